//! The trainer's side of handing tasks to remote workers.

use tokio::sync::{mpsc, watch};

use agent_r1_actors::runtime::EpisodeRequest;

/// Tasks for remote workers: the channel to the cluster's task pump, how many more tasks
/// the workers could take now, and whether the local service samples too.
#[derive(Clone, Debug)]
pub(crate) struct RemoteTasks {
    pub(crate) tasks: mpsc::Sender<EpisodeRequest>,
    pub(crate) wanted: watch::Receiver<usize>,
    pub(crate) local_too: bool,
}

impl RemoteTasks {
    /// Room in the channel once the workers have room for one more task.
    pub(crate) async fn reserve(&self) -> Option<mpsc::Permit<'_, EpisodeRequest>> {
        let mut wanted = self.wanted.clone();
        wanted.wait_for(|&n| n > 0).await.ok()?;
        self.tasks.reserve().await.ok()
    }
}
