//! What a file system serves: [`NfsFileSystem`], called with the RPC
//! call's credentials ([`Caller`]) and the client's opaque file handles
//! ([`FileHandle`], chosen by the file system, at most [`NFS3_FHSIZE`]
//! bytes).

use crate::nfs::{cookieverf3, createverf3, fattr3, ftype3, nfsstat3, nfstime3, sattr3, writeverf3, NFS3_FHSIZE};
use async_trait::async_trait;
use std::net::SocketAddr;

/// One call's work (its arguments decoded, its reply written), as
/// [`NfsFileSystem::operation`] gets it to run.
pub type Call<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<()>> + Send + 'a>>;

/// Who sent a call: the peer's address and the call's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The client's address (its TCP peer).
    pub peer: SocketAddr,
    /// The call's credentials.
    pub auth: Auth,
}

/// An RPC call's credentials.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Auth {
    /// `AUTH_NONE` (only for the NULL procedures and MOUNT's listings:
    /// other calls are refused `AUTH_TOOWEAK` before they reach the file system).
    None,
    /// `AUTH_SYS` (`AUTH_UNIX`): the ids the client claims.
    Sys {
        /// The caller's user id.
        uid: u32,
        /// The caller's group id.
        gid: u32,
        /// Supplementary groups (at most 16 in AUTH_SYS).
        groups: Vec<u32>,
    },
}

/// A file handle as the client sends it back: opaque bytes the file system
/// made, 1 to [`NFS3_FHSIZE`] long (checked when decoded).
#[derive(Clone, PartialEq, Eq)]
pub struct FileHandle(Vec<u8>);

impl std::fmt::Debug for FileHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileHandle({} bytes)", self.0.len())
    }
}

impl FileHandle {
    /// A handle of `bytes`; `None` if empty or over [`NFS3_FHSIZE`].
    pub fn new(bytes: Vec<u8>) -> Option<FileHandle> {
        (!bytes.is_empty() && bytes.len() <= NFS3_FHSIZE as usize).then_some(FileHandle(bytes))
    }

    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// How CREATE treats an existing name (RFC 1813 `createhow3`).
#[derive(Debug, Clone)]
pub enum CreateHow {
    /// Create or open (and apply `sattr3`, e.g. a truncation).
    Unchecked(sattr3),
    /// Fail with `NFS3ERR_EXIST` if the name exists.
    Guarded(sattr3),
    /// Exclusive create: a retransmission with the same verifier succeeds.
    Exclusive(createverf3),
}

/// How WRITE asks for its data to be kept (RFC 1813 `stable_how`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stable {
    /// May be kept in memory until COMMIT.
    Unstable,
    /// Data (and what finds it) durable before the reply.
    DataSync,
    /// Data and attributes durable before the reply.
    FileSync,
}

/// One directory entry of a READDIR or READDIRPLUS reply.
#[derive(Debug, Clone)]
pub struct DirEntry {
    /// Its file id.
    pub fileid: u64,
    /// Its name.
    pub name: Vec<u8>,
    /// The cookie that continues the listing after it.
    pub cookie: u64,
    /// Its attributes and handle (READDIRPLUS; `None` if not known).
    pub plus: Option<(FileHandle, fattr3)>,
}

/// A READDIR or READDIRPLUS page.
#[derive(Debug, Clone)]
pub struct DirPage {
    /// The cookie verifier the client sends back with the page's cookies.
    pub verifier: cookieverf3,
    /// Entries in order.
    pub entries: Vec<DirEntry>,
    /// No entry follows the last one.
    pub eof: bool,
}

/// FSSTAT's answer (RFC 1813 `FSSTAT3resok` without attributes).
#[derive(Debug, Clone, Copy, Default)]
pub struct FsStat {
    /// Bytes in the file system.
    pub total_bytes: u64,
    /// Bytes free.
    pub free_bytes: u64,
    /// Bytes free to the caller.
    pub avail_bytes: u64,
    /// Inodes (file slots) in all.
    pub total_files: u64,
    /// Inodes free.
    pub free_files: u64,
    /// Inodes free to the caller.
    pub avail_files: u64,
}

/// The result of a file-system call.
pub type NfsResult<T> = Result<T, nfsstat3>;

