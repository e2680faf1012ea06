//! The learner across ranks: every rank holds the whole batch and the same weights, trains
//! its share of each mini-batch's rows (balanced by tokens), and the ranks sum their
//! gradients before each optimizer step, so one update equals the single-process update up
//! to float rounding. The no-grad pass before the update is split the same way and its
//! results summed (each row is computed on one rank, zero elsewhere).
//!
//! [`ShardMode::Replicated`] keeps the whole optimizer on every rank (plain data parallel);
//! [`ShardMode::OptimizerState`] gives each parameter one owning rank that holds its float32
//! master and AdamW moments and steps it, then broadcasts the new weights (ZeRO-1): each
//! rank holds about `1/ranks` of the optimizer's memory. [`ShardMode::Parameters`] also
//! shards the decoder layers' parameters and gradients with the same owners (FSDP style):
//! a layer is gathered just before it runs and released after, its gradients reduced to
//! their owners right after its backward pass (see `layer_shards`).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::optim::ParamOptimizer;
use crate::process_group::{GroupSpec, ProcessGroup, ReduceOp};
use crate::{Error, Result};

/// Gradient elements reduced per collective: one float32 copy of this many elements at a
/// time.
const BUCKET: i64 = 1 << 24;

/// What every rank keeps of the optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ShardMode {
    /// The whole optimizer state on every rank; gradients all-reduced.
    Replicated,
    /// Each parameter's master and moments on one rank (ZeRO-1); gradients all-reduced, the
    /// owner steps and broadcasts the parameter.
    OptimizerState,
    /// As `OptimizerState`, and each decoder layer's parameters and gradients held by their
    /// owner only: gathered per layer before use, gradients reduced per layer after its
    /// backward pass (FSDP style; needs `memory.recompute`). Rank 0 keeps the whole weights
    /// to publish them.
    Parameters,
}

impl ShardMode {
    /// The name used in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Replicated => "replicated",
            Self::OptimizerState => "optimizer_state",
            Self::Parameters => "parameters",
        }
    }

    /// Whether each parameter's optimizer state lives on one rank.
    pub fn shards_optimizer(self) -> bool {
        matches!(self, Self::OptimizerState | Self::Parameters)
    }
}

/// How a learner joins its ranks: where they meet, which rank it is, how they shard.
#[derive(Debug, Clone)]
pub struct RankJoin {
    /// The group's rendezvous, this rank, the rank count and the timeout.
    pub spec: GroupSpec,
    /// Replicated or sharded optimizer state.
    pub mode: ShardMode,
}

impl RankJoin {
    /// Joins the group (waits up to its timeout for every rank).
    pub fn group(&self) -> Result<ProcessGroup> {
        ProcessGroup::join(&self.spec)
    }
}

/// What rank 0 tells the other ranks to do (see [`Ranks::lead`] and
/// `Learner::follow`): each is a collective the followers then run with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// The learner is done: followers return.
    Stop = 0,
    /// Train on the batch in the payload (JSON trajectories).
    Update = 1,
    /// Write the optimizer state to the path in the payload (rank 0 writes).
    SaveOptimizer = 2,
    /// Restore the optimizer state from the path in the payload.
    LoadOptimizer = 3,
    /// Nothing to do: rank 0 is idle (between updates), and says so before the followers'
    /// wait would pass the group's timeout.
    Idle = 4,
}

/// A learner's process group and how it shards.
#[derive(Debug)]
pub(crate) struct Ranks {
    pub(crate) group: Arc<ProcessGroup>,
    pub(crate) mode: ShardMode,
}

impl Ranks {
    /// Rank 0 sends an order and its payload to every other rank.
    pub(crate) fn lead(&self, order: Order, payload: &[u8]) -> Result<()> {
        let mut header = Tensor::from_slice(&[order as i64, payload.len() as i64]);
        self.group.broadcast(&mut header, 0, "the leader's order")?;
        if !payload.is_empty() {
            let mut bytes = Tensor::from_slice(payload);
            self.group.broadcast(&mut bytes, 0, "the leader's order")?;
        }
        Ok(())
    }

