#!/usr/bin/env bash
# The engine on a GPU, in one command: decode throughput at batch 1, 64 and 256 against the
# device's memory-bandwidth floor, transformers' `generate` on the same shapes, and `bench
# rollout` with many synthetic multi-hop episodes; then one table.
#
#   scripts/bench_gpu.sh                                   # GPU: qwen2.5-0.5b and -1.5b, bf16
#   BIN=/path/agent-r1 scripts/bench_gpu.sh                # no cargo build (machines without cargo)
#   DEVICE=cpu SHAPES=tiny BATCH_SIZES=1,8 PROMPT_LEN=32 NEW_TOKENS=16 EPISODES=16 \
#     scripts/bench_gpu.sh                                 # the CPU check (make test runs it)
#
# Steps: build agent-r1 (unless BIN is given); make each shape's model directory once
# (`agent-r1 init-model --shape S`, random weights; the preset `tiny` for CPU checks); for
# each shape run `agent-r1 bench decode` and scripts/hf_generate_bench.py with the same
# batch sizes, prompt length and new tokens, one process after the other; run `agent-r1
# bench rollout` on the first shape with EPISODES episodes all in flight; print the table
# ($OUT/summary.txt, $OUT/summary.json).
#
# Settings (environment): DEVICE (cuda, cuda:N or cpu; default cuda), DTYPE (bf16 on GPU,
# float32 on CPU), SHAPES (qwen2.5-0.5b,qwen2.5-1.5b; also qwen3-1.7b, llama3.2-1b, or the
# preset tiny), BATCH_SIZES (1,64,256), PROMPT_LEN (512), NEW_TOKENS (256), REPEATS (2),
# EPISODES (4096), BIN, PY (the Python with torch + transformers), OUT
# (runs/bench_gpu), SKIP_HF=1 (no transformers baseline), MEMORY_FRACTION (unset; e.g.
# 0.8: `bench rollout` sizes its engine's rows, up to EPISODES, and parked-KV pool from that
# share of the device and prints the plan), CUDA_GRAPHS (1; 0 decodes without CUDA graphs),
# VERIFY (0; N re-scores N sequences per batch size with a plain forward pass and reports the
# largest log-probability difference), EAGER=1 (also decode every shape without CUDA graphs,
# last: the table's "eager step ms").
set -euo pipefail
if [ -n "${BIN:-}" ]; then BIN=$(realpath "$BIN"); fi
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
case "$DEVICE" in
  cpu) DTYPE=${DTYPE:-float32} ;;
  cuda | cuda:*) DTYPE=${DTYPE:-bf16} ;;
  *) echo "bench_gpu: DEVICE must be cuda, cuda:N or cpu, not $DEVICE" >&2; exit 2 ;;
esac
SHAPES=${SHAPES:-qwen2.5-0.5b,qwen2.5-1.5b}
BATCH_SIZES=${BATCH_SIZES:-1,64,256}
PROMPT_LEN=${PROMPT_LEN:-512}
NEW_TOKENS=${NEW_TOKENS:-256}
REPEATS=${REPEATS:-2}
EPISODES=${EPISODES:-4096}
OUT=${OUT:-runs/bench_gpu}
mkdir -p "$OUT"

if [ -z "${PY:-}" ]; then
  for candidate in /opt/torch/.venv/bin/python3 .venv/bin/python python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PY=$candidate; break; fi
  done
fi
"$PY" -c 'import torch, transformers' || {
  echo "bench_gpu: $PY lacks torch or transformers; set PY=" >&2; exit 2; }

if [ -z "${BIN:-}" ]; then
  echo "== cargo build --release --bin agent-r1" >&2
  cargo build --release --bin agent-r1
  BIN=target/release/agent-r1
fi
[ -x "$BIN" ] || { echo "bench_gpu: $BIN is not an executable" >&2; exit 2; }
# A binary built elsewhere carries an rpath to that machine's libtorch; where it does not
# start, point the loader at the libtorch of $PY's torch (2.11.0, as the binary was built).
if ! "$BIN" --version >/dev/null 2>&1; then
  torch_lib=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== libtorch from $torch_lib" >&2
fi

{
  date -u +%FT%TZ
  echo "device=$DEVICE dtype=$DTYPE shapes=$SHAPES batch_sizes=$BATCH_SIZES prompt=$PROMPT_LEN new=$NEW_TOKENS"
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  if [ "$DEVICE" != cpu ]; then nvidia-smi -L; fi
} >"$OUT/env.txt" 2>&1

