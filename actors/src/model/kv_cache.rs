//! Key/value storage for incremental decoding.
//!
//! [`KvStore`] is what attention talks to; [`KvCache`] is the batch cache of plain
//! generation. Its rows advance in lockstep (one slot per step for every row), so a row that
//! is padding at a slot marks it invalid instead of shifting: attention masks invalid slots,
//! and rotary positions count only a row's valid tokens. Storage is preallocated and grows by
//! doubling, so a decode step writes in place instead of concatenating the whole history.

use tch::{Device, Kind, Tensor};

/// Where attention keys and values of earlier tokens live during a forward pass.
///
/// The model calls `begin_chunk` once, `append` once per layer, then `end_chunk`. The
/// inference engine implements it over its slot storage, so continuous batching runs the
/// same attention code as plain generation.
pub trait KvStore {
    /// Reserves slots for a chunk whose real tokens are `input_mask` [B, T]; returns rotary
    /// positions [B, T] and the boolean attention mask [B, 1, T, S] over what `append` returns.
    fn begin_chunk(&mut self, input_mask: &Tensor) -> (Tensor, Tensor);
    /// Stores layer `layer`'s new keys/values [B, kvh, T, D] and returns all keys/values the
    /// chunk attends to [B, kvh, S, D].
    fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> (Tensor, Tensor);
    /// Commits the chunk after every layer appended.
    fn end_chunk(&mut self, t: i64);
    /// Keys given by lengths instead of the mask `begin_chunk` returns: attention then runs
    /// over packed sequences without a mask tensor (one query token per row, on a GPU).
    fn key_lengths(&self) -> Option<KeyLengths> {
        None
    }
}

/// Which keys each row's single query sees, given as lengths: the `group` query heads that
/// share KV head `j` of row `r` are sequence `r * kv_heads + j`, whose keys are slots
/// `cu_k[i]..cu_k[i] + used[i]` of the flattened `[rows * kv_heads * slots, dim]` store.
#[derive(Debug)]
pub struct KeyLengths {
    /// Query offsets [n + 1] int32 (`i * group`).
    pub cu_q: Tensor,
    /// Key offsets [n + 1] int32 (`i * slots`).
    pub cu_k: Tensor,
    /// Keys used per sequence [n] int32.
    pub used: Tensor,
    /// Slots per sequence (the longest it may use).
    pub max_k: i64,
}

impl KeyLengths {
    /// Another handle on the same tensors.
    pub fn shallow_clone(&self) -> Self {
        Self {
            cu_q: self.cu_q.shallow_clone(),
            cu_k: self.cu_k.shallow_clone(),
            used: self.used.shallow_clone(),
            max_k: self.max_k,
        }
    }
}

/// Per-layer keys and values of a batch, plus which slots hold real tokens.
#[derive(Debug)]
pub struct KvCache {
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    valid: Tensor,
    next_position: Tensor,
    len: i64,
    capacity: i64,
}

impl KvCache {
    /// An empty cache for `batch` rows.
    pub fn new(
        layers: usize,
        batch: i64,
        kv_heads: i64,
        head_dim: i64,
        capacity: i64,
        kind: Kind,
        device: Device,
    ) -> Self {
        let capacity = capacity.max(1);
        let shape = [batch, kv_heads, capacity, head_dim];
        Self {
            keys: (0..layers)
                .map(|_| Tensor::zeros(shape, (kind, device)))
                .collect(),
            values: (0..layers)
                .map(|_| Tensor::zeros(shape, (kind, device)))
                .collect(),
            valid: Tensor::zeros([batch, capacity], (Kind::Bool, device)),
            next_position: Tensor::zeros([batch], (Kind::Int64, device)),
            len: 0,
            capacity,
        }
    }

    /// Slots used so far (valid or not).
    pub fn len(&self) -> i64 {
        self.len
    }

    /// Whether no slot is used.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows in the batch.
    pub fn batch(&self) -> i64 {
        self.valid.size()[0]
    }

    /// Real tokens held, summed over rows.
    pub fn tokens_held(&self) -> i64 {
        self.valid
            .narrow(1, 0, self.len)
            .sum(Kind::Int64)
            .int64_value(&[])
    }

    /// Bytes of key/value storage allocated.
    pub fn bytes_allocated(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(|t| t.numel() * t.kind().elt_size_in_bytes())
            .sum()
    }

    fn ensure_capacity(&mut self, needed: i64) {
        if needed <= self.capacity {
            return;
        }
        let new_cap = needed.max(self.capacity * 2);
        let grow = |t: &Tensor, dim: i64| {
            let mut shape = t.size();
            shape[dim as usize] = new_cap;
            let bigger = Tensor::zeros(&shape, (t.kind(), t.device()));
            bigger.narrow(dim, 0, self.capacity).copy_(t);
            bigger
        };
        self.keys = self.keys.iter().map(|t| grow(t, 2)).collect();
        self.values = self.values.iter().map(|t| grow(t, 2)).collect();
        self.valid = grow(&self.valid, 1);
        self.capacity = new_cap;
    }
}

impl KvStore for KvCache {
    fn begin_chunk(&mut self, input_mask: &Tensor) -> (Tensor, Tensor) {
        let t = input_mask.size()[1];
        self.ensure_capacity(self.len + t);
        self.valid.narrow(1, self.len, t).copy_(input_mask);
        let counts = input_mask.to_kind(Kind::Int64).cumsum(1, Kind::Int64);
        let positions = (self.next_position.unsqueeze(1) + counts - 1).clamp_min(0);
        self.next_position +=
            input_mask
                .to_kind(Kind::Int64)
                .sum_dim_intlist(1, false, Kind::Int64);
        let mask = chunk_mask(&self.valid.narrow(1, 0, self.len + t), self.len, t);
        (positions, mask)
    }

    fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let t = k.size()[2];
        self.keys[layer].narrow(2, self.len, t).copy_(k);
        self.values[layer].narrow(2, self.len, t).copy_(v);
        (
            self.keys[layer].narrow(2, 0, self.len + t),
            self.values[layer].narrow(2, 0, self.len + t),
        )
    }

    fn end_chunk(&mut self, t: i64) {
        self.len += t;
    }
}

/// Attention mask for `t` new tokens at slots `start..start + t` over `valid` [B, S]:
/// a token sees valid slots up to its own, and always itself, so that a padding row is never
/// fully masked (which would make softmax produce NaN and poison the cache).
pub(crate) fn chunk_mask(valid: &Tensor, start: i64, t: i64) -> Tensor {
    let device = valid.device();
    let s = valid.size()[1];
    let slots = Tensor::arange(s, (Kind::Int64, device)).unsqueeze(0);
    let query_slots = Tensor::arange_start(start, start + t, (Kind::Int64, device)).unsqueeze(1);
    let causal = slots.le_tensor(&query_slots); // [T, S]
    let own = slots.eq_tensor(&query_slots);
    let mask = valid.unsqueeze(1).logical_and(&causal.unsqueeze(0)); // [B, T, S]
    mask.logical_or(&own.unsqueeze(0)).unsqueeze(1)
}
