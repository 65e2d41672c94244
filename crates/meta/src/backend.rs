//! The backend boundary: row operations inside one transaction.
//!
//! **API Boundary:** a backend stores rows and knows nothing about POSIX.
//! Every rule (permissions, link counts, rename, object bookkeeping) lives in
//! [`crate::Namespace`], written once over these traits. [`Txn`] has no
//! SQLite-isms: `Sqlite` and `Postgres` pass the same conformance suite
//! (`tests/conformance.rs`, `tests/postgres.rs`).
//!
//! **Attempts and retries.** [`Backend::attempt`] runs a closure once in
//! one transaction (read-write or read-only, [`Access`]) and says how it
//! ended: `Ok`, or a [`TxnError`] — `Conflict` (a serialization failure or
//! deadlock; nothing committed), `Abort(status)` (the closure's own error;
//! rolled back), `Unavailable` (the server could not be reached; nothing
//! committed: the manager answers `METADATA_UNAVAILABLE`) or `Storage` (the
//! backend failed; at commit, the outcome is unknown). `transact`/`read`
//! (and `try_transact`/`try_read`, which keep the `TxnError`) run the closure
//! again after a conflict, at most [`TXN_ATTEMPTS_MAX`] times, waiting a
//! random part of a backoff from [`TXN_BACKOFF_MIN`] doubling to
//! [`TXN_BACKOFF_MAX`]; a conflict still there is `BUSY`. Aborts and
//! storage failures are never retried. So a closure is `FnMut` and acts only
//! through its `Txn`: what it did outside would be done twice. SQLite never
//! conflicts (one connection behind a mutex).

use crate::types::{AcvIntent, DirEntry, DriveRecord, Inode, Intent, Lease, Quota, QuotaSubject, StaleRange, User};
use nasd_proto::acl::AclEntry;
use nasd_proto::fs::{FsStatus, Ino, ObjectRef};
use nasd_proto::layout::Component;
use std::time::Duration;

/// What a recorded PAL push is for ([`Txn::pal_pending_put`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PalPush {
    /// A file's access PAL, on each of its components.
    File,
    /// A PAL collection's super PAL, on every drive.
    Collection,
}

impl PalPush {
    /// The table its records live in.
    pub(crate) fn table(self) -> &'static str {
        match self {
            PalPush::File => "pal_pending",
            PalPush::Collection => "collection_pending",
        }
    }
}

/// Row-level access inside one transaction. Backends implement this.
///
/// Every method reports a storage failure as [`FsStatus::Internal`] (after
/// logging the cause). Methods that write assume the caller checked what
/// POSIX requires; a backend may still refuse a write that breaks one of its
/// constraints (a duplicate key, a dangling reference) with `Internal`.
/// Integers are stored bit-for-bit (a `u64` may be kept as a signed 64-bit
/// column).
pub trait Txn {
    /// Reads an inode with its components (in component order).
    fn get_inode(&mut self, ino: Ino) -> Result<Option<Inode>, FsStatus>;
    /// Inserts or replaces an inode's row (keyed by `attr.ino`): attributes,
    /// target, layout and acv. `inode.components` is **not** written here:
    /// components are rows of their own ([`Txn::put_component`]).
    fn put_inode(&mut self, inode: &Inode) -> Result<(), FsStatus>;
    /// Deletes an inode, its parent pointer, its extended attributes and its ACL entries. No entry, component, stale
    /// range or write intent may still name it.
    fn delete_inode(&mut self, ino: Ino) -> Result<(), FsStatus>;
    /// Hands out the next inode number (never reused, never [`crate::ROOT_INO`]).
    fn alloc_ino(&mut self) -> Result<Ino, FsStatus>;
    /// A directory's parent (the root's parent is the root).
    fn dir_parent(&mut self, dir: Ino) -> Result<Option<Ino>, FsStatus>;
    /// Sets a directory's parent pointer.
    fn set_dir_parent(&mut self, dir: Ino, parent: Ino) -> Result<(), FsStatus>;

