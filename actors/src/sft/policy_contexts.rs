//! Demonstrations seen through a context policy: each assistant turn is taught in the
//! context the policy would give it at rollout time, so a warm-started agent meets in RL the
//! contexts it learnt on (a window of the last turns, elided tool responses).
//!
//! The contexts are built in token space exactly as the episode loop builds them: the prompt
//! rendered once, each turn's action ids, the observation suffix the renderer appends, and the
//! policy's decision between turns. Turns whose contexts chain share one sequence; a rebuilt
//! context starts a new one.

use agent_r1_envs::message::{Message, Role};

use super::SftSequence;
use crate::runtime::context_policy::{ContextPolicy, History, NextContext, TurnRecord};
use crate::runtime::TurnRenderer;
use crate::{Error, Result};

/// The supervised sequences of `messages` (a prompt, then assistant turns each followed by
/// its observations) under `policy`. A policy that asks for a summary is taught the chained
/// context there: a summary cannot be demonstrated.
pub fn sequences_under_policy(
    renderer: &TurnRenderer,
    policy: &dyn ContextPolicy,
    messages: &[Message],
) -> Result<Vec<SftSequence>> {
    let first = messages
        .iter()
        .position(|m| m.role == Role::Assistant)
        .ok_or_else(|| Error::invalid("demonstration", "has no assistant message"))?;
    let prompt_ids = renderer.prompt(&messages[..first])?;
    let end = renderer.end_of_turn_id();
    let mut sequences = Vec::new();
    let mut row = SftSequence {
        ids: prompt_ids.clone(),
        trained: vec![false; prompt_ids.len()],
    };
    let mut chained = prompt_ids.clone();
    let mut turns: Vec<TurnRecord> = Vec::new();
    let mut at = first;
    while at < messages.len() {
        let next = messages[at + 1..]
            .iter()
            .position(|m| m.role == Role::Assistant)
            .map_or(messages.len(), |i| at + 1 + i);
        if !turns.is_empty() {
            let history = History {
                prompt_ids: &prompt_ids,
                turns: &turns,
                chained: &chained,
            };
            if let NextContext::Rebuilt(ids) = policy.next_context(&history, renderer)? {
                sequences.push(std::mem::replace(
                    &mut row,
                    SftSequence {
                        trained: vec![false; ids.len()],
                        ids: ids.clone(),
                    },
                ));
                chained = ids;
            }
        }
        let mut action_ids = renderer.tokenizer().encode(&messages[at].content, false)?;
        action_ids.push(end);
        let observations = messages[at + 1..next].to_vec();
        row.ids.extend(&action_ids);
        row.trained
            .extend(std::iter::repeat_n(true, action_ids.len()));
        chained.extend(&action_ids);
        if !observations.is_empty() {
            let observation_ids = renderer.continuation(&action_ids, &observations)?;
            row.ids.extend(&observation_ids);
            row.trained
                .extend(std::iter::repeat_n(false, observation_ids.len()));
            chained.extend(&observation_ids);
            turns.push(TurnRecord {
                action_ids,
                observation_ids,
                observations,
            });
        }
        at = next;
    }
    sequences.push(row);
    Ok(sequences)
}
