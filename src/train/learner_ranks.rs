//! The learner's models as a plan any rank can load, and the other ranks of a learner with
//! `learner.ranks > 1`: processes of this binary (`agent-r1 learner-rank`) that load the
//! same plan, join rank 0's process group and follow its orders until it stops.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use agent_r1_actors::learner::{
    CriticConfig, CriticPrefix, Learner, LearnerConfig, LearnerModels, RankJoin, Reference,
};
use agent_r1_actors::model::lora::{AdapterSource, LoraConfig};
use agent_r1_actors::model::{Placement, PolicyModel};
use agent_r1_actors::process_group::GroupSpec;
use agent_r1_actors::tokenizer::HfTokenizer;
use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::critic_prefix::TemplatePrefix;

/// The directory under the run directory where the ranks meet.
pub const RANKS_DIR: &str = "learner-ranks";

/// A model the learner loads: its directory and, when it trains adapters, their settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelPlan {
    /// A Hugging Face model directory (the frozen base when adapters train).
    pub dir: PathBuf,
    /// The settings of fresh adapters.
    pub lora: Option<LoraConfig>,
    /// A saved adapter to start from.
    pub lora_from: Option<PathBuf>,
}

impl ModelPlan {
    pub fn new(dir: PathBuf, adapter: Option<AdapterSource>) -> Self {
        let (lora, lora_from) = match adapter {
            Some(a) => (Some(a.config), a.from),
            None => (None, None),
        };
        Self {
            dir,
            lora,
            lora_from,
        }
    }

    fn adapter(&self) -> Option<AdapterSource> {
        self.lora.clone().map(|config| AdapterSource {
            config,
            from: self.lora_from.clone(),
        })
    }

    fn load(&self, placement: Placement, value_head: bool) -> agent_r1_actors::Result<PolicyModel> {
        PolicyModel::load_adapted(&self.dir, placement, value_head, self.adapter().as_ref())
    }
}

/// The KL reference the learner holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ReferencePlan {
    /// No KL term.
    None,
    /// The policy's frozen base with its adapters off.
    PolicyBase,
    /// A model of its own.
    Model(PathBuf),
}

/// Everything a learner rank loads: the same on every rank, written by the trainer to
/// `learner-ranks/plan.json` for the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LearnerPlan {
    /// The learner's settings (`[learner]`'s ranks among them).
    pub config: LearnerConfig,
    /// The seed set before the models load (fresh value heads and adapters draw from it).
    pub seed: u64,
    /// The policy.
    pub policy: ModelPlan,
    /// Whether the policy carries the value head (a critic on its trunk).
    pub value_head_on_policy: bool,
    /// A separate critic.
    pub critic: Option<ModelPlan>,
    /// The KL reference.
    pub reference: ReferencePlan,
    /// The on-policy distillation teacher.
    pub teacher: Option<PathBuf>,
    /// The asymmetric critic's prefix template, read with the policy's tokenizer.
    pub critic_prefix: Option<CriticConfig>,
}

impl LearnerPlan {
    /// Loads the models on `placement` (on the learner thread); `prefix` is the critic prefix
    /// already built, else it is built from the plan.
    pub fn load(
        &self,
        placement: Placement,
        prefix: Option<TemplatePrefix>,
    ) -> agent_r1_actors::Result<LearnerModels> {
        tch::manual_seed(self.seed as i64);
        let policy = self.policy.load(placement, self.value_head_on_policy)?;
        let critic = self
            .critic
            .as_ref()
            .map(|c| c.load(placement, true))
            .transpose()?;
        let reference = match &self.reference {
            ReferencePlan::None => None,
            ReferencePlan::PolicyBase => Some(Reference::PolicyBase),
            ReferencePlan::Model(dir) => Some(Reference::Model(Box::new(PolicyModel::load(
                dir, placement, false,
            )?))),
        };
        let teacher = self
            .teacher
            .as_ref()
            .map(|dir| PolicyModel::load(dir, placement, false))
            .transpose()?;
        let prefix = match (prefix, &self.critic_prefix) {
            (Some(p), _) => Some(p),
            (None, Some(critic)) => {
                let tokenizer = std::sync::Arc::new(HfTokenizer::from_dir(&self.policy.dir)?);
                TemplatePrefix::new(critic, tokenizer)
                    .map_err(|e| agent_r1_actors::Error::Other(e.to_string()))?
            }
            (None, None) => None,
        };
        Ok(LearnerModels {
            policy,
            critic,
            reference,
            teacher,
            critic_prefix: prefix.map(|p| Box::new(p) as Box<dyn CriticPrefix>),
        })
    }

    /// How many ranks the learner has.
    pub fn ranks(&self) -> usize {
        self.config.memory.ranks
    }

    /// The group rank `rank` joins, meeting at `store`.
    pub fn join(&self, store: &Path, rank: usize) -> RankJoin {
        RankJoin {
            spec: GroupSpec::on_this_machine(
                store.to_path_buf(),
                rank,
                self.ranks(),
                Duration::from_secs(self.config.memory.rank_timeout_s),
            ),
            mode: self.config.memory.shard,
        }
    }
}

