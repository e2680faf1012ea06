//! Groups streamed trajectories into learner batches: a batch is the first `groups` groups
//! to complete (every episode of a task's group ended), sorted by (group id, episode id).
//! Group estimators (GRPO, RLOO) need whole groups; the order within a batch does not depend
//! on which group or episode finished first, so the learner's mini-batches (and with them
//! the weights) are the same whatever the timing, as an exact resume needs.

use std::collections::{BTreeMap, VecDeque};

use crate::trajectory::Trajectory;

/// Collects trajectories until whole groups, then whole batches, are ready.
#[derive(Debug)]
pub struct GroupBatcher {
    group_size: usize,
    groups_per_batch: usize,
    partial: BTreeMap<u64, Vec<Trajectory>>,
    complete: VecDeque<Vec<Trajectory>>,
}

impl GroupBatcher {
    /// Batches of `groups_per_batch` groups of `group_size` episodes (both at least 1).
    pub fn new(group_size: usize, groups_per_batch: usize) -> Self {
        Self {
            group_size: group_size.max(1),
            groups_per_batch: groups_per_batch.max(1),
            partial: BTreeMap::new(),
            complete: VecDeque::new(),
        }
    }

    /// Adds one finished trajectory (completed or failed: both end their group's slot);
    /// returns the group id when this completed its group.
    pub fn push(&mut self, trajectory: Trajectory) -> Option<u64> {
        let group = trajectory.group_id;
        let members = self.partial.entry(group).or_default();
        members.push(trajectory);
        if members.len() < self.group_size {
            return None;
        }
        let mut members = self.partial.remove(&group).unwrap_or_default();
        members.sort_by_key(|t| t.episode_id);
        self.complete.push_back(members);
        Some(group)
    }

    /// Complete groups waiting for a batch, without taking them (for a checkpoint).
    pub fn complete(&self) -> impl Iterator<Item = &Trajectory> + '_ {
        self.complete.iter().flatten()
    }

    /// The next batch, when enough groups are complete.
    pub fn next_batch(&mut self) -> Option<Vec<Trajectory>> {
        (self.complete.len() >= self.groups_per_batch).then(|| {
            let mut batch: Vec<Trajectory> = self
                .complete
                .drain(..self.groups_per_batch)
                .flatten()
                .collect();
            batch.sort_by_key(|t| (t.group_id, t.episode_id));
            batch
        })
    }

    /// Complete groups waiting for a batch.
    pub fn complete_groups(&self) -> usize {
        self.complete.len()
    }

    /// Trajectories of groups with some but not all of their episodes ended, without taking
    /// them (for a checkpoint).
    pub fn partial(&self) -> impl Iterator<Item = &Trajectory> + '_ {
        self.partial.values().flatten()
    }

    /// Groups with some but not all of their episodes ended.
    pub fn partial_groups(&self) -> impl Iterator<Item = u64> + '_ {
        self.partial.keys().copied()
    }

    /// Every trajectory held: complete groups first (in completion order), then partial ones.
    pub fn take_all(&mut self) -> (Vec<Trajectory>, Vec<Trajectory>) {
        let complete = self.complete.drain(..).flatten().collect();
        let partial = std::mem::take(&mut self.partial)
            .into_values()
            .flatten()
            .collect();
        (complete, partial)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::EpisodeEnd;

    fn t(group: u64, episode: u64) -> Trajectory {
        Trajectory {
            episode_id: episode,
            group_id: group,
            task: agent_r1_envs::task::Task {
                id: format!("t{group}"),
                data_source: "test".into(),
                question: String::new(),
                answers: vec![],
                prompt: None,
                extra: serde_json::Value::Null,
            },
            prompt_ids: vec![],
            steps: vec![],
            reward: 0.0,
            metrics: Default::default(),
            end: EpisodeEnd::Completed {
                reason: "done".into(),
            },
            attempts: 1,
            wall_seconds: 0.0,
        }
    }

    #[test]
    fn batches_hold_the_first_complete_groups_sorted_whatever_the_finishing_order() {
        let mut b = GroupBatcher::new(2, 2);
        assert_eq!(b.push(t(7, 1)), None);
        b.push(t(3, 4));
        assert!(b.next_batch().is_none());
        assert_eq!(b.push(t(3, 2)), Some(3));
        assert!(b.next_batch().is_none(), "one complete group of two");
        b.push(t(9, 5));
        b.push(t(7, 0));
        b.push(t(1, 8));
        b.push(t(1, 9));
        let batch = b.next_batch().expect("groups 3 and 7 completed first");
        let ids: Vec<(u64, u64)> = batch.iter().map(|t| (t.group_id, t.episode_id)).collect();
        assert_eq!(ids, vec![(3, 2), (3, 4), (7, 0), (7, 1)]);
        // Group 1 completed after 3 and 7: it waits for the next batch, wherever its id sorts.
        b.push(t(5, 6));
        b.push(t(5, 7));
        let batch = b.next_batch().expect("groups 1 and 5");
        let ids: Vec<(u64, u64)> = batch.iter().map(|t| (t.group_id, t.episode_id)).collect();
        assert_eq!(ids, vec![(1, 8), (1, 9), (5, 6), (5, 7)]);
        assert_eq!(b.partial_groups().collect::<Vec<_>>(), vec![9]);
        assert_eq!(
            b.partial().map(|t| t.episode_id).collect::<Vec<_>>(),
            vec![5]
        );
        let (complete, partial) = b.take_all();
        assert!(complete.is_empty());
        assert_eq!(partial.len(), 1);
    }
}
