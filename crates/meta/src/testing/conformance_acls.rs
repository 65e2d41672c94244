//! Conformance cases for global ACLs (`crate::acl`): the same semantics on
//! every backend.

use super::conformance::{at, create, ino, mkdir, own, parent, rename, symlink, ALICE, BOB, CAROL, ROOT};
use crate::backend::{Backend, PalPush};
use crate::types::{Caller, SetAttrs};
use crate::Namespace;
use nasd_proto::acl::*;
use nasd_proto::fs::*;

fn user(uid: u32, rights: u8) -> AclEntry {
    AclEntry { who: AclWho::User(uid), rights, flags: 0 }
}

fn group(gid: u32, rights: u8, flags: u8) -> AclEntry {
    AclEntry { who: AclWho::Group(gid), rights, flags }
}

/// Role entries grant a caller acting in the role (its identity
/// credential's), nobody else; they are stored and inherited like the
/// others. Files whose PAL did not reach every drive are recorded until
/// delivered, and forgotten with the file.
pub(super) fn acl_roles_and_undelivered_pals<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/r", 0o755).unwrap();
    own(ns, "/r", &ALICE, 0o755);
    let r = ino(ns, "/r");
    let staff = AclEntry { who: AclWho::Role(7), rights: ACL_READ | ACL_WRITE, flags: ACL_INHERIT };
    ns.set_acl(&ALICE, r, vec![user(CAROL.uid, ACL_READ), staff]).unwrap();
    assert_eq!(ns.get_acl(r).unwrap().entries, vec![user(CAROL.uid, ACL_READ), staff], "users before roles");
    let f = create(ns, &ALICE, "/r/f", 0o600).unwrap().attr.ino;
    assert_eq!(ns.get_acl(f).unwrap().entries, vec![AclEntry { flags: 0, ..staff }], "inherited");
    let bob_staff = Caller { role: 7, ..BOB };
    ns.check_access(&bob_staff, f, true, true).unwrap();
    assert_eq!(ns.check_access(&BOB, f, true, false).err(), Some(FsStatus::PermissionDenied), "no role");
    let bob_audit = Caller { role: 9, ..BOB };
    assert_eq!(ns.check_access(&bob_audit, f, true, false).err(), Some(FsStatus::PermissionDenied), "another role");
    let role0 = AclEntry { who: AclWho::Role(0), rights: ACL_READ, flags: 0 };
    assert_eq!(ns.set_acl(&ALICE, f, vec![role0]).err(), Some(FsStatus::InvalidArgument));

    assert!(ns.pals_undelivered(PalPush::File, 10).unwrap().is_empty());
    let g = create(ns, &ALICE, "/r/g", 0o600).unwrap().attr.ino;
    ns.pal_undelivered(PalPush::File, g).unwrap();
    ns.pal_undelivered(PalPush::File, f).unwrap();
    let listed = ns.pals_undelivered(PalPush::File, 10).unwrap();
    assert_eq!(listed.iter().map(|p| p.0).collect::<Vec<_>>(), vec![f, g]);
    assert_eq!(ns.pals_undelivered(PalPush::File, 1).unwrap().len(), 1);
    // A push that fails again after the list was read keeps the record.
    ns.pal_undelivered(PalPush::File, f).unwrap();
    ns.pal_delivered(PalPush::File, f, listed[0].1).unwrap();
    let again = ns.pals_undelivered(PalPush::File, 10).unwrap();
    assert_eq!(again.iter().map(|p| p.0).collect::<Vec<_>>(), vec![f, g], "a later failure survives");
    assert!(again[0].1 > listed[0].1);
    ns.pal_delivered(PalPush::File, f, again[0].1).unwrap();
    ns.pal_delivered(PalPush::File, f, again[0].1).unwrap();
    assert_eq!(ns.pals_undelivered(PalPush::File, 10).unwrap().iter().map(|p| p.0).collect::<Vec<_>>(), vec![g]);
    let (p, name) = parent(ns, "/r/g");
    ns.unlink(&ALICE, p, &name).unwrap();
    assert!(ns.pals_undelivered(PalPush::File, 10).unwrap().is_empty(), "forgotten with the file");
}

