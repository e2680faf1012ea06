// The CUDA pieces tch does not wrap, for the inference engine's decode step: PyTorch's CUDA
// graphs (at::cuda::CUDAGraph) and flash attention over variable-length keys
// (at::_flash_attention_forward with `seqused_k`). Built by actors/build.rs only where
// libtorch has CUDA and the CUDA runtime headers are found.
//
// Every function returns NULL on success or a malloc'd error message the caller frees with
// ar1_free_error: no C++ exception crosses into Rust.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDAStream.h>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace {
char* error(const std::string& what) {
  char* out = static_cast<char*>(std::malloc(what.size() + 1));
  std::memcpy(out, what.c_str(), what.size() + 1);
  return out;
}

template <typename F>
char* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const std::exception& e) {
    return error(e.what());
  } catch (...) {
    return error("unknown C++ exception");
  }
}

// One engine's graphs: a side stream to capture on (capture is not allowed on the default
// stream) and one memory pool shared by every graph, so the buckets' activations share
// memory. The engine's thread is the only one that uses it.
struct Graphs {
  c10::DeviceIndex device;
  c10::cuda::CUDAStream side;
  std::optional<c10::cuda::CUDAStream> outer;
  at::cuda::MempoolId_t pool;
  Graphs(c10::DeviceIndex d)
      : device(d), side(c10::cuda::getStreamFromPool(false, d)), pool(at::cuda::graph_pool_handle()) {}
};
}  // namespace

extern "C" {

void ar1_free_error(char* e) { std::free(e); }

char* ar1_graphs_new(int64_t device, void** out) {
  return guarded([&] { *out = new Graphs(static_cast<c10::DeviceIndex>(device)); });
}

void ar1_graphs_free(void* graphs) { delete static_cast<Graphs*>(graphs); }

// Makes the side stream current (after the work queued so far on the current stream).
char* ar1_graphs_enter(void* graphs) {
  return guarded([&] {
    auto* g = static_cast<Graphs*>(graphs);
    auto outer = c10::cuda::getCurrentCUDAStream(g->device);
    c10::Event ready(c10::DeviceType::CUDA);
    ready.record(outer);
    ready.block(g->side);
    g->outer = outer;
    c10::cuda::setCurrentCUDAStream(g->side);
  });
}

// Makes the stream current before `enter` current again, after the side stream's work.
char* ar1_graphs_leave(void* graphs) {
  return guarded([&] {
    auto* g = static_cast<Graphs*>(graphs);
    if (!g->outer) return;
    c10::Event done(c10::DeviceType::CUDA);
    done.record(g->side);
    done.block(*g->outer);
    c10::cuda::setCurrentCUDAStream(*g->outer);
    g->outer.reset();
  });
}

char* ar1_graph_new(void** out) {
  return guarded([&] { *out = new at::cuda::CUDAGraph(); });
}

void ar1_graph_free(void* graph) { delete static_cast<at::cuda::CUDAGraph*>(graph); }

// Begins capturing the calling thread's work on the side stream (between enter and leave).
// Thread-local capture mode: other threads (a learner in the same process) may go on using
// the device meanwhile.
char* ar1_graph_capture_begin(void* graphs, void* graph) {
  return guarded([&] {
    auto* g = static_cast<Graphs*>(graphs);
    static_cast<at::cuda::CUDAGraph*>(graph)->capture_begin(g->pool, cudaStreamCaptureModeThreadLocal);
  });
}

char* ar1_graph_capture_end(void* graph) {
  return guarded([&] { static_cast<at::cuda::CUDAGraph*>(graph)->capture_end(); });
}

// Replays on the current stream.
char* ar1_graph_replay(void* graph) {
  return guarded([&] { static_cast<at::cuda::CUDAGraph*>(graph)->replay(); });
}

// Flash attention over packed sequences, each reading only its first `seqused_k[i]` keys of
// the `cu_k[i]..cu_k[i+1]` it owns: q [total_q, heads, dim], k and v [total_k, kv_heads,
// dim], cu_q / cu_k [n + 1] int32, seqused_k [n] int32. Returns [total_q, heads, dim].
char* ar1_flash_varlen(const at::Tensor* q, const at::Tensor* k, const at::Tensor* v,
                       const at::Tensor* cu_q, const at::Tensor* cu_k, const at::Tensor* seqused_k,
                       int64_t max_q, int64_t max_k, double scale, int causal, at::Tensor** out) {
  return guarded([&] {
    auto result = at::_flash_attention_forward(*q, *k, *v, *cu_q, *cu_k, max_q, max_k, 0.0, causal != 0, false,
                                               scale, std::nullopt, std::nullopt, *seqused_k, std::nullopt);
    *out = new at::Tensor(std::get<0>(result));
  });
}

}  // extern "C"
