//! The nasd object store: partitions of variable-length objects on one block
//! file, with a stored BLAKE3 digest beside every block.
//!
//! # Design
//!
//! - **Blocks.** Object data lives in fixed-size blocks of `blocks.dat`. Each
//!   object maps logical block numbers to physical blocks; unmapped blocks are
//!   holes and read as zeros, with no disk read. A block a write leaves all
//!   zeros is a hole too: it takes no block and no quota. Bytes of a stored
//!   block at or past the object's `logical_size` are always zero.
//! - **Space.** A new block is a freed one before the file grows, and a
//!   freed block's bytes go back to the file system (a punched hole) before
//!   it is reused, so `blocks.dat` occupies what the store holds (`space.rs`).
//! - **Copy on write, always.** A write never changes a block in place: every
//!   block it touches is assembled in memory, digested, written to a newly
//!   allocated block, and the whole write is installed in the in-memory index
//!   at once at the end. A failed or interrupted write changes nothing, and
//!   `fastcopy` shares blocks by reference count.
//! - **Durability.** The index and attributes are persisted by [`Store::commit`]:
//!   `fdatasync(blocks.dat)`, then one SQLite transaction (WAL, synchronous=FULL).
//!   A block freed in memory is reused only after a commit that no longer
//!   references it (and once no read has it pinned), so the durable index
//!   only ever points at blocks whose bytes are durable and match their
//!   stored digests — after any crash.
//! - **Concurrency.** Changes to one object are ordered by a striped
//!   reader-writer lock, held only for in-memory work and disk I/O, never
//!   while waiting for a caller's data: a write streams its data into new
//!   blocks without it and takes it to plan and to install (where it checks
//!   again what it must find, [`WriteCheck`], and merges any block it covers
//!   in part with a write that installed meanwhile); a read takes its view of
//!   the block map under the metadata mutex and **pins** the blocks it will
//!   read, so they are not reused until it is done, instead of holding any
//!   lock while its caller sends the data on. Metadata is one mutex held only
//!   for in-memory updates, never across I/O.
//!
//! The store knows nothing about sockets, tokio or the wire protocol's frames.
//!
//! # A drive directory
//!
//! | file | contents |
//! |---|---|
//! | `LOCK` | held with an exclusive file lock while a process has the store open |
//! | `blocks.dat` | fixed-size blocks by physical block number; a sparse file |
//! | `meta.sqlite` (+ `-wal`) | the index, attributes, partitions, transactions and undo, PALs, and the drive's settings (keys, identity keys, minimum protections, authorization schemes, written durably by [`Store::put_settings`]); tables in `db.rs` |
//! | `audit.sqlite` | the drive's audit trail (written by `nasd-drive`, not the store) |
//! | `master.key` | the master key file `nasd drive` creates (0600) when none is given |
//! | `capacity` | the capacity in bytes `nasd drive` was given, or took from the free disk, at its first start; every start refuses a capacity the disk cannot back unless forced (`nasd-cli`) |
//! | `drive.key` | `nasd up` only: the drive key its manager set, for `nasd audit` and `nasd scrub --drive` (0600) |
//!
//! # Commit protocol
//!
//! [`Store::commit`]: snapshot the dirty metadata under the metadata lock →
//! `fdatasync(blocks.dat)` → one SQLite transaction (WAL,
//! `synchronous=FULL`) → release to the allocator the blocks the previous
//! durable index referenced and the new one does not. It assumes that
//! `fdatasync` returning means the data is durable, and that SQLite's commit
//! is atomic and durable as documented.
//! - A crash before the transaction commits: the old index is durable and
//!   the blocks it references were never overwritten (writes go to fresh
//!   blocks only); new blocks are unreferenced and free at open.
//! - A crash after it: every block the new index references was written
//!   before the `fdatasync`, so its bytes match its stored digest.
//! - A failed `fdatasync` or transaction sets `failed`: the store refuses
//!   every further change until restarted (no retry of a sync that may have
//!   dropped pages).
//!
//! Free space is not persisted: at open every block the index or an undo row
//! references is in use, every other is free (pins live in memory only).
//! Object identifiers are never reused: a partition's high-water mark is
//! raised durably, in a transaction of its own, before identifiers below it
//! are handed out.
//!
//! **Invariants:** a block referenced by the durable index or a durable undo
//! row is never written; a pinned block is never reused (a block freed while
//! a read pins it waits in `Meta::pinned_free` until its last pin goes); the
//! allocator holds exactly the blocks no index, undo entry, durable index
//! (until the next commit) or pin holds and whose bytes were punched; stored
//! bytes at or past an object's `logical_size` are zero (truncation rewrites
//! the tail block), so extending an object exposes zeros.
//!
//! # Writes and reads
//!
//! Changes to one object are ordered by a striped reader-writer lock
//! (`LOCK_STRIPES`): writes, truncation, attribute changes, transactions and
//! removal take it exclusive; fastcopy and scrub's re-check shared;
//! partition removal and `INITIALIZE` take every stripe. A write
//! ([`Store::write_checked`]) takes its object's lock twice. To **plan**: it
//! checks its [`WriteCheck`], charges the quota and counts its blocks in
//! flight. Then it streams its data into freshly allocated blocks with no
//! lock held; a block it covers only in part is filled from the object's
//! current block (pinned while read) and remembered as that block's base. To
//! **install**: the object must still be the one planned for (its
//! partition's incarnation), pass its `WriteCheck` again — the append
//! condition, the access control version the drive passes (a revocation
//! answered first refuses it with `ACCESS_REVOKED`), the PAL stamp — and fit
//! the quota as the object is now; a block covered in part whose mapping is
//! no longer its base is merged again (disk I/O under the lock, never network
//! I/O); then the new blocks enter the index in one critical section of the
//! metadata lock. So writes to one object take effect in the order they
//! install, and a write that fails any of this changes nothing.
//!
//! A read ([`Store::read_with`]) takes no object lock: it takes the object's
//! size and a batch of its block map ([`READ_BATCH_BLOCKS`] references) in
//! one critical section, pins the batch's blocks, hands them to its
//! [`DataSink`] (which may wait on the network), unpins them and takes the
//! next batch. A read of at most one batch is one consistent view; a longer
//! one is consistent batch by batch. A read whose object goes away between
//! batches fails with `NO_SUCH_OBJECT`. `DataSink::unit` passes the stored
//! digest of each whole block; a sink that finds a block does not match it
//! returns `nasd_crypto::StoredDigestMismatch`, reported as
//! `DATA_CORRUPTED`.
//!
//! **Memory per request.** A read holds one batch of its block map (≈ 80
//! bytes a block, pins included), whatever its size. A write's plan maps
//! every block it writes until it installs them all at once (what makes it
//! atomic): ≈ 93 bytes a block (≈ 1.5 MiB per GiB at 64 KiB blocks), plus
//! at most two partial blocks per region; a re-merge holds two blocks.
//!
//! **Quotas.** A partition is charged for the distinct physical blocks its
//! objects reference (in their maps or in the undo of their open
//! transactions), plus reservations not yet backed by blocks, plus blocks
//! promised to writes in progress. A write computes its charge before it
//! reads any data and again as it installs, and fails with `QUOTA_EXCEEDED`
//! changing nothing. `blocks_used` splits each block shared by copy-on-write
//! clones evenly among them.
//!
//! Also here: [`Store::scrub`] re-reads every stored block once against its
//! digest (in batches of [`SCRUB_BATCH_BLOCKS`]); [`Store::append`] refuses
//! a region that does not start at or past the object's end, checked as the
//! write installs; [`Store::extents`] lists stored ranges (`EXTENTS`, at most
//! [`EXTENTS_SCAN_BLOCKS_MAX`] references walked per call).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod alloc;
mod cache;
mod db;
mod error;
mod pal;