    /// The inode a directory entry names.
    fn get_dirent(&mut self, dir: Ino, name: &str) -> Result<Option<Ino>, FsStatus>;
    /// Adds a directory entry (the name must be free).
    fn insert_dirent(&mut self, dir: Ino, name: &str, child: Ino) -> Result<(), FsStatus>;
    /// Removes a directory entry.
    fn delete_dirent(&mut self, dir: Ino, name: &str) -> Result<(), FsStatus>;
    /// Up to `limit` entries of `dir` with names greater than `after`, in
    /// ascending byte order of the names, each with its inode.
    fn list_dir(&mut self, dir: Ino, after: &str, limit: usize) -> Result<Vec<DirEntry>, FsStatus>;
    /// Whether a directory has no entries.
    fn dir_is_empty(&mut self, dir: Ino) -> Result<bool, FsStatus>;
    /// (number of inodes, sum of `Inode::allocated` over regular files: what
    /// their data takes, holes not counted).
    fn usage(&mut self) -> Result<(u64, u64), FsStatus>;

    /// An inode's extended attribute.
    fn get_xattr(&mut self, ino: Ino, name: &str) -> Result<Option<Vec<u8>>, FsStatus>;
    /// An inode's extended attributes: names in byte order, each with its
    /// value's length.
    fn list_xattrs(&mut self, ino: Ino) -> Result<Vec<(String, usize)>, FsStatus>;
    /// Creates or replaces an inode's extended attribute.
    fn put_xattr(&mut self, ino: Ino, name: &str, value: &[u8]) -> Result<(), FsStatus>;
    /// Removes an inode's extended attribute; whether it existed.
    fn delete_xattr(&mut self, ino: Ino, name: &str) -> Result<bool, FsStatus>;

    /// The bytes a regular file keeps below its small-file threshold
    /// ([`Inode::small_threshold`](crate::Inode)): at most the threshold;
    /// bytes past them up to the file's size are zeros. `None`: none stored
    /// (all zeros). Removed with the inode.
    fn get_small(&mut self, ino: Ino) -> Result<Option<Vec<u8>>, FsStatus>;
    /// Creates or replaces a file's small-file bytes.
    fn put_small(&mut self, ino: Ino, bytes: &[u8]) -> Result<(), FsStatus>;
    /// The small-file bytes a write transaction staged for a file: its
    /// transaction id and the bytes below the threshold as that transaction
    /// leaves them (installed by its `COMMIT`, dropped when it is rolled
    /// back). At most one per file. Removed with the inode.
    fn get_staged(&mut self, ino: Ino) -> Result<Option<(u64, Vec<u8>)>, FsStatus>;
    /// Creates or replaces a file's staged small-file bytes.
    fn put_staged(&mut self, ino: Ino, txn: u64, bytes: &[u8]) -> Result<(), FsStatus>;
    /// Drops a file's staged small-file bytes (nothing if there are none).
    fn delete_staged(&mut self, ino: Ino) -> Result<(), FsStatus>;
    /// An inode's named ACL entries, in canonical order (users, then groups,
    /// each by id).
    fn get_acl(&mut self, ino: Ino) -> Result<Vec<AclEntry>, FsStatus>;
    /// Replaces an inode's named ACL entries (the inode exists; the list is
    /// canonical). An empty list removes them all.
    fn put_acl(&mut self, ino: Ino, entries: &[AclEntry]) -> Result<(), FsStatus>;
    /// Records that a PAL push did not reach every drive: file `ino`'s
    /// access PAL (`pal_pending`, forgotten with the file) or collection
    /// `ino`'s super PAL (`collection_pending`, kept after its directory is
    /// gone: the drives must forget the super PAL). Recording it twice is
    /// recording it once.
    fn pal_pending_put(&mut self, what: PalPush, ino: Ino) -> Result<(), FsStatus>;
    /// Each record has a sequence number that grows with every put.
    /// Forgets `ino`'s record if its sequence number is still `seq` (none
    /// is not an error).
    fn pal_pending_delete(&mut self, what: PalPush, ino: Ino, seq: u64) -> Result<(), FsStatus>;
    /// `ino`'s record's sequence number, if it has one.
    fn pal_pending_seq(&mut self, what: PalPush, ino: Ino) -> Result<Option<u64>, FsStatus>;
    /// The recorded files (or collections) and their sequence numbers,
    /// ascending, at most `limit`.
    fn pal_pending_list(&mut self, what: PalPush, limit: usize) -> Result<Vec<(Ino, u64)>, FsStatus>;
    /// The PAL collection regular file `ino` is a member of (the directory
    /// it was created in), if it is one (`pal_members`).
    fn pal_member(&mut self, ino: Ino) -> Result<Option<Ino>, FsStatus>;
    /// Makes file `ino` a member of collection `collection`.
    fn put_pal_member(&mut self, ino: Ino, collection: Ino) -> Result<(), FsStatus>;
    /// Members of `collection` above `after`, ascending, at most `limit`.
    fn pal_members(&mut self, collection: Ino, after: Ino, limit: usize) -> Result<Vec<Ino>, FsStatus>;
    /// The directories with at least one shared ACL entry (the collections
    /// that have a super PAL), ascending, at most `limit`.
    fn shared_collections(&mut self, limit: usize) -> Result<Vec<Ino>, FsStatus>;