/// Named entries add to the mode bits for the callers they name; removing
/// them takes the access away again; chmod keeps them.
pub(super) fn acl_grants_and_revokes<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/d", 0o755).unwrap();
    own(ns, "/d", &ALICE, 0o700);
    let f = create(ns, &ROOT, "/d/f", 0o600).unwrap().attr.ino;
    own(ns, "/d/f", &ALICE, 0o600);
    let d = ino(ns, "/d");
    // Nothing for CAROL by the mode bits.
    assert_eq!(ns.walk(&CAROL, "/d/f", true).err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.check_access(&CAROL, f, true, false).err(), Some(FsStatus::PermissionDenied));
    // Search on the directory and read on the file, for CAROL alone.
    ns.set_acl(&ALICE, d, vec![user(CAROL.uid, ACL_EXECUTE)]).unwrap();
    let (_, info, revoked) = ns.set_acl(&ALICE, f, vec![user(CAROL.uid, ACL_READ)]).unwrap();
    assert_eq!(info, AclInfo { uid: ALICE.uid, gid: ALICE.gid, mode: 0o600, entries: vec![user(CAROL.uid, ACL_READ)] });
    assert_eq!(revoked.revoke.len(), 1, "capabilities of the file's one component are revoked");
    assert_eq!(ns.getattr(f).unwrap().acv, revoked.revoke[0].acv);
    assert_eq!(ns.walk(&CAROL, "/d/f", true).unwrap().attr.ino, f);
    ns.check_access(&CAROL, f, true, false).unwrap();
    assert_eq!(ns.check_access(&CAROL, f, false, true).err(), Some(FsStatus::PermissionDenied), "read only");
    assert_eq!(ns.readdir(&CAROL, d, "", 10).err(), Some(FsStatus::PermissionDenied), "search is not read");
    assert_eq!(ns.check_access(&BOB, f, true, false).err(), Some(FsStatus::PermissionDenied), "not named");
    // A group entry names every member, through primary or supplementary groups.
    let dave = Caller { uid: 1003, gid: 300, groups: vec![400], role: 0 };
    ns.set_acl(&ALICE, d, vec![user(CAROL.uid, ACL_EXECUTE), group(400, ACL_EXECUTE, 0)]).unwrap();
    ns.set_acl(&ALICE, f, vec![user(CAROL.uid, ACL_READ), group(400, ACL_READ | ACL_WRITE, 0)]).unwrap();
    ns.check_access(&dave, f, true, true).unwrap();
    // chmod and chown change the base entries, and keep the named ones.
    let set = SetAttrs { mode: Some(0o640), ..SetAttrs::default() };
    ns.setattr(&ALICE, f, &set).unwrap();
    let got = ns.get_acl(f).unwrap();
    assert_eq!((got.mode, got.entries.len()), (0o640, 2));
    ns.check_access(&CAROL, f, true, false).unwrap();
    // Revoke: CAROL's entry goes, and so does her access at once.
    ns.set_acl(&ALICE, f, vec![group(400, ACL_READ | ACL_WRITE, 0)]).unwrap();
    assert_eq!(ns.check_access(&CAROL, f, true, false).err(), Some(FsStatus::PermissionDenied));
    ns.check_access(&dave, f, true, true).unwrap();
    // Write on a directory lets a named user create and remove names in it.
    assert_eq!(create(ns, &CAROL, "/d/c", 0o644).err(), Some(FsStatus::PermissionDenied));
    ns.set_acl(&ALICE, d, vec![user(CAROL.uid, ACL_WRITE | ACL_EXECUTE)]).unwrap();
    let c = create(ns, &CAROL, "/d/c", 0o644).unwrap();
    assert_eq!(c.attr.uid, CAROL.uid);
    let (p, name) = parent(ns, "/d/c");
    ns.unlink(&CAROL, p, &name).unwrap();
    // A file with entries can be removed: its rows go with it.
    let (p, name) = parent(ns, "/d/f");
    ns.unlink(&ALICE, p, &name).unwrap();
    assert_eq!(ns.get_acl(f).err(), Some(FsStatus::NotFound));
}

