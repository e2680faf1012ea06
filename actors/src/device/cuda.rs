//! What tch does not wrap for a GPU's decode step, through `csrc/cuda_shim.cpp`: CUDA
//! graphs (PyTorch's `at::cuda::CUDAGraph`, with its memory pool) and flash attention over
//! keys of per-sequence lengths. The shim is compiled only where libtorch has CUDA and the
//! CUDA headers are there (`cfg(agent_r1_cuda)`); elsewhere [`Graphs::new`] says why not.

use std::ffi::c_void;
#[cfg(agent_r1_cuda)]
use std::ffi::{c_char, CStr};
#[cfg(agent_r1_cuda)]
use std::panic::{catch_unwind, AssertUnwindSafe};

use tch::{Device, Tensor};

#[cfg(agent_r1_cuda)]
use crate::error::panic_message;

/// What a build without the shim says where a graph or flash attention is asked for.
#[cfg(not(agent_r1_cuda))]
const NO_SHIM: &str =
    "this build has no CUDA shim (libtorch without CUDA, or no CUDA headers at build time)";

/// Why a CUDA graph could not be made or run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CUDA graphs: {0}")]
pub struct GraphError(pub String);

#[cfg(agent_r1_cuda)]
mod ffi {
    use std::ffi::{c_char, c_void};
    use tch::Tensor;

    /// `at::Tensor*`, as tch's `C_tensor` is.
    pub(super) type RawTensor = *const c_void;

    extern "C" {
        pub(super) fn ar1_free_error(e: *mut c_char);
        pub(super) fn ar1_graphs_new(device: i64, out: *mut *mut c_void) -> *mut c_char;
        pub(super) fn ar1_graphs_free(graphs: *mut c_void);
        pub(super) fn ar1_graphs_enter(graphs: *mut c_void) -> *mut c_char;
        pub(super) fn ar1_graphs_leave(graphs: *mut c_void) -> *mut c_char;
        pub(super) fn ar1_graph_new(out: *mut *mut c_void) -> *mut c_char;
        pub(super) fn ar1_graph_free(graph: *mut c_void);
        pub(super) fn ar1_graph_capture_begin(
            graphs: *mut c_void,
            graph: *mut c_void,
        ) -> *mut c_char;
        pub(super) fn ar1_graph_capture_end(graph: *mut c_void) -> *mut c_char;
        pub(super) fn ar1_graph_replay(graph: *mut c_void) -> *mut c_char;
        pub(super) fn ar1_flash_varlen(
            q: RawTensor,
            k: RawTensor,
            v: RawTensor,
            cu_q: RawTensor,
            cu_k: RawTensor,
            seqused_k: RawTensor,
            max_q: i64,
            max_k: i64,
            scale: f64,
            causal: i32,
            out: *mut *mut c_void,
        ) -> *mut c_char;
    }

    pub(super) fn raw(t: &Tensor) -> RawTensor {
        t.as_ptr() as RawTensor
    }
}

/// Turns the shim's error string (NULL = success) into a result.
#[cfg(agent_r1_cuda)]
fn check(e: *mut c_char) -> Result<(), GraphError> {
    if e.is_null() {
        return Ok(());
    }
    // SAFETY: a non-NULL return is a NUL-terminated string the shim malloc'd for us.
    let message = unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned();
    unsafe { ffi::ar1_free_error(e) };
    Err(GraphError(message))
}

/// One engine's CUDA graphs: the side stream they are captured on and the memory pool they
/// share. Owned by the engine's thread (not `Send`).
#[derive(Debug)]
pub struct Graphs {
    // Never made without the shim (`Graphs::new` refuses first).
    #[cfg_attr(not(agent_r1_cuda), allow(dead_code))]
    raw: *mut c_void,
}

/// One captured graph, replayed on the current stream.
#[derive(Debug)]
pub struct Graph {
    // Never made without the shim (`Graphs::new` refuses first).
    #[cfg_attr(not(agent_r1_cuda), allow(dead_code))]
    raw: *mut c_void,
}

impl Graphs {
    /// Graphs for `device`; an error where the build has no CUDA shim or the device is no GPU.
    pub fn new(device: Device) -> Result<Self, GraphError> {
        let Device::Cuda(index) = device else {
            return Err(GraphError(format!("{device:?} is not a CUDA device")));
        };
        #[cfg(agent_r1_cuda)]
        {
            let mut raw = std::ptr::null_mut();
            // SAFETY: the shim writes `raw` only on success.
            check(unsafe { ffi::ar1_graphs_new(index as i64, &mut raw) })?;
            Ok(Self { raw })
        }
        #[cfg(not(agent_r1_cuda))]
        {
            let _ = index;
            Err(GraphError(NO_SHIM.into()))
        }
    }

