//! The learner across processes on torch.distributed (Gloo on the CPU): an update split over
//! 2 and 4 ranks, in each sharding mode, equals the single-process update within 1e-6
//! (losses, gradient norms, weights after each step), for GRPO and for PPO with a separate
//! critic; the optimizer state saved by a sharded run resumes bit for bit on the same number
//! of ranks and within 1e-6 on another; a rank killed with SIGKILL makes the others end with
//! an error naming the collective (no hang); a rank that loaded other weights or another
//! config is refused on every rank before any work.
//!
//! This file is its own harness (`harness = false`): the driver (`main` with no rank in the
//! environment) starts each rank as a child process of this same executable.

mod learner_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use agent_r1_actors::learner::{
    AlgorithmConfig, Estimator, KlConfig, Learner, LearnerConfig, LearnerModels, MemoryConfig,
    ShardMode,
};
use agent_r1_actors::model::{Placement, PolicyModel};
use agent_r1_actors::process_group::{GroupSpec, ProcessGroup};
use agent_r1_actors::testing;
use agent_r1_actors::trajectory::Trajectory;
use learner_common::{model_config, save_policy, trajectory, TestStep};
use tch::{Kind, Tensor};

/// How long the rendezvous and each collective may take before a rank gives up.
const GROUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the driver waits for a rank process (a bound, not a measurement).
const PROCESS_LIMIT: Duration = Duration::from_secs(300);

/// What one rank process is asked to do (passed in its environment).
#[derive(Debug, Clone)]
struct Job {
    rank: usize,
    world: usize,
    mode: ShardMode,
    ppo: bool,
    /// The policy (and, with `ppo`, `critic/`) to load.
    model: PathBuf,
    /// Where rank `r` writes `rank{r}.safetensors`.
    out: PathBuf,
    store: PathBuf,
    /// Updates to run, numbered from `first_update` (each number its own batch).
    first_update: usize,
    updates: usize,
    /// A checkpoint directory to resume from (weights and `optimizer.safetensors`).
    resume: Option<PathBuf>,
    /// A checkpoint directory to write after the updates.
    save: Option<PathBuf>,
    /// Kill this rank with SIGKILL after joining (fault injection).
    die: bool,
    /// Use another learning rate (a rank with another config).
    other_lr: bool,
}

impl Job {
    fn env(&self) -> Vec<(&'static str, String)> {
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map_or(String::new(), |p| p.display().to_string())
        };
        vec![
            ("AR1_RANK", self.rank.to_string()),
            ("AR1_WORLD", self.world.to_string()),
            ("AR1_MODE", self.mode.as_str().into()),
            ("AR1_PPO", u8::from(self.ppo).to_string()),
            ("AR1_MODEL", self.model.display().to_string()),
            ("AR1_OUT", self.out.display().to_string()),
            ("AR1_STORE", self.store.display().to_string()),
            ("AR1_FIRST", self.first_update.to_string()),
            ("AR1_UPDATES", self.updates.to_string()),
            ("AR1_RESUME", path(&self.resume)),
            ("AR1_SAVE", path(&self.save)),
            ("AR1_DIE", u8::from(self.die).to_string()),
            ("AR1_OTHER_LR", u8::from(self.other_lr).to_string()),
        ]
    }

    fn from_env() -> Option<Self> {
        let get = |k: &str| std::env::var(k).ok();
        let rank = get("AR1_RANK")?.parse().ok()?;
        let opt = |k: &str| get(k).filter(|s| !s.is_empty()).map(PathBuf::from);
        Some(Self {
            rank,
            world: get("AR1_WORLD")?.parse().ok()?,
            mode: match get("AR1_MODE")?.as_str() {
                "optimizer_state" => ShardMode::OptimizerState,
                "parameters" => ShardMode::Parameters,
                _ => ShardMode::Replicated,
            },
            ppo: get("AR1_PPO")? == "1",
            model: opt("AR1_MODEL")?,
            out: opt("AR1_OUT")?,
            store: opt("AR1_STORE")?,
            first_update: get("AR1_FIRST")?.parse().ok()?,
            updates: get("AR1_UPDATES")?.parse().ok()?,
            resume: opt("AR1_RESUME"),
            save: opt("AR1_SAVE"),
            die: get("AR1_DIE")? == "1",
            other_lr: get("AR1_OTHER_LR")? == "1",
        })
    }
}

