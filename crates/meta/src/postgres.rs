//! The PostgreSQL backend: the same rows as [`crate::Sqlite`], in a
//! PostgreSQL database that several machines can reach.
//!
//! # Transactions
//! Every transaction runs at `ISOLATION LEVEL SERIALIZABLE` (read-only ones
//! `READ ONLY` as well), so the name space's rules, written for one
//! serializable transaction at a time, hold unchanged. PostgreSQL enforces
//! that by failing one of two transactions whose effects could not have
//! happened one after the other (SQLSTATE `40001`) or that deadlock
//! (`40P01`): the attempt ends in [`TxnError::Conflict`] and
//! [`Backend::transact`] runs the closure again, with backoff
//! ([`crate::with_retries`]).
//!
//! # Writers
//! Read-write transactions of every backend on a database run at once (no
//! writers' turn across managers, issue 24), at most [`WRITERS_MAX`] per
//! backend (its [`PgOptions::writers_max`]); read-only ones run beside them
//! on the rest of its [`CONNECTIONS_MAX`] connections. Serializable
//! transactions that run at once conflict when PostgreSQL's predicate locks
//! say they might not be serializable, and those locks are coarse: an index
//! scan locks the B-tree *page* it reads, a sequential scan the whole table,
//! and more than two rows read on one heap page become a lock on the page.
//! So the name space's rows are laid out for writers in different
//! directories not to share pages:
//! - **Inode numbers in blocks per connection.** Each connection takes
//!   [`INO_BLOCK`] numbers at a time from the sequence `next_ino_block` and
//!   hands them out in order, so two writers' new inodes — and the rows
//!   keyed by inode (components, names' children, parents, PAL members) —
//!   go to index pages a million keys apart, not to one right-most leaf as
//!   when every create took the next number of one sequence. A number is
//!   handed out once (a rolled-back attempt burns it); the rest of a block
//!   goes with its connection.
//! - **Pool takes spread.** A create takes the first pooled object at or
//!   past a random point a little past the last object its connection took
//!   ([`POOL_SPREAD`]), reading that one row: two creates seldom delete
//!   one row ("concurrent delete"), where each used to take the lowest.
//! - **Index scans, not sequential ones**, wherever an index serves
//!   (`enable_seqscan = off` per session): the small tables (drives, leases,
//!   pool, quotas) would otherwise be read whole, and every write to them
//!   conflict with every reader.
//! - **Commit marks per connection** (below): two writers of one backend
//!   never write one row.
//!
//! Conflicts still happen — two writers in one directory share its entries'
//! pages, and while the name space is young every index is a page or two —
//! and never reach a client: the attempt ends in [`TxnError::Conflict`],
//! [`Backend::transact`] runs the closure again with backoff
//! ([`crate::with_retries`]), and [`Postgres::conflicts`] counts them. A
//! transaction that conflicted [`CONFLICTS_BEFORE_ALONE`] times in a row runs
//! its next attempt **alone**: every writer holds the session advisory lock
//! [`WRITER_LOCK`] *shared* from before its `BEGIN` to after its end
//! (pipelined with them: no round trip), and this one takes it *exclusive*,
//! so its snapshot follows every other writer's end and no writer runs
//! beside it. A read-only transaction can never be the pivot of a
//! serialization failure, nor make a lone writer one, so that attempt
//! cannot conflict with nasd's transactions: a create cannot starve behind
//! a stream of shorter writers, and a request fails `BUSY` only if
//! something outside nasd keeps conflicting with it. [`Postgres::alone`]
//! counts those attempts.
//!
//! Measured before this (issue 14, the server's log of SQLSTATE `40001`
//! with its statements): with writers of several managers at once and
//! nothing of the above, every create deleted the same row — the lowest
//! pooled object of the drive — and the upserts and probes of new inodes,
//! components and names all read and wrote the same right-most leaf pages,
//! since inode numbers and object ids only grew; four managers' creates
//! failed `BUSY` after 12 attempts within 60 files. The fix then was one
//! writer at a time across all managers; this layout replaces it
//! (docs/BENCHMARKS.md, "Writers in parallel on PostgreSQL").
//!
//! A failed statement aborts a PostgreSQL transaction (unlike SQLite), so
//! the first failure is kept: every later row operation of the attempt
//! fails at once, and the attempt reports that first failure whatever the
//! closure returns — a closure that swallowed the error cannot commit.
//!
//! A `COMMIT` whose connection is lost (the server killed as it commits)
//! may or may not have committed. Each read-write transaction sets, with
//! its `BEGIN` (pipelined), a new mark in its connection's row of
//! `commit_marks` and asks its transaction id (`txid_current()`). Once the
//! server answers again, a new connection waits until that id is no
//! longer in progress (`txid_status`, for up to [`COMMIT_OUTCOME_WAIT`])
//! and then reads the row: the mark there is success, another
//! `Unavailable` (nothing changed: sent again by the manager's clients),
//! and only an outcome that cannot be told is `Storage`. The id's status is
//! not the answer: after a crash the server hands out again the ids whose
//! log it had not written, so it may tell of another transaction.
//!
//! # Schema
//! The tables are those of the SQLite schema version 2 (see `sqlite.rs`),
//! with these differences: integers are `BIGINT` (a `u64` bit-for-bit, as
//! on SQLite), booleans `BOOLEAN`, blobs `BYTEA`; directory entry and user
//! names are `TEXT COLLATE "C"`, so they sort by bytes whatever the
//! database's locale (as SQLite's `BINARY`); and the inode and write
//! transaction counters are the sequences `next_ino` (from 2) and `next_txn`
//! (from 1). A sequence hands out each number once even to transactions that
//! roll back (a failed or retried operation may burn numbers, never reuse
//! one), and does not make every create conflict on one counter row.
//!
//! The schema version is the one row of `nasd_schema`; `MIGRATIONS[i]` takes
//! version `i` to `i + 1` (version 0: no tables yet). The migrations run on
//! first use, in one transaction under an advisory lock
//! ([`MIGRATION_LOCK`]), so managers starting together against a new
//! database create it once. A database is created too if the server has none
//! of the name (the role needs `CREATEDB` for that). A database newer than
//! [`POSTGRES_SCHEMA_VERSION`] is refused.
//! - 0 → 1: the whole schema, equivalent to SQLite's version 2.
//! - 1 → 2: supplementary groups (`user_groups`), gateway grants, extended
//!   attributes (`xattrs`), device numbers (`rdev`), quotas (`quotas`, the
//!   inodes' `qdir`, the intents' `escrow` and `size_limit`): SQLite's
//!   versions 3 and 4.
//! - 2 → 3: `leases(name, holder, token, expires_ms)` (SQLite's version 5),
//!   the leases several managers on one database share (`crate::Lease`);
//!   their clock is the server's (`clock_timestamp()`), one for every manager.
//! - 3 → 4: small files (SQLite's version 6): the inodes' `small_threshold`,
//!   `small_data(ino, bytes)` and `small_staged(ino, txn, bytes)`.
//! - 4 → 5: `acl_entries(ino, kind, id, rights, flags)` (SQLite's version
//!   7): the named entries of the inodes' global ACLs.
//! - 5 → 6: `pal_pending(ino, seq)` (SQLite's version 8): the files whose
//!   access PAL is not on every component yet.
//! - 6 → 7: the inodes' routing `site` (SQLite's version 9).
//! - 7 → 8: PAL collections (SQLite's version 10): `pal_members(ino,
//!   collection)` and `collection_pending(ino, seq)`.
//! - 8 → 9: the intents' `writes` and `unopened` component bit sets
//!   (SQLite's version 11).
//! - 9 → 10: sparse files (SQLite's version 12): the inodes' `data_bytes`.
//! - 10 → 11: `commit_marks(writer, seq, at)`, one row per connection (no
//!   SQLite counterpart; one per backend before issue 24): what tells
//!   whether a `COMMIT` that lost its connection committed; rows not set for
//!   [`COMMIT_MARK_KEEP_DAYS`] removed at open.
//! - 11 → 12: the sequence `next_ino_block` (no SQLite counterpart), from
//!   the first block above every number `next_ino` handed out, which is no
//!   longer used ("Writers" above).
//!
//! # Connections
//! The client is `tokio-postgres` on a small runtime of the backend's own
//! (one thread): the calls block the calling thread on a future, which works
//! from any thread — a tokio worker too, where a blocking client built on
//! `Runtime::block_on` would panic. Connections are opened when needed, kept
//! idle for reuse, and dropped when broken; each has a statement timeout
//! ([`STATEMENT_TIMEOUT`]). The connection string is resolved as libpq
//! users expect ([`crate::pg_connect`]: the password from `$PGPASSWORD`, a
//! password file or `~/.pgpass`; TLS by `sslmode`, up to `verify-full`) and
//! is never logged or put in an error: [`Postgres::target`] is what names
//! the database.

use crate::backend::{Access, Backend, PalPush, Txn, TxnError};
use crate::error::{postgres_detail, MetaError};
use crate::pg_connect::{PgOptions, PgTarget};
use crate::types::{
    AcvIntent, DirEntry, DriveRecord, Inode, Intent, IntentState, Lease as LeaseRow, Quota, QuotaSubject, StaleRange,
    User,
};
use nasd_proto::acl::AclEntry;
use nasd_proto::codec::{Reader, Writer};
use nasd_proto::fs::{FileAttr, FileKind, FsStatus, Ino, ObjectRef};
use nasd_proto::layout::{Component, ComponentState, Layout};
use nasd_proto::manager::DriveState;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, Row, Statement};

/// Version 1: the whole schema (see the module documentation).
const V1: &str = r#"
CREATE TABLE inodes (
    ino BIGINT PRIMARY KEY, kind BIGINT NOT NULL, mode BIGINT NOT NULL,
    nlink BIGINT NOT NULL, uid BIGINT NOT NULL, gid BIGINT NOT NULL,
    size BIGINT NOT NULL, atime_ns BIGINT NOT NULL, mtime_ns BIGINT NOT NULL,
    ctime_ns BIGINT NOT NULL, target TEXT, layout BYTEA, acv BIGINT NOT NULL);
CREATE TABLE dir_parents (
    dir BIGINT PRIMARY KEY REFERENCES inodes (ino),
    parent BIGINT NOT NULL REFERENCES inodes (ino));
CREATE TABLE dirents (
    dir BIGINT NOT NULL REFERENCES inodes (ino), name TEXT COLLATE "C" NOT NULL,
    child BIGINT NOT NULL REFERENCES inodes (ino),
    PRIMARY KEY (dir, name));
CREATE INDEX dirents_child ON dirents (child);
CREATE SEQUENCE next_ino START 2;
CREATE SEQUENCE next_txn START 1;
CREATE TABLE users (
    name TEXT COLLATE "C" PRIMARY KEY, uid BIGINT NOT NULL UNIQUE, gid BIGINT NOT NULL,
    password_hash TEXT NOT NULL, admin BOOLEAN NOT NULL);
CREATE TABLE drives (
    drive BIGINT PRIMARY KEY, drive_id BYTEA NOT NULL UNIQUE, addr TEXT NOT NULL,
    partition BIGINT NOT NULL, sealed_keys BYTEA NOT NULL, capacity_bytes BIGINT NOT NULL,
    failure_domain TEXT NOT NULL, state BIGINT NOT NULL);
CREATE TABLE pool (
    drive BIGINT NOT NULL, partition BIGINT NOT NULL, object BIGINT NOT NULL,
    PRIMARY KEY (drive, partition, object));
CREATE TABLE doomed (
    drive BIGINT NOT NULL, partition BIGINT NOT NULL, object BIGINT NOT NULL,
    PRIMARY KEY (drive, partition, object));
CREATE TABLE acv_intents (
    drive BIGINT NOT NULL, partition BIGINT NOT NULL, object BIGINT NOT NULL,
    acv BIGINT NOT NULL, PRIMARY KEY (drive, partition, object));
CREATE TABLE settings (key TEXT PRIMARY KEY, value BYTEA NOT NULL);
INSERT INTO settings (key, value) VALUES ('map_epoch', '\x00000000'::BYTEA);
CREATE TABLE components (
    ino BIGINT NOT NULL REFERENCES inodes (ino), idx BIGINT NOT NULL,
    drive BIGINT NOT NULL, partition BIGINT NOT NULL, object BIGINT NOT NULL,
    state BIGINT NOT NULL, PRIMARY KEY (ino, idx));
