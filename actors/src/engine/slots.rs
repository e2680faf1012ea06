//! Slot storage for continuous batching.
//!
//! Every running sequence owns one row of a preallocated
//! [layers, 2 (keys, values), rows, kv_heads, capacity + 1, dim] tensor. Running rows are kept
//! packed at the front (a leaving row is replaced by the last one), so a forward pass over the
//! running batch is a `narrow`, not a gather. Each row has its own length: a chunk writes row
//! b's new tokens at slots `len_b ..`, and padding tokens of a chunk are written to the row's
//! spare slot `capacity`, which is never attended. Keeping every layer's keys and values in
//! one tensor makes parking, restoring and moving a row one copy each instead of one per
//! layer and kind: those copies run between forward passes, on the engine's critical path.
//!
//! Slots come after heads so that attention reads each head's keys and values as one
//! contiguous `[len, dim]` block: with slots before heads every key is `kv_heads * dim`
//! elements from the next, and the fused attention kernel ran about 4x slower over such
//! strided views.

use tch::{Device, Kind, Tensor};

#[cfg(doc)]
use super::kv_pool::KvPool;
use super::kv_pool::Lease;
use crate::model::{KeyLengths, KvStore};

/// Keys and values of one sequence, moved out of the batch while it waits for tools.
///
/// The tensor ([layers, 2, kv_heads, capacity, dim]) may hold more slots than `len`: the
/// episode's next turn grows its context by a tool observation and a reply, and parking
/// that turn then copies only the new tokens into the spare slots instead of allocating
/// and filling a new tensor (see [`SlotCache::park_into`]).
#[derive(Debug)]
pub(crate) struct ParkedKv {
    kv: Tensor,
    pub(crate) len: i64,
    /// The pool range `kv` lives in, if it is in the pool (freed with this).
    _lease: Option<Lease>,
}

impl ParkedKv {
    /// Empty parked KV in a pool range (see [`KvPool::lease`]).
    pub(crate) fn pooled(kv: Tensor, lease: Lease) -> Self {
        Self {
            kv,
            len: 0,
            _lease: Some(lease),
        }
    }

    /// Another handle on the same tensor. Only for KV that is never parked into again (the
    /// shared prompt prefix): writes through one handle would show through the other.
    pub(crate) fn share(&self) -> ParkedKv {
        debug_assert!(self._lease.is_none(), "pooled KV is parked into again");
        ParkedKv {
            kv: self.kv.shallow_clone(),
            len: self.len,
            _lease: None,
        }
    }

    /// Bytes held, spare slots included.
    pub(crate) fn bytes(&self) -> usize {
        self.kv.numel() * self.kv.kind().elt_size_in_bytes()
    }

    /// Slots held, spare ones included.
    pub(crate) fn capacity(&self) -> i64 {
        self.kv.size()[SLOT_DIM as usize]
    }
}

/// The slot dimension of a row's (or a parked tensor's) [layers, 2, kv_heads, slots, dim].
const SLOT_DIM: i64 = 3;

