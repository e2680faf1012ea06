//! Reducing a per-token loss matrix to the scalar that is back-propagated.

use std::fmt;
use std::str::FromStr;

use tch::Tensor;

use super::{check, masked};
use crate::{Error, Result};

/// How a `[B, T]` per-token loss becomes a scalar (verl's `loss_agg_mode`).
///
/// The choice sets how much each token weighs: `TokenMean` weighs all action tokens of the
/// batch alike (long trajectories count more), the `SeqMean*` modes weigh trajectories alike.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum LossAgg {
    /// `"token-mean"`: sum over all action tokens / number of action tokens. Agent-R1's default.
    #[default]
    TokenMean,
    /// `"seq-mean-token-sum"`: per-sequence sum over its action tokens, then the mean over
    /// sequences.
    SeqMeanTokenSum,
    /// `"seq-mean-token-mean"`: per-sequence mean over its action tokens, then the mean over
    /// sequences.
    SeqMeanTokenMean,
}

impl LossAgg {
    /// The name verl's configuration uses.
    pub fn as_str(self) -> &'static str {
        match self {
            LossAgg::TokenMean => "token-mean",
            LossAgg::SeqMeanTokenSum => "seq-mean-token-sum",
            LossAgg::SeqMeanTokenMean => "seq-mean-token-mean",
        }
    }
}

impl fmt::Display for LossAgg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LossAgg {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "token-mean" => Ok(LossAgg::TokenMean),
            "seq-mean-token-sum" => Ok(LossAgg::SeqMeanTokenSum),
            "seq-mean-token-mean" => Ok(LossAgg::SeqMeanTokenMean),
            other => Err(Error::invalid(
                "loss_agg_mode",
                format!(
                    "unknown mode {other:?}; expected token-mean, seq-mean-token-sum or \
                     seq-mean-token-mean"
                ),
            )),
        }
    }
}

/// Aggregates `loss_mat` `[B, T]` over the action tokens in `mask` `[B, T]` into a scalar that
/// keeps `loss_mat`'s graph.
///
/// Sequences without any action token (padding rows of a micro-batch, a trajectory truncated
/// before the model spoke) do not count in the `SeqMean*` denominators, as in Agent-R1's
/// pad-aware `agg_loss`; verl's plain version would count them (and turn
/// `seq-mean-token-mean` into NaN). A batch with no action token at all gives 0, still
/// attached to the graph so that `backward` works and yields zero gradients.
pub fn agg_loss(loss_mat: &Tensor, mask: &Tensor, mode: LossAgg) -> Result<Tensor> {
    check::floating("loss_mat", loss_mat)?;
    check::dims("loss_mat", loss_mat, 2)?;
    check::same_shape("mask", mask, "loss_mat", loss_mat)?;
    Ok(agg_loss_unchecked(loss_mat, mask, mode))
}

pub(crate) fn agg_loss_unchecked(loss_mat: &Tensor, mask: &Tensor, mode: LossAgg) -> Tensor {
    let kind = loss_mat.kind();
    match mode {
        LossAgg::TokenMean => masked::masked_mean_unchecked(loss_mat, mask),
        LossAgg::SeqMeanTokenSum | LossAgg::SeqMeanTokenMean => {
            let per_token = masked::select(loss_mat, mask);
            let seq_sum = per_token.sum_dim_intlist(-1, false, kind);
            let count = check::mask_like(mask, loss_mat).sum_dim_intlist(-1, false, kind);
            let seq_loss = if mode == LossAgg::SeqMeanTokenMean {
                // count 0 only where seq_sum is 0 too: 0 / 1.
                seq_sum / count.clamp_min(1.0)
            } else {
                seq_sum
            };
            let present = count.gt(0).to_kind(kind);
            (seq_loss * &present).sum(kind) / present.sum(kind).clamp_min(1.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, t2, values};
    use super::*;

    fn batch() -> (Tensor, Tensor) {
        let loss = t2(&[&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0], &[7.0, 8.0, 9.0]]);
        // Row 0 has a hole at the end, row 1 one token, row 2 none (a padding row).
        let mask = t2(&[&[1.0, 1.0, 0.0], &[1.0, 0.0, 0.0], &[0.0, 0.0, 0.0]]);
        (loss, mask)
    }

    #[test]
    fn token_mean() {
        let (l, m) = batch();
        // (1 + 2 + 4) / 3 tokens
        let got = agg_loss(&l, &m, LossAgg::TokenMean).unwrap();
        assert_close(&got, &[7.0 / (3.0 + 1e-8)], 1e-9);
    }

    #[test]
    fn seq_mean_token_sum_ignores_empty_rows() {
        let (l, m) = batch();
        // rows: 1 + 2 = 3, 4; row 2 is empty and not counted: (3 + 4) / 2
        let got = agg_loss(&l, &m, LossAgg::SeqMeanTokenSum).unwrap();
        assert_close(&got, &[3.5], 1e-12);
    }

    #[test]
    fn seq_mean_token_mean_ignores_empty_rows() {
        let (l, m) = batch();
        // rows: (1 + 2) / 2 = 1.5, 4 / 1 = 4; mean (1.5 + 4) / 2
        let got = agg_loss(&l, &m, LossAgg::SeqMeanTokenMean).unwrap();
        assert_close(&got, &[2.75], 1e-12);
    }

    #[test]
    fn all_empty_is_zero_with_zero_grad() {
        for mode in [
            LossAgg::TokenMean,
            LossAgg::SeqMeanTokenSum,
            LossAgg::SeqMeanTokenMean,
        ] {
            let l = t2(&[&[1.0, 2.0]]).set_requires_grad(true);
            let m = t2(&[&[0.0, 0.0]]);
            let loss = agg_loss(&l, &m, mode).unwrap();
            assert_close(&loss, &[0.0], 0.0);
            loss.backward();
            assert_eq!(values(&l.grad()), vec![0.0, 0.0], "{mode}");
        }
    }

    #[test]
    fn names_round_trip() {
        for mode in [
            LossAgg::TokenMean,
            LossAgg::SeqMeanTokenSum,
            LossAgg::SeqMeanTokenMean,
        ] {
            assert_eq!(mode.as_str().parse::<LossAgg>().unwrap(), mode);
        }
        assert!("seq-sum".parse::<LossAgg>().is_err());
    }

    #[test]
    fn rejects_1d() {
        let l = Tensor::from_slice(&[1.0f64, 2.0]);
        let err = agg_loss(&l, &l, LossAgg::TokenMean)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("loss_mat") && err.contains("2 dimensions"),
            "{err}"
        );
    }
}
