//! RL algorithms: advantage estimators, losses and batch filters, as pure functions on tch
//! tensors.
//!
//! The semantics follow verl's `core_algos.py` (which Agent-R1 trains with) so that runs are
//! comparable with the Python stack; where this module departs from it (degenerate masks,
//! empty sequences, tool tokens inside a response), the item's documentation says so and why.
//!
//! Conventions shared by every function:
//! - `B` is the batch (trajectories), `T` the response length in tokens, `S` the number of steps
//!   (model turns) of a trajectory, `V` the vocabulary, `N` a flat batch of sequences.
//! - A *mask* is a tensor of the same shape as the values it masks, of any kind (bool, integer or
//!   float); non-zero marks an *action* token (one the policy generated). Tool responses, chat
//!   template glue and padding are 0. Masked-out positions may hold anything, NaN included: they
//!   never reach a result.
//! - Advantage estimators run without autograd and return detached tensors; the losses keep the
//!   graph to their `log_prob` / `vpreds` input.
//! - Inconsistent inputs (shapes, kinds, devices, group ids) give [`crate::Error::Invalid`]
//!   naming the argument; nothing panics on a caller's shapes.

mod agg;
mod check;
mod entropy;
mod filter;
mod gae;
mod group;
mod kl;
mod masked;
mod policy_loss;
mod reinforce;
mod rollout_correction;
mod step_gae;
#[cfg(test)]
pub(crate) mod test_util;
mod value_loss;

pub use agg::{agg_loss, LossAgg};
pub use entropy::{entropy_from_log_probs, entropy_from_logits};
pub use filter::filter_zero_variance_groups;
pub use gae::gae;
pub use group::{broadcast_to_tokens, grpo_advantages, rloo_advantages, GRPO_EPS};
pub use kl::{kl_estimate, KlKind};
pub use masked::{masked_mean, masked_sum, masked_var, masked_whiten, WHITEN_EPS};
pub use policy_loss::{
    decoupled_ppo_policy_loss, decoupled_weight, ppo_policy_loss, weighted_ppo_policy_loss,
    PolicyLoss, PpoClip,
};
pub use reinforce::{reinforce_pp_advantages, reinforce_pp_baseline_advantages};
pub use rollout_correction::{
    correction, mismatch_stats, Correction, MismatchStats, RejectLevel, RolloutCorrection,
    WeightLevel,
};
pub use step_gae::{step_gae, step_index_map, StepIndex};
pub use value_loss::{value_loss, ValueLoss};
