//! The prefetch cache: blocks read from disk ahead of the reads a client
//! said it will make (the drive's `prefetch-v1` extension), held until the
//! client says it has made them.
//!
//! **Keyed by where and what.** An entry is a physical block and the digest
//! of its bytes. Blocks are copy-on-write: a write puts new bytes in a new
//! block, so an entry can never go stale — a freed block given to other
//! data is stored under another digest, and a read looks up the digest its
//! block map holds now. Bytes enter only after they are checked against
//! that digest ([`Store::prefetch`]), so a block freed and reused between
//! the map lookup and the disk read is never cached under the old digest.
//! A hit therefore returns exactly what the disk holds for the block.
//!
//! **Held, not guessed.** Each entry records who holds it: a stream and the
//! last hint number in it that needs the block. [`BlockCache::release`]
//! drops a stream's holds up to the hint the client has reached; an entry
//! no one holds is gone. Nothing is evicted to make room: when the cache is
//! full a prefetch waits (its caller paces on the client's progress), so
//! blocks a client will read soon are not pushed out by blocks it reads
//! later.
//!
//! **No access.** The cache is a faster source for reads, never an
//! authority: a read served from it has passed every check a read from
//! disk passes.

use crate::{lock, BlockDigest, BlockRef, Store, StoreError};
use nasd_proto::Region;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Default bytes a drive's prefetch cache holds (`prefetch_cache_bytes`).
pub const PREFETCH_CACHE_BYTES_DEFAULT: u64 = 64 << 20;

/// Who holds a cached block: a stream and the last hint in it that needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The client's stream id.
    pub stream: u64,
    /// The hint number.
    pub seq: u32,
}

/// Blocks held for prefetch streams, bounded in bytes.
#[derive(Debug)]
pub struct BlockCache {
    capacity: u64,
    inner: Mutex<Inner>,
    /// `Inner::used`, stored under the lock at each change and read
    /// without it: a read finds an empty cache (the common case) without
    /// taking the lock.
    used: AtomicU64,
    hits: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    used: u64,
    /// Physical block → its entry.
    blocks: HashMap<u64, Entry>,
    /// Per stream: the bytes of blocks it holds.
    held: HashMap<u64, u64>,
}

#[derive(Debug)]
struct Entry {
    digest: BlockDigest,
    bytes: Arc<[u8]>,
    holders: Vec<Holder>,
}

/// What [`Store::prefetch`] did with a hint's blocks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Prefetched {
    /// Blocks read from disk into the cache.
    pub loaded: u64,
    /// Blocks already cached (now held for this hint too).
    pub held: u64,
    /// Blocks not cached: holes, or blocks that changed while read.
    pub skipped: u64,
    /// The cache had no room for the rest: try again once a client's
    /// progress frees some.
    pub full: bool,
}

impl BlockCache {
    /// A cache of at most `capacity` bytes (0: nothing is ever cached).
    pub fn new(capacity: u64) -> BlockCache {
        BlockCache { capacity, inner: Mutex::new(Inner::default()), used: AtomicU64::new(0), hits: AtomicU64::new(0) }
    }

    /// Its bound in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes held for `stream`.
    pub fn held_by(&self, stream: u64) -> u64 {
        lock(&self.inner).held.get(&stream).copied().unwrap_or(0)
    }

