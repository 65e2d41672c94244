//! The manager's repair over real drives: a drive that stays down has its
//! components rebuilt on the others (every file then reads byte-exact with
//! that drive gone for good); a drive that was down briefly has the ranges
//! its components missed resynced when it comes back; scrub finds a rotten
//! block and heals it from redundancy; a new drive takes its share of the
//! components by rebalancing. Every test takes a checksum (BLAKE3) of every
//! file, read back, before the fault and after the repair, and checks they
//! are equal and are the checksums of what was written.

mod common;

use common::raw::{begin, commit_ranges, create, read_all, striper, striper_without, write, write_new};
use common::*;
use nasd_fs::FsClient;
use nasd_manager::ManagerConfig;
use nasd_proto::layout::Layout;
use nasd_proto::manager::{ClusterStatus, RepairAction};
use nasd_stripe::DrivePool;
use std::sync::Arc;
use std::time::Duration;

/// A file's checksum.
fn checksum(data: &[u8]) -> blake3::Hash {
    blake3::hash(data)
}

/// The checksum of every file of `files` as read back now (a fresh lookup
/// each), in order.
async fn checksums(fs: &FsClient, pool: &Arc<DrivePool>, files: &[(String, Vec<u8>)]) -> Vec<(String, blake3::Hash)> {
    let mut out = Vec::with_capacity(files.len());
    for (name, _) in files {
        out.push((name.clone(), checksum(&read_all(fs, pool, &format!("/{name}")).await)));
    }
    out
}

/// The checksum of every file of `files` before a fault: as read back, and
/// equal to the checksum of what was written.
async fn checksums_before(
    fs: &FsClient,
    pool: &Arc<DrivePool>,
    files: &[(String, Vec<u8>)],
) -> Vec<(String, blake3::Hash)> {
    let before = checksums(fs, pool, files).await;
    for ((name, data), (_, sum)) in files.iter().zip(&before) {
        assert_eq!(*sum, checksum(data), "{name} reads back as written");
    }
    before
}

/// Asserts every file of `files` reads back now with the checksum it had
/// `before` (`what`: after what).
async fn assert_checksums(
    fs: &FsClient,
    pool: &Arc<DrivePool>,
    files: &[(String, Vec<u8>)],
    before: &[(String, blake3::Hash)],
    what: &str,
) {
    let after = checksums(fs, pool, files).await;
    for ((name, was), (_, now)) in before.iter().zip(&after) {
        assert_eq!(now, was, "{name}: its checksum {what} differs from the one before");
    }
}

