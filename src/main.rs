//! The `agent-r1` binary: CLI, config and wiring.

fn main() {
    println!("agent-r1 {}", env!("CARGO_PKG_VERSION"));
}
