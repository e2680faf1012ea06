//! Running parsed tool calls: validation, timeout, per-tool concurrency limit, load shedding
//! and panic isolation.
//!
//! [`ToolExecutor`] holds tools by name and runs one turn's calls concurrently, returning
//! one [`CallOutcome`] per call in call order. The pieces are free functions too, so the
//! actor runtime's own pools can reuse them: [`check_call`] (name + schema),
//! [`run_guarded`] (timeout + panic catching of one call) and [`execute`] (both).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Semaphore;

use crate::schema::validate_arguments;
use crate::tool::{CallError, CallOutcome, Tool, ToolCall, ToolOutput};

/// Settings of a [`ToolExecutor`].
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutorConfig {
    /// Calls of one tool that may wait for a free slot (beyond its `max_concurrency`
    /// running ones); a call arriving when this many wait is shed as
    /// [`CallError::Overloaded`].
    pub queue_capacity: usize,
    /// Longest a call may wait for a slot before it is shed as [`CallError::Overloaded`]
    /// (`None`: wait as long as it takes).
    pub queue_timeout: Option<Duration>,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 64,
            queue_timeout: Some(Duration::from_secs(60)),
        }
    }
}

/// Counters of one tool in an executor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolStats {
    /// Calls that reached the tool (ran, whatever the result).
    pub ran: u64,
    /// Calls shed because the queue was full or the wait too long.
    pub shed: u64,
    /// Calls that ran past the timeout.
    pub timed_out: u64,
    /// Calls whose tool panicked.
    pub panicked: u64,
    /// Calls waiting for a slot now.
    pub waiting: usize,
}

/// One tool with its admission state.
struct Slot {
    tool: Arc<dyn Tool>,
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    ran: AtomicU64,
    shed: AtomicU64,
    timed_out: AtomicU64,
    panicked: AtomicU64,
}

/// Tools by name, run with validation, timeouts, concurrency limits, load shedding and
/// panic isolation.
pub struct ToolExecutor {
    slots: HashMap<String, Arc<Slot>>,
    config: ExecutorConfig,
}

impl std::fmt::Debug for ToolExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolExecutor")
            .field("tools", &self.names())
            .field("config", &self.config)
            .finish()
    }
}

impl ToolExecutor {
    /// An executor over `tools` (a later tool with the same name replaces an earlier one).
    pub fn new(tools: impl IntoIterator<Item = Arc<dyn Tool>>, config: ExecutorConfig) -> Self {
        let slots = tools
            .into_iter()
            .map(|tool| {
                let slot = Slot {
                    permits: Arc::new(Semaphore::new(tool.max_concurrency().max(1))),
                    tool,
                    waiting: AtomicUsize::new(0),
                    ran: AtomicU64::new(0),
                    shed: AtomicU64::new(0),
                    timed_out: AtomicU64::new(0),
                    panicked: AtomicU64::new(0),
                };
                (slot.tool.name().to_string(), Arc::new(slot))
            })
            .collect();
        Self { slots, config }
    }

