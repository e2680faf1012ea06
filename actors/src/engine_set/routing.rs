//! Which engine an episode's first turn goes to: the policy, apart from the set that uses it.

/// Picks the engine for an episode that has none yet. Later turns of the episode go to the
/// same engine whatever the policy says (its KV is parked there).
pub trait RoutingPolicy: Send + Sync + 'static {
    /// The index into `load` of the engine to use; `load[i]` is what engine `i` holds now
    /// (see [`EngineLoad`]). `load` is never empty.
    fn pick(&self, load: &[EngineLoad]) -> usize;
}

/// What one engine holds when a new episode is routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineLoad {
    /// Episodes routed to it and not yet released: each may have KV parked there and will
    /// send more turns.
    pub episodes: usize,
    /// Turns queued or decoding on it now.
    pub pending_turns: usize,
}

/// The engine holding the fewest episodes; ties go to the fewest pending turns, then to the
/// lowest index (so routing is reproducible for a given order of arrivals and releases).
#[derive(Debug, Clone, Copy, Default)]
pub struct LeastLoaded;

impl RoutingPolicy for LeastLoaded {
    fn pick(&self, load: &[EngineLoad]) -> usize {
        load.iter()
            .enumerate()
            .min_by_key(|(i, l)| (l.episodes, l.pending_turns, *i))
            .map_or(0, |(i, _)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(episodes: usize, pending_turns: usize) -> EngineLoad {
        EngineLoad {
            episodes,
            pending_turns,
        }
    }

    #[test]
    fn fewest_episodes_first_then_fewest_turns_then_lowest_index() {
        let p = LeastLoaded;
        assert_eq!(p.pick(&[load(3, 0), load(2, 9), load(4, 0)]), 1);
        assert_eq!(p.pick(&[load(2, 5), load(2, 1), load(2, 1)]), 1);
        assert_eq!(p.pick(&[load(0, 0), load(0, 0)]), 0);
        assert_eq!(p.pick(&[load(7, 7)]), 0);
    }
}
