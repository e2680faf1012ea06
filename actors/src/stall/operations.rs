//! The probe of stages whose work is a set of calls: each call in flight holds an
//! [`Operation`], and the oldest one is what is stuck.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::{Probe, Stuck};

#[derive(Debug, Default)]
struct Open {
    next: u64,
    /// By start order, so the first entry is the oldest.
    calls: BTreeMap<u64, (Instant, String)>,
}

/// The calls in flight in one stage (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct Operations {
    inner: Arc<Mutex<Open>>,
}

/// One call in flight; dropping it ends the call. Held by whatever does the work (the
/// blocking closure, the tool's task), so a call that never returns keeps it.
#[derive(Debug)]
pub struct Operation {
    ops: Operations,
    id: u64,
}

impl Operations {
    fn lock(&self) -> MutexGuard<'_, Open> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a call described by `what` (e.g. `episode 12: score`).
    pub fn start(&self, what: impl Into<String>) -> Operation {
        self.start_at(what, Instant::now())
    }

    /// [`Self::start`] at a given instant.
    pub fn start_at(&self, what: impl Into<String>, at: Instant) -> Operation {
        let mut open = self.lock();
        let id = open.next;
        open.next += 1;
        open.calls.insert(id, (at, what.into()));
        Operation {
            ops: self.clone(),
            id,
        }
    }

    /// Calls in flight.
    pub fn len(&self) -> usize {
        self.lock().calls.len()
    }

    /// Whether no call is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Operation {
    fn drop(&mut self) {
        self.ops.lock().calls.remove(&self.id);
    }
}

impl Probe for Operations {
    fn stuck(&self, _now: Instant) -> Option<Stuck> {
        let open = self.lock();
        // Calls may be started with explicit instants; the oldest is the earliest start.
        open.calls
            .values()
            .min_by_key(|(since, _)| *since)
            .map(|(since, what)| Stuck {
                item: what.clone(),
                since: *since,
            })
    }
}