    /// A quota.
    fn get_quota(&mut self, subject: QuotaSubject) -> Result<Option<Quota>, FsStatus>;
    /// Inserts or replaces a quota.
    fn put_quota(&mut self, quota: &Quota) -> Result<(), FsStatus>;
    /// Removes a quota (nothing if there is none).
    fn delete_quota(&mut self, subject: QuotaSubject) -> Result<(), FsStatus>;
    /// Every quota, in subject order.
    fn list_quotas(&mut self) -> Result<Vec<Quota>, FsStatus>;
    /// What the inodes owned by `uid` use: (bytes of regular files, inodes).
    fn usage_of_uid(&mut self, uid: u32) -> Result<(u64, u64), FsStatus>;

    /// Reads a user by name, with its supplementary groups.
    fn get_user(&mut self, name: &str) -> Result<Option<User>, FsStatus>;
    /// Whether some user has this uid.
    fn uid_taken(&mut self, uid: u32) -> Result<bool, FsStatus>;
    /// Inserts or replaces a user (keyed by name), its supplementary groups
    /// included (they replace the user's earlier ones).
    fn put_user(&mut self, user: &User) -> Result<(), FsStatus>;
    /// Every user, ordered by name.
    fn list_users(&mut self) -> Result<Vec<User>, FsStatus>;

    /// Reads a drive record.
    fn get_drive(&mut self, drive: u32) -> Result<Option<DriveRecord>, FsStatus>;
    /// The drive number holding this drive id, if any.
    fn drive_with_id(&mut self, drive_id: &[u8; 16]) -> Result<Option<u32>, FsStatus>;
    /// Inserts or replaces a drive record (keyed by drive number).
    fn put_drive(&mut self, rec: &DriveRecord) -> Result<(), FsStatus>;
    /// Every drive, ordered by drive number.
    fn list_drives(&mut self) -> Result<Vec<DriveRecord>, FsStatus>;

    /// Adds an object to the pool.
    fn pool_insert(&mut self, object: &ObjectRef) -> Result<(), FsStatus>;
    /// Removes and returns one pooled object of a drive.
    fn pool_take(&mut self, drive: u32) -> Result<Option<ObjectRef>, FsStatus>;
    /// Number of pooled objects of a drive.
    fn pool_count(&mut self, drive: u32) -> Result<u64, FsStatus>;
    /// Every pooled object of a drive.
    fn pool_objects(&mut self, drive: u32) -> Result<Vec<ObjectRef>, FsStatus>;
    /// Every object of a drive that is a component of a file.
    fn file_objects(&mut self, drive: u32) -> Result<Vec<ObjectRef>, FsStatus>;
    /// Whether an object is a component of a file, pooled or doomed.
    fn object_known(&mut self, object: &ObjectRef) -> Result<bool, FsStatus>;

