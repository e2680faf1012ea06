//! The `Workflow` extension point: user code that drives a whole episode.
//!
//! A workflow is async code that calls [`Agent::generate`] on any contexts it builds, as
//! often as it likes and concurrently if it likes (a best-of-n, a debate, a planner then an
//! executor, an answer then a self-check), calls tools through the run's tool pools, and
//! returns rewards for the episode and for any of its steps. Every generate call is one
//! recorded step with its own context; steps are kept in the order the calls were made, so a
//! deterministic workflow gives the same trajectory every time. Contexts are token ids: the
//! workflow renders what it writes anew with [`Agent::renderer`] and reuses sampled ids as
//! they were sampled.
//!
//! After each step the episode's record is on the run's in-flight board; a resume runs the
//! workflow again and replays the recorded steps (see [`super::in_flight`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;

use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallError, CallOutcome, ToolCall};

use super::call_ledger::EpisodeCalls;
use super::in_flight::{InFlightBoard, InFlightEpisode, WorkflowStep};
use super::render::TurnRenderer;
use super::EpisodeConfig;
use crate::engine::TurnOutput;
use crate::model::generate::FinishReason;
use crate::trajectory::{RebuiltContext, Step};
use crate::{Error, Result};

/// User code that drives an episode (see the module documentation).
#[async_trait]
pub trait Workflow: Send + Sync + 'static {
    /// The workflow's name, recorded on the contexts it builds.
    fn name(&self) -> &str;

    /// Runs one episode of `task`. An error fails the episode with its message (re-queued
    /// once, like any failed episode).
    async fn run(&self, task: &Task, agent: &Agent) -> Result<WorkflowOutcome>;
}

/// What a workflow returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkflowOutcome {
    /// The episode's reward (placed on its last action token).
    pub reward: f64,
    /// Rewards of single steps, by the step index [`Generation::step`] gave.
    pub step_rewards: Vec<(usize, f64)>,
    /// Named metrics, as an env's score has.
    pub metrics: BTreeMap<String, f64>,
}

/// One sampled step, as the workflow sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The step's index in the episode's trajectory.
    pub step: usize,
    /// The ids sampled.
    pub token_ids: Vec<u32>,
    /// Their text (special tokens dropped).
    pub text: String,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// The sampling log-probability of each id (what the learner trains with).
    pub logprobs: Vec<f32>,
    /// The policy version that sampled the first id.
    pub policy_version: u64,
}

/// A call's own limits on top of the run's sampling settings (`[rollout]`), which every
/// call samples with so that the learner's log-probabilities are the engine's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerateOptions {
    /// At most this many new tokens (the run's `max_response_length` and the context still
    /// bound it).
    pub max_new_tokens: Option<usize>,
    /// More strings that end the turn (included in the output, as the run's stop strings).
    pub stop: Vec<String>,
}

/// The run an [`Agent`] reaches: the engine, the tool pools, the renderer and the episode
/// settings. The episode runtime implements it.
#[async_trait]
pub(crate) trait AgentRun: Send + Sync {
    /// The model's chat template and tool-call format.
    fn renderer(&self) -> &TurnRenderer;
    /// The run's episode settings.
    fn episode_config(&self) -> &EpisodeConfig;
    /// Samples one turn on `context` under engine key `key`; returns it and its seconds.
    async fn sample(
        &self,
        key: u64,
        context: Vec<u32>,
        options: &GenerateOptions,
    ) -> crate::Result<(TurnOutput, f64)>;
    /// Runs tool calls through the run's tool pools, keyed by `place` (the episode's keys and
    /// the step they follow); outcomes in the calls' order.
    async fn run_calls(
        &self,
        place: (&EpisodeCalls, usize),
        calls: Vec<std::result::Result<ToolCall, CallError>>,
    ) -> Vec<CallOutcome>;
    /// Frees the engine's state for `key`.
    fn release(&self, key: u64);
    /// Where episodes in flight keep their records for the checkpoint.
    fn in_flight(&self) -> &InFlightBoard;
}

/// The step of a sampled turn on a context of `context_len` tokens.
pub(crate) fn step_of(out: TurnOutput, context_len: usize, generate_seconds: f64) -> Step {
    let token_versions = Step::compact_versions(out.policy_version, out.token_versions);
    Step {
        context_len,
        logprobs: out.logprobs,
        policy_version: out.policy_version,
        token_versions,
        finish_reason: out.finish_reason,
        tool_calls: vec![],
        observation_ids: vec![],
        reward: 0.0,
        generate_seconds,
        tool_seconds: 0.0,
        prefill_tokens: out.prefill_tokens,
        action_ids: out.token_ids,
        rebuilt: None,
    }
}

