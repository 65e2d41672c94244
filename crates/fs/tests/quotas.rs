//! Quotas end to end over real daemons on loopback: a directory's tree and a
//! user's files limited in bytes (what their data takes: holes cost nothing)
//! and inodes, writes past them refused with EDQUOT (never a silently short
//! file), the escrow a writer holds, and no rename across a quota's
//! boundary.

mod common;

use common::*;
use nasd_fs::{FsStatus, QuotaOf};

const MIB: usize = 1 << 20;

#[test]
fn quotas_limit_trees_and_users() {
    run(async {
        let cluster = Cluster::start(ClusterOptions::default()).await;
        let admin = cluster.login(ADMIN, ADMIN_PW).await;
        let alice = cluster.login(USER_A, PW_A).await;
        to(admin.mkdir("/proj", 0o777)).await.unwrap();
        let proj = QuotaOf::Dir(to(admin.walk("/proj", nasd_fs::OpenMode::None)).await.unwrap().handle());
        // Handles are per user: alice names the directory by her own.
        let proj_a = QuotaOf::Dir(to(alice.walk("/proj", nasd_fs::OpenMode::None)).await.unwrap().handle());
        let e = to(alice.set_quota(proj_a, Some(1), None)).await.unwrap_err();
        assert_eq!(e.status(), Some(FsStatus::NotAdmin), "only administrators set quotas");
        to(admin.set_quota(proj, Some(3 * MIB as u64), Some(10))).await.unwrap();

        to(alice.write_file("/proj/a", &pattern(1, 2 * MIB))).await.unwrap();
        // The next file gets the 1 MiB left, in its escrow, and no more: EDQUOT, with
        // what was written before kept whole.
        let f = to(alice.create("/proj/b", 0o644, true, false)).await.unwrap();
        to(f.write_at(0, &pattern(2, MIB))).await.unwrap();
        let e = to(f.write_at(MIB as u64, &pattern(3, MIB))).await.unwrap_err();
        assert_eq!((e.status(), e.errno()), (Some(FsStatus::QuotaExceeded), 122), "EDQUOT: {e}");
        to(f.flush()).await.unwrap();
        assert_eq!(to(alice.read_file("/proj/b")).await.unwrap(), pattern(2, MIB), "b holds exactly what was accepted");
        let q = to(alice.quota(proj_a)).await.unwrap();
        assert_eq!((q.exists, q.bytes_used, q.files_used), (true, 3 * MIB as u64, 2));
        // More room: the same file takes more, under a fresh escrow.
        to(admin.set_quota(proj, Some(4 * MIB as u64), Some(10))).await.unwrap();
        to(f.write_at(MIB as u64, &pattern(3, MIB))).await.unwrap();
        let q = to(alice.quota(proj_a)).await.unwrap();
        assert!(q.escrow > 0 || q.bytes_used == 4 * MIB as u64, "an open writer holds escrow: {q:?}");
        to(f.close()).await.unwrap();
        let q = to(alice.quota(proj_a)).await.unwrap();
        assert_eq!((q.bytes_used, q.escrow), (4 * MIB as u64, 0), "given back at the commit");
        // Quotas count what the data takes: truncating up past the quota adds
        // a hole, which costs nothing (it used to be refused).
        to(alice.truncate("/proj/a", 3 * MIB as u64)).await.unwrap();
        assert_eq!(to(alice.stat("/proj/a")).await.unwrap().attr.size, 3 * MIB as u64);
        assert_eq!(to(alice.quota(proj_a)).await.unwrap().bytes_used, 4 * MIB as u64);
        // No rename or link across the quota's boundary: EXDEV.
        to(admin.mkdir("/other", 0o777)).await.unwrap();
        let e = to(alice.rename("/proj/a", "/other/a")).await.unwrap_err();
        assert_eq!((e.status(), e.errno()), (Some(FsStatus::CrossQuota), 18));
        to(alice.unlink("/proj/a")).await.unwrap();
        assert_eq!(to(alice.quota(proj_a)).await.unwrap().bytes_used, 2 * MIB as u64);

        // A user's inode limit; a user sees its own quota, not another's.
        let me = QuotaOf::User(UID_A);
        to(admin.set_quota(me, None, Some(3))).await.unwrap();
        assert_eq!(to(alice.quota(me)).await.unwrap().files_used, 1, "b");
        to(alice.write_file("/proj/c", b"c")).await.unwrap();
        to(alice.mkdir("/proj/d", 0o755)).await.unwrap();
        let e = to(alice.mkdir("/proj/e", 0o755)).await.unwrap_err();
        assert_eq!(e.status(), Some(FsStatus::QuotaExceeded), "a fourth inode of alice's");
        assert_eq!(to(alice.quota(QuotaOf::User(UID_B))).await.unwrap_err().status(), Some(FsStatus::NotAdmin));
        to(admin.set_quota(me, None, None)).await.unwrap();
        assert!(!to(alice.quota(me)).await.unwrap().exists, "removed");
        to(alice.mkdir("/proj/e", 0o755)).await.unwrap();
        drop((admin, alice));
        cluster.stop().await;
    });
}
