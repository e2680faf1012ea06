//! One preallocated tensor that parked KV lives in.
//!
//! Parking a finished turn copies its row out of the batch. Into a freshly allocated tensor,
//! that copy first page-faults its memory in: on a CPU run that grows parked KV to a GiB,
//! the faults cost as much as the copies, on the engine's critical path. The pool is one
//! tensor of the parked budget, touched once when the engine starts (optionally), and
//! parked KV is a contiguous range of it, handed out by a coalescing range allocator.
//! Ranges are measured in token slots; a range of n slots is laid out [layers, 2, kv_heads,
//! n, dim], like a heap-allocated parked tensor and a row of the running batch, so parking
//! and restoring stay one copy each. On a GPU the whole pool is reserved when the engine starts.

use std::cell::RefCell;
use std::rc::Rc;

use offset_allocator::ext::min_allocator_size;
use offset_allocator::{Allocation, Allocator};
use tch::{Device, Kind, Tensor};

use crate::{Error, Result};

/// The allocator, shared with every lease so a dropped lease frees its range.
type Ranges = Rc<RefCell<Allocator>>;

/// A range of the pool; the range is free again when this is dropped.
pub(crate) struct Lease {
    ranges: Ranges,
    allocation: Allocation,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("offset", &self.allocation.offset)
            .finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.ranges.borrow_mut().free(self.allocation);
    }
}

#[derive(Debug)]
pub(crate) struct KvPool {
    /// Flat storage: a whole number of token slots (one token's keys and values each).
    storage: Tensor,
    ranges: Option<Ranges>,
    /// The longest range an empty pool hands out (a little under its slots: see `lease`).
    longest: u32,
    /// [layers, 2, kv_heads, dim] of one token slot.
    token_shape: [i64; 4],
}

impl KvPool {
    /// Most ranges handed out at once (each parked episode holds one).
    const MAX_RANGES: u32 = 1 << 17;

    /// A pool of `bytes` (rounded down to whole token slots); `prefault` touches its memory
    /// now instead of on first use.
    pub(crate) fn new(
        bytes: usize,
        layers: i64,
        kv_heads: i64,
        head_dim: i64,
        kind: Kind,
        device: Device,
        prefault: bool,
    ) -> Result<Self> {
        let token_shape = [layers, 2, kv_heads, head_dim];
        let token_elems: i64 = token_shape.iter().product();
        let token_bytes = token_elems.max(1) as usize * kind.elt_size_in_bytes();
        let slots = (bytes / token_bytes).min(u32::MAX as usize - 1) as u32;
        let elems = slots as i64 * token_elems;
        let storage = if prefault {
            Tensor::f_zeros([elems], (kind, device))
        } else {
            Tensor::f_empty([elems], (kind, device))
        }
        .map_err(|e| {
            Error::invalid(
                "engine parked_kv_bytes",
                format!(
                    "cannot allocate the parked-KV pool of {} MiB on {device:?} ({e}); \
                     a smaller parked_kv_bytes fits",
                    bytes >> 20
                ),
            )
        })?;
        let ranges = (slots > 0).then(|| {
            Rc::new(RefCell::new(Allocator::with_max_allocs(
                slots,
                Self::MAX_RANGES,
            )))
        });
        let longest = ranges
            .as_ref()
            .map_or(0, |r| r.borrow().storage_report().largest_free_region);
        Ok(Self {
            storage,
            ranges,
            longest,
            token_shape,
        })
    }

    /// Free token slots, and the longest free range.
    pub(crate) fn free(&self) -> (i64, i64) {
        match &self.ranges {
            Some(r) => {
                let report = r.borrow().storage_report();
                (
                    report.total_free_space as i64,
                    report.largest_free_region as i64,
                )
            }
            None => (0, 0),
        }
    }

    /// Whether a range of `capacity` slots fits in the pool at all (when nothing else is
    /// parked): if not, evicting other episodes' KV to make room is pointless.
    pub(crate) fn can_ever_hold(&self, capacity: i64) -> bool {
        u32::try_from(capacity.max(1)).is_ok_and(|c| min_allocator_size(c) <= self.longest)
    }