    /// Inserts or replaces component `idx` of inode `ino` (the inode exists;
    /// no other component anywhere holds the object).
    fn put_component(&mut self, ino: Ino, idx: usize, component: &Component) -> Result<(), FsStatus>;
    /// Deletes every component of an inode (its stale ranges must be gone).
    fn delete_components(&mut self, ino: Ino) -> Result<(), FsStatus>;
    /// The file and component index holding an object, if any.
    fn component_of(&mut self, object: &ObjectRef) -> Result<Option<(Ino, usize)>, FsStatus>;
    /// Up to `limit` components in state `Stale`, as (inode, index), in
    /// ascending order strictly after `after`.
    fn list_stale_components(&mut self, after: (Ino, usize), limit: usize) -> Result<Vec<(Ino, usize)>, FsStatus>;
    /// Up to `limit` components whose object lies on `drive`, as (inode,
    /// index, object), in ascending (inode, index) order strictly after `after`.
    fn list_components_on_drive(
        &mut self,
        drive: u32,
        after: (Ino, usize),
        limit: usize,
    ) -> Result<Vec<(Ino, usize, ObjectRef)>, FsStatus>;
    /// Every drive of the drive table with the number of components on it,
    /// ordered by drive number.
    fn component_counts(&mut self) -> Result<Vec<(u32, u64)>, FsStatus>;
    /// Number of inodes with at least one component in state `Stale`.
    fn count_degraded(&mut self) -> Result<u64, FsStatus>;

    /// The stale ranges recorded for component `idx` of `ino`, ascending by offset.
    fn get_stale_ranges(&mut self, ino: Ino, idx: usize) -> Result<Vec<StaleRange>, FsStatus>;
    /// Records a stale range of a component (the component exists; no
    /// recorded range of it starts at the same offset).
    fn put_stale_range(&mut self, ino: Ino, idx: usize, range: &StaleRange) -> Result<(), FsStatus>;
    /// Deletes the stale ranges of component `idx` of `ino`, or of every
    /// component of `ino` if `idx` is `None`.
    fn delete_stale_ranges(&mut self, ino: Ino, idx: Option<usize>) -> Result<(), FsStatus>;

    /// Hands out the next write transaction id (never reused, never 0).
    fn alloc_txn(&mut self) -> Result<u64, FsStatus>;
    /// Inserts or replaces a write intent (keyed by `txn`). A backend refuses
    /// a second intent for one inode (`Internal`).
    fn put_intent(&mut self, intent: &Intent) -> Result<(), FsStatus>;
    /// Reads a write intent by transaction id.
    fn get_intent(&mut self, txn: u64) -> Result<Option<Intent>, FsStatus>;
    /// The write intent of an inode, if any.
    fn intent_of_inode(&mut self, ino: Ino) -> Result<Option<Intent>, FsStatus>;
    /// Up to `limit` write intents with ids greater than `after`, ascending.
    fn list_intents(&mut self, after: u64, limit: usize) -> Result<Vec<Intent>, FsStatus>;
    /// Deletes a write intent (no-op if absent).
    fn delete_intent(&mut self, txn: u64) -> Result<(), FsStatus>;

    /// Records an object to be removed from its drive.
    fn doom(&mut self, object: &ObjectRef) -> Result<(), FsStatus>;
    /// Up to `limit` doomed objects (of `drive` only, if given), in a stable order.
    fn list_doomed(&mut self, drive: Option<u32>, limit: usize) -> Result<Vec<ObjectRef>, FsStatus>;
    /// Every doomed object of a drive.
    fn doomed_objects(&mut self, drive: u32) -> Result<Vec<ObjectRef>, FsStatus>;
    /// Forgets a doomed object (no-op if absent).
    fn forget_doomed(&mut self, object: &ObjectRef) -> Result<(), FsStatus>;

