//! The conformance suite: the name space's semantics, run against any backend.

use super::conformance_acls as acls;
use super::conformance_files as files;
use super::{check_invariants, snapshot, Failing};
use crate::backend::{Backend, Txn};
use crate::types::{AcvIntent, Caller, DriveRecord, Effects, Inode, Quota, SetAttrs, StaleRange, User};
use crate::{take_pooled, Namespace, BATCH_MAX, READDIR_ENTRIES_MAX};
use nasd_proto::fs::*;
use nasd_proto::layout::{ComponentState, Layout};
use nasd_proto::manager::DriveState;
use std::collections::BTreeSet;

pub(super) const ALICE: Caller = Caller { uid: 1000, gid: 100, groups: Vec::new(), role: 0 };
/// In ALICE's group.
pub(super) const BOB: Caller = Caller { uid: 1001, gid: 100, groups: Vec::new(), role: 0 };
/// In neither.
pub(super) const CAROL: Caller = Caller { uid: 1002, gid: 200, groups: Vec::new(), role: 0 };
pub(super) const ROOT: Caller = Caller::ROOT;
pub(super) const PARTITION: u64 = 7;
/// Objects pooled on drive 1 by [`setup`].
pub(super) const POOLED: u64 = 32;
/// Drives [`setup`] adds with [`WIDE_POOLED`] objects pooled on each, for
/// layouts of several components.
pub(super) const WIDE: [u32; 4] = [3, 4, 5, 6];
/// Objects pooled on each of [`WIDE`] (ids 500..).
pub(super) const WIDE_POOLED: u64 = 16;

type Case<B> = (&'static str, fn(&Namespace<B>));

/// Runs every conformance case, each on a fresh backend from `make`, and
/// checks the structural invariants after each. Panics on the first failure,
/// naming the case.
pub fn conformance<B: Backend>(make: impl Fn() -> B) {
    for (name, case) in cases::<B>() {
        eprintln!("conformance case: {name}");
        let ns = Namespace::new(make(), Layout::SINGLE).expect("open name space");
        setup(&ns);
        case(&ns);
        check_invariants(&ns);
    }
    super::conformance_small::small_files(&make);
    eprintln!("conformance case: reopen");
    files::reopen(&make);
    eprintln!("conformance case: rollback");
    rollback(Namespace::new(Failing::new(make()), Layout::SINGLE).expect("open name space"));
}

fn cases<B: Backend>() -> Vec<Case<B>> {
    vec![
        ("root", root),
        ("mkdir", mkdir_case),
        ("create", create_case),
        ("create_existing", create_existing),
        ("pool_exhaustion", pool_exhaustion),
        ("symlink", symlink_case),
        ("readdir", readdir_case),
        ("permission_matrix", permission_matrix),
        ("directory_permissions", directory_permissions),
        ("setgid_inheritance", setgid_inheritance),
        ("supplementary_groups", supplementary_groups),
        ("extended_attributes", extended_attributes),
        ("special_files", special_files),
        ("open_writer_truncates", open_writer_truncates),
        ("stale_temporaries", stale_temporaries),
        ("manager_writer", manager_writer),
        ("quotas", quotas),
        ("hard_links", hard_links),
        ("unlink_rmdir", unlink_rmdir),
        ("rename_same_dir", rename_same_dir),
        ("rename_replace", rename_replace),
        ("rename_kinds", rename_kinds),
        ("rename_cross_dir", rename_cross_dir),
        ("rename_into_subtree", rename_into_subtree),
        ("rename_same_inode", rename_same_inode),
        ("rename_permissions", rename_permissions),
        ("rollback_mid_way", rollback_mid_way),
        ("sticky", sticky),
        ("walk", walk_case),
        ("walk_symlinks", walk_symlinks),
        ("symlink_loops", symlink_loops),
        ("chmod_chown", chmod_chown),
        ("truncate_utimes", truncate_utimes),
        ("acv_intents", acv_intents),
        ("record_size_usage", record_size_usage),
        ("pool_and_known_objects", pool_and_known_objects),
        ("doomed_log", doomed_log),
        ("leases", leases),
        ("reservations", reservations),
        ("users", users),
        ("drives", drives),
        ("settings", settings),
        ("inode_numbers", inode_numbers),
        ("concurrency", concurrency),
        ("layout_inheritance", files::layout_inheritance),
        ("set_layout_directories", files::set_layout_directories),
        ("set_layout_files", files::set_layout_files),
        ("placement", files::placement),
        ("placement_refusals", files::placement_refusals),
        ("write_intents", files::write_intents),
        ("write_intent_permissions", files::write_intent_permissions),
        ("commit_rules", files::commit_rules),
        ("stale_marking", files::stale_marking),
        ("size_change_missed", files::size_change_missed),
        ("replace_component", files::replace_component),
        ("component_queries", files::component_queries),
        ("multi_component_revocation", files::multi_component_revocation),
        ("multi_component_removal", files::multi_component_removal),
        ("drive_state_and_epoch", files::drive_state_and_epoch),
        ("acl_grants_and_revokes", acls::acl_grants_and_revokes),
        ("acl_rules", acls::acl_rules),
        ("acl_inheritance", acls::acl_inheritance),
        ("routing_table", super::conformance_routing::routing_table),
        ("routing_sites", super::conformance_routing::routing_sites),
        ("acl_roles_and_undelivered_pals", acls::acl_roles_and_undelivered_pals),
        ("acl_shared_collections", acls::acl_shared_collections),
    ]
}

// ---- helpers ----

pub(super) fn obj(drive: u32, object: u64) -> ObjectRef {
    ObjectRef { drive, partition: PARTITION, object }
}

pub(super) fn drive_rec(drive: u32) -> DriveRecord {
    DriveRecord {
        drive,
        drive_id: [drive as u8; 16],
        addr: format!("127.0.0.1:{}", 7000 + drive),
        partition: PARTITION,
        sealed_keys: vec![drive as u8; 48],
        capacity_bytes: 1 << 30,
        failure_domain: String::new(),
        state: DriveState::In,
    }
}

/// Drives 1 and 2 and [`WIDE`]; [`POOLED`] objects pooled on drive 1 (ids
/// 100..), [`WIDE_POOLED`] on each of [`WIDE`] (ids 500..), none on drive 2.
pub(crate) fn setup<B: Backend>(ns: &Namespace<B>) {
    ns.add_drive(&drive_rec(1)).unwrap();
    ns.add_drive(&drive_rec(2)).unwrap();
    let objects: Vec<ObjectRef> = (100..100 + POOLED).map(|o| obj(1, o)).collect();
    ns.pool_add(&objects).unwrap();
    for d in WIDE {
        ns.add_drive(&drive_rec(d)).unwrap();
        let objects: Vec<ObjectRef> = (500..500 + WIDE_POOLED).map(|o| obj(d, o)).collect();
        ns.pool_add(&objects).unwrap();
    }
}

/// A placement policy for tests: one pooled object from each of the first
/// `layout.components()` drives of `drives` (in that order) whose pool has
/// one; `NoSpace` if fewer have. With [`Layout::SINGLE`]: the first drive
/// with a pooled object.
pub fn pool_placer(drives: &[u32]) -> impl FnMut(&Layout, &mut dyn Txn) -> Result<Vec<ObjectRef>, FsStatus> {
    let drives = drives.to_vec();
    move |layout, t| {
        let mut placed = Vec::with_capacity(layout.components());
        for &d in &drives {
            if placed.len() == layout.components() {
                break;
            }
            placed.extend(take_pooled(t, d)?);
        }
        if placed.len() < layout.components() {
            return Err(FsStatus::NoSpace);
        }
        Ok(placed)
    }
}

/// The one component object of a single-component file.
pub(super) fn single(n: &Inode) -> ObjectRef {
    assert_eq!(n.layout, Some(Layout::SINGLE), "{n:?}");
    assert_eq!(n.components.len(), 1, "{n:?}");
    n.components[0].object
}

pub(super) fn split(path: &str) -> (&str, &str) {
    let i = path.rfind('/').expect("absolute path");
    (if i == 0 { "/" } else { &path[..i] }, &path[i + 1..])
}

/// Resolves `path` as root without following a final link.
pub(super) fn at<B: Backend>(ns: &Namespace<B>, path: &str) -> Result<Inode, FsStatus> {
    ns.walk(&ROOT, path, false)
}

pub(super) fn ino<B: Backend>(ns: &Namespace<B>, path: &str) -> Ino {
    at(ns, path).unwrap_or_else(|e| panic!("{path}: {e:?}")).attr.ino
}

pub(super) fn parent<B: Backend>(ns: &Namespace<B>, path: &str) -> (Ino, String) {
    let (dir, name) = split(path);
    (ino(ns, dir), name.to_owned())
}

pub(super) fn mkdir<B: Backend>(ns: &Namespace<B>, who: &Caller, path: &str, mode: u32) -> Result<Inode, FsStatus> {
    let (p, name) = parent(ns, path);
    ns.mkdir(who, p, &name, mode)
}

pub(super) fn create<B: Backend>(ns: &Namespace<B>, who: &Caller, path: &str, mode: u32) -> Result<Inode, FsStatus> {
    let (p, name) = parent(ns, path);
    ns.create(who, p, &name, mode, true, false, &mut pool_placer(&[1])).map(|(n, created)| {
        assert!(created);
        n
    })
}

pub(super) fn symlink<B: Backend>(ns: &Namespace<B>, path: &str, target: &str) -> Result<Inode, FsStatus> {
    let (p, name) = parent(ns, path);
    ns.symlink(&ROOT, p, &name, target)
}

pub(super) fn unlink<B: Backend>(ns: &Namespace<B>, who: &Caller, path: &str) -> Result<Effects, FsStatus> {
    let (p, name) = parent(ns, path);
    ns.unlink(who, p, &name)
}

pub(super) fn rmdir<B: Backend>(ns: &Namespace<B>, who: &Caller, path: &str) -> Result<(), FsStatus> {
    let (p, name) = parent(ns, path);
    ns.rmdir(who, p, &name).map(|_| ())
}

pub(super) fn rename<B: Backend>(ns: &Namespace<B>, who: &Caller, from: &str, to: &str) -> Result<Effects, FsStatus> {
    let (p, name) = parent(ns, from);
    let (np, new_name) = parent(ns, to);
    ns.rename(who, p, &name, np, &new_name)
}

pub(super) fn link<B: Backend>(ns: &Namespace<B>, from: &str, to: &str) -> Result<Inode, FsStatus> {
    let (np, new_name) = parent(ns, to);
    ns.link(&ROOT, ino(ns, from), np, &new_name)
}

/// Gives `path` to `who` with `mode`.
pub(super) fn own<B: Backend>(ns: &Namespace<B>, path: &str, who: &Caller, mode: u32) {
    let set = SetAttrs { mode: Some(mode), uid: Some(who.uid), gid: Some(who.gid), ..SetAttrs::default() };
    ns.setattr(&ROOT, ino(ns, path), &set).unwrap();
}

pub(super) fn set_times<B: Backend>(ns: &Namespace<B>, path: &str, t: i64) {
    let set = SetAttrs { atime_ns: Some(t), mtime_ns: Some(t), ..SetAttrs::default() };
    ns.setattr(&ROOT, ino(ns, path), &set).unwrap();
}

pub(super) fn missing<B: Backend>(ns: &Namespace<B>, path: &str) {
    assert_eq!(at(ns, path).err(), Some(FsStatus::NotFound), "{path} should be gone");
}

// ---- cases ----

fn root<B: Backend>(ns: &Namespace<B>) {
    let r = ns.getattr(ROOT_INO).unwrap();
    assert_eq!((r.attr.kind, r.attr.mode, r.attr.nlink, r.attr.uid, r.attr.gid), (FileKind::Dir, 0o755, 2, 0, 0));
    assert_eq!(at(ns, "/").unwrap(), r);
    assert_eq!(ns.lookup(&ALICE, ROOT_INO, "..").unwrap(), r);
    assert_eq!(ns.lookup(&ALICE, ROOT_INO, ".").unwrap(), r);
    mkdir(ns, &ROOT, "/a", 0o755).unwrap();
    assert_eq!(ns.getattr(ROOT_INO).unwrap().attr.nlink, 3);
}

fn mkdir_case<B: Backend>(ns: &Namespace<B>) {
    set_times(ns, "/", 5);
    let a = mkdir(ns, &ROOT, "/a", 0o170_755).unwrap();
    assert_eq!((a.attr.kind, a.attr.mode, a.attr.nlink, a.attr.size), (FileKind::Dir, 0o755, 2, 0));
    assert_eq!(ns.getattr(a.attr.ino).unwrap(), a);
    let r = ns.getattr(ROOT_INO).unwrap();
    assert_eq!((r.attr.nlink, r.attr.size), (3, 1));
    assert!(r.attr.mtime_ns > 5 && r.attr.ctime_ns > 5, "parent times not updated");
    assert_eq!(ns.lookup(&ROOT, ROOT_INO, "a").unwrap(), a);
    assert_eq!(ns.lookup(&ROOT, a.attr.ino, "..").unwrap().attr.ino, ROOT_INO);
    assert_eq!(mkdir(ns, &ROOT, "/a", 0o755).err(), Some(FsStatus::Exists));
    for (name, err) in [("", FsStatus::InvalidName), (".", FsStatus::InvalidName), ("..", FsStatus::InvalidName)] {
        assert_eq!(ns.mkdir(&ROOT, ROOT_INO, name, 0o755).err(), Some(err));
    }
    assert_eq!(ns.mkdir(&ROOT, ROOT_INO, "x/y", 0o755).err(), Some(FsStatus::InvalidName));
    assert_eq!(ns.mkdir(&ROOT, ROOT_INO, "x\0y", 0o755).err(), Some(FsStatus::InvalidName));
    let long = "n".repeat(FILE_NAME_MAX + 1);
    assert_eq!(ns.mkdir(&ROOT, ROOT_INO, &long, 0o755).err(), Some(FsStatus::NameTooLong));
    ns.mkdir(&ROOT, ROOT_INO, &long[1..], 0o755).unwrap();
    let f = create(ns, &ROOT, "/f", 0o644).unwrap();
    assert_eq!(ns.mkdir(&ROOT, f.attr.ino, "x", 0o755).err(), Some(FsStatus::NotDir));
    assert_eq!(ns.mkdir(&ROOT, 9999, "x", 0o755).err(), Some(FsStatus::NotFound));
    let b = mkdir(ns, &ALICE, "/a/b", 0o700);
    assert_eq!(b.err(), Some(FsStatus::PermissionDenied));
    let b = mkdir(ns, &ROOT, "/a/b", 0o700).unwrap();
    assert_eq!(ns.getattr(a.attr.ino).unwrap().attr.nlink, 3);
    assert_eq!(at(ns, "/a/b").unwrap(), b);
}

fn create_case<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/home", 0o777).unwrap();
    let home = ino(ns, "/home");
    let (f, created) = ns.create(&ALICE, home, "f", 0o640, false, false, &mut pool_placer(&[2, 1])).unwrap();
    assert!(created);
    let a = &f.attr;
    assert_eq!((a.kind, a.mode, a.nlink, a.uid, a.gid, a.size), (FileKind::File, 0o640, 1, 1000, 100, 0));
    let object = single(&f);
    assert_eq!((object.drive, object.partition), (1, PARTITION), "object from the first drive with a pool");
    assert!((100..100 + POOLED).contains(&object.object));
    assert_eq!(f.acv, 0);
    assert_eq!(ns.pool_len(1).unwrap(), POOLED as usize - 1);
    assert_eq!(ns.getattr(a.ino).unwrap(), f);
    assert_eq!(ns.walk(&ALICE, "/home/f", true).unwrap(), f);
    let h = ns.getattr(home).unwrap();
    assert_eq!((h.attr.size, h.attr.nlink), (1, 2));
    // Mode bits outside the mask are dropped.
    let (g, _) = ns.create(&ALICE, home, "g", 0o100_644, false, false, &mut pool_placer(&[1])).unwrap();
    assert_eq!(g.attr.mode, 0o644);
    assert_ne!(single(&g), single(&f));
}

