//! Supervised warm start: teaching a model the tool-call format from demonstrations.
//!
//! The loss covers only the assistant's tokens (what the policy will later produce); the
//! prompt, the template and tool observations are context, exactly as in RL. Assistant spans
//! are found in token space by rendering each prefix with the generation prompt, so the ids
//! trained on are the ids the chat template produces at inference time.

use std::ops::ControlFlow;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::nn::{self, OptimizerConfig};
use tch::{Kind, Tensor};

use agent_r1_envs::message::{Message, Role};

mod chat_rows;
mod policy_contexts;

pub use chat_rows::{demonstration, read_chat_demonstrations, ChatRowRules};
pub use policy_contexts::sequences_under_policy;

use crate::model::PolicyModel;
use crate::tokenizer::HfTokenizer;
use crate::{Error, Result};

/// One demonstration: a whole conversation and the tools shown to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Demonstration {
    /// System, user, assistant and tool messages in order.
    pub messages: Vec<Message>,
    /// OpenAI function specs passed to the chat template.
    pub tools: Option<Vec<Value>>,
}

/// A tokenized demonstration.
#[derive(Debug, Clone, PartialEq)]
pub struct SftSequence {
    /// Token ids of the whole conversation.
    pub ids: Vec<u32>,
    /// Per id: whether it is an assistant token (trained on).
    pub trained: Vec<bool>,
}

/// Tokenizes a demonstration and marks its assistant tokens.
pub fn tokenize_demonstration(tok: &HfTokenizer, demo: &Demonstration) -> Result<SftSequence> {
    let tools = demo.tools.as_deref();
    let mut ids: Vec<u32> = Vec::new();
    let mut trained: Vec<bool> = Vec::new();
    for (i, m) in demo.messages.iter().enumerate() {
        if m.role != Role::Assistant {
            continue;
        }
        let prefix = tok.encode_chat(&demo.messages[..i], tools, true)?;
        let upto = tok.encode_chat(&demo.messages[..=i], tools, false)?;
        if !upto.starts_with(&prefix) || !prefix.starts_with(&ids) {
            return Err(Error::Template(format!(
                "message {i}: the rendered conversation is not a prefix of its continuation, \
                 so assistant tokens cannot be located"
            )));
        }
        trained.extend(std::iter::repeat_n(false, prefix.len() - ids.len()));
        trained.extend(std::iter::repeat_n(true, upto.len() - prefix.len()));
        ids = upto;
    }
    if ids.is_empty() {
        return Err(Error::invalid("demonstration", "has no assistant message"));
    }
    Ok(SftSequence { ids, trained })
}

/// Settings of a warm start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftConfig {
    /// Optimizer steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch_size: usize,
    /// Peak learning rate (AdamW), reached after `warmup_steps`, then cosine decay.
    pub learning_rate: f64,
    /// Learning rate at the last step as a fraction of the peak (1 = constant after the
    /// warm-up). Why not always decay: a short warm start that decays to a tenth of its rate
    /// stalls before a small model learns to copy names from its context, which happens
    /// abruptly, after some hundreds of steps at a high rate.
    pub final_lr_fraction: f64,
    /// Linear warm-up steps.
    pub warmup_steps: usize,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// Gradient-norm clip.
    pub grad_clip: f64,
    /// Longest sequence; longer ones are cut (their tail is lost).
    pub max_len: usize,
    /// Seed for batch order.
    pub seed: u64,
}

impl Default for SftConfig {
    fn default() -> Self {
        Self {
            steps: 300,
            batch_size: 16,
            learning_rate: 3e-3,
            final_lr_fraction: 0.1,
            warmup_steps: 20,
            weight_decay: 0.01,
            grad_clip: 1.0,
            max_len: 1024,
            seed: 0,
        }
    }
}

/// What a warm start did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftReport {
    /// Steps taken.
    pub steps: usize,
    /// Mean loss over the first 10 steps.
    pub first_loss: f64,
    /// Mean loss over the last 10 steps.
    pub last_loss: f64,
    /// Assistant tokens trained on.
    pub tokens: usize,
    /// Whether `on_step` stopped the run before `config.steps` (the model is then part-way).
    #[serde(default)]
    pub interrupted: bool,
}

