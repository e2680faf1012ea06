//! The continuous-batching engine against plain generation: the same tokens whether a
//! sequence runs alone or joins a batch mid-flight, whether its prefix KV was reused, parked
//! and evicted, or recomputed.

use agent_r1_actors::testing;
use std::path::Path;

use agent_r1_actors::device::memory;
use agent_r1_actors::engine::{EngineConfig, EngineHandle, TurnRequest};
use agent_r1_actors::memory_plan::ShareRequest;
use agent_r1_actors::model::generate::FinishReason;
use agent_r1_actors::model::{ModelConfig, Placement, PolicyModel, SamplingParams};
use tch::{Device, Kind};

#[path = "support/tiny_engine.rs"]
mod tiny_engine;

use tiny_engine::{make_model, runtime, tiny_config};

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_new_tokens: n,
        ..Default::default()
    }
}

fn start(dir: &Path, config: EngineConfig) -> testing::TestEngine {
    let dir = dir.to_path_buf();
    testing::start_engine(
        move || PolicyModel::load(&dir, Placement::default(), false),
        None,
        config,
    )
    .unwrap()
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (seed * 31 + i * 17) % 96).collect()
}

#[test]
fn batched_turns_equal_standalone_generation() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let reference = PolicyModel::load(tmp.path(), Placement::default(), false).unwrap();
    let began = std::time::Instant::now();
    let engine = start(
        tmp.path(),
        EngineConfig {
            max_batch_rows: 5,
            max_context: 256,
            ..testing::engine_config()
        },
    );
    let prompts: Vec<Vec<u32>> = (0..12)
        .map(|i| prompt(i, 3 + (i as usize * 7) % 40))
        .collect();
    let lens: Vec<usize> = (0..12).map(|i| 5 + (i * 13) % 30).collect();
    let rt = runtime();
    let outputs = rt.block_on(async {
        // All twelve are queued before the first step, so the schedule does not depend on
        // the machine's speed: five fill the batch, the other seven join it as rows free up.
        engine.pause_after(0).unwrap();
        let mut tasks = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let engine = engine.clone();
            let req = TurnRequest {
                episode: i as u64,
                context: p.clone(),
                params: greedy(lens[i]),
                stop_strings: vec![],
            };
            tasks.push(tokio::spawn(async move { engine.generate(req).await }));
        }
        wait_for(&engine, "all turns queued", |s| {
            s.paused && s.queued_turns == 12
        })
        .await;
        engine.resume().unwrap();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap().unwrap());
        }
        out
    });
    for (i, out) in outputs.iter().enumerate() {
        let alone = reference
            .generate(std::slice::from_ref(&prompts[i]), &greedy(lens[i]))
            .unwrap();
        assert_eq!(out.token_ids, alone[0].token_ids, "sequence {i}");
        for (a, b) in out.logprobs.iter().zip(&alone[0].logprobs) {
            assert!((a - b).abs() < 1e-4, "sequence {i}: logprob {a} vs {b}");
        }
        assert_eq!(out.finish_reason, FinishReason::Length);
        assert_eq!(out.prefill_tokens, prompts[i].len());
    }
    let stats = rt.block_on(engine.stats()).unwrap();
    let elapsed = began.elapsed().as_secs_f64();
    assert!(stats.mean_batch_size() > 2.0, "batching: {stats:?}");
    assert!(stats.mean_batch_size() <= 5.0);
    // The engine's time splits into parts that each ran and together fit in the wall time
    // (the bench's overhead breakdown relies on it).
    assert!(
        stats.forward_seconds > 0.0 && stats.finish_seconds > 0.0,
        "{stats:?}"
    );
    assert!(
        stats.admit_seconds > 0.0 && stats.idle_seconds > 0.0,
        "{stats:?}"
    );
    let parts = stats.forward_seconds
        + stats.admit_seconds
        + stats.finish_seconds
        + stats.idle_seconds
        + stats.stop_check_seconds;
    assert!(
        parts <= elapsed,
        "{parts} s of parts in {elapsed} s: {stats:?}"
    );
}

