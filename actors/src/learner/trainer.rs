//! The synchronous learner: models, optimizers and the PPO-style update.
//!
//! It holds tensors, so it lives on one OS thread (`super::thread`, reached through
//! [`super::LearnerRef`]); it is public for callers that already own such a thread (the
//! learner benchmark).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha12Rng;
use tch::{Kind, Tensor};

use super::advantages::estimate;
use super::batch::{build_batch, TrainBatch};
use super::config::{KlPlacement, LearnerConfig};
use super::critic_prefix::{critic_input, CriticPrefix};
use super::data_parallel::{self, Order, Ranks, ShardMode};
use super::distill::{reverse_kl_advantage, DistillCombine};
use super::layer_shards::{self, LayerShards};
use super::micro_batches::MicroBatching;
use super::optim::ParamOptimizer;
use super::staleness::filter_stale;
use super::stats::{DistillStats, UpdateStats};
use super::token_stats::{self, Positions};
use crate::algo::{self, LossAgg};
use crate::model::{LayerCheckpoints, PolicyModel, VALUE_HEAD};
use crate::process_group::ProcessGroup;
use crate::trajectory::Trajectory;
use crate::weight_digest::WeightDigest;
use crate::{Error, Result};

/// The models a learner trains and reads.
#[derive(Debug)]
pub struct LearnerModels {
    /// The trainable policy. With a value head (`PolicyModel::load(.., true)`) and no separate
    /// critic, the head shares the policy's trunk and serves as the critic.
    pub policy: PolicyModel,
    /// A separate critic (a `PolicyModel` with a value head), as verl's PPO uses.
    pub critic: Option<PolicyModel>,
    /// The frozen reference policy for the KL term (required when `kl` is configured).
    pub reference: Option<Reference>,
    /// The asymmetric critic's prefix: what the separate critic reads before each row
    /// (only with a separate critic).
    pub critic_prefix: Option<Box<dyn CriticPrefix>>,
    /// The frozen teacher of on-policy distillation (required with `distill`), with the
    /// policy's vocabulary.
    pub teacher: Option<PolicyModel>,
}

/// The frozen policy the KL term measures the policy against.
#[derive(Debug)]
pub enum Reference {
    /// A model of its own, frozen by the learner.
    Model(Box<PolicyModel>),
    /// The LoRA policy's own frozen base, computed with its adapters off: the same
    /// log-probabilities as a second copy of the base, without the copy's memory. Only for a
    /// policy with adapters.
    PolicyBase,
}

/// Where values come from.
#[derive(Debug)]
enum Critic {
    /// No critic (group or REINFORCE estimators).
    None,
    /// The policy's own value head on its trunk.
    Shared,
    /// A separate model with a value head.
    Separate(Box<PolicyModel>),
}

/// Per-token statistics summed with their mini-batch weights, over applied steps.
#[derive(Debug, Default)]
struct Sums {
    policy_loss: f64,
    entropy: f64,
    kl: f64,
    approx_kl: f64,
    clip: f64,
    clip_lower: f64,
    value_loss: f64,
    value_clip: f64,
    grad_norm: f64,
    critic_grad_norm: f64,
    mini_batches: usize,
}

impl Sums {
    /// Adds one applied step's numbers.
    fn add(&mut self, step: &Sums) {
        self.policy_loss += step.policy_loss;
        self.entropy += step.entropy;
        self.kl += step.kl;
        self.approx_kl += step.approx_kl;
        self.clip += step.clip;
        self.clip_lower += step.clip_lower;
        self.value_loss += step.value_loss;
        self.value_clip += step.value_clip;
        self.grad_norm += step.grad_norm;
        self.critic_grad_norm += step.critic_grad_norm;
        self.mini_batches += 1;
    }
}

/// Owns the trainable policy, the optional critic and reference, and their optimizers.
#[derive(Debug)]
pub struct Learner {
    config: LearnerConfig,
    policy: PolicyModel,
    critic: Critic,
    reference: Option<Reference>,
    critic_prefix: Option<Box<dyn CriticPrefix>>,
    teacher: Option<PolicyModel>,
    actor_opt: ParamOptimizer,
    critic_opt: Option<ParamOptimizer>,
    version: u64,
    updates: usize,
    /// Mini-batch shuffles. ChaCha (what `StdRng` is) because its position can be saved:
    /// a resumed run continues the same sequence of shuffles.
    rng: ChaCha12Rng,
    /// The other learner ranks, when the update is split across processes
    /// ([`Learner::join_ranks`]).
    ranks: Option<Ranks>,
    /// Rank 0 told the other ranks to stop ([`Learner::stop_ranks`]).
    stopped: bool,
    /// A collective of the ranks failed: the group is unusable, so the followers are not
    /// told to stop (they end on the same failure).
    ranks_broken: std::cell::Cell<bool>,
    /// With `ShardMode::Parameters`: the gate that holds the policy's decoder layers
    /// sharded.
    policy_shards: Option<Arc<LayerShards>>,
    /// The same for a separate critic's.
    critic_shards: Option<Arc<LayerShards>>,
}

/// Turns layer gates on for one update and off again, however it ends.
struct ActiveShards(Vec<Arc<LayerShards>>);

impl ActiveShards {
    fn on<'a>(shards: impl Iterator<Item = &'a Arc<LayerShards>>) -> Self {
        let shards: Vec<Arc<LayerShards>> = shards.cloned().collect();
        for s in &shards {
            s.activate(true);
        }
        Self(shards)
    }
}

impl Drop for ActiveShards {
    fn drop(&mut self) {
        for s in &self.0 {
            s.activate(false);
        }
    }
}

/// Where [`Learner::save`] writes a separate critic, inside the policy's directory.
pub const CRITIC_DIR: &str = "critic";

/// Trainable variables of `model`, sorted by name so that sums over them (the gradient
/// norm) run in the same order every time and runs are reproducible; `keep` picks by name.
fn params(model: &PolicyModel, keep: impl Fn(&str) -> bool) -> Vec<Tensor> {
    named_params(model, keep)
        .into_iter()
        .map(|(_, t)| t)
        .collect()
}