pub use cache::{BlockCache, Holder, Prefetched, PREFETCH_CACHE_BYTES_DEFAULT};
pub use error::StoreError;
pub use pal::{PalStamp, PalView};

use alloc::Allocator;
use nasd_crypto::{block_digest, ct_eq, BlockDigest};
use nasd_env::{DirLock, DiskFile, Env};
use nasd_proto::limits::{DIGESTS_MAX, OBJECT_SIZE_MAX, PARTITIONS_MAX};
use nasd_proto::well_known::*;
use nasd_proto::{
    validate_regions, AttrMask, Attributes, DriveControl, ObjectPal, Pal, PartitionControl, PartitionInfo, Region,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

/// Smallest and largest supported block sizes (protocol limits).
pub use nasd_proto::limits::{BLOCK_SIZE_MAX, BLOCK_SIZE_MIN};
/// Default block size (chosen by measurement, see docs/BENCHMARKS.md).
pub const BLOCK_SIZE_DEFAULT: u32 = 64 * 1024;
/// Most objects one partition may hold (bounds the in-memory index).
pub const OBJECTS_PER_PARTITION_MAX: u64 = 1 << 24;
/// Block references a read takes from an object's block map at a time, and
/// pins (one metadata-lock hold, 56 bytes each plus a pin count): a read's
/// metadata memory is this many references whatever its size (up to
/// `DATA_LEN_MAX`), and a read of at most this many stored blocks sees one
/// consistent view of its object.
pub const READ_BATCH_BLOCKS: usize = 1024;
/// Block references, and objects, `scrub` visits per metadata-lock hold (64
/// bytes each).
pub const SCRUB_BATCH_BLOCKS: usize = 1024;
/// Block references one [`Store::extents`] walks (one metadata-lock hold of
/// some 100 µs, no allocation beyond the extents listed): an object with
/// more mapped blocks past the offset is listed over several calls.
pub const EXTENTS_SCAN_BLOCKS_MAX: usize = 16 * 1024;
/// Memory an open write transaction holds per logical block it changed, at
/// most: its undo entry (a B-tree entry of a block number and an optional
/// 40-byte block reference) and the reference count of the block it keeps.
/// Measured in `tests/txn_memory.rs`; see `txn.rs`.
pub const TXN_UNDO_BYTES_PER_BLOCK: usize = 160;
/// Object identifiers reserved durably at a time; a crash skips at most this many.
const ID_RESERVE_BATCH: u64 = 1024;
/// Number of object lock stripes.
const LOCK_STRIPES: usize = 1024;

const _: () = assert!(BLOCK_SIZE_MIN <= BLOCK_SIZE_DEFAULT && BLOCK_SIZE_DEFAULT <= BLOCK_SIZE_MAX);

/// Where a logical block is stored and the digest of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRef {
    /// Physical block number in `blocks.dat`.
    pub phys: u64,
    /// BLAKE3 of the block's `block_size` bytes.
    pub digest: BlockDigest,
}

