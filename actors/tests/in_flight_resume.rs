//! Episodes in flight continue from their last finished step. A rollout is stopped (a
//! crash: the service aborted) once episodes have finished some of their steps; the
//! records a checkpoint would write (the run's `InFlightBoard`, through JSON) are handed
//! back to a new service, which continues each episode from its record: the engine samples
//! only the steps that were not finished, and every trajectory equals the one an
//! uninterrupted rollout of the same episodes gives (deterministic engine: one row, no KV
//! reuse), its re-prefilled steps' log-probs equal to a plain forward pass.
//!
//! Test double, by design: `Scripted` calls `echo` on every turn whatever the (untrained)
//! model wrote, so that episodes have several steps. In the first life `echo` holds every
//! episode's third call (fault injection: a tool that never answers), so the crash comes
//! when each running episode has finished exactly two steps, an order of events, not a clock.

#[path = "support/tiny_agent.rs"]
mod tiny_agent;

use agent_r1_actors::testing;
use std::sync::Arc;
use std::time::Duration;

use agent_r1_actors::model::SamplingParams;
use agent_r1_actors::runtime::workflow::{Agent, Workflow, WorkflowOutcome};
use agent_r1_actors::runtime::{
    EnvSource, EpisodeConfig, EpisodeRequest, InFlightBoard, InFlightEpisode, RolloutService,
    RolloutSetup, TurnRenderer,
};
use agent_r1_actors::trajectory::{Step, Trajectory};
use agent_r1_envs::env::{Env, Score, TurnOutcome};
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallError, Tool, ToolCall, ToolOutput};
use async_trait::async_trait;
use serde_json::{json, Value};
use tiny_agent::{assert_logprobs_match_forward, task, tiny_agent_deterministic, TinyAgent};

/// Turns per episode: every turn but the last calls `echo`.
const TURNS: usize = 5;
const EPISODES: u64 = 4;

/// Echoes; with `hold`, an episode's third call (its text up to ` #`) never answers, and says
/// so on `hold`.
#[derive(Default)]
struct Echo {
    hold: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    calls: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

#[async_trait]
impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Repeats its text."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(3600)
    }
    async fn call(&self, args: Value) -> agent_r1_envs::Result<ToolOutput> {
        let text = args["text"].as_str().unwrap_or("").to_string();
        if let Some(held) = &self.hold {
            let n = {
                let mut calls = self.calls.lock().unwrap();
                let episode = text.split(" #").next().unwrap_or(&text).to_string();
                let n = calls.entry(episode).or_default();
                *n += 1;
                *n
            };
            if n == 3 {
                let _ = held.send(text.clone());
                std::future::pending::<()>().await;
            }
        }
        Ok(ToolOutput::text(format!("echo: {text}")))
    }
}

struct Scripted;

impl Env for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn tool_names(&self) -> Vec<String> {
        vec!["echo".into()]
    }
    fn reset(&self, task: &Task) -> agent_r1_envs::Result<Vec<Message>> {
        Ok(vec![
            Message::system("You are a test agent."),
            Message::user(task.question.clone()),
        ])
    }
    fn on_turn(
        &self,
        task: &Task,
        _text: &str,
        _calls: Vec<Result<ToolCall, CallError>>,
    ) -> TurnOutcome {
        TurnOutcome::Calls(vec![Ok(ToolCall {
            name: "echo".into(),
            arguments: json!({ "text": task.id }),
        })])
    }
    fn score(&self, _task: &Task, transcript: &[Message]) -> Score {
        Score {
            reward: transcript.len() as f64,
            metrics: Default::default(),
        }
    }
}

fn setup(f: &TinyAgent, env: EnvSource, board: &InFlightBoard, echo: Echo) -> RolloutSetup {
    let renderer =
        Arc::new(TurnRenderer::new(f.tokenizer.clone(), vec![echo.spec()], None).unwrap());
    let end = renderer.end_of_turn_id();
    RolloutSetup {
        engine: f.engine.clone().into(),
        env,
        tools: vec![Arc::new(echo)],
        renderer,
        context_policy: Arc::new(agent_r1_actors::runtime::context_policy::Full),
        episode: EpisodeConfig {
            max_turns: TURNS,
            max_context: 2048,
            sampling: SamplingParams {
                temperature: 1.0,
                max_new_tokens: 8,
                stop_token_ids: vec![end],
                ..Default::default()
            },
            ..testing::episode_config()
        },
        concurrency: 2,
        tool_queue_capacity: 64,
        restart: Default::default(),
        validate: Arc::new(|_, _| Ok(())),
        live: Default::default(),
        stall: None,
        calls: Default::default(),
        in_flight: board.clone(),
    }
}

