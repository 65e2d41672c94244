//! Reads through the kernel cost the drives each byte once (issue 29.3):
//! a buffered sequential read of a file the page cache does not hold makes
//! the drives send as many bytes as the reader gets, however the kernel's
//! read-ahead orders the reads it sends the mount. Counted at the drives
//! (`nasd_drive_data_bytes_total{op="read"}`), not timed.

mod common;

use std::io::Read;
use std::process::Command;
use std::time::Duration;

/// Each test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(600);
const MIB: u64 = 1 << 20;

/// Bytes of one stripe of the widest layout the test reads (`stripe:4` of
/// 1 MiB units). A sequential read may cost the drives one stripe more than
/// the file: with a data drive down, the first read (before the read-ahead
/// starts) decodes its whole stripe.
const STRIPE_BYTES_MAX: u64 = 4 * MIB;

/// Object bytes all drives of the cluster have sent so far.
fn drive_bytes_read(env: &common::Env) -> u64 {
    env.cluster().drives.iter().map(|d| d.metrics.read_bytes_total()).sum()
}

/// Writes `len` seeded bytes to `path` through the client library, not
/// the mount, so the kernel's page cache holds none of them.
fn write_directly(env: &common::Env, path: &str, data: &[u8]) {
    env.rt().block_on(async {
        let fs = env.cluster().login(common::ADMIN, common::ADMIN_PW).await;
        let f = fs.create(path, 0o644, true, false).await.expect("create");
        for (i, piece) in data.chunks(4 * MIB as usize).enumerate() {
            f.write_at(i as u64 * 4 * MIB, piece).await.expect("write");
        }
        f.close().await.expect("close");
    });
}

/// Reads the whole file at `path` with `read(2)` calls of `buf` bytes.
fn read_with_buffer(path: &std::path::Path, buf: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(path).expect("open through the mount");
    let mut out = Vec::new();
    let mut chunk = vec![0u8; buf];
    loop {
        let n = f.read(&mut chunk).expect("read through the mount");
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&chunk[..n]);
    }
}

/// For each layout nasd offers (`rs:2+1`, as `nasd up` lays files out,
/// `stripe:4` and `mirror:2`), a file of a seeded size is read start to
/// end through the mount by `cat` and by a reader with a seeded buffer
/// size: each read returns the file's bytes, and the drives sent no more
/// than the file and [`STRIPE_BYTES_MAX`]. They sent 2.2 (cat) and 6.1
/// (4 KiB reads) bytes per byte when the read-ahead dropped its prefetch
/// at every read the kernel's concurrent read-ahead delivered out of
/// order. Then the `rs:2+1` file is read again with the drive of its first
/// data column killed: decoded from parity, still each byte once (1.48
/// when read-ahead windows cut stripes, whose chunks both windows read).
#[test]
fn a_buffered_sequential_read_reads_each_byte_once() {
    require_fuse!();
    let seed = common::seed("a_buffered_sequential_read_reads_each_byte_once");
    let mut rng = common::Rng::new(seed);
    for layout in ["rs:2+1@1M", "stripe:4", "mirror:2"] {
        let opts =
            common::ClusterOptions { root_layout: Some(nasd_fs::Layout::parse(layout).unwrap()), ..Default::default() };
        let mut env = common::Env::start("a_buffered_sequential_read_reads_each_byte_once", LIMIT, opts);
        let m = env.mount();
        let len = (24 * MIB + rng.below(16 * MIB)) as usize;
        let data = common::cluster::pattern(seed, len);
        write_directly(&env, "/a", &data);
        write_directly(&env, "/c", &data);

        let before = drive_bytes_read(&env);
        let out = Command::new("cat").arg(m.join("a")).output().expect("run cat");
        assert!(out.status.success(), "cat: {}", String::from_utf8_lossy(&out.stderr));
        assert!(out.stdout == data, "{layout}: cat read other bytes than were written (seed {seed})");
        let by_cat = (drive_bytes_read(&env) - before) as f64 / len as f64;

        // A second file: the first is in the page cache now.
        write_directly(&env, "/b", &data);
        let buf = 4096 << rng.below(11);
        let before = drive_bytes_read(&env);
        let got = read_with_buffer(&m.join("b"), buf);
        assert!(got == data, "{layout}: a {buf}-byte reader read other bytes than were written (seed {seed})");
        let by_reader = (drive_bytes_read(&env) - before) as f64 / len as f64;

        eprintln!(
            "{layout}, {len} bytes: drives read {by_cat:.3} bytes per byte for cat, \
             {by_reader:.3} for a reader of {buf} bytes at a time"
        );
        for (who, ratio) in [("cat", by_cat), ("the reader", by_reader)] {
            assert_read_once(layout, who, ratio, len, seed);
        }
        if layout.starts_with("rs:") {
            kill_drive_of_first_column(&mut env, "/c");
            let before = drive_bytes_read(&env);
            let got = read_with_buffer(&m.join("c"), buf);
            assert!(got == data, "{layout}, degraded: the reader read other bytes than were written (seed {seed})");
            let degraded = (drive_bytes_read(&env) - before) as f64 / len as f64;
            eprintln!("{layout}, {len} bytes, a data drive down: drives read {degraded:.3} bytes per byte");
            assert_read_once(layout, "a degraded reader", degraded, len, seed);
        }
        env.stop();
    }
}

