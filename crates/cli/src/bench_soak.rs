//! `nasd bench soak` (issue 11): legitimate clients keep working while
//! hostile connections sit on every daemon, and the daemons' memory stays
//! bounded.
//!
//! A manager and drives run as **separate processes** (this binary's
//! `nasd manager` and `nasd drive`, default settings, on loopback), so each
//! daemon's resident memory is its own (`/proc/PID/status`, sampled). Beside
//! them, in this process:
//! - legitimate clients, each its own `FsClient` logged in as a normal user,
//!   run mixed operations (create, put, get, stat, ls, rm, rename) in a
//!   directory of their own and check every answer against a model of that
//!   directory (a read returns the bytes written, a listing the names
//!   created); any error or wrong answer is counted;
//! - idle connections: TCP opened to a daemon, nothing sent;
//! - slow-drip connections: a valid frame header (a drive's request header,
//!   or a TLS record header for the manager), then one byte every few
//!   seconds.
//!
//! Hostile connections come from loopback addresses other than 127.0.0.1
//! (`127.0.1.1` and up, a few connections each), spread over every daemon:
//! the daemons bound connections per peer (`CONNECTIONS_PER_PEER_MAX`,
//! `SESSIONS_PER_PEER_MAX`), so from one address most would be refused at
//! accept, by design, and the soak would test nothing; from many they are
//! admitted and hold slots until the daemon drops them. When a daemon drops
//! one, it is opened again, so the hostile load stays on for the whole run.
//! The legitimate clients all come from 127.0.0.1, with the daemons'
//! default per-peer bounds.
//!
//! Nothing here asserts a timing. The run fails if a legitimate client saw
//! an error or a wrong answer, or if a daemon exited.

use crate::size::{human, parse_size};
use crate::xorshift::Rng;
use anyhow::Context;
use nasd_fs::{FsClient, FsConfig, Layout};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// `nasd bench soak` flags.
#[derive(clap::Args)]
pub struct SoakArgs {
    /// How long the load runs with the hostile connections, seconds.
    #[arg(long, default_value_t = 300)]
    seconds: u64,
    /// How long the baseline runs first: the same clients on fresh daemons
    /// without hostile connections, seconds (0: no baseline).
    #[arg(long, default_value_t = 300)]
    baseline_seconds: u64,
    /// Legitimate clients (each its own login and connections).
    #[arg(long, default_value_t = 64)]
    clients: u32,
    /// Idle hostile connections (opened, nothing sent).
    #[arg(long, default_value_t = 500)]
    idle: u32,
    /// Slow-drip hostile connections (a frame header, then a byte every
    /// --drip-secs).
    #[arg(long, default_value_t = 500)]
    slow: u32,
    /// Seconds between the bytes of a slow-drip connection.
    #[arg(long, default_value_t = 3)]
    drip_secs: u64,
    /// Hostile connections per source address (127.0.1.1 and up).
    #[arg(long, default_value_t = 10)]
    per_address: u32,
    /// Drives (separate processes).
    #[arg(long, default_value_t = 4)]
    drives: u32,
    /// Layout of the clients' files.
    #[arg(long, default_value = "rs:2+1")]
    layout: String,
    /// Largest file a client puts (sizes are uniform from 0 to this).
    #[arg(long, default_value = "1MiB")]
    file_size_max: String,
    /// How often the daemons' memory is sampled, milliseconds.
    #[arg(long, default_value_t = 1000)]
    sample_ms: u64,
    /// After the load stops, how long to wait before the last memory sample
    /// (longer than the daemons' 10 s limit for unauthenticated
    /// connections, so theirs are gone), seconds.
    #[arg(long, default_value_t = 15)]
    cool_down_secs: u64,
    /// Where the daemons keep their files [default: a temporary directory].
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// Files a client keeps at most in its directory (a put past it removes one first).
const FILES_PER_CLIENT_MAX: usize = 16;
/// Error messages kept for the report (all are counted).
const ERRORS_SHOWN_MAX: usize = 20;
/// Longest a daemon may take to start listening or to stop after SIGTERM
/// (a hang, not a timing).
const DAEMON_WAIT_MAX: Duration = Duration::from_secs(120);
/// Longest a hostile connect may take before it counts as refused.
const ATTACK_CONNECT_MAX: Duration = Duration::from_secs(10);
/// Pause before a hostile connection the daemon dropped (or refused) is
/// opened again.
const ATTACK_REOPEN_PAUSE: Duration = Duration::from_millis(100);
/// Hostile connections are first opened spread over this long (the
/// daemons' limit for unauthenticated connections), so the daemon does not
/// drop them all at once; the number open is sampled after it.
const ATTACK_RAMP: Duration = Duration::from_secs(10);
/// Source addresses for hostile connections: 127.0.1.1 and up (within 127/8).
const ATTACK_ADDRESSES_MAX: u32 = 250 * 250;

/// Runs the soak.
pub async fn run(args: SoakArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.seconds > 0, "--seconds must be at least 1");
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!((1..=64).contains(&args.drives), "--drives must be 1 to 64");
    anyhow::ensure!(args.drip_secs > 0, "--drip-secs must be at least 1");
    anyhow::ensure!(args.per_address > 0, "--per-address must be at least 1");
    anyhow::ensure!(args.sample_ms > 0, "--sample-ms must be at least 1");
    let hostile = args.idle + args.slow;
    anyhow::ensure!(
        hostile.div_ceil(args.per_address) <= ATTACK_ADDRESSES_MAX,
        "--idle + --slow over --per-address needs more than {ATTACK_ADDRESSES_MAX} source addresses"
    );
    let layout = Layout::parse(&args.layout).map_err(|e| anyhow::anyhow!("--layout {}: {e}", args.layout))?;
    anyhow::ensure!(
        layout.components() <= args.drives as usize,
        "--layout {layout} needs {} drives",
        layout.components()
    );
    let file_max = parse_size(&args.file_size_max).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(file_max <= 64 << 20, "--file-size-max must be at most 64 MiB");
    // Every hostile socket, and each client's connections to the manager and the drives, is a
    // descriptor of this process.
    let fds_needed = hostile as u64 + args.clients as u64 * (1 + 4 * args.drives as u64) + 256;
    raise_fd_limit(fds_needed)?;

