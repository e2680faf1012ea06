//! The worked example of docs/envs.md ("Adding an env"), verbatim: one type implementing
//! `Env` and one registration line.

use agent_r1_envs::env::{Env, Score, TurnOutcome};
use agent_r1_envs::envs::EnvRegistry;
use agent_r1_envs::message::Message;
use agent_r1_envs::reward::hotpotqa::best_score;
use agent_r1_envs::reward::qa::final_answer;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool_call::ToolCallFormat;
use serde_json::{json, Value};

// --- begin docs/envs.md example ---
/// Closed-book QA: no tools; the model answers at once inside <answer>.
pub struct ClosedBookQa {
    instruction: String,
}

impl ClosedBookQa {
    pub fn from_options(options: &Value) -> agent_r1_envs::Result<Self> {
        let instruction = options
            .get("instruction")
            .and_then(Value::as_str)
            .unwrap_or("Answer inside <answer>...</answer>.")
            .to_string();
        Ok(Self { instruction })
    }
}

impl Env for ClosedBookQa {
    fn name(&self) -> &str {
        "closed_book_qa"
    }

    fn tool_names(&self) -> Vec<String> {
        Vec::new()
    }

    fn reset(&self, task: &Task) -> agent_r1_envs::Result<Vec<Message>> {
        Ok(vec![
            Message::system(self.instruction.clone()),
            Message::user(task.question.clone()),
        ])
    }

    fn score(&self, task: &Task, transcript: &[Message]) -> Score {
        let answer = final_answer(transcript).unwrap_or("");
        let s = best_score(answer, &task.answers);
        Score {
            reward: s.em,
            metrics: [("em".to_string(), s.em), ("f1".to_string(), s.f1)].into(),
        }
    }
}
// --- end docs/envs.md example ---

fn task() -> Task {
    Task {
        id: "t1".into(),
        data_source: "test".into(),
        question: "What is the capital of France?".into(),
        answers: vec!["Paris".into()],
        prompt: None,
        extra: Value::Null,
    }
}

#[test]
fn a_user_env_is_one_type_and_one_registration_line() {
    let mut registry = EnvRegistry::with_builtins();
    registry.register("closed_book_qa", |o: &Value| {
        Ok(Box::new(ClosedBookQa::from_options(o)?) as Box<dyn Env>)
    });
    assert!(registry.contains("closed_book_qa"));
    assert_eq!(
        registry.names(),
        vec![
            "closed_book_qa",
            "math",
            "multihop_qa",
            "synthetic_math",
            "synthetic_multihop"
        ]
    );

    let Ok(env) = registry.create("closed_book_qa", &json!({"instruction": "Be brief."})) else {
        panic!("closed_book_qa should build");
    };
    let task = task();
    let first = env.reset(&task).expect("reset");
    assert_eq!(first[0].content, "Be brief.");
    let turn = "<answer>The Paris</answer>";
    assert_eq!(
        env.on_turn(&task, turn, ToolCallFormat::Hermes.parse(turn)),
        TurnOutcome::Done
    );
    let mut transcript = first;
    transcript.push(Message::assistant(turn));
    let score = env.score(&task, &transcript);
    assert_eq!(score.reward, 1.0);
    assert_eq!(score.metrics["f1"], 1.0);
    transcript.pop();
    transcript.push(Message::assistant("<answer>Lyon</answer>"));
    assert_eq!(env.score(&task, &transcript).reward, 0.0);
}