fn request(i: u64, resume: Option<&InFlightEpisode>) -> EpisodeRequest {
    EpisodeRequest {
        task: task(format!("item {i}")),
        group_id: i,
        episode_id: i,
        resume: resume.map(|r| Box::new(r.clone())),
    }
}

/// Runs the requests to their end; the trajectories by episode id.
async fn run(setup: RolloutSetup, requests: Vec<EpisodeRequest>) -> Vec<Trajectory> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let service = RolloutService::start(setup, tx).await.unwrap();
    let n = requests.len();
    let sender = service.tasks();
    for r in requests {
        sender.submit(r).await.unwrap();
    }
    drop(sender);
    let mut out = Vec::new();
    while out.len() < n {
        let t = tokio::time::timeout(Duration::from_secs(600), rx.recv())
            .await
            .expect("an episode within 600 s")
            .expect("the service ended early");
        out.push(t);
    }
    let report = service.finish().await.unwrap();
    assert_eq!(report.summary.completed as usize, n, "{report:?}");
    out.sort_by_key(|t| t.episode_id);
    out
}

/// What two lives of a rollout gave: the uninterrupted rollout's trajectories, the records
/// taken at the crash, the resumed rollout's trajectories, and the tokens sampled after the
/// crash.
struct Lives {
    reference: Vec<Trajectory>,
    records: Vec<InFlightEpisode>,
    resumed: Vec<Trajectory>,
    generated: usize,
}

/// Runs the episodes uninterrupted, then again with a crash once both running episodes have
/// finished two steps, then resumes them from the records; the env from `env()` each time.
fn two_lives(f: &TinyAgent, env: impl Fn() -> EnvSource) -> Lives {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let reference = rt.block_on(run(
        setup(f, env(), &InFlightBoard::default(), Echo::default()),
        (0..EPISODES).map(|i| request(i, None)).collect(),
    ));
    for t in &reference {
        assert_eq!(t.steps.len(), TURNS, "episode {}", t.episode_id);
    }

    // The first life: stopped once both running episodes are held at their third call, so
    // each has finished two steps.
    let board = InFlightBoard::default();
    let (held, mut holding) = tokio::sync::mpsc::unbounded_channel();
    let first = setup(
        f,
        env(),
        &board,
        Echo {
            hold: Some(held),
            ..Default::default()
        },
    );
    let records: Vec<InFlightEpisode> = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let service = RolloutService::start(first, tx).await.unwrap();
        let sender = service.tasks();
        let feed = tokio::spawn(async move {
            for i in 0..EPISODES {
                if sender.submit(request(i, None)).await.is_err() {
                    return;
                }
            }
        });
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        // A bound, not a clock: the wait is for the two episodes' third calls.
        tokio::time::timeout(Duration::from_secs(600), async {
            for _ in 0..2 {
                holding
                    .recv()
                    .await
                    .expect("the tool's sender lives in the service");
            }
        })
        .await
        .expect("two episodes at their third call within 600 s");
        let taken = board.snapshot();
        assert_eq!(taken.len(), 2, "{taken:?}");
        // The built-in loop records a turn once its calls are answered; a workflow records a
        // step once generated (the third's call is the one held).
        assert!(
            taken
                .iter()
                .all(|r| recorded(r).len() == if r.workflow_steps.is_empty() { 2 } else { 3 }),
            "{taken:?}"
        );
        service.abort("a crash (fault injection)");
        let _ = service.finish().await;
        feed.abort();
        drain.abort();
        taken
    });
    // As a checkpoint writes and reads them.
    let records: Vec<InFlightEpisode> = records
        .iter()
        .map(|r| serde_json::from_str(&serde_json::to_string(r).unwrap()).unwrap())
        .collect();
    for r in &records {
        r.check().unwrap();
    }

    // The second life: every episode again; those with a record continue from it.
    let before = rt.block_on(f.engine.stats()).unwrap().tokens_generated;
    let resumed = rt.block_on(run(
        setup(f, env(), &InFlightBoard::default(), Echo::default()),
        (0..EPISODES)
            .map(|i| request(i, records.iter().find(|r| r.episode_id == i)))
            .collect(),
    ));
    let generated = rt.block_on(f.engine.stats()).unwrap().tokens_generated - before;

    Lives {
        reference,
        records,
        resumed,
        generated: generated as usize,
    }
}