/// Trains `model` on `data` with a masked next-token loss. `on_step` sees each step's loss
/// and may stop the run early (a signal during a long warm start), with `Break`.
pub fn train_sft(
    model: &mut PolicyModel,
    data: &[SftSequence],
    config: &SftConfig,
    mut on_step: impl FnMut(usize, f64) -> ControlFlow<()>,
) -> Result<SftReport> {
    if data.is_empty() || config.batch_size == 0 || config.steps == 0 {
        return Err(Error::invalid(
            "sft",
            "needs at least one sequence, batch_size >= 1 and steps >= 1",
        ));
    }
    let device = model.placement().device;
    let mut opt = nn::AdamW {
        wd: config.weight_decay,
        ..Default::default()
    }
    .build(model.var_store(), config.learning_rate)?;
    let mut order: Vec<usize> = (0..data.len()).collect();
    let mut rng_state = config
        .seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1);
    let mut next_rand = move || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        rng_state
    };
    let mut cursor = order.len();
    let mut losses = Vec::with_capacity(config.steps);
    let mut tokens = 0usize;
    let mut interrupted = false;
    for step in 0..config.steps {
        let mut batch = Vec::with_capacity(config.batch_size);
        while batch.len() < config.batch_size.min(data.len()) {
            if cursor == order.len() {
                for i in (1..order.len()).rev() {
                    order.swap(i, (next_rand() % (i as u64 + 1)) as usize);
                }
                cursor = 0;
            }
            batch.push(&data[order[cursor]]);
            cursor += 1;
        }
        let len = batch
            .iter()
            .map(|s| s.ids.len().min(config.max_len))
            .max()
            .unwrap_or(1);
        let b = batch.len();
        let mut ids = vec![0i64; b * len];
        let mut valid = vec![false; b * len];
        let mut weight = vec![0f32; b * len];
        for (r, s) in batch.iter().enumerate() {
            for j in 0..s.ids.len().min(len) {
                ids[r * len + j] = s.ids[j] as i64;
                valid[r * len + j] = true;
                weight[r * len + j] = if s.trained[j] { 1.0 } else { 0.0 };
            }
        }
        let shape = [b as i64, len as i64];
        let ids = Tensor::from_slice(&ids).view(shape).to_device(device);
        let valid = Tensor::from_slice(&valid).view(shape).to_device(device);
        let weight = Tensor::from_slice(&weight).view(shape).to_device(device);
        let hidden = model.forward(&ids, &valid, None);
        // Logits only where a token is trained on: the vocabulary projection and its
        // softmax are most of a small model's step, and most tokens (prompts, tool output)
        // carry no loss.
        let hidden = hidden.narrow(1, 0, len as i64 - 1);
        let next_weight = weight.narrow(1, 1, len as i64 - 1).reshape([-1]);
        let trained = next_weight.gt(0.0).nonzero().squeeze_dim(1);
        let hidden = hidden
            .reshape([-1, hidden.size()[2]])
            .index_select(0, &trained);
        let targets = ids
            .narrow(1, 1, len as i64 - 1)
            .reshape([-1])
            .index_select(0, &trained);
        let w = next_weight.index_select(0, &trained);
        let nll = model
            .logits(&hidden)
            .to_kind(Kind::Float)
            .log_softmax(-1, Kind::Float)
            .gather(-1, &targets.unsqueeze(-1), false)
            .squeeze_dim(-1)
            .neg();
        let count = w.sum(Kind::Float).clamp_min(1.0);
        let loss = (nll * &w).sum(Kind::Float) / count;
        let lr = schedule(config, step);
        opt.set_lr(lr);
        opt.zero_grad();
        loss.backward();
        opt.clip_grad_norm(config.grad_clip);
        opt.step();
        let loss_v = loss.double_value(&[]);
        if !loss_v.is_finite() {
            return Err(Error::invalid(
                "sft",
                format!("loss became {loss_v} at step {step}"),
            ));
        }
        tokens += w.sum(Kind::Float).double_value(&[]) as usize;
        losses.push(loss_v);
        if on_step(step, loss_v).is_break() {
            interrupted = step + 1 < config.steps;
            break;
        }
    }
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let k = losses.len().min(10);
    Ok(SftReport {
        steps: losses.len(),
        first_loss: mean(&losses[..k]),
        last_loss: mean(&losses[losses.len() - k..]),
        tokens,
        interrupted,
    })
}

fn schedule(c: &SftConfig, step: usize) -> f64 {
    if step < c.warmup_steps {
        return c.learning_rate * (step + 1) as f64 / c.warmup_steps as f64;
    }
    let span = (c.steps - c.warmup_steps).max(1) as f64;
    let progress = (step - c.warmup_steps) as f64 / span;
    let floor = c.final_lr_fraction;
    c.learning_rate
        * (floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))
}