/// `learner.ranks > 1` on this machine: the learner on the CPU, and no more ranks than
/// cores. One line naming the key, before any work.
pub fn check_ranks(config: &LearnerConfig, placement: Placement) -> anyhow::Result<()> {
    let ranks = config.memory.ranks;
    if ranks < 2 {
        return Ok(());
    }
    if placement != Placement::default() {
        anyhow::bail!(
            "learner.ranks = {ranks}: learner ranks run on the CPU in float32 (torch.distributed \
             with Gloo); this learner is on {:?} in {:?} (NCCL ranks on GPUs are not built in): \
             set model.device = \"cpu\" or learner.ranks = 1",
            placement.device,
            placement.kind
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if ranks > cores {
        anyhow::bail!(
            "learner.ranks = {ranks}: more ranks than this machine's {cores} cores; allowed: \
             1 to {cores}"
        );
    }
    Ok(())
}

/// The other ranks' processes, stopped when this is dropped: each is given a few seconds to
/// end on its own (rank 0's learner tells them to stop as it closes), then killed.
#[derive(Debug)]
pub struct Followers {
    children: Vec<(usize, Child)>,
}

impl Followers {
    /// Writes `plan` under `run_dir/learner-ranks/` and starts ranks `1..plan.ranks()`;
    /// returns them and the join of rank 0 (this process). Each rank's stderr is this
    /// process's.
    pub fn start(
        plan: &LearnerPlan,
        run_dir: &Path,
        extra_args: impl Fn(usize) -> Vec<String>,
    ) -> anyhow::Result<(Self, RankJoin)> {
        let dir = run_dir.join(RANKS_DIR);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("{}: cannot create", dir.display()))?;
        let plan_path = dir.join("plan.json");
        std::fs::write(&plan_path, serde_json::to_vec_pretty(plan)?)
            .with_context(|| format!("{}: cannot write", plan_path.display()))?;
        // A fresh rendezvous file: one left by an earlier start would hold its ranks' keys.
        let store = dir.join("rendezvous");
        match std::fs::remove_file(&store) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("{}: cannot remove", store.display())),
        }
        let exe = std::env::current_exe().context("finding this program to start learner ranks")?;
        let mut followers = Self {
            children: Vec::new(),
        };
        for rank in 1..plan.ranks() {
            let child = std::process::Command::new(&exe)
                .arg("learner-rank")
                .arg("--plan")
                .arg(&plan_path)
                .arg("--store")
                .arg(&store)
                .arg("--rank")
                .arg(rank.to_string())
                .args(extra_args(rank))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .with_context(|| format!("starting learner rank {rank} ({})", exe.display()))?;
            followers.children.push((rank, child));
        }
        eprintln!(
            "learner: {} ranks ({}), rank timeout {} s",
            plan.ranks(),
            plan.config.memory.shard.as_str(),
            plan.config.memory.rank_timeout_s
        );
        Ok((followers, plan.join(&store, 0)))
    }
}

impl Drop for Followers {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for (rank, child) in &mut self.children {
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        if !status.success() {
                            tracing::warn!("learner rank {rank} ended with {status}");
                        }
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }
}

/// `agent-r1 learner-rank`: one learner rank other than 0. Loads `plan`, joins the group at
/// `store` as `rank` and follows rank 0's orders until it stops (or a collective fails: the
/// error names the rank and the operation). `signal_at` is fault injection for tests: the
/// process sends itself the signal (SIGKILL, SIGSTOP) as it starts that update (from 1).
pub fn follow(
    plan: &Path,
    store: &Path,
    rank: usize,
    signal_at: Option<(u64, i32)>,
) -> anyhow::Result<()> {
    let text = std::fs::read(plan).with_context(|| format!("{}: cannot read", plan.display()))?;
    let plan: LearnerPlan = serde_json::from_slice(&text)
        .with_context(|| format!("{}: not a learner plan", plan.display()))?;
    if rank == 0 || rank >= plan.ranks() {
        anyhow::bail!(
            "--rank {rank}: the followers of a learner of {} ranks are 1 to {}",
            plan.ranks(),
            plan.ranks() - 1
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    tch::set_num_threads((cores / plan.ranks()).max(1) as i32);
    let models = plan.load(Placement::default(), None)?;
    let mut learner = Learner::new(models, plan.config.clone())?;
    let join = plan.join(store, rank);
    learner.join_ranks(join.group()?, join.mode)?;
    learner.follow_with(|update| {
        if let Some((_, signal)) = signal_at.filter(|(at, _)| *at == update) {
            eprintln!("learner rank {rank}: signal {signal} at update {update} (fault injection)");
            // SAFETY: signals this process.
            unsafe { libc::kill(libc::getpid(), signal) };
        }
    })?;
    Ok(())
}
