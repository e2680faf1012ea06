//! `agent-r1 demo` (what `make demo` runs): the built-in tiny model learns the tool-call
//! format from synthetic demonstrations, then answers held-out multi-hop questions through
//! the whole runtime (engine, episode actors, BM25 search tool, env scoring).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use agent_r1_actors::engine::EngineConfig;
use agent_r1_actors::model::PolicyModel;
use agent_r1_actors::runtime::run_rollout;
use agent_r1_actors::sft::{tokenize_demonstration, train_sft, Demonstration, SftConfig};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_actors::trajectory::{Trajectory, TrajectoryWriter};
use agent_r1_envs::env::Env;
use agent_r1_envs::synthetic::{demos, DemoConfig, Split, SyntheticConfig};
use agent_r1_envs::tool::Tool;
use anyhow::Context;
use serde_json::json;

use crate::cmd::init_model::init_model;
use crate::setup::{self, RolloutKnobs};

/// Flags of `agent-r1 demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Run directory (model, corpus, index, trajectories).
    #[arg(long, default_value = "runs/demo")]
    out: PathBuf,
    /// Seed of the world, the model and sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Supervised warm-start steps.
    #[arg(long, default_value_t = 250)]
    sft_steps: usize,
    /// Held-out questions to answer.
    #[arg(long, default_value_t = 64)]
    eval_questions: usize,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "cpu")]
    device: String,
}

