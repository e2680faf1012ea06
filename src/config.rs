//! The `agent-r1 train` config: one TOML file, checked completely before anything heavy starts.
//!
//! A training run takes hours; a typo found after the model has loaded wastes minutes and a
//! silently ignored key wastes the run. So every section rejects unknown keys, types are
//! checked by serde (the error names the key path, e.g. `algorithm.ppo_epochs`, and the
//! line), and [`TrainConfig::validate`] checks ranges, cross-section rules and (optionally)
//! that the files named exist. Every error is one [`ConfigError`]: the key, what was given,
//! what is allowed.
//!
//! Each section is defined once, by the crate that uses it: `[algorithm]`, `[learner]` and
//! `[critic]` are the learner's own types, `[stall]` the stall detector's, `[env.dataset]`
//! and `[env.world]` the envs crate's; the rest live in this module's files. A field's doc
//! comment, default and declared range (`#[schemars(range(..))]`) are its whole definition:
//! the range checks and `check-config --explain` ([`explain`]) read them from the schema.
//! Relative paths are relative to the working directory, as for tools.

mod cluster;
mod distill;
mod env;
mod lora;
mod metrics;
mod model;
mod rollout;
mod run;
#[cfg(test)]
mod tests;
mod tools;
mod warm_start;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use agent_r1_actors::engine::EngineConfig;
use agent_r1_actors::learner::{
    AlgorithmConfig, CriticConfig, DistillConfig, LearnerConfig, MemoryConfig,
};
use agent_r1_actors::model::{LoraConfig, Placement};
use agent_r1_actors::stall::StallConfig;
use agent_r1_envs::access::BearerToken;
use agent_r1_envs::config::{check_declared, key_docs, KeyDoc, Section};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The one config error type (the envs crate's): file, key, line and column, given versus allowed.
pub use agent_r1_envs::config::ConfigError;
pub use cluster::{ClusterSection, ClusterTls};
pub use distill::check_teacher;
pub use env::EnvSection;
pub use metrics::MetricsSection;
pub use model::ModelSection;
pub use rollout::RolloutSection;
pub use run::{CheckpointSection, EvalSection, TrainMode, TrainingSection};
pub use warm_start::{BadHabitSection, WarmStartSection};

use crate::registries::Registries;
use crate::setup::RolloutKnobs;

/// Requests waiting for the learner thread before a caller is refused as overloaded.
pub(crate) const LEARNER_QUEUE_CAPACITY: usize = 4;
/// Longest a caller waits for the learner's answer (its wait behind queued work included).
pub(crate) const LEARNER_REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);
/// Token budget of an engine's running batch (contexts plus their new tokens).
pub(crate) const ENGINE_MAX_BATCH_TOKENS: usize = 64 * 2048;
/// Deadline of a turn asked of an engine without one of its own (an episode's turn has
/// `rollout.generate_timeout_secs`).
pub(crate) const ENGINE_REQUEST_TIMEOUT: Duration = Duration::from_secs(1800);
/// Turns an engine accepts (queued or running) before callers wait for admission.
pub(crate) const ENGINE_MAX_PENDING: usize = 8192;

/// Keys that moved, with where to: an old config gets told where the key went.
const MOVED_KEYS: &[(&str, &str)] = &[
    ("training.update_timeout_secs", "stall.learner_secs"),
    ("training.publish_timeout_secs", "stall.publish_secs"),
];

/// Built-in training configs, `agent-r1 train --preset NAME`: the commented files in
/// `examples/`, compiled in so that `make demo` needs no path.
pub const PRESETS: &[(&str, &str)] = &[
    ("demo", include_str!("../examples/demo.toml")),
    ("math", include_str!("../examples/math.toml")),
];

/// The text of the built-in config `name` (see [`PRESETS`]).
pub fn preset_text(name: &str) -> Result<&'static str, ConfigError> {
    match PRESETS.iter().find(|(n, _)| *n == name) {
        Some((_, text)) => Ok(text),
        None => {
            let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            Err(ConfigError::new(
                "",
                format!(
                    "--preset: unknown preset `{name}` (allowed: {})",
                    names.join(", ")
                ),
            ))
        }
    }
}

/// Whether [`TrainConfig::validate`] checks that named files exist. `Skip` lets a config be
/// checked on a machine without the data (CI, or before a download).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileCheck {
    /// Model directories and dataset files must exist.
    Require,
    /// Paths are not looked at.
    Skip,
}