fn create_existing<B: Backend>(ns: &Namespace<B>) {
    let f = create(ns, &ALICE, "/f", 0o644);
    assert_eq!(f.err(), Some(FsStatus::PermissionDenied), "root dir is 0755 root");
    let f = create(ns, &ROOT, "/f", 0o666).unwrap();
    ns.record_size(f.attr.ino, 10, 10, 77).unwrap();
    let (again, created) = ns.create(&ROOT, ROOT_INO, "f", 0o600, false, false, &mut pool_placer(&[1])).unwrap();
    assert!(!created);
    assert_eq!((again.attr.ino, again.attr.size, again.attr.mode), (f.attr.ino, 10, 0o666));
    assert_eq!(
        ns.create(&ROOT, ROOT_INO, "f", 0o600, true, false, &mut pool_placer(&[1])).err(),
        Some(FsStatus::Exists)
    );
    let pooled = ns.pool_len(1).unwrap();
    // Opening an existing file takes nothing from the pool, even without a drive list.
    let (t, created) = ns.create(&ALICE, ROOT_INO, "f", 0o600, false, true, &mut pool_placer(&[])).unwrap();
    assert!(!created);
    assert_eq!(t.attr.size, 0, "truncate");
    assert_eq!(ns.pool_len(1).unwrap(), pooled);
    own(ns, "/f", &ALICE, 0o644);
    assert_eq!(
        ns.create(&BOB, ROOT_INO, "f", 0o600, false, false, &mut pool_placer(&[1])).err(),
        Some(FsStatus::PermissionDenied)
    );
    mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    assert_eq!(
        ns.create(&ROOT, ROOT_INO, "d", 0o600, false, false, &mut pool_placer(&[1])).err(),
        Some(FsStatus::IsDir)
    );
    symlink(ns, "/l", "/f").unwrap();
    assert_eq!(
        ns.create(&ROOT, ROOT_INO, "l", 0o600, false, false, &mut pool_placer(&[1])).err(),
        Some(FsStatus::Exists)
    );
}

fn pool_exhaustion<B: Backend>(ns: &Namespace<B>) {
    for i in 0..POOLED {
        create(ns, &ROOT, &format!("/f{i}"), 0o644).unwrap();
    }
    assert_eq!(ns.pool_len(1).unwrap(), 0);
    let before = snapshot(ns);
    assert_eq!(create(ns, &ROOT, "/more", 0o644).err(), Some(FsStatus::NoSpace));
    assert_eq!(
        ns.create(&ROOT, ROOT_INO, "more", 0o644, true, false, &mut pool_placer(&[1, 2, 9])).err(),
        Some(FsStatus::NoSpace)
    );
    assert_eq!(snapshot(ns), before, "a failed create left something behind");
    missing(ns, "/more");
    ns.pool_add(&[obj(2, 5)]).unwrap();
    let (m, _) = ns.create(&ROOT, ROOT_INO, "more", 0o644, true, false, &mut pool_placer(&[1, 2])).unwrap();
    assert_eq!(single(&m), obj(2, 5));
}

fn symlink_case<B: Backend>(ns: &Namespace<B>) {
    let l = symlink(ns, "/l", "some/where").unwrap();
    assert_eq!((l.attr.kind, l.attr.mode, l.attr.size, l.attr.nlink), (FileKind::Symlink, 0o777, 10, 1));
    assert_eq!(l.target.as_deref(), Some("some/where"));
    assert_eq!((l.layout, l.components.len()), (None, 0));
    assert_eq!(ns.getattr(l.attr.ino).unwrap(), l);
    assert_eq!(symlink(ns, "/l", "x").err(), Some(FsStatus::Exists));
    assert_eq!(symlink(ns, "/e", "").err(), Some(FsStatus::InvalidArgument));
    assert_eq!(symlink(ns, "/e", "a\0b").err(), Some(FsStatus::InvalidArgument));
    let long = "t".repeat(SYMLINK_TARGET_MAX + 1);
    assert_eq!(symlink(ns, "/e", &long).err(), Some(FsStatus::NameTooLong));
    symlink(ns, "/e", &long[1..]).unwrap();
    assert_eq!(ns.symlink(&ALICE, ROOT_INO, "x", "y").err(), Some(FsStatus::PermissionDenied));
    let fx = unlink(ns, &ROOT, "/l").unwrap();
    assert_eq!(fx, Effects::default(), "symlinks have no objects");
    missing(ns, "/l");
}

fn readdir_case<B: Backend>(ns: &Namespace<B>) {
    let d = mkdir(ns, &ROOT, "/d", 0o755).unwrap().attr.ino;
    for name in ["c", "a", "b", "B", "é", "aa"] {
        symlink(ns, &format!("/d/{name}"), "x").unwrap();
    }
    let names = |after: &str, limit: usize| -> Vec<String> {
        ns.readdir(&ALICE, d, after, limit).unwrap().into_iter().map(|e| e.name).collect()
    };
    assert_eq!(names("", 100), ["B", "a", "aa", "b", "c", "é"]);
    assert_eq!(names("a", 100), ["aa", "b", "c", "é"]);
    assert_eq!(names("a", 2), ["aa", "b"]);
    assert_eq!(names("é", 2), Vec::<String>::new());
    assert_eq!(names("", 0), Vec::<String>::new());
    let e = ns.readdir(&ROOT, d, "b", 1).unwrap().remove(0);
    assert_eq!(e.inode, at(ns, "/d/c").unwrap());
    let f = create(ns, &ROOT, "/f", 0o644).unwrap().attr.ino;
    assert_eq!(ns.readdir(&ROOT, f, "", 10).err(), Some(FsStatus::NotDir));
    let searchable = |who: &Caller| ns.readdir_searchable(who, d, "", 1).map(|(_, x)| x);
    assert_eq!(searchable(&ALICE), Ok(true));
    own(ns, "/d", &ALICE, 0o744);
    assert_eq!(searchable(&ALICE), Ok(true), "the owner has rwx");
    assert_eq!(searchable(&CAROL), Ok(false), "others may read the names but not search");
    assert_eq!(searchable(&ROOT), Ok(true));
    own(ns, "/d", &ALICE, 0o311);
    assert_eq!(ns.readdir(&ALICE, d, "", 10).err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.readdir(&CAROL, d, "", 10).err(), Some(FsStatus::PermissionDenied));
    own(ns, "/d", &ALICE, 0o755);
    for i in 0..READDIR_ENTRIES_MAX {
        symlink(ns, &format!("/d/z{i:05}"), "x").unwrap();
    }
    assert_eq!(ns.readdir(&ROOT, d, "", usize::MAX).unwrap().len(), READDIR_ENTRIES_MAX, "limit is capped");
    assert_eq!(ns.getattr(d).unwrap().attr.size, READDIR_ENTRIES_MAX as u64 + 6);
}

/// Open permissions of a file owned by ALICE (gid 100) under each mode.
fn permission_matrix<B: Backend>(ns: &Namespace<B>) {
    let f = create(ns, &ROOT, "/f", 0o644).unwrap().attr.ino;
    let d = mkdir(ns, &ROOT, "/d", 0o755).unwrap().attr.ino;
    // (mode, caller, want_read, want_write, allowed)
    let rows: &[(u32, &Caller, bool, bool, bool)] = &[
        (0o640, &ALICE, true, true, true),
        (0o640, &BOB, true, false, true),
        (0o640, &BOB, false, true, false),
        (0o640, &CAROL, true, false, false),
        (0o604, &BOB, true, false, false), // the group class applies, not other
        (0o604, &CAROL, true, false, true),
        (0o060, &ALICE, true, false, false), // the owner class applies, not group
        (0o060, &BOB, true, true, true),
        (0o222, &ALICE, true, false, false),
        (0o222, &ALICE, false, true, true),
        (0o222, &CAROL, false, true, true),
        (0o000, &ALICE, true, false, false),
        (0o000, &ROOT, true, true, true),
        (0o000, &ALICE, false, false, true),
        (0o400, &ALICE, true, true, false),
        (0o007, &CAROL, true, true, true),
        (0o007, &BOB, true, false, false),
    ];
    for &(mode, who, r, w, allowed) in rows {
        for target in [f, d] {
            let set = SetAttrs { mode: Some(mode), uid: Some(1000), gid: Some(100), ..SetAttrs::default() };
            ns.setattr(&ROOT, target, &set).unwrap();
            let got = ns.check_access(who, target, r, w).map(|_| ());
            let want = match (target == d && w, allowed) {
                (true, _) => Err(FsStatus::IsDir),
                (false, true) => Ok(()),
                (false, false) => Err(FsStatus::PermissionDenied),
            };
            assert_eq!(got, want, "mode {mode:o} caller {who:?} r={r} w={w} dir={}", target == d);
        }
    }
    assert_eq!(ns.check_access(&ROOT, 9999, true, false).err(), Some(FsStatus::NotFound));
}

fn directory_permissions<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    create(ns, &ROOT, "/d/f", 0o644).unwrap();
    let d = ino(ns, "/d");
    // Search needs x.
    for (mode, who, ok) in [(0o700, &ALICE, true), (0o700, &BOB, false), (0o710, &BOB, true), (0o701, &BOB, false)] {
        own(ns, "/d", &ALICE, mode);
        assert_eq!(ns.lookup(who, d, "f").is_ok(), ok, "lookup mode {mode:o} {who:?}");
        assert_eq!(ns.walk(who, "/d/f", true).is_ok(), ok, "walk mode {mode:o} {who:?}");
    }
    own(ns, "/d", &ALICE, 0o000);
    assert!(ns.lookup(&ROOT, d, "f").is_ok(), "root bypasses search permission");
    // Creating and removing need w and x.
    for (mode, ok) in [(0o700, true), (0o500, false), (0o300, true), (0o600, false)] {
        own(ns, "/d", &ALICE, mode);
        let want = if ok { Ok(()) } else { Err(FsStatus::PermissionDenied) };
        assert_eq!(ns.mkdir(&ALICE, d, "sub", 0o755).map(|_| ()), want, "mkdir mode {mode:o}");
        if ok {
            assert_eq!(ns.rmdir(&ALICE, d, "sub").map(|_| ()), Ok(()));
        }
    }
    own(ns, "/d", &ALICE, 0o500);
    assert_eq!(ns.unlink(&ALICE, d, "f").err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.mkdir(&ALICE, d, "f", 0o755).err(), Some(FsStatus::Exists), "existence before write permission");
    assert!(ns.unlink(&ROOT, d, "f").is_ok(), "root bypasses");
}

fn setgid_inheritance<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/g", 0o777).unwrap();
    own(ns, "/g", &CAROL, 0o2777);
    let f = create(ns, &ALICE, "/g/f", 0o2755).unwrap();
    assert_eq!((f.attr.uid, f.attr.gid), (1000, 200), "group from the setgid directory");
    assert_eq!(f.attr.mode, 0o755, "setgid dropped: ALICE is not in group 200");
    let d = mkdir(ns, &ALICE, "/g/d", 0o755).unwrap();
    assert_eq!((d.attr.gid, d.attr.mode), (200, 0o2755), "directories inherit setgid");
    let plain = create(ns, &ALICE, "/g/d/p", 0o644).unwrap();
    assert_eq!(plain.attr.gid, 200);
    mkdir(ns, &ROOT, "/n", 0o777).unwrap();
    let f = create(ns, &ALICE, "/n/f", 0o2755).unwrap();
    assert_eq!((f.attr.gid, f.attr.mode), (100, 0o2755), "own group keeps setgid");
}

