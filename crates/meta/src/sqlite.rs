//! The embedded SQLite backend.
//!
//! Layout (schema version 12, kept in `PRAGMA user_version`):
//! - `inodes(ino, kind, mode, nlink, uid, gid, size, atime_ns, mtime_ns,
//!   ctime_ns, target, acv, layout, rdev, qdir, small_threshold, site,
//!   data_bytes)`:
//!   `layout` is the 7-byte canonical
//!   encoding of a `nasd_proto::layout::Layout` (NULL where the inode has
//!   none: symlinks, directories that inherit).
//! - `components(ino, idx, drive, partition, object, state)`, primary key
//!   (ino, idx): a file's component objects; `state` is the
//!   `ComponentState` code (0 Ok, 1 Stale). A unique index on (drive,
//!   partition, object) makes two components sharing an object impossible;
//!   `components_drive` (drive, ino, idx) serves per-drive listings and
//!   counts, the partial index `components_stale` the stale listing.
//! - `stale_ranges(ino, idx, offset, length)`, primary key (ino, idx,
//!   offset), referencing the component: byte ranges a stale component
//!   missed (disjoint, merged by the name space).
//! - `intents(txn, ino, state, uid, deadline_ns, escrow, size_limit,
//!   writes, unopened)`: write intents, `txn` the primary key, `ino` unique
//!   (at most one intent per file); `writes` and `unopened` are component
//!   bit sets (`Intent::writes`, `Intent::unopened`).
//! - `dir_parents(dir, parent)`: each directory's `..`.
//! - `dirents(dir, name, child)`: names, ordered by (dir, name bytes).
//! - `counters(name, value)`: `next_ino`, the next inode number to hand
//!   out; `next_txn`, the next write transaction id (starts at 1).
//! - `drives(drive, drive_id, addr, partition, sealed_keys, capacity_bytes,
//!   failure_domain, state)`: `state` is the `DriveState` code (0 In, 1 Out).
//! - `users(name, uid, gid, password_hash, admin, gateway_lo, gateway_hi)`,
//!   and `user_groups(name, gid)`, primary key (name, gid), referencing the
//!   user: each user's supplementary groups.
//! - `xattrs(ino, name, value)`, primary key (ino, name), referencing the
//!   inode: extended attributes.
//! - `small_data(ino, bytes)` and `small_staged(ino, txn, bytes)`,
//!   referencing the inode: a file's bytes below its small-file threshold
//!   (`inodes.small_threshold`), and those its open write transaction `txn`
//!   staged there (`crate::small`).
//! - `quotas(kind, id, bytes_limit, files_limit, bytes_used, files_used)`
//!   (`crate::quotas`).
//! - `leases(name, holder, token, expires_ms)` (`crate::Lease`).
//! - `acl_entries(ino, kind, id, rights, flags)`, referencing the inode: the
//!   named entries of its global ACL (`crate::acl`).
//! - `pal_pending(ino, seq)`: files whose access PAL did not reach every
//!   component (no foreign key: a retry finding the inode gone forgets it);
//!   `pal_members(ino, collection)`, removed with the file: the PAL
//!   collection of each regular file; `collection_pending(ino, seq)`:
//!   collections whose super PAL did not reach every drive (kept after the
//!   directory is gone).
//! - `pool`, `doomed`, `acv_intents`, `settings` (among them `map_epoch`: a
//!   `u32`, 4 bytes little-endian; `file_system_id`; `routing`; `auth_link`;
//!   `users_epoch`).
//!
//! Every reference between rows is a foreign key (enforced), so a dangling
//! entry, parent pointer, component, stale range or intent cannot be
//! committed. `u64` values are stored bit-for-bit as SQLite's signed 64-bit
//! integers. The database runs in WAL mode with `synchronous=NORMAL`: a
//! commit writes its pages to the write-ahead log (the OS page cache) and
//! returns, so it survives a crash of the process at once; [`Sqlite::sync`]
//! makes every commit so far durable against power loss with one
//! `fdatasync` of the log, shared by every caller waiting (group commit),
//! which the manager asks for at a client's `SYNC` (its `fsync`) and at
//! least every `metadata_sync_interval`. SQLite syncs the log before each
//! checkpoint and the database file after it, so the log is the one file
//! holding commits that are not yet durable. Read-only transactions run on
//! [`SQLITE_READERS`] connections of their own, on the snapshot of the last
//! commit, never waiting for the writer.
//!
//! Migrations: `MIGRATIONS[i]` takes version `i` to `i + 1`, each in its own
//! transaction together with the new `user_version`; a database newer than
//! [`SCHEMA_VERSION`] is refused.
//! - 0 → 1 (`V1`): the first schema: one object per regular file, in the
//!   `inodes` columns `obj_drive, obj_partition, obj_object`.
//! - 1 → 2 (`V2`): layouts and components. Every v1 file gets layout
//!   `Layout::SINGLE` with its old object as component 0 (state Ok), and the
//!   root gets `Layout::SINGLE` (a cluster keeps placing one object per
//!   file until its administrator sets another layout); the object columns
//!   and their index are dropped. Adds `stale_ranges`, `intents`, the
//!   `next_txn` counter, the drives' `failure_domain` and `state`, and the
//!   `map_epoch` setting (0).
//! - 2 → 3 (`V3`): supplementary groups: the `user_groups` table (every
//!   existing user has none).
//! - 3 → 4 (`V4`): the users' gateway grants (`gateway_lo`, `gateway_hi`:
//!   both NULL, or the inclusive id range), the `xattrs` table, and the
//!   inodes' device number `rdev` (0; special files came with it), and
//!   quotas: `quotas(kind, id, bytes_limit, files_limit, bytes_used,
//!   files_used)` (kind 1 user, id its uid; kind 2 directory, id its inode;
//!   a NULL limit is none), the inodes' `qdir` (the directory whose quota
//!   counts them, 0: none) with indexes on `uid` and `qdir`, and the
//!   intents' `escrow` and `size_limit` (`u64::MAX`, stored as -1: none).
//! - 4 → 5 (`V5`): `leases(name, holder, token, expires_ms)`: the leases
//!   that let several managers share one database (`crate::Lease`).
//! - 5 → 6 (`V6`): small files: the inodes' `small_threshold` (0 for every
//!   existing inode: their bytes stay on their components), `small_data`
//!   and `small_staged`.
//! - 6 → 7 (`V7`): `acl_entries(ino, kind, id, rights, flags)`, primary
//!   key (ino, kind, id), referencing the inode: the named entries of its
//!   global ACL (`nasd_proto::acl`; kind 1 user, 2 group, 3 role). Every
//!   inode has none.
//! - 7 → 8 (`V8`): `pal_pending(ino, seq)`: the files whose access PAL the
//!   manager could not set on every component, set again at each
//!   maintenance pass until every drive took it; `seq` grows each time a
//!   push fails again, so a retry clears only the failure it saw. Empty.
//! - 8 → 9 (`V9`): routing by request class: the inodes' `site` (the
//!   logical routing site each was made in; 0 for every existing inode,
//!   which one manager held). The routing table itself is the setting
//!   `routing` (`crate::routing`).
//! - 9 → 10 (`V10`): PAL collections: `pal_members(ino, collection)`, the
//!   directory each regular file was created in (indexed by collection;
//!   files made before have none, and their own entries alone apply), and
//!   `collection_pending(ino, seq)`, the collections whose super PAL did
//!   not reach every drive (kept after the directory is gone, whose super
//!   PAL the drives must then forget). Both empty.
//! - 10 → 11 (`V11`): the intents' `writes` (-1, every component: what a
//!   client's intent says) and `unopened` (0) component bit sets.
//! - 11 → 12 (`V12`): sparse files: the inodes' `data_bytes`, the bytes a
//!   regular file's data components store as last measured
//!   (`Inode::data_bytes`); quotas count them instead of the size. Every
//!   existing file is taken as dense: its size less its bytes below the
//!   small-file threshold (so quota usage does not move).

use crate::backend::{Access, Backend, PalPush, Txn, TxnError};
use crate::error::{internal, MetaError};
use crate::types::{
    AcvIntent, DirEntry, DriveRecord, Inode, Intent, IntentState, Lease, Quota, QuotaSubject, StaleRange, User,
};
use nasd_proto::acl::{AclEntry, AclWho, ACL_SHARED};
use nasd_proto::codec::{Reader, Writer};
use nasd_proto::fs::{FileAttr, FileKind, FsStatus, Ino, ObjectRef};
use nasd_proto::layout::{Component, ComponentState, Layout};
use nasd_proto::manager::DriveState;
use rusqlite::types::Type;
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

const V1: &str = "
CREATE TABLE inodes (
    ino INTEGER PRIMARY KEY, kind INTEGER NOT NULL, mode INTEGER NOT NULL,
    nlink INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
    size INTEGER NOT NULL, atime_ns INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL, target TEXT, obj_drive INTEGER,
    obj_partition INTEGER, obj_object INTEGER, acv INTEGER NOT NULL);
CREATE UNIQUE INDEX inodes_object ON inodes (obj_drive, obj_partition, obj_object)
    WHERE obj_drive IS NOT NULL;
CREATE TABLE dir_parents (
    dir INTEGER PRIMARY KEY REFERENCES inodes (ino),
    parent INTEGER NOT NULL REFERENCES inodes (ino));
CREATE TABLE dirents (
    dir INTEGER NOT NULL REFERENCES inodes (ino), name TEXT NOT NULL,
    child INTEGER NOT NULL REFERENCES inodes (ino),
    PRIMARY KEY (dir, name)) WITHOUT ROWID;
CREATE INDEX dirents_child ON dirents (child);
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO counters (name, value) VALUES ('next_ino', 2);
CREATE TABLE users (
    name TEXT PRIMARY KEY, uid INTEGER NOT NULL UNIQUE, gid INTEGER NOT NULL,
    password_hash TEXT NOT NULL, admin INTEGER NOT NULL);
CREATE TABLE drives (
    drive INTEGER PRIMARY KEY, drive_id BLOB NOT NULL UNIQUE, addr TEXT NOT NULL,
    partition INTEGER NOT NULL, sealed_keys BLOB NOT NULL, capacity_bytes INTEGER NOT NULL);
CREATE TABLE pool (
    drive INTEGER NOT NULL, partition INTEGER NOT NULL, object INTEGER NOT NULL,
    PRIMARY KEY (drive, partition, object)) WITHOUT ROWID;
