//! Env implementations and the env registry.
//!
//! - [`MultihopQaEnv`] (`multihop_qa`): QA with a `search` tool over tasks of any dataset
//!   format, scored with the selected [`crate::reward::RewardKind`];
//! - [`SyntheticMultihopEnv`] (`synthetic_multihop`): the same over a generated world;
//! - [`MathEnv`] (`math`): word problems with a numeric answer (GSM8K format), solved with
//!   the `calculator` or `python` tool;
//! - [`SyntheticMathEnv`] (`synthetic_math`): the same over generated problems;
//! - [`EnvRegistry`]: envs by name, built-ins plus user registrations.

pub mod corpus;
pub mod math;
pub mod multihop_qa;
pub mod options;
pub mod prompt;
pub mod registry;
pub mod synthetic_math;
pub mod synthetic_multihop;

pub use corpus::CorpusSpec;
pub use math::{MathEnv, MathOptions};
pub use multihop_qa::{MultihopQaEnv, MultihopQaOptions, QaOptions};
pub use registry::{EnvFactory, EnvRegistry, GeneratedEnvFactory};
pub use synthetic_math::{SyntheticMathEnv, SyntheticMathOptions};
pub use synthetic_multihop::{SyntheticMultihopEnv, SyntheticMultihopOptions};