    let tmp = tempfile::tempdir_in(args.dir.as_deref().unwrap_or(&std::env::temp_dir()))?;
    let exe = std::env::current_exe().context("cannot find this program to start the daemons")?;
    println!("# nasd bench soak");
    println!();
    println!(
        "A manager and {} drives, each a separate process with its default limits; {} legitimate clients \
         (127.0.0.1), files {layout} of 0..{} each.",
        args.drives,
        args.clients,
        human(file_max)
    );
    println!(
        "Hostile: {} idle and {} slow-drip connections (a byte every {} s), from {} loopback addresses \
         ({} each) other than 127.0.0.1, over all {} daemons.",
        args.idle,
        args.slow,
        args.drip_secs,
        hostile.div_ceil(args.per_address),
        args.per_address,
        args.drives + 1
    );
    println!();
    let mut rounds = Vec::new();
    if args.baseline_seconds > 0 {
        rounds.push(Round { name: "baseline: clients only", hostile: false, seconds: args.baseline_seconds });
    }
    rounds.push(Round { name: "soak: clients beside the hostile connections", hostile: true, seconds: args.seconds });
    let mut results = Vec::new();
    for (n, round) in rounds.iter().enumerate() {
        let dir = tmp.path().join(format!("round-{n}"));
        std::fs::create_dir(&dir)?;
        let mut daemons = Vec::new();
        let result = soak(&args, round, layout, file_max, &dir, &exe, &mut daemons).await;
        // Stopped whatever happened, each by its own process id.
        let mut unclean = Vec::new();
        for d in &mut daemons {
            match d.stop().await {
                Ok(status) if status.success() => {}
                Ok(status) => unclean.push(format!("{}: {status}", d.name)),
                Err(e) => unclean.push(format!("{}: {e:#}", d.name)),
            }
        }
        let failed = match result {
            Ok(r) => {
                print!("{}", r.text);
                println!(
                    "Daemons stopped by SIGTERM: {}.",
                    if unclean.is_empty() { "all exited cleanly".to_string() } else { unclean.join("; ") }
                );
                println!();
                let failed = (r.errors > 0).then(|| format!("{} legitimate-client errors (listed above)", r.errors));
                results.push(r);
                failed
                    .or((!unclean.is_empty()).then(|| format!("daemons did not stop cleanly: {}", unclean.join("; "))))
            }
            Err(e) => Some(format!("{e:#}")),
        };
        if let Some(why) = failed {
            let kept = tmp.keep();
            eprintln!("the daemons' files and logs are kept in {}", kept.display());
            anyhow::bail!("{}: {why}", round.name);
        }
    }
    if let [base, soak] = &results[..] {
        println!("## Memory with the hostile connections against the baseline");
        println!();
        println!("| process | baseline max RSS | soak max RSS | ratio | soak max RSS, first half | second half |");
        println!("|---|---|---|---|---|---|");
        for (b, s) in base.memory.iter().zip(&soak.memory) {
            let (Some(bm), Some(sm)) = (b.max_during(), s.max_during()) else { continue };
            println!(
                "| {} | {} | {} | {:.2} | {} | {} |",
                s.name,
                mib(Some(bm)),
                mib(Some(sm)),
                sm as f64 / bm as f64,
                mib(s.max_first),
                mib(s.max_second)
            );
        }
        println!();
    }
    Ok(())
}

/// One load of a run: fresh daemons, the clients, and the hostile
/// connections or not.
struct Round {
    name: &'static str,
    hostile: bool,
    seconds: u64,
}

/// What a round found.
struct RoundResult {
    text: String,
    errors: u64,
    memory: Vec<DaemonMemory>,
}

