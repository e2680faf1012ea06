//! The gap between the probabilities the inference engine sampled with and the ones the
//! trainer computes for the same tokens with the same weights (different kernels, bf16
//! rounding, CUDA graphs): measured, and corrected by importance weights or rejection.
//!
//! Per token, with `δ = log π_trainer - log π_sampler` (clamped to ±20) and `ρ = exp(δ)`:
//! - truncated importance sampling (TIS): the token's loss is scaled by `min(ρ, cap)`
//!   (`weight = "token"`), or every token of a sequence by `min(Π ρ, cap)`
//!   (`weight = "sequence"`); the weight is detached;
//! - rejection (masked importance sampling, MIS): a token leaves the loss when `ρ` is
//!   outside `[lower, upper]` (`reject = "token"`), a whole sequence when `Π ρ` is
//!   (`"sequence"`) or when the geometric mean `exp(mean δ)` is (`"geometric"`). Rejected
//!   tokens leave the loss's denominator too, as verl's rollout rejection does.
//!
//! A *sequence* is a row of the batch: a trajectory, or one step's own context when steps
//! are trained as rows of their own.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::check;
use crate::Result;

/// `δ` is clamped to this magnitude before `exp`, as the PPO ratio is.
const MAX_LOG_RATIO: f64 = 20.0;

/// Which truncated importance weight corrects the sampler/trainer gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WeightLevel {
    /// No importance weight.
    #[default]
    Off,
    /// Per token: `min(ρ, weight_cap)`.
    Token,
    /// Per sequence: `min(Π ρ, weight_cap)` on each of its tokens.
    Sequence,
}

/// Which rejection rule masks tokens whose gap is too large.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RejectLevel {
    /// Nothing is rejected.
    #[default]
    Off,
    /// A token whose `ρ` is outside the bounds.
    Token,
    /// A whole sequence whose `Π ρ` is outside the bounds.
    Sequence,
    /// A whole sequence whose geometric mean `exp(mean δ)` is outside the bounds (length
    /// does not make long sequences fail, as it does with `sequence`).
    Geometric,
}

/// `[algorithm.rollout_correction]`: how the learner measures and corrects the gap between
/// the engine's sampling log-probabilities and its own for the same weights.
///
/// The gap is measured on every update over the tokens sampled by the weights the update
/// starts from (in synchronous training, all of them). A correction, when on, applies to
/// every trained token whose gap it can see: all of them, or, with decoupled PPO, the fresh
/// ones (a stale token's gap is corrected by decoupled PPO's weight, which covers both).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutCorrection {
    /// Truncated importance sampling: `off`, `token` or `sequence`.
    pub weight: WeightLevel,
    /// Cap of the truncated weight.
    #[schemars(range(min = 1.0))]
    pub weight_cap: f64,
    /// Rejection: `off`, `token`, `sequence` or `geometric`.
    pub reject: RejectLevel,
    /// Tokens (or sequences) whose ratio is below this are rejected.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 1.0))]
    pub reject_lower: f64,
    /// Tokens (or sequences) whose ratio is above this are rejected.
    #[schemars(range(min = 1.0))]
    pub reject_upper: f64,
    /// `|δ|` above which a token counts as mismatched in the reported fraction.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub report_threshold: f64,
}

impl Default for RolloutCorrection {
    fn default() -> Self {
        Self {
            weight: WeightLevel::Off,
            weight_cap: 2.0,
            reject: RejectLevel::Off,
            reject_lower: 0.5,
            reject_upper: 2.0,
            report_threshold: 0.1,
        }
    }
}

impl RolloutCorrection {
    /// Whether any correction changes the loss (else the gap is only measured).
    pub fn corrects(&self) -> bool {
        self.weight != WeightLevel::Off || self.reject != RejectLevel::Off
    }
}

/// The measured gap over a set of tokens: scalars, detached, 0 with no token.
#[derive(Debug)]
pub struct MismatchStats {
    /// Tokens measured.
    pub tokens: Tensor,
    /// Mean `|δ|`.
    pub abs_mean: Tensor,
    /// Largest `|δ|`.
    pub abs_max: Tensor,
    /// k3 estimate of KL(sampler || trainer): mean of `ρ - 1 - δ` (the tokens were drawn
    /// from the sampler).
    pub kl_k3: Tensor,
    /// Fraction of tokens with `|δ| > report_threshold`.
    pub over_threshold: Tensor,
    /// The worst sequence: largest `|Σ δ|` over its measured tokens.
    pub sequence_abs_max: Tensor,
}

/// The correction of a batch: per-token factors, detached.
#[derive(Debug)]
pub struct Correction {
    /// `[B, T]`: the truncated importance weight of each token (1 where none applies).
    pub weight: Tensor,
    /// `[B, T]`: 1 where the token stays in the loss, 0 where it was rejected.
    pub keep: Tensor,
}

