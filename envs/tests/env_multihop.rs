//! The built-in envs through the registry: options, reset, turn handling, process rewards
//! and scoring with each reward kind.

use std::time::Duration;

use agent_r1_envs::dataset::{load_tasks, LoadOptions};
use agent_r1_envs::env::{Env, TurnOutcome};
use agent_r1_envs::envs::{CorpusSpec, EnvRegistry, SyntheticMultihopEnv};
use agent_r1_envs::generated_env::GeneratedEnv;
use agent_r1_envs::message::{Message, Role};
use agent_r1_envs::synthetic::{gold_demo, Split};
use agent_r1_envs::tool::{CallError, CallOutcome, ToolOutput};
use agent_r1_envs::tool_call::ToolCallFormat;
use agent_r1_envs::Error;
use serde_json::json;

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/data")
        .join(name)
}

#[test]
fn registry_knows_builtins_and_reports_unknown_names() {
    let registry = EnvRegistry::with_builtins();
    assert_eq!(
        registry.names(),
        vec![
            "math",
            "multihop_qa",
            "synthetic_math",
            "synthetic_multihop"
        ]
    );
    let Err(err) = registry.create("webshop", &json!({})) else {
        panic!("webshop is not registered");
    };
    match err {
        Error::Unknown { kind, name, known } => {
            assert_eq!((kind, name.as_str()), ("env", "webshop"));
            assert_eq!(
                known,
                "math, multihop_qa, synthetic_math, synthetic_multihop"
            );
        }
        other => panic!("expected Unknown, got {other:?}"),
    }
}

#[test]
fn option_typos_and_bad_values_are_config_errors() {
    let registry = EnvRegistry::with_builtins();
    let err = registry
        .create("multihop_qa", &json!({"rewrad": "hotpotqa_em"}))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("no option `rewrad`") && err.contains("reward"),
        "{err}"
    );
    let err = registry
        .create("multihop_qa", &json!({"reward": "bleu"}))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("bleu"), "{err}");
    assert!(registry
        .create("multihop_qa", &json!({"max_observation_chars": 0}))
        .is_err());
    assert!(registry.create("multihop_qa", &json!([1])).is_err());
}

#[test]
fn multihop_qa_builds_prompts_from_tasks_of_any_format() {
    let env = EnvRegistry::with_builtins()
        .create("multihop_qa", &json!({"corpus": {"jsonl": "corpus.jsonl"}}))
        .expect("env");
    assert_eq!(env.name(), "multihop_qa");
    assert_eq!(env.tool_names(), vec!["search"]);
    assert_eq!(env.max_observation_chars(), 2048);

    let hotpot = load_tasks(fixture("hotpotqa.json"), &LoadOptions::default())
        .expect("load")
        .tasks;
    let msgs = env.reset(&hotpot[0]).expect("reset");
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0].role, Role::System);
    assert!(msgs[0].content.contains("<tool_call>") && msgs[0].content.contains("<answer>"));
    assert!(msgs[1].content.contains("Scott Derrickson"));

    // Parquet rows carry their own prompt, used as is.
    let parquet = load_tasks(
        fixture("agent_r1_string_gt.parquet"),
        &LoadOptions::default(),
    )
    .expect("load")
    .tasks;
    let msgs = env.reset(&parquet[0]).expect("reset");
    assert_eq!(msgs, parquet[0].prompt.clone().expect("prompt"));
}

#[test]
fn multihop_qa_turns_and_scores() {
    let env = EnvRegistry::with_builtins()
        .create("multihop_qa", &json!({"reward": "hotpotqa_f1", "process_reward": {"well_formed": 0.1, "success": 0.05}}))
        .expect("env");
    let task = load_tasks(fixture("hotpotqa.json"), &LoadOptions::default())
        .expect("load")
        .tasks[1]
        .clone();
    let call = "<think>who played Corliss Archer?</think>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"Kiss and Tell 1945\"}}\n</tool_call>";
    match env.on_turn(&task, call, ToolCallFormat::Hermes.parse(call)) {
        TurnOutcome::Calls(calls) => assert_eq!(calls.len(), 1),
        TurnOutcome::Done => panic!("a tool call should continue the episode"),
    }
    let outcomes = [
        CallOutcome {
            name: Some("search".into()),
            result: Ok(ToolOutput::text("Shirley Temple ...")),
            latency: Duration::ZERO,
        },
        CallOutcome {
            name: None,
            result: Err(CallError::MissingName),
            latency: Duration::ZERO,
        },
    ];
    assert!((env.step_reward(&task, &outcomes) - 0.15).abs() < 1e-12);
    let final_turn = "<think>She was Chief of Protocol.</think>\n<answer>Chief of Protocol of the United States</answer>";
    assert_eq!(
        env.on_turn(&task, final_turn, ToolCallFormat::Hermes.parse(final_turn)),
        TurnOutcome::Done
    );

    let mut transcript = env.reset(&task).expect("reset");
    transcript.push(Message::assistant(call));
    transcript.push(Message::tool("Shirley Temple ..."));
    transcript.push(Message::assistant(final_turn));
    let score = env.score(&task, &transcript);
    // Normalised, the prediction has 6 tokens ("chief of protocol of united states") and
    // shares 3 with the gold ("chief of protocol").
    assert!(
        (score.metrics["precision"] - 0.5).abs() < 1e-12,
        "{score:?}"
    );
    assert_eq!(score.metrics["recall"], 1.0);
    assert!((score.reward - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(score.metrics["em"], 0.0);
    assert_eq!(score.metrics["substring_em"], 1.0);
    assert_eq!(score.metrics["format"], 1.0);
    assert_eq!(score.metrics["agent_r1_reward"], 1.0);
    assert_eq!(score.metrics["tool_calls_written"], 1.0);
}

#[test]
fn synthetic_multihop_writes_its_corpus_and_gold_demos_win() {
    let dir = tempfile::tempdir().expect("dir");
    let corpus_path = dir.path().join("synthetic.jsonl");
    let options = json!({
        "world": {"seed": 3, "n_questions": 50},
        "corpus_path": corpus_path,
        "reward": "hotpotqa_em",
        "max_observation_chars": 512
    });
    let env = SyntheticMultihopEnv::from_options(&options).expect("env");
    assert_eq!(env.corpus(), Some(&CorpusSpec::Jsonl(corpus_path.clone())));
    assert!(
        std::fs::read_to_string(&corpus_path)
            .expect("corpus")
            .lines()
            .count()
            > 100
    );
    assert_eq!(env.max_observation_chars(), 512);
    let tasks = env.tasks(Split::Train);
    assert_eq!(tasks.len(), 40);
    let world = env.world();
    for task in tasks.iter().take(10) {
        let question = world.question(&task.id).expect("question");
        let prefix = env.reset(task).expect("reset");
        let transcript =
            gold_demo(question).messages(prefix, |c| world.observe(c.str_arg("query"), 3));
        let score = env.score(task, &transcript);
        assert_eq!(score.reward, 1.0);
    }
    let registry = EnvRegistry::with_builtins();
    let boxed = registry
        .create(
            "synthetic_multihop",
            &json!({"world": {"seed": 3, "n_questions": 50}}),
        )
        .expect("env");
    assert_eq!(boxed.name(), "synthetic_multihop");
    let err = registry
        .create("synthetic_multihop", &json!({"world": {"n_cites": 3}}))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("n_cites"), "{err}");
}
