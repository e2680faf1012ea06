#!/usr/bin/env bash
# agent-r1's learner against the same GRPO update in plain PyTorch + transformers
# (scripts/torch_learner_bench.py), on the same device, model and synthetic batch.
#
#   scripts/bench_gpu_learner.sh                          # GPU: qwen2.5-1.5b shape, bf16
#   BIN=/path/agent-r1 scripts/bench_gpu_learner.sh       # no cargo build (machines without cargo)
#   DEVICE=cpu MODEL=/tmp/tiny scripts/bench_gpu_learner.sh   # CPU-only smoke test, float32
#
# Steps: build agent-r1 (unless BIN is given); make the model directory once
# (`agent-r1 init-model --shape $SHAPE`, or MODEL=DIR); run `agent-r1 bench learner` and
# the PyTorch script with the same flags, each in its own process, one after the other,
# measuring each process's peak memory from outside the same way (GPU: nvidia-smi polled
# every 100 ms; CPU: the child's peak RSS from wait4); print a table, the ratios and a
# PASS/FAIL line: agent-r1 within 10% of PyTorch's speed and no higher in memory.
# Everything lands in $OUT (default runs/bench_gpu_learner): both JSON outputs and logs,
# the memory samples, summary.txt and summary.json. Exit status is 0 whatever the verdict
# (summary.json has "pass"); non-zero only when a step fails.
#
# Settings (environment): DEVICE (cuda, cuda:N or cpu; default cuda), DTYPE (default bf16
# on GPU, float32 on CPU), SHAPE (qwen2.5-1.5b; qwen2.5-0.5b, qwen3-1.7b, llama3.2-1b or
# the preset tiny), MODEL (an existing model directory instead of SHAPE), BIN, PY (the
# Python with torch + transformers), OUT, and the batch: TRAJECTORIES (8), GROUP_SIZE (8),
# PROMPT_TOKENS (256), STEPS (4), ACTION_TOKENS (128), OBSERVATION_TOKENS (64): 256 + 4 x
# (128 + 64) = 1024 tokens per trajectory, 512 trained on; UPDATES (3 timed, after one
# untimed warm-up), MICRO_BATCH_SIZE (8), MINI_BATCH_SIZE (0 = the whole batch in one
# optimizer step), LOGITS_CHUNK_TOKENS (1024), SEED (0), RECOMPUTE (0; 1 = activation
# checkpointing in both), LORA_RANK (0; R = LoRA adapters of rank R on every projection,
# alpha 2R, beside the frozen weights: agent-r1's `[lora]` against PEFT's on the same model).
#
#   LORA_RANK=16 scripts/bench_gpu_learner.sh             # GPU: LoRA, agent-r1 against PEFT
#
# Micro-batch 8 = the whole 8-trajectory batch in one forward/backward of 8,192 tokens: it is
# agent-r1's default micro_batch_size, gives both implementations their largest matrix
# products, and makes the peak memory the one a real step of that size needs (activations
# of 8k tokens + weights, gradients, float32 masters and moments). MICRO_BATCH_SIZE=4 runs
# two micro-batches per optimizer step to include gradient accumulation.
set -euo pipefail
# Paths given relative to where the command was typed, before moving to the repository root.
if [ -n "${MODEL:-}" ]; then MODEL=$(realpath "$MODEL"); fi
if [ -n "${BIN:-}" ]; then BIN=$(realpath "$BIN"); fi
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
case "$DEVICE" in
  cpu) DTYPE=${DTYPE:-float32} ;;
  cuda | cuda:*) DTYPE=${DTYPE:-bf16} ;;
  *) echo "bench_gpu_learner: DEVICE must be cuda, cuda:N or cpu, not $DEVICE" >&2; exit 2 ;;
esac
SHAPE=${SHAPE:-qwen2.5-1.5b}
OUT=${OUT:-runs/bench_gpu_learner}
TRAJECTORIES=${TRAJECTORIES:-8}
GROUP_SIZE=${GROUP_SIZE:-8}
PROMPT_TOKENS=${PROMPT_TOKENS:-256}
STEPS=${STEPS:-4}
ACTION_TOKENS=${ACTION_TOKENS:-128}
OBSERVATION_TOKENS=${OBSERVATION_TOKENS:-64}
UPDATES=${UPDATES:-3}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-8}
MINI_BATCH_SIZE=${MINI_BATCH_SIZE:-0}
LOGITS_CHUNK_TOKENS=${LOGITS_CHUNK_TOKENS:-1024}
SEED=${SEED:-0}
mkdir -p "$OUT"

