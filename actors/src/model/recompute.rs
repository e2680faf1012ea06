//! Activation recomputation per decoder layer, for the learner.
//!
//! A plain training forward keeps every layer's intermediate tensors until the backward
//! pass: at a real shape that is most of the learner's memory (the attention and MLP
//! activations of every layer, for every token of the micro-batch). Here the forward runs
//! without gradients and keeps only each layer's input `[B, T, H]`; the final norm runs with
//! gradients from a leaf standing for the last layer's output, so the loss backpropagates as
//! usual down to that leaf. [`LayerCheckpoints::backward`] then walks the layers from the top:
//! it recomputes one layer's forward from its saved input, backpropagates the gradient that
//! reached its output (the parameters accumulate theirs), and hands the gradient at its
//! input to the layer below; last, the embedding. At any moment one layer's activations
//! exist. The cost is one more forward pass; the gradients are the plain ones (the layers
//! are deterministic, so the recomputed forward is the same computation).

use tch::nn::Module;
use tch::{Kind, Tensor};

use super::layers::AttnMask;
use super::PolicyModel;

/// What [`PolicyModel::forward_checkpointed`] keeps for the backward pass.
#[derive(Debug)]
pub struct LayerCheckpoints {
    ids: Tensor,
    cos: Tensor,
    sin: Tensor,
    /// The input of each layer (the embeddings first), without gradients.
    inputs: Vec<Tensor>,
    /// The leaf standing for the last layer's output; the loss's gradient collects here.
    top: Tensor,
}

impl PolicyModel {
    /// [`PolicyModel::forward_right_padded`] keeping only each decoder layer's input for
    /// the backward pass: the returned hidden states `[B, T, H]` carry gradients as far
    /// as the final norm; after the loss's backward pass,
    /// [`LayerCheckpoints::backward`] carries them through the layers.
    pub fn forward_checkpointed(
        &self,
        ids: &Tensor,
        input_mask: &Tensor,
    ) -> (Tensor, LayerCheckpoints) {
        let (x, mut inputs, cos, sin) = tch::no_grad(|| {
            let (cos, sin) = self.right_padded_rotary(input_mask);
            let mut inputs = Vec::with_capacity(self.layers.len() + 1);
            inputs.push(self.embed_tokens.forward(ids).to_kind(self.residual));
            for (i, layer) in self.layers.iter().enumerate() {
                let x = inputs.last().expect("the embeddings are there");
                self.gate(|g| g.before_forward(i));
                let y = layer.forward(x, &cos, &sin, AttnMask::Causal, None);
                self.gate(|g| g.after_forward(i));
                inputs.push(y);
            }
            let x = inputs.pop().expect("at least the embeddings");
            (x, inputs, cos, sin)
        });
        inputs.shrink_to_fit();
        let top = x.set_requires_grad(true);
        let hidden = self.norm.forward_to(&top, self.placement.kind);
        let checkpoints = LayerCheckpoints {
            ids: ids.shallow_clone(),
            cos,
            sin,
            inputs,
            top,
        };
        (hidden, checkpoints)
    }
}

impl PolicyModel {
    /// The layer gate's calls of a checkpointed forward pass, computing nothing: a learner
    /// rank with no rows in a micro-batch the others train on joins their collectives.
    pub fn idle_forward(&self) {
        for i in 0..self.layers.len() {
            self.gate(|g| g.before_forward(i));
            self.gate(|g| g.after_forward(i));
        }
    }

    /// The layer gate's calls of [`LayerCheckpoints::backward`], computing nothing (no
    /// gradient of this rank reaches a layer).
    pub fn idle_backward(&self) {
        for i in (0..self.layers.len()).rev() {
            self.gate(|g| g.before_backward(i));
            self.gate(|g| g.after_backward(i));
        }
    }
}

impl LayerCheckpoints {
    /// Backpropagates the gradient the loss left on the last layer's output through every
    /// layer (recomputing each from its saved input) and the embedding, accumulating into
    /// the model's parameter gradients. Call it once, after the loss's backward pass; it
    /// does nothing if no gradient reached the hidden states (a model with a layer gate
    /// still walks its layers through the gate, computing nothing: see
    /// [`PolicyModel::idle_backward`]).
    pub fn backward(mut self, model: &PolicyModel) {
        let mut grad = self.top.grad();
        if !grad.defined() {
            model.idle_backward();
            return;
        }
        for (i, layer) in model.layers.iter().enumerate().rev() {
            let input = self.inputs.pop().expect("one input per layer");
            let x = input.set_requires_grad(true);
            model.gate(|g| g.before_backward(i));
            let y = layer.forward(&x, &self.cos, &self.sin, AttnMask::Causal, None);
            // d(sum(y * g))/dy = g exactly, whatever the rounding of the product itself.
            (y * &grad).sum(Kind::Float).backward();
            model.gate(|g| g.after_backward(i));
            grad = x.grad();
        }
        if model.embed_tokens.ws.requires_grad() {
            let embeddings = model
                .embed_tokens
                .forward(&self.ids)
                .to_kind(model.residual);
            (embeddings * grad).sum(Kind::Float).backward();
        }
    }
}
