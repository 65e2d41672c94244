//! End to end over real daemons on loopback (issue 5, "Must show"): four
//! drives with security enforced, the manager over TLS, and `nasd_fs`
//! clients of two users and an administrator.
//!
//! - a tree is created, written, read back byte for byte, renamed (across
//!   directories, replacing targets) and removed, and the drives keep no
//!   object of a removed file;
//! - user B cannot read user A's 0600 file, and after A's chmod 0600 a
//!   capability B obtained earlier is refused by the drive (and B's open
//!   file cannot refresh it);
//! - the drive refuses a capability the client edited;
//! - a 10 s transfer with 2 s capabilities (and working keys rotating every
//!   3 s) succeeds;
//! - wrong passwords, non-administrators adding users and chown by non-root
//!   are refused;
//! - a directory with more entries than one READDIR reply lists completely,
//!   also when long symlink targets make a page larger than one message;
//! - writes and flushes after a capability expired refresh it with the
//!   rights they need; over-long arguments are refused by the client library;
//! - stat takes sizes from the manager (what writers' commits recorded) and
//!   mints no capability.

mod common;

use common::*;
use nasd_client::{Auth, ClientError, Credential, DriveClient, MacAlgorithm};
use nasd_crypto::Key;
use nasd_fs::{FileKind, FsClient, FsConfig, FsError, FsStatus, ObjectRef, OpenMode};
use nasd_manager::ManagerConfig;
use nasd_proto::manager::{set_mask, Entry, FileAccess as Access, Handle, ManagerReply, ManagerRequest};
use nasd_proto::{rights, AttrMask, Attributes, CapabilityArgs, Protection, Region, Status};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: usize = 1024 * 1024;

/// The manager's refusal status of a failed call.
#[track_caller]
fn fs_status<T: std::fmt::Debug>(r: Result<T, FsError>) -> FsStatus {
    match r {
        Err(e) => e.status().unwrap_or_else(|| panic!("expected a refusal from the manager, got {e:?}")),
        Ok(v) => panic!("expected a refusal from the manager, got {v:?}"),
    }
}

/// The drive's refusal status of a failed drive call.
#[track_caller]
fn drive_status<T: std::fmt::Debug>(r: Result<T, ClientError>) -> Status {
    match r {
        Err(e) => e.status().unwrap_or_else(|| panic!("expected a refusal from the drive, got {e:?}")),
        Ok(v) => panic!("expected a refusal from the drive, got {v:?}"),
    }
}

/// A drive connection that uses `token` (a capability's clear arguments)
/// with the capability key `key`, as a client holding them would.
/// A drive connection using a capability `token` as `original` (what the
/// manager handed out) says: its key, algorithm and minimum protection (write
/// capabilities demand data integrity).
async fn capability_client(original: &Access, token: Vec<u8>) -> DriveClient {
    let comp = &original.components[0];
    let mut c = to(DriveClient::connect(comp.drive_addr.as_str())).await.expect("connect to the drive");
    let algorithm = MacAlgorithm::from_id(original.algorithm).expect("known algorithm");
    let credential = Credential::Capability { token, key: Key::from_bytes(comp.key), algorithm };
    let min = Protection::from_bits(original.min_protection).expect("known protection bits");
    c.set_auth(Auth::new(credential, min.union(Protection::INTEGRITY_ARGS)));
    c
}

/// A drive connection that uses the capability in `access` unchanged.
async fn access_client(access: &Access) -> DriveClient {
    capability_client(access, access.components[0].token.clone()).await
}

/// Reads the whole object behind `access` directly from its drive.
async fn drive_read(access: &Access, len: u64) -> Result<Vec<u8>, ClientError> {
    let mut c = access_client(access).await;
    let region = Region { offset: 0, length: len };
    to(c.read(access.components[0].object.partition, access.components[0].object.object, &[region]))
        .await
        .map(|(_, data)| data)
}

/// The capability `walk(path, open)` hands out.
async fn access_of(fs: &FsClient, path: &str, open: OpenMode) -> Access {
    let e = to(fs.walk(path, open)).await.unwrap_or_else(|e| panic!("walk {path}: {e}"));
    e.access.unwrap_or_else(|| panic!("no capability for {path} with {open:?}"))
}

/// The administrator makes `/name` (0755) and gives it to `uid`.
async fn make_home(admin: &FsClient, path: &str, uid: u32) {
    to(admin.mkdir(path, 0o755)).await.expect("mkdir home");
    let attr = to(admin.chown(path, Some(uid), Some(uid))).await.expect("chown home");
    assert_eq!((attr.uid, attr.gid), (uid, uid));
}

/// Writes a new file with `mode` (exclusive create) and closes it.
async fn write_new(fs: &FsClient, path: &str, mode: u32, data: &[u8]) {
    let f = to(fs.create(path, mode, true, false)).await.unwrap_or_else(|e| panic!("create {path}: {e}"));
    to(f.write_at(0, data)).await.unwrap_or_else(|e| panic!("write {path}: {e}"));
    to(f.flush()).await.expect("flush");
    let attr = to(f.close()).await.expect("close");
    assert_eq!(attr.size, data.len() as u64, "{path}: the manager records the size at commit");
    assert_eq!(attr.mode, mode);
}

/// Removes everything below `path` (not `path` itself).
async fn remove_below(fs: &FsClient, path: &str) {
    let mut dirs = vec![path.to_string()];
    let mut empty_dirs = Vec::new();
    while let Some(dir) = dirs.pop() {
        for (name, attr) in to(fs.readdir(&dir)).await.expect("readdir") {
            let p = format!("{dir}/{name}");
            if attr.kind == FileKind::Dir {
                dirs.push(p.clone());
                empty_dirs.push(p);
            } else {
                to(fs.unlink(&p)).await.unwrap_or_else(|e| panic!("unlink {p}: {e}"));
            }
        }
    }
    // Deepest first.
    for d in empty_dirs.iter().rev() {
        to(fs.rmdir(d)).await.unwrap_or_else(|e| panic!("rmdir {d}: {e}"));
    }
}

/// Every object on the cluster's drives, by drive number.
async fn objects_on_drives(c: &Cluster) -> Vec<(u32, BTreeSet<u64>)> {
    let mut out = Vec::new();
    for d in c.manager.drives() {
        let objects = to(d.list_objects()).await.expect("list a drive's objects");
        out.push((d.drive, objects.into_iter().collect()));
    }
    out
}

fn on_drive(objects: &[(u32, BTreeSet<u64>)], o: &ObjectRef) -> bool {
    objects.iter().any(|(d, set)| *d == o.drive && set.contains(&o.object))
}

// ---------------------------------------------------------------- the tree

#[test]
fn tree_written_read_renamed_removed_without_leaks() {
    run(tree_written_read_renamed_removed_without_leaks_scenario());
}

