//! `nasd bench stripe` (issue 10): what striping a file over drives buys one
//! client, in one run of one process — a TLS manager and N drives on
//! loopback, each drive on a runtime of its own (as N processes would have)
//! and, for the layout cases, each paced to a fixed rate by its emulated
//! slow media (`DriveConfig::throttle_bytes_per_sec`, a test aid), so the
//! ideal aggregate of a layout is `data columns × per-drive rate`.
//!
//! Cases, each beside a baseline measured in the same run:
//! - the machine's limits: iperf3 and a raw TCP copy on loopback, a raw disk
//!   write, and every layout unthrottled with the CPU time of client,
//!   drives and manager (from `/proc/self/task/*/stat`) and of the whole
//!   machine (`/proc/stat`);
//! - one large file written and read back through the product path
//!   (`nasd_fs::File`, default data integrity) per layout, throttled;
//! - a Reed-Solomon file read healthy, then with one and two drives stopped;
//! - the rebuild of the stopped drives' components (`REPAIR rebuild`), its
//!   rate from `CLUSTER_STATUS` progress;
//! - an unthrottled put and get of a larger file against iperf3.
//!
//! No figure is asserted: the table reports ratios.

use crate::bench::{mib_s, raw_disk, raw_tcp};
use crate::daemons::{ClusterSetup, LocalCluster, THREAD_NAME_MANAGER, THREAD_PREFIX_DRIVE};
use crate::fs_cmd;
use crate::size::{human, parse_size};
use anyhow::Context;
use nasd_fs::{FsClient, Layout, RepairAction, Scheme};
use nasd_manager::ManagerConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `nasd bench stripe` flags.
#[derive(clap::Args)]
pub struct StripeArgs {
    /// Drives in the cluster (at least as many as the widest layout's components).
    #[arg(long, default_value_t = 8)]
    drives: u32,
    /// Emulated slow media, a test aid: every drive of the throttled cases
    /// moves at most this many MiB/s of data (reads and writes together).
    #[arg(long, default_value_t = 32)]
    drive_mib_per_sec: u64,
    /// Size of the file written and read per layout, and of the degraded-read
    /// and rebuild file.
    #[arg(long, default_value = "256MiB")]
    size: String,
    /// Size of the unthrottled put and get compared with iperf3.
    #[arg(long, default_value = "1GiB")]
    put_size: String,
    /// Layouts measured (comma-separated), throttled and unthrottled.
    #[arg(long, default_value = "stripe:1,stripe:2,stripe:4,stripe:8,mirror:2x4,rs:4+2")]
    layouts: String,
    /// Layout of the unthrottled put and get (`nasd up`'s default).
    #[arg(long, default_value = "rs:2+1")]
    put_layout: String,
    /// Layout of the degraded-read and rebuild file (Reed-Solomon; with two
    /// parity components the read is also measured with two drives stopped).
    #[arg(long, default_value = "rs:4+2")]
    degraded_layout: String,
    /// The iperf3 program for the loopback baseline (skipped if it cannot run).
    #[arg(long, default_value = "iperf3")]
    iperf3: PathBuf,
    /// Where the clusters keep their files [default: a temporary directory].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Cases to leave out (comma-separated): baselines, unthrottled, put,
    /// layouts, degraded, rebuild.
    #[arg(long, default_value = "")]
    skip: String,
}

/// Everything a run needs, parsed.
struct Plan {
    drives: u32,
    rate: u64,
    size: u64,
    put_size: u64,
    layouts: Vec<Layout>,
    put_layout: Layout,
    degraded: Layout,
    iperf3: PathBuf,
    skip: Vec<String>,
}

impl Plan {
    fn new(a: &StripeArgs) -> anyhow::Result<Plan> {
        let size = parse_size(&a.size).map_err(anyhow::Error::msg)?;
        let put_size = parse_size(&a.put_size).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(size > 0 && put_size > 0, "--size and --put-size must be above 0");
        anyhow::ensure!(a.drive_mib_per_sec > 0, "--drive-mib-per-sec must be at least 1");
        let layout = |t: &str| Layout::parse(t.trim()).map_err(|e| anyhow::anyhow!("layout '{t}': {e}"));
        let layouts =
            a.layouts.split(',').filter(|t| !t.trim().is_empty()).map(layout).collect::<Result<Vec<_>, _>>()?;
        let put_layout = layout(&a.put_layout)?;
        let degraded = layout(&a.degraded_layout)?;
        anyhow::ensure!(
            matches!(degraded.scheme, Scheme::ReedSolomon { .. }),
            "--degraded-layout must be Reed-Solomon (rs:K+M)"
        );
        let skip: Vec<String> = a.skip.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
        for s in &skip {
            anyhow::ensure!(CASES.contains(&s.as_str()), "--skip {s}: cases are {}", CASES.join(", "));
        }
        let widest = layouts.iter().chain([&put_layout, &degraded]).map(|l| l.components()).max().unwrap_or(1);
        anyhow::ensure!(
            a.drives as usize >= widest,
            "--drives {} is fewer than the {widest} components of the widest layout",
            a.drives
        );
        anyhow::ensure!(a.drives <= 64, "--drives must be at most 64");
        Ok(Plan {
            drives: a.drives,
            rate: a.drive_mib_per_sec.checked_mul(1 << 20).context("--drive-mib-per-sec is too large")?,
            size,
            put_size,
            layouts,
            put_layout,
            degraded,
            iperf3: a.iperf3.clone(),
            skip,
        })
    }

