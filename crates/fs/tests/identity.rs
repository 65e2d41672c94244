//! Who a request runs as, and what the manager keeps beside names, end to
//! end over real daemons on loopback:
//!
//! - supplementary groups: set by an administrator (`ADD_USER`,
//!   `SET_USER_GROUPS`), they put a user in the group class of every check,
//!   let the owner give a file to any group it is in, and a change reaches
//!   the user's open sessions at their next request.
//! - gateways (`AS_USER`): one login acts for local users within the ids an
//!   administrator granted it.
//! - extended attributes, and the change feed (`WATCH`).

mod common;

use common::*;
use nasd_fs::{FsError, FsStatus};

/// The manager's refusal status of a failed call.
#[track_caller]
fn fs_status<T: std::fmt::Debug>(r: Result<T, FsError>) -> FsStatus {
    match r {
        Err(e) => e.status().unwrap_or_else(|| panic!("expected a refusal from the manager, got {e:?}")),
        Ok(v) => panic!("expected a refusal from the manager, got {v:?}"),
    }
}

const USER_C: &str = "carol";
const PW_C: &str = "carol password";
const UID_C: u32 = 1002;

#[test]
fn supplementary_groups_end_to_end() {
    run(async {
        let cluster = Cluster::start(ClusterOptions::default()).await;
        let admin = cluster.login(ADMIN, ADMIN_PW).await;
        // Carol is in alice's private group (gid UID_A) as a supplementary group.
        to(admin.add_user_in_groups(USER_C, PW_C, UID_C, UID_C, &[UID_A, 5000, UID_A], false)).await.unwrap();
        let listed = to(admin.users()).await.unwrap();
        let carol_info = listed.iter().find(|u| u.name == USER_C).expect("carol is listed");
        assert_eq!(carol_info.groups, [UID_A, 5000], "sorted and deduplicated by the client");
        to(admin.mkdir("/d", 0o777)).await.unwrap();

        let alice = cluster.login(USER_A, PW_A).await;
        let (bob, carol) = (cluster.login(USER_B, PW_B).await, cluster.login(USER_C, PW_C).await);
        to(alice.write_file("/d/f", b"group data")).await.unwrap();
        to(alice.chmod("/d/f", 0o640)).await.unwrap();
        assert_eq!(
            to(carol.read_file("/d/f")).await.unwrap(),
            b"group data",
            "the group class through a supplementary group"
        );
        assert_eq!(fs_status(to(bob.read_file("/d/f")).await), FsStatus::PermissionDenied);
        assert_eq!(fs_status(to(carol.open("/d/f", true)).await), FsStatus::PermissionDenied, "g has no w");

        // The group class denies what others get.
        to(alice.chmod("/d/f", 0o604)).await.unwrap();
        assert_eq!(fs_status(to(carol.read_file("/d/f")).await), FsStatus::PermissionDenied);
        assert_eq!(to(bob.read_file("/d/f")).await.unwrap(), b"group data");
        to(alice.chmod("/d/f", 0o640)).await.unwrap();

        // Taken out of the group: carol's session, logged in before, loses it at its next request.
        to(admin.set_user_groups(USER_C, &[5000])).await.unwrap();
        assert_eq!(fs_status(to(carol.read_file("/d/f")).await), FsStatus::PermissionDenied);

        // chgrp: alice may give her file to a group she is in, and to no other.
        assert_eq!(fs_status(to(alice.chown("/d/f", None, Some(5000))).await), FsStatus::NotPermitted);
        to(admin.set_user_groups(USER_A, &[5000])).await.unwrap();
        let attr = to(alice.chown("/d/f", None, Some(5000))).await.unwrap();
        assert_eq!((attr.uid, attr.gid), (UID_A, 5000));
        assert_eq!(to(carol.read_file("/d/f")).await.unwrap(), b"group data", "carol is in 5000");
        assert_eq!(fs_status(to(alice.chown("/d/f", None, Some(6000))).await), FsStatus::NotPermitted);

        // Only administrators set groups, and never more than GROUPS_MAX.
        assert_eq!(fs_status(to(alice.set_user_groups(USER_A, &[1, 2])).await), FsStatus::NotAdmin);
        let many: Vec<u32> = (0..=nasd_fs::GROUPS_MAX as u32).collect();
        assert_eq!(to(admin.set_user_groups(USER_C, &many)).await.unwrap_err().errno(), 22, "refused, not cut short");
        drop((alice, bob, carol, admin));
        cluster.stop().await;
    });
}