async fn tree_written_read_renamed_removed_without_leaks_scenario() {
    let c = Cluster::start(ClusterOptions::default()).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    make_home(&admin, "/alice", UID_A).await;
    // A small transfer piece so the large file spans several.
    let a = to(FsClient::connect(&FsConfig { transfer_piece: 4 * MIB, ..c.fs_config(USER_A, PW_A) }))
        .await
        .expect("A logs in");
    assert_eq!(a.identity().uid, UID_A);
    assert!(!a.identity().admin);

    // --- create
    to(a.mkdir_all("/alice/d1/d2/d3", 0o755)).await.expect("mkdir -p");
    to(a.mkdir("/alice/other", 0o750)).await.expect("mkdir");
    assert_eq!(fs_status(to(a.mkdir("/alice/other", 0o755)).await), FsStatus::Exists);
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("/alice/d1/empty", Vec::new()),
        ("/alice/d1/one", pattern(1, 1)),
        ("/alice/d1/d2/page", pattern(2, 4095)),
        ("/alice/d1/d2/d3/big", pattern(3, 64 * 1024 + 1)),
        ("/alice/huge", pattern(4, 20 * MIB + 12_345)),
        ("/alice/other/victim", pattern(5, 777)),
    ];
    for (path, data) in &files {
        if data.len() > MIB {
            to(a.write_file(path, data)).await.expect("write_file");
        } else {
            write_new(&a, path, 0o640, data).await;
        }
    }
    to(a.symlink("/alice/d1/d2/page", "/alice/abs-link")).await.expect("absolute symlink");
    to(a.symlink("d1/one", "/alice/rel-link")).await.expect("relative symlink");
    to(a.symlink("../page", "/alice/d1/d2/d3/up-link")).await.expect("symlink with ..");
    let hard = to(a.link("/alice/d1/d2/page", "/alice/other/page-hard")).await.expect("hard link");
    assert_eq!(hard.nlink, 2);

    // --- read back, byte for byte, and stat
    let mut objects = Vec::new();
    let mut old_access = Vec::new();
    for (path, data) in &files {
        let got = to(a.read_file(path)).await.unwrap_or_else(|e| panic!("read {path}: {e}"));
        assert!(got == *data, "{path}: {} bytes read back differ from the {} written", got.len(), data.len());
        let st = to(a.stat(path)).await.expect("stat");
        assert_eq!(st.attr.kind, FileKind::File);
        assert_eq!(st.attr.size, data.len() as u64, "{path}: stat size (the manager's, recorded at commit)");
        let manager_view = to(a.walk(path, OpenMode::None)).await.expect("walk");
        assert_eq!(manager_view.attr.size, data.len() as u64, "{path}: the manager's size");
        assert!(manager_view.access.is_none(), "OpenMode::None hands out no capability");
        let access = access_of(&a, path, OpenMode::Read).await;
        objects.extend(access.components.iter().map(|comp| (path.to_string(), comp.object)));
        old_access.push((path.to_string(), access));
    }
    let used: BTreeSet<u32> = objects.iter().map(|(_, o)| o.drive).collect();
    assert!(used.len() > 1, "files are spread over the drives: {used:?}");
    // A read across a transfer-piece boundary, and one past the end.
    let (_, huge) = &files[4];
    let f = to(a.open("/alice/huge", false)).await.expect("open");
    let at = 4 * MIB as u64 - 100;
    assert!(to(f.read_at(at, 300)).await.expect("read_at") == huge[at as usize..at as usize + 300]);
    let tail = to(f.read_at(huge.len() as u64 - 10, 100)).await.expect("read_at the end");
    assert!(tail == huge[huge.len() - 10..], "a read past the end stops at the end");
    // Links.
    let page = &files[2].1;
    assert!(to(a.read_file("/alice/abs-link")).await.expect("through an absolute link") == *page);
    assert!(to(a.read_file("/alice/rel-link")).await.expect("through a relative link") == files[1].1);
    assert!(to(a.read_file("/alice/d1/d2/d3/up-link")).await.expect("through ../") == *page);
    assert!(to(a.read_file("/alice/other/page-hard")).await.expect("through the hard link") == *page);
    let l = to(a.lstat("/alice/abs-link")).await.expect("lstat");
    assert_eq!(l.attr.kind, FileKind::Symlink);
    assert_eq!(l.attr.size, "/alice/d1/d2/page".len() as u64);
    assert_eq!(to(a.readlink("/alice/rel-link")).await.expect("readlink"), "d1/one");
    let (p, h) = (to(a.stat("/alice/d1/d2/page")).await.unwrap(), to(a.stat("/alice/other/page-hard")).await.unwrap());
    assert_eq!((p.attr.ino, p.attr.nlink), (h.attr.ino, 2), "a hard link is the same inode");
    let names: Vec<String> = to(a.readdir("/alice")).await.expect("readdir").into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["abs-link", "d1", "huge", "other", "rel-link"]);

    // --- truncate, extend, rewrite in place
    let t = pattern(6, 5000);
    write_new(&a, "/alice/d1/trunc", 0o644, &t).await;
    assert_eq!(to(a.truncate("/alice/d1/trunc", 100)).await.expect("truncate").size, 100);
    assert!(to(a.read_file("/alice/d1/trunc")).await.unwrap() == t[..100]);
    to(a.truncate("/alice/d1/trunc", 300)).await.expect("extend");
    let mut extended = t[..100].to_vec();
    extended.resize(300, 0);
    assert!(to(a.read_file("/alice/d1/trunc")).await.unwrap() == extended, "extending exposes zeros");
    to(a.write_file("/alice/d1/trunc", b"abc")).await.expect("rewrite a file in place");
    assert_eq!(to(a.read_file("/alice/d1/trunc")).await.unwrap(), b"abc");
    assert_eq!(to(a.stat("/alice/d1/trunc")).await.unwrap().attr.size, 3);
    let access = access_of(&a, "/alice/d1/trunc", OpenMode::Read).await;
    objects.extend(access.components.iter().map(|comp| ("/alice/d1/trunc".to_string(), comp.object)));
    old_access.push(("/alice/d1/trunc".into(), access));

    // --- rename a file across directories
    to(a.rename("/alice/d1/one", "/alice/d1/d2/d3/one")).await.expect("rename a file across directories");
    assert_eq!(fs_status(to(a.stat("/alice/d1/one")).await), FsStatus::NotFound);
    assert!(to(a.read_file("/alice/d1/d2/d3/one")).await.unwrap() == files[1].1);
    assert_eq!(fs_status(to(a.stat("/alice/rel-link")).await), FsStatus::NotFound, "the link now dangles");

    // --- rename a file over an existing one (in another directory): the target's object goes
    let victim = objects.iter().find(|(p, _)| p == "/alice/other/victim").unwrap().1;
    let victim_access = old_access.iter().find(|(p, _)| p == "/alice/other/victim").unwrap().1.clone();
    assert!(drive_read(&victim_access, 777).await.expect("the victim's capability works") == files[5].1);
    to(a.rename("/alice/d1/d2/d3/big", "/alice/other/victim")).await.expect("rename over an existing file");
    assert!(to(a.read_file("/alice/other/victim")).await.unwrap() == files[3].1);
    assert_eq!(fs_status(to(a.stat("/alice/d1/d2/d3/big")).await), FsStatus::NotFound);
    let gone = drive_status(drive_read(&victim_access, 777).await);
    assert_eq!(gone, Status::NoSuchObject, "the replaced file's object is removed before rename returns");
    assert!(!on_drive(&objects_on_drives(&c).await, &victim), "replaced object {victim:?} still on its drive");

    // --- rename a directory across directories, then over an existing empty directory
    to(a.rename("/alice/d1/d2/d3", "/alice/other/d3")).await.expect("rename a directory across directories");
    assert!(to(a.read_file("/alice/other/d3/one")).await.unwrap() == files[1].1);
    assert_eq!(fs_status(to(a.stat("/alice/d1/d2/d3")).await), FsStatus::NotFound);
    assert_eq!(to(a.stat("/alice/d1/d2")).await.unwrap().attr.nlink, 2, "d2 lost its subdirectory");
    assert_eq!(to(a.stat("/alice/other")).await.unwrap().attr.nlink, 3, "other gained one");
    to(a.mkdir("/alice/d3-final", 0o755)).await.unwrap();
    to(a.mkdir("/alice/full", 0o755)).await.unwrap();
    to(a.write_file("/alice/full/x", b"x")).await.unwrap();
    assert_eq!(fs_status(to(a.rename("/alice/other/d3", "/alice/full")).await), FsStatus::NotEmpty);
    assert_eq!(fs_status(to(a.rename("/alice/other", "/alice/other/d3/inside")).await), FsStatus::InvalidMove);
    to(a.rename("/alice/other/d3", "/alice/d3-final")).await.expect("rename a directory over an empty one");
    assert!(to(a.read_file("/alice/d3-final/one")).await.unwrap() == files[1].1);
    // The ../page link moved with its directory: it now names /alice/page, which does not exist.
    assert_eq!(fs_status(to(a.stat("/alice/d3-final/up-link")).await), FsStatus::NotFound);

    // --- unlink one name of a hard-linked file: the other still reads the data
    let page_obj = objects.iter().find(|(p, _)| p == "/alice/d1/d2/page").unwrap().1;
    to(a.unlink("/alice/d1/d2/page")).await.expect("unlink one of two names");
    assert!(to(a.read_file("/alice/other/page-hard")).await.unwrap() == *page);
    assert_eq!(to(a.stat("/alice/other/page-hard")).await.unwrap().attr.nlink, 1);
    assert!(on_drive(&objects_on_drives(&c).await, &page_obj), "a file with a name left keeps its object");

    // --- remove everything
    remove_below(&a, "/alice").await;
    assert!(to(a.readdir("/alice")).await.unwrap().is_empty());
    assert_eq!(fs_status(to(a.rmdir("/alice")).await), FsStatus::PermissionDenied, "/ belongs to root");
    to(admin.rmdir("/alice")).await.expect("the administrator removes the home");
    assert!(to(admin.readdir("/")).await.unwrap().is_empty());
    assert_eq!(fs_status(to(admin.rmdir("/")).await), FsStatus::InvalidArgument, "the root has no parent");
    let (inodes, file_bytes, drives) = to(admin.statfs()).await.expect("statfs");
    assert_eq!((inodes, file_bytes), (1, 0), "only the root directory is left");
    assert_eq!(drives.len(), 4);
    assert!(drives.iter().all(|d| d.online));

    // --- no leaked objects: each removed file's object is gone from its drive (removed before the
    // unlink returned), the maintenance pass leaves nothing doomed, and every object left on a drive is
    // a pooled, empty one the manager knows.
    to(c.manager.maintain()).await;
    let left = objects_on_drives(&c).await;
    for (path, o) in &objects {
        assert!(!on_drive(&left, o), "{path}: object {o:?} leaked");
    }
    for (path, access) in &old_access {
        let s = drive_status(drive_read(access, 1).await);
        assert_eq!(s, Status::NoSuchObject, "{path}: its old capability must find no object");
    }
    for d in c.manager.drives() {
        assert_eq!(to(c.manager.collect_orphans(&d)).await.expect("collect orphans"), 0, "drive {}", d.drive);
        for (drive, set) in &left {
            if *drive != d.drive {
                continue;
            }
            for &o in set {
                let attrs = to(d.getattr(o)).await.expect("getattr of a pooled object");
                assert_eq!(attrs.logical_size, 0, "drive {drive} object {o}: only empty pooled objects are left");
            }
        }
    }

    drop((a, admin, f));
    c.stop().await;
}

