//! A user's own demonstrations as the run will see them: the chat-format JSONL read with the
//! run's tools, tool-call format, calls per turn and env system prompt, and tokenized through
//! the model's chat template. `agent-r1 sft` and `[warm_start] data` both read them here.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::Context;
use serde_json::Value;

use agent_r1_actors::sft::{
    read_chat_demonstrations, tokenize_demonstration, ChatRowRules, SftSequence,
};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::env::Env;
use agent_r1_envs::message::Role;
use agent_r1_envs::task::Task;

use crate::config::TrainConfig;
use crate::registries::Registries;

/// [`chat_row_rules`] for a run of `cfg`, without starting it: the tools' specs without
/// opening a search index, the env built from the config.
pub fn run_rules(cfg: &TrainConfig, registries: &Registries) -> anyhow::Result<ChatRowRules> {
    let specs = cfg
        .tools_config(None)
        .specs(&registries.tools)
        .context("building the tools' specs `[tools.*]`")?;
    let env = if registries.workflows.contains(&cfg.env.name)
        || registries.envs.generates_tasks(&cfg.env.name)
    {
        None
    } else {
        Some(
            registries
                .envs
                .create(&cfg.env.name, &cfg.run_env_options(registries))
                .context("building the env `[env]`")?,
        )
    };
    Ok(chat_row_rules(cfg, specs, env.as_deref()))
}

/// The rules a demonstration must follow in a run of `cfg` whose tools show `specs` and
/// whose env (when it has one) starts episodes with its system prompt.
pub fn chat_row_rules(cfg: &TrainConfig, specs: Vec<Value>, env: Option<&dyn Env>) -> ChatRowRules {
    let names: BTreeSet<String> = specs
        .iter()
        .filter_map(|s| s["function"]["name"].as_str().map(str::to_string))
        .collect();
    let default_system = env.and_then(|env| {
        let probe = Task {
            id: "demonstration".into(),
            data_source: "demonstration".into(),
            question: "?".into(),
            answers: vec![],
            prompt: None,
            extra: Value::Null,
        };
        env.reset(&probe)
            .ok()?
            .into_iter()
            .find(|m| m.role == Role::System)
            .map(|m| m.content)
    });
    ChatRowRules {
        format: cfg.model.resolved_tool_call_format(),
        tools: Some(names),
        max_calls_per_turn: cfg.env.max_tool_calls_per_turn,
        default_tools: Some(cfg.rollout.template_specs(specs)).filter(|s| !s.is_empty()),
        default_system,
    }
}

/// The conversations of `path`, tokenized with their assistant tokens marked.
pub fn tokenized_demonstrations(
    path: &Path,
    rules: &ChatRowRules,
    tokenizer: &HfTokenizer,
) -> anyhow::Result<Vec<SftSequence>> {
    read_chat_demonstrations(path, rules)?
        .iter()
        .enumerate()
        .map(|(i, d)| {
            tokenize_demonstration(tokenizer, d)
                .with_context(|| format!("{}: conversation {}", path.display(), i + 1))
        })
        .collect()
}
