//! A drive's metrics, scraped over HTTP from a `nasd-metrics` endpoint on
//! loopback while a real drive (security enforced) serves honest clients,
//! forgeries and replays: each counter moves by what was done.

mod common;

use common::{bytes, refused, rg, Drive, Options, P};
use nasd_metrics::{scrape, sum_of, Metrics, Sample};
use nasd_proto::Status;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A drive whose metrics are served on loopback; returns it and the
/// endpoint's address.
async fn drive_with_endpoint() -> (Drive, SocketAddr) {
    let options = Options::default();
    let metrics = Metrics::new();
    options.metrics.register(&metrics, Some("0".into()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = listener.local_addr().unwrap();
    tokio::spawn(nasd_metrics::serve(listener, metrics, std::future::pending()));
    (Drive::start_with(options).await, endpoint)
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    sum_of(samples, name, &[&[("drive", "0")], labels].concat())
}

/// A proxy that forwards one client connection to the drive and keeps what
/// the client sent, for replaying it.
async fn recording_proxy(drive: SocketAddr) -> (SocketAddr, tokio::sync::oneshot::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut client, _) = listener.accept().await.unwrap();
        let mut upstream = TcpStream::connect(drive).await.unwrap();
        let (mut cr, mut cw) = client.split();
        let (mut ur, mut uw) = upstream.split();
        let mut sent = Vec::new();
        let upward = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = cr.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    let _ = uw.shutdown().await;
                    break;
                }
                sent.extend_from_slice(&buf[..n]);
                uw.write_all(&buf[..n]).await.unwrap();
            }
        };
        let downward = tokio::io::copy(&mut ur, &mut cw);
        let _ = tokio::join!(upward, downward);
        let _ = tx.send(sent);
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_writes_and_refusals_move_their_counters() {
    let (d, endpoint) = drive_with_endpoint().await;
    let mut admin = d.admin().await;
    let drive_id = admin.drive_id();
    let data = bytes(7, 3 * 4096 + 100);
    let (o, _) = admin.create(P).await.unwrap();

    let before = scrape(endpoint).await.unwrap();
    admin.write(P, o, &[rg(0, data.len() as u64)], &data).await.unwrap();
    let (_, got) = admin.read(P, o, &[rg(100, 5000)]).await.unwrap();
    assert_eq!(got, data[100..5100]);
    let after = scrape(endpoint).await.unwrap();
    let moved = |name: &str, labels: &[(&str, &str)]| value(&after, name, labels) - value(&before, name, labels);
    assert_eq!(moved("nasd_drive_requests_total", &[("op", "write")]), 1.0);
    assert_eq!(moved("nasd_drive_requests_total", &[("op", "read")]), 1.0);
    assert_eq!(moved("nasd_drive_data_bytes_total", &[("op", "write")]), data.len() as f64);
    assert_eq!(moved("nasd_drive_data_bytes_total", &[("op", "read")]), 5000.0);
    assert_eq!(moved("nasd_drive_request_duration_seconds_count", &[("op", "read")]), 1.0);
    assert_eq!(moved("nasd_drive_refusals_total", &[]), 0.0, "nothing refused yet");
    assert!(value(&after, "nasd_drive_connections", &[]) >= 1.0, "the admin's connection is open");
    assert_eq!(value(&after, "nasd_drive_capacity_bytes", &[]), Options::default().capacity_bytes as f64);
    assert!(value(&after, "nasd_drive_used_bytes", &[]) >= data.len() as f64);

    // A capability minted with a key that is not the working key: its MAC is bad.
    let forged = Drive::mint(&nasd_crypto::Key::random(), &Drive::capability_args(drive_id, o));
    let mut forger = d.client(forged).await;
    assert_eq!(refused(forger.read(P, o, &[rg(0, 10)]).await), Status::BadDigest);
    // An expired capability.
    let mut args = Drive::capability_args(drive_id, o);
    args.expiration_ns = 1;
    let mut late = d.client(Drive::mint(&d.working, &args)).await;
    assert_eq!(refused(late.read(P, o, &[rg(0, 10)]).await), Status::CapabilityExpired);
    // An honest request recorded on the wire and sent again: a replay.
    let (proxy, recorded) = recording_proxy(d.addr).await;
    let mut honest = nasd_client::DriveClient::connect(proxy).await.unwrap();
    honest.set_auth(nasd_client::Auth::new(d.capability(drive_id, o), common::PROTECTION));
    honest.getattr(P, o).await.unwrap();
    drop(honest);
    let recorded = recorded.await.unwrap();
    let mut replayer = TcpStream::connect(d.addr).await.unwrap();
    replayer.write_all(&recorded).await.unwrap();
    replayer.shutdown().await.unwrap();
    let mut replies = Vec::new();
    replayer.read_to_end(&mut replies).await.unwrap();

    let refused_after = scrape(endpoint).await.unwrap();
    let refusals = |reason: &str| {
        value(&refused_after, "nasd_drive_refusals_total", &[("reason", reason)])
            - value(&after, "nasd_drive_refusals_total", &[("reason", reason)])
    };
    assert_eq!(refusals("bad_digest"), 1.0);
    assert_eq!(refusals("capability_expired"), 1.0);
    assert_eq!(refusals("nonce_replayed"), 1.0);
    assert_eq!(
        value(&refused_after, "nasd_drive_refusals_total", &[]) - value(&after, "nasd_drive_refusals_total", &[]),
        3.0,
        "nothing else refused"
    );
    let hits = value(&refused_after, "nasd_drive_capability_key_cache_total", &[("result", "hit")]);
    let misses = value(&refused_after, "nasd_drive_capability_key_cache_total", &[("result", "miss")]);
    assert!(misses >= 1.0, "the honest capability's key was computed once");
    assert!(hits >= 1.0, "and found in the cache when its request was replayed");
}
