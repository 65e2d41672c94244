//! Rolling single-drive outages on real processes (issue 22, part 2): `nasd
//! drive` daemons and a `nasd manager` on loopback ([`common::cluster`]),
//! library writers putting files of 300 KB–2.5 MB piece by piece and
//! library readers reading acknowledged files back, while every drive in
//! turn is SIGKILLed and started again — never two at once — with outages
//! and gaps between them from zero to longer than the manager's failure
//! detection (three missed one-second heartbeats), for `rs:2+1`, `rs:4+2`
//! and `mirror:2`.
//!
//! What must hold:
//! - every read returns the file's bytes or an error, never other bytes;
//! - no read fails while at most one drive's redundancy is missing: an
//!   outage is "open" from the kill until the manager, with every drive up
//!   and every transaction begun before the restart ended (a write lease
//!   and some later), reports no degraded file; a read may fail only while
//!   two outages are open at once (the next drive was killed before the
//!   previous one's components were brought up to date: the bytes it missed
//!   may then be on no reachable drive);
//! - once every drive is back, the manager brings every file up to date (no
//!   degraded file, within a bound that calls a hang), and every
//!   acknowledged file reads back byte for byte.
//!
//! The schedule (which drive, how long down, the gap, the writers' sizes and
//! pauses, the readers' picks) comes from one seed, printed at the start;
//! `NASD_TEST_SEED=N` replays it (the daemons' timing still varies). No
//! assertion is on timing: the bounds only call a hang.
//!
//! Before the fix, a repair of a file stale on one drive that began while
//! another drive was dead but not yet noticed recorded that drive's
//! component stale too: with two of three components stale the file stayed
//! unreadable with every drive up, and the manager repeated "resync …
//! deferred" for good.

mod common;

use common::cluster::{Cluster, Options};
use nasd_fs::FsClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KB: usize = 1000;
/// Write-transaction lease, seconds: short, so a writer cut off by a double
/// outage is rolled back soon.
const LEASE_SECS: u64 = 4;
/// After a restart, an outage stays open at least this long: transactions
/// begun while the drive was down commit (missing it) or are rolled back
/// within their lease and a maintenance pass or two.
const SETTLE_AFTER_RESTART: Duration = Duration::from_secs(LEASE_SECS + 3);
/// The manager notices a dead drive after three missed one-second
/// heartbeats; outages and gaps are drawn below and above this.
const DETECTION: Duration = Duration::from_secs(3);
/// How often the monitor asks the manager for the cluster status.
const POLL: Duration = Duration::from_millis(250);
/// Longest the cluster may take to bring every file up to date once every
/// drive is back (a hang, not a timing assertion).
const HEAL_WAIT_MAX: Duration = Duration::from_secs(180);
/// Longest one library call of the test may take (a hang).
const STEP: Duration = Duration::from_secs(120);
/// Library writers and readers.
const WRITERS: usize = 2;
const READERS: usize = 2;

/// One cluster at a time: three clusters on two cores would make heartbeats
/// time out on a busy machine, outages nobody caused.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn rolling_outages_rs_2_1() {
    run("rs:2+1", 4);
}

#[test]
fn rolling_outages_rs_4_2() {
    run("rs:4+2", 7);
}

#[test]
fn rolling_outages_mirror_2() {
    run("mirror:2", 3);
}

// ------------------------------------------------------------------ schedule

/// One outage: drive (index into `Cluster::drives`) down for `down`, then
/// `gap` before the next.
#[derive(Debug, Clone, Copy)]
struct Outage {
    drive: usize,
    down: Duration,
    gap: Duration,
}

fn secs(rng: &mut StdRng, lo: f64, hi: f64) -> Duration {
    Duration::from_secs_f64(rng.gen_range(lo..hi))
}

/// Every drive in turn (a seeded order), then two more drawn at random;
/// each outage and gap shorter or longer than [`DETECTION`], gaps often zero.
fn schedule(rng: &mut StdRng, drives: usize) -> Vec<Outage> {
    let d = DETECTION.as_secs_f64();
    let mut order: Vec<usize> = (0..drives).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.gen_range(0..=i));
    }
    for _ in 0..2 {
        order.push(rng.gen_range(0..drives));
    }
    order
        .into_iter()
        .map(|drive| {
            let down = match rng.gen_range(0..5) {
                0 | 1 => secs(rng, 0.2, d / 2.0),
                2 => secs(rng, d / 2.0, d),
                _ => secs(rng, d + 0.5, 2.0 * d),
            };
            let gap = match rng.gen_range(0..4) {
                0 => Duration::ZERO,
                1 => secs(rng, 0.0, d / 2.0),
                2 => secs(rng, d / 2.0, d),
                _ => secs(rng, d + 0.5, 2.0 * d),
            };
            Outage { drive, down, gap }
        })
        .collect()
}