#[derive(Debug)]
pub(crate) struct SlotCache {
    /// [layers, 2, rows, kv_heads, capacity + 1, dim].
    all: Tensor,
    /// Per layer, views of `all`'s keys and values ([rows, kv_heads, capacity + 1, dim]).
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    lens: Vec<i64>,
    capacity: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl SlotCache {
    pub(crate) fn new(
        layers: usize,
        rows: i64,
        capacity: i64,
        kv_heads: i64,
        head_dim: i64,
        kind: Kind,
        device: Device,
    ) -> Self {
        let all = Tensor::zeros(
            [layers as i64, 2, rows, kv_heads, capacity + 1, head_dim],
            (kind, device),
        );
        let part = |l: usize, which: i64| all.select(0, l as i64).select(0, which);
        Self {
            keys: (0..layers).map(|l| part(l, 0)).collect(),
            values: (0..layers).map(|l| part(l, 1)).collect(),
            all,
            lens: vec![0; rows as usize],
            capacity,
            kv_heads,
            head_dim,
        }
    }

    pub(crate) fn capacity(&self) -> i64 {
        self.capacity
    }

    pub(crate) fn len(&self, row: usize) -> i64 {
        self.lens[row]
    }

    pub(crate) fn bytes_allocated(&self) -> usize {
        self.all.numel() * self.all.kind().elt_size_in_bytes()
    }

    /// Row `row`'s first `len` slots of every layer: [layers, 2, kv_heads, len, dim].
    fn row(&self, row: usize, len: i64) -> Tensor {
        self.all.select(2, row as i64).narrow(SLOT_DIM, 0, len)
    }

    /// Forgets row `row`'s tokens past `len` (they are overwritten by later chunks).
    pub(crate) fn truncate(&mut self, row: usize, len: i64) {
        self.lens[row] = self.lens[row].min(len);
    }

    /// Copies row `src` over row `dst` (packing the running rows after one leaves).
    pub(crate) fn move_row(&mut self, src: usize, dst: usize) {
        if src == dst {
            return;
        }
        let len = self.lens[src];
        if len > 0 {
            self.row(dst, len).copy_(&self.row(src, len));
        }
        self.lens[dst] = len;
        self.lens[src] = 0;
    }

    /// Copies row `row`'s first `len` tokens' keys/values out into a new heap tensor.
    pub(crate) fn park(&self, row: usize, len: i64) -> ParkedKv {
        let len = len.clamp(0, self.lens[row]);
        let from = self.row(row, len);
        // `empty`, not `copy()`: tch's copy zero-fills first, a second pass over the bytes.
        let mut kv = Tensor::empty(from.size(), (from.kind(), from.device()));
        kv.copy_(&from);
        ParkedKv {
            kv,
            len,
            _lease: None,
        }
    }

    /// Parks row `row` into `parked`, copying only slots `from..`: the first `from` slots
    /// of both hold the same tokens (`parked` is what the row was restored from, or empty).
    /// Gives `parked` back when the row does not fit in it.
    pub(crate) fn park_into(
        &self,
        row: usize,
        mut parked: ParkedKv,
        from: i64,
    ) -> std::result::Result<ParkedKv, ParkedKv> {
        let len = self.lens[row];
        let from = from.min(parked.len).min(len);
        if len > parked.capacity() {
            return Err(parked);
        }
        if len > from {
            parked.kv.narrow(SLOT_DIM, from, len - from).copy_(
                &self
                    .all
                    .select(2, row as i64)
                    .narrow(SLOT_DIM, from, len - from),
            );
        }
        parked.len = len;
        Ok(parked)
    }

    /// Writes the first `len` tokens of `parked` into row `row`.
    pub(crate) fn restore(&mut self, row: usize, parked: &ParkedKv, len: i64) {
        let len = len.min(parked.len);
        if len > 0 {
            self.row(row, len)
                .copy_(&parked.kv.narrow(SLOT_DIM, 0, len));
        }
        self.lens[row] = len;
    }

    /// Rows `0..rows` each took one token outside a [`SlotChunk`] (a replayed decode graph,
    /// whose [`GraphChunk`] wrote their keys and values on the device).
    pub(crate) fn advance(&mut self, rows: usize) {
        for len in &mut self.lens[..rows] {
            *len += 1;
        }
    }

    /// Keys and values of `positions` [rows, 1] written at `write_index` [rows * kv_heads]
    /// (both on the device, computed by the graph from what the host uploaded), attended by
    /// [`KeyLengths`] over rows `0..rows` of the whole store: a decode step whose shapes do
    /// not change from step to step.
    pub(crate) fn graph_chunk(
        &self,
        rows: i64,
        positions: Tensor,
        write_index: Tensor,
        lengths: KeyLengths,
    ) -> GraphChunk<'_> {
        GraphChunk {
            cache: self,
            rows,
            positions,
            write_index,
            lengths,
        }
    }

    /// Index of `slot` of row `row`'s KV head `head` in a layer's keys (or values) viewed as
    /// `[rows * kv_heads * (capacity + 1), dim]`: where [`SlotCache::write`] puts a token.
    pub(crate) fn flat_slot(&self, row: i64, head: i64, slot: i64) -> i64 {
        (row * self.kv_heads + head) * (self.capacity + 1) + slot
    }

    /// Writes layer `layer`'s new keys and values `[rows, kv_heads, t, dim]` at `index`
    /// (`rows * kv_heads * t` [`SlotCache::flat_slot`]s, in (row, head, token) order).
    fn write(&self, layer: usize, index: &Tensor, k: &Tensor, v: &Tensor) {
        let total = self.keys[layer].size()[0] * self.kv_heads * (self.capacity + 1);
        let flat = [total, self.head_dim];
        let new = [-1, self.head_dim];
        let _ = self.keys[layer]
            .view(flat)
            .index_copy_(0, index, &k.reshape(new));
        let _ = self.values[layer]
            .view(flat)
            .index_copy_(0, index, &v.reshape(new));
    }

    /// Slots per row in the store (the spare slot included): the stride of a row's keys.
    pub(crate) fn slots_per_row(&self) -> i64 {
        self.capacity + 1
    }

    /// KV heads per row.
    pub(crate) fn kv_heads(&self) -> i64 {
        self.kv_heads
    }