    fn runs(&self, case: &str) -> bool {
        !self.skip.iter().any(|s| s == case)
    }
}

const CASES: [&str; 6] = ["baselines", "unthrottled", "put", "layouts", "degraded", "rebuild"];

/// Runs the benchmark.
pub async fn run(args: StripeArgs) -> anyhow::Result<()> {
    let plan = Plan::new(&args)?;
    let tmp = tempfile::tempdir_in(args.dir.as_deref().unwrap_or(&std::env::temp_dir()))?;
    let _ = DISK.set(disk_of(tmp.path()));
    println!("# nasd bench stripe");
    println!();
    println!(
        "machine: {} CPUs ({}); {} drives, per-drive rate {} MiB/s when throttled; file {}, put/get {}",
        online_cpus(),
        cpu_model(),
        plan.drives,
        plan.rate >> 20,
        human(plan.size),
        human(plan.put_size)
    );
    println!(
        "client: nasd_fs::File (as `nasd cp`), INTEGRITY_ARGS|INTEGRITY_DATA|HASH_AND_MAC; writes end with flush + commit"
    );
    println!();
    let mut base = Baselines::default();
    if plan.runs("baselines") {
        base = baselines(&plan, tmp.path()).await?;
    }
    let mut unthrottled = Vec::new();
    if plan.runs("unthrottled") || plan.runs("put") {
        let dir = tmp.path().join("unthrottled");
        let (cluster, fs) = start(&dir, &plan, None).await?;
        let result = async {
            if plan.runs("unthrottled") {
                unthrottled = unthrottled_sweep(&fs, &plan).await?;
            }
            if plan.runs("put") {
                put_get(&fs, &plan, &base).await?;
            }
            anyhow::Ok(())
        }
        .await;
        drop(fs);
        cluster.stop().await?;
        result?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    if plan.runs("layouts") || plan.runs("degraded") || plan.runs("rebuild") {
        let dir = tmp.path().join("throttled");
        let (mut cluster, fs) = start(&dir, &plan, Some(plan.rate)).await?;
        let result = async {
            if plan.runs("layouts") {
                throttled_layouts(&fs, &plan, &unthrottled).await?;
            }
            if plan.runs("degraded") || plan.runs("rebuild") {
                degraded_and_rebuild(&fs, &mut cluster, &plan).await?;
            }
            anyhow::Ok(())
        }
        .await;
        drop(fs);
        cluster.stop().await?;
        result?;
    }
    Ok(())
}

/// A cluster of `plan.drives` drives on runtimes of their own, and an
/// administrator's client logged in to it.
async fn start(dir: &Path, plan: &Plan, throttle: Option<u64>) -> anyhow::Result<(LocalCluster, FsClient)> {
    let setup = ClusterSetup {
        drives: plan.drives,
        capacity: (plan.size.max(plan.put_size) * 4).max(1 << 30),
        throttle_bytes_per_sec: throttle,
        media_seek: None,
        manager: ManagerConfig {
            // Components of stopped drives are rebuilt only when asked (REPAIR rebuild).
            rebuild_delay: Duration::from_secs(24 * 3600),
            ..ManagerConfig::default()
        },
        own_runtimes: true,
        auth: false,
    };
    let cluster = LocalCluster::start_with(dir, setup).await?;
    match fs_cmd::login(&cluster.client, None).await {
        Ok(fs) => Ok((cluster, fs)),
        Err(e) => {
            let _ = cluster.stop().await;
            Err(e)
        }
    }
}

// ------------------------------------------------------------ baselines

#[derive(Default)]
struct Baselines {
    /// iperf3 client → server and server → client (`-R`), MiB/s.
    iperf_up: Option<f64>,
    iperf_down: Option<f64>,
    /// The raw loopback TCP copy of `nasd bench` (tokio, 1 MiB writes), MiB/s.
    tcp_up: Option<f64>,
    tcp_down: Option<f64>,
}

async fn baselines(plan: &Plan, dir: &Path) -> anyhow::Result<Baselines> {
    let n = plan.put_size;
    let mut b = Baselines::default();
    println!("## Baselines (same run, {} each)", human(n));
    println!();
    println!("| baseline | MiB/s | CPU |");
    println!("|---|---|---|");
    for reverse in [false, true] {
        let what =
            if reverse { "iperf3 -R, loopback (server → client)" } else { "iperf3, loopback (client → server)" };
        let bin = plan.iperf3.clone();
        match tokio::task::spawn_blocking(move || iperf3(&bin, n, reverse)).await? {
            Ok(r) => {
                println!(
                    "| {what} | {:.0} | sender {:.0}%, receiver {:.0}% of a core |",
                    r.mib_s, r.sender_cpu, r.receiver_cpu
                );
                *(if reverse { &mut b.iperf_down } else { &mut b.iperf_up }) = Some(r.mib_s);
            }
            Err(e) => println!("| {what} | – | not measured: {e:#} |"),
        }
    }
    let (up, down) = raw_tcp(n, 1 << 20).await?;
    b.tcp_up = Some(mib_s(n, up));
    b.tcp_down = Some(mib_s(n, down));
    println!("| raw TCP copy of `nasd bench`, loopback, 1 MiB writes (client → server) | {:.0} | – |", mib_s(n, up));
    println!("| same, server → client | {:.0} | – |", mib_s(n, down));
    let dir = dir.to_path_buf();
    let disk = tokio::task::spawn_blocking(move || raw_disk(n, 1 << 20, Some(&dir))).await??;
    println!("| raw file write + fdatasync on the drives' disk | {:.0} | – |", mib_s(n, disk));
    println!();
    Ok(b)
}

struct Iperf {
    mib_s: f64,
    sender_cpu: f64,
    receiver_cpu: f64,
}

/// Longest an iperf3 run of a benchmark may take (a hang, not a timing).
const IPERF3_WAIT_MAX: Duration = Duration::from_secs(120);

/// Runs an iperf3 server for one test on a free loopback port and an iperf3
/// client moving `bytes` to it (or from it, `reverse`); parses the client's JSON.
fn iperf3(bin: &Path, bytes: u64, reverse: bool) -> anyhow::Result<Iperf> {
    use std::process::{Command, Stdio};
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port().to_string();
    let mut server = Command::new(bin)
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    let result = (|| {
        // The server's port opens soon after it starts; a probe connection would count as its
        // one test, so the client is retried instead.
        let started = Instant::now();
        loop {
            let mut args = vec!["-c", "127.0.0.1", "-p", &port, "-J"];
            let n = bytes.to_string();
            args.extend(["-n", &n]);
            if reverse {
                args.push("-R");
            }
            let out = Command::new(bin).args(&args).stdin(Stdio::null()).output()?;
            let json: serde_json::Value = serde_json::from_slice(&out.stdout)
                .with_context(|| format!("iperf3 printed no JSON: {}", String::from_utf8_lossy(&out.stderr)))?;
            if let Some(e) = json.get("error").and_then(|e| e.as_str()) {
                if e.contains("connect") && started.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                anyhow::bail!("iperf3: {e}");
            }
            let end = &json["end"];
            let bps = end["sum_received"]["bits_per_second"].as_f64().context("iperf3 JSON: no end.sum_received")?;
            let cpu = &end["cpu_utilization_percent"];
            let (host, remote) =
                (cpu["host_total"].as_f64().unwrap_or(0.0), cpu["remote_total"].as_f64().unwrap_or(0.0));
            // The client is the host; with -R it receives.
            let (sender_cpu, receiver_cpu) = if reverse { (remote, host) } else { (host, remote) };
            return Ok(Iperf { mib_s: bps / 8.0 / (1 << 20) as f64, sender_cpu, receiver_cpu });
        }
    })();
    let deadline = Instant::now() + IPERF3_WAIT_MAX;
    while server.try_wait()?.is_none() {
        if Instant::now() > deadline || result.is_err() {
            let _ = server.kill();
            let _ = server.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    result
}

// ------------------------------------------------------------ cases

/// One timed transfer and the CPU it took.
#[derive(Clone, Copy)]
pub(crate) struct Measured {
    pub(crate) bytes: u64,
    pub(crate) wall: Duration,
    pub(crate) cpu: CpuUse,
}

impl Measured {
    pub(crate) fn mib_s(&self) -> f64 {
        mib_s(self.bytes, self.wall)
    }

    /// The share of the wall time the drives' disk was busy, or "–".
    fn disk_busy(&self) -> String {
        self.cpu.disk.map_or("–".into(), |d| format!("{:.2}", d / self.wall.as_secs_f64()))
    }
}

/// A layout's write and read without throttling.
struct Unthrottled {
    layout: Layout,
    write: Measured,
    read: Measured,
}

async fn unthrottled_sweep(fs: &FsClient, plan: &Plan) -> anyhow::Result<Vec<Unthrottled>> {
    println!("## Unthrottled: the machine's limit per layout ({} file, every drive unpaced)", human(plan.size));
    println!();
    println!("CPU columns are cores busy during the transfer (CPU-seconds / wall seconds): this process's client,");
    println!(
        "drive and manager threads, and every other process on the machine (from /proc/stat; {} CPUs).",
        online_cpus()
    );
    println!();
    println!("\"disk busy\" is the share of the time the drives' disk had I/O in flight (/proc/diskstats io_ticks, any process's I/O).");
    println!();
    println!("| layout | direction | MiB/s | client cores | drive cores | manager cores | other processes' cores | CPU ms per MiB | disk busy |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let pattern = Pattern::new();
    let mut out = Vec::new();
    for layout in &plan.layouts {
        let path = layout_dir(fs, layout).await? + "/unthrottled.bin";
        let write = measure(plan.size, write_file(fs, &path, plan.size, &pattern)).await?;
        let read = measure(plan.size, read_file(fs, &path, plan.size, &pattern)).await?;
        fs.unlink(&path).await?;
        for (dir, m) in [("write", &write), ("read", &read)] {
            println!(
                "| {layout} | {dir} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
                m.mib_s(),
                m.cpu.client / m.wall.as_secs_f64(),
                m.cpu.drives / m.wall.as_secs_f64(),
                m.cpu.manager / m.wall.as_secs_f64(),
                m.cpu.others() / m.wall.as_secs_f64(),
                m.cpu.process() * 1000.0 / (m.bytes as f64 / (1 << 20) as f64),
                m.disk_busy(),
            );
        }
        out.push(Unthrottled { layout: *layout, write, read });
    }
    println!();
    Ok(out)
}

async fn put_get(fs: &FsClient, plan: &Plan, base: &Baselines) -> anyhow::Result<()> {
    let n = plan.put_size;
    let layout = plan.put_layout;
    println!("## Unthrottled put and get of {} ({layout}) against loopback baselines", human(n));
    println!();
    println!("| transfer | MiB/s | ratio to iperf3 | ratio to raw TCP | client cores | drive cores | other processes' cores | disk busy |");
    println!("|---|---|---|---|---|---|---|---|");
    let pattern = Pattern::new();
    let path = layout_dir(fs, &layout).await? + "/put.bin";
    let put = measure(n, write_file(fs, &path, n, &pattern)).await?;
    let get = measure(n, read_file(fs, &path, n, &pattern)).await?;
    fs.unlink(&path).await?;
    let ratio = |m: &Measured, b: Option<f64>| b.map_or("–".to_string(), |b| format!("{:.3}", m.mib_s() / b));
    for (what, m, iperf, tcp) in [
        ("put (write + flush + commit)", &put, base.iperf_up, base.tcp_up),
        ("get (read)", &get, base.iperf_down, base.tcp_down),
    ] {
        println!(
            "| {what} | {:.0} | {} | {} | {:.2} | {:.2} | {:.2} | {} |",
            m.mib_s(),
            ratio(m, iperf),
            ratio(m, tcp),
            m.cpu.client / m.wall.as_secs_f64(),
            m.cpu.drives / m.wall.as_secs_f64(),
            m.cpu.others() / m.wall.as_secs_f64(),
            m.disk_busy(),
        );
    }
    println!();
    Ok(())
}

async fn throttled_layouts(fs: &FsClient, plan: &Plan, unthrottled: &[Unthrottled]) -> anyhow::Result<()> {
    let rate = plan.rate as f64 / (1 << 20) as f64;
    println!(
        "## Throttled: every drive paced to {rate:.0} MiB/s ({} file; ideal = data columns × {rate:.0} MiB/s, for a mirror's reads every copy)",
        human(plan.size)
    );
    println!();
    println!("\"unthrottled\" is the same transfer with unpaced drives (above): the machine's limit for it.");
    println!();
    println!("| layout | drives | direction | MiB/s | ideal MiB/s | ratio to ideal | unthrottled MiB/s | ratio to min(ideal, unthrottled) | client cores | drive cores | other processes' cores | disk busy |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let pattern = Pattern::new();
    for layout in &plan.layouts {
        let path = layout_dir(fs, layout).await? + "/throttled.bin";
        let write = measure(plan.size, write_file(fs, &path, plan.size, &pattern)).await?;
        let read = measure(plan.size, read_file(fs, &path, plan.size, &pattern)).await?;
        fs.unlink(&path).await?;
        let limit = unthrottled.iter().find(|u| u.layout == *layout);
        for (dir, m, free) in
            [("write", &write, limit.map(|u| u.write.mib_s())), ("read", &read, limit.map(|u| u.read.mib_s()))]
        {
            let ideal = ideal_columns(layout, dir == "read") as f64 * rate;
            let bound = free.map_or(ideal, |f| f.min(ideal));
            println!(
                "| {layout} | {} | {dir} | {:.0} | {ideal:.0} | {:.2} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
                layout.components(),
                m.mib_s(),
                m.mib_s() / ideal,
                free.map_or("–".into(), |f| format!("{f:.0}")),
                m.mib_s() / bound,
                m.cpu.client / m.wall.as_secs_f64(),
                m.cpu.drives / m.wall.as_secs_f64(),
                m.cpu.others() / m.wall.as_secs_f64(),
                m.disk_busy(),
            );
        }
    }
    println!();
    Ok(())
}

/// How many drives' rates add up in a transfer of a file of `layout`: every
/// data column's (each copy of a mirrored column, and parity, are written
/// beside it at the same rate), and for a mirror's reads every copy's, as
/// reads take the copies in turn.
fn ideal_columns(layout: &Layout, read: bool) -> usize {
    match layout.scheme {
        Scheme::Mirror { .. } if read => layout.components(),
        _ => layout.data_columns(),
    }
}

/// Reads of a Reed-Solomon file healthy and with drives stopped, then the
/// rebuild of the stopped drives' components.
async fn degraded_and_rebuild(fs: &FsClient, cluster: &mut LocalCluster, plan: &Plan) -> anyhow::Result<()> {
    let layout = plan.degraded;
    let parity = match layout.scheme {
        Scheme::ReedSolomon { parity, .. } => parity as usize,
        _ => 0,
    };
    let rate = plan.rate as f64 / (1 << 20) as f64;
    let pattern = Pattern::new();
    let path = layout_dir(fs, &layout).await? + "/degraded.bin";
    write_file(fs, &path, plan.size, &pattern).await?;
    // The drives holding the first data columns: losing them forces decoding.
    let info = fs.get_layout(&path).await?;
    let addrs: Vec<String> = cluster.drive_addrs().iter().map(|a| a.to_string()).collect();
    let victims: Vec<usize> = info
        .components
        .iter()
        .take(parity.min(2))
        .map(|(_, addr)| addrs.iter().position(|a| a == addr).context("a component on an unknown drive"))
        .collect::<Result<_, _>>()?;
    if plan.runs("degraded") {
        println!(
            "## Degraded reads: one {layout} file of {} (data columns × {rate:.0} MiB/s = {:.0} MiB/s ideal)",
            human(plan.size),
            layout.data_columns() as f64 * rate
        );
        println!();
        println!(
            "| drives stopped | MiB/s | ratio to healthy | client cores | other processes' cores | drive bytes read per byte | busiest drive's share |"
        );
        println!("|---|---|---|---|---|---|---|");
    }
    let mut healthy = None;
    let drive_read = cluster.drive_bytes_read();
    for stopped in 0..=victims.len() {
        if stopped > 0 {
            let i = victims[stopped - 1];
            cluster.stop_drive(i).await?;
            wait_down(fs, &addrs[i]).await?;
        }
        if !plan.runs("degraded") {
            continue;
        }
        let before = drive_read();
        let m = measure(plan.size, read_file(fs, &path, plan.size, &pattern)).await?;
        let sent: Vec<u64> = drive_read().iter().zip(&before).map(|(a, b)| a - b).collect();
        let total: u64 = sent.iter().sum();
        let busiest = sent.iter().max().copied().unwrap_or(0) as f64 / total.max(1) as f64;
        let h = *healthy.get_or_insert(m.mib_s());
        let what = match stopped {
            0 => "none (healthy)".to_string(),
            n => format!(
                "{n} (data column{} {})",
                if n > 1 { "s" } else { "" },
                (0..n).map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
            ),
        };
        println!(
            "| {what} | {:.0} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} |",
            m.mib_s(),
            m.mib_s() / h,
            m.cpu.client / m.wall.as_secs_f64(),
            m.cpu.others() / m.wall.as_secs_f64(),
            total as f64 / plan.size as f64,
            busiest
        );
    }
    if plan.runs("degraded") {
        println!();
    }
    if plan.runs("rebuild") {
        rebuild(fs, plan, &path, &victims.iter().map(|&i| addrs[i].clone()).collect::<Vec<_>>(), &pattern).await?;
    }
    Ok(())
}

/// How often the rebuild's progress is sampled.
const PROGRESS_POLL: Duration = Duration::from_millis(100);
/// Longest a rebuild of a benchmark may take (a hang, not a timing).
const REBUILD_WAIT_MAX: Duration = Duration::from_secs(1800);

async fn rebuild(fs: &FsClient, plan: &Plan, path: &str, stopped: &[String], pattern: &Pattern) -> anyhow::Result<()> {
    let rate = plan.rate as f64 / (1 << 20) as f64;
    // What the stopped drives held of the file: the bytes to rebuild.
    let info = fs.get_layout(path).await?;
    let geometry = nasd_stripe::geometry::Geometry::new(info.layout).map_err(|e| anyhow::anyhow!("{e}"))?;
    let lost: Vec<usize> =
        info.components.iter().enumerate().filter(|(_, (_, addr))| stopped.contains(addr)).map(|(i, _)| i).collect();
    let bytes: u64 = lost.iter().map(|&i| geometry.component_len(plan.size, i)).sum();
    let t0 = Instant::now();
    let cpu0 = CpuSample::now();
    fs.repair(RepairAction::Rebuild).await?;
    // (time, bytes rebuilt so far) from CLUSTER_STATUS. The manager rebuilds drive by drive, and
    // its progress starts from zero for each: a round that ended counts its whole total.
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    let (mut base, mut round_total, mut round_done) = (0u64, 0u64, 0u64);
    loop {
        let s = fs.cluster_status().await?;
        let now = t0.elapsed();
        let p = s.rebuild;
        if p.bytes_total < round_total || p.bytes_done < round_done {
            base += round_total;
        }
        round_total = p.bytes_total;
        round_done = p.bytes_done;
        if p.bytes_total > 0 {
            samples.push((now, base + p.bytes_done));
        }
        if s.drives.iter().filter(|d| stopped.contains(&d.addr)).all(|d| d.components == 0) {
            break;
        }
        anyhow::ensure!(now < REBUILD_WAIT_MAX, "the rebuild did not finish: {p:?}");
        tokio::time::sleep(PROGRESS_POLL).await;
    }
    let wall = t0.elapsed();
    let cpu = CpuSample::now().since(&cpu0);
    let steady = match (samples.iter().find(|s| s.1 > 0), samples.last()) {
        (Some(a), Some(b)) if b.0 > a.0 && b.1 > a.1 => Some((b.1 - a.1, b.0 - a.0)),
        _ => None,
    };
    println!(
        "## Rebuild: `REPAIR rebuild` of {} component(s) of the {} file on {} stopped drive(s), drives paced at {rate:.0} MiB/s",
        lost.len(),
        info.layout,
        stopped.len()
    );
    println!();
    println!("| measured over | bytes rebuilt | seconds | MiB/s | ratio to one drive's rate | manager cores | other processes' cores |");
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| REPAIR sent → last component swapped in | {} | {:.2} | {:.1} | {:.2} | {:.2} | {:.2} |",
        human(bytes),
        wall.as_secs_f64(),
        mib_s(bytes, wall),
        mib_s(bytes, wall) / rate,
        cpu.manager / wall.as_secs_f64(),
        cpu.others() / wall.as_secs_f64()
    );
    if let Some((b, d)) = steady {
        println!(
            "| CLUSTER_STATUS progress, first to last of {} samples | {} | {:.2} | {:.1} | {:.2} | – | – |",
            samples.len(),
            human(b),
            d.as_secs_f64(),
            mib_s(b, d),
            mib_s(b, d) / rate
        );
    }
    println!();
    // Every component is in service again: the file reads back whole from its new places.
    let m = measure(plan.size, read_file(fs, path, plan.size, pattern)).await?;
    println!("read back after the rebuild, every component on a running drive: {:.0} MiB/s, byte-exact", m.mib_s());
    println!();
    Ok(())
}

/// Waits (bounded) until the manager's heartbeats find the drive at `addr` down.
async fn wait_down(fs: &FsClient, addr: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = fs.cluster_status().await?;
        if s.drives.iter().any(|d| d.addr == addr && !d.up) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the manager never found drive {addr} down");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A directory whose new files get `layout`; its path.
pub(crate) async fn layout_dir(fs: &FsClient, layout: &Layout) -> anyhow::Result<String> {
    let name: String = layout.to_string().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let path = format!("/bench-{name}");
    if fs.stat(&path).await.is_err() {
        fs.mkdir(&path, 0o755).await?;
        fs.set_layout(&path, Some(*layout)).await?;
    }
    Ok(path)
}

pub(crate) async fn measure(
    bytes: u64,
    work: impl std::future::Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<Measured> {
    let cpu0 = CpuSample::now();
    let t = Instant::now();
    work.await?;
    let wall = t.elapsed();
    Ok(Measured { bytes, wall, cpu: CpuSample::now().since(&cpu0) })
}

/// Creates `path` and writes `size` bytes of the pattern through the file
/// system client, then flushes (the drives' FLUSH and the manager's COMMIT).
pub(crate) async fn write_file(fs: &FsClient, path: &str, size: u64, pattern: &Pattern) -> anyhow::Result<()> {
    let f = fs.create(path, 0o644, true, false).await.with_context(|| format!("create {path}"))?;
    let mut src = PatternReader { pattern: pattern.clone(), at: 0, end: size };
    f.write_from(0, size, &mut src).await.with_context(|| format!("write {path}"))?;
    f.flush().await.with_context(|| format!("flush {path}"))?;
    f.close().await?;
    Ok(())
}

/// Opens `path` and reads it whole, checking every byte against the pattern.
pub(crate) async fn read_file(fs: &FsClient, path: &str, size: u64, pattern: &Pattern) -> anyhow::Result<()> {
    let f = fs.open(path, false).await.with_context(|| format!("open {path}"))?;
    let mut check = PatternChecker { pattern: pattern.clone(), at: 0, bad: 0 };
    let got = f.read_to(0, size, &mut check).await.with_context(|| format!("read {path}"))?;
    anyhow::ensure!(got == size && check.at == size, "{path}: read {got} of {size} bytes");
    anyhow::ensure!(check.bad == 0, "{path}: {} bytes read back differ from what was written", check.bad);
    Ok(())
}

// ------------------------------------------------------------ data

/// Bytes of the pattern's repeating block.
const PATTERN_BLOCK: usize = 1 << 20;

/// Test data generated and checked at memory speed: a random 1 MiB block,
/// repeated, each copy starting with its own index (so a block read from
/// the wrong place is caught).
#[derive(Clone)]
pub(crate) struct Pattern(Arc<Vec<u8>>);

impl Pattern {
    pub(crate) fn new() -> Pattern {
        let mut block = vec![0u8; PATTERN_BLOCK];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for chunk in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        Pattern(Arc::new(block))
    }

    /// The pieces of `at..at + len` that lie in one copy of the block:
    /// (offset in the stream, offset in the block, length).
    fn segments(at: u64, len: usize) -> impl Iterator<Item = (usize, usize, usize)> {
        let mut done = 0;
        std::iter::from_fn(move || {
            if done == len {
                return None;
            }
            let off = ((at + done as u64) % PATTERN_BLOCK as u64) as usize;
            let n = (PATTERN_BLOCK - off).min(len - done);
            let seg = (done, off, n);
            done += n;
            Some(seg)
        })
    }

    /// The 8-byte index that starts copy number `(at / block)`, the part of
    /// it at block offset `off` and beyond, at most `n` bytes.
    fn index_part(at: u64, off: usize, n: usize) -> ([u8; 8], std::ops::Range<usize>) {
        let index = (at / PATTERN_BLOCK as u64).to_le_bytes();
        let end = 8usize.saturating_sub(off).min(n);
        (index, 0..end)
    }

    /// Copies the pattern's bytes at `at..at + dst.len()` into `dst`.
    pub(crate) fn fill(&self, at: u64, dst: &mut [u8]) {
        for (d, off, n) in Self::segments(at, dst.len()) {
            let seg = &mut dst[d..d + n];
            seg.copy_from_slice(&self.0[off..off + n]);
            let (index, head) = Self::index_part(at + d as u64, off, n);
            for i in head {
                seg[i] = index[off + i];
            }
        }
    }

    /// How many bytes of `src`, taken as the stream at `at`, differ from the pattern.
    pub(crate) fn mismatches(&self, at: u64, src: &[u8]) -> u64 {
        let mut bad = 0;
        for (d, off, n) in Self::segments(at, src.len()) {
            let seg = &src[d..d + n];
            let (index, head) = Self::index_part(at + d as u64, off, n);
            let h = head.end;
            bad += head.filter(|&i| seg[i] != index[off + i]).count() as u64;
            if seg[h..] != self.0[off + h..off + n] {
                bad += seg[h..].iter().zip(&self.0[off + h..off + n]).filter(|(a, b)| a != b).count() as u64;
            }
        }
        bad
    }
}

struct PatternReader {
    pattern: Pattern,
    at: u64,
    end: u64,
}

impl tokio::io::AsyncRead for PatternReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let n = (buf.remaining() as u64).min(self.end - self.at) as usize;
        self.pattern.fill(self.at, buf.initialize_unfilled_to(n));
        buf.advance(n);
        self.at += n as u64;
        std::task::Poll::Ready(Ok(()))
    }
}

struct PatternChecker {
    pattern: Pattern,
    at: u64,
    bad: u64,
}

impl tokio::io::AsyncWrite for PatternChecker {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let bad = self.pattern.mismatches(self.at, buf);
        self.bad += bad;
        self.at += buf.len() as u64;
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

// ------------------------------------------------------------ CPU time

/// CPU-seconds spent between two samples.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuUse {
    /// This process's threads other than drives' and manager's: the client
    /// (and this harness: pattern generation and checking).
    pub(crate) client: f64,
    /// Drive runtimes' threads (`nasd-drive-N`).
    pub(crate) drives: f64,
    /// The manager runtime's threads.
    pub(crate) manager: f64,
    /// Every CPU of the machine, every process (`/proc/stat`, not idle).
    machine: f64,
    /// Seconds the drives' disk had I/O in flight (every process's I/O).
    disk: Option<f64>,
}

impl CpuUse {
    fn process(&self) -> f64 {
        self.client + self.drives + self.manager
    }

    /// CPU-seconds of every other process (and the kernel's own threads).
    fn others(&self) -> f64 {
        (self.machine - self.process()).max(0.0)
    }
}

/// Cumulative CPU ticks at one moment, and the drives' disk's busy time.
struct CpuSample {
    process: u64,
    drives: u64,
    manager: u64,
    machine: u64,
    disk_ms: Option<u64>,
}

/// The block device (major, minor) the clusters' files are on, for its
/// busy time in `/proc/diskstats`; set once at the start of a run.
pub(crate) static DISK: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();

/// The device holding `dir`.
pub(crate) fn disk_of(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(dir).ok()?.dev();
    Some((libc::major(dev) as u64, libc::minor(dev) as u64))
}

/// Milliseconds the device spent with I/O in flight (`/proc/diskstats`
/// field 13, `io_ticks`), from the device's line.
fn disk_busy_ms(diskstats: &str, (major, minor): (u64, u64)) -> Option<u64> {
    diskstats.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 13 && f[0].parse() == Ok(major) && f[1].parse() == Ok(minor)).then(|| f[12].parse().ok())?
    })
}

impl CpuSample {
    fn now() -> CpuSample {
        let (mut drives, mut manager) = (0, 0);
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for t in tasks.flatten() {
                let Some((name, ticks)) =
                    std::fs::read_to_string(t.path().join("stat")).ok().as_deref().and_then(task_ticks)
                else {
                    continue;
                };
                if name.starts_with(THREAD_PREFIX_DRIVE) {
                    drives += ticks;
                } else if name == THREAD_NAME_MANAGER {
                    manager += ticks;
                }
            }
        }
        let process =
            std::fs::read_to_string("/proc/self/stat").ok().as_deref().and_then(task_ticks).map_or(0, |t| t.1);
        let machine = std::fs::read_to_string("/proc/stat").ok().as_deref().and_then(machine_busy_ticks).unwrap_or(0);
        let disk_ms = DISK
            .get()
            .copied()
            .flatten()
            .and_then(|d| disk_busy_ms(&std::fs::read_to_string("/proc/diskstats").ok()?, d));
        CpuSample { process, drives, manager, machine, disk_ms }
    }

    fn since(&self, before: &CpuSample) -> CpuUse {
        let hz = clock_ticks_per_sec();
        let secs = |a: u64, b: u64| a.saturating_sub(b) as f64 / hz;
        let drives = secs(self.drives, before.drives);
        let manager = secs(self.manager, before.manager);
        let process = secs(self.process, before.process);
        CpuUse {
            client: (process - drives - manager).max(0.0),
            drives,
            manager,
            machine: secs(self.machine, before.machine),
            disk: self.disk_ms.zip(before.disk_ms).map(|(a, b)| a.saturating_sub(b) as f64 / 1000.0),
        }
    }
}

