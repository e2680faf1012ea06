//! Trajectories to right-padded training tensors.
//!
//! Everything per token is laid out over *target* positions: column `j` of a `[B, L]` tensor
//! (`L = T - 1`) is about token `j + 1` of the stream, the one the model predicts from the
//! hidden state at position `j`. This is where a log-probability, a value and a reward of the
//! token naturally live, and it lets the learner run one forward pass over `[B, T]` and read
//! everything from `hidden[:, :-1]` without shifting again.

use tch::{Device, Kind, Tensor};

use super::critic_input::CriticInput;
use super::estimation_layout::EstimationLayout;
use crate::trajectory::rows::TrainRow;
use crate::trajectory::Trajectory;
use crate::{Error, Result};

/// A batch ready for the forward pass; see the module documentation for the layout.
#[derive(Debug)]
pub(crate) struct TrainBatch {
    /// `[B, T]` Int64 token ids, right-padded with 0.
    pub(crate) ids: Tensor,
    /// `[B, T]` Bool: real tokens (false = padding).
    pub(crate) input_mask: Tensor,
    /// `[B, L]` Float: 1 where the target token is an action the policy sampled.
    pub(crate) action_mask: Tensor,
    /// `[B, L]` Float: sampling log-probabilities of action tokens (0 elsewhere).
    pub(crate) old_logprobs: Tensor,
    /// `[B, L]` Float: process rewards at each step's last action token, the outcome reward
    /// at the trajectory's last action token.
    pub(crate) token_rewards: Tensor,
    /// `[B, L]` Int64: the weights version that sampled each action token (0 elsewhere).
    pub(crate) token_version: Tensor,
    /// Per row: its trajectory's outcome plus process rewards (the score group estimators
    /// compare).
    pub(crate) scores: Vec<f64>,
    /// Per row: its trajectory's group.
    pub(crate) group_ids: Vec<i64>,
    /// Per row: its trajectory's episode id (for logs).
    pub(crate) episode_ids: Vec<u64>,
    /// Per row: its trajectory's index in the batch given to [`build_batch`].
    pub(crate) row_trajectory: Vec<usize>,
    /// The asymmetric critic's rows (prefix, then the row), when it has a prefix.
    pub(crate) critic_input: Option<CriticInput>,
    /// Per row: its real tokens (at most `max_len`).
    pub(crate) lengths: Vec<usize>,
    /// Rows cut at `max_len`.
    pub(crate) truncated: usize,
    /// Where each row's columns lie in its trajectory, when some trajectory has more than
    /// one row (a rebuilt context); `None` when rows are trajectories.
    pub(crate) layout: Option<EstimationLayout>,
}

impl TrainBatch {
    /// Rows.
    pub(crate) fn rows(&self) -> i64 {
        self.ids.size()[0]
    }

    /// Target positions per row (`L = T - 1`).
    pub(crate) fn cols(&self) -> i64 {
        self.ids.size()[1] - 1
    }

    /// Rows `index` of every tensor, for micro-batches, cut to the longest of those rows:
    /// what lies past it is padding, which a right-padded causal pass never reads.
    pub(crate) fn select(&self, index: &[i64]) -> TrainBatch {
        let idx = Tensor::from_slice(index).to_device(self.ids.device());
        let pick = |v: &[f64]| index.iter().map(|&i| v[i as usize]).collect::<Vec<_>>();
        let lengths: Vec<usize> = index.iter().map(|&i| self.lengths[i as usize]).collect();
        let t = lengths.iter().copied().max().unwrap_or(0).max(2) as i64;
        let cut_t = |x: &Tensor| x.index_select(0, &idx).narrow(1, 0, t);
        let cut_l = |x: &Tensor| x.index_select(0, &idx).narrow(1, 0, t - 1);
        TrainBatch {
            ids: cut_t(&self.ids),
            input_mask: cut_t(&self.input_mask),
            action_mask: cut_l(&self.action_mask),
            old_logprobs: cut_l(&self.old_logprobs),
            token_rewards: cut_l(&self.token_rewards),
            token_version: cut_l(&self.token_version),
            scores: pick(&self.scores),
            group_ids: index.iter().map(|&i| self.group_ids[i as usize]).collect(),
            episode_ids: index
                .iter()
                .map(|&i| self.episode_ids[i as usize])
                .collect(),
            row_trajectory: index
                .iter()
                .map(|&i| self.row_trajectory[i as usize])
                .collect(),
            critic_input: self.critic_input.as_ref().map(|c| c.select(index)),
            lengths,
            truncated: 0,
            layout: None,
        }
    }
}

