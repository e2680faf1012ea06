//! `custom-agent`: agent-r1's whole command line (`train`, `eval`, `check-config`,
//! `tool call`, ...) with one more tool kind, `keyword_search`, defined in this crate.

mod keyword_search;

use agent_r1::registries::Registries;

fn main() {
    let mut registries = Registries::builtins();
    registries
        .tools
        .register("keyword_search", keyword_search::build);
    agent_r1::cli::main(registries)
}
