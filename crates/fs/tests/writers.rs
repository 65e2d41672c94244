//! Write transactions as `nasd_fs::File` runs them, and one client serving
//! many requests at once; real drives and the real TLS manager on loopback,
//! with a relay (`common::Proxy`) in front of the manager where a test must
//! hold requests back.
//!
//! - a request held at the manager does not hold up the client's others: they
//!   go out beside it on the same connection (pipelined); a connection takes
//!   `CONNECTION_REQUESTS_MAX`, then others open, at most `MANAGER_CONNECTIONS_MAX`;
//! - files written and read concurrently through one client;
//! - a writer that stops writing without flushing is committed a quarter into
//!   its lease; one that writes more than `TXN_BYTES_MAX` is committed then;
//! - a `COMMIT` that reaches the manager after the lease ran out: the writes
//!   are rolled back, the flush fails with `ABORTED`, the file takes no more
//!   writes.

mod common;

use common::*;
use nasd_fs::{FsClient, FsConfig, FsStatus, Layout, CONNECTION_REQUESTS_MAX, MANAGER_CONNECTIONS_MAX, TXN_BYTES_MAX};
use nasd_manager::ManagerConfig;
use nasd_proto::manager::{ManagerReply, ManagerRequest};
use std::time::Duration;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

fn layout(text: &str) -> Layout {
    Layout::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// Waits (within [`STEP`]) until `check` holds, looking every 20 ms.
async fn until<F: std::future::Future<Output = bool>>(mut check: impl FnMut() -> F) {
    to(async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

#[test]
fn a_request_held_at_the_manager_does_not_hold_up_the_others() {
    run(async {
        let c = Cluster::start(ClusterOptions::default()).await;
        let relay = Proxy::start(c.addr).await;
        let config = FsConfig { manager: relay.addr.to_string(), ..c.fs_config(ADMIN, ADMIN_PW) };
        let fs = to(FsClient::connect(&config)).await.expect("log in through the relay");
        assert_eq!(relay.accepted(), 1, "one connection to log in");

        // A WATCH the manager holds until something changes...
        let position = match to(fs.call(&ManagerRequest::Watch { incarnation: 0, after: 0, wait_ms: 0 })).await {
            Ok(ManagerReply::Changes { incarnation, next, .. }) => (incarnation, next),
            other => panic!("WATCH: {other:?}"),
        };
        let held = tokio::spawn({
            let fs = fs.clone();
            let watch = ManagerRequest::Watch { incarnation: position.0, after: position.1, wait_ms: 30_000 };
            async move { fs.call(&watch).await }
        });
        // ...while others go out beside it on the same connection and are answered.
        for _ in 0..20 {
            to(fs.stat("/")).await.expect("a request while another is held");
        }
        assert!(!held.is_finished(), "the held request is still held: the others did not wait for it");
        assert_eq!(relay.accepted(), 1, "they shared the one connection");
        to(fs.mkdir("/other", 0o755)).await.expect("a change");
        match to(held).await.expect("task") {
            Ok(ManagerReply::Changes { changes, .. }) => assert!(!changes.is_empty(), "the WATCH saw the change"),
            other => panic!("WATCH: {other:?}"),
        }
        to(fs.write_file("/other/f", b"written meanwhile")).await.expect("a whole file");

        // Many requests at once: a connection takes CONNECTION_REQUESTS_MAX, then another
        // opens, no more connections than the bound.
        relay.pause(true);
        let tasks: Vec<_> = (0..MANAGER_CONNECTIONS_MAX * CONNECTION_REQUESTS_MAX + 3)
            .map(|_| {
                let fs = fs.clone();
                tokio::spawn(async move { fs.stat("/other/f").await })
            })
            .collect();
        until(|| async { relay.accepted() >= MANAGER_CONNECTIONS_MAX }).await;
        relay.pause(false);
        for t in tasks {
            assert_eq!(to(t).await.expect("task").expect("stat").attr.size, 17);
        }
        assert_eq!(relay.accepted(), MANAGER_CONNECTIONS_MAX, "the pool opens no more than its bound");
        assert!(fs.idle_manager_connections() <= MANAGER_CONNECTIONS_MAX);
        drop(fs);
        c.stop().await;
    });
}

#[test]
fn files_written_and_read_at_once_through_one_client() {
    run(async {
        let c = Cluster::start(ClusterOptions { root_layout: Some(layout("rs:2+1@64K")), ..Default::default() }).await;
        let fs = c.login(ADMIN, ADMIN_PW).await;
        const FILES: u64 = 8;
        let tasks: Vec<_> = (0..FILES)
            .map(|i| {
                let fs = fs.clone();
                tokio::spawn(async move {
                    let data = pattern(i, (MIB + i * 70_001) as usize);
                    let path = format!("/f{i}");
                    let f = fs.create(&path, 0o644, true, false).await?;
                    for (k, chunk) in data.chunks(100_000).enumerate() {
                        f.write_at(k as u64 * 100_000, chunk).await?;
                    }
                    f.close().await?;
                    let got = fs.read_file(&path).await?;
                    Ok::<bool, nasd_fs::FsError>(got == data)
                })
            })
            .collect();
        for (i, t) in tasks.into_iter().enumerate() {
            assert!(to(t).await.expect("task").expect("write and read"), "file {i} reads back as written");
        }
        drop(fs);
        c.stop().await;
    });
}

#[test]
fn a_writer_that_stops_without_flushing_is_committed_a_quarter_into_its_lease() {
    run(async {
        let config = ManagerConfig { pool_target: 8, write_lease: Duration::from_secs(2), ..ManagerConfig::default() };
        let opts = ClusterOptions { config, root_layout: Some(layout("rs:2+1@64K")), ..Default::default() };
        let c = Cluster::start(opts).await;
        let (writer, reader) = (c.login(ADMIN, ADMIN_PW).await, c.login(ADMIN, ADMIN_PW).await);
        let first = pattern(1, 100_000);
        let f = to(writer.create("/f", 0o644, true, false)).await.expect("create");
        to(f.write_at(0, &first)).await.expect("write");
        // No flush, no further write: the commit comes by itself, well within the 2 s lease
        // (a transaction left to its lease would be rolled back, and the size stay 0).
        until(|| async { to(reader.stat("/f")).await.expect("stat").attr.size == first.len() as u64 }).await;
        assert!(to(reader.read_file("/f")).await.expect("read") == first);
        // The next write begins the next transaction.
        to(f.write_at(first.len() as u64, b"more")).await.expect("write again");
        assert_eq!(to(f.close()).await.expect("close").size, first.len() as u64 + 4);
        drop((writer, reader));
        c.stop().await;
    });
}

#[test]
fn a_writer_is_committed_once_it_wrote_txn_bytes_max() {
    run(async {
        // A lease long enough that only the byte bound commits during the test.
        // Every byte through the write transaction (no small-file path), so the byte bound counts them all.
        let config = ManagerConfig {
            pool_target: 8,
            write_lease: Duration::from_secs(3600),
            small_file_threshold: 0,
            ..ManagerConfig::default()
        };
        let opts = ClusterOptions { config, root_layout: Some(layout("stripe:4@1M")), ..Default::default() };
        let c = Cluster::start(opts).await;
        let (writer, reader) = (c.login(ADMIN, ADMIN_PW).await, c.login(ADMIN, ADMIN_PW).await);
        let piece = pattern(2, (8 * MIB) as usize);
        let pieces = TXN_BYTES_MAX / piece.len() as u64;
        let f = to(writer.create("/big", 0o644, true, false)).await.expect("create");
        for k in 0..pieces {
            to(f.write_at(k * piece.len() as u64, &piece)).await.expect("write");
        }
        // Exactly TXN_BYTES_MAX written: committed without a flush.
        assert_eq!(to(reader.stat("/big")).await.expect("stat").attr.size, TXN_BYTES_MAX);
        to(f.write_at(TXN_BYTES_MAX, b"tail")).await.expect("a write in the next transaction");
        assert_eq!(to(reader.stat("/big")).await.expect("stat").attr.size, TXN_BYTES_MAX, "not committed yet");
        assert_eq!(to(f.close()).await.expect("close").size, TXN_BYTES_MAX + 4);
        let r = to(reader.open("/big", false)).await.expect("open");
        for at in [0, TXN_BYTES_MAX / 2 + 12_345, TXN_BYTES_MAX - 10] {
            let i = (at % piece.len() as u64) as usize;
            let got = to(r.read_at(at, 10)).await.expect("read");
            assert!(got == piece[i..i + 10], "bytes at {at}");
        }
        assert_eq!(to(r.read_at(TXN_BYTES_MAX, 100)).await.expect("read the tail"), b"tail");
        drop((writer, reader, r));
        c.stop().await;
    });
}

#[test]
fn a_commit_after_the_lease_ran_out_is_aborted_and_rolled_back() {
    run(async {
        let config = ManagerConfig {
            pool_target: 8,
            write_lease: Duration::from_secs(1),
            maintenance_interval: Duration::from_millis(100),
            // Rollback is of the drives' bytes: a small write is stable at once and not rolled back.
            small_file_threshold: 0,
            ..ManagerConfig::default()
        };
        let opts =
            ClusterOptions { config, maintenance: true, root_layout: Some(layout("rs:2+1@64K")), ..Default::default() };
        let c = Cluster::start(opts).await;
        let relay = Proxy::start(c.addr).await;
        let config = FsConfig { manager: relay.addr.to_string(), ..c.fs_config(ADMIN, ADMIN_PW) };
        let writer = to(FsClient::connect(&config)).await.expect("log in through the relay");
        let direct = c.login(ADMIN, ADMIN_PW).await;
        let (v1, v2) = (pattern(1, 200_000), pattern(2, 200_000));
        to(writer.write_file("/f", &v1)).await.expect("the first version");

        // The second version reaches the drives, but its COMMIT is held back past the lease.
        let f = to(writer.open("/f", true)).await.expect("open");
        to(f.write_at(0, &v2)).await.expect("write");
        relay.pause(true);
        let f = std::sync::Arc::new(f);
        let flush = tokio::spawn({
            let f = f.clone();
            async move { f.flush().await }
        });
        until(|| async { relay.held() > 0 }).await;
        // The manager rolls the transaction back: every component holds the first version again.
        until(|| async { to(direct.read_file("/f")).await.is_ok_and(|d| d == v1) }).await;
        relay.pause(false);

        let e = to(flush).await.expect("task").expect_err("the commit came too late");
        assert_eq!(e.status(), Some(FsStatus::Aborted), "{e}");
        assert_eq!(e.errno(), 5, "EIO");
        assert!(e.to_string().contains("rolled back"), "{e}");
        let again = to(f.write_at(0, b"x")).await.expect_err("a file whose writes were lost takes no more");
        assert_eq!(again.status(), Some(FsStatus::Aborted));
        assert!(to(direct.read_file("/f")).await.expect("read") == v1, "the first version stands");
        assert_eq!(to(direct.stat("/f")).await.expect("stat").attr.size, v1.len() as u64);
        drop((writer, direct, f));
        c.stop().await;
    });
}
