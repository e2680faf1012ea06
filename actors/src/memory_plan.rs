//! The memory planner: the peak a training run will need on its device, term by term, from
//! the model's shape and the configuration alone (nothing is allocated).
//!
//! Each term counts what this crate's code keeps at the learner's peak, the end of a
//! micro-batch's forward pass and the start of its backward pass, when every persistent
//! buffer exists at once: the policy's weights, gradients, float32 master copy and AdamW
//! moments; a separate critic's of the same; the frozen reference (none with LoRA: the policy's
//! base with its adapters off is the reference); the engine's copy of the
//! weights, its slots and its parked-KV pool (reserved when it starts); and the micro-batch's
//! activations and vocabulary-logits chunk. The activation term follows the decoder's code
//! (`model/layers.rs`): what autograd saves per token and layer (the float32 residual stream
//! the learner keeps, norm outputs,
//! projections, rotary halves, attention output and log-sum-exp, the SwiGLU intermediates),
//! or with recomputation each layer's input plus one layer's worth. `agent-r1 bench learner`
//! prints this prediction beside the measured peak.
//!
//! With `learner.ranks > 1` the plan is one rank's: every rank holds the weights, gradients
//! and its micro-batch's activations, plus one float32 bucket of the gradient all-reduce;
//! with `learner.shard = "optimizer_state"` its masters and moments are its `1/ranks` share;
//! with `"parameters"` also its decoder layers' weights and gradients, plus one whole layer
//! gathered and reduced at a time (rank 0 keeps every weight whole, to publish them).
//! Rank 0's plan has the engine beside it; the other ranks' have none.

pub mod engine_share;

use std::fmt;

use tch::{Device, Kind};

use crate::learner::LearnerConfig;
use crate::model::{LoraConfig, ModelConfig};

pub use engine_share::{EngineShare, ShareRequest};

/// Fixed cost of a process using the device: the CUDA context and libraries' workspaces on
/// a GPU; libtorch's code, the tokenizer and the process's own heap on a CPU.
fn runtime_overhead(device: Device) -> u64 {
    match device {
        Device::Cpu => 512 << 20,
        _ => 1 << 30,
    }
}

/// The engine's share of a training run's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnginePlan {
    /// Engines of this shape on the device (`rollout.devices` may list one device twice).
    pub engines: usize,
    /// Rows decoded together (the slots' rows).
    pub rows: usize,
    /// Longest context a row holds.
    pub max_context: usize,
    /// The parked-KV pool, reserved in full.
    pub parked_kv_bytes: usize,
    /// Each engine's share of the device, bytes, where `rollout.memory_fraction` sizes it
    /// (then the engine takes exactly that, whatever `rows` and `parked_kv_bytes` say).
    pub share_bytes: Option<u64>,
}

/// What a run puts on one device.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    /// Where it all lives.
    pub device: Device,
    /// The policy's architecture.
    pub model: &'a ModelConfig,
    /// Precision of the weights (float32 or bfloat16).
    pub kind: Kind,
    /// The learner's configuration (micro-batching, recomputation, logits chunk, KL).
    pub learner: &'a LearnerConfig,
    /// A separate critic's architecture; `None` for no critic or a value head on the
    /// policy's trunk.
    pub separate_critic: Option<&'a ModelConfig>,
    /// LoRA adapters on the separate critic (`[critic.lora]`).
    pub critic_lora: Option<&'a LoraConfig>,
    /// A distillation teacher's architecture (`[distill]`), stored in `kind` like the policy.
    pub teacher: Option<&'a ModelConfig>,
    /// LoRA adapters (`[lora]`): the base is frozen, so only the adapters have gradients
    /// and optimizer state.
    pub lora: Option<&'a LoraConfig>,
    /// The engines that share the device (as in `train`).
    pub engine: Option<EnginePlan>,
    /// Sampled tokens in the largest micro-batch when known (a benchmark's fixed shape);
    /// `None` plans for the worst case, every token sampled.
    pub action_tokens: Option<usize>,
    /// The learner rank planned for (0 with one rank; with sharded parameters rank 0 keeps
    /// whole weights and the others their shares).
    pub rank: usize,
}

/// One line of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    /// What the memory holds.
    pub name: &'static str,
    /// Bytes.
    pub bytes: u64,
    /// The configuration keys that shrink it; empty where only the model does.
    pub knobs: &'static str,
}

/// A predicted peak, term by term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The terms, in the order they are explained in.
    pub terms: Vec<Term>,
}

