//! Small files (issue 14 item 4), end to end on a real cluster: a manager
//! whose `small_file_threshold` is `T` keeps every new file's bytes below `T`
//! in its metadata store and the rest striped over drives. Reads and writes
//! below, around and above `T`, truncation across it and sparse files read
//! back exactly as a byte model says, through one open file, a reopen and a
//! second client; the components hold nothing below `T`; files made before
//! the threshold was set keep every byte on their drives. On SQLite and on a
//! real PostgreSQL server; there also with two managers on one database,
//! where a small write takes the file's inode lease in the database.

mod common;

use common::*;
use nasd_client::{Auth, Credential, DriveClient, MacAlgorithm};
use nasd_crypto::Key;
use nasd_fs::OpenMode;
use nasd_manager::ManagerConfig;
use nasd_meta::testing::{check_invariants, PgServer};
use nasd_meta::{Location, Namespace, Postgres};
use nasd_proto::layout::Layout;
use nasd_proto::manager::FileAccess;
use nasd_proto::{Protection, Region};
use std::sync::Arc;
use std::time::Duration;

/// The threshold under test: not a multiple of the stripe unit, so the
/// split falls inside a stripe unit.
const T: u64 = 10_000;

#[test]
fn small_files_cross_the_threshold_on_sqlite() {
    run(scenario(None));
}

#[test]
fn small_files_cross_the_threshold_on_postgres() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = server.fresh_url();
    run(scenario(Some(url.parse::<Location>().expect("a PostgreSQL URL"))));
    run(two_managers(server.fresh_url()));
    drop(server);
}

/// A file's bytes as they should read, and the open file under test.
struct Model {
    bytes: Vec<u8>,
}

impl Model {
    fn write(&mut self, offset: u64, data: &[u8]) {
        let end = offset as usize + data.len();
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        self.bytes[offset as usize..end].copy_from_slice(data);
    }
    fn truncate(&mut self, size: u64) {
        self.bytes.resize(size as usize, 0);
    }
}

async fn check_reads(f: &nasd_fs::File, model: &Model, what: &str) {
    let size = model.bytes.len() as u64;
    assert_eq!(f.size(), size, "{what}: size");
    let whole = to(f.read_at(0, size + 100)).await.unwrap_or_else(|e| panic!("{what}: read: {e}"));
    assert!(whole == model.bytes, "{what}: the whole file reads back as written");
    // Ranges below, around and above the threshold, and past the end.
    for (offset, len) in [(0, 10), (T - 7, 14), (T - 1, 1), (T, 1), (T + 1, 4097), (1, T + 9000), (size, 10)] {
        if offset > size {
            continue;
        }
        let got = to(f.read_at(offset, len)).await.unwrap_or_else(|e| panic!("{what}: read {offset}+{len}: {e}"));
        let end = (offset + len).min(size) as usize;
        assert!(got == model.bytes[offset as usize..end], "{what}: read {offset}+{len}");
    }
}

