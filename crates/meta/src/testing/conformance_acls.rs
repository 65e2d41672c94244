//! Conformance cases for global ACLs (`crate::acl`): the same semantics on
//! every backend.

use super::conformance::{at, create, ino, mkdir, own, parent, symlink, ALICE, BOB, CAROL, ROOT};
use crate::backend::Backend;
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

    assert!(ns.pals_undelivered(10).unwrap().is_empty());
    let g = create(ns, &ALICE, "/r/g", 0o600).unwrap().attr.ino;
    ns.pal_undelivered(g).unwrap();
    ns.pal_undelivered(f).unwrap();
    let listed = ns.pals_undelivered(10).unwrap();
    assert_eq!(listed.iter().map(|p| p.0).collect::<Vec<_>>(), vec![f, g]);
    assert_eq!(ns.pals_undelivered(1).unwrap().len(), 1);
    // A push that fails again after the list was read keeps the record.
    ns.pal_undelivered(f).unwrap();
    ns.pal_delivered(f, listed[0].1).unwrap();
    let again = ns.pals_undelivered(10).unwrap();
    assert_eq!(again.iter().map(|p| p.0).collect::<Vec<_>>(), vec![f, g], "a later failure survives");
    assert!(again[0].1 > listed[0].1);
    ns.pal_delivered(f, again[0].1).unwrap();
    ns.pal_delivered(f, again[0].1).unwrap();
    assert_eq!(ns.pals_undelivered(10).unwrap().iter().map(|p| p.0).collect::<Vec<_>>(), vec![g]);
    let (p, name) = parent(ns, "/r/g");
    ns.unlink(&ALICE, p, &name).unwrap();
    assert!(ns.pals_undelivered(10).unwrap().is_empty(), "forgotten with the file");
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
    assert_eq!(revoked.len(), 1, "capabilities of the file's one component are revoked");
    assert_eq!(ns.getattr(f).unwrap().acv, revoked[0].acv);
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