// ------------------------------------------------- users and permissions

#[test]
fn logins_administration_and_ownership_are_checked() {
    run(logins_administration_and_ownership_are_checked_scenario());
}

async fn logins_administration_and_ownership_are_checked_scenario() {
    let c = Cluster::start(ClusterOptions::default()).await;
    // Wrong password, unknown user.
    let wrong = to(FsClient::connect(&c.fs_config(USER_A, "not the password"))).await;
    assert_eq!(fs_status(wrong), FsStatus::BadCredentials);
    let unknown = to(FsClient::connect(&c.fs_config("mallory", PW_A))).await;
    assert_eq!(fs_status(unknown), FsStatus::BadCredentials);
    // The wrong CA: TLS fails before any password is sent.
    let other_ca = nasd_manager::tls::ensure_certificates(&c.dir().join("other-ca"), &["localhost".into()]).unwrap();
    let mut cfg = c.fs_config(USER_A, PW_A);
    cfg.ca_cert = other_ca.ca;
    assert!(matches!(to(FsClient::connect(&cfg)).await, Err(FsError::Setup(_))), "an unknown CA is refused");

    let admin = c.login(ADMIN, ADMIN_PW).await;
    let a = c.login(USER_A, PW_A).await;
    let b = c.login(USER_B, PW_B).await;
    assert!(admin.identity().admin && admin.identity().uid == 0);
    assert_eq!(b.identity().uid, UID_B);

    // Only administrators add users (or list them, or add drives).
    assert_eq!(fs_status(to(a.add_user("carol", "carol password", 0, 0, false)).await), FsStatus::NotAdmin);
    assert_eq!(fs_status(to(a.add_user("carol", "carol password", 0, 0, true)).await), FsStatus::NotAdmin);
    assert_eq!(fs_status(to(a.users()).await), FsStatus::NotAdmin);
    assert_eq!(fs_status(to(a.add_drive("127.0.0.1:1", &Key::random())).await), FsStatus::NotAdmin);
    assert_eq!(fs_status(to(a.set_password(USER_B, "new password")).await), FsStatus::NotAdmin);
    to(admin.add_user("carol", "carol password", 0, 0, false)).await.expect("the administrator adds a user");
    let users = to(admin.users()).await.expect("list users");
    let carol = users.iter().find(|u| u.name == "carol").expect("carol listed");
    assert!(carol.uid >= 1000 && carol.uid != UID_A && carol.uid != UID_B, "uid 0 picks a free uid: {carol:?}");
    assert_eq!(fs_status(to(admin.add_user("carol", "carol password", 0, 0, false)).await), FsStatus::Exists);
    let carol = c.login("carol", "carol password").await;
    assert_eq!(fs_status(to(carol.mkdir("/carol", 0o755)).await), FsStatus::PermissionDenied, "/ is root's");
    // Changing one's own password.
    to(a.set_password(USER_A, "alice's new password")).await.expect("own password");
    assert_eq!(fs_status(to(FsClient::connect(&c.fs_config(USER_A, PW_A))).await), FsStatus::BadCredentials);
    let a = c.login(USER_A, "alice's new password").await;

    // chown by non-root is refused: the owner may not give a file away, nor move it to a group
    // not their own; others may not chmod it.
    make_home(&admin, "/alice", UID_A).await;
    to(a.write_file("/alice/f", b"data")).await.unwrap();
    assert_eq!(fs_status(to(a.chown("/alice/f", Some(UID_B), None)).await), FsStatus::NotPermitted);
    assert_eq!(fs_status(to(b.chown("/alice/f", Some(UID_B), None)).await), FsStatus::NotPermitted);
    assert_eq!(fs_status(to(b.chmod("/alice/f", 0o666)).await), FsStatus::NotPermitted, "chmod: owner only");
    assert_eq!(fs_status(to(a.chown("/alice/f", None, Some(UID_B))).await), FsStatus::NotPermitted, "not A's group");
    let st = to(a.stat("/alice/f")).await.unwrap();
    assert_eq!((st.attr.uid, st.attr.gid, st.attr.mode), (UID_A, UID_A, 0o644), "nothing changed");
    // The administrator (root) may.
    let attr = to(admin.chown("/alice/f", Some(UID_B), Some(UID_B))).await.expect("root chowns");
    assert_eq!((attr.uid, attr.gid), (UID_B, UID_B));

    drop((a, b, admin, carol));
    c.stop().await;
}

