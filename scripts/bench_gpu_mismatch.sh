#!/usr/bin/env bash
# The sampler/trainer gap of real training runs on a GPU: the same short run (GRPO on the
# synthetic multi-hop task, a randomly initialised model of a real shape) in bf16 with CUDA
# graphs, in bf16 without them, and in float32; each update's `mismatch` from metrics.jsonl
# (mean and max |Δ log-prob| between the engine's sampling log-probabilities and the
# learner's, k3 KL, fraction over 0.1, worst row), summarised in one table.
#
#   scripts/bench_gpu_mismatch.sh                         # GPU: qwen2.5-0.5b shape
#   BIN=/path/agent-r1 scripts/bench_gpu_mismatch.sh      # no cargo build
#   DEVICE=cpu SHAPE=tiny VARIANTS=float32 UPDATES=1 scripts/bench_gpu_mismatch.sh
#                                                         # the CPU check (make test runs it)
#
# Settings (environment): DEVICE (cuda, cuda:N or cpu; default cuda), SHAPE (qwen2.5-0.5b;
# qwen2.5-1.5b, qwen3-1.7b, llama3.2-1b, or the preset tiny), VARIANTS (comma-separated, of
# bf16-graphs, bf16-eager, float32; default all three), UPDATES (3), BATCH (16 tasks of
# GROUP 4 episodes), RESPONSE (64 tokens per turn), BIN, OUT (runs/bench_gpu_mismatch).
# Everything lands in $OUT: the model directory, each variant's config, run directory and
# log, summary.txt and summary.json.
set -euo pipefail
if [ -n "${BIN:-}" ]; then BIN=$(realpath "$BIN"); fi
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
case "$DEVICE" in
  cpu | cuda | cuda:*) ;;
  *) echo "bench_gpu_mismatch: DEVICE must be cuda, cuda:N or cpu, not $DEVICE" >&2; exit 2 ;;
esac
SHAPE=${SHAPE:-qwen2.5-0.5b}
VARIANTS=${VARIANTS:-bf16-graphs,bf16-eager,float32}
UPDATES=${UPDATES:-3}
BATCH=${BATCH:-16}
GROUP=${GROUP:-4}
RESPONSE=${RESPONSE:-64}
OUT=${OUT:-runs/bench_gpu_mismatch}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")

if [ -z "${BIN:-}" ]; then
  echo "== cargo build --release --bin agent-r1" >&2
  cargo build --release --bin agent-r1
  BIN=target/release/agent-r1
fi
[ -x "$BIN" ] || { echo "bench_gpu_mismatch: $BIN is not an executable" >&2; exit 2; }

# The model directory, once: a real shape with random weights (stored in bf16), or the
# preset tiny model for CPU checks.
MODEL=$OUT/model-$SHAPE
if [ ! -f "$MODEL/config.json" ]; then
  if [ "$SHAPE" = tiny ]; then
    "$BIN" init-model --preset tiny --out "$MODEL" --force >&2
  else
    "$BIN" init-model --shape "$SHAPE" --out "$MODEL" --force >&2
  fi
fi

for variant in ${VARIANTS//,/ }; do
  case "$variant" in
    bf16-graphs) dtype=bf16; graphs=true ;;
    bf16-eager) dtype=bf16; graphs=false ;;
    float32) dtype=float32; graphs=false ;;
    *) echo "bench_gpu_mismatch: unknown variant $variant (bf16-graphs, bf16-eager, float32)" >&2; exit 2 ;;
  esac
  config=$OUT/$variant.toml
  cat > "$config" <<EOF
[model]
dir = "$MODEL"
device = "$DEVICE"
dtype = "$dtype"

[env]
name = "synthetic_multihop"

[env.world]
seed = 0
n_questions = 80
test_fraction = 0.2

[tools.search]
top_k = 2

[algorithm]
estimator = "grpo"
actor_lr = 1e-6
micro_batch_size = 8

[algorithm.kl]
placement = "off"

[rollout]
batch_size = $BATCH
group_size = $GROUP
max_turns = 2
max_prompt_length = 1024
max_response_length = $RESPONSE
max_context_length = 2048
concurrency = $((BATCH * GROUP))
cuda_graphs = $graphs

[training]
updates = $UPDATES
mode = "sync"
seed = 0
run_dir = "$OUT/$variant-run"

[eval]
every = 0

[metrics]
enabled = false
EOF
  echo "== $variant: agent-r1 train --config $config" >&2
  rm -rf "$OUT/$variant-run"
  "$BIN" train --config "$config" --out "$OUT/$variant-run" > "$OUT/$variant.log" 2>&1 || {
    tail -20 "$OUT/$variant.log" >&2; echo "bench_gpu_mismatch: $variant failed" >&2; exit 1; }
done

# One row per variant: means over updates (max of the maxima).
python3 - "$OUT" "$VARIANTS" "$SHAPE" "$DEVICE" <<'EOF'
import json, sys
out, variants, shape, device = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4]
rows = []
for v in variants:
    updates = [json.loads(l) for l in open(f"{out}/{v}-run/metrics.jsonl") if l.strip()]
    gaps = [u["mismatch"] for u in updates if u.get("mismatch")]
    if not gaps:
        sys.exit(f"bench_gpu_mismatch: {v}: no update reported a mismatch")
    mean = lambda k: sum(g[k] for g in gaps) / len(gaps)
    rows.append({
        "variant": v, "updates": len(gaps), "tokens": sum(g["tokens"] for g in gaps),
        "abs_mean": mean("abs_mean"), "abs_max": max(g["abs_max"] for g in gaps),
        "kl_k3": mean("kl_k3"), "over_threshold": mean("over_threshold"),
        "sequence_abs_max": max(g["sequence_abs_max"] for g in gaps),
    })
lines = [f"sampler/trainer gap, shape {shape}, device {device}",
         "| variant | updates | tokens | mean abs | max abs | k3 KL | frac > 0.1 | worst row |",
         "| --- | --- | --- | --- | --- | --- | --- | --- |"]
for r in rows:
    lines.append(f"| {r['variant']} | {r['updates']} | {r['tokens']} | {r['abs_mean']:.3e} | "
                 f"{r['abs_max']:.3e} | {r['kl_k3']:.3e} | {r['over_threshold']:.4f} | "
                 f"{r['sequence_abs_max']:.3e} |")
text = "\n".join(lines)
print(text)
open(f"{out}/summary.txt", "w").write(text + "\n")
json.dump({"shape": shape, "device": device, "rows": rows}, open(f"{out}/summary.json", "w"), indent=1)
EOF
