//! The POSIX name space, written once over [`Backend`].
//!
//! Every public method is exactly one transaction: it checks everything it
//! needs inside the transaction and any error rolls the whole operation back.
//! Checks follow Linux's order (lookup needs search permission; then
//! existence; then write permission, the sticky bit and the kinds), so a
//! caller sees the same error a local file system would give.

use crate::acl::check;
use crate::backend::{Backend, Txn};
use crate::layouts::{nearest_layout, place_components, Placer};
use crate::perm::{self, check_sticky, owns, strip_sgid, R, S_ISGID, S_ISUID, W, X};
use crate::quotas;
use crate::types::{AcvIntent, Caller, DirEntry, Effects, Inode, SetAttrs};
use crate::{DIR_DEPTH_MAX, READDIR_ENTRIES_MAX};
use nasd_proto::fs::*;
use nasd_proto::layout::Layout;

/// The name space: POSIX semantics generic over the backend. Every method is
/// one transaction.
pub struct Namespace<B: Backend> {
    pub(crate) backend: B,
    /// [`DIR_DEPTH_MAX`], smaller in tests.
    pub(crate) dir_depth_max: usize,
    /// The small-file threshold new regular files get (0: none; [`crate::small`]).
    pub(crate) small_threshold: u32,
    /// How new inodes choose their routing site (`crate::routing`).
    pub(crate) sites: crate::routing::SitePolicy,
    /// Whether a change of a file's mode, owner or ACL revokes its
    /// capabilities (bumps its ACV): not where none are ever minted (a
    /// partition whose drives take PALs only).
    pub(crate) revokes_capabilities: bool,
}

/// Nanoseconds since the Unix epoch, now.
pub(crate) fn now_ns() -> i64 {
    i64::try_from(nasd_env::clock::system_ns()).unwrap_or(i64::MAX)
}

/// Reads an inode that must exist.
pub(crate) fn get(t: &mut dyn Txn, ino: Ino) -> Result<Inode, FsStatus> {
    t.get_inode(ino)?.ok_or(FsStatus::NotFound)
}

/// Reads an inode that must be a directory.
pub(crate) fn get_dir(t: &mut dyn Txn, ino: Ino) -> Result<Inode, FsStatus> {
    let dir = get(t, ino)?;
    if dir.attr.kind != FileKind::Dir {
        return Err(FsStatus::NotDir);
    }
    Ok(dir)
}

/// Reads a directory the caller may search.
fn searchable(t: &mut dyn Txn, caller: &Caller, ino: Ino) -> Result<Inode, FsStatus> {
    let dir = get_dir(t, ino)?;
    check(t, caller, &dir, X)?;
    Ok(dir)
}

/// The inode a name in `dir` refers to, if any.
pub(crate) fn child(t: &mut dyn Txn, dir: Ino, name: &str) -> Result<Option<Inode>, FsStatus> {
    match t.get_dirent(dir, name)? {
        None => Ok(None),
        Some(ino) => {
            let inode = t.get_inode(ino)?;
            assert!(inode.is_some(), "directory entry {dir}/{name} names missing inode {ino}");
            Ok(inode)
        }
    }
}

/// Adjusts a directory after an entry was added (+1) or removed (-1):
/// entry count, link count (subdirectories), mtime and ctime.
fn touch_dir(t: &mut dyn Txn, dir: Ino, dsize: i64, dnlink: i32, now: i64) -> Result<(), FsStatus> {
    let mut d = get_dir(t, dir)?;
    if dnlink > 0 && d.attr.nlink >= LINK_COUNT_MAX {
        return Err(FsStatus::TooManyLinks);
    }
    d.attr.size = d.attr.size.checked_add_signed(dsize).expect("directory entry count underflow");
    d.attr.nlink = d.attr.nlink.checked_add_signed(dnlink).expect("directory link count underflow");
    d.attr.mtime_ns = now;
    d.attr.ctime_ns = now;
    quotas::put(t, &mut d)
}

/// Bumps a regular file's ACV and records an intent for every component
/// object (the caller writes the inode). Nothing for inodes without
/// components.
pub(crate) fn revoke(t: &mut dyn Txn, inode: &mut Inode) -> Result<Vec<AcvIntent>, FsStatus> {
    if inode.components.is_empty() {
        return Ok(Vec::new());
    }
    inode.acv = inode.acv.checked_add(1).expect("access control version overflow");
    let intents: Vec<AcvIntent> = inode.objects().map(|object| AcvIntent { object, acv: inode.acv }).collect();
    for intent in &intents {
        t.put_acv_intent(intent)?;
    }
    Ok(intents)
}

/// Drops every component of a file whose last name is gone: its write
/// intent and stale ranges are forgotten, each object's pending ACV intent
/// too, and each object is doomed.
fn drop_components(t: &mut dyn Txn, inode: &Inode, fx: &mut Effects) -> Result<(), FsStatus> {
    let ino = inode.attr.ino;
    if let Some(intent) = t.intent_of_inode(ino)? {
        t.delete_intent(intent.txn)?;
    }
    t.delete_stale_ranges(ino, None)?;
    t.delete_components(ino)?;
    for object in inode.objects() {
        t.delete_acv_intent(&object, None)?;
        t.doom(&object)?;
        fx.doomed.push(object);
    }
    Ok(())
}

