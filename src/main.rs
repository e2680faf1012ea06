//! The `agent-r1` binary: the command line ([`agent_r1::cli`]) with the built-in tools and
//! envs.

use agent_r1::registries::Registries;

fn main() {
    agent_r1::cli::main(Registries::builtins())
}
