//! The FUSE requests, each turned into calls of the shared file-system
//! layer ([`nasd_vfs::Vfs`]) on a task of its own: this module translates
//! FUSE's requests, replies and errnos, and decides who each request runs as
//! and how long it waits for a manager; the semantics are the layer's.

use crate::attr::{file_type, nanos, to_kernel, GENERATION};
use crate::errno::vfs_errno;
use crate::{MountConfig, MAX_READAHEAD_BYTES, MAX_WRITE_BYTES, NAME_REQUESTS_IN_FLIGHT_MAX, REQUESTS_IN_FLIGHT_MAX};
use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use nasd_fs::{FileKind, FsClient, FsStatus, Identity, Ino, ManagerWait, Seek, SetAttr, XattrMode};
use nasd_vfs::{CreateFlags, Vfs, VfsError};
use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Semaphore;

/// Block size `statfs` reports capacity in.
const STATFS_BLOCK_BYTES: u32 = 4096;
/// Free inodes `statfs` reports: the manager sets no limit on them.
const STATFS_FILES_FREE: u64 = 1 << 32;
/// Longest name `statfs` reports (`FILE_NAME_MAX`).
const STATFS_NAME_MAX: u32 = nasd_proto::fs::FILE_NAME_MAX as u32;

tokio::task_local! {
    /// The client a request runs as: the mount's own, or with
    /// [`MountConfig::map_users`] one acting for the local caller.
    static CALLER: FsClient;
}

/// The kernel's caches, which the layer's change feed keeps true.
struct KernelCache(Notifier);

impl nasd_vfs::Invalidator for KernelCache {
    fn inval_inode(&self, ino: Ino) {
        // The kernel may have dropped the inode already (ENOENT): nothing to do.
        let _ = self.0.inval_inode(INodeNo(ino), 0, 0);
    }

    fn inval_attr(&self, ino: Ino) {
        // Attributes only (offset -1): safe from inside a request.
        let _ = self.0.inval_inode(INodeNo(ino), -1, 0);
    }

    fn inval_entry(&self, dir: Ino, name: &str) {
        let _ = self.0.inval_entry(INodeNo(dir), OsStr::new(name));
    }
}

/// Everything a mount shares between its requests.
pub(crate) struct State {
    vfs: Vfs,
    runtime: tokio::runtime::Handle,
    identity: Identity,
    /// The local user who mounted.
    owner_uid: u32,
    allow_other: bool,
    /// Each request runs as its local caller (`AS_USER`).
    map_users: bool,
    /// How long requests wait for a manager that cannot be reached.
    manager_wait: ManagerWait,
    /// Data requests in flight (reads, writes, flushes and releases of open
    /// files): each holds at most one transfer.
    requests: Arc<Semaphore>,
    /// Name-space and attribute requests in flight, apart from the data
    /// requests so that many of them waiting for the manager leave the
    /// open files' reads and writes going.
    name_requests: Arc<Semaphore>,
    answered: AtomicU64,
    failed: AtomicU64,
    /// What the mount counts, for Prometheus.
    metrics: crate::MountMetrics,
}

/// The supplementary groups of process (or thread) `pid`: the `Groups:`
/// line of `/proc/PID/status` (FUSE tells a request's uid, gid and pid,
/// not its groups).
fn caller_groups(pid: u32) -> std::io::Result<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_groups(&status)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no readable Groups: line in /proc status"))
}

fn parse_groups(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    line.split_whitespace().map(|g| g.parse().ok()).collect()
}

/// Whether the process (or thread) `pid` that made a request has a signal
/// pending that ends a waiting system call: one it catches (the call
/// returns `EINTR` to its handler), or `SIGKILL` (what the kernel makes of
/// any signal that kills it). fuser answers the kernel's `INTERRUPT` with
/// `ENOSYS`, so the kernel stops sending it: the daemon looks for itself,
/// in `/proc/PID/status`. A caller that cannot be looked at (pid 0, the
/// kernel's own requests; another pid namespace) is never interrupted.
fn caller_interrupted(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    std::fs::read_to_string(format!("/proc/{pid}/status")).ok().and_then(|s| signal_pending(&s)).unwrap_or(false)
}

/// Whether `/proc/PID/status` text shows a pending signal, not blocked,
/// that is caught or is `SIGKILL`; `None` if a line is missing or bad.
fn signal_pending(status: &str) -> Option<bool> {
    let mask = |name: &str| {
        let hex = status.lines().find_map(|l| l.strip_prefix(name))?.trim();
        u64::from_str_radix(hex, 16).ok()
    };
    let pending = mask("SigPnd:")? | mask("ShdPnd:")?;
    let blocked = mask("SigBlk:")?;
    let caught = mask("SigCgt:")?;
    let sigkill = 1u64 << (libc::SIGKILL - 1);
    Some(pending & !blocked & (caught | sigkill) != 0)
}

