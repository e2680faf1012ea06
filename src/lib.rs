//! `agent-r1 train`, the training daemon ([`train`]), and its building blocks: the TOML
//! config ([`config`]), atomic checkpoints ([`checkpoint`]), the Prometheus endpoint
//! ([`metrics_server`]), the web UI ([`view`]) and what commands build their runs from ([`setup`]).
//!
//! They live in a library target (the binary's commands are in `src/cmd/`) so that the
//! training loop and the integration tests under `tests/` use one public API.

pub mod checkpoint;
pub mod config;
pub mod memory;
pub mod metrics_server;
pub mod setup;
pub mod train;
pub mod view;