    /// Records an ACV intent, replacing any older one for the same object.
    fn put_acv_intent(&mut self, intent: &AcvIntent) -> Result<(), FsStatus>;
    /// Up to `limit` ACV intents (of objects on `drive` only, if given), in a stable order.
    fn list_acv_intents(&mut self, drive: Option<u32>, limit: usize) -> Result<Vec<AcvIntent>, FsStatus>;
    /// Forgets the intent for an object; with `only_acv`, only if its acv matches.
    fn delete_acv_intent(&mut self, object: &ObjectRef, only_acv: Option<u64>) -> Result<(), FsStatus>;

    /// Reads a setting.
    fn get_setting(&mut self, key: &str) -> Result<Option<Vec<u8>>, FsStatus>;
    /// Writes a setting.
    fn put_setting(&mut self, key: &str, value: &[u8]) -> Result<(), FsStatus>;

    /// The database's clock, in milliseconds since the Unix epoch: the one
    /// clock every manager sharing the database agrees on (lease expiry).
    fn now_ms(&mut self) -> Result<u64, FsStatus>;
    /// Reads a lease by name.
    fn get_lease(&mut self, name: &str) -> Result<Option<Lease>, FsStatus>;
    /// Inserts or replaces a lease (keyed by name).
    fn put_lease(&mut self, lease: &Lease) -> Result<(), FsStatus>;
    /// Deletes a lease (no-op if absent).
    fn delete_lease(&mut self, name: &str) -> Result<(), FsStatus>;
    /// Up to `limit` leases whose names start with `prefix`, in name order.
    fn list_leases(&mut self, prefix: &str, limit: usize) -> Result<Vec<Lease>, FsStatus>;
    /// Directory entries whose name ends with `suffix`, as (directory,
    /// name, child), ordered by directory then name, after (`after_dir`,
    /// `after_name`), at most `limit`.
    fn list_names_ending(
        &mut self,
        suffix: &str,
        after_dir: Ino,
        after_name: &str,
        limit: usize,
    ) -> Result<Vec<(Ino, String, Ino)>, FsStatus>;
}

/// How one attempt at a transaction failed ([`Backend::attempt`],
/// [`Backend::try_transact`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TxnError {
    /// Another transaction conflicted with this one (a serialization
    /// failure or a deadlock): nothing was committed, and running the
    /// closure again may succeed. [`Backend::try_transact`] retries it up to
    /// [`TXN_ATTEMPTS_MAX`] times, then reports it.
    Conflict,
    /// The closure returned this error: rolled back, not retried.
    Abort(FsStatus),
    /// The backend failed (connection lost, disk full, a constraint broken,
    /// a row it cannot decode); the cause is logged. If it failed while
    /// committing, whether the transaction committed is unknown. Not retried.
    Storage,
    /// The database could not be reached, or the connection to it broke
    /// before the commit was sent: nothing was committed. Not retried here:
    /// an outage outlasts any backoff of [`with_retries`], and the caller
    /// (a client) decides how long to wait.
    Unavailable,
}

impl From<TxnError> for FsStatus {
    /// `Conflict` (still, after the retries) is [`FsStatus::Busy`]: the
    /// caller may retry later. `Storage` is [`FsStatus::Internal`],
    /// `Unavailable` [`FsStatus::MetadataUnavailable`].
    fn from(e: TxnError) -> FsStatus {
        match e {
            TxnError::Conflict => FsStatus::Busy,
            TxnError::Abort(status) => status,
            TxnError::Storage => FsStatus::Internal,
            TxnError::Unavailable => FsStatus::MetadataUnavailable,
        }
    }
}

/// Whether a transaction may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads and writes; commits if the closure returns `Ok`.
    ReadWrite,
    /// Reads only: any write fails with [`FsStatus::Internal`], and nothing
    /// is ever committed.
    ReadOnly,
}