/// Polls the cluster status until `done` holds, at most [`STEP`]. Every
/// status seen shows progress that makes sense: no more done than planned,
/// and a rebuild's bytes within what these tests' files hold (a resync of a
/// component stale whole used to plan 512 TiB, and shown "0/0 files").
async fn until(fs: &FsClient, what: &str, done: impl Fn(&ClusterStatus) -> bool) -> ClusterStatus {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let s = to(fs.cluster_status()).await.expect("status");
        let p = s.rebuild;
        assert!(p.files_done <= p.files_total && p.bytes_done <= p.bytes_total, "{what}: rebuild {p:?}");
        assert!(p.bytes_total <= 1 << 30, "{what}: a rebuild plans more bytes than the files hold: {p:?}");
        if done(&s) {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: still {s:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn config(layout: &str, rebuild_delay: Duration) -> ManagerConfig {
    ManagerConfig {
        pool_target: 8,
        default_layout: Layout::parse(layout).expect("layout"),
        rebuild_delay,
        maintenance_interval: Duration::from_millis(200),
        ..ManagerConfig::default()
    }
}

/// Files of assorted sizes (in stripes of 64 KiB units: ending mid-unit,
/// mid-stripe, on a boundary).
fn contents() -> Vec<(String, Vec<u8>)> {
    [1, 5000, 65_536, 131_072, 200_001, 700_000]
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("f{i}"), pattern(i as u64, n)))
        .collect()
}

#[test]
fn a_drive_that_stays_down_has_its_components_rebuilt_elsewhere() {
    run(async {
        let opts = ClusterOptions {
            config: config("rs:2+1@64K", Duration::ZERO),
            drives: 5,
            maintenance: true,
            ..Default::default()
        };
        let mut c = Cluster::start(opts).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let files = contents();
        for (name, data) in &files {
            write_new(&admin, &pool, name, data).await;
        }
        let sums = checksums_before(&admin, &pool, &files).await;
        let victim = c.drives.remove(1);
        let before = until(&admin, "components on drive 1", |s| s.drives[1].components > 0).await;
        let held = before.drives[1].components;
        victim.stop().await;
        let after =
            until(&admin, "rebuild off the stopped drive", |s| !s.drives[1].up && s.drives[1].components == 0).await;
        let total: u64 = after.drives.iter().map(|d| d.components).sum();
        assert_eq!(total, before.drives.iter().map(|d| d.components).sum::<u64>(), "every component still exists");
        assert!(held > 0);
        assert_checksums(&admin, &pool, &files, &sums, "after the rebuild").await;
        // Nothing is read from the lost drive: every component of every file is elsewhere and Ok.
        for (name, _) in &files {
            let info = to(admin.get_layout(&format!("/{name}"))).await.expect("layout");
            assert!(info.components.iter().all(|(c, _)| c.object.drive != 1 && c.state == nasd_fs::ComponentState::Ok));
        }
        c.stop().await;
    });
}

#[test]
fn a_drive_back_from_a_short_outage_is_resynced() {
    run(async {
        let opts = ClusterOptions {
            config: config("mirror:3@64K", Duration::from_secs(3600)),
            drives: 3,
            maintenance: true,
            ..Default::default()
        };
        let mut c = Cluster::start(opts).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let old = pattern(9, 300_000);
        write_new(&admin, &pool, "a", &old).await;
        let (h, _) = create(&admin, "b").await;
        let new = pattern(10, 400_000);
        let files = vec![("a".to_string(), old.clone()), ("b".to_string(), new.clone())];
        let stopped = c.drives.remove(2).halt().await;
        until(&admin, "drive 2 down", |s| !s.drives[2].up).await;

        // Written while drive 2 is down: its copy misses it and is marked stale.
        let access = to(admin.walk("/b", nasd_fs::OpenMode::ReadWrite)).await.expect("walk").access.expect("access");
        let missed = write(&admin, &pool, h, &access, &new).await;
        assert_eq!(missed.len(), 1, "the copy on the stopped drive missed the write");
        let info = to(admin.get_layout("/b")).await.expect("layout");
        assert!(info.components.iter().any(|(c, _)| c.object.drive == 2), "a copy on drive 2: {info:?}");
        let status = to(admin.cluster_status()).await.expect("status");
        assert!(status.files_degraded >= 1, "{status:?}");
        let sums = checksums_before(&admin, &pool, &files).await;

        c.drives.insert(2, stopped.start().await);
        until(&admin, "resync of the stale copy", |s| s.drives[2].up && s.files_degraded == 0).await;
        assert_checksums(&admin, &pool, &files, &sums, "after the resync").await;
        // Each copy alone, drive 2's resynced one included, holds each file: the others taken out.
        for (name, data) in &files {
            let access = to(admin.walk(&format!("/{name}"), nasd_fs::OpenMode::Read))
                .await
                .expect("walk")
                .access
                .expect("access");
            assert!(access.components.iter().all(|c| c.state == nasd_fs::ComponentState::Ok), "{access:?}");
            for copy in 0..3 {
                let others: Vec<usize> = (0..3).filter(|&i| i != copy).collect();
                let len = data.len() as u64;
                let (back, _) = to(striper(&pool, &access, &others).read(0, len, len)).await.expect("read");
                assert_eq!(checksum(&back), checksum(data), "/{name}: copy {copy} alone, after the resync");
            }
        }
        c.stop().await;
    });
}

/// Writes `data` at `offset` of `/name` in a transaction of its own that
/// misses `missing`, flushed and not committed: the file's handle, the open
/// transaction, and the components it missed (for the commit, which marks
/// them stale over the ranges it names).
async fn write_missing(
    fs: &FsClient,
    pool: &Arc<DrivePool>,
    name: &str,
    offset: u64,
    data: &[u8],
    missing: &[usize],
) -> (nasd_proto::manager::Handle, u64, Vec<u8>) {
    let e = to(fs.walk(&format!("/{name}"), nasd_fs::OpenMode::ReadWrite)).await.expect("walk");
    let (h, size) = (e.handle(), e.attr.size);
    let access = e.access.expect("access");
    let txn = begin(fs, h).await.expect("begin");
    let s = striper_without(pool, &access, missing);
    let w = to(s.write(offset, data, size)).await.expect("write");
    let f = to(s.flush(&w.written)).await.expect("flush");
    let missed: Vec<u8> = w.missed.union(&f.missed).map(|&m| m as u8).collect();
    assert_eq!(missed, missing.iter().map(|&m| m as u8).collect::<Vec<_>>(), "the write missed what it left out");
    (h, txn, missed)
}

/// A stale copy whose resync has to wait for a client's transaction, which
/// then commits a write that copy missed too: the resync rewrites that range
/// as well (it reads the ranges to rewrite under its own transaction, after
/// the client's commit), and the copy alone then holds every write.
///
/// The repair pass is kept busy with a larger stale file first (stale
/// components are resynced in file order), so the client's transaction
/// begins before the pass reaches the file, and it commits once the pass
/// waits for it.
#[test]
fn a_resync_that_waited_for_a_writer_rewrites_what_the_writer_missed() {
    run(async {
        let opts = ClusterOptions {
            config: config("mirror:2@64K", Duration::from_secs(3600)),
            drives: 2,
            maintenance: true,
            ..Default::default()
        };
        let c = Cluster::start(opts).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        // The busy file first (a lower inode number), then the file under test.
        let big = pattern(30, 48 << 20);
        write_new(&admin, &pool, "big", &pattern(31, big.len())).await;
        let mut want = pattern(32, 300_000);
        write_new(&admin, &pool, "f", &want).await;

        // The big file's second copy misses a rewrite of all of it: a long resync.
        let (h, txn, missed) = write_missing(&admin, &pool, "big", 0, &big, &[1]).await;
        commit_ranges(&admin, h, txn, big.len() as u64, missed, vec![(0, big.len() as u64)]).await.expect("commit");
        // Then f's second copy misses [0, 100000), and a client's transaction begins on f at once.
        let a = pattern(33, 100_000);
        let (h, txn, missed) = write_missing(&admin, &pool, "f", 0, &a, &[1]).await;
        commit_ranges(&admin, h, txn, a.len() as u64, missed, vec![(0, a.len() as u64)]).await.expect("commit");
        want[..a.len()].copy_from_slice(&a);
        let b = pattern(34, 100_000);
        let (h, txn, missed) = write_missing(&admin, &pool, "f", 200_000, &b, &[1]).await;
        want[200_000..300_000].copy_from_slice(&b);
        // Once the big file is resynced, the pass has gone on to f and waits for the client.
        let resynced = |name: &'static str| {
            let admin = &admin;
            async move {
                let info = to(admin.get_layout(&format!("/{name}"))).await.expect("layout");
                info.components.iter().all(|(c, _)| c.state == nasd_fs::ComponentState::Ok)
            }
        };
        let deadline = tokio::time::Instant::now() + STEP;
        while !resynced("big").await {
            assert!(tokio::time::Instant::now() < deadline, "the big file was not resynced");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!resynced("f").await, "f's resync waits for the client's transaction");
        tokio::time::sleep(Duration::from_millis(500)).await;
        commit_ranges(&admin, h, txn, 300_000, missed, vec![(200_000, 100_000)]).await.expect("commit");

        until(&admin, "every copy resynced", |s| s.files_degraded == 0).await;
        let access = to(admin.walk("/f", nasd_fs::OpenMode::Read)).await.expect("walk").access.expect("access");
        for copy in 0..2 {
            let len = want.len() as u64;
            let (back, _) = to(striper(&pool, &access, &[1 - copy]).read(0, len, len)).await.expect("read");
            assert_eq!(checksum(&back), checksum(&want), "/f: copy {copy} alone holds every write");
        }
        c.stop().await;
    });
}

