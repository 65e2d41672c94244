//! The file manager's metadata: a POSIX name space (directories, regular
//! files, symbolic links, hard links, owners, modes, times), file layouts
//! and their component objects, users, the drive table, the object pool and
//! the intention logs (objects to remove, access-control versions to set,
//! write intents).
//!
//! # Design
//!
//! - **Backends are a trait.** [`Backend`] runs a closure in one transaction
//!   over row operations ([`Txn`]); [`Sqlite`] (embedded, WAL,
//!   `synchronous=FULL`) is the default, [`Postgres`] keeps the same rows in
//!   a PostgreSQL server (every transaction `SERIALIZABLE`), and a
//!   [`Location`] (`sqlite:PATH`, `postgres://…`) opens either as a
//!   [`Store`].
//! - **Transactions may run again.** An attempt ends in a [`TxnError`]:
//!   `Conflict` (a serialization failure or deadlock: [`Backend::transact`]
//!   runs the closure again, at most [`TXN_ATTEMPTS_MAX`] times with
//!   backoff), `Abort` (the closure's own error) or `Storage` (the backend
//!   failed). So closures are `FnMut` and act only through their [`Txn`].
//! - **Semantics are written once.** [`Namespace`] implements permission
//!   checks, rename rules, link counts and object bookkeeping generically over
//!   [`Backend`]; every public method is exactly one transaction, so a failed
//!   operation changes nothing. The conformance suite (`testing::conformance`,
//!   behind the `testing` feature) runs the same checks against every backend.
//! - **Drives are finished after commit.** Operations that drop or re-protect
//!   drive objects record what must happen in the same transaction (the
//!   `doomed` table and the ACV intents) and report it in [`Effects`]; the
//!   manager carries it out on the drives and then forgets the records.
//! - **Files are layouts of components.** A regular file has a [`Layout`]
//!   and `layout.components()` component objects on distinct drives, placed
//!   by the manager's policy (a [`Placer`]) inside the creating transaction.
//!   Directories may carry a layout that new files below them inherit
//!   (dynamically: the nearest ancestor's at creation); the root always has
//!   one. Writes run under write intents (Slice's intention log): a
//!   component that missed writes is marked Stale with the ranges it missed,
//!   for repair to rebuild.
//!
//! # Example
//!
//! ```
//! use nasd_meta::{Caller, Layout, Namespace, Sqlite, ROOT_INO};
//!
//! let ns = Namespace::new(Sqlite::open_in_memory()?, Layout::SINGLE)?;
//! let dir = ns.mkdir(&Caller::ROOT, ROOT_INO, "home", 0o755)?;
//! assert_eq!(ns.walk(&Caller::ROOT, "/home", true)?.attr.ino, dir.attr.ino);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod acl;
mod admin;
mod backend;
mod components;
mod error;
mod intents;
mod layouts;
mod leases;
mod log_limit;
mod namespace;
mod perm;
pub mod pg_connect;
#[cfg(any(test, feature = "pg-server"))]
pub mod pg_server;
mod postgres;
mod quotas;
mod routing;
mod small;
mod sqlite;
mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod types;
mod walk;
mod xattrs;
pub use quotas::ESCROW_BYTES_MAX;

pub use backend::{
    commits_on_this_thread, with_retries, Access, Backend, Durability, PalPush, Txn, TxnError, TXN_ATTEMPTS_MAX,
    TXN_BACKOFF_MAX, TXN_BACKOFF_MIN,
};
pub use components::subtract_ranges;
pub use error::{postgres_detail, postgres_server_gone, MetaError};
pub use layouts::{take_pooled, Placer};
pub use leases::{holds, reservation_name, LEASE_HOLDER_MAX, LEASE_NAME_MAX, LEASE_TTL_MAX, RESERVATION_PREFIX};
pub use log_limit::{LogLimit, LOG_REPEAT_INTERVAL};
pub use namespace::Namespace;
pub use nasd_proto::fs::*;
pub use nasd_proto::layout::{Component, ComponentState, Layout, Scheme, COMPONENTS_MAX};
pub use nasd_proto::manager::{DriveState, XattrMode};
pub use postgres::{
    Postgres, COMMIT_MARK_KEEP_DAYS, CONFLICTS_BEFORE_ALONE, CONNECTIONS_MAX, CONNECTION_WAIT_MAX, CONNECT_TIMEOUT,
    INO_BLOCK, MIGRATION_LOCK, POSTGRES_SCHEMA_VERSION, STATEMENT_TIMEOUT, WRITERS_MAX, WRITER_LOCK,
};
pub use routing::{redirect_scaled, ROUTING_SETTING};
pub use sqlite::SQLITE_READERS;
pub use sqlite::{Sqlite, SCHEMA_VERSION};
pub use store::{Location, Store};
pub use types::{
    AcvIntent, Caller, DirEntry, DriveRecord, Effects, Inode, Intent, IntentState, Lease, Quota, QuotaSubject,
    SetAttrs, StaleRange, User, MANAGER_WRITER_UID,
};

/// Most entries one `readdir` returns; a larger `limit` is capped to it.
/// Costs one row read (and one inode) per entry per call.
pub const READDIR_ENTRIES_MAX: usize = 1024;
/// Most doomed objects or ACV intents one listing returns, and most objects
/// one `pool_add` or `forget_doomed` call takes (one transaction each).
pub const BATCH_MAX: usize = 1024;
/// Longest user name, in bytes.
pub const USER_NAME_MAX: usize = 255;
/// Longest password hash string, in bytes.
pub const PASSWORD_HASH_MAX: usize = 1024;
/// Longest drive address (`host:port`), in bytes.
pub const DRIVE_ADDR_MAX: usize = 1024;
/// Largest sealed key blob of a drive record, in bytes.
pub const SEALED_KEYS_MAX: usize = 64 * 1024;
/// Longest settings key, in bytes.
pub const SETTING_KEY_MAX: usize = 255;
/// Largest settings value, in bytes.
pub const SETTING_VALUE_MAX: usize = 1024 * 1024;
/// Deepest a directory may be made or moved below the root (the root is at
/// depth 0): `mkdir` and a `rename` that moves a directory to another parent
/// refuse to put one deeper, with `TooDeep`. A path naming a deeper
/// directory would be over [`PATH_MAX`] (each level costs at least two
/// bytes), and it bounds the walk up the parent pointers that those two
/// operations make (one indexed row read per level).
pub const DIR_DEPTH_MAX: usize = PATH_MAX / 2;

/// Most stale ranges recorded per component. Past it the closest ranges are
/// joined (the bytes between them count as missed too: repair rebuilds a
/// little more than needed, never less). Bounds what marking a component
/// stale reads and writes (one row per range).
pub const STALE_RANGES_MAX: usize = 256;
/// Most (component, range) entries one `commit_write` takes, and most ranges
/// one `mark_stale` takes: a `COMMIT` names at most
/// `nasd_proto::manager::DIRTY_RANGES_MAX` file ranges, each one range in
/// each of at most [`COMPONENTS_MAX`] components.
pub const COMMIT_STALE_MAX: usize = COMPONENTS_MAX * nasd_proto::manager::DIRTY_RANGES_MAX;

const _: () = assert!(READDIR_ENTRIES_MAX > 0 && BATCH_MAX > 0 && DIR_DEPTH_MAX > 0);
const _: () = assert!(STALE_RANGES_MAX > 0 && COMMIT_STALE_MAX > 0);
