//! Sparse files through the kernel (issue 23.4): a hole costs no space on
//! the drives and nothing in a quota, `st_blocks` says what the data takes,
//! and `SEEK_DATA`/`SEEK_HOLE` find the data, on files striped
//! Reed-Solomon over real drives.

mod common;

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Each test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(600);
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Files striped `rs:2+1` over 1 MiB units, as `nasd up` lays them out.
fn env(name: &str) -> common::Env {
    let layout = nasd_fs::Layout::parse("rs:2+1@1M").unwrap();
    common::Env::start(name, LIMIT, common::ClusterOptions { root_layout: Some(layout), ..Default::default() })
}

/// `lseek(fd, offset, whence)`: the offset, or the errno.
fn lseek(f: &fs::File, offset: u64, whence: i32) -> Result<u64, i32> {
    // SAFETY: a valid open descriptor; lseek reads no memory.
    let at = unsafe { libc::lseek(f.as_raw_fd(), offset as libc::off_t, whence) };
    if at < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(at as u64)
    }
}

/// Bytes the drives say they use, all together.
fn drives_used(env: &common::Env) -> u64 {
    let admin = env.rt().block_on(env.cluster().login(common::ADMIN, common::ADMIN_PW));
    let (_, _, drives) = env.rt().block_on(admin.statfs()).expect("statfs");
    drives.iter().map(|d| d.used_bytes).sum()
}

/// One byte written 10 GiB into a new file: the file is 10 GiB + 1 long,
/// yet the drives store a block or two for it and `st_blocks` says so (it
/// said 20 971 521 — the size in 512-byte units — and a 10 GiB file the
/// same, whatever it held). A read anywhere in the hole returns zeros.
#[test]
fn a_hole_costs_nothing_and_st_blocks_tells_the_truth() {
    require_fuse!();
    let mut env = env("a_hole_costs_nothing_and_st_blocks_tells_the_truth");
    let m = env.mount();
    let before = drives_used(&env);
    let f = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(m.join("sparse")).unwrap();
    f.write_all_at(b"x", 10 * GIB).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let meta = fs::metadata(m.join("sparse")).unwrap();
    assert_eq!(meta.len(), 10 * GIB + 1);
    // One block of one data column (64 KiB); the parity block is not counted.
    assert!(meta.blocks() > 0 && meta.blocks() * 512 <= MIB, "st_blocks {} for one byte", meta.blocks());
    let used = drives_used(&env) - before;
    assert!(used > 0 && used <= 4 * MIB, "the drives store {used} bytes for one byte at 10 GiB");
    let f = fs::File::open(m.join("sparse")).unwrap();
    let mut buf = vec![1u8; 4 * MIB as usize];
    f.read_exact_at(&mut buf, 5 * GIB + 12345).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "a hole reads as zeros");
    let mut last = [0u8; 2];
    assert_eq!(f.read_at(&mut last, 10 * GIB).unwrap(), 1);
    assert_eq!(last[0], b'x');
    drop(f);
    // A file of real data counts what it holds.
    fs::write(m.join("dense"), vec![7u8; 3 * MIB as usize]).unwrap();
    let dense = fs::metadata(m.join("dense")).unwrap();
    assert_eq!(dense.blocks() * 512, 3 * MIB, "three MiB of data, two data columns");
    env.stop();
}

