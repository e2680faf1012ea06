//! The asymmetric critic (as Agent-R1 v0.1 has it): a separate critic reads a critic-only
//! prefix before each row, rendered from fields of the task the policy does not see (the gold
//! answer, a reference solution), while the actor's input, log-probabilities and update stay
//! as they are. Values are still read at each row's own positions, shifted past the prefix.

use tch::{Device, Tensor};

use super::batch::TrainBatch;
use super::critic_input::CriticInput;
use crate::trajectory::Trajectory;
use crate::{Error, Result};
use agent_r1_envs::task::Task;

/// The token ids a separate critic reads before every row of a task's trajectories.
pub trait CriticPrefix: Send + Sync + std::fmt::Debug {
    /// The prefix of `task`; an error names what the task lacks.
    fn ids(&self, task: &Task) -> Result<Vec<u32>>;
}

/// The critic's rows of `batch`: each row's tokens (as the batch holds them, truncation
/// included) after the prefix of its trajectory's task.
pub(crate) fn critic_input(
    batch: &TrainBatch,
    trajectories: &[Trajectory],
    prefix: &dyn CriticPrefix,
    device: Device,
) -> Result<CriticInput> {
    let mut prefixes: Vec<Option<Vec<u32>>> = vec![None; trajectories.len()];
    let b = batch.rows() as usize;
    let row_ids = Vec::<i64>::try_from(batch.ids.to_device(Device::Cpu).flatten(0, -1))?;
    let t = batch.ids.size()[1] as usize;
    let mut rows: Vec<Vec<i64>> = Vec::with_capacity(b);
    let mut offsets = Vec::with_capacity(b);
    for r in 0..b {
        let n = batch.row_trajectory[r];
        if prefixes[n].is_none() {
            let traj = &trajectories[n];
            let ids = prefix.ids(&traj.task).map_err(|e| {
                Error::invalid(
                    format!("critic prefix of task {}", traj.task.id),
                    e.to_string(),
                )
            })?;
            prefixes[n] = Some(ids);
        }
        let p = prefixes[n].as_deref().unwrap_or_default();
        let mut ids: Vec<i64> = p.iter().map(|&i| i64::from(i)).collect();
        ids.extend(&row_ids[r * t..r * t + batch.lengths[r]]);
        offsets.push(p.len() as i64);
        rows.push(ids);
    }
    let width = rows.iter().map(Vec::len).max().unwrap_or(1).max(1);
    let mut ids = vec![0i64; b * width];
    let mut mask = vec![false; b * width];
    for (r, row) in rows.iter().enumerate() {
        ids[r * width..r * width + row.len()].copy_from_slice(row);
        mask[r * width..r * width + row.len()].fill(true);
    }
    let shape = [b as i64, width as i64];
    Ok(CriticInput {
        ids: Tensor::from_slice(&ids).view(shape).to_device(device),
        input_mask: Tensor::from_slice(&mask).view(shape).to_device(device),
        offsets: Tensor::from_slice(&offsets).to_device(device),
        lengths: rows.iter().map(Vec::len).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learner::batch::build_batch;
    use crate::model::{ModelConfig, Placement, PolicyModel};
    use crate::trajectory::test_support::traj;
    use tch::Kind;

    /// Prefix `[30 + k, .. k + 2 ids]` for the task of episode `k`: lengths differ per task.
    #[derive(Debug)]
    struct ByEpisode;

    impl CriticPrefix for ByEpisode {
        fn ids(&self, task: &Task) -> Result<Vec<u32>> {
            let k: u32 = task.id.trim_start_matches('t').parse().unwrap();
            Ok((0..k + 2).map(|i| 30 + k + i).collect())
        }
    }

    fn critic() -> PolicyModel {
        tch::manual_seed(5);
        let config = ModelConfig::from_json(&serde_json::json!({
            "model_type": "qwen2", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 2, "tie_word_embeddings": true
        }))
        .unwrap();
        PolicyModel::new(config, Placement::default(), true).unwrap()
    }

    /// The values of the batch path (rows padded, prefixes of different lengths, states
    /// gathered at each row's own positions) against each row's sequence run alone, unpadded,
    /// its values read by hand at `prefix length + j`.
    #[test]
    fn values_are_read_at_each_rows_own_positions_after_its_prefix() {
        let trajectories = vec![
            traj(
                1,
                0,
                &[1, 2],
                &[(&[5, 6, 7], &[-1.0; 3], &[3], 0.0, 0)],
                1.0,
            ),
            traj(2, 0, &[1, 2, 4], &[(&[8, 9], &[-1.0; 2], &[], 0.0, 0)], 0.0),
            traj(
                0,
                1,
                &[1],
                &[(&[10, 11, 12, 13], &[-1.0; 4], &[], 0.0, 0)],
                0.0,
            ),
        ];
        let batch = build_batch(&trajectories, 100, Device::Cpu).unwrap();
        let input = critic_input(&batch, &trajectories, &ByEpisode, Device::Cpu).unwrap();
        assert_eq!(
            Vec::<i64>::try_from(&input.offsets).unwrap(),
            vec![3, 4, 2],
            "prefix lengths k + 2"
        );
        let model = critic();
        let cols = batch.cols();
        let values = tch::no_grad(|| {
            let h = model.forward_right_padded(&input.ids, &input.input_mask);
            model.values(&input.own_positions(&h, cols)).unwrap()
        });
        for (r, t) in trajectories.iter().enumerate() {
            let prefix = ByEpisode.ids(&t.task).unwrap();
            let mut ids: Vec<i64> = prefix.iter().map(|&i| i64::from(i)).collect();
            let own = t.token_stream();
            ids.extend(own.iter().map(|&i| i64::from(i)));
            let n = ids.len() as i64;
            let alone = tch::no_grad(|| {
                let h = model.forward(
                    &Tensor::from_slice(&ids).unsqueeze(0),
                    &Tensor::ones([1, n], (Kind::Bool, Device::Cpu)),
                    None,
                );
                model.values(&h).unwrap()
            });
            // Column j is the state before the row's token j + 1: position p + j.
            for j in 0..own.len() as i64 - 1 {
                let want = alone.double_value(&[0, prefix.len() as i64 + j]);
                let got = values.double_value(&[r as i64, j]);
                assert!(
                    (want - got).abs() < 1e-5,
                    "row {r} column {j}: batch {got} vs alone {want}"
                );
            }
        }
        // The actor's tensors do not change: the prefix lives in the critic's input only.
        let plain = build_batch(&trajectories, 100, Device::Cpu).unwrap();
        assert!(plain.ids.equal(&batch.ids) && plain.input_mask.equal(&batch.input_mask));
    }
}
