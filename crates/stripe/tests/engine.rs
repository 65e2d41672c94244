//! The striping engine against real drives on loopback, security enforced:
//! round trips of every scheme, degraded reads (drives stopped before and
//! during a read, a rotten block, a hung drive, the bound on each wait),
//! degraded writes, capability refresh, rebuilding components, and pooled
//! connections a drive closed.

mod common;

use common::*;
use nasd_proto::layout::ComponentState;
use nasd_proto::Status;
use nasd_stripe::{
    Binder, BoxFuture, FailureCause, Options, Report, StaticBinder, StripeError, Striper, Target, WriteOutcome,
};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const U: u64 = 4096;

/// The bytes a file holds after writes, as a plain buffer.
#[derive(Default, Clone)]
struct Model(Vec<u8>);

impl Model {
    fn write(&mut self, offset: u64, data: &[u8]) {
        let end = offset as usize + data.len();
        if self.0.len() < end {
            self.0.resize(end, 0);
        }
        self.0[offset as usize..end].copy_from_slice(data);
    }
    fn size(&self) -> u64 {
        self.0.len() as u64
    }
    fn range(&self, offset: u64, len: u64) -> &[u8] {
        let end = (offset.saturating_add(len)).min(self.size());
        if offset >= end {
            return &[];
        }
        &self.0[offset as usize..end as usize]
    }
}

async fn write(s: &Striper, m: &mut Model, offset: u64, data: &[u8]) -> WriteOutcome {
    let outcome =
        to(s.write(offset, data, m.size())).await.unwrap_or_else(|e| panic!("write {offset}+{}: {e}", data.len()));
    m.write(offset, data);
    outcome
}

async fn check(s: &Striper, m: &Model, offset: u64, len: u64, what: &str) -> Report {
    let (bytes, report) =
        to(s.read(offset, len, m.size())).await.unwrap_or_else(|e| panic!("{what}: read {offset}+{len}: {e}"));
    assert!(bytes == m.range(offset, len), "{what}: read {offset}+{len} differs ({} bytes back)", bytes.len());
    report
}

async fn check_all(s: &Striper, m: &Model, what: &str) -> Report {
    check(s, m, 0, m.size() + 10, what).await
}

/// Writes that end mid-unit, mid-stripe and on boundaries, sparse and
/// overlapping, at unaligned offsets; checks after each.
async fn workload(s: &Striper, layout: &str, k: u64) -> Model {
    let mut m = Model::default();
    let sb = U * k;
    let writes: Vec<(u64, usize)> = vec![
        (0, 100),                                // mid-unit
        (100, (U - 100) as usize),               // to a unit boundary
        (U, (sb + U / 2) as usize),              // past a stripe boundary, mid-stripe
        (3 * sb, sb as usize),                   // sparse, a whole aligned stripe
        (5 * sb + 17, (2 * sb) as usize + 1000), // unaligned, several stripes
        (50, 3 * U as usize),                    // overwrite across units
        (2 * sb - 1, 2),                         // straddling a stripe boundary
        (20 * sb + U - 1, 1),                    // a lone far byte
        (9 * sb, (3 * sb) as usize),             // fills part of the hole
    ];
    for (i, (offset, len)) in writes.into_iter().enumerate() {
        let outcome = write(s, &mut m, offset, &pattern(i as u64 + 1, len)).await;
        assert!(outcome.missed.is_empty(), "{layout}: write {i} missed {:?}", outcome.missed);
        check_all(s, &m, &format!("{layout} after write {i}")).await;
    }
    for (offset, len) in [(1, 1), (U - 1, 2), (sb - 3, U + 6), (7 * sb + 5, 3 * sb), (m.size() - 1, 100)] {
        let report = check(s, &m, offset, len, layout).await;
        assert!(report.is_clean());
    }
    // Reads past the size stop at it; a read at the size is empty.
    assert!(to(s.read(m.size(), 10, m.size())).await.unwrap().0.is_empty());
    m
}

