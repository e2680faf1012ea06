//! The separate critic's input when it reads a prefix: each batch row with its task's
//! prefix in front, and where each row's own positions lie in it.

use tch::{Kind, Tensor};

/// The separate critic's rows: each batch row with its task's prefix in front.
#[derive(Debug)]
pub(crate) struct CriticInput {
    /// `[B, P + T]` Int64 ids: prefix, then the row's tokens, right-padded with 0.
    pub(crate) ids: Tensor,
    /// `[B, P + T]` Bool: real tokens.
    pub(crate) input_mask: Tensor,
    /// `[B]` Int64: each row's prefix length, where its own tokens begin.
    pub(crate) offsets: Tensor,
    /// Per row: prefix plus row tokens.
    pub(crate) lengths: Vec<usize>,
}

impl CriticInput {
    /// Rows `index`, cut to the longest of them.
    pub(crate) fn select(&self, index: &[i64]) -> CriticInput {
        let idx = Tensor::from_slice(index).to_device(self.ids.device());
        let lengths: Vec<usize> = index.iter().map(|&i| self.lengths[i as usize]).collect();
        let t = lengths.iter().copied().max().unwrap_or(1).max(1) as i64;
        let cut = |x: &Tensor| x.index_select(0, &idx).narrow(1, 0, t);
        CriticInput {
            ids: cut(&self.ids),
            input_mask: cut(&self.input_mask),
            offsets: self.offsets.index_select(0, &idx),
            lengths,
        }
    }

    /// From `[b, P + T, H]` hidden states of these rows, the `[b, cols, H]` states at each
    /// row's own positions `0..cols` (position `j` of a row is `offset + j` here).
    pub(crate) fn own_positions(&self, hidden: &Tensor, cols: i64) -> Tensor {
        let (b, t, h) = hidden.size3().expect("[b, t, h] hidden states");
        let device = hidden.device();
        let index = (self.offsets.to_device(device).unsqueeze(1)
            + Tensor::arange(cols, (Kind::Int64, device)).unsqueeze(0))
        .clamp_max(t - 1);
        hidden.gather(1, &index.unsqueeze(2).expand([b, cols, h], false), false)
    }
}