CREATE UNIQUE INDEX components_object ON components (drive, partition, object);
CREATE INDEX components_drive ON components (drive, ino, idx);
CREATE INDEX components_stale ON components (ino, idx) WHERE state = 1;
CREATE TABLE stale_ranges (
    ino BIGINT NOT NULL, idx BIGINT NOT NULL, "offset" BIGINT NOT NULL, length BIGINT NOT NULL,
    PRIMARY KEY (ino, idx, "offset"),
    FOREIGN KEY (ino, idx) REFERENCES components (ino, idx));
CREATE TABLE intents (
    txn BIGINT PRIMARY KEY, ino BIGINT NOT NULL UNIQUE REFERENCES inodes (ino),
    state BIGINT NOT NULL, uid BIGINT NOT NULL, deadline_ns BIGINT NOT NULL);
"#;

/// Version 2: what SQLite's versions 3 and 4 added (see the module
/// documentation).
const V2: &str = r#"
CREATE TABLE user_groups (
    name TEXT NOT NULL REFERENCES users (name), gid BIGINT NOT NULL,
    PRIMARY KEY (name, gid));
ALTER TABLE users ADD COLUMN gateway_lo BIGINT;
ALTER TABLE users ADD COLUMN gateway_hi BIGINT;
CREATE TABLE xattrs (
    ino BIGINT NOT NULL REFERENCES inodes (ino), name TEXT COLLATE "C" NOT NULL, value BYTEA NOT NULL,
    PRIMARY KEY (ino, name));
ALTER TABLE inodes ADD COLUMN rdev BIGINT NOT NULL DEFAULT 0;
ALTER TABLE inodes ADD COLUMN qdir BIGINT NOT NULL DEFAULT 0;
CREATE INDEX inodes_uid ON inodes (uid);
CREATE INDEX inodes_qdir ON inodes (qdir) WHERE qdir <> 0;
ALTER TABLE intents ADD COLUMN escrow BIGINT NOT NULL DEFAULT 0;
ALTER TABLE intents ADD COLUMN size_limit BIGINT NOT NULL DEFAULT -1;
CREATE TABLE quotas (
    kind BIGINT NOT NULL, id BIGINT NOT NULL, bytes_limit BIGINT, files_limit BIGINT,
    bytes_used BIGINT NOT NULL, files_used BIGINT NOT NULL,
    PRIMARY KEY (kind, id));
"#;

/// Version 3: leases shared by the managers of one database (SQLite's version 5).
const V3: &str = r#"
CREATE TABLE leases (
    name TEXT COLLATE "C" PRIMARY KEY, holder TEXT NOT NULL, token BIGINT NOT NULL, expires_ms BIGINT NOT NULL);
"#;

/// Version 4: small files (SQLite's version 6; [`crate::small`]).
const V4: &str = r#"
ALTER TABLE inodes ADD COLUMN small_threshold BIGINT NOT NULL DEFAULT 0;
CREATE TABLE small_data (
    ino BIGINT PRIMARY KEY REFERENCES inodes (ino), bytes BYTEA NOT NULL);
CREATE TABLE small_staged (
    ino BIGINT PRIMARY KEY REFERENCES inodes (ino), txn BIGINT NOT NULL, bytes BYTEA NOT NULL);
"#;

/// Version 5: global ACLs (SQLite's version 7).
const V5: &str = r#"
CREATE TABLE acl_entries (
    ino BIGINT NOT NULL REFERENCES inodes (ino), kind BIGINT NOT NULL, id BIGINT NOT NULL,
    rights BIGINT NOT NULL, flags BIGINT NOT NULL,
    PRIMARY KEY (ino, kind, id));
"#;

/// Version 6: files whose PAL push failed (SQLite's version 8).
const V6: &str = r#"
CREATE TABLE pal_pending (ino BIGINT PRIMARY KEY, seq BIGINT NOT NULL);
"#;

/// Version 7: routing sites (SQLite's version 9; `crate::routing`).
const V7: &str = r#"
ALTER TABLE inodes ADD COLUMN site BIGINT NOT NULL DEFAULT 0;
"#;

/// Version 8: PAL collections (SQLite's version 10).
const V8: &str = r#"
CREATE TABLE pal_members (ino BIGINT PRIMARY KEY, collection BIGINT NOT NULL);
CREATE INDEX pal_members_collection ON pal_members (collection, ino);
CREATE TABLE collection_pending (ino BIGINT PRIMARY KEY, seq BIGINT NOT NULL);
"#;

/// Version 9: the components a write transaction may change and those it
/// could not be opened on (SQLite's version 11).
const V9: &str = r#"
ALTER TABLE intents ADD COLUMN writes BIGINT NOT NULL DEFAULT -1;
ALTER TABLE intents ADD COLUMN unopened BIGINT NOT NULL DEFAULT 0;
"#;

/// Version 10: sparse files (SQLite's version 12): the bytes each regular
/// file's components store, existing files taken as dense.
const V10: &str = r#"
ALTER TABLE inodes ADD COLUMN data_bytes BIGINT NOT NULL DEFAULT 0;
UPDATE inodes SET data_bytes = size - LEAST(size, small_threshold) WHERE kind = 1;
"#;

/// Version 11: commit marks (no SQLite counterpart): one row per open
/// connection (per backend before issue 24), set by each of its read-write transactions, so
/// that a `COMMIT` that lost its connection is known to have committed by
/// its own row, not by its transaction id, which a server restarted after
/// a crash may hand out again ([`Postgres::commit_outcome`]).
const V11: &str = r#"
CREATE TABLE commit_marks (writer BIGINT PRIMARY KEY, seq BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL);
"#;

/// Version 12: inode numbers in blocks (no SQLite counterpart): each
/// connection takes a block of [`INO_BLOCK`] numbers at a time from
/// `next_ino_block`, the first block above every number `next_ino` handed
/// out (see "Writers" in the module documentation).
const V12: &str = r#"
CREATE SEQUENCE next_ino_block MINVALUE 1;
SELECT setval('next_ino_block', (SELECT last_value FROM next_ino) / 1048576 + 1, false);
"#;

/// Rows of `commit_marks` not set for this long are removed when a backend
/// opens the database: a row is read only by its own connection's backend,
/// right after a `COMMIT` whose `BEGIN` set it, so only the rows of
/// connections that are gone get this old (one idle that long sets its row
/// again with its next `BEGIN`).
pub const COMMIT_MARK_KEEP_DAYS: u32 = 7;

/// The migration chain: entry `i` takes schema version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11, V12];

/// The PostgreSQL schema version this build writes (its own chain, apart
/// from SQLite's [`crate::SCHEMA_VERSION`]).
pub const POSTGRES_SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The advisory lock key migrations hold (`pg_advisory_xact_lock`): "nasd"
/// in ASCII.
pub const MIGRATION_LOCK: i64 = 0x6e61_7364;

/// The advisory lock key every read-write transaction of every backend on a
/// database holds from before its `BEGIN` until after its end ("nasdwr" in
/// ASCII): shared, so writers run at once, or — a transaction that has
/// conflicted [`CONFLICTS_BEFORE_ALONE`] times in a row — exclusive, so it
/// runs with no other writer and cannot conflict again (see "Writers" in
/// the module documentation).
pub const WRITER_LOCK: i64 = 0x6e61_7364_7772;

/// Conflicts in a row after which a transaction's next attempt runs alone
/// among the writers ([`WRITER_LOCK`] exclusive): conflicts end, whatever
/// the load, long before [`crate::TXN_ATTEMPTS_MAX`].
pub const CONFLICTS_BEFORE_ALONE: u32 = 3;
const _: () = assert!(CONFLICTS_BEFORE_ALONE + 1 < crate::TXN_ATTEMPTS_MAX);

/// Most read-write transactions one backend runs at once (see "Writers" in
/// the module documentation); the rest of its [`CONNECTIONS_MAX`]
/// connections serve reads.
pub const WRITERS_MAX: usize = 4;

/// A create takes the first pooled object of a drive at or past a random
/// point up to this far past the last one its connection took (see
/// "Writers" in the module documentation).
const POOL_SPREAD: u64 = 32;

/// Inode numbers a connection takes from the database at a time: block `b`
/// of the sequence `next_ino_block` is `b * INO_BLOCK .. (b + 1) * INO_BLOCK`
/// (see "Writers" in the module documentation).
pub const INO_BLOCK: u64 = 1 << 20;
const _: () = assert!(INO_BLOCK == 1_048_576, "the literal in V12 is INO_BLOCK");

/// Most connections one backend opens, for its writers and its readers.
/// Each costs a server process.
pub const CONNECTIONS_MAX: usize = 8;
/// Longest wait for a free connection before a transaction fails with
/// [`TxnError::Storage`].
pub const CONNECTION_WAIT_MAX: Duration = Duration::from_secs(30);
/// Longest a writer whose `COMMIT` lost its connection waits for the server
/// to say whether it committed ([`Postgres::commit_outcome`]); past it the
/// outcome is unknown (`Storage`: the request "may be partly done").
pub const COMMIT_OUTCOME_WAIT: Duration = Duration::from_secs(30);
/// Longest wait to connect to the server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest any one statement may run (`statement_timeout`): a hung server
/// or a lock held by a stuck peer fails the transaction instead of
/// blocking a manager thread for ever.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);
const _: () = assert!(CONNECTIONS_MAX > WRITERS_MAX && WRITERS_MAX >= 1, "writers leave a connection to readers");

/// The PostgreSQL backend. See the module documentation.
pub struct Postgres {
    /// What names the database in logs and errors: no password.
    target: String,
    /// The server, database, credentials and TLS, resolved.
    pg: PgTarget,
    /// Runs the connections' I/O. `Option` so that `Drop` can shut it down
    /// without blocking (dropping a runtime inside another one panics).
    runtime: Option<tokio::runtime::Runtime>,
    pool: Mutex<Pool>,
    /// Signalled when a connection is handed back or closed.
    freed: Condvar,
    /// Read-write transactions in progress, at most [`Postgres::writers_max`]
    /// (see "Writers" in the module documentation).
    writers: Mutex<usize>,
    /// Signalled when a writer ends.
    writer_done: Condvar,
    /// Most read-write transactions of this backend at once.
    writers_max: usize,
    /// Attempts that ended in a conflict ([`Postgres::conflicts`]).
    conflicts: AtomicU64,
    /// Attempts that ran alone among the writers ([`Postgres::alone`]).
    alone: AtomicU64,
    /// Failures to reach the server, logged at a bounded rate.
    unreachable: crate::LogLimit,
    /// Set while the server cannot be reached (for the line that says it is back).
    unreachable_since: std::sync::atomic::AtomicBool,
}

struct Pool {
    idle: Vec<Conn>,
    /// Connections open, idle or in use.
    live: usize,
}

/// One connection and the statements prepared on it.
struct Conn {
    client: Client,
    statements: HashMap<&'static str, Statement>,
    /// This connection's row of `commit_marks` (random: every connection of
    /// every backend has its own, so concurrent writers never write one row).
    mark_writer: i64,
    /// The last mark a read-write transaction on this connection set.
    last_mark: i64,
    /// The inode numbers this connection hands out next: the rest of a
    /// block of [`INO_BLOCK`] taken from the sequence `next_ino_block`
    /// (see "Writers" in the module documentation).
    inos: std::ops::Range<u64>,
    /// Per drive, where this connection's next pool take starts looking
    /// (partition, object): just past the last object it took.
    pool_points: HashMap<u32, (i64, i64)>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres").field("target", &self.target).finish_non_exhaustive()
    }
}

/// Blocks the calling thread on `fut` (see "Connections" in the module
/// documentation).
fn wait<F: Future>(fut: F) -> F::Output {
    futures::executor::block_on(fut)
}

/// `postgres://USER@HOST:PORT/DB` of a configuration, without its password
/// or options.
pub(crate) fn describe(config: &Config) -> String {
    use tokio_postgres::config::Host;
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(h, p)| match h {
            Host::Tcp(name) => format!("{name}:{p}"),
            Host::Unix(path) => format!("{}:{p}", path.display()),
        })
        .collect();
    let user = config.get_user().unwrap_or("");
    format!("postgres://{user}@{}/{}", hosts.join(","), config.get_dbname().unwrap_or(user))
}