/// How to open or create a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Block size for a new store (an existing store keeps its own).
    pub block_size: u32,
    /// Bytes of block storage the drive may use.
    pub capacity_bytes: u64,
    /// Check every block read against its stored digest.
    pub verify_reads: bool,
    /// Extension names advertised in the drive-control object.
    pub extensions: Vec<String>,
    /// Bytes the prefetch cache may hold ([`BlockCache`]; 0: none).
    pub prefetch_cache_bytes: u64,
    /// Emulated media seek (a benchmark aid): every block read from
    /// `blocks.dat` that the kernel's page cache does not hold waits this
    /// long first, one read at a time, as on one disk arm. None: none.
    pub media_seek: Option<std::time::Duration>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            block_size: BLOCK_SIZE_DEFAULT,
            capacity_bytes: 64 << 30,
            verify_reads: true,
            extensions: Vec::new(),
            prefetch_cache_bytes: PREFETCH_CACHE_BYTES_DEFAULT,
            media_seek: None,
        }
    }
}

/// What a write must still find when it installs its data, checked under
/// the object's lock with the install (and once when it is planned, so a
/// write that cannot land is refused before its data streams). A failed
/// check changes nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCheck {
    /// Every region starts at or past the object's end (the `APPEND`
    /// right): otherwise [`StoreError::NotAnAppend`].
    pub append_only: bool,
    /// The object's `access_control_version` is this one (the capability's):
    /// otherwise [`StoreError::AccessRevoked`]. None: not checked.
    pub access_control_version: Option<u64>,
    /// The object's access PAL, its collection and that collection's super
    /// PAL are those a request by identity was authorized against
    /// ([`Store::pal_view`]): otherwise [`StoreError::PalChanged`]. None:
    /// not checked.
    pub pal: Option<PalStamp>,
}

/// Supplies a write's data, in order. `fill` must fill `buf` completely.
pub trait DataSource {
    /// Fills `buf` with the next bytes of the write's data.
    fn fill(&mut self, buf: &mut [u8]) -> std::io::Result<()>;
}

/// Receives a read's results: first the per-region lengths, then the bytes.
pub trait DataSink {
    /// Called once, before any data, with the bytes each region will return.
    fn start(&mut self, lengths: &[u64]) -> std::io::Result<()>;
    /// Called with the data, in order.
    fn data(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    /// Called instead of [`DataSink::data`] for each unit of a read (one
    /// region's bytes within one block), with the block's stored digest when
    /// the unit is the whole block. The default forwards to `data`.
    ///
    /// A sink that hashes a whole block itself and finds that its bytes do
    /// not match `stored_digest` returns an error wrapping
    /// [`nasd_crypto::StoredDigestMismatch`]: the store then fails the read
    /// with [`StoreError::DataCorrupted`] for that block (and logs it).
    fn unit(&mut self, bytes: &[u8], stored_digest: Option<&BlockDigest>) -> std::io::Result<()> {
        let _ = stored_digest;
        self.data(bytes)
    }
}

/// A [`DataSource`] over a byte slice (tests and small writes).
impl DataSource for &[u8] {
    fn fill(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        if self.len() < buf.len() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "write data ended early"));
        }
        let (head, tail) = self.split_at(buf.len());
        buf.copy_from_slice(head);
        *self = tail;
        Ok(())
    }
}

