//! The tiny training run the binary's tests share: a fresh tiny model, no warm start, a
//! 40-question world, GRPO with groups of 2, two turns of 16 tokens.

use std::path::Path;

/// The config's `[model]` to `[training]` sections; a test appends the sections it is
/// about (`[checkpoint]`, `[eval]`, `[metrics]`, `[cluster]`, ...).
pub fn tiny_config(dir: &Path, updates: u64, batch: usize, concurrency: usize) -> String {
    format!(
        r#"
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
batch_size = {batch}
group_size = 2
max_turns = 2
max_prompt_length = 384
max_response_length = 16
max_context_length = 1024
concurrency = {concurrency}

[training]
updates = {updates}
seed = 0
run_dir = "{run}"
"#,
        run = dir.join("unused-run-dir").display(),
    )
}
