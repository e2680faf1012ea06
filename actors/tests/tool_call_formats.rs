//! An agent of each family calls tools the way its template taught it: a Qwen3 model (hermes
//! `<tool_call>` after a `<think>` block), a Llama 3.1 model (a JSON object, `"parameters"`)
//! and a Mistral v0.3 model (`[TOOL_CALLS]` and a JSON list, its results carrying the
//! `tool_call_id`s its template requires) each run a real episode of the built-in tool env
//! through the runtime, with the real engine, their family's tokenizer and chat template, and
//! a real tool. The env reads the calls in the model's own format: its default system prompt
//! shows that format, and the `format` reward and `tool_calls_written` metric count the calls as the
//! model wrote them.
//!
//! The models are tiny and random, then taught one episode by supervised steps on the exact
//! token stream the runtime builds (prompt, action, the template's observation suffix,
//! answer), so greedy decoding writes the call. The episode must then parse it into the same
//! tool call in both formats, and its token stream must be what the engine conditioned on:
//! the log-probabilities the engine recorded equal the model's own over the stored stream.
//! A Qwen3 model taught three calls in one turn makes all three when a turn may.

use agent_r1_actors::testing;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_r1_actors::engine::EngineConfig;
use agent_r1_actors::model::{ModelConfig, Placement, PolicyModel, SamplingParams};
use agent_r1_actors::runtime::{run_rollout, EpisodeConfig, RolloutSetup, TurnRenderer};
use agent_r1_actors::sft::{train_sft, SftConfig, SftSequence};
use agent_r1_actors::tiny_tokenizer::{train_tokenizer, TokenizerStyle, BUILTIN_CORPUS};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_actors::trajectory::{EpisodeEnd, Trajectory};
use agent_r1_envs::env::Env;
use agent_r1_envs::envs::prompt::qa_system_prompt;
use agent_r1_envs::envs::MultihopQaEnv;
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use agent_r1_envs::tool::{CallOutcome, Tool, ToolOutput};
use agent_r1_envs::tool_call::ToolCallFormat;
use async_trait::async_trait;
use serde_json::{json, Value};
use tch::Kind;

/// Echoes its text and remembers the arguments of every call.
#[derive(Default)]
struct Echo {
    calls: Mutex<Vec<Value>>,
}

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
    fn timeout(&self) -> Duration {
        Duration::from_secs(10)
    }
    async fn call(&self, args: Value) -> agent_r1_envs::Result<ToolOutput> {
        self.calls.lock().unwrap().push(args.clone());
        Ok(ToolOutput::text(format!(
            "echo: {}",
            args["text"].as_str().unwrap_or("")
        )))
    }
}

/// The built-in tool env (`multihop_qa`, Agent-R1's reward) with the echo tool, reading
/// calls in `format`.
fn qa_env(format: ToolCallFormat) -> MultihopQaEnv {
    MultihopQaEnv::from_options(&json!({
        "tools": ["echo"],
        "reward": "agent_r1_qa",
        "tool_call_format": format.name(),
    }))
    .unwrap()
}

fn task() -> Task {
    Task {
        id: "echo-1".into(),
        data_source: "test".into(),
        question: "Say hi through the tool.".into(),
        answers: vec!["hi".into()],
        prompt: None,
        extra: Value::Null,
    }
}

/// The texts the tool is called with when a turn makes `calls` calls.
fn call_texts(calls: usize) -> Vec<String> {
    ["hi", "ho", "hu"][..calls]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// What the model is taught to write in each turn, in its family's format after a `<think>`
/// block (Agent-R1's protocol): the first turn makes `calls` calls (several only in hermes,
/// one `<tool_call>` block each).
fn actions(format: ToolCallFormat, calls: usize) -> (String, String) {
    let think = "<think>\nI will use the tool.\n</think>\n\n";
    let answer = "<think>\nIt said hi.\n</think>\n\n<answer>hi</answer>".to_string();
    let call = match format {
        ToolCallFormat::Hermes => call_texts(calls)
            .iter()
            .map(|t| format!("<tool_call>\n{{\"name\": \"echo\", \"arguments\": {{\"text\": \"{t}\"}}}}\n</tool_call>"))
            .collect::<Vec<_>>()
            .join("\n"),
        ToolCallFormat::Llama3Json => "{\"name\": \"echo\", \"parameters\": {\"text\": \"hi\"}}".into(),
        ToolCallFormat::Mistral => {
            "[TOOL_CALLS] [{\"name\": \"echo\", \"arguments\": {\"text\": \"hi\"}}]".into()
        }
    };
    (format!("{think}{call}"), answer)
}

fn model_config(family: &str, vocab: usize) -> ModelConfig {
    let mut c = json!({
        "model_type": family, "vocab_size": vocab.div_ceil(64) * 64, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": true,
        "max_position_embeddings": 4096,
    });
    if family == "llama" {
        c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 256});
    }
    ModelConfig::from_json(&c).unwrap()
}

