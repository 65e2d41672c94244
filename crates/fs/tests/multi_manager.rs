//! Two managers on one PostgreSQL database (a real server the test starts),
//! both serving clients over TLS, on the same four real drives: the
//! database is the only state they share (docs/ARCHITECTURE.md, "Several
//! managers on one database").
//!
//! - `two_managers_share_pools_keys_and_orphan_collection`: clients of
//!   both managers write files and read each other's back while both
//!   managers' maintenance rotates working keys (a short rotation interval)
//!   and a task makes both collect orphans on every drive over and over.
//!   No fresh pool object is taken for an orphan (every object the database
//!   names is on its drive), no manager mints with a key the other retired
//!   (every read succeeds), a real orphan is removed, and both managers end
//!   with the same keys.
//! - `cross_manager_rename_and_link_races_resolve_consistently`: two
//!   clients, one per manager, race renames of one name to two targets,
//!   links of two files to one name, and renames of two files over one
//!   name: each race has one outcome, the same seen through either
//!   manager, and the name space's invariants hold in the database.

mod common;

use common::*;
use nasd_fs::{FsClient, FsStatus};
use nasd_manager::{Location, Manager, ManagerConfig};
use nasd_meta::testing::{check_invariants, PgServer};
use nasd_meta::{Layout, Namespace, Postgres};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Files each scenario writes (half through each manager).
const FILES: usize = 48;
/// Race rounds of each kind.
const ROUNDS: usize = 12;

fn config(url: &str, rotate: bool) -> ManagerConfig {
    ManagerConfig {
        // Small pools: refills (and so lease hand-overs) happen every few creates.
        pool_target: 4,
        // Rotation due every 3 s, capabilities live 2 s: a key is retired two
        // rotations after it was made current, so one minted until a manager
        // learns of a rotation (within a maintenance pass) outlives its capabilities.
        read_lifetime: Duration::from_secs(2),
        write_lifetime: Duration::from_secs(2),
        rotate_interval: if rotate { Duration::from_secs(3) } else { Duration::from_secs(3600) },
        maintenance_interval: Duration::from_millis(200),
        metadata: Some(url.parse::<Location>().expect("a PostgreSQL URL")),
        ..ManagerConfig::default()
    }
}

#[test]
fn two_managers_share_pools_keys_and_orphan_collection() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    run(shared_upkeep(server.fresh_url()));
    drop(server);
}

#[test]
fn cross_manager_rename_and_link_races_resolve_consistently() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    run(races(server.fresh_url()));
    drop(server);
}

/// Outcomes of the orphan-collection task, per manager: (collections run,
/// turned away because the other manager held the drive's lease).
#[derive(Default)]
struct Collections {
    ran: [AtomicUsize; 2],
    busy: [AtomicUsize; 2],
    removed: AtomicUsize,
}