#[test]
fn round_trips_every_scheme() {
    run(async {
        let c = Cluster::start(6).await;
        for (layout, k) in [
            ("stripe:1@4K", 1),
            ("stripe:4@4K", 4),
            ("mirror:2@4K", 1),
            ("mirror:2x3@4K", 3),
            ("rs:2+1@4K", 2),
            ("rs:4+2@4K", 4),
        ] {
            for options in [Options::default(), small_batches()] {
                let target = c.target(layout, 0, Cred::DriveKey).await;
                let s = c.striper(target.clone(), options);
                let m = workload(&s, layout, k).await;
                // What each component holds agrees with the geometry: the
                // drive's bytes are the component's bytes rebuilt.
                for comp in 0..target.components.len() {
                    let b = &target.components[comp];
                    let drive = &c.drives[c.drive_of(b)];
                    let rebuilt = match to(s.read_component(comp, 0, u64::MAX, m.size())).await {
                        Ok((bytes, _)) => bytes,
                        Err(e) => {
                            assert!(layout.starts_with("stripe"), "{layout}: rebuild {comp}: {e}");
                            assert!(matches!(e, StripeError::Unavailable { .. }), "stripes have no redundancy: {e}");
                            continue;
                        }
                    };
                    assert!(!layout.starts_with("stripe"), "a stripe component cannot be rebuilt");
                    let raw = drive.raw(b.object, 0, rebuilt.len() as u64).await;
                    assert!(raw == rebuilt, "{layout}: component {comp} rebuilt differs from the drive's");
                }
            }
        }
    });
}

#[test]
fn degraded_reads_serve_every_byte_while_the_layout_tolerates_the_losses() {
    for (layout, k, lose) in [
        ("rs:4+2@4K", 4, vec![1]),
        ("rs:4+2@4K", 4, vec![0, 3]),
        ("rs:4+2@4K", 4, vec![2, 5]),
        ("rs:2+1@4K", 2, vec![0]),
        ("rs:2+1@4K", 2, vec![2]),
        ("mirror:2x3@4K", 3, vec![0, 4, 2]),
        ("mirror:3@4K", 1, vec![0, 1]),
    ] {
        run(async move {
            let mut c = Cluster::start(6).await;
            let target = c.target(layout, 0, Cred::Capability(hash_and_mac())).await;
            let s = c.striper(target.clone(), small_batches());
            let mut m = Model::default();
            let sb = U * k;
            write(&s, &mut m, 0, &pattern(9, (7 * sb + 1234) as usize)).await;
            for &comp in &lose {
                let d = c.drive_of(&target.components[comp]);
                c.drives[d].stop();
            }
            let report = check_all(&s, &m, layout).await;
            let failed: BTreeSet<usize> = report.failed.iter().map(|f| f.component).collect();
            // Mirror reads only some copies, so only those tried are reported.
            assert!(failed.iter().all(|f| lose.contains(f)), "{layout}: reported {failed:?}, lost {lose:?}");
            if layout.starts_with("rs") && lose.iter().any(|&x| x < k as usize) {
                assert!(!failed.is_empty(), "{layout}: a lost data column is reported");
            }
            for (offset, len) in [(5, 3 * U), (sb - 1, 2), (3 * sb + 100, sb)] {
                check(&s, &m, offset, len, layout).await;
            }
        });
    }
}

#[test]
fn losing_more_than_tolerated_is_unavailable_naming_the_drives() {
    for (layout, lose) in [
        ("rs:2+1@4K", vec![0, 2]),
        ("rs:4+2@4K", vec![0, 1, 4]),
        ("stripe:4@4K", vec![2]),
        ("mirror:2x2@4K", vec![1, 3]),
    ] {
        run(async move {
            let mut c = Cluster::start(6).await;
            let target = c.target(layout, 0, Cred::DriveKey).await;
            let s = c.striper(target.clone(), Options::default());
            let size = 64 * U;
            to(s.write(0, &pattern(3, size as usize), 0)).await.unwrap();
            let mut drives = Vec::new();
            for &comp in &lose {
                let d = c.drive_of(&target.components[comp]);
                drives.push(c.drives[d].number);
                c.drives[d].stop();
            }
            drives.sort_unstable();
            match to(s.read(0, size, size)).await {
                Err(StripeError::Unavailable { missing_drives, missing, .. }) => {
                    assert_eq!(missing_drives, drives, "{layout}");
                    assert_eq!(missing, lose.iter().copied().collect::<BTreeSet<_>>().into_iter().collect::<Vec<_>>());
                }
                other => panic!("{layout}: expected Unavailable, got {:?}", other.map(|(b, _)| b.len())),
            }
        });
    }
}

/// An `AsyncWrite` into memory that runs a hook once it has taken `after` bytes.
struct Tripwire<F: FnMut()> {
    out: Vec<u8>,
    after: usize,
    hook: Option<F>,
}

