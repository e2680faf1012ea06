//! Per-token estimators of KL(policy || reference) from sampled log-probabilities
//! (Schulman, "Approximating KL divergence", as verl's `kl_penalty`).

use std::fmt;
use std::str::FromStr;

use tch::Tensor;

use super::check;
use crate::{Error, Result};

/// Which estimator of KL(policy || reference) to use per sampled token.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub enum KlKind {
    /// `logp - ref` (verl `"kl"` / `"k1"`): unbiased, high variance, can be negative.
    #[serde(rename = "k1", alias = "kl")]
    K1,
    /// `0.5 (logp - ref)²` (verl `"mse"` / `"k2"`): low variance, biased.
    #[serde(rename = "k2", alias = "mse")]
    K2,
    /// `exp(ref - logp) - (ref - logp) - 1`, clamped to [-10, 10] (verl `"low_var_kl"` /
    /// `"k3"`): unbiased, non-negative, low variance. Agent-R1's KL loss.
    #[serde(rename = "low_var_kl", alias = "k3")]
    K3,
}

impl KlKind {
    /// verl's name for the estimator.
    pub fn as_str(self) -> &'static str {
        match self {
            KlKind::K1 => "k1",
            KlKind::K2 => "k2",
            KlKind::K3 => "low_var_kl",
        }
    }
}

impl fmt::Display for KlKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KlKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "kl" | "k1" => Ok(KlKind::K1),
            "mse" | "k2" => Ok(KlKind::K2),
            "low_var_kl" | "k3" => Ok(KlKind::K3),
            other => Err(Error::invalid(
                "kl_penalty",
                format!("unknown estimator {other:?}; expected kl/k1, mse/k2 or low_var_kl/k3"),
            )),
        }
    }
}

/// The per-token KL estimate, same shape as `logprob` and `ref_logprob` (any shape, e.g.
/// `[B, T]`).
///
/// Keeps `logprob`'s graph, so it serves both ways Agent-R1 uses it: subtracted (times a
/// coefficient) from the token rewards, or aggregated over the action tokens with
/// [`super::agg_loss`] and added to the policy loss. For K3 the log-ratio is clamped to ±20
/// before `exp` and the estimate to ±10, as verl, so one token where the policies disagree
/// wildly cannot blow the loss up.
pub fn kl_estimate(logprob: &Tensor, ref_logprob: &Tensor, kind: KlKind) -> Result<Tensor> {
    check::floating("logprob", logprob)?;
    check::floating("ref_logprob", ref_logprob)?;
    check::same_shape("ref_logprob", ref_logprob, "logprob", logprob)?;
    let reference = ref_logprob.detach().to_kind(logprob.kind());
    Ok(match kind {
        KlKind::K1 => logprob - &reference,
        KlKind::K2 => (logprob - &reference).square() * 0.5,
        KlKind::K3 => {
            let kl = (&reference - logprob).clamp(-20.0, 20.0);
            (kl.exp() - &kl - 1.0).clamp(-10.0, 10.0)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::agg::{agg_loss, LossAgg};
    use super::super::test_util::{assert_close, t2, values};
    use super::*;

    // logp - ref = [1, -1], i.e. ref - logp = [-1, 1].
    fn pair() -> (Tensor, Tensor) {
        (t2(&[&[-1.0, -2.0]]), t2(&[&[-2.0, -1.0]]))
    }

    #[test]
    fn k1_k2_k3() {
        let (lp, rf) = pair();
        assert_close(
            &kl_estimate(&lp, &rf, KlKind::K1).unwrap(),
            &[1.0, -1.0],
            1e-12,
        );
        // 0.5 * 1², 0.5 * (-1)²
        assert_close(
            &kl_estimate(&lp, &rf, KlKind::K2).unwrap(),
            &[0.5, 0.5],
            1e-12,
        );
        // e^-1 - (-1) - 1 = e^-1 = 0.367879; e^1 - 1 - 1 = e - 2 = 0.718282
        let e = [(-1f64).exp(), 1f64.exp() - 2.0];
        assert_close(&kl_estimate(&lp, &rf, KlKind::K3).unwrap(), &e, 1e-12);
    }

    #[test]
    fn k3_is_clamped() {
        // ref - logp = 5: e^5 - 6 = 142.4 -> 10; ref - logp = 30 -> exp of the clamped 20,
        // still -> 10; ref - logp = -30 -> clamped -20: e^-20 + 20 - 1 = 19.0... -> 10.
        let lp = t2(&[&[0.0, 0.0, 0.0]]);
        let rf = t2(&[&[5.0, 30.0, -30.0]]);
        assert_close(
            &kl_estimate(&lp, &rf, KlKind::K3).unwrap(),
            &[10.0, 10.0, 10.0],
            0.0,
        );
    }

    #[test]
    fn as_a_masked_loss_term_with_gradient() {
        let (lp, rf) = pair();
        let lp = lp.set_requires_grad(true);
        let mask = t2(&[&[1.0, 0.0]]);
        let kl = kl_estimate(&lp, &rf, KlKind::K3).unwrap();
        let loss = agg_loss(&kl, &mask, LossAgg::TokenMean).unwrap();
        // Only token 0: e^-1 / (1 + 1e-8)
        assert_close(&loss, &[(-1f64).exp() / (1.0 + 1e-8)], 1e-9);
        loss.backward();
        // d/dlogp [e^(ref - logp) - (ref - logp) - 1] = -e^(ref - logp) + 1 = 1 - e^-1
        let g = values(&lp.grad());
        assert!(
            (g[0] - (1.0 - (-1f64).exp()) / (1.0 + 1e-8)).abs() < 1e-9,
            "{g:?}"
        );
        assert_eq!(g[1], 0.0);
    }

    #[test]
    fn names() {
        assert_eq!("low_var_kl".parse::<KlKind>().unwrap(), KlKind::K3);
        assert_eq!("kl".parse::<KlKind>().unwrap(), KlKind::K1);
        assert_eq!("mse".parse::<KlKind>().unwrap(), KlKind::K2);
        assert!("full".parse::<KlKind>().is_err());
        let (lp, _) = pair();
        assert!(kl_estimate(&lp, &t2(&[&[0.0]]), KlKind::K1).is_err());
    }
}