// ------------------------------------------------------------------ workload

/// `len` deterministic bytes for `seed` (xorshift).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0xff51_afd7_ed55_8ccd);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A file whose writer flushed and closed it without an error.
#[derive(Debug, Clone)]
struct Acked {
    path: String,
    seed: u64,
    len: usize,
}

/// A read that failed: which file, when (from, to), and why.
#[derive(Debug, Clone)]
struct FailedRead {
    path: String,
    from: Instant,
    to: Instant,
    error: String,
}

/// One answer of the manager's cluster status.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    down: Vec<u32>,
    degraded: u64,
}

#[derive(Default)]
struct Shared {
    acked: Mutex<Vec<Acked>>,
    failed_reads: Mutex<Vec<FailedRead>>,
    wrong_bytes: Mutex<Vec<String>>,
    samples: Mutex<Vec<Sample>>,
    reads: AtomicU64,
    failed_writes: AtomicU64,
    stop_work: AtomicBool,
    stop_monitor: AtomicBool,
}

async fn step<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(STEP, f).await.unwrap_or_else(|_| panic!("{what}: no answer in {STEP:?} (a hang)"))
}

/// Writes one file in 3–8 pieces with short pauses (so that its
/// transactions span outages), then flushes and closes it.
async fn put_one(fs: &FsClient, path: &str, data: &[u8], rng: &mut StdRng) -> Result<(), nasd_fs::FsError> {
    let f = step("create", fs.create(path, 0o644, true, false)).await?;
    let pieces = rng.gen_range(3..=8);
    let piece = data.len().div_ceil(pieces);
    for (i, chunk) in data.chunks(piece).enumerate() {
        step("write", f.write_at((i * piece) as u64, chunk)).await?;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..200))).await;
    }
    step("flush", f.flush()).await?;
    step("close", f.close()).await.map(|_| ())
}

async fn writer(fs: FsClient, w: usize, seed: u64, shared: Arc<Shared>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = format!("/w{w}");
    step("mkdir", fs.mkdir(&dir, 0o755)).await.unwrap_or_else(|e| panic!("mkdir {dir}: {e}"));
    let mut n = 0u64;
    while !shared.stop_work.load(Ordering::SeqCst) {
        n += 1;
        let (path, file_seed) = (format!("{dir}/f{n}"), rng.gen::<u64>());
        let len = rng.gen_range(300 * KB..=2500 * KB);
        let data = pattern(file_seed, len);
        match put_one(&fs, &path, &data, &mut rng).await {
            Ok(()) => shared.acked.lock().unwrap().push(Acked { path, seed: file_seed, len }),
            Err(e) => {
                shared.failed_writes.fetch_add(1, Ordering::SeqCst);
                eprintln!("[rolling] write of {path} failed (not acknowledged): {e}");
            }
        }
    }
}

async fn reader(fs: FsClient, seed: u64, shared: Arc<Shared>) {
    let mut rng = StdRng::seed_from_u64(seed);
    while !shared.stop_work.load(Ordering::SeqCst) {
        let pick = {
            let acked = shared.acked.lock().unwrap();
            (!acked.is_empty()).then(|| acked[rng.gen_range(0..acked.len())].clone())
        };
        let Some(file) = pick else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let from = Instant::now();
        let read = step("read", fs.read_file(&file.path)).await;
        let to = Instant::now();
        shared.reads.fetch_add(1, Ordering::SeqCst);
        match read {
            Ok(bytes) => {
                if bytes != pattern(file.seed, file.len) {
                    shared.wrong_bytes.lock().unwrap().push(format!(
                        "{}: read {} bytes that differ from the {} written",
                        file.path,
                        bytes.len(),
                        file.len
                    ));
                }
            }
            Err(e) => {
                shared.failed_reads.lock().unwrap().push(FailedRead { path: file.path, from, to, error: e.to_string() })
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..60))).await;
    }
}

