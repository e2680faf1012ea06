//! Building blocks of `agent-r1 train`, the training daemon: its TOML config
//! ([`config`]), atomic checkpoints ([`checkpoint`]) and the Prometheus endpoint
//! ([`metrics_server`]).
//!
//! They live in a library target (the binary's commands are in `src/cmd/`) so that the
//! training loop and the integration tests under `tests/` use one public API.

pub mod checkpoint;
pub mod config;
pub mod metrics_server;
