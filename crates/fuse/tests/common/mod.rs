//! Real FUSE mounts of a real nasd cluster for the mount's tests: the
//! in-process cluster of `crates/fs/tests/common` (drives with security
//! enforced, the TLS manager), one or more [`nasd_fuse::Mount`]s of it served
//! by a runtime of their own, and a watchdog that bounds each test's time: past
//! its limit it aborts the mounts' FUSE connections (so every system call
//! stuck in them fails) and, if the test still does not end, the process.
//!
//! A test body is plain blocking code against the mount points (`std::fs`,
//! child processes), as any program would use the mount.
#![allow(dead_code)]

#[path = "../../../fs/tests/common/mod.rs"]
pub mod cluster;
pub mod xattr;

#[allow(unused_imports)]
pub use cluster::{ClusterOptions, ADMIN, ADMIN_PW, PW_A, UID_A, USER_A};

use cluster::Cluster;
use nasd_fuse::{Mount, MountConfig};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Longest a mount or an unmount may take (a hang, not a timing assertion).
pub const MOUNT_WAIT_MAX: Duration = Duration::from_secs(60);

/// Why FUSE tests cannot run here, if they cannot: `/dev/fuse` must open
/// (root, and the kernel's fuse module). No CI step can provide it.
pub fn fuse_unavailable() -> Option<String> {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => None,
        Err(e) => Some(format!("/dev/fuse cannot be opened ({e}): FUSE mounts need root and the fuse module")),
    }
}

/// Skips the test (returns) with a message when FUSE is not available.
#[macro_export]
macro_rules! require_fuse {
    () => {
        if let Some(why) = common::fuse_unavailable() {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}

/// The path of an external test tool, or why the test cannot run: missing
/// tools skip the test, except under CI (`CI=true`), whose `.ci/run`
/// installs them — there a missing tool fails it.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin")))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        let message = format!("`{name}` is not installed (.ci/run installs it)");
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{message}");
        eprintln!("SKIPPED: {message}");
    }
    found
}

/// A mount the watchdog may have to cut off: its FUSE connection number.
#[derive(Clone)]
struct Cut {
    mountpoint: PathBuf,
    connection: u64,
}

/// Bounds a test's time.
pub struct Watchdog {
    done: Arc<AtomicBool>,
    cuts: Arc<Mutex<Vec<Cut>>>,
}

impl Watchdog {
    pub fn start(name: &str, limit: Duration) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let cuts: Arc<Mutex<Vec<Cut>>> = Arc::default();
        let (d, c, name) = (done.clone(), cuts.clone(), name.to_string());
        std::thread::spawn(move || {
            let deadline = Instant::now() + limit;
            while Instant::now() < deadline {
                if d.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("{name}: over its time limit of {} s: aborting its FUSE connections", limit.as_secs());
            for cut in c.lock().unwrap().iter() {
                abort_connection(cut);
            }
            let grace = Instant::now() + Duration::from_secs(60);
            while Instant::now() < grace {
                if d.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("{name}: still not ended a minute after its connections were aborted: exiting");
            std::process::exit(101);
        });
        Watchdog { done, cuts }
    }

    fn watch(&self, mountpoint: &Path) {
        // From the mount table, not a stat of the mount (which a mount that
        // refuses its caller would fail): the FUSE connection is the minor
        // device number.
        let connection = fuse_connection(mountpoint).expect("the new mount is in /proc/self/mountinfo");
        self.cuts.lock().unwrap().push(Cut { mountpoint: mountpoint.to_path_buf(), connection });
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

/// The FUSE connection number of the mount at `mountpoint`: the minor
/// device number in `/proc/self/mountinfo` (`major:minor` is its third field,
/// the mount point its fifth).
fn fuse_connection(mountpoint: &Path) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.to_str()?;
    table.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.get(4) != Some(&want) {
            return None;
        }
        fields.get(2)?.split_once(':')?.1.parse().ok()
    })
}