/// An SQL identifier, quoted.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Postgres {
    /// Opens the database named by `url` (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`
    /// or `host=… dbname=…`), creating the database if the server has none
    /// of that name and the schema if the database is empty, and migrating
    /// an older schema.
    ///
    /// # Errors
    /// [`MetaError::BadUrl`] if `url` does not parse (the message does not
    /// repeat it), [`MetaError::Postgres`] if the server cannot be reached
    /// or refuses, [`MetaError::TooNew`] if a newer build wrote the schema.
    pub fn open(url: &str) -> Result<Postgres, MetaError> {
        Postgres::open_with(url, &PgOptions::default(), true)
    }

    /// [`Postgres::open`] with what the configuration adds to the URL (a
    /// password file).
    ///
    /// # Errors
    /// As [`Postgres::open`].
    pub fn open_with_options(url: &str, options: &PgOptions) -> Result<Postgres, MetaError> {
        Postgres::open_with(url, options, true)
    }

    /// Opens an existing metadata database as [`Postgres::open`] does
    /// (migrating an older schema), but creates nothing: for tools that must
    /// not make a file system where none was.
    ///
    /// # Errors
    /// [`MetaError::Missing`] if the server has no such database or it holds
    /// no schema; otherwise as [`Postgres::open`].
    pub fn open_existing(url: &str, options: &PgOptions) -> Result<Postgres, MetaError> {
        Postgres::open_with(url, options, false)
    }

    fn open_with(url: &str, options: &PgOptions, create: bool) -> Result<Postgres, MetaError> {
        let pg = PgTarget::parse(url, options)?.with_defaults(CONNECT_TIMEOUT, "nasd");
        let target = pg.describe().to_string();
        if let Some(warning) = pg.exposure_warning() {
            tracing::warn!("{warning}");
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("nasd-meta-postgres")
            .enable_all()
            .build()
            .map_err(|e| MetaError::Io(format!("cannot start the PostgreSQL client runtime: {e}")))?;
        let mut pg = Postgres {
            target,
            pg,
            runtime: Some(runtime),
            pool: Mutex::new(Pool { idle: Vec::new(), live: 0 }),
            freed: Condvar::new(),
            writers: Mutex::new(0),
            writer_done: Condvar::new(),
            writers_max: options.writers_max.unwrap_or(WRITERS_MAX).clamp(1, CONNECTIONS_MAX - 1),
            conflicts: AtomicU64::new(0),
            alone: AtomicU64::new(0),
            unreachable: crate::LogLimit::new(),
            unreachable_since: std::sync::atomic::AtomicBool::new(false),
        };
        let mut conn = match pg.connect() {
            Err(e) if e.code() == Some(&SqlState::INVALID_CATALOG_NAME) && !create => {
                return Err(MetaError::Missing(pg.target.clone()))
            }
            Err(e) if e.code() == Some(&SqlState::INVALID_CATALOG_NAME) => {
                pg.create_database()?;
                pg.connect()
            }
            other => other,
        }
        .map_err(|e| pg.error(e))?;
        pg.migrate(&mut conn, create)?;
        let pool = pg.pool.get_mut().unwrap_or_else(PoisonError::into_inner);
        pool.idle.push(conn);
        pool.live = 1;
        Ok(pg)
    }

    /// What names the database: `postgres://USER@HOST:PORT/DB`, never a
    /// password.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// How many transaction attempts of this backend ended in a conflict
    /// (a serialization failure or a deadlock, [`TxnError::Conflict`]) since
    /// it was opened, whether or not a later attempt succeeded: every one
    /// cost a rollback and a rerun.
    pub fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }

    /// How many transaction attempts of this backend ran alone among the
    /// writers of the database ([`WRITER_LOCK`] exclusive), after
    /// [`CONFLICTS_BEFORE_ALONE`] conflicts in a row.
    pub fn alone(&self) -> u64 {
        self.alone.load(Ordering::Relaxed)
    }

    fn error(&self, source: tokio_postgres::Error) -> MetaError {
        MetaError::Postgres { target: self.target.clone(), source }
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("the runtime lives as long as the backend")
    }

    /// Opens one connection to `pg` on the backend's runtime.
    fn connect_to(&self, pg: PgTarget) -> Result<Client, tokio_postgres::Error> {
        let target = self.target.clone();
        let task = self.runtime().spawn(async move {
            pg.connect(move |e| {
                tracing::warn!(%target, error = %postgres_detail(&e), "metadata database connection closed");
            })
            .await
        });
        match wait(task) {
            Ok(r) => r,
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(join) => panic!("the PostgreSQL client runtime stopped while the backend is in use: {join}"),
        }
    }

    fn connect(&self) -> Result<Conn, tokio_postgres::Error> {
        let client = self.connect_to(self.pg.clone())?;
        // A session left idle inside a transaction (its process frozen) is ended, and with it
        // the writer lock it holds: other managers wait at most this long for their turn.
        let ms = STATEMENT_TIMEOUT.as_millis();
        // Index scans rather than sequential ones wherever an index serves: a sequential scan
        // takes a predicate lock on the whole table (see "Writers" in the module documentation).
        let timeout = format!(
            "SET statement_timeout = {ms}; SET idle_in_transaction_session_timeout = {ms}; SET enable_seqscan = off"
        );
        wait(client.batch_execute(&timeout))?;
        Ok(Conn {
            client,
            statements: HashMap::new(),
            mark_writer: nasd_env::Env::real().random_u64() as i64,
            last_mark: 0,
            inos: 0..0,
            pool_points: HashMap::new(),
        })
    }

    /// Creates the configured database, through the server's `postgres`
    /// database, under the session advisory lock [`MIGRATION_LOCK`] there:
    /// backends opening a new database at once create it once.
    fn create_database(&self) -> Result<(), MetaError> {
        let config = self.pg.config();
        let user = config.get_user().unwrap_or("");
        let name = config.get_dbname().unwrap_or(user).to_owned();
        let client = self.connect_to(self.pg.with_dbname("postgres")).map_err(|e| self.error(e))?;
        let create = async {
            client.query("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await?;
            let exists = client.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name]).await?.is_some();
            if !exists {
                client.batch_execute(&format!("CREATE DATABASE {}", quote_ident(&name))).await?;
            }
            client.query("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).await?;
            Ok::<_, tokio_postgres::Error>(!exists)
        };
        // The lock goes with the session if anything fails.
        if wait(create).map_err(|e| self.error(e))? {
            tracing::info!(target = %self.target, "metadata database created");
        }
        Ok(())
    }

    /// Brings the schema to [`POSTGRES_SCHEMA_VERSION`], in one transaction
    /// holding [`MIGRATION_LOCK`]; without `create`, a database without the
    /// schema is [`MetaError::Missing`].
    fn migrate(&self, conn: &mut Conn, create: bool) -> Result<(), MetaError> {
        let c = &conn.client;
        let run = async {
            c.batch_execute("BEGIN").await?;
            c.query("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
            c.batch_execute("CREATE TABLE IF NOT EXISTS nasd_schema (version BIGINT NOT NULL)").await?;
            match c.query_opt("SELECT version FROM nasd_schema", &[]).await? {
                Some(row) => row.try_get::<_, i64>(0).map(Some),
                None => Ok(None),
            }
        };
        let found = wait(run).map_err(|e| self.error(e))?;
        let found = found.unwrap_or(0);
        let outcome = (|| {
            if found < 0 {
                return Err(MetaError::BadVersion(found));
            }
            if found == 0 && !create {
                return Err(MetaError::Missing(self.target.clone()));
            }
            if found > POSTGRES_SCHEMA_VERSION {
                return Err(MetaError::TooNew { found, supported: POSTGRES_SCHEMA_VERSION });
            }
            for (from, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
                wait(c.batch_execute(sql)).map_err(|e| self.error(e))?;
                tracing::info!(target = %self.target, version = from + 1, "metadata schema migrated");
            }
            let write = async {
                if found < POSTGRES_SCHEMA_VERSION {
                    c.batch_execute("DELETE FROM nasd_schema").await?;
                    c.execute("INSERT INTO nasd_schema (version) VALUES ($1)", &[&POSTGRES_SCHEMA_VERSION]).await?;
                }
                let keep = format!("{COMMIT_MARK_KEEP_DAYS} days");
                c.execute("DELETE FROM commit_marks WHERE at < now() - $1::text::interval", &[&keep]).await?;
                c.batch_execute("COMMIT").await
            };
            wait(write).map_err(|e| self.error(e))
        })();
        if outcome.is_err() {
            let _ = wait(c.batch_execute("ROLLBACK"));
        }
        outcome
    }

    /// The schema version stored in the database.
    ///
    /// # Errors
    /// [`MetaError::Postgres`] if it cannot be read.
    pub fn schema_version(&self) -> Result<i64, MetaError> {
        let lease = self.checkout().map_err(|_| MetaError::Io("no connection to the metadata database".into()))?;
        let row = wait(lease.conn().client.query_one("SELECT version FROM nasd_schema", &[]));
        row.and_then(|r| r.try_get(0)).map_err(|e| self.error(e))
    }

    fn lock_pool(&self) -> MutexGuard<'_, Pool> {
        // The pool's state stays consistent at every unlock: a panic elsewhere cannot break it.
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `conn` leased out, with no transaction begun on it yet.
    fn fresh_lease(&self, conn: Conn) -> Lease<'_> {
        Lease { pg: self, conn: Some(conn), clean: true, writer: None, locked: false, xid: None, mark: None }
    }

    /// A connection: an idle one, else a new one while fewer than
    /// [`CONNECTIONS_MAX`] are open, else the next one handed back (waiting
    /// at most [`CONNECTION_WAIT_MAX`]).
    fn checkout(&self) -> Result<Lease<'_>, TxnError> {
        let deadline = Instant::now() + CONNECTION_WAIT_MAX;
        let mut pool = self.lock_pool();
        loop {
            while let Some(conn) = pool.idle.pop() {
                if !conn.client.is_closed() {
                    return Ok(self.fresh_lease(conn));
                }
                pool.live -= 1;
            }
            if pool.live < CONNECTIONS_MAX {
                pool.live += 1;
                drop(pool);
                return match self.connect() {
                    Ok(conn) => {
                        if self.unreachable_since.swap(false, Ordering::Relaxed) {
                            tracing::warn!(target = %self.target, "the metadata database is reachable again");
                        }
                        self.unreachable.reset();
                        Ok(self.fresh_lease(conn))
                    }
                    Err(e) => {
                        self.lock_pool().live -= 1;
                        self.freed.notify_one();
                        self.log_failure(TxnError::Unavailable, &e, "cannot connect to the metadata database");
                        Err(TxnError::Unavailable)
                    }
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::error!(target = %self.target, "no metadata database connection came free in time");
                return Err(TxnError::Storage);
            }
            pool = self.freed.wait_timeout(pool, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.pool.get_mut().unwrap_or_else(PoisonError::into_inner).idle.clear();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// How a writer holds [`WRITER_LOCK`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriterMode {
    /// With the other writers (the usual way).
    Shared,
    /// Alone: the transaction conflicted [`CONFLICTS_BEFORE_ALONE`] times in a row.
    Alone,
}

thread_local! {
    /// Conflicts in a row of the transaction this thread runs (attempts of one
    /// transaction run on one thread, [`crate::with_retries`]).
    static CONFLICTS_IN_A_ROW: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// One of the backend's [`Postgres::writers_max`] read-write transactions
/// in progress ([`Postgres::writer_slot`]).
struct WriterSlot<'a> {
    pg: &'a Postgres,
}

impl Drop for WriterSlot<'_> {
    fn drop(&mut self) {
        let mut writers = self.pg.writers.lock().unwrap_or_else(PoisonError::into_inner);
        *writers -= 1;
        drop(writers);
        self.pg.writer_done.notify_one();
    }
}

/// A connection lent to one transaction; handed back when dropped if it is
/// outside any transaction and open, else closed.
struct Lease<'a> {
    pg: &'a Postgres,
    conn: Option<Conn>,
    /// Outside any transaction (false from `BEGIN` until its end is confirmed).
    clean: bool,
    /// The transaction is a writer, and how it holds [`WRITER_LOCK`] (see
    /// [`Lease::control`]).
    writer: Option<WriterMode>,
    /// The session holds (or may hold) [`WRITER_LOCK`]: the connection is
    /// closed rather than reused unless it is released.
    locked: bool,
    /// The writer's transaction id (`txid_current()`, asked with its
    /// `BEGIN`): what tells, after a `COMMIT` lost its connection, whether
    /// it committed ([`Postgres::commit_outcome`]).
    xid: Option<i64>,
    /// The row (its connection's) and mark the writer's transaction sets in
    /// `commit_marks` (with its `BEGIN`): what tells whether it committed
    /// once it is over.
    mark: Option<(i64, i64)>,
}

