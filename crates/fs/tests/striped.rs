//! Files over many drives through `nasd_fs::File`, end to end: real drives
//! (security enforced, each on a runtime of its own so a killed drive drops
//! every connection at once) and the real TLS manager on loopback, layouts
//! set on directories with `SET_LAYOUT`.
//!
//! - files on `stripe:4`, `mirror:2`, `rs:2+1` and `rs:4+2` written, closed,
//!   reopened and read back byte-exact: sizes ending mid-unit, mid-stripe and
//!   on boundaries, sparse writes, overwrites in place; every component holds
//!   exactly what the layout says;
//! - close-to-open: a reader sees a writer's data once the writer closed;
//! - a drive killed during a sequential read of a mirrored and of a
//!   Reed-Solomon file: no error, identical bytes;
//! - a drive killed during a sequential write of an `rs:2+1` file: no error,
//!   everything readable after close, the component recorded stale;
//! - more drives down than the layout tolerates: `FsError::Unavailable`
//!   naming them, no data.

mod common;

use common::*;
use nasd_fs::{ComponentState, FsClient, FsConfig, FsError, Layout, OpenMode};
use nasd_proto::manager::FileAccess;
use nasd_stripe::geometry::Geometry;
use std::collections::BTreeSet;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
/// Stripe unit of every layout here: small, so files span many stripes.
const UNIT: u64 = 64 * KIB;

