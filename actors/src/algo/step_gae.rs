//! Step-level GAE: one decision per model turn instead of one per token.
//!
//! Representation. A trajectory (one batch row of `T` response tokens) is a sequence of `S`
//! steps, each a contiguous span of action tokens (one model turn) separated by tool responses.
//! Step quantities live in `[B, S]` tensors with a `step_mask` `[B, S]` (1 = the step exists;
//! trajectories with fewer turns are padded at the end), and `token_step` `[B, T]` (Int64)
//! says which step each token belongs to, -1 for tokens that are not actions.
//! [`step_index_map`] builds this from an action mask.

use tch::{Kind, Tensor};

use super::{check, gae::gae_recursion, masked};
use crate::{Error, Result};

/// Where each model turn of a batch of trajectories lies; see the module documentation.
#[derive(Debug)]
pub struct StepIndex {
    /// `[B, T]` Int64: the step of each token, -1 for a non-action token.
    pub token_step: Tensor,
    /// `[B, S]` Int64: the position of the first token of each step (0 for absent steps).
    pub first_token: Tensor,
    /// `[B, S]` Float (f32): 1 where the step exists.
    pub step_mask: Tensor,
}

impl StepIndex {
    /// The number of steps `S` (the most turns of any row).
    pub fn num_steps(&self) -> i64 {
        self.step_mask.size()[1]
    }

    /// Reads a per-token quantity `[B, T]` at the first token of each step: `[B, S]`, 0 for
    /// absent steps. For critic values this is the value of the state before the turn was
    /// generated, which is what step-level GAE needs.
    pub fn at_first_token(&self, per_token: &Tensor) -> Result<Tensor> {
        check::same_shape("per_token", per_token, "token_step", &self.token_step)?;
        let mask = check::mask_bool(&self.step_mask);
        let picked = per_token.gather(1, &self.first_token, false);
        Ok(picked.where_self(&mask, &picked.zeros_like()))
    }

    /// Sums a per-token quantity `[B, T]` (token rewards) over the tokens of each step:
    /// `[B, S]`. Values on non-action tokens are dropped.
    pub fn sum_per_step(&self, per_token: &Tensor) -> Result<Tensor> {
        check::floating("per_token", per_token)?;
        check::same_shape("per_token", per_token, "token_step", &self.token_step)?;
        let size = self.step_mask.size();
        let out = Tensor::zeros(&size, (per_token.kind(), per_token.device()));
        if size[1] == 0 {
            return Ok(out);
        }
        let on = self.token_step.ge(0);
        let src = per_token.where_self(&on, &per_token.zeros_like());
        Ok(out.scatter_add(1, &self.token_step.clamp_min(0), &src))
    }
}

/// Splits each row of `action_mask` `[B, T]` into steps: every maximal run of non-zero
/// positions is one step, numbered from 0 in order.
pub fn step_index_map(action_mask: &Tensor) -> Result<StepIndex> {
    let size = check::dims("action_mask", action_mask, 2)?;
    let (b, t) = (size[0], size[1]);
    let device = action_mask.device();
    let flat = Vec::<i64>::try_from(
        check::mask_bool(action_mask)
            .to_kind(Kind::Int64)
            .to_device(tch::Device::Cpu)
            .flatten(0, -1),
    )?;
    let mut token_step = vec![-1i64; flat.len()];
    let mut firsts: Vec<Vec<i64>> = Vec::with_capacity(b as usize);
    for row in 0..b as usize {
        let mut starts = Vec::new();
        let mut prev = false;
        for col in 0..t as usize {
            let on = flat[row * t as usize + col] != 0;
            if on && !prev {
                starts.push(col as i64);
            }
            if on {
                token_step[row * t as usize + col] = starts.len() as i64 - 1;
            }
            prev = on;
        }
        firsts.push(starts);
    }
    let s = firsts.iter().map(Vec::len).max().unwrap_or(0);
    let mut first_token = vec![0i64; b as usize * s];
    let mut step_mask = vec![0f32; b as usize * s];
    for (row, starts) in firsts.iter().enumerate() {
        for (k, start) in starts.iter().enumerate() {
            first_token[row * s + k] = *start;
            step_mask[row * s + k] = 1.0;
        }
    }
    let s = s as i64;
    Ok(StepIndex {
        token_step: Tensor::from_slice(&token_step)
            .reshape([b, t])
            .to_device(device),
        first_token: Tensor::from_slice(&first_token)
            .reshape([b, s])
            .to_device(device),
        step_mask: Tensor::from_slice(&step_mask)
            .reshape([b, s])
            .to_device(device),
    })
}

