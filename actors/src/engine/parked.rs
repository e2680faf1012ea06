//! KV of sequences waiting on tools, in the engine's parked-KV pool.
//!
//! Keeping every waiting episode's KV is impossible at scale (4096 episodes x 1k tokens x
//! 4 KiB is 16 GiB), so parked KV lives in a pool of fixed size and the least recently
//! parked entry is evicted first when a new one does not fit: an episode that has waited
//! longest is the one whose tool is slowest, so it is the least likely to be needed soon.
//! An evicted episode's next turn recomputes its prefix.

use std::collections::{BTreeMap, HashMap};

use super::slots::ParkedKv;

#[derive(Debug)]
struct Entry {
    tokens: Vec<u32>,
    kv: ParkedKv,
    tick: u64,
    bytes: usize,
}

/// Parked KV by episode, evicted least recently parked first.
#[derive(Debug, Default)]
pub(crate) struct ParkedStore {
    entries: HashMap<u64, Entry>,
    order: BTreeMap<u64, u64>,
    tick: u64,
    used: usize,
    pub(crate) evictions: u64,
    pub(crate) evicted_tokens: u64,
}

impl ParkedStore {
    pub(crate) fn bytes(&self) -> usize {
        self.used
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Parks `kv`, whose slots hold `tokens`.
    pub(crate) fn insert(&mut self, episode: u64, tokens: Vec<u32>, kv: ParkedKv) {
        self.remove(episode);
        let bytes = kv.bytes();
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

    /// Drops the least recently parked entry (its pool range is free again); false when
    /// nothing is parked.
    pub(crate) fn evict_oldest(&mut self) -> bool {
        let Some((_, oldest)) = self.order.pop_first() else {
            return false;
        };
        if let Some(e) = self.entries.remove(&oldest) {
            self.used -= e.bytes;
            self.count_eviction(e.tokens.len());
        }
        true
    }

    /// Counts KV of `tokens` tokens that could not be kept (evicted, or never parked).
    pub(crate) fn count_eviction(&mut self, tokens: usize) {
        self.evictions += 1;
        self.evicted_tokens += tokens as u64;
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

/// How many spare slots to give newly parked KV: a high quantile of how much recent
/// episodes' KV grew from one parked turn to the next (a tool observation, template tokens
/// and the next reply). With that many spare slots most next turns park in
/// place; the rest pay one new tensor, as they would without spare slots. Spare slots
/// count against the parked budget, so the quantile trades evictions for copies.
#[derive(Debug)]
pub(crate) struct SpareSlots {
    recent: Vec<i64>,
    next: usize,
    slots: i64,
}

impl SpareSlots {
    /// Growths remembered.
    const WINDOW: usize = 256;
    /// Growths at or under the spare slots, of those remembered.
    const QUANTILE: f64 = 0.9;
    /// Spare slots are a multiple of this (fewer distinct tensor sizes for the allocator).
    const GRANULE: i64 = 16;
    /// Spare slots before any growth is seen.
    const INITIAL: i64 = 256;

    pub(crate) fn observe(&mut self, growth: i64) {
        let growth = growth.max(0);
        if self.recent.len() < Self::WINDOW {
            self.recent.push(growth);
        } else {
            self.recent[self.next] = growth;
        }
        self.next = (self.next + 1) % Self::WINDOW;
        // Re-estimated every 16 growths; selecting in 256 numbers is nothing beside one copy.
        if self.next % 16 == 0 {
            let mut recent = self.recent.clone();
            let at = ((recent.len() - 1) as f64 * Self::QUANTILE).round() as usize;
            let (_, &mut quantile, _) = recent.select_nth_unstable(at);
            self.slots = (quantile + Self::GRANULE - 1) / Self::GRANULE * Self::GRANULE;
        }
    }

    pub(crate) fn slots(&self) -> i64 {
        self.slots
    }
}

impl Default for SpareSlots {
    fn default() -> Self {
        Self {
            recent: Vec::with_capacity(Self::WINDOW),
            next: 0,
            slots: Self::INITIAL,
        }
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;
    use crate::engine::slots::SlotCache;

    #[test]
    fn spare_slots_follow_the_90th_percentile_of_recent_growth() {
        let mut spare = SpareSlots::default();
        assert_eq!(spare.slots(), SpareSlots::INITIAL);
        for _ in 0..16 {
            spare.observe(100);
        }
        // Rounded up to the granule.
        assert_eq!(spare.slots(), 112);
        for g in 1..=256 {
            spare.observe(g);
        }
        // The window now holds 1..=256; its 90th percentile is 231, rounded up to 240.
        assert_eq!(spare.slots(), 240);
        for _ in 0..256 {
            spare.observe(-5);
        }
        assert_eq!(spare.slots(), 0, "shrinking contexts need no spare slots");
    }

    #[test]
    fn the_least_recently_parked_entry_is_evicted_first() {
        let slots = SlotCache::new(1, 1, 8, 1, 4, Kind::Float, Device::Cpu);
        let park = || slots.park(0, 0);
        let mut store = ParkedStore::default();
        for episode in [3, 1, 2] {
            store.insert(episode, vec![0; episode as usize], park());
        }
        // Parking episode 3 again makes it the most recent.
        store.insert(3, vec![0; 3], park());
        assert!(store.evict_oldest());
        assert!(store.take(1).is_none(), "episode 1 was parked longest ago");
        assert_eq!((store.evictions, store.evicted_tokens), (1, 1));
        assert!(store.evict_oldest());
        assert!(store.take(2).is_none());
        assert_eq!(store.len(), 1);
        assert!(store.take(3).is_some());
        assert!(!store.evict_oldest(), "nothing left to evict");
    }
}