    /// Tool names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.slots.keys().cloned().collect();
        names.sort();
        names
    }

    /// The tool called `name`.
    pub fn tool(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.slots.get(name).map(|s| &s.tool)
    }

    /// OpenAI function specs of all tools (for the chat template's `tools`), sorted by name.
    pub fn specs(&self) -> Vec<Value> {
        self.names()
            .iter()
            .filter_map(|n| self.tool(n).map(|t| t.spec()))
            .collect()
    }

    /// Counters of the tool `name`.
    pub fn stats(&self, name: &str) -> Option<ToolStats> {
        self.slots.get(name).map(|s| ToolStats {
            ran: s.ran.load(Ordering::Relaxed),
            shed: s.shed.load(Ordering::Relaxed),
            timed_out: s.timed_out.load(Ordering::Relaxed),
            panicked: s.panicked.load(Ordering::Relaxed),
            waiting: s.waiting.load(Ordering::Relaxed),
        })
    }

    /// Runs one turn's calls concurrently; outcomes come back in call order. Parse failures
    /// pass through as error outcomes (latency zero), so the model sees every call answered.
    pub async fn run(&self, calls: Vec<Result<ToolCall, CallError>>) -> Vec<CallOutcome> {
        let handles: Vec<_> = calls
            .into_iter()
            .map(|call| {
                let prepared = self.prepare(call);
                let config = self.config.clone();
                tokio::spawn(async move {
                    match prepared {
                        Ok((slot, call)) => run_in_slot(slot, call, &config).await,
                        Err(outcome) => *outcome,
                    }
                })
            })
            .collect();
        let mut outcomes = Vec::with_capacity(handles.len());
        for handle in handles {
            // Each task catches its tool's panic itself; a join error here means the runtime
            // is shutting down.
            outcomes.push(handle.await.unwrap_or_else(|e| CallOutcome {
                name: None,
                result: Err(CallError::Failed(format!("call task failed: {e}"))),
                latency: Duration::ZERO,
            }));
        }
        outcomes
    }

    /// Runs one call (validation, admission, timeout, panic catching).
    pub async fn run_one(&self, call: Result<ToolCall, CallError>) -> CallOutcome {
        match self.prepare(call) {
            Ok((slot, call)) => run_in_slot(slot, call, &self.config).await,
            Err(outcome) => *outcome,
        }
    }

    /// Resolves the tool and validates the arguments; an `Err` is the finished outcome
    /// (boxed: it is the rare path and much larger than the `Ok`).
    fn prepare(
        &self,
        call: Result<ToolCall, CallError>,
    ) -> Result<(Arc<Slot>, ToolCall), Box<CallOutcome>> {
        let failed = |name: Option<String>, e: CallError| {
            Box::new(CallOutcome {
                name,
                result: Err(e),
                latency: Duration::ZERO,
            })
        };
        let call = call.map_err(|e| failed(None, e))?;
        let Some(slot) = self.slots.get(&call.name) else {
            return Err(failed(
                Some(call.name.clone()),
                CallError::UnknownTool(call.name),
            ));
        };
        if let Err(e) = validate_arguments(&slot.tool.parameters(), &call.arguments) {
            return Err(failed(Some(call.name), e));
        }
        Ok((slot.clone(), call))
    }
}

/// Decrements a waiting counter when dropped (also when the waiting call is cancelled).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn run_in_slot(slot: Arc<Slot>, call: ToolCall, config: &ExecutorConfig) -> CallOutcome {
    let start = Instant::now();
    let name = Some(call.name.clone());
    let shed = |slot: &Slot| {
        slot.shed.fetch_add(1, Ordering::Relaxed);
        CallOutcome {
            name: name.clone(),
            result: Err(CallError::Overloaded),
            latency: start.elapsed(),
        }
    };
    let permit = match slot.permits.clone().try_acquire_owned() {
        Ok(permit) => permit,
        Err(_) => {
            if slot.waiting.fetch_add(1, Ordering::AcqRel) >= config.queue_capacity {
                slot.waiting.fetch_sub(1, Ordering::AcqRel);
                return shed(&slot);
            }
            let _waiting = Waiting(&slot.waiting);
            let acquire = slot.permits.clone().acquire_owned();
            let acquired = match config.queue_timeout {
                Some(limit) => tokio::time::timeout(limit, acquire).await.ok(),
                None => Some(acquire.await),
            };
            match acquired {
                Some(Ok(permit)) => permit,
                // Timed out waiting, or the semaphore was closed.
                _ => return shed(&slot),
            }
        }
    };
    slot.ran.fetch_add(1, Ordering::Relaxed);
    let result = run_guarded(slot.tool.clone(), call.arguments).await;
    drop(permit);
    match &result {
        Err(CallError::Timeout(_)) => {
            slot.timed_out.fetch_add(1, Ordering::Relaxed);
        }
        Err(CallError::Failed(m)) if m.contains(PANIC_MARKER) => {
            slot.panicked.fetch_add(1, Ordering::Relaxed);
        }
        _ => {}
    }
    CallOutcome {
        name,
        result,
        latency: start.elapsed(),
    }
}

/// Checks a call against the tools available: the tool exists and the arguments fit its
/// schema. Returns the tool to run.
pub fn check_call<'a>(
    tools: &'a HashMap<String, Arc<dyn Tool>>,
    call: &ToolCall,
) -> Result<&'a Arc<dyn Tool>, CallError> {
    let tool = tools
        .get(&call.name)
        .ok_or_else(|| CallError::UnknownTool(call.name.clone()))?;
    validate_arguments(&tool.parameters(), &call.arguments)?;
    Ok(tool)
}