/// KiB as MiB with one decimal, or "–".
fn mib(kib: Option<u64>) -> String {
    kib.map_or("–".to_string(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

/// Starts the daemons (into `daemons`, for the caller to stop), runs the
/// round's load, and returns its report.
async fn soak(
    args: &SoakArgs,
    round: &Round,
    layout: Layout,
    file_max: u64,
    dir: &Path,
    exe: &Path,
    daemons: &mut Vec<Daemon>,
) -> anyhow::Result<RoundResult> {
    use std::fmt::Write;
    for i in 0..args.drives {
        let data = dir.join(format!("drive-{i}"));
        let d = Daemon::start(format!("drive {i}"), exe, dir, |addr| {
            vec![
                "drive".into(),
                "--data".into(),
                data.clone().into(),
                "--listen".into(),
                addr.to_string().into(),
                "--capacity".into(),
                "4GiB".into(),
            ]
        })
        .await?;
        daemons.push(d);
    }
    let mdata = dir.join("manager");
    let manager = Daemon::start("manager".into(), exe, dir, |addr| {
        vec!["manager".into(), "--data".into(), mdata.clone().into(), "--listen".into(), addr.to_string().into()]
    })
    .await?;
    let manager_addr = manager.addr;
    daemons.push(manager);

    // The administrator takes the drives into service and makes the clients' user and directories.
    let tls = nasd_manager::tls::TlsFiles::in_dir(&mdata.join("tls"));
    let admin_password = std::fs::read_to_string(mdata.join("admin.password"))
        .context("the manager wrote no admin.password")?
        .trim()
        .to_string();
    let config = |user: &str, password: &str| FsConfig {
        manager: manager_addr.to_string(),
        server_name: "localhost".into(),
        ca_cert: tls.ca.clone(),
        user: user.into(),
        password: password.into(),
        ..FsConfig::default()
    };
    let admin = FsClient::connect(&config("admin", &admin_password)).await.context("admin login")?;
    for d in daemons.iter().filter(|d| d.name.starts_with("drive")) {
        let key = nasd_crypto::read_key_file(&dir.join(d.name.replace(' ', "-")).join("master.key"))?;
        admin.add_drive(&d.addr.to_string(), &key).await.with_context(|| format!("adding {}", d.name))?;
    }
    let password = nasd_crypto::Key::random().to_hex()[..24].to_string();
    admin.add_user("soak", &password, 0, 0, false).await?;
    let uid = admin.users().await?.into_iter().find(|u| u.name == "soak").context("user soak not listed")?.uid;
    admin.mkdir("/soak", 0o755).await?;
    admin.set_layout("/soak", Some(layout)).await?;
    for i in 0..args.clients {
        let d = format!("/soak/c{i}");
        admin.mkdir(&d, 0o755).await?;
        admin.chown(&d, Some(uid), None).await?;
    }
    let mut clients = Vec::new();
    for i in 0..args.clients {
        clients.push(FsClient::connect(&config("soak", &password)).await.with_context(|| format!("client {i} login"))?);
    }
    drop(admin);

    // Memory before any load, then sampled until the end.
    let watched: Vec<(String, u32)> = daemons.iter().map(|d| (d.name.clone(), d.pid())).collect();
    let memory = Arc::new(Mutex::new(Memory::new(&watched)));
    sample(&memory, Phase::Before);
    let (stop_tx, stop_rx) = watch::channel(false);
    let started = Instant::now();
    let length = Duration::from_secs(round.seconds);
    let sampler = {
        let (memory, mut stop, every) = (memory.clone(), stop_rx.clone(), Duration::from_millis(args.sample_ms));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {
                        sample(&memory, Phase::During { second_half: started.elapsed() > length / 2 })
                    }
                    _ = stop.changed() => return,
                }
            }
        })
    };

    // Hostile connections, spread over the daemons, from 127.0.1.1 and up.
    let targets: Vec<(String, SocketAddr, bool)> =
        daemons.iter().map(|d| (d.name.clone(), d.addr, d.name == "manager")).collect();
    let idle = Arc::new(AttackStats::default());
    let slow = Arc::new(AttackStats::default());
    let mut attackers = Vec::new();
    let hostile = if round.hostile { args.idle + args.slow } else { 0 };
    for n in 0..hostile {
        let (kind, stats) = if n < args.idle { (Kind::Idle, idle.clone()) } else { (Kind::Slow, slow.clone()) };
        let (_, addr, manager) = targets[n as usize % targets.len()].clone();
        let local = attack_address(n / args.per_address);
        let (drip, stop) = (Duration::from_secs(args.drip_secs), stop_rx.clone());
        let first = ATTACK_RAMP * n / hostile;
        attackers.push(tokio::spawn(attacker(kind, local, addr, manager, first, drip, stats, stop)));
    }
    let gauge = {
        let (idle, slow, mut stop) = (idle.clone(), slow.clone(), stop_rx.clone());
        let every = Duration::from_millis(args.sample_ms);
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(ATTACK_RAMP) => {}
                _ = stop.changed() => return,
            }
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {
                        // Not once the load is stopping: its connections are being closed.
                        if *stop.borrow() {
                            return;
                        }
                        idle.sample_open();
                        slow.sample_open();
                    }
                    _ = stop.changed() => return,
                }
            }
        })
    };

    // The legitimate clients.
    let deadline = started + length;
    let ops = Arc::new(OpStats::default());
    let mut workers = Vec::new();
    for (i, fs) in clients.into_iter().enumerate() {
        let ops = ops.clone();
        workers.push(tokio::spawn(client(i, fs, file_max, deadline, ops)));
    }
    for w in workers {
        w.await.context("a client task panicked")?;
    }
    let ran = started.elapsed();
    sample(&memory, Phase::During { second_half: true });
    let _ = stop_tx.send(true);
    for a in attackers {
        a.await.context("an attacker task panicked")?;
    }
    let _ = gauge.await;
    let _ = sampler.await;
    let mut died = Vec::new();
    for d in daemons.iter_mut() {
        if !d.alive() {
            died.push(d.name.clone());
        }
    }
    anyhow::ensure!(died.is_empty(), "daemons exited during the soak: {}", died.join(", "));
    tokio::time::sleep(Duration::from_secs(args.cool_down_secs)).await;
    sample(&memory, Phase::After);

    let mut out = String::new();
    writeln!(out, "## {} ({} s)", round.name, ran.as_secs())?;
    writeln!(out)?;
    ops.report(&mut out, ran)?;
    if round.hostile {
        writeln!(out, "Hostile connections (each opened again when the daemon drops it):")?;
        writeln!(out)?;
        writeln!(
            out,
            "| kind | asked for | opened | refused at connect | dropped by the daemon | held until dropped, mean s | longest held, s | open at once after the first 10 s (min / mean / max of samples) |"
        )?;
        writeln!(out, "|---|---|---|---|---|---|---|---|")?;
        idle.report(&mut out, "idle", args.idle)?;
        slow.report(&mut out, "slow drip", args.slow)?;
        writeln!(out)?;
    }
    let memory = std::mem::take(&mut *memory.lock().expect("memory lock"));
    memory.report(&mut out, args.cool_down_secs)?;
    Ok(RoundResult { text: out, errors: ops.errors.load(Ordering::Relaxed), memory: memory.daemons })
}

