//! Free-space map of the block file: a set of free extents.
//!
//! Not persisted. At open it is rebuilt from the block index: every block the
//! index references is in use, every other block below the capacity is free.
//! While the store runs, a block comes back here only once no index, undo
//! entry, durable index (until the next commit) or read's pin holds it
//! (`Meta::release_block`, `Meta::free_block`, `Meta::unpin`).

use std::collections::BTreeMap;

/// Free extents (start → length) of a block file of `capacity` blocks.
#[derive(Debug)]
pub struct Allocator {
    free: BTreeMap<u64, u64>,
    capacity: u64,
    free_blocks: u64,
    cursor: u64,
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
        Allocator { free, capacity, free_blocks, cursor: 0 }
    }

    /// Blocks not allocated.
    pub fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    /// Total blocks.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Allocates one block, preferring `hint` or the first free block after it,
    /// so that consecutive allocations with consecutive hints are contiguous.
    /// Without a hint it continues after the previous allocation (next fit).
    pub fn alloc(&mut self, hint: Option<u64>) -> Option<u64> {
        let want = hint.unwrap_or(self.cursor);
        let found = self
            .free
            .range(..=want)
            .next_back()
            .filter(|(&s, &l)| want < s + l)
            .map(|(&s, _)| (s, want))
            .or_else(|| self.free.range(want..).next().map(|(&s, _)| (s, s)))
            .or_else(|| self.free.iter().next().map(|(&s, _)| (s, s)));
        let (start, block) = found?;
        let len = self.free.remove(&start).expect("extent exists");
        if block > start {
            self.free.insert(start, block - start);
        }
        let end = start + len;
        if block + 1 < end {
            self.free.insert(block + 1, end - block - 1);
        }
        self.free_blocks -= 1;
        self.cursor = block + 1;
        Some(block)
    }

    /// Returns a block to the free map. Freeing a free block is an invariant
    /// violation and stops the process (fail-stop: the index is corrupt).
    pub fn free(&mut self, block: u64) {
        assert!(block < self.capacity, "free of block {block} beyond capacity");
        let prev = self.free.range(..=block).next_back().map(|(&s, &l)| (s, l));
        if let Some((s, l)) = prev {
            assert!(block >= s + l, "double free of block {block}");
        }
        let next = self.free.range(block + 1..).next().map(|(&s, &l)| (s, l));
        let mut start = block;
        let mut len = 1;
        if let Some((s, l)) = prev {
            if s + l == block {
                self.free.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some((s, l)) = next {
            if s == block + 1 {
                self.free.remove(&s);
                len += l;
            }
        }
        self.free.insert(start, len);
        self.free_blocks += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_with_hints_and_coalescing_frees() {
        let mut a = Allocator::new(10, &[2, 5]);
        assert_eq!(a.free_blocks(), 8);
        assert_eq!(a.alloc(Some(3)), Some(3));
        assert_eq!(a.alloc(Some(4)), Some(4));
        assert_eq!(a.alloc(Some(5)), Some(6), "5 is taken: next free after it");
        a.free(4);
        a.free(3);
        assert_eq!(a.alloc(Some(3)), Some(3));
        let mut got = vec![];
        while let Some(b) = a.alloc(None) {
            got.push(b);
        }
        got.sort();
        assert_eq!(got, vec![0, 1, 4, 7, 8, 9]);
        assert_eq!(a.free_blocks(), 0);
        for b in 0..10 {
            a.free(b);
        }
        assert_eq!(a.free.len(), 1);
    }

    #[test]
    #[should_panic(expected = "double free")]
    fn double_free_stops() {
        let mut a = Allocator::new(4, &[]);
        a.free(1);
    }
}
