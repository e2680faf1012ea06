//! OpenEnv environments (`openenv-core`) as a native env kind: agent-r1 is the OpenEnv
//! client.
//!
//! `session.rs` is one environment session over the server's WebSocket (`/ws`: `reset`,
//! `step`, `state`, `close`, each answered by an observation, a state or an error), which is
//! how `openenv-core` gives a client an environment of its own (its HTTP `/reset` and
//! `/step` build a fresh environment per request). `workflow.rs` is the `openenv` workflow:
//! per episode a session, the observation rendered into the step's context as a user
//! message, the model's reply sent as the action, the env's reward placed on the step and
//! its `done` ending the episode.

pub mod session;
pub mod workflow;

pub use session::{EnvReply, Session};
pub use workflow::{OpenEnv, OpenEnvOptions, NAME};
