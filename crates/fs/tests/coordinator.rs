//! The manager as coordinator of write transactions, over real drives and
//! the real TLS manager, driven with raw manager requests and the striping
//! engine (as a client would): `BEGIN_WRITE` opens the transaction on every
//! component's drive, `COMMIT` records the size and ends it, a writer that
//! lets its lease run out is rolled back on every component (every stripe
//! reads as before, through any subset of components), a second writer
//! waits, and a transaction a drive kept open without the manager knowing
//! it is taken as committed.

mod common;

use common::raw::{begin, commit, create, striper};
use common::*;
use nasd_fs::{FsStatus, OpenMode};
use nasd_manager::ManagerConfig;
use nasd_proto::layout::{ComponentState, Layout};
use nasd_proto::manager::FileAccess;
use nasd_stripe::DrivePool;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

fn layout() -> Layout {
    Layout::parse("rs:2+1@64K").expect("layout")
}

fn config() -> ManagerConfig {
    ManagerConfig {
        pool_target: 8,
        default_layout: layout(),
        write_lease: Duration::from_secs(1),
        ..ManagerConfig::default()
    }
}

/// Open transactions on the drives, per component object.
async fn open_txns(c: &Cluster, access: &FileAccess) -> Vec<Option<u64>> {
    let mut out = Vec::new();
    for comp in &access.components {
        let d = c.manager.drives().into_iter().find(|d| d.drive == comp.object.drive).expect("drive");
        let txns = to(d.txn_list(comp.object.object - 1, 1)).await.expect("txn list");
        out.push(txns.iter().find(|t| t.0 == comp.object.object).map(|t| t.1));
    }
    out
}

#[test]
fn a_committed_transaction_records_the_size_and_ends_on_every_drive() {
    run(async {
        let c = Cluster::start(ClusterOptions { config: config(), ..Default::default() }).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let (h, access) = create(&admin, "f").await;
        let txn = begin(&admin, h).await.expect("begin");
        assert_eq!(open_txns(&c, &access).await, vec![Some(txn); 3], "open on every component");

        let data = pattern(1, 300_000);
        let s = striper(&pool, &access, &[]);
        let written = to(s.write(0, &data, 0)).await.expect("write");
        assert!(written.missed.is_empty());
        to(s.flush(&written.written)).await.expect("flush");
        assert_eq!(commit(&admin, h, txn, data.len() as u64, vec![]).await.expect("commit"), data.len() as u64);

        // The ends go out in the background; every drive hears them soon.
        let mut left = open_txns(&c, &access).await;
        for _ in 0..200 {
            if left.iter().all(Option::is_none) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            left = open_txns(&c, &access).await;
        }
        assert_eq!(left, vec![None; 3], "the transaction ended on every drive");
        let (back, _) = to(s.read(0, data.len() as u64, data.len() as u64)).await.expect("read");
        assert!(back == data);

        // A second commit of the same transaction is refused: it is over.
        assert_eq!(commit(&admin, h, txn, 1, vec![]).await.unwrap_err().status(), Some(FsStatus::Aborted));
        c.stop().await;
    });
}