/// A fresh inode made by `caller` in directory `parent` (not yet stored).
fn fresh(
    t: &mut dyn Txn,
    caller: &Caller,
    parent: &Inode,
    kind: FileKind,
    mode: u32,
    now: i64,
    site: u8,
) -> Result<Inode, FsStatus> {
    let inherit = parent.attr.mode & S_ISGID != 0;
    let gid = if inherit { parent.attr.gid } else { caller.gid };
    let mut mode = mode & MODE_MASK;
    match kind {
        FileKind::Dir if inherit => mode |= S_ISGID,
        FileKind::File => mode = strip_sgid(caller, mode, gid),
        _ => {}
    }
    let nlink = if kind == FileKind::Dir { 2 } else { 1 };
    let qdir = quotas::tree_below(t, parent)?;
    let attr = FileAttr {
        ino: t.alloc_ino()?,
        kind,
        mode,
        nlink,
        uid: caller.uid,
        gid,
        size: 0,
        atime_ns: now,
        mtime_ns: now,
        ctime_ns: now,
        rdev: 0,
        allocated: 0,
    };
    Ok(Inode {
        attr,
        target: None,
        layout: None,
        components: Vec::new(),
        acv: 0,
        qdir,
        small_threshold: 0,
        site,
        data_bytes: 0,
    })
}

/// Stores a new inode and names it `name` in `parent`.
fn add_new(t: &mut dyn Txn, parent: Ino, name: &str, inode: &mut Inode, now: i64) -> Result<(), FsStatus> {
    quotas::check_room(t, None, inode)?;
    quotas::put(t, inode)?;
    let is_dir = inode.attr.kind == FileKind::Dir;
    if is_dir {
        t.set_dir_parent(inode.attr.ino, parent)?;
    }
    t.insert_dirent(parent, name, inode.attr.ino)?;
    touch_dir(t, parent, 1, i32::from(is_dir), now)
}

/// Drops one link of a non-directory: dooms its object at the last link,
/// otherwise revokes outstanding capabilities.
fn drop_link(t: &mut dyn Txn, mut inode: Inode, now: i64, fx: &mut Effects) -> Result<(), FsStatus> {
    assert!(inode.attr.nlink > 0, "inode {} has no links to drop", inode.attr.ino);
    inode.attr.nlink -= 1;
    if inode.attr.nlink == 0 {
        drop_components(t, &inode, fx)?;
        return quotas::remove(t, &inode);
    }
    inode.attr.ctime_ns = now;
    fx.revoke.extend(revoke(t, &mut inode)?);
    quotas::put(t, &mut inode)
}

/// Removes the name `dir/name` of `victim` (an empty directory or any other
/// inode) and what hangs on it.
fn drop_name(t: &mut dyn Txn, dir: Ino, name: &str, victim: Inode, now: i64, fx: &mut Effects) -> Result<(), FsStatus> {
    t.delete_dirent(dir, name)?;
    let is_dir = victim.attr.kind == FileKind::Dir;
    touch_dir(t, dir, -1, -i32::from(is_dir), now)?;
    if is_dir {
        quotas::remove(t, &victim)
    } else {
        drop_link(t, victim, now, fx)
    }
}

/// How deep directory `dir` lies below the root (the root: 0), found by
/// walking up its parent pointers at most `limit` steps: `TooDeep` if it lies
/// deeper than `limit` (or the pointers form a cycle, a broken invariant that
/// must not stop the manager either); `InvalidMove` if `avoid` is `dir` or
/// one of its ancestors.
fn depth_avoiding(t: &mut dyn Txn, dir: Ino, avoid: Option<Ino>, limit: usize) -> Result<usize, FsStatus> {
    let mut cur = dir;
    for depth in 0..=limit {
        if Some(cur) == avoid {
            return Err(FsStatus::InvalidMove);
        }
        if cur == ROOT_INO {
            return Ok(depth);
        }
        cur = t.dir_parent(cur)?.expect("directory without a parent pointer");
    }
    Err(FsStatus::TooDeep)
}

/// The kind rules for replacing `old` by `src`.
fn check_replace(t: &mut dyn Txn, src: &Inode, old: &Inode) -> Result<(), FsStatus> {
    match (src.attr.kind == FileKind::Dir, old.attr.kind == FileKind::Dir) {
        (true, false) => Err(FsStatus::NotDir),
        (false, true) => Err(FsStatus::IsDir),
        (true, true) if !t.dir_is_empty(old.attr.ino)? => Err(FsStatus::NotEmpty),
        _ => Ok(()),
    }
}

/// The request of one rename, for helpers.
struct Move<'a> {
    parent: Ino,
    name: &'a str,
    new_parent: Ino,
    new_name: &'a str,
}

impl<B: Backend> Namespace<B> {
    /// Opens the name space on `backend`, creating the root directory
    /// (ino 1, mode 0o755, uid 0, gid 0, layout `default_layout`: the file
    /// system's default) if absent. An existing root keeps its own layout.
    ///
    /// # Errors
    /// `InvalidArgument` if `default_layout` breaks a bound
    /// ([`Layout::validate`]); `Internal` if the backend fails.
    pub fn new(backend: B, default_layout: Layout) -> Result<Self, FsStatus> {
        if let Err(e) = default_layout.validate() {
            tracing::error!(error = %e, "the default layout is out of bounds");
            return Err(FsStatus::InvalidArgument);
        }
        backend.transact(|t| {
            if t.get_inode(ROOT_INO)?.is_some() {
                return Ok(());
            }
            let now = now_ns();
            let attr = FileAttr {
                ino: ROOT_INO,
                kind: FileKind::Dir,
                mode: 0o755,
                nlink: 2,
                uid: 0,
                gid: 0,
                size: 0,
                atime_ns: now,
                mtime_ns: now,
                ctime_ns: now,
                rdev: 0,
                allocated: 0,
            };
            let root = Inode {
                attr,
                target: None,
                layout: Some(default_layout),
                components: Vec::new(),
                acv: 0,
                qdir: 0,
                small_threshold: 0,
                site: 0,
                data_bytes: 0,
            };
            t.put_inode(&root)?;
            t.set_dir_parent(ROOT_INO, ROOT_INO)
        })?;
        Ok(Namespace {
            backend,
            dir_depth_max: DIR_DEPTH_MAX,
            small_threshold: 0,
            sites: crate::routing::SitePolicy::default(),
            revokes_capabilities: true,
        })
    }

