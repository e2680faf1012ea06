//! One pool per tool: `max_concurrency` worker actors under a pool actor that queues calls
//! (bounded: a full queue sheds the call with an `Overloaded` observation), validates
//! arguments, and supervises its workers. Each call runs through the envs crate's one call
//! guard (`call_guard::run_guarded`: the tool's timeout, panics caught), so a slow tool never
//! holds an episode past `Tool::timeout`. A call whose tool panicked is answered with that
//! panic, and its worker is replaced after a back-off. A queued call
//! whose episode stopped waiting (its reply port closed) is dropped instead of run.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use agent_r1_envs::call_guard::run_guarded_holding;
use agent_r1_envs::call_key::CallKey;
use agent_r1_envs::tool::{CallError, CallOutcome, Tool, ToolCall};
use serde_json::Value;

use crate::stall::Operations;

/// Restart limits of a pool's workers.
#[derive(Debug, Clone, PartialEq)]
pub struct RestartPolicy {
    /// First back-off before a replacement worker starts.
    pub backoff: Duration,
    /// Longest back-off (it doubles with each failure within `window`).
    pub max_backoff: Duration,
    /// Failures counted for the back-off are those within this window.
    pub window: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(2),
            window: Duration::from_secs(10),
        }
    }
}

/// Messages of a tool pool.
#[derive(Debug)]
pub enum ToolPoolMsg {
    /// Run a call (under its idempotency key, where it has one); the reply is its outcome
    /// (never an error at the messaging level unless the pool itself is gone).
    Call(ToolCall, Option<CallKey>, RpcReplyPort<CallOutcome>),
    /// A worker finished its call.
    WorkerIdle(ActorId),
    /// Start a replacement worker (after a back-off).
    Respawn,
    /// Report counters.
    Stats(RpcReplyPort<ToolPoolStats>),
}

// Local only: never sent to another node.
impl ractor::Message for ToolPoolMsg {}

/// Counters of a pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolPoolStats {
    /// Calls answered.
    pub calls: u64,
    /// Calls shed because the queue was full.
    pub shed: u64,
    /// Workers restarted after a failure.
    pub restarts: u64,
    /// Calls waiting now.
    pub queued: usize,
}

/// Arguments of a pool.
pub struct ToolPoolArgs {
    /// The tool.
    pub tool: Arc<dyn Tool>,
    /// Calls that may wait for a worker before new ones are shed.
    pub queue_capacity: usize,
    /// Worker restart policy.
    pub restart: RestartPolicy,
    /// Validates arguments before a call is queued (the schema check of the envs crate).
    pub validate: super::ArgValidator,
    /// Where running calls are recorded for the stall detector (`None`: not watched).
    pub stall: Option<Operations>,
}

/// The `kind` labels of `agent_r1_tool_errors_total` for calls that reached a pool (the
/// episode also reports `timeout` and `failed` for calls that waited too long or whose
/// worker crashed).
const POOL_ERROR_KINDS: [&str; 5] = [
    "invalid_arguments",
    "overloaded",
    "timeout",
    "failed",
    "panicked",
];

/// The pool actor.
pub struct ToolPool;

/// The pool's state.
pub struct ToolPoolState {
    tool: Arc<dyn Tool>,
    args_validate: super::ArgValidator,
    idle: Vec<ActorRef<WorkerMsg>>,
    busy: HashMap<ActorId, ActorRef<WorkerMsg>>,
    queue: VecDeque<Queued>,
    queue_capacity: usize,
    restart: RestartPolicy,
    failures: VecDeque<Instant>,
    stats: ToolPoolStats,
    stall: Option<Operations>,
}

