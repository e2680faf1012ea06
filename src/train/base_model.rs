//! The model a run starts from: a preset made fresh, a directory, or a warm start on
//! generated or the user's demonstrations; and the checkpoint it resumes.

use agent_r1_actors::model::lora::AdapterSource;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::Context;
use serde_json::{json, Value};

use agent_r1_actors::model::{Placement, PolicyModel};
use agent_r1_actors::runtime::{EnvSource, InFlightEpisode, LiveBoard};
use agent_r1_actors::sft::{train_sft, SftConfig};
use agent_r1_actors::tokenizer::HfTokenizer;
use agent_r1_actors::trajectory::Trajectory;
use agent_r1_envs::demo::DemoConfig;

use super::records::{drop_records, read_jsonl, truncate_after};
use super::scenario::Scenario;
use super::{OPTIMIZER_STATE, PRESET_VOCAB};
use crate::checkpoint::TrainingState;
use crate::config::TrainConfig;
use crate::demonstrations::{chat_row_rules, tokenized_demonstrations};
use crate::{checkpoint, setup};

/// The model RL starts from (also the KL reference and the tokenizer's home).
pub(super) struct BaseModel {
    pub(super) dir: PathBuf,
    /// The warm start's report (`null` when there was none this time).
    pub(super) warm: Value,
    /// A signal stopped the warm start: nothing is saved and the run ends.
    pub(super) interrupted: bool,
}