fn run_family(style: TokenizerStyle, family: &str, format: ToolCallFormat, calls: usize) {
    let dir = tempfile::tempdir().unwrap();
    let trained = train_tokenizer(style, BUILTIN_CORPUS.lines(), 512, &[], false).unwrap();
    trained.write_to(dir.path()).unwrap();
    let ids = trained.ids().clone();
    std::fs::write(
        dir.path().join("generation_config.json"),
        ids.generation_config().to_string(),
    )
    .unwrap();
    let tokenizer = Arc::new(HfTokenizer::from_dir(dir.path()).unwrap());
    let echo = Arc::new(Echo::default());
    let renderer = Arc::new(TurnRenderer::new(tokenizer.clone(), vec![echo.spec()], None).unwrap());
    assert_eq!(
        renderer.tool_call_format(),
        format,
        "detected from the template"
    );

    // The episode in token space, as the runtime will build it.
    let env = qa_env(format);
    let (first, second) = actions(format, calls);
    let end = renderer.end_of_turn_id();
    let prompt = renderer.prompt(&env.reset(&task()).unwrap()).unwrap();
    let mut action1 = tokenizer.encode(&first, false).unwrap();
    if format.call_end().is_none() || calls > 1 {
        // A JSON call is a whole turn; with several calls a turn runs to its end.
        action1.push(end);
    }
    let outcomes: Vec<CallOutcome> = call_texts(calls)
        .iter()
        .map(|t| CallOutcome {
            name: Some("echo".into()),
            result: Ok(ToolOutput::text(format!("echo: {t}"))),
            latency: Duration::ZERO,
        })
        .collect();
    let observation = env.observe(&task(), &outcomes);
    let continuation = renderer.continuation(&action1, &observation).unwrap();
    let mut action2 = tokenizer.encode(&second, false).unwrap();
    action2.push(end);
    let mut stream = prompt.clone();
    let mut trained = vec![false; prompt.len()];
    for (part, is_action) in [(&action1, true), (&continuation, false), (&action2, true)] {
        stream.extend(part.iter());
        trained.extend(std::iter::repeat_n(is_action, part.len()));
    }

    tch::manual_seed(0);
    let mut model = PolicyModel::new(
        model_config(family, ids.vocab_size),
        Placement::default(),
        false,
    )
    .unwrap();
    let report = train_sft(
        &mut model,
        &[SftSequence {
            ids: stream.clone(),
            trained,
        }],
        &SftConfig {
            steps: 300,
            batch_size: 1,
            learning_rate: 3e-3,
            final_lr_fraction: 1.0,
            warmup_steps: 10,
            ..Default::default()
        },
        |_, _| std::ops::ControlFlow::Continue(()),
    )
    .unwrap();
    assert!(report.last_loss < 0.01, "not learnt: {report:?}");
    let model_dir = dir.path().join("model");
    model.save(&model_dir, Some(dir.path())).unwrap();

    let load_dir = model_dir.clone();
    let engine = testing::start_engine(
        move || PolicyModel::load(&load_dir, Placement::default(), false),
        None,
        EngineConfig {
            max_batch_rows: 2,
            max_context: 1024,
            parked_kv_bytes: 8 << 20,
            ..testing::engine_config()
        },
    )
    .unwrap();
    let setup = RolloutSetup {
        engine: (&engine).into(),
        env: agent_r1_actors::runtime::EnvSource::Shared(Arc::new(qa_env(format))),
        tools: vec![echo.clone() as Arc<dyn Tool>],
        renderer: renderer.clone(),
        context_policy: std::sync::Arc::new(agent_r1_actors::runtime::context_policy::Full),
        episode: EpisodeConfig {
            max_turns: 3,
            max_context: 1024,
            sampling: SamplingParams {
                temperature: 0.0,
                max_new_tokens: 64 * calls,
                stop_token_ids: renderer.stop_ids(calls),
                ..Default::default()
            },
            max_tool_calls_per_turn: calls,
            ..testing::episode_config()
        },
        concurrency: 1,
        tool_queue_capacity: 4,
        restart: Default::default(),
        validate: Arc::new(|_, _| Ok(())),
        live: Default::default(),
        stall: None,
        calls: Default::default(),
        in_flight: Default::default(),
    };
    let trajectory = rollout(setup);

    // The calls parsed into the same tool calls in both formats and ran (concurrently, so in
    // any order), and their results came back in the order of the calls.
    let mut ran = echo.calls.lock().unwrap().clone();
    ran.sort_by_key(|v| v.to_string());
    let mut want: Vec<Value> = call_texts(calls)
        .iter()
        .map(|t| json!({"text": t}))
        .collect();
    want.sort_by_key(|v| v.to_string());
    assert_eq!(ran, want);
    let answered: Vec<String> = trajectory.steps[0]
        .tool_calls
        .iter()
        .map(|c| c.result.as_ref().unwrap().text.clone())
        .collect();
    let expected: Vec<String> = call_texts(calls)
        .iter()
        .map(|t| format!("echo: {t}"))
        .collect();
    assert_eq!(answered, expected);
    assert_eq!(
        trajectory.end,
        EpisodeEnd::Completed {
            reason: "done".into()
        }
    );
    assert_eq!(trajectory.steps.len(), 2);
    assert_eq!(trajectory.steps[0].tool_calls.len(), calls);
    // Agent-R1's reward in the model's own format: 0.5 for the call turn when it holds one
    // well-formed call (the original's rule; three calls in a turn are not one), 0.5 for the
    // answer turn, and the answer.
    let format_score = if calls == 1 { 1.0 } else { 0.5 };
    assert_eq!(trajectory.metrics["format"], format_score);
    assert_eq!(trajectory.metrics["tool_calls_written"], calls as f64);
    assert_eq!(trajectory.metrics["substring_em"], 1.0);
    assert_eq!(trajectory.reward, -1.0 + format_score + 1.0);
    // The system prompt showed the call in the model's format.
    let shown = format.example("search", json!({"query": "..."}));
    let system = qa_system_prompt(format);
    assert!(
        format == ToolCallFormat::Hermes || system.contains(&shown),
        "{system}"
    );
    let prompt_text = tokenizer.decode(&trajectory.prompt_ids, false).unwrap();
    assert!(prompt_text.contains(&system), "{prompt_text}");

    // Token-in, token-out: the stored stream is the one built above, actions are the engine's
    // samples, and the engine's log-probabilities are the model's over the stored stream.
    assert_eq!(trajectory.token_stream(), stream);
    assert_eq!(trajectory.steps[0].action_ids, action1);
    assert_eq!(trajectory.steps[0].observation_ids, continuation);
    let logits = model.sequence_logits(&stream).unwrap();
    let logprobs = logits.log_softmax(-1, Kind::Float);
    let mut worst = 0.0f64;
    for step in &trajectory.steps {
        for (i, (&id, &lp)) in step.action_ids.iter().zip(&step.logprobs).enumerate() {
            let at = (step.context_len + i - 1) as i64;
            let ours = logprobs.double_value(&[at, i64::from(id)]);
            worst = worst.max((ours - f64::from(lp)).abs());
        }
    }
    assert!(
        worst < 1e-4,
        "engine log-probs differ from the stream's by {worst}"
    );
}

