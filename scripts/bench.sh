#!/usr/bin/env bash
# `make bench`: the benchmark figures of docs/benchmarks.md, one JSON object per line in runs/bench/.
# The rollout benchmarks need a model that calls tools over several turns: the policy
# `make demo` ends with (runs/demo/checkpoints/step-12/policy, ~2.5 searches per episode;
# the warm-started model-sft stops after one on purpose), or MODEL=DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/agent-r1}
MODEL=${MODEL:-runs/demo/checkpoints/step-12/policy}
OUT=${OUT:-runs/bench}
mkdir -p "$OUT"
if [ ! -f "$MODEL/config.json" ]; then
  echo "bench: $MODEL is not a model directory; run 'make demo' first or pass MODEL=DIR" >&2
  exit 2
fi
"$BIN" bench generate --device cpu --repeats 3 | tee "$OUT/generate.jsonl"
: > "$OUT/rollout.jsonl"
# episodes concurrency fault-rate [extra flags]
for run in "16 1 0" "64 64 0" "1024 1024 0" "1024 1024 0 --lazy-parked-kv" "1024 1024 0 --no-kv-reuse" \
  "4096 4096 0" "1024 1024 0.2"; do
  set -- $run
  "$BIN" bench rollout --model "$MODEL" --env synthetic_multihop --device cpu \
    --episodes "$1" --concurrency "$2" --tool-fault-rate "$3" "${@:4}" --json | tee -a "$OUT/rollout.jsonl"
done
"$BIN" bench learner --json | tee "$OUT/learner.jsonl"