const PANIC_MARKER: &str = "the tool panicked";

/// Runs one call of `tool` on its own task with the tool's timeout. A tool error becomes
/// [`CallError::Failed`], a panic becomes [`CallError::Failed`] ("the tool panicked: ..."),
/// and a call past [`Tool::timeout`] is aborted and becomes [`CallError::Timeout`]. Does
/// not validate arguments (see [`execute`]).
pub async fn run_guarded(tool: Arc<dyn Tool>, arguments: Value) -> Result<ToolOutput, CallError> {
    let limit = tool.timeout();
    let mut task = tokio::spawn(async move { tool.call(arguments).await });
    match tokio::time::timeout(limit, &mut task).await {
        Err(_) => {
            task.abort();
            Err(CallError::Timeout(limit))
        }
        Ok(Ok(Ok(output))) => Ok(output),
        Ok(Ok(Err(e))) => Err(CallError::Failed(e.to_string())),
        Ok(Err(join)) if join.is_panic() => {
            let payload = join.into_panic();
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(CallError::Failed(format!("{PANIC_MARKER}: {message}")))
        }
        Ok(Err(join)) => Err(CallError::Failed(format!("the tool was cancelled: {join}"))),
    }
}

/// Validates and runs one call of `tool` (no concurrency limit): the building block for a
/// runtime that manages its own pools.
pub async fn execute(tool: Arc<dyn Tool>, arguments: Value) -> CallOutcome {
    let start = Instant::now();
    let name = Some(tool.name().to_string());
    let result = match validate_arguments(&tool.parameters(), &arguments) {
        Ok(()) => run_guarded(tool, arguments).await,
        Err(e) => Err(e),
    };
    CallOutcome {
        name,
        result,
        latency: start.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::ToolOutput;
    use async_trait::async_trait;
    use serde_json::json;

    /// Sleeps `ms` milliseconds, panics on `"panic": true`, fails on `"fail": true`.
    struct Probe {
        running: AtomicUsize,
        peak: AtomicUsize,
        limit: usize,
    }

    impl Probe {
        fn new(limit: usize) -> Arc<Self> {
            Arc::new(Self {
                running: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                limit,
            })
        }
    }

    #[async_trait]
    impl Tool for Probe {
        fn name(&self) -> &str {
            "probe"
        }
        fn description(&self) -> &str {
            "test probe"
        }
        fn parameters(&self) -> Value {
            json!({"type": "object", "properties": {"ms": {"type": "integer", "minimum": 0}},
                   "required": ["ms"]})
        }
        fn timeout(&self) -> Duration {
            Duration::from_millis(400)
        }
        fn max_concurrency(&self) -> usize {
            self.limit
        }
        async fn call(&self, args: Value) -> crate::Result<ToolOutput> {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            let ms = args["ms"].as_u64().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            if args.get("panic") == Some(&json!(true)) {
                panic!("probe exploded");
            }
            if args.get("fail") == Some(&json!(true)) {
                return Err(crate::Error::Other("probe failed".into()));
            }
            Ok(ToolOutput::text(format!("slept {ms}")))
        }
    }

    fn call(args: Value) -> Result<ToolCall, CallError> {
        Ok(ToolCall {
            name: "probe".into(),
            arguments: args,
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_run_concurrently_and_come_back_in_order() {
        let probe = Probe::new(8);
        let exec = ToolExecutor::new([probe.clone() as Arc<dyn Tool>], Default::default());
        let start = Instant::now();
        let out = exec
            .run(vec![
                call(json!({"ms": 300})),
                call(json!({"ms": 100})),
                Err(CallError::MissingName),
                call(json!({"ms": 200})),
            ])
            .await;
        // Sequentially this would take 600 ms.
        assert!(
            start.elapsed() < Duration::from_millis(550),
            "ran concurrently"
        );
        assert_eq!(out[0].observation(100), "slept 300");
        assert_eq!(out[1].observation(100), "slept 100");
        assert_eq!(out[2].result, Err(CallError::MissingName));
        assert_eq!(out[3].observation(100), "slept 200");
        assert!(out[0].latency >= Duration::from_millis(300));
        assert_eq!(probe.peak.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn unknown_tools_and_bad_arguments_never_reach_the_tool() {
        let probe = Probe::new(1);
        let exec = ToolExecutor::new([probe.clone() as Arc<dyn Tool>], Default::default());
        let out = exec
            .run(vec![
                Ok(ToolCall {
                    name: "nope".into(),
                    arguments: json!({}),
                }),
                call(json!({"ms": "ten"})),
                call(json!({})),
            ])
            .await;
        assert_eq!(out[0].result, Err(CallError::UnknownTool("nope".into())));
        assert!(
            out[1].observation(200).contains("`ms`"),
            "{}",
            out[1].observation(200)
        );
        assert!(out[2]
            .observation(200)
            .contains("\"ms\" is a required property"));
        assert_eq!(exec.stats("probe").unwrap().ran, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrency_limit_and_load_shedding() {
        let probe = Probe::new(2);
        let exec = ToolExecutor::new(
            [probe.clone() as Arc<dyn Tool>],
            ExecutorConfig {
                queue_capacity: 2,
                queue_timeout: None,
            },
        );
        let calls = (0..6).map(|_| call(json!({"ms": 100}))).collect();
        let out = exec.run(calls).await;
        let shed = out
            .iter()
            .filter(|o| o.result == Err(CallError::Overloaded))
            .count();
        assert_eq!(shed, 2, "2 run, 2 wait, 2 are shed");
        assert_eq!(
            probe.peak.load(Ordering::SeqCst),
            2,
            "never more than the limit"
        );
        let stats = exec.stats("probe").unwrap();
        assert_eq!((stats.ran, stats.shed, stats.waiting), (4, 2, 0));
        assert_eq!(
            out[0].observation(200),
            "slept 100",
            "the first calls are admitted"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_too_long_is_shed() {
        let probe = Probe::new(1);
        let exec = ToolExecutor::new(
            [probe as Arc<dyn Tool>],
            ExecutorConfig {
                queue_capacity: 8,
                queue_timeout: Some(Duration::from_millis(50)),
            },
        );
        let out = exec
            .run(vec![call(json!({"ms": 200})), call(json!({"ms": 1}))])
            .await;
        assert!(out[0].result.is_ok());
        assert_eq!(out[1].result, Err(CallError::Overloaded));
    }

    #[tokio::test]
    async fn timeouts_panics_and_errors_become_observations() {
        let probe = Probe::new(4);
        let exec = ToolExecutor::new([probe.clone() as Arc<dyn Tool>], Default::default());
        let out = exec
            .run(vec![
                call(json!({"ms": 5_000})),
                call(json!({"ms": 1, "panic": true})),
                call(json!({"ms": 1, "fail": true})),
            ])
            .await;
        assert_eq!(
            out[0].result,
            Err(CallError::Timeout(Duration::from_millis(400)))
        );
        assert!(
            out[0].latency < Duration::from_secs(2),
            "aborted at the timeout"
        );
        assert_eq!(
            out[1].observation(200),
            "Error: the tool panicked: probe exploded"
        );
        assert_eq!(out[2].observation(200), "Error: probe failed");
        let stats = exec.stats("probe").unwrap();
        assert_eq!((stats.timed_out, stats.panicked), (1, 1));
        // The executor still works after a panic.
        let again = exec.run_one(call(json!({"ms": 1}))).await;
        assert_eq!(again.observation(100), "slept 1");
    }

    #[tokio::test]
    async fn free_functions_validate_and_run() {
        let probe: Arc<dyn Tool> = Probe::new(1);
        let bad = execute(probe.clone(), json!({"ms": -1})).await;
        assert!(matches!(bad.result, Err(CallError::InvalidArguments(_))));
        let good = execute(probe.clone(), json!({"ms": 0})).await;
        assert_eq!(good.name.as_deref(), Some("probe"));
        assert_eq!(good.observation(100), "slept 0");
        let tools = HashMap::from([("probe".to_string(), probe)]);
        let c = ToolCall {
            name: "other".into(),
            arguments: json!({}),
        };
        assert!(matches!(
            check_call(&tools, &c),
            Err(CallError::UnknownTool(_))
        ));
    }
}
