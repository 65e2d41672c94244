//! Faults between the manager, the clients and a drive, made by a relay
//! in front of the drive or the manager (`common::Proxy`): the drive cut
//! off while its working key is replaced, a reply altered in flight, a size
//! change held up at the drive while the file's mode changes; connections
//! the drive or the manager closed while idle; replies lengthened, cut
//! short or never sent (time-outs); write data changed in flight.

mod common;

use common::*;
use nasd_client::ClientError;
use nasd_fs::{FailureCause, FsClient, FsConfig, FsError, OpenMode as Open};
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

/// TCP states (as in /proc/net/tcp) of this host's connections to `port`
/// on loopback, seen from their client side.
fn states_of_connections_to(port: u16) -> Vec<u8> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote_port = u16::from_str_radix(fields.get(2)?.rsplit(':').next()?, 16).ok()?;
            let state = u8::from_str_radix(fields.get(3)?, 16).ok()?;
            (remote_port == port).then_some(state)
        })
        .collect()
}

const TCP_ESTABLISHED: u8 = 0x01;
const TCP_CLOSE_WAIT: u8 = 0x08;

/// Waits until the peer at `port` (a drive, or the relay in front of the
/// manager) has closed every connection to it: the kept ones sit half-closed
/// (CLOSE-WAIT) on this side, none is open.
async fn peer_closed_every_connection(port: u16) {
    to(async {
        loop {
            let states = states_of_connections_to(port);
            if states.contains(&TCP_CLOSE_WAIT) && !states.contains(&TCP_ESTABLISHED) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

#[test]
fn connections_a_drive_closed_while_idle_are_replaced_before_use() {
    run(stale_connections_scenario());
}

/// A drive closes connections idle for its idle timeout (one second here);
/// the manager's pooled connection and the client's pooled ones (the
/// striping engine's `DrivePool`) then sit in CLOSE-WAIT. Both pools check a
/// connection before reuse (`DriveClient::is_reusable`) and drop it, and the
/// manager sends a repeatable call once more on a fresh connection if a
/// reused one fails without an answer. With the old client the put's close
/// used to fail ("drive 0 did not answer…") — `ls -l` then showed 0 B until
/// maintenance caught up —, and so did the next read on the client's kept
/// connection.
async fn stale_connections_scenario() {
    let idle = Duration::from_secs(1);
    let c = Cluster::start(ClusterOptions { drives: 1, drive_idle_timeout: idle, ..Default::default() }).await;
    let addr = c.drives[0].addr;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    let first = pattern(11, 100_000);
    to(admin.write_file("/f", &first)).await.unwrap();
    assert!(admin.idle_drive_connections(&addr.to_string()) > 0, "the put's connection is kept");

    peer_closed_every_connection(addr.port()).await;
    assert_eq!(admin.idle_drive_connections(&addr.to_string()), 0, "closed connections leave the client's pool");
    // The put's BEGIN_WRITE and COMMIT reach the drive over the manager's pooled connection, its
    // data over the client's.
    let second = pattern(12, 50_000);
    to(admin.write_file("/g", &second)).await.expect("a put after the drive closed the idle connections");
    assert_eq!(to(admin.stat("/g")).await.unwrap().attr.size, second.len() as u64, "the size the commit recorded");

    let f = to(admin.open("/f", false)).await.unwrap();
    assert!(to(f.read_at(0, 1)).await.unwrap() == first[..1]);
    peer_closed_every_connection(addr.port()).await;
    // The read goes out on a fresh connection, not on the one the drive closed.
    let read = to(f.read_at(0, first.len() as u64)).await.expect("a read after the drive closed the pooled ones");
    assert!(read == first);

    drop((f, admin));
    c.stop().await;
}

#[test]
fn manager_connections_closed_while_idle_are_replaced_before_use() {
    run(stale_manager_connections_scenario());
}

/// The client's pooled manager connections are checked before reuse too: once
/// the manager closed one (its idle timeout, a restart; here the relay in
/// front of it ends every connection), the next request goes out on a fresh
/// connection instead of failing on the closed one (a failed request is
/// never resent).
async fn stale_manager_connections_scenario() {
    let c = Cluster::start(ClusterOptions { drives: 1, ..Default::default() }).await;
    let proxy = Proxy::start(c.addr).await;
    let fs = to(FsClient::connect(&FsConfig { manager: proxy.addr.to_string(), ..c.fs_config(ADMIN, ADMIN_PW) }))
        .await
        .expect("log in through the relay");
    to(fs.stat("/")).await.expect("stat");
    assert_eq!(fs.idle_manager_connections(), 1);

    proxy.cut();
    peer_closed_every_connection(proxy.addr.port()).await;
    proxy.reconnect();
    to(fs.stat("/")).await.expect("a request after the manager closed the idle connection");
    assert_eq!(fs.idle_manager_connections(), 1, "the closed connection was replaced, not kept as well");

    drop((fs, proxy));
    c.stop().await;
}

/// Where a frame header keeps its capability length (PROTOCOL.md, "Frame").
const CAPABILITY_LEN_AT: usize = 20;
/// The clients' wait bound in the time-out tests (the default is a minute).
const SHORT_WAIT: Duration = Duration::from_secs(2);

/// A time-out naming the peer and the step: of the manager (`FsError::Io`),
/// or of a drive — the file's one component then failed its read
/// (`FsError::Unavailable`) because one wait of the connection, or the
/// striping engine's deadline for the request, ran out.
fn timed_out(e: &FsError) -> bool {
    match e {
        FsError::Io(io) => io.kind() == std::io::ErrorKind::TimedOut && io.to_string().contains("did not"),
        FsError::Unavailable { failures, .. } => {
            !failures.is_empty() && failures.iter().all(|f| f.cause.is_time_out()) && e.to_string().contains("did not")
        }
        _ => false,
    }
}

#[test]
fn a_drive_reply_cut_short_or_lengthened_ends_in_a_time_out() {
    run(drive_reply_time_out_scenario());
}

/// Every wait of the client for a drive is bounded (`FsConfig::reply_timeout`,
/// applied by the striping engine with `DriveClient::set_timeout` and
/// `connect_with_timeout`, within its deadline per request): a reply whose
/// header was changed in flight to announce one byte more than comes, or a
/// reply that stops half way with the connection left open, fails the read
/// with a time-out naming the drive, and the next read works on a new
/// connection. Both used to wait forever (`nasd cat` hung).
async fn drive_reply_time_out_scenario() {
    let (c, drive, proxy) = proxied_cluster().await;
    let config = FsConfig { reply_timeout: SHORT_WAIT, ..c.fs_config(ADMIN, ADMIN_PW) };
    let fs = to(FsClient::connect(&config)).await.expect("log in");
    let data = pattern(21, 1 << 20);
    to(fs.write_file("/f", &data)).await.unwrap();

    // Lengthened: the client reads past the size it knows of no more, so the reply without
    // data is the drive's answer to a new connection's HELLO. A fresh client's first read
    // connects; that connection's HELLO reply has its capability length changed from 0 to 1
    // and promises a byte more than comes.
    let fresh = to(FsClient::connect(&config)).await.expect("log in");
    let f = to(fresh.open("/f", false)).await.unwrap();
    proxy.tamper_reply_on(proxy.accepted(), CAPABILITY_LEN_AT);
    let started = Instant::now();
    let e = to(f.read_at(0, data.len() as u64)).await.expect_err("a reply promising a byte that never comes");
    assert!(timed_out(&e), "{e:?}");
    assert!(started.elapsed() < 4 * SHORT_WAIT, "bounded by the client's wait, not the engine's 30 s");
    assert!(to(f.read_at(0, data.len() as u64)).await.expect("the next read, on a new connection") == data);
    drop((f, fresh));

    // Cut short: 100 000 bytes of the read's reply pass, then nothing, the connection open.
    let f = to(fs.open("/f", false)).await.unwrap();
    proxy.hold_replies_after(100_000);
    let started = Instant::now();
    let e = to(f.read_at(0, data.len() as u64)).await.expect_err("a reply that stops half way");
    assert!(timed_out(&e), "{e:?}");
    assert!(started.elapsed() < 4 * SHORT_WAIT, "bounded by the client's wait, not the engine's 30 s");
    proxy.release_replies();
    assert!(to(fs.read_file("/f")).await.expect("the next read, on a new connection") == data);

    drop((f, fs));
    stop(c, drive, proxy).await;
}

#[test]
fn a_manager_that_stops_answering_ends_in_a_time_out() {
    run(manager_time_out_scenario());
}

/// Every wait of the client for its manager is bounded too: with the
/// manager's replies held back (connection open), a request fails with a
/// time-out naming the manager, and once the manager answers again the
/// next request reconnects and works. It used to wait forever.
async fn manager_time_out_scenario() {
    let c = Cluster::start(ClusterOptions { drives: 1, ..Default::default() }).await;
    let proxy = Proxy::start(c.addr).await;
    let config =
        FsConfig { manager: proxy.addr.to_string(), reply_timeout: SHORT_WAIT, ..c.fs_config(ADMIN, ADMIN_PW) };
    let fs = to(FsClient::connect(&config)).await.expect("log in through the relay");
    to(fs.stat("/")).await.expect("stat");

    proxy.hold_replies_after(0);
    let e = to(fs.stat("/")).await.expect_err("no answer");
    assert!(timed_out(&e), "{e:?}");
    assert!(e.to_string().contains("manager"), "{e}");
    proxy.release_replies();
    to(fs.stat("/")).await.expect("the next request reconnects");

    drop((fs, proxy));
    c.stop().await;
}

#[test]
fn write_data_is_macced_even_for_a_client_configured_without_data_integrity() {
    run(write_data_integrity_scenario());
}

/// Capabilities that allow writing carry a minimum protection with data
/// integrity (the manager's default policy), so a client configured with
/// `data_integrity = false` still MACs its write data: a byte changed in
/// flight is refused by the drive (`BAD_DATA_TAG`) and nothing is written;
/// a client that sends write data without tags is refused outright
/// (`PROTECTION_TOO_WEAK`). Write capabilities used to demand
/// `INTEGRITY_ARGS` only: such a client's data reached the drive with no
/// MAC, and the changed byte was stored.
async fn write_data_integrity_scenario() {
    let (c, drive, proxy) = proxied_cluster().await;
    let config = FsConfig { data_integrity: false, ..c.fs_config(ADMIN, ADMIN_PW) };
    let fs = to(FsClient::connect(&config)).await.expect("log in");
    let original = pattern(31, 1 << 20);
    to(fs.write_file("/f", &original)).await.unwrap();

    let f = to(fs.open("/f", true)).await.unwrap();
    let changed = pattern(32, 1 << 20);
    // Well inside the data of the next write (its frame prefix, and the manager's TXN_BEGIN
    // for the transaction, are a few hundred bytes).
    proxy.tamper_request_at(100_000);
    // Write-behind: the refusal comes back at the next write or at the flush that commits.
    let e = match to(f.write_at(0, &changed)).await {
        Err(e) => e,
        Ok(()) => to(f.flush()).await.expect_err("data changed in flight"),
    };
    let FsError::Unavailable { failures, .. } = &e else { panic!("{e:?}") };
    assert_eq!(failures[0].cause.status(), Some(nasd_proto::Status::BadDataTag), "{e:?}");
    drop(f);
    assert!(to(fs.read_file("/f")).await.unwrap() == original, "nothing of the altered write was stored");

    // The capability itself demands it: without data tags the drive refuses the write.
    let access = to(fs.walk("/f", OpenMode::ReadWrite)).await.unwrap().access.expect("write access");
    let min = nasd_proto::Protection::from_bits(access.min_protection).unwrap();
    assert!(min.covers(nasd_proto::Protection::INTEGRITY_DATA), "{min:?}");
    let mut raw = to(nasd_client::DriveClient::connect(access.components[0].drive_addr.as_str())).await.unwrap();
    let credential = nasd_client::Credential::Capability {
        token: access.components[0].token.clone(),
        key: nasd_crypto::Key::from_bytes(access.components[0].key),
        algorithm: nasd_client::MacAlgorithm::from_id(access.algorithm).unwrap(),
    };
    raw.set_auth(nasd_client::Auth::new(credential, nasd_proto::Protection::INTEGRITY_ARGS));
    let region = nasd_proto::Region { offset: 0, length: 4 };
    let e =
        to(raw.write(access.components[0].object.partition, access.components[0].object.object, &[region], b"evil"))
            .await
            .unwrap_err();
    assert_eq!(e.status(), Some(nasd_proto::Status::ProtectionTooWeak), "{e}");
    assert!(to(fs.read_file("/f")).await.unwrap() == original);

    drop(fs);
    stop(c, drive, proxy).await;
}
