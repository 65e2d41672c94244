//! `nasd bench cost` (issue 29): the data path's CPU cost model. One file
//! written and read back per layout and protection, in one process — a TLS
//! manager and drives on loopback, each drive on a runtime of its own (as
//! separate processes would have), unpaced — with the CPU-seconds per GiB
//! of file data of the client, the drives and the manager (from
//! `/proc/self/task/*/stat`), beside a **floor** computed from the rates of
//! the necessary work measured in the same run, on one core each:
//!
//! - one BLAKE3 pass where data enters (the client digests the blocks it
//!   writes, data and parity; a mirror's copies share one digest), and one
//!   where each drive stores a block (its stored digest, kept whatever the
//!   wire protection, for scrubbing and Hash-and-MAC reads); on a read, one
//!   pass at the client checking the drives' Hash-and-MAC replies (the
//!   drives answer from stored digests);
//! - Reed-Solomon parity for the redundant share (writes);
//! - the bytes through loopback TCP (a raw copy's CPU per byte, both ends)
//!   and one copy into or out of the drive's page cache (memcpy rate), for
//!   every byte stored (writes) or delivered (reads).
//!
//! Each rate is the cheapest of three runs after a warm-up pass (the
//! machine's best). MACs over digests and request headers cost a few hundred bytes of
//! hashing per request and are left out of the floor. The harness's own
//! work — generating the written bytes and comparing the bytes read back —
//! is measured separately and taken out of the client's figure.
//!
//! "Without data protection" is a client with `data_integrity = false` on a
//! manager that lets write capabilities go without `INTEGRITY_DATA`
//! (`[manager] write_data_integrity = false`): requests still carry
//! `INTEGRITY_ARGS`. No figure is asserted: the table reports ratios.

use crate::bench::raw_tcp;
use crate::bench_stripe::{
    clock_ticks_per_sec, cpu_model, disk_of, layout_dir, measure, online_cpus, read_file, write_file, Measured,
    Pattern, DISK,
};
use crate::daemons::{ClusterSetup, LocalCluster};
use crate::fs_cmd;
use crate::size::{human, parse_size};
use nasd_fs::{Layout, Scheme};
use nasd_manager::ManagerConfig;
use nasd_proto::Protection;
use std::path::PathBuf;
use std::time::Duration;