/// A [`DataSink`] that collects into memory (tests and small reads).
#[derive(Debug, Default)]
pub struct VecSink {
    /// Per-region lengths.
    pub lengths: Vec<u64>,
    /// The bytes.
    pub data: Vec<u8>,
}

impl DataSink for VecSink {
    fn start(&mut self, lengths: &[u64]) -> std::io::Result<()> {
        self.lengths = lengths.to_vec();
        Ok(())
    }
    fn data(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.data.extend_from_slice(bytes);
        Ok(())
    }
}

/// What [`Store::scrub`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Physical blocks read and checked.
    pub blocks_checked: u64,
    /// Blocks whose bytes no longer match their stored digest.
    pub corrupt: Vec<CorruptBlock>,
}

/// A block that failed its digest (one object that maps it is named).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CorruptBlock {
    /// Partition.
    pub partition: u64,
    /// Object.
    pub object: u64,
    /// Logical block number.
    pub block: u64,
}

/// Drive-wide figures for `inquiry`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreInfo {
    /// The drive's unique name.
    pub drive_id: [u8; 16],
    /// Bytes per block.
    pub block_size: u32,
    /// Bytes of block storage.
    pub capacity_bytes: u64,
    /// Bytes of block storage in use (including blocks awaiting release).
    pub used_bytes: u64,
    /// Every partition.
    pub partitions: Vec<PartitionInfo>,
}

#[derive(Debug)]
struct Object {
    attrs: Attributes,
    /// Blocks reserved by `setattr(blocks_allocated)`.
    reserved: u64,
    blocks: BTreeMap<u64, BlockRef>,
    /// The write transaction open on the object, if any.
    txn: Option<Box<Txn>>,
    /// The object's security attribute (access PAL and PAL collection), if
    /// it has one; never an empty one.
    pal: Option<Arc<ObjectPal>>,
    /// Changes whenever `pal` is set (`Meta::next_pal_stamp`); 0 for an
    /// object whose PAL was never set.
    pal_stamp: u64,
}

/// An open write transaction on one object (`txn.rs`): enough to put the object's data and length back as they
/// were when it began.
#[derive(Debug)]
struct Txn {
    /// The identifier `txn_begin` named (never 0).
    id: u64,
    /// Drive clock when it began.
    begun_ns: u64,
    /// The object's `logical_size` when it began.
    old_size: u64,
    /// Logical block → its mapping before the transaction first changed it
    /// (None: a hole). Each held block keeps the reference the index had
    /// (it stays counted in `refcount`, so it is neither released nor
    /// reused) until the transaction ends. An entry `None` whose block is a
    /// hole again is dropped: every entry holds a charged block, here or in
    /// the index, so undo is bounded by the quota.
    undo: BTreeMap<u64, Option<BlockRef>>,
}

impl Object {
    fn slack(&self) -> u64 {
        self.reserved.saturating_sub(self.blocks.len() as u64)
    }
}

#[derive(Debug)]
struct Partition {
    quota_bytes: u64,
    objects: BTreeMap<u64, Object>,
    next_id: u64,
    high_water: u64,
    /// Distinct physical blocks referenced by the partition's objects.
    physical_blocks: u64,
    /// Reserved but unmapped blocks, summed over objects.
    slack_blocks: u64,
    /// Blocks promised to writes in progress.
    inflight_blocks: u64,
    /// Objects with an open write transaction (for `txn_list`).
    txn_objects: BTreeSet<u64>,
    /// Which partition this is among all that had its number since the
    /// store opened (`Meta::incarnations`): a write or read that outlives
    /// a partition's removal must not touch a new one of the same number.
    incarnation: u64,
    /// PAL collection → its super PAL and the stamp of its last change
    /// (at most `PAL_COLLECTIONS_MAX`; never an empty one).
    collections: BTreeMap<u64, (Arc<Pal>, u64)>,
}

impl Partition {
    fn charged_blocks(&self) -> u64 {
        self.physical_blocks + self.slack_blocks + self.inflight_blocks
    }
}

