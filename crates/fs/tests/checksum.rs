//! File checksums from the digests the drives stored (`DIGESTS`,
//! `nasd_fs::File::checksum`) on a real cluster: equal for equal bytes
//! however they were written (one write; seeded pieces in a seeded order,
//! zeros left as holes) under one layout, different after a one-byte change
//! or one more byte, refused to a user who may not read the file — and no
//! drive reads the data for them: their audit trails show `DIGESTS`
//! requests and no `READ`. Bytes below a small-file threshold come from the
//! manager. `NASD_SEED=N` replays a run.

mod common;

use common::seeded::{seed, Rng};
use common::*;
use nasd_client::DriveClient;
use nasd_fs::{FsClient, FsError, FsStatus, Layout};
use nasd_proto::opcode;
use std::time::Duration;

/// Audit records asked for per `READ_AUDIT` (the drive's limit).
const AUDIT_PAGE: u16 = 512;

/// Every drive's audit records after `after`, as (sequence, opcode), per drive.
async fn audit_after(c: &Cluster, after: &[u64]) -> Vec<Vec<(u64, u16)>> {
    let mut out = Vec::new();
    for (i, d) in c.manager.drives().iter().enumerate() {
        let key = d.keys().drive;
        let mut client = to(DriveClient::connect(d.addr.as_str())).await.expect("connect to a drive");
        let mut seen = Vec::new();
        let mut from = after.get(i).copied().unwrap_or(0);
        // Up to a short page: every READ_AUDIT is audited itself, so the trail never ends
        // for a reader who waits for an empty page.
        loop {
            let page = to(client.read_audit(&key, from, AUDIT_PAGE)).await.expect("read the audit trail");
            seen.extend(page.iter().map(|r| (r.sequence, r.opcode)));
            match page.last() {
                Some(last) if page.len() == AUDIT_PAGE as usize => from = last.sequence,
                _ => break,
            }
        }
        out.push(seen);
    }
    out
}

/// The last audit sequence of every drive.
async fn audit_marks(c: &Cluster) -> Vec<u64> {
    audit_after(c, &[]).await.iter().map(|records| records.last().map_or(0, |r| r.0)).collect()
}

