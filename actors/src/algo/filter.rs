//! DAPO's dynamic-sampling filter: groups whose samples all scored the same carry no GRPO
//! signal (every advantage is 0) but still cost a backward pass.

use std::collections::HashMap;

use tch::{Kind, Tensor};

use super::check;
use crate::Result;

/// Returns the indices `[0, N)` of the samples to keep (in their original order) and how many
/// groups were dropped, given outcome `scores` `[N]` and one group id per score.
///
/// A group is dropped when it has two or more samples and all of them scored exactly the same.
/// Groups of one are kept, as in verl's DAPO recipe (`std > 0 or len == 1`): a lone sample
/// has no siblings to disagree with, and its GRPO advantage is its raw score. Equality is exact
/// rather than `std > 0`, so that float noise in a mean (`0.1 + 0.1 + 0.1`) cannot make a
/// unanimous group look varied.
pub fn filter_zero_variance_groups(
    scores: &Tensor,
    group_ids: &[i64],
) -> Result<(Vec<usize>, usize)> {
    check::floating("scores", scores)?;
    let groups = check::Groups::new("scores", scores, group_ids)?;
    let s = Vec::<f64>::try_from(scores.to_kind(Kind::Double).to_device(tch::Device::Cpu))?;
    let mut first: HashMap<i64, f64> = HashMap::new();
    let mut varied = vec![false; groups.counts.len()];
    for (i, g) in groups.index.iter().enumerate() {
        let f = *first.entry(*g).or_insert(s[i]);
        if s[i] != f {
            varied[*g as usize] = true;
        }
    }
    let keep_group: Vec<bool> = varied
        .iter()
        .zip(&groups.counts)
        .map(|(v, n)| *v || *n == 1)
        .collect();
    let kept = (0..s.len())
        .filter(|i| keep_group[groups.index[*i] as usize])
        .collect();
    let dropped = keep_group.iter().filter(|k| !**k).count();
    Ok((kept, dropped))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::t1;
    use super::*;

    #[test]
    fn drops_unanimous_groups_keeps_singletons() {
        // group 1: [1, 1] unanimous -> dropped; group 2: [0, 1] kept;
        // group 3: [2, 2] unanimous -> dropped; group 4: [5] alone -> kept.
        let s = t1(&[1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 5.0]);
        let (kept, dropped) = filter_zero_variance_groups(&s, &[1, 1, 2, 2, 3, 3, 4]).unwrap();
        assert_eq!(kept, vec![2, 3, 6]);
        assert_eq!(dropped, 2);
    }

    #[test]
    fn interleaved_groups_keep_order() {
        // Samples of groups 8 and 9 interleaved; 9 = [0.3, 0.3, 0.3] dropped.
        let s = t1(&[0.3, 1.0, 0.3, 0.0, 0.3]);
        let (kept, dropped) = filter_zero_variance_groups(&s, &[9, 8, 9, 8, 9]).unwrap();
        assert_eq!(kept, vec![1, 3]);
        assert_eq!(dropped, 1);
    }

    #[test]
    fn all_equal_batch_drops_everything() {
        let s = t1(&[0.0, 0.0, 0.0, 0.0]);
        let (kept, dropped) = filter_zero_variance_groups(&s, &[1, 1, 2, 2]).unwrap();
        assert!(kept.is_empty());
        assert_eq!(dropped, 2);
        assert!(filter_zero_variance_groups(&s, &[1, 1]).is_err());
    }
}
