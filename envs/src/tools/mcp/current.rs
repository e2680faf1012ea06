//! The current server connection (stdio) or session (HTTP) of a client, started by one caller
//! at a time.
//!
//! A server that is slow or hung at start-up must not pile up callers that each start it
//! again: the first caller that finds no live value starts one, and the others wait for
//! that attempt, each up to its own deadline. When the attempt fails, everyone who waited
//! on it gets its error at once (a hung `initialize` costs the queued calls one wait, not
//! one each); the next new call tries again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How often a waiter looks at its cancel flag and the process's shutdown.
const POLL: Duration = Duration::from_millis(20);

struct State<T> {
    value: Option<Arc<T>>,
    starting: bool,
    /// Start attempts finished, successful or not.
    attempts: u64,
    /// The error of the last attempt, when it failed.
    last_error: Option<String>,
    /// Callers waiting for an attempt to finish.
    waiting: usize,
}

/// A value some callers share and one of them (re)starts when it is missing or dead.
pub(crate) struct Current<T> {
    state: Mutex<State<T>>,
    finished: Condvar,
}

impl<T> Default for Current<T> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                value: None,
                starting: false,
                attempts: 0,
                last_error: None,
                waiting: 0,
            }),
            finished: Condvar::new(),
        }
    }
}

impl<T> Current<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value, when there is one and `live` says it still works.
    pub(crate) fn live(&self, live: impl Fn(&T) -> bool) -> Option<Arc<T>> {
        self.lock().value.clone().filter(|v| live(v))
    }

    /// The value, live or not.
    pub(crate) fn get(&self) -> Option<Arc<T>> {
        self.lock().value.clone()
    }

    /// Callers now waiting for a start that another caller runs.
    pub(crate) fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Drops the value if it is still `which` (a failure seen on an older value must not
    /// end a newer one).
    pub(crate) fn clear_if(&self, which: &Arc<T>) {
        let mut state = self.lock();
        if state.value.as_ref().is_some_and(|v| Arc::ptr_eq(v, which)) {
            state.value = None;
        }
    }

    /// The live value, or a new one from `start` (run by this caller, without the lock held,
    /// when no other caller is starting one). Waiting for another caller's attempt ends at
    /// `deadline`, when `cancelled` is set, or when the process shuts down.
    pub(crate) fn get_or_start(
        &self,
        deadline: Instant,
        cancelled: &AtomicBool,
        live: impl Fn(&T) -> bool,
        start: impl FnOnce() -> Result<T, String>,
    ) -> Result<Arc<T>, String> {
        let mut state = self.lock();
        let mut seen_attempts: Option<u64> = None;
        loop {
            if let Some(v) = state.value.as_ref().filter(|v| live(v)) {
                return Ok(v.clone());
            }
            if let (Some(seen), Some(e)) = (seen_attempts, &state.last_error) {
                if state.attempts != seen {
                    return Err(e.clone());
                }
            }
            if !state.starting {
                state.starting = true;
                state.value = None;
                break;
            }
            seen_attempts.get_or_insert(state.attempts);
            let now = Instant::now();
            let why = if now >= deadline {
                Some("the server is still starting (another call started it)")
            } else if cancelled.load(Ordering::Acquire) {
                Some("the call was given up")
            } else if crate::shutdown::requested() {
                Some("given up: the process is shutting down")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(why.to_string());
            }
            state.waiting += 1;
            state = self
                .finished
                .wait_timeout(state, POLL.min(deadline - now))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            state.waiting -= 1;
        }
        drop(state);
        // Whatever `start` does (including a panic), the attempt ends and waiters wake.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(start))
            .unwrap_or_else(|_| Err("starting the server panicked".to_string()))
            .map(Arc::new);
        let mut state = self.lock();
        state.starting = false;
        state.attempts += 1;
        match &outcome {
            Ok(v) => {
                state.value = Some(v.clone());
                state.last_error = None;
            }
            Err(e) => state.last_error = Some(e.clone()),
        }
        drop(state);
        self.finished.notify_all();
        outcome
    }
}