/// A `stat` line's command name and user + system ticks.
fn task_ticks(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_string();
    // After the name: state (field 3), ..., utime (14), stime (15).
    let fields: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

/// Busy ticks of every CPU from `/proc/stat` (all but idle and iowait).
fn machine_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest times are inside user).
    let total: u64 = v.iter().take(8).sum();
    Some(total - v.get(3)? - v.get(4)?)
}

pub(crate) fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

pub(crate) fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub(crate) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_lines_parse() {
        let line = "1234 (nasd-drive-3) S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 1 0 100 0 0";
        assert_eq!(task_ticks(line), Some(("nasd-drive-3".into(), 325)));
        // A name with spaces and parentheses.
        let line = "1 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 1 2 0 0";
        assert_eq!(task_ticks(line), Some(("a (b) c".into(), 3)));
        let stat = "cpu  100 5 50 1000 20 3 7 2 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        assert_eq!(machine_busy_ticks(stat), Some(100 + 5 + 50 + 3 + 7 + 2));
        let diskstats = " 254       0 vda 4674848 152771 317939722 8489733 5832572 717493 649198216 4191594 0 725076 12932438\n 254       1 vda1 1 2 3 4 5 6 7 8 0 99 100\n";
        assert_eq!(disk_busy_ms(diskstats, (254, 0)), Some(725_076));
        assert_eq!(disk_busy_ms(diskstats, (254, 1)), Some(99));
        assert_eq!(disk_busy_ms(diskstats, (8, 0)), None);
    }

    #[test]
    fn the_pattern_checker_accepts_the_pattern_in_any_split_and_catches_a_swap() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let p = Pattern::new();
            let len = 3 * PATTERN_BLOCK as u64 + 12_345;
            let mut data = Vec::new();
            PatternReader { pattern: p.clone(), at: 0, end: len }.read_to_end(&mut data).await.unwrap();
            assert_eq!(data.len() as u64, len);
            let mut ok = PatternChecker { pattern: p.clone(), at: 0, bad: 0 };
            for piece in data.chunks(333_333) {
                ok.write_all(piece).await.unwrap();
            }
            assert_eq!((ok.at, ok.bad), (len, 0));
            // Two whole blocks swapped: only their indexes tell them apart.
            let b = PATTERN_BLOCK;
            let (first, second) = data.split_at_mut(b);
            first[..b].swap_with_slice(&mut second[..b]);
            let mut swapped = PatternChecker { pattern: p, at: 0, bad: 0 };
            swapped.write_all(&data).await.unwrap();
            assert!(swapped.bad > 0);
        });
    }
}
