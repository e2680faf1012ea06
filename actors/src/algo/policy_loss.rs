//! PPO's clipped surrogate with dual clip (verl's `compute_policy_loss_vanilla`), and its
//! decoupled, importance-corrected form for stale tokens (AReaL).

use tch::Tensor;

use super::agg::{agg_loss_unchecked, LossAgg};
use super::{check, masked};
use crate::Result;

/// The log-ratio is clamped to this magnitude before `exp`, as verl: one token whose
/// probability collapsed must not turn the loss into inf.
const MAX_LOG_RATIO: f64 = 20.0;

/// Clip settings of the PPO policy loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PpoClip {
    /// The ratio is clipped below at `1 - clip_ratio_low` (verl `clip_ratio_low`, default 0.2).
    pub clip_ratio_low: f64,
    /// The ratio is clipped above at `1 + clip_ratio_high` (0.2; DAPO's "clip higher" raises
    /// it to 0.28 to keep exploration tokens alive).
    pub clip_ratio_high: f64,
    /// Dual clip: for negative advantages the loss is capped at `-A * clip_ratio_c`, so a token
    /// whose ratio exploded cannot dominate the batch (3.0; must be > 1).
    pub clip_ratio_c: f64,
}

impl Default for PpoClip {
    fn default() -> Self {
        PpoClip {
            clip_ratio_low: 0.2,
            clip_ratio_high: 0.2,
            clip_ratio_c: 3.0,
        }
    }
}

/// The policy loss and the statistics verl logs with it.
#[derive(Debug)]
pub struct PolicyLoss {
    /// Scalar loss attached to `log_prob`'s graph (`pg_loss`).
    pub loss: Tensor,
    /// Scalar, detached: fraction of action tokens where the PPO clip was binding
    /// (`pg_clipfrac`).
    pub clip_frac: Tensor,
    /// Scalar, detached: masked mean of `old_log_prob - log_prob`, the k1 estimate of
    /// KL(old || new) (`ppo_kl`), after the ±20 clamp.
    pub approx_kl: Tensor,
    /// Scalar, detached: fraction of action tokens where the dual clip was binding
    /// (`pg_clipfrac_lower`).
    pub clip_frac_lower: Tensor,
    /// Decoupled PPO only: scalar, detached, the mean importance weight `π_prox / π_behavior`
    /// over action tokens (capped tokens count as 0).
    pub behavior_weight: Option<Tensor>,
    /// Decoupled PPO only: scalar, detached, masked mean of `behavior_log_prob -
    /// prox_log_prob`, the k1 estimate of KL(behavior || prox): how far off-policy the tokens
    /// are (0 when fresh).
    pub behavior_kl: Option<Tensor>,
}

/// PPO clipped surrogate loss over `[B, T]` log-probabilities.
///
/// `log_prob` (current policy, with grad), `old_log_prob` (the policy that sampled),
/// `advantages` and `mask` are `[B, T]`. Per token, with `r = exp(clamp(log_prob -
/// old_log_prob, ±20))`:
/// `l = max(-A r, -A clip(r, 1 - low, 1 + high))`, and for `A < 0` additionally
/// `l = min(l, -A c)` (dual clip); then aggregated with `agg`. Gradients flow to `log_prob`
/// only (`old_log_prob` and `advantages` are detached).
pub fn ppo_policy_loss(
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    clip: &PpoClip,
    agg: LossAgg,
) -> Result<PolicyLoss> {
    check_inputs(log_prob, old_log_prob, advantages, mask, clip)?;
    surrogate(log_prob, old_log_prob, advantages, mask, clip, agg, None)
}

