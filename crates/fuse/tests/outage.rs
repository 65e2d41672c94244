//! Manager outages as a mount's users meet them (issue 23.1), on a real
//! cluster and a real mount: while the manager is away, a call that needs it
//! waits for it (a hard mount) and goes on when it is back; reads of a file
//! already open, and writes inside its open write transaction, go on
//! meanwhile; no call ever fails with `EINVAL`; the wait is logged once per
//! outage, and its end once; a bounded wait fails with `EIO`; a waiting call
//! ends when its caller gets a signal.
//!
//! The manager stops and starts again on its address at moments drawn from a
//! printed seed (`NASD_SEED=N` repeats a run), while one thread makes
//! name-space calls and another reads a file held open, so each outage
//! catches the calls at another point.

mod common;

use common::{cluster::pattern, errno_of, Env, Rng, ADMIN, ADMIN_PW};
use nasd_fuse::{ManagerWait, MountConfig};
use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Each test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(900);
/// Longest the test waits for something that must happen (a hang, not a
/// timing assertion: it normally takes milliseconds).
const PATIENCE: Duration = Duration::from_secs(60);
/// The file held open and read through the outages.
const DATA_BYTES: usize = 3 << 20;
/// The log target and lines an outage writes (`nasd_fs::OUTAGE_LOG_TARGET`).
const WAIT_LINE: &str = "the manager cannot be reached: requests wait for it";
const BACK_LINE: &str = "the manager answers again";

fn logs() -> common::Logs {
    common::capture_logs(&format!("{}=info", nasd_fs::OUTAGE_LOG_TARGET))
}

