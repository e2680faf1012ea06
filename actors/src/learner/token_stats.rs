//! Log-probabilities and entropies of chosen positions without a `[tokens x vocabulary]`
//! tensor for a whole micro-batch.
//!
//! At a real vocabulary (151,936 for Qwen) the float32 logits of one 4k-token sequence are
//! 2.5 GB, and `log_softmax` and its backward hold more of the same. Here the vocabulary
//! projection runs `chunk` positions at a time, twice: once without gradients for the values
//! the loss needs, and once per chunk with gradients, each chunk backpropagating the loss's
//! gradient with respect to its log-probabilities and entropies (obtained from the loss with
//! those values as leaves) before the next is built. The gradient reaching the hidden states
//! is returned and pushed through the trunk in one backward pass. Peak memory is one chunk's
//! logits, whatever the sequence length; the gradients are the unchunked ones up to float
//! summation order.

use tch::{Kind, Tensor};

use crate::algo;
use crate::model::PolicyModel;

/// Positions of a `[B, L]` batch picked by a mask, and their target ids.
pub(crate) struct Positions {
    /// Flat indices into `B * L`.
    index: Tensor,
    /// The target token at each position.
    targets: Tensor,
    rows: i64,
    cols: i64,
}

impl Positions {
    /// The positions where `mask` `[B, L]` is nonzero; `targets` `[B, L]` are the ids they
    /// predict.
    pub(crate) fn masked(mask: &Tensor, targets: &Tensor) -> Self {
        let (rows, cols) = mask.size2().expect("mask is [B, L]");
        let index = mask.reshape([-1]).ne(0).nonzero().squeeze_dim(1);
        let targets = targets.reshape([-1]).index_select(0, &index);
        Self {
            index,
            targets,
            rows,
            cols,
        }
    }

    /// Number of positions.
    pub(crate) fn len(&self) -> i64 {
        self.index.size()[0]
    }

    /// Rows `[N, H]` of `hidden` `[B, L, H]` at the positions (differentiable).
    pub(crate) fn gather(&self, hidden: &Tensor) -> Tensor {
        let h = hidden.size()[2];
        hidden.reshape([-1, h]).index_select(0, &self.index)
    }

    /// `[B, L]` with `values` `[N]` at the positions and 0 elsewhere (differentiable in
    /// `values`).
    pub(crate) fn scatter(&self, values: &Tensor) -> Tensor {
        Tensor::zeros([self.rows * self.cols], (values.kind(), values.device()))
            .index_add(0, &self.index, values)
            .view([self.rows, self.cols])
    }
}

/// Float32 log-probabilities `[C, V]` at the sampling temperature for hidden rows `[C, H]`.
fn log_probs(model: &PolicyModel, h: &Tensor, temperature: f64) -> Tensor {
    let mut logits = model.logits(h).to_kind(Kind::Float);
    if temperature != 1.0 {
        logits /= temperature;
    }
    logits.log_softmax(-1, Kind::Float)
}

/// The log-probability `[C]` of each row's target under `log_p` `[C, V]`.
fn of_targets(log_p: &Tensor, targets: &Tensor) -> Tensor {
    log_p
        .gather(-1, &targets.unsqueeze(-1), false)
        .squeeze_dim(-1)
}

fn spans(n: i64, chunk: i64) -> impl Iterator<Item = (i64, i64)> {
    (0..n)
        .step_by(chunk.max(1) as usize)
        .map(move |start| (start, chunk.min(n - start)))
}

/// Log-probabilities `[N]` of the positions' targets under `model`, from the hidden rows
/// `h` `[N, H]`, and with `with_entropy` the entropies `[N]` too; without gradients.
pub(crate) fn values(
    model: &PolicyModel,
    h: &Tensor,
    positions: &Positions,
    temperature: f64,
    chunk: i64,
    with_entropy: bool,
) -> (Tensor, Option<Tensor>) {
    tch::no_grad(|| {
        let empty = || Tensor::zeros([0], (Kind::Float, h.device()));
        let (mut logps, mut entropies) = (vec![empty()], vec![empty()]);
        for (start, len) in spans(positions.len(), chunk) {
            let log_p = log_probs(model, &h.narrow(0, start, len), temperature);
            logps.push(of_targets(&log_p, &positions.targets.narrow(0, start, len)));
            if with_entropy {
                entropies.push(algo::entropy_from_log_probs(&log_p));
            }
        }
        (
            Tensor::cat(&logps, 0),
            with_entropy.then(|| Tensor::cat(&entropies, 0)),
        )
    })
}

