//! A trajectory as training rows: steps whose contexts chain share one row.
//!
//! A row is a token sequence that holds the context of its first step and then, for each of
//! its steps, the action and the observation that the next step's context extends. A step
//! with a rebuilt context starts a new row holding its own context, so every action is
//! trained at the exact context it was sampled from. With no rebuilt context a trajectory
//! is one row, [`Trajectory::token_stream`], as it always was.

use std::ops::Range;

use super::Trajectory;

/// One training row of a trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainRow {
    /// The row's tokens.
    pub ids: Vec<u32>,
    /// The trajectory's steps whose actions lie in this row.
    pub steps: Range<usize>,
    /// Per step of `steps`: the position of its first action token in `ids`.
    pub action_starts: Vec<usize>,
}

impl Trajectory {
    /// The rows the learner trains on (see the module documentation). A row followed by a
    /// rebuilt context ends with its last action: the observation after it is part of no
    /// context the policy saw in that row. The last row keeps its trailing observation, as
    /// the one row of a chained trajectory always has.
    pub fn rows(&self) -> Vec<TrainRow> {
        let mut rows: Vec<TrainRow> = Vec::new();
        let mut current = TrainRow {
            ids: self.prompt_ids.clone(),
            steps: 0..0,
            action_starts: vec![],
        };
        for (k, (step, context)) in self.steps.iter().zip(self.contexts()).enumerate() {
            if k == 0 || step.rebuilt.is_some() {
                if k > 0 {
                    let end = current.action_starts.last().copied().unwrap_or(0)
                        + self.steps[k - 1].action_ids.len();
                    current.ids.truncate(end);
                    rows.push(std::mem::replace(
                        &mut current,
                        TrainRow {
                            ids: vec![],
                            steps: k..k,
                            action_starts: vec![],
                        },
                    ));
                }
                current.ids = context;
            }
            current.action_starts.push(current.ids.len());
            current.ids.extend(&step.action_ids);
            current.ids.extend(&step.observation_ids);
            current.steps.end = k + 1;
        }
        rows.push(current);
        rows
    }
}

#[cfg(test)]
mod tests {
    use crate::trajectory::test_support::traj;
    use crate::trajectory::RebuiltContext;

    #[test]
    fn a_chained_trajectory_is_one_row_equal_to_its_token_stream() {
        let t = traj(
            1,
            0,
            &[1, 2],
            &[
                (&[3, 4], &[-0.1, -0.2], &[5], 0.0, 0),
                (&[6], &[-0.3], &[7, 8], 0.0, 0),
            ],
            1.0,
        );
        let rows = t.rows();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].ids, t.token_stream());
        assert_eq!(rows[0].action_starts, vec![2, 5]);
        assert_eq!(rows[0].steps, 0..2);
        t.check_contexts().unwrap();
    }

    #[test]
    fn a_rebuilt_context_starts_a_row_with_its_own_context() {
        let mut t = traj(
            1,
            0,
            &[1, 2],
            &[
                (&[3, 4], &[-0.1, -0.2], &[5], 0.0, 0),
                (&[6], &[-0.3], &[7], 0.0, 0),
                (&[9], &[-0.4], &[], 0.0, 0),
            ],
            1.0,
        );
        // Step 1 sees [1, 2, 5] (step 0's action dropped), step 2 chains on it.
        let chained = [1, 2, 3, 4, 5];
        let rebuilt = RebuiltContext::between(&chained, &[1, 2, 5], "window");
        assert_eq!((rebuilt.kept, rebuilt.dropped), (2, 3));
        assert_eq!(rebuilt.apply(&chained), vec![1, 2, 5]);
        t.steps[1].rebuilt = Some(rebuilt);
        t.steps[1].context_len = 3;
        t.steps[2].context_len = 5;
        t.check_contexts().unwrap();
        let contexts: Vec<Vec<u32>> = t.contexts().collect();
        assert_eq!(
            contexts,
            vec![vec![1, 2], vec![1, 2, 5], vec![1, 2, 5, 6, 7]]
        );
        let rows = t.rows();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].ids, vec![1, 2, 3, 4]);
        assert_eq!(rows[0].steps, 0..1);
        assert_eq!(rows[1].ids, vec![1, 2, 5, 6, 7, 9]);
        assert_eq!(rows[1].action_starts, vec![3, 5]);
        assert_eq!(rows[1].steps, 1..3);
        // The full history is still there for viewers.
        assert_eq!(t.token_stream(), vec![1, 2, 3, 4, 5, 6, 7, 9]);
    }

    #[test]
    fn the_stored_form_round_trips_and_a_chained_step_stores_nothing_more() {
        // JSON is the form of rollouts files, checkpoints' pending trajectories and the
        // cluster's wire.
        let mut t = traj(
            1,
            0,
            &[1, 2],
            &[(&[3], &[-0.1], &[5], 0.0, 0), (&[6], &[-0.3], &[], 0.0, 0)],
            1.0,
        );
        let chained = serde_json::to_string(&t).unwrap();
        assert!(!chained.contains("rebuilt"), "{chained}");
        t.steps[1].rebuilt = Some(RebuiltContext::between(&[1, 2, 3, 5], &[1, 2, 5], "window"));
        t.steps[1].context_len = 3;
        let json = serde_json::to_string(&t).unwrap();
        let back: crate::trajectory::Trajectory = serde_json::from_str(&json).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.context(1), vec![1, 2, 5]);
        // A file written before steps had their own contexts reads as chained steps.
        let old: crate::trajectory::Trajectory = serde_json::from_str(&chained).unwrap();
        assert_eq!(old.rebuilt_steps(), 0);
    }

    #[test]
    fn inconsistent_stored_contexts_are_named() {
        let mut t = traj(4, 0, &[1], &[(&[2], &[-0.1], &[], 0.0, 0)], 0.0);
        t.steps[0].rebuilt = Some(RebuiltContext {
            kept: 5,
            ids: vec![],
            dropped: 0,
            by: "window".into(),
        });
        let err = t.check_contexts().unwrap_err().to_string();
        assert!(
            err.contains("trajectory 4 step 0") && err.contains("keeps 5"),
            "{err}"
        );
        t.steps[0].rebuilt = None;
        t.steps[0].context_len = 3;
        let err = t.check_contexts().unwrap_err().to_string();
        assert!(err.contains("it has 1"), "{err}");
    }
}
