//! Sharded parameters (`learner.shard = "parameters"`, FSDP style) as a model's
//! [`LayerGate`]: each decoder-layer parameter has one owning rank (the rank that holds its
//! optimizer state and steps it); the other ranks hold it only while its layer runs.
//!
//! - Before a layer runs (forward, or recomputed for its backward pass), each of its
//!   parameters is broadcast from its owner into a buffer on the ranks that released it;
//!   after, those ranks release it again.
//! - After a layer's backward pass, its gradients of this micro-batch are summed across the
//!   ranks in one float32 buffer; the owner adds the sum to what it accumulated, every
//!   other rank drops its gradient. A rank with no gradient (no rows in this micro-batch)
//!   contributes zeros, so the ranks run the same collectives in the same order.
//! - Rank 0 keeps every parameter whole: it publishes the weights and writes checkpoints.
//!   After each optimizer step the owners send rank 0 their new values
//!   ([`LayerShards::send_to_leader`]).
//!
//! The embeddings, final norm, heads and value head stay on every rank (their gradients are
//! summed at the end of the mini-batch, as in the other modes).
//!
//! The gate is active only inside an update ([`LayerShards::activate`]): outside, rank 0's
//! whole weights are used as they are, with no collective.

use std::sync::{Arc, Mutex, MutexGuard};

use tch::{Device, Kind, Tensor};

use crate::model::LayerGate;
use crate::process_group::{set_grad, ProcessGroup, ReduceOp};
use crate::{Error, Result};

/// One decoder-layer parameter as the gate sees it.
#[derive(Debug)]
struct Shard {
    /// The parameter (a shallow handle: its data is swapped in place).
    param: Tensor,
    /// Its index in the optimizer (the name errors use).
    index: usize,
    owner: usize,
    shape: Vec<i64>,
    kind: Kind,
    /// Whether this rank holds its data now.
    whole: bool,
    /// The owner's gradient accumulated over earlier micro-batches, set aside while the
    /// layer's backward pass computes this micro-batch's.
    stash: Option<Tensor>,
}