/// With a fixed seed, what an episode samples is a function of the episode alone: the same
/// tokens whether it runs by itself or among many others joining and leaving the batch.
#[test]
fn sampled_turns_do_not_depend_on_batch_composition() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let config = EngineConfig {
        max_batch_rows: 6,
        max_context: 256,
        seed: 42,
        ..testing::engine_config()
    };
    let sampled = |n: usize| SamplingParams {
        temperature: 1.0,
        max_new_tokens: n,
        ..Default::default()
    };
    let request = |i: u32| TurnRequest {
        episode: 1000 + i as u64,
        context: prompt(i, 4 + i as usize % 9),
        params: sampled(12 + i as usize % 7),
        stop_strings: vec![],
    };
    let rt = runtime();
    let alone_engine = start(tmp.path(), config.clone());
    let alone: Vec<Vec<u32>> = rt.block_on(async {
        let mut out = Vec::new();
        for i in [3u32, 7] {
            out.push(alone_engine.generate(request(i)).await.unwrap().token_ids);
        }
        out
    });
    let crowd_engine = start(tmp.path(), config);
    let crowd = rt.block_on(async {
        let tasks: Vec<_> = (0..16u32)
            .map(|i| {
                let engine = crowd_engine.clone();
                let req = request(i);
                tokio::spawn(async move {
                    tokio::time::sleep(std::time::Duration::from_millis(2 * (i % 5) as u64)).await;
                    engine.generate(req).await.unwrap().token_ids
                })
            })
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    assert_eq!(crowd[3], alone[0]);
    assert_eq!(crowd[7], alone[1]);
    // Different episodes draw differently.
    let distinct: std::collections::HashSet<_> = crowd.iter().collect();
    assert!(distinct.len() > 12, "{distinct:?}");
}

/// Episodes whose prompts open alike (system message, tool list) reuse the first prompt's KV
/// for the common prefix, and generate exactly what they would from scratch.
#[test]
fn new_episodes_reuse_the_shared_prompt_prefix() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let reference = PolicyModel::load(tmp.path(), Placement::default(), false).unwrap();
    let engine = start(
        tmp.path(),
        EngineConfig {
            max_batch_rows: 4,
            max_context: 256,
            ..testing::engine_config()
        },
    );
    let system = prompt(3, 40);
    let with_question = |q: u32| {
        let mut p = system.clone();
        p.extend(prompt(q, 6));
        p
    };
    let rt = runtime();
    rt.block_on(async {
        for (episode, q) in [(10u64, 1u32), (11, 2), (12, 5)] {
            let context = with_question(q);
            let out = engine
                .generate(TurnRequest {
                    episode,
                    context: context.clone(),
                    params: greedy(16),
                    stop_strings: vec![],
                })
                .await
                .unwrap();
            let alone = reference
                .generate(std::slice::from_ref(&context), &greedy(16))
                .unwrap();
            assert_eq!(out.token_ids, alone[0].token_ids, "episode {episode}");
            if episode == 10 {
                assert_eq!(out.reused_tokens, 0);
            } else {
                // At least the 40 shared tokens (more if the questions happen to agree).
                assert!(out.reused_tokens >= 40, "{out:?}");
                assert_eq!(out.prefill_tokens, context.len() - out.reused_tokens);
            }
        }
        let stats = engine.stats().await.unwrap();
        assert!(stats.shared_prefix_tokens >= 80, "{stats:?}");
    });
}

