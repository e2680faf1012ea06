//! Faults to inject into engine threads: a plan handed to the engines when they start, for
//! tests and for the fault-injection flags of `train` and `bench train`. Nothing else can
//! make an engine fail on purpose: the engine's handle has no such method, and a plan can be
//! armed only in a build with the `fault-injection` feature (in any other build a plan is
//! never armed, and the engines' reads of it are constant).
//!
//! The engines that share a plan each read it between decode steps (and before a weight
//! update): a fault armed once fires once in each of them, and not in an engine started
//! after it was armed. A thread that replaces a crashed one reads on where its predecessor
//! stopped: what fired before the crash does not fire again, what was armed since does.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Whether a plan can be armed in this build.
const ARMABLE: bool = cfg!(any(test, feature = "fault-injection"));

/// A fault-injection plan for the engines it is given to. Cheap to clone; clones share it.
#[derive(Debug, Clone, Default)]
pub struct EngineFaults(Arc<Plan>);

#[derive(Debug, Default)]
struct Plan {
    hang: AtomicBool,
    panic_after_steps: AtomicU64,
    panic_after_armed: AtomicU64,
    panic_on_update_armed: AtomicU64,
}

impl EngineFaults {
    /// A plan with nothing armed.
    pub fn new() -> Self {
        Self::default()
    }

    #[cfg(any(test, feature = "fault-injection"))]
    /// Every engine stops stepping for good, as a hung kernel or a deadlock would leave it.
    pub fn hang(&self) {
        self.0.hang.store(true, Ordering::Release);
    }

    #[cfg(any(test, feature = "fault-injection"))]
    /// Every engine's thread panics after `steps` more decode steps (at least one), as a
    /// libtorch error raised through tch would.
    pub fn panic_after(&self, steps: u64) {
        self.0
            .panic_after_steps
            .store(steps.max(1), Ordering::Relaxed);
        self.0.panic_after_armed.fetch_add(1, Ordering::Release);
    }

    #[cfg(any(test, feature = "fault-injection"))]
    /// Every engine's thread panics on its next weight update, before applying it, as a
    /// libtorch error while copying the tensors would.
    pub fn panic_on_next_update(&self) {
        self.0.panic_on_update_armed.fetch_add(1, Ordering::Release);
    }

    /// One engine's view of the plan (shared by the threads that replace each other in it):
    /// nothing armed before this call fires.
    pub(crate) fn reader(&self) -> Arc<FaultReader> {
        Arc::new(FaultReader {
            plan: self.clone(),
            panic_after_seen: AtomicU64::new(self.0.panic_after_armed.load(Ordering::Acquire)),
            panic_on_update_seen: AtomicU64::new(
                self.0.panic_on_update_armed.load(Ordering::Acquire),
            ),
        })
    }
}

/// One engine's view of a plan: what it has taken so far.
#[derive(Debug)]
pub(crate) struct FaultReader {
    plan: EngineFaults,
    panic_after_seen: AtomicU64,
    panic_on_update_seen: AtomicU64,
}

impl FaultReader {
    /// Whether the engines are to hang.
    pub(crate) fn hang(&self) -> bool {
        if !ARMABLE {
            return false;
        }
        self.plan.0.hang.load(Ordering::Acquire)
    }

    /// The steps before a panic, when one was armed since the last call.
    pub(crate) fn panic_after(&self) -> Option<u64> {
        if !ARMABLE {
            return None;
        }
        let armed = self.plan.0.panic_after_armed.load(Ordering::Acquire);
        let seen = self.panic_after_seen.swap(armed, Ordering::AcqRel);
        (armed != seen).then(|| self.plan.0.panic_after_steps.load(Ordering::Relaxed))
    }

    /// Whether a panic on the next weight update was armed since the last call.
    pub(crate) fn panic_on_update(&self) -> bool {
        if !ARMABLE {
            return false;
        }
        let armed = self.plan.0.panic_on_update_armed.load(Ordering::Acquire);
        self.panic_on_update_seen.swap(armed, Ordering::AcqRel) != armed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_armed_once_fires_once_in_each_reader_and_not_in_a_later_one() {
        let plan = EngineFaults::new();
        let (a, b) = (plan.reader(), plan.reader());
        assert_eq!(
            (a.panic_after(), a.panic_on_update(), a.hang()),
            (None, false, false)
        );
        plan.panic_after(0);
        plan.panic_on_next_update();
        let late = plan.reader();
        assert_eq!(a.panic_after(), Some(1), "at least one step");
        assert_eq!(a.panic_after(), None, "fires once");
        assert_eq!(b.panic_after(), Some(1), "in each reader");
        assert!(a.panic_on_update() && !a.panic_on_update());
        assert_eq!((late.panic_after(), late.panic_on_update()), (None, false));
        plan.panic_after(3);
        assert_eq!(late.panic_after(), Some(3));
        plan.hang();
        assert!(a.hang() && late.hang());
    }
}