/// Fails unless the drives sent between the file's bytes and them plus
/// one stripe, `ratio` being what they sent per byte of a `len`-byte file.
fn assert_read_once(layout: &str, who: &str, ratio: f64, len: usize, seed: u64) {
    let most = 1.0 + STRIPE_BYTES_MAX as f64 / len as f64;
    assert!(
        (1.0..=most).contains(&ratio),
        "{layout}: the drives read {ratio:.3} bytes per byte {who} read (at most {most:.3}; seed {seed})"
    );
}

/// Kills the drive holding the first component (data column 0) of `path`.
fn kill_drive_of_first_column(env: &mut common::Env, path: &str) {
    let admin = env.rt().block_on(env.cluster().login(common::ADMIN, common::ADMIN_PW));
    let info = env.rt().block_on(admin.get_layout(path)).expect("layout");
    let addr = info.components[0].1.clone();
    let drive =
        env.cluster_mut().drives.iter_mut().find(|d| d.addr.to_string() == addr).expect("the first column's drive");
    drive.kill();
}

/// 4 KiB reads at random places of a file the page cache does not hold
/// (the reader says so with `POSIX_FADV_RANDOM`, as a database would): each
/// costs the drives at most one request of its own 4 KiB (issue 29.5), on
/// `rs:2+1` as `nasd up` lays files out.
#[test]
fn a_small_random_read_is_one_drive_request() {
    require_fuse!();
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    const READS: u64 = 200;
    const PAGE: u64 = 4096;
    let seed = common::seed("a_small_random_read_is_one_drive_request");
    let mut rng = common::Rng::new(seed);
    let opts = common::ClusterOptions {
        root_layout: Some(nasd_fs::Layout::parse("rs:2+1@1M").unwrap()),
        ..Default::default()
    };
    let mut env = common::Env::start("a_small_random_read_is_one_drive_request", LIMIT, opts);
    let m = env.mount();
    let len = (16 * MIB + rng.below(16 * MIB)) as usize;
    let data = common::cluster::pattern(seed, len);
    write_directly(&env, "/r", &data);
    let f = std::fs::File::open(m.join("r")).expect("open through the mount");
    // SAFETY: a valid open descriptor; posix_fadvise reads no memory.
    assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) }, 0);
    let requests =
        |env: &common::Env| -> u64 { env.cluster().drives.iter().map(|d| d.metrics.requests_total("read")).sum() };
    let (requests_before, bytes_before) = (requests(&env), drive_bytes_read(&env));
    let mut page = vec![0u8; PAGE as usize];
    for _ in 0..READS {
        let at = rng.below(len as u64 / PAGE) * PAGE;
        f.read_exact_at(&mut page, at).expect("read through the mount");
        assert!(page == data[at as usize..(at + PAGE) as usize], "a 4 KiB read at {at} (seed {seed})");
    }
    let sent_requests = requests(&env) - requests_before;
    let sent_bytes = drive_bytes_read(&env) - bytes_before;
    eprintln!("{READS} random 4 KiB reads: {sent_requests} drive reads, {sent_bytes} bytes");
    assert!(
        (1..=READS).contains(&sent_requests) && sent_bytes <= READS * PAGE,
        "{READS} random 4 KiB reads cost {sent_requests} drive reads of {sent_bytes} bytes (seed {seed})"
    );
    drop(f);
    env.stop();
}
