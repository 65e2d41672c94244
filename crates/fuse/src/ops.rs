//! The FUSE requests, each turned into handle-based `nasd-fs` calls on a task
//! of its own.

use crate::attr::{file_type, nanos, to_kernel, GENERATION};
use crate::dir::DirStream;
use crate::errno::errno;
use crate::inodes::{Hidden, Inodes};
use crate::{
    MountConfig, MAX_READAHEAD_BYTES, MAX_WRITE_BYTES, NAME_REQUESTS_IN_FLIGHT_MAX, OPEN_DIRS_MAX, OPEN_FILES_MAX,
    REQUESTS_IN_FLIGHT_MAX,
};
use fuser::{
    AccessFlags, Errno, FileHandle, Filesystem, FopenFlags, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use nasd_fs::{
    Change, Entry, File, FileKind, FsClient, FsError, Handle, Identity, Ino, ManagerWait, Seek, SetAttr, XattrMode,
};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime};
use tokio::sync::Semaphore;

/// Block size `statfs` reports capacity in.
const STATFS_BLOCK_BYTES: u32 = 4096;
/// Free inodes `statfs` reports: the manager sets no limit on them.
const STATFS_FILES_FREE: u64 = 1 << 32;
/// Longest name `statfs` reports (`FILE_NAME_MAX`).
const STATFS_NAME_MAX: u32 = nasd_proto::fs::FILE_NAME_MAX as u32;
/// Longest one wait on the change feed lasts; then the mount asks again.
const FEED_WAIT: Duration = Duration::from_secs(25);
/// How long the mount waits before it asks a feed that failed again.
const FEED_RETRY: Duration = Duration::from_secs(1);
/// How long the mount waits for the change feed to report a change it made
/// itself (and skips it) before it forgets it: one not reported by then
/// (the feed lost it, or was down) only costs an invalidation.
const OWN_CHANGE_WAIT: Duration = Duration::from_secs(10);
/// Longest a call answered from an open file waits for the manager's answer
/// during an outage (a manager on a host that is gone answers nothing until
/// the connection times out); past it the open file answers.
const UNLESS_UNREACHABLE_WAIT_MAX: Duration = Duration::from_secs(1);
/// The extended attribute the kernel reads before every write of a file
/// (whether the write must drop file capabilities).
const WRITE_CHECK_XATTR: &str = "security.capability";
/// Prefix of the hidden name a file unlinked while open here lives on under.
pub(crate) const HIDDEN_PREFIX: &str = ".nasd-unlinked-";

tokio::task_local! {
    /// The client a request runs as: the mount's own, or with
    /// [`MountConfig::map_users`] one acting for the local caller.
    static CALLER: FsClient;
}

/// One open file description (a FUSE file handle).
#[derive(Debug, Clone, Copy)]
struct OpenFile {
    ino: Ino,
    /// Opened for writing: its `close` commits the file's writes.
    write: bool,
}

/// Everything a mount shares between its requests.
pub(crate) struct State {
    fs: FsClient,
    runtime: tokio::runtime::Handle,
    identity: Identity,
    /// The local user who mounted.
    owner_uid: u32,
    allow_other: bool,
    /// Each request runs as its local caller (`AS_USER`).
    map_users: bool,
    ttl: Duration,
    /// How long requests wait for a manager that cannot be reached.
    manager_wait: ManagerWait,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, OpenFile>>,
    dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<DirStream>>>>,
    next_fh: AtomicU64,
    hidden_seq: AtomicU64,
    /// Data requests in flight (reads, writes, flushes and releases of open
    /// files): each holds at most one transfer.
    requests: Arc<Semaphore>,
    /// Name-space and attribute requests in flight, apart from the data
    /// requests so that many of them waiting for the manager leave the
    /// open files' reads and writes going.
    name_requests: Arc<Semaphore>,
    notifier: OnceLock<Notifier>,
    answered: AtomicU64,
    failed: AtomicU64,
    /// Cache invalidations sent to the kernel from the change feed.
    invalidations: AtomicU64,
    /// Changes the feed reported that this mount had made itself (skipped).
    own_skipped: AtomicU64,
    /// When a call that does not wait last tried the manager during an outage.
    outage_try: Mutex<Option<std::time::Instant>>,
    /// Changes this mount is making itself, which the feed will report:
    /// the kernel learnt them from the replies, so they are skipped.
    own: Mutex<HashMap<Change, (u32, std::time::Instant)>>,
}