#[test]
fn a_writer_whose_lease_ran_out_is_rolled_back_on_every_component() {
    run(async {
        let c = Cluster::start(ClusterOptions { config: config(), ..Default::default() }).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let (h, access) = create(&admin, "f").await;
        let old = pattern(2, 200_000);
        let txn = begin(&admin, h).await.expect("begin");
        let s = striper(&pool, &access, &[]);
        let w = to(s.write(0, &old, 0)).await.expect("write");
        to(s.flush(&w.written)).await.expect("flush");
        commit(&admin, h, txn, old.len() as u64, vec![]).await.expect("commit");

        // A writer overwrites part of one stripe and grows the file, flushes, and dies.
        let txn = begin(&admin, h).await.expect("begin again");
        let new = pattern(3, 150_000);
        let w = to(s.write(100_000, &new, old.len() as u64)).await.expect("overwrite");
        to(s.flush(&w.written)).await.expect("flush");
        tokio::time::sleep(Duration::from_millis(1200)).await; // past the 1 s lease
        to(c.manager.maintain()).await;

        // Every stripe reads as before, whichever component is missing (under fresh capabilities:
        // the rollback revoked the writer's).
        let fresh = to(admin.walk("/f", OpenMode::Read)).await.expect("walk").access.expect("access");
        for missing in [None, Some(0), Some(1), Some(2)] {
            let unreadable: Vec<usize> = missing.into_iter().collect();
            let s = striper(&pool, &fresh, &unreadable);
            let (back, _) = to(s.read(0, 250_000, 250_000)).await.expect("read");
            assert!(back[..old.len()] == old[..], "rolled back (component {missing:?} left out)");
            assert!(back[old.len()..].iter().all(|&b| b == 0), "the extension is gone too");
        }
        assert_eq!(open_txns(&c, &access).await, vec![None; 3], "ended on every drive");
        let late = commit(&admin, h, txn, 250_000, vec![]).await.unwrap_err();
        assert_eq!(late.status(), Some(FsStatus::Aborted), "the rolled-back transaction is gone: {late}");
        // The late writer's capabilities are revoked: nothing it sends lands outside a transaction.
        let w = to(s.write(0, b"late", old.len() as u64)).await;
        assert!(w.is_err() || !w.unwrap().missed.is_empty(), "a late write lands nowhere");
        for missing in [None, Some(0), Some(1), Some(2)] {
            let fresh = to(admin.walk("/f", OpenMode::Read)).await.expect("walk").access.expect("access");
            let s = striper(&pool, &fresh, &missing.into_iter().collect::<Vec<_>>());
            let (back, _) = to(s.read(0, old.len() as u64, old.len() as u64)).await.expect("read");
            assert!(back == old, "still the committed content");
        }
        let size = to(admin.walk("/f", OpenMode::None)).await.expect("walk").attr.size;
        assert_eq!(size, old.len() as u64, "the size is the committed one");
        c.stop().await;
    });
}

#[test]
fn one_writer_at_a_time_and_a_dead_ones_transaction_does_not_block_the_next() {
    run(async {
        let c = Cluster::start(ClusterOptions { config: config(), ..Default::default() }).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let (h, _) = create(&admin, "f").await;
        let first = begin(&admin, h).await.expect("begin");
        // A second writer waits for the first; its lease runs out after 1 s, and the waiting
        // BEGIN_WRITE rolls it back and goes ahead.
        let second = begin(&admin, h).await.expect("the second writer gets the file after the first's lease");
        assert!(second > first, "transaction ids grow");
        // The first writer's commit now fails: its transaction is gone.
        assert!(commit(&admin, h, first, 10, vec![]).await.is_err());
        commit(&admin, h, second, 0, vec![]).await.expect("the second commits");
        c.stop().await;
    });
}

#[test]
fn a_transaction_a_drive_kept_open_without_an_intent_is_taken_as_committed() {
    run(async {
        let c = Cluster::start(ClusterOptions { config: config(), ..Default::default() }).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let (h, access) = create(&admin, "f").await;
        // As if the end of a committed transaction 999 never reached the first component's drive.
        let comp = &access.components[0];
        let d = c.manager.drives().into_iter().find(|d| d.drive == comp.object.drive).expect("drive");
        to(d.txn_begin(comp.object.object, 999_999)).await.expect("an old transaction");
        let txn = begin(&admin, h).await.expect("begin resolves the old transaction");
        let open = open_txns(&c, &access).await;
        assert_eq!(open, vec![Some(txn); 3], "the new transaction is open everywhere");
        // And recovery does the same for every drive: commit the unknown, keep the open.
        to(d.txn_end(comp.object.object, txn, true)).await.expect("end");
        to(d.txn_begin(comp.object.object, 999_998)).await.expect("another old one");
        d.set_unrecovered();
        to(c.manager.recover()).await;
        let open: BTreeSet<Option<u64>> = open_txns(&c, &access).await.into_iter().collect();
        assert!(!open.contains(&Some(999_998)), "recovery committed the unknown transaction: {open:?}");
        c.stop().await;
    });
}