/// Raises this process's soft limit on open files to at least `needed` (up
/// to the hard limit), or says why the soak cannot run.
fn raise_fd_limit(needed: u64) -> anyhow::Result<()> {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on a valid struct.
    unsafe {
        anyhow::ensure!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0, "getrlimit failed");
        if l.rlim_cur < needed {
            l.rlim_cur = needed.min(l.rlim_max);
            anyhow::ensure!(libc::setrlimit(libc::RLIMIT_NOFILE, &l) == 0, "setrlimit failed");
        }
    }
    anyhow::ensure!(
        l.rlim_cur >= needed,
        "the soak needs {needed} open files and the hard limit is {} (ulimit -Hn)",
        l.rlim_max
    );
    Ok(())
}

// ------------------------------------------------------------ daemons

/// A `nasd` daemon started by the soak as a child process.
struct Daemon {
    name: String,
    addr: SocketAddr,
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    /// Starts `exe args(addr)` in `dir` on a free loopback port, its output
    /// in `dir/NAME.log`, and waits until it accepts connections.
    async fn start(
        name: String,
        exe: &Path,
        dir: &Path,
        args: impl Fn(SocketAddr) -> Vec<OsString>,
    ) -> anyhow::Result<Daemon> {
        let log = dir.join(format!("{}.log", name.replace(' ', "-")));
        // A port free now may be taken before the daemon binds it: then another.
        for _ in 0..5 {
            let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
            let logf = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
            let child = Command::new(exe)
                .args(args(addr))
                .current_dir(dir)
                .env("NO_COLOR", "1")
                .env_remove("NASD_CONFIG")
                .env_remove("NASD_PASSWORD")
                .env_remove("NASD_NEW_PASSWORD")
                .stdin(Stdio::null())
                .stdout(logf.try_clone()?)
                .stderr(logf)
                .spawn()
                .with_context(|| format!("cannot start {}", exe.display()))?;
            let mut d = Daemon { name: name.clone(), addr, child: Some(child), log: log.clone() };
            let deadline = Instant::now() + DAEMON_WAIT_MAX;
            loop {
                if !d.alive() {
                    let tail = d.log_tail();
                    if tail.contains("cannot listen") {
                        break;
                    }
                    anyhow::bail!("{name} exited at startup; its log ends:\n{tail}");
                }
                let probe = tokio::time::timeout(Duration::from_millis(200), tokio::net::TcpStream::connect(addr));
                if let Ok(Ok(_)) = probe.await {
                    return Ok(d);
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "{name} did not listen in time; its log ends:\n{}",
                    d.log_tail()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        anyhow::bail!("{name}: no free port after five tries")
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Whether the process is still running.
    fn alive(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(Ok(Some(_))) | Some(Err(_)) | None => false,
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM, and a bounded wait for the exit; SIGKILL past it.
    async fn stop(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let Some(mut child) = self.child.take() else { anyhow::bail!("not running") };
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + DAEMON_WAIT_MAX;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("did not stop within {} s of SIGTERM; killed", DAEMON_WAIT_MAX.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ------------------------------------------------------------ memory

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Before,
    During { second_half: bool },
    After,
}

/// One daemon's memory figures, KiB.
#[derive(Default)]
struct DaemonMemory {
    name: String,
    pid: u32,
    before: Option<u64>,
    max_first: Option<u64>,
    max_second: Option<u64>,
    end: Option<u64>,
    after: Option<u64>,
    hwm: Option<u64>,
    fds_max: Option<u64>,
    samples: u64,
}

impl DaemonMemory {
    fn max_during(&self) -> Option<u64> {
        self.max_first.max(self.max_second)
    }
}

#[derive(Default)]
struct Memory {
    daemons: Vec<DaemonMemory>,
    own: DaemonMemory,
}

impl Memory {
    fn new(watched: &[(String, u32)]) -> Memory {
        Memory {
            daemons: watched
                .iter()
                .map(|(n, p)| DaemonMemory { name: n.clone(), pid: *p, ..Default::default() })
                .collect(),
            own: DaemonMemory {
                name: "this process (clients and hostile sockets)".into(),
                pid: std::process::id(),
                ..Default::default()
            },
        }
    }

    fn report(&self, out: &mut String, cool_down: u64) -> std::fmt::Result {
        use std::fmt::Write;
        writeln!(out, "Resident memory (VmRSS) of each process, sampled:")?;
        writeln!(out)?;
        writeln!(
            out,
            "| process | before the load | max, first half | max, second half | at the end | {cool_down} s after the end | peak (VmHWM) | open descriptors, max during | samples |"
        )?;
        writeln!(out, "|---|---|---|---|---|---|---|---|---|")?;
        for d in self.daemons.iter().chain([&self.own]) {
            writeln!(
                out,
                "| {} (pid {}) | {} | {} | {} | {} | {} | {} | {} | {} |",
                d.name,
                d.pid,
                mib(d.before),
                mib(d.max_first),
                mib(d.max_second),
                mib(d.end),
                mib(d.after),
                mib(d.hwm),
                d.fds_max.map_or("–".into(), |f| f.to_string()),
                d.samples
            )?;
        }
        writeln!(out)?;
        Ok(())
    }
}

fn sample(memory: &Mutex<Memory>, phase: Phase) {
    let mut m = memory.lock().expect("memory lock");
    let Memory { daemons, own } = &mut *m;
    for d in daemons.iter_mut().chain([own]) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid)).unwrap_or_default();
        let rss = status_kib(&status, "VmRSS:");
        let fds = std::fs::read_dir(format!("/proc/{}/fd", d.pid)).ok().map(|e| e.count() as u64);
        d.samples += 1;
        d.hwm = status_kib(&status, "VmHWM:").or(d.hwm);
        match phase {
            Phase::Before => d.before = rss,
            Phase::During { second_half } => {
                let max = if second_half { &mut d.max_second } else { &mut d.max_first };
                *max = (*max).max(rss);
                d.end = rss;
                d.fds_max = d.fds_max.max(fds);
            }
            Phase::After => d.after = rss,
        }
    }
}

/// A `/proc/PID/status` field in KiB (`VmRSS:   1234 kB`).
fn status_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix(field)?.split_whitespace().next()?.parse().ok())
}

// ------------------------------------------------------------ hostile connections

#[derive(Clone, Copy)]
enum Kind {
    Idle,
    Slow,
}

#[derive(Default)]
struct AttackStats {
    opened: AtomicU64,
    refused: AtomicU64,
    dropped: AtomicU64,
    held_ms_sum: AtomicU64,
    held_ms_max: AtomicU64,
    open: AtomicI64,
    /// Samples of `open`: count, sum, min, max.
    samples: Mutex<(u64, i64, Option<i64>, i64)>,
}

impl AttackStats {
    fn sample_open(&self) {
        let n = self.open.load(Ordering::Relaxed);
        let mut s = self.samples.lock().expect("samples lock");
        s.0 += 1;
        s.1 += n;
        s.2 = Some(s.2.map_or(n, |m| m.min(n)));
        s.3 = s.3.max(n);
    }

    fn report(&self, out: &mut String, kind: &str, asked: u32) -> std::fmt::Result {
        use std::fmt::Write;
        let dropped = self.dropped.load(Ordering::Relaxed);
        let (count, sum, min, max) = *self.samples.lock().expect("samples lock");
        writeln!(
            out,
            "| {kind} | {asked} | {} | {} | {dropped} | {} | {:.1} | {} / {} / {max} |",
            self.opened.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
            if dropped > 0 {
                format!("{:.1}", self.held_ms_sum.load(Ordering::Relaxed) as f64 / dropped as f64 / 1000.0)
            } else {
                "–".into()
            },
            self.held_ms_max.load(Ordering::Relaxed) as f64 / 1000.0,
            min.unwrap_or(0),
            if count > 0 { sum / count as i64 } else { 0 },
        )
    }
}

/// Source address of hostile connection group `n`: 127.0.1.1, 127.0.1.2, …
fn attack_address(n: u32) -> Ipv4Addr {
    Ipv4Addr::new(127, (n / 250 / 250) as u8, (1 + n / 250 % 250) as u8, (1 + n % 250) as u8)
}

/// The first bytes of a frame a daemon would wait for the rest of: a
/// drive's request header (a READ, no key), or a TLS handshake record
/// header for the manager; then the bytes dripped after it.
fn drip_bytes(manager: bool) -> (Vec<u8>, Vec<u8>) {
    if manager {
        // A TLS record: handshake (22), TLS 1.0 record version, 512 bytes to follow.
        (vec![22, 3, 1, 2, 0], vec![1; 512])
    } else {
        let req = nasd_proto::Request::Read {
            partition: 1,
            object: 1,
            regions: vec![nasd_proto::Region { offset: 0, length: 4096 }],
        };
        let frame = nasd_proto::FramePrefix::encode(
            &nasd_proto::FrameHeader::request(req.opcode(), 1),
            &[],
            &req.encode_args(),
            &[0; nasd_proto::limits::DIGEST_LEN],
        );
        let (head, rest) = frame.split_at(nasd_proto::limits::HEADER_LEN);
        (head.to_vec(), rest.to_vec())
    }
}

/// One hostile connection, first opened after `first`, then again whenever
/// the daemon drops it, until `stop`.
#[allow(clippy::too_many_arguments)]
async fn attacker(
    kind: Kind,
    local: Ipv4Addr,
    target: SocketAddr,
    manager: bool,
    first: Duration,
    drip: Duration,
    stats: Arc<AttackStats>,
    mut stop: watch::Receiver<bool>,
) {
    let (head, rest) = drip_bytes(manager);
    tokio::select! {
        _ = tokio::time::sleep(first) => {}
        _ = stop.changed() => return,
    }
    while !*stop.borrow() {
        let connect = async {
            let s = tokio::net::TcpSocket::new_v4()?;
            s.bind(SocketAddr::new(local.into(), 0))?;
            s.connect(target).await
        };
        let stream = tokio::select! {
            r = tokio::time::timeout(ATTACK_CONNECT_MAX, connect) => r,
            _ = stop.changed() => return,
        };
        let Ok(Ok(mut stream)) = stream else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            pause(&mut stop).await;
            continue;
        };
        stats.opened.fetch_add(1, Ordering::Relaxed);
        stats.open.fetch_add(1, Ordering::Relaxed);
        let t0 = Instant::now();
        let dropped = match kind {
            Kind::Idle => hold(&mut stream, &mut stop).await,
            Kind::Slow => drip_to(&mut stream, &head, &rest, drip, &mut stop).await,
        };
        stats.open.fetch_sub(1, Ordering::Relaxed);
        if !dropped {
            return;
        }
        let held = t0.elapsed().as_millis() as u64;
        stats.dropped.fetch_add(1, Ordering::Relaxed);
        stats.held_ms_sum.fetch_add(held, Ordering::Relaxed);
        stats.held_ms_max.fetch_max(held, Ordering::Relaxed);
        pause(&mut stop).await;
    }
}

async fn pause(stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(ATTACK_REOPEN_PAUSE) => {}
        _ = stop.changed() => {}
    }
}

