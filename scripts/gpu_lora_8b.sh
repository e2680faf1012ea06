#!/usr/bin/env bash
# A short LoRA training run at the Llama 3.1 8B shape on one GPU: the frozen bf16 base, rank-16
# adapters on every projection, the KL loss against the base with the adapters off, and the
# engine on the same GPU; the memory plan beside the measured peak.
#
#   scripts/gpu_lora_8b.sh                                  # GPU: llama3.1-8b shape, bf16
#   BIN=/path/agent-r1 scripts/gpu_lora_8b.sh               # no cargo build
#   DEVICE=cpu SHAPE=tiny UPDATES=1 scripts/gpu_lora_8b.sh  # CPU smoke run, float32
#
# Steps: build agent-r1 (unless BIN is given); make the model once (`agent-r1 init-model
# --shape $SHAPE`: random weights and a tokenizer of the family's vocabulary; no download);
# write the run's config; `agent-r1 check-config --device-memory-gib $PLAN_GIB` prints the
# plan; `agent-r1 train` runs UPDATES updates of GRPO on the synthetic multi-hop env (the
# model is random, so the run measures fit, memory and time, not learning) while nvidia-smi
# is polled every 100 ms; a summary prints planned against measured peak, the update times
# and PASS when the run finished within 10% of its plan. Everything lands in $OUT (default
# runs/gpu_lora_8b): config, plan, logs, metrics and summary.txt.
#
# Settings (environment): DEVICE (cuda, cuda:N or cpu), SHAPE (llama3.1-8b; qwen2.5-7b, a
# smaller shape, or the preset tiny), DTYPE (bf16 on GPU, float32 on CPU), LORA_RANK (16),
# UPDATES (3), BATCH (8 tasks x GROUP 4 episodes), RESPONSE (256 tokens per turn), TURNS (3),
# CONCURRENCY (32), PLAN_GIB (80: the GPU the plan is checked against), BIN, OUT.
set -euo pipefail
if [ -n "${BIN:-}" ]; then BIN=$(realpath "$BIN"); fi
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
case "$DEVICE" in
  cpu) DTYPE=${DTYPE:-float32} ;;
  cuda | cuda:*) DTYPE=${DTYPE:-bf16} ;;
  *) echo "gpu_lora_8b: DEVICE must be cuda, cuda:N or cpu, not $DEVICE" >&2; exit 2 ;;
esac
SHAPE=${SHAPE:-llama3.1-8b}
LORA_RANK=${LORA_RANK:-16}
UPDATES=${UPDATES:-3}
BATCH=${BATCH:-8}
GROUP=${GROUP:-4}
RESPONSE=${RESPONSE:-256}
TURNS=${TURNS:-3}
CONCURRENCY=${CONCURRENCY:-32}
PLAN_GIB=${PLAN_GIB:-80}
OUT=${OUT:-runs/gpu_lora_8b}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")

if [ -z "${BIN:-}" ]; then
  echo "== cargo build --release --bin agent-r1" >&2
  cargo build --release --bin agent-r1
  BIN=target/release/agent-r1
fi
[ -x "$BIN" ] || { echo "gpu_lora_8b: $BIN is not an executable" >&2; exit 2; }
# A binary built elsewhere may need the libtorch of the machine's torch 2.11.
if ! "$BIN" --version >/dev/null 2>&1; then
  for py in /opt/torch/.venv/bin/python3 .venv/bin/python python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import torch' 2>/dev/null; then
      torch_lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
      export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      break
    fi
  done
fi

MODEL_DIR="$OUT/model-$SHAPE-$DTYPE"
if [ ! -f "$MODEL_DIR/config.json" ]; then
  case "$SHAPE" in
    qwen* | llama*) model_flags=(--shape "$SHAPE" --dtype "$DTYPE") ;;
    *) model_flags=(--preset "$SHAPE") ;;
  esac
  echo "== agent-r1 init-model ${model_flags[*]} --out $MODEL_DIR" >&2
  "$BIN" init-model "${model_flags[@]}" --out "$MODEL_DIR" --force >"$OUT/init-model.json"
fi