    /// The same name space revoking capabilities on access changes or not:
    /// `false` where no capability is ever minted (the drives take PALs
    /// only), so a chmod, chown or ACL change bumps no ACV and leaves the
    /// drives no ACV to set — the new PAL is what takes the right away.
    pub fn with_capabilities(self, minted: bool) -> Self {
        Namespace { revokes_capabilities: minted, ..self }
    }

    /// The same name space with a smaller [`DIR_DEPTH_MAX`] (tests).
    #[cfg(test)]
    pub(crate) fn with_dir_depth_max(self, dir_depth_max: usize) -> Self {
        assert!(dir_depth_max > 0 && dir_depth_max <= DIR_DEPTH_MAX);
        Namespace { dir_depth_max, ..self }
    }

    /// Fails with `TooDeep` unless a new directory may be put in directory
    /// `parent`: it would lie at most [`DIR_DEPTH_MAX`] below the root.
    fn check_room_below(&self, t: &mut dyn Txn, parent: Ino) -> Result<(), FsStatus> {
        depth_avoiding(t, parent, None, self.dir_depth_max - 1).map(|_| ())
    }

    /// The backend (for maintenance and tests).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, the name space given up (a manager's restart, in tests:
    /// everything the name space knows is in the backend).
    pub fn into_backend(self) -> B {
        self.backend
    }

    /// Reads an inode. No permission is checked: the caller proves it reached
    /// the inode by name some other way (the manager: a file handle it made
    /// when a walk or lookup found the inode).
    ///
    /// # Errors
    /// `NotFound`.
    pub fn getattr(&self, ino: Ino) -> Result<Inode, FsStatus> {
        self.backend.read(|t| get(t, ino))
    }

    /// Looks a name up in a directory; needs search (x) permission on it.
    /// `.` is the directory itself and `..` its parent (the root's is the root).
    ///
    /// # Errors
    /// `NotFound`, `NotDir`, `PermissionDenied`, `InvalidName`, `NameTooLong`.
    pub fn lookup(&self, caller: &Caller, parent: Ino, name: &str) -> Result<Inode, FsStatus> {
        self.backend.read(|t| {
            let dir = searchable(t, caller, parent)?;
            match name {
                "." => Ok(dir),
                ".." => {
                    let up = t.dir_parent(parent)?.expect("directory without a parent pointer");
                    get(t, up)
                }
                _ => {
                    validate_name(name)?;
                    child(t, parent, name)?.ok_or(FsStatus::NotFound)
                }
            }
        })
    }

    /// Up to `limit` (at most [`READDIR_ENTRIES_MAX`]) entries of `dir` whose
    /// names sort after `after` (byte order), with their inodes. `.` and `..`
    /// are not listed. Needs read permission.
    ///
    /// # Errors
    /// `NotFound`, `NotDir`, `PermissionDenied`.
    pub fn readdir(&self, caller: &Caller, dir: Ino, after: &str, limit: usize) -> Result<Vec<DirEntry>, FsStatus> {
        self.readdir_searchable(caller, dir, after, limit).map(|(entries, _)| entries)
    }

    /// As [`Namespace::readdir`], and (in the same transaction) whether the
    /// caller may also search `dir`: POSIX needs search (x) permission to
    /// look an entry up or stat it, so without it a caller may be shown the
    /// names and kinds only.
    ///
    /// # Errors
    /// As [`Namespace::readdir`].
    pub fn readdir_searchable(
        &self,
        caller: &Caller,
        dir: Ino,
        after: &str,
        limit: usize,
    ) -> Result<(Vec<DirEntry>, bool), FsStatus> {
        self.backend.read(|t| {
            let d = get_dir(t, dir)?;
            check(t, caller, &d, R)?;
            let searchable = check(t, caller, &d, X).is_ok();
            Ok((t.list_dir(dir, after, limit.min(READDIR_ENTRIES_MAX))?, searchable))
        })
    }

    /// Makes a directory `name` in `parent` with permission bits `mode`.
    ///
    /// # Errors
    /// `NotFound`, `NotDir`, `PermissionDenied`, `Exists`, `TooManyLinks`,
    /// `InvalidName`, `NameTooLong`, `TooDeep` (`parent` is
    /// [`DIR_DEPTH_MAX`] below the root already).
    pub fn mkdir(&self, caller: &Caller, parent: Ino, name: &str, mode: u32) -> Result<Inode, FsStatus> {
        validate_name(name)?;
        self.backend.transact(|t| {
            let p = self.creatable(t, caller, parent, name)?;
            self.check_room_below(t, parent)?;
            let now = now_ns();
            let site = self.sites.site_for(&p, name, FileKind::Dir);
            let mut inode = fresh(t, caller, &p, FileKind::Dir, mode, now, site)?;
            add_new(t, parent, name, &mut inode, now)?;
            crate::acl::inherit(t, &p, &inode)?;
            Ok(inode)
        })
    }

    /// Checks that `caller` may add `name` to directory `parent` and that the
    /// name is free; returns the directory.
    fn creatable(&self, t: &mut dyn Txn, caller: &Caller, parent: Ino, name: &str) -> Result<Inode, FsStatus> {
        let p = searchable(t, caller, parent)?;
        if t.get_dirent(parent, name)?.is_some() {
            return Err(FsStatus::Exists);
        }
        check(t, caller, &p, W | X)?;
        Ok(p)
    }

