//! `[env]`: which environment, and the tasks it is trained and evaluated on.

use std::path::PathBuf;
use std::sync::Arc;

use agent_r1_actors::runtime::ContextPolicy;

use agent_r1_envs::config::Section;
use agent_r1_envs::dataset::LoadOptions;
use agent_r1_envs::envs::synthetic_multihop;
use agent_r1_envs::synthetic::SyntheticConfig;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{relabel, ConfigError, FileCheck};
use crate::registries::Registries;

/// `[env]`: which environment, and the tasks it is trained and evaluated on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    /// Registered env name (`multihop_qa`, `synthetic_multihop`, `math`, `synthetic_math`,
    /// or one a user's crate registers).
    pub name: String,
    /// Dataset files trained on (envs that read files; the synthetic ones make their own).
    #[serde(default)]
    pub train_files: Vec<PathBuf>,
    /// Dataset files evaluated on.
    #[serde(default)]
    pub test_files: Vec<PathBuf>,
    /// How dataset files are read (`[env.dataset]`).
    #[serde(default)]
    pub dataset: LoadOptions,
    /// The generated world of `synthetic_multihop` (`[env.world]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world: Option<SyntheticConfig>,
    /// Options handed to the env itself (`[env.options]`: reward, system_prompt, tools,
    /// max_observation_chars, ...); the env rejects keys it does not know.
    #[serde(default)]
    #[schemars(with = "serde_json::Map<String, Value>")]
    pub options: toml::Table,
    /// Tool calls one turn may make, run concurrently and answered in order. At 1
    /// (Agent-R1's default) generation stops at the end of the first call; above, a turn
    /// runs to its end, and calls past the limit are answered with an error, not run.
    #[serde(default = "one_call_per_turn")]
    #[schemars(range(min = 1, max = 64))]
    pub max_tool_calls_per_turn: usize,
    /// What each turn sees of the episode's history (`[env.context]`): `policy` is `full`
    /// (the whole history, the default), `window` (`turns`: the prompt and the last turns),
    /// `elide` (`keep_turns`: older tool responses become `placeholder`), `summary`
    /// (`budget_tokens`: past it the model writes a summary that replaces the history), or
    /// one a user's crate registers; the other keys are the policy's options.
    #[serde(default)]
    #[schemars(with = "serde_json::Map<String, Value>")]
    pub context: toml::Table,
    /// Runs this env's episodes with a registered workflow instead of the built-in loop
    /// (`[env.workflow]`: `name`, e.g. `external_agent`, and the workflow's options). The
    /// env still makes the tasks, their first messages (handed to the workflow as each
    /// task's `prompt`), the warm start's demonstrations and the held-out split; the
    /// workflow's episodes may call the env's tools.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    #[schemars(with = "serde_json::Map<String, Value>")]
    pub workflow: toml::Table,
}

/// The context policy of `[env.context]` when it names none.
pub const DEFAULT_CONTEXT_POLICY: &str = "full";

fn one_call_per_turn() -> usize {
    1
}

impl EnvSection {
    /// The env's rules: a registered name, files where the env reads them, a world only for
    /// the synthetic env, and the env's own options (it is built once, cheaply: no model, no
    /// tools, nothing written).
    pub(super) fn check(
        &self,
        files: FileCheck,
        registries: &Registries,
    ) -> Result<(), ConfigError> {
        let registry = &registries.envs;
        let workflow = registries.workflows.contains(&self.name);
        if !registry.contains(&self.name) && !workflow {
            let mut known = registry.names();
            known.extend(registries.workflows.names());
            return Err(ConfigError::range(
                "env.name",
                format!("{:?}", self.name),
                known.join(", "),
            ));
        }
        let generated = !workflow && registry.generates_tasks(&self.name);
        for (key, list) in [
            ("env.train_files", &self.train_files),
            ("env.test_files", &self.test_files),
        ] {
            if generated && !list.is_empty() {
                return Err(ConfigError::new(
                    key,
                    format!(
                        "{:?} generates its own tasks; remove the files or use an env that reads them",
                        self.name
                    ),
                ));
            }
            if let (Some(missing), FileCheck::Require) = (list.iter().find(|p| !p.is_file()), files)
            {
                return Err(ConfigError::new(
                    key,
                    format!("{}: no such file", missing.display()),
                ));
            }
        }
        if !generated && self.train_files.is_empty() {
            return Err(ConfigError::new(
                "env.train_files",
                format!(
                    "{:?} needs at least one dataset file to train on",
                    self.name
                ),
            ));
        }
        if let Some(world) = &self.world {
            if self.name != synthetic_multihop::NAME {
                return Err(ConfigError::new(
                    "env.world",
                    format!(
                        "only synthetic_multihop has a generated world, not {:?}",
                        self.name
                    ),
                ));
            }
            world.validate().map_err(|e| e.under("env.world"))?;
        }
        self.context_policy(registries)?;
        if !self.workflow.is_empty() {
            self.check_driving_workflow(workflow, registries)?;
        }
        if workflow {
            if !self.context.is_empty() {
                return Err(ConfigError::new(
                    "env.context",
                    format!(
                        "workflow {:?} builds its own contexts; remove [env.context]",
                        self.name
                    ),
                ));
            }
            return registries
                .workflows
                .check(&self.name, &self.options_json())
                .map_err(|err| relabel(err, |k| k.to_string(), "env.options"));
        }
        if self.options.contains_key("world") || self.options.contains_key("corpus_path") {
            return Err(ConfigError::new(
                "env.options",
                "`world` and `corpus_path` are set by the trainer: use [env.world] for the world",
            ));
        }
        registry
            .create(&self.name, &self.options_json())
            .map(|_| ())
            .map_err(|err| {
                relabel(
                    err,
                    |k| match k.strip_prefix("env.") {
                        Some(rest) if rest != "world" && !rest.starts_with("world.") => {
                            format!("env.options.{rest}")
                        }
                        _ if k == "env" => "env.options".into(),
                        _ => k.to_string(),
                    },
                    "env.options",
                )
            })
    }