CREATE TABLE doomed (
    drive INTEGER NOT NULL, partition INTEGER NOT NULL, object INTEGER NOT NULL,
    PRIMARY KEY (drive, partition, object)) WITHOUT ROWID;
CREATE TABLE acv_intents (
    drive INTEGER NOT NULL, partition INTEGER NOT NULL, object INTEGER NOT NULL,
    acv INTEGER NOT NULL, PRIMARY KEY (drive, partition, object)) WITHOUT ROWID;
CREATE TABLE settings (key TEXT PRIMARY KEY, value BLOB NOT NULL);
";

/// Layouts and components (see the module documentation). The literal
/// `X'00001000010100'` is `Layout::SINGLE`'s canonical encoding (checked by
/// a test).
const V2: &str = "
ALTER TABLE inodes ADD COLUMN layout BLOB;
CREATE TABLE components (
    ino INTEGER NOT NULL REFERENCES inodes (ino), idx INTEGER NOT NULL,
    drive INTEGER NOT NULL, partition INTEGER NOT NULL, object INTEGER NOT NULL,
    state INTEGER NOT NULL, PRIMARY KEY (ino, idx)) WITHOUT ROWID;
CREATE UNIQUE INDEX components_object ON components (drive, partition, object);
CREATE INDEX components_drive ON components (drive, ino, idx);
CREATE INDEX components_stale ON components (ino, idx) WHERE state = 1;
INSERT INTO components (ino, idx, drive, partition, object, state)
    SELECT ino, 0, obj_drive, obj_partition, obj_object, 0 FROM inodes WHERE obj_drive IS NOT NULL;
UPDATE inodes SET layout = X'00001000010100' WHERE kind = 1 OR ino = 1;
DROP INDEX inodes_object;
ALTER TABLE inodes DROP COLUMN obj_drive;
ALTER TABLE inodes DROP COLUMN obj_partition;
ALTER TABLE inodes DROP COLUMN obj_object;
CREATE TABLE stale_ranges (
    ino INTEGER NOT NULL, idx INTEGER NOT NULL, \"offset\" INTEGER NOT NULL, length INTEGER NOT NULL,
    PRIMARY KEY (ino, idx, \"offset\"),
    FOREIGN KEY (ino, idx) REFERENCES components (ino, idx)) WITHOUT ROWID;
CREATE TABLE intents (
    txn INTEGER PRIMARY KEY, ino INTEGER NOT NULL UNIQUE REFERENCES inodes (ino),
    state INTEGER NOT NULL, uid INTEGER NOT NULL, deadline_ns INTEGER NOT NULL);
INSERT INTO counters (name, value) VALUES ('next_txn', 1);
ALTER TABLE drives ADD COLUMN failure_domain TEXT NOT NULL DEFAULT '';
ALTER TABLE drives ADD COLUMN state INTEGER NOT NULL DEFAULT 0;
INSERT OR IGNORE INTO settings (key, value) VALUES ('map_epoch', X'00000000');
";

/// Supplementary groups (see the module documentation).
const V3: &str = "
CREATE TABLE user_groups (
    name TEXT NOT NULL REFERENCES users (name), gid INTEGER NOT NULL,
    PRIMARY KEY (name, gid)) WITHOUT ROWID;
";

/// Gateways and extended attributes (see the module documentation).
const V4: &str = "
ALTER TABLE inodes ADD COLUMN rdev INTEGER NOT NULL DEFAULT 0;
ALTER TABLE inodes ADD COLUMN qdir INTEGER NOT NULL DEFAULT 0;
CREATE INDEX inodes_uid ON inodes (uid);
CREATE INDEX inodes_qdir ON inodes (qdir) WHERE qdir != 0;
ALTER TABLE intents ADD COLUMN escrow INTEGER NOT NULL DEFAULT 0;
ALTER TABLE intents ADD COLUMN size_limit INTEGER NOT NULL DEFAULT -1;
CREATE TABLE quotas (
    kind INTEGER NOT NULL, id INTEGER NOT NULL, bytes_limit INTEGER, files_limit INTEGER,
    bytes_used INTEGER NOT NULL, files_used INTEGER NOT NULL,
    PRIMARY KEY (kind, id)) WITHOUT ROWID;
ALTER TABLE users ADD COLUMN gateway_lo INTEGER;
ALTER TABLE users ADD COLUMN gateway_hi INTEGER;
CREATE TABLE xattrs (
    ino INTEGER NOT NULL REFERENCES inodes (ino), name TEXT NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (ino, name)) WITHOUT ROWID;
";

/// Leases shared by the managers of one database (see the module documentation).
const V5: &str = "
CREATE TABLE leases (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, token INTEGER NOT NULL, expires_ms INTEGER NOT NULL)
    WITHOUT ROWID;
";

/// Small files (issue 14, `crate::small`): each inode's small-file
/// threshold, the bytes of a file below it, and the bytes a write
/// transaction staged there (installed by its `COMMIT`, dropped at its
/// rollback; one per file, as a file has one write transaction at a time).
const V6: &str = "
ALTER TABLE inodes ADD COLUMN small_threshold INTEGER NOT NULL DEFAULT 0;
CREATE TABLE small_data (
    ino INTEGER PRIMARY KEY REFERENCES inodes (ino), bytes BLOB NOT NULL);
CREATE TABLE small_staged (
    ino INTEGER PRIMARY KEY REFERENCES inodes (ino), txn INTEGER NOT NULL, bytes BLOB NOT NULL);
";

/// Global ACLs (see the module documentation).
const V7: &str = "
CREATE TABLE acl_entries (
    ino INTEGER NOT NULL REFERENCES inodes (ino), kind INTEGER NOT NULL, id INTEGER NOT NULL,
    rights INTEGER NOT NULL, flags INTEGER NOT NULL,
    PRIMARY KEY (ino, kind, id)) WITHOUT ROWID;
";

/// Files whose PAL push failed (see the module documentation).
const V8: &str = "
CREATE TABLE pal_pending (ino INTEGER PRIMARY KEY, seq INTEGER NOT NULL);
";

/// Routing sites (see the module documentation).
const V9: &str = "
ALTER TABLE inodes ADD COLUMN site INTEGER NOT NULL DEFAULT 0;
";

/// PAL collections (see the module documentation).
const V10: &str = "
CREATE TABLE pal_members (ino INTEGER PRIMARY KEY, collection INTEGER NOT NULL);
CREATE INDEX pal_members_collection ON pal_members (collection, ino);
CREATE TABLE collection_pending (ino INTEGER PRIMARY KEY, seq INTEGER NOT NULL);
";

/// The components a write transaction may change and those it could not be
/// opened on (see the module documentation).
const V11: &str = "
ALTER TABLE intents ADD COLUMN writes INTEGER NOT NULL DEFAULT -1;
ALTER TABLE intents ADD COLUMN unopened INTEGER NOT NULL DEFAULT 0;
";

/// Sparse files (see the module documentation).
const V12: &str = "
ALTER TABLE inodes ADD COLUMN data_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE inodes SET data_bytes = size - MIN(size, small_threshold) WHERE kind = 1;
";

/// The migration chain: entry `i` takes schema version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11, V12];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// How long a statement waits for another process's lock before failing.
const BUSY_TIMEOUT_MS: u64 = 5_000;

/// Connections of a database file that run read-only transactions, apart
/// from the writer's: in WAL mode a reader works on the snapshot of the
/// last commit and neither waits for the writer nor holds it up.
pub const SQLITE_READERS: usize = 4;

/// The embedded SQLite backend: one writer connection, read-write
/// transactions serialized by its mutex; read-only transactions on
/// [`SQLITE_READERS`] reader connections (a database file's; an in-memory
/// database reads on the writer).
pub struct Sqlite {
    /// Where the database's files and clock are ([`Sqlite::open_in`]).
    env: nasd_env::Env,
    conn: Mutex<Connection>,
    readers: Vec<Mutex<Connection>>,
    /// Spreads readers over their connections.
    next_reader: AtomicUsize,
    /// The write-ahead log, once opened to be synced (`None` in memory).
    wal: Option<Box<Wal>>,
    /// Read-write transactions committed since open.
    committed: AtomicU64,
    /// Of those, the first `durable` are durable against power loss.
    durable: AtomicU64,
    syncs: AtomicU64,
}

/// The write-ahead log file, which [`Sqlite::sync`] flushes.
struct Wal {
    path: PathBuf,
    /// Held by the one sync in progress; the open log file.
    file: Mutex<Option<nasd_env::DiskFile>>,
    /// A flush failed: every later change is refused (its pages may be lost).
    failed: std::sync::atomic::AtomicBool,
}

impl Sqlite {
    /// Opens (creating and migrating if needed) the database at `path`, in WAL
    /// mode with `synchronous=NORMAL` and foreign keys enforced, with its
    /// reader connections.
    ///
    /// # Errors
    /// [`MetaError::Sqlite`] if the file cannot be opened or migrated,
    /// [`MetaError::TooNew`] if a newer build wrote it.
    pub fn open(path: &Path) -> Result<Sqlite, MetaError> {
        Sqlite::open_in(&nasd_env::Env::real(), path)
    }

    /// [`Sqlite::open`] in `env`: the database and its log on the
    /// environment's disk (a simulated one keeps what was synced apart from
    /// what was only written), leases on its clock.
    ///
    /// # Errors
    /// As [`Sqlite::open`].
    pub fn open_in(env: &nasd_env::Env, path: &Path) -> Result<Sqlite, MetaError> {
        let mut db = Sqlite::setup(env.open_sqlite(path)?)?;
        db.env = env.clone();
        for _ in 0..SQLITE_READERS {
            let reader = env.open_sqlite(path)?;
            reader.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))?;
            reader.pragma_update(None, "query_only", true)?;
            db.readers.push(Mutex::new(reader));
        }
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        db.wal = Some(Box::new(Wal { path: wal.into(), file: Mutex::new(None), failed: Default::default() }));
        // The log file exists now (the migration's transactions wrote it): its name is made
        // durable once, so a log flushed later is found after a power loss.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            env.sync_dir(dir).map_err(|e| MetaError::Io(format!("cannot sync {}: {e}", dir.display())))?;
        }
        Ok(db)
    }

    /// Opens a fresh private in-memory database (for tests).
    ///
    /// # Errors
    /// As [`Sqlite::open`].
    pub fn open_in_memory() -> Result<Sqlite, MetaError> {
        Sqlite::setup(Connection::open_in_memory()?)
    }

    fn setup(mut conn: Connection) -> Result<Sqlite, MetaError> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", true)?;
        conn.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))?;
        migrate(&mut conn)?;
        Ok(Sqlite {
            env: nasd_env::Env::real(),
            conn: Mutex::new(conn),
            readers: Vec::new(),
            next_reader: AtomicUsize::new(0),
            wal: None,
            committed: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
        })
    }

    /// The connection. A poisoned lock means a panic (a broken invariant)
    /// interrupted a transaction: managers fail-stop (STYLE.md), so the
    /// process aborts rather than serve every later request `Internal`; a
    /// restart recovers from the durable state (the interrupted transaction
    /// was never committed).
    fn lock(&self) -> Result<MutexGuard<'_, Connection>, FsStatus> {
        lock_or_abort(&self.conn)
    }

    /// A reader connection: an idle one if any, else the next in turn.
    fn reader(&self) -> Option<MutexGuard<'_, Connection>> {
        if self.readers.is_empty() {
            return None;
        }
        for r in &self.readers {
            if let Ok(guard) = r.try_lock() {
                return Some(guard);
            }
        }
        let at = self.next_reader.fetch_add(1, Ordering::Relaxed) % self.readers.len();
        lock_or_abort(&self.readers[at]).ok()
    }

    /// Makes every transaction committed so far durable against power loss:
    /// one `fdatasync` of the write-ahead log, which callers arriving while
    /// it runs share (a caller whose commits an earlier flush covered
    /// returns at once). In memory: nothing to do.
    ///
    /// # Errors
    /// [`TxnError::Storage`] if the flush failed; every later change is then
    /// refused until the manager restarts (no retry of a flush that may have
    /// dropped pages).
    pub fn sync(&self) -> Result<(), TxnError> {
        let target = self.committed.load(Ordering::SeqCst);
        let Some(wal) = &self.wal else {
            self.durable.fetch_max(target, Ordering::SeqCst);
            return Ok(());
        };
        if self.durable.load(Ordering::SeqCst) >= target {
            return Ok(());
        }
        let mut file = wal.file.lock().unwrap_or_else(|p| p.into_inner());
        if self.durable.load(Ordering::SeqCst) >= target {
            return Ok(());
        }
        // Every commit counted before this point wrote its log pages before it was counted.
        let covers = self.committed.load(Ordering::SeqCst);
        if file.is_none() {
            *file = Some(self.env.open_file(&wal.path, false).map_err(|e| sync_failed(wal, &e))?);
        }
        file.as_ref().expect("opened above").sync_data().map_err(|e| sync_failed(wal, &e))?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.durable.fetch_max(covers, Ordering::SeqCst);
        Ok(())
    }

    /// Commits and durable commits so far.
    pub fn durability(&self) -> crate::backend::Durability {
        crate::backend::Durability {
            committed: self.committed.load(Ordering::SeqCst),
            durable: self.durable.load(Ordering::SeqCst),
            syncs: self.syncs.load(Ordering::Relaxed),
        }
    }
}