const GW: &str = "gateway";
const GW_PW: &str = "gateway password";

/// `AS_USER`: a gateway logged in once acts for local users without their
/// passwords, as them, within the ids an administrator granted it.
#[test]
fn gateways_act_for_local_users_within_their_grant() {
    run(async {
        let cluster = Cluster::start(ClusterOptions::default()).await;
        let admin = cluster.login(ADMIN, ADMIN_PW).await;
        to(admin.add_user(GW, GW_PW, 950, 950, false)).await.unwrap();
        to(admin.mkdir("/home", 0o777)).await.unwrap();
        let gw = cluster.login(GW, GW_PW).await;
        let as_a = gw.as_user(UID_A, UID_A, &[]).unwrap();
        assert_eq!(as_a.identity().uid, UID_A);
        assert_eq!(fs_status(to(as_a.mkdir("/home/x", 0o755)).await), FsStatus::NotPermitted, "no grant yet");

        to(admin.set_gateway(GW, Some((1000, 60_000)))).await.unwrap();
        let listed = to(admin.users()).await.unwrap();
        assert_eq!(listed.iter().find(|u| u.name == GW).unwrap().gateway, Some((1000, 60_000)));
        to(as_a.write_file("/home/a.txt", b"from a")).await.unwrap();
        let st = to(as_a.stat("/home/a.txt")).await.unwrap();
        assert_eq!((st.attr.uid, st.attr.gid), (UID_A, UID_A), "made as the user it acts for");
        let alice = cluster.login(USER_A, PW_A).await;
        assert_eq!(to(alice.read_file("/home/a.txt")).await.unwrap(), b"from a", "alice's own file");

        // Another local user: its own permissions, its claimed groups.
        to(as_a.chmod("/home/a.txt", 0o640)).await.unwrap();
        let other = gw.as_user(1005, 1005, &[]).unwrap();
        assert_eq!(fs_status(to(other.read_file("/home/a.txt")).await), FsStatus::PermissionDenied);
        let in_group = gw.as_user(1005, 1005, &[UID_A]).unwrap();
        assert_eq!(to(in_group.read_file("/home/a.txt")).await.unwrap(), b"from a");
        assert_eq!(fs_status(to(in_group.open("/home/a.txt", true)).await), FsStatus::PermissionDenied);

        // Outside the grant, and administrator requests, are refused.
        let root = gw.as_user(0, 0, &[]).unwrap();
        assert_eq!(fs_status(to(root.read_file("/home/a.txt")).await), FsStatus::NotPermitted);
        assert_eq!(fs_status(to(as_a.users()).await), FsStatus::NotAdmin, "not wrapped: runs as the gateway");
        to(admin.set_gateway(GW, None)).await.unwrap();
        assert_eq!(fs_status(to(as_a.read_file("/home/a.txt")).await), FsStatus::NotPermitted, "grant taken away");
        drop((admin, gw, as_a, alice, other, in_group, root));
        cluster.stop().await;
    });
}

/// Extended attributes through the manager, by handle.
#[test]
fn extended_attributes_end_to_end() {
    run(async {
        let cluster = Cluster::start(ClusterOptions::default()).await;
        let alice = cluster.login(USER_A, PW_A).await;
        let admin = cluster.login(ADMIN, ADMIN_PW).await;
        to(admin.mkdir("/d", 0o777)).await.unwrap();
        to(alice.write_file("/d/f", b"x")).await.unwrap();
        let h = to(alice.walk("/d/f", nasd_fs::OpenMode::None)).await.unwrap().handle();
        let big = vec![0xa5u8; nasd_proto::fs::XATTR_VALUE_MAX];
        to(alice.setxattr(h, "user.big", &big, nasd_fs::XattrMode::Create)).await.unwrap();
        to(alice.setxattr(h, "user.small", b"s", nasd_fs::XattrMode::Either)).await.unwrap();
        assert_eq!(to(alice.getxattr(h, "user.big")).await.unwrap(), big, "a 64 KiB value goes and comes back whole");
        assert_eq!(to(alice.listxattr(h)).await.unwrap(), ["user.big", "user.small"]);
        let e = to(alice.setxattr(h, "user.small", b"t", nasd_fs::XattrMode::Create)).await.unwrap_err();
        assert_eq!(e.errno(), 17, "EEXIST");
        assert_eq!(to(alice.getxattr(h, "user.none")).await.unwrap_err().errno(), 61, "ENODATA");
        assert_eq!(to(alice.setxattr(h, "os2.x", b"", nasd_fs::XattrMode::Either)).await.unwrap_err().errno(), 95);
        assert_eq!(to(alice.setxattr(h, "trusted.x", b"", nasd_fs::XattrMode::Either)).await.unwrap_err().errno(), 1);
        let over = vec![0u8; nasd_proto::fs::XATTR_VALUE_MAX + 1];
        let e = to(alice.setxattr(h, "user.over", &over, nasd_fs::XattrMode::Either)).await.unwrap_err();
        assert_eq!(e.errno(), 22, "refused by the client before sending: {e}");
        to(alice.removexattr(h, "user.big")).await.unwrap();
        assert_eq!(to(alice.listxattr(h)).await.unwrap(), ["user.small"]);
        drop((alice, admin));
        cluster.stop().await;
    });
}

