//! Runtime configs with every value written out, for this crate's tests, examples and
//! benches (the `testing` feature). The runtime configs have no defaults of their own: a
//! run resolves them from its TOML config (`agent_r1::config::TrainConfig`), and a test
//! starts from these and sets what it is about.

use std::time::Duration;

use crate::engine::EngineConfig;
use crate::learner::LearnerConfig;
use crate::model::SamplingParams;
use crate::runtime::EpisodeConfig;

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