/// An NFSv3 file system. Every call gets the caller and the handles the
/// client sent, unchanged; the file system decides what they name and
/// whether the caller may.
#[async_trait]
pub trait NfsFileSystem: Send + Sync + 'static {
    /// MOUNT: the root handle of export `path` for `caller`
    /// (`Err` answers the client `MNT3ERR_*`, given as its `nfsstat3` twin:
    /// `NFS3ERR_NOENT`, `NFS3ERR_ACCES`, `NFS3ERR_NOTDIR`, …).
    async fn mount(&self, caller: &Caller, path: &[u8]) -> NfsResult<FileHandle>;
    /// The exports MOUNT's EXPORT lists.
    fn exports(&self) -> Vec<Vec<u8>>;
    /// The verifier WRITE and COMMIT answer: changes when data the server
    /// acknowledged as UNSTABLE may have been lost (a restart).
    fn write_verifier(&self) -> writeverf3;

    /// Told of each NFS call answered (for metrics): its procedure's name
    /// ([`crate::proc_name`]), its outcome ([`crate::outcome_name`]: `ok`,
    /// an `nfsstat3` such as `noent`, or `garbage_args`, `proc_unavail`),
    /// and the time from the call read to its reply ready. Does nothing
    /// unless the file system counts.
    fn answered(&self, _proc: &'static str, _outcome: &'static str, _took: std::time::Duration) {}

    /// Runs `call`, the whole of one NFS or MOUNT call — `proc` names the
    /// procedure ([`crate::proc_name`] for NFS, `mount` for MOUNT's) — from
    /// `caller`, as one operation of the file system: it may run it inside
    /// what it wants every request the call makes to carry (a trace id, a
    /// span its log lines are in). By default it just runs it.
    fn operation<'a>(&'a self, _proc: &'static str, _caller: &'a Caller, call: Call<'a>) -> Call<'a> {
        call
    }

    /// GETATTR.
    async fn getattr(&self, caller: &Caller, fh: &FileHandle) -> NfsResult<fattr3>;
    /// SETATTR, refused with `NFS3ERR_NOT_SYNC` if `guard` is not the ctime.
    async fn setattr(
        &self,
        caller: &Caller,
        fh: &FileHandle,
        set: sattr3,
        guard: Option<nfstime3>,
    ) -> NfsResult<fattr3>;
    /// LOOKUP of `name` in directory `dir`.
    async fn lookup(&self, caller: &Caller, dir: &FileHandle, name: &[u8]) -> NfsResult<(FileHandle, fattr3)>;
    /// ACCESS: which of the `ACCESS3_*` bits in `mask` the caller has.
    async fn access(&self, caller: &Caller, fh: &FileHandle, mask: u32) -> NfsResult<(u32, fattr3)>;
    /// READLINK.
    async fn readlink(&self, caller: &Caller, fh: &FileHandle) -> NfsResult<(Vec<u8>, fattr3)>;
    /// READ of up to `count` bytes at `offset`: the bytes, whether they end
    /// at the end of the file, and the attributes after.
    async fn read(
        &self,
        caller: &Caller,
        fh: &FileHandle,
        offset: u64,
        count: u32,
    ) -> NfsResult<(Vec<u8>, bool, fattr3)>;
    /// WRITE: how the data was kept, and the attributes after.
    async fn write(
        &self,
        caller: &Caller,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        stable: Stable,
    ) -> NfsResult<(Stable, fattr3)>;
    /// CREATE of a regular file.
    async fn create(
        &self,
        caller: &Caller,
        dir: &FileHandle,
        name: &[u8],
        how: CreateHow,
    ) -> NfsResult<(FileHandle, fattr3)>;
    /// MKDIR.
    async fn mkdir(
        &self,
        caller: &Caller,
        dir: &FileHandle,
        name: &[u8],
        set: sattr3,
    ) -> NfsResult<(FileHandle, fattr3)>;
    /// SYMLINK.
    async fn symlink(
        &self,
        caller: &Caller,
        dir: &FileHandle,
        name: &[u8],
        target: &[u8],
        set: sattr3,
    ) -> NfsResult<(FileHandle, fattr3)>;
    /// MKNOD of a special file: `kind` is `NF3CHR`, `NF3BLK`, `NF3SOCK` or
    /// `NF3FIFO` (others are refused `NFS3ERR_BADTYPE` before the call);
    /// `rdev` (major, minor) for devices, else (0, 0).
    async fn mknod(
        &self,
        caller: &Caller,
        dir: &FileHandle,
        name: &[u8],
        kind: ftype3,
        set: sattr3,
        rdev: (u32, u32),
    ) -> NfsResult<(FileHandle, fattr3)>;
    /// REMOVE of a name that is not a directory.
    async fn remove(&self, caller: &Caller, dir: &FileHandle, name: &[u8]) -> NfsResult<()>;
    /// RMDIR.
    async fn rmdir(&self, caller: &Caller, dir: &FileHandle, name: &[u8]) -> NfsResult<()>;
    /// RENAME.
    async fn rename(&self, caller: &Caller, from: (&FileHandle, &[u8]), to: (&FileHandle, &[u8])) -> NfsResult<()>;
    /// LINK: a new name `name` in `dir` for `file`; the file's attributes after.
    async fn link(&self, caller: &Caller, file: &FileHandle, dir: &FileHandle, name: &[u8]) -> NfsResult<fattr3>;
    /// READDIR (`plus` false) or READDIRPLUS: entries after `cookie` (0: from
    /// the start), at most `max_entries`; `NFS3ERR_BAD_COOKIE` if `verifier`
    /// (zero with cookie 0) no longer lets the cookie be understood.
    async fn readdir(
        &self,
        caller: &Caller,
        dir: &FileHandle,
        cookie: u64,
        verifier: cookieverf3,
        max_entries: usize,
        plus: bool,
    ) -> NfsResult<DirPage>;
    /// FSSTAT.
    async fn fsstat(&self, caller: &Caller, fh: &FileHandle) -> NfsResult<(FsStat, fattr3)>;
    /// COMMIT: what was written UNSTABLE to the file made durable.
    async fn commit(&self, caller: &Caller, fh: &FileHandle, offset: u64, count: u32) -> NfsResult<fattr3>;
}