/// Aborts a FUSE connection through fusectl: every request on it fails at once.
fn abort_connection(cut: &Cut) {
    let dir = Path::new("/sys/fs/fuse/connections");
    if std::fs::read_dir(dir).map(|mut d| d.next().is_none()).unwrap_or(true) {
        let _ = Command::new("mount").args(["-t", "fusectl", "none"]).arg(dir).status();
    }
    let abort = dir.join(cut.connection.to_string()).join("abort");
    match std::fs::write(&abort, b"1") {
        Ok(()) => eprintln!("aborted the FUSE connection of {}", cut.mountpoint.display()),
        Err(e) => eprintln!("cannot abort {}: {e}", abort.display()),
    }
}

/// A cluster, its mounts, and the runtime that serves them.
pub struct Env {
    pub watchdog: Watchdog,
    rt: Option<tokio::runtime::Runtime>,
    cluster: Option<Cluster>,
    mounts: Vec<Mount>,
    dir: tempfile::TempDir,
}

impl Env {
    /// A cluster with `opts`, under a watchdog of `limit`.
    pub fn start(name: &str, limit: Duration, opts: ClusterOptions) -> Env {
        let watchdog = Watchdog::start(name, limit);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .thread_stack_size(8 * 1024 * 1024)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let cluster = rt.block_on(Cluster::start(opts));
        let dir = tempfile::tempdir().expect("temporary directory");
        Env { watchdog, rt: Some(rt), cluster: Some(cluster), mounts: Vec::new(), dir }
    }

    pub fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("runtime")
    }

    pub fn cluster(&self) -> &Cluster {
        self.cluster.as_ref().expect("cluster")
    }

    pub fn cluster_mut(&mut self) -> &mut Cluster {
        self.cluster.as_mut().expect("cluster")
    }

    /// Stops the manager (its listener and every session) and leaves it
    /// stopped: the mounts find nothing at its address.
    pub fn halt_manager(&mut self) {
        let (rt, cluster) = (self.rt.as_ref().expect("runtime"), self.cluster.as_mut().expect("cluster"));
        rt.block_on(cluster.halt_manager());
    }

    /// Serves the manager again on its address, with the configuration it had.
    pub fn resume_manager(&mut self) {
        let (rt, cluster) = (self.rt.as_ref().expect("runtime"), self.cluster.as_mut().expect("cluster"));
        let config = cluster.manager.config().clone();
        rt.block_on(cluster.resume_manager(config, false));
    }

    /// A scratch directory outside the mounts (removed at the end).
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// Mounts the file system as `user` with `config` (its mount point is
    /// replaced by a fresh directory); the mount point.
    pub fn mount_with(&mut self, user: &str, password: &str, mut config: MountConfig) -> PathBuf {
        let mountpoint = self.dir.path().join(format!("mnt{}", self.mounts.len()));
        std::fs::create_dir_all(&mountpoint).expect("mount point");
        config.mountpoint = mountpoint.clone();
        let rt = self.rt.as_ref().expect("runtime");
        let fs = rt.block_on(self.cluster.as_ref().expect("cluster").login(user, password));
        let mount = rt
            .block_on(async { tokio::time::timeout(MOUNT_WAIT_MAX, Mount::start(fs, config)).await })
            .expect("mounting timed out")
            .expect("mount");
        self.watchdog.watch(&mountpoint);
        self.mounts.push(mount);
        mountpoint
    }

    /// Mounts the file system as `user` at `config.mountpoint` as it is
    /// (not made or emptied first); the mount's refusal if it refuses.
    pub fn try_mount_at(&mut self, user: &str, password: &str, config: MountConfig) -> std::io::Result<()> {
        let mountpoint = config.mountpoint.clone();
        let rt = self.rt.as_ref().expect("runtime");
        let fs = rt.block_on(self.cluster.as_ref().expect("cluster").login(user, password));
        let mount = rt
            .block_on(async { tokio::time::timeout(MOUNT_WAIT_MAX, Mount::start(fs, config)).await })
            .expect("mounting timed out")?;
        self.watchdog.watch(&mountpoint);
        self.mounts.push(mount);
        Ok(())
    }

    /// Unmounts the mount made `index`-th and waits for it to end.
    pub fn unmount(&mut self, index: usize) {
        let mut mount = self.mounts.remove(index);
        mount.unmount().expect("unmount");
        let rt = self.rt.as_ref().expect("runtime");
        rt.block_on(async { tokio::time::timeout(MOUNT_WAIT_MAX, mount.ended()).await })
            .expect("the mount did not end in time")
            .expect("the mount ended cleanly");
    }

    /// Mounts as the administrator (uid 0, as the local root who runs the
    /// tests) with the default configuration.
    pub fn mount(&mut self) -> PathBuf {
        self.mount_with(ADMIN, ADMIN_PW, MountConfig::new(""))
    }

    /// The mount made `index`-th.
    pub fn mounted(&self, index: usize) -> &Mount {
        &self.mounts[index]
    }

    /// Unmounts every mount and stops the cluster.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        let Some(rt) = self.rt.take() else { return };
        for mut mount in self.mounts.drain(..) {
            if let Err(e) = mount.unmount() {
                eprintln!("unmount {}: {e}", mount.mountpoint().display());
            }
            match rt.block_on(async { tokio::time::timeout(MOUNT_WAIT_MAX, mount.ended()).await }) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("the mount at {} ended with {e}", mount.mountpoint().display()),
                Err(_) => eprintln!("the mount at {} did not end in time", mount.mountpoint().display()),
            }
        }
        if let Some(cluster) = self.cluster.take() {
            rt.block_on(cluster.stop());
        }
        rt.shutdown_timeout(Duration::from_secs(10));
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Runs `cmd`, failing the test with its output if it fails; its stdout.
pub fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The errno of a failed I/O call.
pub fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// The seed of a test's random choices: `$NASD_SEED`, else a fresh one;
/// printed, so a failing run can be repeated.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("NASD_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
    });
    eprintln!("{test}: seed {seed} (NASD_SEED={seed} repeats this run)");
    seed
}

