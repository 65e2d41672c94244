//! Small files (issue 14 item 4), end to end on a real cluster: a manager
//! whose `small_file_threshold` is `T` keeps every new file's bytes below `T`
//! in its metadata store and the rest striped over drives. Reads and writes
//! below, around and above `T`, truncation across it and sparse files read
//! back exactly as a byte model says, through one open file, a reopen and a
//! second client; the components hold nothing below `T`; files made before
//! the threshold was set keep every byte on their drives. On SQLite and on a
//! real PostgreSQL server.

mod common;

use common::*;
use nasd_client::{Auth, Credential, DriveClient, MacAlgorithm};
use nasd_crypto::Key;
use nasd_fs::OpenMode;
use nasd_manager::ManagerConfig;
use nasd_meta::testing::PgServer;
use nasd_meta::Location;
use nasd_proto::layout::Layout;
use nasd_proto::manager::FileAccess;
use nasd_proto::{Protection, Region};

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