async fn monitor(fs: FsClient, shared: Arc<Shared>) {
    while !shared.stop_monitor.load(Ordering::SeqCst) {
        if let Ok(Ok(s)) = tokio::time::timeout(STEP, fs.cluster_status()).await {
            let down = s.drives.iter().filter(|d| !d.up).map(|d| d.drive).collect();
            shared.samples.lock().unwrap().push(Sample { at: Instant::now(), down, degraded: s.files_degraded });
        }
        tokio::time::sleep(POLL).await;
    }
}

// ------------------------------------------------------------------ verdicts

/// A span of time during which one drive's share of redundancy was missing.
#[derive(Debug, Clone, Copy)]
struct Window {
    drive: u32,
    from: Instant,
    to: Option<Instant>,
}

/// The first sample at or after `after` with every drive up and no file
/// degraded.
fn healed_at(samples: &[Sample], after: Instant) -> Option<Instant> {
    samples.iter().find(|s| s.at >= after && s.down.is_empty() && s.degraded == 0).map(|s| s.at)
}

/// The open outages: each kill until the cluster healed after its restart;
/// and each drive the manager saw down outside those (a heartbeat that timed
/// out on a busy machine) until it healed again.
fn windows(kills: &[(u32, Instant, Instant)], samples: &[Sample]) -> Vec<Window> {
    let mut out: Vec<Window> = kills
        .iter()
        .map(|&(drive, killed, started)| Window {
            drive,
            from: killed,
            to: healed_at(samples, started + SETTLE_AFTER_RESTART),
        })
        .collect();
    for s in samples {
        for &d in &s.down {
            let covered = out.iter().any(|w| w.drive == d && w.from <= s.at && w.to.is_none_or(|t| s.at < t));
            if !covered {
                let from = s.at.checked_sub(POLL).unwrap_or(s.at);
                out.push(Window { drive: d, from, to: healed_at(samples, s.at + SETTLE_AFTER_RESTART) });
            }
        }
    }
    out
}

/// Whether two outages were open at once at some time within `[from, to]`.
fn double_outage(windows: &[Window], from: Instant, to: Instant) -> bool {
    windows.iter().enumerate().any(|(i, a)| {
        windows[i + 1..].iter().any(|b| {
            let start = a.from.max(b.from).max(from);
            let end = match (a.to, b.to) {
                (Some(x), Some(y)) => x.min(y).min(to),
                (Some(x), None) | (None, Some(x)) => x.min(to),
                (None, None) => to,
            };
            a.drive != b.drive && start <= end
        })
    })
}

// ------------------------------------------------------------------ the run

fn seed() -> u64 {
    match std::env::var("NASD_TEST_SEED") {
        Ok(s) => s.trim().parse().expect("NASD_TEST_SEED must be a u64"),
        Err(_) => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
            t ^ (std::process::id() as u64).rotate_left(32)
        }
    }
}

/// Prints the seed if the test panics.
struct SeedGuard(&'static str, u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("[rolling {}] FAILED with seed {} (replay: NASD_TEST_SEED={})", self.0, self.1, self.1);
        }
    }
}