/// A small deterministic generator (xorshift64*), seeded from [`seed`].
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A duration uniform in `lo..=hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// Log lines of this test process (every test of the binary, so callers
/// pick theirs out by a field such as the manager's address), as the
/// daemon's terminal would show them, for the targets `filter` names
/// (an `EnvFilter` directive such as `"nasd_outage=info,fuser=warn"`).
/// The first call in a process installs the collector; `NASD_LOG` is not
/// used then.
pub struct Logs(Arc<Mutex<Vec<u8>>>);

#[derive(Clone)]
struct LogSink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogSink {
    type Writer = LogSink;
    fn make_writer(&'a self) -> LogSink {
        self.clone()
    }
}

pub fn capture_logs(filter: &str) -> Logs {
    static SINK: std::sync::OnceLock<Arc<Mutex<Vec<u8>>>> = std::sync::OnceLock::new();
    let sink = SINK.get_or_init(|| {
        let sink = Arc::new(Mutex::new(Vec::new()));
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(LogSink(sink.clone()))
            .with_ansi(false)
            .init();
        sink
    });
    Logs(sink.clone())
}

impl Logs {
    /// The lines logged so far that contain every one of `parts`.
    pub fn lines_with(&self, parts: &[&str]) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
        text.lines().filter(|l| parts.iter().all(|p| l.contains(p))).map(str::to_string).collect()
    }
}

/// Where thread or process `tid` sleeps in the kernel (`/proc/TID/wchan`):
/// `request_wait_answer` or another `fuse_` function while it waits for
/// the mount; `None` once it is gone.
pub fn wchan(tid: i32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{tid}/wchan")).ok()
}

/// Whether `tid` waits for a FUSE request's answer now.
pub fn waits_for_fuse(tid: i32) -> bool {
    wchan(tid).is_some_and(|w| w.contains("fuse") || w.contains("request_wait_answer"))
}