/// The config's model directory, or a fresh preset in the run directory, then the warm start
/// on the env's demonstrations. On a resume these exist already and are reused.
pub(super) fn base_model(
    cfg: &TrainConfig,
    run_dir: &Path,
    scenario: &Scenario,
    resuming: bool,
    placement: Placement,
    live: &LiveBoard,
    stop: &AtomicBool,
) -> anyhow::Result<BaseModel> {
    let seed = cfg.training.seed;
    let mut dir = match (&cfg.model.dir, &cfg.model.preset) {
        (Some(dir), _) => dir.clone(),
        (None, preset) => {
            let preset = preset.as_deref().unwrap_or("tiny");
            let dir = run_dir.join("model-init");
            if !resuming || !dir.join("config.json").is_file() {
                let corpus = match &scenario.generated {
                    Some(env) => Some(setup::tokenizer_corpus(
                        env.as_ref(),
                        &scenario.train,
                        &shown_specs(cfg, scenario),
                    )?),
                    None => None,
                };
                setup::init_model(
                    preset,
                    &dir,
                    corpus.as_ref(),
                    PRESET_VOCAB,
                    seed as i64,
                    true,
                )?;
            }
            dir
        }
    };
    let mut warm = json!(null);
    if cfg.warm_start.steps == 0 {
        return Ok(BaseModel {
            dir,
            warm,
            interrupted: false,
        });
    }
    let sft_dir = run_dir.join("model-sft");
    if !resuming || !sft_dir.join("config.json").is_file() {
        let w = &cfg.warm_start;
        let sft = SftConfig {
            steps: w.steps,
            batch_size: w.batch_size,
            learning_rate: w.learning_rate,
            final_lr_fraction: w.final_lr_fraction,
            max_len: cfg.rollout.max_context_length,
            seed,
            ..Default::default()
        };
        let on_step = |step: usize, loss: f64| {
            live.touch(format!("warm start step {step}"));
            if step % 25 == 0 || step + 1 == w.steps {
                eprintln!("  sft step {step:>4}  loss {loss:.3}");
            }
            if stop.load(Ordering::SeqCst) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        let t0 = Instant::now();
        let done = match &w.data {
            Some(data) => own_warm_start(
                cfg, scenario, data, &dir, &sft_dir, placement, &sft, on_step,
            )?,
            None => generated_warm_start(cfg, scenario, &dir, &sft_dir, placement, &sft, on_step)?,
        };
        warm = json!({
            "steps": done.report.steps,
            "demonstrations": done.demonstrations,
            "loss_first": done.report.first_loss,
            "loss_last": done.report.last_loss,
            "seconds": t0.elapsed().as_secs_f64(),
            "interrupted": done.report.interrupted,
        });
        if done.report.interrupted {
            eprintln!(
                "interrupted during the warm start (after {} steps): nothing saved, the next \
                 start redoes it",
                done.report.steps
            );
            return Ok(BaseModel {
                dir,
                warm,
                interrupted: true,
            });
        }
    }
    dir = sft_dir;
    Ok(BaseModel {
        dir,
        warm,
        interrupted: false,
    })
}

/// The tools' specs as the run's chat template is given them (`rollout.tool_schemas_in_prompt`).
fn shown_specs(cfg: &TrainConfig, scenario: &Scenario) -> Vec<serde_json::Value> {
    cfg.rollout
        .template_specs(scenario.tools.iter().map(|t| t.spec()).collect())
}

/// The warm start on the demonstrations a generated env makes (its skills, then the bad
/// habit of `[warm_start.bad_habit]`).
pub(super) fn generated_warm_start(
    cfg: &TrainConfig,
    scenario: &Scenario,
    dir: &Path,
    sft_dir: &Path,
    placement: Placement,
    sft: &SftConfig,
    on_step: impl FnMut(usize, f64) -> ControlFlow<()>,
) -> anyhow::Result<setup::WarmStart> {
    let env = scenario
        .generated
        .as_ref()
        .context("warm_start needs an env that generates its own tasks, or warm_start.data")?;
    let w = &cfg.warm_start;
    let seed = cfg.training.seed;
    let demos = |early_wrong_answer_prob, variants_per_question| DemoConfig {
        early_wrong_answer_prob,
        variants_per_question,
        seed,
    };
    let mut phases = vec![setup::WarmStartPhase {
        steps: w.steps,
        learning_rate: w.learning_rate,
        demos: demos(w.early_wrong_answer_prob, w.variants_per_question),
    }];
    if let Some(h) = &w.bad_habit {
        phases.push(setup::WarmStartPhase {
            steps: h.steps,
            learning_rate: h.learning_rate,
            demos: demos(h.early_wrong_answer_prob, h.variants_per_question),
        });
    }
    let total: usize = phases.iter().map(|p| p.steps).sum();
    eprintln!(
        "warm start: {total} steps{}",
        w.bad_habit.as_ref().map_or(String::new(), |h| format!(
            " (the last {} on demonstrations that answer early at {})",
            h.steps, h.early_wrong_answer_prob
        ))
    );
    setup::warm_start(
        env.as_ref(),
        &scenario.train,
        &scenario.tools,
        &shown_specs(cfg, scenario),
        dir,
        sft_dir,
        placement,
        sft,
        &phases,
        scenario.context_policy.as_ref(),
        on_step,
    )
}

/// The warm start on the user's own demonstrations (`[warm_start] data`), read as the run
/// shows its tools and prompts.
#[allow(clippy::too_many_arguments)]
pub(super) fn own_warm_start(
    cfg: &TrainConfig,
    scenario: &Scenario,
    data: &Path,
    dir: &Path,
    sft_dir: &Path,
    placement: Placement,
    sft: &SftConfig,
    on_step: impl FnMut(usize, f64) -> ControlFlow<()>,
) -> anyhow::Result<setup::WarmStart> {
    let specs = scenario.tools.iter().map(|t| t.spec()).collect();
    let env = match &scenario.env {
        EnvSource::Shared(env) => Some(env.as_ref()),
        _ => None,
    };
    let rules = chat_row_rules(cfg, specs, env);
    let tokenizer = HfTokenizer::from_dir(dir)?;
    let sequences =
        tokenized_demonstrations(data, &rules, &tokenizer).context("reading warm_start.data")?;
    eprintln!(
        "warm start: {} steps on {} demonstrations of {}",
        sft.steps,
        sequences.len(),
        data.display()
    );
    let mut model = PolicyModel::load(dir, placement, false)?;
    let report = train_sft(&mut model, &sequences, sft, on_step)?;
    if !report.interrupted {
        model.save(sft_dir, Some(dir))?;
    }
    Ok(setup::WarmStart {
        dir: sft_dir.to_path_buf(),
        report,
        demonstrations: sequences.len(),
    })
}

/// Where the loop starts: the policy to load, the training state, and the samples a
/// checkpoint held that were not trained on yet.
pub(super) struct StartPoint {
    /// The model directory the policy loads (the base, when adapters train).
    pub(super) policy_dir: PathBuf,
    /// The adapters the policy starts with: a checkpoint's, `model.adapter`'s or fresh ones
    /// (`None`: the full weights train).
    pub(super) adapter: Option<AdapterSource>,
    pub(super) state: TrainingState,
    pub(super) pending: Vec<Trajectory>,
    /// Episodes in flight at the checkpoint, with their finished steps.
    pub(super) in_flight: Vec<InFlightEpisode>,
    /// The checkpoint's step, when resuming.
    pub(super) resumed_step: Option<u64>,
    /// The checkpoint's optimizer state, when it has one.
    pub(super) optimizer_state: Option<PathBuf>,
}

impl StartPoint {
    pub(super) fn load(
        run_dir: &Path,
        resumed: Option<&checkpoint::Checkpoint>,
        base_dir: &Path,
        adapter: Option<AdapterSource>,
    ) -> anyhow::Result<Self> {
        let Some(c) = resumed else {
            // Rows of a life killed before its first checkpoint: this start writes them again.
            for log in ["metrics.jsonl", "eval.jsonl"] {
                let dropped = drop_records(&run_dir.join(log))?;
                if dropped > 0 {
                    eprintln!("{log}: dropped {dropped} lines written before any checkpoint");
                }
            }
            return Ok(Self {
                policy_dir: base_dir.to_path_buf(),
                adapter,
                state: TrainingState::default(),
                pending: vec![],
                in_flight: vec![],
                resumed_step: None,
                optimizer_state: None,
            });
        };
        let pending: Vec<Trajectory> = match c.pending_trajectories() {
            Some(path) => read_jsonl(&path)?
                .into_iter()
                .map(serde_json::from_value)
                .collect::<Result<_, _>>()
                .with_context(|| format!("{}: not trajectories", path.display()))?,
            None => vec![],
        };
        let in_flight = match c.in_flight_episodes() {
            Some(path) => read_in_flight(&path)?,
            None => vec![],
        };
        for log in ["metrics.jsonl", "eval.jsonl"] {
            let dropped = truncate_after(&run_dir.join(log), c.step())?;
            if dropped > 0 {
                eprintln!(
                    "{log}: dropped {dropped} lines written after checkpoint step {}",
                    c.step()
                );
            }
        }
        let state = c.manifest.state.clone();
        eprintln!(
            "resumed from step {} ({}): policy version {}, data position {}, {} pending trajectories, {} episodes in flight",
            c.step(),
            c.dir.display(),
            state.policy_version,
            state.data_position,
            pending.len(),
            in_flight.len()
        );
        let optimizer_state = if c.manifest.files.iter().any(|f| f.path == OPTIMIZER_STATE) {
            Some(c.path(OPTIMIZER_STATE))
        } else {
            eprintln!(
                "warning: {} has no {OPTIMIZER_STATE} (written before it was saved): \
                 AdamW's moments restart from zero",
                c.dir.display()
            );
            None
        };
        // With adapters, the checkpoint's policy is the adapter (PEFT's format) over the
        // frozen base.
        let (policy_dir, adapter) = match adapter {
            Some(source) => (
                base_dir.to_path_buf(),
                Some(AdapterSource {
                    from: Some(c.path("policy")),
                    ..source
                }),
            ),
            None => (c.path("policy"), None),
        };
        Ok(Self {
            policy_dir,
            adapter,
            state,
            pending,
            in_flight,
            resumed_step: Some(c.step()),
            optimizer_state,
        })
    }
}

/// The in-flight episodes a checkpoint holds; a line that is not a record that can be
/// continued refuses the resume in one line naming the file and the line.
fn read_in_flight(path: &Path) -> anyhow::Result<Vec<InFlightEpisode>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    let mut out: Vec<InFlightEpisode> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let refuse = |why: String| {
            anyhow::anyhow!(
                "{}, line {}: {why}; the checkpoint's episodes in flight are refused",
                path.display(),
                i + 1
            )
        };
        let record: InFlightEpisode = serde_json::from_str(line)
            .map_err(|e| refuse(format!("not an in-flight episode ({e})")))?;
        record.check().map_err(|why| {
            refuse(format!(
                "episode {} cannot be continued: {why}",
                record.episode_id
            ))
        })?;
        if out.iter().any(|r| r.episode_id == record.episode_id) {
            return Err(refuse(format!(
                "episode {} is there twice",
                record.episode_id
            )));
        }
        out.push(record);
    }
    Ok(out)
}