#[test]
fn next_turn_reuses_kv_and_matches_recompute_and_eviction() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let rt = runtime();
    let run_two_turns = |config: EngineConfig| {
        let engine = start(tmp.path(), config);
        rt.block_on(async {
            let first = prompt(3, 20);
            let t1 = engine
                .generate(TurnRequest {
                    episode: 7,
                    context: first.clone(),
                    params: greedy(10),
                    stop_strings: vec![],
                })
                .await
                .unwrap();
            // Another episode runs in between (it must not disturb episode 7's parked KV).
            engine
                .generate(TurnRequest {
                    episode: 8,
                    context: prompt(5, 30),
                    params: greedy(10),
                    stop_strings: vec![],
                })
                .await
                .unwrap();
            let mut second = first.clone();
            second.extend(&t1.token_ids);
            second.extend(prompt(9, 12)); // the "tool observation"
            let t2 = engine
                .generate(TurnRequest {
                    episode: 7,
                    context: second.clone(),
                    params: greedy(10),
                    stop_strings: vec![],
                })
                .await
                .unwrap();
            let stats = engine.stats().await.unwrap();
            (t1, t2, second, stats)
        })
    };
    let (t1, t2, second, stats) = run_two_turns(EngineConfig {
        max_context: 128,
        ..testing::engine_config()
    });
    // Reused: the first context and every generated token but the last (never fed).
    assert_eq!(t2.reused_tokens, 20 + t1.token_ids.len() - 1);
    assert_eq!(t2.prefill_tokens, second.len() - t2.reused_tokens);
    assert_eq!(stats.evictions, 0);

    // Same turns with a parked budget too small for anything: evicted, recomputed, same tokens.
    let (e1, e2, _, estats) = run_two_turns(EngineConfig {
        max_context: 128,
        parked_kv_bytes: 1024,
        ..testing::engine_config()
    });
    // Only the shared prompt prefix (episode 7's first prompt, the first one seen) survives.
    assert_eq!(e2.reused_tokens, 20);
    assert_eq!(estats.shared_prefix_tokens, 20);
    assert_eq!(e2.prefill_tokens, second.len() - 20);
    assert!(estats.evictions >= 2, "{estats:?}");
    assert_eq!(e1.token_ids, t1.token_ids);
    assert_eq!(e2.token_ids, t2.token_ids, "reuse and recompute must agree");
    for (a, b) in e2.logprobs.iter().zip(&t2.logprobs) {
        assert!((a - b).abs() < 1e-4);
    }

    // Reuse off (the benchmark's baseline): every turn prefills its whole context, nothing
    // is parked or shared, and the tokens are the same.
    let (n1, n2, _, nstats) = run_two_turns(EngineConfig {
        max_context: 128,
        kv_reuse: false,
        ..testing::engine_config()
    });
    assert_eq!((n1.reused_tokens, n2.reused_tokens), (0, 0));
    assert_eq!(n2.prefill_tokens, second.len());
    assert_eq!(nstats.reused_tokens, 0);
    assert_eq!(nstats.parked_episodes, 0);
    assert_eq!(nstats.prefill_tokens, (20 + 30 + second.len()) as u64);
    assert_eq!(n2.token_ids, t2.token_ids, "reuse and no reuse must agree");
}

/// Four turns each of three interleaved episodes: parked in place (the default pool), parked
/// into new ranges with evictions (a pool of 80 token slots, not prefaulted), and not parked
/// at all (reuse off) must sample the same tokens.
#[test]
fn turns_parked_in_place_or_evicted_sample_what_recompute_samples() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let rt = runtime();
    let run = |config: EngineConfig| {
        let engine = start(tmp.path(), config);
        rt.block_on(async {
            let mut contexts: Vec<Vec<u32>> =
                (0..3).map(|e| prompt(e + 1, 20 + e as usize)).collect();
            let mut outputs = Vec::new();
            for turn in 0..4 {
                for (e, context) in contexts.iter_mut().enumerate() {
                    let out = engine
                        .generate(TurnRequest {
                            episode: e as u64,
                            context: context.clone(),
                            params: greedy(10),
                            stop_strings: vec![],
                        })
                        .await
                        .unwrap();
                    context.extend(&out.token_ids);
                    context.extend(prompt(40 + turn * 3 + e as u32, 12));
                    outputs.push(out);
                }
            }
            (outputs, engine.stats().await.unwrap())
        })
    };
    let (pooled, stats) = run(EngineConfig {
        max_context: 256,
        ..testing::engine_config()
    });
    // Every later turn of every episode fits its first park's spare slots.
    assert_eq!(stats.parked_in_place, 9, "{stats:?}");
    assert_eq!(stats.evictions, 0);
    for out in &pooled[3..] {
        assert_eq!(out.prefill_tokens, 12 + 1, "{out:?}");
    }
    // One token slot of the test model: 2 layers x (keys, values) x 2 heads x 8 dims x 4 B.
    let (small, small_stats) = run(EngineConfig {
        max_context: 256,
        parked_kv_bytes: 80 * 256,
        prefault_parked_kv: false,
        ..testing::engine_config()
    });
    assert!(small_stats.evictions >= 3, "{small_stats:?}");
    assert!(small_stats.parked_bytes <= 80 * 256);
    let (recomputed, _) = run(EngineConfig {
        max_context: 256,
        kv_reuse: false,
        ..testing::engine_config()
    });
    for ((a, b), c) in pooled.iter().zip(&small).zip(&recomputed) {
        assert_eq!(a.token_ids, c.token_ids, "parked in place vs recomputed");
        assert_eq!(b.token_ids, c.token_ids, "evicted vs recomputed");
        for (x, y) in a.logprobs.iter().zip(&c.logprobs) {
            assert!((x - y).abs() < 1e-4);
        }
    }
}

