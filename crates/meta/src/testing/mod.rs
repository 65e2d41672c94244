//! Test support for backends (feature `testing`): the conformance suite
//! every backend must pass ([`conformance`]), a fault-injecting backend
//! wrapper ([`Failing`]), whole-state snapshots ([`Snapshot`]) and the
//! structural invariants ([`check_invariants`]), and a real PostgreSQL
//! server for tests ([`PgServer`], from [`crate::pg_server`]).
//!
//! Everything here panics on a failed check; it is for tests only.

mod conformance;
mod conformance_acls;
mod conformance_files;
mod conformance_routing;
mod conformance_small;
mod failing;

pub use crate::pg_server::{PgServer, PgServerOptions, PASSWORD_ROLE};
#[cfg(test)]
pub(crate) use conformance::setup;
pub use conformance::{conformance, pool_placer};
pub use failing::Failing;

use crate::backend::{Backend, Txn};
use crate::types::{AcvIntent, DirEntry, DriveRecord, Inode, Intent, StaleRange};
use crate::{Namespace, BATCH_MAX, READDIR_ENTRIES_MAX, STALE_RANGES_MAX};
use nasd_proto::fs::{FileKind, FsStatus, Ino, ObjectRef, ROOT_INO};
use nasd_proto::layout::ComponentState;
use std::collections::{BTreeMap, BTreeSet};

/// Most inodes the test walkers visit (they are for small test trees).
const TEST_TREE_INODES_MAX: usize = 100_000;

/// Every entry of a directory, paging through [`Txn::list_dir`].
pub fn list_all(t: &mut dyn Txn, dir: Ino) -> Result<Vec<DirEntry>, FsStatus> {
    let mut all: Vec<DirEntry> = Vec::new();
    loop {
        let after = all.last().map(|e| e.name.clone()).unwrap_or_default();
        let page = t.list_dir(dir, &after, READDIR_ENTRIES_MAX)?;
        let done = page.len() < READDIR_ENTRIES_MAX;
        all.extend(page);
        assert!(all.len() <= TEST_TREE_INODES_MAX, "test directory too large");
        if done {
            return Ok(all);
        }
    }
}

/// Every name in the tree, as `(absolute path, inode)`, in depth-first order
/// (the root is `/`).
pub fn tree(t: &mut dyn Txn) -> Result<Vec<(String, Inode)>, FsStatus> {
    let root = t.get_inode(ROOT_INO)?.expect("no root directory");
    let mut out = vec![("/".to_owned(), root)];
    let mut stack = vec![(String::new(), ROOT_INO)];
    while let Some((path, dir)) = stack.pop() {
        for e in list_all(t, dir)? {
            let p = format!("{path}/{}", e.name);
            if e.inode.attr.kind == FileKind::Dir {
                stack.push((p.clone(), e.inode.attr.ino));
            }
            out.push((p, e.inode));
            assert!(out.len() <= TEST_TREE_INODES_MAX, "test tree too large");
        }
    }
    Ok(out)
}

/// Everything a name-space operation may change, for before/after comparisons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Every name with its inode (see [`tree`]).
    pub tree: Vec<(String, Inode)>,
    /// Pooled objects of every drive.
    pub pool: BTreeSet<ObjectRef>,
    /// Doomed objects.
    pub doomed: Vec<ObjectRef>,
    /// Pending ACV intents.
    pub intents: Vec<AcvIntent>,
    /// Write intents.
    pub write_intents: Vec<Intent>,
    /// Every stale component with its recorded ranges.
    pub stale: Vec<((Ino, usize), Vec<StaleRange>)>,
    /// The drive table.
    pub drives: Vec<DriveRecord>,
    /// The cluster map epoch setting.
    pub map_epoch: Option<Vec<u8>>,
    /// (inodes, file bytes).
    pub usage: (u64, u64),
}

