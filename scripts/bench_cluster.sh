#!/usr/bin/env bash
# Rollout throughput with 1 and 2 remote workers on loopback (issue 20): a trainer that only
# trains (cluster.local_rollout = false) and N `agent-r1 worker` processes on this machine.
# Prints one line per N: updates, episodes, wall seconds of the run after the workers joined,
# episodes/s. Usage: BIN=target/release/agent-r1 scripts/bench_cluster.sh [UPDATES]
set -euo pipefail
BIN=${BIN:-target/release/agent-r1}
UPDATES=${1:-6}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
echo "bench-cookie" > "$WORK/cookie"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
printf "%-8s %8s %9s %8s %12s\n" workers updates episodes wall_s episodes/s
for N in 1 2; do
  P=$(port)
  cat > "$WORK/train-$N.toml" <<TOML
[model]
preset = "tiny"
device = "cpu"
dtype = "float32"
[env]
name = "synthetic_multihop"
[env.world]
seed = 0
n_questions = 200
test_fraction = 0.2
[tools.search]
top_k = 2
[algorithm]
estimator = "grpo"
actor_lr = 2e-3
micro_batch_size = 16
[algorithm.kl]
placement = "off"
[rollout]
batch_size = 8
group_size = 4
max_turns = 3
max_prompt_length = 384
max_response_length = 32
max_context_length = 1024
concurrency = 32
[training]
updates = $UPDATES
mode = "sync"
seed = 0
run_dir = "$WORK/run-$N"
[checkpoint]
every = 1000
[eval]
every = 1000
questions = 4
[metrics]
enabled = false
[cluster]
listen = "127.0.0.1:$P"
cookie_file = "$WORK/cookie"
min_workers = $N
local_rollout = false
TOML
  "$BIN" train --config "$WORK/train-$N.toml" > "$WORK/train-$N.out" 2> "$WORK/train-$N.err" &
  TRAIN=$!
  until grep -q "waiting for" "$WORK/train-$N.err" 2>/dev/null; do sleep 0.5; done
  for i in $(seq 1 "$N"); do
    "$BIN" worker --join "127.0.0.1:$P" --cookie-file "$WORK/cookie" --name "w$i" \
      --dir "$WORK/w$N-$i" > "$WORK/w$N-$i.out" 2> "$WORK/w$N-$i.err" &
  done
  until grep -q "workers$" "$WORK/train-$N.err" && [ "$(grep -c ' joined ' "$WORK/train-$N.err")" -ge "$N" ]; do sleep 0.2; done
  START=$(date +%s.%N)
  wait $TRAIN
  END=$(date +%s.%N)
  wait
  EPISODES=$(tail -1 "$WORK/train-$N.out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["cluster"]["accepted"])')
  python3 -c "w=$END-$START; print(f'{$N:<8} {$UPDATES:>8} {$EPISODES:>9} {w:>8.1f} {$EPISODES/w:>12.2f}')"
done