fn run(layout: &'static str, drives: usize) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let seed = seed();
    eprintln!("[rolling {layout}] seed {seed} (replay with NASD_TEST_SEED={seed})");
    let _guard = SeedGuard(layout, seed);
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = schedule(&mut rng, drives);
    eprintln!("[rolling {layout}] outages: {plan:?}");

    let mut c = Cluster::start(Options {
        drives,
        manager: format!(
            "default_layout = \"{layout}\"\nwrite_lease_secs = {LEASE_SECS}\nrebuild_delay_secs = 3600\n\
             small_file_threshold = 0\n"
        ),
        drive_args: Vec::new(),
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let shared = Arc::new(Shared::default());
    let mut work = Vec::new();
    for w in 0..WRITERS {
        let fs = rt.block_on(c.login());
        work.push(rt.spawn(writer(fs, w, rng.gen(), shared.clone())));
    }
    for _ in 0..READERS {
        let fs = rt.block_on(c.login());
        work.push(rt.spawn(reader(fs, rng.gen(), shared.clone())));
    }
    let watcher = rt.spawn(monitor(rt.block_on(c.login()), shared.clone()));

    // The outages, one drive at a time.
    let mut kills = Vec::new();
    std::thread::sleep(Duration::from_secs(1));
    for o in &plan {
        let number = c.drives[o.drive].number;
        let killed = Instant::now();
        c.drives[o.drive].kill();
        std::thread::sleep(o.down);
        c.drives[o.drive].start();
        kills.push((number, killed, Instant::now()));
        std::thread::sleep(o.gap);
    }
    shared.stop_work.store(true, Ordering::SeqCst);
    for t in work {
        rt.block_on(t).expect("a writer or reader panicked");
    }

    // Every drive is back: the manager must bring every file up to date.
    let deadline = Instant::now() + HEAL_WAIT_MAX;
    let last_start = kills.last().map_or_else(Instant::now, |k| k.2);
    let healed = loop {
        let healed = healed_at(&shared.samples.lock().unwrap(), last_start + SETTLE_AFTER_RESTART);
        if healed.is_some() || Instant::now() > deadline {
            break healed;
        }
        std::thread::sleep(POLL);
    };
    shared.stop_monitor.store(true, Ordering::SeqCst);
    rt.block_on(watcher).expect("the monitor panicked");

    // Every acknowledged file, byte for byte, through a fresh client.
    let acked = shared.acked.lock().unwrap().clone();
    let fs = rt.block_on(c.login());
    let mut unreadable = Vec::new();
    for a in &acked {
        match rt.block_on(step("read back", fs.read_file(&a.path))) {
            Ok(bytes) if bytes == pattern(a.seed, a.len) => {}
            Ok(bytes) => {
                unreadable.push(format!("{}: {} bytes that differ from the {} written", a.path, bytes.len(), a.len))
            }
            Err(e) => unreadable.push(format!("{}: {e}", a.path)),
        }
    }
    let samples = shared.samples.lock().unwrap().clone();
    let open = windows(&kills, &samples);
    let failed_reads = shared.failed_reads.lock().unwrap().clone();
    let (excused, unexcused): (Vec<FailedRead>, Vec<FailedRead>) =
        failed_reads.into_iter().partition(|f| double_outage(&open, f.from, f.to));
    eprintln!(
        "[rolling {layout}] {} files acknowledged, {} writes failed; {} reads, {} failed during a double outage, {} \
         failed otherwise",
        acked.len(),
        shared.failed_writes.load(Ordering::SeqCst),
        shared.reads.load(Ordering::SeqCst),
        excused.len(),
        unexcused.len()
    );

    let wrong = shared.wrong_bytes.lock().unwrap().clone();
    assert!(wrong.is_empty(), "reads returned other bytes than written:\n{}", wrong.join("\n"));
    assert!(acked.len() >= WRITERS, "the writers acknowledged only {} files", acked.len());
    assert!(
        unreadable.is_empty(),
        "{} of {} acknowledged files do not read back with every drive up:\n{}\n{}",
        unreadable.len(),
        acked.len(),
        unreadable.iter().take(20).cloned().collect::<Vec<_>>().join("\n"),
        stale_files(&rt, &fs, &acked)
    );
    assert!(
        healed.is_some(),
        "with every drive back, files stay degraded after {HEAL_WAIT_MAX:?}: {}\n{}",
        samples.last().map_or_else(String::new, |s| format!("{s:?}")),
        stale_files(&rt, &fs, &acked)
    );
    let start = kills.first().map(|k| k.1).unwrap_or_else(Instant::now);
    let at = |t: Instant| t.saturating_duration_since(start).as_secs_f64();
    assert!(
        unexcused.is_empty(),
        "reads failed while at most one drive's redundancy was missing:\n{}\noutages (s from the first kill): {}",
        unexcused
            .iter()
            .take(20)
            .map(|f| format!("{} at {:.2}–{:.2} s: {}", f.path, at(f.from), at(f.to), f.error))
            .collect::<Vec<_>>()
            .join("\n"),
        open.iter()
            .map(|w| format!(
                "drive {} {:.2}–{}",
                w.drive,
                at(w.from),
                w.to.map_or("end".into(), |t| format!("{:.2}", at(t)))
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// The components of acknowledged files the manager records as not Ok, for
/// failure messages.
fn stale_files(rt: &tokio::runtime::Runtime, fs: &FsClient, acked: &[Acked]) -> String {
    let mut out = Vec::new();
    for a in acked {
        if let Ok(info) = rt.block_on(step("layout", fs.get_layout(&a.path))) {
            let states: Vec<String> =
                info.components.iter().map(|(c, _)| format!("{:?}@drive{}", c.state, c.object.drive)).collect();
            if info.components.iter().any(|(c, _)| c.state != nasd_fs::ComponentState::Ok) {
                out.push(format!("{}: {}", a.path, states.join(" ")));
            }
        }
    }
    format!(
        "files with components not Ok ({}):\n{}",
        out.len(),
        out.into_iter().take(20).collect::<Vec<_>>().join("\n")
    )
}
