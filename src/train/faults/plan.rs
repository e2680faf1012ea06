//! The fault plan of a build with `fault-injection`: what the hidden `train` flags ask for,
//! and the moments of a run where each fault is injected.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use agent_r1_actors::engine::EngineFaults;
use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::learner::BeforeUpdate;
use agent_r1_actors::runtime::fault::FaultyTool;
use agent_r1_actors::runtime::EnvSource;
use agent_r1_envs::env::{Env, Score, TurnOutcome};
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallError, CallOutcome, Tool, ToolCall, ToolOutput};
use anyhow::Context;
use async_trait::async_trait;
use serde_json::{json, Value};

use crate::train::scenario::Scenario;

/// The longest a checkpoint write waits for an episode in flight to finish a step
/// (`Faults::checkpoint_with_a_finished_step`); a sampler that has nothing to run never has one.
const STEP_IN_FLIGHT_WAIT: Duration = Duration::from_secs(120);

/// A stage made to hang for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HangStage {
    /// The env's scorer never returns.
    Env,
    /// The first tool blocks its thread on every call (the env calls it on the first turn).
    Tool,
    /// The engine thread stops stepping as sampling starts.
    Engine,
    /// The learner never returns from its first update.
    Learner,
    /// The first weight publication after an update never completes (the engine thread
    /// stops while nothing samples).
    Publication,
    /// The first checkpoint write blocks.
    Checkpoint,
}

impl HangStage {
    /// Every stage, by its flag value.
    pub const ALL: [(&'static str, HangStage); 6] = [
        ("env", HangStage::Env),
        ("tool", HangStage::Tool),
        ("engine", HangStage::Engine),
        ("learner", HangStage::Learner),
        ("publication", HangStage::Publication),
        ("checkpoint", HangStage::Checkpoint),
    ];
}

impl FromStr for HangStage {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .iter()
            .find(|(name, _)| *name == s)
            .map(|(_, stage)| *stage)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|(n, _)| *n).collect();
                format!("unknown stage `{s}`; allowed: {}", names.join(", "))
            })
    }
}

/// The faults a run injects (none by default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// The learner sleeps this long at the start of every update.
    pub learner_delay: Option<Duration>,
    /// Every checkpoint write pauses this long after the policy is saved, before commit.
    pub checkpoint_delay: Option<Duration>,
    /// Every checkpoint write waits, before it takes the sampler's snapshot, until an episode
    /// in flight has finished a step or none is running (at most `STEP_IN_FLIGHT_WAIT`), so
    /// that a resume from it continues an episode from its last finished step.
    pub checkpoint_with_a_finished_step: bool,
    /// One stage hangs for good.
    pub hang: Option<HangStage>,
    /// The engine thread stops stepping for good as sampling for the update after this many
    /// starts (so checkpoints exist before it stalls).
    pub engine_hang_after_updates: Option<u64>,
    /// This fraction of every tool's calls panics, overruns its timeout or fails.
    pub tool_fault_rate: Option<f64>,
    /// Once the first update's weights are published, every engine thread panics after this
    /// many more decode steps (and its actor restarts it).
    pub engine_panic_after_steps: Option<u64>,
    /// Once the first update's weights are published, every engine stops for good (as one
    /// past its restart policy does), so the rollout fails as a whole.
    pub engine_stop_after_first_update: bool,
    /// A learner rank that dies or hangs as it starts an update, while rank 0 runs that
    /// update's collectives.
    pub learner_rank_kill: Option<RankFault>,
}

/// A learner rank's process killed (SIGKILL) or stopped (SIGSTOP: it hangs) as it starts
/// update `update` (from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankFault {
    /// The rank, 1 or more.
    pub rank: usize,
    /// The update, from 1.
    pub update: u64,
    /// Stopped rather than killed.
    pub hang: bool,
}

impl Faults {
    /// Whether any fault is injected. The engines read the run's fault plan only then; a
    /// run without faults hands them none, so their decode loop never reads one.
    pub(crate) fn any(&self) -> bool {
        *self != Faults::default()
    }

    /// The fault-injection arguments of learner rank `rank`'s process.
    pub(crate) fn rank_args(&self, rank: usize) -> Vec<String> {
        match self.learner_rank_kill {
            Some(f) if f.rank == rank => {
                let flag = match f.hang {
                    true => "--inject-hang-at-update",
                    false => "--inject-kill-at-update",
                };
                vec![flag.into(), f.update.to_string()]
            }
            _ => Vec::new(),
        }
    }

