//! Free-space map of the block file: a set of free extents.
//!
//! Not persisted. At open it is rebuilt from the block index: every block the
//! index references is in use, every other block below the capacity is free.
//! While the store runs, a block comes back here only once no index, undo
//! entry, durable index (until the next commit) or read's pin holds it, and
//! once its bytes were given back to the file system (`Meta::release_block`,
//! `Meta::free_block`, `Meta::unpin`, `Store::punch_freed`).
//!
//! **Reuse before growth.** The block file ends at the **grow point**, the
//! start of the free extent that runs to the capacity (everything past it
//! was never used, or was trimmed at open). A new block is the hint if the
//! hint is free and below the grow point, else the lowest free block: freed
//! blocks are taken before the file grows, so the file's size follows what
//! the store holds, not what it ever held.

use std::collections::BTreeMap;

/// Free extents (start → length) of a block file of `capacity` blocks.
#[derive(Debug)]
pub struct Allocator {
    free: BTreeMap<u64, u64>,
    capacity: u64,
    free_blocks: u64,
}

impl Allocator {
    /// An allocator over `capacity` blocks of which `used` (sorted, unique) are taken.
    pub fn new(capacity: u64, used: &[u64]) -> Self {
        debug_assert!(used.windows(2).all(|w| w[0] < w[1]));
        let mut free = BTreeMap::new();
        let mut next = 0u64;
        for &b in used {
            assert!(b < capacity, "block {b} beyond capacity {capacity}");
            if b > next {
                free.insert(next, b - next);
            }
            next = b + 1;
        }
        if next < capacity {
            free.insert(next, capacity - next);
        }
        let free_blocks = capacity - used.len() as u64;
        Allocator { free, capacity, free_blocks }
    }

    /// Blocks not allocated.
    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    /// Total blocks.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// One past the last block in use (or 0): every block from here to the
    /// capacity is free.
    pub fn grow_point(&self) -> u64 {
        match self.free.iter().next_back() {
            Some((&s, &l)) if s + l == self.capacity => s,
            _ => self.capacity,
        }
    }

    /// The free extents below the grow point, (start, length) in order.
    pub fn free_extents_below_grow_point(&self) -> Vec<(u64, u64)> {
        let grow = self.grow_point();
        self.free.range(..grow).map(|(&s, &l)| (s, l)).collect()
    }

    /// Allocates one block: `hint` if it is free and below the grow point
    /// (so that consecutive allocations with consecutive hints are
    /// contiguous), else the lowest free block — a freed block before one
    /// that grows the file.
    pub fn alloc(&mut self, hint: Option<u64>) -> Option<u64> {
        let grow = self.grow_point();
        let hinted = hint
            .filter(|&h| h < grow)
            .and_then(|h| self.free.range(..=h).next_back().filter(|(&s, &l)| h < s + l).map(|(&s, _)| (s, h)));
        let (start, block) = hinted.or_else(|| self.free.iter().next().map(|(&s, _)| (s, s)))?;
        let len = self.free.remove(&start).expect("extent exists");
        if block > start {
            self.free.insert(start, block - start);
        }
        let end = start + len;
        if block + 1 < end {
            self.free.insert(block + 1, end - block - 1);
        }
        self.free_blocks -= 1;
        Some(block)
    }

    /// Returns a block to the free map. Freeing a free block is an invariant
    /// violation and stops the process (fail-stop: the index is corrupt).
    #[cfg(test)]
    pub fn free(&mut self, block: u64) {
        self.free_extent(block, 1);
    }

    /// Returns blocks `start .. start + len` (`len` > 0) to the free map in
    /// one step, whatever `len`. Freeing a block that is free stops the
    /// process, as [`Allocator::free`] does.
    pub fn free_extent(&mut self, start: u64, len: u64) {
        assert!(len > 0, "free of an empty extent at {start}");
        let end = start.checked_add(len).filter(|&e| e <= self.capacity);
        let end = end.unwrap_or_else(|| panic!("free of blocks {start}+{len} beyond capacity"));
        let prev = self.free.range(..end).next_back().map(|(&s, &l)| (s, l));
        if let Some((s, l)) = prev {
            assert!(start >= s + l, "double free of blocks {start}+{len}");
        }
        let next = self.free.range(end..).next().map(|(&s, &l)| (s, l));
        let (mut first, mut last) = (start, end);
        if let Some((s, l)) = prev.filter(|(s, l)| s + l == start) {
            self.free.remove(&s);
            first = s;
            debug_assert_eq!(s + l, start);
        }
        if let Some((s, l)) = next.filter(|(s, _)| *s == end) {
            self.free.remove(&s);
            last = s + l;
        }
        self.free.insert(first, last - first);
        self.free_blocks += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_with_hints_and_coalescing_frees() {
        let mut a = Allocator::new(10, &[2, 5]);
        assert_eq!(a.free_blocks(), 8);
        assert_eq!(a.grow_point(), 6);
        assert_eq!(a.alloc(Some(3)), Some(3));
        assert_eq!(a.alloc(Some(4)), Some(4));
        assert_eq!(a.alloc(Some(5)), Some(0), "5 is taken: the lowest free block");
        a.free(4);
        a.free(3);
        assert_eq!(a.alloc(Some(3)), Some(3));
        let mut got = vec![];
        while let Some(b) = a.alloc(None) {
            got.push(b);
        }
        assert_eq!(got, vec![1, 4, 6, 7, 8, 9], "lowest first");
        assert_eq!(a.free_blocks(), 0);
        assert_eq!(a.grow_point(), 10);
        for b in 0..10 {
            a.free(b);
        }
        assert_eq!(a.free.len(), 1);
        assert_eq!(a.grow_point(), 0);
    }

    #[test]
    fn freed_blocks_are_reused_before_the_file_grows() {
        let mut a = Allocator::new(100, &[]);
        let first: Vec<u64> = (0..10).map(|_| a.alloc(None).unwrap()).collect();
        assert_eq!(first, (0..10).collect::<Vec<_>>());
        for b in 2..6 {
            a.free(b);
        }
        assert_eq!(a.grow_point(), 10);
        assert_eq!(a.free_extents_below_grow_point(), vec![(2, 4)]);
        // A hint at the grow point would grow the file while blocks below are free.
        assert_eq!(a.alloc(Some(10)), Some(2));
        assert_eq!(a.alloc(Some(3)), Some(3), "a free hint below the grow point is taken");
        assert_eq!(a.alloc(Some(9)), Some(4), "9 is taken");
        assert_eq!(a.alloc(None), Some(5));
        assert_eq!(a.alloc(Some(10)), Some(10), "nothing free below: the file grows");
        assert_eq!(a.grow_point(), 11);
    }

    #[test]
    fn extents_free_in_one_step_and_coalesce() {
        let mut a = Allocator::new(100, &(0..100).collect::<Vec<_>>());
        a.free_extent(10, 5);
        a.free_extent(20, 5);
        a.free_extent(15, 5);
        assert_eq!(a.free.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(), vec![(10, 15)]);
        a.free(9);
        a.free_extent(25, 75);
        assert_eq!(a.free.iter().map(|(&s, &l)| (s, l)).collect::<Vec<_>>(), vec![(9, 91)]);
        assert_eq!((a.free_blocks(), a.grow_point()), (91, 9));
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn freeing_an_extent_over_a_free_block_stops() {
        let mut a = Allocator::new(10, &(0..10).collect::<Vec<_>>());
        a.free(5);
        a.free_extent(3, 4);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_stops() {
        let mut a = Allocator::new(4, &[]);
        a.free(1);
    }
}