/// CAROL (gid 200) with ALICE's group 100 among her supplementary groups:
/// the group class of every check, chgrp to a group she is in, set-group-id
/// kept for a group she is in.
fn supplementary_groups<B: Backend>(ns: &Namespace<B>) {
    let carol = Caller { groups: vec![50, 100], ..CAROL };
    create(ns, &ROOT, "/f", 0o640).unwrap();
    own(ns, "/f", &ALICE, 0o640);
    let f = ino(ns, "/f");
    assert_eq!(ns.check_access(&carol, f, true, false).map(|_| ()), Ok(()), "group 100 through a supplementary group");
    assert_eq!(ns.check_access(&carol, f, false, true).err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.check_access(&CAROL, f, true, false).err(), Some(FsStatus::PermissionDenied));
    own(ns, "/f", &ALICE, 0o604);
    assert_eq!(ns.check_access(&carol, f, true, false).err(), Some(FsStatus::PermissionDenied), "the group class");
    assert!(ns.check_access(&CAROL, f, true, false).is_ok(), "others");
    // Directories: search and write through a supplementary group.
    mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    own(ns, "/d", &ALICE, 0o770);
    let d = ino(ns, "/d");
    assert!(ns.mkdir(&carol, d, "sub", 0o755).is_ok());
    assert_eq!(ns.mkdir(&CAROL, d, "sub2", 0o755).err(), Some(FsStatus::PermissionDenied));
    // New inodes take the primary group; set-group-id stays for a supplementary group.
    let sub = ns.lookup(&carol, d, "sub").unwrap();
    assert_eq!((sub.attr.uid, sub.attr.gid), (1002, 200));
    let (g, _) = ns.create(&carol, d, "g", 0o2755, true, false, &mut pool_placer(&[1])).unwrap();
    assert_eq!((g.attr.gid, g.attr.mode), (200, 0o2755));
    // chgrp: the owner to any group it is in, not to another.
    let chgrp = |who: &Caller, gid: u32| {
        let set = SetAttrs { gid: Some(gid), ..SetAttrs::default() };
        ns.setattr(who, g.attr.ino, &set).map(|(n, _)| (n.attr.gid, n.attr.mode))
    };
    assert_eq!(chgrp(&carol, 50), Ok((50, 0o755)), "a supplementary group (chown clears set-group-id)");
    assert_eq!(chgrp(&carol, 100), Ok((100, 0o755)));
    assert_eq!(chgrp(&carol, 300).err(), Some(FsStatus::NotPermitted), "not one of hers");
    assert_eq!(
        chgrp(&CAROL, 50).err(),
        Some(FsStatus::NotPermitted),
        "without the supplementary groups, 50 is not hers"
    );
    assert_eq!(chgrp(&carol, 100), Ok((100, 0o755)), "unchanged by the refusal");
    let chmod = SetAttrs { mode: Some(0o2750), ..SetAttrs::default() };
    assert_eq!(ns.setattr(&carol, g.attr.ino, &chmod).unwrap().0.attr.mode, 0o2750, "in group 100: kept");
    assert_eq!(ns.setattr(&CAROL, g.attr.ino, &chmod).unwrap().0.attr.mode, 0o750, "without it: stripped");
}

/// Extended attributes: Linux's namespace rules, create/replace, limits,
/// ctime, and removal with the inode.
fn extended_attributes<B: Backend>(ns: &Namespace<B>) {
    use crate::XattrMode::{Create, Either, Replace};
    let f = create(ns, &ROOT, "/f", 0o644).unwrap().attr.ino;
    own(ns, "/f", &ALICE, 0o644);
    let before = ns.getattr(f).unwrap().attr.ctime_ns;
    std::thread::sleep(std::time::Duration::from_millis(2));
    let n = ns.setxattr(&ALICE, f, "user.color", b"blue", Create).unwrap();
    assert!(n.attr.ctime_ns > before, "ctime moves");
    assert_eq!(ns.getxattr(&ALICE, f, "user.color").unwrap(), b"blue");
    assert_eq!(ns.getxattr(&BOB, f, "user.color").unwrap(), b"blue", "group may read");
    assert_eq!(ns.setxattr(&ALICE, f, "user.color", b"red", Create).err(), Some(FsStatus::Exists));
    assert_eq!(ns.setxattr(&ALICE, f, "user.size", b"1", Replace).err(), Some(FsStatus::NoXattr));
    ns.setxattr(&ALICE, f, "user.color", b"red", Replace).unwrap();
    ns.setxattr(&ALICE, f, "user.empty", b"", Either).unwrap();
    assert_eq!(ns.getxattr(&ALICE, f, "user.empty").unwrap(), b"");
    assert_eq!(ns.getxattr(&ALICE, f, "user.none").err(), Some(FsStatus::NoXattr));
    // Write permission for user.*; others may not write, nor read without r.
    assert_eq!(ns.setxattr(&BOB, f, "user.x", b"1", Either).err(), Some(FsStatus::PermissionDenied));
    own(ns, "/f", &ALICE, 0o600);
    assert_eq!(ns.getxattr(&CAROL, f, "user.color").err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.removexattr(&CAROL, f, "user.color").err(), Some(FsStatus::PermissionDenied));
    // trusted.*: root only, invisible to others; security.*: root writes, anyone reads.
    ns.setxattr(&ROOT, f, "trusted.t", b"T", Either).unwrap();
    assert_eq!(ns.setxattr(&ALICE, f, "trusted.u", b"U", Either).err(), Some(FsStatus::NotPermitted));
    assert_eq!(ns.getxattr(&ALICE, f, "trusted.t").err(), Some(FsStatus::NoXattr));
    assert_eq!(ns.setxattr(&ALICE, f, "security.s", b"S", Either).err(), Some(FsStatus::NotPermitted));
    ns.setxattr(&ROOT, f, "security.s", b"S", Either).unwrap();
    assert_eq!(ns.getxattr(&CAROL, f, "security.s").unwrap(), b"S");
    assert_eq!(ns.listxattr(&ALICE, f).unwrap(), ["security.s", "user.color", "user.empty"]);
    assert_eq!(ns.listxattr(&ROOT, f).unwrap(), ["security.s", "trusted.t", "user.color", "user.empty"]);
    assert_eq!(ns.listxattr(&CAROL, f).unwrap().len(), 3, "listing needs no permission on the file");
    // Names: other namespaces unsupported; bare prefixes and NULs invalid.
    assert_eq!(ns.setxattr(&ROOT, f, "system.posix_acl_access", b"", Either).err(), Some(FsStatus::NotSupported));
    assert_eq!(ns.getxattr(&ROOT, f, "other").err(), Some(FsStatus::NotSupported));
    assert_eq!(ns.setxattr(&ROOT, f, "user.", b"", Either).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.setxattr(&ROOT, f, "user.a\0b", b"", Either).err(), Some(FsStatus::InvalidArgument));
    let long = format!("user.{}", "n".repeat(XATTR_NAME_MAX));
    assert_eq!(ns.setxattr(&ROOT, f, &long, b"", Either).err(), Some(FsStatus::NameTooLong));
    // Limits: the value, the count and the bytes per inode.
    let big = vec![1u8; XATTR_VALUE_MAX + 1];
    assert_eq!(ns.setxattr(&ROOT, f, "user.big", &big, Either).err(), Some(FsStatus::TooBig));
    let g = create(ns, &ROOT, "/g", 0o644).unwrap().attr.ino;
    for i in 0..XATTRS_PER_INODE_MAX {
        ns.setxattr(&ROOT, g, &format!("user.{i:03}"), b"v", Either).unwrap();
    }
    assert_eq!(ns.setxattr(&ROOT, g, "user.one-more", b"v", Either).err(), Some(FsStatus::TooBig));
    ns.setxattr(&ROOT, g, "user.000", b"replaced", Either).expect("replacing does not count as one more");
    let h = create(ns, &ROOT, "/h", 0o644).unwrap().attr.ino;
    let per = XATTR_VALUE_MAX;
    let fits = XATTR_BYTES_PER_INODE_MAX / (per + 16);
    for i in 0..fits {
        ns.setxattr(&ROOT, h, &format!("user.{i}"), &vec![0; per], Either).unwrap();
    }
    assert_eq!(ns.setxattr(&ROOT, h, "user.over", &vec![0; per], Either).err(), Some(FsStatus::TooBig));
    // user.* lives on files and directories only; sticky directories: owner only.
    let l = symlink(ns, "/l", "f").unwrap().attr.ino;
    assert_eq!(ns.setxattr(&ROOT, l, "user.x", b"", Either).err(), Some(FsStatus::NotPermitted));
    assert_eq!(ns.getxattr(&ROOT, l, "user.x").err(), Some(FsStatus::NoXattr));
    ns.setxattr(&ROOT, l, "trusted.x", b"ok", Either).unwrap();
    let d = mkdir(ns, &ROOT, "/d", 0o1777).unwrap().attr.ino;
    own(ns, "/d", &ALICE, 0o1777);
    assert_eq!(ns.setxattr(&BOB, d, "user.x", b"", Either).err(), Some(FsStatus::NotPermitted));
    ns.setxattr(&ALICE, d, "user.x", b"dir", Either).unwrap();
    assert_eq!(ns.getxattr(&BOB, d, "user.x").unwrap(), b"dir");
    // Removal.
    ns.removexattr(&ALICE, f, "user.color").unwrap();
    assert_eq!(ns.removexattr(&ALICE, f, "user.color").err(), Some(FsStatus::NoXattr));
    assert_eq!(ns.listxattr(&ALICE, f).unwrap(), ["security.s", "user.empty"]);
    // The attributes go with the inode.
    ns.unlink(&ROOT, ROOT_INO, "g").unwrap();
    assert_eq!(ns.listxattr(&ROOT, g).err(), Some(FsStatus::NotFound));
    ns.unlink(&ROOT, ROOT_INO, "h").unwrap();
    ns.unlink(&ROOT, ROOT_INO, "l").unwrap();
    ns.unlink(&ROOT, ROOT_INO, "f").unwrap();
    ns.rmdir(&ROOT, ROOT_INO, "d").unwrap();
    assert_eq!(ns.getxattr(&ROOT, f, "user.empty").err(), Some(FsStatus::NotFound));
}

/// FIFOs, sockets and devices: inodes without data, made with `mknod`;
/// devices by the superuser only; renamed, linked and removed as files are.
fn special_files<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/d", 0o777).unwrap();
    let d = ino(ns, "/d");
    let fifo = ns.mknod(&ALICE, d, "p", FileKind::Fifo, 0o640, 0).unwrap();
    assert_eq!((fifo.attr.kind, fifo.attr.mode, fifo.attr.uid, fifo.attr.size), (FileKind::Fifo, 0o640, 1000, 0));
    assert!(fifo.layout.is_none() && fifo.components.is_empty() && fifo.target.is_none());
    ns.mknod(&ALICE, d, "s", FileKind::Socket, 0o755, 0).unwrap();
    let dev = 8 << 8 | 1;
    assert_eq!(ns.mknod(&ALICE, d, "c", FileKind::CharDevice, 0o644, dev).err(), Some(FsStatus::NotPermitted));
    let c = ns.mknod(&ROOT, d, "c", FileKind::CharDevice, 0o644, dev).unwrap();
    assert_eq!((c.attr.kind, c.attr.rdev), (FileKind::CharDevice, dev));
    assert_eq!(ns.getattr(c.attr.ino).unwrap().attr.rdev, dev, "the device number is stored");
    ns.mknod(&ROOT, d, "b", FileKind::BlockDevice, 0o600, 0).unwrap();
    // Not a special kind, a device number for a FIFO, an existing name, no write permission.
    assert_eq!(ns.mknod(&ROOT, d, "f", FileKind::File, 0o644, 0).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.mknod(&ROOT, d, "q", FileKind::Fifo, 0o644, 5).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.mknod(&ROOT, d, "p", FileKind::Fifo, 0o644, 0).err(), Some(FsStatus::Exists));
    own(ns, "/d", &ALICE, 0o755);
    assert_eq!(ns.mknod(&CAROL, d, "q", FileKind::Fifo, 0o644, 0).err(), Some(FsStatus::PermissionDenied));
    // No data: no size change, no write transaction, no layout.
    let size = SetAttrs { size: Some(1), ..SetAttrs::default() };
    assert_eq!(ns.setattr(&ROOT, fifo.attr.ino, &size).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.begin_write(&ROOT, fifo.attr.ino, i64::MAX).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.effective_layout(fifo.attr.ino).err(), Some(FsStatus::InvalidArgument));
    // chmod, link, rename and unlink as for any non-directory.
    let chmod = SetAttrs { mode: Some(0o600), ..SetAttrs::default() };
    assert_eq!(ns.setattr(&ALICE, fifo.attr.ino, &chmod).unwrap().0.attr.mode, 0o600);
    ns.link(&ROOT, fifo.attr.ino, ROOT_INO, "p2").unwrap();
    assert_eq!(ns.getattr(fifo.attr.ino).unwrap().attr.nlink, 2);
    ns.rename(&ROOT, d, "s", ROOT_INO, "s2").unwrap();
    ns.unlink(&ROOT, d, "p").unwrap();
    ns.unlink(&ROOT, ROOT_INO, "p2").unwrap();
    assert_eq!(ns.getattr(fifo.attr.ino).err(), Some(FsStatus::NotFound));
}

