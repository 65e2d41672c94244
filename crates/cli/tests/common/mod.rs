//! The `nasd` binary as a child process, for the tests that start real
//! daemons: start on a loopback port and wait until it accepts, SIGKILL,
//! SIGTERM with a bounded wait for a clean exit, and the daemon's log; a
//! drive's master key once it wrote it; `nasd` client commands. `cluster`
//! runs a whole cluster of such processes (drives, a manager, clients).
#![allow(dead_code)]

pub mod cluster;
pub mod up;

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a daemon may take to start listening or to stop after SIGTERM
/// (a hang, not a timing assertion).
pub const DAEMON_WAIT_MAX: Duration = Duration::from_secs(120);

/// Polls `done`, failing with `what` after [`DAEMON_WAIT_MAX`] (a hang, not a timing assertion).
pub fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + DAEMON_WAIT_MAX;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {} s", DAEMON_WAIT_MAX.as_secs());
        std::thread::sleep(Duration::from_millis(20));
    }
}
/// Ports tried before giving up when the chosen one is taken meanwhile.
const PORT_ATTEMPTS: usize = 5;

/// A free loopback address (free now; a daemon may still lose it to
/// another test), below the kernel's ephemeral range so that the outgoing
/// connections of daemons started meanwhile never take it.
pub fn free_addr() -> SocketAddr {
    let port = nasd_meta::pg_server::free_loopback_port().expect("a free loopback port");
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A `nasd` daemon running as a child process, its output in a log file.
pub struct Daemon {
    pub name: &'static str,
    child: Option<Child>,
    pub addr: SocketAddr,
    log: PathBuf,
}

impl Daemon {
    /// Starts `nasd <args(addr)>` in `cwd`, listening on `prefer` (or, if
    /// that is taken, a free loopback port), and waits until it accepts
    /// connections. Its output is appended to `log`.
    pub fn start(
        name: &'static str,
        cwd: &Path,
        log: &Path,
        prefer: Option<SocketAddr>,
        args: impl Fn(SocketAddr) -> Vec<OsString>,
    ) -> Daemon {
        Self::start_with_env(name, cwd, log, prefer, &[], args)
    }

    /// [`Daemon::start`] with `env` added to the daemon's environment.
    pub fn start_with_env(
        name: &'static str,
        cwd: &Path,
        log: &Path,
        prefer: Option<SocketAddr>,
        env: &[(&str, &str)],
        args: impl Fn(SocketAddr) -> Vec<OsString>,
    ) -> Daemon {
        for attempt in 1..=PORT_ATTEMPTS {
            let addr = match prefer {
                Some(a) if attempt == 1 => a,
                _ => free_addr(),
            };
            let logf = OpenOptions::new().create(true).append(true).open(log).expect("daemon log");
            let child = Command::new(env!("CARGO_BIN_EXE_nasd"))
                .args(args(addr))
                .current_dir(cwd)
                .env("NASD_LOG", "info")
                .env("NO_COLOR", "1")
                .env_remove("NASD_CONFIG")
                .env_remove("NASD_NEW_PASSWORD")
                .env_remove("NASD_PASSWORD")
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(logf.try_clone().expect("daemon log"))
                .stderr(logf)
                .spawn()
                .expect("cannot start the nasd binary");
            let mut d = Daemon { name, child: Some(child), addr, log: log.to_path_buf() };
            let deadline = Instant::now() + DAEMON_WAIT_MAX;
            loop {
                if let Some(status) = d.child.as_mut().unwrap().try_wait().expect("try_wait") {
                    d.child = None;
                    let tail = log_tail(log);
                    if tail.contains("cannot listen") && attempt < PORT_ATTEMPTS {
                        break; // someone took the port in between: pick another
                    }
                    panic!("{name} exited at startup ({status}); log:\n{tail}");
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return d;
                }
                assert!(Instant::now() < deadline, "{name} did not accept on {addr} in time; log:\n{}", log_tail(log));
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        unreachable!("every attempt returns or panics")
    }

    /// Starts `WRAP… nasd ARGS` in `cwd` (e.g. `ip netns exec NS` first:
    /// the daemon on another host), `env` added to its environment, and
    /// waits until it accepts connections at `addr` (an address it owns, so
    /// there is no other port to try). Its output is appended to `log`.
    pub fn start_wrapped(
        name: &'static str,
        cwd: &Path,
        log: &Path,
        wrap: &[String],
        addr: SocketAddr,
        env: &[(&str, &str)],
        args: Vec<OsString>,
    ) -> Daemon {
        let logf = OpenOptions::new().create(true).append(true).open(log).expect("daemon log");
        let mut command = match wrap.split_first() {
            None => Command::new(env!("CARGO_BIN_EXE_nasd")),
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(env!("CARGO_BIN_EXE_nasd"));
                c
            }
        };
        let child = command
            .args(args)
            .current_dir(cwd)
            .env("NASD_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("NASD_CONFIG")
            .env_remove("NASD_NEW_PASSWORD")
            .env_remove("NASD_PASSWORD")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(logf.try_clone().expect("daemon log"))
            .stderr(logf)
            .spawn()
            .expect("cannot start the nasd binary");
        let mut d = Daemon { name, child: Some(child), addr, log: log.to_path_buf() };
        let deadline = Instant::now() + DAEMON_WAIT_MAX;
        loop {
            if let Some(status) = d.child.as_mut().unwrap().try_wait().expect("try_wait") {
                d.child = None;
                panic!("{name} exited at startup ({status}); log:\n{}", log_tail(log));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return d;
            }
            assert!(Instant::now() < deadline, "{name} did not accept on {addr} in time; log:\n{}", log_tail(log));
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the daemon wrote so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Everything the daemon wrote, once it holds `needle` (or after
    /// [`DAEMON_WAIT_MAX`]): a daemon listens before its banner is written
    /// whole, and stderr writes a line in pieces.
    pub fn output_once(&self, needle: &str) -> String {
        let deadline = Instant::now() + DAEMON_WAIT_MAX;
        loop {
            let out = self.output();
            // The whole line: the daemon may be between the writes of one.
            let whole = out.find(needle).is_some_and(|at| out[at..].contains('\n'));
            if whole || Instant::now() >= deadline {
                return out;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The end of the daemon's log, for failure messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }

    /// Whether it runs (not killed or stopped by the test).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    /// Waits (at most [`DAEMON_WAIT_MAX`]) for the daemon to exit by itself;
    /// `None` if it is still running then.
    pub fn wait_exit(&mut self) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + DAEMON_WAIT_MAX;
        let child = self.child.as_mut().expect("daemon running");
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("daemon running");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }

    /// SIGTERM, and wait (bounded) for a clean exit.
    pub fn terminate(&mut self) {
        let mut child = self.child.take().expect("daemon running");
        // SAFETY: plain kill(2) on our own child, which has not been reaped.
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0, "SIGTERM: {}", std::io::Error::last_os_error());
        let deadline = Instant::now() + DAEMON_WAIT_MAX;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                assert!(status.success(), "{} did not stop cleanly ({status}); log:\n{}", self.name, self.log_tail());
                return;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{} ignored SIGTERM; log:\n{}", self.name, self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
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

/// A `nasd` command with none of the environment that would change whom it
/// logs in as or which config file it reads.
pub fn nasd_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nasd"));
    c.env("NO_COLOR", "1")
        .env_remove("NASD_CONFIG")
        .env_remove("NASD_NEW_PASSWORD")
        .env_remove("NASD_PASSWORD")
        .env_remove("NASD_USER")
        .stdin(Stdio::null());
    c
}

/// The standard output of a command that must have succeeded (else its
/// output is the failure's message).
#[track_caller]
pub fn ok(out: std::process::Output) -> String {
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The master key a drive serving `drive_dir` made as it started: it
/// listens first and writes the key after, so this waits (bounded) for a
/// whole one.
pub fn master_key(drive_dir: &Path) -> nasd_crypto::Key {
    let deadline = Instant::now() + DAEMON_WAIT_MAX;
    loop {
        match nasd_crypto::read_key_file(&drive_dir.join("master.key")) {
            Ok(k) => return k,
            Err(e) => assert!(Instant::now() < deadline, "no master key in {}: {e}", drive_dir.display()),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last 40 lines of `log`.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Bytes in a mebibyte.
pub const MIB: u64 = 1024 * 1024;

/// Resident memory of process `pid`, in bytes.
pub fn rss(pid: u32) -> u64 {
    proc_status(pid, "VmRSS:") * 1024
}

/// A `kB` or count field of /proc/PID/status.
pub fn proc_status(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line[field.len()..].trim().trim_end_matches(" kB").parse().expect("a number")
}

/// Threads of process `pid`.
pub fn threads(pid: u32) -> u64 {
    proc_status(pid, "Threads:")
}

/// Open file descriptors of process `pid`.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).expect("/proc/PID/fd").count()
}
