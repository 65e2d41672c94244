//! Faults between the manager, the clients and a drive, made by a relay
//! in front of the drive (`common::Proxy`): the drive cut off while its
//! working key is replaced, a reply altered in flight, a size change held
//! up at the drive while the file's mode changes.

mod common;

use common::*;
use nasd_client::ClientError;
use nasd_fs::{FailureCause, FsError, OpenMode as Open};
use nasd_proto::manager::{set_mask, Handle, ManagerReply, ManagerRequest, OpenMode};
use std::time::{Duration, Instant};

/// A cluster whose only drive is reached through a [`Proxy`].
async fn proxied_cluster() -> (Cluster, TestDrive, Proxy) {
    let c = Cluster::start(ClusterOptions { drives: 0, ..Default::default() }).await;
    let drive = TestDrive::start(c.dir().join("drive-behind-proxy")).await;
    let proxy = Proxy::start(drive.addr).await;
    to(c.manager.add_drive(&proxy.addr.to_string(), &drive.master)).await.expect("add the drive behind the proxy");
    (c, drive, proxy)
}

async fn stop(c: Cluster, drive: TestDrive, proxy: Proxy) {
    c.stop().await;
    drop(proxy);
    drive.stop().await;
}

#[test]
fn capabilities_work_while_a_new_working_key_waits_for_its_drive() {
    run(key_pending_scenario());
}

async fn key_pending_scenario() {
    let (c, drive, proxy) = proxied_cluster().await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    let data = pattern(1, 10_000);
    to(admin.write_file("/f", &data)).await.unwrap();
    let d = c.manager.drives()[0].clone();
    assert!(!d.key_pending(), "a new drive has the key it was set up with");
    let before = d.keys().current.0;

    // The drive is out of reach when its working key is replaced: the new key
    // is recorded but not installed, and the failing drive's upkeep backs off.
    proxy.cut();
    to(c.manager.rotate(&d)).await.expect_err("the drive cannot be told");
    assert!(d.key_pending());
    assert_eq!(d.keys().current.0, before + 1);
    to(c.manager.maintain()).await;
    assert!(d.key_pending());
    proxy.reconnect();

    // Capabilities minted meanwhile carry a key the drive has.
    let client = c.login(ADMIN, ADMIN_PW).await;
    let read = to(client.read_file("/f")).await.expect("a capability minted while the install is pending works");
    assert_eq!(read, data);

    // The next pass installs the key, backoff or not; capabilities then use it.
    to(c.manager.maintain()).await;
    assert!(!d.key_pending(), "the pending working key is installed on the next pass");
    let client = c.login(ADMIN, ADMIN_PW).await;
    assert_eq!(to(client.read_file("/f")).await.unwrap(), data);
    // And the next rotation goes through.
    to(c.manager.rotate(&d)).await.expect("rotate");
    assert_eq!(to(c.login(ADMIN, ADMIN_PW).await.read_file("/f")).await.unwrap(), data);

    drop((admin, client));
    stop(c, drive, proxy).await;
}

#[test]
fn a_connection_left_unusable_by_an_altered_reply_is_replaced() {
    run(altered_reply_scenario());
}

async fn altered_reply_scenario() {
    let (c, drive, proxy) = proxied_cluster().await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    let data = pattern(2, 256 * 1024);
    to(admin.write_file("/f", &data)).await.unwrap();
    let f = to(admin.open("/f", false)).await.unwrap();
    // Connected, with a capability (a read away from the start: no read-ahead follows it).
    assert_eq!(to(f.read_at(1, 1)).await.expect("a first read"), data[1..2]);

    // One bit of the read's data flips on the way: the tag catches it, the
    // client library marks the connection unusable, and the file (one
    // component, no redundancy) has nothing to read around it with.
    proxy.tamper_at(64 * 1024);
    let e = to(f.read_at(0, data.len() as u64)).await.expect_err("altered data is refused");
    let FsError::Unavailable { failures, missing_drives, tolerates: 0, .. } = &e else { panic!("{e:?}") };
    assert_eq!(missing_drives.len(), 1, "{e}");
    assert!(
        matches!(&failures[0].cause, FailureCause::Drive(c) if matches!(**c, ClientError::HashAndMacMismatch(_) | ClientError::BadReply(_))),
        "{e:?}"
    );
    assert_eq!(e.errno(), 5, "EIO");
    // A read is not repeated by itself; the next one runs on a new connection.
    let again = to(f.read_at(0, data.len() as u64)).await.expect("the next read reconnects");
    assert_eq!(again, data);

    drop((f, admin));
    stop(c, drive, proxy).await;
}