/// A step the workflow made, with its whole context (compacted when the episode ends).
pub(crate) struct Recorded {
    pub(crate) context: Vec<u32>,
    pub(crate) step: Step,
}

/// What a workflow drives the episode with.
pub struct Agent {
    run: Arc<dyn AgentRun>,
    episode_id: u64,
    /// Steps by call order; `None` while a call is in flight or when it failed.
    steps: Mutex<Vec<Option<Recorded>>>,
    /// Engine keys in use by calls in flight (a key per concurrent call, so that concurrent
    /// calls draw their own random numbers), and every key used (released at the end).
    lanes: Mutex<(Vec<bool>, usize)>,
    /// Its tool calls' keys.
    calls: EpisodeCalls,
    /// Its record on the in-flight board (identity only; the steps are copied in on each
    /// put), and whether the episode has ended (nothing is put after that).
    record: Mutex<(InFlightEpisode, bool)>,
    /// Steps a resumed episode made before, by call index, replayed where the workflow asks
    /// for the same context again.
    replay: Mutex<Vec<Option<WorkflowStep>>>,
    started: Instant,
}

impl Agent {
    /// The agent of the episode `record` names (its identity), replaying `replay`.
    pub(crate) fn new(
        run: Arc<dyn AgentRun>,
        record: InFlightEpisode,
        replay: Vec<Option<WorkflowStep>>,
    ) -> Self {
        let episode_id = record.episode_id;
        Self {
            run,
            episode_id,
            calls: EpisodeCalls::new(episode_id),
            steps: Mutex::new(vec![]),
            lanes: Mutex::new((vec![], 0)),
            record: Mutex::new((record, false)),
            replay: Mutex::new(replay),
            started: Instant::now(),
        }
    }

    /// The model's chat template and tool-call format, for rendering prompts and what
    /// follows an action in token space.
    pub fn renderer(&self) -> &TurnRenderer {
        self.run.renderer()
    }

    /// The longest context a step may have (`rollout.max_context_length`).
    pub fn max_context(&self) -> usize {
        self.run.episode_config().max_context
    }

    /// The run's sampling settings (temperature, top-p, top-k, the longest turn, stop ids).
    pub fn sampling(&self) -> &crate::model::SamplingParams {
        &self.run.episode_config().sampling
    }

    /// Samples one step on `context` (a recorded step) within the turn deadline.
    pub async fn generate(&self, context: Vec<u32>) -> Result<Generation> {
        self.generate_with(context, &GenerateOptions::default())
            .await
    }

    /// [`Self::generate`] with the call's own limits.
    pub async fn generate_with(
        &self,
        context: Vec<u32>,
        options: &GenerateOptions,
    ) -> Result<Generation> {
        let config = self.run.episode_config();
        if context.is_empty() || context.len() + 1 >= config.max_context {
            return Err(Error::invalid(
                "workflow generate",
                format!(
                    "a context of {} tokens; allowed: 1 to {} (rollout.max_context_length less \
                     room for one token)",
                    context.len(),
                    config.max_context.saturating_sub(2)
                ),
            ));
        }
        let index = {
            let mut steps = self.lock_steps();
            steps.push(None);
            steps.len() - 1
        };
        if let Some(step) = self.replayed(index, &context) {
            let generation = self.generation(index, &step)?;
            self.lock_steps()[index] = Some(Recorded { context, step });
            self.keep();
            return Ok(generation);
        }
        let lane = self.take_lane();
        let sampled = self
            .run
            .sample(self.lane_key(lane), context.clone(), options)
            .await;
        self.give_lane(lane);
        let (out, seconds) = sampled?;
        let step = step_of(out, context.len(), seconds);
        let generation = self.generation(index, &step)?;
        self.lock_steps()[index] = Some(Recorded { context, step });
        self.keep();
        Ok(generation)
    }

    /// What the workflow sees of step `index`.
    fn generation(&self, index: usize, step: &Step) -> Result<Generation> {
        let text = self
            .run
            .renderer()
            .tokenizer()
            .decode(&step.action_ids, true)?;
        Ok(Generation {
            step: index,
            token_ids: step.action_ids.clone(),
            text,
            finish_reason: step.finish_reason,
            logprobs: step.logprobs.clone(),
            policy_version: step.policy_version,
        })
    }

    /// The recorded step `index` of a resumed episode, where it was sampled on `context`:
    /// its action and log-probs as they were, its tool outcomes left for the workflow's
    /// calls to add again (answered from the call journal).
    fn replayed(&self, index: usize, context: &[u32]) -> Option<Step> {
        let mut replay = self.replay.lock().unwrap_or_else(|e| e.into_inner());
        let slot = replay.get_mut(index)?;
        if slot.as_ref()?.context != context {
            return None;
        }
        let mut step = slot.take()?.step;
        step.tool_calls.clear();
        step.tool_seconds = 0.0;
        Some(step)
    }

