//! Entropy of the policy's next-token distribution, from logits.

use tch::{Kind, Tensor};

use super::check;
use crate::Result;

/// Entropy `H = -Σ p log p` over the last dimension: `[B, T, V]` logits give `[B, T]` (any
/// leading shape works).
///
/// Computed from `log_softmax` (logits minus their logsumexp), so large logits do not overflow
/// as a naive `softmax` then `log` would, and in at least f32 so bf16/f16 logits keep their
/// precision in the sum over a large vocabulary. Logits of `-inf` (banned tokens) contribute 0,
/// with a finite gradient. Keeps the graph (for an entropy bonus).
pub fn entropy_from_logits(logits: &Tensor) -> Result<Tensor> {
    check::floating("logits", logits)?;
    if logits.dim() == 0 {
        return Err(crate::Error::invalid(
            "logits",
            "expected at least one dimension (the vocabulary), got a scalar",
        ));
    }
    let kind = if logits.kind() == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    };
    Ok(entropy_from_log_probs(
        &logits.to_kind(kind).log_softmax(-1, kind),
    ))
}

/// [`entropy_from_logits`] from log-probabilities already computed (`log_softmax` of the
/// logits, float32 or float64), for callers that need both.
pub fn entropy_from_log_probs(log_p: &Tensor) -> Tensor {
    let kind = log_p.kind();
    let p = log_p.exp();
    // Where p == 0 exactly (logit -inf), log p is -inf and 0 * -inf would be NaN: clamp log p
    // to the most negative finite number, which leaves every other term untouched.
    let floor = if kind == Kind::Double {
        f64::MIN
    } else {
        f32::MIN as f64
    };
    -(p * log_p.clamp_min(floor)).sum_dim_intlist(-1, false, kind)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, values};
    use super::*;

    #[test]
    fn known_distributions() {
        // [B=1, T=3, V=2]:
        // [0, 0]: uniform, H = ln 2 = 0.693147
        // [0, ln 3]: p = [1/4, 3/4], H = 0.25 ln 4 + 0.75 ln(4/3) = 0.562335
        // [1000, 1000]: uniform again; a naive exp would overflow
        let logits =
            Tensor::from_slice(&[0.0, 0.0, 0.0, 3f64.ln(), 1000.0, 1000.0]).reshape([1, 3, 2]);
        let h = entropy_from_logits(&logits).unwrap();
        assert_eq!(h.size(), vec![1, 3]);
        let h2 = 0.25 * 4f64.ln() + 0.75 * (4.0f64 / 3.0).ln();
        assert_close(&h, &[2f64.ln(), h2, 2f64.ln()], 1e-12);
    }

    #[test]
    fn banned_tokens_and_gradient() {
        // f32 logits [0, 0, -inf]: two equally likely tokens, H = ln 2; the gradient must be
        // finite everywhere and non-zero somewhere once the distribution is not uniform.
        let logits = Tensor::from_slice(&[0.0f32, 1.0, f32::NEG_INFINITY])
            .reshape([1, 1, 3])
            .set_requires_grad(true);
        let h = entropy_from_logits(&logits).unwrap();
        // p = [1/(1+e), e/(1+e)], H = ln(1+e) - e/(1+e) = 0.582203
        let e = 1f64.exp();
        assert_close(&h, &[(1.0 + e).ln() - e / (1.0 + e)], 1e-6);
        h.sum(Kind::Float).backward();
        let g = values(&logits.grad());
        assert!(g.iter().all(|x| x.is_finite()), "{g:?}");
        // dH/dz_i = -p_i (log p_i + H): for z0, p0 = 0.268941, log p0 = -1.313262:
        // -0.268941 * (-1.313262 + 0.582203) = 0.196612; z1 the opposite; z2 0.
        assert!(
            (g[0] - 0.196612).abs() < 1e-5 && (g[1] + 0.196612).abs() < 1e-5,
            "{g:?}"
        );
        assert_eq!(g[2], 0.0);
    }

    #[test]
    fn rejects_integer_logits() {
        let bad = Tensor::from_slice(&[1i64, 2]);
        assert!(entropy_from_logits(&bad).is_err());
    }
}
