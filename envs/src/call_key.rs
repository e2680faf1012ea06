//! The idempotency key of one tool call: which run, episode, step and call it is, so that a
//! service with side effects can tell a repeated call from a new one.
//!
//! A key names a call by its place in an episode, not by its arguments, and the runtime
//! derives it the same way every time the episode runs: an episode sampled again after a
//! crash makes its calls under the keys it made them under before. The call journal
//! (`call_journal`) answers those it has a result for; a call that was running at the crash
//! is sent again under the same key, for the service to recognise.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The environment variable the python tool's process gets its call's key in.
pub const PYTHON_ENV_VAR: &str = "AGENT_R1_IDEMPOTENCY_KEY";
/// The field of an MCP `tools/call` request's `_meta` that carries the key.
pub const MCP_META_FIELD: &str = "agent-r1/idempotency-key";
/// The HTTP header that carries the key (the IETF `Idempotency-Key` header).
pub const HTTP_HEADER: &str = "Idempotency-Key";

/// The key of one tool call.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CallKey {
    /// The run's id (written once into the run directory, kept across resumes).
    pub run: String,
    /// The episode's id (stable across resumes: a task's stream position and group member).
    pub episode: u64,
    /// The step the calls follow (the turn in the built-in loop; a workflow's step).
    pub step: u32,
    /// The call's position among the step's calls.
    pub index: u32,
    /// 0, unless the episode, sampled again after a crash, made a different call at this
    /// place than before: from there on its calls are new calls, under the next branch.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub branch: u32,
}

fn is_zero(b: &u32) -> bool {
    *b == 0
}

impl CallKey {
    /// The same place on the next branch.
    pub fn next_branch(&self) -> Self {
        Self {
            branch: self.branch + 1,
            ..self.clone()
        }
    }
}

impl fmt::Display for CallKey {
    /// `run/e12/s3/c0`, with `/b1` appended on branch 1.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/e{}/s{}/c{}",
            self.run, self.episode, self.step, self.index
        )?;
        if self.branch > 0 {
            write!(f, "/b{}", self.branch)?;
        }
        Ok(())
    }
}

/// A run id: 16 random hex digits.
pub fn new_run_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Checks a run id read from a file: 1 to 64 characters of `[A-Za-z0-9_-]`, so that keys
/// stay readable in headers and logs.
pub fn check_run_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the run id {id:?} is not 1 to 64 characters of letters, digits, `-` and `_`"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_print_their_place_and_branch() {
        let key = CallKey {
            run: "r1".into(),
            episode: 12,
            step: 3,
            index: 0,
            branch: 0,
        };
        assert_eq!(key.to_string(), "r1/e12/s3/c0");
        assert_eq!(key.next_branch().to_string(), "r1/e12/s3/c0/b1");
        assert_ne!(key, key.next_branch());
    }

    #[test]
    fn run_ids_are_checked() {
        let id = new_run_id();
        assert_eq!(id.len(), 16);
        check_run_id(&id).unwrap();
        for bad in ["", "a b", "x/y", &"a".repeat(65)] {
            assert!(check_run_id(bad).is_err(), "{bad:?}");
        }
    }
}
