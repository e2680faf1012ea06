#!/usr/bin/env bash
# The asymmetric critic on the demo's task: PPO with GAE and a separate critic, trained from
# the demo's warm-started policy twice, once with the critic reading nothing more than the
# policy and once with the gold answer in its prefix ([critic] prefix). Prints the critic's
# value loss per update side by side.
#
#   scripts/critic_prefix.sh [OUT]        (default runs/critic-prefix; about 20 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/critic-prefix}
UPDATES=${UPDATES:-12}
BIN=${BIN:-target/release/agent-r1}
[ -x "$BIN" ] || cargo build --release --bin agent-r1
export MKL_CBWR=AUTO,STRICT GOMP_SPINCOUNT=10000
mkdir -p "$OUT"

# $1: the [model] table, $2: extra tables (warm start or critic prefix), $3: run directory.
config() {
  cat <<EOF
$1
device = "cpu"
dtype = "float32"

[env]
name = "synthetic_multihop"

[env.world]
seed = 0
n_questions = 400
test_fraction = 0.2

[env.options]
reward = "agent_r1_qa"
max_observation_chars = 1024

[tools.search]
top_k = 3

[algorithm]
estimator = "gae"
gamma = 1.0
lambda = 1.0
actor_lr = 5e-4
critic_lr = 1e-3
critic_warmup_updates = 0
entropy_coef = 0.003
micro_batch_size = 16

[algorithm.kl]
placement = "off"

[critic]
separate = true

[rollout]
batch_size = 16
group_size = 8
max_turns = 4
max_prompt_length = 384
max_response_length = 64
max_context_length = 1024
concurrency = 64

[training]
updates = $UPDATES
mode = "sync"
seed = 0
run_dir = "$3"

[checkpoint]
every = 0

[eval]
every = 0

[metrics]
address = "127.0.0.1:0"
$2
EOF
}

WARM='
[warm_start]
steps = 800
batch_size = 8
learning_rate = 5e-3
final_lr_fraction = 1.0
early_wrong_answer_prob = 0.0
variants_per_question = 1

[warm_start.bad_habit]
steps = 60
learning_rate = 1e-3
early_wrong_answer_prob = 0.6
variants_per_question = 5'

config '[model]
preset = "tiny"' "$WARM" "$OUT/without" > "$OUT/without.toml"
"$BIN" train --config "$OUT/without.toml" --out "$OUT/without" > "$OUT/without.json" 2> "$OUT/without.log"

config "[model]
dir = \"$OUT/without/model-sft\"" "" "$OUT/with" \
  | sed 's/^separate = true$/separate = true\nprefix = "Gold answer: {answer}\\n"\nprefix_max_tokens = 64/' \
  > "$OUT/with.toml"
"$BIN" train --config "$OUT/with.toml" --out "$OUT/with" > "$OUT/with.json" 2> "$OUT/with.log"

python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
def rows(name):
    return [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
a, b = rows("without"), rows("with")
print("update  value_loss(no prefix)  value_loss(gold answer in prefix)  reward_mean(no prefix, prefix)")
for x, y in zip(a, b):
    print(f"{x['step']:>6}  {x['value_loss']:>21.4f}  {y['value_loss']:>33.4f}  {x['reward_mean']:+.3f}, {y['reward_mean']:+.3f}")
mean = lambda r, k: sum(v[k] for v in r) / len(r)
print(f"mean    {mean(a, 'value_loss'):>21.4f}  {mean(b, 'value_loss'):>33.4f}")
PY
