//! `agent-r1 bench learner`: training throughput of the learner on synthetic trajectories.
//!
//! The batch has the shape of a multi-turn tool-use rollout (a long prompt, then turns of
//! sampled tokens each followed by a tool observation that is masked out of the loss), so the
//! figures say how many rollout tokens per second one learner can absorb, which is what
//! decides whether the learner or the engine bounds an async run. The model is a randomly
//! initialised preset or real shape, or a model directory: throughput does not depend on
//! what the weights are.

use agent_r1_actors::device::parse_placement;
use agent_r1_actors::learner::{
    AlgorithmConfig, DistillCombine, DistillConfig, Estimator, KlConfig, KlPlacement, Learner,
    LearnerConfig, LearnerModels, MemoryConfig, Reference,
};
use agent_r1_actors::memory_plan::{MemoryPlan, PlanInput, Term};
use agent_r1_actors::model::generate::FinishReason;
use agent_r1_actors::model::{LoraConfig, TargetModules};
use agent_r1_actors::trajectory::{EpisodeEnd, Step, Trajectory};
use agent_r1_envs::task::Task;
use serde_json::json;

use super::bench_support::{peak_rss_mb, reset_peak_rss, ModelFlags};
use crate::config::{LEARNER_QUEUE_CAPACITY, LEARNER_REQUEST_TIMEOUT};

/// Flags of `agent-r1 bench learner`.
#[derive(Debug, clap::Args)]
pub(crate) struct LearnerBench {
    #[command(flatten)]
    model: ModelFlags,
    /// Comma-separated estimators: `gae` (PPO, value head sharing the policy's trunk) and
    /// the critic-free ones (`grpo`, `rloo`, `reinforce_pp`, ...).
    #[arg(long, default_value = "gae,grpo", value_delimiter = ',')]
    estimators: Vec<String>,
    /// Trajectories per batch.
    #[arg(long, default_value_t = 64)]
    trajectories: usize,
    /// Trajectories per group (for the group estimators).
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Prompt tokens per trajectory.
    #[arg(long, default_value_t = 200)]
    prompt_tokens: usize,
    /// Model turns per trajectory.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Sampled (trained) tokens per turn.
    #[arg(long, default_value_t = 48)]
    action_tokens: usize,
    /// Tool-observation tokens after each turn (masked out of the loss).
    #[arg(long, default_value_t = 32)]
    observation_tokens: usize,
    /// Timed updates per estimator (after one untimed warm-up on a small batch).
    #[arg(long, default_value_t = 2)]
    updates: usize,
    /// PPO epochs per update.
    #[arg(long, default_value_t = 1)]
    ppo_epochs: usize,
    /// Trajectories per optimizer step (0 = the whole batch).
    #[arg(long, default_value_t = 0)]
    mini_batch_size: usize,
    /// Trajectories per forward/backward pass.
    #[arg(long, default_value_t = 8)]
    micro_batch_size: usize,
    /// Positions whose vocabulary logits exist at once (the learner's logits memory bound).
    #[arg(long, default_value_t = 1024)]
    logits_chunk_tokens: usize,
    /// Recompute each decoder layer in the backward pass instead of keeping its activations.
    #[arg(long)]
    recompute: bool,
    /// Pack micro-batches by this many padded tokens instead of --micro-batch-size
    /// sequences (0 = off).
    #[arg(long, default_value_t = 0)]
    max_tokens_per_micro_batch: usize,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "auto")]
    device: String,
    /// float32, bf16 (CUDA) or auto.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Seed of the weights and the synthetic batch.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// On-policy distillation alone from a teacher of the model's shape (another random
    /// initialisation): its forward pass is timed (`teacher_tokens_per_s`) and counted in the
    /// plan and the peak.
    #[arg(long)]
    distill: bool,
    /// Train LoRA adapters of this rank (alpha twice the rank, every projection) beside the
    /// frozen weights instead of the full weights; 0 trains the full weights.
    #[arg(long, default_value_t = 0)]
    lora_rank: usize,
    /// The projections that get adapters (PEFT's names, comma-separated, or `all-linear`).
    #[arg(long, default_value = "all-linear", value_delimiter = ',')]
    lora_targets: Vec<String>,
    /// A KL term in the loss towards the start weights: with LoRA the reference is the
    /// policy's frozen base with its adapters off, without it a second copy of the weights.
    #[arg(long)]
    kl: bool,
    /// With --kl and LoRA, keep the reference as a second copy of the base instead (what the
    /// base with adapters off saves).
    #[arg(long, requires = "kl")]
    kl_reference_copy: bool,
    /// Learner ranks: this process is rank 0 and starts the others as processes of this
    /// program (each with `1/ranks` of the cores); every update is split across them by tokens
    /// and their gradients summed (torch.distributed with Gloo, CPU only). Each rank's peak
    /// RSS is measured.
    #[arg(long, default_value_t = 1)]
    ranks: usize,
    /// With --ranks: `replicated`, `optimizer_state` (masters and AdamW moments split
    /// across the ranks) or `parameters` (also the decoder layers' weights and gradients;
    /// needs --recompute).
    #[arg(long, default_value = "replicated")]
    shard: String,
    /// With --ranks: this process's rank (rank 0, the default, starts the others and passes
    /// each its rank).
    #[arg(long, default_value_t = 0)]
    rank: usize,
    /// With --ranks: the rendezvous file (rank 0 chooses one and passes it to the others).
    #[arg(long)]
    store: Option<std::path::PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// The other ranks of a `bench learner --ranks N`: this program again with `--rank r