#[test]
fn stops_bad_requests_and_weight_updates() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let reference = PolicyModel::load(tmp.path(), Placement::default(), false).unwrap();
    let engine = start(
        tmp.path(),
        EngineConfig {
            max_context: 64,
            ..testing::engine_config()
        },
    );
    let rt = runtime();
    let p = prompt(1, 10);
    let alone = reference
        .generate(std::slice::from_ref(&p), &greedy(20))
        .unwrap()
        .remove(0);
    let stop = alone.token_ids[4];
    let first_stop = alone.token_ids.iter().position(|&t| t == stop).unwrap();
    rt.block_on(async {
        let out = engine
            .generate(TurnRequest {
                episode: 1,
                context: p.clone(),
                params: SamplingParams {
                    stop_token_ids: vec![stop],
                    ..greedy(20)
                },
                stop_strings: vec![],
            })
            .await
            .unwrap();
        assert_eq!(out.finish_reason, FinishReason::Stop);
        assert_eq!(out.token_ids, alone.token_ids[..=first_stop].to_vec());

        // Bad requests get an error; the engine keeps serving.
        for (ctx, needle) in [
            (vec![], "no tokens"),
            (vec![500], "vocabulary"),
            (vec![1; 80], "max_context"),
        ] {
            let e = engine
                .generate(TurnRequest {
                    episode: 2,
                    context: ctx,
                    params: greedy(3),
                    stop_strings: vec![],
                })
                .await
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{e}");
        }
        // Context capacity ends a turn without error.
        let full = engine
            .generate(TurnRequest {
                episode: 3,
                context: prompt(2, 60),
                params: greedy(20),
                stop_strings: vec![],
            })
            .await
            .unwrap();
        assert_eq!(full.finish_reason, FinishReason::ContextFull);
        assert_eq!(full.token_ids.len(), 4);

        // A weight update bumps the version and changes what is generated.
        let zeros: Vec<(String, tch::Tensor)> = reference
            .var_store()
            .variables()
            .into_iter()
            .filter(|(n, _)| n.contains("mlp.down_proj"))
            .map(|(n, t)| (n, t.zeros_like()))
            .collect();
        engine.update_weights(5, zeros).await.unwrap();
        let after = engine
            .generate(TurnRequest {
                episode: 1,
                context: p.clone(),
                params: greedy(20),
                stop_strings: vec![],
            })
            .await
            .unwrap();
        assert_eq!(after.policy_version, 5);
        assert_ne!(after.token_ids, alone.token_ids);
        assert_eq!(after.reused_tokens, 0, "old-policy KV is dropped on update");
        let bad = engine
            .update_weights(
                6,
                vec![("nope".into(), tch::Tensor::zeros([1], tch::kind::FLOAT_CPU))],
            )
            .await
            .unwrap_err();
        assert!(bad.to_string().contains("nope"));
    });
}

#[test]
fn a_sliding_window_shorter_than_the_served_context_is_refused_at_start() {
    let config = ModelConfig::from_json(&serde_json::json!({
        "model_type": "mistral", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "sliding_window": 256
    }))
    .unwrap();
    let start = |max_context: usize| {
        let config = config.clone();
        testing::start_engine(
            move || PolicyModel::new(config.clone(), Placement::default(), false),
            None,
            EngineConfig {
                max_context,
                parked_kv_bytes: 1 << 20,
                ..testing::engine_config()
            },
        )
    };
    let e = match start(512) {
        Ok(_) => panic!("a 512-token context past a 256-token window must be refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("`sliding_window` = 256") && e.contains("512") && !e.contains('\n'),
        "{e}"
    );
    // Within the window, attention is exact and the engine runs.
    assert!(start(256).is_ok());
}

/// Polls the engine's counters until `done` holds (each poll is answered between decode
/// steps), failing after a minute.
async fn wait_for(
    engine: &EngineHandle,
    what: &str,
    done: impl Fn(&agent_r1_actors::engine::EngineStats) -> bool,
) -> agent_r1_actors::engine::EngineStats {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let stats = engine.stats().await.unwrap();
        if done(&stats) {
            return stats;
        }
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::task::yield_now().await;
    }
}