    /// Whether `stage` is the one made to hang.
    fn hangs(&self, stage: HangStage) -> bool {
        self.hang == Some(stage)
    }

    /// Wraps the scenario's env and tools in the faults asked for: faulty tools, a tool that
    /// blocks, an env whose scorer never returns, calls forced on turns that made none.
    pub(crate) fn apply_to_scenario(&self, scenario: &mut Scenario) -> anyhow::Result<()> {
        if let Some(rate) = self.tool_fault_rate {
            anyhow::ensure!(
                (0.0..=1.0).contains(&rate),
                "--inject-tool-faults {rate}: allowed 0 to 1"
            );
            for (i, tool) in scenario.tools.iter_mut().enumerate() {
                *tool = Arc::new(FaultyTool::new(
                    tool.clone(),
                    rate,
                    Duration::ZERO,
                    i as u64,
                ));
            }
        }
        // With tool faults, every turn that made no call calls every tool (an untrained model
        // rarely calls one by itself), so the faults are met; a hanging tool is called alone.
        let force_calls = if self.hangs(HangStage::Tool) {
            let first = scenario
                .tools
                .first_mut()
                .context("--inject-hang tool needs a [tools.NAME] table")?;
            let call = ForcedCall::of(first.as_ref());
            *first = Arc::new(BlockingTool(first.clone()));
            vec![call]
        } else if self.tool_fault_rate.is_some() {
            scenario
                .tools
                .iter()
                .map(|t| ForcedCall::of(t.as_ref()))
                .collect()
        } else {
            vec![]
        };
        let hang_score = self.hangs(HangStage::Env);
        if hang_score || !force_calls.is_empty() {
            let EnvSource::Shared(inner) = &scenario.env else {
                anyhow::bail!("the env faults inject into an env, and [env] names a workflow");
            };
            scenario.env = EnvSource::Shared(Arc::new(FaultyEnv {
                inner: inner.clone(),
                hang_score,
                force_calls,
            }));
        }
        Ok(())
    }

    /// What the learner does at the start of every update: sleep, or hang on the first.
    pub(crate) fn before_update(&self) -> Option<BeforeUpdate> {
        let delay = self.learner_delay;
        let hang = self.hangs(HangStage::Learner);
        (delay.is_some() || hang).then(|| {
            Arc::new(move |_| {
                if hang {
                    hang_forever("a learner update");
                }
                if let Some(delay) = delay {
                    std::thread::sleep(delay);
                }
            }) as BeforeUpdate
        })
    }

    /// Before sampling for the update after `updates_done`: the engines may hang for good.
    pub(crate) fn before_sampling(&self, updates_done: u64, engines: &EngineFaults) {
        let hang_now = self
            .engine_hang_after_updates
            .is_some_and(|n| updates_done >= n);
        if self.hangs(HangStage::Engine) || hang_now {
            engines.hang();
        }
    }

    /// Before an update's weights are published: the engines may hang for good.
    pub(crate) fn before_publication(&self, engines: &EngineFaults) {
        if self.hangs(HangStage::Publication) {
            engines.hang();
        }
    }

    /// Once the weights of the update after `updates_done` are published: after the first,
    /// the engines' threads may panic after some steps, or the engines stop for good.
    pub(crate) fn after_publication(
        &self,
        updates_done: u64,
        engines: &EngineFaults,
        engine_set: &EngineSet,
    ) {
        if updates_done != 0 {
            return;
        }
        if let Some(steps) = self.engine_panic_after_steps {
            engines.panic_after(steps);
        }
        if self.engine_stop_after_first_update {
            engine_set.shutdown();
        }
    }

