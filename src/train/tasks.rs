//! The run's task stream: every epoch is a seeded shuffle of the training tasks.
//!
//! The stream is a pure function of (seed, position), so a checkpoint only needs the
//! position (`TrainingState::data_position`) for a resumed run to draw exactly the tasks an
//! uninterrupted run would have drawn; no generator state has to be serialised.

use agent_r1_envs::task::Task;

/// Tasks by position in an endless sequence of seeded epochs.
pub struct TaskStream {
    tasks: Vec<Task>,
    seed: u64,
    /// The permutation of the last epoch asked for (positions arrive in order).
    cached: Option<(u64, Vec<usize>)>,
}

/// SplitMix64: a small, well-mixed generator whose whole state is one number.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl TaskStream {
    /// A stream over `tasks` (must not be empty: the caller checks) seeded by `seed`.
    pub fn new(tasks: Vec<Task>, seed: u64) -> Self {
        Self {
            tasks,
            seed,
            cached: None,
        }
    }

    /// Tasks per epoch.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether there are no tasks.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    fn permutation(&self, epoch: u64) -> Vec<usize> {
        let mut state = self.seed ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let mut order: Vec<usize> = (0..self.tasks.len()).collect();
        for i in (1..order.len()).rev() {
            let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        order
    }

    /// The task at `position` (0-based over the whole run), or `None` without tasks.
    pub fn task(&mut self, position: u64) -> Option<Task> {
        let n = self.tasks.len() as u64;
        if n == 0 {
            return None;
        }
        let epoch = position / n;
        if self.cached.as_ref().map(|c| c.0) != Some(epoch) {
            self.cached = Some((epoch, self.permutation(epoch)));
        }
        let order = &self.cached.as_ref()?.1;
        self.tasks.get(order[(position % n) as usize]).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks(n: usize) -> Vec<Task> {
        (0..n)
            .map(|i| Task {
                id: i.to_string(),
                data_source: "t".into(),
                question: format!("q{i}"),
                answers: vec![],
                prompt: None,
                extra: serde_json::Value::Null,
            })
            .collect()
    }

    #[test]
    fn epochs_are_permutations_and_positions_are_reproducible() {
        let mut a = TaskStream::new(tasks(7), 3);
        let mut b = TaskStream::new(tasks(7), 3);
        let first: Vec<String> = (0..7).map(|p| a.task(p).unwrap().id).collect();
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(sorted, (0..7).map(|i| i.to_string()).collect::<Vec<_>>());
        // Out of order, from a fresh stream (a resume): the same tasks.
        assert_eq!(b.task(12).unwrap().id, a.task(12).unwrap().id);
        assert_eq!(b.task(3).unwrap().id, first[3]);
        let second: Vec<String> = (7..14).map(|p| a.task(p).unwrap().id).collect();
        assert_ne!(first, second, "epochs are shuffled differently");
        assert!(TaskStream::new(vec![], 0).task(0).is_none());
    }
}
