//! Guarding one tool call: the tool exists, the arguments fit its schema, the call runs on
//! its own task under the tool's timeout, and a panic or an error becomes an observation.
//!
//! This is the only place a call is guarded. Queueing, concurrency limits and load shedding
//! belong to whoever runs many calls: the actor runtime's tool pools
//! (`agent_r1_actors::runtime`) run every call through [`run_guarded`]; `agent-r1 tool call`
//! runs one through [`execute`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::call_key::CallKey;
use crate::schema::validate_arguments;
use crate::tool::{CallError, CallOutcome, Tool, ToolCall, ToolOutput};

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

/// Runs one call of `tool` on its own task with the tool's timeout. A tool error becomes
/// [`CallError::Failed`], a panic [`CallError::Panicked`], and a call past [`Tool::timeout`]
/// is aborted and becomes [`CallError::Timeout`]. Does not validate arguments (see
/// [`execute`]).
pub async fn run_guarded(tool: Arc<dyn Tool>, arguments: Value) -> Result<ToolOutput, CallError> {
    run_guarded_holding(tool, None, arguments, ()).await
}

/// [`run_guarded`], with `held` kept by the call's own task until that task ends: past the
/// timeout when the tool's code does not yield (a tool that blocks its thread cannot be
/// aborted), so a stall detector's record of the call outlives the answer to the caller.
///
/// The call's task runs on the tool runtime ([`tool_runtime`]), not the caller's: a tool
/// that blocks its thread pins a tool-runtime thread, the caller's timeout still fires, and
/// the caller's runtime goes on. Such a call is counted in `agent_r1_tool_calls_overdue`
/// until its code returns.
///
/// With a `key`, the tool runs [`Tool::call_keyed`] with it.
pub async fn run_guarded_holding<H: Send + 'static>(
    tool: Arc<dyn Tool>,
    key: Option<CallKey>,
    arguments: Value,
    held: H,
) -> Result<ToolOutput, CallError> {
    let limit = tool.timeout();
    let state = Arc::new(AtomicU8::new(RUNNING));
    let ended = EndOfCall(state.clone());
    let mut task = tool_runtime().spawn(async move {
        let _held = held;
        let _ended = ended;
        match key {
            Some(key) => tool.call_keyed(&key, arguments).await,
            None => tool.call(arguments).await,
        }
    });
    match tokio::time::timeout(limit, &mut task).await {
        Err(_) => {
            task.abort();
            // Overdue until the task ends: at once for a tool that yields (the abort drops
            // it at its next await), when its code returns for one that blocks.
            if state
                .compare_exchange(RUNNING, OVERDUE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                metrics::gauge!(crate::metric_names::TOOL_CALLS_OVERDUE.name).increment(1.0);
            }
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
            Err(CallError::Panicked(message))
        }
        Ok(Err(join)) => Err(CallError::Failed(format!("the tool was cancelled: {join}"))),
    }
}

const RUNNING: u8 = 0;
const OVERDUE: u8 = 1;
const ENDED: u8 = 2;

/// Dropped with the call's task (finished, or dropped after an abort).
struct EndOfCall(Arc<AtomicU8>);

impl Drop for EndOfCall {
    fn drop(&mut self) {
        if self.0.swap(ENDED, Ordering::AcqRel) == OVERDUE {
            metrics::gauge!(crate::metric_names::TOOL_CALLS_OVERDUE.name).decrement(1.0);
        }
    }
}

/// The runtime every guarded tool call runs on: its own threads (named `agent-r1-tool`,
/// twice the cores and at least 8), so that tools that block their thread take threads
/// from here and never from the actor runtime that waits on them. It lives as long as the
/// process.
pub fn tool_runtime() -> &'static tokio::runtime::Handle {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads((2 * cores).max(8))
                .thread_name("agent-r1-tool")
                .enable_all()
                .build()
                .expect("the tool runtime starts (threads and an I/O driver)")
        })
        .handle()
}

/// Validates and runs one call of `tool` (no queue, no concurrency limit).
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

