#!/usr/bin/env bash
# Run 1 on the lent GPU: probe, smoke, decode + transformers at two shapes, rollout, learner.
set -uo pipefail
cd "$(dirname "$0")/.."
export PY=/opt/torch/.venv/bin/python3
command -v $PY >/dev/null || PY=python3
TL=$($PY -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$TL"
BIN=$PWD/gpu/agent-r1
O=${OUT:-/tmp/out}; mkdir -p $O
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv
el probe; timeout 60 $PY -u gpu/probe.py 2>&1 | tee $O/probe.txt
el smoke; $BIN --version
timeout 60 $BIN init-model --preset tiny --out /tmp/tiny --force >/dev/null
timeout 60 $BIN bench decode --model /tmp/tiny --device cuda --dtype float32 --batch-sizes 1,8 --prompt-len 32 --new-tokens 16 --repeats 1 2>&1 | tee $O/smoke.txt
for shape in qwen2.5-0.5b qwen2.5-1.5b; do
  el init $shape; timeout 60 $BIN init-model --shape $shape --dtype bf16 --out /tmp/m-$shape --force > /dev/null || echo "init failed $shape"
  el decode $shape; timeout 75 $BIN bench decode --model /tmp/m-$shape --device cuda --dtype bf16 --batch-sizes 1,64,256 --prompt-len 512 --new-tokens 256 --repeats 1 2>&1 | sed "s/^{/{\"shape\":\"$shape\",/" | tee -a $O/decode.jsonl
  el hf $shape; timeout 75 $PY -u scripts/hf_generate_bench.py --model /tmp/m-$shape --device cuda --dtype bf16 --batch-sizes 1,64,256 --prompt-len 512 --new-tokens 256 --repeats 1 2>&1 | sed "s/^{/{\"shape\":\"$shape\",/" | tee -a $O/hf.jsonl
done
el rollout; timeout 90 $BIN bench rollout --model /tmp/m-qwen2.5-0.5b --env synthetic_multihop --device cuda --episodes 4096 --concurrency 4096 --memory-fraction 0.8 --max-batch 4096 --json 2>&1 | tail -30 | tee $O/rollout.txt
el learner; BIN=$BIN MODEL=/tmp/m-qwen2.5-1.5b OUT=$O/learner UPDATES=2 timeout 80 scripts/bench_gpu_learner.sh 2>&1 | tail -25
el done