    /// Runs `body` once on the side stream (a warm-up: allocations, library handles and
    /// kernel choices happen outside the capture), then captures it into a graph. Returns the
    /// graph and what the captured `body` returned: tensors that each replay overwrites.
    /// A panic inside `body` (an operation not allowed while capturing) becomes an error.
    pub fn capture<R>(&self, mut body: impl FnMut() -> R) -> Result<(Graph, R), GraphError> {
        #[cfg(agent_r1_cuda)]
        {
            let mut graph = std::ptr::null_mut();
            check(unsafe { ffi::ar1_graph_new(&mut graph) })?;
            let graph = Graph { raw: graph };
            check(unsafe { ffi::ar1_graphs_enter(self.raw) })?;
            let captured = (|| {
                catch_unwind(AssertUnwindSafe(&mut body))
                    .map_err(|p| GraphError(format!("warm-up failed: {}", panic_message(&*p))))?;
                check(unsafe { ffi::ar1_graph_capture_begin(self.raw, graph.raw) })?;
                let out = catch_unwind(AssertUnwindSafe(&mut body));
                let ended = check(unsafe { ffi::ar1_graph_capture_end(graph.raw) });
                let out =
                    out.map_err(|p| GraphError(format!("capture failed: {}", panic_message(&*p))))?;
                ended.map(|()| out)
            })();
            let left = check(unsafe { ffi::ar1_graphs_leave(self.raw) });
            let out = captured?;
            left?;
            Ok((graph, out))
        }
        #[cfg(not(agent_r1_cuda))]
        {
            let _ = &mut body;
            Err(GraphError(NO_SHIM.into()))
        }
    }
}

impl Drop for Graphs {
    fn drop(&mut self) {
        #[cfg(agent_r1_cuda)]
        unsafe {
            ffi::ar1_graphs_free(self.raw)
        };
    }
}

impl Graph {
    /// Runs the captured work again on the current stream, over the same tensors.
    pub fn replay(&self) -> Result<(), GraphError> {
        #[cfg(agent_r1_cuda)]
        {
            check(unsafe { ffi::ar1_graph_replay(self.raw) })
        }
        #[cfg(not(agent_r1_cuda))]
        {
            Err(GraphError(NO_SHIM.into()))
        }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        #[cfg(agent_r1_cuda)]
        unsafe {
            ffi::ar1_graph_free(self.raw)
        };
    }
}

/// Flash attention over packed sequences, sequence `i` reading only the first `used[i]` of
/// the keys `cu_k[i]..cu_k[i + 1]` it owns: `q` [total_q, heads, dim], `k` and `v`
/// [total_k, kv_heads, dim] (bf16 or f16, on a GPU), `cu_q`/`cu_k` [n + 1] and `used` [n]
/// int32. Returns [total_q, heads, dim]. Panics like a tch operation where it fails.
#[allow(clippy::too_many_arguments)]
pub fn flash_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_q: &Tensor,
    cu_k: &Tensor,
    used: &Tensor,
    max_q: i64,
    max_k: i64,
    scale: f64,
) -> Tensor {
    #[cfg(agent_r1_cuda)]
    {
        use ffi::raw;
        let mut out = std::ptr::null_mut();
        let result = check(unsafe {
            ffi::ar1_flash_varlen(
                raw(q),
                raw(k),
                raw(v),
                raw(cu_q),
                raw(cu_k),
                raw(used),
                max_q,
                max_k,
                scale,
                0,
                &mut out,
            )
        });
        match result {
            // SAFETY: on success the shim returns a `new at::Tensor`, which tch frees.
            Ok(()) => unsafe { Tensor::from_ptr(out as *mut _) },
            Err(e) => panic!("flash attention: {}", e.0),
        }
    }
    #[cfg(not(agent_r1_cuda))]
    {
        let _ = (q, k, v, cu_q, cu_k, used, max_q, max_k, scale);
        panic!("flash attention: {NO_SHIM}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graphs_are_refused_off_a_gpu_with_the_reason() {
        let err = Graphs::new(Device::Cpu).unwrap_err();
        assert!(
            err.to_string().contains("Cpu is not a CUDA device"),
            "{err}"
        );
    }
}