/// `SEEK_DATA` and `SEEK_HOLE` through the mount find the stored ranges of
/// a file with holes (they reached the mount as `ENOSYS`, so the kernel
/// answered "data everywhere, the hole at the end"): `cp --sparse=always`
/// copies such a file to a local disk as sparse as it was, byte for byte.
#[test]
fn seek_data_and_seek_hole_find_the_data() {
    require_fuse!();
    let mut env = env("seek_data_and_seek_hole_find_the_data");
    let m = env.mount();
    let path = m.join("holes");
    let f = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
    // [0, 100 000): data; a hole; 10 bytes at 5 MiB + 7; a hole; 1 MiB at
    // 9 MiB (a whole stripe unit, column 1); a hole to the end, 64 MiB.
    let head = common::cluster::pattern(1, 100_000);
    f.write_all_at(&head, 0).unwrap();
    f.write_all_at(b"0123456789", 5 * MIB + 7).unwrap();
    let unit = common::cluster::pattern(2, MIB as usize);
    f.write_all_at(&unit, 9 * MIB).unwrap();
    f.set_len(64 * MIB).unwrap();
    // Before and after the writes are committed.
    for when in ["open for writing", "after fsync"] {
        let hole = lseek(&f, 0, libc::SEEK_HOLE).unwrap();
        assert!((100_000..=128 * 1024).contains(&hole), "{when}: first hole at {hole}");
        assert_eq!(lseek(&f, 50, libc::SEEK_DATA), Ok(50), "{when}: in data, data is where one is");
        let data = lseek(&f, 200_000, libc::SEEK_DATA).unwrap();
        assert!((5 * MIB + 7 - 64 * 1024..=5 * MIB + 7).contains(&data), "{when}: the next data at {data}");
        let hole = lseek(&f, 5 * MIB + 8, libc::SEEK_HOLE).unwrap();
        assert!((5 * MIB + 17..=5 * MIB + 128 * 1024).contains(&hole), "{when}: then a hole at {hole}");
        assert_eq!(lseek(&f, 6 * MIB, libc::SEEK_DATA), Ok(9 * MIB), "{when}: the stored unit");
        assert_eq!(lseek(&f, 9 * MIB, libc::SEEK_HOLE), Ok(10 * MIB), "{when}: its end");
        assert_eq!(lseek(&f, 10 * MIB, libc::SEEK_DATA), Err(libc::ENXIO), "{when}: only holes follow");
        assert_eq!(lseek(&f, 10 * MIB, libc::SEEK_HOLE), Ok(10 * MIB), "{when}");
        assert_eq!(lseek(&f, 64 * MIB, libc::SEEK_HOLE), Err(libc::ENXIO), "{when}: at the end");
        f.sync_all().unwrap();
    }
    drop(f);
    // A fresh descriptor sees the same; cp copies the data and skips the holes.
    let f = fs::File::open(&path).unwrap();
    assert_eq!(lseek(&f, 6 * MIB, libc::SEEK_DATA), Ok(9 * MIB));
    drop(f);
    let local = env.scratch().join("holes.copy");
    common::sh(Command::new("cp").arg("--sparse=always").arg(&path).arg(&local));
    let copied = fs::read(&local).unwrap();
    let mut want = vec![0u8; 64 * MIB as usize];
    want[..100_000].copy_from_slice(&head);
    want[(5 * MIB + 7) as usize..(5 * MIB + 17) as usize].copy_from_slice(b"0123456789");
    want[(9 * MIB) as usize..(10 * MIB) as usize].copy_from_slice(&unit);
    assert!(copied == want, "the copy holds the file's bytes");
    let on_disk = fs::metadata(&local).unwrap().blocks() * 512;
    assert!(on_disk <= 4 * MIB, "the local copy is sparse too: {on_disk} bytes on disk");
    env.stop();
}

/// A 20 GiB sparse file fits a 64 MiB quota: quotas count what the data
/// takes, not the size (it failed with EDQUOT: the quota counted the size).
/// Data still counts: writing more than the quota's room is refused.
#[test]
fn a_sparse_file_larger_than_its_quota_fits() {
    require_fuse!();
    let mut env = env("a_sparse_file_larger_than_its_quota_fits");
    let m = env.mount();
    fs::create_dir(m.join("proj")).unwrap();
    let admin = env.rt().block_on(env.cluster().login(common::ADMIN, common::ADMIN_PW));
    let proj = env
        .rt()
        .block_on(async {
            let proj = nasd_fs::QuotaOf::Dir(admin.walk("/proj", nasd_fs::OpenMode::None).await?.handle());
            admin.set_quota(proj, Some(64 * MIB), None).await?;
            Ok::<_, nasd_fs::FsError>(proj)
        })
        .expect("set the quota");
    let usage = || env.rt().block_on(admin.quota(proj)).expect("quota").bytes_used;
    let f = OpenOptions::new().create(true).truncate(true).write(true).open(m.join("proj/sparse")).unwrap();
    f.write_all_at(b"end", 20 * GIB).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::metadata(m.join("proj/sparse")).unwrap().len(), 20 * GIB + 3);
    let f = OpenOptions::new().create(true).truncate(true).write(true).open(m.join("proj/truncated")).unwrap();
    f.set_len(40 * GIB).unwrap();
    drop(f);
    assert!(usage() <= MIB, "two sparse files use {} bytes of the quota", usage());
    // Real data counts: 48 MiB fits, 48 MiB more does not.
    fs::write(m.join("proj/data"), vec![5u8; 48 * MIB as usize]).unwrap();
    assert!((48 * MIB..49 * MIB).contains(&usage()), "usage {}", usage());
    let e = fs::write(m.join("proj/more"), vec![6u8; 48 * MIB as usize]).unwrap_err();
    assert_eq!(common::errno_of(&e), libc::EDQUOT, "{e}");
    check_sparse(&m.join("proj/sparse"));
    env.stop();
}

/// The last bytes of the 20 GiB file are there, and a hole before them reads zeros.
fn check_sparse(path: &Path) {
    let f = fs::File::open(path).unwrap();
    let mut end = [0u8; 3];
    f.read_exact_at(&mut end, 20 * GIB).unwrap();
    assert_eq!(&end, b"end");
    let mut hole = vec![9u8; MIB as usize];
    f.read_exact_at(&mut hole, 20 * GIB - MIB).unwrap();
    assert!(hole.iter().all(|&b| b == 0));
}
