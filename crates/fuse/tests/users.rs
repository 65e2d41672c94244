//! Who the mount acts for, and what the manager keeps beside file bytes,
//! through the kernel: a mount with `map_users` runs each request as its
//! local caller (uid, gid, supplementary groups) through the manager's
//! gateway requests, with no password of theirs; extended attributes with
//! the system calls programs use.

mod common;

use common::xattr::{cpath, getxattr, listxattr, setxattr};

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

/// Each test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(600);

/// A local user and group no account on this machine needs to own.
const LOCAL_UID: u32 = 47_001;
const LOCAL_GID: u32 = 47_001;
/// A group the local user is in only as a supplementary group.
const SHARED_GID: u32 = 47_500;

/// `sh -c script` as `uid`/`gid` with supplementary `groups`; its exit
/// status and stderr.
fn run_as(uid: u32, gid: u32, groups: &[u32], script: &str) -> (bool, String) {
    let groups: Vec<libc::gid_t> = groups.to_vec();
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run sh as another user");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn map_users_runs_each_request_as_its_local_caller() {
    require_fuse!();
    let mut env = common::Env::start("map_users", LIMIT, common::ClusterOptions::default());
    let manager = env.cluster().manager.clone();
    env.rt().block_on(manager.set_gateway(common::ADMIN, Some((0, u32::MAX)))).expect("grant");
    let mut config = nasd_fuse::MountConfig::new("");
    config.allow_other = true;
    config.map_users = true;
    let m = env.mount_with(common::ADMIN, common::ADMIN_PW, config);

    // Root (the local caller here) makes a shared directory and a private one.
    fs::create_dir(m.join("shared")).unwrap();
    fs::set_permissions(m.join("shared"), fs::Permissions::from_mode(0o777)).unwrap();
    fs::create_dir(m.join("private")).unwrap();
    fs::set_permissions(m.join("private"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(m.join("private/secret"), b"root's").unwrap();
    fs::set_permissions(m.join("private/secret"), fs::Permissions::from_mode(0o644)).unwrap();

    // What the local user makes is the local user's.
    let mine = m.join("shared/mine");
    let (ok, err) = run_as(LOCAL_UID, LOCAL_GID, &[], &format!("echo hello > {}", mine.display()));
    assert!(ok, "the local user writes in a 0777 directory: {err}");
    let md = fs::metadata(&mine).unwrap();
    assert_eq!((md.uid(), md.gid()), (LOCAL_UID, LOCAL_GID), "owned by its local caller");
    assert_eq!(fs::read(&mine).unwrap(), b"hello\n");

    // The local user may not do what its ids may not.
    let (ok, _) = run_as(LOCAL_UID, LOCAL_GID, &[], &format!("echo x > {}", m.join("intruder").display()));
    assert!(!ok, "root's 0755 directory refuses the local user");
    let (ok, _) = run_as(LOCAL_UID, LOCAL_GID, &[], &format!("cat {}", m.join("private/secret").display()));
    assert!(!ok, "no search permission on root's 0700 directory, whatever root looked up before");
    let (ok, _) = run_as(LOCAL_UID, LOCAL_GID, &[], &format!("chmod 666 {}", m.join("private/secret").display()));
    assert!(!ok);

    // Supplementary groups reach the manager.
    let group_file = m.join("shared/group-file");
    fs::write(&group_file, b"for the group").unwrap();
    let c = CString::new(group_file.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path; chown(2) touches nothing else.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 0, SHARED_GID) }, 0);
    fs::set_permissions(&group_file, fs::Permissions::from_mode(0o640)).unwrap();
    let cat = format!("cat {}", group_file.display());
    assert!(run_as(LOCAL_UID, LOCAL_GID, &[SHARED_GID], &cat).0, "a member through a supplementary group reads");
    assert!(!run_as(LOCAL_UID, LOCAL_GID, &[], &cat).0, "a non-member does not");
    // A chgrp by the owner to a group it is in only as a supplementary group.
    let chgrp = format!("chgrp {SHARED_GID} {}", mine.display());
    assert!(!run_as(LOCAL_UID, LOCAL_GID, &[], &chgrp).0);
    let (ok, err) = run_as(LOCAL_UID, LOCAL_GID, &[SHARED_GID], &chgrp);
    assert!(ok, "{err}");
    assert_eq!(fs::metadata(&mine).unwrap().gid(), SHARED_GID);
    env.stop();
}