/// `ftruncate` on a descriptor open for writing: the owner may change the
/// size whatever the mode (knfsd's owner override); nobody else gains anything.
fn open_writer_truncates<B: Backend>(ns: &Namespace<B>) {
    let f = create(ns, &ROOT, "/f", 0o644).unwrap().attr.ino;
    own(ns, "/f", &ALICE, 0o000);
    let size = |open_writer| SetAttrs { size: Some(7), open_writer, ..SetAttrs::default() };
    assert_eq!(ns.setattr(&ALICE, f, &size(false)).err(), Some(FsStatus::PermissionDenied), "truncate(2) by path");
    assert_eq!(ns.setattr(&ALICE, f, &size(true)).unwrap().0.attr.size, 7, "ftruncate(2) by the owner");
    assert_eq!(ns.setattr(&BOB, f, &size(true)).err(), Some(FsStatus::PermissionDenied), "not the owner");
    own(ns, "/f", &ALICE, 0o066);
    assert!(ns.setattr(&BOB, f, &size(true)).is_ok(), "the mode still lets the group write");
}

/// The manager's own write transactions are recorded as
/// `MANAGER_WRITER_UID`'s, an id no caller may begin one as.
fn manager_writer<B: Backend>(ns: &Namespace<B>) {
    create(ns, &ROOT, "/own", 0o666).unwrap();
    let f = ino(ns, "/own");
    let nobody = Caller { uid: crate::MANAGER_WRITER_UID, gid: 0, groups: Vec::new(), role: 0 };
    assert_eq!(ns.begin_write(&nobody, f, i64::MAX).err(), Some(FsStatus::PermissionDenied));
    let txn = ns.begin_write_as(&ROOT, f, i64::MAX, crate::MANAGER_WRITER_UID).unwrap();
    assert_eq!(ns.intent(txn).unwrap().map(|i| i.uid), Some(crate::MANAGER_WRITER_UID));
    ns.abort_intent(txn).unwrap();
    ns.finish_intent(txn).unwrap();
}

/// Temporaries a dead client left: files named `*.nasd-tmp` not written
/// since the given time and with no write transaction open, in every
/// directory, in order, bounded; not a fresh one, one being written, a
/// directory or another name.
fn stale_temporaries<B: Backend>(ns: &Namespace<B>) {
    const SUFFIX: &str = ".nasd-tmp";
    mkdir(ns, &ROOT, "/a", 0o777).unwrap();
    mkdir(ns, &ROOT, "/b", 0o777).unwrap();
    for path in ["/a/.x.1.nasd-tmp", "/a/.y.2.nasd-tmp", "/b/.z.3.nasd-tmp", "/a/x", "/b/nasd-tmp"] {
        create(ns, &ALICE, path, 0o644).unwrap();
    }
    mkdir(ns, &ROOT, "/b/.d.4.nasd-tmp", 0o777).unwrap();
    let writing = ino(ns, "/a/.y.2.nasd-tmp");
    let txn = ns.begin_write(&ALICE, writing, i64::MAX).unwrap();
    let names = |older_than, limit| ns.stale_temporaries(SUFFIX, older_than, limit).unwrap();
    let (a, b) = (ino(ns, "/a"), ino(ns, "/b"));
    let expected = vec![(a, ".x.1.nasd-tmp".to_string()), (b, ".z.3.nasd-tmp".to_string())];
    assert_eq!(names(i64::MAX, 10), expected, "old, closed, regular files named so");
    assert_eq!(names(i64::MAX, 1), expected[..1], "bounded");
    assert_eq!(names(0, 10), vec![], "none older than the epoch");
    ns.abort_intent(txn).unwrap();
    ns.finish_intent(txn).unwrap();
    assert_eq!(names(i64::MAX, 10).len(), 3, "the write ended: its copy is a leftover too");
}

/// Quotas of users and directory trees: usage, limits on inodes and bytes,
/// escrow for writers, trees moved when a quota is set or removed, and no
/// rename or link across a tree's boundary.
fn quotas<B: Backend>(ns: &Namespace<B>) {
    use crate::QuotaSubject::{Dir, User};
    let alice_create = |dir: Ino, name: &str| ns.create(&ALICE, dir, name, 0o644, true, false, &mut pool_placer(&[1]));
    let grow = |ino: Ino, size: u64| {
        let set = SetAttrs { size: Some(size), ..SetAttrs::default() };
        ns.setattr(&ALICE, ino, &set).map(|(n, _)| n.attr.size)
    };
    // A whole write transaction: the file `size` long, its components storing
    // `data` bytes; a refused commit is rolled back.
    let write = |who: &Caller, ino: Ino, size: u64, data: u64| {
        let txn = ns.begin_write(who, ino, i64::MAX).unwrap();
        let committed = ns.commit_write(who, ino, txn, size, data, &[], 1);
        if committed.is_err() {
            ns.abort_intent(txn).unwrap();
        }
        ns.finish_intent(txn).unwrap();
        committed.map(|n| (n.attr.size, n.attr.allocated))
    };
    mkdir(ns, &ROOT, "/home", 0o777).unwrap();
    let home = ino(ns, "/home");
    let (pre, _) = alice_create(home, "pre").unwrap();
    write(&ALICE, pre.attr.ino, 100, 100).unwrap();
    // A new user quota counts what the user has.
    let q = ns.set_quota(User(ALICE.uid), Some(1000), Some(3)).unwrap().unwrap();
    assert_eq!((q.bytes_used, q.files_used), (100, 1));
    let (b, _) = alice_create(home, "b").unwrap();
    alice_create(home, "c").unwrap();
    assert_eq!(alice_create(home, "d").err(), Some(FsStatus::QuotaExceeded), "a fourth inode");
    assert!(ns.create(&BOB, home, "bobs", 0o644, true, false, &mut pool_placer(&[1])).is_ok(), "bob has no quota");
    // Quotas count what the data takes: a size costs nothing by itself (a hole).
    assert_eq!(grow(b.attr.ino, 5000), Ok(5000), "a sparse file larger than the quota");
    assert_eq!(ns.quota(User(ALICE.uid)).unwrap().unwrap().0.bytes_used, 100);
    assert_eq!(grow(b.attr.ino, 10), Ok(10), "shrinking is always allowed");
    // Escrow: a writer reserves room; others see less; a commit within it succeeds.
    let txn = ns.begin_write(&ALICE, b.attr.ino, i64::MAX).unwrap();
    let i = ns.intent(txn).unwrap().unwrap();
    assert_eq!((i.escrow, i.size_limit), (900, 910), "1000 - 100 used: all of it, within ESCROW_BYTES_MAX");
    let (q, held) = ns.quota(User(ALICE.uid)).unwrap().unwrap();
    assert_eq!((q.bytes_used, held), (100, 900));
    let c = ino(ns, "/home/c");
    assert_eq!(write(&ALICE, c, 1, 1).err(), Some(FsStatus::QuotaExceeded), "the escrow holds the rest");
    assert_eq!(
        ns.commit_write(&ALICE, b.attr.ino, txn, 2000, 901, &[], 1).err(),
        Some(FsStatus::QuotaExceeded),
        "100 + 901 > 1000"
    );
    let n = ns.commit_write(&ALICE, b.attr.ino, txn, 2000, 500, &[], 1).unwrap();
    assert_eq!((n.attr.size, n.attr.allocated), (2000, 500), "2000 bytes long, 500 stored");
    ns.finish_intent(txn).unwrap();
    assert_eq!(ns.quota(User(ALICE.uid)).unwrap().unwrap(), (Quota { bytes_used: 600, ..q.clone() }, 0));
    assert_eq!(write(&ALICE, c, 400, 400), Ok((400, 400)), "the escrow is given back at commit");
    // Past its escrow a commit fits if the quota has room: b's next writer
    // is given 0 (the quota is full), and stores fewer bytes than before.
    assert_eq!(write(&ALICE, b.attr.ino, 2000, 100), Ok((2000, 100)), "data overwritten with zeros frees room");
    assert_eq!(write(&ALICE, b.attr.ino, 2000, 500), Ok((2000, 500)), "room again, past the escrow of 0");
    // Unlinking gives back; chown moves usage between users.
    ns.unlink(&ALICE, home, "c").unwrap();
    let q = ns.quota(User(ALICE.uid)).unwrap().unwrap().0;
    assert_eq!((q.bytes_used, q.files_used), (600, 2));
    ns.set_quota(User(BOB.uid), None, Some(100)).unwrap();
    let chown = SetAttrs { uid: Some(BOB.uid), ..SetAttrs::default() };
    ns.setattr(&ROOT, b.attr.ino, &chown).unwrap();
    assert_eq!(ns.quota(User(BOB.uid)).unwrap().unwrap().0.bytes_used, 500);
    assert_eq!(ns.quota(User(ALICE.uid)).unwrap().unwrap().0.bytes_used, 100);

    // A directory quota takes its tree (down to nested quota directories).
    mkdir(ns, &ROOT, "/home/proj", 0o777).unwrap();
    mkdir(ns, &ROOT, "/home/proj/sub", 0o777).unwrap();
    let proj = ino(ns, "/home/proj");
    let sub = ino(ns, "/home/proj/sub");
    let (x, _) = alice_create(sub, "x").unwrap();
    write(&ALICE, x.attr.ino, 50, 50).unwrap();
    let q = ns.set_quota(Dir(proj), Some(60), None).unwrap().unwrap();
    assert_eq!((q.bytes_used, q.files_used), (50, 2), "sub and x, not proj itself");
    assert_eq!(ns.getattr(x.attr.ino).unwrap().qdir, proj);
    assert_eq!(ns.getattr(proj).unwrap().qdir, 0, "the quota directory counts in the enclosing tree");
    assert_eq!(write(&ALICE, x.attr.ino, 61, 61).err(), Some(FsStatus::QuotaExceeded));
    assert_eq!(write(&ALICE, x.attr.ino, 1 << 40, 60), Ok((1 << 40, 60)), "1 TiB long, 60 bytes stored");
    write(&ALICE, x.attr.ino, 50, 50).unwrap();
    let (y, _) = ns.create(&ROOT, sub, "y", 0o644, true, false, &mut pool_placer(&[1])).unwrap();
    assert_eq!(y.qdir, proj, "made below: in the tree");
    // Nested: sub's own quota takes its part out of proj's.
    ns.set_quota(Dir(sub), None, Some(10)).unwrap();
    let (pq, _) = ns.quota(Dir(proj)).unwrap().unwrap();
    assert_eq!((pq.bytes_used, pq.files_used), (0, 1), "only sub itself stays in proj's tree");
    assert_eq!(ns.getattr(x.attr.ino).unwrap().qdir, sub);
    // No rename or link across a tree's boundary (EXDEV); within one, fine.
    assert_eq!(ns.rename(&ROOT, sub, "x", home, "x").err(), Some(FsStatus::CrossQuota));
    assert_eq!(ns.link(&ROOT, x.attr.ino, home, "xl").err(), Some(FsStatus::CrossQuota));
    mkdir(ns, &ROOT, "/home/proj/sub/deeper", 0o777).unwrap();
    ns.rename(&ROOT, sub, "x", ino(ns, "/home/proj/sub/deeper"), "x").unwrap();
    // Removing a quota gives the tree back to the enclosing one.
    ns.set_quota(Dir(sub), None, None).unwrap();
    assert!(ns.quota(Dir(sub)).unwrap().is_none());
    assert_eq!(ns.getattr(x.attr.ino).unwrap().qdir, proj);
    let (pq, _) = ns.quota(Dir(proj)).unwrap().unwrap();
    assert_eq!((pq.bytes_used, pq.files_used), (50, 4), "sub, deeper, x and y (not proj itself)");
    assert_eq!(ns.set_quota(Dir(x.attr.ino), Some(1), None).err(), Some(FsStatus::NotDir));
    assert_eq!(ns.set_quota(User(4242), None, None), Ok(None), "removing what is not there");
    ns.set_quota(Dir(proj), None, None).unwrap();
    assert_eq!(ns.getattr(x.attr.ino).unwrap().qdir, 0);
    ns.rename(&ROOT, ino(ns, "/home/proj/sub/deeper"), "x", home, "x").unwrap();
    let users: Vec<_> = ns.quotas().unwrap().into_iter().map(|q| q.subject).collect();
    assert_eq!(users, [User(ALICE.uid), User(BOB.uid)]);
}

fn hard_links<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    let f = create(ns, &ROOT, "/f", 0o644).unwrap();
    let object = single(&f);
    set_times(ns, "/d", 5);
    let l = link(ns, "/f", "/d/g").unwrap();
    assert_eq!((l.attr.ino, l.attr.nlink), (f.attr.ino, 2));
    assert_eq!(at(ns, "/d/g").unwrap(), l);
    assert_eq!(at(ns, "/f").unwrap(), l);
    let d = at(ns, "/d").unwrap();
    assert_eq!((d.attr.size, d.attr.nlink), (1, 2));
    assert!(d.attr.mtime_ns > 5);
    assert_eq!(link(ns, "/f", "/d/g").err(), Some(FsStatus::Exists));
    assert_eq!(link(ns, "/d", "/d2").err(), Some(FsStatus::NotPermitted));
    assert_eq!(ns.link(&ROOT, 9999, ROOT_INO, "x").err(), Some(FsStatus::NotFound));
    assert_eq!(ns.link(&ALICE, f.attr.ino, ROOT_INO, "x").err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.link(&ROOT, f.attr.ino, f.attr.ino, "x").err(), Some(FsStatus::NotDir));
    symlink(ns, "/s", "/f").unwrap();
    assert_eq!(link(ns, "/s", "/s2").unwrap().attr.nlink, 2, "symlinks can be hard-linked");
    // Dropping a link revokes; dropping the last dooms.
    let fx = unlink(ns, &ROOT, "/f").unwrap();
    assert_eq!(fx, Effects { revoke: vec![AcvIntent { object, acv: 1 }], doomed: vec![], collections: vec![] });
    let g = at(ns, "/d/g").unwrap();
    assert_eq!((g.attr.nlink, g.acv), (1, 1));
    assert_eq!(ns.acv_intents(10).unwrap(), vec![AcvIntent { object, acv: 1 }]);
    assert!(ns.doomed(10).unwrap().is_empty());
    let fx = unlink(ns, &ROOT, "/d/g").unwrap();
    assert_eq!(fx, Effects { revoke: vec![], doomed: vec![object], collections: vec![] });
    assert_eq!(ns.doomed(10).unwrap(), vec![object]);
    assert!(ns.acv_intents(10).unwrap().is_empty(), "a doomed object needs no revocation");
    assert_eq!(ns.getattr(f.attr.ino).err(), Some(FsStatus::NotFound));
    assert!(ns.known_objects(1).unwrap().contains(&object.object), "doomed objects stay known");
}