fn set_attr(handle: Handle, mask: u8, mode: u32, size: u64) -> ManagerRequest {
    ManagerRequest::SetAttr { handle, mask, mode, uid: 0, gid: 0, size, atime_ns: 0, mtime_ns: 0 }
}

#[test]
fn a_chmod_cannot_come_between_a_truncates_check_and_its_commit() {
    run(truncate_against_chmod_scenario());
}

async fn truncate_against_chmod_scenario() {
    let (c, drive, proxy) = proxied_cluster().await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    to(admin.mkdir("/shared", 0o777)).await.unwrap();
    let alice_fs = c.login(USER_A, PW_A).await;
    let data = pattern(3, 1000);
    to(alice_fs.write_file("/shared/f", &data)).await.unwrap();
    to(alice_fs.chmod("/shared/f", 0o666)).await.unwrap();

    let m = c.manager.clone();
    let alice = to(m.open_session(USER_A, PW_A)).await.unwrap();
    let bob = to(m.open_session(USER_B, PW_B)).await.unwrap();
    let walk = ManagerRequest::Walk { path: "/shared/f".into(), follow: true, open: OpenMode::None };
    let handle_for = |reply| match reply {
        Ok(ManagerReply::Entry(e)) => e.handle(),
        other => panic!("walk: {other:?}"),
    };
    let hb = handle_for(to(m.handle(&bob, walk.clone())).await);
    let ha = handle_for(to(m.handle(&alice, walk)).await);

    // Bob (write permission as "other") truncates; the drive's side of it is
    // held up at the relay, after the manager checked his permission.
    proxy.pause(true);
    let truncate = {
        let m = m.clone();
        tokio::spawn(async move { m.handle(&bob, set_attr(hb, set_mask::SIZE, 0, 10)).await })
    };
    to(async {
        while proxy.held() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // Alice takes the write permission away meanwhile. The wait gives her
    // chmod every chance to commit before the truncate does; a slow machine
    // can only make the test miss the race, not fail.
    let chmod = {
        let (m, alice) = (m.clone(), alice.clone());
        tokio::spawn(async move { m.handle(&alice, set_attr(ha, set_mask::MODE, 0o644, 0)).await })
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let mode = match to(m.handle(&alice, ManagerRequest::GetAttr { handle: ha, open: OpenMode::None })).await {
            Ok(ManagerReply::Entry(e)) => e.attr.mode,
            other => panic!("getattr: {other:?}"),
        };
        if mode == 0o644 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.pause(false);
    let truncated = to(truncate).await.expect("truncate task");
    to(chmod).await.expect("chmod task").expect("chmod");

    // Never a refused request after the drive cut the data: the truncate
    // was checked and committed as one, before the chmod.
    let object = to(admin.walk("/shared/f", Open::Read)).await.unwrap().access.unwrap().components[0].object;
    let on_drive = to(c.manager.drives()[0].getattr(object.object)).await.expect("getattr").logical_size;
    assert_eq!(to(admin.stat("/shared/f")).await.unwrap().attr.size, on_drive, "the manager's record");
    match truncated {
        Ok(ManagerReply::Entry(e)) => {
            assert_eq!((e.attr.size, on_drive), (10, 10));
        }
        other => panic!("the truncate was refused ({other:?}) with the drive's copy at {on_drive} bytes"),
    }
    assert_eq!(to(admin.stat("/shared/f")).await.unwrap().attr.mode, 0o644);

    drop((admin, alice_fs));
    stop(c, drive, proxy).await;
}