/// Step-level GAE; returns per-token `(advantages, returns)` `[B, T]`.
///
/// `step_rewards`, `step_values` and `step_mask` are `[B, S]`: the reward of each turn (the sum
/// of its token rewards, see [`StepIndex::sum_per_step`]), the critic's value read at the
/// turn's first generated token ([`StepIndex::at_first_token`]), and which steps exist.
/// `token_step` `[B, T]` maps tokens to steps (-1 = not an action token). GAE runs over the
/// steps of each trajectory (`delta_s = r_s + gamma V_{s+1} - V_s`, the step after the last
/// having value 0), then each step's advantage and return (`A_s + V_s`) are broadcast to its
/// tokens; non-action tokens get 0.
///
/// With `whiten`, advantages are whitened over the existing steps, not over tokens, as
/// Agent-R1 does, so that a long turn does not weigh more in the statistics than a short one.
/// (Agent-R1 divides by `std + 1e-8`; this uses verl's `rsqrt(var + 1e-8)` like every other
/// whitening here, a difference far below the noise of the estimate.)
pub fn step_gae(
    step_rewards: &Tensor,
    step_values: &Tensor,
    step_mask: &Tensor,
    token_step: &Tensor,
    gamma: f64,
    lambda: f64,
    whiten: bool,
) -> Result<(Tensor, Tensor)> {
    check::floating("step_rewards", step_rewards)?;
    let steps = check::dims("step_rewards", step_rewards, 2)?;
    check::floating("step_values", step_values)?;
    check::same_shape("step_values", step_values, "step_rewards", step_rewards)?;
    check::same_shape("step_mask", step_mask, "step_rewards", step_rewards)?;
    let tokens = check::dims("token_step", token_step, 2)?;
    check::same_device("token_step", token_step, "step_rewards", step_rewards)?;
    if token_step.kind() != Kind::Int64 {
        return Err(Error::invalid(
            "token_step",
            format!("expected Int64 step indices, got {:?}", token_step.kind()),
        ));
    }
    if tokens[0] != steps[0] {
        return Err(Error::invalid(
            "token_step",
            format!(
                "has {} rows but `step_rewards` has {} (shapes {tokens:?} and {steps:?})",
                tokens[0], steps[0]
            ),
        ));
    }
    check::param("gamma", gamma, gamma >= 0.0, "a finite number >= 0")?;
    check::param("lambda", lambda, lambda >= 0.0, "a finite number >= 0")?;
    let kind = step_rewards.kind();
    let device = step_rewards.device();
    if tokens[1] > 0 {
        let hi = token_step.max().int64_value(&[]);
        let lo = token_step.min().int64_value(&[]);
        if lo < -1 || hi >= steps[1] {
            return Err(Error::invalid(
                "token_step",
                format!(
                    "holds steps in [{lo}, {hi}]; expected -1 or 0..{}",
                    steps[1]
                ),
            ));
        }
        if hi >= 0 {
            let on = token_step.ge(0);
            let exists = check::mask_bool(step_mask).gather(1, &token_step.clamp_min(0), false);
            let orphans = on.logical_and(&exists.logical_not()).any().int64_value(&[]);
            if orphans != 0 {
                return Err(Error::invalid(
                    "token_step",
                    "maps tokens to a step that `step_mask` marks absent",
                ));
            }
        }
    }
    if steps[1] == 0 {
        let z = Tensor::zeros(&tokens, (kind, device));
        return Ok((z.shallow_clone(), z));
    }
    Ok(tch::no_grad(|| {
        let rewards = step_rewards.detach();
        let values = step_values.detach().to_kind(kind);
        let raw = gae_recursion(&rewards, &values, step_mask, gamma, lambda);
        let step_returns = masked::select(&(&raw + &values), step_mask);
        let step_adv = if whiten {
            masked::masked_whiten_unchecked(&raw, step_mask)
        } else {
            raw
        };
        let on = token_step.ge(0);
        let idx = token_step.clamp_min(0);
        let spread = |per_step: &Tensor| {
            let g = per_step.gather(1, &idx, false);
            g.where_self(&on, &g.zeros_like())
        };
        (spread(&step_adv), spread(&step_returns))
    }))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, t2, values, whiten_ref};
    use super::*;

    // Row 0: two turns, tokens [0, 1] and [4, 5], tool response at [2, 3], padding [6, 7].
    // Row 1: one turn, tokens [0, 2].
    fn action_mask() -> Tensor {
        t2(&[
            &[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0],
            &[1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ])
    }

    #[test]
    fn index_map_finds_turns() {
        let ix = step_index_map(&action_mask()).unwrap();
        assert_eq!(ix.num_steps(), 2);
        assert_eq!(
            values(&ix.token_step),
            vec![0., 0., -1., -1., 1., 1., -1., -1., 0., 0., 0., -1., -1., -1., -1., -1.]
        );
        assert_eq!(values(&ix.first_token), vec![0., 4., 0., 0.]);
        assert_eq!(values(&ix.step_mask), vec![1., 1., 1., 0.]);
        // Values read at the first token of each turn: row 0 positions 0 and 4, row 1 position 0.
        let v = t2(&[
            &[0.5, 0.1, 9.0, 9.0, 0.7, 0.1, 0.0, 0.0],
            &[0.2, 0.3, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0],
        ]);
        assert_close(&ix.at_first_token(&v).unwrap(), &[0.5, 0.7, 0.2, 0.0], 0.0);
        // Token rewards summed per turn; the 5 on a tool token is dropped.
        let r = t2(&[
            &[0.0, 0.25, 5.0, 0.0, 0.0, 1.0, 0.0, 0.0],
            &[0.1, 0.1, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0],
        ]);
        assert_close(&ix.sum_per_step(&r).unwrap(), &[0.25, 1.0, 0.5, 0.0], 1e-12);
    }

    fn inputs() -> (Tensor, Tensor, Tensor, Tensor) {
        let ix = step_index_map(&action_mask()).unwrap();
        let rewards = t2(&[&[0.0, 1.0], &[0.5, 0.0]]);
        // Row 1's second step is absent: its value 5 must be ignored.
        let values = t2(&[&[0.5, 0.7], &[0.2, 5.0]]);
        let step_mask = ix.step_mask.to_kind(Kind::Double);
        (rewards, values, step_mask, ix.token_step)
    }

    // gamma 0.9, lambda 0.5 over steps:
    // row 0, s1: delta = 1 + 0 - 0.7 = 0.3;           A = 0.3,   R = 1.0
    //        s0: delta = 0 + 0.9*0.7 - 0.5 = 0.13;    A = 0.13 + 0.45*0.3 = 0.265, R = 0.765
    // row 1, s1 absent; s0: delta = 0.5 + 0 - 0.2 = 0.3; A = 0.3, R = 0.5
    #[test]
    fn broadcast_to_turn_tokens() {
        let (r, v, sm, ts) = inputs();
        let (adv, ret) = step_gae(&r, &v, &sm, &ts, 0.9, 0.5, false).unwrap();
        let a = [
            0.265, 0.265, 0., 0., 0.3, 0.3, 0., 0., 0.3, 0.3, 0.3, 0., 0., 0., 0., 0.,
        ];
        let rr = [
            0.765, 0.765, 0., 0., 1.0, 1.0, 0., 0., 0.5, 0.5, 0.5, 0., 0., 0., 0., 0.,
        ];
        assert_close(&adv, &a, 1e-12);
        assert_close(&ret, &rr, 1e-12);
    }

    #[test]
    fn whitened_over_steps_not_tokens() {
        let (r, v, sm, ts) = inputs();
        let (adv, _) = step_gae(&r, &v, &sm, &ts, 0.9, 0.5, true).unwrap();
        // Statistics over the three steps [0.265, 0.3, 0.3] (row 1's three tokens count once).
        let w = whiten_ref(&[0.265, 0.3, 0.3]);
        let e = [
            w[0], w[0], 0., 0., w[1], w[1], 0., 0., w[2], w[2], w[2], 0., 0., 0., 0., 0.,
        ];
        assert_close(&adv, &e, 1e-6);
    }

    #[test]
    fn rejects_inconsistent_maps() {
        let (r, v, sm, _) = inputs();
        let out_of_range = Tensor::from_slice(&[0i64, 2, -1, 0]).reshape([2, 2]);
        let err = step_gae(&r, &v, &sm, &out_of_range, 1.0, 1.0, false).unwrap_err();
        assert!(err.to_string().contains("token_step"), "{err}");
        // Row 1 token mapped to its absent step 1.
        let orphan = Tensor::from_slice(&[0i64, 1, 0, 1]).reshape([2, 2]);
        let err = step_gae(&r, &v, &sm, &orphan, 1.0, 1.0, false).unwrap_err();
        assert!(err.to_string().contains("absent"), "{err}");
        let float_map = Tensor::from_slice(&[0.0f64, 1.0, 0.0, 0.0]).reshape([2, 2]);
        assert!(step_gae(&r, &v, &sm, &float_map, 1.0, 1.0, false).is_err());
        let three_rows = Tensor::zeros([3, 2], (Kind::Int64, tch::Device::Cpu));
        assert!(step_gae(&r, &v, &sm, &three_rows, 1.0, 1.0, false).is_err());
    }
}
