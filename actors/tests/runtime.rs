//! The actor runtime end to end on the real engine (a tiny model in libtorch), the real
//! tokenizer and chat template, and real tool pools.
//!
//! Test doubles, by design: `ScriptedEnv` decides to call a tool on the first turns whatever
//! the (untrained) model wrote, so tool paths run deterministically, and `FaultyTool` injects
//! panics, hangs and errors, and a `before_update` hook holds the learner mid-update.

use agent_r1_actors::testing;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent_r1_actors::engine::{EngineConfig, EngineHandle};
use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::learner::{
    AlgorithmConfig, BeforeUpdate, Estimator, KlConfig, LearnerConfig, LearnerModels, LearnerRef,
    LearnerStart,
};
use agent_r1_actors::model::presets::preset;
use agent_r1_actors::model::{Placement, PolicyModel, SamplingParams};
use agent_r1_actors::runtime::fault::FaultyTool;
use agent_r1_actors::runtime::{
    run_rollout, EnvSource, EpisodeConfig, EpisodeRequest, GroupBatcher, RolloutReport,
    RolloutService, RolloutSetup, TurnRenderer,
};
use agent_r1_actors::tiny_tokenizer::write_tiny_tokenizer;
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_actors::trajectory::{EpisodeEnd, Trajectory};
use agent_r1_envs::env::{Env, Score, TurnOutcome};
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallError, Tool, ToolCall, ToolOutput};
use async_trait::async_trait;
use metrics::{SharedString, Unit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::CompositeKey;
use serde_json::{json, Value};
use tch::Kind;

struct Echo;

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
        Duration::from_millis(300)
    }
    fn max_concurrency(&self) -> usize {
        4
    }
    async fn call(&self, args: Value) -> agent_r1_envs::Result<ToolOutput> {
        Ok(ToolOutput::text(format!(
            "echo: {}",
            args["text"].as_str().unwrap_or("")
        )))
    }
}

/// Fault injection: `echo`, except that its `at`-th call shuts the engine down first.
struct StopsEngineAtCall {
    engine: EngineHandle,
    at: u64,
    calls: AtomicU64,
}

#[async_trait]
impl Tool for StopsEngineAtCall {
    fn name(&self) -> &str {
        Echo.name()
    }
    fn description(&self) -> &str {
        Echo.description()
    }
    fn parameters(&self) -> Value {
        Echo.parameters()
    }
    fn timeout(&self) -> Duration {
        Echo.timeout()
    }
    fn max_concurrency(&self) -> usize {
        Echo.max_concurrency()
    }
    async fn call(&self, args: Value) -> agent_r1_envs::Result<ToolOutput> {
        if self.calls.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
            let engine = self.engine.clone();
            tokio::task::spawn_blocking(move || engine.shutdown())
                .await
                .unwrap();
        }
        Echo.call(args).await
    }
}

/// Test double: calls `echo` on the first `calls` turns of each task, then stops; its
/// `reset` panics for tasks named `bad-*`, and for `flaky-*` on the first attempt only.
struct ScriptedEnv {
    calls: usize,
    turns: Mutex<HashMap<String, usize>>,
    resets: Mutex<HashMap<String, usize>>,
}

impl Env for ScriptedEnv {
    fn name(&self) -> &str {
        "scripted"
    }
    fn tool_names(&self) -> Vec<String> {
        vec!["echo".into()]
    }
    fn reset(&self, task: &Task) -> agent_r1_envs::Result<Vec<Message>> {
        let n = {
            let mut r = self.resets.lock().unwrap();
            let n = r.entry(task.id.clone()).or_default();
            *n += 1;
            *n
        };
        if task.id.starts_with("bad-") || (task.id.starts_with("flaky-") && n == 1) {
            panic!("injected env failure for {}", task.id);
        }
        self.turns.lock().unwrap().insert(task.id.clone(), 0);
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
        let mut turns = self.turns.lock().unwrap();
        let t = turns.entry(task.id.clone()).or_default();
        *t += 1;
        if *t <= self.calls {
            TurnOutcome::Calls(vec![
                Ok(ToolCall {
                    name: "echo".into(),
                    arguments: json!({"text": format!("turn {t}")}),
                }),
                Err(CallError::InvalidJson("expected value".into())),
            ])
        } else {
            TurnOutcome::Done
        }
    }
    fn score(&self, _task: &Task, transcript: &[Message]) -> Score {
        Score {
            reward: transcript.len() as f64,
            metrics: [("messages".to_string(), transcript.len() as f64)].into(),
        }
    }
}

fn tiny_model(dir: &Path) {
    let ids = write_tiny_tokenizer(dir, None, 512, &[]).unwrap();
    tch::manual_seed(0);
    let model = PolicyModel::new(
        preset("tiny", ids.vocab_size, ids.eos_token_ids).unwrap(),
        Placement::default(),
        false,
    )
    .unwrap();
    model.save(dir, None).unwrap();
}

fn tasks(prefix: &str, n: usize) -> Vec<(Task, u64)> {
    (0..n)
        .map(|i| {
            (
                Task {
                    id: format!("{prefix}-{i}"),
                    data_source: "test".into(),
                    question: format!("What is item {i}?"),
                    answers: vec![format!("{i}")],
                    prompt: None,
                    extra: Value::Null,
                },
                (i / 4) as u64,
            )
        })
        .collect()
}

struct Fixture {
    _dir: tempfile::TempDir,
    engine: testing::TestEngine,
    tokenizer: Arc<HfTokenizer>,
    model: PolicyModel,
}