/// Waits until the drives audited `DIGESTS` requests after `marks` (a drive
/// audits a request once its reply is sent), then returns whether any of
/// them audited a `READ` after `marks`.
async fn drives_read_since(c: &Cluster, marks: &[u64]) -> bool {
    for _ in 0..200 {
        let records: Vec<(u64, u16)> = audit_after(c, marks).await.into_iter().flatten().collect();
        if records.iter().any(|r| r.1 == opcode::DIGESTS) {
            return records.iter().any(|r| r.1 == opcode::READ);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no drive audited a DIGESTS request");
}

/// Writes `data` to a new file `path` in seeded pieces in a seeded order,
/// skipping the runs of zeros (left as holes).
async fn write_in_pieces(fs: &FsClient, path: &str, data: &[u8], rng: &mut Rng) {
    let f = to(fs.create(path, 0o644, true, false)).await.expect("create");
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let len = (1 + rng.below(200_000) as usize).min(data.len() - at);
        pieces.push(at..at + len);
        at += len;
    }
    for i in (1..pieces.len()).rev() {
        pieces.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for p in pieces {
        if data[p.clone()].iter().any(|&b| b != 0) {
            to(f.write_at(p.start as u64, &data[p])).await.expect("write a piece");
        }
    }
    if data.last() == Some(&0) {
        // The size: its last byte, a zero, written alone.
        to(f.write_at(data.len() as u64 - 1, &[0])).await.expect("write the last byte");
    }
    to(f.flush()).await.expect("flush");
    to(f.close()).await.expect("close");
}

fn refusal<T: std::fmt::Debug>(r: Result<T, FsError>) -> FsStatus {
    r.expect_err("refused").status().expect("a refusal from the manager")
}

/// One layout: equal bytes written two ways, a one-byte change, one more
/// byte, a user without read access, and no data read at the drives.
async fn check_layout(c: &Cluster, layout: &str, rng: &mut Rng) {
    let admin = c.login(ADMIN, ADMIN_PW).await;
    let len = 300_000 + rng.below(900_000) as usize;
    let mut data = pattern(rng.next(), len);
    // A run of zeros across whole blocks: a hole in one file, zeros written in the other.
    let zeros = rng.below(len as u64 / 2) as usize;
    data[zeros..zeros + 200_000.min(len - zeros)].fill(0);
    eprintln!("{layout}: {len} bytes, zeros from {zeros}");

    to(admin.write_file("/one-write", &data)).await.expect("write in one go");
    write_in_pieces(&admin, "/pieces", &data, rng).await;
    let mut changed = data.clone();
    let at = rng.below(len as u64) as usize;
    changed[at] ^= 1 + rng.below(255) as u8;
    to(admin.write_file("/one-byte-changed", &changed)).await.expect("write the changed copy");
    let mut longer = data.clone();
    longer.push(0);
    to(admin.write_file("/one-more-byte", &longer)).await.expect("write the longer copy");
    to(admin.write_file("/private", &data)).await.expect("write the private copy");
    to(admin.chmod("/private", 0o600)).await.expect("chmod");
    assert_eq!(to(admin.read_file("/pieces")).await.unwrap(), data, "{layout}: the pieces read back");

    // Warm up (the earlier requests' audit records land first), then mark the trails. The
    // check sees reads where there were some: the read of /pieces above.
    to(admin.checksum("/one-write")).await.expect("checksum");
    assert!(drives_read_since(c, &vec![0; c.drives.len()]).await, "{layout}: the read of /pieces is audited");
    let marks = audit_marks(c).await;

    let one = to(admin.checksum("/one-write")).await.expect("checksum of /one-write");
    let pieces = to(admin.checksum("/pieces")).await.expect("checksum of /pieces");
    let byte = to(admin.checksum("/one-byte-changed")).await.expect("checksum of /one-byte-changed");
    let more = to(admin.checksum("/one-more-byte")).await.expect("checksum of /one-more-byte");
    let private = to(admin.checksum("/private")).await.expect("checksum of /private by its owner");
    assert_eq!(one, pieces, "{layout}: equal bytes written otherwise");
    assert_eq!(one, private, "{layout}: equal bytes");
    assert_ne!(one, byte, "{layout}: byte {at} changed");
    assert_ne!(one, more, "{layout}: one more (zero) byte");
    assert!(!drives_read_since(c, &marks).await, "{layout}: a drive read data for a checksum");

    let bob = c.login(USER_B, PW_B).await;
    assert_eq!(refusal(to(bob.checksum("/private")).await), FsStatus::PermissionDenied, "{layout}: no read access");
    assert_eq!(to(bob.checksum("/one-write")).await.expect("readable by all"), one, "{layout}: another reader");
    for path in ["/one-write", "/pieces", "/one-byte-changed", "/one-more-byte", "/private"] {
        to(admin.unlink(path)).await.expect("unlink");
    }
}

#[test]
fn checksums_follow_the_bytes_and_read_no_data() {
    let seed = seed("checksums");
    for (i, text) in ["rs:2+1@64K", "mirror:2@64K", "stripe:3@64K"].into_iter().enumerate() {
        run(async move {
            let layout = Layout::parse(text).unwrap();
            let c = Cluster::start(ClusterOptions { drives: 4, root_layout: Some(layout), ..Default::default() }).await;
            let mut rng = Rng(seed.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1);
            check_layout(&c, text, &mut rng).await;
            c.stop().await;
        });
    }
}

/// Under a small-file threshold the head comes from the manager (hashed by
/// the client), the rest from the drives' digests: a change in either part
/// changes the checksum, and a file wholly below the threshold needs no drive.
#[test]
fn checksums_cover_the_bytes_the_manager_keeps() {
    let seed = seed("checksums");
    run(async move {
        let mut opts = ClusterOptions { drives: 3, ..Default::default() };
        opts.config.small_file_threshold = 10_000;
        let c = Cluster::start(opts).await;
        let admin = c.login(ADMIN, ADMIN_PW).await;
        let mut rng = Rng(seed);
        let data = pattern(rng.next(), 150_000);
        let sum = |path: &'static str| {
            let admin = &admin;
            async move { to(admin.checksum(path)).await.expect("checksum") }
        };
        for (path, bytes) in [("/a", data.clone()), ("/b", data.clone())] {
            to(admin.write_file(path, &bytes)).await.unwrap();
        }
        assert_eq!(sum("/a").await, sum("/b").await, "equal bytes");
        for at in [rng.below(10_000) as usize, 10_000 + rng.below(140_000) as usize] {
            let mut changed = data.clone();
            changed[at] ^= 0x80;
            to(admin.write_file("/b", &changed)).await.unwrap();
            assert_ne!(sum("/a").await, sum("/b").await, "byte {at} changed");
        }
        to(admin.write_file("/small-a", &data[..5000])).await.unwrap();
        to(admin.write_file("/small-b", &data[..5000])).await.unwrap();
        to(admin.write_file("/small-c", &data[..4999])).await.unwrap();
        assert_eq!(sum("/small-a").await, sum("/small-b").await, "equal small files");
        assert_ne!(sum("/small-a").await, sum("/small-c").await, "one byte shorter");
        c.stop().await;
    });
}
