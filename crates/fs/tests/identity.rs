//! Who a request runs as, end to end over real daemons on loopback:
//!
//! - supplementary groups: set by an administrator (`ADD_USER`,
//!   `SET_USER_GROUPS`), they put a user in the group class of every check,
//!   let the owner give a file to any group it is in, and a change reaches
//!   the user's open sessions at their next request.

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
