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
pub use fs::{Auth, Call, Caller, CreateHow, DirEntry, DirPage, FileHandle, FsStat, NfsFileSystem, NfsResult, Stable};
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

/// The name of NFSv3 procedure `proc` (RFC 1813), `other` for a number it
/// does not define: a bounded label for metrics.
pub fn proc_name(proc: u32) -> &'static str {
    const NAMES: [&str; 22] = [
        "null",
        "getattr",
        "setattr",
        "lookup",
        "access",
        "readlink",
        "read",
        "write",
        "create",
        "mkdir",
        "symlink",
        "mknod",
        "remove",
        "rmdir",
        "rename",
        "link",
        "readdir",
        "readdirplus",
        "fsstat",
        "fsinfo",
        "pathconf",
        "commit",
    ];
    NAMES.get(proc as usize).copied().unwrap_or("other")
}

/// Every name [`outcome_of`] gives, `ok` first.
pub const OUTCOMES: [&str; 32] = [
    "ok",
    "perm",
    "noent",
    "io",
    "nxio",
    "acces",
    "exist",
    "xdev",
    "nodev",
    "notdir",
    "isdir",
    "inval",
    "fbig",
    "nospc",
    "rofs",
    "mlink",
    "nametoolong",
    "notempty",
    "dquot",
    "stale",
    "remote",
    "badhandle",
    "not_sync",
    "bad_cookie",
    "notsupp",
    "toosmall",
    "serverfault",
    "badtype",
    "jukebox",
    "garbage_args",
    "proc_unavail",
    "other",
];

/// The outcome of an NFS call from its reply: `ok`, the `nfsstat3` of a
/// failed procedure (lowercase, without `NFS3ERR_`), `proc_unavail`, or
/// `other` for what none of these name.
pub fn outcome_of(proc: u32, reply: &[u8]) -> &'static str {
    // xid, REPLY, MSG_ACCEPTED, verifier (AUTH_NONE, empty), accept_stat: 24 bytes, then the
    // procedure's status (every procedure but NULL starts its result with one).
    let word = |at: usize| reply.get(at..at + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    match word(20) {
        Some(0) => {}
        Some(3) => return "proc_unavail",
        _ => return "other",
    }
    if proc == 0 {
        return "ok";
    }
    match word(24) {
        Some(0) => "ok",
        Some(1) => "perm",
        Some(2) => "noent",
        Some(5) => "io",
        Some(6) => "nxio",
        Some(13) => "acces",
        Some(17) => "exist",
        Some(18) => "xdev",
        Some(19) => "nodev",
        Some(20) => "notdir",
        Some(21) => "isdir",
        Some(22) => "inval",
        Some(27) => "fbig",
        Some(28) => "nospc",
        Some(30) => "rofs",
        Some(31) => "mlink",
        Some(63) => "nametoolong",
        Some(66) => "notempty",
        Some(69) => "dquot",
        Some(70) => "stale",
        Some(71) => "remote",
        Some(10001) => "badhandle",
        Some(10002) => "not_sync",
        Some(10003) => "bad_cookie",
        Some(10004) => "notsupp",
        Some(10005) => "toosmall",
        Some(10006) => "serverfault",
        Some(10007) => "badtype",
        Some(10008) => "jukebox",
        _ => "other",
    }
}

#[cfg(test)]
mod outcome_tests {
    use super::*;
    use crate::xdr::XDR;

    /// The outcome is read where the encoders put it: a success reply's
    /// status word, and an accept status that is not SUCCESS.
    #[test]
    fn outcomes_come_from_the_reply_a_procedure_wrote() {
        let reply = |stat: nfs::nfsstat3| {
            let mut out = Vec::new();
            rpc::make_success_reply(7).serialize(&mut out).unwrap();
            stat.serialize(&mut out).unwrap();
            out
        };
        assert_eq!(outcome_of(1, &reply(nfs::nfsstat3::NFS3_OK)), "ok");
        assert_eq!(outcome_of(3, &reply(nfs::nfsstat3::NFS3ERR_NOENT)), "noent");
        assert_eq!(outcome_of(7, &reply(nfs::nfsstat3::NFS3ERR_DQUOT)), "dquot");
        assert_eq!(outcome_of(1, &reply(nfs::nfsstat3::NFS3ERR_BADHANDLE)), "badhandle");
        let mut null = Vec::new();
        rpc::make_success_reply(7).serialize(&mut null).unwrap();
        assert_eq!(outcome_of(0, &null), "ok");
        let mut unavail = Vec::new();
        rpc::proc_unavail_reply_message(7).serialize(&mut unavail).unwrap();
        assert_eq!(outcome_of(99, &unavail), "proc_unavail");
        assert_eq!(outcome_of(1, &[]), "other");
        for proc in 0..22 {
            assert_ne!(proc_name(proc), "other");
        }
        assert_eq!(proc_name(22), "other");
        assert!(OUTCOMES.contains(&"dquot") && OUTCOMES.contains(&"other"));
    }
}