#[test]
fn modes_are_enforced_and_chmod_revokes_capabilities_at_the_drive() {
    run(modes_are_enforced_and_chmod_revokes_capabilities_at_the_drive_scenario());
}

async fn modes_are_enforced_and_chmod_revokes_capabilities_at_the_drive_scenario() {
    let c = Cluster::start(ClusterOptions::default()).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    make_home(&admin, "/alice", UID_A).await;
    let a = c.login(USER_A, PW_A).await;
    let b = c.login(USER_B, PW_B).await;
    let secret = pattern(10, 10_000);
    let shared = pattern(11, 70_000);
    write_new(&a, "/alice/secret", 0o600, &secret).await;
    write_new(&a, "/alice/shared", 0o644, &shared).await;

    // B cannot read A's 0600 file: the manager refuses every way of asking.
    assert_eq!(fs_status(to(b.read_file("/alice/secret")).await), FsStatus::PermissionDenied);
    assert_eq!(fs_status(to(b.open("/alice/secret", false)).await), FsStatus::PermissionDenied);
    assert_eq!(fs_status(to(b.walk("/alice/secret", OpenMode::Read)).await), FsStatus::PermissionDenied);
    assert_eq!(fs_status(to(b.open("/alice/secret", true)).await), FsStatus::PermissionDenied);
    let st = to(b.stat("/alice/secret")).await.expect("stat needs no read permission");
    assert_eq!(st.attr.size, secret.len() as u64);
    assert_eq!(b.held_rights(st.attr.ino), None, "stat mints no capability");
    let attr_only = access_of(&b, "/alice/secret", OpenMode::ReadIfAllowed).await;
    let denied = drive_read(&attr_only, secret.len() as u64).await;
    assert_eq!(drive_status(denied), Status::RightsInsufficient, "no data under a stat capability");
    // B can read the 0644 file, but not write it or create in A's directory.
    assert!(to(b.read_file("/alice/shared")).await.expect("B reads a 0644 file") == shared);
    assert_eq!(fs_status(to(b.open("/alice/shared", true)).await), FsStatus::PermissionDenied);
    assert_eq!(fs_status(to(b.create("/alice/mine", 0o644, true, false)).await), FsStatus::PermissionDenied);
    assert_eq!(fs_status(to(b.unlink("/alice/shared")).await), FsStatus::PermissionDenied);
    let best = to(b.walk("/alice/shared", OpenMode::Best)).await.unwrap().access.expect("read access");
    assert_eq!(best.rights & rights::WRITE, 0, "a read-only caller gets read rights only");
    assert_eq!(
        best.components[0].object,
        access_of(&a, "/alice/shared", OpenMode::Read).await.components[0].object,
        "for the file's object"
    );

    // B obtains a capability (and opens the file) while it is 0644...
    let b_access = access_of(&b, "/alice/shared", OpenMode::Read).await;
    assert!(drive_read(&b_access, shared.len() as u64).await.expect("B's capability works") == shared);
    let b_file = to(b.open("/alice/shared", false)).await.expect("B opens the 0644 file");
    assert!(to(b_file.read_at(0, 100)).await.unwrap() == shared[..100]);
    let a_file = to(a.open("/alice/shared", true)).await.expect("A opens it too");
    let a_access = access_of(&a, "/alice/shared", OpenMode::ReadWrite).await;

    // ...then A makes it 0600.
    let attr = to(a.chmod("/alice/shared", 0o600)).await.expect("chmod");
    assert_eq!(attr.mode, 0o600);

    // The drive refuses B's earlier capability: revoked before chmod returned.
    let refused = drive_status(drive_read(&b_access, shared.len() as u64).await);
    assert_eq!(refused, Status::AccessRevoked);
    // B's open file cannot refresh it: the manager no longer grants B read access.
    let e = to(b_file.read_at(0, 100)).await.expect_err("B's open file must not read after chmod 0600");
    assert_eq!(e.status(), Some(FsStatus::PermissionDenied), "{e:?}");
    assert_eq!(e.errno(), 13);
    assert_eq!(fs_status(to(b.read_file("/alice/shared")).await), FsStatus::PermissionDenied);
    // A's capability was revoked too, but A may still read and write: A's open file refreshes.
    assert_eq!(drive_status(drive_read(&a_access, 10).await), Status::AccessRevoked);
    assert!(to(a_file.read_at(0, 100)).await.expect("A's file refreshes its capability") == shared[..100]);
    to(a_file.write_at(0, b"changed")).await.expect("A writes after refreshing");
    to(a_file.close()).await.unwrap();
    let now = to(a.read_file("/alice/shared")).await.unwrap();
    assert_eq!(&now[..7], b"changed");
    assert!(now[7..] == shared[7..]);
    // The administrator (root) still reads it.
    assert!(to(admin.read_file("/alice/shared")).await.unwrap() == now);

    // chown (by root) and unlinking one of two names revoke at once as well.
    to(a.chmod("/alice/shared", 0o644)).await.unwrap();
    let before_chown = access_of(&b, "/alice/shared", OpenMode::Read).await;
    assert!(drive_read(&before_chown, 10).await.is_ok());
    to(admin.chown("/alice/shared", Some(UID_A), Some(UID_B))).await.expect("root chowns");
    assert_eq!(drive_status(drive_read(&before_chown, 10).await), Status::AccessRevoked, "after chown");
    to(a.link("/alice/shared", "/alice/shared-too")).await.unwrap();
    let before_unlink = access_of(&b, "/alice/shared-too", OpenMode::Read).await;
    assert!(drive_read(&before_unlink, 10).await.is_ok());
    to(a.unlink("/alice/shared")).await.unwrap();
    assert_eq!(drive_status(drive_read(&before_unlink, 10).await), Status::AccessRevoked, "after unlink");
    assert!(to(b.read_file("/alice/shared-too")).await.expect("B reads through the other name") == now);

    drop((a, b, admin, b_file));
    c.stop().await;
}

// ----------------------------------------------------- edited capabilities

#[test]
fn the_drive_refuses_capabilities_the_client_edited() {
    run(the_drive_refuses_capabilities_the_client_edited_scenario());
}

