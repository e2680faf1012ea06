//! How much of its device the engine takes, decided once its weights are loaded (like vLLM's
//! `gpu_memory_utilization`): the engine may use `memory_fraction` of the device's total
//! memory, its weights included. What is left after the weights goes first to the running
//! batch's slots (`rows` x `max_context` tokens of KV) and a reserve for the activations of
//! the largest forward pass, and the rest to the pool of parked KV. Fewer rows than asked
//! are planned when the asked ones do not fit; not even one row is an error.
//!
//! The activation reserve is an estimate, on the high side, of the largest pass the engine
//! runs: a prefill of `max(max_prefill_tokens, max_context)` tokens at most (a pass holds up
//! to `max_prefill_tokens`, or one turn's whole context; and never more than
//! `min(max_batch_tokens, rows x max_context)`): hidden states, MLP intermediates, queries,
//! keys and values of one layer at a time, and the attention bias of the grouped query
//! heads over the whole context; plus the logits and the sampling buffers of every row.

use std::fmt;

use serde::{Deserialize, Serialize};
use tch::Kind;

use super::{element_bytes, engine_step_bytes, layer_activation_bytes_per_token};
use crate::device::memory::DeviceMemory;
use crate::model::ModelConfig;

/// What the share is planned from: the settings and the loaded model.
#[derive(Debug, Clone, Copy)]
pub struct ShareRequest<'a> {
    /// The share of the device's total memory the engine may use, its weights included.
    pub fraction: f64,
    /// The model's architecture.
    pub model: &'a ModelConfig,
    /// The precision of its weights and KV.
    pub kind: Kind,
    /// Bytes of the loaded weights.
    pub weights_bytes: u64,
    /// Tokens a row holds.
    pub max_context: u64,
    /// Rows asked for (the most the plan gives).
    pub wanted_rows: u64,
    /// Tokens of the running batch's budget (context + new tokens, summed over rows).
    pub max_batch_tokens: u64,
    /// Tokens of one prefill pass at most (one turn's context may exceed it: it then gets a
    /// pass of its own).
    pub max_prefill_tokens: u64,
}

impl ShareRequest<'_> {
    /// Bytes of the activation reserve for `rows` rows (see the module docs).
    pub fn activation_bytes(&self, rows: u64) -> u64 {
        let s = element_bytes(self.kind);
        let tokens = self
            .max_prefill_tokens
            .max(self.max_context)
            .min(self.max_batch_tokens)
            .min(rows.saturating_mul(self.max_context));
        // One layer at a time, and the attention bias (in the weights' precision, one row per
        // query head of a group, the boolean masks it is made from beside it) over the whole
        // context.
        let layer = tokens.saturating_mul(layer_activation_bytes_per_token(self.model, s));
        let group = (self.model.num_attention_heads / self.model.num_key_value_heads) as u64;
        let bias = tokens
            .saturating_mul(self.max_context)
            .saturating_mul(group * s + group + 1);
        layer
            .saturating_add(bias)
            .saturating_add(engine_step_bytes(self.model, rows))
    }

    /// Bytes of the slots of `rows` rows (as the engine allocates them: one spare token).
    pub fn slot_bytes(&self, rows: u64) -> u64 {
        let per_token = self
            .model
            .kv_bytes_per_token(element_bytes(self.kind) as usize) as u64;
        rows.saturating_mul(self.max_context + 1)
            .saturating_mul(per_token)
    }
}

/// What the engine takes of its device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EngineShare {
    /// The device's memory when the plan was made.
    pub device: DeviceMemory,
    /// The engine's share: `fraction` of the total.
    pub share_bytes: u64,
    /// Of the share, the weights.
    pub weights_bytes: u64,
    /// Rows of the running batch (at most those asked for).
    pub rows: u64,
    /// Bytes of their slots.
    pub slot_bytes: u64,
    /// Bytes kept free for activations.
    pub activation_bytes: u64,
    /// Bytes of the parked-KV pool.
    pub parked_bytes: u64,
}

/// Plans `request` on a device with `memory`; `Err` is one line saying what does not fit
/// and what to change.
pub fn plan(request: &ShareRequest<'_>, memory: DeviceMemory) -> Result<EngineShare, String> {
    const MIB: u64 = 1 << 20;
    let share = (request.fraction * memory.total as f64) as u64;
    let after_weights = share.saturating_sub(request.weights_bytes);
    // What is free bounds the share too: other processes (or a learner on the same device)
    // may hold some of it already.
    let budget = after_weights.min(memory.free);
    let needs = |rows: u64| {
        request
            .slot_bytes(rows)
            .saturating_add(request.activation_bytes(rows))
    };
    let Some(rows) = (1..=request.wanted_rows.max(1))
        .rev()
        .find(|&rows| needs(rows) <= budget)
    else {
        return Err(format!(
            "memory_fraction = {} gives the engine {} MiB after its weights ({} MiB of a {} MiB \
             share; {} MiB free on the device), less than one row of {} tokens needs ({} MiB of \
             KV and activations); raise memory_fraction or lower max_context_length",
            request.fraction,
            budget / MIB,
            request.weights_bytes / MIB,
            share / MIB,
            memory.free / MIB,
            request.max_context,
            needs(1).div_ceil(MIB),
        ));
    };
    Ok(EngineShare {
        device: memory,
        share_bytes: share,
        weights_bytes: request.weights_bytes,
        rows,
        slot_bytes: request.slot_bytes(rows),
        activation_bytes: request.activation_bytes(rows),
        parked_bytes: budget - needs(rows),
    })
}