    /// Creates a regular file. Its layout is `parent`'s effective layout
    /// ([`effective_layout`](Self::effective_layout)); `place` (the
    /// manager's placement policy) is called inside the transaction with
    /// that layout and must return `layout.components()` objects on distinct
    /// drives, taken from pools with [`take_pooled`](crate::take_pooled);
    /// they become the file's components, in order, state Ok. If the name
    /// exists: `exclusive` → `Exists`; a regular file is returned after
    /// checking write permission, with size set to 0 if `truncate` (the
    /// manager truncates the objects), and `place` is not called. Returns
    /// (inode, created).
    ///
    /// # Errors
    /// Whatever `place` fails with (the manager's placer: `NoSpace` when
    /// pools are empty or the cluster has too few drives; everything it took
    /// goes back with the rollback); `Internal` if `place` broke its contract
    /// (a wrong count, two objects on one drive, an object some file, pool
    /// or log holds), logged; `TooDeep` if the nearest ancestor with a
    /// layout is more than [`DIR_DEPTH_MAX`] levels up; `Exists` (also for an
    /// existing symlink: resolve it first), `IsDir`, `NotFound`, `NotDir`,
    /// `PermissionDenied`, `InvalidName`, `NameTooLong`.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &str,
        mode: u32,
        exclusive: bool,
        truncate: bool,
        place: &mut Placer<'_>,
    ) -> Result<(Inode, bool), FsStatus> {
        validate_name(name)?;
        self.backend.transact(|t| {
            let p = searchable(t, caller, parent)?;
            if let Some(existing) = child(t, parent, name)? {
                return open_existing(t, caller, existing, exclusive, truncate).map(|n| (n, false));
            }
            check(t, caller, &p, W | X)?;
            let layout = nearest_layout(t, &p, self.dir_depth_max)?;
            let now = now_ns();
            let site = self.sites.site_for(&p, name, FileKind::File);
            let mut inode = fresh(t, caller, &p, FileKind::File, mode, now, site)?;
            inode.layout = Some(layout);
            inode.components = place_components(t, &layout, place)?;
            inode.small_threshold = self.small_threshold;
            add_new(t, parent, name, &mut inode, now)?;
            crate::layouts::put_components(t, &inode)?;
            crate::acl::inherit(t, &p, &inode)?;
            Ok((inode, true))
        })
    }

    /// Makes a symbolic link `name` in `parent` pointing at `target`.
    ///
    /// # Errors
    /// `InvalidArgument` (empty target or NUL in it), `NameTooLong` (target
    /// longer than [`SYMLINK_TARGET_MAX`]), and as [`Namespace::mkdir`].
    pub fn symlink(&self, caller: &Caller, parent: Ino, name: &str, target: &str) -> Result<Inode, FsStatus> {
        validate_name(name)?;
        if target.is_empty() || target.contains('\0') {
            return Err(FsStatus::InvalidArgument);
        }
        if target.len() > SYMLINK_TARGET_MAX {
            return Err(FsStatus::NameTooLong);
        }
        self.backend.transact(|t| {
            let p = self.creatable(t, caller, parent, name)?;
            let now = now_ns();
            let site = self.sites.site_for(&p, name, FileKind::Symlink);
            let mut inode = fresh(t, caller, &p, FileKind::Symlink, 0o777, now, site)?;
            inode.attr.size = target.len() as u64;
            inode.target = Some(target.to_owned());
            add_new(t, parent, name, &mut inode, now)?;
            Ok(inode)
        })
    }

    /// Makes a special file `name` in `parent`: a FIFO, a socket, or a
    /// character or block device with number `rdev` (the superuser only, as
    /// Linux needs `CAP_MKNOD`). It has no data, no layout and no objects.
    ///
    /// # Errors
    /// `InvalidArgument` (a kind that is not special, or a device number
    /// for a FIFO or socket), `NotPermitted` (a device by anyone but the
    /// superuser), and as [`Namespace::mkdir`].
    pub fn mknod(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &str,
        kind: FileKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Inode, FsStatus> {
        validate_name(name)?;
        if !kind.is_special() || (rdev != 0 && !kind.is_device()) || mode & !MODE_MASK != 0 {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| {
            let p = self.creatable(t, caller, parent, name)?;
            if kind.is_device() && !caller.is_root() {
                return Err(FsStatus::NotPermitted);
            }
            let now = now_ns();
            let site = self.sites.site_for(&p, name, kind);
            let mut inode = fresh(t, caller, &p, kind, mode, now, site)?;
            inode.attr.rdev = rdev;
            add_new(t, parent, name, &mut inode, now)?;
            crate::acl::inherit(t, &p, &inode)?;
            Ok(inode)
        })
    }

    /// Adds the name `new_parent/new_name` for inode `ino` (a hard link).
    ///
    /// # Errors
    /// `NotPermitted` for directories, `TooManyLinks`, and as [`Namespace::mkdir`].
    pub fn link(&self, caller: &Caller, ino: Ino, new_parent: Ino, new_name: &str) -> Result<Inode, FsStatus> {
        validate_name(new_name)?;
        self.backend.transact(|t| {
            let mut inode = get(t, ino)?;
            if inode.attr.kind == FileKind::Dir {
                return Err(FsStatus::NotPermitted);
            }
            let dir = self.creatable(t, caller, new_parent, new_name)?;
            if inode.attr.nlink >= LINK_COUNT_MAX {
                return Err(FsStatus::TooManyLinks);
            }
            if quotas::tree_below(t, &dir)? != inode.qdir {
                return Err(FsStatus::CrossQuota);
            }
            let now = now_ns();
            inode.attr.nlink += 1;
            inode.attr.ctime_ns = now;
            quotas::put(t, &mut inode)?;
            t.insert_dirent(new_parent, new_name, ino)?;
            touch_dir(t, new_parent, 1, 0, now)?;
            Ok(inode)
        })
    }

    /// Checks that `caller` may remove the entry `dir/name`; returns it.
    fn removable(&self, t: &mut dyn Txn, caller: &Caller, dir: Ino, name: &str) -> Result<Inode, FsStatus> {
        let d = searchable(t, caller, dir)?;
        let victim = child(t, dir, name)?.ok_or(FsStatus::NotFound)?;
        check(t, caller, &d, W | X)?;
        check_sticky(caller, &d, &victim)?;
        Ok(victim)
    }

    /// Removes a non-directory name. A regular file's capabilities are
    /// revoked (an ACV intent) or, at its last link, its object is doomed.
    ///
    /// # Errors
    /// `IsDir`, `NotFound`, `NotDir`, `PermissionDenied`, `NotPermitted`
    /// (sticky directory), `InvalidName`, `NameTooLong`.
    pub fn unlink(&self, caller: &Caller, parent: Ino, name: &str) -> Result<Effects, FsStatus> {
        validate_name(name)?;
        self.backend.transact(|t| {
            let victim = self.removable(t, caller, parent, name)?;
            if victim.attr.kind == FileKind::Dir {
                return Err(FsStatus::IsDir);
            }
            let mut fx = Effects::default();
            drop_name(t, parent, name, victim, now_ns(), &mut fx)?;
            Ok(fx)
        })
    }

    /// Removes an empty directory.
    ///
    /// # Errors
    /// `NotDir` (also when the name is not a directory), `NotEmpty`, and as
    /// [`Namespace::unlink`].
    pub fn rmdir(&self, caller: &Caller, parent: Ino, name: &str) -> Result<Effects, FsStatus> {
        validate_name(name)?;
        self.backend.transact(|t| {
            let victim = self.removable(t, caller, parent, name)?;
            if victim.attr.kind != FileKind::Dir {
                return Err(FsStatus::NotDir);
            }
            if !t.dir_is_empty(victim.attr.ino)? {
                return Err(FsStatus::NotEmpty);
            }
            let mut fx = Effects::default();
            crate::acl::dissolve(t, &victim, self.revokes_capabilities, &mut fx)?;
            drop_name(t, parent, name, victim, now_ns(), &mut fx)?;
            Ok(fx)
        })
    }

    /// Renames `parent/name` to `new_parent/new_name` atomically, replacing
    /// an existing target by POSIX rules (file over file, directory over
    /// empty directory). Renaming onto the same inode does nothing. A moved
    /// directory's `..` and both parents' link counts follow it.
    ///
    /// # Errors
    /// `InvalidMove` (directory into its own subtree), `NotDir` (directory
    /// over non-directory), `IsDir` (non-directory over directory),
    /// `NotEmpty`, `NotPermitted` (sticky directories), `TooManyLinks`,
    /// `NotFound`, `PermissionDenied`, `InvalidName`, `NameTooLong`,
    /// `TooDeep` (a directory moved to a parent [`DIR_DEPTH_MAX`] below the
    /// root).
    pub fn rename(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &str,
        new_parent: Ino,
        new_name: &str,
    ) -> Result<Effects, FsStatus> {
        validate_name(name)?;
        validate_name(new_name)?;
        let mv = Move { parent, name, new_parent, new_name };
        self.backend.transact(|t| rename_in(t, caller, &mv, self.dir_depth_max, self.revokes_capabilities))
    }

    /// Changes mode (owner or root; a non-root caller outside the file's
    /// group loses set-group-id), owner (root only), group (the owner to a
    /// group it is in — its gid or a supplementary group —, or root), size
    /// (needs write; not for directories) and times
    /// (owner or root). ctime is updated. Changing mode, owner or group of a
    /// regular file bumps its ACV and returns the recorded intents, one per
    /// component object. Changing
    /// owner or group of a non-directory without setting the mode in the same
    /// call clears set-user-id and set-group-id.
    ///
    /// # Errors
    /// `NotPermitted`, `PermissionDenied` (size), `IsDir` (size of a
    /// directory), `InvalidArgument` (mode bits outside [`MODE_MASK`], size
    /// of a symlink), `NotFound`.
    pub fn setattr(&self, caller: &Caller, ino: Ino, set: &SetAttrs) -> Result<(Inode, Vec<AcvIntent>), FsStatus> {
        if set.mode.is_some_and(|m| m & !MODE_MASK != 0) {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| setattr_in(t, caller, ino, set, self.revokes_capabilities))
    }

    /// [`setattr`](Self::setattr) and the commit of write transaction `txn`
    /// on the same file, in one transaction: how the manager records a size
    /// change it made on the components under its own write transaction, so
    /// the new size is recorded exactly when the transaction counts as
    /// committed (never one without the other after a crash). The
    /// components listed in `missed` did not take the change: they become
    /// Stale with those ranges added, in the same transaction (as
    /// [`commit_write`](Self::commit_write) records a write's). A change to
    /// size 0 leaves every component that took it holding what the file
    /// holds, nothing: a Stale one among them becomes Ok, its ranges
    /// forgotten (on a layout without redundancy nothing else could ever
    /// make it current again).
    ///
    /// # Errors
    /// As [`setattr`](Self::setattr); `InvalidArgument` if `txn` is not an
    /// Open intent on `ino`, or for a component index the file lacks, more
    /// than [`COMMIT_STALE_MAX`](crate::COMMIT_STALE_MAX) ranges, an empty
    /// one or one past `u64::MAX`.
    pub fn setattr_committing(
        &self,
        caller: &Caller,
        ino: Ino,
        set: &SetAttrs,
        txn: u64,
        missed: &[(usize, crate::types::StaleRange)],
    ) -> Result<(Inode, Vec<AcvIntent>), FsStatus> {
        if set.mode.is_some_and(|m| m & !MODE_MASK != 0) || missed.len() > crate::COMMIT_STALE_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        crate::components::check_ranges(missed.iter().map(|(_, r)| r))?;
        self.backend.transact(|t| {
            let mut intent = t.get_intent(txn)?.filter(|i| i.ino == ino).ok_or(FsStatus::InvalidArgument)?;
            if intent.state != crate::types::IntentState::Open {
                return Err(FsStatus::InvalidArgument);
            }
            intent.state = crate::types::IntentState::Committed;
            t.put_intent(&intent)?;
            let changed = setattr_in(t, caller, ino, set, self.revokes_capabilities)?;
            let cut_to_nothing = set.size == Some(0);
            if missed.is_empty() && !cut_to_nothing {
                return Ok(changed);
            }
            let mut n = get(t, ino)?;
            if missed.iter().any(|&(idx, _)| idx >= n.components.len()) {
                return Err(FsStatus::InvalidArgument);
            }
            for &(idx, range) in missed {
                crate::components::mark_stale_in(t, &mut n, idx, &[range])?;
            }
            if cut_to_nothing {
                let everything = crate::types::StaleRange { offset: 0, length: u64::MAX };
                for idx in 0..n.components.len() {
                    let took_it = !missed.iter().any(|&(m, _)| m == idx);
                    if took_it && n.components[idx].state == nasd_proto::layout::ComponentState::Stale {
                        crate::components::forget_stale_in(t, &mut n, idx, &[everything])?;
                    }
                }
            }
            Ok((n, changed.1))
        })
    }

    /// Checks that [`setattr`](Self::setattr) with these arguments would be
    /// allowed now, changing nothing: every rule it applies, in its order.
    /// The manager calls it before changing a file's length on its drive, so
    /// a refused request does not cut the data first. Returns the inode as
    /// it is.
    ///
    /// # Errors
    /// As [`setattr`](Self::setattr).
    pub fn check_setattr(&self, caller: &Caller, ino: Ino, set: &SetAttrs) -> Result<Inode, FsStatus> {
        if set.mode.is_some_and(|m| m & !MODE_MASK != 0) {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.read(|t| {
            let n = get(t, ino)?;
            let mut changed = n.clone();
            apply_mode_owner(caller, &mut changed, set)?;
            apply_size_times(t, caller, &mut changed, set, now_ns())?;
            if changed.attr.size > n.attr.size {
                let grown = Inode { attr: FileAttr { size: changed.attr.size, ..n.attr.clone() }, ..n.clone() };
                quotas::check_room(t, Some(&n), &grown)?;
            }
            Ok(n)
        })
    }

    /// Permission check for open: read and/or write against the mode (root
    /// bypasses). Returns the inode.
    ///
    /// # Errors
    /// `IsDir` (a directory opened for writing), `PermissionDenied`, `NotFound`.
    pub fn check_access(
        &self,
        caller: &Caller,
        ino: Ino,
        want_read: bool,
        want_write: bool,
    ) -> Result<Inode, FsStatus> {
        self.backend.read(|t| {
            let n = get(t, ino)?;
            if want_write && n.attr.kind == FileKind::Dir {
                return Err(FsStatus::IsDir);
            }
            let want = if want_read { R } else { 0 } | if want_write { W } else { 0 };
            check(t, caller, &n, want)?;
            Ok(n)
        })
    }

    /// Records a regular file's size, stored bytes ([`Inode::data_bytes`])
    /// and mtime as measured on its drive after a writer closed (ctime
    /// becomes now): the manager's `COMMIT` with txn 0, which measures
    /// component 0 of a single-component file.
    ///
    /// # Errors
    /// `IsDir`, `InvalidArgument` (a symlink), `NotFound`.
    pub fn record_size(&self, ino: Ino, size: u64, data_bytes: u64, mtime_ns: i64) -> Result<Inode, FsStatus> {
        self.backend.transact(|t| {
            let mut n = get(t, ino)?;
            check_sizable(&n)?;
            let old = n.clone();
            // A drive's object holds no byte below a small-file threshold: a
            // length at or below it says nothing of the bytes kept there.
            let threshold = n.small_threshold;
            n.attr.size = if threshold > 0 && size <= threshold as u64 { old.attr.size } else { size };
            n.data_bytes = data_bytes;
            n.attr.mtime_ns = mtime_ns;
            n.attr.ctime_ns = now_ns();
            quotas::check_room(t, Some(&old), &n)?;
            quotas::put(t, &mut n)?;
            Ok(n)
        })
    }

    /// Bumps a regular file's ACV and records an intent for every component
    /// object (for revocations the manager decides on); returns them, in
    /// component order.
    ///
    /// # Errors
    /// `InvalidArgument` (no components: not a regular file), `NotFound`.
    pub fn bump_acv(&self, ino: Ino) -> Result<Vec<AcvIntent>, FsStatus> {
        self.backend.transact(|t| {
            let mut n = get(t, ino)?;
            let intents = revoke(t, &mut n)?;
            if intents.is_empty() {
                return Err(FsStatus::InvalidArgument);
            }
            t.put_inode(&n)?;
            Ok(intents)
        })
    }

    /// Totals for df: (number of inodes, total bytes of regular files as the
    /// manager knows them).
    ///
    /// # Errors
    /// `Internal`.
    pub fn usage(&self) -> Result<(u64, u64), FsStatus> {
        self.backend.read(|t| t.usage())
    }

    /// Regular files whose name ends with `suffix` (a client's temporary
    /// copy, `.NAME.XXXXXXXX.nasd-tmp`), last modified before
    /// `older_than_ns`, with no write transaction open: left by a client
    /// that died mid-copy. At most `limit`, as (directory, name).
    ///
    /// # Errors
    /// `Internal`.
    pub fn stale_temporaries(
        &self,
        suffix: &str,
        older_than_ns: i64,
        limit: usize,
    ) -> Result<Vec<(Ino, String)>, FsStatus> {
        const CHUNK: usize = 256;
        let mut found = Vec::new();
        let (mut after_dir, mut after_name) = (0, String::new());
        while found.len() < limit {
            let names = self.backend.read(|t| t.list_names_ending(suffix, after_dir, &after_name, CHUNK))?;
            let Some((dir, name, _)) = names.last() else { break };
            (after_dir, after_name) = (*dir, name.clone());
            let stale = self.backend.read(|t| {
                let mut stale = Vec::new();
                for (dir, name, child) in &names {
                    let Some(inode) = t.get_inode(*child)? else { continue };
                    let old = inode.attr.kind == FileKind::File && inode.attr.mtime_ns < older_than_ns;
                    if old && t.intent_of_inode(*child)?.is_none() {
                        stale.push((*dir, name.clone()));
                    }
                }
                Ok(stale)
            })?;
            found.extend(stale);
            if names.len() < CHUNK {
                break;
            }
        }
        found.truncate(limit);
        Ok(found)
    }
}

/// `setattr` inside its transaction.
fn setattr_in(
    t: &mut dyn Txn,
    caller: &Caller,
    ino: Ino,
    set: &SetAttrs,
    revokes: bool,
) -> Result<(Inode, Vec<AcvIntent>), FsStatus> {
    let mut n = get(t, ino)?;
    if *set == SetAttrs::default() {
        return Ok((n, Vec::new()));
    }
    let old = n.clone();
    let now = now_ns();
    apply_mode_owner(caller, &mut n, set)?;
    apply_size_times(t, caller, &mut n, set, now)?;
    n.attr.ctime_ns = now;
    if n.attr.size > old.attr.size {
        // Only growth is checked (an owner change by root moves usage unchecked).
        let grown = Inode { attr: FileAttr { uid: old.attr.uid, ..n.attr.clone() }, ..old.clone() };
        quotas::check_room(t, Some(&old), &grown)?;
    }
    let intents = if set.changes_access() && revokes { revoke(t, &mut n)? } else { Vec::new() };
    quotas::put(t, &mut n)?;
    if let Some(size) = set.size {
        crate::small::cut_small(t, &n, size)?;
    }
    Ok((n, intents))
}

/// `create` on an existing name.
fn open_existing(
    t: &mut dyn Txn,
    caller: &Caller,
    mut n: Inode,
    exclusive: bool,
    truncate: bool,
) -> Result<Inode, FsStatus> {
    if exclusive || n.attr.kind == FileKind::Symlink {
        return Err(FsStatus::Exists);
    }
    if n.attr.kind == FileKind::Dir {
        return Err(FsStatus::IsDir);
    }
    check(t, caller, &n, W)?;
    if truncate {
        let now = now_ns();
        n.attr.size = 0;
        n.data_bytes = 0;
        n.attr.mtime_ns = now;
        n.attr.ctime_ns = now;
        quotas::put(t, &mut n)?;
        crate::small::cut_small(t, &n, 0)?;
    }
    Ok(n)
}

/// `rename` inside its transaction; `dir_depth_max`: [`DIR_DEPTH_MAX`] or a test's.
fn rename_in(
    t: &mut dyn Txn,
    caller: &Caller,
    mv: &Move<'_>,
    dir_depth_max: usize,
    revokes: bool,
) -> Result<Effects, FsStatus> {
    let sp = searchable(t, caller, mv.parent)?;
    let dp = searchable(t, caller, mv.new_parent)?;
    let src = child(t, mv.parent, mv.name)?.ok_or(FsStatus::NotFound)?;
    let is_dir = src.attr.kind == FileKind::Dir;
    let crosses = mv.parent != mv.new_parent;
    // Within one parent a directory stays as deep as it is, and its parent cannot lie below it.
    if is_dir && crosses {
        depth_avoiding(t, mv.new_parent, Some(src.attr.ino), dir_depth_max - 1)?;
    }
    let old = child(t, mv.new_parent, mv.new_name)?;
    if old.as_ref().is_some_and(|o| o.attr.ino == src.attr.ino) {
        return Ok(Effects::default());
    }
    check(t, caller, &sp, W | X)?;
    check_sticky(caller, &sp, &src)?;
    check(t, caller, &dp, W | X)?;
    if let Some(old) = &old {
        check_sticky(caller, &dp, old)?;
        check_replace(t, &src, old)?;
    }
    if is_dir && crosses {
        check(t, caller, &src, W)?;
    }
    if quotas::tree_below(t, &dp)? != src.qdir {
        return Err(FsStatus::CrossQuota);
    }
    let now = now_ns();
    let mut fx = Effects::default();
    if let Some(old) = old {
        if old.attr.kind == FileKind::Dir {
            crate::acl::dissolve(t, &old, revokes, &mut fx)?;
        }
        drop_name(t, mv.new_parent, mv.new_name, old, now, &mut fx)?;
    }
    move_name(t, mv, src, now)?;
    Ok(fx)
}

/// Moves the (checked) entry; the target name is free.
fn move_name(t: &mut dyn Txn, mv: &Move<'_>, mut src: Inode, now: i64) -> Result<(), FsStatus> {
    let dir_moves = src.attr.kind == FileKind::Dir && mv.parent != mv.new_parent;
    t.delete_dirent(mv.parent, mv.name)?;
    t.insert_dirent(mv.new_parent, mv.new_name, src.attr.ino)?;
    touch_dir(t, mv.parent, -1, -i32::from(dir_moves), now)?;
    touch_dir(t, mv.new_parent, 1, i32::from(dir_moves), now)?;
    if dir_moves {
        t.set_dir_parent(src.attr.ino, mv.new_parent)?;
    }
    src.attr.ctime_ns = now;
    quotas::put(t, &mut src)
}

/// chmod and chown. Set-group-id is judged against the new group.
fn apply_mode_owner(caller: &Caller, n: &mut Inode, set: &SetAttrs) -> Result<(), FsStatus> {
    let uid_ok = |u: u32| caller.is_root() || (owns(caller, n) && u == n.attr.uid);
    let gid_ok = |g: u32| caller.is_root() || (owns(caller, n) && (caller.in_group(g) || g == n.attr.gid));
    let mode_ok = set.mode.is_none() || owns(caller, n);
    if set.uid.is_some_and(|u| !uid_ok(u)) || set.gid.is_some_and(|g| !gid_ok(g)) || !mode_ok {
        return Err(FsStatus::NotPermitted);
    }
    let chown = set.uid.is_some() || set.gid.is_some();
    n.attr.uid = set.uid.unwrap_or(n.attr.uid);
    n.attr.gid = set.gid.unwrap_or(n.attr.gid);
    match set.mode {
        Some(mode) => n.attr.mode = strip_sgid(caller, mode, n.attr.gid),
        None if chown && n.attr.kind != FileKind::Dir => n.attr.mode &= !(S_ISUID | S_ISGID),
        None => {}
    }
    Ok(())
}

pub(crate) fn check_sizable(n: &Inode) -> Result<(), FsStatus> {
    match n.attr.kind {
        FileKind::File => Ok(()),
        FileKind::Dir => Err(FsStatus::IsDir),
        _ => Err(FsStatus::InvalidArgument),
    }
}

fn apply_size_times(t: &mut dyn Txn, caller: &Caller, n: &mut Inode, set: &SetAttrs, now: i64) -> Result<(), FsStatus> {
    if let Some(size) = set.size {
        check_sizable(n)?;
        if !(set.open_writer && owns(caller, n)) {
            check(t, caller, n, perm::W)?;
        }
        n.attr.size = size;
        n.attr.mtime_ns = now;
        // The components' bytes as measured after the change, when the
        // manager made it; nothing is stored in an empty file.
        n.data_bytes = set.data_bytes.unwrap_or(n.data_bytes);
        if size == 0 {
            n.data_bytes = 0;
        }
        n.refresh_allocated();
    }
    if set.atime_ns.is_some() || set.mtime_ns.is_some() {
        if !owns(caller, n) {
            return Err(FsStatus::NotPermitted);
        }
        n.attr.atime_ns = set.atime_ns.unwrap_or(n.attr.atime_ns);
        n.attr.mtime_ns = set.mtime_ns.unwrap_or(n.attr.mtime_ns);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sqlite;

    const ROOT: Caller = Caller::ROOT;

    fn mkdir(ns: &Namespace<Sqlite>, parent: Ino, name: &str) -> Result<Ino, FsStatus> {
        ns.mkdir(&ROOT, parent, name, 0o755).map(|n| n.attr.ino)
    }

    #[test]
    fn directories_are_made_and_moved_at_most_dir_depth_max_deep() {
        let ns = Namespace::new(Sqlite::open_in_memory().unwrap(), Layout::SINGLE).unwrap().with_dir_depth_max(4);
        // /d1/d2/d3/d4: d4 lies at the limit.
        let mut d = vec![ROOT_INO];
        for i in 1..=4 {
            d.push(mkdir(&ns, d[i - 1], &format!("d{i}")).unwrap());
        }
        assert_eq!(mkdir(&ns, d[4], "d5"), Err(FsStatus::TooDeep));
        assert!(ns
            .create(&ROOT, d[4], "f", 0o644, true, false, &mut |_, _| Err(FsStatus::NoSpace))
            .is_err_and(|e| e != FsStatus::TooDeep));

        // A move to another parent is judged by where the directory lands.
        mkdir(&ns, ROOT_INO, "x").unwrap();
        assert_eq!(ns.rename(&ROOT, ROOT_INO, "x", d[4], "x").err(), Some(FsStatus::TooDeep));
        ns.rename(&ROOT, ROOT_INO, "x", d[3], "x").unwrap();
        assert_eq!(ns.rename(&ROOT, d[1], "d2", d[3], "d2").err(), Some(FsStatus::InvalidMove), "still checked");

        // A subtree moved whole can leave directories below the limit: they
        // take no new subdirectories and receive no moved ones, and a rename
        // inside one parent still works there.
        let y = mkdir(&ns, ROOT_INO, "y").unwrap();
        let z = mkdir(&ns, y, "z").unwrap();
        ns.rename(&ROOT, ROOT_INO, "y", d[3], "y").unwrap();
        assert_eq!(mkdir(&ns, z, "w"), Err(FsStatus::TooDeep), "z lies at depth 5");
        mkdir(&ns, ROOT_INO, "v").unwrap();
        assert_eq!(ns.rename(&ROOT, ROOT_INO, "v", z, "v").err(), Some(FsStatus::TooDeep));
        ns.rename(&ROOT, y, "z", y, "z2").unwrap();
        ns.rename(&ROOT, y, "z2", ROOT_INO, "z").unwrap();
        mkdir(&ns, z, "w").unwrap();
    }

    /// Parent pointers that loop (a broken invariant) must not take the
    /// manager down: the walk is bounded and ends in an error.
    #[test]
    fn a_parent_pointer_cycle_is_an_error_not_a_panic() {
        let ns = Namespace::new(Sqlite::open_in_memory().unwrap(), Layout::SINGLE).unwrap();
        let a = mkdir(&ns, ROOT_INO, "a").unwrap();
        let b = mkdir(&ns, a, "b").unwrap();
        ns.backend.transact(|t| t.set_dir_parent(a, b)).unwrap();
        assert_eq!(mkdir(&ns, b, "c"), Err(FsStatus::TooDeep));
        mkdir(&ns, ROOT_INO, "m").unwrap();
        assert_eq!(ns.rename(&ROOT, ROOT_INO, "m", b, "m").err(), Some(FsStatus::TooDeep));
    }
}