/// Bytes of one element of `kind`.
pub(crate) fn element_bytes(kind: Kind) -> u64 {
    match kind {
        Kind::BFloat16 | Kind::Half => 2,
        Kind::Double => 8,
        _ => 4,
    }
}

/// Bytes of the logits of `rows` rows' last positions (float32) and the sampler's float64
/// working copies (probabilities, their running sum, the draws' comparison).
pub fn engine_step_bytes(m: &ModelConfig, rows: u64) -> u64 {
    rows * m.vocab_size as u64 * (4 + 3 * 8)
}

/// Bytes autograd keeps per token for one decoder layer in a plain training pass (also an
/// upper bound of what one layer of an inference pass holds at once).
pub(crate) fn layer_activation_bytes_per_token(m: &ModelConfig, s: u64) -> u64 {
    let h = m.hidden_size as u64;
    let i = m.intermediate_size as u64;
    let q = (m.num_attention_heads * m.head_dim) as u64;
    let kv = (m.num_key_value_heads * m.head_dim) as u64;
    // Two norms: the float32 residual stream going in, the normed output coming out.
    let norms = 2 * (4 * h + h * s);
    // Projections q, k, v; rotary: the rotated halves and the results; attention output and
    // the o_proj input it is reshaped into.
    let attention = (q + 2 * kv) * s + (q + kv) * s + (q + kv) * s + 2 * q * s;
    let qk_norm = if m.qk_norm {
        (q + kv) * s + if s < 4 { (q + kv) * 4 } else { 0 }
    } else {
        0
    };
    // Log-sum-exp per query head, float32.
    let lse = m.num_attention_heads as u64 * 4;
    // SwiGLU: gate, silu(gate), up, and their product.
    let mlp = 4 * i * s;
    norms + attention + qk_norm + lse + mlp
}