/// A turn whose caller stopped waiting (its deadline passed, its episode was dropped) is not
/// decoded for nobody: queued, it is never admitted; running, it leaves the batch at the
/// next step and its row goes to the next turn.
#[test]
fn turns_whose_caller_stopped_waiting_are_dropped_queued_or_running() {
    // As long as a turn can be (4 + 2040 < max_context 2048).
    const LONG: usize = 2040;
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let engine = start(
        tmp.path(),
        EngineConfig {
            max_batch_rows: 1,
            ..testing::engine_config()
        },
    );
    let turn = |episode: u64, n: usize| TurnRequest {
        episode,
        context: prompt(episode as u32, 4),
        params: greedy(n),
        stop_strings: vec![],
    };
    runtime().block_on(async {
        // A holds the engine's one row; B queues behind it, then its caller goes away.
        // The engine is paused while B's caller goes away, so B is never admitted whatever
        // the machine's speed.
        let a = tokio::spawn({
            let engine = engine.clone();
            async move { engine.generate(turn(1, LONG)).await }
        });
        wait_for(&engine, "A decodes", |s| s.tokens_generated > 0).await;
        engine.pause_after(0).unwrap();
        let b = tokio::spawn({
            let engine = engine.clone();
            async move { engine.generate(turn(2, LONG)).await }
        });
        wait_for(&engine, "B queued", |s| s.paused && s.queued_turns == 1).await;
        b.abort();
        assert!(b.await.unwrap_err().is_cancelled());
        engine.resume().unwrap();
        let a = a.await.unwrap().unwrap();
        assert_eq!(a.token_ids.len(), LONG);
        let stats = wait_for(&engine, "B dropped", |s| s.abandoned_turns == 1).await;
        assert_eq!(
            (stats.turns, stats.tokens_generated),
            (1, LONG as u64),
            "B was never decoded"
        );

        // C runs alone, the engine pauses three steps in, and C's caller goes away: C
        // leaves the batch at the next step, without another token.
        engine.pause_after(3).unwrap();
        let c = tokio::spawn({
            let engine = engine.clone();
            async move { engine.generate(turn(3, LONG)).await }
        });
        let paused = wait_for(&engine, "C part-decoded", |s| s.paused).await;
        let decoded = paused.tokens_generated - LONG as u64;
        assert!((1..LONG as u64).contains(&decoded), "{paused:?}");
        c.abort();
        let _ = c.await;
        engine.resume().unwrap();
        let stats = wait_for(&engine, "C dropped", |s| s.abandoned_turns == 2).await;
        assert_eq!(stats.turns, 1, "C was not answered");
        assert_eq!(
            stats.tokens_generated, paused.tokens_generated,
            "C decoded after its caller went away"
        );
        // Its row is free: D decodes exactly its own tokens.
        let d = engine.generate(turn(4, 8)).await.unwrap();
        assert_eq!(d.token_ids.len(), 8);
        let after = engine.stats().await.unwrap();
        assert_eq!(after.tokens_generated, stats.tokens_generated + 8);
        // A deadline covers admission, queueing and decoding together.
        let late = engine
            .generate_within(turn(5, LONG), std::time::Duration::ZERO)
            .await
            .unwrap_err();
        assert!(late.to_string().contains("timed out"), "{late}");
    });
    engine.shutdown();
}

/// A forward pass brings its results to the host in one copy: the tokens and
/// log-probabilities of the whole batch together, whatever mix of sampling settings the
/// rows have; nothing else is read back per step.
/// Sends every request at once and waits for all the outputs, in request order.
fn all_at_once(
    rt: &tokio::runtime::Runtime,
    engine: &EngineHandle,
    requests: impl Iterator<Item = TurnRequest>,
) -> Vec<agent_r1_actors::engine::TurnOutput> {
    rt.block_on(async {
        let turns: Vec<_> = requests
            .map(|request| {
                let engine = engine.clone();
                tokio::spawn(async move { engine.generate(request).await.unwrap() })
            })
            .collect();
        let mut outputs = Vec::with_capacity(turns.len());
        for t in turns {
            outputs.push(t.await.unwrap());
        }
        outputs
    })
}

