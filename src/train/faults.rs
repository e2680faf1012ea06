//! Fault injection for tests and benchmarks: a slowed learner (`bench train`), a slowed
//! checkpoint write (so a `kill -9` can land inside one), one stage that hangs for good (the
//! stall detector's tests), faulty tools (the soak), and engine threads that panic or stop
//! (the engine actor's restart, the sampler's failure path). Test doubles, by design.
//!
//! The plan and the hidden `train` flags that fill it exist only in a build with the
//! `fault-injection` feature (the tests turn it on; `cargo build --release --features
//! fault-injection` for the soak and `bench train`). Any other build has the inert plan:
//! the same calls at the same moments of a run, each doing nothing, so a real run's code
//! has no fault in it.

#[cfg(feature = "fault-injection")]
mod plan;
#[cfg(feature = "fault-injection")]
pub use plan::{Faults, HangStage, RankFault};

#[cfg(not(feature = "fault-injection"))]
mod inert;
#[cfg(not(feature = "fault-injection"))]
pub use inert::Faults;
