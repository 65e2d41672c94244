//! Freed space goes back to the file system.
//!
//! A block the store no longer needs — no index, undo entry, durable index
//! (until the next commit) or read's pin holds it — waits in
//! `Meta::to_punch`. [`Store::punch_freed`] (at every commit, and by a
//! writer that finds no free block) takes them, punches their extents out of
//! `blocks.dat` (`fallocate(PUNCH_HOLE | KEEP_SIZE)`) and only then hands
//! them to the allocator: a punch never lands on a block that was reused,
//! and the blocks it punches are free in the durable index already, so a
//! crash anywhere loses nothing (a punch that did not happen is made up at
//! the next open, which trims the file past the last block in use and
//! punches every free extent below it).
//!
//! The file's disk usage so follows what the store holds (`used_bytes`),
//! not what it ever held. A file system that cannot punch holes is told
//! once in the log; freed blocks are then reused but not given back.

use super::*;
use nix::errno::Errno;

impl Meta {
    /// Blocks free or about to be (punched, then handed to the allocator).
    pub(crate) fn free_blocks(&self) -> u64 {
        self.alloc.free_blocks() + self.to_punch.len() as u64 + self.punching
    }

    /// Blocks in use, or held until a commit or a read lets go of them.
    pub(crate) fn used_blocks(&self) -> u64 {
        self.alloc.capacity() - self.free_blocks()
    }
}

/// Sorted, unique blocks as extents (start, length).
fn extents(blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in blocks {
        match out.last_mut() {
            Some((start, len)) if *start + *len == b => *len += 1,
            _ => out.push((b, 1)),
        }
    }
    out
}

impl Store {
    /// Gives the bytes of every block waiting in `to_punch` back to the file
    /// system, then hands the blocks to the allocator. One at a time
    /// (`punch_lock`); the metadata lock is not held while punching.
    pub(crate) fn punch_freed(&self) {
        let _one = lock(&self.punch_lock);
        let mut blocks = {
            let mut m = lock(&self.meta);
            let blocks = std::mem::take(&mut m.to_punch);
            m.punching += blocks.len() as u64;
            blocks
        };
        if blocks.is_empty() {
            return;
        }
        blocks.sort_unstable();
        let freed = extents(&blocks);
        for &(start, len) in &freed {
            self.punch(start, len);
        }
        // An extent goes back to the allocator in one step (one B-tree
        // update, not one per block) after a check that none of it is in use.
        let mut m = lock(&self.meta);
        m.punching -= blocks.len() as u64;
        for (start, len) in freed {
            let idle = |b: u64| !m.refcount.contains_key(&b) && !m.pins.contains_key(&b);
            assert!((start..start + len).all(idle), "a punched block of {start}+{len} is in use");
            m.alloc.free_extent(start, len);
        }
    }

    /// At open: trims `blocks.dat` past the last block in use and punches
    /// every free extent below it (blocks freed before a crash, or by a
    /// store that did not punch). Nothing is in use but what the durable
    /// index holds.
    pub(crate) fn give_back_free_space(&self) -> Result<(), StoreError> {
        let (grow_point, free) = {
            let m = lock(&self.meta);
            (m.alloc.grow_point(), m.alloc.free_extents_below_grow_point())
        };
        let end = grow_point * self.bs();
        if self.data.len()? > end {
            self.data.set_len(end)?;
        }
        for (start, len) in free {
            self.punch(start, len);
        }
        Ok(())
    }

    /// Punches blocks `start .. start + len` out of `blocks.dat`, keeping its
    /// size. A failure costs space, never data: the blocks are free.
    fn punch(&self, start: u64, len: u64) {
        if !self.punch_holes.load(Ordering::Relaxed) {
            return;
        }
        let bs = self.bs();
        let result = self.data.punch_hole(start * bs, len * bs);
        match result.map_err(|e| (e.raw_os_error().map(Errno::from_raw), e)) {
            Ok(()) => {}
            Err((Some(Errno::EOPNOTSUPP | Errno::ENOSYS), e)) => {
                if self.punch_holes.swap(false, Ordering::Relaxed) {
                    tracing::warn!(
                        dir = %self.dir.display(),
                        error = %e,
                        "the file system under the drive cannot punch holes: freed blocks are reused but their \
                         space is not given back to it"
                    );
                }
            }
            Err((_, e)) => {
                tracing::warn!(dir = %self.dir.display(), start, blocks = len, error = %e, "punching freed blocks failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::extents;

    #[test]
    fn blocks_coalesce_into_extents() {
        assert_eq!(extents(&[]), vec![]);
        assert_eq!(extents(&[3]), vec![(3, 1)]);
        assert_eq!(extents(&[0, 1, 2, 5, 6, 9]), vec![(0, 3), (5, 2), (9, 1)]);
    }
}