#[test]
fn every_forward_pass_copies_to_the_host_once() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let engine = start(
        tmp.path(),
        EngineConfig {
            max_batch_rows: 8,
            max_context: 256,
            ..testing::engine_config()
        },
    );
    let settings = |i: u32| SamplingParams {
        temperature: [0.0, 0.7, 1.0, 1.3][i as usize % 4],
        top_k: [0, 5, 0, 2][i as usize % 4],
        top_p: [1.0, 1.0, 0.9, 0.5][i as usize % 4],
        max_new_tokens: 6 + i as usize % 5,
        ..Default::default()
    };
    let rt = runtime();
    all_at_once(
        &rt,
        &engine,
        (0..12u32).map(|i| TurnRequest {
            episode: i as u64,
            context: prompt(i, 5 + i as usize),
            params: settings(i),
            stop_strings: vec![],
        }),
    );
    let stats = rt.block_on(engine.stats()).unwrap();
    assert!(
        stats.decode_steps > 0 && stats.prefill_passes > 0,
        "{stats:?}"
    );
    assert_eq!(
        stats.device_to_host_copies,
        stats.decode_steps + stats.prefill_passes,
        "{stats:?}"
    );
}

#[test]
fn prefill_passes_hold_at_most_max_prefill_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let cap = 120;
    let engine = start(
        tmp.path(),
        EngineConfig {
            max_batch_rows: 8,
            max_context: 256,
            max_prefill_tokens: cap,
            kv_reuse: false,
            ..testing::engine_config()
        },
    );
    let rt = runtime();
    let outputs = all_at_once(
        &rt,
        &engine,
        (0..8u32).map(|i| TurnRequest {
            episode: i as u64,
            context: prompt(i, 50),
            params: greedy(3),
            stop_strings: vec![],
        }),
    );
    let stats = rt.block_on(engine.stats()).unwrap();
    assert_eq!(stats.prefill_tokens, 8 * 50, "{stats:?}");
    // 50-token prompts: at most 2 rows (100 tokens) fit one pass, so 8 prompts take at least
    // 4 passes however they arrived, and no pass ran more than the cap.
    assert!(stats.prefill_passes >= 4, "{stats:?}");
    assert!(
        stats.prefill_tokens + stats.prefill_padding_tokens <= stats.prefill_passes * cap as u64,
        "{stats:?}"
    );
    // Split passes sample what a turn samples alone.
    let alone = start(tmp.path(), testing::engine_config());
    for (i, out) in outputs.iter().enumerate() {
        let single = rt
            .block_on(alone.generate(TurnRequest {
                episode: i as u64,
                context: prompt(i as u32, 50),
                params: greedy(3),
                stop_strings: vec![],
            }))
            .unwrap();
        assert_eq!(out.token_ids, single.token_ids, "turn {i}");
    }
}

// `memory_fraction`: the engine sizes its running batch and its parked-KV pool from its
// device's memory once its weights are loaded, and refuses to start when not one row fits.
// On the CPU, whose total memory the test reads the same way the engine does, so the fraction
// is chosen to leave room for exactly the rows the test expects.

fn share_config(fraction: f64) -> EngineConfig {
    EngineConfig {
        max_batch_rows: 8,
        max_batch_tokens: 8 * 128,
        max_context: 128,
        memory_fraction: Some(fraction),
        ..testing::engine_config()
    }
}

fn weights_bytes(dir: &Path) -> u64 {
    PolicyModel::load(dir, Placement::default(), false)
        .unwrap()
        .weights_bytes()
}

#[test]
fn a_memory_fraction_decides_the_rows_and_the_pool() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let model = tiny_config();
    let cfg = share_config(1.0);
    let request = ShareRequest {
        fraction: 1.0,
        model: &model,
        kind: Kind::Float,
        weights_bytes: weights_bytes(tmp.path()),
        max_context: cfg.max_context as u64,
        wanted_rows: cfg.max_batch_rows as u64,
        max_batch_tokens: cfg.max_batch_tokens as u64,
        max_prefill_tokens: cfg.max_prefill_tokens as u64,
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
    let engine = start(tmp.path(), share_config(fraction));
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
fn a_memory_fraction_too_small_for_one_row_fails_the_start_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    make_model(tmp.path());
    let dir = tmp.path().to_path_buf();
    let err = testing::start_engine(
        move || PolicyModel::load(&dir, Placement::default(), false),
        None,
        share_config(1e-9),
    )
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