fn unlink_rmdir<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    mkdir(ns, &ROOT, "/d/e", 0o755).unwrap();
    create(ns, &ROOT, "/d/f", 0o644).unwrap();
    assert_eq!(unlink(ns, &ROOT, "/d/e").err(), Some(FsStatus::IsDir));
    assert_eq!(rmdir(ns, &ROOT, "/d/f").err(), Some(FsStatus::NotDir));
    assert_eq!(rmdir(ns, &ROOT, "/d").err(), Some(FsStatus::NotEmpty));
    assert_eq!(unlink(ns, &ROOT, "/d/x").err(), Some(FsStatus::NotFound));
    assert_eq!(rmdir(ns, &ROOT, "/d/x").err(), Some(FsStatus::NotFound));
    assert_eq!(ns.rmdir(&ROOT, ROOT_INO, "..").err(), Some(FsStatus::InvalidName));
    assert_eq!(ns.unlink(&ROOT, ino(ns, "/d/f"), "x").err(), Some(FsStatus::NotDir));
    let e = ino(ns, "/d/e");
    rmdir(ns, &ROOT, "/d/e").unwrap();
    assert_eq!(ns.getattr(e).err(), Some(FsStatus::NotFound));
    let d = at(ns, "/d").unwrap();
    assert_eq!((d.attr.nlink, d.attr.size), (2, 1));
    let fx = unlink(ns, &ROOT, "/d/f").unwrap();
    assert_eq!(fx.doomed.len(), 1);
    rmdir(ns, &ROOT, "/d").unwrap();
    let r = ns.getattr(ROOT_INO).unwrap();
    assert_eq!((r.attr.nlink, r.attr.size), (2, 0));
}

fn rename_same_dir<B: Backend>(ns: &Namespace<B>) {
    let f = create(ns, &ROOT, "/a", 0o644).unwrap();
    set_times(ns, "/", 5);
    assert_eq!(rename(ns, &ROOT, "/a", "/b").unwrap(), Effects::default());
    missing(ns, "/a");
    let b = at(ns, "/b").unwrap();
    assert_eq!((b.attr.ino, &b.components, b.acv), (f.attr.ino, &f.components, 0));
    assert!(b.attr.ctime_ns >= f.attr.ctime_ns);
    let r = ns.getattr(ROOT_INO).unwrap();
    assert_eq!(r.attr.size, 1);
    assert!(r.attr.mtime_ns > 5);
    assert_eq!(rename(ns, &ROOT, "/a", "/c").err(), Some(FsStatus::NotFound));
    assert_eq!(ns.rename(&ROOT, ROOT_INO, "b", ROOT_INO, "").err(), Some(FsStatus::InvalidName));
}

fn rename_replace<B: Backend>(ns: &Namespace<B>) {
    let a = create(ns, &ROOT, "/a", 0o644).unwrap();
    let b = create(ns, &ROOT, "/b", 0o644).unwrap();
    let fx = rename(ns, &ROOT, "/a", "/b").unwrap();
    assert_eq!(fx, Effects { revoke: vec![], doomed: vec![single(&b)], collections: vec![] });
    assert_eq!(ino(ns, "/b"), a.attr.ino);
    missing(ns, "/a");
    assert_eq!(ns.getattr(b.attr.ino).err(), Some(FsStatus::NotFound));
    // Replacing a file that has another link revokes instead.
    let c = create(ns, &ROOT, "/c", 0o644).unwrap();
    link(ns, "/c", "/c2").unwrap();
    let fx = rename(ns, &ROOT, "/b", "/c").unwrap();
    assert_eq!(
        fx,
        Effects { revoke: vec![AcvIntent { object: single(&c), acv: 1 }], doomed: vec![], collections: vec![] }
    );
    let c2 = at(ns, "/c2").unwrap();
    assert_eq!((c2.attr.nlink, c2.acv), (1, 1));
    assert_eq!(ino(ns, "/c"), a.attr.ino);
    assert_eq!(ns.getattr(ROOT_INO).unwrap().attr.size, 2);
    // Replacing a symlink: no objects involved.
    symlink(ns, "/s", "x").unwrap();
    assert_eq!(rename(ns, &ROOT, "/c2", "/s").unwrap(), Effects::default());
}

fn rename_kinds<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    mkdir(ns, &ROOT, "/full", 0o755).unwrap();
    mkdir(ns, &ROOT, "/full/x", 0o755).unwrap();
    mkdir(ns, &ROOT, "/empty", 0o755).unwrap();
    create(ns, &ROOT, "/f", 0o644).unwrap();
    assert_eq!(rename(ns, &ROOT, "/d", "/f").err(), Some(FsStatus::NotDir));
    assert_eq!(rename(ns, &ROOT, "/f", "/d").err(), Some(FsStatus::IsDir));
    assert_eq!(rename(ns, &ROOT, "/d", "/full").err(), Some(FsStatus::NotEmpty));
    assert_eq!(rename(ns, &ROOT, "/full/x", "/").err(), Some(FsStatus::InvalidName));
    let d = ino(ns, "/d");
    let empty = ino(ns, "/empty");
    assert_eq!(rename(ns, &ROOT, "/d", "/empty").unwrap(), Effects::default());
    assert_eq!(ino(ns, "/empty"), d);
    assert_eq!(ns.getattr(empty).err(), Some(FsStatus::NotFound));
    let r = ns.getattr(ROOT_INO).unwrap();
    assert_eq!((r.attr.nlink, r.attr.size), (4, 3));
    // A directory over an empty directory in another parent.
    mkdir(ns, &ROOT, "/full/y", 0o755).unwrap();
    rename(ns, &ROOT, "/empty", "/full/y").unwrap();
    let full = at(ns, "/full").unwrap();
    assert_eq!((full.attr.nlink, full.attr.size), (4, 2));
    assert_eq!(ns.lookup(&ROOT, d, "..").unwrap().attr.ino, full.attr.ino);
}

fn rename_cross_dir<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/x", 0o755).unwrap();
    mkdir(ns, &ROOT, "/y", 0o755).unwrap();
    mkdir(ns, &ROOT, "/x/d", 0o755).unwrap();
    create(ns, &ROOT, "/x/d/f", 0o644).unwrap();
    create(ns, &ROOT, "/x/g", 0o644).unwrap();
    let (x, y, d) = (ino(ns, "/x"), ino(ns, "/y"), ino(ns, "/x/d"));
    rename(ns, &ROOT, "/x/d", "/y/d2").unwrap();
    let (xa, ya) = (ns.getattr(x).unwrap().attr, ns.getattr(y).unwrap().attr);
    assert_eq!((xa.nlink, xa.size, ya.nlink, ya.size), (2, 1, 3, 1));
    assert_eq!(ns.lookup(&ROOT, d, "..").unwrap().attr.ino, y);
    assert_eq!(ino(ns, "/y/d2/.."), y);
    assert_eq!(ino(ns, "/y/d2/f"), ino(ns, "/y/d2/./f"));
    rename(ns, &ROOT, "/x/g", "/y/d2/g").unwrap();
    assert_eq!(at(ns, "/y/d2").unwrap().attr.size, 2);
    assert_eq!(at(ns, "/x").unwrap().attr.size, 0);
    // Up the tree.
    rename(ns, &ROOT, "/y/d2/f", "/f").unwrap();
    rename(ns, &ROOT, "/y/d2", "/d3").unwrap();
    assert_eq!(ns.getattr(ROOT_INO).unwrap().attr.nlink, 5);
    assert_eq!(ns.lookup(&ROOT, d, "..").unwrap().attr.ino, ROOT_INO);
}

fn rename_into_subtree<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/a", 0o755).unwrap();
    mkdir(ns, &ROOT, "/a/b", 0o755).unwrap();
    mkdir(ns, &ROOT, "/a/b/c", 0o755).unwrap();
    let before = snapshot(ns);
    assert_eq!(rename(ns, &ROOT, "/a", "/a/b/c/a").err(), Some(FsStatus::InvalidMove));
    assert_eq!(rename(ns, &ROOT, "/a", "/a/x").err(), Some(FsStatus::InvalidMove));
    assert_eq!(rename(ns, &ROOT, "/a/b", "/a/b/c/x").err(), Some(FsStatus::InvalidMove));
    // Onto an ancestor: the ancestor is not empty.
    assert_eq!(rename(ns, &ROOT, "/a/b/c", "/a").err(), Some(FsStatus::NotEmpty));
    assert_eq!(snapshot(ns), before);
    rename(ns, &ROOT, "/a/b/c", "/c").unwrap();
    rename(ns, &ROOT, "/a", "/c/a").unwrap();
    assert_eq!(ino(ns, "/c/a/b/.."), ino(ns, "/c/a"));
}

fn rename_same_inode<B: Backend>(ns: &Namespace<B>) {
    create(ns, &ROOT, "/f", 0o644).unwrap();
    link(ns, "/f", "/g").unwrap();
    mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    let before = snapshot(ns);
    assert_eq!(rename(ns, &ROOT, "/f", "/g").unwrap(), Effects::default());
    assert_eq!(rename(ns, &ROOT, "/f", "/f").unwrap(), Effects::default());
    assert_eq!(rename(ns, &ROOT, "/d", "/d").unwrap(), Effects::default());
    assert_eq!(rename(ns, &ALICE, "/f", "/g").unwrap(), Effects::default(), "no-op needs no write permission");
    assert_eq!(snapshot(ns), before, "renaming onto the same inode is a no-op");
}

fn rename_permissions<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/src", 0o777).unwrap();
    mkdir(ns, &ROOT, "/ro", 0o755).unwrap();
    mkdir(ns, &ROOT, "/rw", 0o777).unwrap();
    create(ns, &ALICE, "/src/f", 0o644).unwrap();
    mkdir(ns, &ALICE, "/src/d", 0o555).unwrap();
    assert_eq!(rename(ns, &ALICE, "/src/f", "/ro/f").err(), Some(FsStatus::PermissionDenied));
    assert_eq!(rename(ns, &ALICE, "/ro", "/rw/ro").err(), Some(FsStatus::PermissionDenied), "root dir not writable");
    // Moving a directory to another parent needs write permission on it (for its `..`).
    assert_eq!(rename(ns, &ALICE, "/src/d", "/rw/d").err(), Some(FsStatus::PermissionDenied));
    rename(ns, &ALICE, "/src/d", "/src/d2").unwrap();
    rename(ns, &ALICE, "/src/f", "/rw/f").unwrap();
    own(ns, "/src/d2", &ALICE, 0o755);
    rename(ns, &ALICE, "/src/d2", "/rw/d").unwrap();
}

/// Sets an inode's link count behind the name space's back.
fn force_nlink<B: Backend>(ns: &Namespace<B>, ino: Ino, nlink: u32) {
    ns.backend()
        .transact(|t| {
            let mut n = t.get_inode(ino)?.expect("inode");
            n.attr.nlink = nlink;
            t.put_inode(&n)
        })
        .unwrap();
}

/// Operations that fail after they changed rows leave nothing behind.
fn rollback_mid_way<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/full", 0o755).unwrap();
    mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    mkdir(ns, &ROOT, "/d/sub", 0o755).unwrap();
    create(ns, &ROOT, "/full/f", 0o644).unwrap();
    let full = ino(ns, "/full");
    force_nlink(ns, full, LINK_COUNT_MAX);
    let before = snapshot(ns);
    // The entries move and the source directory is updated before the
    // target directory's link count overflows.
    assert_eq!(rename(ns, &ROOT, "/d/sub", "/full/sub").err(), Some(FsStatus::TooManyLinks));
    assert_eq!(mkdir(ns, &ROOT, "/full/x", 0o755).err(), Some(FsStatus::TooManyLinks));
    assert_eq!(snapshot(ns), before, "a failed operation left a trace");
    let f = ino(ns, "/full/f");
    force_nlink(ns, f, LINK_COUNT_MAX);
    assert_eq!(link(ns, "/full/f", "/g").err(), Some(FsStatus::TooManyLinks));
    force_nlink(ns, f, 1);
    force_nlink(ns, full, 2);
    rename(ns, &ROOT, "/d/sub", "/full/sub").unwrap();
}