/// Polls `done` until it holds, failing the test with `what` after [`PATIENCE`].
fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {} s", PATIENCE.as_secs());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// `statvfs(2)` of the mount (`df`): its total blocks.
fn statvfs(p: &Path) -> io::Result<u64> {
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of the right type.
    if unsafe { libc::statvfs(cstr(p).as_ptr(), &mut s) } == 0 {
        Ok(s.f_blocks as u64)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `stat(2)` without the standard library's retries: its size.
fn stat(p: &Path) -> io::Result<u64> {
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a buffer of the right type.
    if unsafe { libc::stat(cstr(p).as_ptr(), &mut s) } == 0 {
        Ok(s.st_size as u64)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `touch`: the modification time set to now.
fn touch(p: &Path) -> io::Result<()> {
    // SAFETY: a NUL-terminated path; null times mean "now".
    if unsafe { libc::utimensat(libc::AT_FDCWD, cstr(p).as_ptr(), std::ptr::null(), 0) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The names in directory `p`.
fn list(p: &Path) -> io::Result<Vec<String>> {
    fs::read_dir(p)?.map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned())).collect()
}

/// Reads `len` bytes at `at` of the open `file` from the mount, not from
/// the kernel's page cache (dropped first), and checks them against `data`.
fn read_checked(file: &fs::File, data: &[u8], at: usize, len: usize) -> io::Result<()> {
    // SAFETY: an open descriptor; the advice only drops cached pages.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, at as u64)?;
    assert!(buf == data[at..at + len], "the bytes at {at}..{} read through the mount are wrong", at + len);
    Ok(())
}

/// One call of the name-space worker.
struct Call {
    what: String,
    /// It changes the name space (a lost reply may leave it done or not).
    changes: bool,
    started: Instant,
    ended: Instant,
    result: io::Result<()>,
}

/// When the manager went away and came back.
#[derive(Clone, Copy)]
struct Outage {
    /// Its stop began.
    stopping: Instant,
    /// It was stopped: no session left.
    stopped: Instant,
    /// It serves again.
    back: Instant,
}

/// Makes seeded name-space calls in `dir` until `stop`: lists, `df`,
/// `stat`, `touch`, creates with contents, `mkdir`.
fn name_space_worker(dir: PathBuf, mount: PathBuf, seed: u64, stop: Arc<AtomicBool>) -> Vec<Call> {
    let mut rng = Rng::new(seed);
    let mut calls = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let started = Instant::now();
        let (what, changes, result) = match rng.below(6) {
            0 => ("list".to_string(), false, list(&dir).map(|names| assert!(names.iter().any(|n| n == "base-0")))),
            1 => ("df".to_string(), false, statvfs(&mount).map(|blocks| assert!(blocks > 0))),
            2 => {
                let k = rng.below(4);
                ("stat".to_string(), false, stat(&dir.join(format!("base-{k}"))).map(|n| assert_eq!(n, k + 1)))
            }
            3 => ("touch".to_string(), true, touch(&dir.join(format!("base-{}", rng.below(4))))),
            4 => (format!("create w-{i}"), true, fs::write(dir.join(format!("w-{i}")), i.to_string())),
            _ => (format!("mkdir m-{i}"), true, fs::create_dir(dir.join(format!("m-{i}")))),
        };
        calls.push(Call { what, changes, started, ended: Instant::now(), result });
        std::thread::sleep(Duration::from_millis(rng.below(30)));
    }
    calls
}

/// Reads seeded ranges of the open `file` until `stop`; when each read started.
fn reader(file: Arc<fs::File>, data: Arc<Vec<u8>>, seed: u64, stop: Arc<AtomicBool>, reads: Arc<Mutex<Vec<Instant>>>) {
    let mut rng = Rng::new(seed);
    while !stop.load(Ordering::SeqCst) {
        let len = 1 + rng.below(256 * 1024) as usize;
        let at = rng.below((data.len() - len) as u64) as usize;
        let started = Instant::now();
        if let Err(e) = read_checked(&file, &data, at, len) {
            panic!("reading the open file at {at} failed: {e} (errno {})", errno_of(&e));
        }
        reads.lock().unwrap().push(started);
    }
}

/// The calls of a thread started while the manager is away: they wait for it.
fn calls_during(dir: &Path, mount: &Path, round: usize) -> io::Result<()> {
    let names = list(dir)?;
    assert!(names.iter().any(|n| n == "base-0"), "{names:?}");
    assert!(statvfs(mount)? > 0);
    let path = dir.join(format!("during-{round}"));
    let text = format!("made during outage {round}");
    fs::write(&path, &text)?;
    let size = stat(&path)?;
    if size != text.len() as u64 {
        // Lost, or a stale size? Asked again past the attribute timeout, and read back.
        std::thread::sleep(nasd_fuse::ATTR_TIMEOUT_DEFAULT + Duration::from_secs(1));
        let (later, read) = (stat(&path)?, fs::read(&path)?);
        panic!(
            "during-{round} stats as {size} bytes right after its close; {later} bytes a while later, {} read back \
             (of {})",
            read.len(),
            text.len()
        );
    }
    Ok(())
}

/// Starts `f` on a thread of its own; its thread id once it runs.
fn thread_with_tid<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> (std::thread::JoinHandle<T>, i32) {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        // SAFETY: gettid(2) cannot fail.
        tx.send(unsafe { libc::gettid() }).unwrap();
        f()
    });
    (handle, rx.recv().unwrap())
}

/// Waits until thread `tid` waits for the mount's answer; fails the test if
/// `handle`'s thread ends first (its call did not wait).
fn until_waiting<T: std::fmt::Debug>(what: &str, tid: i32, handle: &std::thread::JoinHandle<T>) {
    until(&format!("{what} waiting for the manager"), || {
        assert!(!handle.is_finished(), "{what} ended without waiting for the manager");
        common::waits_for_fuse(tid)
    });
}

#[test]
fn calls_wait_through_manager_outages_while_open_files_read_and_write_on() {
    require_fuse!();
    let logs = logs();
    let seed = common::seed("outages");
    let mut rng = Rng::new(seed);
    let mut env = Env::start("outages", LIMIT, common::ClusterOptions::default());
    let m = env.mount();
    let addr = env.cluster().addr.to_string();

    let dir = m.join("d");
    fs::create_dir(&dir).unwrap();
    for k in 0..4u64 {
        fs::write(dir.join(format!("base-{k}")), vec![b'x'; k as usize + 1]).unwrap();
    }
    let data = Arc::new(pattern(seed, DATA_BYTES));
    fs::write(m.join("data"), data.as_slice()).unwrap();
    let held = Arc::new(fs::File::open(m.join("data")).unwrap());

    let stop = Arc::new(AtomicBool::new(false));
    let reads: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let worker = {
        let (dir, m, stop) = (dir.clone(), m.clone(), stop.clone());
        let s = rng.next();
        std::thread::spawn(move || name_space_worker(dir, m, s, stop))
    };
    let reading = {
        let (held, data, stop, reads) = (held.clone(), data.clone(), stop.clone(), reads.clone());
        let s = rng.next();
        std::thread::spawn(move || reader(held, data, s, stop, reads))
    };

    let rounds = 2 + rng.below(2) as usize;
    let mut outages = Vec::new();
    for round in 0..rounds {
        std::thread::sleep(rng.millis(0, 800));
        // A file open for writing, its write transaction begun just before the outage.
        let written = pattern(seed ^ round as u64, 200_000);
        let mut writer = fs::File::create(m.join(format!("written-{round}"))).unwrap();
        writer.write_all(&written[..100_000]).unwrap();

        let stopping = Instant::now();
        env.halt_manager();
        let stopped = Instant::now();
        eprintln!("outage {round}: the manager is stopped");

        // A name-space call made now waits for the manager.
        let (during, tid) = {
            let (dir, m) = (dir.clone(), m.clone());
            thread_with_tid(move || calls_during(&dir, &m, round))
        };
        until_waiting("a listing made while the manager is away", tid, &during);
        // Reads of the open file go on: some start and end while the manager is away.
        let before = reads.lock().unwrap().iter().filter(|t| **t > stopped).count();
        until("reads of the open file going on while the manager is away", || {
            reads.lock().unwrap().iter().filter(|t| **t > stopped).count() >= before + 3
        });
        // So do writes inside the write transaction begun before the outage.
        let wrote = std::thread::spawn(move || writer.write_all(&written[100_000..]).map(|()| (writer, written)));
        until("writes inside an open transaction going on while the manager is away", || wrote.is_finished());
        let (writer, written) = wrote.join().unwrap().expect("a write inside an open transaction");
        std::thread::sleep(rng.millis(0, 1500));

        env.resume_manager();
        eprintln!("outage {round}: the manager is back");
        outages.push(Outage { stopping, stopped, back: Instant::now() });
        during.join().unwrap().expect("the calls made while the manager was away, once it is back");
        // The writes of the outage are committed at close, and read back.
        writer.sync_all().expect("committing the writes made during the outage");
        drop(writer);
        assert!(
            fs::read(m.join(format!("written-{round}"))).unwrap() == written,
            "the file written across outage {round}"
        );
    }
    std::thread::sleep(rng.millis(0, 500));
    stop.store(true, Ordering::SeqCst);
    reading.join().expect("the reader saw every byte right");
    let calls = worker.join().unwrap();
    drop(held);
    env.stop();

    // No call failed with EINVAL; each either went through or, changing the name space while
    // the manager was going away under it (its reply lost), failed with EIO.
    let in_flight = |c: &Call| outages.iter().any(|o| c.started <= o.stopped && c.ended >= o.stopping);
    let mut waited = 0;
    for c in &calls {
        if outages.iter().any(|o| c.started >= o.stopped && c.started <= o.back) {
            waited += 1;
        }
        match &c.result {
            Ok(()) => {}
            Err(e) if c.changes && in_flight(c) && errno_of(e) == libc::EIO => {
                eprintln!("{}: EIO, its reply lost as the manager went away", c.what);
            }
            Err(e) => {
                panic!("{} failed: {e} (errno {}); in flight at an outage: {}", c.what, errno_of(e), in_flight(c))
            }
        }
    }
    eprintln!("{} name-space calls, {waited} of them started while the manager was away", calls.len());

    // Each outage logged once when calls began to wait, and once when it ended.
    let waits = logs.lines_with(&[&addr, WAIT_LINE]);
    let backs = logs.lines_with(&[&addr, BACK_LINE]);
    assert_eq!(waits.len(), rounds, "one line per outage as it began: {waits:#?}");
    assert_eq!(backs.len(), rounds, "one line per outage as it ended: {backs:#?}");
    assert!(waits.iter().all(|l| l.contains("WARN") && l.contains("until it is back")), "{waits:#?}");
}

#[test]
fn a_bounded_wait_fails_with_eio_while_open_files_read_on() {
    require_fuse!();
    let logs = logs();
    let seed = common::seed("bounded");
    let mut rng = Rng::new(seed);
    let bound = rng.millis(200, 1500);
    let mut env = Env::start("bounded", LIMIT, common::ClusterOptions::default());
    let mut config = MountConfig::new("");
    config.manager_wait = ManagerWait::Bounded(bound);
    let m = env.mount_with(ADMIN, ADMIN_PW, config);
    let addr = env.cluster().addr.to_string();
    fs::create_dir(m.join("d")).unwrap();
    let data = pattern(seed, DATA_BYTES);
    fs::write(m.join("data"), &data).unwrap();
    let held = fs::File::open(m.join("data")).unwrap();

    env.halt_manager();
    std::thread::sleep(rng.millis(0, 300));
    let d = m.join("d");
    type Call<'a> = Box<dyn Fn() -> io::Result<()> + 'a>;
    let calls: [(&str, Call); 5] = [
        ("ls", Box::new(|| list(&d).map(|_| ()))),
        ("df", Box::new(|| statvfs(&m).map(|_| ()))),
        ("stat", Box::new(|| stat(&d.join("absent")).map(|_| ()))),
        ("touch", Box::new(|| fs::write(d.join("new"), b"new"))),
        ("mkdir", Box::new(|| fs::create_dir(d.join("sub")))),
    ];
    for (what, call) in &calls {
        let e = call().expect_err(&format!("{what} while the manager is away, past the bound"));
        assert_eq!(errno_of(&e), libc::EIO, "{what}: {e}");
        read_checked(&held, &data, rng.below(DATA_BYTES as u64 / 2) as usize, 100_000)
            .expect("a read of the open file while the manager is away");
    }
    env.resume_manager();
    // Back: the same calls go through.
    assert!(list(&d).unwrap().is_empty());
    assert!(statvfs(&m).unwrap() > 0);
    fs::write(d.join("new"), b"new").unwrap();
    fs::create_dir(d.join("sub")).unwrap();
    assert_eq!(stat(&d.join("new")).unwrap(), 3);
    drop(held);
    env.stop();
    let waits = logs.lines_with(&[&addr, WAIT_LINE]);
    assert_eq!(waits.len(), 1, "{waits:#?}");
    assert!(waits[0].contains("then fail with EIO"), "{waits:#?}");
    assert_eq!(logs.lines_with(&[&addr, BACK_LINE]).len(), 1);
}

extern "C" fn ignore_signal(_: libc::c_int) {}

#[test]
fn a_call_waiting_for_the_manager_ends_when_its_caller_is_signalled() {
    require_fuse!();
    let _logs = logs();
    let mut env = Env::start("interrupted", LIMIT, common::ClusterOptions::default());
    let m = env.mount();
    fs::create_dir(m.join("d")).unwrap();
    env.halt_manager();

    // A process killed while its call waits: the call ends, the process with it.
    let mut child = std::process::Command::new("stat")
        .arg(m.join("d/absent"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run stat");
    let pid = child.id() as i32;
    until("stat waiting for the manager", || {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            let _ = io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
            panic!("stat ended without waiting for the manager ({status}): {err}");
        }
        common::waits_for_fuse(pid)
    });
    // SAFETY: signals a child of this process that has not been reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "{status}");

    // A thread whose signal handler runs: its call ends with EINTR.
    // SAFETY: installs a handler that does nothing, without SA_RESTART.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ignore_signal as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()), 0);
    }
    let absent = m.join("d/absent-too");
    let (waiting, tid) = thread_with_tid(move || stat(&absent));
    until_waiting("a stat", tid, &waiting);
    // SAFETY: the thread is alive (joined below).
    assert_eq!(
        unsafe { libc::pthread_kill(std::os::unix::thread::JoinHandleExt::as_pthread_t(&waiting), libc::SIGUSR1) },
        0
    );
    let e = waiting.join().unwrap().expect_err("a stat of a name nobody made");
    assert_eq!(errno_of(&e), libc::EINTR, "{e}");

    env.resume_manager();
    let e = stat(&m.join("d/absent")).expect_err("no such file");
    assert_eq!(errno_of(&e), libc::ENOENT, "{e}");
    assert!(list(&m.join("d")).unwrap().is_empty());
    env.stop();
}
