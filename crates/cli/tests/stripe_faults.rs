//! Files over many drives under faults, on real processes: `nasd drive`
//! daemons, a `nasd manager` (TLS, security on, a short write lease) and the
//! `nasd` client commands (`put`, `get`, `cat`, `status`, `repair`) on
//! loopback, with the library (`nasd_fs::FsClient`, and `nasd_stripe` to
//! read a file through any subset of its components) checking the results
//! (issue 10, "must show"):
//!
//! 1. a drive SIGKILLed during sequential writes of a `mirror:2` file (`nasd
//!    put`) and of an `rs:2+1` file (a library writer checking every write):
//!    no error, every byte readable afterwards, byte-exact, the component
//!    that missed writes recorded stale, and — once the drive is back and
//!    the stale copy resynced — the same bytes through every subset of
//!    components; a truncate right after a drive died (before the heartbeat
//!    noticed) goes around it; a resync longer than the write lease keeps
//!    what it copied;
//! 2. a drive SIGKILLed during `nasd get` of a mirrored file and `nasd cat`
//!    of a Reed-Solomon file: no error, identical bytes;
//! 3. a client SIGKILLed mid-write: a writer process that wrote and flushed
//!    (on every component, and on all but one) under a transaction it never
//!    committed is rolled back after its lease — every stripe reads old,
//!    through every subset of components, the extension it wrote is gone
//!    and the recorded size is the old one; a `nasd put` over an existing
//!    file (which writes a temporary file, committing a transaction a
//!    quarter into each lease, and renames it onto the file once whole),
//!    caught while its open transaction has bytes on the drives past the
//!    committed size, leaves the file as it was and its temporary file
//!    holding exactly what it committed; with the default small-file
//!    threshold, a writer whose transaction staged a file's head on the
//!    small-file path (`WRITE_SMALL` under it) and wrote its tail on the
//!    drives is rolled back head and tail: the whole file reads old;
//! 4. the manager SIGKILLed and started again while such a writer process
//!    has its transactions open: the new manager rolls them back from its
//!    intent log, a staged small-file head
//!    included; and while a `nasd put` is inside a transaction: the put
//!    succeeds (the file is new) or fails in one clear line (the file is
//!    old), through every subset of components, and a temporary file it
//!    left is new up to its recorded size with nothing past it;
//! 5. `m` drives of an `rs:4+2` file stopped: `nasd get` of every file is
//!    byte-exact; `m + 1` stopped: `nasd get` and `nasd cat` fail naming the
//!    missing drives, and `get` leaves no partial copy (nor changes a file it
//!    would have replaced);
//! 6. a drive stopped for good: `nasd repair rebuild` returns once the
//!    rebuild it asked for is done — the status then shows the drive down
//!    with nothing on it and no file degraded —, every file reads with the
//!    same checksum, and through every subset of its new components;
//! 7. a drive added to a live cluster and `nasd repair rebalance`: the new
//!    drive takes about its share while files opened before the move are
//!    read over and over without a failed read; every file keeps its
//!    checksum.
//!
//! No test asserts on timing: a kill lands "during" an operation by polling
//! its progress (bounded by [`STEP`]), and a test checks that it did: the
//! operation had not finished, a reader warned that it read around the
//! failed component, a writer's component was recorded as having missed
//! writes, a `nasd put` was held (SIGSTOP) while uncommitted bytes of it
//! were seen on the drives. Drives that must be slow enough to be caught
//! mid-transfer are paced with `--throttle-mib-per-sec`.
//!
//! `writer_process` is not a test: it is the body of the writer process
//! that tests 3 and 4 start (this test binary, run again with
//! [`WRITER_ENV`] set) and SIGKILL or leave idle.

mod common;

use common::cluster::{path_str, Cluster, Finished, Options, Running};
use nasd_fs::{ComponentState, FsClient, Layout, OpenMode};
use nasd_proto::manager::{FileAccess, ManagerReply, ManagerRequest, SMALL_IO_MAX};
use nasd_proto::Protection;
use nasd_stripe::geometry::Geometry;
use nasd_stripe::{Binder, BoxFuture, DrivePool, StaticBinder, StripeError, Striper, Target};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
/// Write-transaction lease, seconds: short, so rollbacks come quickly, and
/// long enough for a writer to drain its write-behind (32 MiB) through two
/// paced drives in the three quarters of a lease it may write in.
const LEASE_SECS: u64 = 4;
/// Longest a bounded wait of these tests lasts before it calls a hang.
const STEP: Duration = Duration::from_secs(120);
/// Drive pacing (MiB/s) where a transfer must last long enough to be caught
/// in the middle.
const THROTTLE_MIB_S: &str = "24";

// ------------------------------------------------------------------ set-up

/// `[manager]` lines: default layout, the short lease, a rebuild delay, and
/// every byte on the drives (no small-file path: these tests check the
/// stripes, copies and parity the drives hold, and their rollback; the
/// tests of a head on the small-file path use [`small_file_settings`]).
fn manager_settings(layout: &str, rebuild_delay_secs: u64) -> String {
    format!(
        "default_layout = \"{layout}\"\nwrite_lease_secs = {LEASE_SECS}\nrebuild_delay_secs = {rebuild_delay_secs}\n\
         small_file_threshold = 0\n"
    )
}

/// `[manager]` lines with the default small-file threshold
/// ([`nasd_manager::SMALL_FILE_THRESHOLD_DEFAULT`], not set in the file):
/// new files keep their bytes below it in the manager's metadata store.
fn small_file_settings(layout: &str) -> String {
    format!("default_layout = \"{layout}\"\nwrite_lease_secs = {LEASE_SECS}\nrebuild_delay_secs = 3600\n")
}

/// A cluster of `drives` drives (paced if `throttled`) whose new files get
/// `layout`; nothing is rebuilt unless a drive stays down `rebuild_delay_secs`.
fn cluster(drives: usize, layout: &str, rebuild_delay_secs: u64, throttled: bool) -> Cluster {
    let drive_args =
        if throttled { vec!["--throttle-mib-per-sec".to_string(), THROTTLE_MIB_S.to_string()] } else { Vec::new() };
    Cluster::start(Options { drives, manager: manager_settings(layout, rebuild_delay_secs), drive_args })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// `f`, or a panic naming `what` if it takes longer than [`STEP`].
async fn step<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(STEP, f).await.unwrap_or_else(|_| panic!("{what}: no answer in {STEP:?} (a hang)"))
}