impl MemoryPlan {
    /// The plan of `input`.
    pub fn predict(input: &PlanInput<'_>) -> Self {
        let m = input.model;
        let l = input.learner;
        let s = element_bytes(input.kind);
        let params = m.num_parameters() as u64;
        let reduced = s < 4;
        // With the optimizer state sharded, each rank keeps about `1/ranks` of the masters
        // and moments (parameters are dealt out whole, largest first).
        let ranks = l.memory.ranks.max(1) as u64;
        let sharded = ranks > 1 && l.memory.shard.shards_optimizer();
        let shard = |bytes: u64| {
            if sharded {
                bytes.div_ceil(ranks)
            } else {
                bytes
            }
        };
        // With sharded parameters a rank holds the non-layer parameters and its share of
        // the decoder layers' (rank 0: all weights, its share of the gradients).
        let layers_sharded = ranks > 1
            && l.memory.shard == crate::learner::ShardMode::Parameters
            && input.lora.is_none();
        let held = |c: &ModelConfig| -> u64 {
            let all = c.num_parameters() as u64;
            if !layers_sharded {
                return all;
            }
            let layers = (c.num_hidden_layers * c.layer_parameters()) as u64;
            all - layers + layers.div_ceil(ranks)
        };
        let weights_held = |c: &ModelConfig| -> u64 {
            if input.rank == 0 {
                c.num_parameters() as u64
            } else {
                held(c)
            }
        };
        const SHARD_KNOBS: &str =
            "learner.ranks, learner.shard = \"optimizer_state\" or \"parameters\"";
        let mut terms = Vec::new();
        let mut term = |name, bytes, knobs| terms.push(Term { name, bytes, knobs });
        // The adapters are float32 whatever the base's precision: no master copies.
        let adapters = input.lora.map_or(0, |lora| lora.parameters(m));
        term(
            "policy weights",
            weights_held(m) * s,
            if layers_sharded { SHARD_KNOBS } else { "" },
        );
        match input.lora {
            Some(_) => {
                term(
                    "LoRA state (adapters, grads, AdamW)",
                    adapters * 16,
                    "lora.rank, lora.target_modules",
                );
            }
            None => {
                term(
                    "policy gradients",
                    held(m) * s,
                    if layers_sharded { SHARD_KNOBS } else { "" },
                );
                term(
                    "float32 master weights",
                    if reduced { shard(params * 4) } else { 0 },
                    SHARD_KNOBS,
                );
                term("AdamW moments (float32)", shard(params * 8), SHARD_KNOBS);
            }
        }
        if ranks > 1 {
            // Gradients are summed across the ranks in float32 buckets of at most 2^24
            // elements (one at a time).
            let trained = input.lora.map_or(params, |_| adapters);
            if layers_sharded {
                let layer = m.layer_parameters() as u64;
                let rest = params - m.num_hidden_layers as u64 * layer;
                term("gradient all-reduce bucket", rest.min(1 << 24) * 4, "");
                // One layer at a time: its local gradients, their float32 copies and sum,
                // and (off rank 0) its gathered weights.
                let gathered = if input.rank == 0 { 0 } else { layer * s };
                term(
                    "gathered layer (weights, gradients, reduction)",
                    layer * (s + 8) + gathered,
                    "",
                );
            } else {
                term("gradient all-reduce bucket", trained.min(1 << 24) * 4, "");
            }
        }
        // The padded tokens of the largest micro-batch.
        let tokens = match l.memory.max_tokens_per_micro_batch {
            0 => (l.algorithm.micro_batch_size * l.max_len) as u64,
            budget => budget as u64,
        };
        // Per token and layer, an adapter keeps its float32 input (a copy when the base is
        // reduced) and its rank-wide intermediate.
        let adapter_bytes = |lora: &LoraConfig, m: &ModelConfig| -> u64 {
            lora.projection_widths(m)
                .into_iter()
                .map(|(_, inp, _)| if reduced { inp * 4 } else { 0 } + 2 * lora.rank as u64 * 4)
                .sum()
        };
        let adapter_per_token: u64 = input.lora.map_or(0, |lora| adapter_bytes(lora, m));
        let activations = |m: &ModelConfig, adapter_per_token: u64| {
            let layer = (layer_activation_bytes_per_token(m, s) + adapter_per_token) * tokens;
            let h = m.hidden_size as u64;
            // The last norm's float32 input and its output.
            let top = tokens * h * (4 + s);
            if l.memory.recompute {
                // Each layer's float32 input, one layer recomputed, and its backward's
                // working set.
                (m.num_hidden_layers as u64 + 1) * tokens * h * 4 + 2 * layer + top
            } else {
                // Every layer's, and one layer's worth of backward working set.
                (m.num_hidden_layers as u64 + 1) * layer + top
            }
        };
        let policy_activations = activations(m, adapter_per_token);
        term(
            "activations",
            policy_activations,
            "learner.recompute = true, learner.max_tokens_per_micro_batch, algorithm.micro_batch_size",
        );
        // Float32 logits of a chunk, its log-softmax, the entropy's probabilities and their
        // gradients, with the reduced-precision logits themselves.
        let actions = input.action_tokens.unwrap_or(tokens as usize);
        let chunk = l.memory.logits_chunk_tokens.min(actions) as u64;
        let per_position = m.vocab_size as u64 * (6 * 4 + s);
        term(
            "logits chunk",
            chunk * per_position,
            "learner.logits_chunk_tokens",
        );
        if let Some(t) = input.teacher {
            term("teacher weights", t.num_parameters() as u64 * s, "");
            // The teacher runs before the micro-batches train, without grad: one layer's
            // working set, the residual stream and its logits chunk at a time. Only what it
            // needs beyond the training pass's activations and chunk raises the peak.
            let forward = layer_activation_bytes_per_token(t, s) * tokens
                + 2 * tokens * t.hidden_size as u64 * 4
                + chunk * t.vocab_size as u64 * (6 * 4 + s);
            term(
                "teacher forward (beyond the training pass)",
                forward.saturating_sub(policy_activations + chunk * per_position),
                "learner.max_tokens_per_micro_batch, algorithm.micro_batch_size",
            );
        }
        if let Some(c) = input.separate_critic {
            let p = c.num_parameters() as u64;
            let (state, adapter_per_token) = match input.critic_lora {
                // A frozen base and float32 adapters with their gradients and AdamW moments.
                Some(lora) => (p * s + lora.parameters(c) * 16, adapter_bytes(lora, c)),
                None => (
                    (weights_held(c) + held(c)) * s + shard(p * (8 + if reduced { 4 } else { 0 })),
                    0,
                ),
            };
            term(
                "critic weights, gradients and optimizer",
                state,
                "critic.lora",
            );
            term(
                "critic activations",
                activations(c, adapter_per_token),
                "learner.recompute = true, learner.max_tokens_per_micro_batch",
            );
        }
        // With LoRA the reference is the policy's frozen base with its adapters off.
        term(
            "reference model",
            if l.algorithm.kl.active().is_some() && input.lora.is_none() {
                params * s
            } else {
                0
            },
            "algorithm.kl.placement = \"off\"",
        );
        if let Some(EnginePlan {
            engines,
            share_bytes: Some(share),
            ..
        }) = input.engine
        {
            term(
                "engine share (weights, KV, activations)",
                engines as u64 * share,
                "rollout.memory_fraction",
            );
        } else if let Some(e) = input.engine {
            let n = e.engines as u64;
            term(
                "engine weights",
                n * (params * s + adapters * 4),
                "rollout.devices",
            );
            let kv_per_token = m.kv_bytes_per_token(s as usize) as u64;
            term(
                "engine slots (KV)",
                n * e.rows as u64 * (e.max_context as u64 + 1) * kv_per_token,
                "rollout.concurrency, rollout.max_context_length",
            );
            term(
                "parked-KV pool",
                n * e.parked_kv_bytes as u64,
                "rollout.parked_kv_mib",
            );
            // Logits of the rows' last positions and the sampler's float64 working copies.
            term(
                "engine step (logits, sampling)",
                n * engine_step_bytes(m, e.rows as u64),
                "rollout.concurrency",
            );
        }
        term(
            "runtime (context, libraries)",
            runtime_overhead(input.device),
            "",
        );
        terms.retain(|t| t.bytes > 0);
        Self { terms }
    }

