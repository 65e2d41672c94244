//! `nasd bench small-files`: 10 000 small files created, written, closed,
//! opened and read back through `FsClient`, on a manager and four drives in
//! one process, with and without the small-file path (issue 14 item 4):
//! the two clusters differ only in `[manager] small_file_threshold`, and the
//! ratio between them is reported in the same run.

use crate::daemons::{ClusterSetup, LocalCluster};
use crate::fs_cmd;
use crate::size::human;
use nasd_fs::FsClient;
use nasd_manager::ManagerConfig;
use std::time::{Duration, Instant};

/// The two phases' times for one cluster.
struct Times {
    write: Duration,
    read: Duration,
}

/// Runs the benchmark: `files` files of `size` bytes on each cluster.
pub async fn small_files_bench(files: u32, size: u64, dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    anyhow::ensure!(files > 0, "--files must be above 0");
    let base = tempfile::tempdir_in(dir.unwrap_or(&std::env::temp_dir()))?;
    let none = ManagerConfig { small_file_threshold: 0, ..ManagerConfig::default() };
    let without = run_one(base.path(), "striped", none, files, size).await?;
    let small = ManagerConfig::default();
    let threshold = small.small_file_threshold;
    let with = run_one(base.path(), "small", small, files, size).await?;
    println!("{files} files of {} each, one client, one file at a time:", human(size));
    let rate = |d: Duration| files as f64 / d.as_secs_f64();
    println!("| path | create+write+close /s | open+read /s | both /s |");
    println!("|---|---|---|---|");
    println!(
        "| striped over drives (small_file_threshold = 0) | {:.0} | {:.0} | {:.0} |",
        rate(without.write),
        rate(without.read),
        rate(without.write + without.read)
    );
    println!(
        "| small-file path (small_file_threshold = {}) | {:.0} | {:.0} | {:.0} |",
        human(threshold as u64),
        rate(with.write),
        rate(with.read),
        rate(with.write + with.read)
    );
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "| ratio (with / without) | {:.2} | {:.2} | {:.2} |",
        ratio(without.write, with.write),
        ratio(without.read, with.read),
        ratio(without.write + without.read, with.write + with.read)
    );
    Ok(())
}

/// Starts a cluster under `base/name` with `manager`, runs the workload,
/// stops the cluster.
async fn run_one(
    base: &std::path::Path,
    name: &str,
    manager: ManagerConfig,
    files: u32,
    size: u64,
) -> anyhow::Result<Times> {
    let data = base.join(name);
    std::fs::create_dir_all(&data)?;
    let setup = ClusterSetup {
        drives: 4,
        capacity: 4 << 30,
        throttle_bytes_per_sec: None,
        media_seek: None,
        manager,
        own_runtimes: false,
        auth: false,
    };
    let cluster = LocalCluster::start_with(&data, setup).await?;
    let fs = fs_cmd::login(&cluster.client, None).await?;
    let result = workload(&fs, files, size).await;
    drop(fs);
    cluster.stop().await?;
    result
}

/// `len` bytes of a xorshift sequence seeded by `seed`: distinct per seed,
/// so a read of another file's bytes is caught (the benchmarks' file
/// contents).
pub(crate) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The bytes of file `i`.
fn contents(i: u32, size: u64) -> Vec<u8> {
    pattern(u64::from(i), size as usize)
}

async fn workload(fs: &FsClient, files: u32, size: u64) -> anyhow::Result<Times> {
    fs.mkdir("/small", 0o755).await?;
    let path = |i: u32| format!("/small/f{i:06}");
    let t = Instant::now();
    for i in 0..files {
        let f = fs.create(&path(i), 0o644, true, false).await?;
        f.write_at(0, &contents(i, size)).await?;
        let attr = f.close().await?;
        anyhow::ensure!(attr.size == size, "{}: {} bytes after close, wrote {size}", path(i), attr.size);
    }
    let write = t.elapsed();
    let t = Instant::now();
    for i in 0..files {
        let f = fs.open(&path(i), false).await?;
        let got = f.read_at(0, size).await?;
        anyhow::ensure!(got == contents(i, size), "{}: read back other bytes than were written", path(i));
        drop(f);
    }
    let read = t.elapsed();
    Ok(Times { write, read })
}
