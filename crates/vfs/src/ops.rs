//! The operations: names, attributes, open files, directories, extended
//! attributes, each turned into handle-based `nasd-fs` calls.

use crate::dir::{DirCursor, DirItem};
use crate::feed::name_changes;
use crate::inodes::{Hidden, XattrAnswer};
use crate::libc_errno::ENODATA;
use crate::{lock, OpenFile, Vfs, VfsError, HIDDEN_PREFIX, OPEN_DIRS_MAX, OPEN_FILES_MAX};
use nasd_fs::{
    Change, Entry, File, FileAttr, FileKind, FsClient, FsError, FsStatus, Handle, Ino, ManagerWait, Seek, SetAttr,
    XattrMode,
};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest a call answered from an open file waits for the manager's answer
/// during an outage (a manager on a host that is gone answers nothing until
/// the connection times out); past it the open file answers.
const UNLESS_UNREACHABLE_WAIT_MAX: Duration = Duration::from_secs(1);
/// The extended attribute the kernel reads before every write of a file
/// (whether the write must drop file capabilities).
pub const WRITE_CHECK_XATTR: &str = "security.capability";

type Result<T> = std::result::Result<T, VfsError>;

/// What `statfs` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    /// Bytes the drives in service hold.
    pub capacity_bytes: u64,
    /// Bytes free on them.
    pub free_bytes: u64,
    /// Inodes the name space holds.
    pub inodes: u64,
}

/// How [`Vfs::create`] treats an existing name and opens the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CreateFlags {
    /// Fail with `EEXIST` if the name exists (`O_EXCL`).
    pub exclusive: bool,
    /// Truncate an existing file (`O_TRUNC`).
    pub truncate: bool,
    /// Open for writing.
    pub write: bool,
}

/// What an open hands the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The open file description.
    pub fh: u64,
    /// The client's data cache for the file (the kernel's pages) is still
    /// valid: the file's size and modification time are what they were
    /// when it was filled.
    pub keep_cache: bool,
}

pub(crate) async fn remove_hidden_name(hidden: &Hidden) {
    // As whoever hid it: they could unlink the name.
    if let Err(e) = hidden.fs.unlink_at(hidden.parent, &hidden.name).await {
        tracing::warn!(name = %hidden.name, error = %e, "removing the hidden name of a file unlinked while open failed");
    }
}

impl Vfs {
    fn handle(&self, ino: Ino) -> Result<Handle> {
        lock(&self.shared.inodes).handle(ino).ok_or(VfsError::Stale(ino))
    }

    /// The manager's handle of a held inode.
    ///
    /// # Errors
    /// [`VfsError::Stale`] if it is not held.
    pub fn handle_of(&self, ino: Ino) -> Result<Handle> {
        self.handle(ino)
    }

    /// Records an entry handed to the gateway's client (counted: the
    /// gateway later [`forget`](Self::forget)s it); the attributes as the
    /// gateway shows them.
    fn remember(&self, e: &Entry) -> FileAttr {
        let mut inodes = lock(&self.shared.inodes);
        let node = inodes.remember(e, true);
        shown(&node.attr, node.nlink_hidden())
    }

    /// The gateway's client dropped `n` references to `ino` (FUSE `FORGET`).
    pub fn forget(&self, ino: Ino, n: u64) {
        lock(&self.shared.inodes).forget(ino, n);
    }

