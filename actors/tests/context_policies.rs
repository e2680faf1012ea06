//! Context policies end to end: the real engine (a tiny model in libtorch), the real
//! tokenizer and chat template, a real tool pool.
//!
//! For each built-in policy, every recorded context equals what the policy's rules give
//! from the previous steps, rebuilt here independently in token space (nothing is decoded
//! and re-encoded), and every recorded log-probability equals a plain forward pass over the
//! step's own context and action. A rebuilt context reuses the engine's KV up to its first
//! changed token.
//!
//! Test double, by design: `Scripted` calls `echo` on the first turns whatever the
//! (untrained) model wrote, so episodes are long enough for the policies to act.

#[path = "support/tiny_agent.rs"]
mod tiny_agent;

use agent_r1_actors::testing;
use std::sync::Arc;

use agent_r1_actors::model::SamplingParams;
use agent_r1_actors::runtime::{
    ContextPolicies, ContextPolicy, EpisodeConfig, RolloutSetup, TurnRenderer,
};
use agent_r1_actors::sft::sequences_under_policy;
use agent_r1_actors::trajectory::Trajectory;
use agent_r1_envs::env::{Env, Score, TurnOutcome};
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallError, Tool, ToolCall, ToolOutput};
use async_trait::async_trait;
use serde_json::{json, Value};
use tiny_agent::{assert_logprobs_match_forward, collect, task, tiny_agent, TinyAgent};

/// Tool turns per episode (`max_turns` ends it on the turn after).
const CALLS: usize = 6;

struct Echo;

#[async_trait]
impl Tool for Echo {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "Repeats its text."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    }
    async fn call(&self, args: Value) -> agent_r1_envs::Result<ToolOutput> {
        Ok(ToolOutput::text(format!(
            "echo: {}",
            args["text"].as_str().unwrap_or("")
        )))
    }
}

/// Calls `echo` on every turn, whatever the model wrote; episodes end at `max_turns`.
struct Scripted;

/// What every call echoes.
const ECHOED: &str = "again";

impl Env for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn tool_names(&self) -> Vec<String> {
        vec!["echo".into()]
    }
    fn reset(&self, task: &Task) -> agent_r1_envs::Result<Vec<Message>> {
        Ok(vec![
            Message::system("You are a test agent."),
            Message::user(task.question.clone()),
        ])
    }
    fn on_turn(
        &self,
        _task: &Task,
        _text: &str,
        _calls: Vec<Result<ToolCall, CallError>>,
    ) -> TurnOutcome {
        TurnOutcome::Calls(vec![Ok(ToolCall {
            name: "echo".into(),
            arguments: json!({ "text": ECHOED }),
        })])
    }
    fn score(&self, _task: &Task, transcript: &[Message]) -> Score {
        Score {
            reward: transcript.len() as f64,
            metrics: Default::default(),
        }
    }
}

fn renderer(f: &TinyAgent) -> Arc<TurnRenderer> {
    Arc::new(TurnRenderer::new(f.tokenizer.clone(), vec![Echo.spec()], None).unwrap())
}

fn policy(name: &str, options: Value) -> Arc<dyn ContextPolicy> {
    ContextPolicies::with_builtins()
        .create(name, &options)
        .unwrap()
}

