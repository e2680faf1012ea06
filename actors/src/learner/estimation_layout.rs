//! Credit over a trajectory's steps when its steps lie in several training rows.
//!
//! A trajectory whose context was rebuilt trains as several rows (`trajectory::rows`), but
//! credit assignment (GAE over its tokens or steps, group baselines over its score) is about
//! the whole trajectory in time order. The estimators run on an *estimation layout*: one row
//! per trajectory holding its training rows' target columns one after another, with one
//! empty column between two rows so that a step never runs into the next row's first step.
//! Advantages and returns are gathered back into the training rows. Both directions are
//! gathers of a flat tensor with one trailing zero, which empty positions point at, so they
//! copy values exactly. Rows that are trajectories need no layout (`TrainBatch::layout` is
//! `None`), and the estimators then run on the batch as it is.

use tch::{Device, Kind, Tensor};

/// Where each training row's columns lie in its trajectory's estimation row.
#[derive(Debug)]
pub(crate) struct EstimationLayout {
    /// `[N * C]`: for each estimation position, its flat index in the `[R * L]` training
    /// layout, or `R * L` (the trailing zero) for an empty one.
    to_trajectories: Tensor,
    /// `[R * L]`: for each training position, its flat index in the `[N * C]` layout, or
    /// `N * C` for a padding column.
    to_rows: Tensor,
    trajectories: i64,
    cols: i64,
    rows: i64,
    row_cols: i64,
    /// Per trajectory: outcome plus process rewards.
    pub(crate) scores: Vec<f64>,
    /// Per trajectory: its group.
    pub(crate) group_ids: Vec<i64>,
}

impl EstimationLayout {
    /// `row_traj[r]` is row `r`'s trajectory (rows of one trajectory in order),
    /// `lengths[r]` its real tokens, `l` the training layout's target columns.
    pub(crate) fn new(
        row_traj: &[usize],
        lengths: &[usize],
        l: usize,
        scores: Vec<f64>,
        group_ids: Vec<i64>,
        device: Device,
    ) -> Self {
        let n = scores.len();
        let r = row_traj.len();
        // Each row's offset in its trajectory's estimation row.
        let mut used = vec![0usize; n];
        let mut offsets = Vec::with_capacity(r);
        for (&t, &len) in row_traj.iter().zip(lengths) {
            if used[t] > 0 {
                used[t] += 1;
            }
            offsets.push(used[t]);
            used[t] += len.saturating_sub(1);
        }
        let c = used.iter().copied().max().unwrap_or(0).max(1);
        let mut to_trajectories = vec![(r * l) as i64; n * c];
        let mut to_rows = vec![(n * c) as i64; r * l];
        for (row, ((&t, &len), &offset)) in row_traj.iter().zip(lengths).zip(&offsets).enumerate() {
            for col in 0..len.saturating_sub(1) {
                let e = t * c + offset + col;
                to_trajectories[e] = (row * l + col) as i64;
                to_rows[row * l + col] = e as i64;
            }
        }
        Self {
            to_trajectories: Tensor::from_slice(&to_trajectories).to_device(device),
            to_rows: Tensor::from_slice(&to_rows).to_device(device),
            trajectories: n as i64,
            cols: c as i64,
            rows: r as i64,
            row_cols: l as i64,
            scores,
            group_ids,
        }
    }

    /// `[R, L]` training layout to `[N, C]` estimation layout (empty positions 0).
    pub(crate) fn to_trajectories(&self, x: &Tensor) -> Tensor {
        gather(x, &self.to_trajectories).view([self.trajectories, self.cols])
    }

    /// `[N, C]` estimation layout back to `[R, L]` (padding columns 0).
    pub(crate) fn to_rows(&self, x: &Tensor) -> Tensor {
        gather(x, &self.to_rows).view([self.rows, self.row_cols])
    }

    /// The per-trajectory scores as a tensor of `kind` on `device`.
    pub(crate) fn score_tensor(&self, kind: Kind, device: Device) -> Tensor {
        Tensor::from_slice(&self.scores)
            .to_kind(kind)
            .to_device(device)
    }
}

/// `x` flattened with one zero appended, read at `index`.
fn gather(x: &Tensor, index: &Tensor) -> Tensor {
    let flat = x.reshape([-1]);
    let padded = Tensor::cat(&[&flat, &flat.zeros_like().narrow(0, 0, 1)], 0);
    padded.index_select(0, index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_of_a_trajectory_sit_end_to_end_with_one_empty_column_between() {
        // Trajectory 0: rows 0 (4 tokens) and 2 (3 tokens); trajectory 1: row 1 (2 tokens).
        let layout = EstimationLayout::new(
            &[0, 1, 0],
            &[4, 2, 3],
            3,
            vec![1.0, 0.0],
            vec![0, 0],
            Device::Cpu,
        );
        let x = Tensor::from_slice(&[1f32, 2., 3., 4., 0., 0., 5., 6., 0.]).view([3, 3]);
        let est = layout.to_trajectories(&x);
        assert_eq!(est.size(), vec![2, 6]);
        let flat = Vec::<f32>::try_from(est.reshape([-1])).unwrap();
        assert_eq!(flat, vec![1., 2., 3., 0., 5., 6., 4., 0., 0., 0., 0., 0.]);
        let back = Vec::<f32>::try_from(layout.to_rows(&est).reshape([-1])).unwrap();
        assert_eq!(back, vec![1., 2., 3., 4., 0., 0., 5., 6., 0.]);
    }
}