    /// A follower waits for rank 0's next order (up to the group's timeout: a leader that
    /// trains slower than that ends its followers).
    pub(crate) fn next_order(&self) -> Result<(Order, Vec<u8>)> {
        let mut header = Tensor::from_slice(&[0i64, 0]);
        self.group.broadcast(&mut header, 0, "the leader's order")?;
        let v = Vec::<i64>::try_from(&header)?;
        let order = match v[0] {
            0 => Order::Stop,
            1 => Order::Update,
            2 => Order::SaveOptimizer,
            3 => Order::LoadOptimizer,
            4 => Order::Idle,
            other => {
                return Err(Error::Other(format!(
                "learner rank {}: rank 0 sent unknown order {other} (ranks of different builds?)",
                self.group.rank()
            )))
            }
        };
        let mut payload = Vec::new();
        if v[1] > 0 {
            let mut bytes = Tensor::zeros([v[1]], (Kind::Uint8, tch::Device::Cpu));
            self.group.broadcast(&mut bytes, 0, "the leader's order")?;
            payload = Vec::<u8>::try_from(&bytes)?;
        }
        Ok((order, payload))
    }

    /// This rank's rows of `rows` (indices into a batch whose row `i` has `lengths[i]`
    /// tokens): longest first, each row to the rank with the fewest tokens so far (ties to
    /// the lower rank), so the ranks finish together; returned in `rows`' order. Every rank
    /// computes the same split.
    pub(crate) fn share(&self, rows: &[i64], lengths: &[usize]) -> Vec<i64> {
        share(rows, lengths, self.group.rank(), self.group.world())
    }

    /// Sums `t` (a `[rows, cols]` float tensor each rank filled only on its own rows)
    /// across the ranks.
    pub(crate) fn sum_rows(&self, t: &mut Tensor, what: &str) -> Result<()> {
        self.group.all_reduce(t, ReduceOp::Sum, what)
    }

    /// Sums the gradients of `opt`'s parameters across the ranks, in float32 buckets. A
    /// parameter with a gradient on any rank gets one on every rank (zeros where this rank
    /// computed none), so every rank steps the same parameters; one with a gradient on no
    /// rank keeps none, as in a single process. Sharded layer parameters are left out (their
    /// gradients were reduced to their owners after each backward pass).
    pub(crate) fn sum_gradients(&self, opt: &ParamOptimizer, what: &str) -> Result<()> {
        let params: Vec<Tensor> = opt
            .params()
            .iter()
            .enumerate()
            .filter(|(i, _)| !opt.owner_only_grad(*i))
            .map(|(_, p)| p.shallow_clone())
            .collect();
        let mut has: Tensor = Tensor::from_slice(
            &params
                .iter()
                .map(|p| f32::from(u8::from(p.grad().defined())))
                .collect::<Vec<f32>>(),
        );
        self.group
            .all_reduce(&mut has, ReduceOp::Max, &format!("{what} gradient flags"))?;
        let has = Vec::<f32>::try_from(&has)?;
        for (p, &h) in params.iter().zip(&has) {
            if h > 0.0 && !p.grad().defined() {
                // Accumulates a zero gradient into `p` (tch cannot assign `.grad`).
                (p * 0.0).sum(Kind::Float).backward();
            }
        }
        let grads: Vec<Tensor> = params
            .iter()
            .zip(&has)
            .filter(|(_, &h)| h > 0.0)
            .map(|(p, _)| p.grad())
            .collect();
        tch::no_grad(|| {
            let mut start = 0;
            while start < grads.len() {
                let mut end = start;
                let mut size = 0;
                while end < grads.len()
                    && (end == start || size + grads[end].numel() as i64 <= BUCKET)
                {
                    size += grads[end].numel() as i64;
                    end += 1;
                }
                let bucket = &grads[start..end];
                let parts: Vec<Tensor> = bucket
                    .iter()
                    .map(|g| g.to_kind(Kind::Float).flatten(0, -1))
                    .collect();
                let mut flat = Tensor::cat(&parts, 0);
                self.group
                    .all_reduce(&mut flat, ReduceOp::Sum, &format!("{what} gradients"))?;
                let mut offset = 0;
                for g in bucket {
                    let n = g.numel() as i64;
                    let mut g = g.shallow_clone();
                    g.copy_(&flat.narrow(0, offset, n).view_as(&g));
                    offset += n;
                }
                start = end;
            }
            Ok(())
        })
    }

