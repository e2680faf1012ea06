//! When a sampled batch is not trained on, or teaches nothing.

use agent_r1_actors::learner::check_rewards;
use agent_r1_actors::trajectory::Trajectory;

/// Why a batch cannot be trained on, if it cannot: no trajectory at all (every episode
/// ended before its first turn), or a non-finite reward (a bug in the env or its reward,
/// which group and whitening estimators would spread to innocent episodes).
pub(crate) fn unusable(batch: &[Trajectory]) -> Option<(&'static str, String)> {
    if batch.is_empty() {
        return Some((
            "empty_batch",
            "no episode of the batch has a turn to train on".into(),
        ));
    }
    let bad: Vec<u64> = batch
        .iter()
        .filter(|t| check_rewards(t).is_err())
        .map(|t| t.episode_id)
        .collect();
    (!bad.is_empty()).then(|| {
        (
            "non_finite_reward",
            format!("episodes {bad:?} have a non-finite reward (a bug in the env or its reward function)"),
        )
    })
}

/// When every group of completed episodes (of two or more) has one return for all its
/// episodes, the distinct returns seen (as text); `None` when some group varies.
pub(crate) fn no_reward_signal(batch: &[Trajectory]) -> Option<String> {
    let mut groups: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for t in batch.iter().filter(|t| t.completed()) {
        groups
            .entry(t.group_id)
            .or_default()
            .push(t.episode_return());
    }
    let groups: Vec<&Vec<f64>> = groups.values().filter(|g| g.len() > 1).collect();
    let flat = |g: &&Vec<f64>| g.iter().all(|r| (r - g[0]).abs() <= 1e-12);
    if groups.is_empty() || !groups.iter().all(flat) {
        return None;
    }
    let mut seen: Vec<f64> = groups.iter().map(|g| g[0]).collect();
    seen.sort_by(f64::total_cmp);
    seen.dedup();
    Some(
        seen.iter()
            .take(8)
            .map(|r| format!("{r:+.3}"))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

#[cfg(test)]
mod tests {
    use agent_r1_actors::model::generate::FinishReason;
    use agent_r1_actors::trajectory::{EpisodeEnd, Step};
    use agent_r1_envs::task::Task;

    use super::*;

    fn trajectory(id: u64, reward: f64, step_reward: f64) -> Trajectory {
        Trajectory {
            episode_id: id,
            group_id: 0,
            task: Task {
                id: format!("t{id}"),
                data_source: "test".into(),
                question: String::new(),
                answers: vec![],
                prompt: None,
                extra: serde_json::Value::Null,
            },
            prompt_ids: vec![1, 2],
            steps: vec![Step {
                context_len: 2,
                action_ids: vec![3],
                logprobs: vec![-1.0],
                policy_version: 0,
                token_versions: vec![],
                finish_reason: FinishReason::Stop,
                tool_calls: vec![],
                observation_ids: vec![],
                reward: step_reward,
                generate_seconds: 0.0,
                tool_seconds: 0.0,
                prefill_tokens: 0,
                rebuilt: None,
            }],
            reward,
            metrics: Default::default(),
            end: EpisodeEnd::Completed {
                reason: "done".into(),
            },
            attempts: 1,
            wall_seconds: 0.0,
        }
    }

    #[test]
    fn empty_batches_and_non_finite_rewards_are_named() {
        assert_eq!(unusable(&[]).unwrap().0, "empty_batch");
        assert!(unusable(&[trajectory(1, 1.0, 0.5)]).is_none());
        for bad in [
            trajectory(7, f64::NAN, 0.0),
            trajectory(7, 1.0, f64::INFINITY),
        ] {
            let (reason, why) = unusable(&[trajectory(1, 1.0, 0.0), bad]).unwrap();
            assert_eq!(reason, "non_finite_reward");
            assert!(why.contains("[7]"), "{why}");
        }
    }

    #[test]
    fn groups_with_one_return_each_have_no_signal() {
        let group = |id: u64, g: u64, reward: f64| Trajectory {
            group_id: g,
            ..trajectory(id, reward, 0.0)
        };
        // Two groups, each flat: no signal, both returns named.
        let flat = [
            group(1, 0, -1.0),
            group(2, 0, -1.0),
            group(3, 1, 0.5),
            group(4, 1, 0.5),
        ];
        assert_eq!(no_reward_signal(&flat).as_deref(), Some("-1.000, +0.500"));
        // One group that varies is a signal; step rewards count in the return.
        let varied = [
            group(1, 0, -1.0),
            group(2, 0, -1.0),
            group(3, 1, 0.5),
            group(4, 1, 0.0),
        ];
        assert_eq!(no_reward_signal(&varied), None);
        let by_step = [
            group(1, 0, 0.0),
            Trajectory {
                group_id: 0,
                ..trajectory(2, 0.0, 1.0)
            },
        ];
        assert_eq!(no_reward_signal(&by_step), None);
        // Groups of one say nothing either way.
        assert_eq!(
            no_reward_signal(&[group(1, 0, 1.0), group(2, 1, 1.0)]),
            None
        );
    }
}
