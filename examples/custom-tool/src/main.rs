//! `custom-agent`: agent-r1's whole command line (`train`, `eval`, `check-config`,
//! `tool call`, ...) with one more tool kind, `keyword_search`, and a workflow,
//! `self_check`, defined in this crate.

mod keyword_search;
mod self_check;

use agent_r1::registries::Registries;

fn main() {
    let mut registries = Registries::builtins();
    registries
        .tools
        .register("keyword_search", keyword_search::build);
    registries
        .workflows
        .register("self_check", self_check::build);
    agent_r1::cli::main(registries)
}