async fn shared_upkeep(url: String) {
    let c =
        Cluster::start(ClusterOptions { config: config(&url, true), maintenance: true, ..Default::default() }).await;
    let m2 = c.start_other_manager("manager-2", config(&url, true), true).await;
    assert_ne!(c.manager.id(), m2.manager.id(), "two managers, two lease holders");
    let managers: [Arc<Manager>; 2] = [c.manager.clone(), m2.manager.clone()];
    let admin = c.login(ADMIN, ADMIN_PW).await;
    to(admin.mkdir("/alice", 0o755)).await.expect("mkdir");
    to(admin.chown("/alice", Some(UID_A), Some(UID_A))).await.expect("chown");
    let clients = [c.login(USER_A, PW_A).await, c.login_at(m2.addr, USER_A, PW_A).await];
    let versions_before: Vec<u32> = c.manager.drives().iter().map(|d| d.keys().current.0).collect();

    // Both managers collect orphans on every drive, over and over, while files are made.
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Collections::default());
    let collector = {
        let (managers, stop, stats) = (managers.clone(), stop.clone(), stats.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                for (i, m) in managers.iter().enumerate() {
                    for d in m.drives() {
                        match m.collect_orphans(&d).await {
                            Ok(n) => {
                                stats.ran[i].fetch_add(1, Ordering::SeqCst);
                                stats.removed.fetch_add(n, Ordering::SeqCst);
                            }
                            Err(f) if f.status == FsStatus::Busy => {
                                stats.busy[i].fetch_add(1, Ordering::SeqCst);
                            }
                            Err(f) => panic!("manager {i} could not collect orphans on drive {}: {f}", d.drive),
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // A real orphan: an object made on a drive and recorded nowhere.
    let d0 = c.manager.drives()[0].clone();
    let orphan = to(d0.create_objects(1)).await.expect("make an orphan")[0];

    // Files written through one manager, read back through the other; rounds
    // go on until both managers' maintenance has rotated keys a few times.
    let mut written: Vec<(String, Vec<u8>)> = Vec::new();
    let mut i = 0;
    loop {
        let (w, r) = (&clients[i % 2], &clients[(i + 1) % 2]);
        let path = format!("/alice/f{i}");
        let data = pattern(i as u64, 1000 + 997 * (i % 7));
        to(w.write_file(&path, &data)).await.unwrap_or_else(|e| panic!("write {path} through manager {}: {e}", i % 2));
        let back = to(r.read_file(&path)).await.unwrap_or_else(|e| panic!("read {path} through the other: {e}"));
        assert!(back == data, "{path} reads back through the other manager");
        written.push((path, data));
        i += 1;
        let rotations: u32 =
            c.manager.drives().iter().zip(&versions_before).map(|(d, v)| d.keys().current.0 - v).min().unwrap_or(0);
        if i >= FILES && rotations >= 3 {
            break;
        }
        assert!(i < 20 * FILES, "no key rotation in {i} rounds: maintenance does not rotate");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    to(collector).await.expect("the collection task");

    // Every file reads back through either manager.
    for (path, data) in &written {
        for (m, client) in clients.iter().enumerate() {
            let back = to(client.read_file(path)).await.unwrap_or_else(|e| panic!("read {path} via manager {m}: {e}"));
            assert!(back == *data, "{path} via manager {m}");
        }
    }
    // Both collected; the orphan is gone; every object the database knows is on its drive.
    for m in 0..2 {
        assert!(stats.ran[m].load(Ordering::SeqCst) > 0, "manager {m} collected orphans");
    }
    eprintln!(
        "collections run {:?}, turned away {:?}, objects removed {}",
        stats.ran.each_ref().map(|a| a.load(Ordering::SeqCst)),
        stats.busy.each_ref().map(|a| a.load(Ordering::SeqCst)),
        stats.removed.load(Ordering::SeqCst)
    );
    let on_d0: BTreeSet<u64> = to(d0.list_objects()).await.expect("list").into_iter().collect();
    assert!(!on_d0.contains(&orphan), "the orphan was collected");
    let ns = Namespace::new(Postgres::open(&url).expect("open the database"), Layout::SINGLE).unwrap();
    check_invariants(&ns);
    for d in c.manager.drives() {
        let on_drive: BTreeSet<u64> = to(d.list_objects()).await.expect("list").into_iter().collect();
        let known = ns.known_objects(d.drive).expect("known objects");
        let missing: Vec<&u64> = known.difference(&on_drive).collect();
        assert!(missing.is_empty(), "drive {}: objects the database names were removed: {missing:?}", d.drive);
        assert!(ns.pool_len(d.drive).unwrap() > 0, "drive {}: pools are refilled", d.drive);
    }
    // One more pass each: both hold the keys the database holds.
    for m in &managers {
        to(m.maintain()).await;
    }
    for (d1, d2) in c.manager.drives().iter().zip(m2.manager.drives()) {
        let (k1, k2) = (d1.keys(), d2.keys());
        assert_eq!((k1.current.0, k1.previous.0), (k2.current.0, k2.previous.0), "drive {}", d1.drive);
        assert_eq!(k1.current.1.expose(), k2.current.1.expose(), "drive {}: one key", d1.drive);
    }
    drop(clients);
    drop(admin);
    m2.stop().await;
    c.stop().await;
}

/// The refusal status of a failed call; `Ok` for success.
fn outcome<T>(r: &Result<T, nasd_fs::FsError>) -> FsStatus {
    match r {
        Ok(_) => FsStatus::Ok,
        Err(e) => e.status().unwrap_or_else(|| panic!("expected a refusal from the manager, got {e}")),
    }
}

async fn names(c: &FsClient, dir: &str) -> Vec<String> {
    to(c.readdir(dir)).await.expect("readdir").into_iter().map(|(n, _)| n).collect()
}

async fn races(url: String) {
    let c =
        Cluster::start(ClusterOptions { config: config(&url, false), maintenance: true, ..Default::default() }).await;
    let m2 = c.start_other_manager("manager-2", config(&url, false), true).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    to(admin.mkdir("/alice", 0o755)).await.expect("mkdir");
    to(admin.chown("/alice", Some(UID_A), Some(UID_A))).await.expect("chown");
    let (a, b) = (c.login(USER_A, PW_A).await, c.login_at(m2.addr, USER_A, PW_A).await);

    for round in 0..ROUNDS {
        let dir = format!("/alice/r{round}");
        let p = |name: &str| format!("{dir}/{name}");
        let [pa, pb, pc, px, py, pz, pt] = ["a", "b", "c", "x", "y", "z", "t"].map(p);
        to(a.mkdir(&dir, 0o755)).await.expect("mkdir");
        let (x, z) = (pattern(2 * round as u64, 3000), pattern(2 * round as u64 + 1, 5000));
        to(a.write_file(&format!("{dir}/a"), &x)).await.expect("write a");

        // One name renamed to two targets at once: exactly one rename happens.
        let (ra, rb) = tokio::join!(a.rename(&pa, &pb), b.rename(&pa, &pc));
        let mut got = [outcome(&ra), outcome(&rb)];
        got.sort_by_key(|s| *s as u8);
        assert_eq!(got, [FsStatus::Ok, FsStatus::NotFound], "round {round}: one rename wins");
        let winner = if ra.is_ok() { "b" } else { "c" };
        for client in [&a, &b] {
            assert_eq!(names(client, &dir).await, [winner], "round {round}: both managers agree");
            assert!(to(client.read_file(&format!("{dir}/{winner}"))).await.unwrap() == x);
        }
        to(a.unlink(&format!("{dir}/{winner}"))).await.expect("unlink");

        // Two files linked to one name at once: exactly one link happens.
        to(a.write_file(&format!("{dir}/x"), &x)).await.expect("write x");
        to(b.write_file(&format!("{dir}/z"), &z)).await.expect("write z");
        let (la, lb) = tokio::join!(a.link(&px, &py), b.link(&pz, &py));
        let mut got = [outcome(&la), outcome(&lb)];
        got.sort_by_key(|s| *s as u8);
        assert_eq!(got, [FsStatus::Ok, FsStatus::Exists], "round {round}: one link wins");
        let (source, data) = if la.is_ok() { ("x", &x) } else { ("z", &z) };
        for client in [&a, &b] {
            assert!(to(client.read_file(&format!("{dir}/y"))).await.unwrap() == *data, "round {round}");
            let st = to(client.stat(&format!("{dir}/{source}"))).await.unwrap();
            assert_eq!(st.attr.nlink, 2, "round {round}: the linked file has two names");
        }
        to(a.unlink(&format!("{dir}/y"))).await.expect("unlink y");

        // Two files renamed over one name at once: both succeed, one after the other.
        let (oa, ob) = tokio::join!(a.rename(&px, &pt), b.rename(&pz, &pt));
        assert_eq!([outcome(&oa), outcome(&ob)], [FsStatus::Ok, FsStatus::Ok], "round {round}: renames over a name");
        for client in [&a, &b] {
            assert_eq!(names(client, &dir).await, ["t"], "round {round}");
        }
        let t = to(a.read_file(&format!("{dir}/t"))).await.unwrap();
        assert!(t == x || t == z, "round {round}: the last rename's file");
        assert!(to(b.read_file(&format!("{dir}/t"))).await.unwrap() == t, "round {round}: the same through both");
    }
    let ns = Namespace::new(Postgres::open(&url).expect("open the database"), Layout::SINGLE).unwrap();
    check_invariants(&ns);
    drop((a, b, admin));
    m2.stop().await;
    c.stop().await;
}
