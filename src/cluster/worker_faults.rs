//! Fault injection for the cluster worker's tests: a worker that freezes on a lease (as a
//! hung machine), one that holds its leases until it has been dropped and rejoined (work
//! finished late), and a slow first weight swap (as loading a large model). The plan and the
//! hidden `worker` flags that fill it exist only in a build with the `fault-injection`
//! feature; any other build has the inert plan, whose every call does nothing.

pub use plan::WorkerFaults;

#[cfg(feature = "fault-injection")]
mod plan {
    use std::time::Duration;

    /// The faults a worker injects (none by default).
    #[derive(Debug, Clone, Default)]
    pub struct WorkerFaults {
        /// On receiving this many leases, stop doing anything (nothing more is sent).
        pub freeze_at_lease: Option<u64>,
        /// From this many leases on, leases are held without running until the trainer has
        /// dropped this worker and taken it back.
        pub hold_from_lease: Option<u64>,
        /// The first weight swap after joining first waits this long.
        pub slow_swap: Option<Duration>,
    }

    impl WorkerFaults {
        /// On receiving its `received`-th lease (`lease`, for `episode_id`): a worker frozen
        /// here never returns.
        pub(crate) async fn on_lease(
            &self,
            worker: &str,
            lease: u64,
            episode_id: u64,
            received: u64,
        ) {
            if self.freeze_at_lease.is_some_and(|k| received >= k) {
                eprintln!(
                    "worker {worker}: fault injection: frozen at lease {lease} (episode \
                     {episode_id}); nothing more is sent"
                );
                std::future::pending::<()>().await;
            }
        }

        /// Whether the `received`-th lease is held until the worker rejoins.
        pub(crate) fn holds(&self, received: u64) -> bool {
            self.hold_from_lease.is_some_and(|k| received >= k)
        }

        /// Before swapping to version `version`: the first swap waits.
        pub(crate) async fn before_swap(&mut self, worker: &str, version: u64) {
            if let Some(delay) = self.slow_swap.take() {
                eprintln!(
                    "worker {worker}: fault injection: the swap to version {version} waits {:.1} s",
                    delay.as_secs_f64()
                );
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(not(feature = "fault-injection"))]
mod plan {
    /// No faults.
    #[derive(Debug, Clone, Default)]
    pub struct WorkerFaults;

    impl WorkerFaults {
        pub(crate) async fn on_lease(
            &self,
            _worker: &str,
            _lease: u64,
            _episode_id: u64,
            _received: u64,
        ) {
        }

        pub(crate) fn holds(&self, _received: u64) -> bool {
            false
        }

        pub(crate) async fn before_swap(&mut self, _worker: &str, _version: u64) {}
    }
}