fn log_ratio(trainer_log_prob: &Tensor, sampler_log_prob: &Tensor) -> Tensor {
    let kind = Kind::Double;
    (trainer_log_prob.to_kind(kind) - sampler_log_prob.to_kind(kind))
        .clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
}

fn check_inputs(trainer: &Tensor, sampler: &Tensor, mask: &Tensor) -> Result<()> {
    check::floating("trainer_log_prob", trainer)?;
    check::dims("trainer_log_prob", trainer, 2)?;
    check::floating("sampler_log_prob", sampler)?;
    check::same_shape("sampler_log_prob", sampler, "trainer_log_prob", trainer)?;
    check::same_shape("mask", mask, "trainer_log_prob", trainer)
}

/// Measures the gap between `trainer_log_prob` and `sampler_log_prob` (`[B, T]`) over the
/// tokens where `mask` is non-zero. Computed in float64.
pub fn mismatch_stats(
    trainer_log_prob: &Tensor,
    sampler_log_prob: &Tensor,
    mask: &Tensor,
    report_threshold: f64,
) -> Result<MismatchStats> {
    check_inputs(trainer_log_prob, sampler_log_prob, mask)?;
    Ok(tch::no_grad(|| {
        let on = mask.ne(0);
        let zero = Tensor::zeros([], (Kind::Double, trainer_log_prob.device()));
        let delta = log_ratio(trainer_log_prob, sampler_log_prob);
        let delta = delta.where_self(&on, &delta.zeros_like());
        let abs = delta.abs();
        let n = on.sum(Kind::Double);
        let mean = |t: &Tensor| t.sum(Kind::Double) / n.clamp_min(1.0);
        let k3 = delta.exp() - 1.0 - &delta;
        let over = abs
            .gt(report_threshold)
            .logical_and(&on)
            .to_kind(Kind::Double);
        let any = on.any().int64_value(&[]) != 0;
        MismatchStats {
            abs_mean: mean(&abs),
            abs_max: if any { abs.max() } else { zero.copy() },
            kl_k3: mean(&k3.where_self(&on, &k3.zeros_like())),
            over_threshold: mean(&over),
            sequence_abs_max: if any {
                delta.sum_dim_intlist(1, false, Kind::Double).abs().max()
            } else {
                zero
            },
            tokens: n,
        }
    }))
}