fn fixture() -> Fixture {
    fixture_with_rows(16)
}

/// An engine on the CPU over the model in `dir`.
fn tiny_engine(dir: &Path, max_batch_rows: usize) -> testing::TestEngine {
    let path = dir.to_path_buf();
    testing::start_engine(
        move || PolicyModel::load(&path, Placement::default(), false),
        None,
        EngineConfig {
            max_batch_rows,
            max_context: 1024,
            ..testing::engine_config()
        },
    )
    .unwrap()
}

fn fixture_with_rows(max_batch_rows: usize) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let engine = tiny_engine(dir.path(), max_batch_rows);
    let tokenizer = Arc::new(HfTokenizer::from_dir(dir.path()).unwrap());
    let model = PolicyModel::load(dir.path(), Placement::default(), false).unwrap();
    Fixture {
        _dir: dir,
        engine,
        tokenizer,
        model,
    }
}

fn setup(
    f: &Fixture,
    env: EnvSource,
    tools: Vec<Arc<dyn Tool>>,
    concurrency: usize,
) -> RolloutSetup {
    let specs = tools.iter().map(|t| t.spec()).collect();
    let renderer = Arc::new(TurnRenderer::new(f.tokenizer.clone(), specs, None).unwrap());
    let end = renderer.end_of_turn_id();
    RolloutSetup {
        engine: f.engine.clone().into(),
        env,
        tools,
        renderer,
        context_policy: std::sync::Arc::new(agent_r1_actors::runtime::context_policy::Full),
        episode: EpisodeConfig {
            max_turns: 4,
            max_context: 1024,
            sampling: SamplingParams {
                temperature: 1.0,
                max_new_tokens: 12,
                stop_token_ids: vec![end],
                ..Default::default()
            },
            ..testing::episode_config()
        },
        concurrency,
        tool_queue_capacity: 4 * concurrency.max(16),
        restart: Default::default(),
        validate: Arc::new(|_, _| Ok(())),
        live: Default::default(),
        stall: None,
        calls: Default::default(),
        in_flight: Default::default(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn run(
    f: &Fixture,
    env: Arc<dyn Env>,
    tool: Arc<dyn Tool>,
    tasks: Vec<(Task, u64)>,
) -> (RolloutReport, Vec<Trajectory>) {
    run_setup(setup(f, env.into(), vec![tool], 12), tasks)
}

/// Runs `tasks` through one rollout of `setup` and collects the trajectories.
fn run_setup(setup: RolloutSetup, tasks: Vec<(Task, u64)>) -> (RolloutReport, Vec<Trajectory>) {
    runtime().block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let collector = tokio::spawn(async move {
            let mut out = Vec::new();
            while let Some(t) = rx.recv().await {
                out.push(t);
            }
            out
        });
        let report = tokio::time::timeout(Duration::from_secs(300), run_rollout(setup, tasks, tx))
            .await
            .expect("rollout must not hang")
            .unwrap();
        (report, collector.await.unwrap())
    })
}

/// The process-wide recorder the actors report to (tests of this binary share it).
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder in this test binary");
        snapshotter
    })
}

/// Per series name: counters as their value, gauges as their value, histograms as their
/// sample count; labelled series are summed. Of one snapshot: taking a snapshot drains the
/// recorder's counters, so a test takes one and reads everything from it.
fn metric_values(
    snapshot: &[(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)],
) -> HashMap<String, f64> {
    let mut out: HashMap<String, f64> = HashMap::new();
    for (key, _, _, value) in snapshot {
        let v = match value {
            DebugValue::Counter(c) => *c as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(h) => h.len() as f64,
        };
        *out.entry(key.key().name().to_string()).or_default() += v;
    }
    out
}

