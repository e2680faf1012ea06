//! `agent-r1 train`, the training daemon ([`train`]), and its building blocks: the TOML
//! config ([`config`]), atomic checkpoints ([`checkpoint`]), the Prometheus endpoint
//! ([`metrics_server`]), the web UI ([`view`]) and what commands build their runs from ([`setup`]).
//!
//! The command line itself is a library function, [`cli::main`], that takes the
//! [`registries::Registries`] of tools and envs: the `agent-r1` binary passes the built-ins,
//! and a user's crate passes its own beside them (`examples/custom-tool/`).

pub mod checkpoint;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod critic_prefix;
pub mod demonstrations;
pub mod file_digest;
pub mod memory;
pub mod metric_names;
pub mod metrics_server;
pub mod preflight;
pub mod registries;
pub mod setup;
pub mod train;
pub mod view;
pub mod weight_plane;