fn rollout(f: &TinyAgent, policy: Arc<dyn ContextPolicy>, episodes: usize) -> Vec<Trajectory> {
    let renderer = renderer(f);
    let end = renderer.end_of_turn_id();
    let setup = RolloutSetup {
        engine: f.engine.clone().into(),
        env: (Arc::new(Scripted) as Arc<dyn Env>).into(),
        tools: vec![Arc::new(Echo)],
        renderer,
        context_policy: policy,
        episode: EpisodeConfig {
            max_turns: CALLS + 1,
            max_context: 2048,
            sampling: SamplingParams {
                temperature: 1.0,
                max_new_tokens: 10,
                stop_token_ids: vec![end],
                ..Default::default()
            },
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
    let tasks = (0..episodes)
        .map(|i| (task(format!("item {i}")), i as u64))
        .collect();
    collect(setup, tasks).1
}

/// Prints what the engine prefilled against what re-prefilling every context would cost.
fn report_prefill(policy: &str, trajectories: &[Trajectory]) -> (u64, u64) {
    let steps = trajectories.iter().flat_map(|t| &t.steps);
    let prefilled: u64 = steps.clone().map(|s| s.prefill_tokens as u64).sum();
    let contexts: u64 = steps.map(|s| s.context_len as u64).sum();
    eprintln!(
        "{policy}: prefilled {prefilled} of {contexts} context tokens ({:.1}%) over {} episodes",
        100.0 * prefilled as f64 / contexts.max(1) as f64,
        trajectories.len()
    );
    (prefilled, contexts)
}

/// The tool message of each tool turn, as the env's default `observe` renders it.
fn echo_message() -> Message {
    Message::tool(format!("echo: {ECHOED}"))
}

#[test]
fn window_contexts_follow_the_rule_and_logprobs_match_a_forward_pass() {
    let f = tiny_agent(8, 2048);
    let turns = 2;
    let trajectories = rollout(&f, policy("window", json!({ "turns": turns })), 4);
    assert_eq!(trajectories.len(), 4);
    for t in &trajectories {
        assert_eq!(t.steps.len(), CALLS + 1, "{:?}", t.end);
        let contexts: Vec<Vec<u32>> = t.contexts().collect();
        for (k, (context, s)) in contexts.iter().zip(&t.steps).enumerate() {
            // The rule: the prompt and the last `turns` turns, each as sampled and observed.
            let mut expected = t.prompt_ids.clone();
            for s in &t.steps[k.saturating_sub(turns)..k] {
                expected.extend(&s.action_ids);
                expected.extend(&s.observation_ids);
            }
            assert_eq!(context, &expected, "episode {} step {k}", t.episode_id);
            assert_eq!(s.rebuilt.is_some(), k > turns, "step {k}");
            if let Some(r) = &s.rebuilt {
                assert_eq!(r.by, "window");
                assert!(r.kept >= t.prompt_ids.len());
                // Only what follows the reused head was prefilled.
                assert!(
                    s.prefill_tokens <= s.context_len - t.prompt_ids.len(),
                    "step {k}: prefilled {} of {}",
                    s.prefill_tokens,
                    s.context_len
                );
            }
        }
        assert_eq!(t.rows().len(), t.steps.len() - turns);
        assert_logprobs_match_forward(&f.model, t);
    }
    let (prefilled, contexts) = report_prefill("window(2)", &trajectories);
    assert!(prefilled < contexts);
}

#[test]
fn elided_contexts_follow_the_rule_and_logprobs_match_a_forward_pass() {
    let f = tiny_agent(8, 2048);
    let renderer = renderer(&f);
    let keep = 2;
    let placeholder = "[elided]";
    let trajectories = rollout(
        &f,
        policy(
            "elide",
            json!({ "keep_turns": keep, "placeholder": placeholder }),
        ),
        4,
    );
    for t in &trajectories {
        assert_eq!(t.steps.len(), CALLS + 1);
        let contexts: Vec<Vec<u32>> = t.contexts().collect();
        for (k, (context, step)) in contexts.iter().zip(&t.steps).enumerate() {
            let mut expected = t.prompt_ids.clone();
            for (j, s) in t.steps[..k].iter().enumerate() {
                expected.extend(&s.action_ids);
                if j + keep < k {
                    // Only the placeholder is rendered anew; the action ids are as sampled.
                    let elided = Message::tool(placeholder);
                    expected.extend(renderer.continuation(&s.action_ids, &[elided]).unwrap());
                } else {
                    expected.extend(&s.observation_ids);
                }
            }
            assert_eq!(context, &expected, "episode {} step {k}", t.episode_id);
            if let Some(r) = &step.rebuilt {
                assert_eq!(r.by, "elide");
                assert!(r.kept > t.prompt_ids.len());
                assert!(step.prefill_tokens < step.context_len);
            }
        }
        assert_eq!(t.rebuilt_steps(), t.steps.len() - 1 - keep);
        assert_logprobs_match_forward(&f.model, t);
    }
    let (prefilled, contexts) = report_prefill("elide(2)", &trajectories);
    assert!(prefilled < contexts);
}

#[test]
fn summary_steps_are_trained_steps_and_their_contexts_follow_the_rule() {
    let f = tiny_agent(8, 2048);
    let renderer = renderer(&f);
    let request = "Summarise.";
    let budget = 120;
    let trajectories = rollout(
        &f,
        policy(
            "summary",
            json!({ "budget_tokens": budget, "request": request }),
        ),
        4,
    );
    let mut summaries = 0;
    for t in &trajectories {
        let contexts: Vec<Vec<u32>> = t.contexts().collect();
        let mut chained = t.prompt_ids.clone();
        for k in 0..t.steps.len() {
            let s = &t.steps[k];
            match s.rebuilt.as_ref().map(|r| r.by.as_str()) {
                None => assert_eq!(contexts[k], chained, "step {k}"),
                Some("summary") if s.observation_ids.is_empty() && k + 1 < t.steps.len() => {
                    // A summary turn: the chained context passed the budget; the request is a
                    // user message after the last tool response.
                    summaries += 1;
                    assert!(chained.len() > budget);
                    let last = &t.steps[k - 1];
                    let mut expected = contexts[k - 1].clone();
                    expected.extend(&last.action_ids);
                    expected.extend(
                        renderer
                            .continuation(
                                &last.action_ids,
                                &[echo_message(), Message::user(request)],
                            )
                            .unwrap(),
                    );
                    assert_eq!(contexts[k], expected, "summary step {k}");
                    // The next context: the prompt, the summary as sampled, the last response.
                    let mut next = t.prompt_ids.clone();
                    next.extend(&s.action_ids);
                    next.extend(
                        renderer
                            .continuation(&s.action_ids, &[echo_message()])
                            .unwrap(),
                    );
                    assert_eq!(contexts[k + 1], next, "after the summary at step {k}");
                }
                Some(other) => assert_eq!(other, "summary", "step {k}"),
            }
            chained = contexts[k].clone();
            chained.extend(&s.action_ids);
            chained.extend(&s.observation_ids);
        }
        assert_logprobs_match_forward(&f.model, t);
    }
    assert!(summaries > 0, "no episode passed the budget");
    report_prefill("summary(120)", &trajectories);
}

#[test]
fn full_keeps_one_chained_row() {
    let f = tiny_agent(8, 2048);
    let trajectories = rollout(&f, policy("full", json!({})), 4);
    for t in &trajectories {
        assert_eq!(t.rebuilt_steps(), 0);
        assert_eq!(t.rows().len(), 1);
        assert_eq!(t.rows()[0].ids, t.token_stream());
        assert_logprobs_match_forward(&f.model, t);
    }
    report_prefill("full", &trajectories);
}

#[test]
fn bad_policy_options_are_named() {
    let policies = ContextPolicies::with_builtins();
    let err = |name: &str, options: Value| {
        policies
            .create(name, &options)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let e = err("window", json!({ "turns": 0 }));
    assert!(
        e.contains("env.context.turns") && e.contains("at least 1"),
        "{e}"
    );
    let e = err("elide", json!({ "keep_turns": 0 }));
    assert!(e.contains("env.context.keep_turns"), "{e}");
    let e = err("window", json!({ "turn": 3 }));
    assert!(e.contains("env.context.turn"), "{e}");
    let e = err("sliding", json!({}));
    assert!(
        e.contains("unknown context policy `sliding`") && e.contains("window"),
        "{e}"
    );
    let summary = policies
        .create("summary", &json!({ "budget_tokens": 4096 }))
        .unwrap();
    let e = summary.check_fits(2048).unwrap_err();
    assert!(
        e.contains("budget_tokens 4096") && e.contains("2048"),
        "{e}"
    );
    assert!(summary.check_fits(8192).is_ok());
}

/// The warm start teaches each turn in the context the policy gives it at rollout time: with
/// a window of one turn, the third turn's sequence is the prompt, the second turn and its
/// observation, then the third action (the only part trained); with `full`, the whole
/// demonstration is one chained sequence.
#[test]
fn demonstrations_under_a_policy_teach_the_contexts_it_builds() {
    let dir = tempfile::tempdir().unwrap();
    agent_r1_actors::tiny_tokenizer::write_tiny_tokenizer(dir.path(), None, 512, &[]).unwrap();
    let tokenizer =
        Arc::new(agent_r1_actors::tokenizer::HfTokenizer::from_dir(dir.path()).unwrap());
    let renderer = TurnRenderer::new(tokenizer.clone(), vec![Echo.spec()], None).unwrap();
    let call = |q: &str| {
        format!("<think>look</think>\n<tool_call>\n{{\"name\": \"echo\", \"arguments\": {{\"text\": \"{q}\"}}}}\n</tool_call>")
    };
    let answer = "<think>done</think>\n<answer>hi</answer>";
    let prompt = vec![
        Message::system("Use the tool."),
        Message::user("Question: hi?"),
    ];
    let mut messages = prompt.clone();
    for (q, result) in [("a", "first result"), ("b", "second result")] {
        messages.push(Message::assistant(call(q)));
        messages.push(Message::tool(result));
    }
    messages.push(Message::assistant(answer));

    let end = renderer.end_of_turn_id();
    let prompt_ids = renderer.prompt(&prompt).unwrap();
    let action = |text: &str| {
        let mut ids = tokenizer.encode(text, false).unwrap();
        ids.push(end);
        ids
    };
    let (a1, a2, a3) = (action(&call("a")), action(&call("b")), action(answer));
    let o1 = renderer
        .continuation(&a1, &[Message::tool("first result")])
        .unwrap();
    let o2 = renderer
        .continuation(&a2, &[Message::tool("second result")])
        .unwrap();

    let window = sequences_under_policy(
        &renderer,
        policy("window", json!({"turns": 1})).as_ref(),
        &messages,
    )
    .unwrap();
    assert_eq!(window.len(), 2, "the third turn's context is rebuilt");
    let first: Vec<u32> = [&prompt_ids[..], &a1, &o1, &a2, &o2].concat();
    assert_eq!(window[0].ids, first);
    let second: Vec<u32> = [&prompt_ids[..], &a2, &o2, &a3].concat();
    assert_eq!(window[1].ids, second);
    let trained_at = |s: &agent_r1_actors::sft::SftSequence| -> Vec<u32> {
        s.ids
            .iter()
            .zip(&s.trained)
            .filter(|(_, t)| **t)
            .map(|(id, _)| *id)
            .collect()
    };
    assert_eq!(trained_at(&window[0]), [&a1[..], &a2[..]].concat());
    assert_eq!(trained_at(&window[1]), a3);

    let full =
        sequences_under_policy(&renderer, policy("full", json!({})).as_ref(), &messages).unwrap();
    assert_eq!(full.len(), 1);
    assert_eq!(full[0].ids, [&first[..], &a3[..]].concat());
    assert_eq!(trained_at(&full[0]), [&a1[..], &a2[..], &a3[..]].concat());
}
