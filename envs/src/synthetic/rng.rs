//! The generator's random source: ChaCha8 seeded from a `u64`, used only through helpers
//! that draw `u32`s and `f64`s, so a seed gives the same world on every platform.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The portable random source of the synthetic world.
#[derive(Debug, Clone)]
pub struct WorldRng(ChaCha8Rng);

impl WorldRng {
    /// A source for `seed`; `stream` separates independent uses of one seed (world,
    /// demos, ...), so drawing more in one never shifts the other.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        Self(rng)
    }

    /// A uniform index in `0..n` (`n` must be at least 1 and below 2^32).
    pub fn index(&mut self, n: usize) -> usize {
        let n = u32::try_from(n.max(1)).unwrap_or(u32::MAX);
        self.0.random_range(0..n) as usize
    }

    /// A uniform element of `items` (`None` when empty).
    pub fn choose<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            items.get(self.index(items.len()))
        }
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.0.random::<f64>() < p
    }

    /// Fisher-Yates shuffle with [`WorldRng::index`].
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_draws_and_streams_differ() {
        let draw = |seed, stream| {
            let mut r = WorldRng::new(seed, stream);
            (0..8).map(|_| r.index(1000)).collect::<Vec<_>>()
        };
        assert_eq!(draw(1, 0), draw(1, 0));
        assert_ne!(draw(1, 0), draw(1, 1));
        assert_ne!(draw(1, 0), draw(2, 0));
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v: Vec<u32> = (0..50).collect();
        WorldRng::new(3, 0).shuffle(&mut v);
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(v, sorted);
    }
}
