//! `nasd mount` as a user meets it (issue 23), over `nasd up` on this
//! machine and through `/dev/fuse` (root and the fuse module; without them
//! each test says why and is skipped):
//!
//! - While the whole `nasd up` is down and starting again, calls in the
//!   mount wait and then go on — no `EINVAL` — and the mount's terminal says
//!   so once when the wait begins and once when it ends (23.1). When it goes
//!   down and how long it stays down come from a printed seed
//!   (`NASD_SEED=N` repeats a run).
//! - `nasd mount` refuses a directory with entries (unless `--nonempty`)
//!   and a directory that already is a mount point, saying what to do, and
//!   Python opening files in the mount puts nothing in its terminal (23.5).

mod common;

use common::up::Up;
use common::{nasd_command, until, DAEMON_WAIT_MAX};
use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Why the mount cannot be tested here, if it cannot.
fn fuse_unavailable() -> Option<String> {
    match fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => None,
        Err(e) => Some(format!("/dev/fuse cannot be opened ({e}): FUSE mounts need root and the fuse module")),
    }
}

macro_rules! require_fuse {
    () => {
        if let Some(why) = fuse_unavailable() {
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
}

/// The seed of the test's timing: `$NASD_SEED`, else fresh; printed.
fn seed(test: &str) -> u64 {
    let seed = std::env::var("NASD_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        now.as_nanos() as u64 ^ u64::from(std::process::id())
    });
    eprintln!("{test}: seed {seed} (NASD_SEED={seed} repeats this run)");
    seed
}

/// A delay of `lo..=hi` milliseconds drawn from `seed` (split by `n`).
fn delay(seed: u64, n: u64, lo: u64, hi: u64) -> Duration {
    let mut x = (seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    x ^= x >> 29;
    Duration::from_millis(lo + x % (hi - lo + 1))
}

/// The mounts at `point` in this process's mount table.
fn mounts_at(point: &Path) -> usize {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap();
    table.lines().filter(|l| l.split(' ').nth(4) == point.to_str()).count()
}

/// A `nasd mount` serving in the background, its terminal output in a file.
struct Mounted {
    child: Option<Child>,
    point: PathBuf,
    log: PathBuf,
}

impl Mounted {
    /// `nasd mount POINT EXTRA…` in `cwd` (the cluster's config found there); returns once mounted.
    fn start(cwd: &Path, point: &Path, extra: &[&str]) -> Mounted {
        let log = cwd.join(format!("mount-{}.log", point.file_name().unwrap().to_string_lossy()));
        let out = fs::File::create(&log).unwrap();
        let child = nasd_command()
            .current_dir(cwd)
            .arg("mount")
            .arg(point)
            .args(extra)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("run nasd mount");
        let mut m = Mounted { child: Some(child), point: point.to_path_buf(), log };
        until("nasd mount mounting", || {
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("nasd mount ended ({status}):\n{}", m.output());
            }
            m.output().contains("mounted at")
        });
        m
    }

    /// What it printed so far.
    fn output(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM: it unmounts and ends cleanly.
    fn stop(mut self) -> String {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child, not reaped yet.
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + DAEMON_WAIT_MAX;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "nasd mount ignored SIGTERM:\n{}", self.output());
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "nasd mount ended with {status}:\n{}", self.output());
        assert_eq!(mounts_at(&self.point), 0, "unmounted");
        self.output()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            // A mount whose server died: detach it so the directory can go.
            let path = CString::new(self.point.as_os_str().as_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// `nasd mount ARGS` that must be refused: its terminal output. A mount it
/// makes instead (it would serve on) is taken down and fails the test.
fn mount_refused(cwd: &Path, point: &Path, args: &[&str]) -> String {
    let before = mounts_at(point);
    let log = cwd.join("refused.log");
    let out = fs::File::create(&log).unwrap();
    let mut child = nasd_command()
        .current_dir(cwd)
        .arg("mount")
        .arg(point)
        .args(args)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("run nasd mount");
    let deadline = Instant::now() + DAEMON_WAIT_MAX;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if mounts_at(point) > before || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let path = CString::new(point.as_os_str().as_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
            panic!(
                "nasd mount {} {args:?} mounted instead of refusing:\n{}",
                point.display(),
                fs::read_to_string(&log).unwrap()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{output}");
    assert_eq!(mounts_at(point), before, "nothing more mounted at {}", point.display());
    output
}

/// `statvfs(2)` (`df`): the mount's total blocks.
fn statvfs(p: &Path) -> io::Result<u64> {
    let path = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of the right type.
    if unsafe { libc::statvfs(path.as_ptr(), &mut s) } == 0 {
        Ok(s.f_blocks as u64)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether thread `tid` waits for a FUSE request's answer (`/proc/TID/wchan`).
fn waits_for_fuse(tid: i32) -> bool {
    fs::read_to_string(format!("/proc/{tid}/wchan"))
        .is_ok_and(|w| w.contains("fuse") || w.contains("request_wait_answer"))
}

#[test]
fn calls_in_a_mount_wait_while_nasd_up_restarts() {
    require_fuse!();
    let seed = seed("restart");
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let mut up = Up::start(cwd, 2, &[]);
    let point = cwd.join("mnt");
    fs::create_dir(&point).unwrap();
    let mount = Mounted::start(cwd, &point, &[]);
    fs::create_dir(point.join("d")).unwrap();
    fs::write(point.join("d/before"), b"written before the outage").unwrap();
    std::thread::sleep(delay(seed, 1, 0, 1000));

    let addr = up.daemon.addr;
    up.daemon.terminate();
    eprintln!("nasd up stopped");
    // `ls`, `df`, `touch` and `cat` while everything is down: they wait.
    let d = point.join("d");
    let (tx, rx) = std::sync::mpsc::channel();
    let during = std::thread::spawn(move || {
        // SAFETY: gettid(2) cannot fail.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let names: Vec<String> = fs::read_dir(&d)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?;
        assert_eq!(names, ["before"]);
        assert!(statvfs(&d)? > 0);
        fs::write(d.join("during"), b"made while nasd up was down")?;
        assert_eq!(fs::read(d.join("before"))?, b"written before the outage");
        io::Result::Ok(())
    });
    let tid = rx.recv().unwrap();
    until("ls waiting for the manager", || during.is_finished() || waits_for_fuse(tid));
    if during.is_finished() {
        panic!("calls made while nasd up was down ended without waiting: {:?}", during.join());
    }
    std::thread::sleep(delay(seed, 2, 0, 2000));
    drop(up);
    let _up = Up::start_with(cwd, 2, Some(addr), &[], &[]);
    eprintln!("nasd up started again");
    if let Err(e) = during.join().unwrap() {
        panic!("a call made while nasd up was down failed once it was back: {e}\n{}", mount.output());
    }
    assert_eq!(fs::read(point.join("d/during")).unwrap(), b"made while nasd up was down");

    let said = mount.stop();
    let waits = said.lines().filter(|l| l.contains("the manager cannot be reached: requests wait for it")).count();
    let backs = said.lines().filter(|l| l.contains("the manager answers again")).count();
    assert_eq!((waits, backs), (1, 1), "the outage said once as it began and once as it ended:\n{said}");
    assert!(!said.contains("Invalid argument"), "{said}");
}

#[test]
fn nasd_mount_refuses_what_would_surprise_and_keeps_quiet() {
    require_fuse!();
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let _up = Up::start(cwd, 1, &[]);
    let point = cwd.join("full");
    fs::create_dir(&point).unwrap();
    fs::write(point.join("keep.txt"), b"local bytes").unwrap();

    let said = mount_refused(cwd, &point, &[]);
    assert!(said.contains("is not empty") && said.contains("keep.txt") && said.contains("--nonempty"), "{said}");
    let mount = Mounted::start(cwd, &point, &["--nonempty"]);
    assert!(!point.join("keep.txt").exists(), "the mount shows nasd, hiding the directory's entries");
    let said = mount_refused(cwd, &point, &[]);
    assert!(said.contains("already a mount point") && said.contains("unmount it first"), "{said}");
    let said = mount_refused(cwd, &point, &["--nonempty"]);
    assert!(said.contains("already a mount point"), "{said}");

    // Python's open() asks isatty (an ioctl) of every file it opens.
    fs::write(point.join("script.py"), b"print('hello')\n").unwrap();
    let python = std::process::Command::new("python3")
        .arg("-c")
        .arg("import sys\nfor i in range(50):\n    open(sys.argv[1]).read()\n    open(sys.argv[1], 'rb').read()\n")
        .arg(point.join("script.py"))
        .stdin(Stdio::null())
        .output();
    match python {
        Ok(out) => assert!(out.status.success(), "python3: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => eprintln!("python3 not run ({e}); the mount tests' ioctl test covers it"),
    }
    let said = mount.stop();
    assert!(!said.contains("ioctl") && !said.contains("WARN"), "the mount's terminal:\n{said}");
    assert_eq!(fs::read(point.join("keep.txt")).unwrap(), b"local bytes", "the hidden entries come back untouched");
}

/// `nasd mount --metrics ADDR` serves the mount's own metrics: a file read
/// through the mount (written by `nasd put`, so not in the page cache), a
/// file written through it, and an extended attribute that does not exist
/// move the counters by FUSE operation — bytes read and written, and the
/// failed `getxattr` —, and a write over a directory's quota counts its
/// failed data requests (`write`, `flush` or `fsync` answered `EDQUOT`).
#[test]
fn nasd_mount_serves_its_metrics_by_fuse_operation() {
    require_fuse!();
    use nasd_metrics::{scrape, sum_of};
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let up = Up::start(cwd, 1, &[]);
    let data: Vec<u8> = (0..(3 << 20) + 17).map(|i: u32| (i % 241) as u8).collect();
    fs::write(cwd.join("in.bin"), &data).unwrap();
    up.ok(&["put", "in.bin", "/in.bin"]);
    up.ok(&["mkdir", "/q"]);
    up.ok(&["quota", "--dir", "/q", "--bytes", "64KiB"]);
    let point = cwd.join("mnt");
    fs::create_dir(&point).unwrap();
    let mount = Mounted::start(cwd, &point, &["--metrics", "127.0.0.1:0"]);
    let mut at = None;
    until("the mount names its metrics endpoint", || {
        at = mount.output().lines().find_map(|l| l.strip_prefix("metrics at http://")).map(str::to_string);
        at.is_some()
    });
    let at: std::net::SocketAddr = at.unwrap().trim_end_matches("/metrics").parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let before = rt.block_on(scrape(at)).expect("the endpoint answers");

    let read = fs::read(point.join("in.bin"));
    assert!(read.is_ok(), "{read:?}: {}", mount.output());
    assert_eq!(read.unwrap(), data, "read through the mount");
    let written = &data[..1 << 20];
    let wrote = fs::write(point.join("out.bin"), written);
    assert!(wrote.is_ok(), "{wrote:?}: {}", mount.output());
    let path = CString::new(point.join("in.bin").as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated path and name; no buffer (size 0) asks for the length only.
    let got = unsafe { libc::getxattr(path.as_ptr(), c"user.none".as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!((got, io::Error::last_os_error().raw_os_error()), (-1, Some(libc::ENODATA)));

    let after = rt.block_on(scrape(at)).expect("the endpoint answers");
    let moved = |name: &str, labels: &[(&str, &str)]| sum_of(&after, name, labels) - sum_of(&before, name, labels);
    let read = moved("nasd_mount_data_bytes_total", &[("op", "read")]);
    assert!(read >= data.len() as f64, "{read} bytes read through the mount for a {}-byte file", data.len());
    assert_eq!(moved("nasd_mount_data_bytes_total", &[("op", "write")]), written.len() as f64);
    assert!(moved("nasd_mount_requests_total", &[("op", "read")]) >= 1.0);
    assert!(moved("nasd_mount_requests_total", &[("op", "write")]) >= 1.0);
    assert!(moved("nasd_mount_requests_total", &[("op", "create")]) >= 1.0);
    // (The kernel asks for security.capability before writes too.)
    assert!(moved("nasd_mount_failures_total", &[("op", "getxattr")]) >= 1.0, "the attribute that does not exist");
    assert_eq!(moved("nasd_mount_failures_total", &[("op", "read")]), 0.0);
    assert!(moved("nasd_mount_request_duration_seconds_count", &[("op", "flush")]) >= 1.0, "each close flushes");

    // Over the quota: the data requests that fail are failures of their operation.
    let data_failures = |scraped: &[nasd_metrics::Sample]| -> f64 {
        ["write", "flush", "fsync"].iter().map(|op| sum_of(scraped, "nasd_mount_failures_total", &[("op", op)])).sum()
    };
    let mut big = fs::File::create(point.join("q").join("big.bin")).expect("create under the quota");
    let wrote = big.write_all(&data).and_then(|()| big.sync_all());
    assert_eq!(wrote.map_err(|e| e.raw_os_error()), Err(Some(libc::EDQUOT)), "3 MiB into a 64 KiB quota");
    drop(big);
    let over = rt.block_on(scrape(at)).expect("the endpoint answers");
    let failed = data_failures(&over) - data_failures(&after);
    assert!(failed >= 1.0, "{failed} failed data requests counted for a write over the quota");
    mount.stop();
}
