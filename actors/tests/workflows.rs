//! User-written workflows through the runtime: the real engine (a tiny model in libtorch),
//! the real tokenizer and chat template, the real learner.
//!
//! `AnswerThenCheck` is a two-call workflow as a user's crate writes it: an answer, then a
//! check of that answer in a context of its own (another system prompt, the answer's
//! sampled ids reused), each a step with its own reward. Its `panic-*` and `hang-*` tasks are
//! fault injection: a workflow that panics or never returns fails its episode with the
//! reason while the others complete.

#[path = "support/tiny_agent.rs"]
mod tiny_agent;

use agent_r1_actors::testing;
use std::sync::Arc;
use std::time::Duration;

use agent_r1_actors::learner::{
    AlgorithmConfig, Estimator, KlConfig, Learner, LearnerConfig, LearnerModels,
};
use agent_r1_actors::model::{Placement, PolicyModel, SamplingParams};
use agent_r1_actors::runtime::{
    Agent, EnvSource, EpisodeConfig, RolloutReport, RolloutSetup, TurnRenderer, Workflow,
    WorkflowOutcome,
};
use agent_r1_actors::trajectory::{EpisodeEnd, Trajectory};
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use async_trait::async_trait;
use tiny_agent::{assert_logprobs_match_forward, collect, task, tiny_agent, TinyAgent};

const CHECK: &str = "Is that answer right? Reply yes or no.";

struct AnswerThenCheck;

/// The check step's context: another system prompt and the question, then the answer as
/// sampled, then the request to check it.
fn check_context(
    agent: &Agent,
    task: &Task,
    answer_ids: &[u32],
) -> agent_r1_actors::Result<Vec<u32>> {
    let r = agent.renderer();
    let mut ids = r.prompt(&[
        Message::system("You check answers."),
        Message::user(task.question.clone()),
    ])?;
    ids.extend(answer_ids);
    ids.extend(r.continuation(answer_ids, &[Message::user(CHECK)])?);
    Ok(ids)
}

#[async_trait]
impl Workflow for AnswerThenCheck {
    fn name(&self) -> &str {
        "answer_then_check"
    }

    async fn run(&self, task: &Task, agent: &Agent) -> agent_r1_actors::Result<WorkflowOutcome> {
        if task.id.starts_with("panic-") {
            panic!("injected workflow panic for {}", task.id);
        }
        if task.id.starts_with("hang-") {
            std::future::pending::<()>().await;
        }
        if task.id.starts_with("empty-") {
            return Ok(WorkflowOutcome::default());
        }
        let prompt = agent.renderer().prompt(&[
            Message::system("You answer questions."),
            Message::user(task.question.clone()),
        ])?;
        let answer = agent.generate(prompt).await?;
        let check = agent
            .generate(check_context(agent, task, &answer.token_ids)?)
            .await?;
        // Best of two on the check's context, concurrently: two more steps.
        let again = check_context(agent, task, &answer.token_ids)?;
        let (a, b) = futures::join!(agent.generate(again.clone()), agent.generate(again));
        let (a, b) = (a?, b?);
        Ok(WorkflowOutcome {
            reward: if answer.token_ids.len() % 2 == 0 {
                1.0
            } else {
                0.0
            },
            step_rewards: vec![
                (answer.step, 0.5),
                (check.step, 0.25),
                (a.step, 0.0),
                (b.step, 0.0),
            ],
            metrics: [("answer_tokens".to_string(), answer.token_ids.len() as f64)].into(),
        })
    }
}

fn rollout(
    f: &TinyAgent,
    ids: Vec<String>,
    workflow_timeout: Duration,
) -> (RolloutReport, Vec<Trajectory>) {
    let renderer = Arc::new(TurnRenderer::new(f.tokenizer.clone(), vec![], None).unwrap());
    let end = renderer.end_of_turn_id();
    let setup = RolloutSetup {
        engine: f.engine.clone().into(),
        env: EnvSource::Workflow {
            workflow: Arc::new(AnswerThenCheck),
            tool_names: vec![],
        },
        tools: vec![],
        renderer,
        context_policy: Arc::new(agent_r1_actors::runtime::context_policy::Full),
        episode: EpisodeConfig {
            max_context: 1024,
            sampling: SamplingParams {
                temperature: 1.0,
                max_new_tokens: 8,
                stop_token_ids: vec![end],
                ..Default::default()
            },
            workflow_timeout,
            ..testing::episode_config()
        },
        concurrency: 4,
        tool_queue_capacity: 64,
        restart: Default::default(),
        validate: Arc::new(|_, _| Ok(())),
        live: Default::default(),
        stall: None,
        calls: Default::default(),
        in_flight: Default::default(),
    };
    let tasks = ids
        .into_iter()
        .enumerate()
        .map(|(i, id)| (task(id), i as u64 / 2))
        .collect();
    collect(setup, tasks)
}

