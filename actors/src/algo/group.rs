//! Group-relative outcome advantages (GRPO, Dr.GRPO, RLOO): each prompt is rolled out several
//! times and a sample is judged against its siblings.
//!
//! A group of one has no siblings. verl then uses mean 0 (and std 1 for GRPO), so the lone
//! sample's advantage is its raw score (divided by `1 + 1e-6` for GRPO); this follows verl.
//! Drop such groups beforehand if that is not wanted.

use tch::Tensor;

use super::check::{self, Groups};
use crate::Result;

/// Added to the group standard deviation before dividing, as verl's `epsilon`.
pub const GRPO_EPS: f64 = 1e-6;

/// GRPO advantages `[N]` from outcome `scores` `[N]` and one group id per score (the prompt).
///
/// `(s - mean) / (std + 1e-6)` with the group's mean and unbiased standard deviation
/// (`torch.std`, as verl). With `norm_by_std = false` it is `s - mean` (Dr.GRPO), which keeps
/// groups that are nearly unanimous from being amplified. A group whose scores are all equal
/// gets 0. Broadcast to tokens with [`broadcast_to_tokens`].
pub fn grpo_advantages(scores: &Tensor, group_ids: &[i64], norm_by_std: bool) -> Result<Tensor> {
    check::floating("scores", scores)?;
    let groups = Groups::new("scores", scores, group_ids)?;
    Ok(tch::no_grad(|| {
        let scores = scores.detach();
        let means = groups.sample_means(&scores);
        let centered = &scores - &means;
        if norm_by_std {
            let stds = groups.sample_stds(&scores, &means);
            centered / (stds + GRPO_EPS)
        } else {
            centered
        }
    }))
}

/// RLOO advantages `[N]`: each score minus the mean of the *other* scores of its group.
///
/// Computed as verl does, `s * n / (n - 1) - mean * n / (n - 1)`, which equals
/// `s - mean(others)`; the baseline does not include the sample itself, so it stays unbiased.
pub fn rloo_advantages(scores: &Tensor, group_ids: &[i64]) -> Result<Tensor> {
    check::floating("scores", scores)?;
    let groups = Groups::new("scores", scores, group_ids)?;
    Ok(tch::no_grad(|| {
        let scores = scores.detach();
        let means = groups.sample_means(&scores);
        let n: Vec<f64> = groups
            .index
            .iter()
            .map(|g| groups.counts[*g as usize] as f64)
            .collect();
        // n / (n - 1) for n > 1; 1 for a lone sample (whose mean is 0: it keeps its score).
        let scale: Vec<f64> = n
            .iter()
            .map(|n| if *n > 1.0 { n / (n - 1.0) } else { 1.0 })
            .collect();
        let scale = Tensor::from_slice(&scale)
            .to_kind(scores.kind())
            .to_device(scores.device());
        (&scores - &means) * scale
    }))
}

/// Broadcasts per-sequence values `[N]` to their action tokens `[N, T]` (0 elsewhere).
pub fn broadcast_to_tokens(per_seq: &Tensor, mask: &Tensor) -> Result<Tensor> {
    check::floating("per_seq", per_seq)?;
    let n = check::dims("per_seq", per_seq, 1)?[0];
    let size = check::dims("mask", mask, 2)?;
    check::same_device("mask", mask, "per_seq", per_seq)?;
    if size[0] != n {
        return Err(crate::Error::invalid(
            "mask",
            format!(
                "has {} rows but `per_seq` has {n} elements (shape {size:?})",
                size[0]
            ),
        ));
    }
    let tiled = per_seq.unsqueeze(-1).expand(&size, false);
    Ok(super::masked::select(&tiled, mask))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_close, t1, t2};
    use super::*;

    // Groups: 7 -> [1, 0, 0], 3 -> [2, 4], 9 -> [5] (alone), 4 -> [1, 1] (all equal).
    fn batch() -> (Tensor, Vec<i64>) {
        (
            t1(&[1.0, 0.0, 0.0, 2.0, 4.0, 5.0, 1.0, 1.0]),
            vec![7, 7, 7, 3, 3, 9, 4, 4],
        )
    }

    #[test]
    fn grpo_normalised() {
        let (s, g) = batch();
        let adv = grpo_advantages(&s, &g, true).unwrap();
        // group 7: mean 1/3; deviations 2/3, -1/3, -1/3; unbiased var (4/9+1/9+1/9)/2 = 1/3,
        //   std = 1/sqrt(3) = 0.57735
        let s7 = 1.0 / 3f64.sqrt() + 1e-6;
        // group 3: mean 3; deviations -1, 1; var (1+1)/1 = 2; std sqrt(2)
        let s3 = 2f64.sqrt() + 1e-6;
        // group 9 alone: mean 0, std 1 (verl) -> 5 / (1 + 1e-6)
        // group 4 all equal: 0 / (0 + 1e-6) = 0
        let e = [
            (2.0 / 3.0) / s7,
            (-1.0 / 3.0) / s7,
            (-1.0 / 3.0) / s7,
            -1.0 / s3,
            1.0 / s3,
            5.0 / (1.0 + 1e-6),
            0.0,
            0.0,
        ];
        assert_close(&adv, &e, 1e-9);
    }

    #[test]
    fn dr_grpo_only_centres() {
        let (s, g) = batch();
        let adv = grpo_advantages(&s, &g, false).unwrap();
        let e = [2.0 / 3.0, -1.0 / 3.0, -1.0 / 3.0, -1.0, 1.0, 5.0, 0.0, 0.0];
        assert_close(&adv, &e, 1e-12);
    }

    #[test]
    fn rloo_leave_one_out() {
        let (s, g) = batch();
        let adv = rloo_advantages(&s, &g).unwrap();
        // group 7: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (twice)
        //   (verl form: (s - 1/3) * 3/2 gives the same)
        // group 3: 2 - 4 = -2; 4 - 2 = 2
        // group 9 alone: unchanged 5 (verl)
        // group 4: 1 - 1 = 0
        assert_close(&adv, &[1.0, -0.5, -0.5, -2.0, 2.0, 5.0, 0.0, 0.0], 1e-12);
    }

    #[test]
    fn broadcast_fills_action_tokens() {
        let adv = t1(&[2.0, -1.0]);
        let mask = t2(&[
            &[1.0, 1.0, 0.0, 0.0, 1.0, 1.0],
            &[1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ]);
        let got = broadcast_to_tokens(&adv, &mask).unwrap();
        let e = [2., 2., 0., 0., 2., 2., -1., 0., 0., 0., 0., 0.];
        assert_close(&got, &e, 0.0);
        assert!(broadcast_to_tokens(&t1(&[1.0]), &mask).is_err());
    }

    #[test]
    fn rejects_wrong_id_count() {
        let (s, _) = batch();
        let err = grpo_advantages(&s, &[1, 2], true).unwrap_err().to_string();
        assert!(err.contains("group_ids") && err.contains('8'), "{err}");
        assert!(rloo_advantages(&t2(&[&[1.0]]), &[1]).is_err());
    }
}
