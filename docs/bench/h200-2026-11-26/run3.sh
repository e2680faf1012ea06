#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
export PY=/opt/torch/.venv/bin/python3
export LD_LIBRARY_PATH=$($PY -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
BIN=$PWD/gpu/agent-r1; B=/tmp/bench; mkdir -p $B
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi -L
M=$B/model-qwen2.5-0.5b-bf16
timeout 30 $BIN init-model --shape qwen2.5-0.5b --dtype bf16 --out $M --force > $B/init-qwen2.5-0.5b.json
el "check: graphs on"
timeout 40 $BIN bench decode --model $M --device cuda --dtype bf16 --batch-sizes 64 --prompt-len 512 --new-tokens 64 --repeats 1 --verify 4 2>&1 | tee $OUT/check.txt
rc=${PIPESTATUS[0]}; if [ $rc != 0 ]; then echo "GRAPHS FAILED rc=$rc: bench without"; export CUDA_GRAPHS=0; fi


el "bench_gpu.sh"
BIN=$BIN OUT=$B REPEATS=1 VERIFY=2 MEMORY_FRACTION=0.8 EPISODES=4096 timeout 215 scripts/bench_gpu.sh 2>&1 | grep -v "Loading weights"
for f in decode.jsonl hf.jsonl rollout.jsonl summary.txt; do cp $B/$f $OUT/ 2>/dev/null; done
el "eager side by side (no graphs), 0.5b"
timeout 35 $BIN bench decode --model $M --device cuda --dtype bf16 --batch-sizes 1,64,256 --prompt-len 512 --new-tokens 256 --repeats 1 --no-cuda-graphs 2>&1 | tee $OUT/eager.jsonl | cut -c1-400
el done
cat $OUT/summary.txt
