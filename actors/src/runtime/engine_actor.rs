//! The engine as an actor: episodes send `Generate`; the actor forwards it to the engine
//! thread (over the engine's bounded crossbeam channel) and answers when the turn is done,
//! without blocking its mailbox while the turn generates.

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::engine::{EngineHandle, EngineStats, TurnOutput, TurnRequest};

/// Messages of the engine actor.
#[derive(Debug)]
pub enum EngineMsg {
    /// Generate one turn.
    Generate(TurnRequest, RpcReplyPort<crate::Result<TurnOutput>>),
    /// Engine counters.
    Stats(RpcReplyPort<crate::Result<EngineStats>>),
    /// Drop an episode's parked KV (it ended).
    Release(u64),
}

/// The engine actor.
pub struct EngineActor;

impl Actor for EngineActor {
    type Msg = EngineMsg;
    type State = EngineHandle;
    type Arguments = EngineHandle;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        handle: EngineHandle,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(handle)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        handle: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let handle = handle.clone();
        match message {
            EngineMsg::Generate(request, reply) => {
                tokio::spawn(async move {
                    let _ = reply.send(handle.generate(request).await);
                });
            }
            EngineMsg::Release(episode) => handle.release(episode),
            EngineMsg::Stats(reply) => {
                tokio::spawn(async move {
                    let _ = reply.send(handle.stats().await);
                });
            }
        }
        Ok(())
    }
}
