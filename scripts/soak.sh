#!/usr/bin/env bash
# The soak: `agent-r1 train` on the tiny model for MINUTES with 10% of tool calls faulted
# (panics, overruns, errors), sampling the process's resident memory and open file
# descriptors every 10 s; then SIGTERM, and a report: RSS slope after warm-up (the first
# fifth), descriptors min/max after warm-up, and every episode's end from /metrics.
#
# With KILL_EVERY=S, the process is SIGKILLed every S seconds and started again on the same
# run directory (it resumes from its newest checkpoint); the report then adds the restarts,
# each life's resident memory and descriptors after its first minute, and whether every
# episode was trained exactly once.
#
#   scripts/soak.sh [MINUTES=30] [OUT=runs/soak]      (BIN=path/to/agent-r1 to use another build)
#   KILL_EVERY=180 scripts/soak.sh 30 runs/soak-kill
set -euo pipefail
KILL_EVERY=${KILL_EVERY:-0}
MINUTES=${1:-30}
OUT=${2:-runs/soak}
# The soak injects tool faults (a test double): a build with the `fault-injection` feature.
if [ -z "${BIN:-}" ]; then
  cargo build --release --bin agent-r1 --features fault-injection
  BIN=target/release/agent-r1
fi
PY=${PY:-python3}
PORT=$((20000 + $$ % 20000))
rm -rf "$OUT" && mkdir -p "$OUT"
cat > "$OUT/soak.toml" <<TOML
[model]
preset = "tiny"
device = "cpu"
dtype = "float32"

[env]
name = "synthetic_multihop"

[env.world]
seed = 0
n_questions = 200
test_fraction = 0.1

[tools.search]
top_k = 2

[algorithm]
estimator = "grpo"
actor_lr = 1e-3
micro_batch_size = 8

[algorithm.kl]
placement = "off"

[rollout]
batch_size = 8
group_size = 4
max_turns = 3
max_prompt_length = 384
max_response_length = 24
max_context_length = 1024
concurrency = 32
parked_kv_mib = 64

[training]
updates = 1000000
seed = 0
run_dir = "$OUT/run"

[checkpoint]
every = $([ "$KILL_EVERY" -gt 0 ] && echo 5 || echo 50)
keep_last = 2

[eval]
every = 100
questions = 8

[metrics]
address = "127.0.0.1:$PORT"
TOML
LIFE=0
start_train() {
  LIFE=$((LIFE + 1))
  "$BIN" train --config "$OUT/soak.toml" --out "$OUT/run" --inject-tool-faults 0.1 \
    > "$OUT/stdout.log" 2>> "$OUT/stderr.log" &
  PID=$!
  BORN=$(date +%s)
}
start_train
trap 'kill -9 $PID 2>/dev/null || true' EXIT
echo "soak: pid $PID for $MINUTES min, metrics on 127.0.0.1:$PORT, samples in $OUT/samples.tsv" >&2
printf 't_s\trss_kb\tfds\tlife\n' > "$OUT/samples.tsv"
START=$(date +%s)
END=$((START + MINUTES * 60))
while [ "$(date +%s)" -lt "$END" ]; do
  kill -0 $PID 2>/dev/null || { echo "soak: train exited early; see $OUT/stderr.log" >&2; exit 1; }
  RSS=$(awk '/^VmRSS:/ {print $2}' /proc/$PID/status)
  FDS=$(ls /proc/$PID/fd | wc -l)
  printf '%s\t%s\t%s\t%s\n' $(( $(date +%s) - START )) "$RSS" "$FDS" "$LIFE" >> "$OUT/samples.tsv"
  sleep 10
  if [ "$KILL_EVERY" -gt 0 ] && [ $(( $(date +%s) - BORN )) -ge "$KILL_EVERY" ] \
     && [ $(( END - $(date +%s) )) -gt 60 ]; then
    kill -9 $PID; wait $PID 2>/dev/null || true
    echo "soak: SIGKILL at $(( $(date +%s) - START )) s (life $LIFE)" >&2
    start_train
  fi
done
curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics.txt" || true
kill -TERM $PID
for _ in $(seq 1 120); do kill -0 $PID 2>/dev/null || break; sleep 1; done
trap - EXIT
wait $PID || true
"$PY" - "$OUT" <<'PYEOF'
import json, re, sys
out = sys.argv[1]
rows = [l.split('\t') for l in open(f"{out}/samples.tsv").read().split('\n')[1:] if l]
t = [float(r[0]) for r in rows]; rss = [int(r[1]) / 1024 for r in rows]; fds = [int(r[2]) for r in rows]
life = [int(r[3]) for r in rows]
lives = {}
for ti, r, f, l in zip(t, rss, fds, life):
    lives.setdefault(l, []).append((ti, r, f))
per_life = []
for l, s in sorted(lives.items()):
    settled = [x for x in s if x[0] - s[0][0] >= 60] or s
    per_life.append({"life": l, "minutes": round((s[-1][0] - s[0][0]) / 60, 1),
                     "rss_mb": [round(min(x[1] for x in settled), 1), round(max(x[1] for x in settled), 1)],
                     "fds": [min(x[2] for x in settled), max(x[2] for x in settled)]})
cut = len(t) // 5
x, y = t[cut:], rss[cut:]
mx, my = sum(x) / len(x), sum(y) / len(y)
slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / max(1e-9, sum((a - mx) ** 2 for a in x))
metrics = open(f"{out}/metrics.txt").read()
def series(name):
    return {m.group(1) or "": float(m.group(2)) for m in re.finditer(rf'^{name}(?:{{[^}}]*status="(\w+)"[^}}]*}})?\s+(\S+)$', metrics, re.M)}
ends = series("agent_r1_episodes_total")
in_flight = series("agent_r1_episodes_in_flight")
faults = sum(float(v) for v in re.findall(r'^agent_r1_tool_errors_total\{[^}]*\}\s+(\S+)$', metrics, re.M))
calls = sum(float(v) for v in re.findall(r'^agent_r1_tool_calls_total\{[^}]*\}\s+(\S+)$', metrics, re.M))
logged = [json.loads(l) for l in open(f"{out}/run/metrics.jsonl") if l.strip()]
updates = len(logged)
steps = [r["step"] for r in logged]
trained = [i & ~(1 << 63) for r in logged for i in r.get("episode_ids", [])]
summary = None
for line in open(f"{out}/stdout.log"):
    if line.startswith("{"):
        summary = json.loads(line)
report = {
    "minutes": round(t[-1] / 60, 1), "samples": len(t), "updates": updates,
    "rss_mb_after_warmup": [round(min(y), 1), round(max(y), 1)],
    "rss_slope_mb_per_hour": round(slope * 3600, 2),
    "fds_after_warmup": [min(fds[cut:]), max(fds[cut:])],
    "episodes_total": ends, "episodes_in_flight_at_scrape": in_flight.get("", None),
    "tool_calls": calls, "tool_errors": faults,
    "summary": summary and {k: summary.get(k) for k in ("updates", "interrupted", "episodes_requeued", "episodes_failed", "pending_trajectories")},
    "lives": per_life,
    "steps_logged_once_in_order": steps == list(range(1, len(steps) + 1)),
    "episodes_trained": len(trained),
    "episodes_trained_twice": len(trained) - len(set(trained)),
}
print(json.dumps(report, indent=1))
PYEOF