pub(crate) fn run(args: DemoArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let placement = agent_r1_actors::device::parse_placement(&args.device, "float32")?;
    let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let world = SyntheticConfig {
        seed: args.seed,
        ..Default::default()
    };
    let scenario = setup::synthetic(&args.out.join("world"), world, 3)?;
    let env: Arc<dyn Env> = scenario.env.clone();
    let search: Arc<dyn Tool> = scenario.search.clone();
    eprintln!(
        "world: {} documents, {} train / {} test questions",
        scenario.env.world().world.documents.len(),
        scenario.train.len(),
        scenario.test.len()
    );

    // 1. The tiny model, its tokenizer trained on the world's text.
    let init_dir = args.out.join("model-init");
    let corpus = setup::tokenizer_corpus(&scenario.env, &scenario.train, &[search.clone()])?;
    init_model(
        "tiny",
        &init_dir,
        Some(&corpus),
        2048,
        args.seed as i64,
        true,
    )?;
    let tokenizer = Arc::new(HfTokenizer::from_dir(&init_dir)?);

    // 2. Supervised warm start on demonstrations (some answer early with a wrong guess).
    let world_ref = scenario.env.world();
    let train_questions: Vec<_> = world_ref
        .questions(Split::Train)
        .into_iter()
        .cloned()
        .collect();
    let demo_config = DemoConfig {
        early_wrong_answer_prob: 0.2,
        seed: args.seed,
    };
    let tools_spec = vec![search.spec()];
    let mut sequences = Vec::new();
    for (demo, task) in demos(&world_ref.world, &train_questions, &demo_config)
        .iter()
        .zip(&scenario.train)
    {
        let prefix = env.reset(task)?;
        let messages = demo.messages(prefix, |query| {
            rt.block_on(search.call(json!({ "query": query })))
                .map(|o| o.text)
                .unwrap_or_else(|e| format!("Error: {e}"))
        });
        let d = Demonstration {
            messages,
            tools: Some(tools_spec.clone()),
        };
        sequences.push(tokenize_demonstration(&tokenizer, &d)?);
    }
    let mut model = PolicyModel::load(&init_dir, placement, false)?;
    let sft = SftConfig {
        steps: args.sft_steps,
        batch_size: 8,
        seed: args.seed,
        ..Default::default()
    };
    eprintln!(
        "warm start: {} demonstrations, {} steps",
        sequences.len(),
        sft.steps
    );
    let report = train_sft(&mut model, &sequences, &sft, |step, loss| {
        if step % 25 == 0 || step + 1 == sft.steps {
            eprintln!("  step {step:>4}  loss {loss:.3}");
        }
    })?;
    let sft_dir = args.out.join("model-sft");
    model.save(&sft_dir, Some(&init_dir))?;
    drop(model);

    // 3. Held-out episodes through the runtime.
    let engine = setup::engine(
        &sft_dir,
        placement,
        EngineConfig {
            max_batch_rows: 64,
            max_context: 2048,
            seed: args.seed as i64,
            ..Default::default()
        },
    )?;
    let knobs = RolloutKnobs {
        concurrency: 64,
        max_turns: 5,
        max_context: 2048,
        max_new_tokens: 128,
        temperature: 0.0,
    };
    let rollout = setup::rollout_setup(engine, tokenizer.clone(), env, vec![search], &knobs)?;
    let tasks: Vec<_> = scenario
        .test
        .iter()
        .take(args.eval_questions)
        .cloned()
        .enumerate()
        .map(|(i, t)| (t, i as u64))
        .collect();
    let (trajectories, rollout_report) = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let collect = tokio::spawn(async move {
            let mut all: Vec<Trajectory> = Vec::new();
            while let Some(t) = rx.recv().await {
                all.push(t);
            }
            all
        });
        let report = run_rollout(rollout, tasks, tx).await;
        (collect.await, report)
    });
    let mut trajectories = trajectories.context("collecting trajectories")?;
    let rollout_report = rollout_report?;
    if let Some(fatal) = &rollout_report.summary.fatal {
        anyhow::bail!("the rollout stopped: {fatal}");
    }
    trajectories.sort_by_key(|t| t.episode_id);
    let path = args.out.join("rollouts/eval.jsonl");
    let mut writer = TrajectoryWriter::create(&path, Some(tokenizer.clone()))?;
    for t in &trajectories {
        writer.write(t)?;
    }
    writer.flush()?;

    let n = trajectories.len().max(1) as f64;
    let mean = |key: &str| {
        trajectories
            .iter()
            .map(|t| t.metrics.get(key).copied().unwrap_or(0.0))
            .sum::<f64>()
            / n
    };
    let calls: usize = trajectories
        .iter()
        .flat_map(|t| &t.steps)
        .map(|s| s.tool_calls.len())
        .sum();
    let ok_calls: usize = trajectories
        .iter()
        .flat_map(|t| &t.steps)
        .flat_map(|s| &s.tool_calls)
        .filter(|c| c.result.is_ok())
        .count();

    if let Some(sample) = trajectories
        .iter()
        .find(|t| t.steps.iter().any(|s| !s.tool_calls.is_empty()))
    {
        println!(
            "--- a held-out episode (question: {}; gold: {}) ---",
            sample.task.question,
            sample.task.answers.join(" | ")
        );
        for (k, s) in sample.steps.iter().enumerate() {
            println!(
                "[turn {}] model: {}",
                k + 1,
                tokenizer.decode(&s.action_ids, true)?.trim()
            );
            for c in &s.tool_calls {
                println!(
                    "[turn {}] tool: {}",
                    k + 1,
                    c.observation(300).replace('\n', " | ")
                );
            }
        }
        println!("--- score: {:?}", sample.metrics);
    }
    println!();
    println!("{:<34} {:>10}", "held-out episodes", trajectories.len());
    println!(
        "{:<34} {:>10.3}",
        "exact match (official HotpotQA)",
        mean("em")
    );
    println!("{:<34} {:>10.3}", "F1 (official HotpotQA)", mean("f1"));
    println!(
        "{:<34} {:>10.3}",
        "tool calls per episode",
        calls as f64 / n
    );
    println!(
        "{:<34} {:>10.3}",
        "well-formed tool calls",
        ok_calls as f64 / calls.max(1) as f64
    );
    println!(
        "{:<34} {:>10.1}",
        "wall time (s)",
        started.elapsed().as_secs_f64()
    );
    println!("{:<34} {}", "warm-started model", sft_dir.display());
    println!("{:<34} {}", "trajectories", path.display());
    let summary = json!({
        "sft_steps": report.steps,
        "sft_loss_first": report.first_loss,
        "sft_loss_last": report.last_loss,
        "episodes": trajectories.len(),
        "episodes_failed": rollout_report.summary.failed,
        "em": mean("em"),
        "f1": mean("f1"),
        "tool_calls_per_episode": calls as f64 / n,
        "wall_s": started.elapsed().as_secs_f64(),
    });
    println!("{summary}");
    Ok(())
}