fn layout(text: &str) -> Layout {
    Layout::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// A cluster of `drives` drives whose root directory has layout `root`.
async fn cluster(drives: usize, root: &str) -> Cluster {
    Cluster::start(ClusterOptions { drives, root_layout: Some(layout(root)), ..Default::default() }).await
}

/// A client of the administrator moving `piece` bytes per engine operation.
async fn client(c: &Cluster, piece: u64) -> FsClient {
    let config = FsConfig { transfer_piece: piece as usize, ..c.fs_config(ADMIN, ADMIN_PW) };
    to(FsClient::connect(&config)).await.expect("log in")
}

/// The capabilities (and components) a read open hands out for `path`.
async fn access(fs: &FsClient, path: &str) -> FileAccess {
    to(fs.walk(path, OpenMode::Read)).await.expect("walk").access.expect("read access")
}

/// Writes `data` into a new file at `path` in pieces of `step` bytes (not
/// aligned to anything), then closes it.
async fn write_in_steps(fs: &FsClient, path: &str, data: &[u8], step: usize) {
    let f = to(fs.create(path, 0o644, true, false)).await.unwrap_or_else(|e| panic!("create {path}: {e}"));
    for (i, chunk) in data.chunks(step.max(1)).enumerate() {
        to(f.write_at((i * step) as u64, chunk)).await.unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
    assert_eq!(f.size(), data.len() as u64, "{path}: the writer knows the size it wrote");
    let attr = to(f.close()).await.unwrap_or_else(|e| panic!("close {path}: {e}"));
    assert_eq!(attr.size, data.len() as u64, "{path}: the size the commit recorded");
}

/// Reads `path` whole through a new open of `fs`, and a few ranges across
/// unit and stripe boundaries and past the end, and compares with `want`.
async fn check_reads(fs: &FsClient, path: &str, want: &[u8], stripe: u64) {
    let got = to(fs.read_file(path)).await.unwrap_or_else(|e| panic!("read {path}: {e}"));
    assert!(got == want, "{path}: {} bytes read back differ from the {} expected", got.len(), want.len());
    assert_eq!(to(fs.stat(path)).await.expect("stat").attr.size, want.len() as u64, "{path}: stat");
    let f = to(fs.open(path, false)).await.expect("open");
    let len = want.len() as u64;
    for (at, n) in
        [(UNIT - 10, 20), (stripe - 5, 10), (stripe + UNIT / 2, UNIT), (len.saturating_sub(7), 100), (len, 5)]
    {
        let got = to(f.read_at(at, n)).await.unwrap_or_else(|e| panic!("{path}: read {at}+{n}: {e}"));
        let (a, b) = (at.min(len) as usize, (at + n).min(len) as usize);
        assert!(got == want[a..b], "{path}: read {at}+{n} differs");
    }
}

/// Checks that every component object of `path` holds exactly what the
/// layout gives it for the file's size (`Geometry::component_len`).
async fn check_component_lengths(c: &Cluster, fs: &FsClient, path: &str, size: u64) {
    let a = access(fs, path).await;
    let g = Geometry::new(a.layout).expect("geometry");
    for (j, comp) in a.components.iter().enumerate() {
        let d = c.manager.drives().into_iter().find(|d| d.drive == comp.object.drive).expect("the drive");
        let held = to(d.getattr(comp.object.object)).await.expect("getattr of a component").logical_size;
        assert_eq!(held, g.component_len(size, j), "{path} ({}): component {j} holds {held} bytes", a.layout);
    }
}

#[test]
fn files_of_every_layout_read_back_byte_exact() {
    run(async {
        let c = cluster(6, "stripe:1@64K").await;
        let fs = client(&c, 1536 * KIB).await;
        let reader = client(&c, 256 * KIB).await;
        for (i, text) in ["stripe:4@64K", "mirror:2@64K", "rs:2+1@64K", "rs:4+2@64K"].into_iter().enumerate() {
            let l = layout(text);
            let dir = format!("/d{i}");
            to(fs.mkdir(&dir, 0o755)).await.expect("mkdir");
            to(fs.set_layout(&dir, Some(l))).await.expect("set the directory's layout");
            let sb = l.stripe_bytes();
            // Sizes ending mid-unit, on a unit, mid-stripe, on a stripe, and spanning batches.
            let sizes = [0, 1, UNIT - 1, UNIT, UNIT + 1, sb - 1, sb, sb + 1, 3 * sb + UNIT / 2 + 7, 20 * MIB + 12_345];
            for (k, &size) in sizes.iter().enumerate() {
                let path = format!("{dir}/f{k}");
                let data = pattern(100 * i as u64 + k as u64, size as usize);
                write_in_steps(&fs, &path, &data, 100_000).await;
                assert_eq!(access(&fs, &path).await.layout, l, "{path}: the directory's layout");
                check_reads(&reader, &path, &data, sb).await;
                check_component_lengths(&c, &fs, &path, size).await;
            }

            // Sparse: a write past the end leaves a hole of zeros; then the start is written.
            let path = format!("{dir}/sparse");
            let f = to(fs.create(&path, 0o644, true, false)).await.expect("create");
            let (far, tail) = (2 * sb + 100, pattern(7, 5000));
            to(f.write_at(far, &tail)).await.expect("write past the end");
            to(f.write_at(0, b"head")).await.expect("write the start");
            to(f.close()).await.expect("close");
            let mut want = vec![0u8; (far as usize) + tail.len()];
            want[..4].copy_from_slice(b"head");
            want[far as usize..].copy_from_slice(&tail);
            check_reads(&reader, &path, &want, sb).await;

            // Overwrites in place, in a new transaction: across a unit boundary inside a stripe (a
            // read-modify-write for Reed-Solomon), across a stripe boundary, and past the end.
            let path = format!("{dir}/f8");
            let mut want = pattern(100 * i as u64 + 8, sizes[8] as usize);
            let f = to(fs.open(&path, true)).await.expect("open for writing");
            for (at, n) in [(UNIT - 3, 10), (sb - 2, 4), (want.len() as u64 - 1, 3)] {
                let bytes = pattern(at, n);
                to(f.write_at(at, &bytes)).await.expect("overwrite");
                let end = at as usize + n;
                if end > want.len() {
                    want.resize(end, 0);
                }
                want[at as usize..end].copy_from_slice(&bytes);
            }
            assert_eq!(to(f.close()).await.expect("close").size, want.len() as u64);
            check_reads(&reader, &path, &want, sb).await;
            check_component_lengths(&c, &fs, &path, want.len() as u64).await;
        }
        drop((fs, reader));
        c.stop().await;
    });
}

#[test]
fn a_reader_sees_a_writers_data_after_the_writer_closes() {
    run(async {
        let c = cluster(4, "rs:2+1@64K").await;
        let writer = client(&c, 256 * KIB).await;
        let reader = client(&c, 256 * KIB).await;
        let v1 = pattern(1, (3 * UNIT + 5) as usize);
        write_in_steps(&writer, "/f", &v1, 65_000).await;

        // The writer writes more, and has not closed: a new open sees the committed file only.
        let w = to(writer.open("/f", true)).await.expect("open for writing");
        let v2 = pattern(2, (9 * UNIT + 11) as usize);
        to(w.write_at(0, &v2)).await.expect("write");
        let early = to(reader.open("/f", false)).await.expect("open");
        assert_eq!(early.size(), v1.len() as u64, "an open before the writer's close knows the committed size");
        assert_eq!(to(reader.stat("/f")).await.unwrap().attr.size, v1.len() as u64);

        // After the writer's close, an open sees every byte it wrote.
        assert_eq!(to(w.close()).await.expect("close").size, v2.len() as u64);
        let late = to(reader.open("/f", false)).await.expect("open again");
        assert_eq!(late.size(), v2.len() as u64);
        let got = to(late.read_at(0, v2.len() as u64)).await.expect("read");
        assert!(got == v2, "the reader sees the writer's data after its close");
        // The earlier open still reads no further than the size it knows (close-to-open).
        let got = to(early.read_at(0, v2.len() as u64)).await.expect("read through the earlier open");
        assert_eq!(got.len(), v1.len());
        drop((writer, reader, early, late));
        c.stop().await;
    });
}

/// The index in `c.drives` of the drive at `addr`, and the manager's number for it.
fn drive_at(c: &Cluster, addr: &str) -> (usize, u32) {
    let i = c.drives.iter().position(|d| d.addr.to_string() == addr).expect("a test drive at the address");
    let n = c.manager.drives().into_iter().find(|d| d.addr == addr).expect("the manager knows the drive").drive;
    (i, n)
}

/// Reads a file of `len` bytes sequentially in `piece`-byte reads through
/// one open, killing the drive of component `victim` after the first read.
async fn read_killing(c: &mut Cluster, fs: &FsClient, path: &str, len: u64, piece: u64, victim: usize) -> Vec<u8> {
    let a = access(fs, path).await;
    let f = to(fs.open(path, false)).await.expect("open");
    let mut got = to(f.read_at(0, piece)).await.expect("the first read");
    let (i, _) = drive_at(c, &a.components[victim].drive_addr);
    c.drives[i].kill();
    while (got.len() as u64) < len {
        let more = to(f.read_at(got.len() as u64, piece)).await.expect("a read with a drive killed under it");
        assert!(!more.is_empty(), "a read stopped short at {}", got.len());
        got.extend_from_slice(&more);
    }
    got
}

#[test]
fn a_drive_killed_during_a_sequential_read_of_a_mirrored_file_changes_nothing() {
    run(async {
        let mut c = cluster(3, "mirror:2@64K").await;
        let fs = client(&c, 512 * KIB).await;
        // Larger than the read-ahead window, so reads after the kill still go to the drives.
        let data = pattern(3, (24 * MIB + 777) as usize);
        write_in_steps(&fs, "/m", &data, 1_000_000).await;
        let got = read_killing(&mut c, &fs, "/m", data.len() as u64, 512 * KIB, 0).await;
        assert!(got == data, "the bytes read around the killed copy are the file's");
        drop(fs);
        c.stop().await;
    });
}

#[test]
fn a_drive_killed_during_a_sequential_read_of_a_reed_solomon_file_changes_nothing() {
    run(async {
        let mut c = cluster(4, "rs:2+1@64K").await;
        let fs = client(&c, 512 * KIB).await;
        let data = pattern(4, (24 * MIB + 333) as usize);
        write_in_steps(&fs, "/r", &data, 1_000_000).await;
        // A data column's drive: its bytes must be decoded from the other column and the parity.
        let got = read_killing(&mut c, &fs, "/r", data.len() as u64, 512 * KIB, 1).await;
        assert!(got == data, "the bytes decoded around the killed drive are the file's");
        drop(fs);
        c.stop().await;
    });
}

#[test]
fn a_drive_killed_during_a_sequential_write_of_an_rs_2_1_file_misses_only_its_component() {
    run(async {
        let mut c = cluster(4, "rs:2+1@64K").await;
        let fs = client(&c, 256 * KIB).await;
        let data = pattern(5, (16 * MIB + 4321) as usize);
        let f = to(fs.create("/w", 0o644, true, false)).await.expect("create");
        let a = access(&fs, "/w").await;
        let step = 256 * KIB as usize;
        for (k, chunk) in data.chunks(step).enumerate() {
            if k == 16 {
                // 4 MiB in: the drive of data column 1 dies.
                let (i, _) = drive_at(&c, &a.components[1].drive_addr);
                c.drives[i].kill();
            }
            to(f.write_at((k * step) as u64, chunk)).await.expect("a write with a drive killed under it");
        }
        assert_eq!(to(f.close()).await.expect("close with a drive down").size, data.len() as u64);

        // The manager recorded the component that missed writes as stale, and only it.
        let info = to(fs.get_layout("/w")).await.expect("layout");
        let states: Vec<ComponentState> = info.components.iter().map(|(comp, _)| comp.state).collect();
        assert_eq!(states, [ComponentState::Ok, ComponentState::Stale, ComponentState::Ok], "{info:?}");
        // Everything written reads back, through a new client.
        let other = client(&c, 1536 * KIB).await;
        let got = to(other.read_file("/w")).await.expect("read with the drive down");
        assert!(got == data, "everything written is readable after close");
        drop((fs, other));
        c.stop().await;
    });
}

#[test]
fn more_drives_down_than_a_layout_tolerates_is_unavailable_naming_them() {
    run(async {
        let mut c = cluster(5, "rs:2+1@64K").await;
        let fs = client(&c, 256 * KIB).await;
        let data = pattern(6, (MIB + 99) as usize);
        write_in_steps(&fs, "/r", &data, 300_000).await;
        to(fs.mkdir("/s", 0o755)).await.unwrap();
        to(fs.set_layout("/s", Some(layout("stripe:4@64K")))).await.unwrap();
        write_in_steps(&fs, "/s/f", &data, 300_000).await;

        // rs:2+1 tolerates one: kill two of its three drives.
        let a = access(&fs, "/r").await;
        let mut killed = BTreeSet::new();
        for comp in &a.components[..2] {
            let (i, n) = drive_at(&c, &comp.drive_addr);
            c.drives[i].kill();
            killed.insert(n);
        }
        let reader = client(&c, 256 * KIB).await;
        let mut dst = Vec::new();
        let f = to(reader.open("/r", false)).await.expect("open");
        let e = to(f.read_to(0, data.len() as u64, &mut dst)).await.expect_err("two of three components are down");
        let FsError::Unavailable { missing_drives, tolerates, message, .. } = &e else { panic!("{e:?}") };
        assert_eq!(missing_drives.iter().copied().collect::<BTreeSet<u32>>(), killed, "{message}");
        assert_eq!(*tolerates, 1);
        assert_eq!(e.errno(), 5, "EIO");
        for n in &killed {
            assert!(message.contains(&format!("drive {n} (")), "the message names drive {n}: {message}");
        }
        assert!(message.contains("nasd status") && message.contains("/r"), "{message}");
        assert!(data.starts_with(&dst), "nothing but the file's own bytes reached the destination");

        // stripe:4 tolerates none: a file on a killed drive is unavailable too (unless it avoided them).
        let s = access(&fs, "/s/f").await;
        let lost: BTreeSet<u32> = s.components.iter().map(|c| c.object.drive).filter(|d| killed.contains(d)).collect();
        assert!(!lost.is_empty(), "four of five drives: the file uses a killed one");
        let e = to(reader.read_file("/s/f")).await.expect_err("a stripe with a column down");
        let FsError::Unavailable { missing_drives, tolerates: 0, .. } = &e else { panic!("{e:?}") };
        assert_eq!(missing_drives.iter().copied().collect::<BTreeSet<u32>>(), lost, "{e}");
        drop((fs, reader));
        c.stop().await;
    });
}