async fn scenario(metadata: Option<Location>) {
    let config = ManagerConfig { pool_target: 8, small_file_threshold: T as u32, metadata, ..ManagerConfig::default() };
    let c = Cluster::start(ClusterOptions { config, ..Default::default() }).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    to(admin.mkdir("/a", 0o777)).await.expect("mkdir");
    to(admin.set_layout("/a", Some(Layout::parse("rs:2+1@4K").unwrap()))).await.expect("layout");
    let a = c.login(USER_A, PW_A).await;

    // --- one open file: writes below, around and above the threshold, sparse
    let f = to(a.create("/a/f", 0o644, true, false)).await.expect("create");
    let mut model = Model { bytes: Vec::new() };
    let steps: Vec<(u64, Vec<u8>)> = vec![
        (0, pattern(1, 100)),              // below
        (T - 50, pattern(2, 100)),         // across
        (T, pattern(3, 10)),               // at
        (3 * T + 123, pattern(4, 5000)),   // above, leaving a hole
        (500, pattern(5, 2 * T as usize)), // from below to well above
        (T - 1, pattern(6, 1)),            // the last small byte
    ];
    for (i, (offset, data)) in steps.iter().enumerate() {
        to(f.write_at(*offset, data)).await.unwrap_or_else(|e| panic!("write {i}: {e}"));
        model.write(*offset, data);
        check_reads(&f, &model, &format!("after write {i}, before flush")).await;
    }
    to(f.flush()).await.expect("flush");
    check_reads(&f, &model, "after flush").await;
    let attr = to(f.close()).await.expect("close");
    assert_eq!(attr.size, model.bytes.len() as u64);

    // --- reopened, and by another client
    let f = to(a.open("/a/f", true)).await.expect("reopen");
    check_reads(&f, &model, "reopened").await;
    let b = c.login(USER_B, PW_B).await;
    assert!(to(b.read_file("/a/f")).await.expect("B reads") == model.bytes, "another client reads the same bytes");

    // --- truncate across the threshold, then grow again: the cut bytes read as zeros
    for (i, size) in [3 * T, T + 10, T - 30, 0].into_iter().enumerate() {
        let attr = to(a.truncate("/a/f", size)).await.expect("truncate");
        assert!(to(f.adopt_attr(attr)).await);
        model.truncate(size);
        check_reads(&f, &model, &format!("after truncate {i} to {size}")).await;
        let (offset, data) = (size + 7, pattern(10 + i as u64, (T / 2) as usize));
        to(f.write_at(offset, &data)).await.expect("write after truncate");
        model.write(offset, &data);
        to(f.flush()).await.expect("flush after truncate");
        check_reads(&f, &model, &format!("after truncate {i} and a write past it")).await;
    }
    let grown = to(a.truncate("/a/f", 4 * T)).await.expect("extend");
    assert!(to(f.adopt_attr(grown)).await);
    model.truncate(4 * T);
    check_reads(&f, &model, "extended by truncate").await;
    to(f.close()).await.expect("close");
    assert!(to(a.read_file("/a/f")).await.unwrap() == model.bytes, "read_file after all");

    // --- where the bytes are: a single-component file's object holds nothing below T
    to(admin.mkdir("/s", 0o777)).await.expect("mkdir");
    to(admin.set_layout("/s", Some(Layout::SINGLE))).await.expect("layout");
    let data = pattern(20, (T + 3000) as usize);
    to(a.write_file("/s/one", &data)).await.expect("write /s/one");
    let e = to(a.walk("/s/one", OpenMode::Read)).await.expect("walk");
    let access = e.access.expect("read capability");
    assert_eq!(access.small_threshold as u64, T, "the open says the file's threshold");
    let raw = read_component(&access, T + 3000).await;
    assert!(raw[..T as usize].iter().all(|&x| x == 0), "no byte below the threshold on the drive");
    assert!(raw[T as usize..] == data[T as usize..], "the bytes past it are on the drive");
    assert!(to(a.read_file("/s/one")).await.unwrap() == data);

    // --- a 4 KiB file lives wholly on the small-file path; unlink takes its bytes
    to(a.write_file("/a/tiny", &pattern(30, 4096))).await.expect("tiny");
    assert!(to(b.read_file("/a/tiny")).await.unwrap() == pattern(30, 4096));
    to(a.unlink("/a/tiny")).await.expect("unlink");
    to(a.write_file("/a/tiny", b"new")).await.expect("tiny again");
    assert_eq!(to(a.read_file("/a/tiny")).await.unwrap(), b"new", "a new file of the same name starts empty");
    c.stop().await;
}

/// Reads component 0 of a single-component file straight from its drive.
async fn read_component(access: &FileAccess, len: u64) -> Vec<u8> {
    assert_eq!(access.components.len(), 1, "a single-component file");
    let c = &access.components[0];
    let mut d = to(DriveClient::connect(c.drive_addr.as_str())).await.expect("connect to the drive");
    let algorithm = MacAlgorithm::from_id(access.algorithm).expect("known algorithm");
    let credential = Credential::Capability { token: c.token.clone(), key: Key::from_bytes(c.key), algorithm };
    let min = Protection::from_bits(access.min_protection).expect("known protection bits");
    d.set_auth(Auth::new(credential, min.union(Protection::INTEGRITY_ARGS)));
    let (_, mut data) =
        to(d.read(c.object.partition, c.object.object, &[Region { offset: 0, length: len }])).await.expect("read");
    data.resize(len as usize, 0);
    data
}