/// Sends nothing; true when the daemon closes the connection, false at `stop`.
async fn hold(stream: &mut tokio::net::TcpStream, stop: &mut watch::Receiver<bool>) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        tokio::select! {
            r = stream.read(&mut buf) => match r {
                Ok(0) | Err(_) => return true,
                Ok(_) => {} // an answer (a refusal): keep holding
            },
            _ = stop.changed() => return false,
        }
    }
}

/// Sends `head`, then `rest` a byte every `every` (over again when it is
/// all sent); true when the daemon closes the connection, false at `stop`.
async fn drip_to(
    stream: &mut tokio::net::TcpStream,
    head: &[u8],
    rest: &[u8],
    every: Duration,
    stop: &mut watch::Receiver<bool>,
) -> bool {
    let (mut rd, mut wr) = stream.split();
    let send = async {
        wr.write_all(head).await?;
        for &b in rest.iter().cycle() {
            tokio::time::sleep(every).await;
            wr.write_all(&[b]).await?;
        }
        std::io::Result::Ok(())
    };
    let closed = async {
        let mut buf = [0u8; 4096];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::select! {
        _ = send => true,
        () = closed => true,
        _ = stop.changed() => false,
    }
}

// ------------------------------------------------------------ legitimate clients

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Op {
    Create,
    Put,
    Get,
    Stat,
    Ls,
    Rename,
    Rm,
}

impl Op {
    const ALL: [Op; 7] = [Op::Create, Op::Put, Op::Get, Op::Stat, Op::Ls, Op::Rename, Op::Rm];

    fn name(self) -> &'static str {
        match self {
            Op::Create => "create (empty, exclusive)",
            Op::Put => "put (create, write, flush, close)",
            Op::Get => "get (open, read, compare)",
            Op::Stat => "stat (size compared)",
            Op::Ls => "ls (names compared)",
            Op::Rename => "rename",
            Op::Rm => "rm",
        }
    }
}