# The Python that has torch + transformers: the GPU machines' image, else the project's venv.
if [ -z "${PY:-}" ]; then
  for candidate in /opt/torch/.venv/bin/python3 .venv/bin/python python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PY=$candidate; break; fi
  done
fi
"$PY" -c 'import torch, transformers' || {
  echo "bench_gpu_learner: $PY lacks torch or transformers; set PY=" >&2; exit 2; }

# (a) The binary.
if [ -z "${BIN:-}" ]; then
  echo "== cargo build --release --bin agent-r1" >&2
  cargo build --release --bin agent-r1
  BIN=target/release/agent-r1
fi
[ -x "$BIN" ] || { echo "bench_gpu_learner: $BIN is not an executable" >&2; exit 2; }
# A binary built elsewhere carries an rpath to that machine's libtorch; where it does not
# start, point the loader at the libtorch of $PY's torch (the version the binary was built
# against, torch 2.11.0, must be the one installed there).
if ! "$BIN" --version >/dev/null 2>&1; then
  torch_lib=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== libtorch from $torch_lib" >&2
fi

# (b) The model directory, made once and reused by later runs.
if [ -n "${MODEL:-}" ]; then
  MODEL_DIR=$MODEL
else
  MODEL_DIR="$OUT/model-$SHAPE-$DTYPE"
  if [ ! -f "$MODEL_DIR/config.json" ]; then
    case "$SHAPE" in
      qwen* | llama*) model_flags=(--shape "$SHAPE" --dtype "$DTYPE") ;;
      *) model_flags=(--preset "$SHAPE") ;;  # presets are stored in float32
    esac
    echo "== agent-r1 init-model ${model_flags[*]} --out $MODEL_DIR" >&2
    "$BIN" init-model "${model_flags[@]}" --out "$MODEL_DIR" --force >"$OUT/init-model.json"
  fi
fi
[ -f "$MODEL_DIR/config.json" ] || { echo "bench_gpu_learner: $MODEL_DIR has no config.json" >&2; exit 2; }

FLAGS=(--model "$MODEL_DIR" --estimators grpo --device "$DEVICE" --dtype "$DTYPE"
  --trajectories "$TRAJECTORIES" --group-size "$GROUP_SIZE" --prompt-tokens "$PROMPT_TOKENS"
  --steps "$STEPS" --action-tokens "$ACTION_TOKENS" --observation-tokens "$OBSERVATION_TOKENS"
  --updates "$UPDATES" --micro-batch-size "$MICRO_BATCH_SIZE" --mini-batch-size "$MINI_BATCH_SIZE"
  --logits-chunk-tokens "$LOGITS_CHUNK_TOKENS" --seed "$SEED" --json)
# RECOMPUTE=1: both recompute each decoder layer in the backward (activation checkpointing);
# needs an agent-r1 with `bench learner --recompute`.
if [ "${RECOMPUTE:-0}" = 1 ]; then FLAGS+=(--recompute); fi
# LORA_RANK=R: both train rank-R adapters beside the frozen weights (PEFT on the PyTorch side).
if [ "${LORA_RANK:-0}" != 0 ]; then
  FLAGS+=(--lora-rank "$LORA_RANK")
  "$PY" -c 'import peft' || { echo "bench_gpu_learner: $PY lacks peft (LORA_RANK needs it)" >&2; exit 2; }
fi

