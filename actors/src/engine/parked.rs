//! KV of sequences waiting on tools, kept under a byte budget.
//!
//! Keeping every waiting episode's KV is impossible at scale (4096 episodes x 1k tokens x
//! 4 KiB is 16 GiB), so parked KV has a budget and the least recently parked entry is evicted
//! first: an episode that has waited longest is the one whose tool is slowest, so it is the
//! least likely to be needed soon. An evicted episode's next turn recomputes its prefix.

use std::collections::{BTreeMap, HashMap};

use super::slots::ParkedKv;

#[derive(Debug)]
struct Entry {
    tokens: Vec<u32>,
    kv: ParkedKv,
    tick: u64,
    bytes: usize,
}

/// Parked KV by episode, with LRU eviction under a byte budget.
#[derive(Debug)]
pub(crate) struct ParkedStore {
    entries: HashMap<u64, Entry>,
    order: BTreeMap<u64, u64>,
    tick: u64,
    budget: usize,
    used: usize,
    pub(crate) evictions: u64,
    pub(crate) evicted_tokens: u64,
}

impl ParkedStore {
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            tick: 0,
            budget,
            used: 0,
            evictions: 0,
            evicted_tokens: 0,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.used
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Parks `kv`, whose slots hold `tokens`, evicting older entries to stay in budget.
    pub(crate) fn insert(&mut self, episode: u64, tokens: Vec<u32>, kv: ParkedKv) {
        self.remove(episode);
        let bytes = kv.bytes();
        if bytes > self.budget {
            self.evictions += 1;
            self.evicted_tokens += tokens.len() as u64;
            return;
        }
        while self.used + bytes > self.budget {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            if let Some(e) = self.entries.remove(&oldest) {
                self.used -= e.bytes;
                self.evictions += 1;
                self.evicted_tokens += e.tokens.len() as u64;
            }
        }
        self.tick += 1;
        self.order.insert(self.tick, episode);
        self.used += bytes;
        self.entries.insert(
            episode,
            Entry {
                tokens,
                kv,
                tick: self.tick,
                bytes,
            },
        );
    }

    /// Takes an episode's parked KV and the tokens it holds.
    pub(crate) fn take(&mut self, episode: u64) -> Option<(Vec<u32>, ParkedKv)> {
        let e = self.entries.remove(&episode)?;
        self.order.remove(&e.tick);
        self.used -= e.bytes;
        Some((e.tokens, e.kv))
    }

    pub(crate) fn remove(&mut self, episode: u64) {
        let _ = self.take(episode);
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
        self.used = 0;
    }
}
