//! Helpers for the algorithm tests: small f64 tensors and approximate comparisons.

use tch::{Kind, Tensor};

/// A 1-D f64 tensor.
pub(crate) fn t1(v: &[f64]) -> Tensor {
    Tensor::from_slice(v)
}

/// A 2-D f64 tensor from equal-length rows.
pub(crate) fn t2(rows: &[&[f64]]) -> Tensor {
    let cols = rows[0].len() as i64;
    let flat: Vec<f64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_slice(&flat).reshape([rows.len() as i64, cols])
}

/// The elements of `t`, flattened, as f64.
pub(crate) fn values(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).expect("tensor to Vec<f64>")
}

/// Asserts that `t` (flattened) equals `expected` within `tol`.
#[track_caller]
pub(crate) fn assert_close(t: &Tensor, expected: &[f64], tol: f64) {
    let got = values(t);
    assert_eq!(
        got.len(),
        expected.len(),
        "length: got {got:?}, expected {expected:?}"
    );
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (g - e).abs() <= tol,
            "element {i}: got {g}, expected {e} (all: {got:?} vs {expected:?})"
        );
    }
}

/// Plain-arithmetic whitening of a list (unbiased variance, eps 1e-8 under the root), to check
/// the tensor code against an independent computation.
pub(crate) fn whiten_ref(xs: &[f64]) -> Vec<f64> {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    xs.iter()
        .map(|x| (x - mean) / (var + 1e-8).sqrt())
        .collect()
}
