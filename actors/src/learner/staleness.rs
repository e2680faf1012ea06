//! Off-policy staleness: how many weight versions ago each trained token was sampled.
//!
//! In async training the engine keeps generating while the learner updates, so a batch mixes
//! tokens from several versions. The PPO ratio corrects for mild staleness; very old tokens
//! make it unreliable (the clip binds everywhere), so they are dropped from the loss.

use tch::{Kind, Tensor};

use crate::Result;

/// What the staleness filter saw and did.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Staleness {
    /// Mean over action tokens of `current - version` (before dropping).
    pub(crate) mean: f64,
    /// Largest staleness of any action token.
    pub(crate) max: u64,
    /// Action tokens masked out for being older than the limit.
    pub(crate) dropped_tokens: u64,
}

/// Measures per-token staleness against `current` and, with `max_staleness`, returns the
/// action mask with tokens older than that many versions removed. Tokens that claim a version
/// newer than `current` (a learner restarted at a lower version) count as fresh.
pub(crate) fn filter_stale(
    token_version: &Tensor,
    action_mask: &Tensor,
    current: u64,
    max_staleness: Option<u64>,
) -> Result<(Tensor, Staleness)> {
    let current = current.min(i64::MAX as u64) as i64;
    let on = action_mask.ne(0);
    let age = (-token_version + current).clamp_min(0);
    let age = age.where_self(&on, &age.zeros_like());
    let count = on.sum(Kind::Int64).int64_value(&[]);
    let mean = if count > 0 {
        age.sum(Kind::Double).double_value(&[]) / count as f64
    } else {
        0.0
    };
    let max = if count > 0 {
        age.max().int64_value(&[]).max(0) as u64
    } else {
        0
    };
    let (mask, dropped) = match max_staleness {
        Some(limit) => {
            let limit = limit.min(i64::MAX as u64) as i64;
            let stale = age.gt(limit).logical_and(&on);
            let dropped = stale.sum(Kind::Int64).int64_value(&[]) as u64;
            let mask = action_mask.where_self(&stale.logical_not(), &action_mask.zeros_like());
            (mask, dropped)
        }
        None => (action_mask.shallow_clone(), 0),
    };
    Ok((
        mask,
        Staleness {
            mean,
            max,
            dropped_tokens: dropped,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_and_drops_tokens_older_than_the_limit() {
        let versions = Tensor::from_slice(&[5i64, 5, 3, 0, 1, 9]).view([2, 3]);
        let mask = Tensor::from_slice(&[1f32, 1., 1., 0., 1., 1.]).view([2, 3]);
        // ages at action tokens: 1, 1, 3, 5, 0 (9 > 6 counts as fresh).
        let (kept, s) = filter_stale(&versions, &mask, 6, Some(2)).unwrap();
        assert_eq!(s.max, 5);
        assert!((s.mean - 10.0 / 5.0).abs() < 1e-12);
        assert_eq!(s.dropped_tokens, 2);
        let kept = Vec::<f32>::try_from(kept.view([-1])).unwrap();
        assert_eq!(kept, vec![1., 1., 0., 0., 0., 1.]);
        let (all, s) = filter_stale(&versions, &mask, 6, None).unwrap();
        assert_eq!(s.dropped_tokens, 0);
        assert_eq!(Vec::<f32>::try_from(all.view([-1])).unwrap()[2], 1.0);
    }
}
