// torch.distributed's process groups for the learner's ranks, which tch does not wrap: a
// rendezvous store (c10d::FileStore on one machine, c10d::TCPStore across machines) and
// c10d::ProcessGroupGloo over it, with in-place collectives on CPU tensors. Compiled by
// actors/build.rs wherever libtorch is (Gloo is inside libtorch_cpu; the Gloo headers
// c10d's header includes are vendored in csrc/third_party).
//
// Every function returns NULL on success or a malloc'd error message the caller frees with
// ar1_dist_free_error: no C++ exception crosses into Rust.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::chrono::milliseconds timeout;
};

Group* group(void* g) { return static_cast<Group*>(g); }

at::Tensor& tensor(void* t) { return *static_cast<at::Tensor*>(t); }

void finish(Group* g, const c10::intrusive_ptr<c10d::Work>& work) {
  // wait() throws on the collective's own error (a peer gone) and on the timeout.
  work->wait(g->timeout);
}
}  // namespace

extern "C" {

void ar1_dist_free_error(char* e) { std::free(e); }

// Joins a group of `world` ranks as `rank`. `store` is "file" (`where` a path every rank
// can open) or "tcp" (`where` the host rank 0 listens on, at `port`). `interface` is the
// address this rank's Gloo transport binds. Every wait (the rendezvous and each
// collective) ends after `timeout_ms` with an error.
char* ar1_dist_new(const char* store, const char* where, int port, int rank, int world,
                   int64_t timeout_ms, const char* interface, void** out) {
  return guarded([&] {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    c10::intrusive_ptr<c10d::Store> s;
    if (std::string(store) == "file") {
      s = c10::make_intrusive<c10d::FileStore>(std::string(where), world);
    } else {
      c10d::TCPStoreOptions opts;
      opts.port = static_cast<std::uint16_t>(port);
      opts.isServer = rank == 0;
      opts.numWorkers = world;
      opts.waitWorkers = true;
      opts.timeout = timeout;
      s = c10::make_intrusive<c10d::TCPStore>(std::string(where), opts);
    }
    s->setTimeout(timeout);
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(std::string(interface)));
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(s, rank, world, options);
    *out = new Group{s, pg, timeout};
  });
}

void ar1_dist_free(void* g) { delete group(g); }

// In-place all-reduce of a contiguous CPU tensor: `op` 0 sum, 1 max, 2 min.
char* ar1_dist_all_reduce(void* g, void* t, int op) {
  return guarded([&] {
    c10d::AllreduceOptions opts;
    opts.reduceOp = op == 0 ? c10d::ReduceOp::SUM : op == 1 ? c10d::ReduceOp::MAX
                                                            : c10d::ReduceOp::MIN;
    opts.timeout = group(g)->timeout;
    std::vector<at::Tensor> ts{tensor(t)};
    finish(group(g), group(g)->pg->allreduce(ts, opts));
  });
}

// In-place broadcast of a contiguous CPU tensor from `root`.
char* ar1_dist_broadcast(void* g, void* t, int root) {
  return guarded([&] {
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = group(g)->timeout;
    std::vector<at::Tensor> ts{tensor(t)};
    finish(group(g), group(g)->pg->broadcast(ts, opts));
  });
}

char* ar1_dist_barrier(void* g) {
  return guarded([&] {
    c10d::BarrierOptions opts;
    opts.timeout = group(g)->timeout;
    finish(group(g), group(g)->pg->barrier(opts));
  });
}

// Sets the gradient of `param` to `grad` (a tensor of the parameter's shape), or clears it
// when `grad` is NULL, freeing its memory: tch can read `.grad` but not assign it. A learner
// rank that shards parameters keeps only the gradients of the parameters it owns.
char* ar1_set_grad(void* param, void* grad) {
  return guarded([&] {
    if (grad == nullptr) {
      tensor(param).mutable_grad() = at::Tensor();
    } else {
      tensor(param).mutable_grad() = tensor(grad);
    }
  });
}
}