/// Issue 22: the resync of a component stale on drive A runs while drive B,
/// holding another component of the file, is down — dead and not noticed
/// yet, then noticed. Its transaction cannot be opened on B and its reads
/// fail there: it waits, and marks B's component nothing, for B missed
/// nothing. Once B is back the resync runs and every component holds the
/// file. Before the fix B's component was recorded stale whole too: two of
/// three stale, and the file unreadable with every drive back, for good.
#[test]
fn a_resync_while_another_drive_is_down_marks_nothing_there() {
    run(async {
        let opts = ClusterOptions {
            config: config("rs:2+1@64K", Duration::from_secs(3600)),
            drives: 3,
            maintenance: true,
            ..Default::default()
        };
        let mut c = Cluster::start(opts).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let mut want = pattern(40, 500_000);
        write_new(&admin, &pool, "f", &want).await;
        let info = to(admin.get_layout("/f")).await.expect("layout");
        let drive_of = |idx: usize| info.components[idx].0.object.drive as usize;
        let (a, b) = (drive_of(0), drive_of(1));
        // Where drive `n` sits in `c.drives` while the drives in `missing` are out of it.
        let at = |n: usize, missing: usize| if missing < n { n - 1 } else { n };

        // Drive A stops; component 0 misses a rewrite of the first 200 000 bytes.
        let stopped_a = c.drives.remove(a).halt().await;
        until(&admin, "drive A down", |s| !s.drives[a].up).await;
        let new = pattern(41, 200_000);
        let (h, txn, missed) = write_missing(&admin, &pool, "f", 0, &new, &[0]).await;
        commit_ranges(&admin, h, txn, want.len() as u64, missed, vec![(0, new.len() as u64)]).await.expect("commit");
        want[..new.len()].copy_from_slice(&new);

        // Drive B stops and drive A comes back: repair passes (every 200 ms) try the resync of
        // component 0 while B is down, first unnoticed, then noticed.
        let stopped_b = c.drives.remove(at(b, a)).halt().await;
        c.drives.insert(at(a, b), stopped_a.start().await);
        until(&admin, "drive A up, drive B down", |s| s.drives[a].up && !s.drives[b].up).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let states: Vec<_> =
            to(admin.get_layout("/f")).await.expect("layout").components.iter().map(|(c, _)| c.state).collect();
        use nasd_fs::ComponentState::{Down, Ok as Current, Stale};
        assert_eq!(states, vec![Stale, Down, Current], "the component that missed the write, and B's down");

        // B back: its component is not stale (before the fix it was, and the file stayed degraded).
        c.drives.insert(b, stopped_b.start().await);
        until(&admin, "the resync", |s| s.drives.iter().all(|d| d.up) && s.files_degraded == 0).await;
        let access = to(admin.walk("/f", nasd_fs::OpenMode::Read)).await.expect("walk").access.expect("access");
        for missing in [None, Some(0), Some(1), Some(2)] {
            let len = want.len() as u64;
            let s = striper(&pool, &access, &missing.into_iter().collect::<Vec<_>>());
            let (back, _) = to(s.read(0, len, len)).await.expect("read");
            assert_eq!(checksum(&back), checksum(&want), "/f without component {missing:?}");
        }
        c.stop().await;
    });
}

