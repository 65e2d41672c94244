//! The backend boundary: row operations inside one transaction.
//!
//! **API Boundary:** a backend stores rows and knows nothing about POSIX.
//! Every rule (permissions, link counts, rename, object bookkeeping) lives in
//! [`crate::Namespace`], written once over these traits.

use crate::types::{AcvIntent, DirEntry, DriveRecord, Inode, Intent, Quota, QuotaSubject, StaleRange, User};
use nasd_proto::fs::{FsStatus, Ino, ObjectRef};
use nasd_proto::layout::Component;

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
    /// Deletes an inode, its parent pointer and its extended attributes. No entry, component, stale
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
    /// (number of inodes, sum of `size` over regular files).
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
    /// Up to `limit` doomed objects, in a stable order.
    fn list_doomed(&mut self, limit: usize) -> Result<Vec<ObjectRef>, FsStatus>;
    /// Every doomed object of a drive.
    fn doomed_objects(&mut self, drive: u32) -> Result<Vec<ObjectRef>, FsStatus>;
    /// Forgets a doomed object (no-op if absent).
    fn forget_doomed(&mut self, object: &ObjectRef) -> Result<(), FsStatus>;

    /// Records an ACV intent, replacing any older one for the same object.
    fn put_acv_intent(&mut self, intent: &AcvIntent) -> Result<(), FsStatus>;
    /// Up to `limit` ACV intents, in a stable order.
    fn list_acv_intents(&mut self, limit: usize) -> Result<Vec<AcvIntent>, FsStatus>;
    /// Forgets the intent for an object; with `only_acv`, only if its acv matches.
    fn delete_acv_intent(&mut self, object: &ObjectRef, only_acv: Option<u64>) -> Result<(), FsStatus>;

    /// Reads a setting.
    fn get_setting(&mut self, key: &str) -> Result<Option<Vec<u8>>, FsStatus>;
    /// Writes a setting.
    fn put_setting(&mut self, key: &str, value: &[u8]) -> Result<(), FsStatus>;
}

/// A metadata backend: runs a closure in one transaction, committing if it
/// returns `Ok` and rolling back otherwise.
///
/// Transactions are serializable: the closure sees no other transaction's
/// effects part-way through. A backend may run the closure more than once
/// only if it can prove no effect leaked (this SQLite backend never does).
pub trait Backend: Send + Sync + 'static {
    /// Runs `f` in one read-write transaction: commits on `Ok`, rolls back
    /// on `Err` (or a panic).
    ///
    /// # Errors
    /// `f`'s error, or [`FsStatus::Internal`] if the backend fails (begin or
    /// commit).
    fn transact<R>(&self, f: impl FnOnce(&mut dyn Txn) -> Result<R, FsStatus>) -> Result<R, FsStatus>;

    /// Runs `f` in one read-only transaction; any write fails with
    /// [`FsStatus::Internal`] and nothing is committed.
    ///
    /// # Errors
    /// As [`Backend::transact`].
    fn read<R>(&self, f: impl FnOnce(&mut dyn Txn) -> Result<R, FsStatus>) -> Result<R, FsStatus>;
}
