#!/usr/bin/env bash
# Two builds of agent-r1 on the same seeded work, side by side: a `rollout --out` on the
# CPU (one row at a time, no KV reuse) and a deterministic `train` (sync, rollout.deterministic = true) with the default
# `full` context policy. Prints, for each build, the size of the rollouts file, whether its
# episodes are the same token for token (timing fields left out), and the SHA-256 of the
# trained policy's weights.
#
#   scripts/compare_builds.sh OLD_BIN NEW_BIN [WORK_DIR]
set -euo pipefail
old=${1:?usage: compare_builds.sh OLD_BIN NEW_BIN [WORK_DIR]}
new=${2:?usage: compare_builds.sh OLD_BIN NEW_BIN [WORK_DIR]}
work=${3:-$(mktemp -d)}
mkdir -p "$work"
PY=${PY:-python3}
# As .cargo/config.toml sets for processes cargo runs: MKL's results independent of buffer
# alignment, without which the warm start's matmuls may differ in their last bits between runs.
export MKL_CBWR=${MKL_CBWR:-AUTO,STRICT}

cat > "$work/train.toml" <<'TOML'
[model]
preset = "tiny"
device = "cpu"
dtype = "float32"
[env]
name = "synthetic_multihop"
[env.world]
seed = 0
n_questions = 40
test_fraction = 0.2
[tools.search]
top_k = 2
[algorithm]
estimator = "grpo"
actor_lr = 2e-3
micro_batch_size = 8
[algorithm.kl]
placement = "off"
[rollout]
batch_size = 4
group_size = 2
max_turns = 3
max_prompt_length = 384
max_response_length = 32
max_context_length = 1024
concurrency = 8
deterministic = true
[training]
updates = 2
mode = "sync"
seed = 0
[warm_start]
steps = 40
batch_size = 8
learning_rate = 5e-3
[checkpoint]
every = 2
keep_last = 1
[eval]
every = 2
questions = 4
[metrics]
address = "127.0.0.1:0"
TOML

"$new" init-model --preset tiny --out "$work/model" --force > /dev/null
for which in old new; do
    bin=${!which}
    # One row at a time and no KV reuse: every token's numerics depend on its own context only.
    "$bin" rollout --model "$work/model" --episodes 32 --concurrency 8 --max-turns 4 \
        --max-new-tokens 32 --seed 0 --max-batch 1 --no-kv-reuse --device cpu \
        --cache "$work/cache" --out "$work/$which-rollout.jsonl" > /dev/null 2>&1
    rm -rf "$work/$which-train"
    AGENT_R1_LOG=warn "$bin" train --config "$work/train.toml" --out "$work/$which-train" > /dev/null 2>&1
done

"$PY" - "$work" <<'PY'
import hashlib, json, pathlib, sys
work = pathlib.Path(sys.argv[1])
TIMING = {"generate_seconds", "tool_seconds", "wall_seconds", "latency"}
def strip(v):
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if k not in TIMING}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v
def episodes(path):
    return sorted((strip(json.loads(l)) for l in path.read_text().splitlines()), key=lambda e: e["episode_id"])
def weights(run):
    ckpts = sorted((run / "checkpoints").glob("step-*/policy/*.safetensors"))
    h = hashlib.sha256()
    for p in ckpts:
        h.update(p.read_bytes())
    return h.hexdigest()[:16], len(ckpts)
o, n = episodes(work / "old-rollout.jsonl"), episodes(work / "new-rollout.jsonl")
print(f"rollouts: {len(o)} episodes; token for token the same: {o == n}")
for which in ("old", "new"):
    p = work / f"{which}-rollout.jsonl"
    print(f"  {which}: {p.stat().st_size} bytes, {sum(len(json.dumps(e)) for e in (o if which == 'old' else n))} bytes without timing fields")
ro = sorted((work / "old-train" / "rollouts").glob("*.jsonl"))
rn = sorted((work / "new-train" / "rollouts").glob("*.jsonl"))
same = [episodes(a) == episodes(b) for a, b in zip(ro, rn)]
print(f"train rollouts files: {len(ro)} / {len(rn)}; the same token for token: {all(same) and len(ro) == len(rn)}")
for which in ("old", "new"):
    files = sorted((work / f"{which}-train" / "rollouts").glob("*.jsonl"))
    print(f"  {which}: {sum(f.stat().st_size for f in files)} bytes")
wo, wn = weights(work / "old-train"), weights(work / "new-train")
print(f"trained weights sha256: old {wo[0]}, new {wn[0]} ({wo[1]} files): the same bit for bit: {wo == wn}")
PY