/// Update `u`'s batch: 16 trajectories in groups of 4 with different rewards and lengths
/// from 5 to 25 sampled tokens, so the ranks' shares differ in rows and tokens.
fn batch(u: usize) -> Vec<Trajectory> {
    (0..16u64)
        .map(|e| {
            let s = e + 16 * u as u64;
            let prompt: Vec<u32> = (0..3 + s % 4).map(|i| ((s * 5 + i) % 16) as u32).collect();
            let steps = vec![
                TestStep::plain((s * 3) as u32, 3 + (s * 7 % 13) as usize, 0),
                TestStep::plain((s * 7 + 1) as u32, 2 + (s * 5 % 11) as usize, 0),
            ];
            trajectory(s, s / 4, &prompt, steps, ((s * 3) % 4) as f64 / 3.0)
        })
        .collect()
}

fn config(ppo: bool, lr: f64, mode: ShardMode) -> LearnerConfig {
    LearnerConfig {
        algorithm: AlgorithmConfig {
            estimator: if ppo { Estimator::Gae } else { Estimator::Grpo },
            actor_lr: lr,
            critic_lr: 2.0 * lr,
            lr_warmup_steps: 0,
            // Small enough that clipping acts on the summed gradients.
            grad_clip: 0.5,
            mini_batch_size: 8,
            micro_batch_size: 2,
            weight_decay: 0.01,
            kl: KlConfig::OFF,
            critic_warmup_updates: 0,
            ..Default::default()
        },
        memory: MemoryConfig {
            // GRPO cuts micro-batches by count, PPO by a token budget.
            max_tokens_per_micro_batch: if ppo { 128 } else { 0 },
            // Sharded parameters are gathered per layer, which needs recomputation; the
            // single-process reference runs without it.
            recompute: mode == ShardMode::Parameters,
            ..testing::learner_config().memory
        },
        max_len: 64,
        ..testing::learner_config()
    }
}

/// One rank's work; its results go to `out/rank{r}.safetensors`.
fn run_rank(job: &Job) -> agent_r1_actors::Result<()> {
    tch::set_num_threads(1);
    let from = job.resume.as_deref().unwrap_or(&job.model);
    let policy = PolicyModel::load(from, Placement::default(), false)?;
    let critic = job
        .ppo
        .then(|| PolicyModel::load(&from.join("critic"), Placement::default(), true))
        .transpose()?;
    let lr = if job.other_lr { 2e-4 } else { 1e-4 };
    let mut learner = Learner::new(
        LearnerModels {
            policy,
            critic,
            reference: None,
            teacher: None,
            critic_prefix: None,
        },
        LearnerConfig {
            initial_version: job.first_update as u64,
            ..config(job.ppo, lr, job.mode)
        },
    )?;
    if job.world > 1 {
        let group = ProcessGroup::join(&GroupSpec::on_this_machine(
            job.store.clone(),
            job.rank,
            job.world,
            GROUP_TIMEOUT,
        ))?;
        learner.join_ranks(group, job.mode)?;
    }
    if job.die {
        // Fault injection: this rank vanishes as a killed process does.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    let mut out: Vec<(String, Tensor)> = Vec::new();
    if job.rank == 0 {
        // Rank 0 leads: each call below is sent to the other ranks too.
        if let Some(dir) = &job.resume {
            learner.load_optimizer(&dir.join("optimizer.safetensors"))?;
        }
        for u in job.first_update..job.first_update + job.updates {
            let s = learner.update(batch(u))?;
            assert_eq!(s.optimizer_steps, 2, "two mini-batches of 8");
            let mut figures = vec![
                s.policy_loss,
                s.grad_norm,
                s.entropy,
                s.approx_kl,
                s.clip_fraction,
            ];
            figures.extend([s.value_loss, s.critic_grad_norm].into_iter().flatten());
            out.push((format!("stats.{u}"), Tensor::from_slice(&figures)));
        }
        if let Some(dir) = &job.save {
            std::fs::create_dir_all(dir).map_err(|e| agent_r1_actors::Error::io(dir, e))?;
            learner.save_optimizer(&dir.join("optimizer.safetensors"))?;
            learner.save(dir, None)?;
        }
    }
    if job.world > 1 {
        // Rank 0 tells the others to stop (dropping its learner would too); they return
        // from `follow` with the same weights.
        match job.rank {
            0 => learner.stop_ranks()?,
            _ => learner.follow()?,
        }
    }
    for (name, t) in learner.master_weights() {
        out.push((format!("policy.{name}"), t));
    }
    if job.ppo {
        // The critic's weights, as `save` writes them.
        let dir = job.out.join(format!("critic-rank{}", job.rank));
        learner.save(&dir, None)?;
        for (name, t) in read_dir_tensors(&dir.join("critic")) {
            out.push((format!("critic.{name}"), t));
        }
    }
    Tensor::write_safetensors(&out, job.out.join(format!("rank{}.safetensors", job.rank)))?;
    Ok(())
}

fn read_dir_tensors(dir: &Path) -> Vec<(String, Tensor)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            out.extend(Tensor::read_safetensors(&path).unwrap());
        }
    }
    out
}