#[test]
fn every_episode_ends_under_tool_faults_and_actions_match_their_contexts() {
    snapshotter();
    let f = fixture();
    let faulty = FaultyTool::new(Arc::new(Echo), 0.35, Duration::from_millis(2), 7);
    let counts = faulty.counts();
    let env = Arc::new(ScriptedEnv {
        calls: 2,
        turns: Default::default(),
        resets: Default::default(),
    });
    let (report, trajectories) = run(&f, env, Arc::new(faulty), tasks("t", 40));
    let reasons: Vec<String> = trajectories
        .iter()
        .filter(|t| !t.completed())
        .map(|t| format!("{:?}", t.end))
        .collect();
    assert!(
        reasons.is_empty(),
        "{report:?} {:?}",
        &reasons[..reasons.len().min(3)]
    );
    assert_eq!(trajectories.len(), 40, "{report:?}");
    assert!(trajectories.iter().all(|t| t.completed()), "{report:?}");
    assert_eq!(report.summary.completed, 40);
    assert_eq!(report.summary.failed + report.summary.requeued, 0);
    let panics = counts.panics.load(Ordering::Relaxed);
    assert!(
        panics > 0
            && counts.hangs.load(Ordering::Relaxed) > 0
            && counts.errors.load(Ordering::Relaxed) > 0
    );
    // Every call answered as panicked restarted its worker once. (A panic that outlasted
    // the call's timeout would be answered as a timeout, so the tool's own count is only a
    // bound.)
    let panicked = trajectories
        .iter()
        .flat_map(|t| &t.steps)
        .flat_map(|s| &s.tool_calls)
        .filter(|c| matches!(c.result, Err(CallError::Panicked(_))))
        .count() as u64;
    assert!(panicked > 0 && panicked <= panics, "{panicked} of {panics}");
    assert_eq!(
        report.tool_restarts["echo"], panicked,
        "each panicked worker restarted once"
    );

    // The actors report through the `metrics` crate: episodes, queues, batches, tokens, tool
    // latency and errors, restarts.
    let snapshot = snapshotter().snapshot().into_vec();
    // Errors per tool and kind that happened (known kinds are registered at zero when a pool
    // starts).
    let echo_errors: Vec<String> = snapshot
        .iter()
        .filter(|(k, ..)| k.key().name() == "agent_r1_tool_errors_total")
        .filter(|(.., v)| matches!(v, DebugValue::Counter(n) if *n > 0))
        .filter(|(k, ..)| {
            k.key()
                .labels()
                .any(|l| l.key() == "tool" && l.value() == "echo")
        })
        .flat_map(|(k, ..)| {
            k.key()
                .labels()
                .filter(|l| l.key() == "kind")
                .map(|l| l.value().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        ["timeout", "failed", "panicked"]
            .iter()
            .all(|kind| echo_errors.iter().any(|k| k == kind)),
        "errors per tool and kind: {echo_errors:?}"
    );

    let m = metric_values(&snapshot);
    let at_least = |name: &str, min: f64| {
        let v = m.get(name).copied().unwrap_or(f64::NAN);
        assert!(v >= min, "{name} = {v}, expected >= {min}; recorded: {m:?}");
    };
    for gauge in [
        "agent_r1_episodes_in_flight",
        "agent_r1_episodes_queued",
        "agent_r1_engine_waiting_requests",
        "agent_r1_engine_running_sequences",
        "agent_r1_tool_queue_depth",
        "agent_r1_engine_kv_parked_bytes",
    ] {
        at_least(gauge, 0.0);
    }
    at_least("agent_r1_episodes_total", 40.0);
    at_least("agent_r1_engine_batch_size", 1.0);
    at_least("agent_r1_engine_step_seconds", 1.0);
    at_least("agent_r1_engine_tokens_generated_total", 40.0);
    at_least("agent_r1_engine_prefill_tokens_total", 40.0);
    at_least("agent_r1_tool_call_duration_seconds", 40.0);
    at_least("agent_r1_tool_queue_wait_seconds", 40.0);
    at_least("agent_r1_tool_errors_total", 1.0);
    at_least("agent_r1_tool_restarts_total", panicked as f64);

    let mut kinds = HashMap::new();
    for t in &trajectories {
        assert_eq!(t.steps.len(), 3, "two tool turns then a final turn");
        // Contexts are prefixes of one stream; only actions are attributed to the policy.
        let stream = t.token_stream();
        let mut expected = t.prompt_ids.len();
        for s in &t.steps {
            assert_eq!(s.context_len, expected);
            expected += s.action_ids.len() + s.observation_ids.len();
            for c in &s.tool_calls {
                let kind = match &c.result {
                    Ok(_) => "ok",
                    Err(e) => e.kind(),
                };
                *kinds.entry(kind).or_insert(0) += 1;
            }
        }
        assert_eq!(stream.len(), expected);
        assert_eq!(
            t.action_mask().iter().filter(|&&m| m).count(),
            t.generated_tokens()
        );
        let obs = f
            .tokenizer
            .decode(&t.steps[0].observation_ids, false)
            .unwrap();
        assert!(
            obs.contains("<tool_response>") && obs.contains("Error: JSONDecodeError"),
            "{obs}"
        );
    }
    for kind in ["ok", "timeout", "failed", "invalid_json"] {
        assert!(
            kinds.get(kind).copied().unwrap_or(0) > 0,
            "no `{kind}` outcome: {kinds:?}"
        );
    }
    // Token-in, token-out: the stored logprobs are the policy's on exactly the stored context.
    for t in trajectories.iter().take(6) {
        for (k, s) in t.steps.iter().enumerate() {
            let mut ids = t.context(k);
            ids.extend(&s.action_ids);
            let logits = f.model.sequence_logits(&ids).unwrap();
            let lp = logits.log_softmax(-1, Kind::Float);
            for (j, (&tok, &stored)) in s.action_ids.iter().zip(&s.logprobs).enumerate() {
                let v = lp.double_value(&[(s.context_len + j - 1) as i64, tok as i64]);
                assert!(
                    (v - stored as f64).abs() < 1e-3,
                    "episode {} step {k} token {j}: {v} vs {stored}",
                    t.episode_id
                );
            }
        }
    }
}

#[test]
fn failed_episodes_are_requeued_once_then_reported() {
    let f = fixture();
    let env = Arc::new(ScriptedEnv {
        calls: 1,
        turns: Default::default(),
        resets: Default::default(),
    });
    let mut all = tasks("ok", 6);
    all.extend(tasks("flaky", 3));
    all.extend(tasks("bad", 2));
    let (report, trajectories) = run(&f, env, Arc::new(Echo), all);
    let reasons: Vec<String> = trajectories
        .iter()
        .filter(|t| !t.completed())
        .map(|t| format!("{} {:?}", t.task.id, t.end))
        .collect();
    eprintln!("{reasons:?}");
    assert_eq!(trajectories.len(), 11);
    assert_eq!(report.summary.completed, 9, "{report:?}");
    assert_eq!(report.summary.failed, 2);
    assert_eq!(report.summary.requeued, 5, "3 flaky + 2 bad, once each");
    assert!(report.summary.env_restarts >= 7, "{report:?}");
    for t in &trajectories {
        if t.task.id.starts_with("flaky") {
            assert!(t.completed() && t.attempts == 2);
        }
        if t.task.id.starts_with("bad") {
            assert!(!t.completed() && t.attempts == 2);
        }
    }
}

#[test]
fn a_prompt_over_max_prompt_fails_its_episode_once_without_a_retry() {
    let f = fixture();
    let env = Arc::new(ScriptedEnv {
        calls: 0,
        turns: Default::default(),
        resets: Default::default(),
    });
    let short = tasks("ok", 4);
    let mut long = tasks("long", 3);
    for (task, _) in &mut long {
        task.question = format!(
            "{} {}",
            task.question,
            "and what else is there? ".repeat(20)
        );
    }
    let mut setup = setup(
        &f,
        EnvSource::from(env.clone() as Arc<dyn Env>),
        vec![Arc::new(Echo)],
        8,
    );
    // The limit is the longest short prompt, as the renderer makes it.
    let render = |(task, _): &(Task, u64)| {
        let messages = env.reset(task).unwrap();
        setup.renderer.prompt(&messages).unwrap().len()
    };
    let limit = short.iter().map(render).max().unwrap();
    assert!(long.iter().map(render).min().unwrap() > limit);
    setup.episode.max_prompt = Some(limit);
    let mut all = short;
    all.extend(long);
    let (report, trajectories) = run_setup(setup, all);
    assert_eq!(report.summary.completed, 4, "{report:?}");
    assert_eq!(report.summary.failed, 3, "{report:?}");
    assert_eq!(
        report.summary.requeued, 0,
        "a prompt too long is not retried"
    );
    for t in trajectories
        .iter()
        .filter(|t| t.task.id.starts_with("long"))
    {
        assert_eq!(t.attempts, 1);
        assert!(t.steps.is_empty(), "nothing of it is trained on");
        let reason = format!("{:?}", t.end);
        assert!(
            reason.contains(&format!(
                "over the limit of {limit} (rollout.max_prompt_length)"
            )),
            "{reason}"
        );
    }
}

#[test]
fn a_failing_engine_stops_the_run_with_its_error() {
    let f = fixture();
    let env = Arc::new(ScriptedEnv {
        calls: 3,
        turns: Default::default(),
        resets: Default::default(),
    });
    // The engine stops at the 10th tool call: by then no episode can have finished its 3
    // calls and the turn after them, whatever the machine's speed.
    let stopper = StopsEngineAtCall {
        engine: f.engine.clone(),
        at: 10,
        calls: AtomicU64::new(0),
    };
    let (report, trajectories) = run(&f, env, Arc::new(stopper), tasks("t", 200));
    let fatal = report
        .summary
        .fatal
        .clone()
        .expect("the run reports the engine failure");
    assert!(fatal.contains("engine"), "{fatal}");
    assert!(report.summary.completed < 200);
    assert_eq!(
        report.summary.completed as usize,
        trajectories.iter().filter(|t| t.completed()).count()
    );
}

/// Runs `tasks` through one service (episode ids are the tasks' indexes), collecting
/// trajectories until every task has one; `on_each` sees each as it arrives.
async fn stream(
    setup: RolloutSetup,
    tasks: Vec<(Task, u64)>,
    mut on_each: impl FnMut(&Trajectory),
) -> (RolloutReport, Vec<Trajectory>) {
    let n = tasks.len();
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let service = RolloutService::start(setup, tx).await.unwrap();
    let sender = service.tasks();
    let feed = tokio::spawn(async move {
        for (i, (task, group_id)) in tasks.into_iter().enumerate() {
            let episode_id = i as u64;
            let request = EpisodeRequest {
                task,
                group_id,
                episode_id,
                resume: None,
            };
            sender.submit(request).await.unwrap();
        }
    });
    let mut out = Vec::new();
    while out.len() < n {
        let t = tokio::time::timeout(Duration::from_secs(300), rx.recv())
            .await
            .expect("a trajectory within 300 s")
            .expect("the service ended early");
        on_each(&t);
        out.push(t);
    }
    feed.await.unwrap();
    (service.finish().await.unwrap(), out)
}

#[test]
fn one_service_streams_2000_episodes_and_the_engine_batch_stays_full_across_batches() {
    const EPISODES: usize = 2000;
    const CONCURRENCY: usize = 256;
    const BATCH: usize = 64;
    let f = fixture_with_rows(CONCURRENCY);
    let env = Arc::new(ScriptedEnv {
        calls: 1,
        turns: Default::default(),
        resets: Default::default(),
    });
    let setup = setup(
        &f,
        EnvSource::Shared(env),
        vec![Arc::new(Echo)],
        CONCURRENCY,
    );
    let engine = f.engine.clone();
    let (report, all, windows) = runtime().block_on(async move {
        let (tx, mut rx) = tokio::sync::mpsc::channel(CONCURRENCY);
        let service = RolloutService::start(setup, tx).await.unwrap();
        let sender = service.tasks();
        let feed = tokio::spawn(async move {
            for (i, (task, group_id)) in tasks("s", EPISODES).into_iter().enumerate() {
                let request = EpisodeRequest {
                    task,
                    group_id,
                    episode_id: i as u64,
                    resume: None,
                };
                sender.submit(request).await.unwrap();
            }
        });
        // Groups of 4 (the tasks' group ids), 16 groups = 64 trajectories a batch, taken as
        // a learner would while the service runs on. At each batch boundary the engine's
        // counters give the mean rows per decode step since the previous boundary.
        let mut batcher = GroupBatcher::new(4, BATCH / 4);
        let mut all = Vec::new();
        let mut windows = Vec::new();
        let mut batches = 0;
        let mut last = engine.stats().await.unwrap();
        let mut received = 0;
        while received < EPISODES {
            let t = tokio::time::timeout(Duration::from_secs(300), rx.recv())
                .await
                .expect("a trajectory within 300 s")
                .expect("the service ended early");
            received += 1;
            batcher.push(t);
            while let Some(batch) = batcher.next_batch() {
                batches += 1;
                all.extend(batch);
                // Episodes finish in waves, so several batches can complete between two
                // decode steps: such a boundary extends the window instead of closing it.
                let now = engine.stats().await.unwrap();
                let steps = now.decode_steps - last.decode_steps;
                if steps > 0 {
                    windows.push(Window {
                        rows: now.decode_rows - last.decode_rows,
                        steps,
                        idle: now.idle_seconds - last.idle_seconds,
                        received,
                    });
                    last = now;
                }
            }
        }
        let (rest, partial) = batcher.take_all();
        assert!(partial.is_empty());
        all.extend(rest);
        feed.await.unwrap();
        assert_eq!(batches, EPISODES / BATCH);
        (service.finish().await.unwrap(), all, windows)
    });
    let s = &report.summary;
    eprintln!("{s:?}");
    assert_eq!(all.len(), EPISODES);
    assert_eq!(
        (s.taken, s.not_started, s.fatal.clone()),
        (EPISODES as u64, 0, None)
    );
    assert_eq!(
        s.completed + s.failed,
        EPISODES as u64,
        "every episode ended"
    );
    assert_eq!(s.episodes_spawned, EPISODES as u64 + s.requeued);
    assert!(
        all.iter().all(|t| t.completed()),
        "{:?}",
        all.iter().find(|t| !t.completed())
    );
    let mut ids: Vec<u64> = all.iter().map(|t| t.episode_id).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..EPISODES as u64).collect::<Vec<_>>(),
        "one service ran them all"
    );
    // While at least `CONCURRENCY` tasks remain, a batch boundary is not a drain: the
    // engine keeps stepping with most of the episodes in flight (mean rows per step in each
    // window between boundaries). The first wave is left out: its episodes all started
    // together, so they finish together and their successors prefill together, whatever
    // the learner does; the tail drains by design.
    for (k, w) in windows.iter().enumerate() {
        eprintln!(
            "window {k:>2}: {:>4} received, {:>3} steps, {:>6.1} rows/step, engine idle {:.3} s",
            w.received,
            w.steps,
            w.rows as f64 / w.steps as f64,
            w.idle
        );
    }
    let steady: Vec<&Window> = windows
        .iter()
        .filter(|w| w.received >= CONCURRENCY && w.received + CONCURRENCY <= EPISODES)
        .collect();
    assert!(steady.len() >= 10, "{} steady windows", steady.len());
    // A window of one or two steps samples the batch at an instant (episodes move between
    // turns and tools in waves); the mean of a window is read only over a full turn's steps.
    let per_window: Vec<f64> = steady
        .iter()
        .filter(|w| w.steps >= 8)
        .map(|w| w.rows as f64 / w.steps as f64)
        .collect();
    assert!(per_window.len() >= 4, "{} long windows", per_window.len());
    let low = per_window.iter().cloned().fold(f64::INFINITY, f64::min);
    assert!(
        low >= 0.5 * CONCURRENCY as f64,
        "a window averaged {low:.1} rows per step, under half of {CONCURRENCY}: {per_window:?}"
    );
    let rows: u64 = steady.iter().map(|w| w.rows).sum();
    let steps: u64 = steady.iter().map(|w| w.steps).sum();
    let mean = rows as f64 / steps as f64;
    assert!(
        mean >= 0.75 * CONCURRENCY as f64,
        "the steady part averaged {mean:.1} rows per step, under 3/4 of {CONCURRENCY}"
    );
}