/// Who may change an ACL, and what a list may hold.
pub(super) fn acl_rules<B: Backend>(ns: &Namespace<B>) {
    let f = create(ns, &ROOT, "/f", 0o644).unwrap().attr.ino;
    own(ns, "/f", &ALICE, 0o644);
    // Only the owner, root, or a holder of the set-ACL right.
    assert_eq!(ns.set_acl(&BOB, f, vec![user(BOB.uid, ACL_WRITE)]).err(), Some(FsStatus::NotPermitted));
    ns.set_acl(&ROOT, f, vec![user(CAROL.uid, ACL_READ)]).unwrap();
    ns.set_acl(&ALICE, f, vec![user(BOB.uid, ACL_SET_ACL)]).unwrap();
    ns.set_acl(&BOB, f, vec![user(BOB.uid, ACL_SET_ACL | ACL_WRITE)]).unwrap();
    ns.check_access(&BOB, f, false, true).unwrap();
    // ... which does not make the holder the owner: no chmod.
    let set = SetAttrs { mode: Some(0o666), ..SetAttrs::default() };
    assert_eq!(ns.setattr(&BOB, f, &set).err(), Some(FsStatus::NotPermitted));
    // Lists: canonical after sorting, each principal once, valid bits, bounded.
    let (_, got, _) = ns.set_acl(&ALICE, f, vec![group(7, ACL_READ, 0), user(9, ACL_READ)]).unwrap();
    assert_eq!(got.entries, vec![user(9, ACL_READ), group(7, ACL_READ, 0)], "users first, by id");
    assert_eq!(ns.get_acl(f).unwrap().entries, got.entries);
    let twice = vec![user(9, ACL_READ), user(9, ACL_WRITE)];
    assert_eq!(ns.set_acl(&ALICE, f, twice).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.set_acl(&ALICE, f, vec![user(9, 0)]).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.set_acl(&ALICE, f, vec![user(9, 0x80)]).err(), Some(FsStatus::InvalidArgument));
    let inherit_on_file = vec![group(7, ACL_READ, ACL_INHERIT)];
    assert_eq!(ns.set_acl(&ALICE, f, inherit_on_file).err(), Some(FsStatus::InvalidArgument));
    let full: Vec<_> = (0..ACL_ENTRIES_MAX as u32).map(|u| user(2000 + u, ACL_READ)).collect();
    ns.set_acl(&ALICE, f, full.clone()).unwrap();
    assert_eq!(ns.get_acl(f).unwrap().entries, full);
    let over: Vec<_> = (0..=ACL_ENTRIES_MAX as u32).map(|u| user(2000 + u, ACL_READ)).collect();
    assert_eq!(ns.set_acl(&ALICE, f, over).err(), Some(FsStatus::TooBig));
    assert_eq!(ns.get_acl(f).unwrap().entries, full, "a refused set changes nothing");
    ns.set_acl(&ALICE, f, Vec::new()).unwrap();
    assert!(ns.get_acl(f).unwrap().entries.is_empty());
    // Symbolic links carry none; unknown inodes are NOT_FOUND.
    symlink(ns, "/l", "f").unwrap();
    let l = at(ns, "/l").unwrap().attr.ino;
    assert_eq!(ns.set_acl(&ROOT, l, vec![user(9, ACL_READ)]).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.get_acl(999_999).err(), Some(FsStatus::NotFound));
}