/// A writer that goes past the quota escrow its transaction was given (a
/// client that ignores `size_limit`, writing with its capability) gets
/// `QUOTA_EXCEEDED` at `COMMIT`, and the transaction is rolled back on
/// every drive: the file stays as it was and the quota is not charged.
#[test]
fn a_commit_past_the_quota_escrow_is_refused_and_rolled_back() {
    run(async {
        let c = Cluster::start(ClusterOptions { config: config(), ..Default::default() }).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        to(admin.set_quota(nasd_fs::QuotaOf::User(0), Some(100_000), None)).await.unwrap();
        let (h, access) = create(&admin, "f").await;
        let req = nasd_proto::manager::ManagerRequest::BeginWrite { handle: h };
        let (txn, size_limit) = match to(admin.call(&req)).await.expect("begin") {
            nasd_proto::manager::ManagerReply::Began { txn, size_limit, .. } => (txn, size_limit),
            other => panic!("begin: {other:?}"),
        };
        let used = to(admin.quota(nasd_fs::QuotaOf::User(0))).await.unwrap();
        assert_eq!(size_limit, 100_000 - used.bytes_used, "the whole room, in escrow");
        let data = pattern(5, 300_000);
        let s = striper(&pool, &access, &[]);
        let written = to(s.write(0, &data, 0)).await.expect("the drives take the bytes");
        to(s.flush(&written.written)).await.expect("flush");
        let e = commit(&admin, h, txn, data.len() as u64, vec![]).await.unwrap_err();
        assert_eq!(e.status(), Some(FsStatus::QuotaExceeded), "{e}");
        assert_eq!(commit(&admin, h, txn, 1, vec![]).await.unwrap_err().status(), Some(FsStatus::Aborted));
        assert_eq!(to(admin.stat("/f")).await.unwrap().attr.size, 0);
        assert_eq!(open_txns(&c, &access).await, vec![None; 3], "rolled back and ended on every drive");
        assert!(to(s.read(0, 65_536, 65_536)).await.is_err(), "the writer's capabilities were revoked first");
        assert!(to(admin.read_file("/f")).await.unwrap().is_empty());
        let q = to(admin.quota(nasd_fs::QuotaOf::User(0))).await.unwrap();
        assert_eq!((q.bytes_used, q.escrow), (used.bytes_used, 0));
        c.stop().await;
    });
}

/// `ABORT_WRITE`: a writer gives its transaction up and the manager rolls
/// it back at once — the file as it was, the quota escrow and the drive
/// space back, the writer's capabilities revoked — without waiting for the
/// lease. Only the writer (or an administrator): another user is refused,
/// another file's transaction is refused, and one already gone is `Done`.
#[test]
fn a_writer_gives_its_transaction_up() {
    run(async {
        let c = Cluster::start(ClusterOptions { config: config(), ..Default::default() }).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let (h, access) = create(&admin, "f").await;
        let (other, _) = create(&admin, "g").await;
        let txn = begin(&admin, h).await.expect("begin");
        let data = pattern(6, 300_000);
        let s = striper(&pool, &access, &[]);
        let written = to(s.write(0, &data, 0)).await.expect("the drives take the bytes");
        to(s.flush(&written.written)).await.expect("flush");
        let abort = |fs: &nasd_fs::FsClient, handle, txn| {
            let req = nasd_proto::manager::ManagerRequest::AbortWrite { handle, txn };
            let fs = fs.clone();
            async move { to(fs.call(&req)).await.map(|_| ()) }
        };
        let user = c.login(USER_A, PW_A).await;
        let theirs = to(user.walk("/f", OpenMode::None)).await.expect("alice may look /f up").handle();
        let refused = abort(&user, theirs, txn).await.expect_err("another user's transaction");
        assert_eq!(refused.status(), Some(FsStatus::NotPermitted), "{refused}");
        let refused = abort(&admin, other, txn).await.expect_err("another file's transaction");
        assert_eq!(refused.status(), Some(FsStatus::InvalidArgument), "{refused}");
        assert_eq!(open_txns(&c, &access).await, vec![Some(txn); 3], "refusals change nothing");
        abort(&admin, h, txn).await.expect("the writer gives it up");
        assert_eq!(open_txns(&c, &access).await, vec![None; 3], "rolled back and ended on every drive");
        assert!(to(s.read(0, 65_536, 65_536)).await.is_err(), "the writer's capabilities were revoked");
        assert!(to(admin.read_file("/f")).await.unwrap().is_empty(), "the file as it was");
        assert_eq!(commit(&admin, h, txn, 1, vec![]).await.unwrap_err().status(), Some(FsStatus::Aborted));
        abort(&admin, h, txn).await.expect("a transaction already gone: Done");
        c.stop().await;
    });
}