/// Engine counters between two batch boundaries.
struct Window {
    rows: u64,
    steps: u64,
    idle: f64,
    received: usize,
}

/// Blocks a test double until the test opens it (at most two minutes).
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    changed: std::sync::Condvar,
}

impl Gate {
    fn wait(&self) -> bool {
        let open = self.open.lock().unwrap();
        let (open, _) = self
            .changed
            .wait_timeout_while(open, Duration::from_secs(120), |o| !*o)
            .unwrap();
        *open
    }
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.changed.notify_all();
    }
}

/// Test double: answers at once (no tools), and its scorer blocks on `slow-*` tasks until
/// the gate opens; it records which env instance scored what, and the first score of a
/// `crash-*` task panics.
struct ScorerEnv {
    instance: u64,
    gate: Arc<Gate>,
    scored: Arc<Mutex<Vec<(String, u64)>>>,
    crashed: Arc<Mutex<std::collections::HashSet<String>>>,
}

impl Env for ScorerEnv {
    fn name(&self) -> &str {
        "scorer"
    }
    fn tool_names(&self) -> Vec<String> {
        vec![]
    }
    fn reset(&self, task: &Task) -> agent_r1_envs::Result<Vec<Message>> {
        Ok(vec![Message::user(task.question.clone())])
    }
    fn on_turn(&self, _: &Task, _: &str, _: Vec<Result<ToolCall, CallError>>) -> TurnOutcome {
        TurnOutcome::Done
    }
    fn score(&self, task: &Task, _transcript: &[Message]) -> Score {
        self.scored
            .lock()
            .unwrap()
            .push((task.id.clone(), self.instance));
        if task.id.starts_with("slow") && !self.gate.wait() {
            panic!("the gate never opened: other episodes did not finish");
        }
        if task.id.starts_with("crash") && self.crashed.lock().unwrap().insert(task.id.clone()) {
            panic!("injected scorer crash (fault injection)");
        }
        Score {
            reward: 1.0,
            metrics: Default::default(),
        }
    }
}

