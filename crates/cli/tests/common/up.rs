//! A quick-start cluster as a user starts it: `nasd up` in a directory,
//! with commands run there finding its `nasd-data/nasd.toml` by themselves;
//! the administrator logged in in the test process (to see the whole name
//! space), snapshots of the name space and of local trees to compare before
//! and after, a block rotted on a drive's disk, and a command run on a
//! pseudo-terminal.

use super::{free_addr, Daemon, DAEMON_WAIT_MAX};
use nasd_fs::{FileKind, FsClient, FsConfig};
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// A `nasd up` cluster started in `cwd` with its data in `cwd/nasd-data`.
pub struct Up {
    pub daemon: Daemon,
    pub cwd: PathBuf,
    /// The first drive's port, as recorded in `nasd-data/nasd.toml`.
    pub first_drive_port: u16,
}

/// `n` consecutive free loopback ports (free now).
pub fn free_ports(n: u16) -> u16 {
    loop {
        let first = free_addr().port();
        if first.checked_add(n).is_some()
            && (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", first + i)).is_ok())
        {
            return first;
        }
    }
}

impl Up {
    /// `nasd up --drives N [extra]` in `cwd` on free ports, its output in `cwd/up.log`.
    pub fn start(cwd: &Path, drives: u16, extra: &[&str]) -> Up {
        Up::start_with(cwd, drives, None, extra, &[])
    }

    /// [`Up::start`] with `env` added to its environment: on free ports the
    /// first time, on the recorded ones (and `manager`, the manager's
    /// address then) after.
    pub fn start_with(
        cwd: &Path,
        drives: u16,
        manager: Option<std::net::SocketAddr>,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Up {
        let extra: Vec<OsString> = extra.iter().map(OsString::from).collect();
        let config = cwd.join("nasd-data").join("nasd.toml");
        let daemon = Daemon::start_with_env("nasd up", cwd, &cwd.join("up.log"), manager, env, {
            let config = config.clone();
            move |addr| {
                let mut args: Vec<OsString> = vec![
                    "up".into(),
                    "--drives".into(),
                    drives.to_string().into(),
                    "--manager-port".into(),
                    addr.port().to_string().into(),
                ];
                // Chosen afresh on each attempt (a port taken meanwhile), until recorded.
                if !config.exists() {
                    args.extend(["--first-drive-port".into(), free_ports(drives).to_string().into()]);
                }
                args.extend(extra.iter().cloned());
                args
            }
        });
        let recorded = std::fs::read_to_string(&config).unwrap();
        let first_drive_port = recorded
            .lines()
            .find_map(|l| l.strip_prefix("first_drive_port = "))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no first_drive_port in {recorded}"));
        Up { daemon, cwd: cwd.to_path_buf(), first_drive_port }
    }

    /// The cluster's data directory.
    pub fn data(&self) -> PathBuf {
        self.cwd.join("nasd-data")
    }

    /// `nasd ARGS` in the cluster's directory, output piped.
    pub fn nasd(&self, args: &[&str]) -> Output {
        nasd_in(&self.cwd, args, &[])
    }

    /// `nasd ARGS`, which must succeed; its standard output.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.nasd(args);
        assert!(out.status.success(), "nasd {args:?} failed: {}", text(&out.stderr));
        text(&out.stdout)
    }

    /// `nasd ARGS`, which must succeed and, piped, print nothing at all.
    pub fn quiet(&self, args: &[&str]) {
        let out = self.nasd(args);
        assert!(out.status.success(), "nasd {args:?} failed: {}", text(&out.stderr));
        assert!(
            out.stdout.is_empty() && out.stderr.is_empty(),
            "nasd {args:?} piped printed: {:?} {:?}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }

    /// `nasd ARGS`, which must fail with nothing on standard output; its standard error.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.nasd(args);
        assert!(!out.status.success(), "nasd {args:?} succeeded: {}", text(&out.stdout));
        assert!(out.stdout.is_empty(), "nasd {args:?} printed {:?}", text(&out.stdout));
        text(&out.stderr)
    }

    /// `nasd ARGS`, which must fail, whatever it printed on standard output; its standard error.
    pub fn fails_stdout_unchecked(&self, args: &[&str]) -> String {
        let out = self.nasd(args);
        assert!(!out.status.success(), "nasd {args:?} succeeded: {}", text(&out.stdout));
        text(&out.stderr)
    }

    /// The authentication server's port, as recorded in `nasd-data/nasd.toml`.
    pub fn auth_port(&self) -> u16 {
        let recorded = std::fs::read_to_string(self.data().join("nasd.toml")).unwrap();
        recorded
            .lines()
            .find_map(|l| l.strip_prefix("auth_port = "))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no auth_port recorded in {recorded}"))
    }

    /// The administrator, logged in in this process: at the authentication
    /// server (the manager's administrator, same password), then by
    /// identity at the manager, which takes no passwords.
    pub fn admin(&self, rt: &tokio::runtime::Runtime) -> FsClient {
        let manager = self.data().join("manager");
        let password = std::fs::read_to_string(manager.join("admin.password")).unwrap().trim().to_string();
        let ca_cert = manager.join("tls").join("ca.pem");
        let auth = format!("127.0.0.1:{}", self.auth_port());
        let login = async {
            let tls = nasd_login::auth_client::connector(&ca_cert).expect("the cluster's CA");
            let (_, grant) =
                nasd_login::auth_client::AuthClient::login(&auth, "localhost", &tls, "admin", &password, 0)
                    .await
                    .expect("admin logs in at the authentication server");
            let config = FsConfig {
                manager: self.daemon.addr.to_string(),
                server_name: "localhost".into(),
                ca_cert: ca_cert.clone(),
                user: "admin".into(),
                identity: Some((grant.credential, grant.idkey)),
                ..Default::default()
            };
            FsClient::connect(&config).await
        };
        rt.block_on(async { tokio::time::timeout(DAEMON_WAIT_MAX, login).await })
            .expect("login hung")
            .expect("admin logs in")
    }
}

/// Runs `nasd ARGS` in `cwd` to completion, output piped (no config but the one it finds there).
pub fn nasd_in(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    run(Command::new(env!("CARGO_BIN_EXE_nasd")).args(args), cwd, env)
}

/// Runs `nasd --config CONFIG ARGS` in `cwd` to completion, output piped.
pub fn nasd_with_config(cwd: &Path, config: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    run(Command::new(env!("CARGO_BIN_EXE_nasd")).arg("--config").arg(config).args(args), cwd, env)
}

/// Runs `cmd` in `cwd` with none of nasd's variables but `env`, stdin closed.
fn run(cmd: &mut Command, cwd: &Path, env: &[(&str, &str)]) -> Output {
    cmd.current_dir(cwd)
        .env_remove("NASD_CONFIG")
        .env_remove("NASD_NEW_PASSWORD")
        .env_remove("NASD_PASSWORD")
        .env_remove("NASD_USER")
        .env_remove("NASD_ROLE")
        .env_remove("NASD_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run nasd")
}

/// A finished nasd run that must have succeeded: its standard output.
#[track_caller]
pub fn ok(out: Output) -> String {
    assert!(out.status.success(), "nasd failed: {}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// A finished nasd run that must have failed (whatever it printed): its standard error.
#[track_caller]
pub fn fails(out: Output) -> String {
    assert!(!out.status.success(), "nasd succeeded: {}", text(&out.stdout));
    text(&out.stderr)
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Every path in nasd with its kind, size and mode, temporary names included.
pub fn name_space(rt: &tokio::runtime::Runtime, fs: &FsClient) -> Vec<(String, FileKind, u64, u32)> {
    rt.block_on(async {
        let mut out = Vec::new();
        let mut dirs = vec!["/".to_string()];
        while let Some(dir) = dirs.pop() {
            for (name, attr) in fs.readdir(&dir).await.unwrap() {
                let path = format!("{}/{name}", dir.trim_end_matches('/'));
                if attr.kind == FileKind::Dir {
                    dirs.push(path.clone());
                }
                let size = if attr.kind == FileKind::Dir { 0 } else { attr.size };
                out.push((path, attr.kind, size, attr.mode));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    })
}

/// A file's bytes, compared whole and shown by length and digest.
#[derive(PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes, blake3 {}", self.0.len(), &blake3::hash(&self.0).to_hex()[..16])
    }
}

/// One entry of a local tree: what it is and what it holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry {
    /// A directory and its permission bits.
    Dir(u32),
    /// A file's permission bits and bytes.
    File(u32, Bytes),
    /// A symbolic link's target.
    Link(PathBuf),
}

/// Every path under `dir` (relative to it), sorted, with what it is and holds.
pub fn local_tree(dir: &Path) -> Vec<(PathBuf, Entry)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            let entry = if m.is_dir() {
                dirs.push(p.clone());
                Entry::Dir(mode)
            } else if m.file_type().is_symlink() {
                Entry::Link(std::fs::read_link(&p).unwrap())
            } else {
                Entry::File(mode, Bytes(std::fs::read(&p).unwrap()))
            };
            out.push((p.strip_prefix(dir).unwrap().to_path_buf(), entry));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `len` bytes no two 64-byte pieces of which are alike, led by `tag`.
pub fn pattern(tag: &[u8], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 64);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(tag);
        out.extend_from_slice(format!("-{i:012}-").as_bytes());
        out.extend_from_slice(&[0xA5; 16]);
        i += 1;
    }
    out.truncate(len);
    out
}

/// Flips one byte of the first copy of `needle` in drive `drive`'s block
/// file; `false` if the drive does not hold it.
pub fn rot(data: &Path, drive: usize, needle: &[u8]) -> bool {
    use std::io::{Seek, SeekFrom, Write};
    let path = data.join(format!("drive-{drive}")).join("blocks.dat");
    let bytes = std::fs::read(&path).unwrap();
    let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) else { return false };
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.seek(SeekFrom::Start(at as u64 + 7)).unwrap();
    f.write_all(&[bytes[at + 7] ^ 0xFF]).unwrap();
    f.sync_all().unwrap();
    true
}

/// The drives whose block files hold `needle`, waiting (bounded) for the
/// data to reach them.
pub fn drives_holding(data: &Path, drives: usize, needle: &[u8]) -> Vec<usize> {
    let deadline = Instant::now() + DAEMON_WAIT_MAX;
    loop {
        let holding: Vec<usize> = (0..drives)
            .filter(|d| {
                let bytes = std::fs::read(data.join(format!("drive-{d}")).join("blocks.dat")).unwrap_or_default();
                bytes.windows(needle.len()).any(|w| w == needle)
            })
            .collect();
        if !holding.is_empty() {
            return holding;
        }
        assert!(Instant::now() < deadline, "no drive's blocks.dat holds the file's bytes");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `nasd ARGS` in `cwd` with standard output and error on a
/// pseudo-terminal: its exit status and everything it wrote there.
pub fn on_terminal(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain libc pty calls on descriptors this function owns; the
    // name buffer is large enough and NUL-terminated by ptsname_r.
    let (master, slave) = unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(master >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        let size = libc::winsize { ws_row: 30, ws_col: 120, ws_xpixel: 0, ws_ypixel: 0 };
        assert_eq!(libc::ioctl(master, libc::TIOCSWINSZ, &size), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(master, name.as_mut_ptr(), name.len()), 0);
        let name = std::ffi::CStr::from_ptr(name.as_ptr()).to_str().unwrap().to_string();
        let slave = std::fs::OpenOptions::new().read(true).write(true).open(name).unwrap();
        (std::fs::File::from_raw_fd(master), slave)
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nasd"));
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("NASD_CONFIG")
        .env_remove("NASD_LOG")
        .env_remove("NO_COLOR")
        .env("TERM", "xterm")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave);
    let mut child = cmd.spawn().expect("run nasd on a terminal");
    // The child holds the only other ends of the terminal: once it exits, reads end.
    drop(cmd);
    let reader = std::thread::spawn(move || {
        let mut master = master;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // EIO once every slave end is closed.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    });
    let status = child.wait().unwrap();
    (status, text(&reader.join().unwrap()))
}
