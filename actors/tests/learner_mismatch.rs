//! A sampler made to differ from the trainer on purpose: the engine samples with a perturbed
//! copy of the learner's weights (under the same version), so every token carries a known
//! sampler/trainer gap. The learner's mismatch metrics must report that gap, as an
//! independent forward pass of both models measures it, and with rollout correction on its
//! loss must be the corrected one (importance weights and rejection from that gap, around
//! the learner's own log-probabilities).

mod learner_common;

use agent_r1_actors::testing;
use std::path::Path;

use agent_r1_actors::algo::{RejectLevel, RolloutCorrection, WeightLevel};
use agent_r1_actors::engine::{EngineConfig, EngineHandle, TurnRequest};
use agent_r1_actors::learner::{AlgorithmConfig, Estimator, KlConfig, LearnerConfig, UpdateStats};
use agent_r1_actors::model::{Placement, PolicyModel, SamplingParams};
use agent_r1_actors::trajectory::Trajectory;
use learner_common::{runtime, save_policy, start_learner, trajectory, TestStep, INIT};
use tch::{Kind, Tensor};

/// Groups of this many trajectories, one turn each.
const GROUP: usize = 4;
const GROUPS: u32 = 2;
const NEW_TOKENS: usize = 12;

fn engine(dir: &Path) -> testing::TestEngine {
    let dir = dir.to_path_buf();
    testing::start_engine(
        move || PolicyModel::load(&dir, Placement::default(), false),
        None,
        EngineConfig {
            max_batch_rows: 16,
            max_context: 64,
            seed: 5,
            ..testing::engine_config()
        },
    )
    .unwrap()
}

/// The policy in `from` with Gaussian noise of standard deviation `sigma` added to every
/// weight, written to `to`.
fn perturbed_copy(from: &Path, to: &Path, sigma: f64) {
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    tch::manual_seed(77);
    let model = PolicyModel::load(from, Placement::default(), false).unwrap();
    tch::no_grad(|| {
        for (_, mut t) in model.var_store().variables() {
            let noise = t.randn_like() * sigma;
            let _ = t.g_add_(&noise);
        }
    });
    model.save(to, None).unwrap();
}

/// One turn per episode from the engine; rewards alternate 1, 0 within each group.
async fn rollout(engine: &EngineHandle) -> Vec<Trajectory> {
    let mut out = Vec::new();
    for g in 0..GROUPS {
        for i in 0..GROUP as u64 {
            let id = u64::from(g) * 100 + i;
            let prompt = vec![1, 2, 4 + g];
            let turn = engine
                .generate(TurnRequest {
                    episode: id,
                    context: prompt.clone(),
                    params: SamplingParams {
                        temperature: 1.0,
                        max_new_tokens: NEW_TOKENS,
                        ..Default::default()
                    },
                    stop_strings: vec![],
                })
                .await
                .unwrap();
            engine.release(id);
            out.push(trajectory(
                id,
                u64::from(g),
                &prompt,
                vec![TestStep {
                    actions: turn.token_ids,
                    logprobs: turn.logprobs,
                    observation: vec![],
                    version: turn.policy_version,
                }],
                if i % 2 == 0 { 1.0 } else { 0.0 },
            ));
        }
    }
    out
}

/// Per action token of each trajectory: the log-probability `model` gives it, from one plain
/// forward pass over the whole sequence (no cache, no chunking).
fn logprobs(model: &PolicyModel, t: &Trajectory) -> Vec<f64> {
    let step = &t.steps[0];
    let mut ids: Vec<i64> = t.prompt_ids.iter().map(|&i| i64::from(i)).collect();
    ids.extend(step.action_ids.iter().map(|&i| i64::from(i)));
    let n = ids.len() as i64;
    let input = Tensor::from_slice(&ids).unsqueeze(0);
    let logp = tch::no_grad(|| {
        let h = model.forward(
            &input,
            &Tensor::ones([1, n], (Kind::Bool, tch::Device::Cpu)),
            None,
        );
        model
            .logits(&h)
            .to_kind(Kind::Double)
            .log_softmax(-1, Kind::Double)
    });
    let first = t.prompt_ids.len() as i64;
    step.action_ids
        .iter()
        .enumerate()
        .map(|(j, &tok)| logp.double_value(&[0, first + j as i64 - 1, i64::from(tok)]))
        .collect()
}

fn config(correction: RolloutCorrection) -> LearnerConfig {
    LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: Estimator::Grpo,
            grpo_norm_by_std: false,
            kl: KlConfig::OFF,
            critic_warmup_updates: 0,
            rollout_correction: correction,
            ..Default::default()
        },
        ..testing::learner_config()
    }
}

async fn update(dir: &Path, batch: Vec<Trajectory>, correction: RolloutCorrection) -> UpdateStats {
    let l = start_learner(dir, config(correction), false, false).await;
    let stats = l.update(batch).await.unwrap();
    l.shutdown();
    stats
}