no_graphs=()
if [ "${CUDA_GRAPHS:-1}" = 0 ]; then no_graphs=(--no-cuda-graphs); fi
: >"$OUT/decode.jsonl"
: >"$OUT/hf.jsonl"
: >"$OUT/rollout.jsonl"
: >"$OUT/eager.jsonl"
first_model=
IFS=, read -ra shapes <<<"$SHAPES"
for shape in "${shapes[@]}"; do
  model="$OUT/model-$shape-$DTYPE"
  if [ ! -f "$model/config.json" ]; then
    case "$shape" in
      qwen* | llama*) flags=(--shape "$shape" --dtype "$DTYPE") ;;
      *) flags=(--preset "$shape") ;;
    esac
    echo "== agent-r1 init-model ${flags[*]} --out $model" >&2
    "$BIN" init-model "${flags[@]}" --out "$model" --force >"$OUT/init-$shape.json"
  fi
  first_model=${first_model:-$model}
  echo "== agent-r1 bench decode ($shape)" >&2
  "$BIN" bench decode --model "$model" --device "$DEVICE" --dtype "$DTYPE" \
    --batch-sizes "$BATCH_SIZES" --prompt-len "$PROMPT_LEN" --new-tokens "$NEW_TOKENS" \
    --repeats "$REPEATS" --verify "${VERIFY:-0}" ${no_graphs[@]+"${no_graphs[@]}"} \
    | sed "s/^{/{\"shape\":\"$shape\",/" >>"$OUT/decode.jsonl"
  if [ "${SKIP_HF:-0}" != 1 ]; then
    echo "== transformers generate ($shape)" >&2
    "$PY" scripts/hf_generate_bench.py --model "$model" --device "$DEVICE" --dtype "$DTYPE" \
      --batch-sizes "$BATCH_SIZES" --prompt-len "$PROMPT_LEN" --new-tokens "$NEW_TOKENS" \
      --repeats "$REPEATS" | sed "s/^{/{\"shape\":\"$shape\",/" >>"$OUT/hf.jsonl"
  fi
done
echo "== agent-r1 bench rollout (${shapes[0]}, $EPISODES episodes)" >&2
"$BIN" bench rollout --model "$first_model" --env synthetic_multihop --device "$DEVICE" \
  --episodes "$EPISODES" --concurrency "$EPISODES" --json ${no_graphs[@]+"${no_graphs[@]}"} \
  ${MEMORY_FRACTION:+--memory-fraction "$MEMORY_FRACTION" --max-batch "$EPISODES"} \
  | sed "s/^{/{\"shape\":\"${shapes[0]}\",/" >>"$OUT/rollout.jsonl"
if [ "${EAGER:-0}" = 1 ]; then
  for shape in "${shapes[@]}"; do
    echo "== agent-r1 bench decode --no-cuda-graphs ($shape)" >&2
    "$BIN" bench decode --model "$OUT/model-$shape-$DTYPE" --device "$DEVICE" --dtype "$DTYPE" \
      --batch-sizes "$BATCH_SIZES" --prompt-len "$PROMPT_LEN" --new-tokens "$NEW_TOKENS" \
      --repeats "$REPEATS" --no-cuda-graphs | sed "s/^{/{\"shape\":\"$shape\",/" >>"$OUT/eager.jsonl"
  done
fi

"$PY" - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
out = sys.argv[1]
def rows(name):
    with open(f"{out}/{name}.jsonl") as f:
        return [json.loads(l) for l in f if l.startswith("{")]
decode, hf, rollout, eager = rows("decode"), rows("hf"), rows("rollout"), rows("eager")
baseline = {(r["shape"], r["batch"]): r["tokens_per_s"] for r in hf}
eager_ms = {(r["shape"], r["batch"]): r["step_ms"] for r in eager}
print("| shape | batch | agent-r1 tokens/s | step ms | floor ms | of floor | transformers tokens/s | speed-up | graph steps | max |Δ logprob| | eager step ms |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
summary = {"decode": [], "rollout": []}
for r in decode:
    hf_tps = baseline.get((r["shape"], r["batch"]))
    ratio = r["tokens_per_s"] / hf_tps if hf_tps else None
    print(f"| {r['shape']} | {r['batch']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.2f} | "
          f"{r['floor_ms']:.2f} | {r['floor_fraction']:.0%} | "
          f"{'-' if hf_tps is None else f'{hf_tps:,.0f}'} | {'-' if ratio is None else f'{ratio:.2f}x'} | "
          f"{r.get('graph_decode_steps', 0)}/{r['decode_steps']} | "
          f"{'-' if not r.get('verify') else format(r['verify']['max_abs_logprob_diff'], '.3g')} | "
          f"{'-' if (r['shape'], r['batch']) not in eager_ms else format(eager_ms[(r['shape'], r['batch'])], '.2f')} |")
    if r.get("cuda_graphs_off"):
        print(f"|   | CUDA graphs off: {r['cuda_graphs_off']} |")
    summary["decode"].append({**r, "hf_tokens_per_s": hf_tps, "speedup": ratio})
for r in rollout:
    print(f"\nbench rollout ({r['shape']}): {r['episodes_completed']} of {r['episodes']} episodes completed, "
          f"{r['tokens_per_s']:,.0f} tokens/s, engine overhead {r['overhead_fraction']:.3f}, "
          f"mean batch {r['mean_batch_size']:.1f}")
    summary["rollout"].append(r)
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
EOF