    /// Inside checkpoint `step`'s write, once the policy is saved and before it takes the
    /// sampler's snapshot: a pause (so a `kill -9` can land inside a write), a wait for an
    /// episode in flight that has finished a step, or a hang for good.
    pub(crate) async fn during_checkpoint_write(
        &self,
        step: u64,
        holds_a_finished_step_or_nothing_running: impl Fn() -> bool,
    ) {
        if let Some(delay) = self.checkpoint_delay {
            eprintln!("checkpoint step {step}: writing (paused {delay:?}: fault injection)");
            tokio::time::sleep(delay).await;
        }
        if self.checkpoint_with_a_finished_step {
            let began = std::time::Instant::now();
            while !holds_a_finished_step_or_nothing_running() {
                if began.elapsed() > STEP_IN_FLIGHT_WAIT {
                    eprintln!(
                        "checkpoint step {step}: no episode in flight finished a step within \
                         {STEP_IN_FLIGHT_WAIT:?}; writing without one (fault injection)"
                    );
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        if self.hangs(HangStage::Checkpoint) {
            hang_forever("a checkpoint write");
        }
    }
}

/// Blocks the calling thread for good.
fn hang_forever(what: &str) -> ! {
    tracing::warn!("fault injection: {what} hangs for good");
    loop {
        std::thread::park();
    }
}

/// An env with faults around `inner`: its scorer never returns (`hang_score`), and/or it
/// makes the `force_calls` on every turn that made no call, whatever the model wrote (an
/// untrained model rarely calls a tool by itself).
struct FaultyEnv {
    inner: Arc<dyn Env>,
    hang_score: bool,
    force_calls: Vec<ForcedCall>,
}

/// A call made on every turn that made none: each of the tool's required parameters (or
/// `query`, where its schema names none) gets the turn's text.
struct ForcedCall {
    tool: String,
    params: Vec<String>,
}

impl ForcedCall {
    /// The call of `tool` with the required parameters of its JSON schema.
    fn of(tool: &dyn Tool) -> Self {
        let params: Vec<String> = tool.parameters()["required"]
            .as_array()
            .map(|r| {
                r.iter()
                    .filter_map(|p| p.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            tool: tool.name().to_string(),
            params: if params.is_empty() {
                vec!["query".to_string()]
            } else {
                params
            },
        }
    }

    fn call(&self, text: &str) -> ToolCall {
        ToolCall {
            name: self.tool.clone(),
            arguments: Value::Object(
                self.params
                    .iter()
                    .map(|p| (p.clone(), Value::String(text.to_string())))
                    .collect(),
            ),
        }
    }
}

impl Env for FaultyEnv {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn tool_names(&self) -> Vec<String> {
        self.inner.tool_names()
    }
    fn reset(&self, task: &Task) -> agent_r1_envs::Result<Vec<Message>> {
        self.inner.reset(task)
    }
    fn on_turn(
        &self,
        task: &Task,
        text: &str,
        calls: Vec<Result<ToolCall, CallError>>,
    ) -> TurnOutcome {
        if calls.is_empty() && !self.force_calls.is_empty() {
            return TurnOutcome::Calls(self.force_calls.iter().map(|c| Ok(c.call(text))).collect());
        }
        self.inner.on_turn(task, text, calls)
    }
    fn max_observation_chars(&self) -> usize {
        self.inner.max_observation_chars()
    }
    fn observe(&self, task: &Task, outcomes: &[CallOutcome]) -> Vec<Message> {
        self.inner.observe(task, outcomes)
    }
    fn step_reward(&self, task: &Task, outcomes: &[CallOutcome]) -> f64 {
        self.inner.step_reward(task, outcomes)
    }
    fn score(&self, task: &Task, transcript: &[Message]) -> Score {
        if self.hang_score {
            hang_forever("the env's scorer");
        }
        self.inner.score(task, transcript)
    }
    fn try_score(&self, task: &Task, transcript: &[Message]) -> agent_r1_envs::Result<Score> {
        if self.hang_score {
            hang_forever("the env's scorer");
        }
        self.inner.try_score(task, transcript)
    }
}

/// A tool with `inner`'s name whose calls block their thread for good (any arguments).
struct BlockingTool(Arc<dyn Tool>);

#[async_trait]
impl Tool for BlockingTool {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn description(&self) -> &str {
        self.0.description()
    }
    fn parameters(&self) -> Value {
        json!({"type": "object"})
    }
    fn timeout(&self) -> Duration {
        self.0.timeout()
    }
    fn max_concurrency(&self) -> usize {
        self.0.max_concurrency()
    }
    async fn call(&self, _arguments: Value) -> agent_r1_envs::Result<ToolOutput> {
        hang_forever("a tool call (blocking its thread)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_parse_by_name_and_an_unknown_one_lists_the_allowed() {
        assert_eq!(
            "publication".parse::<HangStage>(),
            Ok(HangStage::Publication)
        );
        let e = "gpu".parse::<HangStage>().unwrap_err();
        assert!(
            e.contains("`gpu`") && e.contains("env, tool, engine"),
            "{e}"
        );
    }
}