/// A directory's inherit entries are copied onto what is made in it, at
/// creation: with the flag onto directories, without onto files.
pub(super) fn acl_inheritance<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/p", 0o755).unwrap();
    own(ns, "/p", &ALICE, 0o755);
    let p = ino(ns, "/p");
    let inherited = group(500, ACL_READ | ACL_EXECUTE, ACL_INHERIT);
    let own_only = user(CAROL.uid, ACL_WRITE);
    ns.set_acl(&ALICE, p, vec![own_only, inherited]).unwrap();
    let f = create(ns, &ALICE, "/p/f", 0o600).unwrap().attr.ino;
    assert_eq!(ns.get_acl(f).unwrap().entries, vec![group(500, ACL_READ | ACL_EXECUTE, 0)]);
    let sub = mkdir(ns, &ALICE, "/p/s", 0o700).unwrap().attr.ino;
    assert_eq!(ns.get_acl(sub).unwrap().entries, vec![inherited], "directories keep propagating it");
    let g = create(ns, &ALICE, "/p/s/g", 0o600).unwrap().attr.ino;
    assert_eq!(ns.get_acl(g).unwrap().entries, vec![group(500, ACL_READ | ACL_EXECUTE, 0)]);
    let (sp, _) = parent(ns, "/p/s/n");
    let fifo = ns.mknod(&ALICE, sp, "n", FileKind::Fifo, 0o600, 0).unwrap().attr.ino;
    assert_eq!(ns.get_acl(fifo).unwrap().entries.len(), 1);
    symlink(ns, "/p/l", "f").unwrap();
    assert!(ns.get_acl(ino(ns, "/p/l")).unwrap().entries.is_empty(), "symlinks get none");
    // A member of group 500 reads the 0600 file through the inherited entry.
    let member = Caller { uid: 1004, gid: 500, groups: Vec::new(), role: 0 };
    ns.walk(&member, "/p/s/g", true).unwrap();
    ns.check_access(&member, g, true, false).unwrap();
    // Changing the directory's ACL later changes nothing below it.
    ns.set_acl(&ALICE, p, Vec::new()).unwrap();
    assert_eq!(ns.get_acl(f).unwrap().entries.len(), 1);
    let h = create(ns, &ALICE, "/p/h", 0o600).unwrap().attr.ino;
    assert!(ns.get_acl(h).unwrap().entries.is_empty());
}

