//! CUDA graphs of the decode step.
//!
//! Launched one kernel at a time from the host, a decode step of a small model is mostly
//! launch time: over a thousand kernels, each a few microseconds of host work. A graph
//! replays the whole step (embedding, every layer, logits and sampling) in one launch.
//!
//! A graph fixes its shapes and the addresses it reads and writes, so a step is captured
//! per bucket of rows (the running batch is padded up to the next bucket with greedy rows
//! that write only their own spare slot) and per [`SampleMode`]. Everything that changes
//! from step to step comes through one upload buffer: token ids, positions, where each row's
//! keys and values go, and the sampling settings; attention reads each row's keys by length
//! ([`crate::model::KeyLengths`]), so no mask's shape follows the longest row. Weight
//! updates copy into the weights in place, so the graphs stay valid across them.

use std::collections::HashMap;

use tch::{Kind, Tensor};

use super::slots::SlotCache;
use crate::device::cuda::{Graph, GraphError, Graphs};
use crate::model::sampling::{
    row_settings, sample_with_settings, RowSampling, SampleMode, PADDING_SETTINGS,
};
use crate::model::{KeyLengths, PolicyModel};

/// The captured decode steps of one engine.
pub(super) struct DecodeGraphs {
    graphs: Graphs,
    /// Row counts a step is padded up to, ascending; the last is the engine's most rows.
    buckets: Vec<i64>,
    captured: HashMap<(i64, SampleMode), Captured>,
}

struct Captured {
    graph: Graph,
    /// float64 on the device: ids [B], positions [B], write index [B * kv_heads], then the
    /// sampling settings [4, B].
    upload: Tensor,
    /// [B, 2] float64 (token, log-probability), overwritten by every replay.
    out: Tensor,
}

impl DecodeGraphs {
    /// Graphs for an engine of `max_rows` rows; an error says why a step cannot be captured
    /// here (no GPU, no CUDA shim in this build, weights in float32).
    pub(super) fn new(model: &PolicyModel, max_rows: usize) -> Result<Self, GraphError> {
        let placement = model.placement();
        if !matches!(placement.kind, Kind::BFloat16 | Kind::Half) {
            return Err(GraphError(format!(
                "flash attention needs bf16 or f16 weights; this engine runs {:?}",
                placement.kind
            )));
        }
        let graphs = Graphs::new(placement.device)?;
        Ok(Self {
            graphs,
            buckets: buckets(max_rows as i64),
            captured: HashMap::new(),
        })
    }

    /// Graphs captured so far.
    pub(super) fn captured(&self) -> usize {
        self.captured.len()
    }

