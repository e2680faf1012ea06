//! `[critic] prefix`: the asymmetric critic's text, rendered from each task's fields and
//! tokenized with the policy's tokenizer, held to `critic.prefix_max_tokens`.

use std::sync::Arc;

use crate::config::ConfigError;
use agent_r1_actors::learner::{CriticConfig, CriticPrefix};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_envs::task::Task;
use agent_r1_envs::task_template::TaskTemplate;

/// The configured template with the tokenizer it is read with.
#[derive(Debug)]
pub struct TemplatePrefix {
    template: TaskTemplate,
    tokenizer: Arc<HfTokenizer>,
    max_tokens: usize,
}

impl TemplatePrefix {
    /// The prefix `critic` configures, `None` without one.
    pub fn new(
        critic: &CriticConfig,
        tokenizer: Arc<HfTokenizer>,
    ) -> Result<Option<Self>, ConfigError> {
        let Some(template) = template(critic)? else {
            return Ok(None);
        };
        Ok(Some(Self {
            template,
            tokenizer,
            max_tokens: critic.prefix_max_tokens,
        }))
    }

    /// The prefix ids of `task`; the error names the task and what is wrong.
    pub fn render(&self, task: &Task) -> Result<Vec<u32>, String> {
        let text = self
            .template
            .render(task)
            .map_err(|e| format!("task {}: {e}", task.id))?;
        let ids = self
            .tokenizer
            .encode(&text, false)
            .map_err(|e| format!("task {}: {e}", task.id))?;
        if ids.len() > self.max_tokens {
            return Err(format!(
                "task {}: the rendered prefix is {} tokens, over critic.prefix_max_tokens = {}; \
                 raise it or shorten the template",
                task.id,
                ids.len(),
                self.max_tokens
            ));
        }
        Ok(ids)
    }

    /// Renders every task; the first that fails is the error (on `critic.prefix`, or on
    /// `critic.prefix_max_tokens` when it is too long). Returns the longest prefix in tokens.
    pub fn check<'a>(
        &self,
        tasks: impl IntoIterator<Item = &'a Task>,
    ) -> Result<usize, ConfigError> {
        let mut longest = 0;
        for task in tasks {
            let ids = self.render(task).map_err(|e| {
                let key = if e.contains("prefix_max_tokens") {
                    "critic.prefix_max_tokens"
                } else {
                    "critic.prefix"
                };
                ConfigError::new(key, e)
            })?;
            longest = longest.max(ids.len());
        }
        Ok(longest)
    }
}

impl CriticPrefix for TemplatePrefix {
    fn ids(&self, task: &Task) -> agent_r1_actors::Result<Vec<u32>> {
        self.render(task)
            .map_err(|e| agent_r1_actors::Error::invalid("critic.prefix", e))
    }
}

/// Renders every task with `critic.prefix` (no tokenizer: the fields only); the first task
/// that lacks a field is the error.
pub fn check_fields<'a>(
    critic: &CriticConfig,
    tasks: impl IntoIterator<Item = &'a Task>,
) -> Result<(), ConfigError> {
    let Some(template) = template(critic)? else {
        return Ok(());
    };
    for task in tasks {
        template
            .render(task)
            .map_err(|e| ConfigError::new("critic.prefix", format!("task {}: {e}", task.id)))?;
    }
    Ok(())
}

/// `critic.prefix` parsed, `None` without one.
fn template(critic: &CriticConfig) -> Result<Option<TaskTemplate>, ConfigError> {
    critic
        .prefix
        .as_deref()
        .map(|text| TaskTemplate::parse(text).map_err(|e| ConfigError::new("critic.prefix", e)))
        .transpose()
}