#[derive(Debug)]
struct Inner {
    group: Arc<ProcessGroup>,
    /// "policy" or "critic", for errors.
    what: &'static str,
    /// Parameters by decoder layer.
    layers: Vec<Vec<Shard>>,
    active: bool,
    /// A backward pass reduced gradients since [`LayerShards::take_walked`].
    walked: bool,
    /// The first failed collective; later calls do no collective.
    error: Option<Error>,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct LayerShards {
    inner: Mutex<Inner>,
}

impl LayerShards {
    /// The gate of one model: `layers[l]` lists layer `l`'s parameters with their optimizer
    /// index and owning rank. Ranks other than 0 release the parameters they do not own.
    pub(crate) fn new(
        group: Arc<ProcessGroup>,
        what: &'static str,
        layers: Vec<Vec<(Tensor, usize, usize)>>,
    ) -> Self {
        let rank = group.rank();
        let layers = layers
            .into_iter()
            .map(|params| {
                params
                    .into_iter()
                    .map(|(param, index, owner)| {
                        let mut shard = Shard {
                            shape: param.size(),
                            kind: param.kind(),
                            param,
                            index,
                            owner,
                            whole: true,
                            stash: None,
                        };
                        if rank != 0 && owner != rank {
                            release(&mut shard);
                        }
                        shard
                    })
                    .collect()
            })
            .collect();
        if rank != 0 {
            return_freed_memory();
        }
        Self {
            inner: Mutex::new(Inner {
                group,
                what,
                layers,
                active: false,
                walked: false,
                error: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while held leaves nothing half-done that matters more than the panic.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Turns the gate on (an update starts on every rank) or off (it ended).
    pub(crate) fn activate(&self, on: bool) {
        self.lock().active = on;
    }

    /// Whether a backward pass reduced gradients since the last call (the same on every
    /// rank); clears it.
    pub(crate) fn take_walked(&self) -> bool {
        std::mem::take(&mut self.lock().walked)
    }

    /// The first collective that failed inside a pass, if any (the update fails with it).
    pub(crate) fn take_error(&self) -> Result<()> {
        match self.lock().error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// After an optimizer step: each parameter's owner sends its new value to rank 0 (which
    /// keeps the weights whole); other ranks pass it through a temporary buffer.
    pub(crate) fn send_to_leader(&self) -> Result<()> {
        let mut inner = self.lock();
        let Inner {
            group,
            what,
            layers,
            ..
        } = &mut *inner;
        let rank = group.rank();
        tch::no_grad(|| {
            for s in layers.iter_mut().flatten() {
                if s.owner == 0 {
                    continue;
                }
                let mut t = if rank == 0 || rank == s.owner {
                    s.param.shallow_clone()
                } else {
                    Tensor::zeros(&s.shape[..], (s.kind, Device::Cpu))
                };
                group.broadcast(&mut t, s.owner, &format!("{what} parameter {}", s.index))?;
            }
            Ok(())
        })
    }

    fn gather(inner: &mut Inner, layer: usize) {
        let Inner {
            group,
            what,
            layers,
            error,
            ..
        } = inner;
        for s in &mut layers[layer] {
            if error.is_none() {
                let mut t = if s.whole {
                    s.param.shallow_clone()
                } else {
                    Tensor::zeros(&s.shape[..], (s.kind, Device::Cpu))
                };
                let what = format!("{what} parameter {} (layer {layer})", s.index);
                match group.broadcast(&mut t, s.owner, &what) {
                    Ok(()) if !s.whole => {
                        s.param.set_data(&t);
                        s.whole = true;
                    }
                    Ok(()) => {}
                    Err(e) => *error = Some(e),
                }
            }
            if !s.whole {
                // The group failed: the pass runs on zeros to its end and the update fails.
                s.param
                    .set_data(&Tensor::zeros(&s.shape[..], (s.kind, Device::Cpu)));
                s.whole = true;
            }
        }
    }

    fn release_layer(inner: &mut Inner, layer: usize) {
        let rank = inner.group.rank();
        for s in &mut inner.layers[layer] {
            if rank != 0 && s.owner != rank {
                release(s);
            }
        }
    }

    fn reduce_gradients(inner: &mut Inner, layer: usize) {
        let Inner {
            group,
            what,
            layers,
            error,
            walked,
            ..
        } = inner;
        let rank = group.rank();
        let shards = &mut layers[layer];
        let result = tch::no_grad(|| -> Result<()> {
            let parts: Vec<Tensor> = shards
                .iter()
                .map(|s| {
                    let g = s.param.grad();
                    if g.defined() {
                        g.to_kind(Kind::Float).flatten(0, -1)
                    } else {
                        Tensor::zeros(
                            [s.shape.iter().product::<i64>()],
                            (Kind::Float, Device::Cpu),
                        )
                    }
                })
                .collect();
            let mut flat = Tensor::cat(&parts, 0);
            drop(parts);
            if error.is_none() {
                group.all_reduce(
                    &mut flat,
                    ReduceOp::Sum,
                    &format!("{what} gradients (layer {layer})"),
                )?;
            }
            let mut offset = 0;
            for s in shards.iter_mut() {
                let n: i64 = s.shape.iter().product();
                if s.owner == rank {
                    let sum = flat.narrow(0, offset, n).view(&s.shape[..]).to_kind(s.kind);
                    // A tensor of its own: a view of the buffer cannot be a gradient that
                    // `zero_grad` detaches in place.
                    let g = match s.stash.take() {
                        Some(acc) => acc + sum,
                        None => sum.copy(),
                    };
                    set_grad(&s.param, Some(&g))?;
                } else {
                    set_grad(&s.param, None)?;
                }
                offset += n;
            }
            Ok(())
        });
        *walked = true;
        if let Err(e) = result {
            if error.is_none() {
                *error = Some(e);
            }
        }
    }
}

/// Hands the pages of freed heap memory back to the system. The released weights were
/// allocated while the model loaded, among other allocations, so freeing them alone leaves
/// them in the process's heap (its resident memory) until this.
/// Then every block of 1 MiB or more (a gathered weight, its reduction buffer) is mapped
/// on its own and unmapped when freed: with glibc's default, such blocks come from the
/// heap once a few have been freed, and layers gathered and released in turn between
/// activations leave the heap fragmented, the process's memory growing by about a layer's
/// weights every few layers.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: both only change and walk glibc's own allocator state.
    unsafe {
        libc::malloc_trim(0);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Frees a parameter's data on a rank that does not own it (its shape is kept aside).
fn release(s: &mut Shard) {
    s.param.set_data(&Tensor::empty([0], (s.kind, Device::Cpu)));
    s.whole = false;
}

impl LayerGate for LayerShards {
    fn before_forward(&self, layer: usize) {
        let mut inner = self.lock();
        if inner.active {
            Self::gather(&mut inner, layer);
        }
    }

    fn after_forward(&self, layer: usize) {
        let mut inner = self.lock();
        if inner.active {
            Self::release_layer(&mut inner, layer);
        }
    }

    fn before_backward(&self, layer: usize) {
        let mut inner = self.lock();
        if !inner.active {
            return;
        }
        Self::gather(&mut inner, layer);
        let rank = inner.group.rank();
        for s in &mut inner.layers[layer] {
            let g = s.param.grad();
            if s.owner == rank && g.defined() {
                // Set aside: the reduction sums only this micro-batch's gradients.
                s.stash = Some(g);
                if let Err(e) = set_grad(&s.param, None) {
                    inner.error.get_or_insert(e);
                    return;
                }
            }
        }
    }

    fn after_backward(&self, layer: usize) {
        let mut inner = self.lock();
        if inner.active {
            Self::reduce_gradients(&mut inner, layer);
            Self::release_layer(&mut inner, layer);
        }
    }
}

/// Groups `params` (optimizer order, with names) by decoder layer (`model.layers.N.`): the
/// parameters the gate shards, with their optimizer index. Others are left out.
pub(crate) fn by_layer(names: &[String], layers: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); layers];
    for (i, name) in names.iter().enumerate() {
        let layer = name
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(l) = layer.filter(|&l| l < layers) {
            out[l].push(i);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::by_layer;

    #[test]
    fn layer_parameters_are_found_by_name() {
        let names: Vec<String> = [
            "lm_head.weight",
            "model.embed_tokens.weight",
            "model.layers.0.mlp.up_proj.weight",
            "model.layers.1.self_attn.q_proj.bias",
            "model.layers.10.input_layernorm.weight",
            "model.layers.1.mlp.down_proj.weight",
            "model.norm.weight",
            "value_head.weight",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let layers = by_layer(&names, 11);
        assert_eq!(layers[0], vec![2]);
        assert_eq!(layers[1], vec![3, 5]);
        assert_eq!(layers[10], vec![4]);
        assert!(layers[2..10].iter().all(Vec::is_empty));
    }
}
