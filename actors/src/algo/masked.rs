//! Masked reductions and whitening over the action tokens of a batch.
//!
//! verl's versions multiply by the mask, so a NaN or inf in a masked-out position (a tool
//! token's garbage value, say) would poison the sum; these select with the mask first, as
//! current verl's `masked_sum` does.

use tch::Tensor;

use super::check;
use crate::Result;

/// Added to the variance under the square root when whitening, as verl does.
pub const WHITEN_EPS: f64 = 1e-8;

/// Sum of `values` over the positions where `mask` is non-zero (weighted by the mask when it
/// holds weights other than 0/1). `values` and `mask` share any shape; returns a scalar.
pub fn masked_sum(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    check::floating("values", values)?;
    check::same_shape("mask", mask, "values", values)?;
    Ok(masked_sum_unchecked(values, mask))
}

/// Mean of `values` over the positions where `mask` is non-zero; returns a scalar.
///
/// The count gets `+ 1e-8` (as verl's `masked_mean`), so an empty mask gives 0 rather than NaN
/// and a batch without action tokens trains as a no-op instead of crashing.
pub fn masked_mean(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    check::floating("values", values)?;
    check::same_shape("mask", mask, "values", values)?;
    Ok(masked_mean_unchecked(values, mask))
}

/// Variance of `values` over the positions where `mask` is non-zero; returns a scalar.
/// Means inside are exact (`sum / count`, not verl's `count + 1e-8`).
///
/// With `unbiased` the variance gets Bessel's correction `n / (n - 1)` as verl's `masked_var`.
/// verl raises when the mask has 0 or 1 positions; here the correction is dropped in that case
/// (the variance is then 0), because one action token in a mini-batch is a legitimate, if rare,
/// outcome of a rollout and must not stop a training run.
pub fn masked_var(values: &Tensor, mask: &Tensor, unbiased: bool) -> Result<Tensor> {
    check::floating("values", values)?;
    check::same_shape("mask", mask, "values", values)?;
    Ok(masked_var_unchecked(values, mask, unbiased))
}

/// Whitens `values` over the masked positions: `(x - mean) / sqrt(var + 1e-8)` with the
/// masked mean and unbiased masked variance, as verl's `masked_whiten`. Same shape as `values`.
///
/// Unlike verl, positions outside the mask are set to 0 (verl leaves whitened garbage there):
/// nothing may read them, and zeros make that visible. The mean here is the exact
/// `sum / count` (verl adds 1e-8 to the count, a relative 1e-8 shift that the `1e4` factor of
/// a zero variance would turn into a visible non-zero advantage for a lone token).
pub fn masked_whiten(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    check::floating("values", values)?;
    check::same_shape("mask", mask, "values", values)?;
    Ok(masked_whiten_unchecked(values, mask))
}

pub(crate) fn masked_sum_unchecked(values: &Tensor, mask: &Tensor) -> Tensor {
    select(values, mask).sum(values.kind())
}

pub(crate) fn masked_mean_unchecked(values: &Tensor, mask: &Tensor) -> Tensor {
    let count = check::mask_like(mask, values).sum(values.kind());
    masked_sum_unchecked(values, mask) / (count + 1e-8)
}

/// `sum / count` over the mask, 0 for an empty mask.
fn exact_mean(values: &Tensor, mask: &Tensor) -> Tensor {
    let count = check::mask_like(mask, values).sum(values.kind());
    masked_sum_unchecked(values, mask) / count.clamp_min(1.0)
}

pub(crate) fn masked_var_unchecked(values: &Tensor, mask: &Tensor, unbiased: bool) -> Tensor {
    let mean = exact_mean(values, mask);
    let var = exact_mean(&(values - mean).square(), mask);
    if unbiased {
        let n = check::mask_like(mask, values).sum(values.kind());
        // n / (n - 1) for n >= 2; n / 1 (0 or 1) otherwise, where the variance is 0 anyway.
        var * (&n / (&n - 1.0).clamp_min(1.0))
    } else {
        var
    }
}