/// The whole training config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// The policy model.
    pub model: ModelSection,
    /// The environment and its data.
    pub env: EnvSection,
    /// Tools by table name (`[tools.NAME]`): `type` (the kind; default the table's name) and
    /// the kind's own options, read by the kind's factory as `train` builds it.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, serde_json::Map<String, Value>>")]
    pub tools: BTreeMap<String, toml::Table>,
    /// A scorer that gives the reward in place of the env's (`type = "http_judge"`, or a
    /// registered kind); its other keys are the kind's options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    pub scorer: Option<toml::Table>,
    /// Advantage estimator and optimiser.
    #[serde(default)]
    pub algorithm: AlgorithmConfig,
    /// Where the critic of `gae` / `step_gae` lives.
    #[serde(default)]
    pub critic: CriticConfig,
    /// On-policy distillation from a teacher model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distill: Option<DistillConfig>,
    /// Train LoRA adapters beside the frozen base instead of the full weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
    /// How the learner bounds its memory.
    #[serde(default)]
    pub learner: MemoryConfig,
    /// How episodes are sampled.
    #[serde(default)]
    pub rollout: RolloutSection,
    /// Length and mode of the run.
    #[serde(default)]
    pub training: TrainingSection,
    /// Checkpoint cadence and retention.
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    /// Held-out evaluation.
    #[serde(default)]
    pub eval: EvalSection,
    /// Prometheus endpoint.
    #[serde(default)]
    pub metrics: MetricsSection,
    /// Supervised warm start before RL (envs that generate their tasks).
    #[serde(default)]
    pub warm_start: WarmStartSection,
    /// The stall detector's deadline per stage.
    #[serde(default)]
    pub stall: StallConfig,
    /// Remote rollout workers and the weight server.
    #[serde(default)]
    pub cluster: ClusterSection,
}

/// Every key of the config with its type, default, allowed values and meaning, sorted
/// (`check-config --explain`); then the options of each env that describes them, as
/// `env.options.KEY`, and of each tool kind, as `tools.KIND.KEY` (a table named after its
/// kind).
pub fn explain(registries: &Registries) -> Vec<KeyDoc> {
    let mut docs = key_docs::<TrainConfig>();
    for env in registries.envs.names() {
        docs.extend(registries.envs.option_keys(env).into_iter().map(|mut doc| {
            doc.key = format!("env.options.{}", doc.key);
            doc.meaning = format!("({env} env) {}", doc.meaning);
            doc
        }));
    }
    for workflow in registries.workflows.names() {
        docs.extend(
            registries
                .workflows
                .keys(workflow)
                .into_iter()
                .map(|mut doc| {
                    doc.key = format!("env.workflow.{}", doc.key);
                    doc.meaning = format!(
                        "({workflow} workflow; under [env.options] when [env] names it) {}",
                        doc.meaning
                    );
                    doc
                }),
        );
    }
    for kind in registries.tools.names() {
        docs.extend(
            registries
                .tools
                .option_keys(kind)
                .into_iter()
                .map(|mut doc| {
                    doc.key = format!("tools.{kind}.{}", doc.key);
                    doc.meaning = format!("({kind} tool) {}", doc.meaning);
                    doc
                }),
        );
    }
    docs
}

/// One key as `check-config --explain` prints it: `key = default  # type; allowed; meaning`
/// (a key without a default has no `= ...`), so the line is itself TOML.
pub fn explain_line(doc: &KeyDoc) -> String {
    let assignment = match &doc.default {
        Some(default) => format!("{} = {default}", doc.key),
        None => doc.key.clone(),
    };
    format!(
        "{assignment}  # {}; {}; {}",
        doc.kind, doc.allowed, doc.meaning
    )
}