/// Every write intent, paging through [`Txn::list_intents`].
pub fn all_intents(t: &mut dyn Txn) -> Result<Vec<Intent>, FsStatus> {
    let mut all: Vec<Intent> = Vec::new();
    loop {
        let page = t.list_intents(all.last().map_or(0, |i| i.txn), BATCH_MAX)?;
        let done = page.len() < BATCH_MAX;
        all.extend(page);
        assert!(all.len() <= TEST_TREE_INODES_MAX, "too many intents for a test");
        if done {
            return Ok(all);
        }
    }
}

/// Every stale component, paging through [`Txn::list_stale_components`].
pub fn all_stale(t: &mut dyn Txn) -> Result<Vec<(Ino, usize)>, FsStatus> {
    let mut all: Vec<(Ino, usize)> = Vec::new();
    loop {
        let page = t.list_stale_components(all.last().copied().unwrap_or((0, 0)), BATCH_MAX)?;
        let done = page.len() < BATCH_MAX;
        all.extend(page);
        assert!(all.len() <= TEST_TREE_INODES_MAX, "too many stale components for a test");
        if done {
            return Ok(all);
        }
    }
}

/// Takes a [`Snapshot`] in one read transaction.
pub fn snapshot<B: Backend>(ns: &Namespace<B>) -> Snapshot {
    ns.backend()
        .read(|t| {
            let mut pool = BTreeSet::new();
            for d in t.list_drives()? {
                pool.extend(t.pool_objects(d.drive)?);
            }
            let mut stale = Vec::new();
            for (ino, idx) in all_stale(t)? {
                stale.push(((ino, idx), t.get_stale_ranges(ino, idx)?));
            }
            Ok(Snapshot {
                tree: tree(t)?,
                pool,
                doomed: t.list_doomed(None, BATCH_MAX)?,
                intents: t.list_acv_intents(None, BATCH_MAX)?,
                write_intents: all_intents(t)?,
                stale,
                drives: t.list_drives()?,
                map_epoch: t.get_setting("map_epoch")?,
                usage: t.usage()?,
            })
        })
        .expect("snapshot")
}

/// Checks the structural invariants of the whole name space: directory link
/// counts are 2 + subdirectories and sizes their entry counts; every
/// directory's parent pointer names the directory holding it; every other
/// inode's link count equals the number of names it has; every inode is
/// reachable (the inode count matches); symlinks' sizes are their target
/// lengths; only regular files have components, exactly as many as their
/// layout names, on distinct drives; the root has a layout, symlinks none;
/// only Stale components have stale ranges (disjoint, ascending, non-empty,
/// at most [`STALE_RANGES_MAX`]); every write intent names a reachable
/// regular file, at most one each; no object is held twice across files'
/// components, the pool and the doomed table; every quota's usage is what
/// the inodes it counts use.
pub fn check_invariants<B: Backend>(ns: &Namespace<B>) {
    ns.backend().read(check_invariants_in).expect("invariant check failed to read");
}

fn check_invariants_in(t: &mut dyn Txn) -> Result<(), FsStatus> {
    let names = tree(t)?;
    let mut links: BTreeMap<Ino, (u32, Inode)> = BTreeMap::new();
    for (path, inode) in &names {
        check_inode_shape(t, path, inode)?;
        links.entry(inode.attr.ino).or_insert((0, inode.clone())).0 += 1;
    }
    for (count, inode) in links.values() {
        if inode.attr.kind != FileKind::Dir {
            assert_eq!(inode.attr.nlink, *count, "link count of {inode:?}");
        }
    }
    let file_bytes = links.values().filter(|(_, n)| n.attr.kind == FileKind::File).map(|(_, n)| n.allocated()).sum();
    for (_, n) in links.values() {
        assert_eq!(n.attr.allocated, n.allocated(), "stored allocation of {n:?}");
    }
    assert_eq!(t.usage()?, (links.len() as u64, file_bytes), "unreachable inodes exist (or usage is wrong)");
    assert!(links[&ROOT_INO].1.layout.is_some(), "the root has no layout");
    check_stale(t, &links)?;
    let mut intent_inos = BTreeSet::new();
    for i in all_intents(t)? {
        assert!(intent_inos.insert(i.ino), "two write intents for inode {}", i.ino);
        let kind = links.get(&i.ino).map(|(_, n)| n.attr.kind);
        assert_eq!(kind, Some(FileKind::File), "write intent {i:?} names no reachable regular file");
    }
    check_quotas(t, &links)?;
    check_objects(t, links.values().flat_map(|(_, n)| n.objects()))
}