pub(crate) fn masked_whiten_unchecked(values: &Tensor, mask: &Tensor) -> Tensor {
    let mean = exact_mean(values, mask);
    let var = masked_var_unchecked(values, mask, true);
    let whitened = (values - mean) * (var + WHITEN_EPS).rsqrt();
    select(&whitened, mask)
}

/// `values * mask` where the mask is non-zero, exactly 0 elsewhere (even where `values` is NaN).
pub(crate) fn select(values: &Tensor, mask: &Tensor) -> Tensor {
    let kept = values.where_self(&check::mask_bool(mask), &values.zeros_like());
    kept * check::mask_like(mask, values)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, t2};
    use super::*;

    // Two action spans with a tool response between them: [1, 1, 0, 0, 1, 1].
    fn holey() -> (Tensor, Tensor) {
        let values = t2(&[&[1.0, 2.0, f64::NAN, 100.0, 3.0, 4.0]]);
        let mask = t2(&[&[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]]);
        (values, mask)
    }

    #[test]
    fn sum_and_mean_skip_holes_even_nan() {
        let (v, m) = holey();
        // 1 + 2 + 3 + 4 = 10; the NaN and the 100 are masked out.
        assert_close(&masked_sum(&v, &m).unwrap(), &[10.0], 1e-12);
        // 10 / (4 + 1e-8)
        assert_close(&masked_mean(&v, &m).unwrap(), &[10.0 / (4.0 + 1e-8)], 1e-12);
    }

    #[test]
    fn variance_biased_and_unbiased() {
        let (v, m) = holey();
        // mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5;
        // biased 5 / 4 = 1.25, unbiased 5 / 3.
        assert_close(&masked_var(&v, &m, false).unwrap(), &[1.25], 1e-6);
        assert_close(&masked_var(&v, &m, true).unwrap(), &[5.0 / 3.0], 1e-6);
    }

    #[test]
    fn whiten_holes_are_zero() {
        let (v, m) = holey();
        // (x - 2.5) / sqrt(5/3 + 1e-8): sqrt(5/3) = 1.2909944
        let s = (5.0f64 / 3.0 + 1e-8).sqrt();
        let e = [-1.5 / s, -0.5 / s, 0.0, 0.0, 0.5 / s, 1.5 / s];
        assert_close(&masked_whiten(&v, &m).unwrap(), &e, 1e-6);
    }

    #[test]
    fn degenerate_masks_give_zeros_not_errors() {
        let v = t2(&[&[5.0, 7.0]]);
        // One token: variance 0, whitened value (5 - 5) * rsqrt(0 + 1e-8) = 0.
        let one = t2(&[&[1.0, 0.0]]);
        assert_close(&masked_var(&v, &one, true).unwrap(), &[0.0], 1e-12);
        assert_close(&masked_whiten(&v, &one).unwrap(), &[0.0, 0.0], 1e-12);
        // No token: mean 0 / (0 + 1e-8) = 0.
        let none = t2(&[&[0.0, 0.0]]);
        assert_close(&masked_mean(&v, &none).unwrap(), &[0.0], 1e-12);
        assert_close(&masked_whiten(&v, &none).unwrap(), &[0.0, 0.0], 1e-12);
    }

    #[test]
    fn bool_mask_and_shape_mismatch() {
        let v = t2(&[&[1.0, 3.0]]);
        let m = Tensor::from_slice(&[true, false]).reshape([1, 2]);
        assert_close(&masked_mean(&v, &m).unwrap(), &[1.0 / (1.0 + 1e-8)], 1e-12);
        let bad = Tensor::from_slice(&[1.0f64, 1.0, 1.0]);
        let err = masked_mean(&v, &bad).unwrap_err().to_string();
        assert!(
            err.contains("mask") && err.contains("[3]") && err.contains("[1, 2]"),
            "{err}"
        );
    }
}