/// A failed flush of the log, logged; the backend refuses changes from now on.
fn sync_failed(wal: &Wal, e: &std::io::Error) -> TxnError {
    wal.failed.store(true, Ordering::SeqCst);
    tracing::error!(error = %e, log = %wal.path.display(), "flushing the metadata's write-ahead log failed: refusing further changes until restarted");
    TxnError::Storage
}

/// Locks a connection, aborting the process if a panic poisoned it (see [`Sqlite::lock`]).
fn lock_or_abort(m: &Mutex<Connection>) -> Result<MutexGuard<'_, Connection>, FsStatus> {
    match m.lock() {
        Ok(guard) => Ok(guard),
        Err(_) => {
            tracing::error!("metadata connection poisoned by a panic inside a transaction: stopping the process");
            eprintln!("fatal: a panic interrupted a metadata transaction; stopping (a restart recovers)");
            std::process::abort()
        }
    }
}

fn migrate(conn: &mut Connection) -> Result<(), MetaError> {
    let found: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if found < 0 {
        return Err(MetaError::BadVersion(found));
    }
    if found > SCHEMA_VERSION {
        return Err(MetaError::TooNew { found, supported: SCHEMA_VERSION });
    }
    for (from, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive)?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", from as i64 + 1)?;
        tx.commit()?;
        tracing::info!(version = from + 1, "metadata schema migrated");
    }
    Ok(())
}

impl Backend for Sqlite {
    fn sync(&self) -> Result<(), TxnError> {
        Sqlite::sync(self)
    }

    fn durability(&self) -> crate::backend::Durability {
        Sqlite::durability(self)
    }

    /// One writer behind a mutex: transactions never conflict. A failed
    /// row operation reaches `f` as `Internal` (logged), and so the caller
    /// as [`TxnError::Abort`]`(Internal)`; a failed begin or commit is
    /// [`TxnError::Storage`].
    fn attempt<R>(
        &self,
        access: Access,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<R, FsStatus>,
    ) -> Result<R, TxnError> {
        if access == Access::ReadOnly {
            if let Some(mut reader) = self.reader() {
                return read_only(&mut reader, &self.env, f);
            }
        }
        let mut conn = self.lock().map_err(|_| TxnError::Storage)?;
        match access {
            Access::ReadWrite => {
                if self.wal.as_ref().is_some_and(|w| w.failed.load(Ordering::SeqCst)) {
                    tracing::error!("refusing a change: an earlier flush of the metadata failed");
                    return Err(TxnError::Storage);
                }
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(storage)?;
                let out = f(&mut SqliteTxn { c: &tx, env: &self.env }).map_err(TxnError::Abort)?;
                tx.commit().map_err(storage)?;
                self.committed.fetch_add(1, Ordering::SeqCst);
                Ok(out)
            }
            Access::ReadOnly => {
                conn.pragma_update(None, "query_only", true).map_err(storage)?;
                let out = read_only(&mut conn, &self.env, f);
                conn.pragma_update(None, "query_only", false).map_err(storage)?;
                out
            }
        }
    }
}

fn read_only<R>(
    conn: &mut Connection,
    env: &nasd_env::Env,
    f: &mut dyn FnMut(&mut dyn Txn) -> Result<R, FsStatus>,
) -> Result<R, TxnError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred).map_err(storage)?;
    let out = f(&mut SqliteTxn { c: &tx, env });
    tx.rollback().map_err(storage)?;
    out.map_err(TxnError::Abort)
}

/// A failed begin, commit or rollback, logged.
fn storage(e: rusqlite::Error) -> TxnError {
    tracing::error!(error = %e, "metadata store failed");
    TxnError::Storage
}

/// One SQLite transaction seen through [`Txn`].
struct SqliteTxn<'a> {
    c: &'a Connection,
    /// The clock leases expire on.
    env: &'a nasd_env::Env,
}

/// The inode columns (table alias `i`) in the order [`inode_from_row`] reads them.
macro_rules! inode_cols {
    () => {
        "i.ino, i.kind, i.mode, i.nlink, i.uid, i.gid, i.size, i.atime_ns, i.mtime_ns, \
         i.ctime_ns, i.target, i.layout, i.acv, i.rdev, i.qdir, i.small_threshold, i.site, i.data_bytes"
    };
}

fn bad_column(idx: usize, what: &'static str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(idx, Type::Integer, what.into())
}

fn u32_col(r: &Row<'_>, idx: usize) -> rusqlite::Result<u32> {
    u32::try_from(r.get::<_, i64>(idx)?).map_err(|_| bad_column(idx, "not a u32"))
}

fn site_col(r: &Row<'_>, idx: usize) -> rusqlite::Result<u8> {
    u8::try_from(r.get::<_, i64>(idx)?)
        .ok()
        .filter(|s| usize::from(*s) < nasd_proto::routing::ROUTING_SITES)
        .ok_or_else(|| bad_column(idx, "not a routing site"))
}

fn u64_col(r: &Row<'_>, idx: usize) -> rusqlite::Result<u64> {
    Ok(r.get::<_, i64>(idx)? as u64)
}

fn usize_col(r: &Row<'_>, idx: usize) -> rusqlite::Result<usize> {
    usize::try_from(r.get::<_, i64>(idx)?).map_err(|_| bad_column(idx, "not an index"))
}

fn u8_col(r: &Row<'_>, idx: usize) -> rusqlite::Result<u8> {
    u8::try_from(r.get::<_, i64>(idx)?).map_err(|_| bad_column(idx, "not a u8"))
}

/// A layout's canonical encoding, as stored in `inodes.layout`.
fn layout_bytes(layout: &Layout) -> Vec<u8> {
    let mut w = Writer::with_capacity(Layout::LEN);
    layout.encode(&mut w);
    w.into_vec()
}

/// Reads a stored layout: exactly its canonical encoding, within bounds.
fn layout_from_bytes(bytes: &[u8]) -> Option<Layout> {
    let mut r = Reader::new(bytes);
    let layout = Layout::decode(&mut r).ok()?;
    r.finish().ok()?;
    Some(layout)
}

/// Reads an inode (without its components) from the `inode_cols!` columns
/// starting at column `at`.
fn inode_from_row(r: &Row<'_>, at: usize) -> rusqlite::Result<Inode> {
    let kind = u8::try_from(r.get::<_, i64>(at + 1)?).ok().and_then(|k| FileKind::from_code(k).ok());
    let attr = FileAttr {
        ino: u64_col(r, at)?,
        kind: kind.ok_or_else(|| bad_column(at + 1, "unknown file kind"))?,
        mode: u32_col(r, at + 2)?,
        nlink: u32_col(r, at + 3)?,
        uid: u32_col(r, at + 4)?,
        gid: u32_col(r, at + 5)?,
        size: u64_col(r, at + 6)?,
        atime_ns: r.get(at + 7)?,
        mtime_ns: r.get(at + 8)?,
        ctime_ns: r.get(at + 9)?,
        rdev: u64_col(r, at + 13)?,
        allocated: 0,
    };
    let layout = match r.get::<_, Option<Vec<u8>>>(at + 11)? {
        None => None,
        Some(bytes) => Some(layout_from_bytes(&bytes).ok_or_else(|| bad_column(at + 11, "not a canonical layout"))?),
    };
    Ok(Inode {
        attr,
        target: r.get(at + 10)?,
        layout,
        components: Vec::new(),
        acv: u64_col(r, at + 12)?,
        qdir: u64_col(r, at + 14)?,
        small_threshold: u32_col(r, at + 15)?,
        site: site_col(r, at + 16)?,
        data_bytes: u64_col(r, at + 17)?,
    })
    .map(|mut n: Inode| {
        n.refresh_allocated();
        n
    })
}