/// A rollback that a drive holds up — it stopped, and the manager has not
/// noticed yet — revokes the file's capabilities once, not at every
/// attempt. Every attempt used to bump the access-control version again,
/// and a `BEGIN_WRITE` waiting on the rollback attempts it every 20 ms:
/// readers of the file, which fetch new capabilities once per refusal, got
/// `ACCESS_REVOKED` from the drives that were up faster than they could
/// use them, and failed with `Unavailable` (found by
/// `crates/cli/tests/stripe_faults.rs`, the manager's resync of a
/// component on a drive just killed).
#[test]
fn a_rollback_a_drive_holds_up_revokes_capabilities_once() {
    run(async {
        let mut c = Cluster::start(ClusterOptions { config: config(), drives: 3, ..Default::default() }).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let (h, access) = create(&admin, "f").await;
        let old = pattern(4, 200_000);
        let txn = begin(&admin, h).await.expect("begin");
        let s = striper(&pool, &access, &[]);
        let w = to(s.write(0, &old, 0)).await.expect("write");
        to(s.flush(&w.written)).await.expect("flush");
        commit(&admin, h, txn, old.len() as u64, vec![]).await.expect("commit");

        // A writer begins and dies; the parity component's drive stops (the manager, without
        // heartbeats here, takes it as up: every rollback attempt tries it and fails).
        let dead = begin(&admin, h).await.expect("begin again");
        let first = access.components[0].object;
        let d0 = c.manager.drives().into_iter().find(|d| d.drive == first.drive).expect("drive");
        let acv = || async { to(d0.getattr(first.object)).await.expect("getattr").access_control_version };
        let before = acv().await;
        let parity = access.components[2].object.drive as usize;
        let stopped = c.drives.remove(parity).halt().await;
        tokio::time::sleep(Duration::from_millis(1200)).await; // past the 1 s lease
        for _ in 0..5 {
            to(c.manager.maintain()).await;
        }
        assert_eq!(acv().await, before + 1, "five attempts at the rollback revoked the capabilities once");
        let fresh = to(admin.walk("/f", OpenMode::Read)).await.expect("walk").access.expect("access");
        let (back, _) = to(striper(&pool, &fresh, &[]).read(0, 200_000, 200_000)).await.expect("a fresh reader reads");
        assert!(back == old);

        // The drive comes back: the rollback finishes there, without another revocation.
        c.drives.insert(parity, stopped.start().await);
        to(c.manager.maintain()).await;
        assert_eq!(open_txns(&c, &access).await, vec![None; 3], "rolled back on every drive");
        assert_eq!(acv().await, before + 1);
        let late = commit(&admin, h, dead, 1, vec![]).await.unwrap_err();
        assert_eq!(late.status(), Some(FsStatus::Aborted), "{late}");
        for missing in [None, Some(0), Some(1), Some(2)] {
            let s = striper(&pool, &fresh, &missing.into_iter().collect::<Vec<_>>());
            let (back, _) = to(s.read(0, 200_000, 200_000)).await.expect("read");
            assert!(back == old, "the old content without component {missing:?}");
        }
        c.stop().await;
    });
}

/// The states `/name`'s components are recorded in.
async fn states(fs: &nasd_fs::FsClient, name: &str) -> Vec<ComponentState> {
    let info = to(fs.get_layout(&format!("/{name}"))).await.expect("layout");
    info.components.iter().map(|(c, _)| c.state).collect()
}