/// Locks a mutex, taking it over if a panicking request left it poisoned
/// (every critical section leaves the tables consistent between statements).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The changes the manager records for a name made or removed in `parent`.
fn name_changes(parent: Handle, name: &str) -> Vec<Change> {
    vec![Change::Entry { dir: parent.ino, name: name.to_string() }, Change::Inode(parent.ino)]
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
    pub fn new(fs: FsClient, runtime: tokio::runtime::Handle, config: &MountConfig, root: Entry) -> State {
        State {
            identity: fs.identity(),
            fs,
            runtime,
            // SAFETY: geteuid(2) cannot fail and touches no memory.
            owner_uid: unsafe { libc::geteuid() },
            allow_other: config.allow_other,
            map_users: config.map_users,
            ttl: config.attr_timeout,
            manager_wait: config.manager_wait,
            inodes: Mutex::new(Inodes::new(&root)),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            hidden_seq: AtomicU64::new(0),
            requests: Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_MAX)),
            name_requests: Arc::new(Semaphore::new(NAME_REQUESTS_IN_FLIGHT_MAX)),
            notifier: OnceLock::new(),
            answered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            invalidations: AtomicU64::new(0),
            own_skipped: AtomicU64::new(0),
            own: Mutex::new(HashMap::new()),
            outage_try: Mutex::new(None),
        }
    }

    pub fn set_notifier(&self, notifier: Notifier) {
        let _ = self.notifier.set(notifier);
    }

    pub fn counters(&self) -> (u64, u64) {
        (self.answered.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }

    pub fn invalidations(&self) -> u64 {
        self.invalidations.load(Ordering::Relaxed)
    }

    pub fn own_changes_skipped(&self) -> u64 {
        self.own_skipped.load(Ordering::Relaxed)
    }

    /// The client the current request runs as ([`CALLER`]); the mount's
    /// own outside a request (background work).
    fn fs(&self) -> FsClient {
        CALLER.try_with(FsClient::clone).unwrap_or_else(|_| self.fs.clone())
    }

    /// The client a request of local user `uid` (group `gid`, process or
    /// thread `pid`) runs as: with `map_users`, one acting for that caller
    /// with its supplementary groups as `/proc` shows them; else the
    /// mount's own, for the users [`State::admit`] lets in.
    fn client_for(&self, uid: u32, gid: u32, pid: u32) -> Result<FsClient, Errno> {
        if !self.map_users {
            self.admit(uid)?;
            return Ok(self.fs.clone());
        }
        // A caller whose groups cannot be read is refused: acting without
        // them could grant what a mode such as 0604 denies the group.
        let groups = caller_groups(pid).map_err(|e| {
            tracing::debug!(pid, error = %e, "cannot read the caller's groups");
            Errno::EACCES
        })?;
        self.fs.as_user(uid, gid, &groups).map_err(|e| {
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

    fn handle(&self, ino: u64) -> Result<Handle, Errno> {
        lock(&self.inodes).handle(ino).ok_or(Errno::ESTALE)
    }

    /// Records an entry handed to the kernel; its attributes as the kernel takes them.
    fn remember(&self, e: &Entry) -> fuser::FileAttr {
        let mut inodes = lock(&self.inodes);
        let node = inodes.remember(e);
        to_kernel(&node.attr, node.nlink_hidden())
    }

    fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    fn open_file(&self, fh: u64) -> Result<OpenFile, Errno> {
        lock(&self.files).get(&fh).copied().ok_or(Errno::EBADF)
    }

    /// The file every descriptor of `ino` reads and writes through.
    fn shared(&self, ino: Ino) -> Result<Arc<File>, Errno> {
        lock(&self.inodes).get(ino).and_then(|n| n.file.clone()).ok_or(Errno::EBADF)
    }

    fn is_open(&self, ino: Ino) -> bool {
        lock(&self.inodes).get(ino).is_some_and(|n| n.opens > 0)
    }

    // ---------------------------------------------------------------- names

    async fn lookup(&self, parent: u64, name: OsString) -> Result<fuser::FileAttr, Errno> {
        let parent = self.handle(parent)?;
        let name = name_of(&name)?;
        let mut e = self.fs().lookup(parent, &name).await.map_err(|e| errno(&e))?;
        // The kernel takes a lookup's attributes as the inode's: never a size
        // short of what this mount has written and not yet committed.
        self.with_local_size(&mut e.attr).await;
        Ok(self.remember(&e))
    }

    /// Raises `attr.size` to the size of the writes this mount holds for the
    /// inode and has not committed (the manager does not know that size yet).
    async fn with_local_size(&self, attr: &mut nasd_fs::FileAttr) {
        let file = lock(&self.inodes).get(attr.ino).and_then(|n| n.file.clone());
        if let Some(file) = file {
            if file.dirty().await {
                attr.size = attr.size.max(file.size());
            }
        }
    }

    async fn getattr(&self, ino: u64) -> Result<fuser::FileAttr, Errno> {
        let handle = self.handle(ino)?;
        let open = lock(&self.inodes).get(ino).and_then(|n| n.file.clone());
        let mut attr = match open {
            // The kernel asks before reads of an open file: while no manager answers, the
            // open file's attributes (what its open, commits and writes here made them)
            // answer, so reads go on at once.
            Some(file) => match self.unless_unreachable(self.fs().getattr(handle)).await {
                Some(r) => r.map_err(|e| errno(&e))?.attr,
                None => file.attr(),
            },
            None => self.fs().getattr(handle).await.map_err(|e| errno(&e))?.attr,
        };
        self.with_local_size(&mut attr).await;
        let mut inodes = lock(&self.inodes);
        inodes.refresh(&attr);
        let hidden = inodes.get(ino).map_or(0, |n| n.nlink_hidden());
        Ok(to_kernel(&attr, hidden))
    }

    /// Runs `call` (manager requests) without waiting for a manager: `None`
    /// if none answers — the one attempt found no manager or lost its
    /// connection — else its result. During an outage the attempt is made
    /// at most once per [`nasd_fs::MANAGER_PROBE_PAUSE`] (so the outage's
    /// end is found even if no other call waits for it) and given
    /// [`UNLESS_UNREACHABLE_WAIT_MAX`]; meanwhile `None` at once.
    async fn unless_unreachable<T>(
        &self,
        call: impl Future<Output = Result<T, FsError>>,
    ) -> Option<Result<T, FsError>> {
        let call = nasd_fs::with_manager_wait(ManagerWait::NONE, None, call);
        let result = if self.fs.manager_outage().is_some() {
            if !self.outage_try_due() {
                return None;
            }
            tokio::time::timeout(UNLESS_UNREACHABLE_WAIT_MAX, call).await.ok()?
        } else {
            call.await
        };
        match result {
            Err(FsError::ManagerUnreachable { .. } | FsError::Io(_)) => None,
            r => Some(r),
        }
    }

    /// Whether a call that does not wait may try the manager during an
    /// outage now (the last such try was [`nasd_fs::MANAGER_PROBE_PAUSE`]
    /// ago or more); taken if so.
    fn outage_try_due(&self) -> bool {
        let mut last = lock(&self.outage_try);
        if last.is_some_and(|t| t.elapsed() < nasd_fs::MANAGER_PROBE_PAUSE) {
            return false;
        }
        *last = Some(std::time::Instant::now());
        true
    }

    async fn setattr(&self, ino: u64, changes: SetAttr) -> Result<fuser::FileAttr, Errno> {
        let handle = self.handle(ino)?;
        let file = lock(&self.inodes).get(ino).and_then(|n| n.file.clone());
        if let Some(file) = &file {
            // The manager changes a size under a write transaction of its own, and a
            // commit sets the modification time: writes here are committed first.
            if file.dirty().await {
                self.making(vec![Change::Inode(ino)], async { file.flush().await.map_err(|e| errno(&e)) }).await?;
            }
        }
        if changes == SetAttr::default() {
            return self.getattr(ino).await;
        }
        let call = async { self.fs().setattr(handle, &changes).await.map_err(|e| errno(&e)) };
        let attr = self.making(vec![Change::Inode(ino)], call).await?;
        if changes.size.is_some() {
            if let Some(file) = &file {
                file.adopt_attr(attr.clone()).await;
            }
        }
        let mut inodes = lock(&self.inodes);
        inodes.refresh(&attr);
        let node = inodes.get_mut(ino);
        let hidden = node.as_ref().map_or(0, |n| n.nlink_hidden());
        if let Some(node) = node {
            if changes.size.is_some() {
                node.cached = None;
            }
        }
        Ok(to_kernel(&attr, hidden))
    }

    async fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let (handle, target) = {
            let inodes = lock(&self.inodes);
            let node = inodes.get(ino).ok_or(Errno::ESTALE)?;
            (node.handle, node.target.clone())
        };
        if let Some(target) = target {
            return Ok(target.into_bytes());
        }
        let e = self.fs().getattr(handle).await.map_err(|e| errno(&e))?;
        if e.attr.kind != FileKind::Symlink {
            return Err(Errno::EINVAL);
        }
        Ok(e.target.into_bytes())
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
        let parent = self.handle(parent)?;
        let name = name_of(&name)?;
        if let Some(kind) = kind {
            let rdev = if kind.is_device() { u64::from(rdev) } else { 0 };
            let call =
                async { self.fs().mknod_at(parent, &name, kind, mode & 0o7777, rdev).await.map_err(|e| errno(&e)) };
            let e = self.making(name_changes(parent, &name), call).await?;
            return Ok(self.remember(&e));
        }
        let call =
            async { self.fs().create_at(parent, &name, mode & 0o7777, true, false).await.map_err(|e| errno(&e)) };
        let file = self.making(name_changes(parent, &name), call).await?;
        let handle = file.handle();
        let e =
            Entry { attr: file.attr(), handle_mac: handle.mac, site: handle.site, target: String::new(), access: None };
        Ok(self.remember(&e))
    }

    async fn mkdir(&self, parent: u64, name: OsString, mode: u32) -> Result<fuser::FileAttr, Errno> {
        let parent = self.handle(parent)?;
        let name = name_of(&name)?;
        let call = async { self.fs().mkdir_at(parent, &name, mode & 0o7777).await.map_err(|e| errno(&e)) };
        let e = self.making(name_changes(parent, &name), call).await?;
        Ok(self.remember(&e))
    }

    async fn symlink(&self, parent: u64, name: OsString, target: std::path::PathBuf) -> Result<fuser::FileAttr, Errno> {
        let parent = self.handle(parent)?;
        let name = name_of(&name)?;
        let target = target.to_str().ok_or(Errno::EINVAL)?.to_owned();
        let call = async { self.fs().symlink_at(parent, &name, &target).await.map_err(|e| errno(&e)) };
        let e = self.making(name_changes(parent, &name), call).await?;
        Ok(self.remember(&e))
    }

    async fn link(&self, ino: u64, new_parent: u64, new_name: OsString) -> Result<fuser::FileAttr, Errno> {
        let file = self.handle(ino)?;
        let new_parent = self.handle(new_parent)?;
        let new_name = name_of(&new_name)?;
        let mut changes = name_changes(new_parent, &new_name);
        changes.push(Change::Inode(file.ino));
        let call = async { self.fs().link_at(file, new_parent, &new_name).await.map_err(|e| errno(&e)) };
        let mut e = self.making(changes, call).await?;
        self.with_local_size(&mut e.attr).await;
        Ok(self.remember(&e))
    }

    /// The inode `name` in `parent` names, if it is a regular file with no
    /// other name that is open in this mount: removing that name would
    /// destroy its data under the open descriptors.
    async fn open_last_name(&self, parent: Handle, name: &str) -> Option<Ino> {
        if lock(&self.files).is_empty() {
            return None;
        }
        let e = self.fs().lookup(parent, name).await.ok()?;
        let ino = e.attr.ino;
        (e.attr.kind == FileKind::File && e.attr.nlink <= 1 && self.is_open(ino)).then_some(ino)
    }

    /// Moves `parent/name` (inode `ino`, open here) to a hidden name that
    /// the last close removes.
    async fn hide(&self, parent: Handle, name: &str, ino: Ino) -> Result<Hidden, Errno> {
        let seq = self.hidden_seq.fetch_add(1, Ordering::Relaxed);
        let hidden = Hidden { parent, name: format!("{HIDDEN_PREFIX}{ino:x}-{seq:x}"), fs: self.fs() };
        self.fs().rename_at(parent, name, parent, &hidden.name).await.map_err(|e| errno(&e))?;
        let closed = {
            let mut inodes = lock(&self.inodes);
            match inodes.get_mut(ino) {
                Some(node) if node.opens > 0 => {
                    node.hidden = Some(hidden.clone());
                    false
                }
                _ => true,
            }
        };
        if closed {
            // The last descriptor closed meanwhile.
            self.remove_hidden_name(&hidden).await;
        }
        Ok(hidden)
    }

    async fn remove_hidden_name(&self, hidden: &Hidden) {
        // As whoever hid it: they could unlink the name.
        if let Err(e) = hidden.fs.unlink_at(hidden.parent, &hidden.name).await {
            tracing::warn!(name = %hidden.name, error = %e, "removing the hidden name of a file unlinked while open failed");
        }
    }

    async fn unlink(&self, parent: u64, name: OsString) -> Result<(), Errno> {
        let parent = self.handle(parent)?;
        let name = name_of(&name)?;
        if let Some(ino) = self.open_last_name(parent, &name).await {
            return self.hide(parent, &name, ino).await.map(|_| ());
        }
        let call = async { self.fs().unlink_at(parent, &name).await.map_err(|e| errno(&e)) };
        self.making(name_changes(parent, &name), call).await
    }

    async fn rmdir(&self, parent: u64, name: OsString) -> Result<(), Errno> {
        let parent = self.handle(parent)?;
        let name = name_of(&name)?;
        let call = async { self.fs().rmdir_at(parent, &name).await.map_err(|e| errno(&e)) };
        self.making(name_changes(parent, &name), call).await
    }

    async fn rename(&self, from: (u64, OsString), to: (u64, OsString), flags: RenameFlags) -> Result<(), Errno> {
        // The manager renames atomically with replacement only: renameat2's
        // RENAME_NOREPLACE and RENAME_EXCHANGE are not supported (EINVAL, as
        // for any flag a file system does not know).
        if !flags.is_empty() {
            return Err(Errno::EINVAL);
        }
        let parent = self.handle(from.0)?;
        let new_parent = self.handle(to.0)?;
        let name = name_of(&from.1)?;
        let new_name = name_of(&to.1)?;
        // A file open here that the rename would replace lives on under a hidden name.
        let mut hidden = None;
        if let Some(ino) = self.open_last_name(new_parent, &new_name).await {
            let source = self.fs().lookup(parent, &name).await.map_err(|e| errno(&e))?;
            if source.attr.ino != ino {
                hidden = Some((ino, self.hide(new_parent, &new_name, ino).await?));
            }
        }
        let mut changes = vec![
            Change::Entry { dir: parent.ino, name: name.clone() },
            Change::Entry { dir: new_parent.ino, name: new_name.clone() },
            Change::Inode(parent.ino),
        ];
        if new_parent.ino != parent.ino {
            changes.push(Change::Inode(new_parent.ino));
        }
        let call = async { self.fs().rename_at(parent, &name, new_parent, &new_name).await.map_err(|e| errno(&e)) };
        let renamed = self.making(changes, call).await;
        if let (Err(_), Some((ino, h))) = (&renamed, hidden) {
            // Put the replaced file back where it was.
            let back = self.fs().rename_at(h.parent, &h.name, new_parent, &new_name).await;
            if back.is_ok() {
                if let Some(node) = lock(&self.inodes).get_mut(ino) {
                    node.hidden = None;
                }
            }
        }
        renamed
    }

    // ---------------------------------------------------------------- files

    fn check_room(&self) -> Result<(), Errno> {
        if lock(&self.files).len() >= OPEN_FILES_MAX {
            return Err(Errno::ENFILE);
        }
        Ok(())
    }

    /// Makes `file` the shared file of `ino` unless one that serves `write`
    /// is there, records one more open, and returns whether the kernel may
    /// keep its page cache (the file is unchanged since it was filled).
    fn install(&self, ino: Ino, file: Arc<File>, write: bool, keep_old: bool) -> Result<bool, Errno> {
        let attr = file.attr();
        let mut inodes = lock(&self.inodes);
        let node = inodes.get_mut(ino).ok_or(Errno::ESTALE)?;
        let serves = node.file.as_ref().is_some_and(|f| !write || f.writable());
        if !(serves && keep_old) {
            node.file = Some(file);
        }
        let stamp = (attr.size, attr.mtime_ns);
        let keep = node.cached == Some(stamp);
        node.cached = Some(stamp);
        node.attr = attr;
        node.opens += 1;
        Ok(keep)
    }

    fn add_fh(&self, ino: Ino, write: bool) -> u64 {
        let fh = self.new_fh();
        lock(&self.files).insert(fh, OpenFile { ino, write });
        fh
    }

    async fn open(&self, ino: u64, flags: i32) -> Result<(u64, FopenFlags), Errno> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let handle = self.handle(ino)?;
        self.check_room()?;
        // Every open asks the manager: its permission check, and fresh
        // attributes (close-to-open).
        let fresh = Arc::new(self.fs().open_handle(handle, write).await.map_err(|e| errno(&e))?);
        let attr = fresh.attr();
        let existing = lock(&self.inodes).get(ino).and_then(|n| n.file.clone());
        let mut keep_old = false;
        if let Some(old) = existing {
            let serves = if write { old.takes_writes().await } else { true };
            if serves {
                // Another client's commits since it was opened show now.
                old.adopt_attr(attr.clone()).await;
                keep_old = true;
            }
        }
        let old_size = lock(&self.inodes).get(ino).map(|n| n.attr.size);
        let keep = self.install(ino, fresh, write, keep_old)?;
        if !keep && old_size.is_some_and(|s| s != attr.size) {
            // The kernel's size for the file is stale: have it asked again.
            if let Some(n) = self.notifier.get() {
                let _ = n.inval_inode(INodeNo(ino), -1, 0);
            }
        }
        let fh = self.add_fh(ino, write);
        Ok((fh, if keep { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() }))
    }

    async fn create(
        &self,
        parent: u64,
        name: OsString,
        mode: u32,
        flags: i32,
    ) -> Result<(fuser::FileAttr, u64, FopenFlags), Errno> {
        let parent = self.handle(parent)?;
        let name = name_of(&name)?;
        self.check_room()?;
        let exclusive = flags & libc::O_EXCL != 0;
        let truncate = flags & libc::O_TRUNC != 0;
        let file = self
            .making(name_changes(parent, &name), async {
                self.fs().create_at(parent, &name, mode & 0o7777, exclusive, truncate).await.map_err(|e| errno(&e))
            })
            .await?;
        let handle = file.handle();
        let e =
            Entry { attr: file.attr(), handle_mac: handle.mac, site: handle.site, target: String::new(), access: None };
        let attr = self.remember(&e);
        let ino = e.attr.ino;
        self.install(ino, Arc::new(file), true, false)?;
        let fh = self.add_fh(ino, flags & libc::O_ACCMODE != libc::O_RDONLY);
        Ok((attr, fh, FopenFlags::empty()))
    }

    async fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let open = self.open_file(fh)?;
        let file = self.shared(open.ino)?;
        file.read_at(offset, u64::from(size)).await.map_err(|e| errno(&e))
    }

    async fn write(&self, fh: u64, offset: u64, data: Vec<u8>) -> Result<u32, Errno> {
        let open = self.open_file(fh)?;
        if !open.write {
            return Err(Errno::EBADF);
        }
        let file = self.shared(open.ino)?;
        // The kernel's offset (its size for O_APPEND): its page cache holds
        // the bytes there too.
        file.write_at(offset, &data).await.map_err(|e| errno(&e))?;
        if let Some(node) = lock(&self.inodes).get_mut(open.ino) {
            node.cached = None;
        }
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
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
        let open = self.open_file(fh)?;
        let file = self.shared(open.ino)?;
        match file.seek(what, offset).await.map_err(|e| errno(&e))? {
            Some(at) => i64::try_from(at).map_err(|_| Errno::EOVERFLOW),
            None => Err(Errno::ENXIO),
        }
    }

    /// `close` of a descriptor open for writing, and `fsync`: commits the
    /// file's writes (close-to-open: another mount's next open sees them).
    async fn commit(&self, fh: u64) -> Result<(), Errno> {
        let open = self.open_file(fh)?;
        if !open.write {
            return Ok(());
        }
        let file = self.shared(open.ino)?;
        // Always flushed: a write that failed in the background is reported here.
        let expected = if file.dirty().await { vec![Change::Inode(open.ino)] } else { Vec::new() };
        self.making(expected, async { file.flush().await.map_err(|e| errno(&e)) }).await?;
        let attr = file.attr();
        let mut inodes = lock(&self.inodes);
        if let Some(node) = inodes.get_mut(open.ino) {
            // The page cache holds what was just committed.
            node.cached = Some((attr.size, attr.mtime_ns));
            node.attr = attr;
        }
        Ok(())
    }

    async fn release(&self, fh: u64) -> Result<(), Errno> {
        let open = lock(&self.files).remove(&fh).ok_or(Errno::EBADF)?;
        let (file, hidden) = {
            let mut inodes = lock(&self.inodes);
            match inodes.get_mut(open.ino) {
                Some(node) => {
                    node.opens = node.opens.saturating_sub(1);
                    if node.opens == 0 {
                        node.write_check = None;
                        (node.file.take(), node.hidden.take())
                    } else {
                        (None, None)
                    }
                }
                None => (None, None),
            }
        };
        let mut result = Ok(());
        if let Some(file) = file {
            // Writes made since the last close (through mmap, or a close whose
            // commit failed) are committed or reported now.
            if file.dirty().await {
                if let Err(e) = file.flush().await {
                    tracing::warn!(ino = open.ino, error = %e, "committing a file's writes at its last close failed");
                    result = Err(errno(&e));
                }
            }
        }
        if let Some(hidden) = hidden {
            self.remove_hidden_name(&hidden).await;
        }
        lock(&self.inodes).drop_if_unused(open.ino);
        result
    }

    // ---------------------------------------------------------- directories

    async fn opendir(&self, ino: u64) -> Result<u64, Errno> {
        let handle = self.handle(ino)?;
        let mut dirs = lock(&self.dirs);
        if dirs.len() >= OPEN_DIRS_MAX {
            return Err(Errno::ENFILE);
        }
        let fh = self.new_fh();
        dirs.insert(fh, Arc::new(tokio::sync::Mutex::new(DirStream::new(handle))));
        Ok(fh)
    }

    async fn readdir(&self, fh: u64, offset: u64, reply: &mut ReplyDirectory) -> Result<(), Errno> {
        let stream = lock(&self.dirs).get(&fh).cloned().ok_or(Errno::EBADF)?;
        let mut stream = stream.lock().await;
        let ino = stream.ino();
        let mut at = offset;
        // Offsets: 0 ".", 1 "..", then the entries; each entry carries the offset after it.
        for (dot, name) in [(0, "."), (1, "..")] {
            if at == dot {
                if reply.add(INodeNo(ino), dot + 1, fuser::FileType::Directory, name) {
                    return Ok(());
                }
                at += 1;
            }
        }
        while let Some(item) = stream.at(&self.fs(), at).await.map_err(|e| errno(&e))? {
            if reply.add(INodeNo(item.ino), at + 1, file_type(item.kind), &item.name) {
                break;
            }
            at += 1;
        }
        Ok(())
    }

    fn releasedir(&self, fh: u64) {
        lock(&self.dirs).remove(&fh);
    }

    // ---------------------------------------------------------------- other

    async fn statfs(&self) -> Result<[u64; 5], Errno> {
        let (inodes, _, drives) = self.fs().statfs().await.map_err(|e| errno(&e))?;
        let online = drives.iter().filter(|d| d.online);
        let (capacity, used) =
            online.fold((0u64, 0u64), |(c, u), d| (c.saturating_add(d.capacity_bytes), u.saturating_add(d.used_bytes)));
        let block = u64::from(STATFS_BLOCK_BYTES);
        let free = capacity.saturating_sub(used) / block;
        Ok([capacity / block, free, free, inodes.saturating_add(STATFS_FILES_FREE), STATFS_FILES_FREE])
    }

    /// `access(2)`, checked against the manager's current attributes the way
    /// its permission rules check (root passes, but needs an `x` bit to execute).
    async fn access(&self, ino: u64, mask: i32) -> Result<(), Errno> {
        let handle = self.handle(ino)?;
        let attr = self.fs().getattr(handle).await.map_err(|e| errno(&e))?.attr;
        let want = (mask & (libc::R_OK | libc::W_OK | libc::X_OK)) as u32;
        if want == 0 {
            return Ok(());
        }
        let id = self.fs().identity();
        let allowed = if id.uid == 0 {
            let exec_ok = attr.kind == FileKind::Dir || attr.mode & 0o111 != 0;
            if exec_ok {
                7
            } else {
                6
            }
        } else if attr.uid == id.uid {
            (attr.mode >> 6) & 7
        } else if attr.gid == id.gid {
            (attr.mode >> 3) & 7
        } else {
            attr.mode & 7
        };
        if want & allowed == want {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// `fallocate` mode 0 (`posix_fallocate`): the file is at least
    /// `offset + length` long afterwards (a longer length is a size change at
    /// the manager; the drives allocate as data is written, so a later write
    /// can still find no space). Other modes are not supported.
    async fn fallocate(&self, ino: u64, fh: u64, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        if mode != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        let attr = self.getattr(ino).await?;
        if end <= attr.size {
            return Ok(());
        }
        // Through a descriptor open for writing, as ftruncate (the owner's override).
        let open_writer = self.open_file(fh).is_ok_and(|f| f.write);
        self.setattr(ino, SetAttr { size: Some(end), open_writer, ..SetAttr::default() }).await.map(|_| ())
    }

    // ------------------------------------------------- extended attributes

    async fn getxattr(&self, ino: u64, name: OsString) -> Result<Vec<u8>, Errno> {
        let handle = self.handle(ino)?;
        let name = name_of(&name)?;
        let open = name == WRITE_CHECK_XATTR && lock(&self.inodes).get(ino).is_some_and(|n| n.file.is_some());
        if open {
            // The kernel asks before every write of the file: while no manager answers,
            // the last answer this mount had while the file is open answers, so writes go on.
            match self.unless_unreachable(self.fs().getxattr(handle, &name)).await {
                Some(r) => {
                    let r = r.map_err(|e| errno(&e));
                    if let Some(node) = lock(&self.inodes).get_mut(ino).filter(|n| n.file.is_some()) {
                        node.write_check = Some(r.clone());
                    }
                    return r;
                }
                None => {
                    let last =
                        lock(&self.inodes).get(ino).filter(|n| n.file.is_some()).and_then(|n| n.write_check.clone());
                    if let Some(last) = last {
                        return last;
                    }
                }
            }
        }
        self.fs().getxattr(handle, &name).await.map_err(|e| errno(&e))
    }

    /// The names, each ended by a NUL, as `listxattr(2)` returns them.
    async fn listxattr(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let handle = self.handle(ino)?;
        let names = self.fs().listxattr(handle).await.map_err(|e| errno(&e))?;
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
        let handle = self.handle(ino)?;
        let name = name_of(&name)?;
        let call = async { self.fs().setxattr(handle, &name, &value, mode).await.map_err(|e| errno(&e)) };
        self.making(vec![Change::Inode(handle.ino)], call).await
    }

    async fn removexattr(&self, ino: u64, name: OsString) -> Result<(), Errno> {
        let handle = self.handle(ino)?;
        let name = name_of(&name)?;
        let call = async { self.fs().removexattr(handle, &name).await.map_err(|e| errno(&e)) };
        self.making(vec![Change::Inode(handle.ino)], call).await
    }

    // ---------------------------------------------------------- change feed

    /// Follows the manager's change feed for as long as the mount lives,
    /// dropping from the kernel's caches what other clients changed: the
    /// attributes and pages of a changed inode, a changed name. A feed
    /// that cannot be reached is tried again every [`FEED_RETRY`]; while it
    /// is down, and for names the feed lost, the attribute timeout is the
    /// bound.
    pub async fn follow_changes(self: Arc<Self>, mut watcher: nasd_fs::Watcher, mut started: bool) {
        loop {
            match watcher.wait(FEED_WAIT).await {
                Ok(batch) => {
                    if batch.lost && started {
                        tracing::info!("the manager's change feed lost changes: dropping every cached inode");
                        self.invalidate_all().await;
                    }
                    started = true;
                    self.invalidate(batch.changes).await;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the change feed failed; trying again");
                    tokio::time::sleep(FEED_RETRY).await;
                }
            }
        }
    }

    /// Notes changes this mount is about to make (as the manager will record
    /// them), so the feed's report of them is skipped.
    fn expect(&self, changes: &[Change]) {
        let now = std::time::Instant::now();
        let mut own = lock(&self.own);
        own.retain(|_, (_, at)| now.duration_since(*at) < OWN_CHANGE_WAIT);
        for c in changes {
            let e = own.entry(c.clone()).or_insert((0, now));
            *e = (e.0 + 1, now);
        }
    }

    /// Forgets expected changes of a request that failed (it changed nothing).
    fn unexpect(&self, changes: &[Change]) {
        let mut own = lock(&self.own);
        for c in changes {
            if let Some(e) = own.get_mut(c) {
                e.0 -= 1;
                if e.0 == 0 {
                    own.remove(c);
                }
            }
        }
    }

    /// Runs a manager request that makes `changes` if it succeeds, expecting them.
    async fn making<T>(&self, changes: Vec<Change>, call: impl Future<Output = Result<T, Errno>>) -> Result<T, Errno> {
        self.expect(&changes);
        let r = call.await;
        if r.is_err() {
            self.unexpect(&changes);
        }
        r
    }

    /// Whether `c` is one of this mount's own changes (then consumed).
    fn own_change(&self, c: &Change) -> bool {
        let mut own = lock(&self.own);
        match own.get_mut(c) {
            Some(e) if OWN_CHANGE_WAIT > e.1.elapsed() => {
                e.0 -= 1;
                if e.0 == 0 {
                    own.remove(c);
                }
                self.own_skipped.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(_) => {
                own.remove(c);
                false
            }
            None => false,
        }
    }

    /// Tells the kernel to drop what `changes` made stale, for inodes and
    /// directories it holds (not what this mount changed itself: the kernel
    /// took that from the replies).
    async fn invalidate(&self, changes: Vec<Change>) {
        let changes: Vec<Change> = changes.into_iter().filter(|c| !self.own_change(c)).collect();
        let mut todo = Vec::new();
        {
            let mut inodes = lock(&self.inodes);
            for c in changes {
                match c {
                    Change::Inode(ino) => {
                        if let Some(node) = inodes.get_mut(ino) {
                            node.cached = None;
                            if !todo.contains(&Change::Inode(ino)) {
                                todo.push(Change::Inode(ino));
                            }
                        }
                    }
                    Change::Entry { dir, name } => {
                        if inodes.get(dir).is_some() {
                            todo.push(Change::Entry { dir, name });
                        }
                    }
                }
            }
        }
        self.notify(todo).await;
    }

    async fn invalidate_all(&self) {
        let all: Vec<Change> = {
            let mut inodes = lock(&self.inodes);
            inodes
                .all_mut()
                .map(|(ino, node)| {
                    node.cached = None;
                    Change::Inode(ino)
                })
                .collect()
        };
        self.notify(all).await;
    }

    /// Sends the kernel its invalidations, off the runtime's threads (the
    /// kernel may wait for requests in flight on the inode first).
    async fn notify(&self, todo: Vec<Change>) {
        let Some(notifier) = self.notifier.get().cloned() else { return };
        if todo.is_empty() {
            return;
        }
        self.invalidations.fetch_add(todo.len() as u64, Ordering::Relaxed);
        let sent = tokio::task::spawn_blocking(move || {
            for c in todo {
                // The kernel may have dropped the inode or the name already (ENOENT): nothing to do.
                let _ = match c {
                    Change::Inode(ino) => notifier.inval_inode(INodeNo(ino), 0, 0),
                    Change::Entry { dir, name } => notifier.inval_entry(INodeNo(dir), OsStr::new(&name)),
                };
            }
        });
        if let Err(e) = sent.await {
            tracing::warn!(error = %e, "sending the kernel its cache invalidations failed");
        }
    }

    /// Removes the hidden names left when the mount ends with files open
    /// (the kernel releases every descriptor before it ends a session; this
    /// is for a session that was cut off).
    pub async fn remove_hidden(&self) {
        let hidden = lock(&self.inodes).take_hidden();
        for h in hidden {
            self.remove_hidden_name(&h).await;
        }
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
    ReplyAttr,
    ReplyData,
    ReplyEmpty,
    ReplyOpen,
    ReplyWrite,
    ReplyStatfs,
    ReplyCreate,
    ReplyDirectory,
    ReplyXattr
);

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
    fn run<R, T, W, F>(&self, req: &Request, reply: R, work: W, ok: impl FnOnce(R, T) + Send + 'static)
    where
        R: Fails,
        T: Send + 'static,
        W: FnOnce(Arc<State>) -> F + Send + 'static,
        F: Future<Output = Result<T, Errno>> + Send + 'static,
    {
        let client = match self.state.client_for(req.uid(), req.gid(), req.pid()) {
            Ok(c) => c,
            Err(e) => {
                self.state.failed.fetch_add(1, Ordering::Relaxed);
                reply.fail(e);
                return;
            }
        };
        self.spawn_as(client, req.pid(), Class::Names, move |state| async move {
            let result = work(state.clone()).await;
            state.answered.fetch_add(1, Ordering::Relaxed);
            match result {
                Ok(value) => ok(reply, value),
                Err(e) => {
                    state.failed.fetch_add(1, Ordering::Relaxed);
                    reply.fail(e)
                }
            }
        });
    }

    /// Runs `work` as a task of its own, as the mount's own client (data
    /// requests on open files, whose opens the manager checked), for the
    /// process `pid`.
    fn spawn<W, F>(&self, pid: u32, work: W)
    where
        W: FnOnce(Arc<State>) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn_as(self.state.fs.clone(), pid, Class::Data, work)
    }

    /// Runs `work` as a task of its own whose manager requests go out as
    /// `client` and wait for a manager that cannot be reached as the mount's
    /// `manager_wait` says, until process `pid` (the caller) is interrupted.
    fn spawn_as<W, F>(&self, client: FsClient, pid: u32, class: Class, work: W)
    where
        W: FnOnce(Arc<State>) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
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
                work(state).await;
            }),
        ));
    }

    fn ttl(&self) -> Duration {
        self.state.ttl
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
        ] {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (name, ttl) = (name.to_owned(), self.ttl());
        self.run(
            req,
            reply,
            move |s| async move { s.lookup(parent.0, name).await },
            move |r, attr| r.entry(&ttl, &attr, GENERATION),
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        lock(&self.state.inodes).forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let ttl = self.ttl();
        self.run(req, reply, move |s| async move { s.getattr(ino.0).await }, move |r, attr| r.attr(&ttl, &attr));
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
            open_writer: fh.is_some_and(|fh| self.state.open_file(fh.0).is_ok_and(|f| f.write)),
        };
        let ttl = self.ttl();
        self.run(
            req,
            reply,
            move |s| async move { s.setattr(ino.0, changes).await },
            move |r, attr| r.attr(&ttl, &attr),
        );
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        self.run(req, reply, move |s| async move { s.readlink(ino.0).await }, |r, target| r.data(&target));
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
            req,
            reply,
            move |s| async move { s.mknod(parent.0, name, mode, rdev).await },
            move |r, attr| r.entry(&ttl, &attr, GENERATION),
        );
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let (name, ttl) = (name.to_owned(), self.ttl());
        self.run(
            req,
            reply,
            move |s| async move { s.mkdir(parent.0, name, mode).await },
            move |r, attr| r.entry(&ttl, &attr, GENERATION),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.run(req, reply, move |s| async move { s.unlink(parent.0, name).await }, |r, ()| r.ok());
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.run(req, reply, move |s| async move { s.rmdir(parent.0, name).await }, |r, ()| r.ok());
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let (name, target, ttl) = (link_name.to_owned(), target.to_owned(), self.ttl());
        self.run(
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
        self.run(req, reply, move |s| async move { s.rename(from, to, flags).await }, |r, ()| r.ok());
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let (name, ttl) = (newname.to_owned(), self.ttl());
        self.run(
            req,
            reply,
            move |s| async move { s.link(ino.0, newparent.0, name).await },
            move |r, attr| r.entry(&ttl, &attr, GENERATION),
        );
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.run(
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
        self.spawn(req.pid(), move |s| async move {
            match s.read(fh.0, offset, size).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(e),
            }
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
        self.spawn(req.pid(), move |s| async move {
            match s.write(fh.0, offset, data).await {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(e),
            }
        });
    }

    fn lseek(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        self.spawn(req.pid(), move |s| async move {
            match s.lseek(fh.0, offset, whence).await {
                Ok(at) => reply.offset(at),
                Err(e) => reply.error(e),
            }
        });
    }

    fn flush(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        self.spawn(req.pid(), move |s| async move {
            match s.commit(fh.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
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
        self.spawn(req.pid(), move |s| async move {
            match s.release(fh.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn fsync(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.spawn(req.pid(), move |s| async move {
            match s.commit(fh.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.run(
            req,
            reply,
            move |s| async move { s.opendir(ino.0).await },
            |r, fh| r.opened(FileHandle(fh), FopenFlags::empty()),
        );
    }

    fn readdir(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        // Each page is read from the manager as the caller (its read permission).
        let client = match self.state.client_for(req.uid(), req.gid(), req.pid()) {
            Ok(c) => c,
            Err(e) => return reply.error(e),
        };
        self.spawn_as(client, req.pid(), Class::Names, move |s| async move {
            match s.readdir(fh.0, offset, &mut reply).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        });
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.state.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        // Every name-space change is durable at the manager before it answers.
        reply.ok();
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.run(
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
        self.run(req, reply, move |s| async move { s.access(ino.0, mask).await }, |r, ()| r.ok());
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
            req,
            reply,
            move |s| async move { s.getxattr(ino.0, name).await },
            move |r, v| reply_xattr(r, size, &v),
        );
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.run(req, reply, move |s| async move { s.listxattr(ino.0).await }, move |r, v| reply_xattr(r, size, &v));
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
        self.run(req, reply, move |s| async move { s.setxattr(ino.0, name, value, flags).await }, |r, ()| r.ok());
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name.to_owned();
        self.run(req, reply, move |s| async move { s.removexattr(ino.0, name).await }, |r, ()| r.ok());
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
