// A binary that links libtorch needs agent-r1's link flags (see build/torch_link.rs): the
// rpath to libtorch and `libtorch.so` kept even though no symbol of it is used directly.
include!("../../build/torch_link.rs");

fn main() {
    link_torch();
}