/// Issue 22: a transaction that cannot be opened on a component (its drive
/// stopped, the manager not knowing it: no heartbeats here) marks nothing
/// at `BEGIN_WRITE` — the component missed nothing yet. A commit marks it
/// stale because the writer reports it missed the writes; a rollback marks
/// it stale because bytes the writer may have landed there have no undo;
/// no other component is marked either way. Before the fix `BEGIN_WRITE`
/// marked it stale at once.
#[test]
fn a_component_the_transaction_was_not_opened_on_is_stale_only_once_it_may_differ() {
    run(async {
        let mut c = Cluster::start(ClusterOptions { config: config(), drives: 3, ..Default::default() }).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let old = pattern(6, 200_000);
        // f, then g: the first file whose parity is on f's parity's drive (placement may
        // start each file on another drive, by free space).
        let mut files = Vec::new();
        let mut g_name = None;
        let mut f_parity = None;
        for n in 0..32 {
            let name = if n == 0 { "f".to_string() } else { format!("g{n}") };
            let (h, access) = create(&admin, &name).await;
            let parity = access.components[2].object.drive;
            if *f_parity.get_or_insert(parity) != parity {
                continue;
            }
            let txn = begin(&admin, h).await.expect("begin");
            let s = striper(&pool, &access, &[]);
            let w = to(s.write(0, &old, 0)).await.expect("write");
            to(s.flush(&w.written)).await.expect("flush");
            commit(&admin, h, txn, old.len() as u64, vec![]).await.expect("commit");
            files.push((h, access));
            if n > 0 {
                g_name = Some(name);
                break;
            }
        }
        let g_name = g_name.expect("a file placed like f within 32 creates");
        let parity = files[0].1.components[2].object.drive as usize;
        let stopped = c.drives.remove(parity).halt().await;

        // f: begun without its parity, which then misses the write the writer commits.
        let (h, access) = &files[0];
        let txn = begin(&admin, *h).await.expect("begin without the parity's drive");
        assert_eq!(states(&admin, "f").await, vec![ComponentState::Ok; 3], "a failed TXN_BEGIN marks nothing");
        let new = pattern(7, 131_072);
        let s = striper(&pool, access, &[]);
        let w = to(s.write(0, &new, old.len() as u64)).await.expect("a write around the parity");
        let f = to(s.flush(&w.written)).await.expect("flush");
        let missed: Vec<u8> = w.missed.union(&f.missed).map(|&m| m as u8).collect();
        assert_eq!(missed, vec![2], "the parity missed the write");
        commit(&admin, *h, txn, old.len() as u64, missed).await.expect("commit");
        let want = [ComponentState::Ok, ComponentState::Ok, ComponentState::Stale];
        assert_eq!(states(&admin, "f").await, want, "the commit marks what missed the write");

        // g: begun without its parity; the writer writes and dies; the drive is back for the rollback.
        let (h, access) = &files[1];
        let txn = begin(&admin, *h).await.expect("begin without the parity's drive");
        assert_eq!(states(&admin, &g_name).await, vec![ComponentState::Ok; 3], "a failed TXN_BEGIN marks nothing");
        let s = striper(&pool, access, &[]);
        let w = to(s.write(0, &new, old.len() as u64)).await.expect("a write around the parity");
        to(s.flush(&w.written)).await.expect("flush");
        c.drives.insert(parity, stopped.start().await);
        tokio::time::sleep(Duration::from_millis(1200)).await; // past the 1 s lease
                                                               // A pass finishes the rollback once the restarted drive answers it (on a loaded machine
                                                               // the first pass may still find it starting: that rollback waits for the next).
        for _ in 0..50 {
            to(c.manager.maintain()).await;
            if states(&admin, &g_name).await == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(states(&admin, &g_name).await, want, "the rollback marks the component it could not undo");
        assert_eq!(commit(&admin, *h, txn, 1, vec![]).await.unwrap_err().status(), Some(FsStatus::Aborted));
        let fresh = to(admin.walk(&format!("/{g_name}"), OpenMode::Read)).await.expect("walk").access.expect("access");
        let (back, _) = to(striper(&pool, &fresh, &[2]).read(0, 200_000, 200_000)).await.expect("read");
        assert!(back == old, "the data components are rolled back");
        c.stop().await;
    });
}

/// A layout without redundancy: a write transaction that could not be
/// opened on one of the file's components is not begun (`DRIVE_UNAVAILABLE`,
/// naming the drive), since rolling it back could only mark that component
/// stale, and nothing could resync it — the file's committed bytes would be
/// lost to a write that failed (nasd-sim's cluster seeds 3, 5, 11 and 14).
/// Nothing is marked, the file reads as committed once the drive is back,
/// and the next writer begins.
#[test]
fn a_layout_without_redundancy_begins_no_transaction_it_could_not_undo() {
    run(async {
        let config = ManagerConfig { default_layout: Layout::parse("stripe:2@64K").expect("layout"), ..config() };
        let mut c = Cluster::start(ClusterOptions { config, drives: 2, ..Default::default() }).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let (h, access) = create(&admin, "f").await;
        let old = pattern(8, 200_000);
        let txn = begin(&admin, h).await.expect("begin");
        let s = striper(&pool, &access, &[]);
        let w = to(s.write(0, &old, 0)).await.expect("write");
        to(s.flush(&w.written)).await.expect("flush");
        commit(&admin, h, txn, old.len() as u64, vec![]).await.expect("commit");

        let second = access.components[1].object.drive;
        let stopped = c.drives.remove(second as usize).halt().await;
        let refused = begin(&admin, h).await.expect_err("no transaction without the second drive");
        assert_eq!(refused.status(), Some(FsStatus::DriveUnavailable), "{refused}");
        assert!(refused.to_string().contains(&format!("drive {second} ")), "names the drive: {refused}");
        assert_eq!(states(&admin, "f").await, vec![ComponentState::Ok; 2], "nothing marked");
        let first = access.components[0].object;
        let d0 = c.manager.drives().into_iter().find(|d| d.drive == first.drive).expect("drive");
        let open = to(d0.txn_list(first.object - 1, 1)).await.expect("txn list");
        assert!(open.iter().all(|t| t.0 != first.object), "the transaction ended where it was opened: {open:?}");

        c.drives.insert(second as usize, stopped.start().await);
        // The next writer begins (its TXN_BEGIN reaches the restarted drive, which makes its
        // readmission due: no heartbeats here), and a maintenance pass readmits the drive (on a
        // loaded machine perhaps a later one): then the committed bytes read back.
        let (mut began, mut back) = (None, None);
        for _ in 0..50 {
            if began.is_none() {
                began = begin(&admin, h).await.ok();
            }
            to(c.manager.maintain()).await;
            let fresh = to(admin.walk("/f", OpenMode::Read)).await.expect("walk").access.expect("access");
            if let (Some(_), Ok((bytes, _))) = (began, to(striper(&pool, &fresh, &[]).read(0, 200_000, 200_000)).await)
            {
                back = Some(bytes);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(back.expect("the drive back, a writer began and the file reads") == old, "the committed bytes");
        commit(&admin, h, began.expect("began"), old.len() as u64, vec![]).await.expect("commit");
        c.stop().await;
    });
}

/// A transaction of the manager's own (a size change) whose process died
/// is rolled back as soon as the manager is back, not when its lease ends:
/// no client will commit it, and the cut it made on some components is
/// readable, torn, until the rollback (nasd-sim's cluster seed 12: one
/// `rs:2+1` stripe read with its first unit cut to zeros and its second
/// old, right after a killed manager came back). Here the dead size change
/// is recorded under `MANAGER_WRITER_UID` with a lease an hour long and has
/// cut one data component; after the restart every subset of components
/// reads the old bytes. A client's transaction (it may still commit after
/// the restart) is left to its lease.
#[test]
fn a_restarted_manager_rolls_back_its_own_dead_transactions_at_once() {
    run(async {
        let mut c = Cluster::start(ClusterOptions { config: config(), drives: 3, ..Default::default() }).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let pool = Arc::new(DrivePool::new());
        let old = pattern(9, 200_000);
        let mut files = Vec::new();
        for name in ["f", "g"] {
            let (h, access) = create(&admin, name).await;
            let txn = begin(&admin, h).await.expect("begin");
            let w = to(striper(&pool, &access, &[]).write(0, &old, 0)).await.expect("write");
            to(striper(&pool, &access, &[]).flush(&w.written)).await.expect("flush");
            commit(&admin, h, txn, old.len() as u64, vec![]).await.expect("commit");
            files.push((h, access));
        }
        let client_txn = begin(&admin, files[1].0).await.expect("a client's transaction on g");

        // The manager dies in a size change of f that has cut its first component.
        c.halt_manager().await;
        let (h, access) = &files[0];
        let ns = nasd_meta::Namespace::new(
            nasd_meta::Sqlite::open(&c.dir().join("manager").join(nasd_manager::META_DB)).expect("metadata"),
            layout(),
        )
        .expect("namespace");
        let hour = 3_600_000_000_000i64;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
        let dead = ns
            .begin_write_as(&nasd_meta::Caller::ROOT, h.ino, now + hour, nasd_meta::MANAGER_WRITER_UID)
            .expect("the dead size change's intent");
        let first = access.components[0].object;
        let d0 = c.manager.drives().into_iter().find(|d| d.drive == first.drive).expect("drive");
        to(d0.txn_begin(first.object, dead)).await.expect("txn begin");
        to(d0.set_size(first.object, 0)).await.expect("the cut reached one component");
        drop(ns);

        c.resume_manager(config(), false).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let fresh = to(admin.walk("/f", OpenMode::Read)).await.expect("walk").access.expect("access");
        for missing in [None, Some(0), Some(1), Some(2)] {
            let s = striper(&pool, &fresh, &missing.into_iter().collect::<Vec<_>>());
            let (back, _) = to(s.read(0, 200_000, 200_000)).await.expect("read");
            assert!(back == old, "the old content without component {missing:?}");
        }
        assert_eq!(
            commit(&admin, *h, dead, 0, vec![]).await.unwrap_err().status(),
            Some(FsStatus::Aborted),
            "rolled back"
        );
        // The client's transaction outlives the restart: it commits.
        commit(&admin, files[1].0, client_txn, old.len() as u64, vec![])
            .await
            .expect("the client commits after the restart");
        c.stop().await;
    });
}