    fn new_fh(&self) -> u64 {
        self.shared.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    fn open_file(&self, fh: u64) -> Result<OpenFile> {
        lock(&self.shared.files).get(&fh).copied().ok_or(VfsError::BadDescriptor)
    }

    /// Whether open file `fh` was opened for writing.
    pub fn open_for_writing(&self, fh: u64) -> bool {
        self.open_file(fh).is_ok_and(|f| f.write)
    }

    /// The file every descriptor of `ino` reads and writes through.
    fn shared_file(&self, ino: Ino) -> Result<Arc<File>> {
        lock(&self.shared.inodes).get(ino).and_then(|n| n.file.clone()).ok_or(VfsError::BadDescriptor)
    }

    /// The file open file description `fh` reads and writes through.
    pub(crate) fn file_of(&self, fh: u64) -> Result<Arc<File>> {
        self.shared_file(self.open_file(fh)?.ino)
    }

    /// The data layout of open file `fh`: a writer that fills whole
    /// stripes ([`nasd_proto::layout::Layout::stripe_bytes`]) spares the
    /// drives a read and a parity rewrite per write.
    pub fn layout_of(&self, fh: u64) -> Result<nasd_proto::layout::Layout> {
        Ok(self.file_of(fh)?.layout())
    }

    fn is_open(&self, ino: Ino) -> bool {
        lock(&self.shared.inodes).get(ino).is_some_and(|n| n.opens > 0)
    }

    // ---------------------------------------------------------------- names

    /// Looks `name` up in directory `parent` and holds what it names (one
    /// more reference).
    ///
    /// # Errors
    /// `NOT_FOUND` (`ENOENT`) if no such name, and the manager's refusals.
    /// A name this layer knows is absent ([`crate::negative`]) is answered
    /// without the manager, only while the change feed is live and no
    /// manager outage is known, for a name the manager would take and a
    /// caller the directory's attributes let search it.
    pub async fn lookup(&self, cx: &FsClient, parent: Ino, name: &str) -> Result<Entry> {
        let parent = self.handle(parent)?;
        let answerable = nasd_proto::fs::validate_name(name).is_ok();
        if answerable && self.known_absent(cx, parent.ino, name) {
            self.shared.negative_hits.fetch_add(1, Ordering::Relaxed);
            let message =
                format!("no {name} in directory {} (known absent: this layer saw it made or asked)", parent.ino);
            return Err(VfsError::Fs(FsError::Fs { status: FsStatus::NotFound, message }));
        }
        let generation = lock(&self.shared.negatives).generation();
        let looked_up = cx.lookup(parent, name).await;
        if let Err(e) = &looked_up {
            if answerable && e.status() == Some(FsStatus::NotFound) && self.fed() {
                lock(&self.shared.negatives).found_absent(parent.ino, name, generation);
            }
        }
        let mut e = looked_up?;
        // The gateway takes a lookup's attributes as the inode's: never a size
        // short of what this layer has written and not yet committed.
        self.with_local_size(&mut e.attr).await;
        e.attr = self.remember(&e);
        Ok(e)
    }

    /// Whether `name` is known absent from `dir` and may be answered so now:
    /// the change feed live and its connection open with nothing unread on
    /// it (asked of the socket now, so a manager that stopped and closed it
    /// is noticed before the feed's task runs), no manager outage known,
    /// and `cx` allowed to
    /// search `dir` by its held attributes (root, or its owner with the
    /// owner's search bit; anyone else asks the manager, which may refuse).
    fn known_absent(&self, cx: &FsClient, dir: Ino, name: &str) -> bool {
        // The cache first: a lookup of a name it does not hold (most of
        // them) costs no system call on the feed's socket.
        if !lock(&self.shared.negatives).absent(dir, name) || !self.fed() || cx.manager_outage().is_some() {
            return false;
        }
        let uid = cx.identity().uid;
        let searchable = lock(&self.shared.inodes).get(dir).is_some_and(|n| {
            n.attr.kind == FileKind::Dir && (uid == 0 || (uid == n.attr.uid && n.attr.mode & 0o100 != 0))
        });
        searchable && self.shared.watch_link.as_ref().is_some_and(|l| l.is_open_and_idle())
    }

    /// Resolves an absolute `path` (following symlinks, also at the end) in
    /// one request and holds what it names (one more reference).
    ///
    /// # Errors
    /// As [`lookup`](Self::lookup), for any component.
    pub async fn resolve(&self, cx: &FsClient, path: &str) -> Result<Entry> {
        let mut e = cx.walk(path, nasd_fs::OpenMode::None).await?;
        self.with_local_size(&mut e.attr).await;
        e.attr = self.remember(&e);
        Ok(e)
    }

    /// Raises `attr.size` to the size of the writes this layer holds for the
    /// inode and has not committed (the manager does not know that size yet).
    async fn with_local_size(&self, attr: &mut FileAttr) {
        let file = lock(&self.shared.inodes).get(attr.ino).and_then(|n| n.file.clone());
        if let Some(file) = file {
            if file.dirty().await {
                attr.size = attr.size.max(file.size());
            }
        }
    }

    /// An inode's attributes from the manager. While no manager answers, an
    /// open file's (what its open, commits and writes here made them)
    /// answer at once, so reads go on.
    pub async fn getattr(&self, cx: &FsClient, ino: Ino) -> Result<FileAttr> {
        let handle = self.handle(ino)?;
        let open = lock(&self.shared.inodes).get(ino).and_then(|n| n.file.clone());
        let mut attr = match open {
            Some(file) => match self.unless_unreachable(cx.getattr(handle)).await {
                Some(r) => r?.attr,
                None => file.attr(),
            },
            None => cx.getattr(handle).await?.attr,
        };
        self.with_local_size(&mut attr).await;
        let mut inodes = lock(&self.shared.inodes);
        inodes.refresh(&attr);
        let hidden = inodes.get(ino).map_or(0, |n| n.nlink_hidden());
        Ok(shown(&attr, hidden))
    }

    /// An inode's attributes as [`getattr`](Self::getattr) gives them, from
    /// what the layer holds while that is younger than
    /// [`attr_ttl`](Vfs::attr_ttl) (the change feed invalidates what
    /// changes; this layer's own writes and commits keep it current) — the
    /// attributes a FUSE kernel would answer from its cache — else asked of
    /// the manager. For replies that carry attributes beside data (NFS
    /// READ and WRITE), so a data call costs no manager request.
    ///
    /// # Errors
    /// As [`getattr`](Self::getattr).
    pub async fn getattr_recent(&self, cx: &FsClient, ino: Ino) -> Result<FileAttr> {
        let ttl = self.attr_ttl();
        let held = {
            let inodes = lock(&self.shared.inodes);
            inodes.get(ino).filter(|n| n.attr_at.elapsed() < ttl).map(|n| (n.attr.clone(), n.nlink_hidden()))
        };
        let Some((mut attr, hidden)) = held else { return self.getattr(cx, ino).await };
        self.with_local_size(&mut attr).await;
        Ok(shown(&attr, hidden))
    }

    /// Runs `call` (manager requests) without waiting for a manager: `None`
    /// if none answers — the one attempt found no manager or lost its
    /// connection — else its result. During an outage the attempt is made
    /// at most once per [`nasd_fs::MANAGER_PROBE_PAUSE`] (so the outage's
    /// end is found even if no other call waits for it) and given
    /// [`UNLESS_UNREACHABLE_WAIT_MAX`]; meanwhile `None` at once.
    async fn unless_unreachable<T>(
        &self,
        call: impl Future<Output = std::result::Result<T, FsError>>,
    ) -> Option<std::result::Result<T, FsError>> {
        let call = nasd_fs::with_manager_wait(ManagerWait::NONE, None, call);
        let result = if self.shared.fs.manager_outage().is_some() {
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
        let mut last = lock(&self.shared.outage_try);
        if last.is_some_and(|t| t.elapsed() < nasd_fs::MANAGER_PROBE_PAUSE) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }

    /// Changes attributes (mode, owner, size, times); writes held here are
    /// committed first (the manager changes a size under a write transaction
    /// of its own, and a commit sets the modification time). An empty
    /// change returns the attributes.
    pub async fn setattr(&self, cx: &FsClient, ino: Ino, changes: SetAttr) -> Result<FileAttr> {
        let handle = self.handle(ino)?;
        let file = lock(&self.shared.inodes).get(ino).and_then(|n| n.file.clone());
        if let Some(file) = &file {
            if file.dirty().await {
                self.making(vec![Change::Inode(ino)], file.flush()).await?;
            }
        }
        if changes == SetAttr::default() {
            return self.getattr(cx, ino).await;
        }
        let attr = self.making(vec![Change::Inode(ino)], cx.setattr(handle, &changes)).await?;
        if changes.size.is_some() {
            if let Some(file) = &file {
                file.adopt_attr(attr.clone()).await;
            }
        }
        let mut inodes = lock(&self.shared.inodes);
        inodes.refresh(&attr);
        let node = inodes.get_mut(ino);
        let hidden = node.as_ref().map_or(0, |n| n.nlink_hidden());
        if let Some(node) = node {
            // A change of owner or mode may change what the kernel asks before writes.
            node.capability = None;
            if changes.size.is_some() {
                node.data_stamp = None;
            }
        }
        Ok(shown(&attr, hidden))
    }

    /// A symbolic link's target (held ones from the table: targets never change).
    pub async fn readlink(&self, cx: &FsClient, ino: Ino) -> Result<String> {
        let (handle, target) = {
            let inodes = lock(&self.shared.inodes);
            let node = inodes.get(ino).ok_or(VfsError::Stale(ino))?;
            (node.handle, node.target.clone())
        };
        if let Some(target) = target {
            return Ok(target);
        }
        let e = cx.getattr(handle).await?;
        if e.attr.kind != FileKind::Symlink {
            return Err(VfsError::Invalid("not a symbolic link"));
        }
        Ok(e.target)
    }

    /// Makes a special file (`kind` FIFO, socket or device) or, with `kind`
    /// `None`, an empty regular file, and holds it.
    pub async fn mknod(
        &self,
        cx: &FsClient,
        parent: Ino,
        name: &str,
        kind: Option<FileKind>,
        mode: u32,
        rdev: u64,
    ) -> Result<Entry> {
        let parent = self.handle(parent)?;
        let changes = name_changes(parent.ino, name);
        let mut e = match kind {
            Some(kind) => {
                let rdev = if kind.is_device() { rdev } else { 0 };
                self.making(changes, cx.mknod_at(parent, name, kind, mode & 0o7777, rdev)).await?
            }
            None => {
                let file = self.making(changes, cx.create_at(parent, name, mode & 0o7777, true, false)).await?;
                entry_of(&file)
            }
        };
        e.attr = self.remember(&e);
        Ok(e)
    }

    /// Makes directory `name` in `parent` and holds it.
    pub async fn mkdir(&self, cx: &FsClient, parent: Ino, name: &str, mode: u32) -> Result<Entry> {
        let parent = self.handle(parent)?;
        let mut e = self.making(name_changes(parent.ino, name), cx.mkdir_at(parent, name, mode & 0o7777)).await?;
        e.attr = self.remember(&e);
        Ok(e)
    }

    /// Makes symbolic link `name` in `parent` to `target` and holds it.
    pub async fn symlink(&self, cx: &FsClient, parent: Ino, name: &str, target: &str) -> Result<Entry> {
        let parent = self.handle(parent)?;
        let mut e = self.making(name_changes(parent.ino, name), cx.symlink_at(parent, name, target)).await?;
        e.attr = self.remember(&e);
        Ok(e)
    }

    /// Makes hard link `new_name` in `new_parent` to `ino`.
    pub async fn link(&self, cx: &FsClient, ino: Ino, new_parent: Ino, new_name: &str) -> Result<Entry> {
        let file = self.handle(ino)?;
        let new_parent = self.handle(new_parent)?;
        let mut changes = name_changes(new_parent.ino, new_name);
        changes.push(Change::Inode(file.ino));
        let mut e = self.making(changes, cx.link_at(file, new_parent, new_name)).await?;
        self.with_local_size(&mut e.attr).await;
        e.attr = self.remember(&e);
        Ok(e)
    }

    /// The inode `name` in `parent` names, if it is a regular file with no
    /// other name that is open here: removing that name would destroy its
    /// data under the open descriptors.
    async fn open_last_name(&self, cx: &FsClient, parent: Handle, name: &str) -> Option<Ino> {
        if lock(&self.shared.files).is_empty() {
            return None;
        }
        let e = cx.lookup(parent, name).await.ok()?;
        let ino = e.attr.ino;
        (e.attr.kind == FileKind::File && e.attr.nlink <= 1 && self.is_open(ino)).then_some(ino)
    }

    /// Moves `parent/name` (inode `ino`, open here) to a hidden name that
    /// the last close removes.
    async fn hide(&self, cx: &FsClient, parent: Handle, name: &str, ino: Ino) -> Result<Hidden> {
        let seq = self.shared.hidden_seq.fetch_add(1, Ordering::Relaxed);
        let hidden = Hidden { parent, name: format!("{HIDDEN_PREFIX}{ino:x}-{seq:x}"), fs: cx.clone() };
        lock(&self.shared.negatives).may_exist(parent.ino, &hidden.name);
        cx.rename_at(parent, name, parent, &hidden.name).await?;
        let closed = {
            let mut inodes = lock(&self.shared.inodes);
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
            remove_hidden_name(&hidden).await;
        }
        Ok(hidden)
    }

    /// Removes name `name` (not a directory) from `parent`; a file open here
    /// whose last name it is lives on under a hidden name until its last close.
    pub async fn unlink(&self, cx: &FsClient, parent: Ino, name: &str) -> Result<()> {
        let parent = self.handle(parent)?;
        if let Some(ino) = self.open_last_name(cx, parent, name).await {
            return self.hide(cx, parent, name, ino).await.map(|_| ());
        }
        Ok(self.making(name_changes(parent.ino, name), cx.unlink_at(parent, name)).await?)
    }

    /// Removes the empty directory `name` from `parent`.
    pub async fn rmdir(&self, cx: &FsClient, parent: Ino, name: &str) -> Result<()> {
        let parent = self.handle(parent)?;
        Ok(self.making(name_changes(parent.ino, name), cx.rmdir_at(parent, name)).await?)
    }

    /// Renames atomically, replacing the target if it exists (POSIX rules);
    /// a file open here that the rename replaces lives on under a hidden name.
    pub async fn rename(&self, cx: &FsClient, from: (Ino, &str), to: (Ino, &str)) -> Result<()> {
        let (parent, name) = (self.handle(from.0)?, from.1);
        let (new_parent, new_name) = (self.handle(to.0)?, to.1);
        let mut hidden = None;
        if let Some(ino) = self.open_last_name(cx, new_parent, new_name).await {
            let source = cx.lookup(parent, name).await?;
            if source.attr.ino != ino {
                hidden = Some((ino, self.hide(cx, new_parent, new_name, ino).await?));
            }
        }
        let mut changes = vec![
            Change::Entry { dir: parent.ino, name: name.to_string() },
            Change::Entry { dir: new_parent.ino, name: new_name.to_string() },
            Change::Inode(parent.ino),
        ];
        if new_parent.ino != parent.ino {
            changes.push(Change::Inode(new_parent.ino));
        }
        let renamed = self.making(changes, cx.rename_at(parent, name, new_parent, new_name)).await;
        if let (Err(_), Some((ino, h))) = (&renamed, hidden) {
            // Put the replaced file back where it was.
            if cx.rename_at(h.parent, &h.name, new_parent, new_name).await.is_ok() {
                if let Some(node) = lock(&self.shared.inodes).get_mut(ino) {
                    node.hidden = None;
                }
            }
        }
        Ok(renamed?)
    }

    // ---------------------------------------------------------------- files

    fn check_room(&self) -> Result<()> {
        if lock(&self.shared.files).len() >= OPEN_FILES_MAX {
            return Err(VfsError::TooManyOpen);
        }
        Ok(())
    }

    /// Makes `file` the shared file of `ino` unless one that serves `write`
    /// is there, records one more open, and returns whether the client may
    /// keep its data cache (the file is unchanged since it was filled).
    fn install(&self, ino: Ino, file: Arc<File>, write: bool, keep_old: bool) -> Result<bool> {
        let attr = file.attr();
        let mut inodes = lock(&self.shared.inodes);
        let node = inodes.get_mut(ino).ok_or(VfsError::Stale(ino))?;
        let serves = node.file.as_ref().is_some_and(|f| !write || f.writable());
        if !(serves && keep_old) {
            node.file = Some(file);
        }
        let stamp = (attr.size, attr.mtime_ns);
        let keep = node.data_stamp == Some(stamp);
        node.data_stamp = Some(stamp);
        node.opens += 1;
        inodes.set_attr(attr);
        Ok(keep)
    }

    fn add_fh(&self, ino: Ino, write: bool) -> u64 {
        let fh = self.new_fh();
        lock(&self.shared.files).insert(fh, OpenFile { ino, write });
        fh
    }

    /// Opens regular file `ino`. Every open asks the manager: its
    /// permission check, and fresh attributes (close-to-open).
    pub async fn open(&self, cx: &FsClient, ino: Ino, write: bool) -> Result<Opened> {
        let handle = self.handle(ino)?;
        self.check_room()?;
        let fresh = Arc::new(cx.open_handle(handle, write).await?);
        let attr = fresh.attr();
        let existing = lock(&self.shared.inodes).get(ino).and_then(|n| n.file.clone());
        let mut keep_old = false;
        if let Some(old) = existing {
            let serves = if write { old.takes_writes().await } else { true };
            if serves {
                // Another client's commits since it was opened show now.
                old.adopt_attr(attr.clone()).await;
                keep_old = true;
            }
        }
        let old_size = lock(&self.shared.inodes).get(ino).map(|n| n.attr.size);
        let keep_cache = self.install(ino, fresh, write, keep_old)?;
        if !keep_cache && old_size.is_some_and(|s| s != attr.size) {
            // The gateway's size for the file is stale: have it asked again.
            self.notify_inode_now(ino);
        }
        Ok(Opened { fh: self.add_fh(ino, write), keep_cache })
    }

    /// Creates regular file `name` in `parent` (or, unless
    /// `how.exclusive`, opens the existing one, truncated with
    /// `how.truncate`), holds it and opens it (for writing with
    /// `how.write`): everything the gateway needs in one manager request.
    pub async fn create(
        &self,
        cx: &FsClient,
        parent: Ino,
        name: &str,
        mode: u32,
        how: CreateFlags,
    ) -> Result<(Entry, Opened)> {
        let CreateFlags { exclusive, truncate, write } = how;
        let parent = self.handle(parent)?;
        self.check_room()?;
        let call = cx.create_at(parent, name, mode & 0o7777, exclusive, truncate);
        let file = self.making(name_changes(parent.ino, name), call).await?;
        let mut e = entry_of(&file);
        e.attr = self.remember(&e);
        let ino = e.attr.ino;
        self.install(ino, Arc::new(file), true, false)?;
        Ok((e, Opened { fh: self.add_fh(ino, write), keep_cache: false }))
    }

    /// Reads up to `size` bytes at `offset` of open file `fh`.
    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let open = self.open_file(fh)?;
        let file = self.shared_file(open.ino)?;
        Ok(file.read_at(offset, u64::from(size)).await?)
    }

    /// `SEEK_DATA`/`SEEK_HOLE` from `offset` in open file `fh`
    /// ([`nasd_fs::File::seek`]): from the drives' stored extents, after this
    /// file's own writes reached them. `None` at or past the end, or (data)
    /// when only holes follow.
    pub async fn seek(&self, fh: u64, what: Seek, offset: u64) -> Result<Option<u64>> {
        let open = self.open_file(fh)?;
        let file = self.shared_file(open.ino)?;
        Ok(file.seek(what, offset).await?)
    }

    /// Writes `data` at `offset` of open file `fh` (into write-behind).
    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let open = self.open_file(fh)?;
        if !open.write {
            return Err(VfsError::BadDescriptor);
        }
        let file = self.shared_file(open.ino)?;
        file.write_at(offset, data).await?;
        // A write the manager made stable at once (a small file's bytes, no transaction
        // open) gave the file its new attributes: they are the inode's now. Else its size
        // here may have grown past what the layer holds (raised where it is handed out).
        let stable = !file.dirty().await;
        let attr = file.attr();
        let mut inodes = lock(&self.shared.inodes);
        if let Some(node) = inodes.get_mut(open.ino) {
            node.data_stamp = None;
            if stable {
                inodes.set_attr(attr);
            } else {
                inodes.touch(open.ino);
            }
        }
        drop(inodes);
        u32::try_from(data.len()).map_err(|_| VfsError::Invalid("a write over 4 GiB"))
    }