    /// `[env.workflow]`: a registered workflow, on an env (not a workflow), with options its
    /// kind accepts; errors name their key under `env.workflow`.
    fn check_driving_workflow(
        &self,
        env_is_workflow: bool,
        registries: &Registries,
    ) -> Result<(), ConfigError> {
        if env_is_workflow {
            return Err(ConfigError::new(
                "env.workflow",
                format!(
                    "{:?} is itself a workflow; [env.workflow] runs an env's episodes with one",
                    self.name
                ),
            ));
        }
        let name = self.workflow_name()?;
        if !registries.workflows.contains(name) {
            return Err(ConfigError::range(
                "env.workflow.name",
                format!("{name:?}"),
                registries.workflows.names().join(", "),
            ));
        }
        if !self.context.is_empty() {
            return Err(ConfigError::new(
                "env.context",
                format!("workflow {name:?} builds its own contexts; remove [env.context]"),
            ));
        }
        registries
            .workflows
            .check(name, &self.workflow_options_json())
            .map_err(|err| {
                relabel(
                    err,
                    |k| match k.strip_prefix("env.options") {
                        Some(rest) => format!("env.workflow{rest}"),
                        None => k.to_string(),
                    },
                    "env.workflow",
                )
            })
    }

    /// The workflow `[env.workflow]` names (checked against the registry by
    /// [`Self::check`]).
    pub fn workflow_name(&self) -> Result<&str, ConfigError> {
        match self.workflow.get("name") {
            Some(toml::Value::String(name)) if !name.is_empty() => Ok(name),
            Some(other) => Err(ConfigError::new(
                "env.workflow.name",
                format!("expected a workflow name, got {other}"),
            )),
            None => Err(ConfigError::new(
                "env.workflow.name",
                "missing: the workflow that runs the env's episodes, e.g. \"external_agent\"",
            )),
        }
    }

    /// `[env.workflow]`'s options: every key but `name`.
    pub fn workflow_options_json(&self) -> Value {
        let mut options = self.workflow.clone();
        options.remove("name");
        serde_json::to_value(&options).unwrap_or(Value::Null)
    }

    /// The context policy `[env.context]` names, built from its other keys; errors name
    /// their key (`env.context.policy`, `env.context.turns`).
    pub fn context_policy(
        &self,
        registries: &Registries,
    ) -> Result<Arc<dyn ContextPolicy>, ConfigError> {
        let name = match self.context.get("policy") {
            None => DEFAULT_CONTEXT_POLICY,
            Some(toml::Value::String(name)) => name.as_str(),
            Some(other) => {
                return Err(ConfigError::new(
                    "env.context.policy",
                    format!("expected a policy name, got {other}"),
                ))
            }
        };
        let known = &registries.context_policies;
        if !known.names().contains(&name) {
            return Err(ConfigError::range(
                "env.context.policy",
                format!("{name:?}"),
                known.names().join(", "),
            ));
        }
        let mut options = self.context.clone();
        options.remove("policy");
        let options = serde_json::to_value(&options).unwrap_or(Value::Null);
        known
            .create(name, &options)
            .map_err(|e| relabel(e, |k| k.to_string(), "env.context"))
    }

    /// The env's factory options: `[env.options]` plus `world` for the synthetic env. The
    /// trainer adds `corpus_path` (inside its run directory) before building the real env.
    pub fn options_json(&self) -> Value {
        let mut options = match serde_json::to_value(&self.options) {
            Ok(Value::Object(map)) => map,
            _ => Default::default(),
        };
        if let Some(world) = &self.world {
            if let Ok(w) = serde_json::to_value(world) {
                options.insert("world".into(), w);
            }
        }
        Value::Object(options)
    }
}