fn main() {
    if let Some(job) = Job::from_env() {
        if let Err(e) = run_rank(&job) {
            eprintln!("rank {} failed: {e}", job.rank);
            std::process::exit(1);
        }
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    std::fs::create_dir_all(&model).unwrap();
    save_policy(&model, 7);
    {
        // The separate critic: the same trunk with a seeded value head.
        tch::manual_seed(3);
        let critic = PolicyModel::new(model_config(), Placement::default(), true).unwrap();
        critic.save(&model.join("critic"), None).unwrap();
    }
    let mut d = Driver {
        tmp: tmp.path().to_path_buf(),
        model,
        runs: 0,
    };
    updates_across_ranks_equal_the_single_process_update(&mut d);
    sharded_state_resumes_on_the_same_and_another_rank_count(&mut d);
    a_killed_rank_ends_the_others_with_a_named_error(&mut d);
    a_rank_with_other_weights_or_config_is_refused(&mut d);
    println!("learner_ranks: all checks passed");
}

struct Driver {
    tmp: PathBuf,
    model: PathBuf,
    runs: usize,
}

impl Driver {
    fn job(&mut self, world: usize, mode: ShardMode, ppo: bool) -> Job {
        self.runs += 1;
        let out = self.tmp.join(format!("run{}", self.runs));
        std::fs::create_dir_all(&out).unwrap();
        Job {
            rank: 0,
            world,
            mode,
            ppo,
            model: self.model.clone(),
            store: out.join("store"),
            out,
            first_update: 0,
            updates: 2,
            resume: None,
            save: None,
            die: false,
            other_lr: false,
        }
    }

    /// Runs every rank of `job` as a process; returns each rank's output.
    fn run(&self, job: &Job, tweak: impl Fn(&mut Job)) -> Vec<Output> {
        let children: Vec<_> = (0..job.world)
            .map(|rank| {
                let mut j = Job {
                    rank,
                    ..job.clone()
                };
                tweak(&mut j);
                Command::new(std::env::current_exe().unwrap())
                    .envs(j.env())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let start = Instant::now();
        let mut children: Vec<_> = children.into_iter().map(Some).collect();
        loop {
            let done = children
                .iter_mut()
                .all(|c| c.as_mut().unwrap().try_wait().unwrap().is_some());
            if done {
                break;
            }
            if start.elapsed() > PROCESS_LIMIT {
                for c in children.iter_mut().flatten() {
                    let _ = c.kill();
                }
                panic!("rank processes still running after {PROCESS_LIMIT:?}: a hang");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        children
            .iter_mut()
            .map(|c| c.take().unwrap().wait_with_output().unwrap())
            .collect()
    }

    /// Runs `job` and checks every rank succeeded; returns rank 0's results and checks the
    /// other ranks ended with exactly the same weights.
    fn results(&self, job: &Job) -> BTreeMap<String, Tensor> {
        let outputs = self.run(job, |_| {});
        for (rank, o) in outputs.iter().enumerate() {
            assert!(
                o.status.success(),
                "rank {rank} of {} failed: {}",
                job.world,
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let read = |rank: usize| -> BTreeMap<String, Tensor> {
            Tensor::read_safetensors(job.out.join(format!("rank{rank}.safetensors")))
                .unwrap()
                .into_iter()
                .collect()
        };
        let first = read(0);
        let layer_elements = |r: &BTreeMap<String, Tensor>| -> i64 {
            r.iter()
                .filter(|(n, _)| n.starts_with("policy.model.layers."))
                .map(|(_, t)| t.numel() as i64)
                .sum()
        };
        for rank in 1..job.world {
            let mine = read(rank);
            for (name, t) in &mine {
                // With sharded parameters a rank other than 0 holds only its own layers'
                // weights (the others are empty between updates).
                let released = job.mode == ShardMode::Parameters && t.numel() == 0;
                if (name.starts_with("policy.") || name.starts_with("critic.")) && !released {
                    assert!(
                        t.equal(&first[name]),
                        "rank {rank} holds another {name} than rank 0"
                    );
                }
            }
            if job.mode == ShardMode::Parameters {
                let (held, all) = (layer_elements(&mine), layer_elements(&first));
                println!(
                    "rank {rank} of {} holds {held} of the {all} decoder-layer weights",
                    job.world
                );
                assert!(
                    held > 0 && held * job.world as i64 <= all * 3 / 2,
                    "rank {rank} of {} holds {held} of {all} layer weights",
                    job.world
                );
            }
        }
        first
    }
}

/// The largest absolute difference between two result sets (same names), and where.
fn max_diff(a: &BTreeMap<String, Tensor>, b: &BTreeMap<String, Tensor>) -> (f64, String) {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "the same results"
    );
    let mut worst = (0.0, String::new());
    for (name, t) in a {
        let d = (t.to_kind(Kind::Double) - b[name].to_kind(Kind::Double))
            .abs()
            .max()
            .double_value(&[]);
        if d > worst.0 || d.is_nan() {
            worst = (d, name.clone());
        }
    }
    worst
}

fn updates_across_ranks_equal_the_single_process_update(d: &mut Driver) {
    for ppo in [false, true] {
        let single = d.job(1, ShardMode::Replicated, ppo);
        let reference = d.results(&single);
        let initial = {
            let mut j = d.job(1, ShardMode::Replicated, ppo);
            j.updates = 0;
            d.results(&j)
        };
        let (moved, _) = max_diff(
            &reference
                .iter()
                .filter(|(n, _)| !n.starts_with("stats."))
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect(),
            &initial,
        );
        assert!(moved > 1e-4, "the updates moved the weights ({moved:e})");
        for world in [2, 4] {
            for mode in [
                ShardMode::Replicated,
                ShardMode::OptimizerState,
                ShardMode::Parameters,
            ] {
                let job = d.job(world, mode, ppo);
                let got = d.results(&job);
                let (diff, at) = max_diff(&reference, &got);
                println!(
                    "{} on {world} ranks, {}: max |difference| from one process {diff:.2e} ({at})",
                    if ppo { "PPO + separate critic" } else { "GRPO" },
                    mode.as_str()
                );
                assert!(
                    diff <= 1e-6,
                    "{world} ranks, {}: {diff:e} at {at}",
                    mode.as_str()
                );
            }
        }
    }
}

fn sharded_state_resumes_on_the_same_and_another_rank_count(d: &mut Driver) {
    for mode in [ShardMode::OptimizerState, ShardMode::Parameters] {
        resumes(d, mode);
    }
}

fn resumes(d: &mut Driver, mode: ShardMode) {
    let straight = d.job(2, mode, true);
    let straight = d.results(&straight);
    let ckpt = d.tmp.join(format!("ckpt-{}", mode.as_str()));
    let mut first = d.job(2, mode, true);
    first.updates = 1;
    first.save = Some(ckpt.clone());
    d.results(&first);
    for world in [2, 4] {
        let mut resumed = d.job(world, mode, true);
        resumed.resume = Some(ckpt.clone());
        resumed.first_update = 1;
        resumed.updates = 1;
        let mut got = d.results(&resumed);
        got.insert("stats.0".into(), straight["stats.0"].shallow_clone());
        let (diff, at) = max_diff(&straight, &got);
        println!(
            "{}: resumed on {world} ranks after 1 update on 2: max |difference| {diff:.2e} ({at})",
            mode.as_str()
        );
        if world == 2 {
            assert_eq!(
                diff, 0.0,
                "resume on the same rank count is bit for bit: {at}"
            );
        } else {
            assert!(diff <= 1e-6, "resume on {world} ranks: {diff:e} at {at}");
        }
    }
}

fn a_killed_rank_ends_the_others_with_a_named_error(d: &mut Driver) {
    let job = d.job(2, ShardMode::OptimizerState, false);
    let outputs = d.run(&job, |j| j.die = j.rank == 1);
    let killed = &outputs[1];
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        killed.status.signal(),
        Some(libc::SIGKILL),
        "rank 1 was killed"
    );
    let survivor = &outputs[0];
    let err = String::from_utf8_lossy(&survivor.stderr);
    println!("the surviving rank said: {}", err.trim());
    assert!(
        !survivor.status.success(),
        "rank 0 must fail, not finish alone"
    );
    assert!(
        err.contains("learner rank 0 of 2:") && err.contains("failed"),
        "the error names the rank and the collective: {err}"
    );
}

fn a_rank_with_other_weights_or_config_is_refused(d: &mut Driver) {
    let other = d.tmp.join("other-model");
    std::fs::create_dir_all(&other).unwrap();
    save_policy(&other, 8);
    std::fs::create_dir_all(other.join("critic")).unwrap();
    for (what, expected) in [
        ("weights", "other weights"),
        ("config", "another learner configuration"),
    ] {
        let job = d.job(2, ShardMode::Replicated, false);
        let outputs = d.run(&job, |j| {
            if j.rank == 1 {
                match what {
                    "weights" => j.model = other.clone(),
                    _ => j.other_lr = true,
                }
            }
        });
        for (rank, o) in outputs.iter().enumerate() {
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "rank {rank} must refuse ({what})");
            assert!(
                err.contains(&format!("rank 1 joined with {expected} than rank 0")),
                "rank {rank} ({what}): {err}"
            );
            assert!(
                !job.out.join(format!("rank{rank}.safetensors")).exists(),
                "no work was done"
            );
        }
    }
}