fn scorer_env(gate: &Arc<Gate>) -> ScorerEnv {
    ScorerEnv {
        instance: 0,
        gate: gate.clone(),
        scored: Default::default(),
        crashed: Default::default(),
    }
}

#[test]
fn a_slow_scorer_in_one_episode_does_not_delay_the_others() {
    let f = fixture();
    let gate = Arc::new(Gate::default());
    let env = Arc::new(scorer_env(&gate));
    let mut all = tasks("slow", 1);
    all.extend(tasks("ok", 30));
    let setup = setup(&f, EnvSource::Shared(env), vec![], 8);
    let mut others = 0;
    let mut slow_after = None;
    let (report, out) = runtime().block_on(stream(setup, all, |t| {
        if t.task.id.starts_with("ok") {
            others += 1;
            // The slow scorer is still blocked: every other episode got past it.
            if others == 30 {
                gate.open();
            }
        } else {
            slow_after = Some(others);
        }
    }));
    assert_eq!(
        slow_after,
        Some(30),
        "the slow episode ended after all 30 others, which finished while it was scoring"
    );
    assert_eq!(report.summary.completed, 31, "{report:?}");
    assert!(out.iter().all(|t| t.completed()));
}

#[test]
fn a_crashed_env_actor_is_replaced_by_a_freshly_built_env() {
    let f = fixture();
    let gate = Arc::new(Gate::default());
    let template = scorer_env(&gate);
    let (scored, crashed) = (template.scored.clone(), template.crashed.clone());
    let builds = Arc::new(AtomicU64::new(0));
    let build = {
        let builds = builds.clone();
        Arc::new(move || {
            let instance = builds.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(ScorerEnv {
                instance,
                gate: gate.clone(),
                scored: scored.clone(),
                crashed: crashed.clone(),
            }) as Arc<dyn Env>)
        })
    };
    let source = EnvSource::per_episode(build).unwrap();
    let mut all = tasks("crash", 1);
    all.extend(tasks("ok", 5));
    let setup = setup(&f, source, vec![], 4);
    let (report, out) = runtime().block_on(stream(setup, all, |_| {}));
    let s = &report.summary;
    assert_eq!(
        (s.completed, s.failed, s.requeued, s.env_restarts),
        (6, 0, 1, 1),
        "{s:?}"
    );
    let crash = out.iter().find(|t| t.task.id == "crash-0").unwrap();
    assert!(crash.completed() && crash.attempts == 2, "{crash:?}");
    // One env per episode attempt (plus the one built at start to learn its tools), and the
    // retry scored on a different instance than the one that crashed.
    assert_eq!(builds.load(Ordering::SeqCst), 1 + s.episodes_spawned);
    let instances: Vec<u64> = template
        .scored
        .lock()
        .unwrap()
        .iter()
        .filter(|(task, _)| task == "crash-0")
        .map(|(_, i)| *i)
        .collect();
    assert_eq!(instances.len(), 2, "{instances:?}");
    assert_ne!(instances[0], instances[1], "the retry ran on a fresh env");
}