impl Lease<'_> {
    fn conn(&self) -> &Conn {
        self.conn.as_ref().expect("leased connection")
    }

    fn conn_mut(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("leased connection")
    }

    /// Runs a transaction-control statement (`BEGIN`, `COMMIT`, `ROLLBACK`).
    /// A writer ([`Lease::writer`]) takes [`WRITER_LOCK`] (a session lock,
    /// shared or exclusive) before its `BEGIN`, so that an exclusive
    /// holder's snapshot follows every other writer's end, and gives it up
    /// at the end of the transaction, whether it succeeded or not. With its
    /// `BEGIN` it also sets a new mark in its connection's row of
    /// `commit_marks` and asks its transaction id. All of it is pipelined
    /// with the statement: no extra round trip.
    fn control(&mut self, sql: &str) -> Result<(), tokio_postgres::Error> {
        let Some(mode) = self.writer else {
            return wait(self.conn().client.batch_execute(sql));
        };
        let (lock, unlock) = match mode {
            WriterMode::Shared => ("pg_advisory_lock_shared", "pg_advisory_unlock_shared"),
            WriterMode::Alone => ("pg_advisory_lock", "pg_advisory_unlock"),
        };
        let conn = self.conn.as_mut().expect("leased connection");
        if !sql.starts_with("BEGIN") {
            let unlock = format!("SELECT {unlock}({WRITER_LOCK})");
            let c = &conn.client;
            let (ended, unlocked) = wait(async { futures::join!(c.batch_execute(sql), c.batch_execute(&unlock)) });
            match unlocked {
                Ok(()) => self.locked = false,
                // The connection is closed rather than reused, and the lock goes with its session.
                Err(e) => {
                    tracing::warn!(target = %self.pg.target, error = %postgres_detail(&e), "metadata writer lock not given up")
                }
            }
            return ended;
        }
        self.locked = true;
        conn.last_mark += 1;
        let seq = conn.last_mark;
        let lock = format!("SELECT {lock}({WRITER_LOCK})");
        let set_mark = format!(
            "INSERT INTO commit_marks (writer, seq, at) VALUES ({}, {seq}, now()) \
             ON CONFLICT (writer) DO UPDATE SET seq = EXCLUDED.seq, at = EXCLUDED.at",
            conn.mark_writer
        );
        let c = &conn.client;
        let (locked, begun, xid, marked) = wait(async {
            futures::join!(
                c.batch_execute(&lock),
                c.batch_execute(sql),
                c.query_one("SELECT txid_current()", &[]),
                c.batch_execute(&set_mark)
            )
        });
        let xid = xid.and_then(|row| row.try_get::<_, i64>(0));
        self.xid = xid.as_ref().ok().copied();
        self.mark = marked.as_ref().ok().map(|()| (conn.mark_writer, seq));
        locked.and(begun).and(xid.map(drop)).and(marked)
    }

    /// Ends the transaction; a failure only costs the connection.
    fn rollback(&mut self) {
        match self.control("ROLLBACK") {
            Ok(()) => self.clean = true,
            Err(e) => {
                tracing::warn!(target = %self.pg.target, error = %postgres_detail(&e), "metadata rollback failed")
            }
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let conn = self.conn.take().expect("leased connection");
        let mut pool = self.pg.lock_pool();
        if self.clean && !self.locked && !conn.client.is_closed() {
            pool.idle.push(conn);
        } else {
            pool.live -= 1;
        }
        drop(pool);
        self.pg.freed.notify_one();
    }
}

/// Whether `e` is the server refusing `txid_status` of a transaction id it
/// has not reached ("transaction ID N is in the future"): after a crash,
/// the transaction's start was not in the log the server recovered from,
/// so it did not commit (found by `nasd-cli`'s `netns_cluster`: a create
/// whose `COMMIT` was cut off by PostgreSQL's SIGKILL was answered
/// `INTERNAL`, its outcome taken for unknown).
fn xid_in_the_future(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|d| *d.code() == SqlState::INVALID_PARAMETER_VALUE && d.message().contains("is in the future"))
}

/// What a database error means for the attempt: a conflict (retried), the
/// server gone (the connection lost, the server shutting down or starting:
/// [`TxnError::Unavailable`]), or another backend failure. Said of a
/// statement before `COMMIT`; a `COMMIT` that lost its connection may have
/// committed ([`Postgres::commit_outcome`]).
fn classify(e: &tokio_postgres::Error) -> TxnError {
    match e.code() {
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED => {
            TxnError::Conflict
        }
        // The server shutting down or starting, or no answer from it (closed, reset, timed out).
        _ if crate::error::postgres_server_gone(e) => TxnError::Unavailable,
        _ => TxnError::Storage,
    }
}

impl Backend for Postgres {
    fn attempt<R>(
        &self,
        access: Access,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<R, FsStatus>,
    ) -> Result<R, TxnError> {
        let out = self.attempt_once(access, f);
        let conflicted = out.as_ref().err() == Some(&TxnError::Conflict);
        if conflicted {
            self.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        CONFLICTS_IN_A_ROW.with(|n| n.set(if conflicted { n.get() + 1 } else { 0 }));
        out
    }
}

impl Postgres {
    /// Logs a failure of class `class`: an outage at a bounded rate
    /// ([`crate::LogLimit`]: one line per interval, whatever the number of
    /// requests failing), anything else each time.
    fn log_failure(&self, class: TxnError, e: &tokio_postgres::Error, what: &str) {
        if class == TxnError::Unavailable {
            self.unreachable_since.store(true, Ordering::Relaxed);
            self.unreachable.log(|suppressed| {
                tracing::error!(target = %self.target, error = %postgres_detail(e), suppressed, "{what}: the metadata database cannot be reached")
            });
        } else {
            tracing::error!(target = %self.target, error = %postgres_detail(e), "{what}");
        }
    }

