//! agent-r1-actors: the supervised actor runtime and what its actors own.
//!
//! The policy model (a Hugging Face compatible Qwen2/Llama decoder in tch), its tokenizer and
//! chat template, the inference engine, the learner and the RL algorithms.
#![warn(missing_docs, unreachable_pub)]

pub mod algo;
pub mod chat_template;
pub mod device;
pub mod endpoint;
pub mod engine;
pub mod engine_set;
pub mod error;
pub mod learner;
pub mod memory_plan;
pub mod metric_names;
pub mod model;
pub mod openenv;
pub mod process_group;
pub mod runtime;
pub mod sft;
pub mod stall;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tiny_tokenizer;
pub mod tokenizer;
pub mod trajectory;
pub mod weight_digest;

pub use error::{Error, Result};
