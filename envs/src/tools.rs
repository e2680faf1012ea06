//! Built-in tools, the registry that builds tools by name, and `[tools.NAME]` config.
//!
//! - [`search`]: BM25 (tantivy) over a JSONL or HotpotQA corpus;
//! - [`calculator`]: exact rational arithmetic;
//! - [`python`]: a snippet in a separate, limited `python3` process;
//! - [`mcp`]: the tools of a Model Context Protocol server over stdio;
//! - [`ToolRegistry`]: factories by name (a user's tool is one file plus one `register` line);
//! - [`ToolsConfig`]: the `[tools.NAME]` tables of a TOML config.

pub mod calculator;
pub mod config;
pub mod mcp;
pub mod python;
pub mod registry;
pub mod search;

pub use config::ToolsConfig;
pub use registry::{NoOptions, ToolRegistry};