    /// Whether transaction `xid`, whose `COMMIT` lost its connection,
    /// committed. First it must be over: `txid_status` asked on a new
    /// connection, again (with back-off) while the server cannot be reached
    /// or the transaction is still in progress there, for up to
    /// [`COMMIT_OUTCOME_WAIT`]. Then its own mark says: it committed if
    /// its connection's row of `commit_marks` holds `mark`. The status itself
    /// is not the answer: a server restarted after a crash hands out again
    /// the ids of transactions none of whose log it had written, so after
    /// the restart `txid_status` may tell of another transaction that got
    /// the same id (found by `nasd-cli`'s `netns_cluster`: a file's write
    /// `COMMIT` cut off by PostgreSQL's SIGKILL was taken for committed, and
    /// the put acknowledged, as another client's transaction committed
    /// under the id after the restart; the file read back short). `None` if
    /// it cannot be told by then (or the server no longer knows).
    fn commit_outcome(&self, xid: i64, (writer, mark): (i64, i64)) -> Option<bool> {
        let deadline = Instant::now() + COMMIT_OUTCOME_WAIT;
        let mut pause = Duration::from_millis(50);
        loop {
            if let Ok(conn) = self.connect() {
                let mut status_said = None;
                let over = match wait(conn.client.query_one("SELECT txid_status($1)", &[&xid])) {
                    Ok(row) => match row.try_get::<_, Option<String>>(0) {
                        // Over (its own status or that of a transaction that reused its id, which
                        // only a restart allows: then it is over too).
                        Ok(Some(status)) if status == "committed" || status == "aborted" => {
                            status_said = Some(status);
                            true
                        }
                        // In progress: the server process serving the lost connection has not ended yet.
                        Ok(Some(_)) => false,
                        // Too old for the server to know, or an answer that makes no sense.
                        Ok(None) | Err(_) => return None,
                    },
                    // Past every transaction the server has begun: its start never reached the log
                    // it recovered from (it was killed first), so neither did a commit.
                    Err(e) if xid_in_the_future(&e) => return Some(false),
                    Err(e) if !crate::error::postgres_server_gone(&e) => return None,
                    Err(_) => false,
                };
                if over {
                    let row = wait(conn.client.query_opt("SELECT seq FROM commit_marks WHERE writer = $1", &[&writer]));
                    let said = status_said.as_deref().unwrap_or("?");
                    let decided = |committed: bool| {
                        // The status of another transaction, which got the id after a restart.
                        let reused = said == "committed" && !committed;
                        tracing::warn!(
                            target = %self.target, xid, txid_status = said, committed, id_handed_out_again = reused,
                            "a metadata COMMIT lost its connection; its mark tells whether it committed"
                        );
                        Some(committed)
                    };
                    match row.map(|r| r.map(|r| r.try_get::<_, i64>(0))) {
                        Ok(Some(Ok(seq))) => return decided(seq == mark),
                        Ok(None) => return decided(false),
                        Ok(Some(Err(_))) => return None,
                        Err(e) if !crate::error::postgres_server_gone(&e) => return None,
                        Err(_) => {}
                    }
                }
            }
            if Instant::now() + pause >= deadline {
                return None;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Waits until fewer than [`Postgres::writers_max`] read-write
    /// transactions of this backend are in progress; the slot is given back
    /// when the guard drops.
    fn writer_slot(&self) -> WriterSlot<'_> {
        let mut writers = self.writers.lock().unwrap_or_else(PoisonError::into_inner);
        while *writers >= self.writers_max {
            writers = self.writer_done.wait(writers).unwrap_or_else(PoisonError::into_inner);
        }
        *writers += 1;
        WriterSlot { pg: self }
    }

    /// One attempt of [`Backend::attempt`], not counted.
    fn attempt_once<R>(
        &self,
        access: Access,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<R, FsStatus>,
    ) -> Result<R, TxnError> {
        let _slot = match access {
            Access::ReadWrite => Some(self.writer_slot()),
            Access::ReadOnly => None,
        };
        let mut lease = self.checkout()?;
        if access == Access::ReadWrite {
            let alone = CONFLICTS_IN_A_ROW.with(|n| n.get()) >= CONFLICTS_BEFORE_ALONE;
            lease.writer = Some(if alone { WriterMode::Alone } else { WriterMode::Shared });
            if alone {
                self.alone.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.run_attempt(&mut lease, access, f)
    }

    /// One transaction on `lease`, from `BEGIN` to its end.
    fn run_attempt<R>(
        &self,
        lease: &mut Lease<'_>,
        access: Access,
        f: &mut dyn FnMut(&mut dyn Txn) -> Result<R, FsStatus>,
    ) -> Result<R, TxnError> {
        let begin = match access {
            Access::ReadWrite => "BEGIN ISOLATION LEVEL SERIALIZABLE",
            Access::ReadOnly => "BEGIN ISOLATION LEVEL SERIALIZABLE, READ ONLY",
        };
        lease.clean = false;
        if let Err(e) = lease.control(begin) {
            let class = classify(&e);
            self.log_failure(class, &e, "cannot begin a metadata transaction");
            return Err(class);
        }
        let mut t = PgTxn { conn: lease.conn_mut(), target: &self.target, pg: self, fault: None };
        let out = f(&mut t);
        let fault = t.fault;
        match (fault, out, access) {
            (Some(fault), _, _) => {
                lease.rollback();
                Err(fault)
            }
            (None, Err(status), _) => {
                lease.rollback();
                Err(TxnError::Abort(status))
            }
            (None, Ok(r), Access::ReadOnly) => {
                lease.rollback();
                Ok(r)
            }
            (None, Ok(r), Access::ReadWrite) => match lease.control("COMMIT") {
                Ok(()) => {
                    lease.clean = true;
                    Ok(r)
                }
                Err(e) if classify(&e) == TxnError::Unavailable && lease.xid.is_some() && lease.mark.is_some() => {
                    // A COMMIT sent and no answer: the server says, once it answers again, whether
                    // it committed.
                    lease.clean = false;
                    let (xid, mark) = (lease.xid.expect("checked"), lease.mark.expect("checked"));
                    match self.commit_outcome(xid, mark) {
                        Some(true) => Ok(r),
                        Some(false) => Err(TxnError::Unavailable),
                        None => {
                            tracing::error!(target = %self.target, error = %postgres_detail(&e), xid, "metadata commit failed; whether it committed is unknown");
                            Err(TxnError::Storage)
                        }
                    }
                }
                Err(e) => {
                    // A COMMIT sent and no answer: it may have committed. Never "nothing changed".
                    let class = match classify(&e) {
                        TxnError::Unavailable => TxnError::Storage,
                        other => other,
                    };
                    if class == TxnError::Storage {
                        tracing::error!(target = %self.target, error = %postgres_detail(&e), "metadata commit failed");
                    }
                    // A failed COMMIT ends the transaction; the connection is reusable if it is open.
                    lease.clean = e.as_db_error().is_some();
                    Err(class)
                }
            },
        }
    }
}

/// One PostgreSQL transaction seen through [`Txn`].
struct PgTxn<'a> {
    conn: &'a mut Conn,
    target: &'a str,
    /// The backend, for its rate-limited outage log.
    pg: &'a Postgres,
    /// The first failure: every later row operation fails at once with it.
    fault: Option<TxnError>,
}

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

impl PgTxn<'_> {
    /// Fails if an earlier statement of this attempt failed.
    fn live(&self) -> Result<(), FsStatus> {
        match self.fault {
            None => Ok(()),
            Some(_) => Err(FsStatus::Internal),
        }
    }

    /// Records a database error and maps it to `Internal`.
    fn failed(&mut self, e: tokio_postgres::Error) -> FsStatus {
        let class = classify(&e);
        if class == TxnError::Conflict {
            tracing::debug!(target = %self.target, error = %postgres_detail(&e), "metadata transaction conflicted");
        } else {
            self.pg.log_failure(class, &e, "metadata store failed");
        }
        self.fault.get_or_insert(class);
        FsStatus::Internal
    }

    /// Records a row that does not decode (a broken invariant of the stored
    /// data) and maps it to `Internal`.
    fn bad_row(&mut self, what: String) -> FsStatus {
        tracing::error!(target = %self.target, what, "metadata row does not decode");
        self.fault.get_or_insert(TxnError::Storage);
        FsStatus::Internal
    }

    /// The statement for `sql`, prepared once per connection.
    fn statement(&mut self, sql: &'static str) -> Result<Statement, FsStatus> {
        self.live()?;
        if let Some(st) = self.conn.statements.get(sql) {
            return Ok(st.clone());
        }
        match wait(self.conn.client.prepare(sql)) {
            Ok(st) => {
                self.conn.statements.insert(sql, st.clone());
                Ok(st)
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    fn query(&mut self, sql: &'static str, params: Params<'_>) -> Result<Vec<Row>, FsStatus> {
        let st = self.statement(sql)?;
        wait(self.conn.client.query(&st, params)).map_err(|e| self.failed(e))
    }

    fn query_opt(&mut self, sql: &'static str, params: Params<'_>) -> Result<Option<Row>, FsStatus> {
        let st = self.statement(sql)?;
        wait(self.conn.client.query_opt(&st, params)).map_err(|e| self.failed(e))
    }

    fn query_one(&mut self, sql: &'static str, params: Params<'_>) -> Result<Row, FsStatus> {
        let st = self.statement(sql)?;
        wait(self.conn.client.query_one(&st, params)).map_err(|e| self.failed(e))
    }

    fn exec(&mut self, sql: &'static str, params: Params<'_>) -> Result<u64, FsStatus> {
        let st = self.statement(sql)?;
        wait(self.conn.client.execute(&st, params)).map_err(|e| self.failed(e))
    }

    /// Decodes every row with `f`.
    fn decode<T>(&mut self, rows: Vec<Row>, f: impl Fn(&Row) -> Decoded<T>) -> Result<Vec<T>, FsStatus> {
        rows.iter().map(|r| f(r).map_err(|e| self.bad_row(e))).collect()
    }

    fn decode_opt<T>(&mut self, row: Option<Row>, f: impl Fn(&Row) -> Decoded<T>) -> Result<Option<T>, FsStatus> {
        row.map(|r| f(&r).map_err(|e| self.bad_row(e))).transpose()
    }

    fn decode_one<T>(&mut self, row: Row, f: impl Fn(&Row) -> Decoded<T>) -> Result<T, FsStatus> {
        f(&row).map_err(|e| self.bad_row(e))
    }

    fn objects(&mut self, sql: &'static str, drive: u32) -> Result<Vec<ObjectRef>, FsStatus> {
        let rows = self.query(sql, &[&i64::from(drive)])?;
        self.decode(rows, object_from_row)
    }

    /// Fills in a user's supplementary groups (ascending).
    fn with_groups(&mut self, mut user: User) -> Result<User, FsStatus> {
        let rows = self.query("SELECT gid FROM user_groups WHERE name = $1 ORDER BY gid", &[&user.name])?;
        user.groups = self.decode(rows, |r| u32_at(r, 0))?;
        Ok(user)
    }

    /// Fills in the components of `inodes` (in component order), in one query.
    fn with_components(&mut self, mut inodes: Vec<Inode>) -> Result<Vec<Inode>, FsStatus> {
        if inodes.is_empty() {
            return Ok(inodes);
        }
        let inos: Vec<i64> = inodes.iter().map(|n| n.attr.ino as i64).collect();
        let rows = self.query(
            "SELECT drive, partition, object, state, idx, ino FROM components WHERE ino = ANY($1) ORDER BY ino, idx",
            &[&inos],
        )?;
        let components = self.decode(rows, |r| {
            let code = u8_at(r, 3)?;
            let state = component_state(code).ok_or_else(|| format!("unknown component state {code}"))?;
            Ok((u64_at(r, 5)?, usize_at(r, 4)?, Component { object: object_from_row(r)?, state }))
        })?;
        let mut by_ino: HashMap<Ino, Vec<Component>> = HashMap::with_capacity(inodes.len());
        for (ino, idx, component) in components {
            let list = by_ino.entry(ino).or_default();
            if idx != list.len() {
                return Err(self.bad_row(format!("component indexes of inode {ino} are not 0, 1, 2, …")));
            }
            list.push(component);
        }
        // A listing may name one inode twice (hard links).
        for n in &mut inodes {
            n.components = by_ino.get(&n.attr.ino).cloned().unwrap_or_default();
        }
        Ok(inodes)
    }
}

/// A decoded value, or what is wrong with the row.
type Decoded<T> = Result<T, String>;

fn i64_at(r: &Row, idx: usize) -> Decoded<i64> {
    r.try_get(idx).map_err(|e| format!("column {idx}: {e}"))
}

fn u64_at(r: &Row, idx: usize) -> Decoded<u64> {
    Ok(i64_at(r, idx)? as u64)
}

fn u32_at(r: &Row, idx: usize) -> Decoded<u32> {
    u32::try_from(i64_at(r, idx)?).map_err(|_| format!("column {idx}: not a u32"))
}

fn u8_at(r: &Row, idx: usize) -> Decoded<u8> {
    u8::try_from(i64_at(r, idx)?).map_err(|_| format!("column {idx}: not a u8"))
}

fn usize_at(r: &Row, idx: usize) -> Decoded<usize> {
    usize::try_from(i64_at(r, idx)?).map_err(|_| format!("column {idx}: not an index"))
}

fn get_at<'a, T: tokio_postgres::types::FromSql<'a>>(r: &'a Row, idx: usize) -> Decoded<T> {
    r.try_get(idx).map_err(|e| format!("column {idx}: {e}"))
}

/// A `usize` (an index or a limit) as a `BIGINT` parameter.
fn big(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
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

/// The inode columns (table alias `i`) in the order [`inode_from_row`] reads them.
macro_rules! inode_cols {
    () => {
        "i.ino, i.kind, i.mode, i.nlink, i.uid, i.gid, i.size, i.atime_ns, i.mtime_ns, \
         i.ctime_ns, i.target, i.layout, i.acv, i.rdev, i.qdir, i.small_threshold, i.site, i.data_bytes"
    };
}

/// Reads an inode (without its components) from the `inode_cols!` columns
/// starting at column `at`.
fn inode_from_row(r: &Row, at: usize) -> Decoded<Inode> {
    let code = u8_at(r, at + 1)?;
    let kind = FileKind::from_code(code).map_err(|_| format!("unknown file kind {code}"))?;
    let attr = FileAttr {
        ino: u64_at(r, at)?,
        kind,
        mode: u32_at(r, at + 2)?,
        nlink: u32_at(r, at + 3)?,
        uid: u32_at(r, at + 4)?,
        gid: u32_at(r, at + 5)?,
        size: u64_at(r, at + 6)?,
        atime_ns: i64_at(r, at + 7)?,
        mtime_ns: i64_at(r, at + 8)?,
        ctime_ns: i64_at(r, at + 9)?,
        rdev: u64_at(r, at + 13)?,
        allocated: 0,
    };
    let layout = match get_at::<Option<&[u8]>>(r, at + 11)? {
        None => None,
        Some(bytes) => Some(layout_from_bytes(bytes).ok_or("not a canonical layout")?),
    };
    let mut n = Inode {
        attr,
        target: get_at(r, at + 10)?,
        layout,
        components: Vec::new(),
        acv: u64_at(r, at + 12)?,
        qdir: u64_at(r, at + 14)?,
        small_threshold: u32_at(r, at + 15)?,
        site: Some(u8_at(r, at + 16)?)
            .filter(|s| usize::from(*s) < nasd_proto::routing::ROUTING_SITES)
            .ok_or_else(|| format!("column {}: not a routing site", at + 16))?,
        data_bytes: u64_at(r, at + 17)?,
    };
    n.refresh_allocated();
    Ok(n)
}

fn object_from_row(r: &Row) -> Decoded<ObjectRef> {
    Ok(ObjectRef { drive: u32_at(r, 0)?, partition: u64_at(r, 1)?, object: u64_at(r, 2)? })
}

/// A stored component state: Ok or Stale (Down is never stored).
fn component_state(code: u8) -> Option<ComponentState> {
    match ComponentState::from_code(code) {
        Ok(s @ (ComponentState::Ok | ComponentState::Stale)) => Some(s),
        _ => None,
    }
}

fn user_from_row(r: &Row) -> Decoded<User> {
    Ok(User {
        name: get_at(r, 0)?,
        uid: u32_at(r, 1)?,
        gid: u32_at(r, 2)?,
        password_hash: get_at(r, 3)?,
        admin: get_at(r, 4)?,
        groups: Vec::new(),
        gateway: match (get_at::<Option<i64>>(r, 5)?, get_at::<Option<i64>>(r, 6)?) {
            (Some(_), Some(_)) => Some((u32_at(r, 5)?, u32_at(r, 6)?)),
            _ => None,
        },
    })
}

fn quota_from_row(r: &Row) -> Decoded<Quota> {
    let (kind, id) = (u8_at(r, 0)?, u64_at(r, 1)?);
    Ok(Quota {
        subject: QuotaSubject::from_key(kind, id).ok_or_else(|| format!("unknown quota subject {kind}"))?,
        bytes_limit: get_at::<Option<i64>>(r, 2)?.map(|v| v as u64),
        files_limit: get_at::<Option<i64>>(r, 3)?.map(|v| v as u64),
        bytes_used: u64_at(r, 4)?,
        files_used: u64_at(r, 5)?,
    })
}

fn drive_state(code: u8) -> Option<DriveState> {
    match code {
        0 => Some(DriveState::In),
        1 => Some(DriveState::Out),
        _ => None,
    }
}

macro_rules! drive_cols {
    () => {
        "drive, drive_id, addr, partition, sealed_keys, capacity_bytes, failure_domain, state"
    };
}

fn drive_from_row(r: &Row) -> Decoded<DriveRecord> {
    let id: Vec<u8> = get_at(r, 1)?;
    let code = u8_at(r, 7)?;
    Ok(DriveRecord {
        drive: u32_at(r, 0)?,
        drive_id: id.try_into().map_err(|_| "drive id is not 16 bytes")?,
        addr: get_at(r, 2)?,
        partition: u64_at(r, 3)?,
        sealed_keys: get_at(r, 4)?,
        capacity_bytes: u64_at(r, 5)?,
        failure_domain: get_at(r, 6)?,
        state: drive_state(code).ok_or_else(|| format!("unknown drive state {code}"))?,
    })
}

macro_rules! intent_cols {
    () => {
        "txn, ino, state, uid, deadline_ns, escrow, size_limit, writes, unopened"
    };
}

fn intent_from_row(r: &Row) -> Decoded<Intent> {
    let code = u8_at(r, 2)?;
    Ok(Intent {
        txn: u64_at(r, 0)?,
        ino: u64_at(r, 1)?,
        state: IntentState::from_code(code).ok_or_else(|| format!("unknown intent state {code}"))?,
        uid: u32_at(r, 3)?,
        deadline_ns: i64_at(r, 4)?,
        escrow: u64_at(r, 5)?,
        size_limit: u64_at(r, 6)?,
        writes: u64_at(r, 7)?,
        unopened: u64_at(r, 8)?,
    })
}

fn obj_params(o: &ObjectRef) -> [i64; 3] {
    [i64::from(o.drive), o.partition as i64, o.object as i64]
}

impl Txn for PgTxn<'_> {
    fn get_inode(&mut self, ino: Ino) -> Result<Option<Inode>, FsStatus> {
        let sql = concat!("SELECT ", inode_cols!(), " FROM inodes i WHERE i.ino = $1");
        let row = self.query_opt(sql, &[&(ino as i64)])?;
        let Some(inode) = self.decode_opt(row, |r| inode_from_row(r, 0))? else {
            return Ok(None);
        };
        Ok(self.with_components(vec![inode])?.pop())
    }

    fn put_inode(&mut self, n: &Inode) -> Result<(), FsStatus> {
        let a = &n.attr;
        self.exec(
            "INSERT INTO inodes (ino, kind, mode, nlink, uid, gid, size, atime_ns, mtime_ns, \
             ctime_ns, target, layout, acv, rdev, qdir, small_threshold, site, data_bytes) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18) \
             ON CONFLICT (ino) DO UPDATE SET kind = excluded.kind, mode = excluded.mode, \
             nlink = excluded.nlink, uid = excluded.uid, gid = excluded.gid, size = excluded.size, \
             atime_ns = excluded.atime_ns, mtime_ns = excluded.mtime_ns, ctime_ns = excluded.ctime_ns, \
             target = excluded.target, layout = excluded.layout, acv = excluded.acv, rdev = excluded.rdev, \
             qdir = excluded.qdir, small_threshold = excluded.small_threshold, site = excluded.site, \
             data_bytes = excluded.data_bytes",
            &[
                &(a.ino as i64),
                &i64::from(a.kind.code()),
                &i64::from(a.mode),
                &i64::from(a.nlink),
                &i64::from(a.uid),
                &i64::from(a.gid),
                &(a.size as i64),
                &a.atime_ns,
                &a.mtime_ns,
                &a.ctime_ns,
                &n.target,
                &n.layout.as_ref().map(layout_bytes),
                &(n.acv as i64),
                &(a.rdev as i64),
                &(n.qdir as i64),
                &i64::from(n.small_threshold),
                &i64::from(n.site),
                &(n.data_bytes as i64),
            ],
        )?;
        Ok(())
    }

    fn delete_inode(&mut self, ino: Ino) -> Result<(), FsStatus> {
        self.exec("DELETE FROM dir_parents WHERE dir = $1", &[&(ino as i64)])?;
        self.exec("DELETE FROM xattrs WHERE ino = $1", &[&(ino as i64)])?;
        self.exec("DELETE FROM small_data WHERE ino = $1", &[&(ino as i64)])?;
        self.exec("DELETE FROM small_staged WHERE ino = $1", &[&(ino as i64)])?;
        self.exec("DELETE FROM acl_entries WHERE ino = $1", &[&(ino as i64)])?;
        self.exec("DELETE FROM pal_pending WHERE ino = $1", &[&(ino as i64)])?;
        self.exec("DELETE FROM pal_members WHERE ino = $1", &[&(ino as i64)])?;
        self.exec("DELETE FROM inodes WHERE ino = $1", &[&(ino as i64)])?;
        Ok(())
    }

    fn alloc_ino(&mut self) -> Result<Ino, FsStatus> {
        self.live()?;
        if self.conn.inos.is_empty() {
            let row = self.query_one("SELECT nextval('next_ino_block')", &[])?;
            let block = self.decode_one(row, |r| u64_at(r, 0))?;
            // Blocks of 2^20 below 2^63: 2^43 of them, each handed out once.
            let start = block.checked_mul(INO_BLOCK).filter(|s| *s < i64::MAX as u64 - INO_BLOCK);
            let Some(start) = start else {
                return Err(self.bad_row(format!("inode block {block} is past the inode numbers")));
            };
            self.conn.inos = start..start + INO_BLOCK;
        }
        Ok(self.conn.inos.next().expect("a block taken just now is not empty"))
    }

    fn dir_parent(&mut self, dir: Ino) -> Result<Option<Ino>, FsStatus> {
        let row = self.query_opt("SELECT parent FROM dir_parents WHERE dir = $1", &[&(dir as i64)])?;
        self.decode_opt(row, |r| u64_at(r, 0))
    }

    fn set_dir_parent(&mut self, dir: Ino, parent: Ino) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO dir_parents (dir, parent) VALUES ($1, $2) \
             ON CONFLICT (dir) DO UPDATE SET parent = excluded.parent",
            &[&(dir as i64), &(parent as i64)],
        )?;
        Ok(())
    }

    fn get_dirent(&mut self, dir: Ino, name: &str) -> Result<Option<Ino>, FsStatus> {
        let row = self.query_opt("SELECT child FROM dirents WHERE dir = $1 AND name = $2", &[&(dir as i64), &name])?;
        self.decode_opt(row, |r| u64_at(r, 0))
    }

    fn insert_dirent(&mut self, dir: Ino, name: &str, child: Ino) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO dirents (dir, name, child) VALUES ($1, $2, $3)",
            &[&(dir as i64), &name, &(child as i64)],
        )?;
        Ok(())
    }

    fn delete_dirent(&mut self, dir: Ino, name: &str) -> Result<(), FsStatus> {
        self.exec("DELETE FROM dirents WHERE dir = $1 AND name = $2", &[&(dir as i64), &name])?;
        Ok(())
    }

    fn list_dir(&mut self, dir: Ino, after: &str, limit: usize) -> Result<Vec<DirEntry>, FsStatus> {
        let sql = concat!(
            "SELECT d.name, EXISTS (SELECT 1 FROM xattrs x WHERE x.ino = d.child), ",
            inode_cols!(),
            " FROM dirents d JOIN inodes i ON i.ino = d.child \
             WHERE d.dir = $1 AND d.name > $2 ORDER BY d.name LIMIT $3"
        );
        let rows = self.query(sql, &[&(dir as i64), &after, &big(limit)])?;
        let entries =
            self.decode(rows, |r| Ok(((get_at::<String>(r, 0)?, get_at::<bool>(r, 1)?), inode_from_row(r, 2)?)))?;
        let (named, inodes): (Vec<(String, bool)>, Vec<Inode>) = entries.into_iter().unzip();
        let inodes = self.with_components(inodes)?;
        let entries = named.into_iter().zip(inodes);
        Ok(entries.map(|((name, has_xattrs), inode)| DirEntry { name, inode, has_xattrs }).collect())
    }

    fn dir_is_empty(&mut self, dir: Ino) -> Result<bool, FsStatus> {
        let row = self.query_one("SELECT EXISTS (SELECT 1 FROM dirents WHERE dir = $1)", &[&(dir as i64)])?;
        Ok(!self.decode_one(row, |r| get_at::<bool>(r, 0))?)
    }

    fn usage(&mut self) -> Result<(u64, u64), FsStatus> {
        let sql = "SELECT COUNT(*), \
                   COALESCE(SUM(CASE WHEN kind = 1 THEN data_bytes + LEAST(size, small_threshold) END), 0)::BIGINT \
                   FROM inodes";
        let row = self.query_one(sql, &[])?;
        self.decode_one(row, |r| Ok((u64_at(r, 0)?, u64_at(r, 1)?)))
    }

    fn get_xattr(&mut self, ino: Ino, name: &str) -> Result<Option<Vec<u8>>, FsStatus> {
        let row = self.query_opt("SELECT value FROM xattrs WHERE ino = $1 AND name = $2", &[&(ino as i64), &name])?;
        self.decode_opt(row, |r| get_at(r, 0))
    }

    fn list_xattrs(&mut self, ino: Ino) -> Result<Vec<(String, usize)>, FsStatus> {
        let sql = "SELECT name, length(value)::BIGINT FROM xattrs WHERE ino = $1 ORDER BY name";
        let rows = self.query(sql, &[&(ino as i64)])?;
        self.decode(rows, |r| Ok((get_at::<String>(r, 0)?, usize_at(r, 1)?)))
    }

    fn put_xattr(&mut self, ino: Ino, name: &str, value: &[u8]) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO xattrs (ino, name, value) VALUES ($1, $2, $3) \
             ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
            &[&(ino as i64), &name, &value],
        )?;
        Ok(())
    }