/// Most times [`Backend::try_transact`] and [`Backend::try_read`] run a
/// closure whose attempts conflict, before they report
/// [`TxnError::Conflict`]. With the backoff below, the 11 waits between
/// them add up to at most 1 023 ms (1 + 2 + … + 128, then 256 three times).
pub const TXN_ATTEMPTS_MAX: u32 = 12;
/// The first wait after a conflict; each further one doubles, up to
/// [`TXN_BACKOFF_MAX`], and a random part of it is waited (full jitter, so
/// two conflicting callers drift apart).
pub const TXN_BACKOFF_MIN: Duration = Duration::from_millis(1);
/// The longest wait between two attempts.
pub const TXN_BACKOFF_MAX: Duration = Duration::from_millis(256);
const _: () = assert!(TXN_ATTEMPTS_MAX >= 2);
const _: () = assert!(TXN_BACKOFF_MIN.as_nanos() > 0 && TXN_BACKOFF_MIN.as_nanos() <= TXN_BACKOFF_MAX.as_nanos());

/// A metadata backend: runs a closure in one transaction, committing if it
/// returns `Ok` and rolling back otherwise.
///
/// Transactions are serializable: the closure sees no other transaction's
/// effects part-way through, and the committed transactions have the effect
/// of some serial order. A backend whose transactions can conflict
/// (PostgreSQL under concurrent writers) reports [`TxnError::Conflict`] from
/// an attempt, and [`Backend::transact`] runs the closure again — so the
/// closure may run **more than once**: it must not leave effects outside the
/// transaction that a rerun would repeat (collect results in values it
/// makes itself, and clone what it moves).
pub trait Backend: Send + Sync + 'static {
    /// Runs `f` once in one transaction: commits on `Ok` (read-write), rolls
    /// back on `Err`, on a conflict, on a backend failure (or a panic).
    /// Not retried.
    ///
    /// # Errors
    /// [`TxnError::Abort`] with `f`'s error; [`TxnError::Conflict`] if the
    /// transaction conflicted with another one (at any statement, or at
    /// commit) — then `f`'s own result does not count, since it may stem from
    /// the failed statement; [`TxnError::Storage`] if the backend failed.
    fn attempt<R>(&self, access: Access, f: &mut dyn FnMut(&mut dyn Txn) -> Result<R, FsStatus>)
        -> Result<R, TxnError>;

    /// Makes every transaction committed so far durable against power loss
    /// (a commit survives a crash of this process as soon as it returns; a
    /// backend may defer the disk flush that makes it survive the machine's
    /// power going, and then share one flush among many commits: group
    /// commit). Concurrent callers share one flush. The default: commits are
    /// durable already (PostgreSQL with `synchronous_commit`).
    ///
    /// # Errors
    /// [`TxnError::Storage`] if the flush failed (the backend then refuses
    /// further changes: a failed flush may have dropped pages).
    fn sync(&self) -> Result<(), TxnError> {
        Ok(())
    }

    /// Read-write transactions committed, and how many of them are durable
    /// against power loss, since the backend was opened (for tests and
    /// benchmarks). The default: every commit is durable at once.
    fn durability(&self) -> Durability {
        Durability::default()
    }

    /// Runs `f` in one read-write transaction, again after a conflict (at
    /// most [`TXN_ATTEMPTS_MAX`] attempts, with a growing random backoff).
    ///
    /// # Errors
    /// As [`Backend::attempt`]; `Conflict` only once every attempt conflicted.
    fn try_transact<R>(&self, mut f: impl FnMut(&mut dyn Txn) -> Result<R, FsStatus>) -> Result<R, TxnError> {
        let r = with_retries(|| self.attempt(Access::ReadWrite, &mut f));
        if r.is_ok() {
            COMMITS.with(|c| c.set(c.get() + 1));
        }
        r
    }

    /// Runs `f` in one read-only transaction, retried as
    /// [`Backend::try_transact`].
    ///
    /// # Errors
    /// As [`Backend::try_transact`].
    fn try_read<R>(&self, mut f: impl FnMut(&mut dyn Txn) -> Result<R, FsStatus>) -> Result<R, TxnError> {
        with_retries(|| self.attempt(Access::ReadOnly, &mut f))
    }

    /// [`Backend::try_transact`], with its error as a status (see
    /// `From<TxnError> for FsStatus`): what the name space's operations use.
    ///
    /// # Errors
    /// `f`'s error, [`FsStatus::Busy`] after [`TXN_ATTEMPTS_MAX`] conflicts,
    /// [`FsStatus::Internal`] if the backend fails.
    fn transact<R>(&self, f: impl FnMut(&mut dyn Txn) -> Result<R, FsStatus>) -> Result<R, FsStatus> {
        self.try_transact(f).map_err(FsStatus::from)
    }

    /// [`Backend::try_read`], with its error as a status.
    ///
    /// # Errors
    /// As [`Backend::transact`].
    fn read<R>(&self, f: impl FnMut(&mut dyn Txn) -> Result<R, FsStatus>) -> Result<R, FsStatus> {
        self.try_read(f).map_err(FsStatus::from)
    }
}

