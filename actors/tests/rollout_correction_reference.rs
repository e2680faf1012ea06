//! The mismatch estimators and rollout corrections (`algo::mismatch_stats`,
//! `algo::correction`, and the corrected PPO loss the learner builds from them) against an
//! independent reference written from the published formulas in plain PyTorch
//! (`tests/py/rollout_correction_reference.py`), on random batches: every output within
//! 1e-6. The reference also computes each of its mutants (one term changed), and every
//! mutant must differ from agent-r1's outputs by more than that on these batches, so a
//! mistake in any one term would be caught.

use std::path::Path;
use std::process::Command;

use agent_r1_actors::algo::{
    correction, mismatch_stats, weighted_ppo_policy_loss, LossAgg, PpoClip, RejectLevel,
    RolloutCorrection, WeightLevel,
};
use serde_json::{json, Value};
use tch::{Kind, Tensor};

#[path = "support/venv.rs"]
mod venv;

const TOLERANCE: f64 = 1e-6;

/// Within the tolerance (false for NaN).
fn agrees(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOLERANCE
}

fn flat(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).unwrap()
}

fn rows(t: &Tensor) -> Vec<Vec<f64>> {
    let cols = t.size()[1] as usize;
    flat(t).chunks(cols).map(<[f64]>::to_vec).collect()
}

fn level_name<T: serde::Serialize>(level: T) -> Value {
    serde_json::to_value(level).unwrap()
}

/// One random batch under one configuration, with agent-r1's outputs.
fn case(seed: i64, scale: f64, config: RolloutCorrection, clip: PpoClip) -> Value {
    tch::manual_seed(seed);
    let (b, t) = (6, 12);
    let opts = (Kind::Double, tch::Device::Cpu);
    let sampler = Tensor::randn([b, t], opts) * 0.5 - 2.0;
    let trainer = &sampler + Tensor::randn([b, t], opts) * scale;
    // Ragged rows: row i has 12 - i tokens; the rest is padding holding garbage that must
    // not reach any result.
    let col = Tensor::arange(t, opts).unsqueeze(0);
    let len = (Tensor::arange(b, opts) * -1.0 + t as f64).unsqueeze(1);
    let mask = col.lt_tensor(&len).to_kind(Kind::Double);
    let on = mask.ne(0);
    let trainer = trainer.where_self(&on, &(trainer.ones_like() * 7.0));
    let log_prob = &trainer + Tensor::randn([b, t], opts) * 0.3;
    let advantages = Tensor::randn([b, t], opts);

    let stats = mismatch_stats(&trainer, &sampler, &mask, config.report_threshold).unwrap();
    let c = correction(&trainer, &sampler, &mask, &config).unwrap();
    let leaf = log_prob.set_requires_grad(true);
    let loss = weighted_ppo_policy_loss(
        &leaf,
        &trainer,
        &c.weight,
        &advantages,
        &(&mask * &c.keep),
        &clip,
        LossAgg::TokenMean,
    )
    .unwrap();
    loss.loss.backward();
    let scalar = |t: &Tensor| t.double_value(&[]);
    json!({
        "trainer": rows(&trainer),
        "sampler": rows(&sampler),
        "mask": rows(&mask),
        "log_prob": rows(&log_prob),
        "advantages": rows(&advantages),
        "config": {
            "weight": level_name(config.weight),
            "weight_cap": config.weight_cap,
            "reject": level_name(config.reject),
            "reject_lower": config.reject_lower,
            "reject_upper": config.reject_upper,
            "report_threshold": config.report_threshold,
            "clip_ratio_low": clip.clip_ratio_low,
            "clip_ratio_high": clip.clip_ratio_high,
            "clip_ratio_c": clip.clip_ratio_c,
        },
        "ours": {
            "stats": {
                "tokens": scalar(&stats.tokens),
                "abs_mean": scalar(&stats.abs_mean),
                "abs_max": scalar(&stats.abs_max),
                "kl_k3": scalar(&stats.kl_k3),
                "over_threshold": scalar(&stats.over_threshold),
                "sequence_abs_max": scalar(&stats.sequence_abs_max),
            },
            "weight": flat(&c.weight),
            "keep": flat(&c.keep),
            "loss": scalar(&loss.loss),
            "grad": flat(&leaf.grad()),
        },
    })
}

