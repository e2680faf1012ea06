//! Runtime configs with every value written out, for this crate's tests, examples and
//! benches (the `testing` feature). The runtime configs have no defaults of their own: a
//! run resolves them from its TOML config (`agent_r1::config::TrainConfig`), and a test
//! starts from these and sets what it is about. And an engine started as a run starts one,
//! from code without an async runtime of its own.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::engine::{start_supervised, EngineConfig, EngineHandle, EngineRestartPolicy};
use crate::learner::LearnerConfig;
use crate::model::PolicyModel;
use crate::model::SamplingParams;
use crate::runtime::EpisodeConfig;
use crate::tokenizer::HfTokenizer;

/// Starts an engine through the door a run uses (`start_supervised`: the engine actor, which
/// replaces a crashed thread; the default restart policy, no fault plan), its actor on a
/// runtime the calling process shares. Returns once the model is loaded, or with the
/// loading error; callable from plain (non-async) code. The engine is shut down when the
/// returned [`TestEngine`] is dropped.
pub fn start_engine(
    load: impl Fn() -> crate::Result<PolicyModel> + Send + Sync + 'static,
    tokenizer: Option<Arc<HfTokenizer>>,
    config: EngineConfig,
) -> crate::Result<TestEngine> {
    static ACTORS: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let runtime = ACTORS.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("agent-r1-test-actors")
            .enable_all()
            .build()
            .expect("a tokio runtime for the engine actors")
    });
    let (started, outcome) = std::sync::mpsc::channel();
    runtime.spawn(async move {
        let result = start_supervised(
            Arc::new(load),
            tokenizer,
            config,
            EngineRestartPolicy::default(),
            None,
        )
        .await;
        let _ = started.send(result.map(|(handle, _actor)| TestEngine(handle)));
    });
    outcome.recv().unwrap_or_else(|_| {
        Err(crate::Error::EngineStopped(
            "the engine actor ended while starting".into(),
        ))
    })
}

/// An engine a test started: its handle (through `Deref`), and the engine shut down when this
/// is dropped. A supervised engine otherwise lives until it is told to stop, as a run's
/// engines live until the run ends, and a test process starts many.
#[derive(Debug)]
pub struct TestEngine(EngineHandle);

impl std::ops::Deref for TestEngine {
    type Target = EngineHandle;

    fn deref(&self) -> &EngineHandle {
        &self.0
    }
}

impl Drop for TestEngine {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

impl From<&TestEngine> for crate::engine_set::EngineSet {
    fn from(engine: &TestEngine) -> Self {
        Self::from(&engine.0)
    }
}

/// An engine of 64 rows over a 2,048-token context, with KV reuse, a 2 GiB parked-KV pool
/// and seed 0.
pub fn engine_config() -> EngineConfig {
    EngineConfig {
        max_batch_rows: 64,
        max_batch_tokens: 64 * 2048,
        max_context: 2048,
        parked_kv_bytes: 2 << 30,
        max_pending: 8192,
        request_timeout: Duration::from_secs(1800),
        seed: 0,
        kv_reuse: true,
        prefault_parked_kv: true,
        metrics_label: "0".into(),
        memory_fraction: None,
        max_prefill_tokens: 16_384,
        cuda_graphs: true,
    }
}

/// Episodes of at most 10 turns in 2,048 tokens, one tool call a turn, sampling at
/// temperature 1, the `[rollout]` section's waits.
pub fn episode_config() -> EpisodeConfig {
    EpisodeConfig {
        max_turns: 10,
        max_context: 2048,
        max_prompt: None,
        sampling: SamplingParams::default(),
        stop_strings: vec![],
        generate_timeout: Duration::from_secs(1800),
        tool_queue_timeout: Duration::from_secs(60),
        env_timeout: Duration::from_secs(60),
        max_tool_calls_per_turn: 1,
        workflow_timeout: Duration::from_secs(3600),
    }
}

/// The `[algorithm]` and `[learner]` sections' defaults, temperature 1, 4,096 tokens a
/// trajectory, synchronous (no staleness bound), seed 0.
pub fn learner_config() -> LearnerConfig {
    crate::learner::config::fixture()
}

#[cfg(test)]
mod tests {
    use std::marker::PhantomData;

    use crate::engine::EngineConfig;
    use crate::learner::{AlgorithmConfig, LearnerConfig};
    use crate::runtime::EpisodeConfig;

    struct Probe<T>(PhantomData<T>);

    /// Picked by method resolution when `T: Default` (it takes the receiver as given).
    trait ViaDefault {
        fn has_default(&self) -> bool {
            true
        }
    }
    impl<T: Default> ViaDefault for &Probe<T> {}

    /// Picked only when `ViaDefault` does not apply (it needs one dereference more).
    trait WithoutDefault {
        fn has_default(&self) -> bool {
            false
        }
    }
    impl<T> WithoutDefault for Probe<T> {}

    macro_rules! has_default {
        ($t:ty) => {
            (&&Probe::<$t>(PhantomData)).has_default()
        };
    }

    #[test]
    fn runtime_configs_have_no_default_while_config_sections_do() {
        assert!(!has_default!(EngineConfig));
        assert!(!has_default!(EpisodeConfig));
        assert!(!has_default!(LearnerConfig));
        // The probe sees a `Default` where there is one: a config section's defaults are
        // its TOML defaults.
        assert!(has_default!(AlgorithmConfig));
    }
}