#[derive(Debug, Default)]
struct DirtyObject {
    /// Every block row is rewritten (new or cloned object).
    replaced: bool,
    blocks: BTreeSet<u64>,
    /// The transaction began or ended: its row and every undo row are rewritten.
    txn: bool,
    /// Undo entries added or dropped.
    undo: BTreeSet<u64>,
    /// The security attribute (PAL) was set: its row is rewritten.
    pal: bool,
}

#[derive(Debug, Default)]
struct Dirty {
    drive: bool,
    removed_partitions: BTreeSet<u64>,
    partitions: BTreeSet<u64>,
    removed_objects: BTreeSet<(u64, u64)>,
    objects: HashMap<(u64, u64), DirtyObject>,
    /// (partition, collection) whose super PAL changed.
    collections: BTreeSet<(u64, u64)>,
}

#[derive(Debug)]
struct Meta {
    partitions: BTreeMap<u64, Partition>,
    refcount: HashMap<u64, u32>,
    alloc: Allocator,
    /// Blocks allocated since the last commit snapshot: not in any durable index.
    fresh: HashSet<u64>,
    /// Blocks no longer referenced that a durable index may still reference.
    pending_free: Vec<u64>,
    /// Blocks readers have pinned (read in progress without the object's
    /// lock), with their pin counts. A pinned block is not reused: freeing
    /// it (`Meta::free_block`) only parks it in `pinned_free`.
    pins: HashMap<u64, u32>,
    /// Free blocks still pinned: returned to the allocator when their last
    /// pin goes. Each is in `pins`, referenced by no index and no undo.
    pinned_free: HashSet<u64>,
    /// Blocks free again — no index, undo entry, durable index or pin holds
    /// them — whose bytes the file system still holds: given back to it
    /// (`Store::punch_freed`) before they go to the allocator, so a punch
    /// never lands on a block that was reused.
    to_punch: Vec<u64>,
    /// Blocks a `Store::punch_freed` took from `to_punch` and has not yet
    /// handed to the allocator.
    punching: u64,
    /// Partitions created or loaded so far (the next `Partition::incarnation`).
    incarnations: u64,
    /// The last PAL stamp handed out (`Meta::next_pal_stamp`): stamps are
    /// never reused while the store is open.
    pal_stamps: u64,
    dirty: Dirty,
}

/// The object store of one drive. Thread-safe; every method blocks on disk I/O.
pub struct Store {
    /// Where the store's clock, randomness and files come from.
    env: Env,
    dir: PathBuf,
    block_size: u32,
    capacity_bytes: u64,
    verify_reads: bool,
    extensions: Vec<String>,
    drive_id: [u8; 16],
    data: DiskFile,
    db: Mutex<rusqlite::Connection>,
    meta: Mutex<Meta>,
    commit_lock: Mutex<()>,
    stripes: Box<[RwLock<()>]>,
    failed: AtomicBool,
    /// Drive clock minus system clock, ns (set by `initialize`; read on every request).
    clock_offset_ns: AtomicI64,
    /// Allowed nonce skew, ns.
    clock_skew_ns: AtomicU64,
    /// [`Store::nonce_now_ns`]'s last reading, and when it was taken
    /// (tokio's monotonic clock: simulated time in a simulation).
    nonce_clock: Mutex<(u64, tokio::time::Instant)>,
    /// BLAKE3 of a block of zeros: the digest of a hole.
    zero_digest: BlockDigest,
    /// One `Store::punch_freed` at a time: a writer that finds no free
    /// block waits here for blocks being punched.
    punch_lock: Mutex<()>,
    /// Whether the file system under `blocks.dat` punches holes (cleared,
    /// with one warning, the first time it says it cannot).
    punch_holes: AtomicBool,
    /// Blocks read ahead for prefetch streams.
    cache: BlockCache,
    /// Emulated media seek, and the one arm that serves them in turn.
    media_seek: Option<(std::time::Duration, Mutex<()>)>,
    _dir_lock: DirLock,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("dir", &self.dir).field("block_size", &self.block_size).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock means a thread panicked mid-update: fail-stop.
    m.lock().expect("store mutex poisoned: a previous panic left state inconsistent")
}

fn is_control(object: u64) -> bool {
    matches!(object, DRIVE_CONTROL | PARTITION_CONTROL | PARTITION_CONTENTS)
}

impl Store {
    /// Opens the store in `dir`, creating it if empty. Fails if another process
    /// has it open.
    pub fn open(dir: &Path, opts: &StoreOptions) -> Result<Store, StoreError> {
        Self::open_in(&Env::real(), dir, opts)
    }