    /// The gradient norm of `opt` (as [`ParamOptimizer::grad_norm`]) when the layers'
    /// gradients live on their owners: each rank sums the squares of its own, rank 0 adds the
    /// replicated parameters', and the ranks sum; the same on every rank.
    pub(crate) fn grad_norm(&self, opt: &ParamOptimizer, what: &str) -> Result<f64> {
        if self.mode != ShardMode::Parameters {
            return Ok(opt.grad_norm());
        }
        let rank = self.group.rank();
        let mut sum = [opt.grad_square_sum(|i| {
            if opt.owner_only_grad(i) {
                opt.owner(i) == rank
            } else {
                rank == 0
            }
        })];
        self.group
            .sum_f64s(&mut sum, &format!("{what} gradient norm"))?;
        Ok(sum[0].sqrt())
    }

    /// After a sharded optimizer's step: each parameter's owner broadcasts its new value
    /// (sharded layer parameters are sent to rank 0 by their layer gate instead).
    pub(crate) fn share_parameters(&self, opt: &ParamOptimizer, what: &str) -> Result<()> {
        if !self.mode.shards_optimizer() {
            return Ok(());
        }
        tch::no_grad(|| {
            for (i, p) in opt.params().iter().enumerate() {
                if opt.owner_only_grad(i) {
                    continue;
                }
                let mut t = p.shallow_clone();
                self.group
                    .broadcast(&mut t, opt.owner(i), &format!("{what} parameter {i}"))?;
            }
            Ok(())
        })
    }

    /// Checks that every rank holds the same weights and configuration (`fingerprint`):
    /// one error, on every rank, naming the first rank that differs from rank 0.
    pub(crate) fn check_same(&self, fingerprint: &[i64]) -> Result<()> {
        let world = self.group.world();
        let k = fingerprint.len() as i64;
        let mut all = Tensor::zeros([world as i64, k], (Kind::Int64, tch::Device::Cpu));
        all.get(self.group.rank() as i64)
            .copy_(&Tensor::from_slice(fingerprint));
        self.group.all_reduce(
            &mut all,
            ReduceOp::Sum,
            "the ranks' weight and config digests",
        )?;
        let first = all.get(0);
        for r in 1..world {
            if !all.get(r as i64).equal(&first) {
                let what = if all.get(r as i64).get(0).equal(&first.get(0)) {
                    "another learner configuration"
                } else {
                    "other weights"
                };
                return Err(Error::invalid(
                    "learner ranks",
                    format!(
                        "rank {r} joined with {what} than rank 0 (every rank must load the same \
                         model and config)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// See [`Ranks::share`].
pub(crate) fn share(rows: &[i64], lengths: &[usize], rank: usize, world: usize) -> Vec<i64> {
    if world <= 1 {
        return rows.to_vec();
    }
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[rows[i] as usize]));
    let mut load = vec![0usize; world];
    let mut mine = vec![false; rows.len()];
    for i in order {
        let r = (0..world).min_by_key(|&r| (load[r], r)).unwrap_or(0);
        load[r] += lengths[rows[i] as usize];
        mine[i] = r == rank;
    }
    rows.iter()
        .zip(mine)
        .filter_map(|(&row, m)| m.then_some(row))
        .collect()
}

/// A 64-bit fingerprint of `value`'s debug form (the same on every rank running the same
/// build).
pub(crate) fn fingerprint(value: &impl std::fmt::Debug) -> i64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{value:?}").hash(&mut h);
    h.finish() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_goes_to_one_rank_and_tokens_balance() {
        let lengths = [100, 400, 50, 400, 200, 60, 10, 300];
        let rows: Vec<i64> = (0..8).collect();
        for world in 1..=4 {
            let shares: Vec<Vec<i64>> = (0..world)
                .map(|r| share(&rows, &lengths, r, world))
                .collect();
            let mut all = shares.concat();
            all.sort();
            assert_eq!(all, rows, "world {world}");
            let tokens: Vec<usize> = shares
                .iter()
                .map(|s| s.iter().map(|&i| lengths[i as usize]).sum())
                .collect();
            let (lo, hi) = (tokens.iter().min().unwrap(), tokens.iter().max().unwrap());
            // Greedy longest-first: no rank is over the lightest by more than the longest row.
            assert!(hi - lo <= 400, "world {world}: {tokens:?}");
            for s in &shares {
                assert!(s.windows(2).all(|w| w[0] < w[1]), "kept in order: {s:?}");
            }
        }
        assert_eq!(share(&rows, &lengths, 0, 2), vec![1, 5, 7]);
        assert_eq!(share(&rows, &lengths, 1, 2), vec![0, 2, 3, 4, 6]);
    }
}