/// Resolves a parsed call among `tools`, validates and runs it: a call that did not parse,
/// names no tool here, or fails its schema is answered without reaching a tool.
pub async fn execute_call(
    tools: &HashMap<String, Arc<dyn Tool>>,
    call: Result<ToolCall, CallError>,
) -> CallOutcome {
    let failed = |name: Option<String>, e: CallError| CallOutcome {
        name,
        result: Err(e),
        latency: Duration::ZERO,
    };
    let call = match call {
        Ok(call) => call,
        Err(e) => return failed(None, e),
    };
    match check_call(tools, &call) {
        Ok(tool) => execute(tool.clone(), call.arguments).await,
        Err(e) => failed(Some(call.name), e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use serde_json::json;

    /// Panics on `"panic": true`, fails on `"fail": true`, never answers on `"hang": true`;
    /// times out after `timeout`.
    struct Probe {
        timeout: Duration,
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
            json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}},
                   "required": ["n"]})
        }
        fn timeout(&self) -> Duration {
            self.timeout
        }
        async fn call(&self, args: Value) -> crate::Result<ToolOutput> {
            if args.get("panic") == Some(&json!(true)) {
                panic!("probe exploded");
            }
            if args.get("fail") == Some(&json!(true)) {
                return Err(crate::Error::Other("probe failed".into()));
            }
            if args.get("hang") == Some(&json!(true)) {
                std::future::pending::<()>().await;
            }
            if args.get("block") == Some(&json!(true)) {
                // Blocks its thread (no await) until the test opens the gate.
                let (lock, opened) = &*GATE;
                let open = lock.lock().unwrap();
                let _open = opened
                    .wait_timeout_while(open, Duration::from_secs(120), |o| !*o)
                    .unwrap();
            }
            Ok(ToolOutput::text(format!("n = {}", args["n"])))
        }
    }

    static GATE: std::sync::LazyLock<(std::sync::Mutex<bool>, std::sync::Condvar)> =
        std::sync::LazyLock::new(Default::default);

    /// A probe that times out after 200 ms, for calls that are meant to time out.
    fn tools() -> HashMap<String, Arc<dyn Tool>> {
        probe(Duration::from_millis(200))
    }

    /// A probe with time to spare, for calls that are meant to end by themselves: a panic
    /// with RUST_BACKTRACE set takes a while to capture its backtrace, and the call's timeout
    /// runs on another thread meanwhile.
    fn patient_tools() -> HashMap<String, Arc<dyn Tool>> {
        probe(Duration::from_secs(120))
    }

    fn probe(timeout: Duration) -> HashMap<String, Arc<dyn Tool>> {
        HashMap::from([(
            "probe".to_string(),
            Arc::new(Probe { timeout }) as Arc<dyn Tool>,
        )])
    }

    fn call(args: Value) -> Result<ToolCall, CallError> {
        Ok(ToolCall {
            name: "probe".into(),
            arguments: args,
        })
    }

    #[tokio::test]
    async fn unknown_tools_and_bad_arguments_never_reach_the_tool() {
        let tools = tools();
        let unknown = ToolCall {
            name: "nope".into(),
            arguments: json!({}),
        };
        let out = execute_call(&tools, Ok(unknown)).await;
        assert_eq!(out.result, Err(CallError::UnknownTool("nope".into())));
        let out = execute_call(&tools, call(json!({"n": "ten", "panic": true}))).await;
        assert!(
            out.observation(200).contains("`n`"),
            "{}",
            out.observation(200)
        );
        let out = execute_call(&tools, call(json!({"panic": true}))).await;
        assert!(out
            .observation(200)
            .contains("\"n\" is a required property"));
        let out = execute_call(&tools, Err(CallError::MissingName)).await;
        assert_eq!((out.name, out.result), (None, Err(CallError::MissingName)));
    }

    #[tokio::test]
    async fn timeouts_panics_and_errors_become_observations() {
        let tools = tools();
        let hung = execute_call(&tools, call(json!({"n": 1, "hang": true}))).await;
        assert_eq!(
            hung.result,
            Err(CallError::Timeout(Duration::from_millis(200)))
        );
        let tools = patient_tools();
        let panicked = execute_call(&tools, call(json!({"n": 1, "panic": true}))).await;
        assert_eq!(
            panicked.result,
            Err(CallError::Panicked("probe exploded".into()))
        );
        assert_eq!(
            panicked.observation(200),
            "Error: the tool panicked: probe exploded"
        );
        let failed = execute_call(&tools, call(json!({"n": 1, "fail": true}))).await;
        assert_eq!(failed.observation(200), "Error: probe failed");
        // The same tool still answers after a panic.
        let again = execute(tools["probe"].clone(), json!({"n": 2})).await;
        assert_eq!(again.name.as_deref(), Some("probe"));
        assert_eq!(again.observation(100), "n = 2");
    }

    /// One runtime thread, as `#[tokio::test]` has: a tool that blocks the thread it is
    /// polled on would hold the caller's only thread, and its timeout could never fire.
    #[tokio::test(flavor = "current_thread")]
    async fn a_tool_that_blocks_its_thread_is_timed_out_and_the_caller_goes_on() {
        let tools = tools();
        let blocked = execute_call(&tools, call(json!({"n": 1, "block": true}))).await;
        assert_eq!(
            blocked.result,
            Err(CallError::Timeout(Duration::from_millis(200)))
        );
        // The caller's runtime is free: another call is answered while the first still
        // blocks a tool-runtime thread.
        let next = execute_call(&patient_tools(), call(json!({"n": 3}))).await;
        assert_eq!(next.observation(100), "n = 3");
        let (lock, opened) = &*GATE;
        *lock.lock().unwrap() = true;
        opened.notify_all();
    }
}