impl TrainConfig {
    /// Parses TOML text: syntax, unknown keys and types. Ranges are [`Self::validate`]'s job.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let de = toml::Deserializer::parse(text).map_err(|e| toml_error(text, "", &e))?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            let key = if key == "." { String::new() } else { key };
            let mut error = toml_error(text, &key, e.inner());
            let moved = MOVED_KEYS.iter().find(|(old, _)| {
                let (section, field) = old.rsplit_once('.').unwrap_or(("", old));
                (key == section || key == *old)
                    && error.message.contains(&format!("unknown field `{field}`"))
            });
            if let Some((_, new)) = moved {
                error.message = format!("{}; this key moved to `{new}`", error.message);
            }
            error
        })
    }

    /// A built-in config by name (see [`PRESETS`]), parsed and validated like a file.
    pub fn preset(
        name: &str,
        files: FileCheck,
        registries: &Registries,
    ) -> Result<Self, ConfigError> {
        let config = Self::from_toml_str(preset_text(name)?)?;
        config.validate(files, registries)?;
        Ok(config)
    }

    /// Reads, parses and validates a config file.
    pub fn load(
        path: &Path,
        files: FileCheck,
        registries: &Registries,
    ) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new("", format!("cannot read the config: {e}")).in_file(path)
        })?;
        let config = Self::from_toml_str(&text).map_err(|e| e.in_file(path))?;
        config
            .validate(files, registries)
            .map_err(|e| e.in_file(path))?;
        Ok(config)
    }

    /// Checks every declared range, each section's own rules and the rules across sections,
    /// builds the env, tools and scorer options once (cheap: no model) so that their own
    /// option errors surface now, and with [`FileCheck::Require`] checks that the model
    /// directory and dataset files exist.
    pub fn validate(&self, files: FileCheck, registries: &Registries) -> Result<(), ConfigError> {
        check_declared(self)?;
        let placed = |section: &'static str| move |e: ConfigError| e.under(section);
        self.model.rules().map_err(placed("model"))?;
        self.model.check_files(files)?;
        self.env.check(files, registries)?;
        self.env
            .context_policy(registries)?
            .check_fits(self.rollout.max_context_length)
            .map_err(|message| ConfigError::new("env.context", message))?;
        self.check_tools_and_scorer(registries)?;
        self.critic.rules().map_err(placed("critic"))?;
        self.check_critic(files)?;
        self.check_distill(files)?;
        self.check_lora(files)?;
        self.learner
            .fits(self.rollout.max_context_length)
            .map_err(placed("learner"))?;
        self.check_learner_ranks()?;
        self.rollout.rules().map_err(placed("rollout"))?;
        let estimator = self.algorithm.estimator;
        if estimator.compares_groups() && self.rollout.group_size < 2 {
            return Err(ConfigError::range(
                "rollout.group_size",
                self.rollout.group_size,
                format!(
                    ">= 2 with algorithm.estimator = {:?} (it compares episodes within a group)",
                    estimator.as_str()
                ),
            ));
        }
        self.training.rules().map_err(placed("training"))?;
        self.metrics.rules().map_err(placed("metrics"))?;
        self.cluster.rules().map_err(placed("cluster"))?;
        if let FileCheck::Require = files {
            let tls = self.cluster.tls.as_ref();
            for (key, path) in [
                ("cluster.cookie_file", self.cluster.cookie_file.as_ref()),
                ("cluster.tls.cert", tls.map(|t| &t.cert)),
                ("cluster.tls.key", tls.map(|t| &t.key)),
            ] {
                if let Some(path) = path.filter(|p| !p.is_file()) {
                    return Err(ConfigError::new(
                        key,
                        format!("{}: no such file", path.display()),
                    ));
                }
            }
        }
        if let FileCheck::Require = files {
            // Read now, so a token too short or not fit for a header is refused before any
            // work, like a missing file.
            for (key, path) in [
                (
                    "cluster.weights_token_file",
                    &self.cluster.weights_token_file,
                ),
                ("metrics.token_file", &self.metrics.token_file),
            ] {
                if let Some(path) = path {
                    BearerToken::read(key, path)?;
                }
            }
        }
        self.check_warm_start(registries)
    }

    fn check_learner_ranks(&self) -> Result<(), ConfigError> {
        let l = &self.learner;
        if l.ranks == 1 && l.shard != agent_r1_actors::learner::ShardMode::Replicated {
            return Err(ConfigError::new(
                "learner.shard",
                format!(
                    "{:?} shards across learner ranks; with learner.ranks = 1 there is nothing \
                     to shard (set learner.ranks >= 2, or shard = \"replicated\")",
                    l.shard.as_str()
                ),
            ));
        }
        if l.shard == agent_r1_actors::learner::ShardMode::Parameters {
            if !l.recompute {
                return Err(ConfigError::new(
                    "learner.shard",
                    "\"parameters\" gathers each decoder layer only while it runs, so its \
                     backward pass must recompute it: set learner.recompute = true (or shard = \
                     \"optimizer_state\")",
                ));
            }
            if self.lora.is_some() {
                return Err(ConfigError::new(
                    "learner.shard",
                    "\"parameters\" does not shard LoRA adapters over a frozen base: with [lora] \
                     use shard = \"replicated\" or \"optimizer_state\"",
                ));
            }
        }
        if l.ranks > 1 && self.model.device.starts_with("cuda") {
            return Err(ConfigError::new(
                "learner.ranks",
                format!(
                    "{} with model.device = {:?}: learner ranks run on the CPU (torch.distributed \
                     with Gloo; NCCL ranks on GPUs are not built in): set model.device = \"cpu\" \
                     or learner.ranks = 1",
                    l.ranks, self.model.device
                ),
            ));
        }
        Ok(())
    }

    fn check_distill(&self, files: FileCheck) -> Result<(), ConfigError> {
        let Some(d) = &self.distill else {
            return Ok(());
        };
        d.rules().map_err(|e| e.under("distill"))?;
        match (files, &self.model.dir) {
            (FileCheck::Skip, _) => Ok(()),
            (FileCheck::Require, Some(policy)) => distill::check_teacher(policy, &d.teacher),
            // A policy made at start-up (a preset) is compared when `train` has made it.
            (FileCheck::Require, None) => model::model_dir("distill.teacher", &d.teacher),
        }
    }

    fn check_critic(&self, files: FileCheck) -> Result<(), ConfigError> {
        let c = &self.critic;
        if (c.separate || c.model.is_some()) && !self.algorithm.estimator.needs_critic() {
            return Err(ConfigError::new(
                "critic",
                format!(
                    "a separate critic is set but estimator {:?} has none (estimators with a \
                     critic: gae, step_gae)",
                    self.algorithm.estimator.as_str()
                ),
            ));
        }
        match (&c.model, files) {
            (Some(dir), FileCheck::Require) => model::model_dir("critic.model", dir),
            _ => Ok(()),
        }
    }

    fn check_warm_start(&self, registries: &Registries) -> Result<(), ConfigError> {
        let envs = &registries.envs;
        if self.warm_start.data.is_some() {
            if self.warm_start.steps == 0 {
                return Err(ConfigError::new(
                    "warm_start.steps",
                    "0 with warm_start.data: set the number of supervised steps (e.g. 80)",
                ));
            }
            if self.warm_start.bad_habit.is_some() {
                return Err(ConfigError::new(
                    "warm_start.bad_habit",
                    "teaches a habit on generated demonstrations; remove it with warm_start.data",
                ));
            }
            return Ok(());
        }
        if self.warm_start.steps == 0 || envs.generates_tasks(&self.env.name) {
            return Ok(());
        }
        let generating: Vec<&str> = envs
            .names()
            .into_iter()
            .filter(|n| envs.generates_tasks(n))
            .collect();
        Err(ConfigError::new(
            "warm_start.steps",
            format!(
                "only envs that generate their own tasks ({}) make demonstrations, not {:?}; give \
                 your own in warm_start.data, or set steps = 0",
                generating.join(", "),
                self.env.name
            ),
        ))
    }

    /// The learner's settings: `[algorithm]` and `[learner]` as they are, plus the rollout's
    /// temperature and context length, the staleness bound (async only) and the seed.
    pub fn learner_config(&self) -> LearnerConfig {
        let t = &self.training;
        let asynchronous = t.mode == TrainMode::Async;
        LearnerConfig {
            algorithm: self.algorithm.clone(),
            memory: self.learner.clone(),
            temperature: self.rollout.temperature,
            max_len: self.rollout.max_context_length,
            max_staleness: asynchronous.then_some(t.max_staleness),
            behavior_weight_cap: t.decoupled_ppo.then_some(t.behavior_weight_cap),
            seed: t.seed,
            // A fresh start's version; `start_learner` sets a resumed run's checkpoint version.
            initial_version: 0,
            queue_capacity: LEARNER_QUEUE_CAPACITY,
            request_timeout: LEARNER_REQUEST_TIMEOUT,
            distill: self.distill.clone(),
        }
    }

    /// One engine's settings from `[rollout]` and the seed: a batch of `concurrency` rows
    /// with KV reuse, or one row without it for a `deterministic` rollout (so no token's
    /// arithmetic depends on another's). `train` and `eval` start their engines from this;
    /// each engine of a set differs only in its metrics label.
    pub fn engine_config(&self) -> EngineConfig {
        let r = &self.rollout;
        let (rows, kv_reuse) = match r.deterministic {
            true => (1, false),
            false => (r.concurrency.max(1), true),
        };
        EngineConfig {
            max_batch_rows: rows,
            max_context: r.max_context_length,
            parked_kv_bytes: r.parked_kv_mib.saturating_mul(1 << 20),
            prefault_parked_kv: r.prefault_parked_kv,
            memory_fraction: r.memory_fraction,
            cuda_graphs: r.cuda_graphs,
            max_prefill_tokens: r.max_prefill_tokens,
            // A token is drawn from (seed, episode, position): what an episode samples does
            // not depend on which engine it was routed to.
            seed: self.training.seed as i64,
            kv_reuse,
            max_batch_tokens: ENGINE_MAX_BATCH_TOKENS,
            max_pending: ENGINE_MAX_PENDING,
            request_timeout: ENGINE_REQUEST_TIMEOUT,
            // An engine of a set gets its index (`start_engines`).
            metrics_label: "0".into(),
        }
    }

    /// The settings of the rollout's episodes: `[rollout]`, the model's tool-call format
    /// and `env.max_tool_calls_per_turn`. `train`'s held-out evaluation and `eval` start
    /// from these.
    pub fn rollout_knobs(&self) -> RolloutKnobs {
        let r = &self.rollout;
        RolloutKnobs {
            concurrency: r.concurrency,
            max_turns: r.max_turns,
            max_context: r.max_context_length,
            max_prompt: Some(r.max_prompt_length),
            max_new_tokens: r.max_response_length,
            temperature: r.temperature,
            top_p: r.top_p,
            tool_call_format: self.model.tool_call_format,
            max_tool_calls_per_turn: self.env.max_tool_calls_per_turn,
            tool_schemas_in_prompt: r.tool_schemas_in_prompt,
            waits: r.waits(),
        }
    }

    /// The env's factory options (see [`EnvSection::options_json`]).
    pub fn env_options(&self) -> Value {
        self.env.options_json()
    }

    /// The options a run builds its env with: [`Self::env_options`], plus the model's
    /// tool-call format for an env that reads tool calls and names none itself.
    pub fn run_env_options(&self, registries: &Registries) -> Value {
        const TOOL_CALL_FORMAT_KEY: &str = "tool_call_format";
        let mut options = self.env_options();
        if let Value::Object(map) = &mut options {
            let reads_calls = registries
                .envs
                .option_keys(&self.env.name)
                .iter()
                .any(|k| k.key == TOOL_CALL_FORMAT_KEY);
            if reads_calls && !map.contains_key(TOOL_CALL_FORMAT_KEY) {
                let format = self.model.resolved_tool_call_format();
                map.insert(TOOL_CALL_FORMAT_KEY.into(), json!(format.name()));
            }
        }
        options
    }

    /// Device and dtype, checked against this machine (see [`ModelSection::placement`]).
    pub fn placement(&self) -> Result<Placement, ConfigError> {
        self.model.placement()
    }

    /// Where the engines run, labelled by device: `rollout.devices`, or the one engine on
    /// `model.device`; checked against this machine like [`Self::placement`].
    pub fn engine_placements(&self) -> Result<Vec<(String, Placement)>, ConfigError> {
        if self.rollout.devices.is_empty() {
            return Ok(vec![(self.model.device.clone(), self.placement()?)]);
        }
        self.rollout
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let key = format!("rollout.devices[{i}]");
                Ok((d.clone(), self.model.placement_on(d, &key)?))
            })
            .collect()
    }

    /// The resolved config as TOML (every default filled in), for logs and `check-config`.
    pub fn to_toml_string(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }
}

/// Turns a toml/serde error into a [`ConfigError`] with the key path and line/column.
fn toml_error(text: &str, key: &str, e: &toml::de::Error) -> ConfigError {
    let error = ConfigError::new(key, e.message().trim().replace('\n', "; "));
    match e.span().map(|span| line_column(text, span.start)) {
        Some((line, column)) => error.at(line, column),
        None => error,
    }
}

/// 1-based line and column (in characters) of byte offset `at`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit_once('\n')
        .map_or(before, |(_, l)| l)
        .chars()
        .count()
        + 1;
    (line, column)
}

/// An envs-crate error as a [`ConfigError`], its key rewritten into this file's layout.
fn relabel(err: agent_r1_envs::Error, key: impl Fn(&str) -> String, fallback: &str) -> ConfigError {
    match err {
        agent_r1_envs::Error::Config { key: k, message } => ConfigError::new(key(&k), message),
        other => ConfigError::new(fallback, other.to_string()),
    }
}