    /// The predicted peak.
    pub fn total(&self) -> u64 {
        self.terms.iter().map(|t| t.bytes).sum()
    }

    /// The largest terms first.
    pub fn largest(&self) -> Vec<&Term> {
        let mut sorted: Vec<&Term> = self.terms.iter().collect();
        sorted.sort_by_key(|t| std::cmp::Reverse(t.bytes));
        sorted
    }

    /// `Ok` when the plan fits in `capacity` bytes of `device`; otherwise the one-line
    /// refusal: the peak, the capacity, and the three largest terms with what shrinks them.
    pub fn check(&self, device: Device, capacity: u64) -> Result<(), String> {
        let total = self.total();
        if total <= capacity {
            return Ok(());
        }
        let largest: Vec<String> = self
            .largest()
            .into_iter()
            .take(3)
            .map(|t| {
                if t.knobs.is_empty() {
                    format!("{} {}", t.name, gib(t.bytes))
                } else {
                    format!("{} {} ({})", t.name, gib(t.bytes), t.knobs)
                }
            })
            .collect();
        Err(format!(
            "predicted peak {} does not fit the {} of {}; largest: {}",
            gib(total),
            gib(capacity),
            device_name(device),
            largest.join("; ")
        ))
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for t in &self.terms {
            writeln!(f, "  {:<36} {:>10}", t.name, gib(t.bytes))?;
        }
        write!(f, "  {:<36} {:>10}", "predicted peak", gib(self.total()))
    }
}