/// Decoupled PPO (AReaL, "Boosting ... with Decoupled PPO"): the trust region is taken around
/// the proximal policy (the learner's weights when the update began), not around the stale
/// policy that sampled, and each token is importance-weighted by `w = π_prox / π_behavior`
/// (detached). Per token, with `r = exp(log_prob - prox_log_prob)`, the loss is
/// `w · l(r)` with `l` the dual-clipped surrogate of [`ppo_policy_loss`]; a token whose
/// weight exceeds `weight_cap` gets weight 0 (it is too far off-policy to correct), and still
/// counts in the aggregation's denominator. With fresh tokens `w = 1` and this is
/// [`ppo_policy_loss`] around the proximal policy.
#[allow(clippy::too_many_arguments)]
pub fn decoupled_ppo_policy_loss(
    log_prob: &Tensor,
    prox_log_prob: &Tensor,
    behavior_log_prob: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    clip: &PpoClip,
    weight_cap: f64,
    agg: LossAgg,
) -> Result<PolicyLoss> {
    check_inputs(log_prob, prox_log_prob, advantages, mask, clip)?;
    check::floating("behavior_log_prob", behavior_log_prob)?;
    check::same_shape("behavior_log_prob", behavior_log_prob, "log_prob", log_prob)?;
    check::param(
        "behavior_weight_cap",
        weight_cap,
        weight_cap >= 1.0,
        ">= 1 (fresh tokens have weight 1)",
    )?;
    let (weight, behavior_kl) = tch::no_grad(|| {
        let weight = decoupled_weight(prox_log_prob, behavior_log_prob, weight_cap);
        let kind = log_prob.kind();
        let log_w = (prox_log_prob.to_kind(kind) - behavior_log_prob.to_kind(kind))
            .clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO);
        let behavior_kl = masked::masked_mean_unchecked(&(-log_w), mask).detach();
        (weight, behavior_kl)
    });
    let mut loss = surrogate(
        log_prob,
        prox_log_prob,
        advantages,
        mask,
        clip,
        agg,
        Some(&weight),
    )?;
    loss.behavior_kl = Some(behavior_kl);
    Ok(loss)
}

/// Decoupled PPO's per-token weight `π_prox / π_behavior` (detached, in `prox_log_prob`'s
/// kind), 0 where it exceeds `weight_cap`.
pub fn decoupled_weight(
    prox_log_prob: &Tensor,
    behavior_log_prob: &Tensor,
    weight_cap: f64,
) -> Tensor {
    tch::no_grad(|| {
        let kind = prox_log_prob.kind();
        let log_w =
            (prox_log_prob - behavior_log_prob.to_kind(kind)).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO);
        let w = log_w.exp();
        let kept = w.le(weight_cap).to_kind(kind);
        (w * kept).detach()
    })
}

/// The PPO surrogate of [`ppo_policy_loss`] around `anchor_log_prob`, each token's loss
/// scaled by `weight` (`[B, T]`, detached: decoupled PPO's staleness weight times a
/// rollout correction's, say). `behavior_weight` reports the weight's masked mean.
#[allow(clippy::too_many_arguments)]
pub fn weighted_ppo_policy_loss(
    log_prob: &Tensor,
    anchor_log_prob: &Tensor,
    weight: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    clip: &PpoClip,
    agg: LossAgg,
) -> Result<PolicyLoss> {
    check_inputs(log_prob, anchor_log_prob, advantages, mask, clip)?;
    check::floating("weight", weight)?;
    check::same_shape("weight", weight, "log_prob", log_prob)?;
    let weight = weight.detach().to_kind(log_prob.kind());
    surrogate(
        log_prob,
        anchor_log_prob,
        advantages,
        mask,
        clip,
        agg,
        Some(&weight),
    )
}

fn check_inputs(
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    clip: &PpoClip,
) -> Result<()> {
    check::floating("log_prob", log_prob)?;
    check::dims("log_prob", log_prob, 2)?;
    check::floating("old_log_prob", old_log_prob)?;
    check::same_shape("old_log_prob", old_log_prob, "log_prob", log_prob)?;
    check::floating("advantages", advantages)?;
    check::same_shape("advantages", advantages, "log_prob", log_prob)?;
    check::same_shape("mask", mask, "log_prob", log_prob)?;
    let PpoClip {
        clip_ratio_low: low,
        clip_ratio_high: high,
        clip_ratio_c: c,
    } = *clip;
    check::param(
        "clip_ratio_low",
        low,
        (0.0..1.0).contains(&low),
        "in [0, 1)",
    )?;
    check::param("clip_ratio_high", high, high >= 0.0, ">= 0")?;
    check::param("clip_ratio_c", c, c > 1.0, "> 1 (dual-clip lower bound)")?;

    Ok(())
}

