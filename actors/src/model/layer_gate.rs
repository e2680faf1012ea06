//! Where a training pass lets someone else hold a decoder layer's weights between uses.
//!
//! A learner rank that shards parameters (`learner.shard = "parameters"`) keeps only its own
//! parameters between uses; the training passes ([`PolicyModel::forward_right_padded`],
//! [`PolicyModel::forward_checkpointed`] and [`LayerCheckpoints::backward`]) call the gate
//! around each layer, so the layer's weights are gathered just before it runs and released
//! right after, and its gradients are reduced to their owners as soon as its backward pass
//! is done. Without a gate (every other use) the calls cost nothing.
//!
//! [`PolicyModel::forward_right_padded`]: super::PolicyModel::forward_right_padded
//! [`PolicyModel::forward_checkpointed`]: super::PolicyModel::forward_checkpointed
//! [`LayerCheckpoints::backward`]: super::LayerCheckpoints::backward

/// Called around each decoder layer of a training pass. A failure inside (a collective)
/// is kept by the gate and reported by its owner after the pass; the gate leaves the layer's
/// weights with their shapes so the pass runs to its end.
pub trait LayerGate: Send + Sync + std::fmt::Debug {
    /// Layer `layer` is about to run forward: its weights must be whole.
    fn before_forward(&self, layer: usize);
    /// Layer `layer` ran forward (without gradients, or its backward pass will recompute it).
    fn after_forward(&self, layer: usize);
    /// Layer `layer` is about to be recomputed for its backward pass.
    fn before_backward(&self, layer: usize);
    /// Layer `layer`'s backward pass is done (or, when no gradient reached it, did not run):
    /// its parameters' gradients of this pass are final.
    fn after_backward(&self, layer: usize);
}