async fn the_drive_refuses_capabilities_the_client_edited_scenario() {
    let c = Cluster::start(ClusterOptions::default()).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    make_home(&admin, "/alice", UID_A).await;
    let a = c.login(USER_A, PW_A).await;
    let data = pattern(20, 8192);
    write_new(&a, "/alice/target", 0o644, &data).await;

    let read = access_of(&a, "/alice/target", OpenMode::Read).await;
    let rw = access_of(&a, "/alice/target", OpenMode::ReadWrite).await;
    assert_eq!(read.rights & rights::WRITE, 0);
    assert_ne!(rw.rights & rights::WRITE, 0);
    // Write capabilities are the short-lived ones (ManagerConfig defaults: 300 s read, 30 s write).
    assert_eq!((read.lifetime_ms, rw.lifetime_ms), (300_000, 30_000));
    let (partition, object) = (read.components[0].object.partition, read.components[0].object.object);
    // Another object on the same drive (a pooled, empty one): an edit must not reach it either.
    let neighbour = {
        let d = c.manager.drives().into_iter().find(|d| d.drive == read.components[0].object.drive).unwrap();
        let objects = to(d.list_objects()).await.unwrap();
        *objects.iter().find(|&&o| o != object).expect("another object on the drive")
    };

    // The unedited capabilities work as given (the control).
    let mut ok = access_client(&read).await;
    assert!(to(ok.read(partition, object, &[Region { offset: 0, length: 8192 }])).await.unwrap().1 == data);
    assert_eq!(
        drive_status(to(ok.write(partition, object, &[Region { offset: 0, length: 4 }], b"evil")).await),
        Status::RightsInsufficient,
        "a read capability does not write"
    );

    let args = CapabilityArgs::decode(&read.components[0].token).expect("the token is a clear capability");
    let rw_args = CapabilityArgs::decode(&rw.components[0].token).expect("the token is a clear capability");
    assert_eq!((args.partition, args.object), (partition, object), "limited to the file's object");
    assert_eq!(args.region, CapabilityArgs::WHOLE_OBJECT);

    let edits: Vec<(&str, &Access, CapabilityArgs)> = vec![
        ("read widened to write", &read, CapabilityArgs { rights: args.rights | rights::WRITE, ..args.clone() }),
        ("read widened to every right", &read, CapabilityArgs { rights: rights::ALL, ..args.clone() }),
        ("other object", &rw, CapabilityArgs { object: neighbour, ..rw_args.clone() }),
        ("whole partition", &rw, CapabilityArgs { object: nasd_proto::ANY_OBJECT, ..rw_args.clone() }),
        ("region moved", &rw, CapabilityArgs { region: Region { offset: 0, length: 4096 }, ..rw_args.clone() }),
        (
            "expiry extended",
            &rw,
            CapabilityArgs { expiration_ns: rw_args.expiration_ns + 3_600_000_000_000, ..rw_args.clone() },
        ),
        (
            "older access control version",
            &rw,
            CapabilityArgs {
                access_control_version: rw_args.access_control_version.wrapping_sub(1),
                ..rw_args.clone()
            },
        ),
        ("weaker minimum protection", &rw, CapabilityArgs { min_protection: Protection::NONE, ..rw_args.clone() }),
        ("audit id changed", &rw, CapabilityArgs { audit_id: 0, ..rw_args.clone() }),
    ];
    for (what, original, edited) in edits {
        assert_ne!(edited, CapabilityArgs::decode(&original.components[0].token).unwrap(), "{what}: an actual edit");
        let token = edited.encode().to_vec();
        let target = if edited.object == nasd_proto::ANY_OBJECT { object } else { edited.object };
        // A write (data or attributes), and a read.
        let mut w = capability_client(original, token.clone()).await;
        let wrote = to(w.write(partition, target, &[Region { offset: 0, length: 4 }], b"evil")).await;
        assert_eq!(drive_status(wrote), Status::BadDigest, "{what}: write");
        let mut s = capability_client(original, token.clone()).await;
        let attrs = Attributes { access_control_version: 0, ..Default::default() };
        let set = to(s.setattr(partition, target, AttrMask::ACCESS_CONTROL_VERSION, &attrs)).await;
        assert_eq!(drive_status(set), Status::BadDigest, "{what}: setattr");
        let mut r = capability_client(original, token).await;
        let got = to(r.read(partition, target, &[Region { offset: 0, length: 16 }])).await;
        assert_eq!(drive_status(got), Status::BadDigest, "{what}: read");
    }

    // Nothing changed: the data, and the capabilities minted before still work (no ACV change).
    assert!(to(a.read_file("/alice/target")).await.unwrap() == data);
    let mut again = access_client(&rw).await;
    assert!(to(again.read(partition, object, &[Region { offset: 0, length: 8192 }])).await.unwrap().1 == data);
    let d = c.manager.drives().into_iter().find(|d| d.drive == read.components[0].object.drive).unwrap();
    assert_eq!(to(d.getattr(neighbour)).await.unwrap().logical_size, 0, "the neighbour object is untouched");

    drop((a, admin));
    c.stop().await;
}

// ------------------------------------------------- a long transfer

/// Bytes of the slow transfer, and its pace: 5 MiB at 512 KiB/s, 10 s each way.
const SLOW_LEN: usize = 5 * MIB;
const SLOW_STEP: usize = 64 * 1024;
const SLOW_STEP_PAUSE: Duration = Duration::from_millis(125);

#[test]
fn a_10s_transfer_with_2s_capabilities_succeeds() {
    run(a_10s_transfer_with_2s_capabilities_succeeds_scenario());
}

