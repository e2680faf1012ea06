//! Env implementations and the env registry.
//!
//! - [`MultihopQaEnv`] (`multihop_qa`): QA with a `search` tool over tasks of any dataset
//!   format, scored with the selected [`crate::reward::RewardKind`];
//! - [`SyntheticMultihopEnv`] (`synthetic_multihop`): the same over a generated world;
//! - [`EnvRegistry`]: envs by name, built-ins plus user registrations.

pub mod corpus;
pub mod multihop_qa;
pub mod prompt;
pub mod registry;
pub mod synthetic_multihop;

pub use corpus::CorpusSpec;
pub use multihop_qa::{MultihopQaEnv, MultihopQaOptions, QaOptions};
pub use registry::{EnvFactory, EnvRegistry};
pub use synthetic_multihop::{SyntheticMultihopEnv, SyntheticMultihopOptions};