/// The dual-clipped surrogate around `old_log_prob`, each token's loss scaled by `weight`
/// when given.
fn surrogate(
    log_prob: &Tensor,
    old_log_prob: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    clip: &PpoClip,
    agg: LossAgg,
    weight: Option<&Tensor>,
) -> Result<PolicyLoss> {
    let PpoClip {
        clip_ratio_low: low,
        clip_ratio_high: high,
        clip_ratio_c: c,
    } = *clip;
    let kind = log_prob.kind();
    let old = old_log_prob.detach().to_kind(kind);
    let adv = advantages.detach().to_kind(kind);
    let log_ratio = (log_prob - &old).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO);
    let ratio = log_ratio.exp();

    let unclipped = -&adv * &ratio;
    let clipped = -&adv * ratio.clamp(1.0 - low, 1.0 + high);
    let ppo = unclipped.maximum(&clipped);
    let dual = -&adv * c;
    let negative = adv.lt(0.0);
    let mut per_token = ppo.minimum(&dual).where_self(&negative, &ppo);
    if let Some(w) = weight {
        per_token *= w;
    }
    let loss = agg_loss_unchecked(&per_token, mask, agg);

    let (clip_frac, approx_kl, clip_frac_lower, behavior_weight) = tch::no_grad(|| {
        let clip_frac =
            masked::masked_mean_unchecked(&clipped.gt_tensor(&unclipped).to_kind(kind), mask);
        let approx_kl = masked::masked_mean_unchecked(&(-&log_ratio), mask);
        let lower = ppo.gt_tensor(&dual).logical_and(&negative).to_kind(kind);
        let clip_frac_lower = masked::masked_mean_unchecked(&lower, mask);
        let behavior_weight = weight.map(|w| masked::masked_mean_unchecked(w, mask).detach());
        (
            clip_frac.detach(),
            approx_kl.detach(),
            clip_frac_lower.detach(),
            behavior_weight,
        )
    });
    Ok(PolicyLoss {
        loss,
        clip_frac,
        approx_kl,
        clip_frac_lower,
        behavior_weight,
        behavior_kl: None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, t2, values};
    use super::*;

    // Five tokens, old log-prob 0, ratios r = exp(log_prob), the last token masked out:
    // t0: A = +1, r = 1.5 -> -1.5 vs -1.2 (clipped at 1.2): -1.2, PPO clip binding
    // t1: A = +1, r = 0.5 -> -0.5 vs -0.8: -0.5, not clipped
    // t2: A = -1, r = 0.5 ->  0.5 vs  0.8: 0.8, PPO clip binding; dual min(0.8, 3) = 0.8
    // t3: A = -1, r = 4.0 ->  4.0 vs  1.2: 4.0; dual min(4, 3) = 3, dual clip binding
    // t4: masked (A = +1, r = 1.5)
    fn batch() -> (Tensor, Tensor, Tensor, Tensor) {
        let lp = t2(&[&[
            1.5f64.ln(),
            0.5f64.ln(),
            0.5f64.ln(),
            4f64.ln(),
            1.5f64.ln(),
        ]])
        .set_requires_grad(true);
        let old = t2(&[&[0.0; 5]]);
        let adv = t2(&[&[1.0, 1.0, -1.0, -1.0, 1.0]]);
        let mask = t2(&[&[1.0, 1.0, 1.0, 1.0, 0.0]]);
        (lp, old, adv, mask)
    }

    // Decoupled PPO, four tokens at the proximal policy (r = 1, nothing clipped), behavior
    // log-probs giving weights w = prox / behavior of 1, 2, 0.5 and 10 (over the cap of 5):
    // per token w * (-A r) = -1, -2, 0.5, and 0 for the capped token (still in the mean).
    #[test]
    fn decoupled_ppo_weights_tokens_by_prox_over_behavior_and_caps_them() {
        let lp = t2(&[&[0.0; 4]]).set_requires_grad(true);
        let prox = t2(&[&[0.0; 4]]);
        let behavior = t2(&[&[0.0, -(2f64.ln()), 2f64.ln(), -(10f64.ln())]]);
        let adv = t2(&[&[1.0, 1.0, -1.0, 1.0]]);
        let mask = t2(&[&[1.0; 4]]);
        let clip = PpoClip::default();
        let out = decoupled_ppo_policy_loss(
            &lp,
            &prox,
            &behavior,
            &adv,
            &mask,
            &clip,
            5.0,
            LossAgg::TokenMean,
        )
        .unwrap();
        assert_close(&out.loss, &[-2.5 / (4.0 + 1e-8)], 1e-9);
        assert_close(out.behavior_weight.as_ref().unwrap(), &[3.5 / 4.0], 1e-6);
        // KL(behavior || prox) by k1: mean of behavior - prox = (0 - ln 2 + ln 2 - ln 10) / 4.
        assert_close(
            out.behavior_kl.as_ref().unwrap(),
            &[-(10f64.ln()) / (4.0 + 1e-8)],
            1e-6,
        );
        out.loss.backward();
        // d/dlogp of -w A r at r = 1: -w A / 4; the capped token gets no gradient.
        let g = values(&lp.grad());
        for (a, b) in g.iter().zip([-0.25, -0.5, 0.125, 0.0]) {
            assert!((a - b).abs() < 1e-6, "{g:?}");
        }

        // Fresh tokens (behavior = prox): exactly PPO around the proximal policy.
        let (lp, old, adv, mask) = batch();
        let fresh =
            decoupled_ppo_policy_loss(&lp, &old, &old, &adv, &mask, &clip, 5.0, LossAgg::TokenMean)
                .unwrap();
        let plain = ppo_policy_loss(&lp, &old, &adv, &mask, &clip, LossAgg::TokenMean).unwrap();
        assert_close(&fresh.loss, &values(&plain.loss), 1e-9);
        assert!(decoupled_ppo_policy_loss(
            &lp,
            &old,
            &old,
            &adv,
            &mask,
            &clip,
            0.5,
            LossAgg::TokenMean
        )
        .unwrap_err()
        .to_string()
        .contains("behavior_weight_cap"));
    }

    #[test]
    fn clip_and_dual_clip() {
        let (lp, old, adv, mask) = batch();
        let out = ppo_policy_loss(
            &lp,
            &old,
            &adv,
            &mask,
            &PpoClip::default(),
            LossAgg::TokenMean,
        )
        .unwrap();
        // (-1.2 - 0.5 + 0.8 + 3) / 4 = 2.1 / 4
        assert_close(&out.loss, &[2.1 / (4.0 + 1e-8)], 1e-9);
        // t0 and t2 clipped: 2 / 4; dual clip at t3: 1 / 4
        assert_close(&out.clip_frac, &[0.5], 1e-8);
        assert_close(&out.clip_frac_lower, &[0.25], 1e-8);
        // -(ln 1.5 + ln 0.5 + ln 0.5 + ln 4) / 4 = -ln(1.5) / 4
        assert_close(&out.approx_kl, &[-(1.5f64.ln()) / 4.0], 1e-8);
    }

    #[test]
    fn gradient_flows_only_through_unclipped_tokens() {
        let (lp, old, adv, mask) = batch();
        let out = ppo_policy_loss(
            &lp,
            &old,
            &adv,
            &mask,
            &PpoClip::default(),
            LossAgg::TokenMean,
        )
        .unwrap();
        out.loss.backward();
        let g = values(&lp.grad());
        // d/dlogp of -A r = -A r: only t1 is unclipped: -1 * 0.5 / 4 = -0.125.
        // Clipped (t0, t2), dual-clipped (t3) and masked (t4) tokens give 0.
        let e = [0.0, -0.125 / (1.0 + 1e-8 / 4.0), 0.0, 0.0, 0.0];
        assert!(g.iter().all(|x| x.is_finite()));
        for (a, b) in g.iter().zip(e) {
            assert!((a - b).abs() < 1e-9, "{g:?}");
        }
    }

    #[test]
    fn clip_higher_is_asymmetric() {
        let (lp, old, adv, mask) = batch();
        let clip = PpoClip {
            clip_ratio_high: 0.28,
            ..PpoClip::default()
        };
        let out = ppo_policy_loss(&lp, &old, &adv, &mask, &clip, LossAgg::TokenMean).unwrap();
        // t0 now clipped at 1.28: (-1.28 - 0.5 + 0.8 + 3) / 4 = 2.02 / 4 (t2 still uses 0.8)
        assert_close(&out.loss, &[2.02 / (4.0 + 1e-8)], 1e-9);
    }

    #[test]
    fn sequence_aggregation() {
        // Two rows: row 0 = t0, t1 (losses -1.2, -0.5), row 1 = t2, t3, t4 masked (0.8, 3).
        let lp = t2(&[
            &[1.5f64.ln(), 0.5f64.ln(), 0.0],
            &[0.5f64.ln(), 4f64.ln(), 1.5f64.ln()],
        ]);
        let old = t2(&[&[0.0; 3], &[0.0; 3]]);
        let adv = t2(&[&[1.0, 1.0, 0.0], &[-1.0, -1.0, 1.0]]);
        let mask = t2(&[&[1.0, 1.0, 0.0], &[1.0, 1.0, 0.0]]);
        let clip = PpoClip::default();
        let sum = ppo_policy_loss(&lp, &old, &adv, &mask, &clip, LossAgg::SeqMeanTokenSum).unwrap();
        // ((-1.2 - 0.5) + (0.8 + 3)) / 2 = 2.1 / 2
        assert_close(&sum.loss, &[1.05], 1e-9);
        let mean =
            ppo_policy_loss(&lp, &old, &adv, &mask, &clip, LossAgg::SeqMeanTokenMean).unwrap();
        // (-1.7 / 2 + 3.8 / 2) / 2 = (-0.85 + 1.9) / 2
        assert_close(&mean.loss, &[0.525], 1e-9);
    }

    #[test]
    fn log_ratio_is_clamped() {
        // log ratio 30 -> clamped to 20; with A = -1 the dual clip caps the loss at 3.
        let lp = t2(&[&[30.0]]).set_requires_grad(true);
        let old = t2(&[&[0.0]]);
        let mask = t2(&[&[1.0]]);
        let out = ppo_policy_loss(
            &lp,
            &old,
            &t2(&[&[-1.0]]),
            &mask,
            &PpoClip::default(),
            LossAgg::TokenMean,
        )
        .unwrap();
        assert_close(&out.loss, &[3.0 / (1.0 + 1e-8)], 1e-9);
        // approx KL is -20, not -30.
        assert_close(&out.approx_kl, &[-20.0 / (1.0 + 1e-8)], 1e-9);
        out.loss.backward();
        assert!(values(&lp.grad()).iter().all(|g| g.is_finite()));
    }

    #[test]
    fn rejects_bad_settings() {
        let (lp, old, adv, mask) = batch();
        let c = PpoClip {
            clip_ratio_c: 1.0,
            ..PpoClip::default()
        };
        let err = ppo_policy_loss(&lp, &old, &adv, &mask, &c, LossAgg::TokenMean).unwrap_err();
        assert!(err.to_string().starts_with("clip_ratio_c"), "{err}");
        let short = t2(&[&[0.0; 4]]);
        let err = ppo_policy_loss(
            &lp,
            &short,
            &adv,
            &mask,
            &PpoClip::default(),
            LossAgg::TokenMean,
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("old_log_prob"), "{err}");
    }
}