fn rollout(setup: RolloutSetup) -> Trajectory {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        let report = tokio::time::timeout(
            Duration::from_secs(300),
            run_rollout(setup, vec![(task(), 0)], tx),
        )
        .await
        .expect("rollout must not hang")
        .unwrap();
        assert_eq!(report.summary.completed, 1, "{report:?}");
        rx.recv().await.expect("one trajectory")
    })
}

#[test]
fn qwen3_agent_calls_tools_in_hermes_format() {
    run_family(TokenizerStyle::Qwen3, "qwen3", ToolCallFormat::Hermes, 1);
}

/// `env.max_tool_calls_per_turn = 3`: generation no longer stops at `</tool_call>`, the turn
/// holds three calls, they run (concurrently) and their three results come back in order,
/// and the stored stream is still the one the engine conditioned on.
#[test]
fn qwen3_agent_makes_three_calls_in_one_turn() {
    run_family(TokenizerStyle::Qwen3, "qwen3", ToolCallFormat::Hermes, 3);
}

#[test]
fn llama31_agent_calls_tools_in_json_format() {
    run_family(
        TokenizerStyle::Llama3_1,
        "llama",
        ToolCallFormat::Llama3Json,
        1,
    );
}

#[test]
fn mistral_agent_calls_tools_with_call_ids() {
    run_family(
        TokenizerStyle::Mistral,
        "mistral",
        ToolCallFormat::Mistral,
        1,
    );
}

/// Mistral's template refuses a tool result without a 9-character `tool_call_id`: the
/// renderer numbers the results it appends, and keeps an id a message already has.
#[test]
fn mistral_results_carry_call_ids() {
    let dir = tempfile::tempdir().unwrap();
    train_tokenizer(
        TokenizerStyle::Mistral,
        BUILTIN_CORPUS.lines(),
        512,
        &[],
        false,
    )
    .unwrap()
    .write_to(dir.path())
    .unwrap();
    let tokenizer = Arc::new(HfTokenizer::from_dir(dir.path()).unwrap());
    let renderer =
        TurnRenderer::new(tokenizer.clone(), vec![Echo::default().spec()], None).unwrap();
    assert_eq!(renderer.tool_call_format(), ToolCallFormat::Mistral);
    let end = renderer.end_of_turn_id();
    let results = [
        Message::tool("a"),
        Message::tool("b").with_tool_call_id("abcdefghi"),
    ];
    let ids = renderer.continuation(&[end], &results).unwrap();
    let text = tokenizer.decode(&ids, false).unwrap();
    assert!(
        text.contains("\"call_id\": \"call00001\"") && text.contains("\"call_id\": \"abcdefghi\""),
        "{text}"
    );
    // Without the renderer's numbering the template refuses, with its own reason.
    let e = tokenizer
        .apply_chat_template(
            &[
                Message::user("x"),
                Message::assistant("y"),
                Message::tool("a"),
            ],
            None,
            false,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("Tool call IDs"), "{e}");
}
