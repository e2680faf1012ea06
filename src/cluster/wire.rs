//! What trainer and workers say to each other over ractor_cluster: one JSON-encoded enum in
//! one message type, so a frame from a peer of another build is an error we can name, not a
//! panic inside ractor's decoding.

use ractor::message::{BoxedDowncastErr, SerializedMessage};
use serde::{Deserialize, Serialize};

use agent_r1_actors::trajectory::Trajectory;
use agent_r1_envs::task::Task;

/// The process group the trainer's coordinator joins; workers find it there.
pub const COORDINATOR_GROUP: &str = "agent_r1.coordinator";

/// The process group of one worker's agent (`agent_r1.worker.NAME`).
pub fn worker_group(name: &str) -> String {
    format!("agent_r1.worker.{name}")
}

/// One control-plane message.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Wire {
    /// Worker -> trainer: I am here, with this many episode slots and these weights.
    Hello {
        /// The worker's name (unique in the cluster).
        worker: String,
        /// Episodes it runs at once (0 until it has the config; its heartbeats say).
        slots: u32,
        /// The policy version its engines hold, if any.
        version: Option<u64>,
    },
    /// Trainer -> worker: the run's config and where its weights are.
    Welcome {
        /// The resolved training config (TOML).
        config: String,
        /// The weight server, `http://HOST:PORT`.
        weights_url: String,
        /// The bearer token the weight server wants, if it wants one (sent here, over the
        /// authenticated channel, so workers need no file of their own).
        weights_token: Option<String>,
        /// The current policy version.
        version: u64,
        /// The SHA-256 of that version's manifest on the weight server (which pins every
        /// file's digest: the weight server itself is not trusted).
        manifest_sha256: String,
        /// With LoRA: the SHA-256 of the frozen base's manifest (`/weights/base/`), fetched
        /// once; each version then holds the adapters alone.
        #[serde(default)]
        base_manifest_sha256: Option<String>,
        /// How often the worker renews its leases, milliseconds.
        heartbeat_ms: u64,
    },
    /// Trainer -> worker: run this episode.
    Lease {
        /// The lease's id (new for every grant, also for a re-queued episode).
        lease: u64,
        /// The episode's group (a task's position in the stream).
        group_id: u64,
        /// The episode's id, the idempotency key: one trajectory per id is accepted.
        episode_id: u64,
        /// The task.
        task: Task,
    },
    /// Worker -> trainer: the episode of `lease` ended.
    Done {
        /// The worker.
        worker: String,
        /// The lease it ran under.
        lease: u64,
        /// What it sampled (completed, or failed with a reason).
        trajectory: Box<Trajectory>,
    },
    /// Worker -> trainer: still alive, holding these leases, with these weights.
    Heartbeat {
        /// The worker.
        worker: String,
        /// The policy version its engines hold.
        version: Option<u64>,
        /// Episodes it runs at once (so a worker dropped after a partition rejoins).
        slots: u32,
        /// The leases it holds (renewed); any other lease of it runs out.
        leases: Vec<u64>,
    },
    /// Trainer -> worker: a new policy version is on the weight server.
    Weights {
        /// The version.
        version: u64,
        /// The SHA-256 of its manifest.
        manifest_sha256: String,
    },
    /// Worker -> trainer: leaving; its leases go back to the queue now.
    Bye {
        /// The worker.
        worker: String,
    },
    /// Trainer -> worker: the run is over.
    Stop,
}

/// An actor message that may cross nodes: a [`Wire`] from a peer (or one that did not
/// decode), or a local command that is never serialized.
#[derive(Debug)]
pub enum ClusterMsg<L> {
    /// From the other side.
    Wire(Wire),
    /// Bytes from a peer that are not a [`Wire`].
    Malformed(String),
    /// From this process.
    Local(L),
}

impl<L: Send + 'static> ractor::Message for ClusterMsg<L> {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        match self {
            ClusterMsg::Wire(wire) => Ok(SerializedMessage::Cast {
                variant: "wire".into(),
                args: serde_json::to_vec(&wire).map_err(|_| BoxedDowncastErr)?,
                metadata: None,
            }),
            ClusterMsg::Malformed(_) | ClusterMsg::Local(_) => Err(BoxedDowncastErr),
        }
    }

    fn deserialize(bytes: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        Ok(match bytes {
            SerializedMessage::Cast { args, .. } => match serde_json::from_slice(&args) {
                Ok(wire) => ClusterMsg::Wire(wire),
                Err(e) => ClusterMsg::Malformed(format!("{} bytes: {e}", args.len())),
            },
            other => ClusterMsg::Malformed(format!("not a cast: {other:?}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::Message;

    #[test]
    fn a_wire_message_survives_the_round_trip_and_garbage_is_named() {
        let msg: ClusterMsg<()> = ClusterMsg::Wire(Wire::Heartbeat {
            worker: "w1".into(),
            version: Some(3),
            slots: 4,
            leases: vec![1, 2],
        });
        let bytes = msg.serialize().expect("a wire message serializes");
        match ClusterMsg::<()>::deserialize(bytes).expect("it decodes") {
            ClusterMsg::Wire(Wire::Heartbeat {
                worker,
                version,
                leases,
                ..
            }) => {
                assert_eq!(
                    (worker.as_str(), version, leases),
                    ("w1", Some(3), vec![1, 2])
                );
            }
            other => panic!("decoded as {other:?}"),
        }
        let garbage = SerializedMessage::Cast {
            variant: "wire".into(),
            args: vec![0xff, 0x00, 0x13],
            metadata: None,
        };
        assert!(matches!(
            ClusterMsg::<()>::deserialize(garbage),
            Ok(ClusterMsg::Malformed(m)) if m.starts_with("3 bytes")
        ));
        assert!(ClusterMsg::Local(()).serialize().is_err());
    }
}