    /// Puts the episode's record, with its steps so far, on the in-flight board.
    fn keep(&self) {
        let steps: Vec<Option<WorkflowStep>> = self
            .lock_steps()
            .iter()
            .map(|r| {
                r.as_ref().map(|r| WorkflowStep {
                    context: r.context.clone(),
                    step: r.step.clone(),
                })
            })
            .collect();
        let guard = self.record.lock().unwrap_or_else(|e| e.into_inner());
        let (base, ended) = &*guard;
        if *ended || steps.iter().all(Option::is_none) {
            return;
        }
        let mut record = base.clone();
        record.workflow_steps = steps;
        record.wall_seconds = self.started.elapsed().as_secs_f64();
        self.run.in_flight().put(record);
    }

    /// Runs tool calls (in parallel, through the run's tool pools, with their timeouts);
    /// outcomes come back in the calls' order, failures as outcomes. When `step` is given,
    /// the outcomes are recorded on that step.
    ///
    /// Each call's idempotency key names the episode, the step (`step`, or when none is given
    /// the number of steps generated so far) and the call's position; a workflow that
    /// replays the same way after a resume gets the journaled results of calls already made.
    pub async fn call_tools(
        &self,
        step: Option<usize>,
        calls: Vec<std::result::Result<ToolCall, CallError>>,
    ) -> Vec<CallOutcome> {
        let began = Instant::now();
        let place = step.unwrap_or_else(|| self.lock_steps().len());
        let outcomes = self.run.run_calls((&self.calls, place), calls).await;
        if let Some(k) = step {
            if let Some(Some(r)) = self.lock_steps().get_mut(k) {
                r.step.tool_calls.extend(outcomes.iter().cloned());
                r.step.tool_seconds += began.elapsed().as_secs_f64();
            }
            self.keep();
        }
        outcomes
    }

    fn lock_steps(&self) -> std::sync::MutexGuard<'_, Vec<Option<Recorded>>> {
        self.steps.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take_lane(&self) -> usize {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let lane = match lanes.0.iter().position(|busy| !busy) {
            Some(free) => free,
            None => {
                lanes.0.push(false);
                lanes.0.len() - 1
            }
        };
        lanes.0[lane] = true;
        lanes.1 = lanes.1.max(lane + 1);
        lane
    }

    fn give_lane(&self, lane: usize) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        lanes.0[lane] = false;
    }

    /// The engine key of a lane: the episode id for the first, a distinct key per lane after.
    fn lane_key(&self, lane: usize) -> u64 {
        self.episode_id
            .wrapping_add((lane as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    /// Releases every engine key the episode used; its record is put no more (the episode
    /// takes it off the board when it stops).
    pub(crate) fn release(&self) {
        self.record.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        let used = self.lanes.lock().unwrap_or_else(|e| e.into_inner()).1;
        for lane in 0..used {
            self.run.release(self.lane_key(lane));
        }
    }

    /// The recorded steps by call index, in call order (failed calls left out).
    pub(crate) fn take_steps(&self) -> Vec<(usize, Recorded)> {
        std::mem::take(&mut *self.lock_steps())
            .into_iter()
            .enumerate()
            .filter_map(|(k, r)| r.map(|r| (k, r)))
            .collect()
    }
}

/// The prompt ids and compact steps of steps recorded with whole contexts: a step whose
/// context extends the previous step's context and action keeps the difference as that
/// step's observation; any other is stored as rebuilt `by` the workflow. `step_rewards`
/// index the recorded steps.
pub(crate) fn compact(
    recorded: Vec<Recorded>,
    by: &str,
) -> std::result::Result<(Vec<u32>, Vec<Step>), String> {
    let Some(first) = recorded.first() else {
        return Err(
            "the workflow made no generate call: an episode needs at least one step".into(),
        );
    };
    let prompt = first.context.clone();
    let mut steps: Vec<Step> = Vec::with_capacity(recorded.len());
    let mut previous: Option<Vec<u32>> = None;
    for Recorded { context, mut step } in recorded {
        if let Some(prev) = previous {
            let last = steps.last_mut().expect("a previous step");
            if context.len() >= prev.len() && context.starts_with(&prev) {
                last.observation_ids = context[prev.len()..].to_vec();
            } else {
                step.rebuilt = Some(RebuiltContext::between(&prev, &context, by));
            }
        } else if context != prompt {
            step.rebuilt = Some(RebuiltContext::between(&prompt, &context, by));
        }
        let mut chained = context;
        chained.extend(&step.action_ids);
        previous = Some(chained);
        steps.push(step);
    }
    Ok((prompt, steps))
}