    /// A chunk over rows `first..first + counts.len()`, row b adding `counts[b]` tokens.
    pub(crate) fn chunk(&mut self, first: usize, counts: Vec<i64>) -> SlotChunk<'_> {
        SlotChunk {
            cache: self,
            first,
            counts,
            write_index: None,
            attend: 0,
        }
    }
}

/// One forward pass's view of the slot storage.
pub(crate) struct SlotChunk<'a> {
    cache: &'a mut SlotCache,
    first: usize,
    counts: Vec<i64>,
    write_index: Option<Tensor>,
    attend: i64,
}

impl KvStore for SlotChunk<'_> {
    fn begin_chunk(&mut self, input_mask: &Tensor) -> (Tensor, Tensor) {
        let device = input_mask.device();
        let t = input_mask.size()[1];
        let rows = self.counts.len();
        let c = &*self.cache;
        let heads = c.kv_heads;
        let width = t as usize;
        // Everything the chunk needs from the host goes to the device in one copy:
        // positions [rows * t], lens [rows], counts [rows], write index [rows * heads * t].
        let mut host = Vec::with_capacity(rows * width * (1 + heads as usize) + 2 * rows);
        let mut attend = 1;
        for (b, &count) in self.counts.iter().enumerate() {
            let len = c.lens[self.first + b];
            attend = attend.max(len + count);
            host.extend((0..t).map(|j| if j < count { len + j } else { 0 }));
        }
        host.extend((0..rows).map(|b| c.lens[self.first + b]));
        host.extend_from_slice(&self.counts);
        for (b, &count) in self.counts.iter().enumerate() {
            let row = (self.first + b) as i64;
            let len = c.lens[self.first + b];
            for h in 0..heads {
                host.extend((0..t).map(|j| {
                    // Padding tokens go to the row's spare slot, which is never attended.
                    c.flat_slot(row, h, if j < count { len + j } else { c.capacity })
                }));
            }
        }
        self.attend = attend;
        let uploaded = Tensor::from_slice(&host).to_device(device);
        let (n, r) = (rows as i64 * t, rows as i64);
        let positions = uploaded.narrow(0, 0, n).view([r, t]);
        let lens = uploaded.narrow(0, n, r).view([r, 1, 1]);
        let counts = uploaded.narrow(0, n + r, r).view([r, 1, 1]);
        self.write_index = Some(uploaded.narrow(0, n + 2 * r, r * heads * t));
        let q = Tensor::arange(t, (Kind::Int64, device)).view([1, t, 1]);
        let s = Tensor::arange(attend, (Kind::Int64, device)).view([1, 1, attend]);
        // A real token sees its row's tokens up to itself; a padding token sees slot 0 only,
        // so no query row is fully masked (softmax over nothing is NaN).
        let real = q.lt_tensor(&counts);
        let causal = s
            .le_tensor(&(&lens + &q))
            .logical_and(&s.lt_tensor(&(&lens + &counts)));
        let mask = real
            .logical_and(&causal)
            .logical_or(&real.logical_not().logical_and(&s.eq(0)));
        (positions, mask.unsqueeze(1))
    }

    fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let c = &*self.cache;
        let rows = self.counts.len() as i64;
        let index = self
            .write_index
            .as_ref()
            .expect("begin_chunk before append");
        c.write(layer, index, k, v);
        let view = |x: &Tensor| {
            x.narrow(0, self.first as i64, rows)
                .narrow(2, 0, self.attend)
        };
        (view(&c.keys[layer]), view(&c.values[layer]))
    }

    fn end_chunk(&mut self, _t: i64) {
        for (b, &count) in self.counts.iter().enumerate() {
            self.cache.lens[self.first + b] += count;
        }
    }
}

/// One decode step's view of the slot storage inside a CUDA graph: nothing from the host,
/// the same shapes every step (see [`SlotCache::graph_chunk`]).
pub(crate) struct GraphChunk<'a> {
    cache: &'a SlotCache,
    rows: i64,
    positions: Tensor,
    write_index: Tensor,
    lengths: KeyLengths,
}

impl KvStore for GraphChunk<'_> {
    fn begin_chunk(&mut self, input_mask: &Tensor) -> (Tensor, Tensor) {
        // The mask is not used: `key_lengths` says which keys each row sees.
        (self.positions.shallow_clone(), input_mask.shallow_clone())
    }

    fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let c = self.cache;
        c.write(layer, &self.write_index, k, v);
        (
            c.keys[layer].narrow(0, 0, self.rows),
            c.values[layer].narrow(0, 0, self.rows),
        )
    }

    fn end_chunk(&mut self, _t: i64) {}

    fn key_lengths(&self) -> Option<KeyLengths> {
        Some(self.lengths.shallow_clone())
    }
}