/// Set when the future that owns it is dropped: a caller that stopped waiting (its deadline,
/// or its episode gave up) tells the blocking thread that still works for it.
#[derive(Default)]
pub(crate) struct CancelOnDrop(Arc<AtomicBool>);

impl CancelOnDrop {
    /// The flag the blocking side watches.
    pub(crate) fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn waiters_share_one_attempt_and_its_failure() {
        let current: Arc<Current<u32>> = Arc::default();
        let never = AtomicBool::new(false);
        let far = Instant::now() + Duration::from_secs(600);
        let (release_tx, release_rx) = mpsc::channel::<Result<u32, String>>();
        let (started_tx, started_rx) = mpsc::channel();
        let starter = {
            let current = current.clone();
            std::thread::spawn(move || {
                let never = AtomicBool::new(false);
                current.get_or_start(
                    far,
                    &never,
                    |_| true,
                    || {
                        started_tx.send(()).unwrap();
                        release_rx.recv().unwrap()
                    },
                )
            })
        };
        started_rx.recv().unwrap();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let current = current.clone();
                std::thread::spawn(move || {
                    let never = AtomicBool::new(false);
                    current.get_or_start(far, &never, |_| true, || Ok(99))
                })
            })
            .collect();
        while current.waiting() < 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        release_tx
            .send(Err("initialize: the server exited".into()))
            .unwrap();
        assert_eq!(
            starter.join().unwrap().unwrap_err(),
            "initialize: the server exited"
        );
        for w in waiters {
            assert_eq!(
                w.join().unwrap().unwrap_err(),
                "initialize: the server exited"
            );
        }
        // The next call starts again, and a value that stops being live is replaced.
        assert_eq!(
            *current
                .get_or_start(far, &never, |_| true, || Ok(7))
                .unwrap(),
            7
        );
        assert_eq!(
            *current
                .get_or_start(far, &never, |_| true, || Ok(8))
                .unwrap(),
            7
        );
        assert_eq!(
            *current
                .get_or_start(far, &never, |v| *v != 7, || Ok(8))
                .unwrap(),
            8
        );
    }

    #[test]
    fn a_waiter_ends_at_its_deadline_or_when_cancelled() {
        let current: Arc<Current<u32>> = Arc::default();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel();
        let starter = {
            let current = current.clone();
            std::thread::spawn(move || {
                let never = AtomicBool::new(false);
                let far = Instant::now() + Duration::from_secs(600);
                current.get_or_start(
                    far,
                    &never,
                    |_| true,
                    || {
                        started_tx.send(()).unwrap();
                        release_rx.recv().unwrap();
                        Ok(1)
                    },
                )
            })
        };
        started_rx.recv().unwrap();
        let never = AtomicBool::new(false);
        let e = current
            .get_or_start(Instant::now(), &never, |_| true, || Ok(2))
            .unwrap_err();
        assert!(e.contains("still starting"), "{e}");
        let cancelled = AtomicBool::new(true);
        let far = Instant::now() + Duration::from_secs(600);
        let e = current
            .get_or_start(far, &cancelled, |_| true, || Ok(2))
            .unwrap_err();
        assert!(e.contains("given up"), "{e}");
        release_tx.send(()).unwrap();
        assert_eq!(*starter.join().unwrap().unwrap(), 1);
    }

    #[test]
    fn a_failure_on_an_old_value_keeps_the_new_one() {
        let current: Current<u32> = Current::default();
        let never = AtomicBool::new(false);
        let far = Instant::now() + Duration::from_secs(600);
        let old = current
            .get_or_start(far, &never, |_| true, || Ok(1))
            .unwrap();
        current.clear_if(&old);
        let new = current
            .get_or_start(far, &never, |_| true, || Ok(2))
            .unwrap();
        current.clear_if(&old);
        assert!(Arc::ptr_eq(&current.get().unwrap(), &new));
        current.clear_if(&new);
        assert!(current.get().is_none());
    }
}
