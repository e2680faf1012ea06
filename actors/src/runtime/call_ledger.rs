//! How an episode's tool calls get their idempotency keys, and how the run's call journal
//! answers a call it already holds the result of (an episode sampled again after a crash
//! makes its calls under the same keys, and gets the recorded results without calling).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use agent_r1_envs::call_journal::{CallJournal, Lookup};
use agent_r1_envs::call_key::{new_run_id, CallKey};
use agent_r1_envs::tool::{CallOutcome, ToolCall};

/// The run's tool-call identity and, where the run keeps one, its call journal.
#[derive(Debug, Clone)]
pub struct CallLedger {
    run: String,
    journal: Option<Arc<CallJournal>>,
}

impl Default for CallLedger {
    /// Keys under a fresh run id, no journal (a rollout that is never resumed).
    fn default() -> Self {
        Self::unjournaled(new_run_id())
    }
}

impl CallLedger {
    /// Keys under the journal's run, results recorded in it and replayed from it.
    pub fn journaled(journal: Arc<CallJournal>) -> Self {
        Self {
            run: journal.run().to_string(),
            journal: Some(journal),
        }
    }

    /// Keys under `run`, nothing recorded.
    pub fn unjournaled(run: String) -> Self {
        Self { run, journal: None }
    }

    /// The run id in every key.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// Whether made calls are recorded (a caller keeps a copy of a call for
    /// [`Self::record`] only then).
    pub(crate) fn journals(&self) -> bool {
        self.journal.is_some()
    }

    /// Records a made call's outcome (a failure to record is logged: the call was made, and
    /// only a crash before the next checkpoint would make it again).
    pub(crate) async fn record(&self, key: &CallKey, call: &ToolCall, outcome: &CallOutcome) {
        if let Some(journal) = &self.journal {
            if let Err(e) = journal.record(key, call, outcome).await {
                tracing::warn!("call {key} was made but not journaled: {e}");
            }
        }
    }
}

/// What to do with one call.
pub(crate) enum Settled {
    /// The journal holds its outcome.
    Replayed(CallOutcome),
    /// Make it, under this key.
    Make(CallKey),
}

/// One episode's place in the key space: its id, and the branch its keys are on (see
/// [`CallKey::branch`]).
#[derive(Debug)]
pub(crate) struct EpisodeCalls {
    episode: u64,
    branch: AtomicU32,
}

impl EpisodeCalls {
    pub(crate) fn new(episode: u64) -> Self {
        Self {
            episode,
            branch: AtomicU32::new(0),
        }
    }

    /// The key of the `index`th call after step `step`, and the journal's outcome for it
    /// where it holds one. A key the journal holds for another call moves the episode to
    /// the next branch for good: its calls from here on are new calls.
    pub(crate) fn settle(
        &self,
        ledger: &CallLedger,
        step: usize,
        index: usize,
        call: &ToolCall,
    ) -> Settled {
        let mut key = CallKey {
            run: ledger.run.clone(),
            episode: self.episode,
            step: u32::try_from(step).unwrap_or(u32::MAX),
            index: u32::try_from(index).unwrap_or(u32::MAX),
            branch: self.branch.load(Ordering::SeqCst),
        };
        let Some(journal) = &ledger.journal else {
            return Settled::Make(key);
        };
        loop {
            match journal.lookup(&key, call) {
                Lookup::Replay(outcome) => return Settled::Replayed(outcome),
                Lookup::Absent => return Settled::Make(key),
                Lookup::Diverged => {
                    key = key.next_branch();
                    self.branch.fetch_max(key.branch, Ordering::SeqCst);
                }
            }
        }
    }
}
