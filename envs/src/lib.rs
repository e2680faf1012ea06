//! agent-r1-envs: what the agent interacts with.
//!
//! Tools ([`tool::Tool`]), task families ([`env::Env`]), datasets and rewards. Plain Rust with
//! no tch, so it builds and tests fast; the actor runtime (`agent-r1-actors`) drives these
//! types from its episode, tool and env actors.
#![warn(missing_docs, unreachable_pub)]

pub mod access;
pub mod call_guard;
pub mod call_journal;
pub mod call_key;
pub mod config;
pub mod control_groups;
pub mod dataset;
pub mod demo;
pub mod env;
pub mod envs;
pub mod error;
pub mod generated_env;
pub mod kinds;
pub mod math;
pub mod message;
pub mod metric;
pub mod metric_names;
pub mod reward;
pub mod schema;
pub mod shutdown;
pub mod synthetic;
pub mod task;
pub mod task_template;
pub mod tool;
pub mod tool_call;
pub mod tools;

pub use error::{Error, Result};