/// A file's small-file bytes fit its threshold and size; bytes staged for
/// it belong to its write transaction, which is not committed (a commit
/// installs them); nothing of either without a threshold.
fn check_small(t: &mut dyn Txn, path: &str, inode: &Inode) -> Result<(), FsStatus> {
    let (ino, threshold) = (inode.attr.ino, u64::from(inode.small_threshold));
    let small = t.get_small(ino)?;
    let staged = t.get_staged(ino)?;
    if threshold == 0 {
        assert!(small.is_none() && staged.is_none(), "{path}: small-file bytes without a threshold");
        return Ok(());
    }
    assert_eq!(inode.attr.kind, FileKind::File, "{path}: a small-file threshold on a {:?}", inode.attr.kind);
    if let Some(b) = small {
        assert!(b.len() as u64 <= threshold.min(inode.attr.size), "{path}: {} small-file bytes", b.len());
    }
    if let Some((txn, b)) = staged {
        assert!(b.len() as u64 <= threshold, "{path}: {} staged bytes", b.len());
        let intent = t.intent_of_inode(ino)?;
        assert!(
            intent.is_some_and(|i| i.txn == txn && i.state != crate::IntentState::Committed),
            "{path}: bytes staged by transaction {txn}, which is not the file's open one"
        );
    }
    Ok(())
}

/// Every quota's usage is what the inodes it counts use; every inode's
/// tree is a directory with a quota (or none).
fn check_quotas(t: &mut dyn Txn, links: &BTreeMap<Ino, (u32, Inode)>) -> Result<(), FsStatus> {
    for (_, n) in links.values() {
        if n.qdir != 0 {
            let q = t.get_quota(crate::QuotaSubject::Dir(n.qdir))?;
            assert!(q.is_some(), "inode {} counted by directory {}, which has no quota", n.attr.ino, n.qdir);
        }
    }
    for q in t.list_quotas()? {
        let counted = links.values().map(|(_, n)| n).filter(|n| match q.subject {
            crate::QuotaSubject::User(uid) => n.attr.uid == uid,
            crate::QuotaSubject::Dir(d) => n.qdir == d,
        });
        let (bytes, files) = counted
            .fold((0u64, 0u64), |(b, f), n| (b + if n.attr.kind == FileKind::File { n.allocated() } else { 0 }, f + 1));
        assert_eq!((q.bytes_used, q.files_used), (bytes, files), "usage of {:?}", q.subject);
    }
    Ok(())
}

/// Stale ranges exist only for Stale components and are well formed; the
/// stale listing matches the inodes.
fn check_stale(t: &mut dyn Txn, links: &BTreeMap<Ino, (u32, Inode)>) -> Result<(), FsStatus> {
    let mut stale = Vec::new();
    for (ino, (_, n)) in links {
        for (idx, c) in n.components.iter().enumerate() {
            let ranges = t.get_stale_ranges(*ino, idx)?;
            if c.state == ComponentState::Stale {
                stale.push((*ino, idx));
            } else {
                assert!(ranges.is_empty(), "inode {ino} component {idx} is {:?} with stale ranges", c.state);
            }
            assert!(ranges.len() <= STALE_RANGES_MAX, "inode {ino} component {idx}: too many ranges");
            assert!(ranges.iter().all(|r| r.length > 0), "inode {ino} component {idx}: an empty range");
            assert!(ranges.windows(2).all(|w| w[0].end() < w[1].offset), "inode {ino}/{idx}: ranges not disjoint");
        }
    }
    assert_eq!(all_stale(t)?, stale, "stale component listing");
    let degraded = links.values().filter(|(_, n)| n.components.iter().any(|c| c.state != ComponentState::Ok)).count();
    assert_eq!(t.count_degraded()?, degraded as u64, "degraded file count");
    Ok(())
}