fn sticky<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/tmp", 0o777).unwrap();
    own(ns, "/tmp", &CAROL, 0o1777);
    create(ns, &ALICE, "/tmp/a", 0o666).unwrap();
    create(ns, &BOB, "/tmp/b", 0o666).unwrap();
    mkdir(ns, &ALICE, "/tmp/ad", 0o777).unwrap();
    let denied = Some(FsStatus::NotPermitted);
    assert_eq!(unlink(ns, &BOB, "/tmp/a").err(), denied);
    assert_eq!(rmdir(ns, &BOB, "/tmp/ad").err(), denied);
    assert_eq!(rename(ns, &BOB, "/tmp/a", "/tmp/x").err(), denied, "rename away");
    assert_eq!(rename(ns, &BOB, "/tmp/b", "/tmp/a").err(), denied, "replace");
    mkdir(ns, &ROOT, "/pub", 0o777).unwrap();
    assert_eq!(rename(ns, &BOB, "/tmp/a", "/pub/a").err(), denied, "move out");
    create(ns, &ALICE, "/pub/p", 0o644).unwrap();
    rename(ns, &BOB, "/pub/p", "/pub/q").unwrap();
    // The file's owner, the directory's owner and root may.
    rename(ns, &ALICE, "/tmp/a", "/tmp/a2").unwrap();
    unlink(ns, &CAROL, "/tmp/a2").unwrap();
    rmdir(ns, &ROOT, "/tmp/ad").unwrap();
    unlink(ns, &BOB, "/tmp/b").unwrap();
}

fn walk_case<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/a", 0o755).unwrap();
    mkdir(ns, &ROOT, "/a/b", 0o755).unwrap();
    let f = create(ns, &ROOT, "/a/b/f", 0o644).unwrap();
    let b = ino(ns, "/a/b");
    for path in ["/a/b/f", "//a///b/f", "/a/./b/f", "/a/b/../b/f", "/../a/b/f", "/a/b/../../a/b/f"] {
        assert_eq!(ns.walk(&ALICE, path, true).unwrap(), f, "{path}");
    }
    for path in ["/a/b", "/a/b/", "/a/b/.", "/a/b//", "/a/b/f/.."] {
        let got = ns.walk(&ALICE, path, true).map(|n| n.attr.ino);
        let want = if path.ends_with("f/..") { Err(FsStatus::NotDir) } else { Ok(b) };
        assert_eq!(got, want, "{path}");
    }
    assert_eq!(ns.walk(&ALICE, "/", true).unwrap().attr.ino, ROOT_INO);
    assert_eq!(ns.walk(&ALICE, "//", true).unwrap().attr.ino, ROOT_INO);
    assert_eq!(ns.walk(&ALICE, "/..", true).unwrap().attr.ino, ROOT_INO);
    assert_eq!(ns.walk(&ALICE, "/a/b/f/", true).err(), Some(FsStatus::NotDir));
    assert_eq!(ns.walk(&ALICE, "/a/b/f/g", true).err(), Some(FsStatus::NotDir));
    assert_eq!(ns.walk(&ALICE, "/a/x/f", true).err(), Some(FsStatus::NotFound));
    assert_eq!(ns.walk(&ALICE, "a/b", true).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.walk(&ALICE, "", true).err(), Some(FsStatus::InvalidArgument));
    let long = format!("/{}", "a/".repeat(PATH_MAX / 2));
    assert_eq!(ns.walk(&ALICE, &long, true).err(), Some(FsStatus::NameTooLong));
    let name = format!("/{}", "n".repeat(FILE_NAME_MAX + 1));
    assert_eq!(ns.walk(&ALICE, &name, true).err(), Some(FsStatus::NameTooLong));
    own(ns, "/a", &BOB, 0o700);
    assert_eq!(ns.walk(&ALICE, "/a/b/f", true).err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.walk(&ALICE, "/a", true).unwrap().attr.ino, ino(ns, "/a"), "the last name needs no x");
    assert_eq!(ns.walk(&BOB, "/a/b/f", true).unwrap(), f);
    own(ns, "/a", &BOB, 0o600);
    assert_eq!(ns.walk(&BOB, "/a/b/f", true).err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.walk(&ROOT, "/a/b/f", true).unwrap(), f);
}

fn walk_symlinks<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/a", 0o755).unwrap();
    mkdir(ns, &ROOT, "/a/b", 0o755).unwrap();
    let f = create(ns, &ROOT, "/a/b/f", 0o644).unwrap();
    let b = ino(ns, "/a/b");
    symlink(ns, "/a/rel", "b").unwrap();
    symlink(ns, "/abs", "/a/b").unwrap();
    symlink(ns, "/a/b/up", "../rel/f").unwrap();
    symlink(ns, "/chain", "abs/../rel/./f").unwrap();
    symlink(ns, "/dangling", "/nowhere").unwrap();
    symlink(ns, "/tofile", "a/b/f/").unwrap();
    let walk = |p: &str, follow: bool| ns.walk(&ALICE, p, follow);
    assert_eq!(walk("/a/rel", true).unwrap().attr.ino, b, "relative target from the link's directory");
    let rel = walk("/a/rel", false).unwrap();
    assert_eq!((rel.attr.kind, rel.target.as_deref()), (FileKind::Symlink, Some("b")));
    assert_eq!(walk("/a/rel/", false).unwrap().attr.ino, b, "a trailing slash follows");
    assert_eq!(walk("/a/rel/f", false).unwrap(), f, "intermediate links are always followed");
    assert_eq!(walk("/abs/f", false).unwrap(), f);
    assert_eq!(walk("/abs/..", true).unwrap().attr.ino, ino(ns, "/a"), "`..` by inode, not lexically");
    assert_eq!(walk("/a/b/up", true).unwrap(), f);
    assert_eq!(walk("/chain", true).unwrap(), f);
    assert_eq!(walk("/dangling", true).err(), Some(FsStatus::NotFound));
    assert_eq!(walk("/dangling", false).unwrap().attr.kind, FileKind::Symlink);
    assert_eq!(walk("/tofile", true).err(), Some(FsStatus::NotDir));
    own(ns, "/a/b", &BOB, 0o700);
    assert_eq!(walk("/abs/f", true).err(), Some(FsStatus::PermissionDenied), "x checked through links");
}

fn symlink_loops<B: Backend>(ns: &Namespace<B>) {
    symlink(ns, "/self", "self").unwrap();
    symlink(ns, "/l1", "/l2").unwrap();
    symlink(ns, "/l2", "l1").unwrap();
    for p in ["/self", "/l1", "/l2/x"] {
        assert_eq!(ns.walk(&ROOT, p, true).err(), Some(FsStatus::SymlinkLoop), "{p}");
    }
    assert_eq!(ns.walk(&ROOT, "/self", false).unwrap().attr.kind, FileKind::Symlink);
    // A chain of exactly SYMLINK_FOLLOW_MAX links resolves; one more does not.
    mkdir(ns, &ROOT, "/end", 0o755).unwrap();
    symlink(ns, "/c0", "/end").unwrap();
    for i in 1..=SYMLINK_FOLLOW_MAX {
        symlink(ns, &format!("/c{i}"), &format!("c{}", i - 1)).unwrap();
    }
    let last = SYMLINK_FOLLOW_MAX - 1;
    assert_eq!(ns.walk(&ROOT, &format!("/c{last}"), true).unwrap().attr.ino, ino(ns, "/end"));
    let over = format!("/c{SYMLINK_FOLLOW_MAX}");
    assert_eq!(ns.walk(&ROOT, &over, true).err(), Some(FsStatus::SymlinkLoop));
}

