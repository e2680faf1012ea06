//! Token-level GAE over the action tokens of multi-turn trajectories.

use tch::Tensor;

use super::{check, masked};
use crate::Result;

/// Token-level generalised advantage estimation; returns `(advantages, returns)`, both `[B, T]`.
///
/// `rewards`, `values` and `mask` are `[B, T]`; `values[b, t]` is the critic's value of the
/// state before token `t`. The recursion runs backwards over the *action* tokens only: a
/// position with mask 0 (a tool response between two model turns, padding) neither adds a TD
/// error nor resets the running estimate, so the "next value" of the last token of a turn is the
/// value of the first token of the next turn. This is Agent-R1's legacy GAE (now also in
/// verl): tool tokens are the environment's move, not a step of the policy, and discounting
/// across them would make credit depend on the length of a search result. A reward placed on a
/// masked position is therefore ignored: put outcome rewards on the last action token.
///
/// `returns = advantages + values` (before whitening) are the critic's targets. With
/// `whiten`, the advantages are whitened over all masked tokens of the batch (verl always does
/// this for GAE). Both outputs are 0 outside the mask (verl leaves carried values there).
pub fn gae(
    rewards: &Tensor,
    values: &Tensor,
    mask: &Tensor,
    gamma: f64,
    lambda: f64,
    whiten: bool,
) -> Result<(Tensor, Tensor)> {
    check::floating("rewards", rewards)?;
    check::dims("rewards", rewards, 2)?;
    check::floating("values", values)?;
    check::same_shape("values", values, "rewards", rewards)?;
    check::same_shape("mask", mask, "rewards", rewards)?;
    check::param("gamma", gamma, gamma >= 0.0, "a finite number >= 0")?;
    check::param("lambda", lambda, lambda >= 0.0, "a finite number >= 0")?;
    Ok(tch::no_grad(|| {
        let rewards = rewards.detach();
        let values = values.detach().to_kind(rewards.kind());
        let raw = gae_recursion(&rewards, &values, mask, gamma, lambda);
        let returns = masked::select(&(&raw + &values), mask);
        let advantages = if whiten {
            masked::masked_whiten_unchecked(&raw, mask)
        } else {
            raw
        };
        (advantages, returns)
    }))
}

/// The backward GAE recursion over `[B, L]` (tokens or steps) that skips masked positions;
/// shapes already checked. Returns the raw advantages, 0 where the mask is 0.
pub(crate) fn gae_recursion(
    rewards: &Tensor,
    values: &Tensor,
    mask: &Tensor,
    gamma: f64,
    lambda: f64,
) -> Tensor {
    let size = rewards.size();
    let (b, len) = (size[0], size[1]);
    let on = check::mask_bool(mask);
    let zeros = Tensor::zeros([b], (rewards.kind(), rewards.device()));
    let mut next_value = zeros.shallow_clone();
    let mut last_gae = zeros.shallow_clone();
    let mut columns = Vec::with_capacity(len as usize);
    for t in (0..len).rev() {
        let (r, v, m) = (rewards.select(1, t), values.select(1, t), on.select(1, t));
        let delta = r + &next_value * gamma - &v;
        let gae_t = delta + &last_gae * (gamma * lambda);
        // `where` rather than verl's `x * m + (1 - m) * y`: a NaN value on a tool token must
        // not leak into the recursion.
        next_value = v.where_self(&m, &next_value);
        last_gae = gae_t.where_self(&m, &last_gae);
        columns.push(last_gae.where_self(&m, &zeros));
    }
    columns.reverse();
    if columns.is_empty() {
        return rewards.zeros_like();
    }
    Tensor::stack(&columns, 1)
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, t2, whiten_ref};
    use super::*;

    // One trajectory: action span [0, 1], tool response [2, 3] (values 9 there must be
    // skipped), action span [4, 5], outcome reward 1 on the last token.
    fn holey() -> (Tensor, Tensor, Tensor) {
        let rewards = t2(&[&[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]]);
        let values = t2(&[&[0.5, 0.6, 9.0, 9.0, 0.7, 0.8]]);
        let mask = t2(&[&[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]]);
        (rewards, values, mask)
    }

    // gamma 0.9, lambda 0.5 (gamma * lambda = 0.45), backwards:
    // t5: delta = 1 + 0.9*0 - 0.8 = 0.2;          A5 = 0.2
    // t4: delta = 0 + 0.9*0.8 - 0.7 = 0.02;       A4 = 0.02 + 0.45*0.2 = 0.11
    // t3, t2: tool tokens, skipped
    // t1: delta = 0 + 0.9*0.7 - 0.6 = 0.03;       A1 = 0.03 + 0.45*0.11 = 0.0795
    //     (next value is t4's 0.7, not t2's 9)
    // t0: delta = 0 + 0.9*0.6 - 0.5 = 0.04;       A0 = 0.04 + 0.45*0.0795 = 0.075775
    const RAW: [f64; 6] = [0.075775, 0.0795, 0.0, 0.0, 0.11, 0.2];

    #[test]
    fn skips_tool_tokens() {
        let (r, v, m) = holey();
        let (adv, ret) = gae(&r, &v, &m, 0.9, 0.5, false).unwrap();
        assert_close(&adv, &RAW, 1e-12);
        // returns = A + V on action tokens: 0.575775, 0.6795, 0.81, 1.0
        assert_close(&ret, &[0.575775, 0.6795, 0.0, 0.0, 0.81, 1.0], 1e-12);
    }

    #[test]
    fn whitened_over_action_tokens() {
        let (r, v, m) = holey();
        let (adv, _) = gae(&r, &v, &m, 0.9, 0.5, true).unwrap();
        let w = whiten_ref(&[RAW[0], RAW[1], RAW[4], RAW[5]]);
        assert_close(&adv, &[w[0], w[1], 0.0, 0.0, w[2], w[3]], 1e-6);
    }

    #[test]
    fn gamma_lambda_one_is_reward_to_go_minus_value() {
        // gamma = lambda = 1: A_t = sum of later rewards - V_t. Two rows, the second padded.
        let r = t2(&[&[0.0, 1.0, 2.0], &[3.0, 0.0, 0.0]]);
        let v = t2(&[&[0.5, 0.5, 0.5], &[1.0, f64::NAN, f64::NAN]]);
        let m = t2(&[&[1.0, 1.0, 1.0], &[1.0, 0.0, 0.0]]);
        let (adv, ret) = gae(&r, &v, &m, 1.0, 1.0, false).unwrap();
        // row 0: 3 - 0.5, 3 - 0.5, 2 - 0.5; row 1: 3 - 1, pads 0 (NaN values ignored)
        assert_close(&adv, &[2.5, 2.5, 1.5, 2.0, 0.0, 0.0], 1e-12);
        assert_close(&ret, &[3.0, 3.0, 2.0, 3.0, 0.0, 0.0], 1e-12);
    }

    #[test]
    fn rejects_mismatched_values() {
        let (r, _, m) = holey();
        let v = t2(&[&[0.0; 5]]);
        let err = gae(&r, &v, &m, 1.0, 1.0, true).unwrap_err().to_string();
        assert!(
            err.starts_with("values:") && err.contains("[1, 5]"),
            "{err}"
        );
        assert!(gae(&r, &r, &m, f64::NAN, 1.0, true).is_err());
    }
}