impl Actor for ToolPool {
    type Msg = ToolPoolMsg;
    type State = ToolPoolState;
    type Arguments = ToolPoolArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: ToolPoolArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        // This tool's series start at zero (every error kind a pool can report), so that
        // rates and error ratios exist before the first call or failure.
        let name = args.tool.name().to_string();
        metrics::counter!(crate::metric_names::TOOL_CALLS_TOTAL.name, "tool" => name.clone())
            .increment(0);
        metrics::counter!(crate::metric_names::TOOL_RESTARTS_TOTAL.name, "tool" => name.clone())
            .increment(0);
        for kind in POOL_ERROR_KINDS {
            metrics::counter!(crate::metric_names::TOOL_ERRORS_TOTAL.name, "tool" => name.clone(), "kind" => kind)
                .increment(0);
        }
        metrics::gauge!(crate::metric_names::TOOL_QUEUE_DEPTH.name, "tool" => name).set(0.0);
        let mut idle = Vec::new();
        for _ in 0..args.tool.max_concurrency().max(1) {
            idle.push(spawn_worker(&myself, &args.tool, &args.stall).await?);
        }
        Ok(ToolPoolState {
            tool: args.tool,
            args_validate: args.validate,
            idle,
            busy: HashMap::new(),
            queue: VecDeque::new(),
            queue_capacity: args.queue_capacity,
            restart: args.restart,
            failures: VecDeque::new(),
            stats: ToolPoolStats::default(),
            stall: args.stall,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ToolPoolMsg::Call(call, key, reply) => {
                let name = state.tool.name().to_string();
                metrics::counter!(crate::metric_names::TOOL_CALLS_TOTAL.name, "tool" => name.clone()).increment(1);
                if let Err(e) = (state.args_validate)(state.tool.as_ref(), &call.arguments) {
                    record_error(&name, &e);
                    let _ = reply.send(CallOutcome {
                        name: Some(call.name),
                        result: Err(e),
                        latency: Duration::ZERO,
                    });
                    return Ok(());
                }
                if state.queue.len() >= state.queue_capacity && state.idle.is_empty() {
                    state.stats.shed += 1;
                    record_error(&name, &CallError::Overloaded);
                    let _ = reply.send(CallOutcome {
                        name: Some(call.name),
                        result: Err(CallError::Overloaded),
                        latency: Duration::ZERO,
                    });
                    return Ok(());
                }
                state.queue.push_back(Queued {
                    call,
                    key,
                    reply,
                    at: Instant::now(),
                });
                dispatch(state);
            }
            ToolPoolMsg::WorkerIdle(id) => {
                if let Some(worker) = state.busy.remove(&id) {
                    state.stats.calls += 1;
                    state.idle.push(worker);
                }
                dispatch(state);
            }
            ToolPoolMsg::Respawn => {
                let worker = spawn_worker(&myself, &state.tool, &state.stall).await?;
                state.idle.push(worker);
                dispatch(state);
            }
            ToolPoolMsg::Stats(reply) => {
                let _ = reply.send(ToolPoolStats {
                    queued: state.queue.len(),
                    ..state.stats.clone()
                });
            }
        }
        metrics::gauge!(crate::metric_names::TOOL_QUEUE_DEPTH.name, "tool" => state.tool.name().to_string())
            .set(state.queue.len() as f64);
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, failed) = match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                tracing::warn!(tool = state.tool.name(), "tool worker failed: {err}");
                (cell, true)
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => (cell, false),
            _ => return Ok(()),
        };
        let id = cell.get_id();
        let was_busy = state.busy.remove(&id).is_some();
        state.idle.retain(|w| w.get_id() != id);
        if !(failed || was_busy) {
            return Ok(());
        }
        state.stats.restarts += 1;
        metrics::counter!(crate::metric_names::TOOL_RESTARTS_TOTAL.name, "tool" => state.tool.name().to_string())
            .increment(1);
        let now = Instant::now();
        state.failures.push_back(now);
        while state
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > state.restart.window)
        {
            state.failures.pop_front();
        }
        let exp = (state.failures.len() as u32).saturating_sub(1).min(16);
        let delay = (state.restart.backoff * 2u32.pow(exp)).min(state.restart.max_backoff);
        let pool = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = pool.cast(ToolPoolMsg::Respawn);
        });
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for w in state
            .idle
            .drain(..)
            .chain(state.busy.drain().map(|(_, w)| w))
        {
            w.stop(None);
        }
        for Queued { call, reply, .. } in state.queue.drain(..) {
            let _ = reply.send(CallOutcome {
                name: Some(call.name),
                result: Err(CallError::Failed("the tool pool stopped".into())),
                latency: Duration::ZERO,
            });
        }
        Ok(())
    }
}

fn dispatch(state: &mut ToolPoolState) {
    while !state.queue.is_empty() {
        let Some(worker) = state.idle.pop() else {
            return;
        };
        let queued = state.queue.pop_front().expect("not empty");
        if queued.reply.is_closed() {
            metrics::counter!(crate::metric_names::TOOL_CALLS_ABANDONED_TOTAL.name, "tool" => state.tool.name().to_string())
                .increment(1);
            state.idle.push(worker);
            continue;
        }
        let id = worker.get_id();
        match worker.cast(WorkerMsg::Run(queued)) {
            Ok(()) => {
                state.busy.insert(id, worker);
            }
            Err(e) => {
                // The worker died between going idle and now; its supervision event restarts
                // it. The call was inside the failed message and is answered from there.
                tracing::warn!("tool worker unreachable: {e}");
                if let ractor::MessagingErr::SendErr(WorkerMsg::Run(queued)) = e {
                    state.queue.push_front(queued);
                }
            }
        }
    }
}

fn record_error(tool: &str, e: &CallError) {
    metrics::counter!(crate::metric_names::TOOL_ERRORS_TOTAL.name, "tool" => tool.to_string(), "kind" => e.kind())
        .increment(1);
}

