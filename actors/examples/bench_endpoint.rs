//! Tokens per second through the OpenAI-compatible endpoint against the same episodes run by
//! a workflow in Rust, side by side in one sitting, on the built-in `tiny` model on the CPU
//! or on a model directory (e.g. `agent-r1 init-model --shape qwen2.5-0.5b --out DIR`: a
//! real model's shape, where sampling rather than the HTTP path sets the pace).
//!
//! Each episode is two chat turns: the question, then the first reply sent back with a
//! follow-up. The Rust workflow renders both contexts in token space and calls `generate`;
//! the endpoint path runs the same conversation from `actors/tests/py/agent_service.py` (the
//! official `openai` client, one service process taking every episode), so the difference
//! is the HTTP round trips, JSON, the client and the endpoint's rendering.
//!
//! cargo run --release -p agent-r1-actors --example bench_endpoint -- [EPISODES] [MAX_TOKENS] [MODEL_DIR]

use agent_r1_actors::testing;
use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_r1_actors::endpoint::{ExternalAgent, ExternalAgentOptions};
use agent_r1_actors::engine::EngineConfig;
use agent_r1_actors::model::presets::preset;
use agent_r1_actors::model::{Placement, PolicyModel, SamplingParams};
use agent_r1_actors::runtime::{
    run_rollout, Agent, EnvSource, EpisodeConfig, RolloutSetup, TurnRenderer, Workflow,
    WorkflowOutcome,
};
use agent_r1_actors::tiny_tokenizer::write_tiny_tokenizer;
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_actors::trajectory::{EpisodeEnd, Trajectory};
use agent_r1_envs::message::Message;
use agent_r1_envs::task::Task;
use async_trait::async_trait;

/// The service's conversation, written against the `Agent` directly.
struct TwoTurns;

#[async_trait]
impl Workflow for TwoTurns {
    fn name(&self) -> &str {
        "two_turns"
    }

    async fn run(&self, task: &Task, agent: &Agent) -> agent_r1_actors::Result<WorkflowOutcome> {
        let r = agent.renderer();
        let prompt = r.prompt(&[Message::user(task.question.clone())])?;
        let first = agent.generate(prompt.clone()).await?;
        let mut context = prompt;
        context.extend(&first.token_ids);
        context.extend(r.continuation(&first.token_ids, &[Message::user("Go on.")])?);
        agent.generate(context).await?;
        Ok(WorkflowOutcome::default())
    }
}

fn rollout(setup: RolloutSetup, episodes: usize) -> (Vec<Trajectory>, f64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let tasks = (0..episodes)
            .map(|i| {
                let task = Task {
                    id: format!("bench-{i}"),
                    data_source: "bench".into(),
                    question: format!("What is item {i} of the list?"),
                    answers: vec![],
                    prompt: None,
                    extra: serde_json::Value::Null,
                };
                (task, i as u64)
            })
            .collect();
        let (tx, mut rx) = tokio::sync::mpsc::channel(episodes);
        let began = Instant::now();
        let collector = tokio::spawn(async move {
            let mut out = vec![];
            while let Some(t) = rx.recv().await {
                out.push(t);
            }
            out
        });
        run_rollout(setup, tasks, tx).await.unwrap();
        let out = collector.await.unwrap();
        (out, began.elapsed().as_secs_f64())
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let episodes: usize = args.get(1).map_or(256, |a| a.parse().unwrap());
    let max_tokens: usize = args.get(2).map_or(32, |a| a.parse().unwrap());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv/bin/python");

    let tiny = tempfile::tempdir().unwrap();
    let model_dir = match args.get(3) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => {
            let ids = write_tiny_tokenizer(tiny.path(), None, 512, &[]).unwrap();
            tch::manual_seed(0);
            PolicyModel::new(
                preset("tiny", ids.vocab_size, ids.eos_token_ids).unwrap(),
                Placement::default(),
                false,
            )
            .unwrap()
            .save(tiny.path(), None)
            .unwrap();
            tiny.path().to_path_buf()
        }
    };
    println!("model: {}", args.get(3).map_or("tiny", |d| d.as_str()));
    let tokenizer = Arc::new(HfTokenizer::from_dir(&model_dir).unwrap());
    let renderer = Arc::new(TurnRenderer::new(tokenizer, vec![], None).unwrap());
    let end = renderer.end_of_turn_id();

    let mut service = std::process::Command::new(&python)
        .arg(root.join("actors/tests/py/agent_service.py"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("`make venv` first");
    let mut line = String::new();
    std::io::BufReader::new(service.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .trim()
        .trim_start_matches("listening on ")
        .parse()
        .unwrap();

    let setup = |env: EnvSource| {
        let load = model_dir.clone();
        let engine = testing::start_engine(
            move || PolicyModel::load(&load, Placement::default(), false),
            None,
            EngineConfig {
                max_batch_rows: 64,
                max_context: 1024,
                ..testing::engine_config()
            },
        )
        .unwrap();
        // The engine lives as long as the guard returned beside the setup.
        let setup = RolloutSetup {
            engine: (&engine).into(),
            env,
            tools: vec![],
            renderer: renderer.clone(),
            context_policy: Arc::new(agent_r1_actors::runtime::context_policy::Full),
            episode: EpisodeConfig {
                max_context: 1024,
                sampling: SamplingParams {
                    temperature: 1.0,
                    // The service asks for 8 tokens a turn; the workflow gets the same.
                    max_new_tokens: max_tokens.min(8),
                    stop_token_ids: vec![end],
                    ..Default::default()
                },
                workflow_timeout: Duration::from_secs(3600),
                ..testing::episode_config()
            },
            concurrency: episodes,
            tool_queue_capacity: 8,
            restart: Default::default(),
            validate: Arc::new(|_, _| Ok(())),
            live: Default::default(),
            stall: None,
            calls: Default::default(),
            in_flight: Default::default(),
        };
        (setup, engine)
    };
    let report = |name: &str, (out, secs): (Vec<Trajectory>, f64)| {
        let done = out
            .iter()
            .filter(|t| matches!(t.end, EpisodeEnd::Completed { .. }))
            .count();
        if let Some(EpisodeEnd::Failed { reason }) = out
            .iter()
            .map(|t| &t.end)
            .find(|e| matches!(e, EpisodeEnd::Failed { .. }))
        {
            println!("{name:<9} a failed episode: {reason}");
        }
        let tokens: usize = out
            .iter()
            .flat_map(|t| &t.steps)
            .map(|s| s.action_ids.len())
            .sum();
        println!(
            "{name:<9} episodes {done}/{episodes}  sampled tokens {tokens}  wall {secs:.2} s  \
             {:.0} tokens/s",
            tokens as f64 / secs
        );
        tokens as f64 / secs
    };
    let rust = report("workflow", {
        let (setup, _engine) = setup(EnvSource::Workflow {
            workflow: Arc::new(TwoTurns),
            tool_names: vec![],
        });
        rollout(setup, episodes)
    });
    let endpoint = ExternalAgent::new(ExternalAgentOptions {
        service_url: Some(format!("http://127.0.0.1:{port}/episode")),
        max_processes: episodes,
        ..Default::default()
    })
    .unwrap();
    let http = report("endpoint", {
        let (setup, _engine) = setup(EnvSource::Workflow {
            workflow: Arc::new(endpoint),
            tool_names: vec![],
        });
        rollout(setup, episodes)
    });
    println!("endpoint / workflow: {:.2}", http / rust);
    let _ = service.kill();
    let _ = service.wait();
}