/// The change feed over the wire: a watcher sees another client's changes
/// as they happen, in order.
#[test]
fn a_watcher_sees_other_clients_changes() {
    run(async {
        let cluster = Cluster::start(ClusterOptions::default()).await;
        let admin = cluster.login(ADMIN, ADMIN_PW).await;
        let alice = cluster.login(USER_A, PW_A).await;
        let mut watcher = alice.watcher();
        assert!(to(watcher.wait(std::time::Duration::ZERO)).await.unwrap().lost, "the first wait starts the feed");
        to(admin.mkdir("/w", 0o777)).await.unwrap();
        let wait = std::time::Duration::from_secs(20);
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let b = to(watcher.wait(wait)).await.unwrap();
            assert!(!b.lost);
            seen.extend(b.changes);
        }
        let root = nasd_fs::ROOT_INO;
        assert_eq!(seen, [nasd_fs::Change::Entry { dir: root, name: "w".into() }, nasd_fs::Change::Inode(root)]);
        to(alice.write_file("/w/f", b"1")).await.unwrap();
        let ino = to(alice.stat("/w/f")).await.unwrap().attr.ino;
        let mut seen = Vec::new();
        while !seen.contains(&nasd_fs::Change::Inode(ino)) {
            let b = to(watcher.wait(wait)).await.unwrap();
            assert!(!b.lost);
            seen.extend(b.changes);
        }
        drop((admin, alice));
        cluster.stop().await;
    });
}

/// Special files (`MKNOD`): FIFOs and sockets by anyone who may write the
/// directory, devices by the superuser only; inodes without data.
#[test]
fn special_files_end_to_end() {
    use nasd_fs::FileKind;
    run(async {
        let cluster = Cluster::start(ClusterOptions::default()).await;
        let admin = cluster.login(ADMIN, ADMIN_PW).await;
        let alice = cluster.login(USER_A, PW_A).await;
        to(admin.mkdir("/dev", 0o777)).await.unwrap();
        let p = to(alice.mknod("/dev/pipe", FileKind::Fifo, 0o620, 0)).await.unwrap();
        assert_eq!((p.kind, p.mode, p.uid, p.rdev), (FileKind::Fifo, 0o620, UID_A, 0));
        let e = to(alice.mknod("/dev/sda", FileKind::BlockDevice, 0o660, 0x0800)).await.unwrap_err();
        assert_eq!(e.errno(), 1, "EPERM: devices are the superuser's: {e}");
        let d = to(admin.mknod("/dev/sda", FileKind::BlockDevice, 0o660, 0x0800)).await.unwrap();
        assert_eq!((d.kind, d.rdev), (FileKind::BlockDevice, 0x0800));
        let e = to(alice.mknod("/dev/file", FileKind::File, 0o644, 0)).await.unwrap_err();
        assert_eq!(e.errno(), 22, "MKNOD makes special files only");
        let listed = to(alice.readdir("/dev")).await.unwrap();
        let kinds: Vec<_> = listed.iter().map(|(n, a)| (n.as_str(), a.kind, a.rdev)).collect();
        assert_eq!(kinds, [("pipe", FileKind::Fifo, 0), ("sda", FileKind::BlockDevice, 0x0800)]);
        assert_eq!(to(alice.open("/dev/pipe", false)).await.unwrap_err().errno(), 22, "no data to open");
        to(alice.unlink("/dev/pipe")).await.unwrap();
        to(admin.unlink("/dev/sda")).await.unwrap();
        drop((admin, alice));
        cluster.stop().await;
    });
}