impl<F: FnMut() + Unpin> tokio::io::AsyncWrite for Tripwire<F> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.out.extend_from_slice(buf);
        if self.out.len() >= self.after {
            if let Some(mut hook) = self.hook.take() {
                hook();
            }
        }
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[test]
fn a_drive_stopped_during_a_large_read_changes_nothing_the_reader_sees() {
    for (layout, victim) in [("rs:4+2@4K", 2usize), ("mirror:2x2@4K", 1), ("rs:2+1@4K", 0)] {
        run(async move {
            let c = Cluster::start(6).await;
            let target = c.target(layout, 0, Cred::Capability(hash_and_mac())).await;
            let s = c.striper(target.clone(), small_batches());
            let data = pattern(11, 3 << 20);
            to(s.write(0, &data, 0)).await.unwrap();
            let d = c.drive_of(&target.components[victim]);
            // The drive stops once the first quarter reached the reader.
            let cluster = Arc::new(Mutex::new(c));
            let hook_cluster = cluster.clone();
            let mut dst = Tripwire {
                out: Vec::new(),
                after: data.len() / 4,
                hook: Some(move || hook_cluster.lock().unwrap().drives[d].stop()),
            };
            let (n, report) = to(s.read_to(0, data.len() as u64, data.len() as u64, &mut dst)).await.unwrap();
            assert!(!cluster.lock().unwrap().drives[d].running(), "the drive was stopped mid-read");
            assert_eq!(n, data.len() as u64);
            assert!(dst.out == data, "{layout}: bytes read while a drive stopped differ");
            // Mirror reads may not have needed the stopped copy again.
            if layout.starts_with("rs") && victim < 2 {
                assert!(report.failed.iter().any(|f| f.component == victim), "{layout}: {report:?}");
            }
        });
    }
}

#[test]
fn a_rotten_block_is_served_from_redundancy_reported_and_healed() {
    for protection in
        [hash_and_mac(), nasd_proto::Protection::INTEGRITY_ARGS.union(nasd_proto::Protection::INTEGRITY_DATA)]
    {
        run(async move {
            let c = Cluster::start(3).await;
            let target = c.target("rs:2+1@16K", 0, Cred::Capability(protection)).await;
            let s = c.striper(target.clone(), Options::default());
            let mut m = Model::default();
            write(&s, &mut m, 0, &pattern(5, 400_000)).await;
            to(s.flush(&(0..3).collect())).await.unwrap();
            // Rot block 5 of component 0 (component bytes 20480..24576).
            let b0 = &target.components[0];
            c.drives[c.drive_of(b0)].rot(b0.object, 5, 100, 0x20);
            let report = check_all(&s, &m, "rotten").await;
            let f = report.failed.iter().find(|f| f.component == 0).expect("the rotten component is reported");
            assert!(f.cause.suggests_rot(), "{:?}", f.cause);
            let range = f.range.clone().expect("a request range");
            assert!(range.start <= 5 * BLOCK_BYTES && 6 * BLOCK_BYTES <= range.end, "{range:?}");
            // Heal: rebuild the rotten block from the others and write it back.
            let (good, _) = to(s.read_component(0, 5 * BLOCK_BYTES, BLOCK_BYTES, m.size())).await.unwrap();
            to(s.write_component(0, 5 * BLOCK_BYTES, &good)).await.unwrap();
            let report = check_all(&s, &m, "healed").await;
            assert!(report.is_clean(), "{report:?}");
        });
    }
}

#[test]
fn degraded_writes_are_missed_then_readable() {
    for (layout, k, victim) in
        [("mirror:2@4K", 1u64, 1usize), ("rs:2+1@4K", 2, 0), ("rs:2+1@4K", 2, 2), ("rs:4+2@4K", 4, 3)]
    {
        run(async move {
            let mut c = Cluster::start(6).await;
            let target = c.target(layout, 0, Cred::DriveKey).await;
            let s = c.striper(target.clone(), small_batches());
            let mut m = Model::default();
            let sb = k * U;
            write(&s, &mut m, 0, &pattern(1, (5 * sb + 300) as usize)).await;
            let d = c.drive_of(&target.components[victim]);
            c.drives[d].stop();
            // Full stripes, a partial stripe read-modify-written, growth.
            for (i, (offset, len)) in [(sb, 2 * sb), (7, 100), (4 * sb + 50, 3 * sb + 9)].into_iter().enumerate() {
                let outcome = write(&s, &mut m, offset, &pattern(20 + i as u64, len as usize)).await;
                // Write 1 touches column 0 only: rs:4+2's column 3 takes no part in it.
                let expect = if layout == "rs:4+2@4K" && i == 1 { BTreeSet::new() } else { BTreeSet::from([victim]) };
                assert_eq!(outcome.missed, expect, "{layout} write {i}");
                assert!(!outcome.written.contains(&victim));
                check_all(&s, &m, &format!("{layout} after degraded write {i}")).await;
            }
            // The manager marks it stale: then it is neither read nor counted.
            let mut stale = target.clone();
            stale.components[victim].state = ComponentState::Down;
            let s2 = c.striper(stale, Options::default());
            let report = check_all(&s2, &m, layout).await;
            assert!(report.is_clean(), "a Down component is not tried: {report:?}");
            let outcome = to(s2.write(0, b"x", m.size())).await.unwrap();
            m.write(0, b"x");
            assert!(!outcome.written.contains(&victim));
            check_all(&s2, &m, layout).await;
        });
    }
}