/// Fault injection: a per-episode env builder that, after the build that learns its tools,
/// blocks until the test releases it (a browser or sandbox that never comes up). Four
/// episodes build at once on a runtime of two threads: each gives up at `env_timeout`, named
/// as the build stage, so the builds cannot have held the runtime's threads.
#[test]
fn a_per_episode_env_build_that_never_returns_fails_its_episodes_at_the_env_timeout() {
    let f = fixture();
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let gate = Arc::new(Mutex::new(gate));
    let builds = Arc::new(AtomicU64::new(0));
    let build = {
        let builds = builds.clone();
        Arc::new(move || {
            if builds.fetch_add(1, Ordering::SeqCst) > 0 {
                // Returns only once the test drops `release`.
                let _ = gate.lock().unwrap_or_else(|p| p.into_inner()).recv();
            }
            Ok(Arc::new(ScriptedEnv {
                calls: 1,
                turns: Default::default(),
                resets: Default::default(),
            }) as Arc<dyn Env>)
        })
    };
    let source = EnvSource::per_episode(build).unwrap();
    let mut setup = setup(&f, source, vec![Arc::new(Echo)], 4);
    setup.episode.env_timeout = Duration::from_secs(2);
    let rt = runtime();
    let (report, out) = rt.block_on(stream(setup, tasks("stuck", 4), |_| {}));
    // The builders still blocked return now, so dropping the runtime can join their threads.
    drop(release);
    drop(rt);
    let s = &report.summary;
    assert_eq!((s.completed, s.failed), (0, 4), "{s:?}");
    for t in &out {
        let EpisodeEnd::Failed { reason } = &t.end else {
            panic!("{t:?}")
        };
        assert!(
            reason.contains("env build gave no answer within 2s"),
            "{reason}"
        );
    }
    assert!(
        builds.load(Ordering::SeqCst) > 4,
        "every attempt built its env"
    );
}

