//! Dispatch from the configured estimator to the `algo` functions, on the batch layout.

use tch::{Kind, Tensor};

use super::config::{Estimator, LearnerConfig};
use crate::algo;
use crate::{Error, Result};

/// Advantages `[B, L]` and, for critic-based estimators, the critic's targets `[B, L]`.
///
/// `rewards` are the per-token rewards (KL penalty already subtracted when it goes in the
/// reward), `scores` `[B]` the per-trajectory sums group estimators compare, `values` the
/// critic's values `[B, L]` at rollout time (required by `gae` and `step_gae`).
pub(crate) fn estimate(
    config: &LearnerConfig,
    rewards: &Tensor,
    mask: &Tensor,
    scores: &Tensor,
    group_ids: &[i64],
    values: Option<&Tensor>,
) -> Result<(Tensor, Option<Tensor>)> {
    let need_values = || {
        values.ok_or_else(|| {
            Error::invalid(
                "estimator",
                format!(
                    "`{}` needs a critic: load the policy with a value head or give a critic",
                    config.algorithm.estimator.as_str()
                ),
            )
        })
    };
    let (gamma, lambda) = (config.algorithm.gamma, config.algorithm.lambda);
    Ok(match config.algorithm.estimator {
        Estimator::Gae => {
            let (adv, ret) = algo::gae(rewards, need_values()?, mask, gamma, lambda, true)?;
            (adv, Some(ret))
        }
        Estimator::StepGae => {
            let index = algo::step_index_map(mask)?;
            let step_rewards = index.sum_per_step(rewards)?;
            let step_values = index.at_first_token(&need_values()?.to_kind(Kind::Float))?;
            let (adv, ret) = algo::step_gae(
                &step_rewards,
                &step_values,
                &index.step_mask,
                &index.token_step,
                gamma,
                lambda,
                true,
            )?;
            (adv, Some(ret))
        }
        Estimator::Grpo => {
            let per_seq =
                algo::grpo_advantages(scores, group_ids, config.algorithm.grpo_norm_by_std)?;
            (algo::broadcast_to_tokens(&per_seq, mask)?, None)
        }
        Estimator::Rloo => {
            let per_seq = algo::rloo_advantages(scores, group_ids)?;
            (algo::broadcast_to_tokens(&per_seq, mask)?, None)
        }
        Estimator::ReinforcePp => (algo::reinforce_pp_advantages(rewards, mask, gamma)?.0, None),
        Estimator::ReinforcePpBaseline => (
            algo::reinforce_pp_baseline_advantages(scores, group_ids, mask)?,
            None,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learner::{AlgorithmConfig, KlConfig};

    fn t(rows: &[&[f32]]) -> Tensor {
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_slice(&flat).view([rows.len() as i64, rows[0].len() as i64])
    }

    #[test]
    fn grpo_broadcasts_group_advantages_to_action_tokens() {
        let mask = t(&[&[0., 1., 1.], &[1., 0., 0.]]);
        let rewards = t(&[&[0., 0., 1.], &[0., 0., 0.]]);
        let scores = Tensor::from_slice(&[1.0f32, 0.0]);
        let config = LearnerConfig {
            algorithm: AlgorithmConfig {
                estimator: Estimator::Grpo,
                grpo_norm_by_std: false,
                kl: KlConfig::OFF,
                critic_warmup_updates: 0,
                ..Default::default()
            },
            ..crate::learner::config::fixture()
        };
        let (adv, ret) = estimate(&config, &rewards, &mask, &scores, &[0, 0], None).unwrap();
        assert!(ret.is_none());
        let adv = Vec::<f32>::try_from(adv.view([-1])).unwrap();
        assert_eq!(adv, vec![0.0, 0.5, 0.5, -0.5, 0.0, 0.0]);
    }

    #[test]
    fn critic_estimators_demand_values() {
        let mask = t(&[&[1., 1.]]);
        let scores = Tensor::from_slice(&[1.0f32]);
        for estimator in [Estimator::Gae, Estimator::StepGae] {
            let config = LearnerConfig {
                algorithm: AlgorithmConfig {
                    estimator,
                    kl: KlConfig::OFF,
                    critic_warmup_updates: 0,
                    ..Default::default()
                },
                ..crate::learner::config::fixture()
            };
            let err = estimate(&config, &mask, &mask, &scores, &[0], None).unwrap_err();
            assert!(err.to_string().contains("critic"), "{err}");
            let values = t(&[&[0.25, 0.5]]);
            let (_, ret) = estimate(&config, &mask, &mask, &scores, &[0], Some(&values)).unwrap();
            assert!(ret.is_some());
        }
    }
}