#[test]
fn scrub_heals_a_rotten_block_from_redundancy() {
    run(async {
        let opts = ClusterOptions {
            config: config("rs:2+1@64K", Duration::from_secs(3600)),
            drives: 3,
            maintenance: true,
            ..Default::default()
        };
        let mut c = Cluster::start(opts).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let data = pattern(5, 500_000);
        let (_, access) = write_new(&admin, &pool, "r", &data).await;
        let mut files = contents();
        for (name, data) in &files {
            write_new(&admin, &pool, name, data).await;
        }
        files.push(("r".to_string(), data.clone()));
        let sums = checksums_before(&admin, &pool, &files).await;
        let comp = access.components[0].object;
        let i = c.drives.iter().position(|d| d.addr.to_string() == access.components[0].drive_addr).expect("drive");
        let stopped = c.drives.remove(i).halt().await;
        stopped.rot(comp.partition, comp.object, 0);
        c.drives.insert(i, stopped.start().await);

        to(admin.repair(RepairAction::Scrub)).await.expect("start a scrub");
        let s = until(&admin, "scrub", |s| s.last_scrub.blocks_checked > 0 && s.scrub.files_total == 0).await;
        assert_eq!((s.last_scrub.corrupt, s.last_scrub.healed, s.last_scrub.unrecoverable), (1, 1, 0), "{s:?}");
        assert_checksums(&admin, &pool, &files, &sums, "after the scrub").await;
        // Healed: the component itself now reads right, without reconstruction — once the
        // restarted drive is readmitted (until then it refuses capabilities as fenced).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let (back, report) = loop {
            let (back, report) =
                to(striper(&pool, &access, &[]).read(0, data.len() as u64, data.len() as u64)).await.expect("read");
            let fenced = report.failed.iter().any(|f| f.cause.status() == Some(nasd_proto::Status::MapEpochMoved));
            if !fenced || std::time::Instant::now() > deadline {
                break (back, report);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(back == data);
        assert!(report.is_clean(), "no component failed: {report:?}");
        // And a second scrub finds nothing.
        // A scrub shows as under way from the moment it is asked for: no wait
        // is needed before following it (the first scrub's result is not taken for this one's).
        to(admin.repair(RepairAction::Scrub)).await.expect("scrub again");
        let s = until(&admin, "second scrub", |s| s.scrub.files_total == 0).await;
        assert_eq!(s.last_scrub.corrupt, 0, "{s:?}");
        c.stop().await;
    });
}

#[test]
fn a_new_drive_takes_its_share_by_rebalancing() {
    run(async {
        let opts = ClusterOptions {
            config: config("mirror:2@64K", Duration::from_secs(3600)),
            drives: 3,
            maintenance: true,
            ..Default::default()
        };
        let mut c = Cluster::start(opts).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let files: Vec<(String, Vec<u8>)> = (0..24).map(|i| (format!("m{i}"), pattern(100 + i, 150_000))).collect();
        for (name, data) in &files {
            write_new(&admin, &pool, name, data).await;
        }
        let sums = checksums_before(&admin, &pool, &files).await;
        let d = TestDrive::start(c.dir().join("drive-new")).await;
        to(admin.add_drive(&d.addr.to_string(), &d.master)).await.expect("add a drive");
        c.drives.push(d);
        until(&admin, "usage of every drive known", |s| {
            s.drives.len() == 4 && s.drives.iter().all(|d| d.used_bytes > 0 || d.drive == 3)
        })
        .await;
        // A rebalance weighs only the drives a heartbeat has reported on, and the new drive's
        // first heartbeat may come after the request (its usage, 0, looks the same before):
        // ask again while a finished rebalance moved nothing to it.
        let deadline = tokio::time::Instant::now() + STEP;
        let s = loop {
            to(admin.repair(RepairAction::Rebalance)).await.expect("rebalance");
            tokio::time::sleep(Duration::from_millis(200)).await;
            let s = until(&admin, "rebalance", |s| s.rebalance.bytes_total == 0).await;
            if s.drives[3].components > 0 {
                break s;
            }
            assert!(tokio::time::Instant::now() < deadline, "nothing moved to the new drive: {s:#?}");
        };
        let total: u64 = s.drives.iter().map(|d| d.components).sum();
        assert_eq!(total, 48, "{s:?}");
        let share = s.drives[3].components as f64 / total as f64;
        assert!(
            (0.15..=0.35).contains(&share),
            "the new drive holds {share:.2} of the components, about 1/4 expected: {s:#?}"
        );
        assert_checksums(&admin, &pool, &files, &sums, "after the rebalance").await;
        c.stop().await;
    });
}