#[test]
fn a_hung_drive_counts_as_failed_after_the_deadline() {
    run(async {
        let c = Cluster::start(2).await;
        let mut target = c.target("mirror:2@4K", 0, Cred::DriveKey).await;
        let s = c.striper(target.clone(), Options::default());
        let data = pattern(2, 100_000);
        to(s.write(0, &data, 0)).await.unwrap();
        // Copy 0 now points at a listener that accepts and never answers.
        let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        target.components[0].addr = hole.local_addr().unwrap().to_string();
        let _held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = hole.accept().await {
                held.push(sock);
            }
        });
        let opts = Options {
            request_deadline: Duration::from_millis(500),
            connect_deadline: Duration::from_millis(500),
            ..Options::default()
        };
        let s = c.striper(target, opts);
        // Reads take the copies in turn: one of two reads starts on the hung one.
        let mut hung = 0;
        for _ in 0..2 {
            let (back, report) = to(s.read(0, data.len() as u64, data.len() as u64)).await.unwrap();
            assert!(back == data);
            if let Some(f) = report.failed.first() {
                assert_eq!(f.component, 0);
                assert!(f.cause.is_time_out(), "{:?}", f.cause);
                hung += 1;
            }
        }
        assert!(hung >= 1, "the hung copy was tried");
    });
}

#[test]
fn each_wait_for_a_drive_is_bounded_by_the_wait_deadline() {
    run(async {
        let c = Cluster::start(2).await;
        let mut target = c.target("mirror:2@4K", 0, Cred::DriveKey).await;
        let data = pattern(3, 10_000);
        to(c.striper(target.clone(), Options::default()).write(0, &data, 0)).await.unwrap();
        // Copy 0 at a listener that accepts and never answers: the HELLO reply never comes.
        let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        target.components[0].addr = hole.local_addr().unwrap().to_string();
        let _held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = hole.accept().await {
                held.push(sock);
            }
        });
        // The request and connect deadlines as by default (30 s, 10 s); each wait 300 ms.
        let opts = Options { wait_deadline: Duration::from_millis(300), ..Options::default() };
        let s = c.striper(target, opts);
        let mut hung = 0;
        for _ in 0..2 {
            let started = std::time::Instant::now();
            let (back, report) = to(s.read(0, data.len() as u64, data.len() as u64)).await.unwrap();
            assert!(back == data);
            if let Some(f) = report.failed.first() {
                assert!(f.cause.is_time_out(), "{:?}", f.cause);
                assert!(f.to_string().contains("did not"), "the step is named: {f}");
                assert!(started.elapsed() < Duration::from_secs(5), "ended by the wait bound, not the request's");
                hung += 1;
            }
        }
        assert!(hung >= 1, "the hung copy was tried");
        // A wait bound must be positive; one longer than the request's is taken as the request's.
        let zero = Options { wait_deadline: Duration::ZERO, ..Options::default() };
        let binder = Arc::new(StaticBinder::new(c.target("mirror:2@4K", 0, Cred::DriveKey).await).unwrap());
        assert!(Striper::with_options(c.pool.clone(), binder.clone(), zero).is_err());
        let long = Options { wait_deadline: Duration::from_secs(3600), ..Options::default() };
        assert!(Striper::with_options(c.pool.clone(), binder, long).is_ok());
    });
}