fn check_inode_shape(t: &mut dyn Txn, path: &str, inode: &Inode) -> Result<(), FsStatus> {
    let a = &inode.attr;
    check_small(t, path, inode)?;
    match (a.kind, &inode.layout) {
        (FileKind::File, Some(layout)) => {
            assert_eq!(inode.components.len(), layout.components(), "{path}: components of layout {layout}");
            let drives: BTreeSet<u32> = inode.objects().map(|o| o.drive).collect();
            assert_eq!(drives.len(), inode.components.len(), "{path}: two components on one drive");
            for c in &inode.components {
                assert_ne!(c.state, ComponentState::Down, "{path}: Down is never stored");
            }
        }
        (FileKind::File, None) => panic!("{path}: a regular file without a layout"),
        (FileKind::Symlink, Some(_)) => panic!("{path}: a symlink with a layout"),
        (kind, Some(_)) if kind.is_special() => panic!("{path}: a special file with a layout"),
        _ => assert!(inode.components.is_empty(), "{path}: components of a non-file"),
    }
    assert_eq!(inode.target.is_some(), a.kind == FileKind::Symlink, "{path}: target iff symlink");
    assert!(a.rdev == 0 || a.kind.is_device(), "{path}: a device number on a non-device");
    if a.kind.is_special() {
        assert_eq!(a.size, 0, "{path}: a special file's size");
    }
    if let Some(target) = &inode.target {
        assert_eq!(a.size, target.len() as u64, "{path}: symlink size");
    }
    if a.kind != FileKind::Dir {
        assert_eq!(t.dir_parent(a.ino)?, None, "{path}: non-directory has a parent pointer");
        return Ok(());
    }
    let entries = list_all(t, a.ino)?;
    let subdirs = entries.iter().filter(|e| e.inode.attr.kind == FileKind::Dir).count() as u32;
    assert_eq!(a.nlink, 2 + subdirs, "{path}: directory link count");
    assert_eq!(a.size, entries.len() as u64, "{path}: directory size");
    assert_eq!(t.dir_is_empty(a.ino)?, entries.is_empty(), "{path}: emptiness");
    for e in entries.iter().filter(|e| e.inode.attr.kind == FileKind::Dir) {
        assert_eq!(t.dir_parent(e.inode.attr.ino)?, Some(a.ino), "{path}/{}: parent pointer", e.name);
    }
    Ok(())
}

fn check_objects(t: &mut dyn Txn, files: impl Iterator<Item = ObjectRef>) -> Result<(), FsStatus> {
    let mut seen = BTreeSet::new();
    let mut place = |o: ObjectRef, what: &str| assert!(seen.insert(o), "object {o:?} held twice ({what})");
    let files: Vec<ObjectRef> = files.collect();
    for o in &files {
        place(*o, "file");
    }
    for d in t.list_drives()? {
        let mut listed = t.file_objects(d.drive)?;
        listed.sort();
        let mut reachable: Vec<ObjectRef> = files.iter().copied().filter(|o| o.drive == d.drive).collect();
        reachable.sort();
        assert_eq!(listed, reachable, "drive {}: file objects", d.drive);
        t.pool_objects(d.drive)?.into_iter().for_each(|o| place(o, "pool"));
        t.doomed_objects(d.drive)?.into_iter().for_each(|o| place(o, "doomed"));
    }
    Ok(())
}