#[test]
fn an_injected_sampler_gap_is_measured_and_corrected() {
    let policy_dir = tempfile::tempdir().unwrap();
    let sampler_dir = tempfile::tempdir().unwrap();
    save_policy(policy_dir.path(), 1);
    perturbed_copy(policy_dir.path(), sampler_dir.path(), 0.08);
    let rt = runtime();

    // The injected gap, measured independently: both models' log-probabilities of the
    // sampled tokens from plain forward passes.
    let sampler_engine = engine(sampler_dir.path());
    let batch = rt.block_on(rollout(&sampler_engine));
    sampler_engine.shutdown();
    let (trainer, sampler) = {
        let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
        let policy = PolicyModel::load(policy_dir.path(), Placement::default(), false).unwrap();
        let perturbed = PolicyModel::load(sampler_dir.path(), Placement::default(), false).unwrap();
        let trainer: Vec<Vec<f64>> = batch.iter().map(|t| logprobs(&policy, t)).collect();
        let sampler: Vec<Vec<f64>> = batch.iter().map(|t| logprobs(&perturbed, t)).collect();
        (trainer, sampler)
    };
    // The engine's sampling log-probabilities are the perturbed model's.
    for (t, s) in batch.iter().zip(&sampler) {
        for (&e, &r) in t.steps[0].logprobs.iter().zip(s) {
            assert!(
                (f64::from(e) - r).abs() < 1e-4,
                "engine {e} vs perturbed model {r}"
            );
        }
    }
    let deltas: Vec<Vec<f64>> = trainer
        .iter()
        .zip(&sampler)
        .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x - y).collect())
        .collect();
    let all: Vec<f64> = deltas.iter().flatten().copied().collect();
    let n = all.len() as f64;
    let abs_mean = all.iter().map(|d| d.abs()).sum::<f64>() / n;
    let abs_max = all.iter().fold(0.0f64, |m, d| m.max(d.abs()));
    let kl_k3 = all.iter().map(|d| d.exp() - 1.0 - d).sum::<f64>() / n;
    let worst_sequence = deltas
        .iter()
        .map(|d| d.iter().sum::<f64>().abs())
        .fold(0.0f64, f64::max);
    eprintln!(
        "injected gap over {n} tokens: mean |Δ| {abs_mean:.4}, max |Δ| {abs_max:.4}, k3 KL \
         {kl_k3:.5}, worst sequence |ΣΔ| {worst_sequence:.4}"
    );
    assert!(
        abs_mean > 0.05,
        "the perturbation must leave a gap to measure: {abs_mean}"
    );

    // Measured without correction: the metrics report the injected gap.
    let plain = rt.block_on(update(
        policy_dir.path(),
        batch.clone(),
        RolloutCorrection::default(),
    ));
    let m = plain
        .mismatch
        .expect("every token is fresh, so all are measured");
    assert_eq!(m.tokens, n as u64);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-4 * b.abs().max(1.0);
    assert!(close(m.abs_mean, abs_mean), "{} vs {abs_mean}", m.abs_mean);
    assert!(close(m.abs_max, abs_max), "{} vs {abs_max}", m.abs_max);
    assert!(close(m.kl_k3, kl_k3), "{} vs {kl_k3}", m.kl_k3);
    assert!(
        close(m.sequence_abs_max, worst_sequence),
        "{} vs {worst_sequence}",
        m.sequence_abs_max
    );
    assert_eq!(plain.correction_weight_mean, None);
    assert_eq!(plain.rejected_tokens, 0);

    // Corrected: token TIS capped at 1.5 and token rejection outside [0.8, 1.25]. At the
    // first step the policy is the learner's own, so each kept token's ratio is 1 and the
    // loss is -Σ keep·w·A / Σ keep with Dr.GRPO's A = reward - group mean (±0.5).
    let correction = RolloutCorrection {
        weight: WeightLevel::Token,
        weight_cap: 1.5,
        reject: RejectLevel::Token,
        reject_lower: 0.8,
        reject_upper: 1.25,
        ..Default::default()
    };
    let corrected = rt.block_on(update(policy_dir.path(), batch.clone(), correction));
    let (mut numer, mut kept, mut weights) = (0.0, 0.0, 0.0);
    for (t, d) in batch.iter().zip(&deltas) {
        let a = t.reward - 0.5;
        for &x in d {
            let rho = x.exp();
            if (0.8..=1.25).contains(&rho) {
                let w = rho.min(1.5);
                numer += -w * a;
                weights += w;
                kept += 1.0;
            }
        }
    }
    let expected_loss = numer / kept;
    eprintln!(
        "corrected: policy loss {} (reference {expected_loss}), rejected {} of {n}, mean \
         weight {:?}; uncorrected loss {}",
        corrected.policy_loss,
        corrected.rejected_tokens,
        corrected.correction_weight_mean,
        plain.policy_loss
    );
    assert!(
        kept > 0.0 && kept < n,
        "the bounds must keep some tokens and reject some"
    );
    assert_eq!(corrected.rejected_tokens, (n - kept) as u64);
    assert_eq!(corrected.action_tokens, kept as u64);
    assert!(
        close(corrected.policy_loss, expected_loss),
        "corrected loss {} vs reference {expected_loss}",
        corrected.policy_loss
    );
    assert!(close(
        corrected.correction_weight_mean.unwrap(),
        weights / kept
    ));
    assert!(
        !close(plain.policy_loss, expected_loss),
        "the uncorrected loss must differ, or the check proves nothing"
    );

    // With the sampler's weights equal to the learner's the gap is float noise.
    let same_engine = engine(policy_dir.path());
    let same_batch = rt.block_on(rollout(&same_engine));
    same_engine.shutdown();
    let same = rt.block_on(update(
        policy_dir.path(),
        same_batch,
        RolloutCorrection::default(),
    ));
    let m = same.mismatch.unwrap();
    eprintln!(
        "no injected gap: mean |Δ| {:e}, max {:e}",
        m.abs_mean, m.abs_max
    );
    assert!(m.abs_max < 1e-4, "{m:?}");
}