/// Every number of `ours` and `theirs` as (name, ours, theirs).
fn pairs(ours: &Value, theirs: &Value) -> Vec<(String, f64, f64)> {
    let mut out = Vec::new();
    for key in [
        "tokens",
        "abs_mean",
        "abs_max",
        "kl_k3",
        "over_threshold",
        "sequence_abs_max",
    ] {
        out.push((
            key.to_string(),
            ours["stats"][key].as_f64().unwrap(),
            theirs["stats"][key].as_f64().unwrap(),
        ));
    }
    out.push((
        "loss".into(),
        ours["loss"].as_f64().unwrap(),
        theirs["loss"].as_f64().unwrap(),
    ));
    for key in ["weight", "keep", "grad"] {
        let (a, b) = (
            ours[key].as_array().unwrap(),
            theirs[key].as_array().unwrap(),
        );
        assert_eq!(a.len(), b.len(), "{key}");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            out.push((
                format!("{key}[{i}]"),
                x.as_f64().unwrap(),
                y.as_f64().unwrap(),
            ));
        }
    }
    out
}

#[test]
fn estimators_and_corrections_equal_the_published_formulas_and_every_term_matters() {
    let clip = PpoClip::default();
    let tight = PpoClip {
        clip_ratio_low: 0.1,
        clip_ratio_high: 0.28,
        clip_ratio_c: 2.0,
    };
    let mut cases = Vec::new();
    let mut seed = 0;
    // Small gaps (a bf16 engine), moderate, and large (a stale or broken sampler).
    for scale in [0.05, 0.4, 1.2] {
        for weight in [WeightLevel::Token, WeightLevel::Sequence] {
            for reject in [
                RejectLevel::Off,
                RejectLevel::Token,
                RejectLevel::Sequence,
                RejectLevel::Geometric,
            ] {
                seed += 1;
                let config = RolloutCorrection {
                    weight,
                    reject,
                    weight_cap: if seed % 2 == 0 { 2.0 } else { 1.5 },
                    reject_lower: if seed % 3 == 0 { 0.5 } else { 0.8 },
                    reject_upper: if seed % 3 == 0 { 2.0 } else { 1.25 },
                    report_threshold: 0.1,
                };
                let clip = if seed % 2 == 0 { clip } else { tight };
                cases.push(case(seed, scale, config, clip));
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cases.json");
    std::fs::write(&input, serde_json::to_vec(&cases).unwrap()).unwrap();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/rollout_correction_reference.py");
    let out = Command::new(venv::python_required(&[]))
        .arg(&script)
        .arg(&input)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();

    let reference = result["reference"].as_array().unwrap();
    assert_eq!(reference.len(), cases.len());
    let mut rejected = 0.0;
    let mut capped = 0;
    for (k, (case, theirs)) in cases.iter().zip(reference).enumerate() {
        for (name, a, b) in pairs(&case["ours"], theirs) {
            assert!(
                agrees(a, b),
                "case {k} ({}): {name}: agent-r1 {a} vs reference {b}",
                case["config"]
            );
        }
        let keep = case["ours"]["keep"].as_array().unwrap();
        rejected += keep.iter().filter(|v| v.as_f64() == Some(0.0)).count() as f64;
        let cap = case["config"]["weight_cap"].as_f64().unwrap();
        capped += case["ours"]["weight"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| (v.as_f64().unwrap() - cap).abs() < 1e-12)
            .count();
    }
    // The batches exercise the rules: some tokens rejected, some weights at their cap.
    assert!(
        rejected > 0.0 && capped > 0,
        "rejected {rejected}, capped {capped}"
    );

    let mutants = result["mutants"].as_object().unwrap();
    assert!(mutants.len() >= 15, "{:?}", mutants.keys());
    for (name, outputs) in mutants {
        let caught = cases
            .iter()
            .zip(outputs.as_array().unwrap())
            .flat_map(|(case, theirs)| pairs(&case["ours"], theirs))
            .any(|(_, a, b)| !agrees(a, b));
        assert!(
            caught,
            "the mutant `{name}` is not told apart on these batches"
        );
    }
}