#[derive(Default)]
struct OpStats {
    /// Per operation: count, total and longest latency (µs).
    per_op: Mutex<BTreeMap<Op, (u64, u64, u64)>>,
    bytes_written: AtomicU64,
    bytes_read: AtomicU64,
    errors: AtomicU64,
    shown: Mutex<Vec<String>>,
}

impl OpStats {
    fn record(&self, op: Op, took: Duration) {
        let us = took.as_micros() as u64;
        let mut m = self.per_op.lock().expect("ops lock");
        let e = m.entry(op).or_default();
        e.0 += 1;
        e.1 += us;
        e.2 = e.2.max(us);
    }

    fn error(&self, client: usize, op: Op, message: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut shown = self.shown.lock().expect("errors lock");
        if shown.len() < ERRORS_SHOWN_MAX {
            shown.push(format!("client {client}, {}: {message}", op.name()));
        }
    }

    fn report(&self, out: &mut String, ran: Duration) -> std::fmt::Result {
        use std::fmt::Write;
        let errors = self.errors.load(Ordering::Relaxed);
        writeln!(out, "Legitimate clients: {errors} errors")?;
        writeln!(out)?;
        writeln!(out, "| operation | done | per second | mean ms | longest ms |")?;
        writeln!(out, "|---|---|---|---|---|")?;
        let m = self.per_op.lock().expect("ops lock");
        let secs = ran.as_secs_f64();
        let mut total = 0;
        for op in Op::ALL {
            let (n, sum, max) = m.get(&op).copied().unwrap_or_default();
            total += n;
            let mean = if n > 0 { sum as f64 / n as f64 / 1000.0 } else { 0.0 };
            writeln!(out, "| {} | {n} | {:.1} | {mean:.1} | {:.1} |", op.name(), n as f64 / secs, max as f64 / 1000.0)?;
        }
        writeln!(out, "| all | {total} | {:.1} | | |", total as f64 / secs)?;
        writeln!(out)?;
        writeln!(
            out,
            "data: {} written, {} read back and compared",
            human(self.bytes_written.load(Ordering::Relaxed)),
            human(self.bytes_read.load(Ordering::Relaxed))
        )?;
        writeln!(out)?;
        for e in self.shown.lock().expect("errors lock").iter() {
            writeln!(out, "- error: {e}")?;
        }
        if errors > 0 {
            writeln!(out)?;
        }
        Ok(())
    }
}