async fn spawn_worker(
    pool: &ActorRef<ToolPoolMsg>,
    tool: &Arc<dyn Tool>,
    stall: &Option<Operations>,
) -> Result<ActorRef<WorkerMsg>, ActorProcessingErr> {
    let (worker, _) = Actor::spawn_linked(
        None,
        ToolWorker,
        (tool.clone(), pool.clone(), stall.clone()),
        pool.get_cell(),
    )
    .await?;
    Ok(worker)
}

/// `search {"query": "..."}`, cut to a readable length.
fn describe_call(name: &str, arguments: &Value) -> String {
    const MAX: usize = 120;
    let args = arguments.to_string();
    match args.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{name} {}...", &args[..cut]),
        None => format!("{name} {args}"),
    }
}

/// A call waiting for a worker.
#[derive(Debug)]
pub(crate) struct Queued {
    call: ToolCall,
    key: Option<CallKey>,
    reply: RpcReplyPort<CallOutcome>,
    /// When it was queued.
    at: Instant,
}

/// A worker's message: run one call.
#[derive(Debug)]
pub(crate) enum WorkerMsg {
    /// The call.
    Run(Queued),
}

// Local only: never sent to another node.
impl ractor::Message for WorkerMsg {}

/// Runs one call at a time.
pub(crate) struct ToolWorker;

impl Actor for ToolWorker {
    type Msg = WorkerMsg;
    type State = (Arc<dyn Tool>, ActorRef<ToolPoolMsg>, Option<Operations>);
    type Arguments = (Arc<dyn Tool>, ActorRef<ToolPoolMsg>, Option<Operations>);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let WorkerMsg::Run(Queued {
            call,
            key,
            reply,
            at: queued,
        }) = message;
        let (tool, pool, stall) = state;
        let name = tool.name().to_string();
        let started = Instant::now();
        // Held by the call's own task: a call that blocks its thread stays on record after
        // its timeout answered the episode.
        let running = stall
            .as_ref()
            .map(|ops| ops.start(format!("call {}", describe_call(&name, &call.arguments))));
        let result = run_guarded_holding(tool.clone(), key, call.arguments, running).await;
        let latency = started.elapsed();
        metrics::histogram!(crate::metric_names::TOOL_CALL_DURATION_SECONDS.name, "tool" => name.clone())
            .record(latency.as_secs_f64());
        metrics::histogram!(crate::metric_names::TOOL_QUEUE_WAIT_SECONDS.name, "tool" => name.clone())
            .record((started - queued).as_secs_f64());
        if let Err(e) = &result {
            record_error(&name, e);
        }
        let panicked = match &result {
            Err(CallError::Panicked(message)) => Some(message.clone()),
            _ => None,
        };
        let _ = reply.send(CallOutcome {
            name: Some(call.name),
            result,
            latency,
        });
        if let Some(message) = panicked {
            // The call is answered; the worker fails so that the pool counts the crash and
            // replaces it after a back-off (a tool that keeps panicking is slowed down).
            return Err(format!("tool `{name}` panicked: {message}").into());
        }
        let _ = pool.cast(ToolPoolMsg::WorkerIdle(myself.get_id()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use agent_r1_envs::tool::ToolOutput;
    use async_trait::async_trait;
    use serde_json::{json, Value};

    use super::*;

    /// Counts the calls it runs.
    struct Counting {
        runs: Arc<AtomicUsize>,
    }

    #[async_trait]
    impl Tool for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        fn description(&self) -> &str {
            "counts its calls"
        }
        fn parameters(&self) -> Value {
            json!({"type": "object"})
        }
        fn max_concurrency(&self) -> usize {
            1
        }
        async fn call(&self, _: Value) -> agent_r1_envs::Result<ToolOutput> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            Ok(ToolOutput::text("done"))
        }
    }

    fn call() -> ToolCall {
        ToolCall {
            name: "counting".into(),
            arguments: json!({}),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_whose_episode_stopped_waiting_is_dropped_unrun() {
        let runs = Arc::new(AtomicUsize::new(0));
        let (pool, _) = Actor::spawn(
            None,
            ToolPool,
            ToolPoolArgs {
                tool: Arc::new(Counting { runs: runs.clone() }),
                queue_capacity: 8,
                restart: RestartPolicy::default(),
                validate: Arc::new(|_: &dyn Tool, _: &Value| Ok(())),
                stall: None,
            },
        )
        .await
        .unwrap();
        // An episode that gave up (its deadline passed) before its call was run.
        let (port, gave_up) = tokio::sync::oneshot::channel();
        drop(gave_up);
        pool.cast(ToolPoolMsg::Call(call(), None, port.into()))
            .unwrap();
        let answered = pool
            .call(|r| ToolPoolMsg::Call(call(), None, r), None)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answered.result.unwrap().text, "done");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "only the awaited call ran");
        pool.stop(None);
    }
}
