//! The math envs: the generator (determinism, split, every expression solves its problem),
//! demonstrations through the real calculator scored by the env, the registry's options, and
//! GSM8K files read and scored by `math`.

use std::collections::BTreeSet;

use agent_r1_envs::dataset::{load_tasks, DatasetFormat, LoadOptions};
use agent_r1_envs::demo::DemoConfig;
use agent_r1_envs::env::Env;
use agent_r1_envs::envs::{EnvRegistry, MathEnv, MathOptions, SyntheticMathEnv};
use agent_r1_envs::generated_env::GeneratedEnv;
use agent_r1_envs::math::problems::template_names;
use agent_r1_envs::math::{calculate, MathConfig, MathWorld};
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Split;
use agent_r1_envs::tool::Tool;
use agent_r1_envs::tools::calculator::CalculatorTool;
use agent_r1_envs::Error;
use serde_json::json;

fn world(seed: u64) -> MathWorld {
    MathWorld::generate(&MathConfig {
        seed,
        ..MathConfig::default()
    })
    .expect("world")
}

#[test]
fn the_generator_is_seeded_split_and_every_expression_solves_its_problem() {
    let w = world(0);
    assert_eq!(w, world(0), "same seed, same problems");
    assert_ne!(w.problems, world(1).problems);
    assert_eq!(w.problems.len(), 400);
    let texts: BTreeSet<&str> = w.problems.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(texts.len(), 400, "problems are distinct");
    assert_eq!(w.problems(Split::Test).len(), 80);
    let templates: BTreeSet<&str> = w.problems.iter().map(|p| p.template).collect();
    assert_eq!(templates.len(), template_names().len(), "{templates:?}");
    for p in &w.problems {
        assert!(p.answer >= 0, "{p:?}");
        assert_eq!(calculate(&p.expression), p.answer.to_string(), "{p:?}");
        assert!(p.text.ends_with('?'), "{p:?}");
    }
    let tasks = w.tasks(Split::Train);
    assert_eq!(tasks.len(), 320);
    assert_eq!(
        tasks[0].answers,
        vec![w.problems(Split::Train)[0].answer.to_string()]
    );
    assert_eq!(tasks[0].extra["split"], "train");
}

#[test]
fn a_tokenizer_keeps_every_number_of_the_problems_whole_up_to_999() {
    let w = world(0);
    let words: BTreeSet<String> = w.whole_numbers().into_iter().collect();
    for p in &w.problems {
        for n in p
            .text
            .split(|c: char| !c.is_ascii_digit())
            .filter(|n| !n.is_empty())
        {
            assert!(words.contains(n), "{n} of {p:?}");
        }
        assert!(words.contains(&(p.answer + 9).to_string()), "{p:?}");
    }
    let big = MathWorld::generate(&MathConfig {
        max_number: 100_000,
        ..MathConfig::default()
    })
    .expect("world");
    assert_eq!(big.whole_numbers().len(), 1000, "at most 0..=999");
}

#[tokio::test]
async fn gold_demos_through_the_calculator_score_one_and_slips_score_zero() {
    let env = SyntheticMathEnv::from_options(&json!({"problems": {"seed": 2, "n_problems": 60}}))
        .expect("env");
    let tasks = env.tasks(Split::Train);
    let demos = env.demonstrations(&DemoConfig {
        early_wrong_answer_prob: 0.4,
        variants_per_question: 5,
        seed: 1,
    });
    assert_eq!(demos.len(), 5 * tasks.len());
    let calculator = CalculatorTool;
    for (chunk, task) in demos.chunks(5).zip(&tasks) {
        assert_eq!(chunk.iter().filter(|d| !d.correct).count(), 2, "0.4 of 5");
        for demo in chunk {
            assert_eq!(demo.task_id, task.id);
            let mut observations = Vec::new();
            for turn in &demo.turns {
                if let Some(call) = &turn.call {
                    assert_eq!(call.tool, "calculator");
                    let out = calculator.call(call.arguments.clone()).await.expect("calc");
                    observations.push(out.text);
                }
            }
            let mut observations = observations.into_iter();
            let transcript = demo.messages(env.reset(task).expect("reset"), |_| {
                observations.next().expect("one observation per call")
            });
            let score = env.score(task, &transcript);
            let want = if demo.correct { 1.0 } else { 0.0 };
            assert_eq!(score.reward, want, "{transcript:#?}");
            assert_eq!(
                score.metrics["format"],
                if demo.correct { 1.0 } else { 0.5 }
            );
        }
    }
    assert!(env.tokenizer_text().contains(&tasks[0].question));
}

#[test]
fn options_are_checked_and_errors_name_the_key() {
    let registry = EnvRegistry::with_builtins();
    assert!(registry.generates_tasks("synthetic_math"));
    assert!(!registry.generates_tasks("math"));
    let env = registry
        .create_generated("synthetic_math", &json!({"problems": {"n_problems": 30}}))
        .expect("env");
    assert_eq!(
        env.tasks(Split::Train).len() + env.tasks(Split::Test).len(),
        30
    );
    let err = |name: &str, options: serde_json::Value| match registry.create(name, &options) {
        Err(Error::Config { key, message }) => format!("{key}: {message}"),
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("{options} was accepted"),
    };
    assert!(err("math", json!({"tolerence": 0.1})).starts_with("env.tolerence:"));
    assert!(err("math", json!({"tolerance": 0.5})).contains("[0, 0.1]"));
    let e = err("synthetic_math", json!({"problems": {"n_problems": 0}}));
    assert!(e.starts_with("env.problems.n_problems: got 0"), "{e}");
    let e = err("synthetic_math", json!({"problems": {"max_number": 5}}));
    assert!(e.starts_with("env.problems.max_number"), "{e}");
    let e = err("synthetic_math", json!({"problems": {"n_problem": 5}}));
    assert!(e.contains("n_problem"), "{e}");
    let Err(e) = registry.create_generated("math", &json!({})) else {
        panic!("math reads files");
    };
    assert!(e.to_string().contains("does not generate"), "{e}");
}

#[test]
fn gsm8k_files_are_read_and_scored_numerically() {
    let path =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/data/gsm8k.jsonl");
    let loaded = load_tasks(&path, &LoadOptions::default()).expect("load");
    assert_eq!(
        loaded.format,
        DatasetFormat::Gsm8k,
        "detected from the `####` answer"
    );
    let answers: Vec<&str> = loaded.tasks.iter().map(|t| t.answers[0].as_str()).collect();
    assert_eq!(answers, ["72", "10", "5"]);
    let env = MathEnv::new(MathOptions {
        tools: vec!["python".into()],
        ..MathOptions::default()
    })
    .expect("env");
    assert_eq!(env.tool_names(), ["python"]);
    let task = &loaded.tasks[1];
    let mut transcript = env.reset(task).expect("reset");
    assert!(transcript[1].content.contains("Weng earns $12"));
    transcript.push(Message::assistant(
        "<think>12 / 60 * 50</think>\n<answer>$10.00</answer>",
    ));
    assert_eq!(env.score(task, &transcript).reward, 1.0);
    transcript.pop();
    transcript.push(Message::assistant(
        "<think>guess</think>\n<answer>12</answer>",
    ));
    assert_eq!(env.score(task, &transcript).reward, 0.0);
}
