//! A whole cluster of real `nasd` processes on loopback: N `nasd drive`
//! daemons and a `nasd manager`, sharing one config file — the manager's
//! `[manager]` settings and the `[client]` section (the administrator, by
//! the manager's `admin.password`) that every client command of the test
//! reads. Drives are taken into service with `nasd admin add-drive`. Client
//! commands run to completion within a bound, or in the background to be
//! watched and SIGKILLed; library clients log in with [`Cluster::login`].

use super::{log_tail, master_key, nasd_command, Daemon, DAEMON_WAIT_MAX};
use nasd_fs::{FsClient, FsConfig};
use std::ffi::OsString;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Longest a client command may run before the test calls it a hang (not a
/// timing assertion: the commands of these tests take seconds).
pub const COMMAND_WAIT_MAX: Duration = Duration::from_secs(300);
/// Empty objects the manager keeps ready per drive (its default, 128, only
/// makes every start slower).
const OBJECT_POOL: usize = 16;

/// What to start.
pub struct Options {
    /// Drive processes.
    pub drives: usize,
    /// Lines for the `[manager]` section (e.g. `default_layout = "rs:2+1"`).
    pub manager: String,
    /// Flags for every `nasd drive` beyond data, address and capacity (e.g.
    /// `--throttle-mib-per-sec 16`).
    pub drive_args: Vec<String>,
}

/// One `nasd drive` process and what it needs to start again.
pub struct Drive {
    /// The manager's number for it.
    pub number: u32,
    /// Where it listens (kept across restarts: the manager knows it by it).
    pub addr: SocketAddr,
    /// Its data directory.
    pub data: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    daemon: Option<Daemon>,
}

impl Drive {
    fn spawn(dir: &Path, data: &Path, log: &Path, prefer: Option<SocketAddr>, extra: &[String]) -> Daemon {
        let (data, extra) = (data.to_path_buf(), extra.to_vec());
        Daemon::start("drive", dir, log, prefer, move |addr| {
            let mut args: Vec<OsString> = vec!["drive".into(), "--data".into(), data.clone().into()];
            args.extend(["--listen".into(), addr.to_string().into(), "--capacity".into(), "1GiB".into()]);
            args.extend(extra.iter().map(OsString::from));
            args
        })
    }

    /// SIGKILL: the drive stays down until [`Drive::start`].
    pub fn kill(&mut self) {
        self.daemon.as_mut().expect("drive running").kill();
        self.daemon = None;
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop(&mut self) {
        self.daemon.as_mut().expect("drive running").terminate();
        self.daemon = None;
    }

    /// Starts it again on its data and address.
    pub fn start(&mut self) {
        assert!(self.daemon.is_none(), "drive {} is running", self.number);
        let dir = self.log.parent().expect("log in a directory").to_path_buf();
        let d = Self::spawn(&dir, &self.data, &self.log, Some(self.addr), &self.args);
        assert_eq!(d.addr, self.addr, "drive {} could not listen on its address again", self.number);
        self.daemon = Some(d);
    }

    /// Whether its process runs.
    pub fn running(&self) -> bool {
        self.daemon.is_some()
    }

    /// The end of its log.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log)
    }
}

/// The processes, their directories, and the shared config file.
pub struct Cluster {
    /// The config file every command of the cluster reads.
    pub config: PathBuf,
    /// The manager's data directory.
    pub manager_dir: PathBuf,
    manager_log: PathBuf,
    manager_settings: String,
    manager: Option<Daemon>,
    /// Where the manager listens.
    pub manager_addr: SocketAddr,
    /// The drives, in the order they were added.
    pub drives: Vec<Drive>,
    commands: AtomicUsize,
    /// Last, so it goes after every process is gone.
    tmp: tempfile::TempDir,
}

impl Cluster {
    /// Starts the drives and the manager and adds every drive with `nasd
    /// admin add-drive`.
    pub fn start(opts: Options) -> Cluster {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let mut drives = Vec::new();
        for i in 0..opts.drives {
            let (data, log) = (dir.join(format!("drive-{i}")), dir.join(format!("drive-{i}.log")));
            let daemon = Drive::spawn(&dir, &data, &log, None, &opts.drive_args);
            let addr = daemon.addr;
            drives.push(Drive { number: 0, addr, data, log, args: opts.drive_args.clone(), daemon: Some(daemon) });
        }
        let mut c = Cluster {
            config: dir.join("nasd.toml"),
            manager_dir: dir.join("manager"),
            manager_log: dir.join("manager.log"),
            manager_settings: opts.manager,
            manager: None,
            manager_addr: super::free_addr(),
            drives,
            commands: AtomicUsize::new(0),
            tmp,
        };
        c.start_manager();
        for i in 0..c.drives.len() {
            c.drives[i].number = c.take_into_service(i);
        }
        c
    }

    /// `nasd admin add-drive` of drive `i` (running): the manager's number for it.
    fn take_into_service(&self, i: usize) -> u32 {
        let d = &self.drives[i];
        master_key(&d.data);
        let key_file = d.data.join("master.key");
        let added = self.run_ok(&["admin", "add-drive", &d.addr.to_string(), "--master-key-file", path_str(&key_file)]);
        added
            .trim()
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("add-drive said: {added}"))
    }

    /// Starts one more drive (with the options' drive flags) and adds it to
    /// the running cluster with `nasd admin add-drive`; its number.
    pub fn add_drive(&mut self) -> u32 {
        let i = self.drives.len();
        let dir = self.tmp.path().to_path_buf();
        let (data, log) = (dir.join(format!("drive-{i}")), dir.join(format!("drive-{i}.log")));
        let args = self.drives.first().map(|d| d.args.clone()).unwrap_or_default();
        let daemon = Drive::spawn(&dir, &data, &log, None, &args);
        let addr = daemon.addr;
        self.drives.push(Drive { number: 0, addr, data, log, args, daemon: Some(daemon) });
        let number = self.take_into_service(i);
        self.drives[i].number = number;
        number
    }

    /// The directory everything lives in.
    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// Writes the config file: the manager's settings and, once it has an
    /// address, the `[client]` section.
    fn write_config(&self, with_client: bool) {
        let mut text = format!("[manager]\nobject_pool = {OBJECT_POOL}\n{}\n", self.manager_settings);
        if with_client {
            text += &format!(
                "\n[client]\nmanager = \"{}\"\nserver_name = \"localhost\"\nca_cert = \"{}\"\nuser = \"admin\"\n\
                 password_file = \"{}\"\n",
                self.manager_addr,
                path_str(&self.ca_cert()),
                path_str(&self.manager_dir.join("admin.password"))
            );
        }
        std::fs::write(&self.config, text).expect("write the config file");
    }

    fn ca_cert(&self) -> PathBuf {
        self.manager_dir.join("tls").join("ca.pem")
    }

    /// Starts the manager (again) on its data, on its address if it can.
    pub fn start_manager(&mut self) {
        assert!(self.manager.is_none(), "the manager is running");
        self.write_config(false);
        let (data, config) = (self.manager_dir.clone(), self.config.clone());
        let m = Daemon::start("manager", self.tmp.path(), &self.manager_log, Some(self.manager_addr), move |addr| {
            vec![
                "--config".into(),
                config.clone().into(),
                "manager".into(),
                "--data".into(),
                data.clone().into(),
                "--listen".into(),
                addr.to_string().into(),
            ]
        });
        self.manager_addr = m.addr;
        self.manager = Some(m);
        self.write_config(true);
    }

    /// SIGKILLs the manager.
    pub fn kill_manager(&mut self) {
        self.manager.as_mut().expect("manager running").kill();
        self.manager = None;
    }

    /// The drive the manager numbers `number`.
    pub fn drive(&mut self, number: u32) -> &mut Drive {
        self.drives.iter_mut().find(|d| d.number == number).unwrap_or_else(|| panic!("no drive {number}"))
    }

    /// The ends of the manager's and every drive's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = format!("--- manager log:\n{}\n", log_tail(&self.manager_log));
        for d in &self.drives {
            out += &format!("--- drive {} ({}) log:\n{}\n", d.number, d.addr, d.log_tail());
        }
        out
    }

    /// `nasd --config CONFIG ARGS`.
    pub fn nasd(&self, args: &[&str]) -> Command {
        let mut c = nasd_command();
        c.arg("--config").arg(&self.config).args(args);
        c
    }

    /// Runs `nasd ARGS` in the background, its output in files.
    pub fn spawn(&self, args: &[&str]) -> Running {
        self.spawn_command(self.nasd(args), &format!("nasd {}", args.join(" ")))
    }

    /// Runs `cmd` (described as `what`) in the background, its output in
    /// files beside the commands'.
    pub fn spawn_command(&self, cmd: Command, what: &str) -> Running {
        Running::spawn(cmd, self.dir(), what, &self.commands)
    }

    /// Runs `nasd ARGS` to completion (at most [`COMMAND_WAIT_MAX`]).
    pub fn run(&self, args: &[&str]) -> Finished {
        self.spawn(args).wait()
    }

    /// Runs `nasd ARGS`, which must succeed; its standard output.
    pub fn run_ok(&self, args: &[&str]) -> String {
        let f = self.run(args);
        assert!(f.status.success(), "{} failed ({}): {}\n{}", f.what, f.status, f.stderr, self.logs());
        String::from_utf8_lossy(&f.stdout).into_owned()
    }

    /// How a library client logs in as the administrator.
    pub fn fs_config(&self) -> FsConfig {
        let password = std::fs::read_to_string(self.manager_dir.join("admin.password")).expect("admin.password");
        FsConfig {
            manager: self.manager_addr.to_string(),
            server_name: "localhost".into(),
            ca_cert: self.ca_cert(),
            user: "admin".into(),
            password: password.trim().to_string(),
            ..Default::default()
        }
    }

    /// Logs in as the administrator, retrying while a manager that was just
    /// started is still recovering.
    pub async fn login(&self) -> FsClient {
        let config = self.fs_config();
        let deadline = Instant::now() + DAEMON_WAIT_MAX;
        loop {
            match FsClient::connect(&config).await {
                Ok(fs) => return fs,
                Err(e) => assert!(Instant::now() < deadline, "cannot log in: {e}\n{}", self.logs()),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Cluster {
    /// A test that failed shows what the daemons said (and keeps their
    /// directories with `NASD_KEEP_TEST_DIR=1`).
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
            if std::env::var_os("NASD_KEEP_TEST_DIR").is_some() {
                let kept = std::mem::replace(&mut self.tmp, tempfile::tempdir().expect("tempdir")).keep();
                eprintln!("test directory kept: {}", kept.display());
            }
        }
    }
}

/// A command running in the background, its output going to files.
pub struct Running {
    /// What it is, for messages.
    pub what: String,
    child: Option<Child>,
    /// Its standard output.
    pub out: PathBuf,
    err: PathBuf,
}

/// A command that ended.
#[derive(Debug)]
pub struct Finished {
    /// What it was.
    pub what: String,
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Running {
    /// Starts `cmd` with its output in new files under `dir`.
    pub fn spawn(mut cmd: Command, dir: &Path, what: &str, counter: &AtomicUsize) -> Running {
        let n = counter.fetch_add(1, Ordering::Relaxed);
        let (out, err) = (dir.join(format!("command-{n}.out")), dir.join(format!("command-{n}.err")));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(File::create(&out).expect("command output file"))
            .stderr(File::create(&err).expect("command error file"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Running { what: what.to_string(), child: Some(child), out, err }
    }

    /// Bytes it wrote to its standard output so far.
    pub fn stdout_len(&self) -> u64 {
        std::fs::metadata(&self.out).map_or(0, |m| m.len())
    }

    /// Its result, if it has ended.
    pub fn try_finish(&mut self) -> Option<Finished> {
        let status = self.child.as_mut().expect("not reaped").try_wait().expect("try_wait")?;
        self.child = None;
        Some(self.finished(status))
    }

    fn finished(&self, status: ExitStatus) -> Finished {
        Finished {
            what: self.what.clone(),
            status,
            stdout: std::fs::read(&self.out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&self.err).unwrap_or_default(),
        }
    }

    /// Waits (at most [`COMMAND_WAIT_MAX`]) for it to end.
    pub fn wait(mut self) -> Finished {
        let deadline = Instant::now() + COMMAND_WAIT_MAX;
        loop {
            if let Some(f) = self.try_finish() {
                return f;
            }
            if Instant::now() > deadline {
                self.kill();
                panic!("{} did not end in {COMMAND_WAIT_MAX:?} (a hang)", self.what);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP`, `libc::SIGCONT`) to it.
    pub fn signal(&self, signal: libc::c_int) {
        let child = self.child.as_ref().expect("running");
        // SAFETY: kill(2) on the pid of a child not yet reaped (so not reused).
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "signal {signal} to {}: {}", self.what, std::io::Error::last_os_error());
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) -> Finished {
        let mut child = self.child.take().expect("running");
        child.kill().expect("SIGKILL");
        let status = child.wait().expect("reap");
        self.finished(status)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A path as UTF-8 (test paths are).
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}