async fn a_10s_transfer_with_2s_capabilities_succeeds_scenario() {
    let config = ManagerConfig {
        read_lifetime: Duration::from_secs(2),
        write_lifetime: Duration::from_secs(2),
        rotate_interval: Duration::from_secs(3),
        maintenance_interval: Duration::from_millis(200),
        pool_target: 8,
        ..ManagerConfig::default()
    };
    let c = Cluster::start(ClusterOptions { config, maintenance: true, ..Default::default() }).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    make_home(&admin, "/alice", UID_A).await;
    let a = to(FsClient::connect(&FsConfig { transfer_piece: 256 * 1024, ..c.fs_config(USER_A, PW_A) }))
        .await
        .expect("log in");
    let data = pattern(30, SLOW_LEN);

    // Write from a source that yields 64 KiB every 125 ms.
    let f = to(a.create("/alice/slow", 0o644, true, false)).await.expect("create");
    let first = access_of(&a, "/alice/slow", OpenMode::ReadWrite).await;
    assert_eq!(first.lifetime_ms, 2000);
    let (mut tx, mut rx) = tokio::io::duplex(SLOW_STEP);
    let source = data.clone();
    let producer = tokio::spawn(async move {
        for chunk in source.chunks(SLOW_STEP) {
            tokio::time::sleep(SLOW_STEP_PAUSE).await;
            tx.write_all(chunk).await.expect("feed the writer");
        }
    });
    let wrote = to(f.write_from(0, SLOW_LEN as u64, &mut rx)).await.expect("the slow write succeeds");
    assert_eq!(wrote, SLOW_LEN as u64);
    producer.await.unwrap();
    to(f.flush()).await.expect("flush");
    assert_eq!(to(f.close()).await.expect("close").size, SLOW_LEN as u64);
    // The capability first handed out for the file is long dead by now.
    let dead = drive_status(drive_read(&first, 16).await);
    assert!(matches!(dead, Status::CapabilityExpired | Status::KeyVersionRetired), "{dead:?}");

    // Read into a sink that takes 64 KiB every 125 ms.
    let f = to(a.open("/alice/slow", false)).await.expect("open");
    let (mut tx, mut rx) = tokio::io::duplex(SLOW_STEP);
    let consumer = tokio::spawn(async move {
        let mut got = Vec::with_capacity(SLOW_LEN);
        let mut buf = vec![0u8; SLOW_STEP];
        loop {
            tokio::time::sleep(SLOW_STEP_PAUSE).await;
            let mut filled = 0;
            while filled < SLOW_STEP {
                match rx.read(&mut buf[filled..]).await.expect("read the pipe") {
                    0 => break,
                    n => filled += n,
                }
            }
            got.extend_from_slice(&buf[..filled]);
            if filled < SLOW_STEP {
                return got;
            }
        }
    });
    let read = to(f.read_to(0, SLOW_LEN as u64, &mut tx)).await.expect("the slow read succeeds");
    assert_eq!(read, SLOW_LEN as u64);
    drop(tx);
    let got = consumer.await.unwrap();
    assert!(got == data, "{} bytes read back differ from the {} written", got.len(), data.len());

    // Working keys rotated during the transfers (every 3 s), so capabilities were minted under
    // several keys; the file still reads back.
    let d = c.manager.drives().into_iter().find(|d| d.drive == first.components[0].object.drive).unwrap();
    assert!(d.keys().current.0 >= 3, "expected at least two rotations in 20 s, have version {}", d.keys().current.0);
    assert!(to(a.read_file("/alice/slow")).await.unwrap() == data);

    drop((a, admin, f));
    c.stop().await;
}

// ------------------------------------------------- large directories

#[test]
fn large_directories_list_completely() {
    run(large_directories_scenario());
}

async fn large_directories_scenario() {
    let c = Cluster::start(ClusterOptions::default()).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    make_home(&admin, "/alice", UID_A).await;
    let a = c.login(USER_A, PW_A).await;
    to(a.mkdir("/alice/big", 0o755)).await.unwrap();
    // More entries than one READDIR reply carries, and more files than the drives' object pools
    // hold at first (4 drives x 8), so creates refill the pools.
    const FILES: usize = 40;
    const LINKS: usize = nasd_proto::manager::READDIR_ENTRIES_MAX + 10 - FILES;
    let mut expected = Vec::new();
    for i in 0..FILES {
        let name = format!("f{i:04}");
        to(a.write_file(&format!("/alice/big/{name}"), name.as_bytes())).await.expect("create a file");
        expected.push(name);
    }
    for i in 0..LINKS {
        let name = format!("l{i:04}");
        to(a.symlink("f0000", &format!("/alice/big/{name}"))).await.expect("symlink");
        expected.push(name);
    }
    expected.sort();
    let listed: Vec<String> = to(a.readdir("/alice/big")).await.unwrap().into_iter().map(|(n, _)| n).collect();
    assert_eq!(listed.len(), expected.len(), "every entry is listed");
    assert_eq!(listed, expected);
    for i in (0..FILES).step_by(7) {
        let name = format!("f{i:04}");
        assert_eq!(to(a.read_file(&format!("/alice/big/{name}"))).await.unwrap(), name.as_bytes());
    }

    // Symlinks with the longest targets: far fewer entries than a page, but more bytes than one
    // message holds. The manager pages by size too (it used to panic the session), and the
    // listing still completes.
    to(a.mkdir("/alice/long", 0o755)).await.unwrap();
    const LONG_LINKS: usize = 260;
    let target = "t".repeat(nasd_proto::fs::SYMLINK_TARGET_MAX);
    for i in 0..LONG_LINKS {
        to(a.symlink(&target, &format!("/alice/long/l{i:04}"))).await.expect("symlink with a long target");
    }
    let listed: Vec<String> = to(a.readdir("/alice/long")).await.expect("list").into_iter().map(|(n, _)| n).collect();
    assert_eq!(listed, (0..LONG_LINKS).map(|i| format!("l{i:04}")).collect::<Vec<_>>());
    assert_eq!(to(a.readlink("/alice/long/l0007")).await.unwrap(), target);
    drop((a, admin));
    c.stop().await;
}

// ------------------------------------------- capabilities after they expire

#[test]
fn writes_and_flushes_refresh_expired_capabilities() {
    run(writes_and_flushes_refresh_expired_capabilities_scenario());
}

