//! What a run will read, read before anything is created: every dataset file row by row,
//! each search corpus document by document, the model's tokenizer, the longest prompt the
//! tasks render to, and the warm start's own demonstrations. `check-config` prints the [`Preflight`]; `train` runs the same
//! checks before it creates its run directory, so a mistake in the data costs one line and
//! exit code 2, not a run directory and a run that cannot learn.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use agent_r1_actors::runtime::TurnRenderer;
use agent_r1_actors::sft::read_chat_demonstrations;
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::dataset::{load_tasks, OnBadRow};
use agent_r1_envs::env::Env;
use agent_r1_envs::task::{Split, Task};

use crate::config::{ConfigError, TrainConfig};
use crate::critic_prefix::{check_fields, TemplatePrefix};
use crate::demonstrations::{run_rules, tokenized_demonstrations};
use crate::registries::Registries;

/// Prompts rendered to find the longest: those with the most characters. Rendering all of a
/// 90,000-question dataset would take a minute; characters and tokens rise together, so the
/// longest in tokens is among the longest in characters.
const PROMPTS_RENDERED: usize = 256;

/// What a run will read, as read.
#[derive(Debug, Default)]
pub struct Preflight {
    /// Each dataset file with its key, its tasks and its skipped bad rows.
    pub files: Vec<DataFile>,
    /// Each search corpus with the key that names it and its documents.
    pub corpora: Vec<(String, PathBuf, usize)>,
    /// The longest prompt in tokens, when the model's tokenizer is at hand.
    pub longest_prompt: Option<LongestPrompt>,
    /// `warm_start.data` and its conversations.
    pub demonstrations: Option<(PathBuf, usize)>,
    /// `critic.prefix`: the longest rendered prefix in tokens (when the model's tokenizer
    /// is at hand) and its budget.
    pub critic_prefix: Option<(Option<usize>, usize)>,
    /// Things that will not stop the run but may make it useless.
    pub warnings: Vec<String>,
}

/// One dataset file.
#[derive(Debug)]
pub struct DataFile {
    /// `env.train_files` or `env.test_files`.
    pub key: &'static str,
    /// The file.
    pub path: PathBuf,
    /// Tasks read.
    pub tasks: usize,
    /// Bad rows skipped (`env.dataset.on_bad_row = "skip"`).
    pub skipped: usize,
}

/// The longest rendered prompt and the limit it is held to.
#[derive(Debug)]
pub struct LongestPrompt {
    /// Its length in tokens (the system prompt and tool specs included).
    pub tokens: usize,
    /// The task it belongs to.
    pub task: String,
    /// The limit and its key.
    pub limit: usize,
    /// `rollout.max_prompt_length` or `rollout.max_context_length`.
    pub key: &'static str,
}

impl fmt::Display for Preflight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for file in &self.files {
            write!(
                f,
                "data: {} {}: {} tasks",
                file.key,
                file.path.display(),
                file.tasks
            )?;
            if file.skipped > 0 {
                write!(f, " ({} bad rows skipped)", file.skipped)?;
            }
            writeln!(f)?;
        }
        for (key, path, documents) in &self.corpora {
            writeln!(f, "corpus: {key} {}: {documents} documents", path.display())?;
        }
        if let Some(p) = &self.longest_prompt {
            writeln!(
                f,
                "longest prompt: {} tokens (task {}), limit {} ({})",
                p.tokens, p.task, p.limit, p.key
            )?;
        }
        if let Some((path, conversations)) = &self.demonstrations {
            writeln!(
                f,
                "demonstrations: warm_start.data {}: {conversations} conversations",
                path.display()
            )?;
        }
        if let Some((longest, budget)) = &self.critic_prefix {
            match longest {
                Some(tokens) => writeln!(
                    f,
                    "critic prefix: the longest is {tokens} tokens, budget {budget} (critic.prefix_max_tokens)"
                )?,
                None => writeln!(
                    f,
                    "critic prefix: every task has its fields (lengths are checked when the preset's tokenizer exists)"
                )?,
            }
        }
        for warning in &self.warnings {
            writeln!(f, "warning: {warning}")?;
        }
        Ok(())
    }
}