    /// `close` of a descriptor open for writing, and `fsync`: commits the
    /// file's writes (close-to-open: another client's next open sees them).
    pub async fn commit(&self, fh: u64) -> Result<()> {
        let open = self.open_file(fh)?;
        if !open.write {
            return Ok(());
        }
        let file = self.shared_file(open.ino)?;
        // Always flushed: a write that failed in the background is reported here.
        let expected = if file.dirty().await { vec![Change::Inode(open.ino)] } else { Vec::new() };
        self.making(expected, file.flush()).await?;
        let attr = file.attr();
        let mut inodes = lock(&self.shared.inodes);
        if let Some(node) = inodes.get_mut(open.ino) {
            // The client's data cache holds what was just committed.
            node.data_stamp = Some((attr.size, attr.mtime_ns));
            inodes.set_attr(attr);
        }
        Ok(())
    }

    /// `fsync`: commits the file's writes ([`commit`](Self::commit)), then
    /// has the manager make them — and every change it acknowledged before —
    /// durable against power loss (`SYNC`).
    pub async fn fsync(&self, fh: u64) -> Result<()> {
        self.commit(fh).await?;
        Ok(self.shared.fs.sync().await?)
    }

    /// `fsyncdir`, `syncfs`: every change the manager acknowledged so far
    /// made durable against power loss (`SYNC`).
    pub async fn sync(&self) -> Result<()> {
        Ok(self.shared.fs.sync().await?)
    }

