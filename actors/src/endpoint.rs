//! An OpenAI-compatible endpoint in front of the rollout engine, and episodes driven by
//! outside programs through it.
//!
//! An outside agent (any program written against an OpenAI client) asks for chat or text
//! completions; each completion is one step of its episode, sampled by the same engine and
//! batching as built-in episodes, with its own context recorded token for token
//! (`conversation.rs`: assistant messages sent back unchanged reuse their sampled ids).
//! `server.rs` is the HTTP side (routes, the episode a request names, limits), `protocol.rs`
//! the wire format validated once, `serve.rs` a request answered on an episode's
//! [`crate::runtime::Agent`], `run_tools.rs` the run's tools offered to outside agents,
//! `process.rs` an agent program's process group, and
//! `external_agent.rs` the `external_agent` workflow that runs one program per episode (or
//! posts each to an agent service, which `agent_service.rs` starts when the run owns it).

pub mod agent_service;
pub mod conversation;
pub mod error;
pub mod external_agent;
pub mod process;
pub mod protocol;
pub mod run_tools;
pub mod serve;
pub mod server;

pub use conversation::Conversation;
pub use error::ApiError;
pub use external_agent::{ExternalAgent, ExternalAgentOptions};
pub use serve::{serve, Call, Reply};
pub use server::{Endpoint, EndpointLimits, EpisodeRequest, Registration};