async fn writes_and_flushes_refresh_expired_capabilities_scenario() {
    let config = ManagerConfig {
        read_lifetime: Duration::from_secs(1),
        write_lifetime: Duration::from_secs(1),
        pool_target: 8,
        ..ManagerConfig::default()
    };
    let c = Cluster::start(ClusterOptions { config, ..Default::default() }).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    make_home(&admin, "/alice", UID_A).await;
    let a = c.login(USER_A, PW_A).await;

    // A writer that pauses longer than its capability lives before flushing: the refresh must
    // ask for write rights again (FLUSH comes only with them).
    let f = to(a.create("/alice/paused", 0o644, true, false)).await.unwrap();
    to(f.write_at(0, b"written before the pause")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    to(f.flush()).await.expect("flush after the write capability expired");
    assert_eq!(to(f.close()).await.unwrap().size, 24);

    // A write-only file: its writer commits it after the first write capability expired, and
    // its size is then the manager's record of the commit.
    let f = to(a.create("/alice/drop-box", 0o200, true, false)).await.unwrap();
    to(f.write_at(0, b"in")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    to(f.flush()).await.expect("flush of a write-only file after its capability expired");
    assert_eq!(f.size(), 2);
    assert_eq!(to(a.stat("/alice/drop-box")).await.unwrap().attr.size, 2, "the manager recorded the commit");

    // A file created read-only by its writer: the creator may write it while it is open (POSIX
    // open with O_CREAT), also after the first write capability expired — the refresh asks with
    // the owner override, and the manager grants the owner write rights whatever the mode.
    let ro = to(a.create("/alice/read-only", 0o444, true, false)).await.unwrap();
    to(ro.write_at(0, b"first")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    to(ro.write_at(5, b" second")).await.expect("a write after the capability expired refreshes it");
    assert_ne!(a.held_rights(ro.ino()).unwrap() & rights::WRITE, 0, "the refreshed capability writes");
    to(ro.flush()).await.unwrap();
    assert_eq!(to(ro.close()).await.unwrap().size, 12);
    assert_eq!(to(a.read_file("/alice/read-only")).await.unwrap(), b"first second");
    assert_eq!(fs_status(to(a.open("/alice/read-only", true)).await), FsStatus::PermissionDenied, "a new open");
    // The override is the owner's only: B claiming to refresh a writer gets what the mode allows.
    let b = c.login(USER_B, PW_B).await;
    let handle = to(b.walk("/alice/read-only", OpenMode::None)).await.unwrap().handle();
    let req = ManagerRequest::GetAttr { handle, open: OpenMode::RefreshWrite };
    let Ok(ManagerReply::Entry(e)) = to(b.call(&req)).await else { panic!("getattr") };
    assert_eq!(e.access.expect("B may read it").rights & rights::WRITE, 0, "no write rights for B");

    // Over-long arguments are refused by the client library, not a panic in the encoder.
    let long = format!("/{}", "x".repeat(70_000));
    assert_eq!(fs_status(to(a.stat(&long)).await), FsStatus::NameTooLong);
    assert_eq!(fs_status(to(a.symlink(&long, "/alice/l")).await), FsStatus::NameTooLong);
    to(a.write_file("/alice/still-usable", b"ok")).await.expect("the connection still works");

    drop((a, b, admin, f));
    c.stop().await;
}

// ------------------------------------------------------------ file handles

/// The reply of one raw manager request.
async fn raw(fs: &FsClient, req: ManagerRequest) -> Result<ManagerReply, FsError> {
    to(fs.call(&req)).await
}

/// The entry of a raw manager request that must succeed.
async fn raw_entry(fs: &FsClient, req: ManagerRequest) -> Entry {
    match raw(fs, req.clone()).await {
        Ok(ManagerReply::Entry(e)) => e,
        other => panic!("{req:?}: {other:?}"),
    }
}

fn set_mode(handle: Handle, mode: u32) -> ManagerRequest {
    ManagerRequest::SetAttr { handle, mask: set_mask::MODE, mode, uid: 0, gid: 0, size: 0, atime_ns: 0, mtime_ns: 0 }
}

fn set_size(handle: Handle, size: u64) -> ManagerRequest {
    ManagerRequest::SetAttr { handle, mask: set_mask::SIZE, mode: 0, uid: 0, gid: 0, size, atime_ns: 0, mtime_ns: 0 }
}

#[test]
fn inode_numbers_without_a_valid_handle_reach_nothing() {
    run(inode_numbers_without_a_valid_handle_reach_nothing_scenario());
}

async fn inode_numbers_without_a_valid_handle_reach_nothing_scenario() {
    let c = Cluster::start(ClusterOptions::default()).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    make_home(&admin, "/alice", UID_A).await;
    make_home(&admin, "/bob", UID_B).await;
    let a = c.login(USER_A, PW_A).await;
    let b = c.login(USER_B, PW_B).await;
    // A's world-readable file inside A's 0700 directory: only a path walk through that directory
    // could reach it, and B may not search it.
    let secret = pattern(40, 3000);
    to(a.mkdir("/alice/private", 0o700)).await.unwrap();
    write_new(&a, "/alice/private/secret", 0o644, &secret).await;
    to(a.mkdir("/alice/pub", 0o755)).await.unwrap();
    write_new(&a, "/alice/pub/open", 0o644, b"open").await;
    assert_eq!(fs_status(to(b.walk("/alice/private/secret", OpenMode::None)).await), FsStatus::PermissionDenied);

    let a_secret = raw_entry(&a, walk_req("/alice/private/secret")).await.handle();
    let a_private = raw_entry(&a, walk_req("/alice/private")).await.handle();
    let b_home = raw_entry(&b, walk_req("/bob")).await.handle();
    let b_open = raw_entry(&b, walk_req("/alice/pub/open")).await.handle();
    let ino = a_secret.ino;
    assert_ne!(a_secret.mac, [0; 32]);
    // Every way B could name A's file without having reached it by name.
    let candidates = [
        ("a guessed inode number", Handle { ino, site: 0, mac: [0; 32] }),
        ("A's own handle, leaked to B", a_secret),
        (
            "B's handle of another file with the inode number changed",
            Handle { ino, site: b_open.site, mac: b_open.mac },
        ),
        (
            "A's handle with one bit flipped",
            Handle {
                ino,
                site: a_secret.site,
                mac: {
                    let mut m = a_secret.mac;
                    m[31] ^= 1;
                    m
                },
            },
        ),
    ];
    for (what, h) in candidates {
        let requests = vec![
            ManagerRequest::GetAttr { handle: h, open: OpenMode::None },
            ManagerRequest::GetAttr { handle: h, open: OpenMode::Read },
            ManagerRequest::GetAttr { handle: h, open: OpenMode::ReadWrite },
            ManagerRequest::GetAttr { handle: h, open: OpenMode::Best },
            ManagerRequest::GetAttr { handle: h, open: OpenMode::RefreshWrite },
            set_mode(h, 0o666),
            set_size(h, 0),
            ManagerRequest::Link { handle: h, new_parent: b_home, new_name: "stolen".into() },
            ManagerRequest::Commit { handle: h, txn: 0, written_end: 0, missed: vec![], dirty: vec![] },
        ];
        for req in requests {
            let e = raw(&b, req.clone()).await.expect_err("B must be refused");
            assert_eq!(e.status(), Some(FsStatus::BadHandle), "{what}: {req:?}: {e:?}");
            assert_eq!(e.errno(), 116, "ESTALE");
        }
    }
    // A's directory handle does not work for B either (lookup, listing, creating in it).
    for req in [
        ManagerRequest::Lookup { parent: a_private, name: "secret".into(), open: OpenMode::Read },
        ManagerRequest::ReadDir { dir: a_private, after: String::new(), limit: 10 },
        ManagerRequest::Create { parent: a_private, name: "x".into(), mode: 0o644, exclusive: true, truncate: false },
    ] {
        assert_eq!(raw(&b, req.clone()).await.err().and_then(|e| e.status()), Some(FsStatus::BadHandle), "{req:?}");
    }
    // Nothing changed.
    assert!(to(a.read_file("/alice/private/secret")).await.unwrap() == secret);
    let st = to(a.stat("/alice/private/secret")).await.unwrap();
    assert_eq!((st.attr.mode, st.attr.size, st.attr.nlink), (0o644, 3000, 1));
    assert_eq!(fs_status(to(b.stat("/bob/stolen")).await), FsStatus::NotFound);

    // The legitimate path: A's own handles work for every request B was refused.
    let e = raw_entry(&a, ManagerRequest::GetAttr { handle: a_secret, open: OpenMode::Read }).await;
    assert_eq!((e.attr.ino, e.handle()), (ino, a_secret));
    assert!(drive_read(&e.access.expect("A may read"), 3000).await.unwrap() == secret);
    let a_home = raw_entry(&a, walk_req("/alice")).await.handle();
    let linked = raw_entry(&a, ManagerRequest::Link { handle: a_secret, new_parent: a_home, new_name: "s2".into() });
    assert_eq!(linked.await.attr.nlink, 2);
    assert_eq!(raw_entry(&a, set_mode(a_secret, 0o640)).await.attr.mode, 0o640);
    assert_eq!(
        raw_entry(
            &a,
            ManagerRequest::Commit { handle: a_secret, txn: 0, written_end: 0, missed: vec![], dirty: vec![] }
        )
        .await
        .attr
        .size,
        3000
    );
    let listed = raw(&a, ManagerRequest::ReadDir { dir: a_private, after: String::new(), limit: 10 }).await;
    let Ok(ManagerReply::Dir { entries, .. }) = listed else { panic!("{listed:?}") };
    assert_eq!(entries[0].1.handle(), a_secret, "READDIR hands out the same handles");

    // B's legitimately obtained handle is like an open descriptor: it keeps working after A makes
    // the directory unsearchable, but the file's own mode still decides what B may do with it.
    let before = raw_entry(&b, ManagerRequest::GetAttr { handle: b_open, open: OpenMode::Read }).await;
    assert!(before.access.is_some());
    to(a.chmod("/alice/pub", 0o700)).await.unwrap();
    assert_eq!(fs_status(to(b.walk("/alice/pub/open", OpenMode::None)).await), FsStatus::PermissionDenied);
    let after = raw_entry(&b, ManagerRequest::GetAttr { handle: b_open, open: OpenMode::Read }).await;
    assert!(drive_read(&after.access.expect("still readable by mode"), 4).await.unwrap() == b"open");
    to(a.chmod("/alice/pub/open", 0o600)).await.unwrap();
    let refused = raw(&b, ManagerRequest::GetAttr { handle: b_open, open: OpenMode::Read }).await;
    assert_eq!(refused.err().and_then(|e| e.status()), Some(FsStatus::PermissionDenied));

    drop((a, b, admin));
    c.stop().await;
}

fn walk_req(path: &str) -> ManagerRequest {
    ManagerRequest::Walk { path: path.into(), follow: false, open: OpenMode::None }
}

#[test]
fn listing_without_search_permission_shows_names_only_and_stat_mints_no_capability() {
    run(listing_without_search_permission_scenario());
}

async fn listing_without_search_permission_scenario() {
    let c = Cluster::start(ClusterOptions::default()).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    make_home(&admin, "/alice", UID_A).await;
    let a = c.login(USER_A, PW_A).await;
    let b = c.login(USER_B, PW_B).await;
    to(a.mkdir("/alice/listable", 0o744)).await.unwrap();
    write_new(&a, "/alice/listable/f", 0o600, b"private").await;
    to(a.symlink("/a/secret/target", "/alice/listable/l")).await.unwrap();

    // r without x: names and kinds, no attributes, targets or handles.
    let dir = raw_entry(&b, walk_req("/alice/listable")).await.handle();
    let page = raw(&b, ManagerRequest::ReadDir { dir, after: String::new(), limit: 10 }).await.unwrap();
    let want = vec![("f".to_string(), FileKind::File), ("l".to_string(), FileKind::Symlink)];
    assert_eq!(page, ManagerReply::Names { names: want.clone(), more: false });
    assert_eq!(to(b.names("/alice/listable")).await.unwrap(), want);
    assert_eq!(fs_status(to(b.readdir("/alice/listable")).await), FsStatus::PermissionDenied);
    assert_eq!(fs_status(to(b.stat("/alice/listable/f")).await), FsStatus::PermissionDenied);
    // The owner (rwx) gets everything.
    let full = to(a.readdir("/alice/listable")).await.unwrap();
    assert_eq!((full[0].1.mode, full[1].1.kind), (0o600, FileKind::Symlink));

    // r and x: full entries, with handles B may use.
    to(a.chmod("/alice/listable", 0o755)).await.unwrap();
    let page = raw(&b, ManagerRequest::ReadDir { dir, after: String::new(), limit: 10 }).await.unwrap();
    let ManagerReply::Dir { entries, more: false } = page else { panic!("{page:?}") };
    assert_eq!(entries[1].1.target, "/a/secret/target");
    let f = raw_entry(&b, ManagerRequest::GetAttr { handle: entries[0].1.handle(), open: OpenMode::None }).await;
    assert_eq!((f.attr.mode, f.attr.size), (0o600, 7));
    assert_eq!(to(b.readdir("/alice/listable")).await.unwrap().len(), 2);
    assert_eq!(to(b.names("/alice/listable")).await.unwrap(), want);

    // stat and lstat mint no capabilities, even for someone who may write the file: the size and
    // times are the manager's.
    write_new(&a, "/alice/mine", 0o644, b"mine").await;
    let fresh = c.login(USER_A, PW_A).await;
    let st = to(fresh.stat("/alice/mine")).await.unwrap();
    assert_eq!(st.attr.size, 4, "the size the writer's commit recorded");
    assert_eq!(fresh.held_rights(st.attr.ino), None, "stat mints no capability");
    to(fresh.lstat("/alice/mine")).await.unwrap();
    assert_eq!(fresh.held_rights(st.attr.ino), None, "nor lstat");
    // OpenMode::ReadIfAllowed still works on the wire: read rights, never write.
    let granted = to(a.walk("/alice/mine", OpenMode::ReadIfAllowed)).await.unwrap().access.unwrap();
    assert_eq!((granted.rights & rights::WRITE, granted.lifetime_ms), (0, 300_000), "a read capability");

    drop((a, b, admin, fresh));
    c.stop().await;
}

#[test]
fn stat_of_a_file_the_caller_may_not_read_shows_the_managers_size() {
    run(stat_unreadable_scenario());
}

async fn stat_unreadable_scenario() {
    let c = Cluster::start(ClusterOptions { drives: 1, ..Default::default() }).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    make_home(&admin, "/alice", UID_A).await;
    let a = c.login(USER_A, PW_A).await;
    write_new(&a, "/alice/wo", 0o200, b"12345").await;

    // Alice writes more to her write-only (-w-) file and has not flushed it: the manager still
    // records 5 bytes, and stat shows that; the writer knows of 9.
    let f = to(a.open("/alice/wo", true)).await.unwrap();
    to(f.write_at(5, b"6789")).await.unwrap();
    assert_eq!(f.size(), 9, "the writer knows what it wrote");
    assert_eq!(raw_entry(&a, walk_req("/alice/wo")).await.attr.size, 5);
    assert_eq!(to(a.stat("/alice/wo")).await.unwrap().attr.size, 5, "unflushed writes are not the file's yet");
    // The flush commits: from now on stat shows 9, to anyone who reached the file, without a capability.
    to(f.flush()).await.unwrap();
    let fresh = c.login(USER_A, PW_A).await;
    let st = to(fresh.stat("/alice/wo")).await.unwrap();
    assert_eq!(st.attr.size, 9, "the size the commit recorded");
    assert_eq!(fresh.held_rights(st.attr.ino), None, "stat mints no capability");

    // OpenMode::ReadIfAllowed still works on the wire: a capability that allows nothing but GETATTR.
    let granted =
        to(a.walk("/alice/wo", OpenMode::ReadIfAllowed)).await.unwrap().access.expect("an attribute capability");
    assert_eq!(granted.rights, rights::GETATTR);
    let mut d = access_client(&granted).await;
    let (p, o) = (granted.components[0].object.partition, granted.components[0].object.object);
    assert_eq!(to(d.getattr(p, o)).await.unwrap().logical_size, 9);
    let denied = to(d.read(p, o, &[Region { offset: 0, length: 9 }])).await.map(|_| ());
    assert_eq!(drive_status(denied), Status::RightsInsufficient, "no data under it");
    // The writer goes on (a new write transaction).
    to(f.write_at(9, b"0")).await.unwrap();
    assert_eq!(to(f.close()).await.unwrap().size, 10);
    assert_eq!(to(fresh.stat("/alice/wo")).await.unwrap().attr.size, 10);

    drop((a, admin, fresh));
    c.stop().await;
}