/// --store FILE`; each prints its peak RSS as one JSON line when rank 0 stops it.
struct BenchRanks {
    store: std::path::PathBuf,
    children: Vec<std::process::Child>,
}

impl BenchRanks {
    fn start(ranks: usize) -> anyhow::Result<Self> {
        let store = std::env::temp_dir().join(format!(
            "agent-r1-bench-ranks-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let exe = std::env::current_exe()?;
        let args: Vec<String> = std::env::args().skip(1).collect();
        let children = (1..ranks)
            .map(|r| {
                std::process::Command::new(&exe)
                    .args(&args)
                    .args(["--rank", &r.to_string(), "--store"])
                    .arg(&store)
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|e| anyhow::anyhow!("starting learner rank {r}: {e}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self { store, children })
    }

    /// Each other rank's peak RSS in MB, once rank 0's learner has stopped them.
    fn peaks(self) -> anyhow::Result<Vec<f64>> {
        let mut peaks = Vec::new();
        for (i, child) in self.children.into_iter().enumerate() {
            let out = child.wait_with_output()?;
            anyhow::ensure!(out.status.success(), "learner rank {} failed", i + 1);
            let line: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            peaks.push(line["peak_rss_mb"].as_f64().unwrap_or(0.0));
        }
        let _ = std::fs::remove_file(&self.store);
        Ok(peaks)
    }
}

pub(crate) fn run(args: LearnerBench) -> anyhow::Result<()> {
    anyhow::ensure!(args.updates > 0, "--updates must be at least 1");
    anyhow::ensure!(args.trajectories > 0, "--trajectories must be at least 1");
    anyhow::ensure!(args.group_size > 0, "--group-size must be at least 1");
    anyhow::ensure!(
        args.steps > 0 && args.action_tokens > 0,
        "--steps and --action-tokens must be at least 1"
    );
    let estimators = args
        .estimators
        .iter()
        .map(|name| {
            serde_json::from_value::<Estimator>(json!(name))
                .map_err(|_| anyhow::anyhow!("--estimators: unknown estimator `{name}`"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(
        !args.kl_reference_copy || args.lora_rank > 0,
        "--kl-reference-copy compares references of a LoRA policy: give --lora-rank too"
    );
    let shard: agent_r1_actors::learner::ShardMode = serde_json::from_value(json!(args.shard))
        .map_err(|_| {
            anyhow::anyhow!(
                "--shard: got {:?}; allowed: replicated, optimizer_state, parameters",
                args.shard
            )
        })?;
    anyhow::ensure!(
        (1..=64).contains(&args.ranks),
        "--ranks: got {}; allowed: 1 to 64",
        args.ranks
    );
    anyhow::ensure!(
        args.ranks == 1 || estimators.len() == 1,
        "--ranks {} measures one estimator: give one with --estimators",
        args.ranks
    );
    let placement = parse_placement(&args.device, &args.dtype)?;
    anyhow::ensure!(
        args.ranks == 1 || placement.device == tch::Device::Cpu,
        "--ranks {}: learner ranks run on the CPU (Gloo); give --device cpu",
        args.ranks
    );
    let mut others = None;
    if args.ranks > 1 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        tch::set_num_threads((cores / args.ranks).max(1) as i32);
        if args.rank == 0 {
            others = Some(BenchRanks::start(args.ranks)?);
        }
    }
    let choice = args.model.choice();
    let model_config = choice.config()?;
    let vocab = model_config.vocab_size as u64;
    let batch = synthetic_batch(&args, vocab);
    let tokens_per_trajectory =
        args.prompt_tokens + args.steps * (args.action_tokens + args.observation_tokens);
    let mut results = Vec::new();
    for estimator in estimators {
        // Per-estimator peak: the models and optimizer state of the previous one are gone.
        reset_peak_rss();
        tch::manual_seed(args.seed as i64);
        let critic = estimator.needs_critic();
        let mut policy = choice.build(placement, critic)?;
        let lora = (args.lora_rank > 0).then(|| LoraConfig {
            rank: args.lora_rank,
            alpha: 2.0 * args.lora_rank as f64,
            target_modules: match args.lora_targets.as_slice() {
                [all] if all == "all-linear" => TargetModules::default(),
                list => TargetModules::List(list.to_vec()),
            },
            ..LoraConfig::default()
        });
        // The KL reference as `train` keeps it (the LoRA policy's own base), or a copy.
        let kl_reference = args
            .kl
            .then_some(if lora.is_some() && !args.kl_reference_copy {
                "policy base, adapters off"
            } else {
                "copy"
            });
        let reference = match kl_reference {
            None => None,
            Some("copy") => {
                tch::manual_seed(args.seed as i64);
                Some(Reference::Model(Box::new(choice.build(placement, false)?)))
            }
            Some(_) => Some(Reference::PolicyBase),
        };
        if let Some(lora) = &lora {
            policy.add_lora(lora)?;
        }
        let config = LearnerConfig {
            algorithm: AlgorithmConfig {
                estimator,
                ppo_epochs: args.ppo_epochs,
                mini_batch_size: args.mini_batch_size,
                micro_batch_size: args.micro_batch_size,
                actor_lr: 1e-6,
                kl: if args.kl {
                    KlConfig {
                        placement: KlPlacement::Loss,
                        ..Default::default()
                    }
                } else {
                    KlConfig::OFF
                },
                critic_warmup_updates: 0,
                ..Default::default()
            },
            memory: MemoryConfig {
                logits_chunk_tokens: args.logits_chunk_tokens,
                recompute: args.recompute,
                max_tokens_per_micro_batch: args.max_tokens_per_micro_batch,
                check_memory: true,
                ranks: args.ranks,
                shard,
                ..Default::default()
            },
            max_len: tokens_per_trajectory,
            seed: args.seed,
            distill: args.distill.then(|| DistillConfig {
                teacher: "(random weights of the model's shape)".into(),
                coef: 1.0,
                combine: DistillCombine::Alone,
            }),
            temperature: 1.0,
            max_staleness: None,
            behavior_weight_cap: None,
            initial_version: 0,
            queue_capacity: LEARNER_QUEUE_CAPACITY,
            request_timeout: LEARNER_REQUEST_TIMEOUT,
        };
        let teacher = if args.distill {
            tch::manual_seed(args.seed.wrapping_add(1) as i64);
            Some(choice.build(placement, false)?)
        } else {
            None
        };
        // Every trajectory has the same shape, so the largest micro-batch is known exactly.
        let rows_per_micro = match args.max_tokens_per_micro_batch {
            0 => args.micro_batch_size,
            budget => (budget / tokens_per_trajectory).max(1),
        }
        .min(args.trajectories);
        let plan_of = |rank: usize| {
            MemoryPlan::predict(&PlanInput {
                device: placement.device,
                model: &model_config,
                kind: placement.kind,
                learner: &config,
                teacher: args.distill.then_some(&model_config),
                separate_critic: None,
                critic_lora: None,
                lora: lora.as_ref(),
                engine: None,
                action_tokens: Some(rows_per_micro * args.steps * args.action_tokens),
                rank,
            })
        };
        let mut plan = plan_of(0);
        // Each rank's planned peak (rank 0 keeps whole weights with sharded parameters).
        let rank_plans_mb: Vec<f64> = (0..args.ranks)
            .map(|r| plan_of(r).total() as f64 / (1u64 << 20) as f64)
            .collect();
        if args.kl_reference_copy {
            // What the planner would count for a reference of its own (a LoRA run never keeps
            // one).
            plan.terms.push(Term {
                name: "reference model",
                bytes: model_config.num_parameters() as u64
                    * placement.kind.elt_size_in_bytes() as u64,
                knobs: "",
            });
        }
        let mut learner = Learner::new(
            LearnerModels {
                policy,
                critic: None,
                reference,
                teacher,
                critic_prefix: None,
            },
            config,
        )?;
        if args.ranks > 1 {
            let store = match (&args.store, &others) {
                (Some(s), _) => s.clone(),
                (None, Some(o)) => o.store.clone(),
                (None, None) => anyhow::bail!("--rank {} needs --store", args.rank),
            };
            let spec = agent_r1_actors::process_group::GroupSpec::on_this_machine(
                store,
                args.rank,
                args.ranks,
                std::time::Duration::from_secs(600),
            );
            let group = agent_r1_actors::process_group::ProcessGroup::join(&spec)?;
            learner.join_ranks(group, shard)?;
            if args.rank > 0 {
                learner.follow()?;
                println!(
                    "{}",
                    json!({"rank": args.rank, "peak_rss_mb": peak_rss_mb()})
                );
                return Ok(());
            }
        }
        // Warm-up on one micro-batch-sized slice: allocator growth and kernel selection.
        let warm = args.micro_batch_size.min(batch.len()).max(1);
        learner.update(batch[..warm].to_vec())?;
        let mut runs = Vec::with_capacity(args.updates);
        let mut teacher_tps = Vec::new();
        for u in 0..args.updates {
            let stats = learner.update(batch.clone())?;
            anyhow::ensure!(
                stats.skipped_steps == 0,
                "update {u} skipped {} steps",
                stats.skipped_steps
            );
            let epochs = args.ppo_epochs as f64;
            teacher_tps.extend(stats.distill.map(|d| d.teacher_tokens_per_second));
            runs.push(json!({
                "seconds": stats.duration_seconds,
                "tokens": stats.tokens,
                "action_tokens": stats.action_tokens,
                "tokens_per_s": stats.tokens as f64 * epochs / stats.duration_seconds,
                "action_tokens_per_s": stats.action_tokens as f64 * epochs / stats.duration_seconds,
                "optimizer_steps": stats.optimizer_steps,
                "policy_loss": stats.policy_loss,
                "grad_norm": stats.grad_norm,
                "entropy": stats.entropy,
                "approx_kl": stats.approx_kl,
                "clip_fraction": stats.clip_fraction,
            }));
            if !args.json {
                eprintln!(
                    "{} update {u}: {:.2} s, {:.0} tokens/s",
                    estimator.as_str(),
                    stats.duration_seconds,
                    stats.tokens as f64 * epochs / stats.duration_seconds
                );
            }
        }
        let seconds: Vec<f64> = runs
            .iter()
            .map(|r| r["seconds"].as_f64().unwrap_or(0.0))
            .collect();
        let rank0_peak = peak_rss_mb();
        // Rank 0's learner stops the other ranks as it is dropped.
        drop(learner);
        let mut rank_peaks = vec![rank0_peak];
        if let Some(o) = others.take() {
            rank_peaks.extend(o.peaks()?);
        }
        let mean = seconds.iter().sum::<f64>() / seconds.len() as f64;
        let best = seconds.iter().cloned().fold(f64::INFINITY, f64::min);
        let tokens = runs[0]["tokens"].as_f64().unwrap_or(0.0) * args.ppo_epochs as f64;
        let actions = runs[0]["action_tokens"].as_f64().unwrap_or(0.0) * args.ppo_epochs as f64;
        results.push(json!({
            "estimator": estimator.as_str(),
            "value_head": critic,
            "lora_rank": args.lora_rank,
            "kl_reference": kl_reference,
            "mean_update_s": mean,
            "best_update_s": best,
            "tokens_per_s": tokens / mean,
            "action_tokens_per_s": actions / mean,
            "best_tokens_per_s": tokens / best,
            "peak_rss_mb": rank0_peak,
            "rank_peak_rss_mb": rank_peaks,
            "rank_predicted_peak_mb": rank_plans_mb,
            "teacher_tokens_per_s": (!teacher_tps.is_empty())
                .then(|| teacher_tps.iter().sum::<f64>() / teacher_tps.len() as f64),
            "predicted_peak_mb": plan.total() as f64 / (1u64 << 20) as f64,
            "plan": plan.terms.iter().map(|t| json!({"term": t.name, "mb": t.bytes as f64 / (1u64 << 20) as f64})).collect::<Vec<_>>(),
            "updates": runs,
        }));
    }
    let out = json!({
        "bench": "learner",
        "model": choice.name(),
        "parameters": model_config.num_parameters(),
        "vocab_size": vocab,
        "device": format!("{:?}", placement.device),
        "dtype": format!("{:?}", placement.kind),
        "torch_threads": tch::get_num_threads(),
        "trajectories": args.trajectories,
        "tokens_per_trajectory": tokens_per_trajectory,
        "action_tokens_per_trajectory": args.steps * args.action_tokens,
        "ppo_epochs": args.ppo_epochs,
        "mini_batch_size": args.mini_batch_size,
        "micro_batch_size": args.micro_batch_size,
        "logits_chunk_tokens": args.logits_chunk_tokens,
        "recompute": args.recompute,
        "max_tokens_per_micro_batch": args.max_tokens_per_micro_batch,
        "ranks": args.ranks,
        "shard": shard.as_str(),
        "results": results,
    });
    if args.json {
        println!("{out}");
    } else {
        println!(
            "learner throughput: {} ({} parameters), {} trajectories x {} tokens ({} sampled), \
             {:?} {:?}, {} torch threads",
            choice.name(),
            model_config.num_parameters(),
            args.trajectories,
            tokens_per_trajectory,
            args.steps * args.action_tokens,
            placement.device,
            placement.kind,
            tch::get_num_threads()
        );
        println!(
            "{:<14} {:>12} {:>12} {:>14} {:>14} {:>12} {:>12}",
            "estimator",
            "mean s/upd",
            "best s/upd",
            "tokens/s",
            "action tok/s",
            "peak RSS MB",
            "planned MB"
        );
        for r in &results {
            println!(
                "{:<14} {:>12.2} {:>12.2} {:>14.0} {:>14.0} {:>12.0} {:>12.0}",
                r["estimator"].as_str().unwrap_or("?"),
                r["mean_update_s"].as_f64().unwrap_or(0.0),
                r["best_update_s"].as_f64().unwrap_or(0.0),
                r["tokens_per_s"].as_f64().unwrap_or(0.0),
                r["action_tokens_per_s"].as_f64().unwrap_or(0.0),
                r["peak_rss_mb"].as_f64().unwrap_or(0.0),
                r["predicted_peak_mb"].as_f64().unwrap_or(0.0),
            );
            if args.ranks > 1 {
                let peaks: Vec<String> = r["rank_peak_rss_mb"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| format!("{:.0}", p.as_f64().unwrap_or(0.0)))
                    .collect();
                let planned: Vec<String> = r["rank_predicted_peak_mb"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| format!("{:.0}", p.as_f64().unwrap_or(0.0)))
                    .collect();
                println!(
                    "{:<14} {} ranks ({}): peak RSS MB per rank {} (planned {})",
                    "",
                    args.ranks,
                    shard.as_str(),
                    peaks.join(", "),
                    planned.join(", ")
                );
            }
            if let Some(tps) = r["teacher_tokens_per_s"].as_f64() {
                println!("{:<14} teacher forward: {tps:.0} tokens/s", "");
            }
        }
    }
    Ok(())
}

/// Trajectories of the configured shape: pseudo-random ids from a fixed LCG (no RNG state
/// shared with libtorch), sampling log-probabilities near a uniform policy's, groups of
/// `group_size` with rewards that differ within each group so group estimators have signal.
fn synthetic_batch(args: &LearnerBench, vocab: u64) -> Vec<Trajectory> {
    let mut state = args.seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    let uniform = -(vocab as f32).ln();
    (0..args.trajectories as u64)
        .map(|e| {
            let mut token =
                |n: usize| -> Vec<u32> { (0..n).map(|_| (next() % vocab) as u32).collect() };
            let prompt_ids = token(args.prompt_tokens);
            let mut context_len = prompt_ids.len();
            let steps = (0..args.steps)
                .map(|_| {
                    let action_ids = token(args.action_tokens);
                    let observation_ids = token(args.observation_tokens);
                    let step = Step {
                        context_len,
                        logprobs: (0..action_ids.len())
                            .map(|i| uniform - 0.01 * (i % 7) as f32)
                            .collect(),
                        action_ids,
                        policy_version: 0,
                        token_versions: vec![],
                        finish_reason: FinishReason::Stop,
                        tool_calls: vec![],
                        observation_ids,
                        reward: 0.0,
                        generate_seconds: 0.0,
                        tool_seconds: 0.0,
                        prefill_tokens: 0,
                        rebuilt: None,
                    };
                    context_len += step.action_ids.len() + step.observation_ids.len();
                    step
                })
                .collect();
            Trajectory {
                episode_id: e,
                group_id: e / args.group_size as u64,
                task: Task {
                    id: format!("synthetic-{e}"),
                    data_source: "bench".into(),
                    question: String::new(),
                    answers: vec![],
                    prompt: None,
                    extra: serde_json::Value::Null,
                },
                prompt_ids,
                steps,
                reward: (e % 3 == 0) as u8 as f64,
                metrics: Default::default(),
                end: EpisodeEnd::Completed {
                    reason: "done".into(),
                },
                attempts: 1,
                wall_seconds: 0.0,
            }
        })
        .collect()
}