#[test]
fn an_episode_continued_from_its_record_ends_as_one_that_never_stopped() {
    let f = tiny_agent_deterministic(2048);
    let lives = two_lives(&f, || (Arc::new(Scripted) as Arc<dyn Env>).into());
    assert!(lives.records.iter().all(|r| r.env_state.is_none()));
    check_resumed(&f, &lives, true);
}

/// An env built per episode that counts its turns (each call's text names the count, so a
/// count not restored would change every later observation); it can snapshot the count, or
/// not.
struct Counting {
    turns: std::sync::Mutex<u64>,
    snapshots: bool,
}

impl Env for Counting {
    fn name(&self) -> &str {
        "counting"
    }
    fn tool_names(&self) -> Vec<String> {
        vec!["echo".into()]
    }
    fn reset(&self, task: &Task) -> agent_r1_envs::Result<Vec<Message>> {
        *self.turns.lock().unwrap() = 0;
        Scripted.reset(task)
    }
    fn on_turn(
        &self,
        task: &Task,
        _text: &str,
        _calls: Vec<Result<ToolCall, CallError>>,
    ) -> TurnOutcome {
        let mut n = self.turns.lock().unwrap();
        *n += 1;
        TurnOutcome::Calls(vec![Ok(ToolCall {
            name: "echo".into(),
            arguments: json!({ "text": format!("{} #{n}", task.id) }),
        })])
    }
    fn score(&self, _task: &Task, transcript: &[Message]) -> Score {
        Score {
            reward: transcript.len() as f64 + *self.turns.lock().unwrap() as f64 / 100.0,
            metrics: Default::default(),
        }
    }
    fn snapshot(&self) -> agent_r1_envs::Result<Option<Value>> {
        Ok(self
            .snapshots
            .then(|| json!({ "turns": *self.turns.lock().unwrap() })))
    }
    fn restore(&self, state: Value) -> agent_r1_envs::Result<()> {
        *self.turns.lock().unwrap() = state["turns"].as_u64().unwrap();
        Ok(())
    }
}

fn counting(snapshots: bool) -> EnvSource {
    EnvSource::per_episode(Arc::new(move || {
        Ok(Arc::new(Counting {
            turns: Default::default(),
            snapshots,
        }) as Arc<dyn Env>)
    }))
    .unwrap()
}

#[test]
fn an_env_built_per_episode_continues_from_its_snapshot() {
    let f = tiny_agent_deterministic(2048);
    let lives = two_lives(&f, || counting(true));
    for r in &lives.records {
        assert_eq!(r.env_state, Some(json!({ "turns": 2 })), "{r:?}");
    }
    check_resumed(&f, &lives, true);
}

#[test]
fn an_env_that_cannot_snapshot_starts_its_episode_over() {
    let f = tiny_agent_deterministic(2048);
    let lives = two_lives(&f, || counting(false));
    assert!(lives.records.iter().all(|r| r.env_state.is_none()));
    check_resumed(&f, &lives, false);
}

