#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
PY=/opt/torch/.venv/bin/python3
export LD_LIBRARY_PATH=$($PY -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
BIN=$PWD/gpu/agent-r1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
el binary; timeout 30 $BIN init-model --shape qwen2.5-0.5b --dtype bf16 --out /tmp/m05 --force >/dev/null
AR1_SYNC=1 timeout 40 $BIN bench decode --model /tmp/m05 --device cuda --dtype bf16 --batch-sizes 1,64 --prompt-len 512 --new-tokens 128 --repeats 1 2>&1 | grep -v '^{' 
el mirror; timeout 90 $PY -u gpu/mirror.py 2>&1
el done