/// Backpropagates `grad_logp` (and `grad_entropy`) `[N]` through the vocabulary projection
/// chunk by chunk: the projection's weights get their gradients, and the gradient with
/// respect to the hidden rows `h` `[N, H]` is returned for the trunk.
pub(crate) fn backward(
    model: &PolicyModel,
    h: &Tensor,
    positions: &Positions,
    temperature: f64,
    chunk: i64,
    grad_logp: &Tensor,
    grad_entropy: Option<&Tensor>,
) -> Tensor {
    let mut grads = vec![h.new_zeros([0, h.size()[1]], (h.kind(), h.device()))];
    for (start, len) in spans(positions.len(), chunk) {
        let hc = h.narrow(0, start, len).detach().set_requires_grad(true);
        let log_p = log_probs(model, &hc, temperature);
        let lp = of_targets(&log_p, &positions.targets.narrow(0, start, len));
        let mut surrogate = (lp * grad_logp.narrow(0, start, len)).sum(Kind::Float);
        if let Some(ge) = grad_entropy {
            let en = algo::entropy_from_log_probs(&log_p);
            surrogate += (en * ge.narrow(0, start, len)).sum(Kind::Float);
        }
        surrogate.backward();
        grads.push(hc.grad().to_kind(h.kind()));
    }
    Tensor::cat(&grads, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelConfig, Placement};

    fn model(tied: bool) -> PolicyModel {
        tch::manual_seed(3);
        let config = ModelConfig::from_json(&serde_json::json!({
            "model_type": "qwen2", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "tie_word_embeddings": tied
        }))
        .unwrap();
        PolicyModel::new(config, Placement::default(), false).unwrap()
    }

    fn head_grad(model: &PolicyModel) -> Tensor {
        let name = if model.config().tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        model.var_store().variables()[name].grad().copy()
    }

    fn zero_grads(model: &PolicyModel) {
        for (_, mut t) in model.var_store().variables() {
            t.zero_grad();
        }
    }

    #[test]
    fn chunked_gradients_equal_the_whole_projections() {
        for tied in [true, false] {
            let model = model(tied);
            let n = 11;
            let h = Tensor::randn([n, 16], (Kind::Float, tch::Device::Cpu));
            let targets = Tensor::randint(40, [n], (Kind::Int64, tch::Device::Cpu));
            let positions = Positions {
                index: Tensor::arange(n, (Kind::Int64, tch::Device::Cpu)),
                targets: targets.shallow_clone(),
                rows: 1,
                cols: n,
            };
            let g_logp = Tensor::randn([n], (Kind::Float, tch::Device::Cpu));
            let g_ent = Tensor::randn([n], (Kind::Float, tch::Device::Cpu));

            // Whole: every position's logits at once, autograd end to end.
            zero_grads(&model);
            let leaf = h.detach().set_requires_grad(true);
            let log_p = log_probs(&model, &leaf, 0.7);
            let (lp, en) = (
                of_targets(&log_p, &targets),
                algo::entropy_from_log_probs(&log_p),
            );
            ((&lp * &g_logp).sum(Kind::Float) + (&en * &g_ent).sum(Kind::Float)).backward();
            let (whole_h, whole_w) = (leaf.grad().copy(), head_grad(&model));

            // Chunked: 3 positions at a time.
            zero_grads(&model);
            let (vlp, ven) = values(&model, &h, &positions, 0.7, 3, true);
            assert!(vlp.allclose(&lp.detach(), 1e-6, 1e-6, false));
            assert!(ven.unwrap().allclose(&en.detach(), 1e-6, 1e-6, false));
            let chunked_h = backward(&model, &h, &positions, 0.7, 3, &g_logp, Some(&g_ent));
            let chunked_w = head_grad(&model);
            let diff = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
            assert!(
                diff(&whole_h, &chunked_h) < 1e-5,
                "tied {tied}: hidden grads"
            );
            assert!(
                diff(&whole_w, &chunked_w) < 1e-5,
                "tied {tied}: projection grads"
            );
        }
    }

    #[test]
    fn positions_gather_and_scatter_the_masked_entries() {
        let mask = Tensor::from_slice(&[0f32, 1., 1., 0., 0., 1.]).view([2, 3]);
        let targets = Tensor::from_slice(&[5i64, 6, 7, 8, 9, 10]).view([2, 3]);
        let p = Positions::masked(&mask, &targets);
        assert_eq!(p.len(), 3);
        assert_eq!(Vec::<i64>::try_from(&p.targets).unwrap(), vec![6, 7, 10]);
        let back = p.scatter(&Tensor::from_slice(&[1f32, 2., 3.]));
        assert_eq!(
            Vec::<f32>::try_from(back.reshape([-1])).unwrap(),
            vec![0., 1., 2., 0., 0., 3.]
        );
    }
}