/// Fault injection: the learner's `before_update` hook holds the update until the test has
/// received 40 more trajectories, so the update can only finish if episodes keep sampling
/// while the learner trains (what `train`'s async mode relies on). A service whose sampling
/// waited on the learner would deadlock here and fail at the hook's limit. At most 32 of
/// the 40 can have started before the update did (8 in the channel, 12 finished and waiting
/// to send, 12 running), so at least 8 episodes started, and sampled, during it.
#[test]
fn sampling_goes_on_while_a_slowed_learner_updates() {
    const DURING: usize = 40;
    const STARTED_BEFORE_AT_MOST: usize = 8 + 12 + 12;
    let f = fixture();
    let env: Arc<dyn Env> = Arc::new(ScriptedEnv {
        calls: 1,
        turns: Default::default(),
        resets: Default::default(),
    });
    let setup = setup(&f, env.into(), vec![Arc::new(Echo)], 12);
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    let hold: BeforeUpdate = Arc::new(move |_| {
        let _ = started_tx.send(());
        release_rx
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(300))
            .expect("sampling went on while the learner was held");
    });
    let dir = f._dir.path().to_path_buf();
    let load = move || {
        Ok(LearnerModels {
            policy: PolicyModel::load(&dir, Placement::default(), false)?,
            critic: None,
            reference: None,
            teacher: None,
            critic_prefix: None,
        })
    };
    let config = LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Grpo,
            micro_batch_size: 8,
            kl: KlConfig::OFF,
            critic_warmup_updates: 0,
            ..Default::default()
        },
        ..testing::learner_config()
    };
    runtime().block_on(async {
        let learner = LearnerRef::spawn(LearnerStart {
            before_update: Some(hold),
            ..LearnerStart::new(load, config)
        })
        .await
        .unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let service = RolloutService::start(setup, tx).await.unwrap();
        let sender = service.tasks();
        let all = tasks("s", 64);
        let n = all.len();
        let feed = tokio::spawn(async move {
            for (i, (task, group_id)) in all.into_iter().enumerate() {
                let request = EpisodeRequest {
                    task,
                    group_id,
                    episode_id: i as u64,
                    resume: None,
                };
                sender.submit(request).await.unwrap();
            }
        });
        async fn next(rx: &mut tokio::sync::mpsc::Receiver<Trajectory>) -> Trajectory {
            tokio::time::timeout(Duration::from_secs(300), rx.recv())
                .await
                .expect("a trajectory within 300 s")
                .expect("the service ended early")
        }
        let mut batch = Vec::new();
        for _ in 0..16 {
            batch.push(next(&mut rx).await);
        }
        let update = tokio::spawn({
            let learner = learner.clone();
            async move { learner.update(batch).await }
        });
        started.recv().await.expect("the update began");
        let before = f.engine.stats().await.unwrap();
        for _ in 0..DURING {
            next(&mut rx).await;
        }
        let after = f.engine.stats().await.unwrap();
        release.send(()).unwrap();
        let stats = update.await.unwrap().unwrap();
        assert_eq!(stats.version, 1, "{stats:?}");
        assert!(
            after.turns >= before.turns + (DURING - STARTED_BEFORE_AT_MOST) as u64
                && after.decode_steps > before.decode_steps,
            "the engine decoded while the learner was held: {before:?} -> {after:?}"
        );
        for _ in 16 + DURING..n {
            next(&mut rx).await;
        }
        feed.await.unwrap();
        let report = service.finish().await.unwrap();
        assert_eq!(report.summary.completed, n as u64, "{report:?}");
        learner.shutdown();
    });
}

/// A tool whose calls wait for each other: each returns only once `parties` calls are
/// inside it at the same time, so a turn's calls finish only if they run concurrently (run
/// one after another, the first would wait until its timeout).
struct Rendezvous {
    barrier: tokio::sync::Barrier,
    runs: AtomicU64,
}

#[async_trait]
impl Tool for Rendezvous {
    fn name(&self) -> &str {
        "meet"
    }
    fn description(&self) -> &str {
        "Returns its index once every call of the turn has arrived."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"i": {"type": "integer"}}, "required": ["i"]})
    }
    fn timeout(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn max_concurrency(&self) -> usize {
        8
    }
    async fn call(&self, args: Value) -> agent_r1_envs::Result<ToolOutput> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.barrier.wait().await;
        Ok(ToolOutput::text(format!("result {}", args["i"])))
    }
}

/// Test double: the first turn makes `calls` calls of `meet` (whatever the model wrote), the
/// second ends the episode.
struct ManyCallsEnv {
    calls: usize,
    turns: Mutex<HashMap<String, usize>>,
}

impl Env for ManyCallsEnv {
    fn name(&self) -> &str {
        "many-calls"
    }
    fn tool_names(&self) -> Vec<String> {
        vec!["meet".into()]
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
        let mut turns = self.turns.lock().unwrap();
        let t = turns.entry(task.id.clone()).or_default();
        *t += 1;
        if *t > 1 {
            return TurnOutcome::Done;
        }
        TurnOutcome::Calls(
            (0..self.calls)
                .map(|i| {
                    Ok(ToolCall {
                        name: "meet".into(),
                        arguments: json!({ "i": i }),
                    })
                })
                .collect(),
        )
    }
    fn score(&self, _task: &Task, _transcript: &[Message]) -> Score {
        Score {
            reward: 0.0,
            metrics: Default::default(),
        }
    }
}