/// Builds the batch: one row per [`TrainRow`] of each trajectory (one per trajectory when no
/// context was rebuilt). Rows longer than `max_len` keep their head; a reward whose token was
/// cut goes to the last action token of its row that survived, so truncation loses tokens,
/// not credit. Rejects (rather than panics on) trajectories whose log-probabilities do not
/// match their actions or whose stored contexts are inconsistent, and empty batches.
pub(crate) fn build_batch(
    trajectories: &[Trajectory],
    max_len: usize,
    device: Device,
) -> Result<TrainBatch> {
    if trajectories.is_empty() {
        return Err(Error::invalid("batch", "has no trajectories"));
    }
    let mut rows: Vec<(usize, TrainRow)> = Vec::with_capacity(trajectories.len());
    for (n, traj) in trajectories.iter().enumerate() {
        traj.check_contexts()?;
        for (k, step) in traj.steps.iter().enumerate() {
            if step.logprobs.len() != step.action_ids.len() {
                return Err(Error::invalid(
                    format!("trajectory {} step {k}", traj.episode_id),
                    format!(
                        "has {} log-probabilities for {} action tokens",
                        step.logprobs.len(),
                        step.action_ids.len()
                    ),
                ));
            }
        }
        rows.extend(traj.rows().into_iter().map(|r| (n, r)));
    }
    let t = rows
        .iter()
        .map(|(_, r)| r.ids.len().min(max_len))
        .max()
        .unwrap_or(0)
        .max(2);
    let l = t - 1;
    let b = rows.len();
    let mut ids = vec![0i64; b * t];
    let mut input = vec![false; b * t];
    let mut mask = vec![0f32; b * l];
    let mut old = vec![0f32; b * l];
    let mut rewards = vec![0f32; b * l];
    let mut versions = vec![0i64; b * l];
    let mut truncated = 0;
    let mut lengths = Vec::with_capacity(b);
    let scores: Vec<f64> = trajectories
        .iter()
        .map(Trajectory::episode_return)
        .collect();
    // The outcome reward goes to the trajectory's last action token: in its last row that has one.
    let mut last_acting_row: Vec<Option<usize>> = vec![None; trajectories.len()];
    for (r, (n, row)) in rows.iter().enumerate() {
        if row
            .steps
            .clone()
            .any(|k| !trajectories[*n].steps[k].action_ids.is_empty())
        {
            last_acting_row[*n] = Some(r);
        }
    }
    for (r, (n, row)) in rows.iter().enumerate() {
        let traj = &trajectories[*n];
        let len = row.ids.len().min(max_len);
        lengths.push(len);
        if row.ids.len() > max_len {
            truncated += 1;
        }
        for (j, &id) in row.ids[..len].iter().enumerate() {
            ids[r * t + j] = id as i64;
            input[r * t + j] = true;
        }
        // Rewards by row position, moved to the last kept action token below.
        let mut placed: Vec<(usize, f64)> = Vec::with_capacity(row.steps.len() + 1);
        let mut last_action: Option<usize> = None;
        for (k, &pos) in row.steps.clone().zip(&row.action_starts) {
            let step = &traj.steps[k];
            for (i, &lp) in step.logprobs.iter().enumerate() {
                let p = pos + i;
                if p >= 1 && p < len {
                    let c = r * l + p - 1;
                    mask[c] = 1.0;
                    old[c] = lp;
                    versions[c] = step.token_version(i).min(i64::MAX as u64) as i64;
                }
            }
            if !step.action_ids.is_empty() {
                last_action = Some(pos + step.action_ids.len() - 1);
            }
            if step.reward != 0.0 {
                if let Some(p) = last_action {
                    placed.push((p, step.reward));
                }
            }
        }
        if let (Some(p), true) = (last_action, last_acting_row[*n] == Some(r)) {
            placed.push((p, traj.reward));
        }
        let last_kept = (1..len).rev().find(|&p| mask[r * l + p - 1] == 1.0);
        if let Some(kept) = last_kept {
            for (p, reward) in placed {
                rewards[r * l + p.min(kept) - 1] += reward as f32;
            }
        }
    }
    let row_traj: Vec<usize> = rows.iter().map(|(n, _)| *n).collect();
    let layout = (b != trajectories.len()).then(|| {
        EstimationLayout::new(
            &row_traj,
            &lengths,
            l,
            scores.clone(),
            trajectories.iter().map(|t| t.group_id as i64).collect(),
            device,
        )
    });
    let shape_t = [b as i64, t as i64];
    let shape_l = [b as i64, l as i64];
    Ok(TrainBatch {
        ids: Tensor::from_slice(&ids).view(shape_t).to_device(device),
        input_mask: Tensor::from_slice(&input).view(shape_t).to_device(device),
        action_mask: Tensor::from_slice(&mask).view(shape_l).to_device(device),
        old_logprobs: Tensor::from_slice(&old).view(shape_l).to_device(device),
        token_rewards: Tensor::from_slice(&rewards)
            .view(shape_l)
            .to_kind(Kind::Float)
            .to_device(device),
        token_version: Tensor::from_slice(&versions)
            .view(shape_l)
            .to_device(device),
        scores: row_traj.iter().map(|&n| scores[n]).collect(),
        group_ids: row_traj
            .iter()
            .map(|&n| trajectories[n].group_id as i64)
            .collect(),
        episode_ids: row_traj
            .iter()
            .map(|&n| trajectories[n].episode_id)
            .collect(),
        row_trajectory: row_traj,
        critic_input: None,
        lengths,
        truncated,
        layout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::test_support::traj;

    fn rows(t: &Tensor) -> Vec<Vec<f64>> {
        let t = t.to_kind(Kind::Double);
        (0..t.size()[0])
            .map(|i| Vec::<f64>::try_from(t.get(i)).unwrap())
            .collect()
    }

    #[test]
    fn aligns_actions_logprobs_and_rewards_to_target_positions() {
        // stream: [p p | a a | o | a] ; step rewards 0.5 on step 0, outcome 1.0.
        let a = traj(
            7,
            1,
            &[1, 2],
            &[
                (&[3, 4], &[-0.1, -0.2], &[5], 0.5, 3),
                (&[6], &[-0.3], &[], 0.0, 4),
            ],
            1.0,
        );
        let b = traj(8, 1, &[1], &[(&[9], &[-0.4], &[], 0.0, 4)], 0.0);
        let batch = build_batch(&[a, b], 100, Device::Cpu).unwrap();
        assert_eq!(batch.ids.size(), vec![2, 6]);
        assert_eq!(rows(&batch.action_mask)[0], vec![0., 1., 1., 0., 1.]);
        assert_eq!(rows(&batch.action_mask)[1], vec![1., 0., 0., 0., 0.]);
        let old = rows(&batch.old_logprobs);
        assert!((old[0][1] + 0.1).abs() < 1e-6 && (old[0][4] + 0.3).abs() < 1e-6);
        assert_eq!(rows(&batch.token_rewards)[0], vec![0., 0., 0.5, 0., 1.]);
        assert_eq!(rows(&batch.token_version)[0], vec![0., 3., 3., 0., 4.]);
        assert_eq!(batch.scores, vec![1.5, 0.0]);
        assert_eq!(batch.episode_ids, vec![7, 8]);
        let input = rows(&batch.input_mask.to_kind(Kind::Float));
        assert_eq!(input[1], vec![1., 1., 0., 0., 0., 0.]);
    }

    #[test]
    fn truncation_keeps_the_head_and_moves_rewards_to_the_last_kept_action() {
        let a = traj(
            1,
            0,
            &[1, 2],
            &[
                (&[3, 4], &[-0.1, -0.2], &[5, 5], 0.25, 0),
                (&[6, 7], &[-0.3, -0.4], &[], 0.0, 0),
            ],
            2.0,
        );
        let batch = build_batch(&[a], 4, Device::Cpu).unwrap();
        assert_eq!(batch.truncated, 1);
        assert_eq!(rows(&batch.action_mask)[0], vec![0., 1., 1.]);
        assert_eq!(rows(&batch.token_rewards)[0], vec![0., 0., 2.25]);
        assert_eq!(batch.scores, vec![2.25]);
    }

    #[test]
    fn rejects_mismatched_logprobs_and_empty_batches() {
        let bad = traj(3, 0, &[1], &[(&[2, 3], &[-0.1], &[], 0.0, 0)], 1.0);
        let err = build_batch(&[bad], 10, Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(err.contains("trajectory 3"), "{err}");
        assert!(build_batch(&[], 10, Device::Cpu).is_err());
    }

    #[test]
    fn select_picks_rows() {
        let a = traj(1, 0, &[1], &[(&[2], &[-0.1], &[], 0.0, 0)], 1.0);
        let b = traj(2, 5, &[1], &[(&[3, 4], &[-0.2, -0.3], &[], 0.0, 0)], 0.0);
        let batch = build_batch(&[a, b], 10, Device::Cpu).unwrap();
        let sub = batch.select(&[1]);
        assert_eq!(sub.episode_ids, vec![2]);
        assert_eq!(sub.group_ids, vec![5]);
        assert_eq!(rows(&sub.action_mask)[0], vec![1., 1.]);
        // The shorter row alone is cut to its own length: no padding columns.
        assert_eq!(batch.lengths, vec![2, 3]);
        let short = batch.select(&[0]);
        assert_eq!(short.ids.size(), vec![1, 2]);
        assert_eq!(rows(&short.action_mask)[0], vec![1.]);
        assert_eq!(short.cols(), 1);
    }
}
