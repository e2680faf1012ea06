//! Slot storage for continuous batching.
//!
//! Every running sequence owns one row of a preallocated [rows, capacity + 1, kv_heads, dim]
//! tensor per layer. Running rows are kept packed at the front (a leaving row is replaced by
//! the last one), so a forward pass over the running batch is a `narrow`, not a gather. Each
//! row has its own length: a chunk writes row b's new tokens at slots `len_b ..`, and padding
//! tokens of a chunk are written to the row's spare slot `capacity`, which is never attended.

use tch::{Device, Kind, Tensor};

use crate::model::KvStore;

/// Keys and values of one sequence, moved out of the batch while it waits for tools.
#[derive(Debug)]
pub(crate) struct ParkedKv {
    pub(crate) keys: Vec<Tensor>,
    pub(crate) values: Vec<Tensor>,
    pub(crate) len: i64,
}

impl ParkedKv {
    /// Another handle on the same (never mutated) tensors.
    pub(crate) fn share(&self) -> ParkedKv {
        ParkedKv {
            keys: self.keys.iter().map(Tensor::shallow_clone).collect(),
            values: self.values.iter().map(Tensor::shallow_clone).collect(),
            len: self.len,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(|t| t.numel() * t.kind().elt_size_in_bytes())
            .sum()
    }
}

#[derive(Debug)]
pub(crate) struct SlotCache {
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
        let shape = [rows, capacity + 1, kv_heads, head_dim];
        Self {
            keys: (0..layers)
                .map(|_| Tensor::zeros(shape, (kind, device)))
                .collect(),
            values: (0..layers)
                .map(|_| Tensor::zeros(shape, (kind, device)))
                .collect(),
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
        self.keys
            .iter()
            .chain(&self.values)
            .map(|t| t.numel() * t.kind().elt_size_in_bytes())
            .sum()
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
            for t in self.keys.iter().chain(&self.values) {
                let from = t.narrow(0, src as i64, 1).narrow(1, 0, len);
                t.narrow(0, dst as i64, 1).narrow(1, 0, len).copy_(&from);
            }
        }
        self.lens[dst] = len;
        self.lens[src] = 0;
    }

    /// Copies row `row`'s keys/values out into compact tensors of its real length.
    pub(crate) fn park(&self, row: usize) -> ParkedKv {
        let len = self.lens[row];
        let take = |t: &Tensor| t.select(0, row as i64).narrow(0, 0, len).copy();
        ParkedKv {
            keys: self.keys.iter().map(take).collect(),
            values: self.values.iter().map(take).collect(),
            len,
        }
    }

    /// Writes the first `len` tokens of `parked` into row `row`.
    pub(crate) fn restore(&mut self, row: usize, parked: &ParkedKv, len: i64) {
        let len = len.min(parked.len);
        if len > 0 {
            for (dst, src) in self.keys.iter().zip(&parked.keys) {
                dst.select(0, row as i64)
                    .narrow(0, 0, len)
                    .copy_(&src.narrow(0, 0, len));
            }
            for (dst, src) in self.values.iter().zip(&parked.values) {
                dst.select(0, row as i64)
                    .narrow(0, 0, len)
                    .copy_(&src.narrow(0, 0, len));
            }
        }
        self.lens[row] = len;
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
        let stride = c.capacity + 1;
        let mut positions = Vec::with_capacity(rows * t as usize);
        let mut write = Vec::with_capacity(rows * t as usize);
        let mut attend = 1;
        for (b, &count) in self.counts.iter().enumerate() {
            let row = (self.first + b) as i64;
            let len = c.lens[self.first + b];
            attend = attend.max(len + count);
            for j in 0..t {
                if j < count {
                    positions.push(len + j);
                    write.push(row * stride + len + j);
                } else {
                    positions.push(0);
                    write.push(row * stride + c.capacity);
                }
            }
        }
        self.attend = attend;
        self.write_index = Some(Tensor::from_slice(&write).to_device(device));
        let positions = Tensor::from_slice(&positions)
            .view([rows as i64, t])
            .to_device(device);
        let lens: Vec<i64> = (0..rows).map(|b| c.lens[self.first + b]).collect();
        let lens = Tensor::from_slice(&lens)
            .view([rows as i64, 1, 1])
            .to_device(device);
        let counts = Tensor::from_slice(&self.counts)
            .view([rows as i64, 1, 1])
            .to_device(device);
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
        let c = &mut *self.cache;
        let rows = self.counts.len() as i64;
        let t = k.size()[2];
        let index = self
            .write_index
            .as_ref()
            .expect("begin_chunk before append");
        let total = c.keys[layer].size()[0] * (c.capacity + 1);
        let flat_shape = [total, c.kv_heads, c.head_dim];
        let new_shape = [rows * t, c.kv_heads, c.head_dim];
        let _ = c.keys[layer].view(flat_shape).index_copy_(
            0,
            index,
            &k.transpose(1, 2).reshape(new_shape),
        );
        let _ = c.values[layer].view(flat_shape).index_copy_(
            0,
            index,
            &v.transpose(1, 2).reshape(new_shape),
        );
        let view = |x: &Tensor| {
            x.narrow(0, self.first as i64, rows)
                .narrow(1, 0, self.attend)
                .transpose(1, 2)
        };
        (view(&c.keys[layer]), view(&c.values[layer]))
    }

    fn end_chunk(&mut self, _t: i64) {
        for (b, &count) in self.counts.iter().enumerate() {
            self.cache.lens[self.first + b] += count;
        }
    }
}
