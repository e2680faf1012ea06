//! `memory_fraction`: the engine sizes its running batch and its parked-KV pool from its
//! device's memory once its weights are loaded, and refuses to start when not one row fits.
//! On the CPU, whose total memory the test reads the same way the engine does, so the
//! fraction is chosen to leave room for exactly the rows the test expects.

use std::path::Path;
use std::sync::Arc;

use agent_r1_actors::device::memory;
use agent_r1_actors::engine::TurnRequest;
use agent_r1_actors::engine::{start_supervised, EngineConfig, EngineRestartPolicy, LoadModel};
use agent_r1_actors::memory_plan::ShareRequest;
use agent_r1_actors::model::{Placement, PolicyModel, SamplingParams};
use tch::{Device, Kind};

#[path = "support/tiny_engine.rs"]
mod tiny_engine;

use tiny_engine::{make_model, runtime, tiny_config};

fn loader(dir: &Path) -> LoadModel {
    let dir = dir.to_path_buf();
    Arc::new(move || PolicyModel::load(&dir, Placement::default(), false))
}

fn config(fraction: f64) -> EngineConfig {
    EngineConfig {
        max_batch_rows: 8,
        max_batch_tokens: 8 * 128,
        max_context: 128,
        memory_fraction: Some(fraction),
        ..Default::default()
    }
}

fn weights_bytes(dir: &Path) -> u64 {
    PolicyModel::load(dir, Placement::default(), false)
        .unwrap()
        .weights_bytes()
}

#[test]
fn the_fraction_decides_the_rows_and_the_pool() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let model = tiny_config();
    let cfg = config(1.0);
    let request = ShareRequest {
        fraction: 1.0,
        model: &model,
        kind: Kind::Float,
        weights_bytes: weights_bytes(tmp.path()),
        max_context: cfg.max_context as u64,
        wanted_rows: cfg.max_batch_rows as u64,
        max_batch_tokens: cfg.max_batch_tokens as u64,
    };
    // Room for 3 rows and 64 KiB more, of the 8 asked for.
    let needs = |rows| request.slot_bytes(rows) + request.activation_bytes(rows);
    let share = request.weights_bytes + needs(3) + (64 << 10);
    assert!(
        needs(4) > needs(3) + (64 << 10),
        "the spare must not fit a 4th row"
    );
    let total = memory::now(Device::Cpu).unwrap().total;
    // Rounded up to the next representable share, so the engine's share is not below it.
    let fraction = (share as f64 + 1.0) / total as f64;

    let rt = runtime();
    let (engine, _actor) = rt
        .block_on(start_supervised(
            loader(tmp.path()),
            None,
            config(fraction),
            EngineRestartPolicy::default(),
        ))
        .unwrap();
    let stats = rt.block_on(engine.stats()).unwrap();
    let plan = stats.memory_plan.expect("a plan");
    assert_eq!(plan.rows, 3, "{plan}");
    // The slots the engine allocated are the ones planned, and the pool is what is left.
    assert_eq!(stats.slot_bytes, plan.slot_bytes, "{plan}");
    let spare = plan.share_bytes - plan.weights_bytes - needs(3);
    assert_eq!(plan.parked_bytes, spare, "{plan}");
    assert!((64 << 10..(64 << 10) + 4096).contains(&spare), "{plan}");

    // 8 turns at once: all finish, never more than 3 decoded together.
    let turns: Vec<_> = (0..8u64)
        .map(|e| {
            let engine = engine.clone();
            rt.spawn(async move {
                engine
                    .generate(TurnRequest {
                        episode: e,
                        context: vec![1 + e as u32, 2, 3],
                        params: SamplingParams {
                            temperature: 0.0,
                            max_new_tokens: 12,
                            ..Default::default()
                        },
                        stop_strings: Vec::new(),
                    })
                    .await
            })
        })
        .collect();
    for t in turns {
        let out = rt.block_on(t).unwrap().unwrap();
        assert!(!out.token_ids.is_empty());
    }
    let stats = rt.block_on(engine.stats()).unwrap();
    assert_eq!(stats.turns, 8);
    assert!(
        stats.decode_rows <= 3 * stats.decode_steps,
        "{} rows over {} steps",
        stats.decode_rows,
        stats.decode_steps
    );
}

#[test]
fn too_little_for_one_row_fails_the_start_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let rt = runtime();
    let err = rt
        .block_on(start_supervised(
            loader(tmp.path()),
            None,
            config(1e-9),
            EngineRestartPolicy::default(),
        ))
        .unwrap_err()
        .to_string();
    assert!(!err.contains('\n'), "{err}");
    assert!(
        err.contains("memory_fraction = 0.000000001")
            && err.contains("less than one row of 128 tokens")
            && err.contains("raise memory_fraction or lower max_context_length"),
        "{err}"
    );
}