#[test]
fn connections_a_drive_closed_are_dropped_from_the_pool_before_reuse() {
    run(async {
        let mut c = Cluster::start(2).await;
        let target = c.target("mirror:2@4K", 0, Cred::DriveKey).await;
        let s = c.striper(target, Options::default());
        let data = pattern(4, 100_000);
        to(s.write(0, &data, 0)).await.unwrap();
        let (a0, a1) = (c.drives[0].addr.to_string(), c.drives[1].addr.to_string());
        assert!(c.pool.idle_connections(&a0) > 0 && c.pool.idle_connections(&a1) > 0, "connections are kept");

        // Drive 0 stops: every connection to it closes. The pool finds its idle ones closed
        // (without sending on them, without waiting) and drops them; drive 1's stay.
        c.drives[0].stop();
        to(async {
            while c.pool.idle_connections(&a0) > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(c.pool.idle_connections(&a1) > 0, "open connections are kept");
        let (back, _) = to(s.read(0, data.len() as u64, data.len() as u64)).await.unwrap();
        assert!(back == data);
    });
}

/// A binder whose first target's capabilities have expired; `refresh` mints
/// fresh ones and counts.
struct Expiring {
    target: Mutex<Arc<Target>>,
    fresh: Target,
    refreshes: AtomicUsize,
}

impl Binder for Expiring {
    fn current(&self) -> Arc<Target> {
        self.target.lock().unwrap().clone()
    }
    fn refresh(&self) -> BoxFuture<'_, Result<Arc<Target>, StripeError>> {
        Box::pin(async move {
            self.refreshes.fetch_add(1, Ordering::SeqCst);
            let t = Arc::new(self.fresh.clone());
            *self.target.lock().unwrap() = t.clone();
            Ok(t)
        })
    }
}

#[test]
fn expired_capabilities_are_refreshed_once_for_all_components() {
    run(async {
        let c = Cluster::start(6).await;
        let fresh = c.target("rs:4+2@4K", 0, Cred::Capability(hash_and_mac())).await;
        let mut expired = fresh.clone();
        for b in &mut expired.components {
            let d = &c.drives[c.drive_of(b)];
            let cred = d.capability(b.object, nasd_proto::rights::ALL, Duration::from_secs(60), true);
            b.auth = nasd_client::Auth::new(cred, hash_and_mac());
        }
        let binder =
            Arc::new(Expiring { target: Mutex::new(Arc::new(expired)), fresh, refreshes: AtomicUsize::new(0) });
        let s = Striper::new(c.pool.clone(), binder.clone());
        let data = pattern(4, 200_000);
        let outcome = to(s.write(0, &data, 0)).await.unwrap();
        assert!(outcome.missed.is_empty(), "{outcome:?}");
        assert_eq!(binder.refreshes.load(Ordering::SeqCst), 1, "concurrent refusals share one refresh");
        let (back, report) = to(s.read(0, data.len() as u64, data.len() as u64)).await.unwrap();
        assert!(back == data && report.is_clean());
        assert_eq!(binder.refreshes.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn a_refusal_that_no_refresh_cures_fails_the_component() {
    run(async {
        let c = Cluster::start(3).await;
        let mut target = c.target("rs:2+1@4K", 0, Cred::DriveKey).await;
        let s = c.striper(target.clone(), Options::default());
        let data = pattern(6, 50_000);
        to(s.write(0, &data, 0)).await.unwrap();
        // Component 1 names an object that does not exist: the static binder
        // cannot cure it, so it fails and the read degrades.
        target.components[1].object += 1000;
        let s = c.striper(target, Options::default());
        let (back, report) = to(s.read(0, data.len() as u64, data.len() as u64)).await.unwrap();
        assert!(back == data);
        assert_eq!(report.failed.len(), 1);
        assert_eq!(report.failed[0].cause.status(), Some(Status::NoSuchObject));
    });
}

#[test]
fn read_component_rebuilds_a_lost_component_onto_a_new_object() {
    for lost in [1usize, 4] {
        run(async move {
            let mut c = Cluster::start(7).await;
            let target = c.target("rs:4+2@4K", 0, Cred::DriveKey).await;
            let s = c.striper(target.clone(), small_batches());
            let mut m = Model::default();
            write(&s, &mut m, 0, &pattern(8, 300_001)).await;
            let d = c.drive_of(&target.components[lost]);
            c.drives[d].stop();
            // Rebuild onto a new object on the spare drive 6, then rebind.
            let binder = Arc::new(StaticBinder::new(target.clone()).unwrap());
            let s = Striper::with_options(c.pool.clone(), binder.clone(), small_batches()).unwrap();
            let geometry = nasd_stripe::geometry::Geometry::new(target.layout).unwrap();
            let len = geometry.component_len(m.size(), lost);
            let (bytes, report) = to(s.read_component(lost, 0, len, m.size())).await.unwrap();
            assert_eq!(bytes.len() as u64, len);
            assert!(report.is_clean(), "the lost component is excluded, not tried: {report:?}");
            let mut rebuilt = target.clone();
            rebuilt.components[lost] = c.bind(6, Cred::DriveKey).await;
            binder.set(rebuilt.clone()).unwrap();
            to(s.write_component(lost, 0, &bytes)).await.unwrap();
            // Two other components Down: every read needs the rebuilt one.
            let mut only = rebuilt.clone();
            for i in (0..6).filter(|&i| i != lost).take(2) {
                only.components[i].state = ComponentState::Down;
            }
            let report = check_all(&c.striper(only, Options::default()), &m, "rebuilt").await;
            assert!(report.is_clean(), "{report:?}");
        });
    }
}

#[test]
fn flush_reaches_every_component_and_counts_the_missing() {
    run(async {
        let mut c = Cluster::start(3).await;
        let target = c.target("rs:2+1@4K", 0, Cred::DriveKey).await;
        let s = c.striper(target.clone(), Options::default());
        let outcome = to(s.write(0, &pattern(1, 30_000), 0)).await.unwrap();
        assert_eq!(outcome.written, (0..3).collect());
        let f = to(s.flush(&outcome.written)).await.unwrap();
        assert!(f.missed.is_empty());
        let d = c.drive_of(&target.components[2]);
        c.drives[d].stop();
        let f = to(s.flush(&outcome.written)).await.unwrap();
        assert_eq!(f.missed, BTreeSet::from([2]));
        let d = c.drive_of(&target.components[1]);
        c.drives[d].stop();
        assert!(matches!(to(s.flush(&outcome.written)).await, Err(StripeError::Unavailable { .. })));
    });
}

#[test]
fn stale_components_are_written_not_read_and_a_wrong_drive_is_refused() {
    run(async {
        let c = Cluster::start(3).await;
        let target = c.target("mirror:3@4K", 0, Cred::DriveKey).await;
        let mut stale = target.clone();
        stale.components[0].state = ComponentState::Stale;
        // Copy 1 is bound to drive 2's address with drive 1's identity.
        stale.components[1].drive_id = c.drives[0].drive_id;
        stale.components[1].addr = c.drives[2].addr.to_string();
        let s = c.striper(stale, Options::default());
        let data = pattern(12, 50_000);
        let outcome = to(s.write(0, &data, 0)).await.unwrap();
        assert!(outcome.written.contains(&0), "a stale component is written: {outcome:?}");
        assert_eq!(outcome.missed, BTreeSet::from([1]));
        let f = &outcome.failed[0];
        assert!(matches!(f.cause, FailureCause::WrongDrive { .. }), "{f}");
        for _ in 0..3 {
            let (back, report) = to(s.read(0, data.len() as u64, data.len() as u64)).await.unwrap();
            assert!(back == data);
            assert!(report.failed.iter().all(|f| f.component == 1), "the stale copy is never read: {report:?}");
        }
        // What the stale copy took is there all the same.
        let b = &target.components[0];
        assert!(c.drives[c.drive_of(b)].raw(b.object, 0, data.len() as u64).await == data);
    });
}

/// A binder over bindings that hold no key (requests go under the pool's
/// identity); `renew_identity` gives the pool a fresh identity and counts.
struct Renewing {
    target: Arc<Target>,
    pool: Arc<nasd_stripe::DrivePool>,
    fresh: Option<nasd_client::Auth>,
    renewals: AtomicUsize,
}

impl Binder for Renewing {
    fn current(&self) -> Arc<Target> {
        self.target.clone()
    }
    fn refresh(&self) -> BoxFuture<'_, Result<Arc<Target>, StripeError>> {
        let t = self.target.clone();
        Box::pin(async move { Ok(t) })
    }
    fn renew_identity(&self) -> BoxFuture<'_, Result<bool, StripeError>> {
        Box::pin(async move {
            self.renewals.fetch_add(1, Ordering::SeqCst);
            match &self.fresh {
                Some(fresh) => {
                    self.pool.set_identity(Some(fresh.clone()));
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }
}

/// An identity (user 5, no role) made with the shared key `shared`, expiring at `expiration_ns`.
fn identity(shared: &nasd_client::Key, expiration_ns: u64) -> nasd_client::Auth {
    let data = nasd_proto::IdentityData { algorithm: 1, key_id: 1, user: 5, role: 0, expiration_ns };
    let key = nasd_crypto::identity_key(shared, &data).unwrap();
    nasd_client::Auth::new(
        nasd_client::Credential::Identity { data, key },
        nasd_proto::Protection::INTEGRITY_ARGS.union(nasd_proto::Protection::INTEGRITY_DATA),
    )
}

/// On a PALs-only partition, a drive refusing the pool's identity as
/// expired (`IDENTITY_EXPIRED`) makes the engine ask the binder to renew it
/// once per component request and send the request again: the pool's
/// connections — the ones already open included — take the new identity
/// (`DrivePool::set_identity`). A binder that cannot renew leaves the
/// refusal standing.
#[test]
fn an_expired_identity_is_renewed_and_the_request_sent_again() {
    run(async {
        let c = Cluster::start(2).await;
        let shared = nasd_client::Key::random();
        let mut target = c.target("stripe:2@4K", 0, Cred::DriveKey).await;
        for (d, b) in c.drives.iter().zip(&target.components) {
            let mut admin = d.admin().await;
            to(admin.set_identity_key(&d.drive_key, 1, &shared)).await.unwrap();
            to(admin.set_auth_scheme(PARTITION, nasd_proto::AuthScheme::PALS)).await.unwrap();
            let entry = nasd_proto::PalEntry {
                principal: nasd_proto::Principal::User(5),
                rights: nasd_proto::rights::READ | nasd_proto::rights::WRITE,
            };
            let pal = nasd_proto::ObjectPal { collection: 0, pal: nasd_proto::Pal::new(vec![entry]) };
            to(admin.set_pal(PARTITION, b.object, &pal)).await.unwrap();
        }
        for b in &mut target.components {
            b.auth = nasd_client::Auth::new(nasd_client::Credential::None, nasd_proto::Protection::NONE);
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        let (fresh, expired) = (identity(&shared, now + 3_600_000_000_000), identity(&shared, 1));
        let target = Arc::new(target);
        let data = pattern(9, 40_000);

        // Open connections under a valid identity, then swap in an expired one: refused, and a
        // binder that cannot renew leaves it so.
        let pool = Arc::new(nasd_stripe::DrivePool::with_identity(Some(fresh.clone())));
        let stuck = Arc::new(Renewing {
            target: target.clone(),
            pool: pool.clone(),
            fresh: None,
            renewals: AtomicUsize::new(0),
        });
        let s = Striper::with_options(pool.clone(), stuck.clone(), Options::default()).unwrap();
        to(s.write(0, &data, 0)).await.unwrap();
        assert!(pool.idle_connections(&c.drives[0].addr.to_string()) > 0, "connections kept");
        pool.set_identity(Some(expired.clone()));
        let refused = to(s.read(0, data.len() as u64, data.len() as u64)).await.expect_err("an expired identity");
        assert!(refused.to_string().contains("IDENTITY_EXPIRED"), "{refused}");
        assert_eq!(stuck.renewals.load(Ordering::SeqCst), 2, "asked once per component request");

        // A binder that renews: the same idle connections, renewed, and the request retried.
        let renewing =
            Arc::new(Renewing { target, pool: pool.clone(), fresh: Some(fresh), renewals: AtomicUsize::new(0) });
        let s = Striper::with_options(pool.clone(), renewing.clone(), Options::default()).unwrap();
        let (back, _) = to(s.read(0, data.len() as u64, data.len() as u64)).await.unwrap();
        assert!(back == data);
        assert!(renewing.renewals.load(Ordering::SeqCst) >= 1);
        let again = renewing.renewals.load(Ordering::SeqCst);
        to(s.write(0, &data, data.len() as u64)).await.unwrap();
        assert_eq!(renewing.renewals.load(Ordering::SeqCst), again, "no renewal while the identity is valid");
    });
}

/// Whether each byte of a file of `size` bytes laid out by `layout` is
/// stored, after writes `nonzero` of non-zero bytes and `zero` of zeros
/// (offset, len): a byte is stored iff a non-zero write touched its
/// component block (4 KiB, a unit here) and it lies below its component
/// object's size (the end of the last write to that column: a component is
/// as long as what was written to it, and bytes past it read as zeros).
fn stored_bytes(layout: &str, nonzero: &[(u64, u64)], zero: &[(u64, u64)], size: u64) -> Vec<bool> {
    let g = nasd_stripe::geometry::Geometry::new(nasd_proto::layout::Layout::parse(layout).unwrap()).unwrap();
    let mut column_len = vec![0u64; g.data_columns()];
    for &(offset, len) in nonzero.iter().chain(zero) {
        for e in g.extents(offset, len) {
            column_len[e.column] = column_len[e.column].max(e.comp_offset + e.len);
        }
    }
    let mut touched = vec![false; size.div_ceil(U) as usize];
    for &(offset, len) in nonzero {
        for u in offset / U..=(offset + len - 1) / U {
            touched[u as usize] = true;
        }
    }
    (0..size).map(|f| touched[(f / U) as usize] && g.locate(f).comp_offset < column_len[g.locate(f).column]).collect()
}

/// `SEEK_DATA` and `SEEK_HOLE` as `stored` says: the first stored byte at
/// or after `from`, and the first unstored one (or the size).
fn expect_seek(stored: &[bool], from: u64) -> (Option<u64>, u64) {
    let from = from as usize;
    let data = stored[from..].iter().position(|&s| s).map(|i| (from + i) as u64);
    let hole = stored[from..].iter().position(|&s| !s).map_or(stored.len(), |i| from + i) as u64;
    (data, hole)
}

/// `Striper::seek` finds data and holes from the components' stored extents
/// on every scheme, from every kind of offset (unit starts, mid-unit, in
/// holes, in data, at a column's last unit, past the end): the first stored
/// byte (`SEEK_DATA`) and the first hole (`SEEK_HOLE`) as a model of which
/// blocks the writes stored says. A block of zeros written is a hole. A
/// component that cannot answer counts as data (conservative); a mirror
/// asks the other copy.
#[test]
fn seek_finds_data_and_holes_from_the_stored_extents() {
    run(async {
        let mut c = Cluster::start(6).await;
        for (layout, k) in
            [("stripe:1@4K", 1u64), ("stripe:4@4K", 4), ("mirror:2x3@4K", 3), ("rs:2+1@4K", 2), ("rs:4+2@4K", 4)]
        {
            let target = c.target(layout, 0, Cred::Capability(hash_and_mac())).await;
            let s = c.striper(target.clone(), small_batches());
            let sb = k * U;
            let mut m = Model::default();
            let writes = [(0, 100), (3 * U + 10, U), (2 * sb + 5, sb), (7 * sb, 1), (12 * sb + U / 2, 3 * U)];
            for (i, &(offset, len)) in writes.iter().enumerate() {
                write(&s, &mut m, offset, &pattern(i as u64 + 1, len as usize)).await;
            }
            // Zeros written over a hole stay a hole.
            let zeros_at = 10 * sb;
            write(&s, &mut m, zeros_at, &vec![0u8; (2 * U) as usize]).await;
            let size = m.size() + 3 * U;
            to(s.write(size - 1, &[0], m.size())).await.unwrap();
            let stored = stored_bytes(layout, &writes, &[(zeros_at, 2 * U), (size - 1, 1)], size);
            let mut froms: Vec<u64> = vec![0, 1, 99, 100, U - 1, U, 3 * U, 4 * U + 9, zeros_at, zeros_at + U + 7];
            froms.extend((0..size / U).map(|u| u * U + (u * 37) % U));
            froms.extend([size - U, size - 1, size, size + 5]);
            for &from in &froms {
                let (data, _) = to(s.seek(nasd_stripe::Seek::Data, from, size)).await.unwrap();
                let (hole, report) = to(s.seek(nasd_stripe::Seek::Hole, from, size)).await.unwrap();
                assert!(report.is_clean(), "{layout}: {report:?}");
                if from >= size {
                    assert_eq!((data, hole), (None, None), "{layout} from {from} past the size {size}");
                    continue;
                }
                let (want_data, want_hole) = expect_seek(&stored, from);
                assert_eq!(data, want_data, "{layout}: SEEK_DATA from {from} (size {size})");
                assert_eq!(hole, Some(want_hole), "{layout}: SEEK_HOLE from {from} (size {size})");
            }
            // A data component that cannot answer counts as data; a mirror asks the other copy.
            let victim = 1 % k as usize;
            let d = c.drive_of(&target.components[victim]);
            c.drives[d].stop();
            let in_hole = 9 * sb + U;
            let (data, report) = to(s.seek(nasd_stripe::Seek::Data, in_hole, size)).await.unwrap();
            let (hole, _) = to(s.seek(nasd_stripe::Seek::Hole, in_hole, size)).await.unwrap();
            let (want_data, want_hole) = expect_seek(&stored, in_hole);
            if layout.starts_with("mirror") {
                assert_eq!((data, hole), (want_data, Some(want_hole)), "{layout}: the other copy answers");
            } else {
                assert!(data.is_some_and(|d| d <= want_data.unwrap()), "{layout}: data no later than the truth");
                assert!(hole.is_some_and(|h| h >= want_hole), "{layout}: a hole no earlier than the truth");
            }
            assert!(!report.is_clean(), "{layout}: the stopped drive is reported");
            c.drives[d] = Drive::start(c.drives[d].number).await;
        }
    });
}
