//! `[rollout]`: how episodes are sampled.

use std::time::Duration;

use agent_r1_envs::config::{ConfigError, Section};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::setup::EpisodeWaits;

/// `[rollout]`: how episodes are sampled. Lengths are in tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutSection {
    /// Tasks (prompts) per update; each is sampled `group_size` times.
    #[schemars(range(min = 1))]
    pub batch_size: usize,
    /// Episodes per task (GRPO's group, Agent-R1's `n`).
    #[schemars(range(min = 1))]
    pub group_size: usize,
    /// Model turns per episode at most.
    #[schemars(range(min = 1))]
    pub max_turns: usize,
    /// Longest first prompt (system + task + tool specs); longer tasks are skipped.
    #[schemars(range(min = 1))]
    pub max_prompt_length: usize,
    /// Most tokens the model may generate in one turn.
    #[schemars(range(min = 1))]
    pub max_response_length: usize,
    /// Longest whole episode (prompt, all turns, all tool results); also the learner's
    /// training length. At least `max_prompt_length + max_response_length`.
    pub max_context_length: usize,
    /// Sampling temperature (the learner divides logits by the same value; greedy decoding
    /// is `eval.greedy`).
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub temperature: f64,
    /// Nucleus mass.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 1.0))]
    pub top_p: f64,
    /// Episodes running at once (over all engines).
    #[schemars(range(min = 1))]
    pub concurrency: usize,
    /// One engine per device listed (`["cuda:1", "cuda:2"]`; `["cpu", "cpu"]` runs two on
    /// the CPU). An episode's first turn goes to the engine holding the fewest episodes and
    /// its later turns to the same one (its KV is parked there). Each engine is sized as the
    /// one engine would be (`concurrency` rows, `parked_kv_mib`). Empty: one engine on
    /// `model.device`. The learner stays on `model.device` either way.
    pub devices: Vec<String>,
    /// The engine's pool of KV parked for episodes waiting on tools (MiB); 0 parks nothing
    /// (every turn then recomputes its episode's context past the shared prompt).
    pub parked_kv_mib: usize,
    /// The share of its device's total memory each engine may use, its weights included
    /// (like vLLM's `gpu_memory_utilization`). Set, each engine decides from the device's
    /// memory, once its weights are loaded, its rows (at most `concurrency`) and its
    /// parked-KV pool (instead of `parked_kv_mib`), and prints the plan; too little for one
    /// row of `max_context_length` fails the start. In `train` the learner shares
    /// `model.device`: leave it room.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 1.0))]
    pub memory_fraction: Option<f64>,
    /// Most tokens one prefill pass runs (rows x their longest new context, padding
    /// included); a turn longer than this is prefilled in a pass of its own. Bounds the
    /// activations of a pass, which `memory_fraction` reserves.
    #[schemars(range(min = 1))]
    pub max_prefill_tokens: usize,
    /// Decode steps on a GPU replay CUDA graphs (bf16 or f16 weights): one launch per step
    /// instead of one per kernel. Where a graph cannot be captured the engine says why when
    /// it starts and decodes without them; false always decodes without them.
    pub cuda_graphs: bool,
    /// Touch the parked-KV pool when the engine starts (resident from the start, no page
    /// faults on the engine's critical path); false faults it in as it is first used.
    pub prefault_parked_kv: bool,
    /// Longest wait for one generated turn, queueing included, seconds.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 604800.0))]
    pub generate_timeout_secs: f64,
    /// Longest wait for a tool call beyond the tool's own timeout (its queue), seconds.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 604800.0))]
    pub tool_queue_timeout_secs: f64,
    /// Longest wait for one env call (reset, turn decision, observation, score), seconds.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 604800.0))]
    pub env_timeout_secs: f64,
    /// Longest a workflow (`[env] name` naming a registered workflow) may take for one whole
    /// episode, seconds; past it the episode fails with the reason and its calls are
    /// cancelled.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 604800.0))]
    pub workflow_timeout_secs: f64,
    /// Reproducible sampling: the engine decodes one turn at a time and recomputes each
    /// context (no KV reuse), so every token's numerics depend on its own context alone, not
    /// on what else shared a batch. With `mode = "sync"` a run then repeats bit for bit, and
    /// a resume continues exactly. Much slower; for checks, not for throughput.
    pub deterministic: bool,
    /// Give the chat template the tools' JSON schemas (its `tools`), which Qwen-style
    /// templates list in the system turn with instructions on calling them. false: the
    /// system prompt alone tells the model about its tools (as Search-R1-style prompts do),
    /// and every context is shorter by that block (about 160 tokens for `search` under the
    /// Qwen template): for a model that learns the call format from demonstrations. The
    /// episodes, the warm start, `sft` and the tiny tokenizer's corpus all render alike.
    pub tool_schemas_in_prompt: bool,
}

impl Default for RolloutSection {
    fn default() -> Self {
        Self {
            batch_size: 128,
            group_size: 5,
            max_turns: 10,
            max_prompt_length: 1024,
            max_response_length: 512,
            max_context_length: 4096,
            temperature: 1.0,
            top_p: 1.0,
            concurrency: 64,
            devices: Vec::new(),
            parked_kv_mib: 2048,
            memory_fraction: None,
            max_prefill_tokens: 16_384,
            cuda_graphs: true,
            prefault_parked_kv: true,
            generate_timeout_secs: 1800.0,
            tool_queue_timeout_secs: 60.0,
            env_timeout_secs: 60.0,
            workflow_timeout_secs: 3600.0,
            deterministic: false,
            tool_schemas_in_prompt: true,
        }
    }
}

impl RolloutSection {
    /// The tool specs the chat template is given: `specs`, or none with
    /// `tool_schemas_in_prompt = false`.
    pub fn template_specs(&self, specs: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
        if self.tool_schemas_in_prompt {
            specs
        } else {
            Vec::new()
        }
    }

    /// The `*_timeout_secs` keys as an episode reads them.
    pub fn waits(&self) -> EpisodeWaits {
        EpisodeWaits {
            generate: Duration::from_secs_f64(self.generate_timeout_secs),
            tool_queue: Duration::from_secs_f64(self.tool_queue_timeout_secs),
            env: Duration::from_secs_f64(self.env_timeout_secs),
            workflow: Duration::from_secs_f64(self.workflow_timeout_secs),
        }
    }
}

impl Section for RolloutSection {
    fn rules(&self) -> Result<(), ConfigError> {
        if let Some((i, d)) = self
            .devices
            .iter()
            .enumerate()
            .find(|(_, d)| !super::model::device_spelling_ok(d))
        {
            return Err(ConfigError::range(
                format!("devices[{i}]"),
                format!("{d:?}"),
                super::model::DEVICE_SPELLINGS,
            ));
        }
        let min_context = self.max_prompt_length + self.max_response_length;
        if self.max_context_length < min_context {
            return Err(ConfigError::range(
                "max_context_length",
                self.max_context_length,
                format!(
                    ">= max_prompt_length + max_response_length = {min_context} (room for one turn)"
                ),
            ));
        }
        Ok(())
    }
}