/// A directory's shared entries hold live for the regular files created in
/// it (its PAL collection's members), wherever they are renamed or linked;
/// a change of them is recorded for the super-PAL push, and taking a right
/// away revokes every member's capabilities; removing the directory does
/// both. Shared entries are for directories only.
pub(super) fn acl_shared_collections<B: Backend>(ns: &Namespace<B>) {
    mkdir(ns, &ROOT, "/c", 0o755).unwrap();
    own(ns, "/c", &ALICE, 0o755);
    mkdir(ns, &ROOT, "/o", 0o777).unwrap();
    let c = ino(ns, "/c");
    let before = create(ns, &ALICE, "/c/before", 0o600).unwrap().attr.ino;
    assert_eq!(ns.check_access(&BOB, before, true, false).err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.pal_source(before).unwrap().1, c, "every file is a member of the directory it was made in");

    let bob_reads = AclEntry { who: AclWho::User(BOB.uid), rights: ACL_READ, flags: ACL_SHARED };
    let (_, _, fx) = ns.set_acl(&ALICE, c, vec![bob_reads]).unwrap();
    assert_eq!(fx.collections, vec![c]);
    assert!(fx.revoke.is_empty(), "granting takes nothing away");
    let (seq, shared) = ns.collection_due(c).unwrap().expect("recorded for the push");
    assert_eq!(shared, vec![bob_reads]);
    assert_eq!(ns.collections().unwrap(), vec![c]);
    assert_eq!(ns.collection_entries(c).unwrap(), vec![bob_reads]);
    ns.check_access(&BOB, before, true, false).unwrap();
    assert_eq!(ns.check_access(&BOB, before, true, true).err(), Some(FsStatus::PermissionDenied), "read only");
    assert!(ns.get_acl(before).unwrap().entries.is_empty(), "not copied");
    let after = create(ns, &ALICE, "/c/after", 0o600).unwrap().attr.ino;
    assert!(ns.get_acl(after).unwrap().entries.is_empty());
    ns.check_access(&BOB, after, true, false).unwrap();
    assert_eq!(ns.check_access(&CAROL, after, true, false).err(), Some(FsStatus::PermissionDenied));

    // Membership stays with the file.
    rename(ns, &ALICE, "/c/after", "/o/moved").unwrap();
    ns.check_access(&BOB, after, true, false).unwrap();
    assert_eq!(ns.pal_source(after).unwrap().1, c);
    // Unchanged shared entries record nothing; delivery clears the record.
    let (_, _, fx) = ns.set_acl(&ALICE, c, vec![bob_reads, user(CAROL.uid, ACL_EXECUTE)]).unwrap();
    assert!(fx.collections.is_empty());
    ns.pal_delivered(PalPush::Collection, c, seq).unwrap();
    assert_eq!(ns.collection_due(c).unwrap(), None);

    // Taking the right away reaches every member and revokes their capabilities.
    let (_, _, fx) = ns.set_acl(&ALICE, c, Vec::new()).unwrap();
    assert_eq!(fx.collections, vec![c]);
    let mut revoked: Vec<Ino> =
        fx.revoke.iter().map(|i| ns.getattr(at_object(ns, i.object)).unwrap().attr.ino).collect();
    revoked.sort_unstable();
    assert_eq!(revoked, vec![before, after], "one intent per member component");
    assert_eq!(ns.check_access(&BOB, before, true, false).err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.check_access(&BOB, after, true, false).err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.collection_due(c).unwrap().map(|d| d.1), Some(Vec::new()), "due: an empty super PAL");
    assert!(ns.collections().unwrap().is_empty());

    // Directories only; with inherit, new subdirectories share it with their own files.
    assert_eq!(ns.set_acl(&ALICE, before, vec![bob_reads]).err(), Some(FsStatus::InvalidArgument));
    let both = AclEntry { flags: ACL_SHARED | ACL_INHERIT, ..bob_reads };
    ns.set_acl(&ALICE, c, vec![both]).unwrap();
    let s = mkdir(ns, &ALICE, "/c/s", 0o755).unwrap().attr.ino;
    assert_eq!(ns.get_acl(s).unwrap().entries, vec![both], "a collection of its own");
    let inner = create(ns, &ALICE, "/c/s/inner", 0o600).unwrap().attr.ino;
    assert!(ns.get_acl(inner).unwrap().entries.is_empty());
    assert_eq!(ns.pal_source(inner).unwrap().1, s);
    ns.check_access(&BOB, inner, true, false).unwrap();
    assert_eq!(ns.collections().unwrap(), vec![c, s]);

    // Removing a collection's directory takes its grants from members living elsewhere.
    rename(ns, &ALICE, "/c/s/inner", "/o/inner").unwrap();
    let (p, name) = parent(ns, "/c/s");
    let fx = ns.rmdir(&ALICE, p, &name).unwrap();
    assert_eq!(fx.collections, vec![s]);
    assert_eq!(fx.revoke.len(), 1, "the member's capabilities");
    assert_eq!(ns.check_access(&BOB, inner, true, false).err(), Some(FsStatus::PermissionDenied));
    assert_eq!(ns.collection_due(s).unwrap().map(|d| d.1), Some(Vec::new()), "kept after the directory");
    let listed: Vec<Ino> = ns.pals_undelivered(PalPush::Collection, 10).unwrap().into_iter().map(|p| p.0).collect();
    assert_eq!(listed, vec![c, s]);
}

/// The file holding object `object`.
fn at_object<B: Backend>(ns: &Namespace<B>, object: ObjectRef) -> Ino {
    ns.backend().read(|t| t.component_of(&object)).unwrap().expect("a component").0
}