impl fmt::Display for EngineShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: u64 = 1 << 20;
        write!(
            f,
            "{} MiB of {} MiB ({} MiB free after the weights): weights {} MiB, {} rows of slots \
             {} MiB, activations {} MiB, parked-KV pool {} MiB",
            self.share_bytes / MIB,
            self.device.total / MIB,
            self.device.free / MIB,
            self.weights_bytes / MIB,
            self.rows,
            self.slot_bytes / MIB,
            self.activation_bytes / MIB,
            self.parked_bytes / MIB,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::presets::shape;

    const GIB: u64 = 1 << 30;

    /// The qwen2.5-0.5b shape in bfloat16 at a 4096-token context.
    fn qwen_half_b(model: &ModelConfig, fraction: f64, wanted_rows: u64) -> ShareRequest<'_> {
        ShareRequest {
            fraction,
            model,
            kind: Kind::BFloat16,
            weights_bytes: model.num_parameters() as u64 * 2,
            max_context: 4096,
            wanted_rows,
            max_batch_tokens: 64 * 2048,
            max_prefill_tokens: 16_384,
        }
    }

    #[test]
    fn the_share_after_weights_goes_to_slots_activations_and_then_the_pool() {
        let m = shape("qwen2.5-0.5b").unwrap().0;
        let r = qwen_half_b(&m, 0.5, 64);
        let memory = DeviceMemory {
            total: 80 * GIB,
            free: 79 * GIB,
        };
        let p = plan(&r, memory).unwrap();
        assert_eq!(p.rows, 64);
        assert_eq!(p.share_bytes, 40 * GIB);
        // 24 layers x (k, v) x 2 heads x 64 x 2 bytes per token.
        assert_eq!(p.slot_bytes, 64 * 4097 * 12_288);
        assert_eq!(
            p.weights_bytes + p.slot_bytes + p.activation_bytes + p.parked_bytes,
            p.share_bytes
        );
        assert!(p.parked_bytes > 20 * GIB, "{p}");
    }

    #[test]
    fn fewer_rows_are_planned_when_the_asked_ones_do_not_fit() {
        let m = shape("qwen2.5-0.5b").unwrap().0;
        let r = qwen_half_b(&m, 0.1, 256);
        let memory = DeviceMemory {
            total: 24 * GIB,
            free: 20 * GIB,
        };
        let p = plan(&r, memory).unwrap();
        assert!(p.rows < 256 && p.rows >= 1, "{p}");
        let budget = p.share_bytes - p.weights_bytes;
        assert!(r.slot_bytes(p.rows) + r.activation_bytes(p.rows) <= budget);
        assert!(r.slot_bytes(p.rows + 1) + r.activation_bytes(p.rows + 1) > budget);
        assert_eq!(p.parked_bytes, budget - p.slot_bytes - p.activation_bytes);
    }

    #[test]
    fn free_memory_bounds_the_share() {
        let m = shape("qwen2.5-0.5b").unwrap().0;
        let r = qwen_half_b(&m, 0.9, 64);
        let memory = DeviceMemory {
            total: 80 * GIB,
            free: 10 * GIB,
        };
        let p = plan(&r, memory).unwrap();
        assert_eq!(p.slot_bytes + p.activation_bytes + p.parked_bytes, 10 * GIB);
    }

    #[test]
    fn the_activation_reserve_is_one_prefill_pass_not_every_row_at_once() {
        let m = shape("qwen2.5-0.5b").unwrap().0;
        let mut r = qwen_half_b(&m, 0.8, 4096);
        r.max_batch_tokens = 4096 * 4096;
        let step = engine_step_bytes(&m, 700);
        // Past 16,384 tokens of prefill the reserve grows only by the rows' logits.
        let prefill = r.activation_bytes(700) - step;
        assert_eq!(r.activation_bytes(4) - engine_step_bytes(&m, 4), prefill);
        // A prefill pass is never smaller than one whole context: with a 64-token cap the
        // reserve is one 4,096-token pass.
        r.max_prefill_tokens = 64;
        let one_context = r.activation_bytes(700) - step;
        assert!(one_context < prefill / 3, "{one_context} vs {prefill}");
        assert_eq!(
            r.activation_bytes(1) - engine_step_bytes(&m, 1),
            one_context
        );
        // 16,384 tokens at this shape: about 1 GiB of layer activations and 0.9 GiB of bias.
        assert!((GIB..3 * GIB).contains(&prefill), "{prefill}");
    }

    #[test]
    fn not_one_row_is_one_line_naming_what_to_change() {
        let m = shape("qwen2.5-0.5b").unwrap().0;
        let r = qwen_half_b(&m, 0.012, 64);
        let memory = DeviceMemory {
            total: 80 * GIB,
            free: 79 * GIB,
        };
        let e = plan(&r, memory).unwrap_err();
        assert!(!e.contains('\n'), "{e}");
        assert!(
            e.contains("memory_fraction = 0.012")
                && e.contains("less than one row of 4096 tokens")
                && e.contains("raise memory_fraction or lower max_context_length"),
            "{e}"
        );
    }
}