    fn delete_xattr(&mut self, ino: Ino, name: &str) -> Result<bool, FsStatus> {
        Ok(self.exec("DELETE FROM xattrs WHERE ino = $1 AND name = $2", &[&(ino as i64), &name])? > 0)
    }

    fn get_small(&mut self, ino: Ino) -> Result<Option<Vec<u8>>, FsStatus> {
        let row = self.query_opt("SELECT bytes FROM small_data WHERE ino = $1", &[&(ino as i64)])?;
        self.decode_opt(row, |r| get_at::<Vec<u8>>(r, 0))
    }

    fn put_small(&mut self, ino: Ino, bytes: &[u8]) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO small_data (ino, bytes) VALUES ($1, $2) ON CONFLICT (ino) DO UPDATE SET bytes = excluded.bytes",
            &[&(ino as i64), &bytes],
        )?;
        Ok(())
    }

    fn get_staged(&mut self, ino: Ino) -> Result<Option<(u64, Vec<u8>)>, FsStatus> {
        let row = self.query_opt("SELECT txn, bytes FROM small_staged WHERE ino = $1", &[&(ino as i64)])?;
        self.decode_opt(row, |r| Ok((u64_at(r, 0)?, get_at::<Vec<u8>>(r, 1)?)))
    }

    fn put_staged(&mut self, ino: Ino, txn: u64, bytes: &[u8]) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO small_staged (ino, txn, bytes) VALUES ($1, $2, $3) \
             ON CONFLICT (ino) DO UPDATE SET txn = excluded.txn, bytes = excluded.bytes",
            &[&(ino as i64), &(txn as i64), &bytes],
        )?;
        Ok(())
    }

    fn delete_staged(&mut self, ino: Ino) -> Result<(), FsStatus> {
        self.exec("DELETE FROM small_staged WHERE ino = $1", &[&(ino as i64)])?;
        Ok(())
    }

    fn get_acl(&mut self, ino: Ino) -> Result<Vec<AclEntry>, FsStatus> {
        let sql = "SELECT kind, id, rights, flags FROM acl_entries WHERE ino = $1 ORDER BY kind, id";
        let rows = self.query(sql, &[&(ino as i64)])?;
        let raw = self.decode(rows, |r| {
            Ok((get_at::<i64>(r, 0)?, get_at::<i64>(r, 1)?, get_at::<i64>(r, 2)?, get_at::<i64>(r, 3)?))
        })?;
        raw.into_iter().map(|(k, id, rights, flags)| crate::sqlite::acl_entry(k, id, rights, flags)).collect()
    }

    fn put_acl(&mut self, ino: Ino, entries: &[AclEntry]) -> Result<(), FsStatus> {
        self.exec("DELETE FROM acl_entries WHERE ino = $1", &[&(ino as i64)])?;
        for e in entries {
            let (kind, id) = e.who.code();
            self.exec(
                "INSERT INTO acl_entries (ino, kind, id, rights, flags) VALUES ($1, $2, $3, $4, $5)",
                &[&(ino as i64), &i64::from(kind), &i64::from(id), &i64::from(e.rights), &i64::from(e.flags)],
            )?;
        }
        Ok(())
    }

    fn pal_pending_put(&mut self, what: PalPush, ino: Ino) -> Result<(), FsStatus> {
        let sql = match what {
            PalPush::File => {
                "INSERT INTO pal_pending (ino, seq) VALUES ($1, 1) \
                 ON CONFLICT (ino) DO UPDATE SET seq = pal_pending.seq + 1"
            }
            PalPush::Collection => {
                "INSERT INTO collection_pending (ino, seq) VALUES ($1, 1) \
                 ON CONFLICT (ino) DO UPDATE SET seq = collection_pending.seq + 1"
            }
        };
        self.exec(sql, &[&(ino as i64)]).map(|_| ())
    }

    fn pal_pending_delete(&mut self, what: PalPush, ino: Ino, seq: u64) -> Result<(), FsStatus> {
        let sql = match what {
            PalPush::File => "DELETE FROM pal_pending WHERE ino = $1 AND seq = $2",
            PalPush::Collection => "DELETE FROM collection_pending WHERE ino = $1 AND seq = $2",
        };
        self.exec(sql, &[&(ino as i64), &(seq as i64)]).map(|_| ())
    }

    fn pal_pending_seq(&mut self, what: PalPush, ino: Ino) -> Result<Option<u64>, FsStatus> {
        let sql = match what {
            PalPush::File => "SELECT seq FROM pal_pending WHERE ino = $1",
            PalPush::Collection => "SELECT seq FROM collection_pending WHERE ino = $1",
        };
        let row = self.query_opt(sql, &[&(ino as i64)])?;
        self.decode_opt(row, |r| Ok(get_at::<i64>(r, 0)? as u64))
    }

    fn pal_pending_list(&mut self, what: PalPush, limit: usize) -> Result<Vec<(Ino, u64)>, FsStatus> {
        let sql = match what {
            PalPush::File => "SELECT ino, seq FROM pal_pending ORDER BY ino LIMIT $1",
            PalPush::Collection => "SELECT ino, seq FROM collection_pending ORDER BY ino LIMIT $1",
        };
        let rows = self.query(sql, &[&(limit as i64)])?;
        let raw = self.decode(rows, |r| Ok((get_at::<i64>(r, 0)?, get_at::<i64>(r, 1)?)))?;
        Ok(raw.into_iter().map(|(i, s)| (i as Ino, s as u64)).collect())
    }

    fn pal_member(&mut self, ino: Ino) -> Result<Option<Ino>, FsStatus> {
        let row = self.query_opt("SELECT collection FROM pal_members WHERE ino = $1", &[&(ino as i64)])?;
        self.decode_opt(row, |r| Ok(get_at::<i64>(r, 0)? as Ino))
    }

    fn put_pal_member(&mut self, ino: Ino, collection: Ino) -> Result<(), FsStatus> {
        let sql = "INSERT INTO pal_members (ino, collection) VALUES ($1, $2) \
                   ON CONFLICT (ino) DO UPDATE SET collection = excluded.collection";
        self.exec(sql, &[&(ino as i64), &(collection as i64)]).map(|_| ())
    }

    fn pal_members(&mut self, collection: Ino, after: Ino, limit: usize) -> Result<Vec<Ino>, FsStatus> {
        let sql = "SELECT ino FROM pal_members WHERE collection = $1 AND ino > $2 ORDER BY ino LIMIT $3";
        let rows = self.query(sql, &[&(collection as i64), &(after as i64), &(limit as i64)])?;
        self.decode(rows, |r| Ok(get_at::<i64>(r, 0)? as Ino))
    }

    fn shared_collections(&mut self, limit: usize) -> Result<Vec<Ino>, FsStatus> {
        const _: () = assert!(nasd_proto::acl::ACL_SHARED == 2, "the literal below is ACL_SHARED");
        let sql = "SELECT DISTINCT ino FROM acl_entries WHERE (flags & 2) != 0 ORDER BY ino LIMIT $1";
        let rows = self.query(sql, &[&(limit as i64)])?;
        self.decode(rows, |r| Ok(get_at::<i64>(r, 0)? as Ino))
    }

    fn get_quota(&mut self, subject: QuotaSubject) -> Result<Option<Quota>, FsStatus> {
        let (kind, id) = subject.key();
        let sql = "SELECT kind, id, bytes_limit, files_limit, bytes_used, files_used FROM quotas \
                   WHERE kind = $1 AND id = $2";
        let row = self.query_opt(sql, &[&i64::from(kind), &(id as i64)])?;
        self.decode_opt(row, quota_from_row)
    }

    fn put_quota(&mut self, q: &Quota) -> Result<(), FsStatus> {
        let (kind, id) = q.subject.key();
        self.exec(
            "INSERT INTO quotas (kind, id, bytes_limit, files_limit, bytes_used, files_used) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (kind, id) DO UPDATE SET \
             bytes_limit = excluded.bytes_limit, files_limit = excluded.files_limit, \
             bytes_used = excluded.bytes_used, files_used = excluded.files_used",
            &[
                &i64::from(kind),
                &(id as i64),
                &q.bytes_limit.map(|v| v as i64),
                &q.files_limit.map(|v| v as i64),
                &(q.bytes_used as i64),
                &(q.files_used as i64),
            ],
        )?;
        Ok(())
    }

    fn delete_quota(&mut self, subject: QuotaSubject) -> Result<(), FsStatus> {
        let (kind, id) = subject.key();
        self.exec("DELETE FROM quotas WHERE kind = $1 AND id = $2", &[&i64::from(kind), &(id as i64)])?;
        Ok(())
    }

    fn list_quotas(&mut self) -> Result<Vec<Quota>, FsStatus> {
        let sql = "SELECT kind, id, bytes_limit, files_limit, bytes_used, files_used FROM quotas ORDER BY kind, id";
        let rows = self.query(sql, &[])?;
        self.decode(rows, quota_from_row)
    }

    fn usage_of_uid(&mut self, uid: u32) -> Result<(u64, u64), FsStatus> {
        let sql = "SELECT COALESCE(SUM(CASE WHEN kind = 1 THEN data_bytes + LEAST(size, small_threshold) ELSE 0 END), \
                   0)::BIGINT, COUNT(*) FROM inodes WHERE uid = $1";
        let row = self.query_one(sql, &[&i64::from(uid)])?;
        self.decode_one(row, |r| Ok((u64_at(r, 0)?, u64_at(r, 1)?)))
    }

    fn get_user(&mut self, name: &str) -> Result<Option<User>, FsStatus> {
        let sql = "SELECT name, uid, gid, password_hash, admin, gateway_lo, gateway_hi FROM users WHERE name = $1";
        let row = self.query_opt(sql, &[&name])?;
        let user = self.decode_opt(row, user_from_row)?;
        user.map(|u| self.with_groups(u)).transpose()
    }

    fn uid_taken(&mut self, uid: u32) -> Result<bool, FsStatus> {
        let row = self.query_one("SELECT EXISTS (SELECT 1 FROM users WHERE uid = $1)", &[&i64::from(uid)])?;
        self.decode_one(row, |r| get_at(r, 0))
    }

    fn put_user(&mut self, u: &User) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO users (name, uid, gid, password_hash, admin, gateway_lo, gateway_hi) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (name) DO UPDATE SET uid = excluded.uid, gid = excluded.gid, \
             password_hash = excluded.password_hash, admin = excluded.admin, \
             gateway_lo = excluded.gateway_lo, gateway_hi = excluded.gateway_hi",
            &[
                &u.name,
                &i64::from(u.uid),
                &i64::from(u.gid),
                &u.password_hash,
                &u.admin,
                &u.gateway.map(|g| i64::from(g.0)),
                &u.gateway.map(|g| i64::from(g.1)),
            ],
        )?;
        self.exec("DELETE FROM user_groups WHERE name = $1", &[&u.name])?;
        for g in &u.groups {
            self.exec("INSERT INTO user_groups (name, gid) VALUES ($1, $2)", &[&u.name, &i64::from(*g)])?;
        }
        Ok(())
    }

    fn list_users(&mut self) -> Result<Vec<User>, FsStatus> {
        let sql = "SELECT name, uid, gid, password_hash, admin, gateway_lo, gateway_hi FROM users ORDER BY name";
        let rows = self.query(sql, &[])?;
        let users = self.decode(rows, user_from_row)?;
        users.into_iter().map(|u| self.with_groups(u)).collect()
    }

    fn get_drive(&mut self, drive: u32) -> Result<Option<DriveRecord>, FsStatus> {
        let sql = concat!("SELECT ", drive_cols!(), " FROM drives WHERE drive = $1");
        let row = self.query_opt(sql, &[&i64::from(drive)])?;
        self.decode_opt(row, drive_from_row)
    }

    fn drive_with_id(&mut self, drive_id: &[u8; 16]) -> Result<Option<u32>, FsStatus> {
        let row = self.query_opt("SELECT drive FROM drives WHERE drive_id = $1", &[&&drive_id[..]])?;
        self.decode_opt(row, |r| u32_at(r, 0))
    }

    fn put_drive(&mut self, d: &DriveRecord) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO drives (drive, drive_id, addr, partition, sealed_keys, capacity_bytes, failure_domain, state) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (drive) DO UPDATE SET \
             drive_id = excluded.drive_id, addr = excluded.addr, partition = excluded.partition, \
             sealed_keys = excluded.sealed_keys, capacity_bytes = excluded.capacity_bytes, \
             failure_domain = excluded.failure_domain, state = excluded.state",
            &[
                &i64::from(d.drive),
                &&d.drive_id[..],
                &d.addr,
                &(d.partition as i64),
                &d.sealed_keys,
                &(d.capacity_bytes as i64),
                &d.failure_domain,
                &i64::from(d.state as u8),
            ],
        )?;
        Ok(())
    }

    fn list_drives(&mut self) -> Result<Vec<DriveRecord>, FsStatus> {
        let rows = self.query(concat!("SELECT ", drive_cols!(), " FROM drives ORDER BY drive"), &[])?;
        self.decode(rows, drive_from_row)
    }

    fn pool_insert(&mut self, o: &ObjectRef) -> Result<(), FsStatus> {
        let [d, p, ob] = obj_params(o);
        self.exec("INSERT INTO pool (drive, partition, object) VALUES ($1, $2, $3)", &[&d, &p, &ob])?;
        Ok(())
    }

    fn pool_take(&mut self, drive: u32) -> Result<Option<ObjectRef>, FsStatus> {
        // The first pooled object at or past a point of this connection's own (a little past
        // the last one it took), else the first: concurrent creates seldom take one row (which
        // one of them would fail on as "concurrent delete"), and each reads one row only.
        // `LIMIT 1` over `UNION ALL` runs the second branch only if the first finds nothing.
        let sql = "DELETE FROM pool WHERE (drive, partition, object) = (SELECT drive, partition, object FROM ( \
                   (SELECT drive, partition, object FROM pool WHERE drive = $1 AND (partition, object) >= ($2, $3) \
                    ORDER BY partition, object LIMIT 1) \
                   UNION ALL \
                   (SELECT drive, partition, object FROM pool WHERE drive = $1 ORDER BY partition, object LIMIT 1) \
                   ) c LIMIT 1) \
                   RETURNING drive, partition, object";
        let (partition, after) = self.conn.pool_points.get(&drive).copied().unwrap_or((0, 0));
        let skip = nasd_env::Env::real().random_u64() % POOL_SPREAD;
        let from = after.saturating_add(skip as i64);
        let row = self.query_opt(sql, &[&i64::from(drive), &partition, &from])?;
        let taken = self.decode_opt(row, object_from_row)?;
        if let Some(o) = &taken {
            self.conn.pool_points.insert(drive, (o.partition as i64, (o.object as i64).saturating_add(1)));
        }
        Ok(taken)
    }

    fn pool_count(&mut self, drive: u32) -> Result<u64, FsStatus> {
        let row = self.query_one("SELECT COUNT(*) FROM pool WHERE drive = $1", &[&i64::from(drive)])?;
        self.decode_one(row, |r| u64_at(r, 0))
    }

    fn pool_objects(&mut self, drive: u32) -> Result<Vec<ObjectRef>, FsStatus> {
        self.objects("SELECT drive, partition, object FROM pool WHERE drive = $1", drive)
    }

    fn file_objects(&mut self, drive: u32) -> Result<Vec<ObjectRef>, FsStatus> {
        self.objects("SELECT drive, partition, object FROM components WHERE drive = $1", drive)
    }

    fn object_known(&mut self, o: &ObjectRef) -> Result<bool, FsStatus> {
        let sql = "SELECT EXISTS (SELECT 1 FROM components WHERE drive = $1 AND partition = $2 AND object = $3) \
                   OR EXISTS (SELECT 1 FROM pool WHERE drive = $1 AND partition = $2 AND object = $3) \
                   OR EXISTS (SELECT 1 FROM doomed WHERE drive = $1 AND partition = $2 AND object = $3)";
        let [d, p, ob] = obj_params(o);
        let row = self.query_one(sql, &[&d, &p, &ob])?;
        self.decode_one(row, |r| get_at(r, 0))
    }

    fn put_component(&mut self, ino: Ino, idx: usize, c: &Component) -> Result<(), FsStatus> {
        let [d, p, o] = obj_params(&c.object);
        self.exec(
            "INSERT INTO components (ino, idx, drive, partition, object, state) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (ino, idx) DO UPDATE SET drive = excluded.drive, partition = excluded.partition, \
             object = excluded.object, state = excluded.state",
            &[&(ino as i64), &big(idx), &d, &p, &o, &i64::from(c.state.code())],
        )?;
        Ok(())
    }

    fn delete_components(&mut self, ino: Ino) -> Result<(), FsStatus> {
        self.exec("DELETE FROM components WHERE ino = $1", &[&(ino as i64)])?;
        Ok(())
    }

    fn component_of(&mut self, o: &ObjectRef) -> Result<Option<(Ino, usize)>, FsStatus> {
        let sql = "SELECT ino, idx FROM components WHERE drive = $1 AND partition = $2 AND object = $3";
        let [d, p, ob] = obj_params(o);
        let row = self.query_opt(sql, &[&d, &p, &ob])?;
        self.decode_opt(row, |r| Ok((u64_at(r, 0)?, usize_at(r, 1)?)))
    }

    fn list_stale_components(&mut self, after: (Ino, usize), limit: usize) -> Result<Vec<(Ino, usize)>, FsStatus> {
        let sql = "SELECT ino, idx FROM components WHERE state = 1 AND (ino, idx) > ($1, $2) \
                   ORDER BY ino, idx LIMIT $3";
        let rows = self.query(sql, &[&(after.0 as i64), &big(after.1), &big(limit)])?;
        self.decode(rows, |r| Ok((u64_at(r, 0)?, usize_at(r, 1)?)))
    }

    fn list_components_on_drive(
        &mut self,
        drive: u32,
        after: (Ino, usize),
        limit: usize,
    ) -> Result<Vec<(Ino, usize, ObjectRef)>, FsStatus> {
        let sql = "SELECT drive, partition, object, ino, idx FROM components \
                   WHERE drive = $1 AND (ino, idx) > ($2, $3) ORDER BY ino, idx LIMIT $4";
        let rows = self.query(sql, &[&i64::from(drive), &(after.0 as i64), &big(after.1), &big(limit)])?;
        self.decode(rows, |r| Ok((u64_at(r, 3)?, usize_at(r, 4)?, object_from_row(r)?)))
    }

    fn component_counts(&mut self) -> Result<Vec<(u32, u64)>, FsStatus> {
        let sql = "SELECT d.drive, (SELECT COUNT(*) FROM components c WHERE c.drive = d.drive) \
                   FROM drives d ORDER BY d.drive";
        let rows = self.query(sql, &[])?;
        self.decode(rows, |r| Ok((u32_at(r, 0)?, u64_at(r, 1)?)))
    }

    fn count_degraded(&mut self) -> Result<u64, FsStatus> {
        let row = self.query_one("SELECT COUNT(DISTINCT ino) FROM components WHERE state = 1", &[])?;
        self.decode_one(row, |r| u64_at(r, 0))
    }

    fn get_stale_ranges(&mut self, ino: Ino, idx: usize) -> Result<Vec<StaleRange>, FsStatus> {
        let sql = "SELECT \"offset\", length FROM stale_ranges WHERE ino = $1 AND idx = $2 ORDER BY \"offset\"";
        let rows = self.query(sql, &[&(ino as i64), &big(idx)])?;
        self.decode(rows, |r| Ok(StaleRange { offset: u64_at(r, 0)?, length: u64_at(r, 1)? }))
    }

    fn put_stale_range(&mut self, ino: Ino, idx: usize, range: &StaleRange) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO stale_ranges (ino, idx, \"offset\", length) VALUES ($1, $2, $3, $4)",
            &[&(ino as i64), &big(idx), &(range.offset as i64), &(range.length as i64)],
        )?;
        Ok(())
    }

    fn delete_stale_ranges(&mut self, ino: Ino, idx: Option<usize>) -> Result<(), FsStatus> {
        self.exec(
            "DELETE FROM stale_ranges WHERE ino = $1 AND ($2::BIGINT IS NULL OR idx = $2)",
            &[&(ino as i64), &idx.map(big)],
        )?;
        Ok(())
    }

    fn alloc_txn(&mut self) -> Result<u64, FsStatus> {
        let row = self.query_one("SELECT nextval('next_txn')", &[])?;
        self.decode_one(row, |r| u64_at(r, 0))
    }

    fn put_intent(&mut self, i: &Intent) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO intents (txn, ino, state, uid, deadline_ns, escrow, size_limit, writes, unopened) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (txn) DO UPDATE SET ino = excluded.ino, state = excluded.state, uid = excluded.uid, \
             deadline_ns = excluded.deadline_ns, escrow = excluded.escrow, size_limit = excluded.size_limit, \
             writes = excluded.writes, unopened = excluded.unopened",
            &[
                &(i.txn as i64),
                &(i.ino as i64),
                &i64::from(i.state.code()),
                &i64::from(i.uid),
                &i.deadline_ns,
                &(i.escrow as i64),
                &(i.size_limit as i64),
                &(i.writes as i64),
                &(i.unopened as i64),
            ],
        )?;
        Ok(())
    }

    fn get_intent(&mut self, txn: u64) -> Result<Option<Intent>, FsStatus> {
        let row =
            self.query_opt(concat!("SELECT ", intent_cols!(), " FROM intents WHERE txn = $1"), &[&(txn as i64)])?;
        self.decode_opt(row, intent_from_row)
    }

    fn intent_of_inode(&mut self, ino: Ino) -> Result<Option<Intent>, FsStatus> {
        let row =
            self.query_opt(concat!("SELECT ", intent_cols!(), " FROM intents WHERE ino = $1"), &[&(ino as i64)])?;
        self.decode_opt(row, intent_from_row)
    }

    fn list_intents(&mut self, after: u64, limit: usize) -> Result<Vec<Intent>, FsStatus> {
        let sql = concat!("SELECT ", intent_cols!(), " FROM intents WHERE txn > $1 ORDER BY txn LIMIT $2");
        let rows = self.query(sql, &[&(after as i64), &big(limit)])?;
        self.decode(rows, intent_from_row)
    }

    fn delete_intent(&mut self, txn: u64) -> Result<(), FsStatus> {
        self.exec("DELETE FROM intents WHERE txn = $1", &[&(txn as i64)])?;
        Ok(())
    }

    fn doom(&mut self, o: &ObjectRef) -> Result<(), FsStatus> {
        let [d, p, ob] = obj_params(o);
        self.exec("INSERT INTO doomed (drive, partition, object) VALUES ($1, $2, $3)", &[&d, &p, &ob])?;
        Ok(())
    }

    fn list_doomed(&mut self, drive: Option<u32>, limit: usize) -> Result<Vec<ObjectRef>, FsStatus> {
        let sql = "SELECT drive, partition, object FROM doomed WHERE $2::BIGINT IS NULL OR drive = $2 \
                   ORDER BY drive, partition, object LIMIT $1";
        let rows = self.query(sql, &[&big(limit), &drive.map(i64::from)])?;
        self.decode(rows, object_from_row)
    }

    fn doomed_objects(&mut self, drive: u32) -> Result<Vec<ObjectRef>, FsStatus> {
        self.objects("SELECT drive, partition, object FROM doomed WHERE drive = $1", drive)
    }

    fn forget_doomed(&mut self, o: &ObjectRef) -> Result<(), FsStatus> {
        let [d, p, ob] = obj_params(o);
        self.exec("DELETE FROM doomed WHERE drive = $1 AND partition = $2 AND object = $3", &[&d, &p, &ob])?;
        Ok(())
    }

    fn put_acv_intent(&mut self, i: &AcvIntent) -> Result<(), FsStatus> {
        let [d, p, o] = obj_params(&i.object);
        self.exec(
            "INSERT INTO acv_intents (drive, partition, object, acv) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (drive, partition, object) DO UPDATE SET acv = excluded.acv",
            &[&d, &p, &o, &(i.acv as i64)],
        )?;
        Ok(())
    }

    fn list_acv_intents(&mut self, drive: Option<u32>, limit: usize) -> Result<Vec<AcvIntent>, FsStatus> {
        let sql = "SELECT drive, partition, object, acv FROM acv_intents WHERE $2::BIGINT IS NULL OR drive = $2 \
                   ORDER BY drive, partition, object LIMIT $1";
        let rows = self.query(sql, &[&big(limit), &drive.map(i64::from)])?;
        self.decode(rows, |r| Ok(AcvIntent { object: object_from_row(r)?, acv: u64_at(r, 3)? }))
    }

    fn delete_acv_intent(&mut self, o: &ObjectRef, only_acv: Option<u64>) -> Result<(), FsStatus> {
        let [d, p, ob] = obj_params(o);
        self.exec(
            "DELETE FROM acv_intents WHERE drive = $1 AND partition = $2 AND object = $3 \
             AND ($4::BIGINT IS NULL OR acv = $4)",
            &[&d, &p, &ob, &only_acv.map(|a| a as i64)],
        )?;
        Ok(())
    }

    fn get_setting(&mut self, key: &str) -> Result<Option<Vec<u8>>, FsStatus> {
        let row = self.query_opt("SELECT value FROM settings WHERE key = $1", &[&key])?;
        self.decode_opt(row, |r| get_at(r, 0))
    }

    fn put_setting(&mut self, key: &str, value: &[u8]) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO settings (key, value) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            &[&key, &value],
        )?;
        Ok(())
    }
    fn now_ms(&mut self) -> Result<u64, FsStatus> {
        let row = self.query_one("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT", &[])?;
        self.decode_one(row, |r| u64_at(r, 0))
    }

    fn get_lease(&mut self, name: &str) -> Result<Option<LeaseRow>, FsStatus> {
        let row = self.query_opt("SELECT name, holder, token, expires_ms FROM leases WHERE name = $1", &[&name])?;
        self.decode_opt(row, lease_from_row)
    }

    fn put_lease(&mut self, l: &LeaseRow) -> Result<(), FsStatus> {
        self.exec(
            "INSERT INTO leases (name, holder, token, expires_ms) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, token = excluded.token, \
             expires_ms = excluded.expires_ms",
            &[&l.name, &l.holder, &(l.token as i64), &(l.expires_ms as i64)],
        )?;
        Ok(())
    }

    fn delete_lease(&mut self, name: &str) -> Result<(), FsStatus> {
        self.exec("DELETE FROM leases WHERE name = $1", &[&name])?;
        Ok(())
    }

    fn list_leases(&mut self, prefix: &str, limit: usize) -> Result<Vec<LeaseRow>, FsStatus> {
        let sql = "SELECT name, holder, token, expires_ms FROM leases \
                   WHERE left(name, length($1)) = $1 ORDER BY name LIMIT $2";
        let rows = self.query(sql, &[&prefix, &big(limit)])?;
        self.decode(rows, lease_from_row)
    }

    fn list_names_ending(
        &mut self,
        suffix: &str,
        after_dir: Ino,
        after_name: &str,
        limit: usize,
    ) -> Result<Vec<(Ino, String, Ino)>, FsStatus> {
        let sql = "SELECT dir, name, child FROM dirents \
                   WHERE right(name, length($1)) = $1 AND (dir > $2 OR (dir = $2 AND name > $3)) \
                   ORDER BY dir, name LIMIT $4";
        let rows = self.query(sql, &[&suffix, &(after_dir as i64), &after_name, &big(limit)])?;
        self.decode(rows, |r| Ok((u64_at(r, 0)?, get_at::<String>(r, 1)?, u64_at(r, 2)?)))
    }
}

fn lease_from_row(r: &Row) -> Decoded<LeaseRow> {
    Ok(LeaseRow { name: get_at(r, 0)?, holder: get_at(r, 1)?, token: u64_at(r, 2)?, expires_ms: u64_at(r, 3)? })
}