    /// [`Store::open`] in `env`: the store's clock, randomness and files
    /// (the lock file, `blocks.dat`, `meta.sqlite`) are the environment's.
    pub fn open_in(env: &Env, dir: &Path, opts: &StoreOptions) -> Result<Store, StoreError> {
        env.create_dir_all(dir)?;
        let dir_lock = env.lock_file(&dir.join("LOCK")).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => StoreError::Locked(dir.display().to_string()),
            _ => StoreError::Io(e),
        })?;
        let mut conn = db::open(env, &dir.join("meta.sqlite"))?;
        let (drive_id, block_size, offset, skew) = Self::load_or_format(env, &mut conn, opts)?;
        let capacity_blocks = opts.capacity_bytes / block_size as u64;
        let data = env.open_file(&dir.join("blocks.dat"), true)?;
        // fdatasync(blocks.dat) does not make its directory entry durable: sync
        // the directory, or a power loss could lose a new blocks.dat that the
        // committed index already points into.
        env.sync_dir(dir)?;
        let meta = Self::load_meta(&conn, block_size, capacity_blocks)?;
        let store = Store {
            env: env.clone(),
            dir: dir.to_path_buf(),
            block_size,
            capacity_bytes: capacity_blocks * block_size as u64,
            verify_reads: opts.verify_reads,
            extensions: Self::extensions_of(opts),
            drive_id,
            data,
            db: Mutex::new(conn),
            meta: Mutex::new(meta),
            commit_lock: Mutex::new(()),
            stripes: (0..LOCK_STRIPES).map(|_| RwLock::new(())).collect(),
            failed: AtomicBool::new(false),
            clock_offset_ns: AtomicI64::new(offset),
            clock_skew_ns: AtomicU64::new(skew),
            nonce_clock: Mutex::new((0, tokio::time::Instant::now())),
            zero_digest: nasd_crypto::zero_block_digest(block_size as usize),
            punch_lock: Mutex::new(()),
            punch_holes: AtomicBool::new(true),
            cache: BlockCache::new(opts.prefetch_cache_bytes),
            media_seek: opts.media_seek.map(|d| (d, Mutex::new(()))),
            _dir_lock: dir_lock,
        };
        store.give_back_free_space()?;
        tracing::info!(dir = %dir.display(), block_size, capacity_bytes = store.capacity_bytes, "store opened");
        Ok(store)
    }

    /// The extensions the drive-control object lists: those asked for, and
    /// `prefetch-v1` with a prefetch cache.
    fn extensions_of(opts: &StoreOptions) -> Vec<String> {
        let mut names = opts.extensions.clone();
        let prefetch = nasd_proto::extension::PREFETCH;
        if opts.prefetch_cache_bytes > 0 && !names.iter().any(|n| n == prefetch) {
            names.push(prefetch.into());
        }
        names
    }

    /// Reads `buf` from `blocks.dat` at `offset`. With an emulated media
    /// seek ([`StoreOptions::media_seek`]), a read the kernel's page cache
    /// cannot answer first waits the seek, one at a time.
    pub(crate) fn read_media(&self, buf: &mut [u8], offset: u64) -> Result<(), StoreError> {
        if let Some((seek, arm)) = &self.media_seek {
            if self.data.read_cached_at(buf, offset) {
                return Ok(());
            }
            let _one_at_a_time = lock(arm);
            std::thread::sleep(*seek);
        }
        self.data.read_exact_at(buf, offset)?;
        Ok(())
    }

    /// The extensions the drive-control object lists.
    pub fn extensions(&self) -> &[String] {
        &self.extensions
    }

    fn load_or_format(
        env: &Env,
        conn: &mut rusqlite::Connection,
        opts: &StoreOptions,
    ) -> Result<([u8; 16], u32, i64, u64), StoreError> {
        let get_u64 = |conn: &rusqlite::Connection, k| -> Result<Option<u64>, StoreError> {
            match db::get_drive_value(conn, k)? {
                None => Ok(None),
                Some(v) => Ok(Some(u64::from_le_bytes(
                    v.try_into().map_err(|_| StoreError::Corrupt(format!("drive value {k}")))?,
                ))),
            }
        };
        match get_u64(conn, "format_version")? {
            Some(v) if v as i64 == db::FORMAT_VERSION => {}
            Some(v) if v >= 1 && (v as i64) < db::FORMAT_VERSION => {
                tracing::info!(from = v, to = db::FORMAT_VERSION, "migrating the store's format");
                db::migrate(conn, v as i64)?;
            }
            Some(v) => return Err(StoreError::Corrupt(format!("format version {v} is not supported"))),
            None => {
                let bs = opts.block_size;
                if !(BLOCK_SIZE_MIN..=BLOCK_SIZE_MAX).contains(&bs) || !bs.is_power_of_two() {
                    return Err(StoreError::BadArgument("block size must be a power of two in 4 KiB..=1 MiB"));
                }
                let mut id = [0u8; 16];
                env.fill_random(&mut id);
                let tx = conn.transaction()?;
                db::put_drive_value(&tx, "drive_id", &id)?;
                db::put_drive_value(&tx, "block_size", &(bs as u64).to_le_bytes())?;
                db::put_drive_value(&tx, "clock_offset_ns", &0u64.to_le_bytes())?;
                db::put_drive_value(&tx, "clock_skew_ns", &DEFAULT_SKEW_NS.to_le_bytes())?;
                db::put_drive_value(&tx, "format_version", &(db::FORMAT_VERSION as u64).to_le_bytes())?;
                tx.commit()?;
            }
        }
        let id = db::get_drive_value(conn, "drive_id")?
            .and_then(|v| <[u8; 16]>::try_from(v).ok())
            .ok_or_else(|| StoreError::Corrupt("drive id".into()))?;
        let bs = get_u64(conn, "block_size")?.ok_or_else(|| StoreError::Corrupt("block size".into()))? as u32;
        let offset = get_u64(conn, "clock_offset_ns")?.unwrap_or(0) as i64;
        let skew = get_u64(conn, "clock_skew_ns")?.unwrap_or(DEFAULT_SKEW_NS);
        Ok((id, bs, offset, skew))
    }

    fn load_meta(conn: &rusqlite::Connection, block_size: u32, capacity_blocks: u64) -> Result<Meta, StoreError> {
        let mut partitions = BTreeMap::new();
        let mut incarnations = 0;
        for p in db::load_partitions(conn)? {
            let next_id = p.id_high_water.max(FIRST_USER_OBJECT);
            incarnations += 1;
            partitions.insert(
                p.id,
                Partition {
                    quota_bytes: p.quota_bytes,
                    objects: BTreeMap::new(),
                    next_id,
                    high_water: next_id,
                    physical_blocks: 0,
                    slack_blocks: 0,
                    inflight_blocks: 0,
                    txn_objects: BTreeSet::new(),
                    incarnation: incarnations,
                    collections: BTreeMap::new(),
                },
            );
        }
        for o in db::load_objects(conn)? {
            let part = partitions
                .get_mut(&o.partition)
                .ok_or_else(|| StoreError::Corrupt(format!("object {} in missing partition {}", o.id, o.partition)))?;
            let mut attrs = o.attrs;
            attrs.block_size = block_size;
            let obj = Object {
                attrs,
                reserved: o.reserved_blocks,
                blocks: BTreeMap::new(),
                txn: None,
                pal: None,
                pal_stamp: 0,
            };
            part.objects.insert(o.id, obj);
        }
        let mut refcount: HashMap<u64, u32> = HashMap::new();
        // Every reference counts, the index's and the undo's alike: a block
        // either holds is in use (and charged), whatever crashed.
        let mut reference = |part: &mut Partition, r: &BlockRef| -> Result<(), StoreError> {
            if r.phys >= capacity_blocks {
                return Err(StoreError::Corrupt(format!("block {} beyond capacity; was capacity lowered?", r.phys)));
            }
            let c = refcount.entry(r.phys).or_insert(0);
            if *c == 0 {
                part.physical_blocks += 1;
            }
            *c += 1;
            Ok(())
        };
        let missing = |what: &str| StoreError::Corrupt(what.into());
        db::load_blocks(conn, |p, o, l, r| {
            let part = partitions.get_mut(&p).ok_or_else(|| missing("block of missing partition"))?;
            reference(part, &r)?;
            part.objects.get_mut(&o).ok_or_else(|| missing("block of missing object"))?.blocks.insert(l, r);
            Ok(())
        })?;
        for t in db::load_txns(conn)? {
            let part = partitions.get_mut(&t.partition).ok_or_else(|| missing("transaction of missing partition"))?;
            let obj = part.objects.get_mut(&t.object).ok_or_else(|| missing("transaction of missing object"))?;
            obj.txn =
                Some(Box::new(Txn { id: t.txn, begun_ns: t.begun_ns, old_size: t.old_size, undo: BTreeMap::new() }));
            part.txn_objects.insert(t.object);
        }
        db::load_undo(conn, |p, o, l, r| {
            let part = partitions.get_mut(&p).ok_or_else(|| missing("undo of missing partition"))?;
            if let Some(r) = &r {
                reference(part, r)?;
            }
            let obj = part.objects.get_mut(&o).ok_or_else(|| missing("undo of missing object"))?;
            obj.txn.as_mut().ok_or_else(|| missing("undo of an object without a transaction"))?.undo.insert(l, r);
            Ok(())
        })?;
        let mut pal_stamps = 0;
        for (p, o, pal) in db::load_pals(conn)? {
            let part = partitions.get_mut(&p).ok_or_else(|| missing("PAL of missing partition"))?;
            let obj = part.objects.get_mut(&o).ok_or_else(|| missing("PAL of missing object"))?;
            pal_stamps += 1;
            (obj.pal, obj.pal_stamp) = (Some(Arc::new(pal)), pal_stamps);
        }
        for (p, c, pal) in db::load_collections(conn)? {
            let part = partitions.get_mut(&p).ok_or_else(|| missing("super PAL of missing partition"))?;
            pal_stamps += 1;
            part.collections.insert(c, (Arc::new(pal), pal_stamps));
        }
        for part in partitions.values_mut() {
            part.slack_blocks = part.objects.values().map(Object::slack).sum();
        }
        let mut used: Vec<u64> = refcount.keys().copied().collect();
        used.sort_unstable();
        Ok(Meta {
            partitions,
            refcount,
            alloc: Allocator::new(capacity_blocks, &used),
            fresh: HashSet::new(),
            pending_free: Vec::new(),
            pins: HashMap::new(),
            pinned_free: HashSet::new(),
            to_punch: Vec::new(),
            punching: 0,
            incarnations,
            pal_stamps,
            dirty: Dirty::default(),
        })
    }

    /// True if reads check every block against its stored digest.
    pub fn verifies_reads(&self) -> bool {
        self.verify_reads
    }

    /// The environment the store runs in (its clock, randomness and disk):
    /// the drive serving it runs in the same one.
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The drive's unique name.
    pub fn drive_id(&self) -> [u8; 16] {
        self.drive_id
    }

    /// The drive clock, nanoseconds since the Unix epoch.
    pub fn now_ns(&self) -> u64 {
        let offset = self.clock_offset_ns.load(Ordering::Relaxed);
        (self.env.now_ns() as i128 + offset as i128).clamp(0, u64::MAX as i128) as u64
    }

    /// The drive clock as nonces see it (the freshness window, the replay
    /// cache, the nonces of replies, which teach clients the drive's
    /// clock): [`Store::now_ns`], except that it never steps back. When the
    /// clock steps back (an operator, NTP, `SET_CLOCK`), this one runs on
    /// from its last reading at the monotonic clock's pace, ahead of the
    /// wall clock by the step. Two things need it: the replay cache forgets
    /// nonces below the window, so a window moving back would accept a
    /// forgotten nonce again (a replay); and a drive refuses nonces from
    /// before its start, so a clock stepped back past the start would
    /// refuse every request until it caught up (nasd-sim seed 2860).
    pub fn nonce_now_ns(&self) -> u64 {
        let wall = self.now_ns();
        let at = tokio::time::Instant::now();
        let mut clock = lock(&self.nonce_clock);
        let (last, then) = *clock;
        let ran_on = last.saturating_add(at.saturating_duration_since(then).as_nanos().min(u64::MAX as u128) as u64);
        let now = wall.max(ran_on);
        *clock = (now, at);
        now
    }

    /// Allowed clock skew for nonces, nanoseconds.
    pub fn clock_skew_ns(&self) -> u64 {
        self.clock_skew_ns.load(Ordering::Relaxed)
    }

    fn check_healthy(&self) -> Result<(), StoreError> {
        if self.failed.load(Ordering::Acquire) {
            Err(StoreError::Failed)
        } else {
            Ok(())
        }
    }

    fn stripe(&self, partition: u64, object: u64) -> &RwLock<()> {
        let h = partition.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ object.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        &self.stripes[(h >> 32) as usize % LOCK_STRIPES]
    }

    fn lock_all(&self) -> Vec<std::sync::RwLockWriteGuard<'_, ()>> {
        self.stripes.iter().map(|s| s.write().expect("object lock poisoned")).collect()
    }

    fn bs(&self) -> u64 {
        self.block_size as u64
    }
}

/// Default allowed skew between a client's nonce clock and the drive's.
pub const DEFAULT_SKEW_NS: u64 = 5_000_000_000;

mod ops;
mod space;
#[cfg(test)]
mod tests;
mod txn;