thread_local! {
    /// Read-write transactions committed by [`Backend::try_transact`] on this thread.
    static COMMITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many read-write transactions [`Backend::try_transact`] (and so
/// [`Backend::transact`]) committed on the calling thread so far: a caller
/// compares two readings to learn whether work it ran on this thread
/// changed the database (the manager, to tell a request that failed before
/// any change from one that failed part-way).
pub fn commits_on_this_thread() -> u64 {
    COMMITS.with(std::cell::Cell::get)
}

/// What [`Backend::durability`] reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Durability {
    /// Read-write transactions committed since the backend was opened
    /// (0 where it does not count them).
    pub committed: u64,
    /// Of those, the ones durable against power loss (the first `durable`).
    pub durable: u64,
    /// Disk flushes [`Backend::sync`] made.
    pub syncs: u64,
}

/// Runs `attempt` until it does not conflict, at most [`TXN_ATTEMPTS_MAX`]
/// times, waiting a random part of an exponentially growing backoff between
/// attempts.
pub fn with_retries<R>(mut attempt: impl FnMut() -> Result<R, TxnError>) -> Result<R, TxnError> {
    let mut backoff = TXN_BACKOFF_MIN;
    for n in 1..=TXN_ATTEMPTS_MAX {
        match attempt() {
            Err(TxnError::Conflict) if n < TXN_ATTEMPTS_MAX => {
                tracing::debug!(attempt = n, "metadata transaction conflicted; running it again");
                std::thread::sleep(jitter(backoff));
                backoff = (backoff * 2).min(TXN_BACKOFF_MAX);
            }
            Err(TxnError::Conflict) => {
                tracing::warn!(attempts = n, "metadata transaction conflicted on every attempt; giving up");
                return Err(TxnError::Conflict);
            }
            other => return other,
        }
    }
    unreachable!("the last attempt returns")
}

/// A uniformly random duration in `[0, max]` (from the standard library's
/// per-hasher random keys: no generator to seed or share).
fn jitter(max: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(random % nanos.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn conflicts_are_retried_a_bounded_number_of_times() {
        let calls = Cell::new(0);
        let r = with_retries(|| {
            calls.set(calls.get() + 1);
            if calls.get() < 3 {
                Err(TxnError::Conflict)
            } else {
                Ok(7)
            }
        });
        assert_eq!((r, calls.get()), (Ok(7), 3), "two conflicts, then success");

        calls.set(0);
        let r: Result<(), _> = with_retries(|| {
            calls.set(calls.get() + 1);
            Err(TxnError::Conflict)
        });
        assert_eq!((r, calls.get()), (Err(TxnError::Conflict), TXN_ATTEMPTS_MAX), "then reported");
        assert_eq!(FsStatus::from(TxnError::Conflict), FsStatus::Busy);

        for e in [TxnError::Abort(FsStatus::Exists), TxnError::Storage] {
            calls.set(0);
            let r: Result<(), _> = with_retries(|| {
                calls.set(calls.get() + 1);
                Err(e)
            });
            assert_eq!((r, calls.get()), (Err(e), 1), "{e:?} is not retried");
        }
    }

    #[test]
    fn jitter_stays_within_its_bound() {
        for max in [Duration::ZERO, Duration::from_nanos(1), TXN_BACKOFF_MIN, TXN_BACKOFF_MAX] {
            for _ in 0..100 {
                assert!(jitter(max) <= max);
            }
        }
    }
}
