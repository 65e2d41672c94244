//! Test support for backends (feature `testing`): the conformance suite
//! every backend must pass ([`conformance`]), a fault-injecting backend
//! wrapper ([`Failing`]), whole-state snapshots ([`Snapshot`]) and the
//! structural invariants ([`check_invariants`]).
//!
//! Everything here panics on a failed check; it is for tests only.

mod conformance;
mod failing;

pub use conformance::conformance;
pub use failing::Failing;

use crate::backend::{Backend, Txn};
use crate::types::{AcvIntent, DirEntry, Inode};
use crate::{Namespace, BATCH_MAX, READDIR_ENTRIES_MAX};
use nasd_proto::fs::{FileKind, FsStatus, Ino, ObjectRef, ROOT_INO};
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
    /// (inodes, file bytes).
    pub usage: (u64, u64),
}

/// Takes a [`Snapshot`] in one read transaction.
pub fn snapshot<B: Backend>(ns: &Namespace<B>) -> Snapshot {
    ns.backend()
        .read(|t| {
            let mut pool = BTreeSet::new();
            for d in t.list_drives()? {
                pool.extend(t.pool_objects(d.drive)?);
            }
            Ok(Snapshot {
                tree: tree(t)?,
                pool,
                doomed: t.list_doomed(BATCH_MAX)?,
                intents: t.list_acv_intents(BATCH_MAX)?,
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
/// lengths; only regular files have objects; no object is held twice
/// across files, the pool and the doomed table.
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
    let file_bytes = links.values().filter(|(_, n)| n.attr.kind == FileKind::File).map(|(_, n)| n.attr.size).sum();
    assert_eq!(t.usage()?, (links.len() as u64, file_bytes), "unreachable inodes exist (or usage is wrong)");
    check_objects(t, links.values().filter_map(|(_, n)| n.object))
}

fn check_inode_shape(t: &mut dyn Txn, path: &str, inode: &Inode) -> Result<(), FsStatus> {
    let a = &inode.attr;
    assert_eq!(inode.object.is_some(), a.kind == FileKind::File, "{path}: object iff regular file");
    assert_eq!(inode.target.is_some(), a.kind == FileKind::Symlink, "{path}: target iff symlink");
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
