//! How a mini-batch is cut into micro-batches (one forward and backward pass each).

use super::config::LearnerConfig;

/// The rule that groups trajectories into micro-batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MicroBatching {
    /// At most this many sequences per pass, in the mini-batch's order.
    Sequences(usize),
    /// Sequences sorted by length and packed while sequences x the longest stays within this
    /// many tokens: a pass costs about the same whatever the lengths, so long rollouts do not
    /// blow the memory that short ones fit in, and short ones are not run a few at a time.
    Tokens(usize),
}

impl MicroBatching {
    /// The rule a (validated) configuration asks for.
    pub(crate) fn of(config: &LearnerConfig) -> Self {
        match config.memory.max_tokens_per_micro_batch {
            0 => Self::Sequences(config.algorithm.micro_batch_size.max(1)),
            budget => Self::Tokens(budget),
        }
    }

    /// Splits `rows` (indices into a batch whose row `i` has `lengths[i]` tokens) into
    /// micro-batches. Deterministic: ties in length keep the rows' order. A row longer than
    /// a token budget gets a micro-batch of its own (the configuration rules that out).
    pub(crate) fn split(self, rows: &[i64], lengths: &[usize]) -> Vec<Vec<i64>> {
        match self {
            Self::Sequences(n) => rows.chunks(n).map(<[i64]>::to_vec).collect(),
            Self::Tokens(budget) => {
                let mut sorted = rows.to_vec();
                sorted.sort_by_key(|&r| std::cmp::Reverse(lengths[r as usize]));
                let mut out: Vec<Vec<i64>> = Vec::new();
                let mut longest = 0;
                for r in sorted {
                    let len = lengths[r as usize];
                    match out.last_mut() {
                        // Sorted longest first: the group's first row is its longest.
                        Some(group) if (group.len() + 1) * longest <= budget => group.push(r),
                        _ => {
                            longest = len;
                            out.push(vec![r]);
                        }
                    }
                }
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_keep_the_order_in_fixed_counts() {
        let groups = MicroBatching::Sequences(2).split(&[4, 1, 3, 0, 2], &[9; 5]);
        assert_eq!(groups, vec![vec![4, 1], vec![3, 0], vec![2]]);
    }

    #[test]
    fn tokens_pack_longest_first_within_the_budget() {
        // Lengths by row: 0:100 1:400 2:50 3:400 4:200 5:60
        let lengths = [100, 400, 50, 400, 200, 60];
        let groups = MicroBatching::Tokens(800).split(&[0, 1, 2, 3, 4, 5], &lengths);
        assert_eq!(groups, vec![vec![1, 3], vec![4, 0, 5, 2]]);
        for g in &groups {
            let longest = g.iter().map(|&r| lengths[r as usize]).max().unwrap();
            assert!(g.len() * longest <= 800, "{g:?}");
        }
        // Every row exactly once.
        let mut all: Vec<i64> = groups.concat();
        all.sort();
        assert_eq!(all, vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_row_over_the_budget_goes_alone() {
        let groups = MicroBatching::Tokens(100).split(&[0, 1, 2], &[30, 150, 30]);
        assert_eq!(groups, vec![vec![1], vec![0, 2]]);
    }
}
