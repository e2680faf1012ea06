#!/usr/bin/env bash
# On-policy distillation on the demo's task, against RL from the same start. The teacher is
# the demo's policy after its warm start and 12 GRPO updates; the student starts from the
# demo's warm-started policy (`model-sft`) and is trained twice: on GRPO's reward (RL) and on
# the teacher's per-token reverse KL alone ([distill]). Held-out greedy EM after every update
# (EVAL_EVERY).
#
#   scripts/distill_demo.sh [OUT]        (default runs/distill; about 25 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/distill}
UPDATES=${UPDATES:-12}
EVAL_EVERY=${EVAL_EVERY:-1}
BIN=${BIN:-target/release/agent-r1}
[ -x "$BIN" ] || cargo build --release --bin agent-r1
export MKL_CBWR=AUTO,STRICT GOMP_SPINCOUNT=10000
mkdir -p "$OUT"

# The teacher: the demo itself (its metrics address freed for a run beside another).
if [ ! -f "$OUT/teacher/eval.jsonl" ] || [ "$(wc -l < "$OUT/teacher/eval.jsonl")" -lt 4 ]; then
  rm -rf "$OUT/teacher"
  sed 's/^address = "127.0.0.1:9464"$/address = "127.0.0.1:0"/' examples/demo.toml > "$OUT/teacher.toml"
  "$BIN" train --config "$OUT/teacher.toml" --out "$OUT/teacher" > "$OUT/teacher.json" 2> "$OUT/teacher.log"
fi
TEACHER=$(ls -d "$OUT"/teacher/checkpoints/*/policy | sort | tail -1)

# $1: extra tables, $2: run directory.
config() {
  sed -e "s|^preset = \"tiny\".*|dir = \"$OUT/teacher/model-sft\"|" \
      -e 's/^address = "127.0.0.1:9464"$/address = "127.0.0.1:0"/' \
      -e "s/^updates = 12$/updates = $UPDATES/" \
      -e "s/^every = 4\$/every = $EVAL_EVERY/" \
      -e '/^\[warm_start/,/^$/d' \
      -e '/^\[checkpoint\]/,/^$/d' examples/demo.toml
  printf '\n[checkpoint]\nevery = 0\n\n%s\n' "$1"
}

config "" > "$OUT/rl.toml"
"$BIN" train --config "$OUT/rl.toml" --out "$OUT/rl" > "$OUT/rl.json" 2> "$OUT/rl.log"
config "[distill]
teacher = \"$TEACHER\"
combine = \"alone\"" > "$OUT/distill.toml"
"$BIN" train --config "$OUT/distill.toml" --out "$OUT/distill" > "$OUT/distill.json" 2> "$OUT/distill.log"

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def evals(name):
    return {r["step"]: r["em"] for r in map(json.loads, open(f"{out}/{name}/eval.jsonl"))}
def updates(name):
    return [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
teacher = evals("teacher")
t_em = teacher[max(teacher)]
rl, di = evals("rl"), evals("distill")
print(f"teacher: held-out EM {t_em:.3f} (the demo after {max(teacher)} updates)")
print("update  EM (RL)  EM (distill)")
for s in sorted(set(rl) | set(di)):
    print(f"{s:>6}  {rl.get(s, float('nan')):>7.3f}  {di.get(s, float('nan')):>12.3f}")
def first(ev):
    hit = [s for s in sorted(ev) if ev[s] >= t_em - 0.05]
    return hit[0] if hit else None
print(f"first update within 0.05 of the teacher: RL {first(rl)}, distill {first(di)}")
d = updates("distill")
print("distill reverse KL per update: " + " ".join(f"{r['distill']['reverse_kl']:.3f}" for r in d))
tps = [r["distill"]["teacher_tokens_per_second"] for r in d]
print(f"teacher forward: {sum(tps)/len(tps):.0f} tokens/s mean over {len(tps)} updates")
print(f"seconds: RL {sum(r['seconds'] for r in updates('rl')):.0f}, distill {sum(r['seconds'] for r in d):.0f} (updates only)")
PY
