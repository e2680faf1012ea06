//! Several engines in one process keep their own `agent_r1_engine_*` series: each carries
//! its `engine` label, so one engine's gauges do not overwrite another's.

use agent_r1_actors::testing;
use std::collections::BTreeSet;
use std::path::Path;

use agent_r1_actors::engine::{EngineConfig, TurnRequest};
use agent_r1_actors::model::{ModelConfig, Placement, PolicyModel, SamplingParams};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

fn make_model(dir: &Path) {
    let config = ModelConfig::from_json(&serde_json::json!({
        "model_type": "qwen2", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rope_theta": 10000.0, "tie_word_embeddings": true
    }))
    .unwrap();
    PolicyModel::new(config, Placement::default(), false)
        .unwrap()
        .save(dir, None)
        .unwrap();
}

fn start(dir: &Path, label: &str) -> testing::TestEngine {
    let dir = dir.to_path_buf();
    let config = EngineConfig {
        max_batch_rows: 2,
        max_context: 64,
        parked_kv_bytes: 1 << 20,
        metrics_label: label.into(),
        ..testing::engine_config()
    };
    testing::start_engine(
        move || PolicyModel::load(&dir, Placement::default(), false),
        None,
        config,
    )
    .unwrap()
}

#[test]
fn each_engine_reports_under_its_own_label() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("no other recorder in this test binary");
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let engines = [start(tmp.path(), "0"), start(tmp.path(), "1")];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (i, engine) in engines.iter().enumerate() {
        let out = rt
            .block_on(engine.generate(TurnRequest {
                episode: i as u64,
                context: vec![1, 2, 3],
                params: SamplingParams {
                    temperature: 0.0,
                    max_new_tokens: 3 + i,
                    ..Default::default()
                },
                stop_strings: vec![],
            }))
            .unwrap();
        assert!(!out.token_ids.is_empty());
    }
    // Every engine's stats answer after the turns it ran, so their metrics are recorded.
    for engine in &engines {
        rt.block_on(engine.stats()).unwrap();
    }
    let snapshot = snapshotter.snapshot().into_vec();
    let labelled = |name: &str| -> BTreeSet<(String, u64)> {
        snapshot
            .iter()
            .filter(|(k, ..)| k.key().name() == name)
            .map(|(k, _, _, v)| {
                let engine = k
                    .key()
                    .labels()
                    .find(|l| l.key() == "engine")
                    .map(|l| l.value().to_string())
                    .unwrap_or_default();
                let value = match v {
                    DebugValue::Counter(c) => *c,
                    DebugValue::Gauge(g) => g.into_inner() as u64,
                    DebugValue::Histogram(h) => h.len() as u64,
                };
                (engine, value)
            })
            .collect()
    };
    let generated = labelled("agent_r1_engine_tokens_generated_total");
    let engines_seen: BTreeSet<&str> = generated.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(engines_seen, BTreeSet::from(["0", "1"]), "{generated:?}");
    let running: BTreeSet<String> = labelled("agent_r1_engine_running_sequences")
        .into_iter()
        .map(|(e, _)| e)
        .collect();
    assert_eq!(running, BTreeSet::from(["0".to_string(), "1".to_string()]));
    for engine in &engines {
        engine.shutdown();
    }
}