fn object_from_row(r: &Row<'_>) -> rusqlite::Result<ObjectRef> {
    Ok(ObjectRef { drive: u32_col(r, 0)?, partition: u64_col(r, 1)?, object: u64_col(r, 2)? })
}

/// A stored component state: Ok or Stale (Down is never stored).
fn component_state(code: u8) -> Option<ComponentState> {
    match ComponentState::from_code(code) {
        Ok(s @ (ComponentState::Ok | ComponentState::Stale)) => Some(s),
        _ => None,
    }
}

/// A user's row; its groups are read separately ([`SqliteTxn::with_groups`]).
fn user_from_row(r: &Row<'_>) -> rusqlite::Result<User> {
    Ok(User {
        name: r.get(0)?,
        uid: u32_col(r, 1)?,
        gid: u32_col(r, 2)?,
        password_hash: r.get(3)?,
        admin: r.get(4)?,
        groups: Vec::new(),
        gateway: match (r.get::<_, Option<i64>>(5)?, r.get::<_, Option<i64>>(6)?) {
            (Some(_), Some(_)) => Some((u32_col(r, 5)?, u32_col(r, 6)?)),
            _ => None,
        },
    })
}

fn drive_state(code: u8) -> Option<DriveState> {
    match code {
        0 => Some(DriveState::In),
        1 => Some(DriveState::Out),
        _ => None,
    }
}

fn drive_from_row(r: &Row<'_>) -> rusqlite::Result<DriveRecord> {
    let id: Vec<u8> = r.get(1)?;
    Ok(DriveRecord {
        drive: u32_col(r, 0)?,
        drive_id: id.try_into().map_err(|_| bad_column(1, "drive id is not 16 bytes"))?,
        addr: r.get(2)?,
        partition: u64_col(r, 3)?,
        sealed_keys: r.get(4)?,
        capacity_bytes: u64_col(r, 5)?,
        failure_domain: r.get(6)?,
        state: drive_state(u8_col(r, 7)?).ok_or_else(|| bad_column(7, "unknown drive state"))?,
    })
}

macro_rules! drive_cols {
    () => {
        "drive, drive_id, addr, partition, sealed_keys, capacity_bytes, failure_domain, state"
    };
}

macro_rules! intent_cols {
    () => {
        "txn, ino, state, uid, deadline_ns, escrow, size_limit, writes, unopened"
    };
}

fn intent_from_row(r: &Row<'_>) -> rusqlite::Result<Intent> {
    Ok(Intent {
        txn: u64_col(r, 0)?,
        ino: u64_col(r, 1)?,
        state: IntentState::from_code(u8_col(r, 2)?).ok_or_else(|| bad_column(2, "unknown intent state"))?,
        uid: u32_col(r, 3)?,
        deadline_ns: r.get(4)?,
        escrow: u64_col(r, 5)?,
        size_limit: u64_col(r, 6)?,
        writes: u64_col(r, 7)?,
        unopened: u64_col(r, 8)?,
    })
}

fn quota_from_row(r: &Row<'_>) -> rusqlite::Result<Quota> {
    let subject =
        QuotaSubject::from_key(u8_col(r, 0)?, u64_col(r, 1)?).ok_or_else(|| bad_column(0, "unknown quota subject"))?;
    Ok(Quota {
        subject,
        bytes_limit: r.get::<_, Option<i64>>(2)?.map(|v| v as u64),
        files_limit: r.get::<_, Option<i64>>(3)?.map(|v| v as u64),
        bytes_used: u64_col(r, 4)?,
        files_used: u64_col(r, 5)?,
    })
}

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl SqliteTxn<'_> {
    fn objects(&self, sql: &str, drive: u32) -> Result<Vec<ObjectRef>, FsStatus> {
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st.query_map([drive as i64], object_from_row).map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn exec(&self, sql: &str, params: impl rusqlite::Params) -> Result<usize, FsStatus> {
        self.c.prepare_cached(sql).and_then(|mut st| st.execute(params)).map_err(internal)
    }

    /// Fills in a user's supplementary groups (ascending).
    fn with_groups(&self, mut user: User) -> Result<User, FsStatus> {
        let sql = "SELECT gid FROM user_groups WHERE name = ?1 ORDER BY gid";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st.query_map([&user.name], |r| u32_col(r, 0)).map_err(internal)?;
        user.groups = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)?;
        Ok(user)
    }

    /// Fills in an inode's components, checking their indexes run 0, 1, ….
    fn with_components(&self, mut inode: Inode) -> rusqlite::Result<Inode> {
        let sql = "SELECT drive, partition, object, state, idx FROM components WHERE ino = ?1 ORDER BY idx";
        let mut st = self.c.prepare_cached(sql)?;
        let rows = st.query_map([inode.attr.ino as i64], |r| {
            let state = component_state(u8_col(r, 3)?).ok_or_else(|| bad_column(3, "unknown component state"))?;
            Ok((usize_col(r, 4)?, Component { object: object_from_row(r)?, state }))
        })?;
        for (n, row) in rows.enumerate() {
            let (idx, component) = row?;
            if idx != n {
                return Err(bad_column(4, "component indexes are not 0, 1, 2, …"));
            }
            inode.components.push(component);
        }
        Ok(inode)
    }
}

fn obj_params(o: &ObjectRef) -> (i64, i64, i64) {
    (o.drive as i64, o.partition as i64, o.object as i64)
}