/// Every resumed trajectory is indistinguishable from the uninterrupted one but for when it
/// ran; `continued`: the recorded steps were kept and only the others sampled again, else
/// every step was sampled again.
fn check_resumed(f: &TinyAgent, lives: &Lives, continued: bool) {
    let Lives {
        reference,
        records,
        resumed,
        generated,
    } = lives;
    let generated = *generated;
    let mut carried = 0;
    for (t, want) in resumed.iter().zip(reference) {
        if let Some(r) = records
            .iter()
            .find(|r| r.episode_id == t.episode_id)
            .filter(|_| continued)
        {
            // The finished steps are the record's, as they were (timings included).
            let steps = recorded(r);
            for (k, s) in steps.iter().enumerate() {
                let at = format!("episode {} step {k}", t.episode_id);
                assert_eq!(t.steps[k].action_ids, s.action_ids, "{at}");
                assert_eq!(t.steps[k].logprobs, s.logprobs, "{at}");
                assert_eq!(t.steps[k].token_versions, s.token_versions, "{at}");
                assert_eq!(t.steps[k].generate_seconds, s.generate_seconds, "{at}");
            }
            if r.workflow_steps.is_empty() {
                assert_eq!(t.steps[..r.steps.len()], r.steps[..]);
            }
            carried += steps.iter().map(|s| s.action_ids.len()).sum::<usize>();
        }
        // Indistinguishable from the episode that never stopped but for when it ran.
        assert_eq!(t.prompt_ids, want.prompt_ids);
        assert_eq!(t.steps.len(), want.steps.len(), "episode {}", t.episode_id);
        for (k, (a, b)) in t.steps.iter().zip(&want.steps).enumerate() {
            let at = format!("episode {} step {k}", t.episode_id);
            assert_eq!(a.context_len, b.context_len, "{at}");
            assert_eq!(a.action_ids, b.action_ids, "{at}");
            assert_eq!(a.observation_ids, b.observation_ids, "{at}");
            assert_eq!(a.logprobs, b.logprobs, "{at}");
            assert_eq!(a.token_versions, b.token_versions, "{at}");
            assert_eq!(a.policy_version, b.policy_version, "{at}");
            let texts = |s: &agent_r1_actors::trajectory::Step| -> Vec<String> {
                s.tool_calls.iter().map(|c| c.observation(1000)).collect()
            };
            assert_eq!(texts(a), texts(b), "{at}");
        }
        assert_eq!(t.reward, want.reward);
        assert_logprobs_match_forward(&f.model, t);
    }
    // Only the steps not finished before the crash were sampled again (all of them, where
    // the episodes started over).
    let total: usize = resumed.iter().map(Trajectory::generated_tokens).sum();
    assert_eq!(carried > 0, continued);
    assert_eq!(generated, total - carried);
    eprintln!(
        "{} episodes resumed from their records ({} finished steps, {carried} tokens not \
         sampled again); {generated} of {total} tokens sampled after the crash",
        records.len(),
        records.iter().map(|r| recorded(r).len()).sum::<usize>()
    );
}

/// A record's finished steps: the built-in loop's, or a workflow's in call order.
fn recorded(r: &InFlightEpisode) -> Vec<Step> {
    if r.workflow_steps.is_empty() {
        r.steps.clone()
    } else {
        r.workflow_steps
            .iter()
            .flatten()
            .map(|w| w.step.clone())
            .collect()
    }
}

/// A workflow of `TURNS` steps on one growing context, each step but the last followed by
/// an `echo` call whose answer the next context shows.
struct EchoLoop;

#[async_trait]
impl Workflow for EchoLoop {
    fn name(&self) -> &str {
        "echo_loop"
    }

    async fn run(&self, task: &Task, agent: &Agent) -> agent_r1_actors::Result<WorkflowOutcome> {
        let r = agent.renderer();
        let mut context = r.prompt(&Scripted.reset(task).unwrap())?;
        for turn in 0..TURNS {
            let g = agent.generate(context.clone()).await?;
            if turn + 1 == TURNS {
                break;
            }
            let call = ToolCall {
                name: "echo".into(),
                arguments: json!({ "text": task.id }),
            };
            let outcomes = agent.call_tools(Some(g.step), vec![Ok(call)]).await;
            let seen = Message::tool(outcomes[0].observation(1000));
            context.extend(&g.token_ids);
            context.extend(r.continuation(&g.token_ids, &[seen])?);
        }
        Ok(WorkflowOutcome {
            reward: context.len() as f64,
            ..Default::default()
        })
    }
}

#[test]
fn a_workflow_episode_replays_its_recorded_steps_and_samples_only_the_rest() {
    let f = tiny_agent_deterministic(2048);
    let lives = two_lives(&f, || EnvSource::Workflow {
        workflow: Arc::new(EchoLoop),
        tool_names: vec!["echo".into()],
    });
    assert!(lives.records.iter().all(|r| r.steps.is_empty()));
    check_resumed(&f, &lives, true);
}
