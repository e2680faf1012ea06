include!("build/torch_link.rs");

fn main() {
    link_torch();
}
