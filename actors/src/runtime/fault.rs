//! Fault injection for tools (a test double, used by `agent-r1 bench rollout
//! --tool-fault-rate` and the runtime's tests): wraps a real tool and makes a fraction of its
//! calls panic, hang past the timeout, or return an error, so that restarts, timeouts and
//! error observations are exercised under load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use agent_r1_envs::tool::{Tool, ToolOutput};

/// Counts of injected faults.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Calls made.
    pub calls: AtomicU64,
    /// Panics injected.
    pub panics: AtomicU64,
    /// Hangs injected.
    pub hangs: AtomicU64,
    /// Errors injected.
    pub errors: AtomicU64,
}

/// A tool that misbehaves on a seeded fraction of calls.
pub struct FaultyTool {
    inner: Arc<dyn Tool>,
    rate: f64,
    latency: Duration,
    seed: u64,
    counts: Arc<FaultCounts>,
}

impl FaultyTool {
    /// Wraps `inner`: each call sleeps `latency`, then with probability `rate` panics, hangs
    /// past the timeout, or fails (one third each).
    pub fn new(inner: Arc<dyn Tool>, rate: f64, latency: Duration, seed: u64) -> Self {
        Self {
            inner,
            rate: rate.clamp(0.0, 1.0),
            latency,
            seed,
            counts: Arc::new(FaultCounts::default()),
        }
    }

    /// The fault counters (shared with the tool).
    pub fn counts(&self) -> Arc<FaultCounts> {
        self.counts.clone()
    }
}

fn mix(mut x: u64) -> u64 {
    // splitmix64: a seeded, reproducible stream without a shared RNG lock.
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[async_trait]
impl Tool for FaultyTool {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn description(&self) -> &str {
        self.inner.description()
    }
    fn parameters(&self) -> Value {
        self.inner.parameters()
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn max_concurrency(&self) -> usize {
        self.inner.max_concurrency()
    }

    async fn call(&self, arguments: Value) -> agent_r1_envs::Result<ToolOutput> {
        self.inject().await?;
        self.inner.call(arguments).await
    }

    /// The key goes on to the wrapped tool.
    async fn call_keyed(
        &self,
        key: &agent_r1_envs::call_key::CallKey,
        arguments: Value,
    ) -> agent_r1_envs::Result<ToolOutput> {
        self.inject().await?;
        self.inner.call_keyed(key, arguments).await
    }
}

impl FaultyTool {
    /// The call's injected latency and fault, if its draw falls under the rate.
    async fn inject(&self) -> agent_r1_envs::Result<()> {
        let n = self.counts.calls.fetch_add(1, Ordering::Relaxed);
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        let draw = mix(self.seed ^ n);
        let u = (draw >> 11) as f64 / (1u64 << 53) as f64;
        if u < self.rate {
            match draw % 3 {
                0 => {
                    self.counts.panics.fetch_add(1, Ordering::Relaxed);
                    // Unwinds without the panic hook: no backtrace is captured (slow with
                    // RUST_BACKTRACE set, and it would race the call's timeout) or printed.
                    std::panic::resume_unwind(Box::new(
                        "injected tool panic (fault injection)".to_string(),
                    ));
                }
                1 => {
                    self.counts.hangs.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(self.inner.timeout() * 3 + Duration::from_secs(1)).await;
                }
                _ => {
                    self.counts.errors.fetch_add(1, Ordering::Relaxed);
                    return Err(agent_r1_envs::Error::Tool {
                        tool: self.inner.name().to_string(),
                        message: "injected error (fault injection)".into(),
                    });
                }
            }
        }
        Ok(())
    }
}