#[test]
fn without_a_gateway_grant_a_mapped_mount_acts_for_nobody() {
    require_fuse!();
    let mut env = common::Env::start("map_users_no_grant", LIMIT, common::ClusterOptions::default());
    let mut config = nasd_fuse::MountConfig::new("");
    config.map_users = true;
    let m = env.mount_with(common::ADMIN, common::ADMIN_PW, config);
    let e = fs::write(m.join("f"), b"x").unwrap_err();
    assert_eq!(common::errno_of(&e), libc::EPERM, "the manager refuses AS_USER without a grant: {e}");
    env.stop();
}

#[test]
fn extended_attributes_through_the_kernel() {
    require_fuse!();
    let mut env = common::Env::start("xattrs", LIMIT, common::ClusterOptions::default());
    let m = env.mount();
    let f = m.join("f");
    fs::write(&f, b"data").unwrap();
    setxattr(&f, "user.mime", b"text/plain", 0).unwrap();
    assert_eq!(getxattr(&f, "user.mime", 100).unwrap(), b"text/plain");
    // The size query (a zero-length buffer) and a buffer too small.
    let p = cpath(&f);
    let n = CString::new("user.mime").unwrap();
    // SAFETY: a size query passes a null buffer of length 0.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(len, 10);
    assert_eq!(getxattr(&f, "user.mime", 3), Err(libc::ERANGE));
    assert_eq!(getxattr(&f, "user.none", 100), Err(libc::ENODATA));
    assert_eq!(setxattr(&f, "user.mime", b"x", libc::XATTR_CREATE), Err(libc::EEXIST));
    assert_eq!(setxattr(&f, "user.other", b"x", libc::XATTR_REPLACE), Err(libc::ENODATA));
    assert_eq!(setxattr(&f, "system.posix_acl_access", b"", 0), Err(libc::EOPNOTSUPP));
    let big = vec![7u8; 65536];
    setxattr(&f, "user.big", &big, 0).unwrap();
    assert_eq!(getxattr(&f, "user.big", 65536).unwrap(), big);
    setxattr(&f, "trusted.admin", b"t", 0).unwrap();
    assert_eq!(listxattr(&f), ["trusted.admin", "user.big", "user.mime"]);
    // On a directory too; and gone with the file.
    fs::create_dir(m.join("d")).unwrap();
    setxattr(&m.join("d"), "user.dir", b"1", 0).unwrap();
    assert_eq!(listxattr(&m.join("d")), ["user.dir"]);
    let rm = CString::new("user.big").unwrap();
    // SAFETY: valid NUL-terminated strings.
    assert_eq!(unsafe { libc::removexattr(p.as_ptr(), rm.as_ptr()) }, 0);
    assert_eq!(listxattr(&f), ["trusted.admin", "user.mime"]);
    // cp --preserve=all copies them (and skips the ACLs the mount does not keep).
    let copy = m.join("copy");
    common::sh(Command::new("cp").arg("--preserve=all").arg(&f).arg(&copy));
    assert_eq!(getxattr(&copy, "user.mime", 100).unwrap(), b"text/plain");
    env.stop();
}

#[test]
fn writes_past_a_quota_fail_with_edquot() {
    use std::io::Write;
    require_fuse!();
    let mut env = common::Env::start("quota", LIMIT, common::ClusterOptions::default());
    let m = env.mount();
    fs::create_dir(m.join("proj")).unwrap();
    let admin = env.rt().block_on(env.cluster().login(common::ADMIN, common::ADMIN_PW));
    env.rt()
        .block_on(async {
            let proj = admin.walk("/proj", nasd_fs::OpenMode::None).await?.handle();
            admin.set_quota(nasd_fs::QuotaOf::Dir(proj), Some(1 << 20), Some(100)).await
        })
        .expect("set the quota");
    // 512 KiB pieces: the third finds no room.
    let piece = vec![7u8; 512 * 1024];
    let mut f = fs::File::create(m.join("proj/big")).unwrap();
    f.write_all(&piece).unwrap();
    f.write_all(&piece).unwrap();
    let e = f.write_all(&piece).unwrap_err();
    assert_eq!(common::errno_of(&e), libc::EDQUOT, "{e}");
    drop(f);
    assert_eq!(fs::metadata(m.join("proj/big")).unwrap().len(), 1 << 20, "what was accepted, whole");
    // Inodes too; and a rename out of the quota's tree is EXDEV (mv copies instead).
    for i in 0..99 {
        fs::write(m.join(format!("proj/f{i}")), b"").unwrap();
    }
    let e = fs::write(m.join("proj/one-too-many"), b"").unwrap_err();
    assert_eq!(common::errno_of(&e), libc::EDQUOT);
    let e = fs::rename(m.join("proj/f0"), m.join("f0")).unwrap_err();
    assert_eq!(common::errno_of(&e), libc::EXDEV);
    env.stop();
}