/// `12.3 GiB`.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn device_name(device: Device) -> String {
    match device {
        Device::Cpu => "cpu".into(),
        Device::Cuda(i) => format!("cuda:{i}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learner::{AlgorithmConfig, KlConfig, MemoryConfig};
    use crate::model::presets::shape;

    fn plan(learner: &LearnerConfig, kind: Kind, engine: Option<EnginePlan>) -> MemoryPlan {
        let (model, _) = shape("qwen2.5-1.5b").unwrap();
        MemoryPlan::predict(&PlanInput {
            device: Device::Cuda(0),
            model: &model,
            kind,
            learner,
            separate_critic: None,
            critic_lora: None,
            teacher: None,
            lora: None,
            engine,
            action_tokens: None,
            rank: 0,
        })
    }

    fn bytes(p: &MemoryPlan, name: &str) -> u64 {
        p.terms
            .iter()
            .find(|t| t.name == name)
            .map_or(0, |t| t.bytes)
    }

    #[test]
    fn the_static_terms_are_the_parameter_arithmetic() {
        let l = crate::learner::config::fixture();
        let p = plan(&l, Kind::BFloat16, None);
        let n = 1_543_714_304u64;
        assert_eq!(bytes(&p, "policy weights"), 2 * n);
        assert_eq!(bytes(&p, "policy gradients"), 2 * n);
        assert_eq!(bytes(&p, "float32 master weights"), 4 * n);
        assert_eq!(bytes(&p, "AdamW moments (float32)"), 8 * n);
        // Float32 weights need no master copy.
        let f = plan(&l, Kind::Float, None);
        assert_eq!(bytes(&f, "float32 master weights"), 0);
        assert_eq!(bytes(&f, "policy weights"), 4 * n);
    }

    #[test]
    fn a_lora_run_keeps_no_reference_copy() {
        let (model, _) = shape("qwen2.5-1.5b").unwrap();
        let l = LearnerConfig {
            algorithm: AlgorithmConfig {
                kl: KlConfig {
                    placement: crate::learner::KlPlacement::Loss,
                    ..Default::default()
                },
                ..Default::default()
            },
            ..crate::learner::config::fixture()
        };
        let lora = LoraConfig::default();
        let with = |lora| {
            MemoryPlan::predict(&PlanInput {
                device: Device::Cuda(0),
                model: &model,
                kind: Kind::BFloat16,
                learner: &l,
                separate_critic: None,
                critic_lora: None,
                teacher: None,
                lora,
                engine: None,
                action_tokens: None,
                rank: 0,
            })
        };
        assert_eq!(bytes(&with(None), "reference model"), 2 * 1_543_714_304);
        assert_eq!(bytes(&with(Some(&lora)), "reference model"), 0);
    }

    #[test]
    fn a_critic_with_lora_keeps_its_base_frozen() {
        let (model, _) = shape("qwen2.5-1.5b").unwrap();
        let l = crate::learner::config::fixture();
        let lora = LoraConfig::default();
        let with = |critic_lora| {
            MemoryPlan::predict(&PlanInput {
                device: Device::Cuda(0),
                model: &model,
                kind: Kind::BFloat16,
                learner: &l,
                separate_critic: Some(&model),
                critic_lora,
                teacher: None,
                lora: None,
                engine: None,
                action_tokens: None,
                rank: 0,
            })
        };
        let n = model.num_parameters() as u64;
        let name = "critic weights, gradients and optimizer";
        // bf16 weights and gradients, float32 masters and moments.
        assert_eq!(bytes(&with(None), name), n * 16);
        assert_eq!(
            bytes(&with(Some(&lora)), name),
            n * 2 + lora.parameters(&model) * 16
        );
        assert!(
            bytes(&with(Some(&lora)), "critic activations")
                > bytes(&with(None), "critic activations")
        );
    }

    #[test]
    fn sharded_optimizer_state_divides_masters_and_moments_by_the_ranks() {
        let n = 1_543_714_304u64;
        let with = |ranks, shard| {
            let mut l = crate::learner::config::fixture();
            l.memory.ranks = ranks;
            l.memory.shard = shard;
            plan(&l, Kind::BFloat16, None)
        };
        let one = with(1, crate::learner::ShardMode::Replicated);
        let replicated = with(2, crate::learner::ShardMode::Replicated);
        let sharded = with(4, crate::learner::ShardMode::OptimizerState);
        assert_eq!(bytes(&one, "gradient all-reduce bucket"), 0);
        assert_eq!(bytes(&replicated, "AdamW moments (float32)"), 8 * n);
        assert_eq!(bytes(&replicated, "gradient all-reduce bucket"), 4 << 24);
        assert_eq!(bytes(&sharded, "AdamW moments (float32)"), 2 * n);
        assert_eq!(bytes(&sharded, "float32 master weights"), n);
        assert_eq!(bytes(&sharded, "policy gradients"), 2 * n);
        assert_eq!(
            one.total() - sharded.total(),
            9 * n - (4 << 24),
            "three quarters of 12 bytes per parameter, less the bucket"
        );
    }

    #[test]
    fn sharded_parameters_divide_the_layers_weights_and_gradients_off_rank_0() {
        let (model, _) = shape("qwen2.5-1.5b").unwrap();
        let n = model.num_parameters() as u64;
        let layers = (model.num_hidden_layers * model.layer_parameters()) as u64;
        let rest = n - layers;
        let mut l = crate::learner::config::fixture();
        l.memory.ranks = 4;
        l.memory.shard = crate::learner::ShardMode::Parameters;
        l.memory.recompute = true;
        let at = |l: &LearnerConfig, rank| {
            MemoryPlan::predict(&PlanInput {
                device: Device::Cuda(0),
                model: &model,
                kind: Kind::BFloat16,
                learner: l,
                separate_critic: None,
                critic_lora: None,
                teacher: None,
                lora: None,
                engine: None,
                action_tokens: None,
                rank,
            })
        };
        let (leader, other) = (at(&l, 0), at(&l, 1));
        // Rank 0 keeps every weight whole (it publishes them); the others their quarter of
        // the layers' and all of the rest.
        assert_eq!(bytes(&leader, "policy weights"), 2 * n);
        assert_eq!(bytes(&other, "policy weights"), 2 * (rest + layers / 4));
        for p in [&leader, &other] {
            assert_eq!(bytes(p, "policy gradients"), 2 * (rest + layers / 4));
            assert_eq!(bytes(p, "AdamW moments (float32)"), 2 * n);
            assert_eq!(bytes(p, "float32 master weights"), n);
            assert_eq!(
                bytes(p, "gradient all-reduce bucket"),
                4 * rest.min(1 << 24)
            );
        }
        let layer = model.layer_parameters() as u64;
        assert_eq!(
            bytes(&leader, "gathered layer (weights, gradients, reduction)"),
            layer * 10
        );
        assert_eq!(
            bytes(&other, "gathered layer (weights, gradients, reduction)"),
            layer * 12
        );
        l.memory.shard = crate::learner::ShardMode::OptimizerState;
        let zero1 = at(&l, 1);
        assert!(other.total() < zero1.total());
        assert_eq!(
            bytes(&zero1, "policy gradients") - bytes(&other, "policy gradients"),
            2 * (layers - layers / 4)
        );
    }

    #[test]
    fn the_knobs_shrink_their_terms() {
        let plain = LearnerConfig {
            algorithm: AlgorithmConfig {
                micro_batch_size: 4,
                kl: KlConfig::OFF,
                critic_warmup_updates: 0,
                ..Default::default()
            },
            max_len: 4096,
            ..crate::learner::config::fixture()
        };
        let p = plan(&plain, Kind::BFloat16, None);
        let r = plan(
            &LearnerConfig {
                memory: MemoryConfig {
                    recompute: true,
                    ..plain.memory.clone()
                },
                ..plain.clone()
            },
            Kind::BFloat16,
            None,
        );
        assert!(bytes(&r, "activations") * 5 < bytes(&p, "activations"));
        let budget = plan(
            &LearnerConfig {
                memory: MemoryConfig {
                    max_tokens_per_micro_batch: 4096,
                    ..plain.memory.clone()
                },
                ..plain.clone()
            },
            Kind::BFloat16,
            None,
        );
        assert_eq!(bytes(&budget, "activations") * 4, bytes(&p, "activations"));
        let chunk = plan(
            &LearnerConfig {
                memory: MemoryConfig {
                    logits_chunk_tokens: 256,
                    ..plain.memory
                },
                ..plain
            },
            Kind::BFloat16,
            None,
        );
        assert_eq!(bytes(&chunk, "logits chunk") * 4, bytes(&p, "logits chunk"));
    }

    #[test]
    fn the_engine_terms_follow_its_allocation() {
        let l = crate::learner::config::fixture();
        let engine = EnginePlan {
            engines: 1,
            rows: 128,
            max_context: 8192,
            parked_kv_bytes: 16 << 30,
            share_bytes: None,
        };
        let p = plan(&l, Kind::BFloat16, Some(engine));
        // Two engines on the device (`rollout.devices = ["cuda:0", "cuda:0"]`): every
        // engine term twice, the learner's terms once.
        let two = plan(
            &l,
            Kind::BFloat16,
            Some(EnginePlan {
                engines: 2,
                ..engine
            }),
        );
        for name in [
            "engine weights",
            "engine slots (KV)",
            "parked-KV pool",
            "engine step (logits, sampling)",
        ] {
            assert_eq!(bytes(&two, name), 2 * bytes(&p, name), "{name}");
        }
        assert_eq!(bytes(&two, "policy weights"), bytes(&p, "policy weights"));
        // 28 layers x 2 x 2 KV heads x 128 dims x 2 bytes = 28 KiB per token.
        assert_eq!(bytes(&p, "engine slots (KV)"), 128 * 8193 * 28 * 1024);
        assert_eq!(bytes(&p, "parked-KV pool"), 16 << 30);
        // Sized by a share of the device instead: one term, the share per engine.
        let shared = plan(
            &l,
            Kind::BFloat16,
            Some(EnginePlan {
                engines: 2,
                share_bytes: Some(20 << 30),
                ..engine
            }),
        );
        assert_eq!(
            bytes(&shared, "engine share (weights, KV, activations)"),
            40 << 30
        );
        assert_eq!(bytes(&shared, "engine slots (KV)"), 0);
        let e = p.check(Device::Cuda(0), 80 << 30).unwrap_err();
        assert!(e.starts_with("predicted peak"), "{e}");
        assert!(e.contains("80.0 GiB of cuda:0"), "{e}");
        assert!(!e.contains('\n'), "one line: {e}");
        assert!(p.check(Device::Cuda(0), 1 << 40).is_ok());
    }
}