fn chmod_chown<B: Backend>(ns: &Namespace<B>) {
    let f = create(ns, &ROOT, "/f", 0o644).unwrap();
    own(ns, "/f", &ALICE, 0o644);
    let (i, object) = (f.attr.ino, single(&f));
    let chmod = |who: &Caller, mode: u32| ns.setattr(who, i, &SetAttrs { mode: Some(mode), ..SetAttrs::default() });
    let acv = ns.getattr(i).unwrap().acv;
    let (n, intent) = chmod(&ALICE, 0o600).unwrap();
    assert_eq!(n.attr.mode, 0o600);
    assert_eq!(intent, vec![AcvIntent { object, acv: acv + 1 }]);
    assert_eq!(n.acv, acv + 1);
    assert_eq!(ns.acv_intents(10).unwrap(), intent);
    assert_eq!(chmod(&BOB, 0o666).err(), Some(FsStatus::NotPermitted));
    assert_eq!(chmod(&ALICE, 0o10_000).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(chmod(&ROOT, 0o4755).unwrap().0.attr.mode, 0o4755);
    assert_eq!(chmod(&ALICE, 0o2755).unwrap().0.attr.mode, 0o2755, "own group keeps setgid");
    let set = |who: &Caller, s: SetAttrs| ns.setattr(who, i, &s).map(|(n, _)| (n.attr.uid, n.attr.gid, n.attr.mode));
    let uid = |u| SetAttrs { uid: Some(u), ..SetAttrs::default() };
    let gid = |g| SetAttrs { gid: Some(g), ..SetAttrs::default() };
    assert_eq!(set(&ALICE, uid(1001)).err(), Some(FsStatus::NotPermitted), "only root gives files away");
    assert_eq!(set(&BOB, uid(1000)).err(), Some(FsStatus::NotPermitted));
    assert_eq!(set(&ALICE, gid(200)).err(), Some(FsStatus::NotPermitted), "not ALICE's group");
    assert_eq!(set(&BOB, gid(100)).err(), Some(FsStatus::NotPermitted), "not BOB's file");
    assert_eq!(set(&ALICE, uid(1000)).unwrap(), (1000, 100, 0o755), "no-op chown clears setgid");
    chmod(&ALICE, 0o4755).unwrap();
    assert_eq!(set(&ROOT, gid(200)).unwrap(), (1000, 200, 0o755), "chown clears setuid");
    assert_eq!(chmod(&ALICE, 0o2755).unwrap().0.attr.mode, 0o755, "not in the file's group: setgid dropped");
    assert_eq!(set(&ALICE, gid(100)).unwrap(), (1000, 100, 0o755), "owner to own group");
    assert_eq!(set(&ROOT, uid(1002)).unwrap(), (1002, 100, 0o755));
    let both = SetAttrs { mode: Some(0o6750), uid: Some(1000), gid: Some(200), ..SetAttrs::default() };
    assert_eq!(set(&ROOT, both).unwrap(), (1000, 200, 0o6750), "an explicit mode wins over the chown rule");
    let regroup = SetAttrs { mode: Some(0o2755), gid: Some(100), ..SetAttrs::default() };
    assert_eq!(set(&ALICE, regroup).unwrap(), (1000, 100, 0o2755), "setgid judged against the new group");
    let last = ns.getattr(i).unwrap();
    assert_eq!(ns.acv_intents(10).unwrap(), vec![AcvIntent { object, acv: last.acv }], "one intent, newest acv");
    // Directories: allowed, no intent; ctime moves.
    let d = mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    let (n, intent) = ns.setattr(&ROOT, d.attr.ino, &SetAttrs { mode: Some(0o700), ..SetAttrs::default() }).unwrap();
    assert_eq!((n.attr.mode, intent, n.acv), (0o700, vec![], 0));
    assert!(n.attr.ctime_ns >= d.attr.ctime_ns);
    let (same, intent) = ns.setattr(&CAROL, i, &SetAttrs::default()).unwrap();
    assert_eq!((same, intent), (last, vec![]), "an empty setattr changes nothing");
    assert_eq!(ns.setattr(&ROOT, 9999, &uid(1)).err(), Some(FsStatus::NotFound));
}

fn truncate_utimes<B: Backend>(ns: &Namespace<B>) {
    let f = create(ns, &ROOT, "/f", 0o644).unwrap();
    own(ns, "/f", &ALICE, 0o664);
    let i = f.attr.ino;
    let size = |s| SetAttrs { size: Some(s), ..SetAttrs::default() };
    let times = SetAttrs { atime_ns: Some(11), mtime_ns: Some(22), ..SetAttrs::default() };
    ns.setattr(&ALICE, i, &times).unwrap();
    let (n, intent) = ns.setattr(&BOB, i, &size(100)).unwrap();
    assert_eq!((n.attr.size, intent, n.acv), (100, vec![], 1), "truncate does not revoke (acv 1 from own)");
    assert!(n.attr.mtime_ns > 22 && n.attr.ctime_ns > 22);
    assert_eq!(ns.setattr(&CAROL, i, &size(0)).err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.setattr(&ROOT, i, &size(0)).unwrap().0.attr.size, 0);
    let d = mkdir(ns, &ROOT, "/d", 0o777).unwrap();
    assert_eq!(ns.setattr(&ROOT, d.attr.ino, &size(0)).err(), Some(FsStatus::IsDir));
    let l = symlink(ns, "/l", "f").unwrap();
    assert_eq!(ns.setattr(&ROOT, l.attr.ino, &size(0)).err(), Some(FsStatus::InvalidArgument));
    let (n, _) = ns.setattr(&ALICE, i, &times).unwrap();
    assert_eq!((n.attr.atime_ns, n.attr.mtime_ns), (11, 22));
    assert!(n.attr.ctime_ns > 22);
    assert_eq!(ns.setattr(&BOB, i, &times).err(), Some(FsStatus::NotPermitted), "times: owner or root");
    let only_m = SetAttrs { mtime_ns: Some(33), ..SetAttrs::default() };
    let (n, _) = ns.setattr(&ROOT, i, &only_m).unwrap();
    assert_eq!((n.attr.atime_ns, n.attr.mtime_ns), (11, 33));
}

fn acv_intents<B: Backend>(ns: &Namespace<B>) {
    let f = create(ns, &ROOT, "/f", 0o644).unwrap();
    let g = create(ns, &ROOT, "/g", 0o644).unwrap();
    let (fo, go) = (single(&f), single(&g));
    assert_eq!(ns.bump_acv(f.attr.ino).unwrap(), vec![AcvIntent { object: fo, acv: 1 }]);
    assert_eq!(ns.bump_acv(f.attr.ino).unwrap(), vec![AcvIntent { object: fo, acv: 2 }]);
    assert_eq!(ns.bump_acv(g.attr.ino).unwrap(), vec![AcvIntent { object: go, acv: 1 }]);
    assert_eq!(ns.getattr(f.attr.ino).unwrap().acv, 2);
    let mut all = ns.acv_intents(10).unwrap();
    all.sort_by_key(|i| i.object);
    let mut want = vec![AcvIntent { object: fo, acv: 2 }, AcvIntent { object: go, acv: 1 }];
    want.sort_by_key(|i| i.object);
    assert_eq!(all, want);
    assert_eq!(ns.acv_intents(1).unwrap().len(), 1);
    for o in [fo, go] {
        let on: Vec<AcvIntent> = want.iter().filter(|i| i.object.drive == o.drive).copied().collect();
        assert_eq!(ns.acv_intents_on(o.drive, 10).unwrap(), on, "drive {}'s intents only", o.drive);
    }
    assert!(ns.acv_intents_on(u32::MAX, 10).unwrap().is_empty());
    ns.forget_acv_intent(&AcvIntent { object: fo, acv: 1 }).unwrap();
    assert_eq!(ns.acv_intents(10).unwrap().len(), 2, "an older intent does not remove a newer one");
    ns.forget_acv_intent(&AcvIntent { object: fo, acv: 2 }).unwrap();
    assert_eq!(ns.acv_intents(10).unwrap(), vec![AcvIntent { object: go, acv: 1 }]);
    ns.forget_acv_intent(&AcvIntent { object: fo, acv: 2 }).unwrap();
    let d = mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    assert_eq!(ns.bump_acv(d.attr.ino).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.bump_acv(9999).err(), Some(FsStatus::NotFound));
    // Doom clears a pending intent.
    assert_eq!(unlink(ns, &ROOT, "/g").unwrap().doomed, vec![go]);
    assert!(ns.acv_intents(10).unwrap().is_empty());
}

fn record_size_usage<B: Backend>(ns: &Namespace<B>) {
    let (inodes, bytes) = ns.usage().unwrap();
    assert_eq!((inodes, bytes), (1, 0));
    let f = create(ns, &ROOT, "/f", 0o644).unwrap();
    create(ns, &ROOT, "/g", 0o644).unwrap();
    mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    symlink(ns, "/l", "abcdef").unwrap();
    let n = ns.record_size(f.attr.ino, 1000, 1000, 1234).unwrap();
    assert_eq!((n.attr.size, n.attr.mtime_ns), (1000, 1234));
    assert!(n.attr.ctime_ns > 1234);
    ns.record_size(ino(ns, "/g"), 24, 24, 1).unwrap();
    assert_eq!(ns.usage().unwrap(), (5, 1024), "symlink and directory sizes are not file bytes");
    assert_eq!(ns.record_size(ino(ns, "/d"), 1, 1, 1).err(), Some(FsStatus::IsDir));
    assert_eq!(ns.record_size(ino(ns, "/l"), 1, 1, 1).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.record_size(9999, 1, 1, 1).err(), Some(FsStatus::NotFound));
    unlink(ns, &ROOT, "/f").unwrap();
    assert_eq!(ns.usage().unwrap(), (4, 24));
}

fn pool_and_known_objects<B: Backend>(ns: &Namespace<B>) {
    assert_eq!(ns.pool_len(1).unwrap(), POOLED as usize);
    assert_eq!(ns.pool_len(2).unwrap(), 0);
    assert_eq!(ns.pool_len(9).unwrap(), 0);
    let before = snapshot(ns);
    assert_eq!(ns.pool_add(&[obj(2, 1), obj(9, 1)]).err(), Some(FsStatus::InvalidArgument), "unknown drive");
    assert_eq!(ns.pool_add(&[obj(2, 1), obj(1, 100)]).err(), Some(FsStatus::Exists), "already pooled");
    assert_eq!(ns.pool_add(&[obj(2, 1), obj(2, 1)]).err(), Some(FsStatus::Exists), "duplicate in batch");
    let many: Vec<ObjectRef> = (0..BATCH_MAX as u64 + 1).map(|o| obj(2, 1000 + o)).collect();
    assert_eq!(ns.pool_add(&many).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(snapshot(ns), before, "a failed pool_add adds nothing");
    ns.pool_add(&[obj(2, 1), obj(2, 2)]).unwrap();
    assert_eq!(ns.pool_len(2).unwrap(), 2);
    let f = single(&create(ns, &ROOT, "/f", 0o644).unwrap());
    let g = single(&create(ns, &ROOT, "/g", 0o644).unwrap());
    unlink(ns, &ROOT, "/g").unwrap();
    assert_eq!(ns.pool_add(&[f]).err(), Some(FsStatus::Exists), "held by a file");
    assert_eq!(ns.pool_add(&[g]).err(), Some(FsStatus::Exists), "doomed");
    let want: BTreeSet<u64> = (100..100 + POOLED).collect();
    assert_eq!(ns.known_objects(1).unwrap(), want, "files + pool + doomed");
    assert_eq!(ns.known_objects(2).unwrap(), BTreeSet::from([1, 2]));
    assert!(ns.known_objects(9).unwrap().is_empty());
    ns.forget_doomed(&[g]).unwrap();
    assert!(!ns.known_objects(1).unwrap().contains(&g.object));
}

/// Leases: one holder at a time, taken over once lapsed, every acquisition
/// a new fencing token, and the fence refusing a holder that lost its lease.
fn leases<B: Backend>(ns: &Namespace<B>) {
    use std::time::Duration;
    let long = Duration::from_secs(3600);
    let a = ns.acquire_lease("drive/1", "manager-a", long).unwrap().expect("a free lease is taken");
    assert_eq!((a.holder.as_str(), a.token), ("manager-a", 1));
    assert_eq!(ns.acquire_lease("drive/1", "manager-b", long).unwrap(), None, "held by another, unexpired");
    assert!(ns.acquire_lease("drive/2", "manager-b", long).unwrap().is_some(), "leases are independent");
    let again = ns.acquire_lease("drive/1", "manager-a", long).unwrap().expect("its own holder takes it again");
    assert_eq!(again.token, 2, "every acquisition moves the token on");
    assert_eq!(ns.renew_lease(&a, long).unwrap(), None, "the first acquisition's token is fenced off");
    let renewed = ns.renew_lease(&again, long).unwrap().expect("renewed");
    assert_eq!(renewed.token, again.token, "a renewal keeps the token");
    assert!(renewed.expires_ms >= again.expires_ms);
    // The fence: objects made under a lease are recorded only by its holder.
    assert_eq!(ns.pool_add_fenced(&[obj(2, 7)], &a).err(), Some(FsStatus::Busy), "a lost lease records nothing");
    assert_eq!(ns.pool_len(2).unwrap(), 0);
    ns.pool_add_fenced(&[obj(2, 7)], &renewed).unwrap();
    assert_eq!(ns.pool_len(2).unwrap(), 1);
    // Lapsed: another holder takes it over, and the old holder is fenced off.
    let short = ns.acquire_lease("drive/3", "manager-a", Duration::from_millis(1)).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let taken = ns.acquire_lease("drive/3", "manager-b", long).unwrap().expect("a lapsed lease is taken over");
    assert_eq!((taken.holder.as_str(), taken.token), ("manager-b", short.token + 1));
    assert_eq!(ns.renew_lease(&short, long).unwrap(), None);
    assert!(!ns.release_lease(&short).unwrap(), "only its holder releases it");
    assert_eq!(ns.lease("drive/3").unwrap(), Some(taken.clone()));
    assert!(ns.release_lease(&taken).unwrap());
    assert_eq!(ns.lease("drive/3").unwrap(), None);
    let next = ns.acquire_lease("drive/3", "manager-a", long).unwrap().unwrap();
    assert_eq!(next.token, 1, "a released lease starts over");
    // Bad arguments.
    for (name, holder, ttl) in [("", "m", long), ("n", "", long), ("n", "m", Duration::ZERO), ("n", "m", long * 25)] {
        assert_eq!(ns.acquire_lease(name, holder, ttl).err(), Some(FsStatus::InvalidArgument), "{name:?} {holder:?}");
    }
    let long_name = "x".repeat(crate::LEASE_NAME_MAX + 1);
    assert_eq!(ns.acquire_lease(&long_name, "m", long).err(), Some(FsStatus::InvalidArgument));
    // Counters and set-once settings.
    assert_eq!(ns.counter("users_epoch").unwrap(), 0);
    assert_eq!(ns.bump_counter("users_epoch").unwrap(), 1);
    assert_eq!(ns.bump_counter("users_epoch").unwrap(), 2);
    assert_eq!(ns.counter("users_epoch").unwrap(), 2);
    assert_eq!(ns.setting_or_insert("fs_id", b"first").unwrap(), b"first");
    assert_eq!(ns.setting_or_insert("fs_id", b"second").unwrap(), b"first", "the first value stays");
}

/// Reserved objects leave the pool yet stay known until released or lapsed.
fn reservations<B: Backend>(ns: &Namespace<B>) {
    use std::time::Duration;
    let o = ns.reserve_pooled_object(1, "manager-a", Duration::from_secs(3600)).unwrap().expect("pooled");
    assert_eq!(ns.pool_len(1).unwrap(), POOLED as usize - 1, "out of the pool");
    assert!(ns.known_objects(1).unwrap().contains(&o.object), "still known: orphan collection keeps it");
    assert_eq!(ns.drop_lapsed_reservations(1).unwrap(), 0);
    ns.unreserve_object(&o).unwrap();
    assert!(!ns.known_objects(1).unwrap().contains(&o.object), "released: an orphan unless a file names it");
    let p = ns.reserve_pooled_object(1, "manager-a", Duration::from_millis(1)).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!ns.known_objects(1).unwrap().contains(&p.object), "a lapsed reservation keeps nothing");
    assert_eq!(ns.drop_lapsed_reservations(1).unwrap(), 1);
    assert_eq!(ns.drop_lapsed_reservations(1).unwrap(), 0);
    assert_eq!(ns.reserve_pooled_object(2, "manager-a", Duration::from_secs(1)).unwrap(), None, "empty pool");
}

fn doomed_log<B: Backend>(ns: &Namespace<B>) {
    let n = BATCH_MAX + 3;
    let extra: Vec<ObjectRef> = (0..n as u64).map(|o| obj(2, o)).collect();
    for chunk in extra.chunks(BATCH_MAX) {
        ns.pool_add(chunk).unwrap();
    }
    mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    let d = ino(ns, "/d");
    for i in 0..n {
        ns.create(&ROOT, d, &format!("f{i}"), 0o644, true, false, &mut pool_placer(&[2])).unwrap();
    }
    for i in 0..n {
        ns.unlink(&ROOT, d, &format!("f{i}")).unwrap();
    }
    let first = ns.doomed(usize::MAX).unwrap();
    assert_eq!(first.len(), BATCH_MAX, "limit is capped");
    assert_eq!(ns.doomed_on(2, usize::MAX).unwrap(), first, "all on drive 2");
    assert_eq!(ns.doomed_on(2, 2).unwrap(), first[..2]);
    assert!(ns.doomed_on(3, 10).unwrap().is_empty(), "none on drive 3");
    assert_eq!(ns.doomed(2).unwrap(), first[..2]);
    assert_eq!(ns.forget_doomed(&extra).err(), Some(FsStatus::InvalidArgument));
    ns.forget_doomed(&first).unwrap();
    ns.forget_doomed(&first).unwrap();
    let rest = ns.doomed(usize::MAX).unwrap();
    assert_eq!(rest.len(), 3);
    let mut all: Vec<ObjectRef> = first.into_iter().chain(rest).collect();
    all.sort();
    let mut want = extra.clone();
    want.sort();
    assert_eq!(all, want);
}

fn user(name: &str, uid: u32) -> User {
    User {
        name: name.to_owned(),
        uid,
        gid: 100,
        password_hash: format!("hash-{name}"),
        admin: uid == 0,
        groups: Vec::new(),
        gateway: None,
    }
}

fn users<B: Backend>(ns: &Namespace<B>) {
    assert!(ns.users().unwrap().is_empty());
    ns.add_user(&user("zoe", 1001)).unwrap();
    ns.add_user(&user("admin", 0)).unwrap();
    ns.add_user(&user("Bob", 1003)).unwrap();
    assert_eq!(ns.add_user(&user("zoe", 1002)).err(), Some(FsStatus::Exists));
    assert_eq!(ns.add_user(&user("amy", 1001)).err(), Some(FsStatus::Exists));
    assert_eq!(ns.add_user(&user("", 5)).err(), Some(FsStatus::InvalidArgument));
    let long = "u".repeat(crate::USER_NAME_MAX + 1);
    assert_eq!(ns.add_user(&user(&long, 5)).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.user("zoe").unwrap(), Some(user("zoe", 1001)));
    assert_eq!(ns.user("nobody").unwrap(), None);
    let by_bytes = vec![user("Bob", 1003), user("admin", 0), user("zoe", 1001)];
    assert_eq!(ns.users().unwrap(), by_bytes, "ordered by the names' bytes");
    ns.set_password("zoe", "new").unwrap();
    assert_eq!(ns.user("zoe").unwrap().unwrap().password_hash, "new");
    assert_eq!(ns.set_password("nobody", "x").err(), Some(FsStatus::NotFound));
    let huge = "h".repeat(crate::PASSWORD_HASH_MAX + 1);
    assert_eq!(ns.set_password("zoe", &huge).err(), Some(FsStatus::InvalidArgument));
    assert!(!format!("{:?}", ns.user("zoe").unwrap()).contains("new"), "Debug redacts the hash");
    // Supplementary groups: stored with the user, replaced whole, kept by a password change.
    let grouped = User { groups: vec![7, 100, 4_000_000_000], ..user("gus", 1007) };
    ns.add_user(&grouped).unwrap();
    assert_eq!(ns.user("gus").unwrap(), Some(grouped.clone()));
    ns.set_user_groups("gus", &[8]).unwrap();
    ns.set_password("gus", "hash2").unwrap();
    let got = ns.user("gus").unwrap().unwrap();
    assert_eq!((got.groups, got.password_hash.as_str()), (vec![8], "hash2"));
    assert_eq!(ns.users().unwrap().iter().find(|u| u.name == "gus").map(|u| u.groups.clone()), Some(vec![8]));
    ns.set_user_groups("gus", &[]).unwrap();
    assert!(ns.user("gus").unwrap().unwrap().groups.is_empty());
    for bad in [vec![2, 1], vec![3, 3], (0..=GROUPS_MAX as u32).collect()] {
        assert_eq!(ns.set_user_groups("gus", &bad).err(), Some(FsStatus::InvalidArgument), "{bad:?}");
        let u = User { groups: bad.clone(), ..user("hal", 1004) };
        assert_eq!(ns.add_user(&u).err(), Some(FsStatus::InvalidArgument), "{bad:?}");
    }
    let most: Vec<u32> = (0..GROUPS_MAX as u32).collect();
    ns.set_user_groups("gus", &most).unwrap();
    assert_eq!(ns.user("gus").unwrap().unwrap().groups, most);
    assert_eq!(ns.set_user_groups("nobody", &[1]).err(), Some(FsStatus::NotFound));
    // Gateway grants: stored with the user, kept by other changes, taken away.
    ns.set_gateway("gus", Some((1000, 60_000))).unwrap();
    ns.set_password("gus", "hash3").unwrap();
    ns.set_user_groups("gus", &[9]).unwrap();
    let got = ns.user("gus").unwrap().unwrap();
    assert_eq!((got.gateway, got.groups), (Some((1000, 60_000)), vec![9]));
    ns.set_gateway("gus", Some((0, u32::MAX))).unwrap();
    assert_eq!(ns.user("gus").unwrap().unwrap().gateway, Some((0, u32::MAX)), "the whole id space");
    assert_eq!(ns.set_gateway("gus", Some((5, 4))).err(), Some(FsStatus::InvalidArgument));
    ns.set_gateway("gus", None).unwrap();
    assert_eq!(ns.user("gus").unwrap().unwrap().gateway, None);
    assert_eq!(ns.set_gateway("nobody", None).err(), Some(FsStatus::NotFound));
    let backwards = User { gateway: Some((2, 1)), ..user("ida", 1005) };
    assert_eq!(ns.add_user(&backwards).err(), Some(FsStatus::InvalidArgument));
    let granted = User { gateway: Some((7, 7)), ..user("ida", 1005) };
    ns.add_user(&granted).unwrap();
    assert_eq!(ns.user("ida").unwrap(), Some(granted));
}

fn drives<B: Backend>(ns: &Namespace<B>) {
    let wide = || WIDE.iter().map(|&d| drive_rec(d));
    assert_eq!(ns.drives().unwrap(), [drive_rec(1), drive_rec(2)].into_iter().chain(wide()).collect::<Vec<_>>());
    assert_eq!(ns.add_drive(&drive_rec(1)).err(), Some(FsStatus::Exists));
    let mut same_id = drive_rec(8);
    same_id.drive_id = drive_rec(2).drive_id;
    assert_eq!(ns.add_drive(&same_id).err(), Some(FsStatus::Exists));
    ns.add_drive(&drive_rec(0)).unwrap();
    let mut d2 = drive_rec(2);
    d2.sealed_keys = vec![9; 64];
    d2.addr = "10.0.0.2:7000".into();
    ns.update_drive(&d2).unwrap();
    let want: Vec<DriveRecord> = [drive_rec(0), drive_rec(1), d2.clone()].into_iter().chain(wide()).collect();
    assert_eq!(ns.drives().unwrap(), want);
    assert_eq!(ns.update_drive(&drive_rec(9)).err(), Some(FsStatus::NotFound));
    d2.drive_id = drive_rec(1).drive_id;
    assert_eq!(ns.update_drive(&d2).err(), Some(FsStatus::Exists));
    let mut big = drive_rec(7);
    big.sealed_keys = vec![0; crate::SEALED_KEYS_MAX + 1];
    assert_eq!(ns.add_drive(&big).err(), Some(FsStatus::InvalidArgument));
    let mut far = drive_rec(7);
    far.failure_domain = "r".repeat(nasd_proto::limits::NAME_LEN_MAX + 1);
    assert_eq!(ns.add_drive(&far).err(), Some(FsStatus::InvalidArgument), "failure domain too long");
    far.failure_domain.pop();
    ns.add_drive(&far).unwrap();
    assert!(!format!("{:?}", drive_rec(1)).contains("[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1"));
}

fn settings<B: Backend>(ns: &Namespace<B>) {
    assert_eq!(ns.setting("fs_id").unwrap(), None);
    ns.set_setting("fs_id", b"abc").unwrap();
    ns.set_setting("key", &[0, 1, 2]).unwrap();
    assert_eq!(ns.setting("fs_id").unwrap(), Some(b"abc".to_vec()));
    ns.set_setting("fs_id", b"").unwrap();
    assert_eq!(ns.setting("fs_id").unwrap(), Some(vec![]));
    assert_eq!(ns.setting("key").unwrap(), Some(vec![0, 1, 2]));
    assert_eq!(ns.set_setting("", b"x").err(), Some(FsStatus::InvalidArgument));
    let big = vec![0; crate::SETTING_VALUE_MAX + 1];
    assert_eq!(ns.set_setting("k", &big).err(), Some(FsStatus::InvalidArgument));
}

fn inode_numbers<B: Backend>(ns: &Namespace<B>) {
    let a = create(ns, &ROOT, "/a", 0o644).unwrap().attr.ino;
    unlink(ns, &ROOT, "/a").unwrap();
    let d = mkdir(ns, &ROOT, "/d", 0o755).unwrap().attr.ino;
    rmdir(ns, &ROOT, "/d").unwrap();
    let s = symlink(ns, "/s", "x").unwrap().attr.ino;
    assert!(ROOT_INO < a && a < d && d < s, "inode numbers are never reused");
    // A failed operation may burn numbers but never hands one out twice.
    let _ = symlink(ns, "/s", "x");
    assert!(symlink(ns, "/t", "x").unwrap().attr.ino > s);
}

fn concurrency<B: Backend>(ns: &Namespace<B>) {
    const THREADS: u32 = 4;
    const EACH: u32 = 20;
    std::thread::scope(|scope| {
        for th in 0..THREADS {
            scope.spawn(move || {
                for i in 0..EACH {
                    ns.mkdir(&ROOT, ROOT_INO, &format!("t{th}-{i}"), 0o755).unwrap();
                    ns.create(&ROOT, ROOT_INO, "shared", 0o644, false, false, &mut pool_placer(&[1])).unwrap();
                }
            });
        }
    });
    let r = ns.getattr(ROOT_INO).unwrap();
    assert_eq!((r.attr.nlink, r.attr.size), (2 + THREADS * EACH, u64::from(THREADS * EACH) + 1));
    assert_eq!(ns.pool_len(1).unwrap(), POOLED as usize - 1, "only one create made the file");
}

// ---- atomicity ----

type Step<B> = (&'static str, fn(&Namespace<Failing<B>>) -> Result<(), FsStatus>);

/// Operations that touch many rows, each failed after every possible number
/// of row operations: a failed operation must leave no trace.
fn rollback<B: Backend>(ns: Namespace<Failing<B>>) {
    setup(&ns);
    let steps: Vec<Step<B>> = vec![
        ("mkdir", |ns| mkdir(ns, &ROOT, "/d", 0o755).map(drop)),
        ("create", |ns| create(ns, &ROOT, "/d/f", 0o644).map(drop)),
        ("link", |ns| link(ns, "/d/f", "/g").map(drop)),
        ("symlink", |ns| symlink(ns, "/d/s", "../g").map(drop)),
        ("mkdir2", |ns| mkdir(ns, &ROOT, "/e", 0o755).map(drop)),
        ("mkdir3", |ns| mkdir(ns, &ROOT, "/e/x", 0o755).map(drop)),
        ("rename dir over empty dir across", |ns| rename(ns, &ROOT, "/d", "/e/x").map(drop)),
        ("create2", |ns| create(ns, &ROOT, "/h", 0o644).map(drop)),
        ("rename file over linked file", |ns| rename(ns, &ROOT, "/h", "/g").map(drop)),
        ("chown", |ns| ns.setattr(&ROOT, ino(ns, "/g"), &SetAttrs { uid: Some(5), ..Default::default() }).map(drop)),
        ("unlink last link", |ns| unlink(ns, &ROOT, "/g").map(drop)),
        ("unlink", |ns| unlink(ns, &ROOT, "/e/x/f").map(drop)),
        ("unlink symlink", |ns| unlink(ns, &ROOT, "/e/x/s").map(drop)),
        ("rmdir", |ns| rmdir(ns, &ROOT, "/e/x")),
        ("pool_add", |ns| ns.pool_add(&[obj(2, 1), obj(2, 2), obj(2, 3)])),
        ("forget_doomed", |ns| ns.forget_doomed(&ns.doomed(10)?)),
        ("add_user", |ns| ns.add_user(&user("u", 7))),
        ("mkdir w", |ns| mkdir(ns, &ROOT, "/w", 0o755).map(drop)),
        ("set_layout dir", |ns| {
            let rs = Layout::parse("rs:2+1").expect("layout");
            ns.set_layout(&ROOT, ino(ns, "/w"), Some(rs), &mut pool_placer(&[])).map(drop)
        }),
        ("create of three components", |ns| {
            let w = ino(ns, "/w");
            ns.create(&ROOT, w, "f", 0o644, true, false, &mut pool_placer(&[1, 3, 4, 5])).map(drop)
        }),
        ("set_layout file", |ns| {
            let s2 = Layout::parse("stripe:2").expect("layout");
            ns.set_layout(&ROOT, ino(ns, "/w/f"), Some(s2), &mut pool_placer(&[5, 6])).map(drop)
        }),
        ("chmod of two components", |ns| {
            ns.setattr(&ROOT, ino(ns, "/w/f"), &SetAttrs { mode: Some(0o600), ..Default::default() }).map(drop)
        }),
        ("begin_write", |ns| ns.begin_write(&ROOT, ino(ns, "/w/f"), 1).map(drop)),
        ("commit_write with stale ranges", |ns| {
            let f = ino(ns, "/w/f");
            let txn = ns.intent_of(f)?.expect("an open intent").txn;
            let stale = [(0, StaleRange { offset: 0, length: 10 }), (1, StaleRange { offset: 5, length: 10 })];
            ns.commit_write(&ROOT, f, txn, 100, 100, &stale, 7).map(drop)
        }),
        ("finish_intent", |ns| ns.finish_intent(ns.intent_of(ino(ns, "/w/f"))?.expect("intent").txn)),
        ("begin_write again", |ns| ns.begin_write(&ROOT, ino(ns, "/w/f"), 1).map(drop)),
        ("abort_intent", |ns| ns.abort_intent(ns.intent_of(ino(ns, "/w/f"))?.expect("intent").txn).map(drop)),
        ("mark_stale", |ns| ns.mark_stale(ino(ns, "/w/f"), 0, &[StaleRange { offset: 100, length: 5 }])),
        ("finish_intent of the abort", |ns| ns.finish_intent(ns.intent_of(ino(ns, "/w/f"))?.expect("intent").txn)),
        ("begin_write for a resync", |ns| ns.begin_write(&ROOT, ino(ns, "/w/f"), 1).map(drop)),
        ("commit_resync", |ns| {
            let f = ino(ns, "/w/f");
            ns.commit_resync(f, ns.intent_of(f)?.expect("an open intent").txn, 0).map(drop)
        }),
        ("finish_intent of the resync", |ns| ns.finish_intent(ns.intent_of(ino(ns, "/w/f"))?.expect("intent").txn)),
        ("mark_stale again", |ns| ns.mark_stale(ino(ns, "/w/f"), 0, &[StaleRange { offset: 100, length: 5 }])),
        ("begin_write to abort", |ns| ns.begin_write(&ROOT, ino(ns, "/w/f"), 1).map(drop)),
        ("abort_intent again", |ns| ns.abort_intent(ns.intent_of(ino(ns, "/w/f"))?.expect("intent").txn).map(drop)),
        ("clear_stale", |ns| ns.clear_stale(ino(ns, "/w/f"), 1)),
        ("replace_component", |ns| {
            ns.replace_component(ino(ns, "/w/f"), 0, obj(3, 9000), ComponentState::Ok).map(drop)
        }),
        ("set_drive_state", |ns| ns.set_drive_state(4, DriveState::Out).map(drop)),
        ("bump_map_epoch", |ns| ns.bump_map_epoch().map(drop)),
        ("unlink of two components with intent and stale ranges", |ns| unlink(ns, &ROOT, "/w/f").map(drop)),
    ];
    for (name, step) in steps {
        let mut fail_at = 0;
        loop {
            let before = snapshot(&ns);
            ns.backend().fail_after(fail_at);
            let result = step(&ns);
            let fired = !ns.backend().disarm();
            if !fired {
                result.unwrap_or_else(|e| panic!("{name}: {e:?}"));
                assert!(fail_at > 0, "{name}: no row operation was failed");
                check_invariants(&ns);
                break;
            }
            assert!(result.is_err(), "{name}: failure at row op {fail_at} was swallowed");
            assert_eq!(snapshot(&ns), before, "{name}: failure at row op {fail_at} left a trace");
            fail_at += 1;
        }
    }
}