GPU_INDEX=0
[[ $DEVICE == cuda:* ]] && GPU_INDEX=${DEVICE#cuda:}
{
  date -u +%FT%TZ
  echo "device=$DEVICE dtype=$DTYPE model=$MODEL_DIR bin=$BIN py=$PY"
  echo "flags: ${FLAGS[*]}"
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  if [ "$DEVICE" != cpu ]; then nvidia-smi -L; fi
} >"$OUT/env.txt" 2>&1

# Samples GPU memory every ~100 ms while process $1 lives, writing the maxima so far to $2 as
# "<MiB of that process and its descendants, per --query-compute-apps> <MiB used on the
# whole GPU>". The caching allocators of both implementations keep what they reserved, so
# the peak persists long enough to be sampled.
poll_gpu() {
  local pid=$1 file=$2 app=0 dev=0 v pids
  while kill -0 "$pid" 2>/dev/null; do
    # The process and its descendants (in case the command is a wrapper).
    pids=$(ps -e -o pid=,ppid= | awk -v root="$pid" '
      { parent[$1] = $2 }
      END { for (p in parent) { q = p; while (q != "" && q != root && q > 1) q = parent[q];
                                if (q == root) print p } }' | tr '\n' ' ' || true)
    v=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
      awk -F', *' -v pids=" $pids" 'index(pids, " " $1 " ") && $2 ~ /^[0-9]+$/ { s += $2 } END { print s + 0 }' || true)
    if [[ $v =~ ^[0-9]+$ ]] && ((v > app)); then app=$v; fi
    v=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_INDEX" 2>/dev/null | head -n1 || true)
    if [[ $v =~ ^[0-9]+$ ]] && ((v > dev)); then dev=$v; fi
    echo "$app $dev" >"$file"
    sleep 0.1
  done
}

# Runs one implementation: stdout to $OUT/$1.json, stderr to $OUT/$1.log, the memory
# figures (MiB) to $OUT/$1.peak: CPU "<peak RSS>", GPU "<per-process> <whole GPU> <idle>".
measure() {
  local name=$1 pid poller rc=0 idle=0 app dev
  shift
  echo "== $name: $*" >&2
  if [ "$DEVICE" = cpu ]; then
    # Exact peak RSS of the child (the kernel's ru_maxrss, via wait4), no sampling.
    "$PY" -c 'import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write("%.1f\n" % (usage.ru_maxrss / 1024))
sys.exit(os.waitstatus_to_exitcode(status))' "$OUT/$name.peak" "$@" >"$OUT/$name.json" 2>"$OUT/$name.log" || rc=$?
  else
    idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$GPU_INDEX" | head -n1)
    echo "0 0" >"$OUT/$name.samples"
    "$@" >"$OUT/$name.json" 2>"$OUT/$name.log" &
    pid=$!
    poll_gpu "$pid" "$OUT/$name.samples" &
    poller=$!
    wait "$pid" || rc=$?
    wait "$poller" || true
    read -r app dev <"$OUT/$name.samples"
    # Per-process peak, whole-GPU peak, the GPU's use before the run; the summary reports
    # the per-process figures, or, where nvidia-smi could not attribute memory to one of
    # the two processes (a container's PID namespace, a sandbox), whole-GPU minus idle for
    # both, so that both are always measured the same way.
    echo "$app $dev $idle" >"$OUT/$name.peak"
  fi
  if ((rc != 0)); then
    echo "bench_gpu_learner: $name failed (exit $rc); the end of $OUT/$name.log:" >&2
    tail -n 20 "$OUT/$name.log" >&2
    exit "$rc"
  fi
}

# (c) One after the other, each in its own process.
measure agent-r1 "$BIN" bench learner "${FLAGS[@]}"
measure pytorch "$PY" scripts/torch_learner_bench.py "${FLAGS[@]}"

# (d) The table, the ratios and the verdict.
"$PY" - "$OUT" "$DEVICE" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
out, device = sys.argv[1], sys.argv[2]

def load(name):
    # The JSON object is the last line of stdout that starts with "{".
    with open(f"{out}/{name}.json") as f:
        line = [l for l in f if l.startswith("{")][-1]
    d = json.loads(line)
    with open(f"{out}/{name}.peak") as f:
        peak = [float(x) for x in f.read().split()]
    return d, d["results"][0], peak

rows = {name: load(name) for name in ("agent-r1", "pytorch")}
if device == "cpu":
    how, peaks = "peak RSS of each process (wait4's ru_maxrss)", {n: r[2][0] for n, r in rows.items()}
elif all(r[2][0] > 0 for r in rows.values()):
    how = "nvidia-smi, each process's own memory, sampled every 100 ms"
    peaks = {n: r[2][0] for n, r in rows.items()}
else:
    how = ("nvidia-smi could not attribute memory to a process: the whole GPU's peak minus its "
           "use before the run, sampled every 100 ms")
    peaks = {n: r[2][1] - r[2][2] for n, r in rows.items()}
d = rows["agent-r1"][0]
n_updates = len(rows["agent-r1"][1]["updates"])
mem = "peak RSS MB" if device == "cpu" else "peak GPU MB"
print(f"learner, GRPO: {d['model']} ({d['parameters']:,} parameters), "
      f"{d['trajectories']} trajectories x {d['tokens_per_trajectory']} tokens "
      f"({d['action_tokens_per_trajectory']} trained on), micro-batch {d['micro_batch_size']}, "
      f"mini-batch {d['mini_batch_size'] or 'all'}, {n_updates} timed "
      f"update{'s' if n_updates != 1 else ''}, {device} {d['dtype']}"
      + (f", LoRA rank {rows['agent-r1'][1]['lora_rank']} (PyTorch: PEFT)"
         if rows["agent-r1"][1].get("lora_rank") else ""))
print(f"memory: {how}")
print(f"{'implementation':<16}{'tokens/s':>12}{'mean s/update':>15}{mem:>14}{'policy loss (1st)':>20}")
for name, (_, r, _) in rows.items():
    peak = peaks[name]
    print(f"{name:<16}{r['tokens_per_s']:>12,.0f}{r['mean_update_s']:>15.3f}{peak:>14,.0f}"
          f"{r['updates'][0]['policy_loss']:>20.7g}")
a, p = rows["agent-r1"][1], rows["pytorch"][1]
a_peak, p_peak = peaks["agent-r1"], peaks["pytorch"]
if "peak_reserved_mb" in p:
    print(f"(pytorch's own allocator: max allocated {p['peak_mb']:,.0f} MB, "
          f"max reserved {p['peak_reserved_mb']:,.0f} MB)")
speed = a["tokens_per_s"] / p["tokens_per_s"]
memory = a_peak / p_peak
la, lp = a["updates"][0]["policy_loss"], p["updates"][0]["policy_loss"]
rel = abs(la - lp) / max(abs(lp), 1e-30)
print(f"speed  agent-r1 / pytorch: {speed:.3f}  (needs >= 0.90)")
print(f"memory agent-r1 / pytorch: {memory:.3f}  (needs <= 1.00)")
print(f"policy loss of the first update: relative difference {rel:.2e}"
      f" (float32 on CPU agrees to ~1e-6; bf16 differs by kernel rounding; with LoRA each"
      f" side draws its own A, so the warm-up update leaves them ~1e-4 apart)")
fast, lean = speed >= 0.90, memory <= 1.00
ok = fast and lean
why = [] if ok else ([] if fast else [f"speed {speed:.3f} < 0.90"]) + ([] if lean else [f"memory {memory:.3f} > 1.00"])
print("PASS: agent-r1 is within 10% of PyTorch's speed and no higher in memory" if ok else
      "FAIL: agent-r1 is not within 10% of PyTorch's speed and no higher in memory (" + "; ".join(why) + ")")
with open(f"{out}/summary.json", "w") as f:
    json.dump({"speed_ratio": speed, "memory_ratio": memory, "pass": ok,
               "policy_loss_rel_diff": rel, "memory_measure": how,
               "agent_r1": {"tokens_per_s": a["tokens_per_s"], "mean_update_s": a["mean_update_s"],
                            "peak_mb": a_peak, "policy_loss": la},
               "pytorch": {"tokens_per_s": p["tokens_per_s"], "mean_update_s": p["mean_update_s"],
                           "peak_mb": p_peak, "policy_loss": lp,
                           "allocator_peak_mb": p["peak_mb"] if "peak_reserved_mb" in p else None,
                           "allocator_reserved_mb": p.get("peak_reserved_mb"),
                           "grad_norm": p.get("grad_norm")}}, f, indent=1)
EOF