#[test]
fn a_turn_with_three_calls_runs_them_together_and_answers_in_order_past_the_limit_none_run() {
    let f = fixture();
    let tool = Arc::new(Rendezvous {
        barrier: tokio::sync::Barrier::new(3),
        runs: AtomicU64::new(0),
    });
    let env = Arc::new(ManyCallsEnv {
        calls: 4,
        turns: Mutex::new(HashMap::new()),
    });
    let mut setup = setup(&f, EnvSource::Shared(env), vec![tool.clone()], 1);
    setup.episode.max_tool_calls_per_turn = 3;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let report = runtime()
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(300),
                run_rollout(setup, tasks("meet", 1), tx),
            )
            .await
        })
        .expect("the rollout must not hang")
        .unwrap();
    assert_eq!(report.summary.completed, 1, "{report:?}");
    let t = rx.try_recv().expect("one trajectory");
    let calls = &t.steps[0].tool_calls;
    let answers: Vec<String> = calls
        .iter()
        .map(|c| match &c.result {
            Ok(out) => out.text.clone(),
            Err(e) => e.kind().to_string(),
        })
        .collect();
    // The barrier let the three through together; the fourth was refused without running.
    assert_eq!(
        answers,
        ["result 0", "result 1", "result 2", "too_many_calls"]
    );
    assert_eq!(tool.runs.load(Ordering::SeqCst), 3);
    // Three observations in the call order, and the refusal says why.
    let obs = f
        .tokenizer
        .decode(&t.steps[0].observation_ids, false)
        .unwrap();
    let at = |needle: &str| {
        obs.find(needle)
            .unwrap_or_else(|| panic!("{needle} in {obs}"))
    };
    assert!(at("result 0") < at("result 1") && at("result 1") < at("result 2"));
    assert!(at("TooManyToolCalls") > at("result 2"), "{obs}");
    // Token-in, token-out: the stored contexts are prefixes of the one stream.
    let mut expected = t.prompt_ids.len();
    for s in &t.steps {
        assert_eq!(s.context_len, expected);
        expected += s.action_ids.len() + s.observation_ids.len();
    }
    assert_eq!(t.token_stream().len(), expected);
}

#[test]
fn two_engines_share_the_episodes_and_each_episode_keeps_its_engine_and_its_kv() {
    const EPISODES: usize = 64;
    let f = fixture();
    let second = tiny_engine(f._dir.path(), 16);
    let engines = EngineSet::new(vec![
        ("cpu (engine 0)".into(), f.engine.clone()),
        ("cpu (engine 1)".into(), second.clone()),
    ])
    .unwrap();
    let env = Arc::new(ScriptedEnv {
        calls: 2,
        turns: Default::default(),
        resets: Default::default(),
    });
    let mut two = setup(&f, EnvSource::Shared(env), vec![Arc::new(Echo)], 16);
    two.engine = engines.clone();
    let (report, all) = run_setup(two, tasks("two", EPISODES));
    assert_eq!(report.summary.completed, EPISODES as u64, "{report:?}");
    assert_eq!(all.len(), EPISODES);

    let each = runtime().block_on(engines.stats_each()).unwrap();
    let routed = engines.episodes_routed().expect("two engines route");
    eprintln!("episodes routed per engine: {routed:?}");
    for (i, s) in each.iter().enumerate() {
        eprintln!(
            "engine {i}: {} turns, {} prefill tokens, {} reused, mean batch {:.1}",
            s.turns,
            s.prefill_tokens,
            s.reused_tokens,
            s.mean_batch_size()
        );
    }
    assert_eq!(routed.iter().sum::<u64>(), EPISODES as u64);
    assert!(
        routed.iter().all(|&n| n > 0),
        "both engines sampled: {routed:?}"
    );
    assert!(
        each.iter().all(|s| s.turns > 0 && s.evictions == 0),
        "{each:?}"
    );
    let steps: usize = all.iter().map(|t| t.steps.len()).sum();
    assert_eq!(each.iter().map(|s| s.turns).sum::<u64>(), steps as u64);
    assert_eq!(
        engines.episodes_held(),
        vec![0, 0],
        "every episode released its route"
    );
    // Sticky: a later turn finds its episode's KV parked on the engine it goes to, so it
    // prefills only what was added since its previous turn (the observation, and the last
    // sampled token, which was never fed), as with one engine; on the other engine it would
    // prefill the whole context past the shared prompt prefix.
    let later_turns_prefill_only_what_is_new = |all: &[Trajectory]| -> (usize, usize) {
        for t in all {
            assert!(t.steps[0].prefill_tokens <= t.prompt_ids.len());
            for (k, pair) in t.steps.windows(2).enumerate() {
                assert_eq!(
                    pair[1].prefill_tokens,
                    pair[0].observation_ids.len() + 1,
                    "episode {} step {}: {:?}",
                    t.episode_id,
                    k + 1,
                    pair[1]
                );
            }
        }
        let first = all.iter().map(|t| t.steps[0].prefill_tokens).sum();
        let later = all
            .iter()
            .flat_map(|t| t.steps.iter().skip(1))
            .map(|s| s.prefill_tokens)
            .sum();
        (first, later)
    };
    let (first, later) = later_turns_prefill_only_what_is_new(&all);

    // The same tasks on one fresh engine.
    let env = Arc::new(ScriptedEnv {
        calls: 2,
        turns: Default::default(),
        resets: Default::default(),
    });
    let mut one = setup(&f, EnvSource::Shared(env), vec![Arc::new(Echo)], 16);
    let alone_engine = tiny_engine(f._dir.path(), 16);
    one.engine = (&alone_engine).into();
    let (report, alone) = run_setup(one, tasks("two", EPISODES));
    assert_eq!(report.summary.completed, EPISODES as u64, "{report:?}");
    let (first_alone, later_alone) = later_turns_prefill_only_what_is_new(&alone);
    eprintln!(
        "prefill tokens, first turns / later turns: two engines {first} / {later}, one engine \
         {first_alone} / {later_alone}"
    );
}