#[test]
fn a_two_call_workflow_records_each_call_as_a_step_with_its_own_context_and_trains() {
    let f = tiny_agent(8, 1024);
    let renderer = TurnRenderer::new(f.tokenizer.clone(), vec![], None).unwrap();
    let (report, trajectories) = rollout(
        &f,
        (0..4).map(|i| format!("q-{i}")).collect(),
        Duration::from_secs(3600),
    );
    assert_eq!(report.summary.completed, 4, "{report:?}");
    for t in &trajectories {
        assert!(t.completed(), "{:?}", t.end);
        assert_eq!(t.steps.len(), 4);
        let contexts: Vec<Vec<u32>> = t.contexts().collect();
        // The answer: the workflow's prompt, as stored.
        let prompt = renderer
            .prompt(&[
                Message::system("You answer questions."),
                Message::user(t.task.question.clone()),
            ])
            .unwrap();
        assert_eq!(contexts[0], prompt);
        assert!(t.steps[0].rebuilt.is_none());
        // The check: its own context, built from the answer's sampled ids.
        let mut check = renderer
            .prompt(&[
                Message::system("You check answers."),
                Message::user(t.task.question.clone()),
            ])
            .unwrap();
        check.extend(&t.steps[0].action_ids);
        check.extend(
            renderer
                .continuation(&t.steps[0].action_ids, &[Message::user(CHECK)])
                .unwrap(),
        );
        for (k, (context, step)) in contexts.iter().zip(&t.steps).enumerate().skip(1) {
            assert_eq!(context, &check, "step {k}");
            let r = step.rebuilt.as_ref().expect("a context of its own");
            assert_eq!(r.by, "answer_then_check");
        }
        // Step rewards where the workflow put them.
        assert_eq!(t.steps[0].reward, 0.5);
        assert_eq!(t.steps[1].reward, 0.25);
        assert_eq!(
            t.metrics["answer_tokens"],
            t.steps[0].action_ids.len() as f64
        );
        // Sampling log-probs equal a plain forward pass over each step's own context.
        assert_logprobs_match_forward(&f.model, t);
        assert_eq!(t.rows().len(), 4);
    }
    // The two concurrent calls drew their own samples: over four episodes they differ.
    assert!(
        trajectories
            .iter()
            .any(|t| t.steps[2].action_ids != t.steps[3].action_ids),
        "concurrent calls sampled the same tokens in every episode"
    );
    // The learner trains on them: every sampled token, each at its own context.
    let sampled: usize = trajectories.iter().map(Trajectory::generated_tokens).sum();
    let policy = PolicyModel::load(&f.path, Placement::default(), false).unwrap();
    let mut learner = Learner::new(
        LearnerModels {
            policy,
            critic: None,
            reference: None,
            teacher: None,
            critic_prefix: None,
        },
        LearnerConfig {
            algorithm: AlgorithmConfig {
                estimator: Estimator::Grpo,
                kl: KlConfig::OFF,
                critic_warmup_updates: 0,
                ..Default::default()
            },
            ..testing::learner_config()
        },
    )
    .unwrap();
    let stats = learner.update(trajectories).unwrap();
    assert!(
        stats.policy_loss.is_finite() && stats.policy_updated,
        "{stats:?}"
    );
    assert_eq!(stats.action_tokens as usize, sampled);
}

#[test]
fn a_panicking_hanging_or_empty_workflow_fails_its_episode_with_the_reason_and_the_run_goes_on() {
    let f = tiny_agent(8, 1024);
    let ids = vec![
        "q-0".to_string(),
        "panic-1".to_string(),
        "empty-3".to_string(),
        "q-4".to_string(),
    ];
    let (report, mut trajectories) = rollout(&f, ids, Duration::from_secs(3600));
    assert_eq!(report.summary.completed, 2, "{report:?}");
    assert_eq!(report.summary.failed, 2, "{report:?}");
    assert_eq!(trajectories.len(), 4, "every episode is delivered");
    // A workflow that never returns, alone, so that its short deadline is all it meets.
    let (report, hung) = rollout(&f, vec!["hang-2".to_string()], Duration::from_secs(2));
    assert_eq!(report.summary.failed, 1, "{report:?}");
    trajectories.extend(hung);
    let reason = |id: &str| match &trajectories.iter().find(|t| t.task.id == id).unwrap().end {
        EpisodeEnd::Failed { reason } => reason.clone(),
        other => panic!("{id} ended {other:?}"),
    };
    let r = reason("panic-1");
    assert!(
        r.contains("panicked") && r.contains("injected workflow panic"),
        "{r}"
    );
    let r = reason("hang-2");
    assert!(
        r.contains("stuck stage") && r.contains("workflow_timeout"),
        "{r}"
    );
    let r = reason("empty-3");
    assert!(r.contains("no generate call"), "{r}");
}