CONFIG="$OUT/train.toml"
cat >"$CONFIG" <<EOF
[model]
dir = "$MODEL_DIR"
device = "$DEVICE"
dtype = "$DTYPE"

[env]
name = "synthetic_multihop"

[env.world]
seed = 0
n_questions = 400
test_fraction = 0.2

[tools.search]
top_k = 3

[algorithm]
estimator = "grpo"
actor_lr = 1e-5
micro_batch_size = 4

[algorithm.kl]                 # the reference is the frozen base with the adapters off
placement = "loss"
kind = "low_var_kl"
coef = 0.001

[lora]
rank = $LORA_RANK
alpha = $((2 * LORA_RANK))
target_modules = "all-linear"

[rollout]
batch_size = $BATCH
group_size = $GROUP
max_turns = $TURNS
max_prompt_length = 512
max_response_length = $RESPONSE
max_context_length = 2048
concurrency = $CONCURRENCY
parked_kv_mib = 2048

[training]
updates = $UPDATES
mode = "sync"
seed = 0
run_dir = "$OUT/run"

[checkpoint]
every = 1000

[eval]
every = 1000
questions = 8

[metrics]
enabled = false
EOF

echo "== agent-r1 check-config --device-memory-gib $PLAN_GIB" >&2
"$BIN" check-config "$CONFIG" --device-memory-gib "$PLAN_GIB" >"$OUT/check-config.txt" 2>&1 || {
  cat "$OUT/check-config.txt" >&2; exit 2; }
grep -A25 '^memory plan' "$OUT/check-config.txt" | sed -n '1,/^memory:/p' >"$OUT/plan.txt"

GPU_INDEX=0
[[ $DEVICE == cuda:* ]] && GPU_INDEX=${DEVICE#cuda:}
rm -rf "$OUT/run"
echo "== agent-r1 train ($UPDATES updates)" >&2
began=$(date +%s)
rc=0
if [ "$DEVICE" = cpu ]; then
  # Exact peak RSS of the child (the kernel's ru_maxrss, via wait4).
  python3 -c 'import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write("%d\n" % (usage.ru_maxrss // 1024))
sys.exit(os.waitstatus_to_exitcode(status))' "$OUT/train.peak" "$BIN" train --config "$CONFIG" --out "$OUT/run" >"$OUT/train.json" 2>"$OUT/train.log" || rc=$?
  peak_mib=$(cat "$OUT/train.peak" 2>/dev/null || echo 0)
else
  idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_INDEX" | head -n1)
  "$BIN" train --config "$CONFIG" --out "$OUT/run" >"$OUT/train.json" 2>"$OUT/train.log" &
  pid=$!
  peak=0
  while kill -0 "$pid" 2>/dev/null; do
    v=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_INDEX" 2>/dev/null | head -n1 || true)
    if [[ $v =~ ^[0-9]+$ ]] && ((v > peak)); then peak=$v; fi
    sleep 0.1
  done
  wait "$pid" || rc=$?
  peak_mib=$((peak - idle))
fi
wall=$(($(date +%s) - began))
if ((rc != 0)); then
  echo "gpu_lora_8b: train failed (exit $rc); the end of $OUT/train.log:" >&2
  tail -n 20 "$OUT/train.log" >&2
  exit "$rc"
fi

planned=$(awk '/predicted peak/ { print $3 }' "$OUT/plan.txt")
{
  echo "shape $SHAPE, $DTYPE on $DEVICE, LoRA rank $LORA_RANK, $UPDATES updates of $BATCH x $GROUP episodes"
  cat "$OUT/plan.txt"
  echo "measured peak: $(awk -v m="$peak_mib" 'BEGIN { printf "%.1f GiB", m / 1024 }') (device memory over idle; CPU: peak RSS)"
  echo "wall: $wall s (model load, engine start, $UPDATES updates)"
  grep -E '^update ' "$OUT/train.log" || true
  awk -v m="$peak_mib" -v p="$planned" 'BEGIN {
    ratio = m / 1024 / p
    printf "measured / planned: %.2f\n", ratio
    print (ratio <= 1.1 ? "PASS" : "FAIL") ": the run finished; measured within 10% of the plan: " (ratio <= 1.1 ? "yes" : "no")
  }'
} | tee "$OUT/summary.txt"