/// The correction `config` prescribes for the tokens where `mask` is non-zero (`[B, T]`
/// log-probabilities). Outside the mask the weight is 1 and nothing is rejected; sequence
/// rules read only a row's masked tokens. Computed in float64, returned in the trainer
/// log-probabilities' kind.
pub fn correction(
    trainer_log_prob: &Tensor,
    sampler_log_prob: &Tensor,
    mask: &Tensor,
    config: &RolloutCorrection,
) -> Result<Correction> {
    check_inputs(trainer_log_prob, sampler_log_prob, mask)?;
    check::param(
        "weight_cap",
        config.weight_cap,
        config.weight_cap >= 1.0,
        ">= 1",
    )?;
    check::param(
        "reject_lower",
        config.reject_lower,
        config.reject_lower > 0.0 && config.reject_lower <= 1.0,
        "in (0, 1]",
    )?;
    check::param(
        "reject_upper",
        config.reject_upper,
        config.reject_upper >= 1.0,
        ">= 1",
    )?;
    let kind = trainer_log_prob.kind();
    Ok(tch::no_grad(|| {
        let on = mask.ne(0);
        let delta = log_ratio(trainer_log_prob, sampler_log_prob);
        let delta = delta.where_self(&on, &delta.zeros_like());
        let ones = delta.ones_like();
        let row_sum = || delta.sum_dim_intlist(1, true, Kind::Double);
        let weight = match config.weight {
            WeightLevel::Off => ones.copy(),
            WeightLevel::Token => delta.exp().clamp_max(config.weight_cap),
            WeightLevel::Sequence => row_sum()
                .clamp_max(MAX_LOG_RATIO)
                .exp()
                .clamp_max(config.weight_cap)
                .expand_as(&delta),
        };
        let (lo, hi) = (config.reject_lower.ln(), config.reject_upper.ln());
        let inside = |log_r: &Tensor| log_r.ge(lo).logical_and(&log_r.le(hi));
        let keep = match config.reject {
            RejectLevel::Off => on.ones_like(),
            RejectLevel::Token => inside(&delta),
            RejectLevel::Sequence => inside(&row_sum()).expand_as(&delta),
            RejectLevel::Geometric => {
                let n = on.sum_dim_intlist(1, true, Kind::Double).clamp_min(1.0);
                inside(&(row_sum() / n)).expand_as(&delta)
            }
        };
        let keep = keep.logical_or(&on.logical_not());
        Correction {
            weight: weight.where_self(&on, &ones).to_kind(kind).detach(),
            keep: keep.to_kind(kind).detach(),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, t2, values};
    use super::*;

    // Two rows of three tokens, the last of row 0 masked out (its garbage must not count):
    // δ row 0 = ln 2, ln 0.25, (masked); row 1 = 0.05, -0.05, ln 3.
    fn batch() -> (Tensor, Tensor, Tensor) {
        let trainer = t2(&[&[2f64.ln(), 0.25f64.ln(), 100.0], &[0.05, -0.05, 3f64.ln()]]);
        let sampler = t2(&[&[0.0, 0.0, f64::NAN], &[0.0, 0.0, 0.0]]);
        let mask = t2(&[&[1.0, 1.0, 0.0], &[1.0, 1.0, 1.0]]);
        (trainer, sampler, mask)
    }

    #[test]
    fn stats_follow_the_definitions_and_ignore_masked_tokens() {
        let (trainer, sampler, mask) = batch();
        let s = mismatch_stats(&trainer, &sampler, &mask, 0.1).unwrap();
        let d = [2f64.ln(), 0.25f64.ln(), 0.05, -0.05, 3f64.ln()];
        let abs: Vec<f64> = d.iter().map(|x: &f64| x.abs()).collect();
        assert_close(&s.tokens, &[5.0], 0.0);
        assert_close(&s.abs_mean, &[abs.iter().sum::<f64>() / 5.0], 1e-12);
        assert_close(&s.abs_max, &[4f64.ln()], 1e-12);
        let k3: f64 = d.iter().map(|x| x.exp() - 1.0 - x).sum::<f64>() / 5.0;
        assert_close(&s.kl_k3, &[k3], 1e-12);
        assert_close(&s.over_threshold, &[3.0 / 5.0], 1e-12);
        // Row 0: ln 2 + ln 0.25 = ln 0.5; row 1: ln 3.
        assert_close(&s.sequence_abs_max, &[3f64.ln()], 1e-12);
    }

    #[test]
    fn no_token_measured_gives_zeros_not_nan() {
        let (trainer, sampler, mask) = batch();
        let s = mismatch_stats(&trainer, &sampler, &mask.zeros_like(), 0.1).unwrap();
        for t in [
            &s.tokens,
            &s.abs_mean,
            &s.abs_max,
            &s.kl_k3,
            &s.over_threshold,
            &s.sequence_abs_max,
        ] {
            assert_close(t, &[0.0], 0.0);
        }
    }

    #[test]
    fn token_tis_truncates_and_sequence_tis_weighs_whole_rows() {
        let (trainer, sampler, mask) = batch();
        let config = RolloutCorrection {
            weight: WeightLevel::Token,
            ..Default::default()
        };
        let c = correction(&trainer, &sampler, &mask, &config).unwrap();
        assert_close(
            &c.weight,
            &[2.0, 0.25, 1.0, 0.05f64.exp(), (-0.05f64).exp(), 2.0],
            1e-12,
        );
        assert_close(&c.keep, &[1.0; 6], 0.0);
        let config = RolloutCorrection {
            weight: WeightLevel::Sequence,
            ..config
        };
        let c = correction(&trainer, &sampler, &mask, &config).unwrap();
        // Row 0: Π ρ = 0.5 (masked column keeps 1); row 1: Π ρ = 3, capped at 2.
        assert_close(&c.weight, &[0.5, 0.5, 1.0, 2.0, 2.0, 2.0], 1e-12);
    }

    #[test]
    fn rejection_masks_tokens_sequences_or_geometric_means_outside_the_bounds() {
        let (trainer, sampler, mask) = batch();
        let at = |reject| {
            let config = RolloutCorrection {
                reject,
                ..Default::default()
            };
            values(&correction(&trainer, &sampler, &mask, &config).unwrap().keep)
        };
        // Bounds [0.5, 2]: ρ = 2 stays (bounds are inclusive), 0.25 and 3 go.
        assert_eq!(at(RejectLevel::Token), [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]);
        // Π ρ: row 0 = 0.5 (in), row 1 = 3 (out).
        assert_eq!(at(RejectLevel::Sequence), [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
        // Geometric: row 0 = 0.5^(1/2) (in), row 1 = 3^(1/3) (in).
        assert_eq!(at(RejectLevel::Geometric), [1.0; 6]);
        assert_eq!(at(RejectLevel::Off), [1.0; 6]);
    }

    #[test]
    fn out_of_range_settings_and_shapes_are_refused_by_name() {
        let (trainer, sampler, mask) = batch();
        for (config, key) in [
            (
                RolloutCorrection {
                    weight_cap: 0.5,
                    ..Default::default()
                },
                "weight_cap",
            ),
            (
                RolloutCorrection {
                    reject_lower: 0.0,
                    ..Default::default()
                },
                "reject_lower",
            ),
            (
                RolloutCorrection {
                    reject_upper: 0.9,
                    ..Default::default()
                },
                "reject_upper",
            ),
        ] {
            let err = correction(&trainer, &sampler, &mask, &config)
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{err}");
        }
        let err = mismatch_stats(&trainer, &sampler.narrow(1, 0, 2), &mask, 0.1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sampler_log_prob"), "{err}");
    }
}
