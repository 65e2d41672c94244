//! A client of manager protocol version 3 against managers that serve only
//! an older version (`ManagerConfig::protocol_version_max`: the manager
//! refuses a newer login and a `TRACED` envelope as a manager of that
//! version does): the client offers older versions until one is taken,
//! sends no envelope in a session before version 3, and its operation's
//! trace id still reaches the drives (docs/PROTOCOL.md, "Manager protocol
//! versions"). Real drives behind recording relays, a real TLS manager.

mod common;

use common::*;
use nasd_fs::FsStatus;
use nasd_proto::manager::{ManagerReply, ManagerRequest, MANAGER_PROTOCOL_VERSION};
use nasd_proto::TraceId;
use std::str::FromStr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Answer = Result<ManagerReply, (FsStatus, String)>;

/// A TLS connection to the cluster's manager, not logged in.
async fn raw_tls(c: &Cluster) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tls = nasd_fs::connector(&c.ca).expect("connector");
    let socket = to(tokio::net::TcpStream::connect(c.addr)).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    to(tls.connect(name, socket)).await.expect("TLS")
}

/// Sends request body `body` (request id `id`) and reads its reply.
async fn exchange(s: &mut (impl AsyncReadExt + AsyncWriteExt + Unpin), id: u64, body: &[u8]) -> Answer {
    to(s.write_all(&(body.len() as u32).to_le_bytes())).await.unwrap();
    to(s.write_all(body)).await.unwrap();
    to(s.flush()).await.unwrap();
    let mut len = [0u8; 4];
    to(s.read_exact(&mut len)).await.expect("a reply");
    let mut reply = vec![0u8; u32::from_le_bytes(len) as usize];
    to(s.read_exact(&mut reply)).await.expect("the reply's body");
    let (reply_id, answer) = ManagerReply::decode(&reply).expect("a well-formed reply");
    assert_eq!(reply_id, id);
    answer
}

/// A raw session of the administrator, logged in with `version`.
async fn session_of_version(c: &Cluster, version: u8) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut s = raw_tls(c).await;
    let login = ManagerRequest::Login { version, user: ADMIN.into(), password: ADMIN_PW.into() };
    let answer = exchange(&mut s, 1, &login.encode(1)).await;
    assert!(matches!(answer, Ok(ManagerReply::LoggedIn { version: v, .. }) if v == version), "{answer:?}");
    s
}

/// A cluster whose manager serves versions up to `newest`, with `drives`
/// drives behind recording relays.
async fn cluster_of_version(newest: u8, drives: usize) -> (Cluster, Vec<(TestDrive, Proxy)>) {
    let options = ClusterOptions::default();
    let config = nasd_manager::ManagerConfig { protocol_version_max: newest, ..options.config };
    let cluster = Cluster::start(ClusterOptions { config, drives: 0, ..options }).await;
    let mut relayed = Vec::new();
    for i in 0..drives {
        let drive = TestDrive::start(cluster.dir().join(format!("drive-{i}"))).await;
        let proxy = Proxy::recording(drive.addr).await;
        to(cluster.manager.add_drive(&proxy.addr.to_string(), &drive.master)).await.expect("add a relayed drive");
        relayed.push((drive, proxy));
    }
    (cluster, relayed)
}

/// The manager answers a login as a manager of its newest version does: a
/// newer one refused `BAD_REQUEST` naming the versions it speaks (the
/// connection still takes the next offer), its own taken; and a `TRACED`
/// envelope is served only in a session of version 3.
#[test]
fn a_manager_refuses_versions_past_its_newest_and_envelopes_before_version_3() {
    run(async {
        for newest in 1..=MANAGER_PROTOCOL_VERSION {
            let (cluster, _drives) = cluster_of_version(newest, 1).await;
            let mut s = raw_tls(&cluster).await;
            for offered in (newest + 1..=MANAGER_PROTOCOL_VERSION).rev() {
                let login = ManagerRequest::Login { version: offered, user: ADMIN.into(), password: ADMIN_PW.into() };
                let (status, message) = exchange(&mut s, 1, &login.encode(1)).await.expect_err("a newer version");
                assert_eq!(status, FsStatus::BadRequest, "{message}");
                assert!(message.contains(&format!("speaks 1..={newest})")), "version {newest}: {message}");
            }
            let login = ManagerRequest::Login { version: newest, user: ADMIN.into(), password: ADMIN_PW.into() };
            let answer = exchange(&mut s, 2, &login.encode(2)).await;
            assert!(matches!(answer, Ok(ManagerReply::LoggedIn { version, .. }) if version == newest), "{answer:?}");

            let trace = TraceId::from_str("an-envelope").unwrap();
            for version in 1..=newest {
                let mut s = session_of_version(&cluster, version).await;
                let traced = exchange(&mut s, 3, &ManagerRequest::StatFs.encode_traced(3, &trace)).await;
                if version >= 3 {
                    assert!(matches!(traced, Ok(ManagerReply::StatFs { .. })), "{traced:?}");
                } else {
                    let (status, message) = traced.expect_err("an envelope in a session before version 3");
                    assert_eq!(status, FsStatus::BadRequest, "{message}");
                    assert!(message.contains("TRACED"), "{message}");
                }
                let plain = exchange(&mut s, 4, &ManagerRequest::StatFs.encode(4)).await;
                assert!(matches!(plain, Ok(ManagerReply::StatFs { .. })), "the session goes on: {plain:?}");
            }
            cluster.stop().await;
        }
    });
}

/// A client logs in to a manager of version 1 or 2 (offering 3, then the
/// versions before), writes and reads a file under one trace id — which
/// would fail if it sent the manager a `TRACED` envelope — and the drives
/// get that id in the operation's frames.
#[test]
fn a_client_works_with_an_older_manager_and_its_trace_id_reaches_the_drives() {
    run(async {
        for newest in [1, 2] {
            let (cluster, drives) = cluster_of_version(newest, 2).await;
            let fs = cluster.login(ADMIN, ADMIN_PW).await;
            let trace = TraceId::from_str(&format!("older-manager-{newest}")).unwrap();
            let data = pattern(u64::from(newest), 300_000);
            let path = format!("/v{newest}.bin");
            let done = nasd_client::trace::scope(Some(trace.clone()), async {
                fs.write_file(&path, &data).await?;
                fs.read_file(&path).await
            });
            assert_eq!(to(done).await.expect("write and read through a version-{newest} manager"), data);

            // The operation's frames as the drives got them: a version-2 header, the id after it.
            let carried = drives
                .iter()
                .flat_map(|(_, proxy)| proxy.request_frames())
                .filter(|frame| {
                    let header =
                        nasd_proto::FrameHeader::decode(frame[..nasd_proto::limits::HEADER_LEN].try_into().unwrap())
                            .expect("a well-formed header");
                    let at = nasd_proto::limits::HEADER_LEN;
                    header.trace_len as usize == trace.as_bytes().len()
                        && &frame[at..at + trace.as_bytes().len()] == trace.as_bytes()
                })
                .count();
            assert!(carried >= 2, "version {newest}: {carried} drive requests carried the operation's trace id");
            drop(fs);
            cluster.stop().await;
        }
    });
}