    /// Reads served from the cache so far (blocks).
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Copies block `b`'s bytes into `buf` if the cache holds them.
    pub(crate) fn read(&self, b: &BlockRef, buf: &mut [u8]) -> bool {
        if self.used() == 0 {
            return false;
        }
        let inner = lock(&self.inner);
        match inner.blocks.get(&b.phys) {
            Some(e) if nasd_crypto::ct_eq(&e.digest, &b.digest) && e.bytes.len() == buf.len() => {
                buf.copy_from_slice(&e.bytes);
                self.hits.fetch_add(1, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    /// Adds `holder` to block `b`'s entry if it is cached; whether it was.
    fn hold(&self, b: &BlockRef, holder: Holder) -> bool {
        let mut inner = lock(&self.inner);
        let size = match inner.blocks.get_mut(&b.phys) {
            Some(e) if e.digest == b.digest => {
                if let Some(h) = e.holders.iter_mut().find(|h| h.stream == holder.stream) {
                    h.seq = h.seq.max(holder.seq);
                    return true;
                }
                e.holders.push(holder);
                e.bytes.len() as u64
            }
            _ => return false,
        };
        *inner.held.entry(holder.stream).or_insert(0) += size;
        true
    }

    /// Caches block `b`'s checked bytes for `holder`; false if there is no
    /// room.
    fn insert(&self, b: &BlockRef, bytes: &[u8], holder: Holder) -> bool {
        let mut inner = lock(&self.inner);
        let size = bytes.len() as u64;
        if let Some(old) = inner.blocks.get(&b.phys) {
            // The block was given to other data since it was cached: the
            // old bytes are of no use to anyone.
            if old.digest != b.digest {
                let old = inner.blocks.remove(&b.phys).expect("present");
                inner.forget(old);
                self.used.store(inner.used, Ordering::Relaxed);
            }
        }
        if inner.blocks.contains_key(&b.phys) {
            drop(inner);
            return self.hold(b, holder);
        }
        if inner.used + size > self.capacity {
            return false;
        }
        inner.used += size;
        self.used.store(inner.used, Ordering::Relaxed);
        *inner.held.entry(holder.stream).or_insert(0) += size;
        inner.blocks.insert(b.phys, Entry { digest: b.digest, bytes: bytes.into(), holders: vec![holder] });
        true
    }

    /// Drops `stream`'s holds on blocks it needs for no hint after
    /// `through_seq` (None: every hold of the stream). Returns bytes freed.
    pub fn release(&self, stream: u64, through_seq: Option<u32>) -> u64 {
        let mut inner = lock(&self.inner);
        let before = inner.used;
        let mut dropped = Vec::new();
        let mut unheld = 0u64;
        for (&phys, e) in inner.blocks.iter_mut() {
            let len = e.holders.len();
            e.holders.retain(|h| h.stream != stream || through_seq.is_some_and(|t| h.seq > t));
            if e.holders.len() < len {
                unheld += e.bytes.len() as u64;
            }
            if e.holders.is_empty() {
                dropped.push(phys);
            }
        }
        for phys in dropped {
            let e = inner.blocks.remove(&phys).expect("listed");
            inner.used -= e.bytes.len() as u64;
        }
        match inner.held.get_mut(&stream) {
            Some(h) if *h > unheld => *h -= unheld,
            _ => {
                inner.held.remove(&stream);
            }
        }
        self.used.store(inner.used, Ordering::Relaxed);
        before - inner.used
    }
}

impl Inner {
    /// Accounts for an entry taken out of `blocks`.
    fn forget(&mut self, e: Entry) {
        let size = e.bytes.len() as u64;
        self.used -= size;
        for h in e.holders {
            if let Some(n) = self.held.get_mut(&h.stream) {
                *n = n.saturating_sub(size);
            }
        }
    }
}

impl Store {
    /// The prefetch cache.
    pub fn block_cache(&self) -> &BlockCache {
        &self.cache
    }

    /// Reads the stored blocks of `region` of object `o` into the prefetch
    /// cache for `holder`, each checked against its digest first. Stops at
    /// the first block that does not fit (the rest are `skipped`). Holes and
    /// bytes past the object's end are not read.
    pub fn prefetch(&self, p: u64, o: u64, region: Region, holder: Holder) -> Result<Prefetched, StoreError> {
        let mut done = Prefetched::default();
        if region.length == 0 || self.cache.capacity == 0 {
            return Ok(done);
        }
        let bs = self.bs();
        let refs: Vec<BlockRef> = {
            let m = lock(&self.meta);
            let obj = m.object(p, o)?;
            let end = region.end().min(obj.attrs.logical_size);
            if end <= region.offset {
                return Ok(done);
            }
            obj.blocks.range(region.offset / bs..=(end - 1) / bs).map(|(_, b)| *b).collect()
        };
        let mut buf = vec![0u8; bs as usize];
        for (i, b) in refs.iter().enumerate() {
            if self.cache.hold(b, holder) {
                done.held += 1;
                continue;
            }
            self.read_media(&mut buf, b.phys * bs)?;
            // Freed and given to other data since the map was read: skip.
            if !nasd_crypto::ct_eq(&nasd_crypto::block_digest(&buf), &b.digest) {
                done.skipped += 1;
                continue;
            }
            if !self.cache.insert(b, &buf, holder) {
                done.skipped += (refs.len() - i) as u64;
                done.full = true;
                break;
            }
            done.loaded += 1;
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(phys: u64, fill: u8) -> (BlockRef, Vec<u8>) {
        let bytes = vec![fill; 16];
        (BlockRef { phys, digest: nasd_crypto::block_digest(&bytes) }, bytes)
    }

    #[test]
    fn entries_are_held_until_released_and_bounded() {
        let cache = BlockCache::new(32);
        let (a, a_bytes) = block(1, 1);
        let (b, b_bytes) = block(2, 2);
        let (c, c_bytes) = block(3, 3);
        assert!(cache.insert(&a, &a_bytes, Holder { stream: 7, seq: 0 }));
        assert!(cache.insert(&b, &b_bytes, Holder { stream: 7, seq: 5 }));
        assert!(!cache.insert(&c, &c_bytes, Holder { stream: 7, seq: 6 }), "full: nothing evicted");
        let mut buf = [0u8; 16];
        assert!(cache.read(&a, &mut buf) && buf == [1; 16]);
        assert_eq!(cache.held_by(7), 32);
        assert_eq!(cache.release(7, Some(4)), 16, "block a was needed through hint 0 only");
        assert!(!cache.read(&a, &mut buf));
        assert!(cache.insert(&c, &c_bytes, Holder { stream: 7, seq: 6 }));
        assert_eq!(cache.release(7, None), 32);
        assert_eq!((cache.used(), cache.held_by(7)), (0, 0));
    }

    #[test]
    fn a_block_given_to_other_data_is_never_served_its_old_bytes() {
        let cache = BlockCache::new(64);
        let (old, old_bytes) = block(1, 1);
        assert!(cache.insert(&old, &old_bytes, Holder { stream: 1, seq: 0 }));
        let (new, new_bytes) = block(1, 9);
        let mut buf = [0u8; 16];
        assert!(!cache.read(&new, &mut buf), "same block, other digest: a miss");
        assert!(cache.insert(&new, &new_bytes, Holder { stream: 2, seq: 0 }));
        assert!(cache.read(&new, &mut buf) && buf == [9; 16]);
        assert_eq!((cache.used(), cache.held_by(1), cache.held_by(2)), (16, 0, 16));
    }

    #[test]
    fn two_streams_share_a_block_and_each_release_only_their_own() {
        let cache = BlockCache::new(64);
        let (a, bytes) = block(4, 4);
        assert!(cache.insert(&a, &bytes, Holder { stream: 1, seq: 3 }));
        assert!(cache.hold(&a, Holder { stream: 2, seq: 1 }));
        assert_eq!(cache.release(1, None), 0, "still held by stream 2");
        let mut buf = [0u8; 16];
        assert!(cache.read(&a, &mut buf));
        assert_eq!(cache.release(2, Some(1)), 16);
        assert_eq!(cache.used(), 0);
    }
}