/// [`params`] with their names.
fn named_params(model: &PolicyModel, keep: impl Fn(&str) -> bool) -> Vec<(String, Tensor)> {
    let mut vars: Vec<(String, Tensor)> = model
        .var_store()
        .variables()
        .into_iter()
        .filter(|(name, t)| keep(name) && t.requires_grad())
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

/// The policy's parameters the actor optimizer trains: all but the value head.
fn is_actor_param(name: &str) -> bool {
    !name.starts_with(VALUE_HEAD)
}

/// Rows `index` of a `[B, ..]` tensor.
fn rows(t: &Tensor, index: &Tensor) -> Tensor {
    t.index_select(0, index)
}

/// Rows `index` of a `[B, L]` tensor, cut to a micro-batch's `cols` target positions.
fn rows_cut(t: &Tensor, index: &Tensor, cols: i64) -> Tensor {
    t.index_select(0, index).narrow(1, 0, cols)
}

/// Per row: whether `t` holds a non-finite number where `mask` is non-zero.
fn nonfinite_rows(t: &Tensor, mask: &Tensor) -> Vec<bool> {
    let bad = t
        .isfinite()
        .logical_not()
        .logical_and(&mask.ne(0))
        .any_dims(Some(&[1i64][..]), false);
    Vec::<bool>::try_from(bad.to_device(tch::Device::Cpu)).unwrap_or_default()
}

/// Rejects a trajectory whose outcome or process reward is not finite.
///
/// Unlike a non-finite loss (numerical trouble the step guard absorbs), a NaN or infinite
/// reward is a bug in the env or reward function, and it cannot be contained to its own
/// episode: group estimators would spread it to the group's baseline and whitening
/// estimators to the whole batch, so skipping steps would blame innocent episodes and
/// dropping it silently would hide the bug. The error names the episode and the step, and
/// comes before any state (version, optimizer, shuffle RNG) changes.
pub fn check_rewards(t: &Trajectory) -> Result<()> {
    if !t.reward.is_finite() {
        return Err(Error::invalid(
            format!("trajectory {}", t.episode_id),
            format!("outcome reward is {} (rewards must be finite)", t.reward),
        ));
    }
    if let Some((k, s)) = t
        .steps
        .iter()
        .enumerate()
        .find(|(_, s)| !s.reward.is_finite())
    {
        return Err(Error::invalid(
            format!("trajectory {} step {k}", t.episode_id),
            format!("process reward is {} (rewards must be finite)", s.reward),
        ));
    }
    Ok(())
}

impl Learner {
    /// Builds the learner: checks that the models fit the configuration (a critic for `gae`
    /// and `step_gae`, a reference for the KL term) and creates the optimizers.
    pub fn new(models: LearnerModels, config: LearnerConfig) -> Result<Self> {
        config.validate()?;
        let LearnerModels {
            mut policy,
            mut critic,
            mut reference,
            critic_prefix,
            mut teacher,
        } = models;
        if let Some(lora) = policy.lora() {
            // A recomputed layer would draw other dropout masks than the pass it replays.
            if lora.dropout > 0.0 && config.memory.recompute {
                return Err(Error::invalid(
                    "lora.dropout",
                    format!(
                        "got {} with memory.recompute on; allowed: 0 with recomputation \
                         (or turn memory.recompute off)",
                        lora.dropout
                    ),
                ));
            }
        }
        // Training passes accumulate the residual stream in float32 (a no-op for float32
        // models): bfloat16 sums there would make the gradients noisy at small learning
        // rates.
        for model in [
            Some(&mut policy),
            critic.as_mut(),
            match reference.as_mut() {
                Some(Reference::Model(r)) => Some(&mut **r),
                _ => None,
            },
            teacher.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            model.set_float32_residual(true);
        }
        let critic = if config.algorithm.estimator.needs_critic() {
            match critic {
                Some(c) if c.has_value_head() => Critic::Separate(Box::new(c)),
                Some(_) => {
                    return Err(Error::invalid(
                        "critic",
                        "the critic model has no value head (load it with value_head = true)",
                    ))
                }
                None if policy.has_value_head() => Critic::Shared,
                None => {
                    return Err(Error::invalid(
                        "estimator",
                        format!(
                            "`{}` needs a critic: give a critic model or load the policy \
                             with a value head",
                            config.algorithm.estimator.as_str()
                        ),
                    ))
                }
            }
        } else {
            if critic.is_some() {
                tracing::warn!(
                    estimator = config.algorithm.estimator.as_str(),
                    "a critic was given but the estimator does not use one; it is ignored"
                );
            }
            Critic::None
        };
        if critic_prefix.is_some() && !matches!(critic, Critic::Separate(_)) {
            return Err(Error::invalid(
                "critic prefix",
                "only a separate critic reads a prefix (critic.separate = true, with `gae` or \
                 `step_gae`)",
            ));
        }
        if config.algorithm.kl.active().is_some() && reference.is_none() {
            return Err(Error::invalid(
                "kl",
                "a KL term is configured but no reference model was given",
            ));
        }
        match reference.as_mut() {
            Some(Reference::Model(r)) => r.var_store_mut().freeze(),
            Some(Reference::PolicyBase) if policy.lora().is_none() => {
                return Err(Error::invalid(
                    "reference",
                    "the policy's base is the reference only for a policy with LoRA adapters; \
                     give the reference as a model of its own",
                ))
            }
            _ => {}
        }
        match (&config.distill, teacher.as_mut()) {
            (Some(_), None) => {
                return Err(Error::invalid(
                    "distill",
                    "distillation is configured but no teacher model was given",
                ))
            }
            (None, Some(_)) => {
                return Err(Error::invalid(
                    "teacher",
                    "a teacher was given but distillation is not configured ([distill])",
                ))
            }
            (Some(_), Some(t)) => {
                t.var_store_mut().freeze();
            }
            (None, None) => {}
        }
        let shared = matches!(critic, Critic::Shared);
        let actor_opt = ParamOptimizer::new(
            params(&policy, is_actor_param),
            config.algorithm.actor_lr,
            config.algorithm.weight_decay,
            (config.algorithm.betas[0], config.algorithm.betas[1]),
            config.algorithm.lr_warmup_steps,
        )?;
        let critic_params = match &critic {
            Critic::None => None,
            Critic::Shared => Some(params(&policy, |name| name.starts_with(VALUE_HEAD))),
            Critic::Separate(c) => Some(params(c, |_| true)),
        };
        let critic_opt = critic_params
            .map(|p| {
                ParamOptimizer::new(
                    p,
                    config.algorithm.critic_lr,
                    config.algorithm.weight_decay,
                    (config.algorithm.betas[0], config.algorithm.betas[1]),
                    config.algorithm.lr_warmup_steps,
                )
            })
            .transpose()?;
        tracing::debug!(
            shared,
            estimator = config.algorithm.estimator.as_str(),
            "learner ready"
        );
        Ok(Self {
            rng: ChaCha12Rng::seed_from_u64(config.seed),
            version: config.initial_version,
            config,
            policy,
            critic,
            reference,
            critic_prefix,
            teacher,
            actor_opt,
            critic_opt,
            updates: 0,
            ranks: None,
            stopped: false,
            ranks_broken: std::cell::Cell::new(false),
            policy_shards: None,
            critic_shards: None,
        })
    }

    /// Makes this learner one rank of `group`; every rank calls it, with the same model and
    /// configuration. Rank 0 then leads: its [`Self::update`], [`Self::save_optimizer`] and
    /// [`Self::load_optimizer`] send the same order (and batch) to the other ranks, which run
    /// [`Self::follow`] until rank 0's learner is dropped. Each update trains this rank's
    /// share of every mini-batch and sums gradients across the ranks, so all ranks end each
    /// update with the same weights (see `data_parallel`). A rank that loaded other weights
    /// or another configuration than rank 0 is refused, on every rank, before any work.
    pub fn join_ranks(&mut self, group: ProcessGroup, mode: ShardMode) -> Result<()> {
        let (rank, world) = (group.rank(), group.world());
        if mode == ShardMode::Parameters {
            self.check_parameter_sharding()?;
        }
        let ranks = Ranks {
            group: Arc::new(group),
            mode,
        };
        let weights = self.policy_digest()?;
        let critic = match &self.critic {
            Critic::Separate(c) => Some(WeightDigest::of(&named_params(c, |_| true))?),
            _ => None,
        };
        ranks.check_same(&[
            data_parallel::fingerprint(&(weights, critic)),
            data_parallel::fingerprint(&(&self.config, mode)),
        ])?;
        if mode.shards_optimizer() {
            self.actor_opt.shard(rank, world);
            if let Some(c) = self.critic_opt.as_mut() {
                c.shard(rank, world);
            }
        }
        if mode == ShardMode::Parameters {
            let gate = |model: &mut PolicyModel,
                        opt: &mut ParamOptimizer,
                        names: Vec<String>,
                        what: &'static str| {
                let layers = layer_shards::by_layer(&names, model.num_layers());
                let mut owner_only = vec![false; names.len()];
                let layers = layers
                    .into_iter()
                    .map(|indices| {
                        indices
                            .into_iter()
                            .map(|i| {
                                owner_only[i] = true;
                                (opt.params()[i].shallow_clone(), i, opt.owner(i))
                            })
                            .collect()
                    })
                    .collect();
                opt.set_owner_only_grads(owner_only);
                let shards = Arc::new(LayerShards::new(ranks.group.clone(), what, layers));
                model.set_layer_gate(Some(shards.clone()));
                shards
            };
            let names = named_params(&self.policy, is_actor_param)
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            self.policy_shards = Some(gate(&mut self.policy, &mut self.actor_opt, names, "policy"));
            if let (Critic::Separate(c), Some(opt)) = (&mut self.critic, self.critic_opt.as_mut()) {
                let names = named_params(c, |_| true)
                    .into_iter()
                    .map(|(n, _)| n)
                    .collect();
                self.critic_shards = Some(gate(c, opt, names, "critic"));
            }
        }
        tracing::info!(rank, world, mode = mode.as_str(), "learner rank joined");
        self.ranks = Some(ranks);
        Ok(())
    }

    /// What `ShardMode::Parameters` needs of the configuration, checked before any rank
    /// shards anything.
    fn check_parameter_sharding(&self) -> Result<()> {
        let refuse = |why: &str| Err(Error::invalid("learner.shard = \"parameters\"", why));
        if !self.config.memory.recompute {
            return refuse(
                "needs memory.recompute = true (each layer is gathered only while it runs, \
                 so its backward pass must recompute it); allowed: set memory.recompute = true, \
                 or shard = \"optimizer_state\"",
            );
        }
        if self.policy.lora().is_some() {
            return refuse(
                "does not shard LoRA adapters (the frozen base is not trained); allowed: shard = \
                 \"replicated\" or \"optimizer_state\" with LoRA",
            );
        }
        if self.policy.placement().device != tch::Device::Cpu {
            return refuse("runs on CPU ranks (Gloo) only; allowed: learner.device = \"cpu\"");
        }
        Ok(())
    }

    /// The gates' first failed collective, if any.
    fn shard_errors(&self) -> Result<()> {
        self.shards().try_for_each(|s| s.take_error())
    }

    /// Whether layer passes must keep step with the other ranks: with sharded parameters
    /// every rank runs the same number of passes (idle ones where it has no rows).
    fn lockstep(&self) -> bool {
        self.policy_shards.is_some()
    }

    /// The layer gates (policy's, then a separate critic's).
    fn shards(&self) -> impl Iterator<Item = &Arc<LayerShards>> {
        self.policy_shards.iter().chain(&self.critic_shards)
    }

    /// With [`Self::lockstep`]: the most micro-batches any rank has (`mine` here).
    fn slots(&self, mine: usize, what: &str) -> Result<usize> {
        match &self.ranks {
            Some(r) if self.lockstep() => {
                let mut n = Tensor::from_slice(&[mine as i64]);
                r.group
                    .all_reduce(&mut n, crate::process_group::ReduceOp::Max, what)?;
                Ok(n.int64_value(&[0]) as usize)
            }
            _ => Ok(mine),
        }
    }

    /// A rank other than 0: carries out rank 0's orders until rank 0 stops (its learner is
    /// dropped), or returns the first error (a collective that failed: rank 0 gone or past the
    /// group's timeout).
    pub fn follow(&mut self) -> Result<()> {
        self.follow_with(|_| {})
    }

    /// [`Self::follow`], calling `before_update` with the number of each update order (from
    /// 1) before it trains: fault injection for tests (a rank that dies mid-update).
    pub fn follow_with(&mut self, mut before_update: impl FnMut(u64)) -> Result<()> {
        let mut updates = 0;
        loop {
            let (order, payload) = match &self.ranks {
                Some(r) if r.group.rank() != 0 => r.next_order()?,
                _ => {
                    return Err(Error::invalid(
                        "learner rank",
                        "only ranks other than 0 follow (rank 0 leads)",
                    ))
                }
            };
            let path = || PathBuf::from(String::from_utf8_lossy(&payload).into_owned());
            match order {
                Order::Stop => return Ok(()),
                Order::Update => {
                    updates += 1;
                    before_update(updates);
                    let batch: Vec<Trajectory> = serde_json::from_slice(&payload).map_err(|e| {
                        Error::Other(format!("the batch rank 0 sent does not parse: {e}"))
                    })?;
                    // An error here is rank 0's too (the same checks on the same batch).
                    if let Err(e) = self.train(batch) {
                        if matches!(e, Error::Collective { .. }) {
                            return Err(e);
                        }
                    }
                }
                Order::SaveOptimizer => self.save_optimizer_here(&path())?,
                Order::LoadOptimizer => self.load_optimizer_here(&path())?,
                Order::Idle => {}
            }
        }
    }

    /// Rank 0 of several: tells the other ranks to stop (their [`Self::follow`] returns).
    /// This learner trains no more after it; dropping it does the same.
    pub fn stop_ranks(&mut self) -> Result<()> {
        self.lead(Order::Stop, &[])?;
        self.stopped = true;
        Ok(())
    }

    /// Rank 0 of several, idle: tells the followers it is still there, so that their wait for
    /// the next order does not pass the group's timeout (call it more often than that). An
    /// error names the rank that is gone. Nothing to do in a single process.
    pub fn keep_ranks_alive(&self) -> Result<()> {
        self.lead(Order::Idle, &[])
    }

    /// The group's timeout, when this learner is one of several ranks.
    pub fn rank_timeout(&self) -> Option<std::time::Duration> {
        self.ranks.as_ref().map(|r| r.group.timeout())
    }

    /// Rank 0 of several: sends `order` to the followers first.
    fn lead(&self, order: Order, payload: &[u8]) -> Result<()> {
        if self.stopped {
            return Err(Error::invalid(
                "learner",
                "its ranks were stopped; it trains no more",
            ));
        }
        match &self.ranks {
            Some(r) if r.group.rank() == 0 => self.noting_broken_ranks(r.lead(order, payload)),
            _ => Ok(()),
        }
    }

    /// This learner's rank and the number of ranks (0 of 1 without [`Self::join_ranks`]).
    pub fn rank(&self) -> (usize, usize) {
        self.ranks
            .as_ref()
            .map_or((0, 1), |r| (r.group.rank(), r.group.world()))
    }

    /// This rank's share of `rows` (all of them in a single process).
    fn my_rows(&self, rows: &[i64], lengths: &[usize]) -> Vec<i64> {
        match &self.ranks {
            Some(r) => r.share(rows, lengths),
            None => rows.to_vec(),
        }
    }

    /// Sums a `[rows, cols]` tensor each rank filled on its own rows.
    fn sum_rows(&self, t: Tensor, what: &str) -> Result<Tensor> {
        match &self.ranks {
            Some(r) => {
                let mut t = t.contiguous();
                r.sum_rows(&mut t, what)?;
                Ok(t)
            }
            None => Ok(t),
        }
    }

    /// The policy version of the current weights.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The configuration.
    pub fn config(&self) -> &LearnerConfig {
        &self.config
    }

    /// The policy (for evaluation or saving on the learner's thread).
    pub fn policy(&self) -> &PolicyModel {
        &self.policy
    }

    /// Copies of the policy's weights that change in training, value head excluded (the
    /// engine has none), sorted by name: what the engine needs to sample from the current
    /// policy. With LoRA these are the adapters alone (the engine holds the same frozen
    /// base). Copies, so that the engine can read them while this learner keeps training.
    pub fn policy_weights(&self) -> Vec<(String, Tensor)> {
        tch::no_grad(|| {
            self.published()
                .into_iter()
                .map(|(name, t)| (name, t.detach().copy()))
                .collect()
        })
    }

    /// The live tensors [`Self::policy_weights`] copies, sorted by name.
    fn published(&self) -> Vec<(String, Tensor)> {
        if self.policy.lora().is_some() {
            return self.policy.adapter_variables();
        }
        let mut live: Vec<(String, Tensor)> = self
            .policy
            .var_store()
            .variables()
            .into_iter()
            .filter(|(name, _)| !name.starts_with(VALUE_HEAD))
            .collect();
        live.sort_by(|a, b| a.0.cmp(&b.0));
        live
    }

    /// Checksums of the policy's weights as [`Self::policy_weights`] copies them (same names,
    /// same order), computed in place.
    pub fn policy_digest(&self) -> Result<WeightDigest> {
        WeightDigest::of(&self.published())
    }

    /// The policy's weights as the optimizer trains them, in float32 and sorted by name
    /// (value head excluded): the master copies when the policy is stored in bfloat16,
    /// which [`Self::policy_weights`] gives rounded.
    pub fn master_weights(&self) -> Vec<(String, Tensor)> {
        named_params(&self.policy, is_actor_param)
            .into_iter()
            .map(|(name, _)| name)
            .zip(self.actor_opt.master_weights())
            .collect()
    }

    /// Saves the policy as a Hugging Face directory (value head included when shared), and a
    /// separate critic under `dir/critic` ([`CRITIC_DIR`]).
    pub fn save(&self, dir: &Path, tokenizer_from: Option<&Path>) -> Result<()> {
        self.policy.save(dir, tokenizer_from)?;
        if let Critic::Separate(c) = &self.critic {
            c.save(&dir.join(CRITIC_DIR), None)?;
        }
        Ok(())
    }

    /// Writes the optimizers' state (AdamW moments and step counts, actor and critic) to one
    /// safetensors file, so a resumed run continues Adam where it stopped.
    ///
    /// With ranks it is a collective: the sharded state is gathered and rank 0 writes the
    /// file, in the same format, so a run resumes on any number of ranks.
    pub fn save_optimizer(&self, path: &Path) -> Result<()> {
        self.lead(Order::SaveOptimizer, path.to_string_lossy().as_bytes())?;
        self.noting_broken_ranks(self.save_optimizer_here(path))
    }

    /// `result`, noting a failed collective (the ranks' group is unusable after it).
    fn noting_broken_ranks<T>(&self, result: Result<T>) -> Result<T> {
        if matches!(result, Err(Error::Collective { .. })) {
            self.ranks_broken.set(true);
        }
        result
    }

    fn save_optimizer_here(&self, path: &Path) -> Result<()> {
        let state = |opt: &ParamOptimizer, prefix: &str| match &self.ranks {
            Some(r) => opt.state_gathered(prefix, &r.group),
            None => Ok(opt.state(prefix)),
        };
        let mut tensors = state(&self.actor_opt, "actor")?;
        if let Some(c) = &self.critic_opt {
            tensors.extend(state(c, "critic")?);
        }
        if self.rank().0 != 0 {
            return Ok(());
        }
        tensors.push((
            "learner.updates".into(),
            Tensor::from_slice(&[self.updates as i64]),
        ));
        let seed: Vec<i64> = self.rng.get_seed().iter().map(|&b| i64::from(b)).collect();
        tensors.push(("learner.shuffle_seed".into(), Tensor::from_slice(&seed)));
        let pos = self.rng.get_word_pos();
        tensors.push((
            "learner.shuffle_word_pos".into(),
            Tensor::from_slice(&[(pos >> 64) as i64, pos as u64 as i64]),
        ));
        Tensor::write_safetensors(&tensors, path).map_err(Error::from)
    }

    /// Restores [`Self::save_optimizer`]'s file; the parameters must be the same ones (a
    /// shape or count mismatch is an error naming the file). Each rank reads the file and
    /// keeps its own share of a sharded state.
    pub fn load_optimizer(&mut self, path: &Path) -> Result<()> {
        self.lead(Order::LoadOptimizer, path.to_string_lossy().as_bytes())?;
        let loaded = self.load_optimizer_here(path);
        self.noting_broken_ranks(loaded)
    }

    fn load_optimizer_here(&mut self, path: &Path) -> Result<()> {
        let tensors = Tensor::read_safetensors(path)
            .map_err(|e| Error::invalid("optimizer state", format!("{}: {e}", path.display())))?;
        self.actor_opt.load_state("actor", &tensors, path)?;
        if let Some(c) = &mut self.critic_opt {
            c.load_state("critic", &tensors, path)?;
        }
        if let Some((_, t)) = tensors.iter().find(|(n, _)| n == "learner.updates") {
            self.updates = usize::try_from(t.int64_value(&[0])).unwrap_or(0);
        }
        let find = |name: &str| tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        if let (Some(seed), Some(pos)) = (
            find("learner.shuffle_seed"),
            find("learner.shuffle_word_pos"),
        ) {
            let bytes = Vec::<i64>::try_from(seed)?;
            let seed: [u8; 32] = bytes
                .iter()
                .map(|&b| u8::try_from(b).ok())
                .collect::<Option<Vec<u8>>>()
                .and_then(|v| v.try_into().ok())
                .ok_or_else(|| {
                    Error::invalid(
                        "optimizer state",
                        format!("{}: `learner.shuffle_seed` is not 32 bytes", path.display()),
                    )
                })?;
            let hi = pos.int64_value(&[0]) as u64 as u128;
            let lo = pos.int64_value(&[1]) as u64 as u128;
            self.rng = ChaCha12Rng::from_seed(seed);
            self.rng.set_word_pos((hi << 64) | lo);
        }
        Ok(())
    }

    /// Hidden states `[b, L, H]` of `model` at the positions that predict each target
    /// token; with `recompute`, only each layer's input is kept and the returned checkpoints
    /// finish the backward pass (see [`LayerCheckpoints`]).
    fn hidden(
        model: &PolicyModel,
        batch: &TrainBatch,
        recompute: bool,
    ) -> (Tensor, Option<LayerCheckpoints>) {
        let l = batch.cols();
        if recompute {
            let (h, checkpoints) = model.forward_checkpointed(&batch.ids, &batch.input_mask);
            (h.narrow(1, 0, l), Some(checkpoints))
        } else {
            let h = model.forward_right_padded(&batch.ids, &batch.input_mask);
            (h.narrow(1, 0, l), None)
        }
    }

    /// The target token `[b, L]` of each position.
    fn targets(batch: &TrainBatch) -> Tensor {
        let t = batch.ids.size()[1];
        batch.ids.narrow(1, 1, t - 1)
    }

    fn chunk(&self) -> i64 {
        self.config.memory.logits_chunk_tokens as i64
    }

    /// Critic values `[b, L]` of the states before each target token, from the policy's
    /// hidden states when the critic shares its trunk and they are at hand; with a separate
    /// critic and `recompute`, the checkpoints that finish its backward pass.
    fn critic_values(
        &self,
        batch: &TrainBatch,
        policy_hidden: Option<&Tensor>,
        recompute: bool,
    ) -> (Option<Tensor>, Option<LayerCheckpoints>) {
        let values =
            |model: &PolicyModel, h: &Tensor| model.values(h).map(|v| v.to_kind(Kind::Float));
        match &self.critic {
            Critic::None => (None, None),
            Critic::Shared => match policy_hidden {
                Some(h) => (values(&self.policy, h), None),
                // Only the value head trains here (critic warm-up): no layer needs gradients.
                None => {
                    let (h, _) = Self::hidden(&self.policy, batch, false);
                    (values(&self.policy, &h.detach()), None)
                }
            },
            Critic::Separate(c) => {
                let (h, checkpoints) = match &batch.critic_input {
                    Some(input) => {
                        let (h, checkpoints) = if recompute {
                            let (h, c) = c.forward_checkpointed(&input.ids, &input.input_mask);
                            (h, Some(c))
                        } else {
                            (c.forward_right_padded(&input.ids, &input.input_mask), None)
                        };
                        (input.own_positions(&h, batch.cols()), checkpoints)
                    }
                    None => Self::hidden(c, batch, recompute),
                };
                (values(c, &h), checkpoints)
            }
        }
    }

    /// Rollout-time values and reference log-probabilities `[B, L]`, without grad, in the
    /// update's micro-batches.
    fn prepass(&self, batch: &TrainBatch) -> Result<Prepass> {
        let n = batch.rows();
        let all: Vec<i64> = (0..n).collect();
        let mine = self.my_rows(&all, &batch.lengths);
        let full = || Tensor::zeros([n, batch.cols()], (Kind::Float, batch.ids.device()));
        let reference = self
            .reference
            .as_ref()
            .filter(|_| self.config.algorithm.kl.active().is_some());
        let (old_values, ref_logprobs, prox_logprobs) = tch::no_grad(|| {
            // Made whether or not this rank has rows, so every rank sums the same tensors.
            let mut values: Option<Tensor> = (!matches!(self.critic, Critic::None)).then(full);
            let mut refs: Option<Tensor> = reference.is_some().then(full);
            // The policy's own log-probabilities are always computed: the sampler/trainer gap
            // is measured on every update.
            let mut prox = full();
            let micros = MicroBatching::of(&self.config).split(&mine, &batch.lengths);
            // With sharded layers every rank runs as many passes as the busiest one.
            let slots = self.slots(micros.len(), "the prepass's micro-batch count")?;
            for _ in micros.len()..slots {
                match &self.critic {
                    Critic::None => {}
                    Critic::Shared => self.policy.idle_forward(),
                    Critic::Separate(c) => c.idle_forward(),
                }
                self.policy.idle_forward();
            }
            for micro in micros {
                let idx = Tensor::from_slice(&micro).to_device(batch.ids.device());
                let mb = batch.select(&micro);
                if let (Some(v), _) = self.critic_values(&mb, None, false) {
                    let v = v.constant_pad_nd([0, batch.cols() - mb.cols()]);
                    let _ = values.get_or_insert_with(full).index_copy_(0, &idx, &v);
                }
                if let Some(reference) = reference {
                    let lp = match reference {
                        Reference::Model(model) => self.action_logprobs(model, &mb, batch.cols()),
                        Reference::PolicyBase => self.policy.with_adapters_off(|| {
                            self.action_logprobs(&self.policy, &mb, batch.cols())
                        }),
                    };
                    let _ = refs.get_or_insert_with(full).index_copy_(0, &idx, &lp);
                }
                let lp = self.action_logprobs(&self.policy, &mb, batch.cols());
                let _ = prox.index_copy_(0, &idx, &lp);
            }
            Ok::<_, Error>((values, refs, prox))
        })?;
        self.shard_errors()?;
        let sum = |t: Option<Tensor>, what: &str| t.map(|t| self.sum_rows(t, what)).transpose();
        let old_values = sum(old_values, "values")?;
        let ref_logprobs = sum(ref_logprobs, "reference log-probabilities")?;
        let prox_logprobs = self.sum_rows(prox_logprobs, "log-probabilities")?;
        let (teacher_logprobs, teacher_seconds) = match &self.teacher {
            Some(teacher) => {
                let (lp, seconds) = self.teacher_pass(teacher, batch, &mine);
                (
                    Some(self.sum_rows(lp, "teacher log-probabilities")?),
                    seconds,
                )
            }
            None => (None, 0.0),
        };
        Ok(Prepass {
            old_values,
            ref_logprobs,
            prox_logprobs,
            teacher_logprobs,
            teacher_seconds,
        })
    }

    /// `model`'s log-probabilities `[b, cols]` of a micro-batch's action tokens (0 elsewhere),
    /// without grad: only action tokens carry a KL term, an importance weight or a teacher's
    /// score.
    fn action_logprobs(&self, model: &PolicyModel, mb: &TrainBatch, cols: i64) -> Tensor {
        let positions = Positions::masked(&mb.action_mask, &Self::targets(mb));
        let (hidden, _) = Self::hidden(model, mb, false);
        let (logp, _) = token_stats::values(
            model,
            &positions.gather(&hidden),
            &positions,
            self.config.temperature,
            self.chunk(),
            false,
        );
        positions
            .scatter(&logp)
            .constant_pad_nd([0, cols - mb.cols()])
    }

    /// The teacher's log-probabilities of the batch's action tokens, in the update's
    /// micro-batches, and the seconds its forward passes took (the device synchronised
    /// before and after, so that no other model's queued work is counted).
    fn teacher_pass(
        &self,
        teacher: &PolicyModel,
        batch: &TrainBatch,
        all: &[i64],
    ) -> (Tensor, f64) {
        let sync = || {
            if let tch::Device::Cuda(i) = teacher.placement().device {
                tch::Cuda::synchronize(i as i64);
            }
        };
        sync();
        let start = Instant::now();
        let mut out = Tensor::zeros(
            [batch.rows(), batch.cols()],
            (Kind::Float, batch.ids.device()),
        );
        tch::no_grad(|| {
            for micro in MicroBatching::of(&self.config).split(all, &batch.lengths) {
                let idx = Tensor::from_slice(&micro).to_device(batch.ids.device());
                let mb = batch.select(&micro);
                let lp = self.action_logprobs(teacher, &mb, batch.cols());
                let _ = out.index_copy_(0, &idx, &lp);
            }
        });
        sync();
        (out, start.elapsed().as_secs_f64())
    }

    /// The weight of a micro-batch's aggregated loss within its mini-batch, so that
    /// accumulated gradients equal those of the whole mini-batch: by action tokens for
    /// token-mean, by sequences with at least one action token otherwise.
    fn agg_weight(&self, mask: &Tensor) -> f64 {
        match self.config.algorithm.loss_agg {
            LossAgg::TokenMean => mask.sum(Kind::Double).double_value(&[]),
            _ => mask
                .ne(0)
                .any_dims(Some(&[1i64][..]), false)
                .sum(Kind::Double)
                .double_value(&[]),
        }
    }

    /// Measures the sampler/trainer gap on the tokens the update's starting weights sampled
    /// and applies decoupled PPO's staleness weight and rollout correction's weight and
    /// rejection, keeping the two factors apart: with decoupled PPO a stale token's gap is its
    /// staleness weight and rollout correction reads fresh tokens only; without it, rollout
    /// correction reads every trained token. Returns the mask without rejected tokens, the
    /// anchor of the PPO ratio and the combined weight.
    fn correct(
        &self,
        batch: &TrainBatch,
        train_mask: Tensor,
        prox: &Tensor,
        stats: &mut UpdateStats,
    ) -> Result<Corrected> {
        let behavior = &batch.old_logprobs;
        let rc = &self.config.algorithm.rollout_correction;
        let on = train_mask.ne(0);
        let current = self.version.min(i64::MAX as u64) as i64;
        let fresh = batch.token_version.ge(current).logical_and(&on);
        let m = algo::mismatch_stats(prox, behavior, &fresh, rc.report_threshold)?;
        let tokens = m.tokens.double_value(&[]) as u64;
        stats.mismatch = (tokens > 0).then(|| crate::learner::Mismatch {
            tokens,
            abs_mean: m.abs_mean.double_value(&[]),
            abs_max: m.abs_max.double_value(&[]),
            kl_k3: m.kl_k3.double_value(&[]),
            over_threshold: m.over_threshold.double_value(&[]),
            sequence_abs_max: m.sequence_abs_max.double_value(&[]),
        });
        let decoupled = self.config.behavior_weight_cap;
        let staleness = decoupled.map(|cap| {
            let w = algo::decoupled_weight(prox, behavior, cap);
            w.where_self(&fresh.logical_not(), &w.ones_like())
        });
        if let Some(w) = &staleness {
            stats.behavior_weight_mean = Some(algo::masked_mean(w, &train_mask)?.double_value(&[]));
            let log_w = (behavior - prox).where_self(&fresh.logical_not(), &prox.zeros_like());
            stats.behavior_kl = Some(algo::masked_mean(&log_w, &train_mask)?.double_value(&[]));
        }
        if !rc.corrects() {
            let anchor = if decoupled.is_some() { prox } else { behavior };
            return Ok(Corrected {
                train_mask,
                anchor: anchor.shallow_clone(),
                weight: staleness,
            });
        }
        let applies = if decoupled.is_some() { fresh } else { on };
        let c = algo::correction(prox, behavior, &applies, rc)?;
        let kept = applies.logical_and(&c.keep.ne(0));
        stats.rejected_tokens =
            (applies.sum(Kind::Int64) - kept.sum(Kind::Int64)).int64_value(&[]) as u64;
        if rc.weight != algo::WeightLevel::Off {
            stats.correction_weight_mean =
                Some(algo::masked_mean(&c.weight, &kept)?.double_value(&[]));
        }
        let train_mask = &train_mask * &c.keep.to_kind(train_mask.kind());
        stats.action_tokens = train_mask.ne(0).sum(Kind::Int64).int64_value(&[]) as u64;
        let weight = match staleness {
            Some(w) => w * &c.weight,
            None => c.weight,
        };
        Ok(Corrected {
            train_mask,
            anchor: prox.shallow_clone(),
            weight: Some(weight),
        })
    }

    /// One update on a batch: advantages, then `ppo_epochs` passes over shuffled mini-batches
    /// with gradient accumulation over micro-batches. A mini-batch whose loss or gradient is
    /// not finite is skipped (gradients dropped, no step), counted and logged with the
    /// episodes to blame. A batch with a non-finite reward is rejected before anything is
    /// trained (see `check_rewards`). Exports metrics and returns the same numbers.
    ///
    /// Rank 0 of several sends the batch to the other ranks first (a batch with a value JSON
    /// cannot carry, a non-finite sampled log-probability, is refused before anything is
    /// sent).
    pub fn update(&mut self, trajectories: Vec<Trajectory>) -> Result<UpdateStats> {
        if matches!(&self.ranks, Some(r) if r.group.rank() == 0) || self.stopped {
            if let Some(t) = trajectories.iter().find(|t| {
                t.steps
                    .iter()
                    .any(|s| s.logprobs.iter().any(|l| !l.is_finite()))
            }) {
                return Err(Error::invalid(
                    format!("trajectory {}", t.episode_id),
                    "a sampled log-probability is not finite; learner ranks refuse such a \
                     batch (it cannot be sent to the other ranks)",
                ));
            }
            let payload = serde_json::to_vec(&trajectories)
                .map_err(|e| Error::Other(format!("cannot send the batch to the ranks: {e}")))?;
            self.lead(Order::Update, &payload)?;
        }
        let trained = self.train(trajectories);
        self.noting_broken_ranks(trained)
    }

    fn train(&mut self, trajectories: Vec<Trajectory>) -> Result<UpdateStats> {
        let start = Instant::now();
        let _active = ActiveShards::on(self.shards());
        if trajectories.is_empty() {
            return Err(Error::invalid("batch", "has no trajectories"));
        }
        for t in &trajectories {
            t.rows()
                .iter()
                .try_for_each(|row| self.policy.check_ids(&row.ids))
                .map_err(|e| {
                    Error::invalid(format!("trajectory {}", t.episode_id), e.to_string())
                })?;
            if let Some(teacher) = &self.teacher {
                t.rows()
                    .iter()
                    .try_for_each(|row| teacher.check_ids(&row.ids))
                    .map_err(|e| {
                        Error::invalid(
                            format!("trajectory {} (distillation teacher)", t.episode_id),
                            e.to_string(),
                        )
                    })?;
            }
            check_rewards(t)?;
        }
        let critic_warmup =
            self.critic_opt.is_some() && self.updates < self.config.algorithm.critic_warmup();
        let mut stats = UpdateStats {
            version: self.version,
            critic_warmup,
            trajectories: trajectories.len(),
            ..Default::default()
        };
        let outcome: Vec<f64> = trajectories
            .iter()
            .map(Trajectory::episode_return)
            .collect();
        stats.reward_mean = outcome.iter().sum::<f64>() / outcome.len() as f64;
        // Distillation alone trains on the teacher's signal, which a group of equal rewards
        // still carries.
        let distill_alone = self
            .config
            .distill
            .as_ref()
            .is_some_and(|d| d.combine == DistillCombine::Alone);
        let trajectories = if self.config.algorithm.filter_zero_variance_groups && !distill_alone {
            let gids: Vec<i64> = trajectories.iter().map(|t| t.group_id as i64).collect();
            let (keep, dropped) =
                algo::filter_zero_variance_groups(&Tensor::from_slice(&outcome), &gids)?;
            stats.filtered_groups = dropped;
            let mut all: Vec<Option<Trajectory>> = trajectories.into_iter().map(Some).collect();
            keep.into_iter().filter_map(|i| all[i].take()).collect()
        } else {
            trajectories
        };
        stats.trajectories_kept = trajectories.len();
        self.updates += 1;
        if trajectories.is_empty() {
            return Ok(self.finish(stats, start));
        }
        let device = self.policy.placement().device;
        let mut batch = build_batch(&trajectories, self.config.max_len, device)?;
        if let (Some(prefix), Critic::Separate(_)) = (&self.critic_prefix, &self.critic) {
            batch.critic_input = Some(critic_input(
                &batch,
                &trajectories,
                prefix.as_ref(),
                device,
            )?);
        }
        drop(trajectories);
        stats.truncated = batch.truncated;
        stats.tokens = batch.input_mask.sum(Kind::Int64).int64_value(&[]) as u64;
        let (train_mask, staleness) = filter_stale(
            &batch.token_version,
            &batch.action_mask,
            self.version,
            self.config.max_staleness,
        )?;
        stats.staleness_mean = staleness.mean;
        stats.staleness_max = staleness.max;
        stats.stale_tokens_dropped = staleness.dropped_tokens;
        stats.action_tokens = train_mask.sum(Kind::Int64).int64_value(&[]) as u64;

        let Prepass {
            old_values,
            ref_logprobs,
            prox_logprobs,
            teacher_logprobs,
            teacher_seconds,
        } = self.prepass(&batch)?;
        let Corrected {
            train_mask,
            anchor,
            weight,
        } = self.correct(&batch, train_mask, &prox_logprobs, &mut stats)?;
        let mut rewards = batch.token_rewards.shallow_clone();
        let mut kl_in_reward: Option<(Tensor, f64)> = None;
        if let (Some(kl), Some(reference)) = (self.config.algorithm.kl.active(), &ref_logprobs) {
            if kl.placement == KlPlacement::InReward {
                let k = algo::kl_estimate(&batch.old_logprobs, reference, kl.kind)?;
                let k = k.where_self(&batch.action_mask.ne(0), &k.zeros_like());
                rewards -= &k * kl.coef;
                stats.kl = Some(algo::masked_mean(&k, &batch.action_mask)?.double_value(&[]));
                kl_in_reward = Some((k, kl.coef));
            }
        }
        // Credit is assigned per trajectory: on the rows as they are when each trajectory is
        // one row, else on the estimation layout (see `estimation_layout`).
        let layout = batch.layout.as_ref();
        let per_trajectory = |x: &Tensor| match layout {
            None => x.shallow_clone(),
            Some(l) => l.to_trajectories(x),
        };
        let mut scores = match layout {
            None => Tensor::from_slice(&batch.scores)
                .to_kind(Kind::Float)
                .to_device(device),
            Some(l) => l.score_tensor(Kind::Float, device),
        };
        if let Some((k, coef)) = &kl_in_reward {
            scores -= per_trajectory(k).sum_dim_intlist(1, false, Kind::Float) * *coef;
        }
        let values = old_values.as_ref().map(per_trajectory);
        let (advantages, returns) = estimate(
            &self.config,
            &per_trajectory(&rewards),
            &per_trajectory(&batch.action_mask),
            &scores,
            layout.map_or(&batch.group_ids, |l| &l.group_ids),
            values.as_ref(),
        )?;
        let (advantages, returns) = match layout {
            None => (advantages, returns),
            Some(l) => (l.to_rows(&advantages), returns.map(|r| l.to_rows(&r))),
        };
        let advantages = match (&self.config.distill, &teacher_logprobs) {
            (Some(d), Some(teacher)) => {
                let (k, distill) =
                    reverse_kl_advantage(&prox_logprobs, teacher, &batch.action_mask, d.coef)?;
                stats.distill = Some(DistillStats {
                    reverse_kl: algo::masked_mean(&k, &train_mask)?.double_value(&[]),
                    teacher_tokens_per_second: stats.tokens as f64 / teacher_seconds.max(1e-9),
                });
                match d.combine {
                    DistillCombine::Alone => distill,
                    DistillCombine::WithReward => advantages + distill,
                }
            }
            _ => advantages,
        };
        stats.advantage_mean = algo::masked_mean(&advantages, &train_mask)?.double_value(&[]);
        // Rows whose inputs are already not finite: the usual culprits of a skipped step.
        let mut suspect = nonfinite_rows(&rewards, &batch.action_mask);
        for other in [
            nonfinite_rows(&batch.old_logprobs, &batch.action_mask),
            nonfinite_rows(&advantages, &batch.action_mask),
        ] {
            for (s, o) in suspect.iter_mut().zip(other) {
                *s |= o;
            }
        }
        for (s, score) in suspect.iter_mut().zip(&batch.scores) {
            *s |= !score.is_finite();
        }

        let ctx = Prepared {
            batch: &batch,
            train_mask: &train_mask,
            advantages: &advantages,
            returns: returns.as_ref(),
            old_values: old_values.as_ref(),
            ref_logprobs: ref_logprobs.as_ref(),
            anchor: &anchor,
            weight: weight.as_ref(),
            suspect: &suspect,
            train_policy: !critic_warmup,
        };
        let n = batch.rows() as usize;
        let mini = match self.config.algorithm.mini_batch_size {
            0 => n,
            m => m.min(n),
        };
        let mut sums = Sums::default();
        let mut policy_steps = 0;
        for _ in 0..self.config.algorithm.ppo_epochs {
            let mut order: Vec<i64> = (0..n as i64).collect();
            order.shuffle(&mut self.rng);
            for chunk in order.chunks(mini) {
                if self.train_mini_batch(&ctx, chunk, &mut sums, &mut stats)? {
                    policy_steps += usize::from(ctx.train_policy);
                }
            }
        }
        let m = sums.mini_batches.max(1) as f64;
        stats.policy_loss = sums.policy_loss / m;
        stats.entropy = sums.entropy / m;
        if let Some(kl) = self.config.algorithm.kl.active() {
            if kl.placement == KlPlacement::Loss && ctx.train_policy {
                stats.kl = Some(sums.kl / m);
            }
        }
        stats.approx_kl = sums.approx_kl / m;
        if !ctx.train_policy {
            stats.behavior_weight_mean = None;
            stats.behavior_kl = None;
            stats.correction_weight_mean = None;
        }
        stats.clip_fraction = sums.clip / m;
        stats.clip_fraction_lower = sums.clip_lower / m;
        let applied = stats.optimizer_steps.max(1) as f64;
        stats.grad_norm = sums.grad_norm / applied;
        if let Some(opt) = &self.critic_opt {
            stats.value_loss = Some(sums.value_loss / m);
            stats.value_clip_fraction = Some(sums.value_clip / m);
            stats.critic_grad_norm = Some(sums.critic_grad_norm / applied);
            stats.critic_lr = Some(opt.lr_at(opt.steps().saturating_sub(1)));
        }
        stats.lr = self
            .actor_opt
            .lr_at(self.actor_opt.steps().saturating_sub(1));
        if policy_steps > 0 {
            self.version += 1;
            stats.policy_updated = true;
        }
        stats.version = self.version;
        Ok(self.finish(stats, start))
    }

    fn finish(&self, mut stats: UpdateStats, start: Instant) -> UpdateStats {
        // The last optimizer step may still be queued on a GPU: it belongs to this update.
        if let tch::Device::Cuda(i) = self.policy.placement().device {
            tch::Cuda::synchronize(i as i64);
        }
        stats.duration_seconds = start.elapsed().as_secs_f64();
        stats.tokens_per_second = (stats.tokens as f64 * self.config.algorithm.ppo_epochs as f64)
            / stats.duration_seconds.max(1e-9);
        stats.record_metrics();
        stats
    }

    /// The layer passes of one micro-batch, computing nothing, on a rank with no rows in it
    /// while other ranks train theirs (sharded layers: the same collectives in the same
    /// order as [`Self::train_mini_batch`]'s passes).
    fn idle_slot(&self, ctx: &Prepared<'_>) {
        let critic_runs = ctx.returns.is_some() && ctx.old_values.is_some();
        if ctx.train_policy {
            self.policy.idle_forward();
        }
        if critic_runs {
            match &self.critic {
                Critic::Separate(c) => c.idle_forward(),
                Critic::Shared if !ctx.train_policy => self.policy.idle_forward(),
                _ => {}
            }
        }
        if ctx.train_policy {
            self.policy.idle_backward();
        }
        if let (true, Critic::Separate(c)) = (critic_runs, &self.critic) {
            c.idle_backward();
        }
    }

    /// Accumulates gradients over the micro-batches of `chunk` and steps; returns whether
    /// the step was applied.
    fn train_mini_batch(
        &mut self,
        ctx: &Prepared<'_>,
        chunk: &[i64],
        sums: &mut Sums,
        stats: &mut UpdateStats,
    ) -> Result<bool> {
        let device = ctx.batch.ids.device();
        let index = Tensor::from_slice(chunk).to_device(device);
        let total = self.agg_weight(&rows(ctx.train_mask, &index));
        if total <= 0.0 {
            return Ok(false);
        }
        self.actor_opt.zero_grad()?;
        if let Some(opt) = self.critic_opt.as_mut() {
            opt.zero_grad()?;
        }
        // This step's numbers join the update's only if it is applied: a skipped step's
        // loss is usually NaN and would make the whole update's statistics (and the
        // dashboards' gauges) NaN although the other steps trained normally.
        let mut step = Sums::default();
        let mut finite = true;
        let recompute = self.config.memory.recompute;
        let mine = self.my_rows(chunk, &ctx.batch.lengths);
        let micros = MicroBatching::of(&self.config).split(&mine, &ctx.batch.lengths);
        // With sharded layers every rank runs as many passes as the busiest one.
        let slots = self.slots(micros.len(), "the mini-batch's micro-batch count")?;
        for _ in micros.len()..slots {
            self.idle_slot(ctx);
        }
        for micro in micros {
            let idx = Tensor::from_slice(&micro).to_device(device);
            let mb = ctx.batch.select(&micro);
            let cols = mb.cols();
            let mask = rows_cut(ctx.train_mask, &idx, cols);
            let w = self.agg_weight(&mask) / total;
            if w == 0.0 {
                if self.lockstep() {
                    self.idle_slot(ctx);
                }
                continue;
            }
            let mut loss: Option<Tensor> = None;
            let mut hidden = None;
            // The policy's log-probabilities and entropies enter the loss as leaves; their
            // gradients go through the vocabulary projection chunk by chunk afterwards (see
            // `token_stats`), so no [tokens x vocab] tensor of the micro-batch exists.
            let mut policy_leaves = None;
            let mut policy_checkpoints = None;
            if ctx.train_policy {
                self.policy.set_training(!recompute);
                let (h, checkpoints) = Self::hidden(&self.policy, &mb, recompute);
                self.policy.set_training(false);
                policy_checkpoints = checkpoints;
                let positions = Positions::masked(&mask, &Self::targets(&mb));
                let h_rows = positions.gather(&h);
                // Entropy is always reported, and trained on with an entropy bonus.
                let (logp_v, ent_v) = token_stats::values(
                    &self.policy,
                    &h_rows.detach(),
                    &positions,
                    self.config.temperature,
                    self.chunk(),
                    true,
                );
                let logp_leaf = logp_v.set_requires_grad(true);
                let ent_leaf = ent_v
                    .expect("asked for")
                    .set_requires_grad(self.config.algorithm.entropy_coef != 0.0);
                let logp = positions.scatter(&logp_leaf);
                let entropy = positions.scatter(&ent_leaf);
                let advantages = rows_cut(ctx.advantages, &idx, cols);
                let anchor = rows_cut(ctx.anchor, &idx, cols);
                let pl = match ctx.weight {
                    Some(weight) => algo::weighted_ppo_policy_loss(
                        &logp,
                        &anchor,
                        &rows_cut(weight, &idx, cols),
                        &advantages,
                        &mask,
                        &self.config.algorithm.clip(),
                        self.config.algorithm.loss_agg,
                    )?,
                    None => algo::ppo_policy_loss(
                        &logp,
                        &anchor,
                        &advantages,
                        &mask,
                        &self.config.algorithm.clip(),
                        self.config.algorithm.loss_agg,
                    )?,
                };
                let mut actor = pl.loss.shallow_clone();
                if self.config.algorithm.entropy_coef != 0.0 {
                    let ent = algo::agg_loss(&entropy, &mask, self.config.algorithm.loss_agg)?;
                    step.entropy += w * ent.double_value(&[]);
                    actor -= ent * self.config.algorithm.entropy_coef;
                } else {
                    let ent = tch::no_grad(|| algo::masked_mean(&entropy.detach(), &mask))?;
                    step.entropy += w * ent.double_value(&[]);
                }
                if let (Some(kl), Some(reference)) =
                    (self.config.algorithm.kl.active(), ctx.ref_logprobs)
                {
                    if kl.placement == KlPlacement::Loss {
                        let k =
                            algo::kl_estimate(&logp, &rows_cut(reference, &idx, cols), kl.kind)?;
                        let k = algo::agg_loss(&k, &mask, self.config.algorithm.loss_agg)?;
                        step.kl += w * k.double_value(&[]);
                        actor += k * kl.coef;
                    }
                }
                step.policy_loss += w * pl.loss.double_value(&[]);
                step.clip += w * pl.clip_frac.double_value(&[]);
                step.clip_lower += w * pl.clip_frac_lower.double_value(&[]);
                step.approx_kl += w * pl.approx_kl.double_value(&[]);
                loss = Some(actor);
                hidden = Some(h);
                policy_leaves = Some((positions, h_rows, logp_leaf, ent_leaf));
            }
            let mut critic_checkpoints = None;
            if let (Some(returns), Some(old_values)) = (ctx.returns, ctx.old_values) {
                let (vpreds, checkpoints) = self.critic_values(&mb, hidden.as_ref(), recompute);
                critic_checkpoints = checkpoints;
                if let Some(vpreds) = vpreds {
                    let vl = algo::value_loss(
                        &vpreds,
                        &rows_cut(returns, &idx, cols),
                        &rows_cut(old_values, &idx, cols),
                        &mask,
                        self.config.algorithm.cliprange_value,
                        self.config.algorithm.loss_agg,
                    )?;
                    step.value_loss += w * vl.loss.double_value(&[]);
                    step.value_clip += w * vl.clip_frac.double_value(&[]);
                    let critic = vl.loss * self.config.algorithm.value_loss_coef;
                    loss = Some(match loss {
                        Some(l) => l + critic,
                        None => critic,
                    });
                }
            }
            let Some(loss) = loss else { continue };
            if !loss.double_value(&[]).is_finite() {
                finite = false;
                // No gradient reaches the layers; with sharded layers their backward passes
                // still join the other ranks' reductions.
                if let Some(checkpoints) = policy_checkpoints.filter(|_| self.lockstep()) {
                    checkpoints.backward(&self.policy);
                }
                if let (Some(checkpoints), Critic::Separate(c)) = (critic_checkpoints, &self.critic)
                {
                    if self.lockstep() {
                        checkpoints.backward(c);
                    }
                }
                continue;
            }
            let loss = loss * w;
            match policy_leaves {
                None => loss.backward(),
                Some((positions, h_rows, logp_leaf, ent_leaf)) => {
                    let with_entropy = ent_leaf.requires_grad();
                    let leaves: Vec<&Tensor> = if with_entropy {
                        vec![&logp_leaf, &ent_leaf]
                    } else {
                        vec![&logp_leaf]
                    };
                    let grads = Tensor::run_backward(&[&loss], &leaves, true, false);
                    let grad_rows = token_stats::backward(
                        &self.policy,
                        &h_rows.detach(),
                        &positions,
                        self.config.temperature,
                        self.chunk(),
                        &grads[0],
                        with_entropy.then(|| &grads[1]),
                    );
                    // One pass through the trunk: the policy's part through the hidden
                    // rows, the value loss's (a shared critic) through the loss itself.
                    (loss + (h_rows * grad_rows).sum(Kind::Float)).backward();
                }
            }
            if let Some(checkpoints) = policy_checkpoints {
                checkpoints.backward(&self.policy);
            }
            if let (Some(checkpoints), Critic::Separate(c)) = (critic_checkpoints, &self.critic) {
                checkpoints.backward(c);
            }
        }
        self.shard_errors()?;
        let reduced = |s: &Option<Arc<LayerShards>>| s.as_ref().is_some_and(|s| s.take_walked());
        let (policy_reduced, critic_reduced) =
            (reduced(&self.policy_shards), reduced(&self.critic_shards));
        if let Some(ranks) = &self.ranks {
            let mut shared = [
                step.policy_loss,
                step.entropy,
                step.kl,
                step.approx_kl,
                step.clip,
                step.clip_lower,
                step.value_loss,
                step.value_clip,
                f64::from(u8::from(!finite)),
            ];
            ranks.group.sum_f64s(&mut shared, "step statistics")?;
            [
                step.policy_loss,
                step.entropy,
                step.kl,
                step.approx_kl,
                step.clip,
                step.clip_lower,
                step.value_loss,
                step.value_clip,
            ] = shared[..8].try_into().expect("eight");
            finite = shared[8] == 0.0;
            ranks.sum_gradients(&self.actor_opt, "policy")?;
            if let Some(opt) = &self.critic_opt {
                ranks.sum_gradients(opt, "critic")?;
            }
        }
        let norm = |opt: &ParamOptimizer, what: &str| match &self.ranks {
            Some(r) => r.grad_norm(opt, what),
            None => Ok(opt.grad_norm()),
        };
        let actor_norm = if ctx.train_policy {
            norm(&self.actor_opt, "policy")?
        } else {
            0.0
        };
        let critic_norm = match &self.critic_opt {
            Some(opt) => norm(opt, "critic")?,
            None => 0.0,
        };
        if !(finite && actor_norm.is_finite() && critic_norm.is_finite()) {
            self.actor_opt.zero_grad()?;
            if let Some(opt) = self.critic_opt.as_mut() {
                opt.zero_grad()?;
            }
            let mut blamed: Vec<u64> = chunk
                .iter()
                .filter(|&&i| ctx.suspect[i as usize])
                .map(|&i| ctx.batch.episode_ids[i as usize])
                .collect();
            if blamed.is_empty() {
                blamed = chunk
                    .iter()
                    .map(|&i| ctx.batch.episode_ids[i as usize])
                    .collect();
            }
            tracing::warn!(
                version = self.version,
                loss_finite = finite,
                grad_norm = actor_norm,
                critic_grad_norm = critic_norm,
                episodes = ?blamed,
                "non-finite loss or gradient: optimizer step skipped"
            );
            stats.skipped_steps += 1;
            for id in blamed {
                if !stats.skipped_episode_ids.contains(&id) {
                    stats.skipped_episode_ids.push(id);
                }
            }
            return Ok(false);
        }
        if ctx.train_policy {
            self.actor_opt
                .clip(actor_norm, self.config.algorithm.grad_clip);
            self.actor_opt.step_after(policy_reduced)?;
            if let Some(ranks) = &self.ranks {
                ranks.share_parameters(&self.actor_opt, "policy")?;
            }
            if let Some(shards) = &self.policy_shards {
                shards.send_to_leader()?;
            }
        }
        if let Some(opt) = self.critic_opt.as_mut() {
            opt.clip(critic_norm, self.config.algorithm.grad_clip);
            opt.step_after(critic_reduced)?;
            if let Some(ranks) = &self.ranks {
                ranks.share_parameters(opt, "critic")?;
            }
            if let Some(shards) = &self.critic_shards {
                shards.send_to_leader()?;
            }
        }
        step.grad_norm = actor_norm;
        step.critic_grad_norm = critic_norm;
        sums.add(&step);
        stats.optimizer_steps += 1;
        Ok(true)
    }
}