/// `nasd bench cost` flags.
#[derive(clap::Args)]
pub struct CostArgs {
    /// Bytes of the file written and read per layout and protection.
    #[arg(long, default_value = "1GiB")]
    size: String,
    /// Layouts measured (comma-separated).
    #[arg(long, default_value = "stripe:4,mirror:2,rs:2+1,rs:4+2")]
    layouts: String,
    /// Drives in the cluster (at least as many as the widest layout's components).
    #[arg(long, default_value_t = 6)]
    drives: u32,
    /// Where the cluster keeps its files [default: a temporary directory].
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Most bytes each rate of the floor is measured over (fewer for a file
/// smaller than this: at least one [`RATE_BUFFER`]).
const RATE_BYTES_MAX: usize = 256 << 20;
/// Bytes of the buffer the rates run over (larger than the caches, as a transfer's data is).
const RATE_BUFFER: usize = 64 << 20;
/// Block the drives digest (the store's default block size).
const DIGEST_BLOCK: usize = 64 << 10;
/// Shard length the parity rate is measured at (a layout's default stripe unit).
const PARITY_SHARD: usize = 1 << 20;
/// Bytes in a GiB, as a float.
const GIB: f64 = (1u64 << 30) as f64;
/// Times each rate is measured (after one untimed pass that faults its
/// buffers in and warms the caches); the floor takes the cheapest, the
/// machine's best: single runs moved by 2x between runs of one day.
const RATE_REPEATS: usize = 3;

/// CPU-seconds per GiB of the necessary work, measured on one core.
struct Rates {
    hash: f64,
    copy: f64,
    /// Both ends of a loopback TCP copy, per GiB moved.
    tcp: f64,
    /// The harness generating one GiB of the written pattern.
    fill: f64,
    /// The harness comparing one GiB read back with the pattern.
    check: f64,
}

pub async fn run(args: CostArgs) -> anyhow::Result<()> {
    let size = parse_size(&args.size).map_err(|e| anyhow::anyhow!("--size: {e}"))?;
    anyhow::ensure!(size >= 1 << 20, "--size must be at least 1 MiB");
    let layouts: Vec<Layout> = args
        .layouts
        .split(',')
        .map(|t| Layout::parse(t.trim()).map_err(|e| anyhow::anyhow!("layout '{t}': {e}")))
        .collect::<anyhow::Result<_>>()?;
    let widest = layouts.iter().map(Layout::components).max().unwrap_or(1);
    anyhow::ensure!(args.drives as usize >= widest, "--drives {} is fewer than {widest} components", args.drives);
    anyhow::ensure!(args.drives <= 64, "--drives must be at most 64");
    let tmp = tempfile::tempdir_in(args.dir.as_deref().unwrap_or(&std::env::temp_dir()))?;
    let _ = DISK.set(disk_of(tmp.path()));

    println!("# nasd bench cost");
    println!();
    println!(
        "machine: {} CPUs ({}); {} drives on loopback, each on a runtime of its own, unpaced; file {} per case",
        online_cpus(),
        cpu_model(),
        args.drives,
        human(size)
    );
    println!();
    let rate_bytes = (size as usize).clamp(RATE_BUFFER, RATE_BYTES_MAX) / RATE_BUFFER * RATE_BUFFER;
    let rates = rates(rate_bytes).await?;
    println!("## The necessary work's rates (one core, this run)");
    println!();
    println!("| work | CPU-s per GiB | GiB/s per core |");
    println!("|---|---:|---:|");
    for (what, r) in [
        ("BLAKE3 of 64 KiB blocks", rates.hash),
        ("memcpy (page cache copy)", rates.copy),
        ("loopback TCP, both ends", rates.tcp),
        ("harness: pattern generated", rates.fill),
        ("harness: pattern compared", rates.check),
    ] {
        println!("| {what} | {r:.3} | {:.2} |", 1.0 / r);
    }
    let mut parity = Vec::new();
    for l in &layouts {
        if let Scheme::ReedSolomon { data, parity: m } = l.scheme {
            if !parity.iter().any(|(k, p, _)| (*k, *p) == (data, m)) {
                let r = parity_rate(data as usize, m as usize, rate_bytes)?;
                println!("| Reed-Solomon {data}+{m} parity, per GiB of data | {r:.3} | {:.2} |", 1.0 / r);
                parity.push((data, m, r));
            }
        }
    }
    println!();

    let cluster = start(&tmp.path().join("cluster"), args.drives, size).await?;
    let result = cases(&cluster, &layouts, size, &rates, &parity).await;
    cluster.stop().await?;
    result
}

/// Every layout written and read with and without data protection; the table.
async fn cases(
    cluster: &LocalCluster,
    layouts: &[Layout],
    size: u64,
    rates: &Rates,
    parity: &[(u8, u8, f64)],
) -> anyhow::Result<()> {
    println!("## CPU-seconds per GiB of file data, by process role, beside the floor");
    println!();
    println!(
        "client: nasd_fs::File (as `nasd cp`), its figure less the harness's (pattern generated or compared, rates above)."
    );
    println!("\"x floor\" is all roles together over the floor. Writes end with flush + commit.");
    println!();
    println!("| layout | protection | direction | MiB/s | client | drives | manager | total | floor | x floor |");
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let pattern = Pattern::new();
    for protected in [true, false] {
        let mut section = cluster.client.clone();
        section.data_integrity = Some(protected);
        let fs = fs_cmd::login(&section, None).await?;
        let name = if protected { "default (Hash-and-MAC)" } else { "no data protection" };
        for layout in layouts {
            let path = format!("{}/cost-{protected}.bin", layout_dir(&fs, layout).await?);
            let write = measure(size, write_file(&fs, &path, size, &pattern)).await?;
            let read = measure(size, read_file(&fs, &path, size, &pattern)).await?;
            fs.unlink(&path).await?;
            let p = parity.iter().find(|(k, m, _)| Some((*k, *m)) == rs_shape(layout)).map_or(0.0, |t| t.2);
            for (dir, m, harness, floor) in [
                ("write", &write, rates.fill, write_floor(layout, protected, rates, p)),
                ("read", &read, rates.check, read_floor(protected, rates)),
            ] {
                row(layout, name, dir, m, harness, floor);
            }
        }
    }
    println!();
    Ok(())
}

fn row(layout: &Layout, protection: &str, dir: &str, m: &Measured, harness: f64, floor: f64) {
    let gib = m.bytes as f64 / GIB;
    let client = (m.cpu.client / gib - harness).max(0.0);
    let drives = m.cpu.drives / gib;
    let manager = m.cpu.manager / gib;
    let total = client + drives + manager;
    println!(
        "| {layout} | {protection} | {dir} | {:.0} | {client:.2} | {drives:.2} | {manager:.2} | {total:.2} | {floor:.2} | {:.1} |",
        m.mib_s(),
        total / floor
    );
}

fn rs_shape(layout: &Layout) -> Option<(u8, u8)> {
    match layout.scheme {
        Scheme::ReedSolomon { data, parity } => Some((data, parity)),
        _ => None,
    }
}

/// Bytes stored per byte of file data.
fn stored_per_byte(layout: &Layout) -> f64 {
    layout.components() as f64 / layout.data_columns() as f64
}

/// Bytes digested at the client per byte written: data and parity; a
/// mirror's copies share their column's digests.
fn digested_per_byte(layout: &Layout) -> f64 {
    match layout.scheme {
        Scheme::Mirror { .. } => 1.0,
        _ => stored_per_byte(layout),
    }
}

/// CPU-seconds per GiB written that no implementation can avoid.
fn write_floor(layout: &Layout, protected: bool, r: &Rates, parity: f64) -> f64 {
    let stored = stored_per_byte(layout);
    let client_hash = if protected { digested_per_byte(layout) * r.hash } else { 0.0 };
    let drive_digest = stored * r.hash;
    client_hash + drive_digest + parity + stored * (r.tcp + r.copy)
}

/// CPU-seconds per GiB read (healthy: data columns only) that no
/// implementation can avoid.
fn read_floor(protected: bool, r: &Rates) -> f64 {
    let client_check = if protected { r.hash } else { 0.0 };
    client_check + r.tcp + r.copy
}

/// CPU-seconds this thread has run (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID is always available on Linux");
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// CPU-seconds per GiB of `work` run over `bytes` on this thread (`work`
/// gets the offset of each [`RATE_BUFFER`] pass and does one pass): the
/// cheapest of [`RATE_REPEATS`] runs after an untimed pass.
fn per_gib(bytes: usize, mut work: impl FnMut(u64)) -> f64 {
    work(0);
    cheapest(|| {
        let t = thread_cpu();
        for pass in 0..bytes / RATE_BUFFER {
            work((pass * RATE_BUFFER) as u64);
        }
        (thread_cpu() - t) / (bytes as f64 / GIB)
    })
}

/// The least of [`RATE_REPEATS`] values of `measure`.
fn cheapest(mut measure: impl FnMut() -> f64) -> f64 {
    (0..RATE_REPEATS).map(|_| measure()).fold(f64::INFINITY, f64::min)
}

/// The floor's rates: hashing, copying, the harness's pattern on this
/// thread; loopback TCP as the whole process's CPU over a raw copy.
async fn rates(bytes: usize) -> anyhow::Result<Rates> {
    let pattern = Pattern::new();
    let mut src = vec![0u8; RATE_BUFFER];
    pattern.fill(0, &mut src);
    let mut dst = vec![0u8; RATE_BUFFER];
    let mut sink = 0u8;
    let hash = per_gib(bytes, |_| {
        for b in src.chunks(DIGEST_BLOCK) {
            sink ^= nasd_crypto::block_digest(b)[0];
        }
    });
    let copy = per_gib(bytes, |_| {
        dst.copy_from_slice(&src);
        sink ^= dst[RATE_BUFFER / 2];
    });
    let fill = per_gib(bytes, |at| pattern.fill(at, &mut dst));
    let check = per_gib(bytes, |at| sink ^= pattern.mismatches(at, &dst) as u8);
    std::hint::black_box(sink);
    let moved = bytes as u64;
    raw_tcp(RATE_BUFFER as u64, 1 << 20).await?;
    let mut tcp = f64::INFINITY;
    for _ in 0..RATE_REPEATS {
        let m = measure(2 * moved, async { raw_tcp(moved, 1 << 20).await.map(|_| ()) }).await?;
        tcp = tcp.min(m.cpu.client.max(1.0 / clock_ticks_per_sec()) / (2.0 * moved as f64 / GIB));
    }
    Ok(Rates { hash, copy, tcp, fill, check })
}

/// CPU-seconds per GiB of data for `k + m` parity at the default stripe unit.
fn parity_rate(k: usize, m: usize, bytes: usize) -> anyhow::Result<f64> {
    let coder = nasd_stripe::coding::Coder::new(k, m).map_err(|e| anyhow::anyhow!("{k}+{m}: {e}"))?;
    let data: Vec<Vec<u8>> = (0..k).map(|i| vec![i as u8 ^ 0x5a; PARITY_SHARD]).collect();
    let stripes = (bytes / (k * PARITY_SHARD)).max(1);
    let mut encoder = coder.encoder();
    let mut sink = 0u8;
    let mut encode = || encoder.encode_into(&data, PARITY_SHARD, |_, p| sink ^= p[0]);
    encode().map_err(|e| anyhow::anyhow!("{k}+{m}: {e}"))?;
    let rate = cheapest(|| {
        let t = thread_cpu();
        for _ in 0..stripes {
            encode().expect("the shape encoded once already");
        }
        (thread_cpu() - t) / ((stripes * k * PARITY_SHARD) as f64 / GIB)
    });
    std::hint::black_box(sink);
    Ok(rate)
}

/// A cluster of `drives` unpaced drives on runtimes of their own, whose
/// manager lets write capabilities go without data integrity (so a client
/// may choose either).
async fn start(dir: &std::path::Path, drives: u32, size: u64) -> anyhow::Result<LocalCluster> {
    let setup = ClusterSetup {
        drives,
        capacity: (size * 4).max(1 << 30),
        throttle_bytes_per_sec: None,
        media_seek: None,
        manager: ManagerConfig {
            write_protection: Protection::INTEGRITY_ARGS,
            rebuild_delay: Duration::from_secs(24 * 3600),
            ..ManagerConfig::default()
        },
        own_runtimes: true,
        auth: false,
    };
    LocalCluster::start_with(dir, setup).await
}