impl Txn for SqliteTxn<'_> {
    fn get_inode(&mut self, ino: Ino) -> Result<Option<Inode>, FsStatus> {
        let sql = concat!("SELECT ", inode_cols!(), " FROM inodes i WHERE i.ino = ?1");
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let Some(inode) = st.query_row([ino as i64], |r| inode_from_row(r, 0)).optional().map_err(internal)? else {
            return Ok(None);
        };
        self.with_components(inode).map(Some).map_err(internal)
    }

    fn put_inode(&mut self, n: &Inode) -> Result<(), FsStatus> {
        let a = &n.attr;
        self.exec(
            "INSERT INTO inodes (ino, kind, mode, nlink, uid, gid, size, atime_ns, mtime_ns, \
             ctime_ns, target, layout, acv, rdev, qdir, small_threshold, site, data_bytes) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18) \
             ON CONFLICT (ino) DO UPDATE SET kind = excluded.kind, mode = excluded.mode, \
             nlink = excluded.nlink, uid = excluded.uid, gid = excluded.gid, size = excluded.size, \
             atime_ns = excluded.atime_ns, mtime_ns = excluded.mtime_ns, ctime_ns = excluded.ctime_ns, \
             target = excluded.target, layout = excluded.layout, acv = excluded.acv, rdev = excluded.rdev, \
             qdir = excluded.qdir, small_threshold = excluded.small_threshold, site = excluded.site, \
             data_bytes = excluded.data_bytes",
            params![
                a.ino as i64,
                a.kind.code(),
                a.mode,
                a.nlink,
                a.uid,
                a.gid,
                a.size as i64,
                a.atime_ns,
                a.mtime_ns,
                a.ctime_ns,
                n.target,
                n.layout.as_ref().map(layout_bytes),
                n.acv as i64,
                a.rdev as i64,
                n.qdir as i64,
                n.small_threshold,
                n.site,
                n.data_bytes as i64
            ],
        )?;
        Ok(())
    }

    fn delete_inode(&mut self, ino: Ino) -> Result<(), FsStatus> {
        self.exec("DELETE FROM dir_parents WHERE dir = ?1", [ino as i64])?;
        self.exec("DELETE FROM xattrs WHERE ino = ?1", [ino as i64])?;
        self.exec("DELETE FROM small_data WHERE ino = ?1", [ino as i64])?;
        self.exec("DELETE FROM small_staged WHERE ino = ?1", [ino as i64])?;
        self.exec("DELETE FROM acl_entries WHERE ino = ?1", [ino as i64])?;
        self.exec("DELETE FROM pal_pending WHERE ino = ?1", [ino as i64])?;
        self.exec("DELETE FROM pal_members WHERE ino = ?1", [ino as i64])?;
        self.exec("DELETE FROM inodes WHERE ino = ?1", [ino as i64])?;
        Ok(())
    }

    fn alloc_ino(&mut self) -> Result<Ino, FsStatus> {
        let sql = "UPDATE counters SET value = value + 1 WHERE name = 'next_ino' RETURNING value - 1";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let ino: i64 = st.query_row([], |r| r.get(0)).map_err(internal)?;
        Ok(ino as u64)
    }

    fn dir_parent(&mut self, dir: Ino) -> Result<Option<Ino>, FsStatus> {
        let mut st = self.c.prepare_cached("SELECT parent FROM dir_parents WHERE dir = ?1").map_err(internal)?;
        st.query_row([dir as i64], |r| u64_col(r, 0)).optional().map_err(internal)
    }

    fn set_dir_parent(&mut self, dir: Ino, parent: Ino) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO dir_parents (dir, parent) VALUES (?1, ?2) \
             ON CONFLICT (dir) DO UPDATE SET parent = excluded.parent",
            [dir as i64, parent as i64],
        )?;
        Ok(())
    }

    fn get_dirent(&mut self, dir: Ino, name: &str) -> Result<Option<Ino>, FsStatus> {
        let mut st =
            self.c.prepare_cached("SELECT child FROM dirents WHERE dir = ?1 AND name = ?2").map_err(internal)?;
        st.query_row(params![dir as i64, name], |r| u64_col(r, 0)).optional().map_err(internal)
    }

    fn insert_dirent(&mut self, dir: Ino, name: &str, child: Ino) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO dirents (dir, name, child) VALUES (?1, ?2, ?3)",
            params![dir as i64, name, child as i64],
        )?;
        Ok(())
    }

    fn delete_dirent(&mut self, dir: Ino, name: &str) -> Result<(), FsStatus> {
        self.exec("DELETE FROM dirents WHERE dir = ?1 AND name = ?2", params![dir as i64, name])?;
        Ok(())
    }

    fn list_dir(&mut self, dir: Ino, after: &str, limit: usize) -> Result<Vec<DirEntry>, FsStatus> {
        let sql = concat!(
            "SELECT d.name, EXISTS (SELECT 1 FROM xattrs x WHERE x.ino = d.child), ",
            inode_cols!(),
            " FROM dirents d JOIN inodes i ON i.ino = d.child \
             WHERE d.dir = ?1 AND d.name > ?2 ORDER BY d.name LIMIT ?3"
        );
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st
            .query_map(params![dir as i64, after, limit_param(limit)], |r| {
                Ok(DirEntry { name: r.get(0)?, has_xattrs: r.get(1)?, inode: inode_from_row(r, 2)? })
            })
            .map_err(internal)?;
        let entries = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)?;
        entries
            .into_iter()
            .map(|e| Ok(DirEntry { inode: self.with_components(e.inode).map_err(internal)?, ..e }))
            .collect()
    }

    fn dir_is_empty(&mut self, dir: Ino) -> Result<bool, FsStatus> {
        let mut st = self.c.prepare_cached("SELECT EXISTS (SELECT 1 FROM dirents WHERE dir = ?1)").map_err(internal)?;
        let any: bool = st.query_row([dir as i64], |r| r.get(0)).map_err(internal)?;
        Ok(!any)
    }

    fn usage(&mut self) -> Result<(u64, u64), FsStatus> {
        let sql =
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN kind = 1 THEN data_bytes + MIN(size, small_threshold) END), 0) \
                   FROM inodes";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        st.query_row([], |r| Ok((u64_col(r, 0)?, u64_col(r, 1)?))).map_err(internal)
    }

    fn get_quota(&mut self, subject: QuotaSubject) -> Result<Option<Quota>, FsStatus> {
        let (kind, id) = subject.key();
        let sql = "SELECT kind, id, bytes_limit, files_limit, bytes_used, files_used FROM quotas \
                   WHERE kind = ?1 AND id = ?2";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        st.query_row(params![kind, id as i64], quota_from_row).optional().map_err(internal)
    }

    fn put_quota(&mut self, q: &Quota) -> Result<(), FsStatus> {
        let (kind, id) = q.subject.key();
        self.exec(
            "INSERT INTO quotas (kind, id, bytes_limit, files_limit, bytes_used, files_used) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
             ON CONFLICT (kind, id) DO UPDATE SET bytes_limit = excluded.bytes_limit, \
             files_limit = excluded.files_limit, bytes_used = excluded.bytes_used, files_used = excluded.files_used",
            params![
                kind,
                id as i64,
                q.bytes_limit.map(|v| v as i64),
                q.files_limit.map(|v| v as i64),
                q.bytes_used as i64,
                q.files_used as i64
            ],
        )?;
        Ok(())
    }

    fn delete_quota(&mut self, subject: QuotaSubject) -> Result<(), FsStatus> {
        let (kind, id) = subject.key();
        self.exec("DELETE FROM quotas WHERE kind = ?1 AND id = ?2", params![kind, id as i64])?;
        Ok(())
    }

    fn list_quotas(&mut self) -> Result<Vec<Quota>, FsStatus> {
        let sql = "SELECT kind, id, bytes_limit, files_limit, bytes_used, files_used FROM quotas ORDER BY kind, id";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st.query_map([], quota_from_row).map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn usage_of_uid(&mut self, uid: u32) -> Result<(u64, u64), FsStatus> {
        let sql =
            "SELECT COALESCE(SUM(CASE WHEN kind = 1 THEN data_bytes + MIN(size, small_threshold) ELSE 0 END), 0), \
                   COUNT(*) FROM inodes WHERE uid = ?1";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        st.query_row([uid], |r| Ok((u64_col(r, 0)?, u64_col(r, 1)?))).map_err(internal)
    }

    fn get_xattr(&mut self, ino: Ino, name: &str) -> Result<Option<Vec<u8>>, FsStatus> {
        let mut st =
            self.c.prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2").map_err(internal)?;
        st.query_row(params![ino as i64, name], |r| r.get(0)).optional().map_err(internal)
    }

    fn list_xattrs(&mut self, ino: Ino) -> Result<Vec<(String, usize)>, FsStatus> {
        let sql = "SELECT name, length(value) FROM xattrs WHERE ino = ?1 ORDER BY CAST(name AS BLOB)";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st
            .query_map([ino as i64], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as usize)))
            .map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn put_xattr(&mut self, ino: Ino, name: &str, value: &[u8]) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO xattrs (ino, name, value) VALUES (?1, ?2, ?3) \
             ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
            params![ino as i64, name, value],
        )?;
        Ok(())
    }

    fn delete_xattr(&mut self, ino: Ino, name: &str) -> Result<bool, FsStatus> {
        Ok(self.exec("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2", params![ino as i64, name])? > 0)
    }

    fn get_small(&mut self, ino: Ino) -> Result<Option<Vec<u8>>, FsStatus> {
        let mut st = self.c.prepare_cached("SELECT bytes FROM small_data WHERE ino = ?1").map_err(internal)?;
        st.query_row([ino as i64], |r| r.get::<_, Vec<u8>>(0)).optional().map_err(internal)
    }

    fn put_small(&mut self, ino: Ino, bytes: &[u8]) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO small_data (ino, bytes) VALUES (?1, ?2) ON CONFLICT (ino) DO UPDATE SET bytes = excluded.bytes",
            params![ino as i64, bytes],
        )?;
        Ok(())
    }

    fn get_staged(&mut self, ino: Ino) -> Result<Option<(u64, Vec<u8>)>, FsStatus> {
        let mut st = self.c.prepare_cached("SELECT txn, bytes FROM small_staged WHERE ino = ?1").map_err(internal)?;
        st.query_row([ino as i64], |r| Ok((u64_col(r, 0)?, r.get::<_, Vec<u8>>(1)?))).optional().map_err(internal)
    }

    fn put_staged(&mut self, ino: Ino, txn: u64, bytes: &[u8]) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO small_staged (ino, txn, bytes) VALUES (?1, ?2, ?3) \
             ON CONFLICT (ino) DO UPDATE SET txn = excluded.txn, bytes = excluded.bytes",
            params![ino as i64, txn as i64, bytes],
        )?;
        Ok(())
    }

    fn delete_staged(&mut self, ino: Ino) -> Result<(), FsStatus> {
        self.exec("DELETE FROM small_staged WHERE ino = ?1", [ino as i64])?;
        Ok(())
    }

    fn get_acl(&mut self, ino: Ino) -> Result<Vec<AclEntry>, FsStatus> {
        let sql = "SELECT kind, id, rights, flags FROM acl_entries WHERE ino = ?1 ORDER BY kind, id";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st
            .query_map([ino as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, i64>(3)?))
            })
            .map_err(internal)?;
        let rows = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)?;
        rows.into_iter().map(|(k, id, rights, flags)| acl_entry(k, id, rights, flags)).collect()
    }

    fn put_acl(&mut self, ino: Ino, entries: &[AclEntry]) -> Result<(), FsStatus> {
        self.exec("DELETE FROM acl_entries WHERE ino = ?1", [ino as i64])?;
        for e in entries {
            let (kind, id) = e.who.code();
            self.exec(
                "INSERT INTO acl_entries (ino, kind, id, rights, flags) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![ino as i64, kind, id, e.rights, e.flags],
            )?;
        }
        Ok(())
    }

    fn pal_pending_put(&mut self, what: PalPush, ino: Ino) -> Result<(), FsStatus> {
        let sql = format!(
            "INSERT INTO {t} (ino, seq) VALUES (?1, 1) ON CONFLICT (ino) DO UPDATE SET seq = {t}.seq + 1",
            t = what.table()
        );
        self.exec(&sql, [ino as i64]).map(|_| ())
    }

    fn pal_pending_delete(&mut self, what: PalPush, ino: Ino, seq: u64) -> Result<(), FsStatus> {
        let sql = format!("DELETE FROM {} WHERE ino = ?1 AND seq = ?2", what.table());
        self.exec(&sql, [ino as i64, seq as i64]).map(|_| ())
    }

    fn pal_pending_seq(&mut self, what: PalPush, ino: Ino) -> Result<Option<u64>, FsStatus> {
        let sql = format!("SELECT seq FROM {} WHERE ino = ?1", what.table());
        let mut st = self.c.prepare_cached(&sql).map_err(internal)?;
        let seq = st.query_row([ino as i64], |r| r.get::<_, i64>(0)).optional().map_err(internal)?;
        Ok(seq.map(|s| s as u64))
    }

    fn pal_pending_list(&mut self, what: PalPush, limit: usize) -> Result<Vec<(Ino, u64)>, FsStatus> {
        let sql = format!("SELECT ino, seq FROM {} ORDER BY ino LIMIT ?1", what.table());
        let mut st = self.c.prepare_cached(&sql).map_err(internal)?;
        let rows =
            st.query_map([limit as i64], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))).map_err(internal)?;
        let rows = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)?;
        Ok(rows.into_iter().map(|(i, s)| (i as Ino, s as u64)).collect())
    }

    fn pal_member(&mut self, ino: Ino) -> Result<Option<Ino>, FsStatus> {
        let mut st = self.c.prepare_cached("SELECT collection FROM pal_members WHERE ino = ?1").map_err(internal)?;
        let c = st.query_row([ino as i64], |r| r.get::<_, i64>(0)).optional().map_err(internal)?;
        Ok(c.map(|c| c as Ino))
    }

    fn put_pal_member(&mut self, ino: Ino, collection: Ino) -> Result<(), FsStatus> {
        let sql = "INSERT INTO pal_members (ino, collection) VALUES (?1, ?2) \
                   ON CONFLICT (ino) DO UPDATE SET collection = excluded.collection";
        self.exec(sql, [ino as i64, collection as i64]).map(|_| ())
    }

    fn pal_members(&mut self, collection: Ino, after: Ino, limit: usize) -> Result<Vec<Ino>, FsStatus> {
        let sql = "SELECT ino FROM pal_members WHERE collection = ?1 AND ino > ?2 ORDER BY ino LIMIT ?3";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows =
            st.query_map([collection as i64, after as i64, limit as i64], |r| r.get::<_, i64>(0)).map_err(internal)?;
        let rows = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)?;
        Ok(rows.into_iter().map(|i| i as Ino).collect())
    }

    fn shared_collections(&mut self, limit: usize) -> Result<Vec<Ino>, FsStatus> {
        let sql =
            format!("SELECT DISTINCT ino FROM acl_entries WHERE (flags & {ACL_SHARED}) != 0 ORDER BY ino LIMIT ?1");
        let mut st = self.c.prepare_cached(&sql).map_err(internal)?;
        let rows = st.query_map([limit as i64], |r| r.get::<_, i64>(0)).map_err(internal)?;
        let rows = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)?;
        Ok(rows.into_iter().map(|i| i as Ino).collect())
    }

    fn get_user(&mut self, name: &str) -> Result<Option<User>, FsStatus> {
        let sql = "SELECT name, uid, gid, password_hash, admin, gateway_lo, gateway_hi FROM users WHERE name = ?1";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let user = st.query_row([name], user_from_row).optional().map_err(internal)?;
        user.map(|u| self.with_groups(u)).transpose()
    }

    fn uid_taken(&mut self, uid: u32) -> Result<bool, FsStatus> {
        let mut st = self.c.prepare_cached("SELECT EXISTS (SELECT 1 FROM users WHERE uid = ?1)").map_err(internal)?;
        st.query_row([uid], |r| r.get(0)).map_err(internal)
    }

    fn put_user(&mut self, u: &User) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO users (name, uid, gid, password_hash, admin, gateway_lo, gateway_hi) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
             ON CONFLICT (name) DO UPDATE SET uid = excluded.uid, gid = excluded.gid, \
             password_hash = excluded.password_hash, admin = excluded.admin, \
             gateway_lo = excluded.gateway_lo, gateway_hi = excluded.gateway_hi",
            params![u.name, u.uid, u.gid, u.password_hash, u.admin, u.gateway.map(|g| g.0), u.gateway.map(|g| g.1)],
        )?;
        self.exec("DELETE FROM user_groups WHERE name = ?1", [&u.name])?;
        for g in &u.groups {
            self.exec("INSERT INTO user_groups (name, gid) VALUES (?1, ?2)", params![u.name, g])?;
        }
        Ok(())
    }

    fn list_users(&mut self) -> Result<Vec<User>, FsStatus> {
        let sql = "SELECT name, uid, gid, password_hash, admin, gateway_lo, gateway_hi FROM users ORDER BY name";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st.query_map([], user_from_row).map_err(internal)?;
        let users = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)?;
        users.into_iter().map(|u| self.with_groups(u)).collect()
    }

    fn get_drive(&mut self, drive: u32) -> Result<Option<DriveRecord>, FsStatus> {
        let sql = concat!("SELECT ", drive_cols!(), " FROM drives WHERE drive = ?1");
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        st.query_row([drive], drive_from_row).optional().map_err(internal)
    }

    fn drive_with_id(&mut self, drive_id: &[u8; 16]) -> Result<Option<u32>, FsStatus> {
        let mut st = self.c.prepare_cached("SELECT drive FROM drives WHERE drive_id = ?1").map_err(internal)?;
        st.query_row([&drive_id[..]], |r| u32_col(r, 0)).optional().map_err(internal)
    }

    fn put_drive(&mut self, d: &DriveRecord) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO drives (drive, drive_id, addr, partition, sealed_keys, capacity_bytes, failure_domain, state) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (drive) DO UPDATE SET \
             drive_id = excluded.drive_id, addr = excluded.addr, partition = excluded.partition, \
             sealed_keys = excluded.sealed_keys, capacity_bytes = excluded.capacity_bytes, \
             failure_domain = excluded.failure_domain, state = excluded.state",
            params![
                d.drive,
                &d.drive_id[..],
                d.addr,
                d.partition as i64,
                d.sealed_keys,
                d.capacity_bytes as i64,
                d.failure_domain,
                d.state as u8
            ],
        )?;
        Ok(())
    }

    fn list_drives(&mut self) -> Result<Vec<DriveRecord>, FsStatus> {
        let sql = concat!("SELECT ", drive_cols!(), " FROM drives ORDER BY drive");
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st.query_map([], drive_from_row).map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn pool_insert(&mut self, o: &ObjectRef) -> Result<(), FsStatus> {
        self.exec("INSERT INTO pool (drive, partition, object) VALUES (?1, ?2, ?3)", obj_params(o))?;
        Ok(())
    }

    fn pool_take(&mut self, drive: u32) -> Result<Option<ObjectRef>, FsStatus> {
        let sql = "SELECT drive, partition, object FROM pool WHERE drive = ?1 ORDER BY partition, object LIMIT 1";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let Some(o) = st.query_row([drive], object_from_row).optional().map_err(internal)? else {
            return Ok(None);
        };
        self.exec("DELETE FROM pool WHERE drive = ?1 AND partition = ?2 AND object = ?3", obj_params(&o))?;
        Ok(Some(o))
    }

    fn pool_count(&mut self, drive: u32) -> Result<u64, FsStatus> {
        let mut st = self.c.prepare_cached("SELECT COUNT(*) FROM pool WHERE drive = ?1").map_err(internal)?;
        st.query_row([drive], |r| u64_col(r, 0)).map_err(internal)
    }

    fn pool_objects(&mut self, drive: u32) -> Result<Vec<ObjectRef>, FsStatus> {
        self.objects("SELECT drive, partition, object FROM pool WHERE drive = ?1", drive)
    }

    fn file_objects(&mut self, drive: u32) -> Result<Vec<ObjectRef>, FsStatus> {
        self.objects("SELECT drive, partition, object FROM components WHERE drive = ?1", drive)
    }

    fn object_known(&mut self, o: &ObjectRef) -> Result<bool, FsStatus> {
        let sql = "SELECT EXISTS (SELECT 1 FROM components WHERE drive = ?1 AND partition = ?2 AND object = ?3) \
                   OR EXISTS (SELECT 1 FROM pool WHERE drive = ?1 AND partition = ?2 AND object = ?3) \
                   OR EXISTS (SELECT 1 FROM doomed WHERE drive = ?1 AND partition = ?2 AND object = ?3)";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        st.query_row(obj_params(o), |r| r.get(0)).map_err(internal)
    }

    fn put_component(&mut self, ino: Ino, idx: usize, c: &Component) -> Result<(), FsStatus> {
        let (d, p, o) = obj_params(&c.object);
        self.exec(
            "INSERT INTO components (ino, idx, drive, partition, object, state) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
             ON CONFLICT (ino, idx) DO UPDATE SET drive = excluded.drive, partition = excluded.partition, \
             object = excluded.object, state = excluded.state",
            params![ino as i64, limit_param(idx), d, p, o, c.state.code()],
        )?;
        Ok(())
    }

    fn delete_components(&mut self, ino: Ino) -> Result<(), FsStatus> {
        self.exec("DELETE FROM components WHERE ino = ?1", [ino as i64])?;
        Ok(())
    }

    fn component_of(&mut self, o: &ObjectRef) -> Result<Option<(Ino, usize)>, FsStatus> {
        let sql = "SELECT ino, idx FROM components WHERE drive = ?1 AND partition = ?2 AND object = ?3";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        st.query_row(obj_params(o), |r| Ok((u64_col(r, 0)?, usize_col(r, 1)?))).optional().map_err(internal)
    }

    fn list_stale_components(&mut self, after: (Ino, usize), limit: usize) -> Result<Vec<(Ino, usize)>, FsStatus> {
        let sql = "SELECT ino, idx FROM components WHERE state = 1 AND (ino, idx) > (?1, ?2) \
                   ORDER BY ino, idx LIMIT ?3";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st
            .query_map(params![after.0 as i64, limit_param(after.1), limit_param(limit)], |r| {
                Ok((u64_col(r, 0)?, usize_col(r, 1)?))
            })
            .map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn list_components_on_drive(
        &mut self,
        drive: u32,
        after: (Ino, usize),
        limit: usize,
    ) -> Result<Vec<(Ino, usize, ObjectRef)>, FsStatus> {
        let sql = "SELECT drive, partition, object, ino, idx FROM components \
                   WHERE drive = ?1 AND (ino, idx) > (?2, ?3) ORDER BY ino, idx LIMIT ?4";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st
            .query_map(params![drive, after.0 as i64, limit_param(after.1), limit_param(limit)], |r| {
                Ok((u64_col(r, 3)?, usize_col(r, 4)?, object_from_row(r)?))
            })
            .map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn component_counts(&mut self) -> Result<Vec<(u32, u64)>, FsStatus> {
        let sql = "SELECT d.drive, (SELECT COUNT(*) FROM components c WHERE c.drive = d.drive) \
                   FROM drives d ORDER BY d.drive";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st.query_map([], |r| Ok((u32_col(r, 0)?, u64_col(r, 1)?))).map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn count_degraded(&mut self) -> Result<u64, FsStatus> {
        let sql = "SELECT COUNT(DISTINCT ino) FROM components WHERE state = 1";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        st.query_row([], |r| u64_col(r, 0)).map_err(internal)
    }

    fn get_stale_ranges(&mut self, ino: Ino, idx: usize) -> Result<Vec<StaleRange>, FsStatus> {
        let sql = "SELECT \"offset\", length FROM stale_ranges WHERE ino = ?1 AND idx = ?2 ORDER BY \"offset\"";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st
            .query_map(params![ino as i64, limit_param(idx)], |r| {
                Ok(StaleRange { offset: u64_col(r, 0)?, length: u64_col(r, 1)? })
            })
            .map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn put_stale_range(&mut self, ino: Ino, idx: usize, range: &StaleRange) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO stale_ranges (ino, idx, \"offset\", length) VALUES (?1, ?2, ?3, ?4)",
            params![ino as i64, limit_param(idx), range.offset as i64, range.length as i64],
        )?;
        Ok(())
    }

    fn delete_stale_ranges(&mut self, ino: Ino, idx: Option<usize>) -> Result<(), FsStatus> {
        self.exec(
            "DELETE FROM stale_ranges WHERE ino = ?1 AND (?2 IS NULL OR idx = ?2)",
            params![ino as i64, idx.map(limit_param)],
        )?;
        Ok(())
    }

    fn alloc_txn(&mut self) -> Result<u64, FsStatus> {
        let sql = "UPDATE counters SET value = value + 1 WHERE name = 'next_txn' RETURNING value - 1";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let txn: i64 = st.query_row([], |r| r.get(0)).map_err(internal)?;
        Ok(txn as u64)
    }

    fn put_intent(&mut self, i: &Intent) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO intents (txn, ino, state, uid, deadline_ns, escrow, size_limit, writes, unopened) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
             ON CONFLICT (txn) DO UPDATE SET ino = excluded.ino, state = excluded.state, uid = excluded.uid, \
             deadline_ns = excluded.deadline_ns, escrow = excluded.escrow, size_limit = excluded.size_limit, \
             writes = excluded.writes, unopened = excluded.unopened",
            params![
                i.txn as i64,
                i.ino as i64,
                i.state.code(),
                i.uid,
                i.deadline_ns,
                i.escrow as i64,
                i.size_limit as i64,
                i.writes as i64,
                i.unopened as i64
            ],
        )?;
        Ok(())
    }

    fn get_intent(&mut self, txn: u64) -> Result<Option<Intent>, FsStatus> {
        let sql = concat!("SELECT ", intent_cols!(), " FROM intents WHERE txn = ?1");
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        st.query_row([txn as i64], intent_from_row).optional().map_err(internal)
    }

    fn intent_of_inode(&mut self, ino: Ino) -> Result<Option<Intent>, FsStatus> {
        let sql = concat!("SELECT ", intent_cols!(), " FROM intents WHERE ino = ?1");
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        st.query_row([ino as i64], intent_from_row).optional().map_err(internal)
    }

    fn list_intents(&mut self, after: u64, limit: usize) -> Result<Vec<Intent>, FsStatus> {
        let sql = concat!("SELECT ", intent_cols!(), " FROM intents WHERE txn > ?1 ORDER BY txn LIMIT ?2");
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st.query_map(params![after as i64, limit_param(limit)], intent_from_row).map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn delete_intent(&mut self, txn: u64) -> Result<(), FsStatus> {
        self.exec("DELETE FROM intents WHERE txn = ?1", [txn as i64])?;
        Ok(())
    }

    fn doom(&mut self, o: &ObjectRef) -> Result<(), FsStatus> {
        self.exec("INSERT INTO doomed (drive, partition, object) VALUES (?1, ?2, ?3)", obj_params(o))?;
        Ok(())
    }

    fn list_doomed(&mut self, drive: Option<u32>, limit: usize) -> Result<Vec<ObjectRef>, FsStatus> {
        let sql = "SELECT drive, partition, object FROM doomed WHERE ?2 IS NULL OR drive = ?2 \
                   ORDER BY drive, partition, object LIMIT ?1";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st
            .query_map(rusqlite::params![limit_param(limit), drive.map(i64::from)], object_from_row)
            .map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn doomed_objects(&mut self, drive: u32) -> Result<Vec<ObjectRef>, FsStatus> {
        self.objects("SELECT drive, partition, object FROM doomed WHERE drive = ?1", drive)
    }

    fn forget_doomed(&mut self, o: &ObjectRef) -> Result<(), FsStatus> {
        self.exec("DELETE FROM doomed WHERE drive = ?1 AND partition = ?2 AND object = ?3", obj_params(o))?;
        Ok(())
    }

    fn put_acv_intent(&mut self, i: &AcvIntent) -> Result<(), FsStatus> {
        let (d, p, o) = obj_params(&i.object);
        self.exec(
            "INSERT INTO acv_intents (drive, partition, object, acv) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (drive, partition, object) DO UPDATE SET acv = excluded.acv",
            [d, p, o, i.acv as i64],
        )?;
        Ok(())
    }

    fn list_acv_intents(&mut self, drive: Option<u32>, limit: usize) -> Result<Vec<AcvIntent>, FsStatus> {
        let sql = "SELECT drive, partition, object, acv FROM acv_intents WHERE ?2 IS NULL OR drive = ?2 \
                   ORDER BY drive, partition, object LIMIT ?1";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st
            .query_map(rusqlite::params![limit_param(limit), drive.map(i64::from)], |r| {
                Ok(AcvIntent { object: object_from_row(r)?, acv: u64_col(r, 3)? })
            })
            .map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn delete_acv_intent(&mut self, o: &ObjectRef, only_acv: Option<u64>) -> Result<(), FsStatus> {
        let (d, p, ob) = obj_params(o);
        self.exec(
            "DELETE FROM acv_intents WHERE drive = ?1 AND partition = ?2 AND object = ?3 AND (?4 IS NULL OR acv = ?4)",
            params![d, p, ob, only_acv.map(|a| a as i64)],
        )?;
        Ok(())
    }

    fn get_setting(&mut self, key: &str) -> Result<Option<Vec<u8>>, FsStatus> {
        let mut st = self.c.prepare_cached("SELECT value FROM settings WHERE key = ?1").map_err(internal)?;
        st.query_row([key], |r| r.get(0)).optional().map_err(internal)
    }

    fn put_setting(&mut self, key: &str, value: &[u8]) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO settings (key, value) VALUES (?1, ?2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![key, value],
        )?;
        Ok(())
    }
    /// SQLite runs in the manager's process: the local clock is the database's.
    fn now_ms(&mut self) -> Result<u64, FsStatus> {
        Ok(self.env.now_ns() / 1_000_000)
    }

    fn get_lease(&mut self, name: &str) -> Result<Option<Lease>, FsStatus> {
        let sql = "SELECT name, holder, token, expires_ms FROM leases WHERE name = ?1";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        st.query_row([name], lease_from_row).optional().map_err(internal)
    }

    fn put_lease(&mut self, l: &Lease) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO leases (name, holder, token, expires_ms) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = excluded.token, \
             expires_ms = excluded.expires_ms",
            params![l.name, l.holder, l.token as i64, l.expires_ms as i64],
        )?;
        Ok(())
    }

    fn delete_lease(&mut self, name: &str) -> Result<(), FsStatus> {
        self.exec("DELETE FROM leases WHERE name = ?1", [name])?;
        Ok(())
    }

    fn list_leases(&mut self, prefix: &str, limit: usize) -> Result<Vec<Lease>, FsStatus> {
        let sql = "SELECT name, holder, token, expires_ms FROM leases \
                   WHERE substr(name, 1, length(?1)) = ?1 ORDER BY name LIMIT ?2";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st.query_map(params![prefix, limit_param(limit)], lease_from_row).map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }

    fn list_names_ending(
        &mut self,
        suffix: &str,
        after_dir: Ino,
        after_name: &str,
        limit: usize,
    ) -> Result<Vec<(Ino, String, Ino)>, FsStatus> {
        let sql = "SELECT dir, name, child FROM dirents \
                   WHERE substr(name, -length(?1)) = ?1 AND (dir > ?2 OR (dir = ?2 AND name > ?3)) \
                   ORDER BY dir, name LIMIT ?4";
        let mut st = self.c.prepare_cached(sql).map_err(internal)?;
        let rows = st
            .query_map(params![suffix, after_dir as i64, after_name, limit_param(limit)], |r| {
                Ok((u64_col(r, 0)?, r.get::<_, String>(1)?, u64_col(r, 2)?))
            })
            .map_err(internal)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(internal)
    }
}

fn lease_from_row(r: &Row<'_>) -> rusqlite::Result<Lease> {
    Ok(Lease { name: r.get(0)?, holder: r.get(1)?, token: u64_col(r, 2)?, expires_ms: u64_col(r, 3)? })
}

/// An ACL row as an entry; a row no entry could have written is a backend
/// failure (`Internal`, logged), shared by both backends.
pub(crate) fn acl_entry(kind: i64, id: i64, rights: i64, flags: i64) -> Result<AclEntry, FsStatus> {
    let decoded = (|| {
        let who = AclWho::from_code(u8::try_from(kind).ok()?, u32::try_from(id).ok()?).ok()?;
        let e = AclEntry { who, rights: u8::try_from(rights).ok()?, flags: u8::try_from(flags).ok()? };
        e.validate().ok().map(|()| e)
    })();
    decoded.ok_or_else(|| {
        tracing::error!(kind, id, rights, flags, "metadata store holds an ACL row no entry encodes");
        FsStatus::Internal
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.sqlite");
        drop(Sqlite::open(&path).unwrap());
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
        drop(conn);
        assert!(matches!(Sqlite::open(&path), Err(MetaError::TooNew { found, .. }) if found == SCHEMA_VERSION + 1));
    }

    #[test]
    fn reopen_keeps_version_and_counters() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.sqlite");
        let db = Sqlite::open(&path).unwrap();
        assert_eq!(db.transact(|t| t.alloc_ino()).unwrap(), 2);
        assert_eq!(db.transact(|t| t.alloc_txn()).unwrap(), 1, "txn 0 means none");
        assert_eq!(db.transact(|t| t.alloc_txn()).unwrap(), 2);
        drop(db);
        let db = Sqlite::open(&path).unwrap();
        assert_eq!(db.transact(|t| t.alloc_ino()).unwrap(), 3);
        assert_eq!(db.transact(|t| t.alloc_txn()).unwrap(), 3, "txn ids are never reused across a reopen");
        let v: i64 = db.lock().unwrap().pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
    }

    #[test]
    fn the_migration_literal_is_the_single_layout() {
        assert_eq!(layout_bytes(&Layout::SINGLE), [0x00, 0x00, 0x10, 0x00, 0x01, 0x01, 0x00]);
        assert!(V2.contains("X'00001000010100'"));
        assert_eq!(layout_from_bytes(&layout_bytes(&Layout::SINGLE)), Some(Layout::SINGLE));
        assert_eq!(layout_from_bytes(&[0, 0, 16, 0, 1, 1, 0, 0]), None, "trailing bytes");
        assert_eq!(layout_from_bytes(&[0, 0, 16, 0, 1, 0, 0]), None, "out of bounds");
    }

    /// A v1 database (one object per file) as the previous build wrote it:
    /// the root, a directory, three files (one with two links, one with an
    /// ACV intent pending), a symlink, pooled and doomed objects, a drive.
    fn write_v1(path: &Path) {
        let mut conn = Connection::open(path).unwrap();
        let tx = conn.transaction().unwrap();
        tx.execute_batch(V1).unwrap();
        tx.pragma_update(None, "user_version", 1).unwrap();
        let inode = "INSERT INTO inodes (ino, kind, mode, nlink, uid, gid, size, atime_ns, mtime_ns, ctime_ns, \
                     target, obj_drive, obj_partition, obj_object, acv) \
                     VALUES (?1, ?2, ?3, ?4, 1000, 100, ?5, 1, 2, 3, ?6, ?7, ?8, ?9, ?10)";
        type Row = (i64, u8, u32, u32, i64, Option<&'static str>, Option<i64>, Option<i64>, Option<i64>, i64);
        let rows: [Row; 6] = [
            (1, 2, 0o755, 3, 4, None, None, None, None, 0),
            (2, 2, 0o755, 2, 2, None, None, None, None, 0),
            (3, 1, 0o644, 2, 4096, None, Some(0), Some(1), Some(16), 2),
            (4, 1, 0o600, 1, 0, None, Some(1), Some(1), Some(16), 0),
            (5, 1, 0o644, 1, 7, None, Some(0), Some(1), Some(17), 1),
            (6, 3, 0o777, 1, 4, Some("/d/a"), None, None, None, 0),
        ];
        for r in rows {
            tx.execute(inode, params![r.0, r.1, r.2, r.3, r.4, r.5, r.6, r.7, r.8, r.9]).unwrap();
        }
        tx.execute_batch(
            "INSERT INTO dir_parents (dir, parent) VALUES (1, 1), (2, 1);
             INSERT INTO dirents (dir, name, child) VALUES (1, 'd', 2), (1, 'a', 3), (2, 'a', 3), (2, 'b', 4),
                 (1, 'c', 5), (1, 'l', 6);
             UPDATE counters SET value = 7 WHERE name = 'next_ino';
             INSERT INTO drives (drive, drive_id, addr, partition, sealed_keys, capacity_bytes)
                 VALUES (0, X'00000000000000000000000000000000', '127.0.0.1:1', 1, X'01', 100),
                        (1, X'01010101010101010101010101010101', '127.0.0.1:2', 1, X'02', 100);
             INSERT INTO pool (drive, partition, object) VALUES (0, 1, 20), (1, 1, 20);
             INSERT INTO doomed (drive, partition, object) VALUES (0, 1, 30);
             INSERT INTO acv_intents (drive, partition, object, acv) VALUES (0, 1, 17, 1);
             INSERT INTO settings (key, value) VALUES ('file_system_id', X'0102');
             INSERT INTO users (name, uid, gid, password_hash, admin) VALUES ('una', 1000, 100, 'hash', 0);",
        )
        .unwrap();
        tx.commit().unwrap();
    }

    /// Opening a v1 database migrates it: every file keeps its object as
    /// component 0 of layout `Layout::SINGLE` (state Ok), the root gets
    /// `Layout::SINGLE`, other directories none; everything else stays.
    #[test]
    fn a_v1_database_migrates_to_components() {
        use crate::testing::{check_invariants, snapshot};
        use crate::{Caller, Namespace};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.sqlite");
        write_v1(&path);
        let ns = Namespace::new(Sqlite::open(&path).unwrap(), Layout::parse("rs:2+1").unwrap()).unwrap();
        let v: i64 = ns.backend().lock().unwrap().pragma_query_value(None, "user_version", |r| r.get(0)).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        check_invariants(&ns);
        let o = |drive: u32, object: u64| ObjectRef { drive, partition: 1, object };
        let file = |path: &str| ns.walk(&Caller::ROOT, path, false).unwrap();
        for (path, object, size, acv) in [("/a", o(0, 16), 4096, 2), ("/d/b", o(1, 16), 0, 0), ("/c", o(0, 17), 7, 1)] {
            let n = file(path);
            assert_eq!(n.layout, Some(Layout::SINGLE), "{path}");
            assert_eq!(n.components, vec![Component { object, state: ComponentState::Ok }], "{path}");
            assert_eq!((n.attr.size, n.acv, n.attr.uid, n.attr.mtime_ns), (size, acv, 1000, 2), "{path}");
            // v11: an existing file is taken as dense (its quota usage does not move).
            assert_eq!((n.data_bytes, n.attr.allocated), (size, size), "{path}");
        }
        assert_eq!(file("/d/a"), file("/a"), "hard links");
        assert_eq!(file("/d/a").attr.nlink, 2);
        assert_eq!(
            ns.effective_layout(nasd_proto::fs::ROOT_INO).unwrap(),
            (Layout::SINGLE, true),
            "the root keeps v1 placement"
        );
        assert_eq!(file("/d").layout, None);
        assert_eq!(ns.effective_layout(2).unwrap(), (Layout::SINGLE, false));
        let l = file("/l");
        assert_eq!((l.layout, l.components.len(), l.target.as_deref()), (None, 0, Some("/d/a")));
        let snap = snapshot(&ns);
        assert_eq!(snap.pool, [o(0, 20), o(1, 20)].into_iter().collect());
        assert_eq!(snap.doomed, vec![o(0, 30)]);
        assert_eq!(snap.intents, vec![AcvIntent { object: o(0, 17), acv: 1 }]);
        assert_eq!(snap.write_intents, vec![]);
        assert_eq!(snap.map_epoch, Some(vec![0, 0, 0, 0]));
        assert!(snap.drives.iter().all(|d| d.failure_domain.is_empty() && d.state == DriveState::In));
        assert_eq!(ns.known_objects(0).unwrap(), [16, 17, 20, 30].into_iter().collect());
        assert_eq!(ns.component_of(&o(1, 16)).unwrap(), Some((4, 0)));
        assert_eq!(ns.setting("file_system_id").unwrap(), Some(vec![1, 2]));
        let una = ns.user("una").unwrap().expect("users survive");
        assert_eq!((una.uid, una.gid, una.groups), (1000, 100, vec![]), "no supplementary groups after v3");
        assert_eq!(ns.component_counts().unwrap(), vec![(0, 2), (1, 1)]);
        // The migrated database works on: new inode numbers and txn ids, new files.
        let txn = ns.begin_write(&Caller::ROOT, 3, 0).unwrap();
        assert_eq!(txn, 1);
        let (f, _) =
            ns.create(&Caller::ROOT, 1, "new", 0o644, true, false, &mut crate::testing::pool_placer(&[0])).unwrap();
        assert_eq!((f.attr.ino, f.components[0].object), (7, o(0, 20)));
        // The old object columns are gone, and two files still cannot share an object.
        let conn = ns.backend().lock().unwrap();
        let cols: Vec<String> = conn
            .prepare("SELECT name FROM pragma_table_info('inodes')")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(!cols.iter().any(|c| c.starts_with("obj_")), "{cols:?}");
        assert!(conn.execute("INSERT INTO components VALUES (5, 1, 0, 1, 16, 0)", []).is_err(), "unique object");
        assert!(conn.execute("INSERT INTO intents VALUES (99, 3, 0, 0, 0)", []).is_err(), "one intent per file");
    }

    #[test]
    fn read_refuses_writes_and_rolls_back() {
        let db = Sqlite::open_in_memory().unwrap();
        assert_eq!(db.read(|t| t.put_setting("k", b"v")), Err(FsStatus::Internal));
        assert_eq!(db.transact(|t| t.get_setting("k")).unwrap(), None);
        db.transact(|t| t.put_setting("k", b"v")).unwrap();
        assert_eq!(db.read(|t| t.get_setting("k")).unwrap(), Some(b"v".to_vec()));
    }

    /// Group commit: a commit is counted and not durable until a sync; one
    /// flush covers every commit before it, and a sync with nothing new
    /// flushes nothing. Readers on their own connections see every commit
    /// at once, also while the writer holds its lock.
    #[test]
    fn commits_wait_for_one_shared_flush_and_readers_never_wait_for_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let db = Sqlite::open(&dir.path().join("meta.sqlite")).unwrap();
        assert_eq!(db.readers.len(), SQLITE_READERS);
        let start = db.durability();
        for i in 0..5u8 {
            db.transact(|t| t.put_setting("k", &[i])).unwrap();
        }
        let d = db.durability();
        assert_eq!(d.committed, start.committed + 5);
        assert_eq!(d.durable, start.durable, "nothing flushed yet: synchronous=NORMAL");
        db.sync().unwrap();
        let d = db.durability();
        assert_eq!((d.durable, d.syncs), (d.committed, start.syncs + 1), "one flush for five commits");
        db.sync().unwrap();
        assert_eq!(db.durability().syncs, start.syncs + 1, "nothing new: no flush");
        // A reader sees the last commit while the writer is held by someone else.
        let writer = db.lock().unwrap();
        assert_eq!(db.read(|t| t.get_setting("k")).unwrap(), Some(vec![4]));
        drop(writer);
        // Durable across a reopen (the process's crash is the OS keeping the log's pages).
        drop(db);
        let db = Sqlite::open(&dir.path().join("meta.sqlite")).unwrap();
        assert_eq!(db.read(|t| t.get_setting("k")).unwrap(), Some(vec![4]));
    }

    /// Set in the child process of `a_panic_inside_a_transaction_stops_the_process`.
    const POISON_CHILD_ENV: &str = "NASD_META_POISON_CHILD";

    /// Fail-stop: after a panic inside a transaction (a broken invariant) the
    /// next use of the database aborts the process, instead of the manager
    /// answering `Internal` to every request until someone restarts it. Runs
    /// itself again as a child process, which must die of SIGABRT.
    #[test]
    fn a_panic_inside_a_transaction_stops_the_process() {
        if std::env::var_os(POISON_CHILD_ENV).is_some() {
            let db = Sqlite::open_in_memory().unwrap();
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _ = db.transact(|_| -> Result<(), FsStatus> { panic!("a broken invariant") });
            }));
            assert!(panicked.is_err());
            let after = db.read(|t| t.get_setting("k"));
            // Not reached with fail-stop: the read above aborts.
            println!("SURVIVED: {after:?}");
            std::process::exit(0);
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "sqlite::tests::a_panic_inside_a_transaction_stops_the_process", "--nocapture"])
            .env(POISON_CHILD_ENV, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stdout.contains("SURVIVED"), "the process went on after the panic: {stdout}");
        use std::os::unix::process::ExitStatusExt;
        const SIGABRT: i32 = 6;
        assert_eq!(out.status.signal(), Some(SIGABRT), "{}\n{stdout}\n{stderr}", out.status);
        assert!(stderr.contains("panic interrupted a metadata transaction"), "{stderr}");
    }

    #[test]
    fn failed_transaction_rolls_back() {
        let db = Sqlite::open_in_memory().unwrap();
        let r: Result<(), _> = db.transact(|t| {
            t.put_setting("k", b"v")?;
            Err(FsStatus::Exists)
        });
        assert_eq!(r, Err(FsStatus::Exists));
        assert_eq!(db.read(|t| t.get_setting("k")).unwrap(), None);
    }
}