    /// One decode step of rows `0..ids.len()`: row `b` adds token `ids[b]` at position
    /// `slots.len(b)` and samples under `rows[b]`. Captures the step's graph the first time
    /// its bucket and mode are seen. Returns the rows' [n, 2] (token, log-probability) on the
    /// device; the caller advances `slots`.
    pub(super) fn step(
        &mut self,
        model: &PolicyModel,
        slots: &SlotCache,
        ids: &[i64],
        rows: &[RowSampling<'_>],
    ) -> Result<Tensor, GraphError> {
        let n = ids.len() as i64;
        let bucket = *self
            .buckets
            .iter()
            .find(|&&b| b >= n)
            .ok_or_else(|| GraphError(format!("{n} rows is more than the engine's rows")))?;
        let vocab = model.config().vocab_size as i64;
        let mut mode = SampleMode::of(rows, vocab);
        if n < bucket {
            mode = mode.with_padding();
        }
        let host = Tensor::from_slice(&step_inputs(slots, bucket, ids, rows, vocab));
        if let Some(c) = self.captured.get_mut(&(bucket, mode)) {
            c.upload.copy_(&host);
            c.graph.replay()?;
            return Ok(c.out.narrow(0, 0, n));
        }
        let upload = host.to_device(model.placement().device);
        let (graph, out) = self
            .graphs
            .capture(|| step_body(model, slots, &upload, bucket, mode))?;
        // The capture recorded the step without running it (the warm-up before it ran it
        // once); replaying writes the same keys and values again and fills `out`.
        graph.replay()?;
        let captured = Captured { graph, upload, out };
        let result = captured.out.narrow(0, 0, n);
        self.captured.insert((bucket, mode), captured);
        Ok(result)
    }
}

/// The upload buffer's contents for a step of `ids.len()` rows padded to `bucket`: ids,
/// positions and write indices (as float64, exact below 2^53), then the sampling settings
/// [4, bucket]. Padding rows are greedy, at position 0, and write their spare slot.
fn step_inputs(
    slots: &SlotCache,
    bucket: i64,
    ids: &[i64],
    rows: &[RowSampling<'_>],
    vocab: i64,
) -> Vec<f64> {
    let n = ids.len();
    let b = bucket as usize;
    let heads = slots.kv_heads();
    let spare = slots.capacity();
    let mut host = Vec::with_capacity(b * (6 + heads as usize));
    host.extend(ids.iter().map(|&id| id as f64));
    host.resize(b, 0.0);
    host.extend((0..n).map(|r| slots.len(r) as f64));
    host.resize(2 * b, 0.0);
    for r in 0..b {
        // Padding rows write their spare slot, which is never attended.
        let at = if r < n { slots.len(r) } else { spare };
        host.extend((0..heads).map(|h| slots.flat_slot(r as i64, h, at) as f64));
    }
    let settings = row_settings(rows, vocab);
    for (column, padding) in PADDING_SETTINGS.iter().enumerate() {
        host.extend_from_slice(&settings[column * n..(column + 1) * n]);
        host.resize(host.len() + b - n, *padding);
    }
    host
}

/// The work a decode graph holds, reading everything that changes from `upload`.
fn step_body(
    model: &PolicyModel,
    slots: &SlotCache,
    upload: &Tensor,
    bucket: i64,
    mode: SampleMode,
) -> Tensor {
    tch::no_grad(|| {
        let device = upload.device();
        let heads = slots.kv_heads();
        let stride = slots.slots_per_row();
        let config = model.config();
        let group = (config.num_attention_heads / config.num_key_value_heads) as i64;
        let ints = upload
            .narrow(0, 0, bucket * (2 + heads))
            .to_kind(Kind::Int64);
        let ids = ints.narrow(0, 0, bucket).view([bucket, 1]);
        let positions = ints.narrow(0, bucket, bucket).view([bucket, 1]);
        let write_index = ints.narrow(0, 2 * bucket, bucket * heads);
        let settings = upload
            .narrow(0, bucket * (2 + heads), 4 * bucket)
            .view([4, bucket]);
        let sequences = bucket * heads;
        let offsets = Tensor::arange(sequences + 1, (Kind::Int, device));
        let lengths = KeyLengths {
            cu_q: &offsets * group,
            cu_k: &offsets * stride,
            used: (&positions + 1)
                .expand([bucket, heads], false)
                .reshape([sequences])
                .to_kind(Kind::Int),
            max_k: stride,
        };
        let mask = Tensor::ones([bucket, 1], (Kind::Bool, device));
        let mut chunk = slots.graph_chunk(bucket, positions.shallow_clone(), write_index, lengths);
        let hidden = model.forward(&ids, &mask, Some(&mut chunk));
        let logits = model.logits(&hidden.squeeze_dim(1));
        sample_with_settings(&logits, &settings, mode)
    })
}

/// Powers of two below `max_rows`, then `max_rows`.
fn buckets(max_rows: i64) -> Vec<i64> {
    let mut out: Vec<i64> = std::iter::successors(Some(1i64), |b| Some(b * 2))
        .take_while(|&b| b < max_rows)
        .collect();
    out.push(max_rows.max(1));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::model::SamplingParams;

    #[test]
    fn a_step_pads_its_rows_with_greedy_rows_that_write_their_spare_slot() {
        // 4 rows of 2 KV heads, 9 slots each (8 + the spare).
        let mut slots = SlotCache::new(1, 4, 8, 2, 4, Kind::Float, tch::Device::Cpu);
        slots.advance(2);
        slots.advance(1);
        let params = SamplingParams {
            temperature: 0.7,
            top_k: 5,
            ..Default::default()
        };
        let rows = [
            RowSampling {
                params: &params,
                draw: 0.25,
            },
            RowSampling {
                params: &params,
                draw: 0.5,
            },
        ];
        let host = step_inputs(&slots, 4, &[11, 12], &rows, 100);
        assert_eq!(&host[0..4], &[11.0, 12.0, 0.0, 0.0], "ids");
        assert_eq!(&host[4..8], &[2.0, 1.0, 0.0, 0.0], "positions");
        // Row r, head h writes slot (r * 2 + h) * 9 + position; padding rows slot 8.
        let writes = [2.0, 11.0, 19.0, 28.0, 44.0, 53.0, 62.0, 71.0];
        assert_eq!(&host[8..16], &writes, "write indices");
        let settings = &host[16..];
        assert_eq!(&settings[0..4], &[0.7, 0.7, 1.0, 1.0], "temperatures");
        assert_eq!(&settings[4..6], &[5.0, 5.0], "top-k");
        assert!(
            settings[6].is_infinite() && settings[7].is_infinite(),
            "padding keeps all"
        );
        assert_eq!(&settings[8..12], &[2.0, 2.0, 2.0, 2.0], "top-p off");
        assert_eq!(
            &settings[12..16],
            &[0.25, 0.5, -1.0, -1.0],
            "draws; padding greedy"
        );
    }

    #[test]
    fn buckets_double_up_to_the_engine_rows() {
        assert_eq!(buckets(1), vec![1]);
        assert_eq!(buckets(64), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(
            buckets(706),
            vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 706]
        );
    }
}