    /// Closes open file `fh`; the last close of an inode commits what is
    /// left and removes the hidden name of a file unlinked while open.
    pub async fn release(&self, fh: u64) -> Result<()> {
        let open = lock(&self.shared.files).remove(&fh).ok_or(VfsError::BadDescriptor)?;
        let (file, hidden) = {
            let mut inodes = lock(&self.shared.inodes);
            match inodes.get_mut(open.ino) {
                Some(node) => {
                    node.opens = node.opens.saturating_sub(1);
                    if node.opens == 0 {
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
                    result = Err(e.into());
                }
            }
        }
        if let Some(hidden) = hidden {
            remove_hidden_name(&hidden).await;
        }
        lock(&self.shared.inodes).drop_if_unused(open.ino);
        result
    }

    /// `posix_fallocate`: the file is at least `offset + length` long
    /// afterwards (a size change at the manager; the drives allocate as data
    /// is written, so a later write can still find no space).
    pub async fn allocate(&self, cx: &FsClient, ino: Ino, fh: u64, offset: u64, length: u64) -> Result<()> {
        let end = offset.checked_add(length).ok_or(VfsError::Invalid("offset + length overflows"))?;
        let attr = self.getattr(cx, ino).await?;
        if end <= attr.size {
            return Ok(());
        }
        // Through a descriptor open for writing, as ftruncate (the owner's override).
        let open_writer = self.open_for_writing(fh);
        self.setattr(cx, ino, SetAttr { size: Some(end), open_writer, ..SetAttr::default() }).await.map(|_| ())
    }

    // ---------------------------------------------------------- directories

    /// Opens a cursor on directory `ino`.
    pub fn opendir(&self, ino: Ino) -> Result<u64> {
        let handle = self.handle(ino)?;
        let mut dirs = lock(&self.shared.dirs);
        if dirs.len() >= OPEN_DIRS_MAX {
            return Err(VfsError::TooManyOpen);
        }
        let fh = self.new_fh();
        dirs.insert(fh, Arc::new(tokio::sync::Mutex::new(DirCursor::new(handle))));
        Ok(fh)
    }

    /// Hands the entries of cursor `fh` from `offset` on to `add` — with
    /// the offset after each, `.` (0) and `..` (1) first — until `add` says
    /// it is full (returns `true`) or the directory ends. Pages are read
    /// from the manager as `cx`.
    pub async fn readdir(
        &self,
        cx: &FsClient,
        fh: u64,
        offset: u64,
        mut add: impl FnMut(u64, &DirItem) -> bool,
    ) -> Result<()> {
        let cursor = lock(&self.shared.dirs).get(&fh).cloned().ok_or(VfsError::BadDescriptor)?;
        let mut cursor = cursor.lock().await;
        let ino = cursor.ino();
        let mut at = offset;
        for (dot, name) in [(0, "."), (1, "..")] {
            if at == dot {
                let item = DirItem { name: name.into(), kind: FileKind::Dir, ino, entry: None };
                if add(dot + 1, &item) {
                    return Ok(());
                }
                at += 1;
            }
        }
        let seq = || lock(&self.shared.inodes).seq();
        while let Some((item, fetched)) = cursor.at(cx, at, seq).await? {
            let Some(item) = self.current(cx, item, fetched).await? else {
                // Removed since its page was read: left out (POSIX leaves it open).
                at += 1;
                continue;
            };
            if add(at + 1, &item) {
                break;
            }
            at += 1;
        }
        Ok(())
    }

    /// A listing entry whose page was asked for when the count of attribute
    /// changes was `fetched`, with the attributes the gateway may take now:
    /// those the layer learnt of since if it holds valid ones, else asked of
    /// the manager if it learnt of a change since (its own writes, commits
    /// and attribute changes, another client's change from the feed), else
    /// the page's; the size raised to what this layer has written and not
    /// committed. `None` if the inode is gone.
    async fn current(&self, cx: &FsClient, mut item: DirItem, fetched: u64) -> Result<Option<DirItem>> {
        let Some(entry) = item.entry.as_mut() else { return Ok(Some(item)) };
        let ino = entry.attr.ino;
        let ttl = self.attr_ttl();
        let newer = {
            let inodes = lock(&self.shared.inodes);
            inodes.get(ino).filter(|n| n.changed > fetched).map(|n| {
                let valid = n.attr_at.elapsed() < ttl;
                valid.then(|| n.attr.clone())
            })
        };
        match newer {
            None => {}
            Some(Some(attr)) => entry.attr = attr,
            Some(None) => {
                let asked = match self.getattr(cx, ino).await {
                    // No longer held: asked by the page's handle.
                    Err(VfsError::Stale(_)) => cx.getattr(entry.handle()).await.map(|e| e.attr).map_err(VfsError::from),
                    asked => asked,
                };
                match asked {
                    Ok(attr) => entry.attr = attr,
                    Err(e) if e.status() == Some(FsStatus::NotFound) => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
        }
        self.with_local_size(&mut entry.attr).await;
        Ok(Some(item))
    }

    /// Holds the inode a listing entry names (one more reference), as a
    /// lookup would (readdirplus); its attributes as the gateway shows them.
    pub async fn remember_listed(&self, e: &Entry) -> FileAttr {
        let mut attr = e.attr.clone();
        self.with_local_size(&mut attr).await;
        let e = Entry { attr, ..e.clone() };
        self.remember(&e)
    }

    /// Closes cursor `fh`.
    pub fn releasedir(&self, fh: u64) {
        lock(&self.shared.dirs).remove(&fh);
    }

    // ---------------------------------------------------------------- other

    /// Space on the drives in service and inodes held.
    pub async fn statfs(&self, cx: &FsClient) -> Result<StatFs> {
        let (inodes, _, drives) = cx.statfs().await?;
        let online = drives.iter().filter(|d| d.online);
        let (capacity, used) =
            online.fold((0u64, 0u64), |(c, u), d| (c.saturating_add(d.capacity_bytes), u.saturating_add(d.used_bytes)));
        Ok(StatFs { capacity_bytes: capacity, free_bytes: capacity.saturating_sub(used), inodes })
    }

    /// `access(2)` for `mask` (`R_OK` 4, `W_OK` 2, `X_OK` 1), checked against
    /// the manager's current attributes the way its permission rules check
    /// (root passes, but needs an `x` bit to execute).
    pub async fn access(&self, cx: &FsClient, ino: Ino, mask: u32) -> Result<()> {
        let handle = self.handle(ino)?;
        let attr = cx.getattr(handle).await?.attr;
        let want = mask & 7;
        if want == 0 {
            return Ok(());
        }
        let id = cx.identity();
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
            Err(VfsError::Denied)
        }
    }

    // ------------------------------------------------- extended attributes

    /// An extended attribute's value. `security.capability`, which the
    /// kernel asks before every write, is answered from the last answer
    /// while the change feed vouches for it (or, for an open file, while no
    /// manager answers), so writes cost no manager round trip.
    ///
    /// A `security.` or `trusted.` name of an inode a listing showed without
    /// extended attributes is `ENODATA` with no request while its
    /// attributes are valid: the manager answers `NO_XATTR` for those
    /// whoever asks (a `user.` name may be refused for permission instead,
    /// and other namespaces are `NOT_SUPPORTED`: those it is asked).
    pub async fn getxattr(&self, cx: &FsClient, ino: Ino, name: &str) -> Result<Vec<u8>> {
        let handle = self.handle(ino)?;
        if is_vouched_absent(name) && self.vouched_without_xattrs(ino) {
            return Err(VfsError::Refused(ENODATA));
        }
        if name != WRITE_CHECK_XATTR {
            return Ok(cx.getxattr(handle, name).await?);
        }
        let ttl = self.attr_ttl();
        let (cached, open) = {
            let inodes = lock(&self.shared.inodes);
            let node = inodes.get(ino);
            (node.and_then(|n| n.capability.clone()), node.is_some_and(|n| n.file.is_some()))
        };
        if let Some((answer, at)) = &cached {
            if at.elapsed() < ttl {
                return answer.clone().map_err(VfsError::Refused);
            }
        }
        let asked = if open {
            match self.unless_unreachable(cx.getxattr(handle, name)).await {
                Some(r) => r,
                // No manager answers: the open file's last answer does, so writes go on.
                None => match cached {
                    Some((answer, _)) => return answer.map_err(VfsError::Refused),
                    None => cx.getxattr(handle, name).await,
                },
            }
        } else {
            cx.getxattr(handle, name).await
        };
        let answer: Option<XattrAnswer> = match &asked {
            Ok(v) => Some(Ok(v.clone())),
            Err(e) if e.status() == Some(nasd_fs::FsStatus::NoXattr) => Some(Err(ENODATA)),
            Err(_) => None,
        };
        if let Some(answer) = answer {
            if let Some(node) = lock(&self.shared.inodes).get_mut(ino) {
                node.capability = Some((answer, Instant::now()));
            }
        }
        Ok(asked?)
    }

    /// The names of an inode's extended attributes.
    /// An inode a listing showed without extended attributes has none to
    /// list while its attributes are valid (listing needs no permission).
    pub async fn listxattr(&self, cx: &FsClient, ino: Ino) -> Result<Vec<String>> {
        let handle = self.handle(ino)?;
        if self.vouched_without_xattrs(ino) {
            return Ok(Vec::new());
        }
        Ok(cx.listxattr(handle).await?)
    }

    /// Whether a manager vouched that `ino` has no extended attributes, as
    /// recently as its cached attributes are still valid.
    fn vouched_without_xattrs(&self, ino: Ino) -> bool {
        let ttl = self.attr_ttl();
        let inodes = lock(&self.shared.inodes);
        inodes.get(ino).and_then(|n| n.no_xattrs_at).is_some_and(|at| at.elapsed() < ttl)
    }

    /// Sets an extended attribute.
    pub async fn setxattr(&self, cx: &FsClient, ino: Ino, name: &str, value: &[u8], mode: XattrMode) -> Result<()> {
        let handle = self.handle(ino)?;
        self.forget_xattr_answer(ino);
        let r = self.making(vec![Change::Inode(ino)], cx.setxattr(handle, name, value, mode)).await;
        self.forget_xattr_answer(ino);
        Ok(r?)
    }

    /// Removes an extended attribute.
    pub async fn removexattr(&self, cx: &FsClient, ino: Ino, name: &str) -> Result<()> {
        let handle = self.handle(ino)?;
        self.forget_xattr_answer(ino);
        let r = self.making(vec![Change::Inode(ino)], cx.removexattr(handle, name)).await;
        self.forget_xattr_answer(ino);
        Ok(r?)
    }

    fn forget_xattr_answer(&self, ino: Ino) {
        if let Some(node) = lock(&self.shared.inodes).get_mut(ino) {
            node.capability = None;
            node.no_xattrs_at = None;
        }
    }
}

/// Whether the manager answers `getxattr(name)` of an inode without
/// extended attributes with `NO_XATTR` whoever asks: a well-formed
/// `security.` name (anyone reads them) or `trusted.` name (hidden from all
/// but the superuser, who finds none).
fn is_vouched_absent(name: &str) -> bool {
    let rest = name.strip_prefix("security.").or_else(|| name.strip_prefix("trusted."));
    rest.is_some_and(|r| !r.is_empty()) && name.len() <= nasd_fs::XATTR_NAME_MAX && !name.contains('\0')
}

/// The attributes a gateway shows: the hidden name of a file unlinked while
/// open is not counted among its links.
fn shown(attr: &FileAttr, nlink_hidden: u32) -> FileAttr {
    FileAttr { nlink: attr.nlink.saturating_sub(nlink_hidden), ..attr.clone() }
}

/// The entry of a file just created (its handle and attributes).
fn entry_of(file: &File) -> Entry {
    let handle = file.handle();
    Entry {
        attr: file.attr(),
        handle_mac: handle.mac,
        site: handle.site,
        target: String::new(),
        access: None,
        no_xattrs: false,
    }
}