/// The check a request of process `pid` waiting for the manager makes.
fn interruption_of(pid: u32) -> Option<nasd_fs::Interrupted> {
    (pid != 0).then(|| Arc::new(move || caller_interrupted(pid)) as nasd_fs::Interrupted)
}

/// A name from the kernel as the manager takes it: UTF-8 (anything else is `EINVAL`).
fn name_of(name: &OsStr) -> Result<String, Errno> {
    name.to_str().map(str::to_owned).ok_or(Errno::EINVAL)
}

impl State {
    pub fn new(vfs: Vfs, runtime: tokio::runtime::Handle, config: &MountConfig) -> State {
        State {
            identity: vfs.fs().identity(),
            vfs,
            runtime,
            // SAFETY: geteuid(2) cannot fail and touches no memory.
            owner_uid: unsafe { libc::geteuid() },
            allow_other: config.allow_other,
            map_users: config.map_users,
            manager_wait: config.manager_wait,
            requests: Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX)),
            name_requests: Arc::new(Semaphore::new(NAME_REQUESTS_IN_FLIGHT_MAX)),
            answered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            metrics: config.metrics.clone(),
        }
    }

    pub fn set_notifier(&self, notifier: Notifier) {
        self.vfs.set_invalidator(Arc::new(KernelCache(notifier)));
    }

    pub fn vfs(&self) -> &Vfs {
        &self.vfs
    }

    pub fn counters(&self) -> (u64, u64) {
        (self.answered.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }

    /// Counts request `op`, answered (`ok`: without an errno) `took` after
    /// it was taken from the kernel, in [`counters`](Self::counters) and
    /// the metrics alike: name and data requests, refusals before any work.
    fn answered(&self, op: &'static str, ok: bool, took: Duration) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics.answered(op, ok, took);
    }

    /// The client the current request runs as ([`CALLER`]); the mount's
    /// own outside a request (background work).
    fn cx(&self) -> FsClient {
        CALLER.try_with(FsClient::clone).unwrap_or_else(|_| self.vfs.fs().clone())
    }

    /// The client a request of local user `uid` (group `gid`, process or
    /// thread `pid`) runs as: with `map_users`, one acting for that caller
    /// with its supplementary groups as `/proc` shows them; else the
    /// mount's own, for the users [`State::admit`] lets in.
    fn client_for(&self, uid: u32, gid: u32, pid: u32) -> Result<FsClient, Errno> {
        if !self.map_users {
            self.admit(uid)?;
            return Ok(self.vfs.fs().clone());
        }
        // A caller whose groups cannot be read is refused: acting without
        // them could grant what a mode such as 0604 denies the group.
        let groups = caller_groups(pid).map_err(|e| {
            tracing::debug!(pid, error = %e, "cannot read the caller's groups");
            Errno::EACCES
        })?;
        self.vfs.fs().as_user(uid, gid, &groups).map_err(|e| {
            tracing::warn!(uid, error = %e, "refusing a caller with more supplementary groups than GROUPS_MAX");
            Errno::EACCES
        })
    }

    /// Whether the mount acts for the local user `uid`: without
    /// `allow_other` the kernel lets only the mounting user in; with it, the
    /// mounting user and the local user whose uid is the nasd user's.
    fn admit(&self, uid: u32) -> Result<(), Errno> {
        if !self.allow_other || uid == self.owner_uid || uid == self.identity.uid {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// How long the kernel may keep what a reply gives it ([`Vfs::attr_ttl`]).
    fn ttl(&self) -> Duration {
        self.vfs.attr_ttl()
    }

    // ---------------------------------------------------------------- names

    /// A lookup: the entry, or for a name that does not exist a negative
    /// entry (inode 0) the kernel keeps for the attribute lifetime — the
    /// change feed drops it when another client makes the name.
    async fn lookup(&self, parent: u64, name: OsString) -> Result<(fuser::FileAttr, Duration), Errno> {
        let name = name_of(&name)?;
        let ttl = self.ttl();
        match self.vfs.lookup(&self.cx(), parent, &name).await {
            Ok(e) => Ok((to_kernel(&e.attr), ttl)),
            Err(e) if e.status() == Some(FsStatus::NotFound) => Ok((negative_entry(), ttl)),
            Err(e) => Err(vfs_errno(&e)),
        }
    }

    async fn getattr(&self, ino: u64) -> Result<fuser::FileAttr, Errno> {
        self.vfs.getattr(&self.cx(), ino).await.map(|a| to_kernel(&a)).map_err(|e| vfs_errno(&e))
    }

    async fn setattr(&self, ino: u64, changes: SetAttr) -> Result<fuser::FileAttr, Errno> {
        self.vfs.setattr(&self.cx(), ino, changes).await.map(|a| to_kernel(&a)).map_err(|e| vfs_errno(&e))
    }

    async fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        self.vfs.readlink(&self.cx(), ino).await.map(String::into_bytes).map_err(|e| vfs_errno(&e))
    }

    async fn mknod(&self, parent: u64, name: OsString, mode: u32, rdev: u32) -> Result<fuser::FileAttr, Errno> {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => None,
            libc::S_IFIFO => Some(FileKind::Fifo),
            libc::S_IFSOCK => Some(FileKind::Socket),
            libc::S_IFCHR => Some(FileKind::CharDevice),
            libc::S_IFBLK => Some(FileKind::BlockDevice),
            // mknod(2) of a directory or a link: EINVAL (mkdir and symlink make those).
            _ => return Err(Errno::EINVAL),
        };
        let name = name_of(&name)?;
        let e = self.vfs.mknod(&self.cx(), parent, &name, kind, mode, u64::from(rdev)).await;
        e.map(|e| to_kernel(&e.attr)).map_err(|e| vfs_errno(&e))
    }

    async fn mkdir(&self, parent: u64, name: OsString, mode: u32) -> Result<fuser::FileAttr, Errno> {
        let name = name_of(&name)?;
        self.vfs.mkdir(&self.cx(), parent, &name, mode).await.map(|e| to_kernel(&e.attr)).map_err(|e| vfs_errno(&e))
    }

    async fn symlink(&self, parent: u64, name: OsString, target: std::path::PathBuf) -> Result<fuser::FileAttr, Errno> {
        let name = name_of(&name)?;
        let target = target.to_str().ok_or(Errno::EINVAL)?.to_owned();
        let e = self.vfs.symlink(&self.cx(), parent, &name, &target).await;
        e.map(|e| to_kernel(&e.attr)).map_err(|e| vfs_errno(&e))
    }

    async fn link(&self, ino: u64, new_parent: u64, new_name: OsString) -> Result<fuser::FileAttr, Errno> {
        let new_name = name_of(&new_name)?;
        let e = self.vfs.link(&self.cx(), ino, new_parent, &new_name).await;
        e.map(|e| to_kernel(&e.attr)).map_err(|e| vfs_errno(&e))
    }

    async fn unlink(&self, parent: u64, name: OsString) -> Result<(), Errno> {
        let name = name_of(&name)?;
        self.vfs.unlink(&self.cx(), parent, &name).await.map_err(|e| vfs_errno(&e))
    }

    async fn rmdir(&self, parent: u64, name: OsString) -> Result<(), Errno> {
        let name = name_of(&name)?;
        self.vfs.rmdir(&self.cx(), parent, &name).await.map_err(|e| vfs_errno(&e))
    }

    async fn rename(&self, from: (u64, OsString), to: (u64, OsString), flags: RenameFlags) -> Result<(), Errno> {
        // The manager renames atomically with replacement only: renameat2's
        // RENAME_NOREPLACE and RENAME_EXCHANGE are not supported (EINVAL, as
        // for any flag a file system does not know).
        if !flags.is_empty() {
            return Err(Errno::EINVAL);
        }
        let (name, new_name) = (name_of(&from.1)?, name_of(&to.1)?);
        self.vfs.rename(&self.cx(), (from.0, &name), (to.0, &new_name)).await.map_err(|e| vfs_errno(&e))
    }

    // ---------------------------------------------------------------- files

    async fn open(&self, ino: u64, flags: i32) -> Result<(u64, FopenFlags), Errno> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let opened = self.vfs.open(&self.cx(), ino, write).await.map_err(|e| vfs_errno(&e))?;
        Ok((opened.fh, if opened.keep_cache { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() }))
    }

    async fn create(
        &self,
        parent: u64,
        name: OsString,
        mode: u32,
        flags: i32,
    ) -> Result<(fuser::FileAttr, u64, FopenFlags), Errno> {
        let name = name_of(&name)?;
        let exclusive = flags & libc::O_EXCL != 0;
        let truncate = flags & libc::O_TRUNC != 0;
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let (e, opened) = self
            .vfs
            .create(&self.cx(), parent, &name, mode, CreateFlags { exclusive, truncate, write })
            .await
            .map_err(|e| vfs_errno(&e))?;
        Ok((to_kernel(&e.attr), opened.fh, FopenFlags::empty()))
    }

    async fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let data = self.vfs.read(fh, offset, size).await.map_err(|e| vfs_errno(&e))?;
        self.metrics.read_bytes(data.len());
        Ok(data)
    }

    async fn write(&self, fh: u64, offset: u64, data: Vec<u8>) -> Result<u32, Errno> {
        // The kernel's offset (its size for O_APPEND): its page cache holds
        // the bytes there too.
        let written = self.vfs.write(fh, offset, &data).await.map_err(|e| vfs_errno(&e))?;
        self.metrics.written_bytes(written);
        Ok(written)
    }

    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` (the kernel does the other
    /// kinds itself): from the drives' stored extents, after this file's own
    /// writes reached them. `ENXIO` at or past the end, or when no data
    /// follows (POSIX).
    async fn lseek(&self, fh: u64, offset: i64, whence: i32) -> Result<i64, Errno> {
        let what = match whence {
            libc::SEEK_DATA => Seek::Data,
            libc::SEEK_HOLE => Seek::Hole,
            _ => return Err(Errno::EINVAL),
        };
        let offset = u64::try_from(offset).map_err(|_| Errno::ENXIO)?;
        match self.vfs.seek(fh, what, offset).await.map_err(|e| vfs_errno(&e))? {
            Some(at) => i64::try_from(at).map_err(|_| Errno::EOVERFLOW),
            None => Err(Errno::ENXIO),
        }
    }

    /// `close` of a descriptor open for writing, and `fsync`: commits the
    /// file's writes (close-to-open: another mount's next open sees them).
    async fn commit(&self, fh: u64) -> Result<(), Errno> {
        self.vfs.commit(fh).await.map_err(|e| vfs_errno(&e))
    }

    /// `fsync`: the file's writes committed, then made durable against power
    /// loss with everything the manager acknowledged before.
    async fn fsync(&self, fh: u64) -> Result<(), Errno> {
        self.vfs.fsync(fh).await.map_err(|e| vfs_errno(&e))
    }

    async fn sync(&self) -> Result<(), Errno> {
        self.vfs.sync().await.map_err(|e| vfs_errno(&e))
    }

    async fn release(&self, fh: u64) -> Result<(), Errno> {
        self.vfs.release(fh).await.map_err(|e| vfs_errno(&e))
    }

    // ---------------------------------------------------------- directories

    async fn opendir(&self, ino: u64) -> Result<u64, Errno> {
        self.vfs.opendir(ino).map_err(|e| vfs_errno(&e))
    }

    async fn readdir(&self, fh: u64, offset: u64, reply: &mut ReplyDirectory) -> Result<(), Errno> {
        let add =
            |next: u64, item: &nasd_vfs::DirItem| reply.add(INodeNo(item.ino), next, file_type(item.kind), &item.name);
        self.vfs.readdir(&self.cx(), fh, offset, add).await.map_err(|e| vfs_errno(&e))
    }

    /// A listing with each entry's attributes and handle (the manager's
    /// `READDIR` carries them): `ls -l` needs no lookup per entry. Every
    /// entry the kernel takes counts as a lookup of its inode.
    async fn readdirplus(&self, fh: u64, offset: u64, reply: &mut ReplyDirectoryPlus) -> Result<(), Errno> {
        let ttl = self.ttl();
        let mut taken = Vec::new();
        let add = |next: u64, item: &nasd_vfs::DirItem| match &item.entry {
            Some(e) if item.name != "." && item.name != ".." => {
                let full = reply.add(INodeNo(e.attr.ino), next, &item.name, &ttl, &to_kernel(&e.attr), GENERATION);
                if !full {
                    taken.push(e.clone());
                }
                full
            }
            // `.`, `..` (never looked up by the kernel), and entries the
            // caller may not search: named, for the kernel to look up.
            _ => reply.add(INodeNo(item.ino), next, &item.name, &Duration::ZERO, &unknown_attr(item), GENERATION),
        };
        let listed = self.vfs.readdir(&self.cx(), fh, offset, add).await.map_err(|e| vfs_errno(&e));
        for e in &taken {
            self.vfs.remember_listed(e).await;
        }
        listed
    }

    fn releasedir(&self, fh: u64) {
        self.vfs.releasedir(fh);
    }

    // ---------------------------------------------------------------- other

    async fn statfs(&self) -> Result<[u64; 5], Errno> {
        let s = self.vfs.statfs(&self.cx()).await.map_err(|e| vfs_errno(&e))?;
        let block = u64::from(STATFS_BLOCK_BYTES);
        let free = s.free_bytes / block;
        Ok([s.capacity_bytes / block, free, free, s.inodes.saturating_add(STATFS_FILES_FREE), STATFS_FILES_FREE])
    }

    async fn access(&self, ino: u64, mask: i32) -> Result<(), Errno> {
        let mask = (mask & (libc::R_OK | libc::W_OK | libc::X_OK)) as u32;
        self.vfs.access(&self.cx(), ino, mask).await.map_err(|e| vfs_errno(&e))
    }

    /// `fallocate` mode 0 (`posix_fallocate`); other modes are not supported.
    async fn fallocate(&self, ino: u64, fh: u64, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        if mode != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        match self.vfs.allocate(&self.cx(), ino, fh, offset, length).await {
            Err(VfsError::Invalid(_)) => Err(Errno::EFBIG),
            r => r.map_err(|e| vfs_errno(&e)),
        }
    }

    // ------------------------------------------------- extended attributes

    async fn getxattr(&self, ino: u64, name: OsString) -> Result<Vec<u8>, Errno> {
        let name = name_of(&name)?;
        self.vfs.getxattr(&self.cx(), ino, &name).await.map_err(|e| vfs_errno(&e))
    }

    /// The names, each ended by a NUL, as `listxattr(2)` returns them.
    async fn listxattr(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let names = self.vfs.listxattr(&self.cx(), ino).await.map_err(|e| vfs_errno(&e))?;
        let mut list = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
        for n in names {
            list.extend_from_slice(n.as_bytes());
            list.push(0);
        }
        Ok(list)
    }

    async fn setxattr(&self, ino: u64, name: OsString, value: Vec<u8>, flags: i32) -> Result<(), Errno> {
        let mode = match flags {
            0 => XattrMode::Either,
            libc::XATTR_CREATE => XattrMode::Create,
            libc::XATTR_REPLACE => XattrMode::Replace,
            _ => return Err(Errno::EINVAL),
        };
        let name = name_of(&name)?;
        self.vfs.setxattr(&self.cx(), ino, &name, &value, mode).await.map_err(|e| vfs_errno(&e))
    }

    async fn removexattr(&self, ino: u64, name: OsString) -> Result<(), Errno> {
        let name = name_of(&name)?;
        self.vfs.removexattr(&self.cx(), ino, &name).await.map_err(|e| vfs_errno(&e))
    }
}

/// A lookup's answer for a name that does not exist: inode 0, which the
/// kernel keeps as a negative entry.
fn negative_entry() -> fuser::FileAttr {
    to_kernel(&blank(0, FileKind::File))
}

/// What a listing shows of an entry without its attributes: its kind.
fn unknown_attr(item: &nasd_vfs::DirItem) -> fuser::FileAttr {
    to_kernel(&blank(item.ino, item.kind))
}

/// Attributes that say nothing but an inode number and a kind.
fn blank(ino: Ino, kind: FileKind) -> nasd_fs::FileAttr {
    nasd_fs::FileAttr {
        ino,
        kind,
        mode: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        size: 0,
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        rdev: 0,
        allocated: 0,
    }
}

/// A reply that can carry an errno.
trait Fails: Send + 'static {
    fn fail(self, e: Errno);
}

macro_rules! fails {
    ($($t:ty),*) => {
        $(impl Fails for $t {
            fn fail(self, e: Errno) {
                self.error(e)
            }
        })*
    };
}
fails!(
    ReplyEntry,
    ReplyDirectoryPlus,
    ReplyAttr,
    ReplyData,
    ReplyEmpty,
    ReplyOpen,
    ReplyWrite,
    ReplyStatfs,
    ReplyCreate,
    ReplyDirectory,
    ReplyXattr,
    ReplyLseek
);

/// Answers `reply` with `ok` of the value or with the errno; whether it
/// succeeded.
fn answered<R: Fails, T>(reply: R, result: Result<T, Errno>, ok: impl FnOnce(R, T)) -> bool {
    match result {
        Ok(value) => {
            ok(reply, value);
            true
        }
        Err(e) => {
            reply.fail(e);
            false
        }
    }
}

/// A `getxattr` or `listxattr` reply: the length if the caller asked for
/// it (`size` 0), `ERANGE` if its buffer is too small, else the bytes.
fn reply_xattr(reply: ReplyXattr, size: u32, bytes: &[u8]) {
    match u32::try_from(bytes.len()) {
        Ok(len) if size == 0 => reply.size(len),
        Ok(len) if len <= size => reply.data(bytes),
        _ => reply.error(Errno::ERANGE),
    }
}

/// Which permits a request takes (see [`State::requests`]).
#[derive(Debug, Clone, Copy)]
enum Class {
    Data,
    Names,
}

/// The `fuser` file system: hands every request to the runtime.
pub(crate) struct NasdFs {
    state: Arc<State>,
}

impl NasdFs {
    pub fn new(state: Arc<State>) -> NasdFs {
        NasdFs { state }
    }

    /// Runs `work` as a task of its own (waiting, on this FUSE thread, while
    /// [`REQUESTS_IN_FLIGHT_MAX`] run) and answers with `ok` or its errno. A
    /// panic in the task drops the reply, which answers `EIO`.
    fn run<R, T, W, F>(
        &self,
        op: &'static str,
        req: &Request,
        reply: R,
        work: W,
        ok: impl FnOnce(R, T) + Send + 'static,
    ) where
        R: Fails,
        T: Send + 'static,
        W: FnOnce(Arc<State>) -> F + Send + 'static,
        F: Future<Output = Result<T, Errno>> + Send + 'static,
    {
        let client = match self.client_for(op, req) {
            Ok(c) => c,
            Err(e) => {
                reply.fail(e);
                return;
            }
        };
        self.spawn_as(op, client, req.pid(), Class::Names, move |state| async move {
            let result = work(state.clone()).await;
            answered(reply, result, ok)
        });
    }

    /// The client request `req` (operation `op`) runs as
    /// ([`State::client_for`]); a refusal is counted as `op`'s.
    fn client_for(&self, op: &'static str, req: &Request) -> Result<FsClient, Errno> {
        let client = self.state.client_for(req.uid(), req.gid(), req.pid());
        if client.is_err() {
            self.state.answered(op, false, Duration::ZERO);
        }
        client
    }

    /// Runs `work` as a task of its own, as the mount's own client (data
    /// requests on open files, whose opens the manager checked), for the
    /// process `pid`.
    fn spawn<W, F>(&self, op: &'static str, pid: u32, work: W)
    where
        W: FnOnce(Arc<State>) -> F + Send + 'static,
        F: Future<Output = bool> + Send + 'static,
    {
        self.spawn_as(op, self.state.vfs.fs().clone(), pid, Class::Data, work)
    }

    /// Runs `work` — request `op`, which answers and says whether it
    /// succeeded — as a task of its own whose manager requests go out as
    /// `client` and wait for a manager that cannot be reached as the mount's
    /// `manager_wait` says, until process `pid` (the caller) is interrupted.
    fn spawn_as<W, F>(&self, op: &'static str, client: FsClient, pid: u32, class: Class, work: W)
    where
        W: FnOnce(Arc<State>) -> F + Send + 'static,
        F: Future<Output = bool> + Send + 'static,
    {
        let started = Instant::now();
        let state = self.state.clone();
        let permits = match class {
            Class::Data => &self.state.requests,
            Class::Names => &self.state.name_requests,
        };
        // FUSE threads are not runtime threads: they may wait here.
        let permit = self.state.runtime.block_on(permits.clone().acquire_owned());
        let wait = self.state.manager_wait;
        self.state.runtime.spawn(nasd_fs::with_manager_wait(
            wait,
            interruption_of(pid),
            CALLER.scope(client, async move {
                let _permit = permit;
                // One kernel request is one operation: its trace id goes to the manager and
                // the drives with every request it makes (docs/PROTOCOL.md, "Trace ids").
                let fs = state.vfs.fs().clone();
                let ok = fs.operation(op, work(state.clone())).await;
                state.answered(op, ok, started.elapsed());
            }),
        ));
    }

    fn ttl(&self) -> Duration {
        self.state.ttl()
    }
}

fn time_of(t: TimeOrNow) -> i64 {
    match t {
        TimeOrNow::SpecificTime(t) => nanos(t),
        TimeOrNow::Now => nanos(SystemTime::now()),
    }
}

impl Filesystem for NasdFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE_BYTES) {
            let _ = config.set_max_write(nearest);
        }
        if let Err(nearest) = config.set_max_readahead(MAX_READAHEAD_BYTES) {
            let _ = config.set_max_readahead(nearest);
        }
        for flag in [
            InitFlags::FUSE_ASYNC_READ,
            InitFlags::FUSE_BIG_WRITES,
            InitFlags::FUSE_MAX_PAGES,
            InitFlags::FUSE_PARALLEL_DIROPS,
            // When the kernel refreshes attributes and finds the size or
            // modification time changed, it drops the file's cached pages.
            InitFlags::FUSE_AUTO_INVAL_DATA,
            // Listings carry attributes and handles (READDIRPLUS): `ls -l`
            // needs no lookup per entry.
            InitFlags::FUSE_DO_READDIRPLUS,
        ] {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.to_owned();
        self.run(
            "lookup",
            req,
            reply,
            move |s| async move { s.lookup(parent.0, name).await },
            move |r, (attr, ttl)| r.entry(&ttl, &attr, GENERATION),
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.state.vfs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ttl = self.ttl();
        self.run(
            "getattr",
            req,
            reply,
            move |s| async move { s.getattr(ino.0).await },
            move |r, attr| r.attr(&ttl, &attr),
        );
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let changes = SetAttr {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime_ns: atime.map(time_of),
            mtime_ns: mtime.map(time_of),
            // ftruncate(2) of a descriptor open for writing.
            open_writer: fh.is_some_and(|fh| self.state.vfs.open_for_writing(fh.0)),
        };
        let ttl = self.ttl();
        self.run(
            "setattr",
            req,
            reply,
            move |s| async move { s.setattr(ino.0, changes).await },
            move |r, attr| r.attr(&ttl, &attr),
        );
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.run("readlink", req, reply, move |s| async move { s.readlink(ino.0).await }, |r, target| r.data(&target));
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (name, ttl) = (name.to_owned(), self.ttl());
        self.run(
            "mknod",
            req,
            reply,
            move |s| async move { s.mknod(parent.0, name, mode, rdev).await },
            move |r, attr| r.entry(&ttl, &attr, GENERATION),
        );
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let (name, ttl) = (name.to_owned(), self.ttl());
        self.run(
            "mkdir",
            req,
            reply,
            move |s| async move { s.mkdir(parent.0, name, mode).await },
            move |r, attr| r.entry(&ttl, &attr, GENERATION),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.run("unlink", req, reply, move |s| async move { s.unlink(parent.0, name).await }, |r, ()| r.ok());
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.run("rmdir", req, reply, move |s| async move { s.rmdir(parent.0, name).await }, |r, ()| r.ok());
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let (name, target, ttl) = (link_name.to_owned(), target.to_owned(), self.ttl());
        self.run(
            "symlink",
            req,
            reply,
            move |s| async move { s.symlink(parent.0, name, target).await },
            move |r, attr| r.entry(&ttl, &attr, GENERATION),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (from, to) = ((parent.0, name.to_owned()), (newparent.0, newname.to_owned()));
        self.run("rename", req, reply, move |s| async move { s.rename(from, to, flags).await }, |r, ()| r.ok());
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let (name, ttl) = (newname.to_owned(), self.ttl());
        self.run(
            "link",
            req,
            reply,
            move |s| async move { s.link(ino.0, newparent.0, name).await },
            move |r, attr| r.entry(&ttl, &attr, GENERATION),
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.run(
            "open",
            req,
            reply,
            move |s| async move { s.open(ino.0, flags.0).await },
            |r, (fh, flags)| r.opened(FileHandle(fh), flags),
        );
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn("read", req.pid(), move |s| async move {
            let result = s.read(fh.0, offset, size).await;
            answered(reply, result, |r, data| r.data(&data))
        });
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = data.to_vec();
        self.spawn("write", req.pid(), move |s| async move {
            let result = s.write(fh.0, offset, data).await;
            answered(reply, result, |r, n| r.written(n))
        });
    }

    fn lseek(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        self.spawn("lseek", req.pid(), move |s| async move {
            let result = s.lseek(fh.0, offset, whence).await;
            answered(reply, result, |r, at| r.offset(at))
        });
    }

    fn flush(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        self.spawn("flush", req.pid(), move |s| async move {
            let result = s.commit(fh.0).await;
            answered(reply, result, |r, ()| r.ok())
        });
    }

    fn release(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn("release", req.pid(), move |s| async move {
            let result = s.release(fh.0).await;
            answered(reply, result, |r, ()| r.ok())
        });
    }

    fn fsync(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.spawn("fsync", req.pid(), move |s| async move {
            let result = s.fsync(fh.0).await;
            answered(reply, result, |r, ()| r.ok())
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.run(
            "opendir",
            req,
            reply,
            move |s| async move { s.opendir(ino.0).await },
            |r, fh| r.opened(FileHandle(fh), FopenFlags::empty()),
        );
    }

    fn readdir(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        // Each page is read from the manager as the caller (its read permission).
        let client = match self.client_for("readdir", req) {
            Ok(c) => c,
            Err(e) => return reply.error(e),
        };
        self.spawn_as("readdir", client, req.pid(), Class::Names, move |s| async move {
            let result = s.readdir(fh.0, offset, &mut reply).await;
            answered(reply, result, |r, ()| r.ok())
        });
    }

    fn readdirplus(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        // Each page is read from the manager as the caller (its read permission).
        let client = match self.client_for("readdirplus", req) {
            Ok(c) => c,
            Err(e) => return reply.error(e),
        };
        self.spawn_as("readdirplus", client, req.pid(), Class::Names, move |s| async move {
            let result = s.readdirplus(fh.0, offset, &mut reply).await;
            answered(reply, result, |r, ()| r.ok())
        });
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.state.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Every name-space change survives the manager's crash once answered; against power
        // loss once the manager flushed its metadata, which this asks for now.
        self.spawn("fsyncdir", req.pid(), move |s| async move {
            let result = s.sync().await;
            answered(reply, result, |r, ()| r.ok())
        });
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.run(
            "statfs",
            req,
            reply,
            move |s| async move { s.statfs().await },
            |r, [blocks, free, avail, files, ffree]| {
                r.statfs(blocks, free, avail, files, ffree, STATFS_BLOCK_BYTES, STATFS_NAME_MAX, STATFS_BLOCK_BYTES)
            },
        );
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let mask = mask.bits();
        self.run("access", req, reply, move |s| async move { s.access(ino.0, mask).await }, |r, ()| r.ok());
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.run(
            "fallocate",
            req,
            reply,
            move |s| async move { s.fallocate(ino.0, fh.0, offset, length, mode).await },
            |r, ()| r.ok(),
        );
    }

    /// No ioctl is supported: `ENOTTY` ("not a terminal", what `isatty` and
    /// Python's `open` expect of a file), quietly (fuser's default logs a
    /// warning for every one).
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    // Extended attributes: kept by the manager (docs/PROTOCOL.md).
    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let name = name.to_owned();
        self.run(
            "getxattr",
            req,
            reply,
            move |s| async move { s.getxattr(ino.0, name).await },
            move |r, v| reply_xattr(r, size, &v),
        );
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.run(
            "listxattr",
            req,
            reply,
            move |s| async move { s.listxattr(ino.0).await },
            move |r, v| reply_xattr(r, size, &v),
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (name, value) = (name.to_owned(), value.to_vec());
        self.run(
            "setxattr",
            req,
            reply,
            move |s| async move { s.setxattr(ino.0, name, value, flags).await },
            |r, ()| r.ok(),
        );
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.run("removexattr", req, reply, move |s| async move { s.removexattr(ino.0, name).await }, |r, ()| r.ok());
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (name, ttl) = (name.to_owned(), self.ttl());
        self.run(
            "create",
            req,
            reply,
            move |s| async move { s.create(parent.0, name, mode, flags).await },
            move |r, (attr, fh, f)| r.created(&ttl, &attr, GENERATION, FileHandle(fh), f),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_groups, signal_pending};

    fn status(pnd: &str, shd: &str, blk: &str, cgt: &str) -> String {
        format!("Name:\tls\nSigQ:\t0/1\nSigPnd:\t{pnd}\nShdPnd:\t{shd}\nSigBlk:\t{blk}\nSigIgn:\t0\nSigCgt:\t{cgt}\n")
    }

    #[test]
    fn a_caller_is_interrupted_by_a_caught_signal_or_sigkill() {
        let z = "0000000000000000";
        // SIGINT (2) is bit 1, SIGKILL (9) bit 8, SIGUSR1 (10) bit 9.
        let (int, kill, usr1) = ("0000000000000002", "0000000000000100", "0000000000000200");
        for (s, expect, why) in [
            (status(z, z, z, z), Some(false), "nothing pending"),
            (status(kill, z, z, z), Some(true), "SIGKILL: the caller is dying"),
            (status(z, kill, z, z), Some(true), "SIGKILL pending for the whole process"),
            (status(usr1, z, z, usr1), Some(true), "a caught signal"),
            (status(z, int, z, int), Some(true), "a caught signal sent to the process"),
            (status(usr1, z, usr1, usr1), Some(false), "a blocked signal waits"),
            (
                status(usr1, z, z, z),
                Some(false),
                "a signal whose default does not kill (the kernel made fatal ones SIGKILL)",
            ),
            ("Name:\tls\n".to_string(), None, "no masks"),
            (status("zz", z, z, z), None, "a mask that does not parse"),
        ] {
            assert_eq!(signal_pending(&s), expect, "{why}");
        }
    }

    #[test]
    fn groups_come_from_the_status_line() {
        let status = "Name:\tsh\nUid:\t47001\t47001\t47001\t47001\nGroups:\t47500 10 \nVmPeak:\t1 kB\n";
        assert_eq!(parse_groups(status), Some(vec![47500, 10]));
        assert_eq!(parse_groups("Name:\tsh\nGroups:\t\n"), Some(vec![]), "no supplementary groups");
        assert_eq!(parse_groups("Name:\tsh\n"), None, "no Groups: line");
        assert_eq!(parse_groups("Groups:\t1 x\n"), None, "a line that does not parse is refused, not cut short");
    }
}