/// Two managers on one PostgreSQL database. While another manager holds a
/// file's inode lease in the database (as it does through a `SETATTR`, a
/// truncating `CREATE` or a small write of the file), a small write sent
/// through this manager does not land: it waits for the lease, and lands
/// once the lease is released. Small writes of one file through both
/// managers, racing, take turns: the head reads as one writer's whole
/// write, and then as the other's once both are done.
async fn two_managers(url: String) {
    let config = ManagerConfig {
        pool_target: 8,
        small_file_threshold: T as u32,
        metadata: Some(url.parse::<Location>().expect("a PostgreSQL URL")),
        ..ManagerConfig::default()
    };
    let c = Cluster::start(ClusterOptions { config: config.clone(), ..Default::default() }).await;
    let m2 = c.start_other_manager("manager-2", config, false).await;
    let admin = c.login(ADMIN, ADMIN_PW).await;
    to(admin.mkdir("/a", 0o777)).await.expect("mkdir");
    let a1 = c.login(USER_A, PW_A).await;
    let a2 = c.login_at(m2.addr, USER_A, PW_A).await;
    let old = pattern(40, 100);
    to(a1.write_file("/a/f", &old)).await.expect("write through manager 1");
    let ino = to(a1.stat("/a/f")).await.expect("stat").attr.ino;

    // Another manager's hold on the inode, taken straight in the database.
    let ns = {
        let url = url.clone();
        Arc::new(
            tokio::task::spawn_blocking(move || {
                Namespace::new(Postgres::open(&url).expect("open the database"), Layout::SINGLE).unwrap()
            })
            .await
            .unwrap(),
        )
    };
    let held = {
        let ns = ns.clone();
        tokio::task::spawn_blocking(move || {
            ns.acquire_lease(&format!("inode/{ino}"), "another-manager", Duration::from_secs(60)).unwrap()
        })
        .await
        .unwrap()
        .expect("the inode's lease is free")
    };
    let new = pattern(41, 100);
    let f = to(a2.open("/a/f", true)).await.expect("open through manager 2");
    let write = {
        let new = new.clone();
        tokio::spawn(async move {
            f.write_at(0, &new).await?;
            f.close().await
        })
    };
    // Given time to land, it has not: the lease holds it off.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!write.is_finished(), "a small write landed while another manager held the file's lease");
    assert_eq!(to(a1.read_file("/a/f")).await.unwrap(), old, "the head is unchanged while the lease is held");
    let released = tokio::task::spawn_blocking(move || ns.release_lease(&held).unwrap()).await.unwrap();
    assert!(released, "the lease was still held when released");
    to(write).await.unwrap().expect("the small write lands once the lease is free");
    assert_eq!(to(a1.read_file("/a/f")).await.unwrap(), new, "manager 1 reads what went through manager 2");

    // Racing whole-head writes through both managers: never a mix.
    let heads = [pattern(50, T as usize), pattern(51, T as usize)];
    for round in 0..8 {
        let tasks: Vec<_> = [&a1, &a2]
            .into_iter()
            .zip(heads.iter().cloned())
            .map(|(client, head)| {
                let client = client.clone();
                tokio::spawn(async move {
                    let f = client.open("/a/f", true).await?;
                    f.write_at(0, &head).await?;
                    f.close().await
                })
            })
            .collect();
        for t in tasks {
            to(t).await.unwrap().unwrap_or_else(|e| panic!("round {round}: a racing small write: {e}"));
        }
        let got = to(a1.read_file("/a/f")).await.unwrap();
        assert!(got == heads[0] || got == heads[1], "round {round}: the head mixes the two writers' bytes");
        assert_eq!(to(a2.read_file("/a/f")).await.unwrap(), got, "round {round}: both managers read the same");
    }
    let url2 = url.clone();
    tokio::task::spawn_blocking(move || {
        check_invariants(&Namespace::new(Postgres::open(&url2).expect("open"), Layout::SINGLE).unwrap())
    })
    .await
    .unwrap();
    drop(m2);
    c.stop().await;
}