    /// A tensor of at least `capacity` token slots ([layers, 2, kv_heads, slots, dim],
    /// contiguous, contents undefined) and its lease, or `None` when no free range is that
    /// long.
    pub(crate) fn lease(&self, capacity: i64) -> Option<(Tensor, Lease)> {
        let ranges = self.ranges.as_ref()?;
        // Rounded up to the allocator's size class. It files a freed range under its size
        // rounded down and looks a request up by its size rounded up, so a freed range of an
        // unrounded size (say 1000 slots) would never serve a request of that same size; of a
        // class size it does. The extra slots are spare slots the episode can grow into.
        let want = min_allocator_size(u32::try_from(capacity.max(1)).ok()?);
        let allocation = ranges.borrow_mut().allocate(want)?;
        let got = i64::from(want);
        let token_elems: i64 = self.token_shape.iter().product();
        let [layers, two, heads, dim] = self.token_shape;
        let kv = self
            .storage
            .narrow(0, allocation.offset as i64 * token_elems, got * token_elems)
            .view([layers, two, heads, got, dim]);
        Some((
            kv,
            Lease {
                ranges: ranges.clone(),
                allocation,
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(slots: usize) -> KvPool {
        // One token slot: 2 layers x 2 x 1 head x 4 dims x 4 bytes = 64 bytes.
        KvPool::new(slots * 64, 2, 1, 4, Kind::Float, Device::Cpu, true).unwrap()
    }

    #[test]
    fn leases_are_disjoint_views_of_the_storage_and_free_on_drop() {
        let p = pool(64);
        assert_eq!(p.free(), (64, 64));
        let (mut a, la) = p.lease(16).unwrap();
        // 16 is a size class of its own.
        let (mut b, lb) = p.lease(16).unwrap();
        assert_eq!(a.size(), [2, 2, 1, 16, 4]);
        let _ = a.fill_(1.0);
        let _ = b.fill_(2.0);
        assert_eq!(a.sum(Kind::Float).double_value(&[]), 16.0 * 16.0);
        assert_eq!(b.sum(Kind::Float).double_value(&[]), 2.0 * 16.0 * 16.0);
        assert_eq!(p.free().0, 32);
        drop(la);
        assert_eq!(p.free().0, 48);
        drop(lb);
        assert_eq!(p.free(), (64, 64));
    }

    #[test]
    fn a_full_pool_refuses_and_freed_neighbours_coalesce() {
        let p = pool(64);
        let leases: Vec<_> = (0..4).map(|_| p.lease(16).unwrap()).collect();
        assert!(p.lease(1).is_none(), "the pool is full");
        let mut leases = leases.into_iter();
        let first = leases.next().unwrap();
        let second = leases.next().unwrap();
        drop(first);
        drop(second);
        // The two freed neighbours make one 32-slot range.
        assert!(p.lease(32).is_some());
    }

    #[test]
    fn a_freed_range_serves_the_next_request_of_its_size_in_a_full_pool() {
        let p = pool(100);
        // 17 slots round up to the 18-slot size class.
        let mut leases: Vec<_> = (0..5).map(|_| p.lease(17).unwrap()).collect();
        assert_eq!(leases[0].0.size()[3], 18);
        assert_eq!(p.free().0, 10);
        assert!(p.lease(17).is_none(), "only 10 slots left");
        drop(leases.remove(1));
        assert!(
            p.lease(17).is_some(),
            "the freed hole must take the same request"
        );
    }

    #[test]
    fn a_range_longer_than_the_pool_can_ever_hold_is_known_up_front() {
        let p = pool(100);
        assert!(p.can_ever_hold(96));
        assert!(!p.can_ever_hold(101));
        assert!(!pool(0).can_ever_hold(1));
    }

    #[test]
    fn an_empty_pool_hands_out_nothing() {
        let p = KvPool::new(10, 2, 1, 4, Kind::Float, Device::Cpu, false).unwrap();
        assert!(p.lease(1).is_none());
        assert_eq!(p.free(), (0, 0));
    }

    #[test]
    fn a_pool_too_large_to_allocate_is_a_clear_error() {
        let e = KvPool::new(usize::MAX / 2, 2, 1, 4, Kind::Float, Device::Cpu, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("parked-KV pool") && e.contains("parked_kv_bytes"),
            "{e}"
        );
    }
}
