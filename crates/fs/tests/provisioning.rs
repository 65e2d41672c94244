//! Drive set-up edge cases: a drive a manager set up but never recorded (it
//! stopped in between) can be set up again; a drive holding other data is
//! refused. And POSIX create: the creator may write a file it creates
//! read-only, and close it.

mod common;

use common::TestDrive;
use nasd_client::DriveClient;
use nasd_manager::drives::DriveHandle;
use nasd_manager::keys::DriveKeys;
use nasd_manager::{Manager, ManagerConfig};
use nasd_proto::fs::FsStatus;
use nasd_proto::manager::{Entry, ManagerReply, ManagerRequest, OpenMode};
use nasd_proto::{rights, Protection};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_provisioned_drives_are_set_up_again_and_foreign_ones_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let config = ManagerConfig { pool_target: 4, ..ManagerConfig::default() };

    // A manager provisioned this drive fully, then died before recording it.
    let orphaned = TestDrive::start(tmp.path().join("d0")).await;
    let mut c = DriveClient::connect(orphaned.addr).await.unwrap();
    let lost_keys = DriveKeys::generate(nasd_env::clock::system_ns() / 1_000_000_000);
    DriveHandle::provision(&mut c, &orphaned.master, &lost_keys, config.partition, 1 << 30, Protection::INTEGRITY_ARGS)
        .await
        .unwrap();

    // Another drive holds someone else's partition.
    let foreign = TestDrive::start(tmp.path().join("d1")).await;
    let mut c = DriveClient::connect(foreign.addr).await.unwrap();
    DriveHandle::provision(
        &mut c,
        &foreign.master,
        &DriveKeys::generate(nasd_env::clock::system_ns() / 1_000_000_000),
        77,
        1 << 30,
        Protection::INTEGRITY_ARGS,
    )
    .await
    .unwrap();

    let m = Manager::open(&tmp.path().join("manager"), config).unwrap();
    let drive = m.add_drive(&orphaned.addr.to_string(), &orphaned.master).await.expect("set up again");
    assert_eq!(drive, 0);
    let refused = m.add_drive(&foreign.addr.to_string(), &foreign.master).await.expect_err("someone's data");
    assert_eq!(refused.status, FsStatus::InvalidArgument, "{refused}");
    assert!(refused.message.contains("already holds partitions"), "{}", refused.message);
    let again = m.add_drive(&orphaned.addr.to_string(), &orphaned.master).await.expect_err("in service already");
    assert_eq!(again.status, FsStatus::Exists);

    // The re-provisioned drive serves files: the creator of a 0444 file may
    // write it (POSIX open with O_CREAT) and close it; others may not write it.
    m.bootstrap_admin("admin", "admin-password").await.unwrap();
    m.add_user("alice", "alice-password", 1000, 1000, false).await.unwrap();
    let alice = m.open_session("alice", "alice-password").await.unwrap();
    let admin = m.open_session("admin", "admin-password").await.unwrap();
    let walk = |path: &str| ManagerRequest::Walk { path: path.into(), follow: true, open: OpenMode::None };
    let entry = |r: Result<ManagerReply, nasd_manager::Failure>| -> Entry {
        let Ok(ManagerReply::Entry(e)) = r else { panic!("{r:?}") };
        e
    };
    let root = entry(m.handle(&admin, walk("/")).await).handle();
    let dir = ManagerRequest::Mkdir { parent: root, name: "shared".into(), mode: 0o1777 };
    entry(m.handle(&admin, dir).await);
    let shared = entry(m.handle(&alice, walk("/shared")).await).handle();
    let create =
        ManagerRequest::Create { parent: shared, name: "ro".into(), mode: 0o444, exclusive: true, truncate: false };
    let ManagerReply::Entry(e) = m.handle(&alice, create).await.unwrap() else { panic!("create") };
    let access = e.access.clone().expect("the creator gets a capability");
    assert_ne!(access.rights & rights::WRITE, 0, "the creator may write what it just created");
    m.handle(
        &alice,
        ManagerRequest::Commit { handle: e.handle(), txn: 0, written_end: 0, missed: vec![], dirty: vec![] },
    )
    .await
    .expect("the owner may close");

    m.add_user("bob", "bob-password", 1001, 1001, false).await.unwrap();
    let bob = m.open_session("bob", "bob-password").await.unwrap();
    let (ro, shared) = (
        entry(m.handle(&bob, walk("/shared/ro")).await).handle(),
        entry(m.handle(&bob, walk("/shared")).await).handle(),
    );
    let close = m
        .handle(&bob, ManagerRequest::Commit { handle: ro, txn: 0, written_end: 0, missed: vec![], dirty: vec![] })
        .await
        .expect_err("not bob's, not writable");
    assert_eq!(close.status, FsStatus::PermissionDenied);
    let link = ManagerRequest::Link { handle: ro, new_parent: shared, new_name: "mine".into() };
    let link = m.handle(&bob, link).await.expect_err("bob may not hard-link alice's read-only file");
    assert_eq!(link.status, FsStatus::PermissionDenied);
    let reopen =
        ManagerRequest::Create { parent: shared, name: "ro".into(), mode: 0o644, exclusive: false, truncate: true };
    let trunc = m.handle(&bob, reopen).await.expect_err("bob may not truncate it");
    assert_eq!(trunc.status, FsStatus::PermissionDenied);

    orphaned.stop().await;
    foreign.stop().await;
}
