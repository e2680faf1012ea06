//! The critic's clipped value loss (verl's `compute_value_loss`).

use tch::Tensor;

use super::agg::{agg_loss_unchecked, LossAgg};
use super::{check, masked};
use crate::Result;

/// The value loss and its clip statistic.
#[derive(Debug)]
pub struct ValueLoss {
    /// Scalar loss attached to `vpreds`' graph (`vf_loss`).
    pub loss: Tensor,
    /// Scalar, detached: fraction of action tokens where the clipped error was the larger one
    /// (`vf_clipfrac`).
    pub clip_frac: Tensor,
}

/// Clipped value loss over `[B, T]`: `0.5 * agg(max((v - R)², (clip(v, V_old ± c) - R)²))`.
///
/// `vpreds` are the critic's new predictions (with grad), `returns` the GAE targets,
/// `old_values` the predictions made at rollout time, `mask` the action tokens;
/// `cliprange_value` is `c` (0.5 by default in verl). The clip keeps one update from moving a
/// value further than `c` from where it was, the `max` makes it pessimistic.
pub fn value_loss(
    vpreds: &Tensor,
    returns: &Tensor,
    old_values: &Tensor,
    mask: &Tensor,
    cliprange_value: f64,
    agg: LossAgg,
) -> Result<ValueLoss> {
    check::floating("vpreds", vpreds)?;
    check::dims("vpreds", vpreds, 2)?;
    check::floating("returns", returns)?;
    check::same_shape("returns", returns, "vpreds", vpreds)?;
    check::floating("old_values", old_values)?;
    check::same_shape("old_values", old_values, "vpreds", vpreds)?;
    check::same_shape("mask", mask, "vpreds", vpreds)?;
    check::param(
        "cliprange_value",
        cliprange_value,
        cliprange_value >= 0.0,
        "a finite number >= 0",
    )?;
    let kind = vpreds.kind();
    let returns = returns.detach().to_kind(kind);
    let old = old_values.detach().to_kind(kind);
    // verl's clip_by_value: max(min(v, old + c), old - c).
    let clipped = vpreds
        .minimum(&(&old + cliprange_value))
        .maximum(&(&old - cliprange_value));
    let unclipped_err = (vpreds - &returns).square();
    let clipped_err = (clipped - &returns).square();
    let per_token = unclipped_err.maximum(&clipped_err);
    let loss = agg_loss_unchecked(&per_token, mask, agg) * 0.5;
    let clip_frac = tch::no_grad(|| {
        let hit = clipped_err.gt_tensor(&unclipped_err).to_kind(kind);
        masked::masked_mean_unchecked(&hit, mask).detach()
    });
    Ok(ValueLoss { loss, clip_frac })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, t2, values};
    use super::*;

    // c = 0.5. Per token:
    // t0: v 0.8, old 0.5, R 3: clip(0.8, [0, 1]) = 0.8; errors 4.84, 4.84 -> 4.84, not
    //     clipped (inside the range, not on its edge, where torch splits gradients of ties)
    // t1: v 2.0, old 1.0, R 3: clip -> 1.5; errors 1, 2.25 -> 2.25, clipped
    // t2: v 2.0, old 1.0, R 0: clip -> 1.5; errors 4, 2.25 -> 4, not clipped
    // t3: masked
    fn batch() -> (Tensor, Tensor, Tensor, Tensor) {
        let v = t2(&[&[0.8, 2.0, 2.0, 50.0]]).set_requires_grad(true);
        let r = t2(&[&[3.0, 3.0, 0.0, 0.0]]);
        let old = t2(&[&[0.5, 1.0, 1.0, 0.0]]);
        let m = t2(&[&[1.0, 1.0, 1.0, 0.0]]);
        (v, r, old, m)
    }

    #[test]
    fn clipped_loss_and_fraction() {
        let (v, r, old, m) = batch();
        let out = value_loss(&v, &r, &old, &m, 0.5, LossAgg::TokenMean).unwrap();
        // 0.5 * (4.84 + 2.25 + 4) / 3
        assert_close(&out.loss, &[0.5 * 11.09 / (3.0 + 1e-8)], 1e-9);
        assert_close(&out.clip_frac, &[1.0 / (3.0 + 1e-8)], 1e-9);
    }

    #[test]
    fn gradient_skips_clipped_tokens() {
        let (v, r, old, m) = batch();
        let out = value_loss(&v, &r, &old, &m, 0.5, LossAgg::TokenMean).unwrap();
        out.loss.backward();
        // d/dv 0.5 (v - R)² / 3 = (v - R) / 3: t0 -2.2/3, t2 +2/3; t1 uses the clipped
        // prediction (constant in v): 0; t3 masked: 0.
        let n = 3.0 + 1e-8;
        let g = values(&v.grad());
        let e = [-2.2 / n, 0.0, 2.0 / n, 0.0];
        for (a, b) in g.iter().zip(e) {
            assert!((a - b).abs() < 1e-9, "{g:?}");
        }
    }

    #[test]
    fn rejects_mismatch() {
        let (v, r, _, m) = batch();
        let old = t2(&[&[0.0; 3]]);
        let err = value_loss(&v, &r, &old, &m, 0.5, LossAgg::TokenMean).unwrap_err();
        assert!(err.to_string().starts_with("old_values"), "{err}");
        assert!(value_loss(&v, &r, &r, &m, -1.0, LossAgg::TokenMean).is_err());
    }
}
