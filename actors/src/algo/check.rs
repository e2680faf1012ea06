//! Argument checks shared by the algorithms: every public function validates its inputs here
//! first, so that libtorch never sees a shape it would abort on.

use tch::{Kind, Tensor};

use crate::{Error, Result};

/// `t` must have exactly `n` dimensions; returns its size.
pub(crate) fn dims(name: &str, t: &Tensor, n: usize) -> Result<Vec<i64>> {
    let size = t.size();
    if size.len() != n {
        return Err(Error::invalid(
            name,
            format!("expected {n} dimensions, got shape {size:?}"),
        ));
    }
    Ok(size)
}

/// `t` must have the shape of `reference` (named `ref_name` in the message).
pub(crate) fn same_shape(name: &str, t: &Tensor, ref_name: &str, reference: &Tensor) -> Result<()> {
    let (a, b) = (t.size(), reference.size());
    if a != b {
        return Err(Error::invalid(
            name,
            format!("expected the shape of `{ref_name}` {b:?}, got {a:?}"),
        ));
    }
    same_device(name, t, ref_name, reference)
}

/// `t` must live on the device of `reference`.
pub(crate) fn same_device(
    name: &str,
    t: &Tensor,
    ref_name: &str,
    reference: &Tensor,
) -> Result<()> {
    let (a, b) = (t.device(), reference.device());
    if a != b {
        return Err(Error::invalid(
            name,
            format!("is on {a:?} but `{ref_name}` is on {b:?}"),
        ));
    }
    Ok(())
}

/// `t` must hold floating-point numbers.
pub(crate) fn floating(name: &str, t: &Tensor) -> Result<()> {
    if !t.is_floating_point() {
        return Err(Error::invalid(
            name,
            format!("expected a floating-point tensor, got {:?}", t.kind()),
        ));
    }
    Ok(())
}

/// A float parameter must be finite (and satisfy `ok`, described by `what`).
pub(crate) fn param(name: &str, v: f64, ok: bool, what: &str) -> Result<()> {
    if !v.is_finite() || !ok {
        return Err(Error::invalid(name, format!("is {v}; expected {what}")));
    }
    Ok(())
}

/// The mask as booleans (non-zero = action token).
pub(crate) fn mask_bool(mask: &Tensor) -> Tensor {
    if mask.kind() == Kind::Bool {
        mask.shallow_clone()
    } else {
        mask.ne(0)
    }
}

/// The mask in the kind of the values it weights.
pub(crate) fn mask_like(mask: &Tensor, values: &Tensor) -> Tensor {
    mask.to_kind(values.kind())
}

/// A per-sample group index: group ids mapped to `0..G` in order of first appearance, with the
/// size of each group.
pub(crate) struct Groups {
    /// `[N]`: the group of each sample.
    pub(crate) index: Vec<i64>,
    /// `[G]`: how many samples each group has.
    pub(crate) counts: Vec<i64>,
}

impl Groups {
    /// Groups `group_ids`, which must have one id per element of the 1-D `scores`.
    pub(crate) fn new(scores_name: &str, scores: &Tensor, group_ids: &[i64]) -> Result<Self> {
        let n = dims(scores_name, scores, 1)?[0];
        if n != group_ids.len() as i64 {
            return Err(Error::invalid(
                "group_ids",
                format!(
                    "has {} ids but `{scores_name}` has {n} elements",
                    group_ids.len()
                ),
            ));
        }
        let mut first: std::collections::HashMap<i64, i64> = std::collections::HashMap::new();
        let mut index = Vec::with_capacity(group_ids.len());
        let mut counts: Vec<i64> = Vec::new();
        for id in group_ids {
            let g = *first.entry(*id).or_insert_with(|| {
                counts.push(0);
                counts.len() as i64 - 1
            });
            counts[g as usize] += 1;
            index.push(g);
        }
        Ok(Groups { index, counts })
    }

    /// For every sample, the mean score of its group; 0 for a group of one, as verl sets it
    /// (so a lone sample keeps its raw score as advantage).
    pub(crate) fn sample_means(&self, scores: &Tensor) -> Tensor {
        let (idx, counts) = self.tensors(scores);
        let sums = Tensor::zeros([self.counts.len() as i64], (scores.kind(), scores.device()))
            .index_add(0, &idx, scores);
        let means = (sums / &counts).where_self(&counts.gt(1), &counts.zeros_like());
        means.index_select(0, &idx)
    }

    /// For every sample, the unbiased (Bessel-corrected, as `torch.std`) standard deviation of
    /// its group; 1 for a group of one, as verl sets it.
    pub(crate) fn sample_stds(&self, scores: &Tensor, sample_means: &Tensor) -> Tensor {
        let (idx, counts) = self.tensors(scores);
        let sq = Tensor::zeros([self.counts.len() as i64], (scores.kind(), scores.device()))
            .index_add(0, &idx, &(scores - sample_means).square());
        let stds = (sq / (&counts - 1.0).clamp_min(1.0)).sqrt();
        let stds = stds.where_self(&counts.gt(1), &counts.ones_like());
        stds.index_select(0, &idx)
    }

    /// The group index `[N]` (Int64) and the group sizes `[G]` in the scores' kind, on their
    /// device.
    fn tensors(&self, scores: &Tensor) -> (Tensor, Tensor) {
        let idx = Tensor::from_slice(&self.index).to_device(scores.device());
        let counts = Tensor::from_slice(&self.counts)
            .to_kind(scores.kind())
            .to_device(scores.device());
        (idx, counts)
    }
}