/// Reads what a run of `cfg` will read; the first problem is the error, naming its config
/// key, the file and row, and what to do.
pub fn preflight(cfg: &TrainConfig, registries: &Registries) -> Result<Preflight, ConfigError> {
    let mut report = Preflight::default();
    let (train, test) = read_data(cfg, &mut report)?;
    read_corpora(cfg, registries, &mut report)?;
    let tokenizer = match &cfg.model.dir {
        Some(dir) => Some(Arc::new(HfTokenizer::from_dir(dir).map_err(|e| {
            ConfigError::new(
                "model.dir",
                format!(
                    "{e}; the directory needs the model's tokenizer.json and tokenizer_config.json"
                ),
            )
        })?)),
        None => None,
    };
    // The env the run builds, built once: its reset renders the prompts (with a tokenizer),
    // and a generating env's tasks are checked like a dataset's (for the critic's prefix).
    let generates = registries.envs.generates_tasks(&cfg.env.name);
    let env = if tokenizer.is_some() || (cfg.critic.prefix.is_some() && generates) {
        run_env(cfg, registries)?
    } else {
        None
    };
    let checks_tasks = (tokenizer.is_some() && env.is_some()) || cfg.critic.prefix.is_some();
    let tasks: Vec<Task> = if checks_tasks {
        train
            .iter()
            .chain(&test)
            .chain(env.iter().flat_map(|e| &e.generated))
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    // Workflows build their own prompts: no env renders one.
    if let (Some(tokenizer), Some(env)) = (&tokenizer, &env) {
        report.longest_prompt =
            longest_prompt(cfg, registries, tokenizer.clone(), env.env.as_ref(), &tasks)?;
    }
    if cfg.critic.prefix.is_some() {
        let longest = match &tokenizer {
            Some(tokenizer) => {
                let prefix = TemplatePrefix::new(&cfg.critic, tokenizer.clone())?
                    .expect("a prefix is configured");
                Some(prefix.check(&tasks)?)
            }
            None => {
                check_fields(&cfg.critic, &tasks)?;
                None
            }
        };
        report.critic_prefix = Some((longest, cfg.critic.prefix_max_tokens));
    }
    if let Some(data) = &cfg.warm_start.data {
        let problem = |e: anyhow::Error| ConfigError::new("warm_start.data", format!("{e:#}"));
        let rules = run_rules(cfg, registries).map_err(problem)?;
        let conversations = match &tokenizer {
            Some(tokenizer) => tokenized_demonstrations(data, &rules, tokenizer)
                .map_err(problem)?
                .len(),
            None => read_chat_demonstrations(data, &rules)
                .map_err(|e| problem(e.into()))?
                .len(),
        };
        report.demonstrations = Some((data.clone(), conversations));
    }
    let generated = registries.envs.generates_tasks(&cfg.env.name)
        && !registries.workflows.contains(&cfg.env.name);
    if !generated && cfg.env.test_files.is_empty() {
        report.warnings.push(
            "no held-out tasks (env.test_files is empty): the run evaluates nothing and \
             reports no held-out EM"
                .into(),
        );
    }
    Ok(report)
}

/// The env a run builds, with the tasks it generates (none for a dataset env).
struct RunEnv {
    env: Box<dyn Env>,
    generated: Vec<Task>,
}

/// The env the run builds; `None` for a workflow, which builds none.
fn run_env(cfg: &TrainConfig, registries: &Registries) -> Result<Option<RunEnv>, ConfigError> {
    if registries.workflows.contains(&cfg.env.name) {
        return Ok(None);
    }
    let options = cfg.run_env_options(registries);
    let env_error = |e: agent_r1_envs::Error| ConfigError::new("env", e.to_string());
    Ok(Some(if registries.envs.generates_tasks(&cfg.env.name) {
        let env = registries
            .envs
            .create_generated(&cfg.env.name, &options)
            .map_err(env_error)?;
        let mut generated = env.tasks(Split::Train);
        generated.extend(env.tasks(Split::Test));
        RunEnv { env, generated }
    } else {
        RunEnv {
            env: registries
                .envs
                .create(&cfg.env.name, &options)
                .map_err(env_error)?,
            generated: Vec::new(),
        }
    }))
}

/// Every dataset file, read as the run reads it.
fn read_data(
    cfg: &TrainConfig,
    report: &mut Preflight,
) -> Result<(Vec<Task>, Vec<Task>), ConfigError> {
    let mut splits = (Vec::new(), Vec::new());
    for (key, paths) in [
        ("env.train_files", &cfg.env.train_files),
        ("env.test_files", &cfg.env.test_files),
    ] {
        for path in paths {
            let loaded = load_tasks(path, &cfg.env.dataset).map_err(|e| {
                let advice = match cfg.env.dataset.on_bad_row {
                    OnBadRow::Fail => {
                        "; fix the row, or set env.dataset.on_bad_row = \"skip\" to leave bad rows out"
                    }
                    OnBadRow::Skip => "",
                };
                ConfigError::new(key, format!("{e}{advice}"))
            })?;
            if loaded.tasks.is_empty() {
                let why = match loaded.skipped.first() {
                    Some(first) => format!("every row is bad (first: {first})"),
                    None => "the file has no rows".into(),
                };
                return Err(ConfigError::new(
                    key,
                    format!("{}: no tasks: {why}", path.display()),
                ));
            }
            if let Some(first) = loaded.skipped.first() {
                report.warnings.push(format!(
                    "{key}: {} bad rows of {} skipped (first: {first})",
                    loaded.skipped.len(),
                    path.display()
                ));
            }
            report.files.push(DataFile {
                key,
                path: path.clone(),
                tasks: loaded.tasks.len(),
                skipped: loaded.skipped.len(),
            });
            let split = if key == "env.train_files" {
                &mut splits.0
            } else {
                &mut splits.1
            };
            split.extend(loaded.tasks);
        }
    }
    Ok(splits)
}

/// Every document of every search corpus (the synthetic world's is written by the run).
fn read_corpora(
    cfg: &TrainConfig,
    registries: &Registries,
    report: &mut Preflight,
) -> Result<(), ConfigError> {
    let tools = cfg.tools_config(None);
    let corpora = tools
        .search_corpora()
        .map_err(|e| ConfigError::new("tools", e.to_string()))?;
    for (table, corpus) in corpora {
        let Some(corpus) = corpus else { continue };
        if !registries.tools.is_builtin_search() {
            continue;
        }
        let key = if cfg
            .tools
            .get(&table)
            .is_some_and(|t| t.contains_key("corpus"))
        {
            format!("tools.{table}.corpus")
        } else {
            "env.options.corpus".to_string()
        };
        let mut documents = 0;
        corpus
            .for_each_document(|_, _, _| {
                documents += 1;
                Ok(())
            })
            .map_err(|e| {
                let advice = match e {
                    agent_r1_envs::Error::Io { .. } => "; give the path of the corpus file",
                    _ => {
                        "; the corpus is a JSONL file of {\"id\", \"title\", \"text\"} \
                         documents ({ jsonl = \"docs.jsonl\" }) or HotpotQA files \
                         ({ hotpotqa = [\"f.json\"] })"
                    }
                };
                ConfigError::new(key.as_str(), format!("{e}{advice}"))
            })?;
        if documents == 0 {
            return Err(ConfigError::new(
                key.as_str(),
                "the corpus has no documents: the search tool would find nothing",
            ));
        }
        let first = corpus.files().first().map(|p| p.to_path_buf());
        report
            .corpora
            .push((key, first.unwrap_or_default(), documents));
    }
    Ok(())
}

/// The longest prompt the run's env renders from the tasks, held to
/// `rollout.max_prompt_length` (and the context length less room for a turn), as the
/// episode holds it. `None` when there are no tasks.
fn longest_prompt(
    cfg: &TrainConfig,
    registries: &Registries,
    tokenizer: Arc<HfTokenizer>,
    env: &dyn Env,
    tasks: &[Task],
) -> Result<Option<LongestPrompt>, ConfigError> {
    let specs = cfg
        .tools_config(None)
        .specs(&registries.tools)
        .map_err(|e| ConfigError::new("tools", e.to_string()))?;
    let specs = cfg.rollout.template_specs(specs);
    let renderer = TurnRenderer::new(tokenizer, specs, cfg.model.tool_call_format)
        .map_err(|e| ConfigError::new("model.dir", e.to_string()))?;
    let mut prompts = Vec::new();
    for task in tasks {
        let messages = env.reset(task).map_err(|e| {
            ConfigError::new(
                "env",
                format!("task {}: the env's reset failed: {e}", task.id),
            )
        })?;
        let chars: usize = messages.iter().map(|m| m.content.len()).sum();
        prompts.push((chars, task, messages));
    }
    prompts.sort_by_key(|(chars, _, _)| std::cmp::Reverse(*chars));
    let mut longest: Option<(usize, &Task)> = None;
    for (_, task, messages) in prompts.iter().take(PROMPTS_RENDERED) {
        let tokens = renderer
            .prompt(messages)
            .map_err(|e| ConfigError::new("model.dir", format!("rendering task {}: {e}", task.id)))?
            .len();
        if longest.is_none_or(|(t, _)| tokens > t) {
            longest = Some((tokens, task));
        }
    }
    let Some((tokens, task)) = longest else {
        return Ok(None);
    };
    let by_context = cfg.rollout.max_context_length.saturating_sub(2);
    let (limit, key) = if cfg.rollout.max_prompt_length <= by_context {
        (cfg.rollout.max_prompt_length, "rollout.max_prompt_length")
    } else {
        (by_context, "rollout.max_context_length")
    };
    if tokens > limit {
        return Err(ConfigError::new(
            key,
            format!(
                "the longest prompt (task {}) is {tokens} tokens with the system prompt and \
                 tool specs, over {limit}: every such episode would end before its first \
                 turn; raise {key} to at least {tokens}, or shorten env.options.system_prompt",
                task.id,
            ),
        ));
    }
    Ok(Some(LongestPrompt {
        tokens,
        task: task.id.clone(),
        limit,
        key,
    }))
}
