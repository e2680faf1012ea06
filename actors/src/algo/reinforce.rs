//! REINFORCE++ (critic-free discounted returns, whitened over the batch) and its grouped
//! baseline variant.

use tch::Tensor;

use super::check::{self, Groups};
use super::masked;
use crate::{Error, Result};

/// REINFORCE++ advantages and returns, both `[B, T]`, from token rewards `rewards` `[B, T]`.
///
/// `returns[t] = r[t] + gamma * returns[next action token]`, running backwards over the action
/// tokens of `mask` only; the advantages are the returns whitened over all masked tokens of
/// the batch. Both are 0 outside the mask.
///
/// verl instead *resets* the running return at every masked position ("reset after EOS").
/// For a single-turn response, whose mask is ones then padding, that is the same thing; in a
/// multi-turn trajectory it would cut every tool response's preceding turns off from the
/// outcome reward, so here tool tokens are skipped as in [`super::gae`] (with values 0 and
/// `lambda = 1`, GAE's returns equal these). Rewards on masked positions are ignored.
pub fn reinforce_pp_advantages(
    rewards: &Tensor,
    mask: &Tensor,
    gamma: f64,
) -> Result<(Tensor, Tensor)> {
    check::floating("rewards", rewards)?;
    let size = check::dims("rewards", rewards, 2)?;
    check::same_shape("mask", mask, "rewards", rewards)?;
    check::param("gamma", gamma, gamma >= 0.0, "a finite number >= 0")?;
    Ok(tch::no_grad(|| {
        let rewards = rewards.detach();
        let on = check::mask_bool(mask);
        let zeros = Tensor::zeros([size[0]], (rewards.kind(), rewards.device()));
        let mut running = zeros.shallow_clone();
        let mut columns = Vec::with_capacity(size[1] as usize);
        for t in (0..size[1]).rev() {
            let m = on.select(1, t);
            let updated = rewards.select(1, t) + &running * gamma;
            running = updated.where_self(&m, &running);
            columns.push(running.where_self(&m, &zeros));
        }
        columns.reverse();
        let returns = if columns.is_empty() {
            rewards.zeros_like()
        } else {
            Tensor::stack(&columns, 1)
        };
        let advantages = masked::masked_whiten_unchecked(&returns, mask);
        (advantages, returns)
    }))
}

/// REINFORCE++-baseline advantages `[N, T]` from outcome `scores` `[N]`, their group ids and
/// the action mask `[N, T]`.
///
/// The group mean is subtracted from each score (a lone sample keeps its score, as verl), the
/// result is broadcast to the sample's action tokens and whitened over all action tokens of the
/// batch, as verl's `compute_reinforce_plus_plus_baseline_outcome_advantage`: the group
/// baseline removes the prompt's difficulty, the batch whitening fixes the scale.
pub fn reinforce_pp_baseline_advantages(
    scores: &Tensor,
    group_ids: &[i64],
    mask: &Tensor,
) -> Result<Tensor> {
    check::floating("scores", scores)?;
    let groups = Groups::new("scores", scores, group_ids)?;
    let size = check::dims("mask", mask, 2)?;
    check::same_device("mask", mask, "scores", scores)?;
    if size[0] != group_ids.len() as i64 {
        return Err(Error::invalid(
            "mask",
            format!(
                "has {} rows but `scores` has {} elements (shape {size:?})",
                size[0],
                group_ids.len()
            ),
        ));
    }
    Ok(tch::no_grad(|| {
        let scores = scores.detach();
        let centered = &scores - groups.sample_means(&scores);
        let tiled = masked::select(&centered.unsqueeze(-1).expand(&size, false), mask);
        masked::masked_whiten_unchecked(&tiled, mask)
    }))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, t1, t2, whiten_ref};
    use super::*;

    #[test]
    fn returns_skip_tool_tokens() {
        // Row 0: two turns around a tool response, reward 1 at the end.
        // Row 1: one turn then padding; the 7 on a padding token is ignored.
        let r = t2(&[
            &[0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
            &[0.0, 0.0, 1.0, 0.0, 7.0, 0.0],
        ]);
        let m = t2(&[
            &[1.0, 1.0, 0.0, 0.0, 1.0, 1.0],
            &[1.0, 1.0, 1.0, 0.0, 0.0, 0.0],
        ]);
        let (adv, ret) = reinforce_pp_advantages(&r, &m, 0.5).unwrap();
        // gamma 0.5, row 0 backwards over action tokens: t5 1, t4 0.5, t1 0.25, t0 0.125
        // row 1: t2 1, t1 0.5, t0 0.25
        let e = [0.125, 0.25, 0., 0., 0.5, 1.0, 0.25, 0.5, 1.0, 0., 0., 0.];
        assert_close(&ret, &e, 1e-12);
        let w = whiten_ref(&[0.125, 0.25, 0.5, 1.0, 0.25, 0.5, 1.0]);
        let ea = [w[0], w[1], 0., 0., w[2], w[3], w[4], w[5], w[6], 0., 0., 0.];
        assert_close(&adv, &ea, 1e-6);
    }

    #[test]
    fn baseline_subtracts_group_mean_then_whitens() {
        // Group 1: scores 1, 0 (mean 0.5) -> 0.5, -0.5; group 2 alone: 3 (mean 0 as verl).
        let s = t1(&[1.0, 0.0, 3.0]);
        let m = t2(&[&[1.0, 1.0, 0.0], &[1.0, 0.0, 0.0], &[1.0, 1.0, 1.0]]);
        let adv = reinforce_pp_baseline_advantages(&s, &[1, 1, 2], &m).unwrap();
        // Token values 0.5, 0.5 | -0.5 | 3, 3, 3 whitened together.
        let w = whiten_ref(&[0.5, 0.5, -0.5, 3.0, 3.0, 3.0]);
        let e = [w[0], w[1], 0.0, w[2], 0.0, 0.0, w[3], w[4], w[5]];
        assert_close(&adv, &e, 1e-6);
    }

    #[test]
    fn rejects_bad_shapes() {
        let s = t1(&[1.0, 0.0]);
        let m = t2(&[&[1.0, 1.0, 0.0]]);
        let err = reinforce_pp_baseline_advantages(&s, &[1, 1], &m).unwrap_err();
        assert!(err.to_string().starts_with("mask:"), "{err}");
        assert!(reinforce_pp_advantages(&s, &s, 1.0).is_err());
    }
}