/// Polls `probe` every 50 ms until it returns `Some`, at most [`STEP`].
async fn until<T, F: std::future::Future<Output = Option<T>>>(what: &str, mut probe: impl FnMut() -> F) -> T {
    let deadline = Instant::now() + STEP;
    loop {
        if let Some(t) = probe().await {
            return t;
        }
        assert!(Instant::now() < deadline, "{what}: not within {STEP:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `len` deterministic bytes for `seed` (xorshift; no two seeds alike).
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

/// Writes `data` to a new local file `dir/name`; its path.
fn local_file(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).expect("write a local file");
    p
}

fn digest(data: &[u8]) -> blake3::Hash {
    blake3::hash(data)
}

fn digest_file(p: &Path) -> blake3::Hash {
    digest(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

/// The recorded size of `path`.
async fn size_of(fs: &FsClient, path: &str) -> u64 {
    step("stat", fs.stat(path)).await.unwrap_or_else(|e| panic!("stat {path}: {e}")).attr.size
}

/// Component `idx` of `path`: its drive number and state.
async fn component(fs: &FsClient, path: &str, idx: usize) -> (u32, ComponentState) {
    let info = step("layout get", fs.get_layout(path)).await.unwrap_or_else(|e| panic!("layout of {path}: {e}"));
    let (c, _) = &info.components[idx];
    (c.object.drive, c.state)
}

/// Asserts a command succeeded.
fn assert_ok(f: &Finished, c: &Cluster) {
    assert!(f.status.success(), "{} failed ({}):\n{}\n{}", f.what, f.status, f.stderr, c.logs());
}

/// `nasd get REMOTE` into a new local file; its checksum.
fn get_digest(c: &Cluster, remote: &str, name: &str) -> blake3::Hash {
    let out = c.dir().join(name);
    let _ = std::fs::remove_file(&out);
    assert_ok(&c.run(&["get", remote, path_str(&out)]), c);
    digest_file(&out)
}

/// The temporary file a running `nasd put` of `remote` writes (`nasd put`
/// writes `DIR/.NAME.XXXXXXXX.nasd-tmp` and renames it onto `remote` once
/// it is whole and durable), if there is one.
async fn staging_of(fs: &FsClient, remote: &str) -> Option<String> {
    let (dir, name) = remote.rsplit_once('/').expect("an absolute path");
    let prefix = format!(".{name}.");
    let entries = fs.readdir(if dir.is_empty() { "/" } else { dir }).await.ok()?;
    let (tmp, _) = entries.into_iter().find(|(n, _)| n.starts_with(&prefix) && n.ends_with(".nasd-tmp"))?;
    Some(format!("{dir}/{tmp}"))
}

/// Runs `nasd put LOCAL REMOTE` in the background and waits until it has
/// committed at least `at_least` bytes of its temporary file (its recorded
/// size), but not all of them: it is then in the middle of the write.
/// Returns the put and the temporary file's path.
async fn put_in_flight(
    c: &Cluster,
    fs: &FsClient,
    local: &Path,
    remote: &str,
    total: u64,
    at_least: u64,
) -> (Running, String) {
    let mut put = c.spawn(&["put", path_str(local), remote]);
    let deadline = Instant::now() + STEP;
    loop {
        if let Some(f) = put.try_finish() {
            panic!("the put ended before it could be interrupted (make the file larger): {f:?}");
        }
        if let Some(tmp) = staging_of(fs, remote).await {
            let size = fs.stat(&tmp).await.map(|s| s.attr.size).unwrap_or(0);
            if (at_least..total).contains(&size) {
                return (put, tmp);
            }
        }
        assert!(Instant::now() < deadline, "{remote}: the put did not commit {at_least} bytes in {STEP:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Bytes at the recorded size that must already hold a put's new content —
/// on the drives, not yet committed — for the put to count as caught inside
/// a write transaction: a stripe of the `rs:2+1@64K` files put here (both
/// data columns; the parity is written with them).
const UNCOMMITTED_PROBE: u64 = 128 * KIB;

/// Runs `nasd put LOCAL REMOTE` (of `new`) in the background and SIGSTOPs
/// it at a moment it is inside a write transaction on its temporary file
/// with bytes on the drives that are not committed: the
/// [`UNCOMMITTED_PROBE`] bytes at the temporary file's recorded size `S`
/// (0 within its first transaction) already read back from the drives as
/// the new content. The
/// put runs undisturbed while the test looks (every 50 ms: the probe's reads
/// take their share of the paced drives); once it sees such bytes it stops
/// the put and checks that `S` is still the recorded size (no `COMMIT` took
/// them in meanwhile), or lets it go on (SIGCONT) and looks again. Returns
/// the stopped put, the temporary file's path and `S`.
async fn put_stopped_mid_transaction(
    c: &Cluster,
    fs: &FsClient,
    local: &Path,
    remote: &str,
    new: &[u8],
) -> (Running, String, u64) {
    let total = new.len() as u64;
    let pool = Arc::new(DrivePool::new());
    let mut put = c.spawn(&["put", path_str(local), remote]);
    let deadline = Instant::now() + STEP;
    loop {
        if let Some(f) = put.try_finish() {
            panic!("the put ended before it was caught inside a transaction (make the file larger): {f:?}");
        }
        assert!(Instant::now() < deadline, "{remote}: the put was not caught inside a transaction in {STEP:?}");
        let Some(tmp) = staging_of(fs, remote).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let size = fs.stat(&tmp).await.map(|s| s.attr.size).unwrap_or(0);
        if size < total - UNCOMMITTED_PROBE {
            let e = step("walk", fs.walk(&tmp, OpenMode::Read)).await.expect("walk");
            let access = e.access.expect("read access");
            let end = size + UNCOMMITTED_PROBE;
            let s = striper(&pool, &access, &BTreeSet::new());
            let probe = step("probe", s.read(size, UNCOMMITTED_PROBE, end)).await;
            if probe.is_ok_and(|(got, _)| got[..] == new[size as usize..end as usize]) {
                put.signal(libc::SIGSTOP);
                // Two round trips to the manager: a COMMIT the put sent just before it stopped is in.
                let first = size_of(fs, &tmp).await;
                if first == size && size_of(fs, &tmp).await == size {
                    return (put, tmp, size);
                }
                put.signal(libc::SIGCONT);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded) for a marker file a process creates, or fails with the
/// process's output if it ends first.
fn wait_for_mark(mark: &Path, p: &mut Running) {
    let deadline = Instant::now() + STEP;
    while !mark.exists() {
        if let Some(f) = p.try_finish() {
            panic!("{} ended before it marked {}: {f:?}", p.what, mark.display());
        }
        assert!(Instant::now() < deadline, "{} did not mark {} in {STEP:?}", p.what, mark.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ends whatever write transaction `path` has open: a `BEGIN_WRITE` (which
/// waits for another writer's lease to run out, and rolls that writer back)
/// and an empty `COMMIT`. Afterwards no transaction on the file is open.
async fn settle(fs: &FsClient, path: &str) {
    let handle = step("walk", fs.walk(path, OpenMode::None)).await.expect("walk").handle();
    let begin = step("BEGIN_WRITE", fs.call(&ManagerRequest::BeginWrite { handle })).await;
    let txn = match begin.unwrap_or_else(|e| panic!("BEGIN_WRITE on {path}: {e}")) {
        ManagerReply::Began { txn, .. } => txn,
        other => panic!("BEGIN_WRITE: {other:?}"),
    };
    let commit = ManagerRequest::Commit { handle, txn, written_end: 0, missed: vec![], dirty: vec![] };
    step("COMMIT", fs.call(&commit)).await.unwrap_or_else(|e| panic!("empty COMMIT on {path}: {e}"));
}

// ------------------------------------------- reading through component subsets

/// Every set of components whose loss `layout` tolerates (the empty set
/// first), smallest first.
fn exclusions(layout: Layout) -> Vec<BTreeSet<usize>> {
    let g = Geometry::new(layout).expect("geometry");
    let n = g.components();
    let mut sets: Vec<BTreeSet<usize>> = (0u64..1 << n)
        .map(|bits| (0..n).filter(|i| bits & (1 << i) != 0).collect::<BTreeSet<usize>>())
        .filter(|s| s.len() <= layout.tolerates() && g.survives(s))
        .collect();
    sets.sort_by_key(|s| (s.len(), s.iter().copied().collect::<Vec<_>>()));
    sets
}

/// The target `access` describes, with the components in `excluded` neither
/// read nor written (taken as `Down`: a write through it misses them).
fn target(access: &FileAccess, excluded: &BTreeSet<usize>) -> Target {
    let min = Protection::from_bits(access.min_protection).expect("known protection bits");
    let protection =
        min.union(Protection::INTEGRITY_ARGS).union(Protection::INTEGRITY_DATA).union(Protection::HASH_AND_MAC);
    let mut target = Target::from_access(access, protection).expect("target");
    for &i in excluded {
        target.components[i].state = ComponentState::Down;
    }
    target
}

/// A striper over `access` that neither reads nor writes the components in `excluded`.
fn striper(pool: &Arc<DrivePool>, access: &FileAccess, excluded: &BTreeSet<usize>) -> Striper {
    Striper::new(pool.clone(), Arc::new(StaticBinder::new(target(access, excluded)).expect("binder")))
}

/// A reader's binder that leaves `excluded` out and, when a drive refuses a
/// capability (the manager revokes them all whenever it rolls a transaction
/// back on the file, its own repairs' included), looks the file up again as
/// `nasd_fs`'s own binder does.
struct SubsetBinder {
    fs: FsClient,
    path: String,
    excluded: BTreeSet<usize>,
    target: Mutex<Arc<Target>>,
}

impl Binder for SubsetBinder {
    fn current(&self) -> Arc<Target> {
        self.target.lock().unwrap().clone()
    }

    fn refresh(&self) -> BoxFuture<'_, Result<Arc<Target>, StripeError>> {
        Box::pin(async move {
            let e = self.fs.walk(&self.path, OpenMode::Read).await.map_err(|e| StripeError::Bind(e.to_string()))?;
            let access = e.access.ok_or_else(|| StripeError::Bind("no access".into()))?;
            let t = Arc::new(target(&access, &self.excluded));
            *self.target.lock().unwrap() = t.clone();
            Ok(t)
        })
    }
}

/// Where `got` first differs from `want`, in words: offset, stripe, and
/// whether that stripe is what `old` or `new` had there.
fn first_difference(got: &[u8], want: &[u8], g: &Geometry, versions: &[(&str, &[u8])]) -> String {
    if got.len() != want.len() {
        return format!("{} bytes where {} were expected", got.len(), want.len());
    }
    let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) else { return "no difference".into() };
    let sb = g.stripe_bytes() as usize;
    let (s, e) = (at / sb * sb, (at / sb * sb + sb).min(got.len()));
    let like: Vec<&str> =
        versions.iter().filter(|(_, v)| v.len() >= e && got[s..e] == v[s..e]).map(|(name, _)| *name).collect();
    let zero = got[s..e].iter().all(|&b| b == 0);
    format!(
        "first difference at byte {at} (stripe {}, column {}): the stripe reads as {}",
        at / sb,
        g.locate(at as u64).column,
        if !like.is_empty() {
            format!("the {} version", like.join("/"))
        } else if zero {
            "zeros".into()
        } else {
            "neither version: a mixed or garbled stripe".into()
        }
    )
}

/// Reads `path` (as a fresh lookup binds it) through every subset of its
/// components its layout can read from — leaving out each set it tolerates
/// losing — as `read_len` bytes (past the recorded size: bytes there must be
/// zeros, nothing a rolled-back write left), and checks each read equals
/// `want` followed by zeros. Components in `dead` are on drives that are
/// gone: a subset that needs them must fail with `Unavailable`, never
/// return other bytes. `versions` name what the file held, for messages.
async fn check_every_subset(
    fs: &FsClient,
    path: &str,
    want: &[u8],
    read_len: u64,
    dead: &BTreeSet<usize>,
    versions: &[(&str, &[u8])],
) {
    assert!(read_len >= want.len() as u64);
    let e = step("walk", fs.walk(path, OpenMode::Read)).await.expect("walk");
    assert_eq!(e.attr.size, want.len() as u64, "{path}: the recorded size is the size of its content");
    let access = e.access.expect("read access");
    let g = Geometry::new(access.layout).expect("geometry");
    let pool = Arc::new(DrivePool::new());
    let mut expected = want.to_vec();
    expected.resize(read_len as usize, 0);
    let mut checked = 0;
    for excluded in exclusions(access.layout) {
        let lost: BTreeSet<usize> = excluded.union(dead).copied().collect();
        let binder = SubsetBinder {
            fs: fs.clone(),
            path: path.to_string(),
            target: Mutex::new(Arc::new(target(&access, &excluded))),
            excluded: excluded.clone(),
        };
        let s = Striper::new(pool.clone(), Arc::new(binder));
        let read = step("read through a subset", s.read(0, read_len, read_len)).await;
        let what = format!("{path} ({}) read without components {excluded:?}, {dead:?} gone", access.layout);
        if !g.survives(&lost) {
            match read {
                Err(StripeError::Unavailable { .. }) => continue,
                Err(e) => panic!("{what}: {e} (expected Unavailable)"),
                Ok(_) => panic!("{what}: bytes returned although components {lost:?} are lost"),
            }
        }
        let (got, _) = read.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(got == expected, "{what}: {}", first_difference(&got, &expected, &g, versions));
        checked += 1;
    }
    assert!(checked > 0, "{path}: no subset of components could be read");
}

// ------------------------------------------------------- the writer process

/// Set in the environment of the writer process.
const WRITER_ENV: &str = "NASD_FAULTS_WRITER";

/// One write of the writer process: `path` (all writes to one path share a
/// transaction), offset, length, pattern seed, and the components it does
/// not write (as if it died between component writes).
#[derive(Debug, Clone)]
struct Job {
    path: String,
    offset: u64,
    len: u64,
    seed: u64,
    skip: Vec<usize>,
}

impl Job {
    fn encode(jobs: &[Job]) -> String {
        let one = |j: &Job| {
            let skip: Vec<String> = j.skip.iter().map(ToString::to_string).collect();
            format!("{},{},{},{},{}", j.path, j.offset, j.len, j.seed, skip.join("+"))
        };
        jobs.iter().map(one).collect::<Vec<_>>().join(";")
    }

    fn decode(text: &str) -> Vec<Job> {
        text.split(';')
            .map(|j| {
                let f: Vec<&str> = j.split(',').collect();
                Job {
                    path: f[0].to_string(),
                    offset: f[1].parse().expect("offset"),
                    len: f[2].parse().expect("len"),
                    seed: f[3].parse().expect("seed"),
                    skip: f[4].split('+').filter(|s| !s.is_empty()).map(|s| s.parse().expect("component")).collect(),
                }
            })
            .collect()
    }

    /// The file's content after this write over `content`.
    fn apply(&self, content: &mut Vec<u8>) {
        let end = (self.offset + self.len) as usize;
        if content.len() < end {
            content.resize(end, 0);
        }
        content[self.offset as usize..end].copy_from_slice(&pattern(self.seed, self.len as usize));
    }
}

/// Starts the writer process: this test binary running `writer_process`,
/// logged in as the administrator. For each file of `jobs` it begins a write
/// transaction (`BEGIN_WRITE`), writes that file's jobs through the striping
/// engine and flushes them, and commits nothing; then it creates `mark` and
/// waits, idle, to be killed. It exits 1 with the error on standard error
/// if anything fails.
fn start_writer(c: &Cluster, jobs: &[Job], mark: &Path) -> Running {
    let config = c.fs_config();
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("this test binary"));
    cmd.args(["writer_process", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(WRITER_ENV, "1")
        .env("NASD_FAULTS_MANAGER", &config.manager)
        .env("NASD_FAULTS_CA", &config.ca_cert)
        .env("NASD_FAULTS_PASSWORD", &config.password)
        .env("NASD_FAULTS_JOBS", Job::encode(jobs))
        .env("NASD_FAULTS_MARK", mark)
        .env("NASD_LOG", "info");
    c.spawn_command(cmd, "the writer process")
}

#[test]
#[ignore = "the body of the writer process that the fault tests start (with NASD_FAULTS_WRITER set)"]
fn writer_process() {
    if std::env::var_os(WRITER_ENV).is_none() {
        return;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let config = nasd_fs::FsConfig {
        manager: var("NASD_FAULTS_MANAGER"),
        server_name: "localhost".into(),
        ca_cert: var("NASD_FAULTS_CA").into(),
        user: "admin".into(),
        password: var("NASD_FAULTS_PASSWORD"),
        ..Default::default()
    };
    let jobs = Job::decode(&var("NASD_FAULTS_JOBS"));
    let mark = PathBuf::from(var("NASD_FAULTS_MARK"));
    let result = runtime().block_on(async {
        let fs = FsClient::connect(&config).await.map_err(|e| format!("log in: {e}"))?;
        uncommitted_writes(&fs, &jobs, &mark).await
    });
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The writer process: a transaction per file, its jobs written and
/// flushed, never committed; then it waits to be killed.
async fn uncommitted_writes(fs: &FsClient, jobs: &[Job], mark: &Path) -> Result<(), String> {
    let pool = Arc::new(DrivePool::new());
    let mut paths: Vec<&str> = jobs.iter().map(|j| j.path.as_str()).collect();
    paths.dedup();
    for path in paths {
        let e = fs.walk(path, OpenMode::ReadWrite).await.map_err(|e| format!("walk {path}: {e}"))?;
        let access = e.access.clone().ok_or("no access")?;
        let began = fs.call(&ManagerRequest::BeginWrite { handle: e.handle() }).await;
        let Ok(ManagerReply::Began { txn, .. }) = began else {
            return Err(format!("BEGIN_WRITE on {path}: {began:?}"));
        };
        let mut size = e.attr.size;
        let threshold = u64::from(access.small_threshold);
        for j in jobs.iter().filter(|j| j.path == path) {
            let skip: BTreeSet<usize> = j.skip.iter().copied().collect();
            let s = striper(&pool, &access, &skip);
            let mut data = pattern(j.seed, j.len as usize);
            let mut offset = j.offset;
            if offset < threshold {
                // The head goes to the manager, staged under the transaction.
                let below = ((threshold - offset) as usize).min(data.len());
                for (k, chunk) in data[..below].chunks(SMALL_IO_MAX).enumerate() {
                    let at = offset + (k * SMALL_IO_MAX) as u64;
                    let req = ManagerRequest::WriteSmall { handle: e.handle(), txn, offset: at, data: chunk.to_vec() };
                    match fs.call(&req).await {
                        Ok(ManagerReply::Entry(_)) => {}
                        other => return Err(format!("WRITE_SMALL {j:?} at {at}: {other:?}")),
                    }
                }
                data.drain(..below);
                offset += below as u64;
            }
            if data.is_empty() {
                size = size.max(j.offset + j.len);
                continue;
            }
            let w = s.write(offset, &data, size).await.map_err(|e| format!("{j:?}: {e}"))?;
            let f = s.flush(&w.written).await.map_err(|e| format!("flush {j:?}: {e}"))?;
            let missed: BTreeSet<usize> = w.missed.union(&f.missed).copied().collect();
            if missed != skip {
                return Err(format!("{j:?}: components {missed:?} missed the write, not the ones left out"));
            }
            size = size.max(j.offset + j.len);
        }
    }
    std::fs::write(mark, b"written").map_err(|e| e.to_string())?;
    tokio::time::sleep(STEP).await;
    Err("nobody killed the writer".into())
}

// ------------------------------------------------------------- 1. writes

/// A drive SIGKILLed while `nasd put` writes a `mirror:2` file: the put
/// succeeds, `nasd get` returns the same bytes, the copy on the lost drive
/// is recorded stale; when the drive comes back the copy is resynced and
/// each copy alone holds the file.
#[test]
fn a_drive_killed_during_a_put_of_a_mirrored_file_loses_nothing() {
    let mut c = cluster(3, "mirror:2@256K", 3600, true);
    let rt = runtime();
    let data = pattern(1, (64 * MIB + 12_345) as usize);
    let local = local_file(c.dir(), "m.bin", &data);
    let fs = rt.block_on(c.login());

    let (mut put, tmp) = rt.block_on(put_in_flight(&c, &fs, &local, "/m.bin", data.len() as u64, 16 * MIB));
    let (victim, _) = rt.block_on(component(&fs, &tmp, 0));
    assert!(put.try_finish().is_none(), "the put is still writing when the drive dies");
    c.drive(victim).kill();
    let done = put.wait();
    assert_ok(&done, &c);

    assert_eq!(rt.block_on(size_of(&fs, "/m.bin")), data.len() as u64);
    assert_eq!(get_digest(&c, "/m.bin", "m.back"), digest(&data), "nasd get after the kill");
    let (_, state) = rt.block_on(component(&fs, "/m.bin", 0));
    assert_ne!(state, ComponentState::Ok, "the copy on the killed drive missed writes (Stale, or Down with its drive)");
    let dead: BTreeSet<usize> = [0].into();
    rt.block_on(check_every_subset(&fs, "/m.bin", &data, data.len() as u64, &dead, &[]));

    // Back: the stale copy is resynced from the other, and then each holds the file.
    c.drive(victim).start();
    rt.block_on(until("the stale copy resynced", || async {
        let s = fs.cluster_status().await.ok()?;
        (s.files_degraded == 0 && s.drives.iter().all(|d| d.up)).then_some(())
    }));
    rt.block_on(check_every_subset(&fs, "/m.bin", &data, data.len() as u64, &BTreeSet::new(), &[]));
}

/// A drive SIGKILLed a third into a library writer's sequential write of
/// an `rs:2+1` file: every write and the close succeed, and every byte
/// reads back (`nasd get`, and every subset of components that avoids the
/// lost one).
#[test]
fn a_drive_killed_during_a_library_write_of_an_rs_file_loses_nothing() {
    let mut c = cluster(4, "rs:2+1@64K", 3600, false);
    let rt = runtime();
    const PIECE: usize = MIB as usize;
    let data = pattern(2, 48 * PIECE + 777);
    let fs = rt.block_on(c.login());
    let f = rt.block_on(step("create", fs.create("/r.bin", 0o644, true, false))).expect("create");
    let (victim, _) = rt.block_on(component(&fs, "/r.bin", 0));
    for (i, piece) in data.chunks(PIECE).enumerate() {
        if i == 16 {
            c.drive(victim).kill();
        }
        rt.block_on(step("write", f.write_at((i * PIECE) as u64, piece)))
            .unwrap_or_else(|e| panic!("write {i} after the kill: {e}\n{}", c.logs()));
    }
    rt.block_on(step("flush", f.flush())).unwrap_or_else(|e| panic!("flush: {e}\n{}", c.logs()));
    let attr = rt.block_on(step("close", f.close())).expect("close");
    assert_eq!(attr.size, data.len() as u64);

    assert_eq!(get_digest(&c, "/r.bin", "r.back"), digest(&data), "nasd get after the kill");
    let (_, state) = rt.block_on(component(&fs, "/r.bin", 0));
    assert_ne!(state, ComponentState::Ok, "the component on the killed drive missed writes (Stale, or Down)");
    rt.block_on(check_every_subset(&fs, "/r.bin", &data, data.len() as u64, &[0].into(), &[]));
}

/// A truncate right after a drive holding a component of the file was
/// SIGKILLed — before the manager's heartbeat has noticed (it takes a few
/// missed beats) — of a `mirror:2` file (cut mid-stripe) and of an `rs:2+1`
/// file whose first data column is on the dead drive, cut mid-stripe in its
/// second column (the new last stripe's parity is encoded from that
/// stripe's bytes as read before the cut — the dead column's chunk
/// reconstructed from the old parity — with zeros past the cut): the size
/// change misses the dead drive's component, as a write would, and goes on;
/// each file then reads as its cut-short content through every subset of
/// components that avoids the dead drive.
#[test]
fn a_truncate_right_after_a_drive_died_goes_around_it() {
    let mut c = cluster(3, "mirror:2@64K", 3600, false);
    let rt = runtime();
    let fs = rt.block_on(c.login());
    c.run_ok(&["mkdir", "/r"]);
    c.run_ok(&["layout", "set", "/r", "rs:2+1@64K"]);
    let old = pattern(12, (3 * MIB) as usize);
    for path in ["/m.bin", "/r/r.bin"] {
        c.run_ok(&["put", path_str(&local_file(c.dir(), "old", &old)), path]);
    }
    let (victim, _) = rt.block_on(component(&fs, "/r/r.bin", 0));
    let on_victim = |path: &str| -> BTreeSet<usize> {
        let held = rt.block_on(step("layout", fs.get_layout(path))).expect("layout");
        held.components.iter().enumerate().filter(|(_, (c, _))| c.object.drive == victim).map(|(i, _)| i).collect()
    };
    let (dead_m, dead_r) = (on_victim("/m.bin"), on_victim("/r/r.bin"));
    assert_eq!(dead_r, BTreeSet::from([0]), "rs:2+1 on three drives has a component on each");
    c.drive(victim).kill();

    // rs:2+1@64K: stripes of 128 KiB; the cut leaves 1000 bytes of column 1 in its last stripe.
    for (path, cut, dead) in [("/m.bin", MIB + 12_345, dead_m), ("/r/r.bin", MIB + 64 * KIB + 1_000, dead_r)] {
        let attr = rt.block_on(step("truncate", fs.truncate(path, cut))).unwrap_or_else(|e| panic!("{path}: {e}"));

        assert_eq!(attr.size, cut);
        let want = &old[..cut as usize];
        assert_eq!(get_digest(&c, path, "back"), digest(want), "{path}");
        rt.block_on(check_every_subset(&fs, path, want, old.len() as u64, &dead, &[]));
    }
}

/// `nasd put` over a `mirror:2` file right after the drive of one of its
/// copies was SIGKILLed (before the heartbeat noticed): the put writes a new
/// file and renames it over the old one, whose objects are to be removed
/// from their drives — one of them on the dead drive. The put succeeds (the
/// removal there is left to the drive's recovery) and the file reads as
/// put. The old file's capabilities, taken before the put, are then refused
/// by the dead drive once it is back — during its readmission fence, and
/// after it, when the old object is gone — never answered with the old
/// bytes; and the drive is readmitted (new files' components on it are read
/// again).
#[test]
fn a_put_over_a_file_right_after_a_drive_died_replaces_it() {
    let mut c = cluster(3, "mirror:2@64K", 3600, false);
    let rt = runtime();
    let fs = rt.block_on(c.login());
    let old = pattern(14, (2 * MIB) as usize);
    c.run_ok(&["put", path_str(&local_file(c.dir(), "old", &old)), "/m.bin"]);
    // A file with a copy on every drive: read through the victim's copy alone
    // once the victim is readmitted.
    c.run_ok(&["mkdir", "/three"]);
    c.run_ok(&["layout", "set", "/three", "mirror:3@64K"]);
    let probe = pattern(16, (100 * KIB) as usize);
    c.run_ok(&["put", path_str(&local_file(c.dir(), "probe", &probe)), "/three/p.bin"]);
    let (victim, _) = rt.block_on(component(&fs, "/m.bin", 0));
    // The old file's capabilities, as a reader that has it open holds them,
    // reading the copy on the victim only.
    let held = rt.block_on(step("walk", fs.walk("/m.bin", OpenMode::Read))).expect("walk").access.expect("access");
    let pool = Arc::new(DrivePool::new());
    let old_copy = striper(&pool, &held, &[1].into());
    let len = old.len() as u64;
    let (got, _) = rt.block_on(step("read", old_copy.read(0, len, len))).expect("the old copy, before the kill");
    assert!(got == old, "the victim's copy holds the old file");

    c.drive(victim).kill();
    let new = pattern(15, (MIB + 12_345) as usize);
    c.run_ok(&["put", path_str(&local_file(c.dir(), "new", &new)), "/m.bin"]);
    assert_eq!(get_digest(&c, "/m.bin", "back"), digest(&new), "/m.bin");

    // Back: from its first request on, the drive refuses the replaced file's
    // capabilities (fenced until readmitted, then the old object is gone).
    c.drive(victim).start();
    let refused = |when: &str| match rt.block_on(step("read the old copy", old_copy.read(0, len, len))) {
        Ok((got, _)) => panic!(
            "{when}: the returning drive served a capability of the replaced file ({})\n{}",
            if got == old { "the old bytes" } else { "other bytes" },
            c.logs()
        ),
        Err(e) => e,
    };
    let first = refused("right after its start");
    let three =
        rt.block_on(step("walk", fs.walk("/three/p.bin", OpenMode::Read))).expect("walk").access.expect("access");
    let on_victim: BTreeSet<usize> =
        three.components.iter().enumerate().filter(|(_, c)| c.object.drive == victim).map(|(i, _)| i).collect();
    assert_eq!(on_victim.len(), 1, "mirror:3 on three drives has a copy on each");
    let others: BTreeSet<usize> = (0..3).filter(|i| !on_victim.contains(i)).collect();
    rt.block_on(until("the drive readmitted: the probe file read through its copy there alone", || async {
        let binder = SubsetBinder {
            fs: fs.clone(),
            path: "/three/p.bin".into(),
            target: Mutex::new(Arc::new(target(&three, &others))),
            excluded: others.clone(),
        };
        let s = Striper::new(pool.clone(), Arc::new(binder));
        let (got, _) = s.read(0, probe.len() as u64, probe.len() as u64).await.ok()?;
        assert!(got == probe, "the probe file's copy on the readmitted drive");
        Some(())
    }));
    let after = refused("after its readmission");
    eprintln!("the old capability on the returning drive: {first}; after its readmission: {after}");
}

/// A resync that takes longer than the write lease: a `mirror:2` file
/// overwritten whole (through the library, in place) while the drive of its
/// first copy is stopped, so that copy is stale from end to end; then the
/// drive started again. The manager's resync copies 128 MiB through drives
/// paced at 24 MiB/s, more than the lease of the write transaction it runs
/// as; once no file is degraded, each copy alone — the resynced one
/// included — holds the file.
#[test]
fn a_resync_longer_than_the_write_lease_keeps_what_it_copied() {
    let mut c = cluster(3, "mirror:2@256K", 3600, true);
    let rt = runtime();
    let fs = rt.block_on(c.login());
    c.run_ok(&["put", path_str(&local_file(c.dir(), "small", b"small")), "/m.bin"]);
    let (victim, _) = rt.block_on(component(&fs, "/m.bin", 0));
    c.drive(victim).stop();
    rt.block_on(until("the drive seen down", || async {
        let s = fs.cluster_status().await.ok()?;
        s.drives.iter().any(|d| d.drive == victim && !d.up).then_some(())
    }));
    let data = pattern(11, (128 * MIB + 3) as usize);
    let f = rt.block_on(step("open", fs.open("/m.bin", true))).expect("open for writing");
    for (i, piece) in data.chunks((8 * MIB) as usize).enumerate() {
        rt.block_on(step("write", f.write_at(i as u64 * 8 * MIB, piece))).unwrap_or_else(|e| panic!("write {i}: {e}"));
    }
    rt.block_on(step("close", f.close())).expect("close");
    let (_, state) = rt.block_on(component(&fs, "/m.bin", 0));
    assert_ne!(state, ComponentState::Ok, "the copy on the stopped drive missed the whole write");

    c.drive(victim).start();
    rt.block_on(until("the stale copy resynced", || async {
        let s = fs.cluster_status().await.ok()?;
        (s.files_degraded == 0 && s.drives.iter().all(|d| d.up)).then_some(())
    }));
    rt.block_on(check_every_subset(&fs, "/m.bin", &data, data.len() as u64, &BTreeSet::new(), &[]));
}

// -------------------------------------------------------------- 2. reads

/// Waits until a process has written at least `at_least` bytes to `out`
/// (or, for `nasd get`, to its staging file beside it) and is still
/// running.
fn wait_for_output(p: &mut Running, out: &Path, at_least: u64) {
    let deadline = Instant::now() + STEP;
    let dir = out.parent().expect("a directory");
    let staged = format!(".{}.", out.file_name().and_then(|n| n.to_str()).expect("a name"));
    loop {
        if let Some(f) = p.try_finish() {
            panic!("{} ended before it could be interrupted (make the file larger): {f:?}", p.what);
        }
        let written = std::fs::read_dir(dir)
            .expect("read_dir")
            .filter_map(Result::ok)
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                e.path() == out || (name.starts_with(&staged) && name.ends_with(".nasd-tmp"))
            })
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .max()
            .unwrap_or(0);
        if written >= at_least {
            return;
        }
        assert!(Instant::now() < deadline, "{} wrote {written} bytes in {STEP:?}", p.what);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `nasd ARGS` in the background with its warnings on (a command's
/// default level is errors only): a reader says when it reads around a
/// failed component.
fn spawn_telling(c: &Cluster, args: &[&str]) -> Running {
    let mut cmd = c.nasd(args);
    cmd.env("NASD_LOG", "warn");
    c.spawn_command(cmd, &format!("nasd {}", args.join(" ")))
}

/// Asserts a reader met the killed drive — it warned that it read around a
/// failed component of `path` — so the kill landed while it was reading,
/// not after.
fn assert_read_around(done: &Finished, path: &str) {
    let warned = done.stderr.lines().any(|l| l.contains("reading around it") && l.contains(&format!("path={path}")));
    assert!(warned, "{}: no component failed during the read (the kill came too late):\n{}", done.what, done.stderr);
}

/// A drive SIGKILLed during `nasd get` of a mirrored file, and another
/// during `nasd cat` of an `rs:2+1` file: both end without an error and
/// with the file's exact bytes.
#[test]
fn a_drive_killed_during_reads_changes_no_byte() {
    let mut c = cluster(4, "mirror:2@256K", 3600, true);
    let rt = runtime();
    let fs = rt.block_on(c.login());
    c.run_ok(&["mkdir", "/r"]);
    c.run_ok(&["layout", "set", "/r", "rs:2+1@64K"]);
    let (m, r) = (pattern(3, (64 * MIB + 4321) as usize), pattern(4, (64 * MIB + 999) as usize));
    c.run_ok(&["put", path_str(&local_file(c.dir(), "m.bin", &m)), "/m.bin"]);
    c.run_ok(&["put", path_str(&local_file(c.dir(), "r.bin", &r)), "/r/r.bin"]);

    // nasd get of the mirrored file; the drive of its first copy dies a quarter in.
    // The victim is found first: nothing but the kill between the quarter mark and the kill.
    let (victim, _) = rt.block_on(component(&fs, "/m.bin", 0));
    let out = c.dir().join("m.back");
    let mut get = spawn_telling(&c, &["get", "/m.bin", path_str(&out)]);
    wait_for_output(&mut get, &out, m.len() as u64 / 4);
    c.drive(victim).kill();
    let done = get.wait();
    assert_ok(&done, &c);
    assert_eq!(digest_file(&out), digest(&m), "nasd get around the killed drive");
    assert_read_around(&done, "/m.bin");
    // Seen down, back, and readmitted by the manager (a restarted drive refuses
    // capabilities until then): the Reed-Solomon read below may need it once its own
    // victim is gone.
    rt.block_on(until("the drive seen down", || async {
        let s = fs.cluster_status().await.ok()?;
        s.drives.iter().any(|d| d.drive == victim && !d.up).then_some(())
    }));
    c.drive(victim).start();
    rt.block_on(until("the drive readmitted", || async {
        let s = fs.cluster_status().await.ok()?;
        s.drives.iter().all(|d| d.up).then_some(())
    }));

    // nasd cat of the Reed-Solomon file; the drive of a data component dies a quarter in.
    let (victim, _) = rt.block_on(component(&fs, "/r/r.bin", 1));
    let mut cat = spawn_telling(&c, &["cat", "/r/r.bin"]);
    let out = cat.out.clone();
    wait_for_output(&mut cat, &out, r.len() as u64 / 4);
    c.drive(victim).kill();
    let done = cat.wait();
    assert_ok(&done, &c);
    assert_eq!(done.stdout.len(), r.len());
    assert_eq!(digest(&done.stdout), digest(&r), "nasd cat around the killed drive");
    assert_read_around(&done, "/r/r.bin");
}

// ------------------------------------------------------- 3. a client killed

/// A file's path, its content before a writer's transaction, and the
/// writes made under it.
type Written = (&'static str, Vec<u8>, Vec<Job>);

/// A `mirror:2` file `/m.bin` and an `rs:2+1` file `/r/r.bin` of `old_len`
/// bytes each, and a writer process that overwrote and extended both inside
/// write transactions — a write on every component, and a write that leaves
/// component 0 out (as if the writer died between component writes: the
/// copies, or the data and parity chunks, of those stripes disagree on the
/// drives) — flushed everything and committed nothing. Returns each file's
/// path, old content and writes, and the writer, alive and idle.
fn two_files_with_open_transactions(c: &Cluster, old_len: u64) -> (Vec<Written>, Running) {
    c.run_ok(&["mkdir", "/r"]);
    c.run_ok(&["layout", "set", "/r", "rs:2+1@64K"]);
    let mut files = Vec::new();
    for (i, path) in ["/m.bin", "/r/r.bin"].into_iter().enumerate() {
        let old = pattern(10 + i as u64, old_len as usize);
        c.run_ok(&["put", path_str(&local_file(c.dir(), &format!("old{i}"), &old)), path]);
        let jobs = vec![
            Job { path: path.into(), offset: 100_000, len: MIB, seed: 20 + i as u64, skip: vec![] },
            Job { path: path.into(), offset: old_len - 70_000, len: 300_000, seed: 30 + i as u64, skip: vec![0] },
        ];
        files.push((path, old, jobs));
    }
    let all_jobs: Vec<Job> = files.iter().flat_map(|(_, _, j)| j.clone()).collect();
    let mark = c.dir().join("written");
    let mut writer = start_writer(c, &all_jobs, &mark);
    wait_for_mark(&mark, &mut writer);
    (files, writer)
}

/// After [`two_files_with_open_transactions`] and the end of the writer's
/// transactions: every stripe of both files reads old — through every
/// subset of components the layouts can read from — the bytes written past
/// the old end are gone, and the recorded sizes are the old ones.
fn check_rolled_back(c: &Cluster, rt: &tokio::runtime::Runtime, files: &[Written], old_len: u64) {
    let fs = rt.block_on(c.login());
    for (path, old, jobs) in files {
        rt.block_on(settle(&fs, path));
        let mut new = old.clone();
        jobs.iter().for_each(|j| j.apply(&mut new));
        assert_eq!(rt.block_on(size_of(&fs, path)), old_len, "{path}: the recorded size is the old one");
        let versions: [(&str, &[u8]); 2] = [("old", old), ("new", &new)];
        rt.block_on(check_every_subset(&fs, path, old, new.len() as u64, &BTreeSet::new(), &versions));
        assert_eq!(get_digest(c, path, "back"), digest(old), "{path}: nasd get");
    }
}

/// The writer process of [`two_files_with_open_transactions`] SIGKILLed:
/// after its lease both files are rolled back on every component.
#[test]
fn a_killed_writer_is_rolled_back_on_every_component() {
    let c = cluster(3, "mirror:2@64K", 3600, false);
    let rt = runtime();
    let old_len = 3 * MIB + 12_345;
    let (files, mut writer) = two_files_with_open_transactions(&c, old_len);
    writer.kill();
    check_rolled_back(&c, &rt, &files, old_len);
}

/// `nasd put` over an existing `rs:2+1` file SIGKILLed inside a write
/// transaction on its temporary file, with bytes past the committed size on
/// the drives. The put writes `DIR/.NAME.XXXXXXXX.nasd-tmp`, committing a
/// transaction a quarter into each lease, and renames it onto the file only
/// once it is whole: killed, it leaves the file as it was — through every
/// subset of components — and, after its lease, its temporary file holding
/// exactly what it committed, nothing of the transaction it had open.
#[test]
fn a_killed_put_leaves_the_file_as_it_was_and_only_what_it_committed() {
    let c = cluster(3, "rs:2+1@64K", 3600, true);
    let rt = runtime();
    let fs = rt.block_on(c.login());
    let old = pattern(5, (24 * MIB + 5) as usize);
    c.run_ok(&["put", path_str(&local_file(c.dir(), "old", &old)), "/f"]);
    let new = pattern(6, (64 * MIB + 77) as usize);
    let local = local_file(c.dir(), "new", &new);

    let (mut put, tmp, committed) = rt.block_on(put_stopped_mid_transaction(&c, &fs, &local, "/f", &new));
    let killed = put.kill();
    assert!(!killed.status.success(), "the put was killed, not finished: {killed:?}");
    rt.block_on(settle(&fs, &tmp));

    let versions: [(&str, &[u8]); 2] = [("old", &old), ("new", &new)];
    rt.block_on(check_every_subset(&fs, "/f", &old, old.len() as u64, &BTreeSet::new(), &versions));
    assert_eq!(get_digest(&c, "/f", "back"), digest(&old), "nasd get of the file the put did not replace");
    let size = rt.block_on(size_of(&fs, &tmp));
    assert_eq!(size, committed, "{tmp}: the size the put had committed when it was stopped");
    let want = &new[..size as usize];
    rt.block_on(check_every_subset(&fs, &tmp, want, new.len() as u64, &BTreeSet::new(), &versions));
}

// ------------------------------------------------------ 4. the manager killed

/// The manager SIGKILLed while `nasd put` replaces an `rs:2+1` file, at a
/// moment the put's open transaction on its temporary file has bytes on the
/// drives past the committed size (the put held by SIGSTOP while the
/// manager dies, then let go: it meets the manager gone), and started
/// again. The put either succeeds (committing to the new manager within its
/// lease, or beginning again) and the file is the new content, or fails
/// with one line saying what failed and the file is the old content; the
/// same through every subset of components. A temporary file the failed put
/// left is the new content up to its recorded size — at least what was
/// committed before the kill — with nothing past it.
#[test]
fn a_manager_killed_during_a_put_leaves_whole_stripes() {
    let mut c = cluster(3, "rs:2+1@64K", 3600, true);
    let rt = runtime();
    let fs = rt.block_on(c.login());
    let old = pattern(7, (24 * MIB + 5) as usize);
    c.run_ok(&["put", path_str(&local_file(c.dir(), "old", &old)), "/f"]);
    let new = pattern(8, (64 * MIB + 77) as usize);
    let local = local_file(c.dir(), "new", &new);

    let (put, tmp, committed) = rt.block_on(put_stopped_mid_transaction(&c, &fs, &local, "/f", &new));
    drop(fs);
    c.kill_manager();
    put.signal(libc::SIGCONT);
    c.start_manager();
    let done = put.wait();
    eprintln!("the put {}: {}", if done.status.success() { "succeeded" } else { "failed" }, done.stderr.trim());
    if !done.status.success() {
        let errors: Vec<&str> = done.stderr.lines().filter(|l| l.starts_with("error: ")).collect();
        assert!(
            errors.len() == 1 && errors[0].contains("/f"),
            "a failed put says what failed, in one line: {}",
            done.stderr
        );
    }

    let fs = rt.block_on(c.login());
    let versions: [(&str, &[u8]); 2] = [("old", &old), ("new", &new)];
    let whole: &[u8] = if done.status.success() { &new } else { &old };
    rt.block_on(check_every_subset(&fs, "/f", whole, whole.len() as u64, &BTreeSet::new(), &versions));
    assert_eq!(get_digest(&c, "/f", "back"), digest(whole), "nasd get");
    if rt.block_on(fs.stat(&tmp)).is_ok() {
        assert!(!done.status.success(), "the put succeeded and left {tmp} behind");
        rt.block_on(settle(&fs, &tmp));
        let size = rt.block_on(size_of(&fs, &tmp));
        assert!(size >= committed, "{size} bytes recorded, {committed} were committed before the manager died");
        let want = &new[..size as usize];
        rt.block_on(check_every_subset(&fs, &tmp, want, new.len() as u64, &BTreeSet::new(), &versions));
    }
}

/// The manager SIGKILLed while the writer process of
/// [`two_files_with_open_transactions`] has its transactions open (written
/// and flushed, some stripes on all components and some on all but one),
/// and started again; the writer stays, idle. The new manager knows the
/// transactions from its intent log and, once their lease has run out,
/// rolls each back on every component: both files read old everywhere.
#[test]
fn a_manager_killed_with_transactions_open_rolls_them_back_after_its_restart() {
    let mut c = cluster(3, "mirror:2@64K", 3600, false);
    let rt = runtime();
    let old_len = 3 * MIB + 12_345;
    let (files, writer) = two_files_with_open_transactions(&c, old_len);
    c.kill_manager();
    c.start_manager();
    check_rolled_back(&c, &rt, &files, old_len);
    drop(writer);
}

// ------------------------------- 3 and 4 with a head on the small-file path

/// The default small-file threshold, which these tests' files cross.
const T: u64 = nasd_manager::SMALL_FILE_THRESHOLD_DEFAULT as u64;

/// A `mirror:2` file `/s.bin` of `old_len` bytes made under the default
/// small-file threshold (its first [`T`] bytes in the manager's metadata
/// store, the rest on the drives), and a writer process that overwrote it
/// whole and extended it inside one write transaction — the head staged
/// under it with `WRITE_SMALL`, the tail written and flushed on both
/// copies — and a second write across the threshold leaving component 0
/// out; committed nothing. While the writer is alive the head still reads
/// old: staged bytes are nobody's before the commit. Returns the file and
/// the writer, alive and idle.
fn a_file_crossing_the_threshold_with_a_transaction_open(c: &Cluster, old_len: u64) -> (Written, Running) {
    let rt = runtime();
    let path = "/s.bin";
    let old = pattern(60, old_len as usize);
    c.run_ok(&["put", path_str(&local_file(c.dir(), "old-s", &old)), path]);
    let jobs = vec![
        Job { path: path.into(), offset: 0, len: old_len + 100_000, seed: 61, skip: vec![] },
        Job { path: path.into(), offset: T - 5_000, len: 200_000, seed: 62, skip: vec![0] },
    ];
    let mark = c.dir().join("written-s");
    let mut writer = start_writer(c, &jobs, &mark);
    wait_for_mark(&mark, &mut writer);
    let fs = rt.block_on(c.login());
    let e = rt.block_on(step("walk", fs.walk(path, OpenMode::Read))).expect("walk");
    assert_eq!(e.access.as_ref().map(|a| u64::from(a.small_threshold)), Some(T), "{path}: made under the threshold");
    let read = ManagerRequest::ReadSmall { handle: e.handle(), offset: 0, len: T as u32 };
    match rt.block_on(step("READ_SMALL", fs.call(&read))) {
        Ok(ManagerReply::SmallData(head)) => {
            assert!(head == old[..T as usize], "{path}: the head reads old while the writer's transaction is open")
        }
        other => panic!("READ_SMALL: {other:?}"),
    }
    ((path, old, jobs), writer)
}

/// After the writer's transaction on `file` ended: the whole file —
/// head from the metadata store and tail from the drives, through `nasd
/// get` — is the old content, the recorded size the old one, and every
/// subset of components reads the old tail (the drives hold nothing below
/// [`T`]).
fn check_rolled_back_whole(c: &Cluster, rt: &tokio::runtime::Runtime, file: &Written) {
    let (path, old, jobs) = file;
    let fs = rt.block_on(c.login());
    rt.block_on(settle(&fs, path));
    let mut new = old.clone();
    jobs.iter().for_each(|j| j.apply(&mut new));
    assert_eq!(rt.block_on(size_of(&fs, path)), old.len() as u64, "{path}: the recorded size is the old one");
    let back = c.dir().join("back-s");
    c.run_ok(&["get", path, path_str(&back)]);
    let got = std::fs::read(&back).expect("the copy nasd get made");
    assert_eq!(got.len(), old.len(), "{path}: nasd get");
    if let Some(at) = got.iter().zip(old.iter()).position(|(a, b)| a != b) {
        let which = if got[at] == new[at] { "new" } else { "neither" };
        panic!("{path}: byte {at} reads {which}, not old (the head ends at {T}): old and new mixed");
    }
    let on_drives = |content: &[u8]| {
        let mut d = content.to_vec();
        d[..T as usize].fill(0);
        d
    };
    let (old_d, new_d) = (on_drives(old), on_drives(&new));
    let versions: [(&str, &[u8]); 2] = [("old", &old_d), ("new", &new_d)];
    rt.block_on(check_every_subset(&fs, path, &old_d, new.len() as u64, &BTreeSet::new(), &versions));
}

/// Issue 10's "old or new, never mixed" with the small-file path on: the
/// writer process of [`a_file_crossing_the_threshold_with_a_transaction_open`]
/// SIGKILLed; after its lease the transaction is rolled back, head and tail.
#[test]
fn a_killed_writer_crossing_the_small_file_threshold_is_rolled_back_head_and_tail() {
    let c = Cluster::start(Options { drives: 3, manager: small_file_settings("mirror:2@64K"), drive_args: vec![] });
    let rt = runtime();
    let (file, mut writer) = a_file_crossing_the_threshold_with_a_transaction_open(&c, MIB + 12_345);
    writer.kill();
    check_rolled_back_whole(&c, &rt, &file);
}

/// The same with the manager SIGKILLed and started again while the
/// transaction is open: the head it staged is in the metadata store, and
/// the restarted manager drops it with the rollback it finds in its intent
/// log.
#[test]
fn a_manager_restarted_under_a_transaction_crossing_the_threshold_rolls_back_head_and_tail() {
    let mut c = Cluster::start(Options { drives: 3, manager: small_file_settings("mirror:2@64K"), drive_args: vec![] });
    let rt = runtime();
    let (file, writer) = a_file_crossing_the_threshold_with_a_transaction_open(&c, MIB + 12_345);
    c.kill_manager();
    c.start_manager();
    check_rolled_back_whole(&c, &rt, &file);
    drop(writer);
}

// ------------------------------------------------ 5. losing m and m + 1 drives

/// `rs:4+2` on six drives: with two drives stopped every file reads
/// byte-exact with `nasd get`; with a third stopped `nasd get` and `nasd
/// cat` fail with an error naming the missing drives, `get` leaves no
/// partial copy behind, and a local file it would have replaced is as it
/// was.
#[test]
fn losing_m_drives_reads_everything_and_m_plus_one_fails_cleanly() {
    let mut c = cluster(6, "rs:4+2@64K", 3600, false);
    let files: Vec<(String, Vec<u8>)> = [1, 200_001, 5 * MIB + 123, 12 * MIB]
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("/f{i}"), pattern(40 + i as u64, n as usize)))
        .collect();
    for (i, (path, data)) in files.iter().enumerate() {
        c.run_ok(&["put", path_str(&local_file(c.dir(), &format!("l{i}"), data)), path]);
    }
    let numbers: Vec<u32> = c.drives.iter().map(|d| d.number).collect();

    for &n in &numbers[..2] {
        c.drive(n).stop();
    }
    for (i, (path, data)) in files.iter().enumerate() {
        assert_eq!(get_digest(&c, path, &format!("b{i}")), digest(data), "{path} with two drives stopped");
    }

    c.drive(numbers[2]).stop();
    let stopped: Vec<(u32, String)> =
        numbers[..3].iter().map(|&n| (n, c.drives.iter().find(|d| d.number == n).unwrap().addr.to_string())).collect();
    let (path, _) = &files[3];
    let out = c.dir().join("partial");
    let got = c.run(&["get", path, path_str(&out)]);
    assert!(!got.status.success(), "nasd get with three drives of rs:4+2 stopped succeeded: {got:?}");
    for (n, addr) in &stopped {
        assert!(
            got.stderr.contains(&format!("drive {n} ({addr})")),
            "the error names drive {n} ({addr}): {}",
            got.stderr
        );
    }
    assert!(got.stderr.contains("unavailable") && got.stderr.contains("rs:4+2"), "{}", got.stderr);
    assert!(!out.exists(), "nasd get left a partial file that looks complete");
    let leftovers: Vec<String> = std::fs::read_dir(c.dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".nasd-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "staging files left behind: {leftovers:?}");

    // A local file it would have replaced stays as it was.
    let kept = local_file(c.dir(), "kept", b"what was here before");
    let got = c.run(&["get", path, path_str(&kept)]);
    assert!(!got.status.success());
    assert_eq!(std::fs::read(&kept).unwrap(), b"what was here before", "a failed get replaced the local file");

    // Every stripe of the file lost three of its six components: not one byte can be read.
    let cat = c.run(&["cat", path]);
    assert!(!cat.status.success(), "nasd cat with three drives stopped succeeded");
    for (n, addr) in &stopped {
        assert!(cat.stderr.contains(&format!("drive {n} ({addr})")), "the error names drive {n}: {}", cat.stderr);
    }
    assert!(cat.stdout.is_empty(), "nasd cat printed {} bytes it could not have read", cat.stdout.len());
}

// ------------------------------------------------------------ 6. rebuild

/// A drive stopped for good (a rebuild delay of an hour: nothing is rebuilt
/// unless asked): `nasd repair rebuild` follows the rebuild it asked for to
/// its end — once it returns, `nasd status` shows the drive down with no
/// component left on it and every file with all its redundancy (it used to
/// return before the rebuild began); every file reads back with the
/// checksum it had (`nasd get`) and through every subset of its
/// components, the rebuilt ones included.
#[test]
fn a_drive_lost_for_good_is_rebuilt_with_the_real_binaries() {
    let mut c = cluster(4, "rs:2+1@64K", 3600, false);
    let rt = runtime();
    let fs = rt.block_on(c.login());
    let files: Vec<(String, Vec<u8>)> = [1, 65_536, 200_001, 3 * MIB + 5, 9 * MIB]
        .iter()
        .enumerate()
        .map(|(i, &n)| (format!("/f{i}"), pattern(50 + i as u64, n as usize)))
        .collect();
    let mut before = Vec::new();
    for (i, (path, data)) in files.iter().enumerate() {
        c.run_ok(&["put", path_str(&local_file(c.dir(), &format!("l{i}"), data)), path]);
        before.push(get_digest(&c, path, &format!("b{i}")));
    }
    // The drive holding the most components goes.
    let status = rt.block_on(step("status", fs.cluster_status())).expect("status");
    let lost = status.drives.iter().max_by_key(|d| d.components).expect("drives");
    let (victim, held) = (lost.drive, lost.components);
    assert!(held > 0);
    let addr = c.drive(victim).addr.to_string();
    c.drive(victim).kill();

    let line = |out: &str| out.lines().find(|l| l.contains(&addr)).unwrap_or_default().to_string();
    let deadline = Instant::now() + STEP;
    loop {
        let out = c.run_ok(&["status"]);
        if line(&out).contains("DOWN") {
            break;
        }
        assert!(Instant::now() < deadline, "the drive is not shown down:\n{out}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let repaired = c.run_ok(&["repair", "rebuild"]);
    let out = c.run_ok(&["status"]);
    assert!(
        out.contains("every file has all its redundancy"),
        "nasd repair rebuild returned with files still degraded; it said:\n{repaired}\nstatus:\n{out}"
    );
    let down = line(&out);
    assert!(down.contains("DOWN") && down.trim_end().ends_with(" 0"), "the lost drive, down and empty:\n{out}");

    for (i, (path, data)) in files.iter().enumerate() {
        assert_eq!(get_digest(&c, path, &format!("a{i}")), before[i], "{path} after the rebuild");
        let info = rt.block_on(step("layout", fs.get_layout(path))).expect("layout");
        assert!(
            info.components.iter().all(|(comp, _)| comp.object.drive != victim && comp.state == ComponentState::Ok),
            "{path}: every component elsewhere and whole: {info:?}"
        );
        rt.block_on(check_every_subset(&fs, path, data, data.len() as u64, &BTreeSet::new(), &[]));
    }
}

// ------------------------------------------------------------ 7. growth

/// A fourth drive added to a live cluster of three (`nasd admin add-drive`)
/// and `nasd repair rebalance`: components of `mirror:2` files and of
/// `stripe:2` files (no redundancy: a reader gets through a move only by
/// finding the component where it went) move onto it until it holds about
/// its share (a quarter), while a reader reads every file over and over —
/// no read fails or returns other bytes during the move. Afterwards every
/// file has the checksum it had before (`nasd get`), and reads byte-exact
/// through every subset of its components.
#[test]
fn a_drive_added_to_a_live_cluster_takes_its_share_while_files_are_read() {
    let mut c = cluster(3, "mirror:2@64K", 3600, false);
    let rt = runtime();
    let fs = rt.block_on(c.login());
    c.run_ok(&["mkdir", "/s"]);
    c.run_ok(&["layout", "set", "/s", "stripe:2@64K"]);
    let files: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| {
            let dir = if i % 2 == 0 { "/s" } else { "" };
            (format!("{dir}/f{i}"), pattern(60 + i, (MIB + i * 4_099) as usize))
        })
        .collect();
    let mut before = Vec::new();
    for (i, (path, data)) in files.iter().enumerate() {
        c.run_ok(&["put", path_str(&local_file(c.dir(), &format!("l{i}"), data)), path]);
        before.push(get_digest(&c, path, &format!("b{i}")));
    }

    // The reader: every file opened once, before the move (so its bindings go stale as
    // components move), then read whole, in turn, until told to stop.
    let open: Vec<nasd_fs::File> = files
        .iter()
        .map(|(path, _)| rt.block_on(step("open", fs.open(path, false))).unwrap_or_else(|e| panic!("{path}: {e}")))
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (files, stop) = (files.clone(), stop.clone());
        rt.spawn(async move {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for (f, (path, data)) in open.iter().zip(&files) {
                    match f.read_at(0, data.len() as u64).await {
                        Ok(got) if got == *data => reads += 1,
                        Ok(got) => return Err(format!("{path}: {} bytes read, not what was put", got.len())),
                        Err(e) => return Err(format!("{path}: {e}")),
                    }
                }
            }
            Ok(reads)
        })
    };

    let added = c.add_drive();
    let deadline = Instant::now() + STEP;
    let status = loop {
        // `nasd repair rebalance` follows the rebalance to its end. It weighs the drives a
        // heartbeat has reported on: ask again while the new drive got nothing.
        let said = c.run_ok(&["repair", "rebalance"]);
        let s = rt.block_on(step("status", fs.cluster_status())).expect("status");
        let new = s.drives.iter().find(|d| d.drive == added).map_or(0, |d| d.components);
        if new > 0 {
            assert_eq!(s.rebalance, Default::default(), "nasd repair returned before the rebalance ended:\n{said}");
            break s;
        }
        assert!(Instant::now() < deadline, "nothing moved to drive {added}; nasd repair said:\n{said}\n{s:#?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let reads = rt.block_on(reader).expect("reader task").unwrap_or_else(|e| panic!("a read during the move: {e}"));
    assert!(reads > 0, "the reader read no file whole during the move");

    let total: u64 = status.drives.iter().map(|d| d.components).sum();
    assert_eq!(total, 48, "every component still exists: {status:#?}");
    let share = status.drives.iter().find(|d| d.drive == added).expect("the new drive").components as f64 / 48.0;
    assert!((0.15..=0.35).contains(&share), "the new drive holds {share:.2} of the components: {status:#?}");
    for (i, (path, data)) in files.iter().enumerate() {
        assert_eq!(get_digest(&c, path, &format!("a{i}")), before[i], "{path} after the rebalance");
        rt.block_on(check_every_subset(&fs, path, data, data.len() as u64, &BTreeSet::new(), &[]));
    }
}