impl Drop for Learner {
    /// Rank 0 of several tells the followers to stop.
    fn drop(&mut self) {
        if self.stopped
            || self.ranks_broken.get()
            || self.ranks.as_ref().is_none_or(|r| r.group.rank() != 0)
        {
            return;
        }
        if let Err(e) = self.lead(Order::Stop, &[]) {
            tracing::warn!("the learner ranks were not told to stop: {e}");
        }
    }
}

/// What every mini-batch of one update reads.
/// What the no-grad pass before an update computes over the whole batch.
struct Prepass {
    /// The critic's values (estimators with a critic).
    old_values: Option<Tensor>,
    /// The reference's log-probabilities (with a KL term).
    ref_logprobs: Option<Tensor>,
    /// The policy's own log-probabilities before any step: the sampler/trainer gap, decoupled
    /// PPO's proximal policy and distillation's student.
    prox_logprobs: Tensor,
    /// The teacher's log-probabilities of the sampled tokens (distillation).
    teacher_logprobs: Option<Tensor>,
    /// Seconds the teacher's forward passes took.
    teacher_seconds: f64,
}

/// The update's loss mask, PPO anchor and token weights after [`Learner::correct`].
struct Corrected {
    train_mask: Tensor,
    anchor: Tensor,
    weight: Option<Tensor>,
}

struct Prepared<'a> {
    batch: &'a TrainBatch,
    train_mask: &'a Tensor,
    advantages: &'a Tensor,
    returns: Option<&'a Tensor>,
    old_values: Option<&'a Tensor>,
    ref_logprobs: Option<&'a Tensor>,
    /// What the PPO ratio is taken around: the policy's log-probabilities as the update
    /// began (decoupled PPO, rollout correction) or the engine's.
    anchor: &'a Tensor,
    /// Each token's detached loss weight (decoupled PPO's staleness weight times rollout
    /// correction's), when either is on.
    weight: Option<&'a Tensor>,
    suspect: &'a [bool],
    train_policy: bool,
}
