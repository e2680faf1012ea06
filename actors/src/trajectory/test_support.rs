//! Trajectories built from a few literal steps, for tests.

use std::collections::BTreeMap;

use agent_r1_envs::task::Task;

use crate::model::generate::FinishReason;
use crate::trajectory::{EpisodeEnd, Step, Trajectory};

/// One test step: `(action ids, logprobs, observation ids, process reward, version)`.
pub(crate) type TestStep<'a> = (&'a [u32], &'a [f32], &'a [u32], f64, u64);

/// A trajectory from test steps.
pub(crate) fn traj(
    episode_id: u64,
    group_id: u64,
    prompt: &[u32],
    steps: &[TestStep<'_>],
    reward: f64,
) -> Trajectory {
    let mut context_len = prompt.len();
    let steps = steps
        .iter()
        .map(|(a, lp, o, r, v)| {
            let s = Step {
                context_len,
                action_ids: a.to_vec(),
                logprobs: lp.to_vec(),
                policy_version: *v,
                token_versions: vec![],
                finish_reason: FinishReason::Stop,
                tool_calls: vec![],
                observation_ids: o.to_vec(),
                reward: *r,
                generate_seconds: 0.0,
                tool_seconds: 0.0,
                prefill_tokens: 0,
                rebuilt: None,
            };
            context_len += a.len() + o.len();
            s
        })
        .collect();
    Trajectory {
        episode_id,
        group_id,
        task: Task {
            id: format!("t{episode_id}"),
            data_source: "test".into(),
            question: String::new(),
            answers: vec![],
            prompt: None,
            extra: serde_json::Value::Null,
        },
        prompt_ids: prompt.to_vec(),
        steps,
        reward,
        metrics: BTreeMap::new(),
        end: EpisodeEnd::Completed {
            reason: "done".into(),
        },
        attempts: 1,
        wall_seconds: 0.0,
    }
}