/// The content of a file put with `seed`: `size` bytes.
fn content(seed: u64, size: u64) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    let mut out = Vec::with_capacity(size as usize);
    while (out.len() as u64) < size {
        let n = (size as usize - out.len()).min(8);
        out.extend_from_slice(&r.next().to_le_bytes()[..n]);
    }
    out
}

/// What a client's directory holds: name → (content seed, size).
type Model = BTreeMap<String, (u64, u64)>;

/// One legitimate client: operations until `deadline`, each answer checked
/// against the model of its directory.
async fn client(i: usize, fs: FsClient, file_max: u64, deadline: Instant, stats: Arc<OpStats>) {
    let dir = format!("/soak/c{i}");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9));
    let mut model = Model::new();
    let mut next_name = 0u64;
    while Instant::now() < deadline {
        let roll = rng.below(100);
        let op = match roll {
            _ if model.is_empty() => Op::Put,
            0..=9 => Op::Create,
            10..=34 => Op::Put,
            35..=59 => Op::Get,
            60..=71 => Op::Stat,
            72..=79 => Op::Ls,
            80..=89 => Op::Rename,
            _ => Op::Rm,
        };
        let op = if matches!(op, Op::Create | Op::Put) && model.len() >= FILES_PER_CLIENT_MAX { Op::Rm } else { op };
        let pick = model.keys().nth(rng.below(model.len() as u64) as usize).cloned();
        let t = Instant::now();
        let result = run_op(op, &fs, &dir, &mut model, pick, &mut next_name, &mut rng, file_max, &stats).await;
        stats.record(op, t.elapsed());
        if let Err(e) = result {
            stats.error(i, op, format!("{e:#}"));
            // The model may no longer match the directory: start again from what is there.
            model = resync(&fs, &dir).await.unwrap_or_default();
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_op(
    op: Op,
    fs: &FsClient,
    dir: &str,
    model: &mut Model,
    pick: Option<String>,
    next_name: &mut u64,
    rng: &mut Rng,
    file_max: u64,
    stats: &OpStats,
) -> anyhow::Result<()> {
    let mut fresh = || {
        *next_name += 1;
        format!("f{next_name}")
    };
    match op {
        Op::Create => {
            let name = fresh();
            let f = fs.create(&format!("{dir}/{name}"), 0o644, true, false).await?;
            f.close().await?;
            model.insert(name, (0, 0));
        }
        Op::Put => {
            let name = fresh();
            let (seed, size) = (rng.next(), rng.below(file_max + 1));
            fs.write_file(&format!("{dir}/{name}"), &content(seed, size)).await?;
            stats.bytes_written.fetch_add(size, Ordering::Relaxed);
            model.insert(name, (seed, size));
        }
        Op::Get => {
            let name = pick.context("no file")?;
            let (seed, size) = model[&name];
            let got = fs.read_file(&format!("{dir}/{name}")).await?;
            stats.bytes_read.fetch_add(got.len() as u64, Ordering::Relaxed);
            anyhow::ensure!(got.len() as u64 == size, "{name}: read {} bytes, {size} were written", got.len());
            anyhow::ensure!(got == content(seed, size), "{name}: the bytes read differ from those written");
        }
        Op::Stat => {
            let name = pick.context("no file")?;
            let st = fs.stat(&format!("{dir}/{name}")).await?;
            anyhow::ensure!(
                st.attr.size == model[&name].1,
                "{name}: size {} for {} written",
                st.attr.size,
                model[&name].1
            );
        }
        Op::Ls => {
            let names: Vec<String> = fs.readdir(dir).await?.into_iter().map(|(n, _)| n).collect();
            let mut names: Vec<&str> = names.iter().map(String::as_str).filter(|n| *n != "." && *n != "..").collect();
            names.sort_unstable();
            let expected: Vec<&str> = model.keys().map(String::as_str).collect();
            anyhow::ensure!(names == expected, "ls {dir}: {names:?}, expected {expected:?}");
        }
        Op::Rename => {
            let name = pick.context("no file")?;
            let to = fresh();
            fs.rename(&format!("{dir}/{name}"), &format!("{dir}/{to}")).await?;
            let v = model.remove(&name).expect("picked from the model");
            model.insert(to, v);
        }
        Op::Rm => {
            let name = pick.context("no file")?;
            fs.unlink(&format!("{dir}/{name}")).await?;
            model.remove(&name);
        }
    }
    Ok(())
}

/// After an error, a model of what the directory holds now (contents
/// unknown, so those files are removed).
async fn resync(fs: &FsClient, dir: &str) -> anyhow::Result<Model> {
    for (name, _) in fs.readdir(dir).await? {
        if name != "." && name != ".." {
            fs.unlink(&format!("{dir}/{name}")).await?;
        }
    }
    Ok(Model::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_parse() {
        let s = "Name:\tnasd\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(status_kib(s, "VmRSS:"), Some(10240));
        assert_eq!(status_kib(s, "VmHWM:"), Some(20480));
        assert_eq!(status_kib(s, "VmSwap:"), None);
    }

    #[test]
    fn attack_addresses_are_loopback_and_not_127_0_0_1() {
        assert_eq!(attack_address(0), Ipv4Addr::new(127, 0, 1, 1));
        assert_eq!(attack_address(249), Ipv4Addr::new(127, 0, 1, 250));
        assert_eq!(attack_address(250), Ipv4Addr::new(127, 0, 2, 1));
        let last = attack_address(ATTACK_ADDRESSES_MAX - 1);
        assert!(last.is_loopback() && last != Ipv4Addr::LOCALHOST, "{last}");
        let all: std::collections::BTreeSet<_> = (0..ATTACK_ADDRESSES_MAX).map(attack_address).collect();
        assert_eq!(all.len() as u32, ATTACK_ADDRESSES_MAX);
        assert!(!all.contains(&Ipv4Addr::LOCALHOST));
    }

    #[test]
    fn drip_frames_start_with_a_header_the_drive_accepts() {
        let (head, rest) = drip_bytes(false);
        assert_eq!(head.len(), nasd_proto::limits::HEADER_LEN);
        let mut whole = head.clone();
        whole.extend_from_slice(&rest);
        let parsed = nasd_proto::FramePrefix::parse(&whole).expect("a whole, valid frame prefix");
        assert!(matches!(
            nasd_proto::Request::decode(parsed.header.opcode, parsed.args),
            Ok(nasd_proto::Request::Read { .. })
        ));
        let (head, rest) = drip_bytes(true);
        assert_eq!(head[0], 22, "a TLS handshake record");
        assert_eq!(u16::from_be_bytes([head[3], head[4]]) as usize, rest.len());
    }

    #[test]
    fn contents_are_deterministic_and_sized() {
        assert_eq!(content(7, 1000), content(7, 1000));
        assert_ne!(content(7, 1000), content(8, 1000));
        assert_eq!(content(7, 13).len(), 13);
        assert!(content(7, 0).is_empty());
    }
}
