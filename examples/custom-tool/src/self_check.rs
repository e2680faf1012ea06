//! `self_check`: a workflow of two model calls, each a step with its own context and its
//! own reward. The model answers the question; then, in a context of its own (a checker's
//! instructions, the question, the answer's sampled ids as they were sampled), it says
//! whether that answer is right. The episode's reward is the answer's; the check step is
//! rewarded when its verdict is right.

use std::sync::Arc;

use agent_r1_actors::runtime::{Agent, Workflow, WorkflowOutcome};
use agent_r1_envs::kinds::KindOptions;
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use async_trait::async_trait;
use serde::Deserialize;

/// `[env.options]` of `self_check`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelfCheckOptions {
    /// The answering call's system prompt.
    #[serde(default = "default_system_prompt")]
    pub system_prompt: String,
    /// What the checking call is asked after the answer.
    #[serde(default = "default_check_prompt")]
    pub check_prompt: String,
}

fn default_system_prompt() -> String {
    "Answer the question in a few words.".into()
}

fn default_check_prompt() -> String {
    "Is the answer above right? Reply yes or no.".into()
}

impl KindOptions for SelfCheckOptions {
    fn validate(&self) -> agent_r1_envs::Result<()> {
        if self.check_prompt.trim().is_empty() {
            return Err(agent_r1_envs::Error::Config {
                key: "env.options.check_prompt".into(),
                message: "must not be empty".into(),
            });
        }
        Ok(())
    }
}

/// The workflow.
pub struct SelfCheck {
    options: SelfCheckOptions,
}

/// Builds the workflow from its options (what `register` takes).
pub fn build(options: SelfCheckOptions) -> agent_r1_envs::Result<Arc<dyn Workflow>> {
    Ok(Arc::new(SelfCheck { options }))
}

fn normalize(text: &str) -> String {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[async_trait]
impl Workflow for SelfCheck {
    fn name(&self) -> &str {
        "self_check"
    }

    async fn run(&self, task: &Task, agent: &Agent) -> agent_r1_actors::Result<WorkflowOutcome> {
        let r = agent.renderer();
        // The answer, in the task's own context.
        let prompt = r.prompt(&[
            Message::system(self.options.system_prompt.clone()),
            Message::user(task.question.clone()),
        ])?;
        let answer = agent.generate(prompt).await?;
        let said = normalize(&answer.text);
        let right = task
            .answers
            .iter()
            .map(|a| normalize(a))
            .any(|a| !a.is_empty() && said.contains(&a));
        // The check, in a context of its own; the answer's ids are reused as sampled.
        let mut check = r.prompt(&[
            Message::system("You check answers."),
            Message::user(task.question.clone()),
        ])?;
        check.extend(&answer.token_ids);
        check.extend(r.continuation(
            &answer.token_ids,
            &[Message::user(self.options.check_prompt.clone())],
        )?);
        let verdict = agent.generate(check).await?;
        let says_right = normalize(&verdict.text).split(' ').any(|w| w == "yes");
        let calibrated = says_right == right;
        Ok(WorkflowOutcome {
            reward: f64::from(u8::from(right)),
            step_rewards: vec![(verdict.step, if calibrated { 0.5 } else { 0.0 })],
            metrics: [
                ("em".to_string(), f64::from(u8::from(right))),
                (
                    "check_calibrated".to_string(),
                    f64::from(u8::from(calibrated)),
                ),
            ]
            .into(),
        })
    }
}
