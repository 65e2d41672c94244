//! nfs-rpc: an NFSv3 and MOUNT v3 server over TCP, forked from
//! [nfsserve](https://github.com/huggingface/nfsserve) 0.11.0 (BSD-3-Clause;
//! `LICENSE`, and `NOTICE` for what changed and why). Its XDR, RPC and
//! NFS/MOUNT type definitions are kept (`xdr.rs`, `rpc.rs`, `nfs.rs`,
//! `mount.rs`); the server and the procedures are new (`server.rs`,
//! `procs.rs`) so that a file system ([`NfsFileSystem`]):
//!
//! - gets every call's **credentials** ([`Caller`]: the peer's address and
//!   the AUTH_SYS uid, gid and groups) and decides as that caller;
//! - chooses its own **opaque file handles** ([`FileHandle`], up to
//!   NFSv3's 64 bytes), so they can be sealed and survive restarts;
//! - serves **LINK, MKNOD and COMMIT** (and WRITE's stability levels with a
//!   write verifier), which nfsserve lacked.
//!
//! Every network input is bounded: a record at most [`RECORD_BYTES_MAX`],
//! an opaque at most [`IO_BYTES_MAX`], names [`NAME_BYTES_MAX`], calls in
//! flight per connection [`server::CALLS_PER_CONNECTION_MAX`] and in all
//! [`server::CALLS_IN_FLIGHT_MAX`], connections [`server::CONNECTIONS_MAX`]
//! and per client address [`Limits::connections_per_client`], calls
//! remembered by the duplicate-request cache [`DRC_ENTRIES_MAX`] (and
//! [`DRC_ENTRIES_PER_CLIENT_MAX`] per client address), its journal
//! [`DRC_JOURNAL_RECORDS_MAX`] records per file.
//!
//! Calls of a credential flavour other than AUTH_SYS are answered
//! `MSG_DENIED`/`AUTH_ERROR` (AUTH_NONE is admitted only for the NULL
//! procedures and MOUNT's listings). A resent SETATTR, CREATE, MKDIR,
//! SYMLINK, MKNOD, REMOVE, RMDIR, RENAME or LINK (same client address and
//! xid, same call) gets the first run's reply from the duplicate-request
//! cache ([`DuplicateRequestCache`]) instead of running twice, also after a
//! restart when the cache is journaled under a state directory.
//! No portmapper is served: clients name the port (libnfs:
//! `nfs://host/export?nfsport=P&mountport=P`, Linux: `-o port=P,mountport=P`).
#![allow(clippy::upper_case_acronyms)]

mod drc;
mod fs;
#[allow(missing_docs)]
pub mod mount;
#[allow(missing_docs)]
pub mod nfs;
mod procs;
#[allow(missing_docs)]
pub mod rpc;
pub mod server;
#[allow(missing_docs)]
pub mod xdr;

pub use drc::{
    DuplicateRequestCache, DRC_ENTRIES_MAX, DRC_ENTRIES_PER_CLIENT_MAX, DRC_JOURNAL_FILE, DRC_JOURNAL_OLD_FILE,
    DRC_JOURNAL_RECORDS_MAX, DRC_REPLY_BYTES_MAX, NON_IDEMPOTENT_PROCS,
};
pub use fs::{Auth, Caller, CreateHow, DirEntry, DirPage, FileHandle, FsStat, NfsFileSystem, NfsResult, Stable};
pub use procs::READDIR_ENTRIES_MAX;
pub use server::{serve, Limits, PeerFilter};

/// Largest READ or WRITE (and FSINFO's `rtmax`/`wtmax`).
pub const IO_BYTES_MAX: u32 = 1 << 20;
/// Largest RPC record a client may send: a WRITE of [`IO_BYTES_MAX`] and its header.
pub const RECORD_BYTES_MAX: usize = IO_BYTES_MAX as usize + 64 * 1024;
/// Longest file name (PATHCONF's `name_max`).
pub const NAME_BYTES_MAX: usize = 255;
/// Longest symbolic link target.
pub const PATH_BYTES_MAX: usize = 4096;
