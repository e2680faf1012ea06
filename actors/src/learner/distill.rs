//! On-policy distillation: a frozen teacher scores the tokens the student sampled, and the
//! per-token reverse KL `log π_student(a) - log π_teacher(a)` becomes (part of) each token's
//! advantage, with no discounting: each token is credited with its own term, as in on-policy
//! distillation (Agarwal et al. 2024; Thinking Machines 2025).

use std::path::PathBuf;

use agent_r1_envs::config::{ConfigError, Section};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use crate::algo;
use crate::Result;

/// How the distillation advantage meets the configured estimator's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DistillCombine {
    /// The advantage is the distillation term alone: the reward is recorded but not trained
    /// on, and groups are not filtered by reward variance.
    #[default]
    Alone,
    /// The distillation term is added to the estimator's advantages.
    WithReward,
}

impl DistillCombine {
    /// The name used in configs and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            DistillCombine::Alone => "alone",
            DistillCombine::WithReward => "with_reward",
        }
    }
}

/// `[distill]`: on-policy distillation from a teacher model with the policy's tokenizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DistillConfig {
    /// The teacher: a model directory of any supported family with the policy's tokenizer
    /// and vocabulary. It is frozen and runs on the learner's device.
    pub teacher: PathBuf,
    /// Coefficient of the per-token reverse KL in the advantage.
    #[serde(default = "default_coef")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub coef: f64,
    /// `alone` (the advantage is the distillation term) or `with_reward` (added to the
    /// estimator's advantages).
    #[serde(default)]
    pub combine: DistillCombine,
}

fn default_coef() -> f64 {
    1.0
}

impl Section for DistillConfig {
    fn rules(&self) -> std::result::Result<(), ConfigError> {
        if !(self.coef.is_finite() && self.coef > 0.0) {
            return Err(ConfigError::range(
                "coef",
                self.coef,
                "> 0 (remove [distill] to train without a teacher)",
            ));
        }
        Ok(())
    }
}

/// The per-token reverse KL `student - teacher` at `mask`'s tokens (0 elsewhere), and the
/// distillation advantage `-coef * KL` there.
pub(crate) fn reverse_kl_advantage(
    student_logprobs: &Tensor,
    teacher_logprobs: &Tensor,
    mask: &Tensor,
    coef: f64,
) -> Result<(Tensor, Tensor)> {
    let k = algo::kl_estimate(student_logprobs, teacher_logprobs, algo::KlKind::K1)?
        .to_kind(Kind::Float);
    let k = k.where_self(&mask.ne(0), &k.zeros_like());
    let advantage = &k * -coef;
    Ok((k, advantage))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::test_util::{assert_close, t2};

    #[test]
    fn advantage_is_minus_coef_times_student_minus_teacher_on_masked_tokens() {
        let student = t2(&[&[-1.0, -2.0, -0.5], &[-3.0, -0.1, -0.2]]);
        let teacher = t2(&[&[-1.5, -1.0, -0.5], &[-0.5, -0.3, -9.0]]);
        let mask = t2(&[&[0.0, 1.0, 1.0], &[1.0, 1.0, 0.0]]);
        let (k, adv) = reverse_kl_advantage(&student, &teacher, &mask, 0.5).unwrap();
        let want_k = [0.0, -1.0, 0.0, -2.5, 0.2, 0.0];
        assert_close(&k, &want_k, 1e-6);
        assert_close(&adv, &want_k.map(|k| -0.5 * k), 1e-6);
    }

    #[test]
    fn coef_must_be_positive() {
        let c = DistillConfig {
            teacher: "t".into(),
            coef: 0.0,
            combine: DistillCombine::Alone,
        };
        let e = c.rules().unwrap_err().to_string();
        assert!(e.contains("coef") && e.contains("> 0"), "{e}");
    }
}
