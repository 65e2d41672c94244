//! The real `nasd` binary: how a standalone manager tells clients to connect,
//! the administrator's password across an interrupted first start and its
//! offline reset, and revocations and truncations that survive a drive
//! crash.

use nasd_client::{Auth, Credential, DriveClient, MacAlgorithm};
use nasd_fs::{FsClient, FsConfig};
use nasd_manager::{Manager, ManagerConfig, Session};
use nasd_proto::manager::{set_mask, Entry, ManagerReply, ManagerRequest, OpenMode};
use nasd_proto::{Protection, Status};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

use common::{free_addr, master_key, Daemon, DAEMON_WAIT_MAX};
use nasd_manager::files;

/// A standalone manager on `data`, its output in `log` (run in `log`'s directory).
fn manager(data: &Path, log: &Path) -> Daemon {
    let data = data.to_path_buf();
    Daemon::start("manager", &files::parent_dir(log), log, None, move |addr| {
        vec!["manager".into(), "--data".into(), data.clone().into(), "--listen".into(), addr.to_string().into()]
    })
}

/// Runs `nasd ARGS` to completion.
fn nasd(args: &[&str]) -> Output {
    common::nasd_command().args(args).output().expect("run nasd")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn login(addr: SocketAddr, ca: &Path, user: &str, password: &str) -> Result<FsClient, nasd_fs::FsError> {
    let config = FsConfig {
        manager: addr.to_string(),
        server_name: "localhost".into(),
        ca_cert: ca.to_path_buf(),
        user: user.into(),
        password: password.into(),
        ..Default::default()
    };
    tokio::time::timeout(DAEMON_WAIT_MAX, FsClient::connect(&config)).await.expect("login hung")
}

fn password_in(file: &Path) -> String {
    std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display())).trim().to_string()
}

#[test]
fn standalone_manager_prints_a_client_section_that_works() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("manager");
    let mut m = manager(&data, &tmp.path().join("manager.log"));
    let out = m.output();
    let section: String = out
        .lines()
        .skip_while(|l| l.trim() != "[client]")
        .take_while(|l| !l.trim().is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(section.contains("manager = ") && section.contains("ca_cert = "), "no [client] section in:\n{out}");
    let config = tmp.path().join("client.toml");
    std::fs::write(&config, &section).unwrap();
    // The section as printed is all a client needs.
    let ls = nasd(&["--config", config.to_str().unwrap(), "ls", "-l", "/"]);
    assert!(
        ls.status.success(),
        "nasd ls with the printed section failed:\n{section}\n{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    m.terminate();
}

#[test]
fn the_admin_password_survives_an_interrupted_first_start_and_can_be_reset() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("manager");
    let password_file = data.join("admin.password");
    let ca = data.join("tls").join("ca.pem");
    let rt = runtime();

    // A first start that wrote the password file and stopped before the user
    // existed: the next start must still create an administrator whose
    // password is in the file.
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(&password_file, "from-a-start-that-crashed\n").unwrap();
    let mut m = manager(&data, &tmp.path().join("m1.log"));
    let password = password_in(&password_file);
    rt.block_on(login(m.addr, &ca, "admin", &password)).expect("the password in admin.password logs in");
    m.terminate();

    // The file is lost: the manager says so and how to recover.
    std::fs::remove_file(&password_file).unwrap();
    let mut m = manager(&data, &tmp.path().join("m2.log"));
    let out = m.output();
    assert!(out.contains("admin.password does not") && out.contains("nasd admin reset-password admin --data"), "{out}");
    m.terminate();

    // The offline reset writes a new password, durably, before setting it.
    let reset = nasd(&["admin", "reset-password", "admin", "--data", data.to_str().unwrap()]);
    assert!(reset.status.success(), "{}", String::from_utf8_lossy(&reset.stderr));
    assert!(String::from_utf8_lossy(&reset.stdout).contains("admin.password"));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&password_file).unwrap().permissions().mode() & 0o777, 0o600);
    let new_password = password_in(&password_file);
    assert_ne!(new_password, password);
    let mut m = manager(&data, &tmp.path().join("m3.log"));
    rt.block_on(login(m.addr, &ca, "admin", &new_password)).expect("the reset password logs in");
    let old = rt.block_on(login(m.addr, &ca, "admin", &password)).expect_err("the old password is gone");
    assert_eq!(old.status(), Some(nasd_fs::FsStatus::BadCredentials));
    m.terminate();

    let unknown = nasd(&["admin", "reset-password", "nobody", "--data", data.to_str().unwrap()]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no user 'nobody'"));
    assert!(
        !data.join("nobody.password").exists() && !data.join("nobody.password.new").exists(),
        "a reset refused for an unknown user writes no password file"
    );

    // A reset that fails leaves the password file as it was (here: a
    // password too short, given with an explicit file).
    let before = std::fs::read(&password_file).unwrap();
    let short = Command::new(env!("CARGO_BIN_EXE_nasd"))
        .args(["admin", "reset-password", "admin", "--data", data.to_str().unwrap(), "--password-file"])
        .arg(&password_file)
        .env("NO_COLOR", "1")
        .env_remove("NASD_CONFIG")
        .env("NASD_NEW_PASSWORD", "short")
        .stdin(Stdio::null())
        .output()
        .expect("run nasd");
    assert!(!short.status.success());
    assert!(String::from_utf8_lossy(&short.stderr).contains("passwords need"), "{short:?}");
    assert_eq!(std::fs::read(&password_file).unwrap(), before, "admin.password still holds the working password");
    assert!(!data.join("admin.password.new").exists());
    let mut m = manager(&data, &tmp.path().join("m4.log"));
    rt.block_on(login(m.addr, &ca, "admin", &new_password)).expect("the password in the file still logs in");
    m.terminate();
    let wrong = nasd(&["admin", "reset-password", "admin", "--data", tmp.path().to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("holds no manager metadata"));
}

/// `manager.key`, which seals every drive key, is staged, synced and linked
/// into place (`nasd_crypto::durable`), so a write of it that fails part way
/// leaves no key file and the next start simply makes one. It used to be
/// created in place: a write cut short (here by `RLIMIT_FSIZE`, as by a full
/// disk) left a partial `manager.key` behind, and the manager then refused to
/// start ("does not hold a key") until someone found and deleted it by hand.
#[test]
fn a_key_file_write_cut_short_leaves_no_partial_key() {
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("manager");
    let mut cut_short = Command::new(env!("CARGO_BIN_EXE_nasd"));
    cut_short
        .args(["manager", "--data", data.to_str().unwrap(), "--listen", &free_addr().to_string()])
        .env("NO_COLOR", "1")
        .env_remove("NASD_CONFIG")
        .stdin(Stdio::null());
    // SAFETY: only async-signal-safe calls (setrlimit, signal) between fork and exec.
    unsafe {
        cut_short.pre_exec(|| {
            // Files may grow to 16 bytes: a 65-byte key file cannot be written whole. The
            // write then fails with EFBIG instead of raising SIGXFSZ (an ignored signal stays
            // ignored across exec).
            let limit = libc::rlimit { rlim_cur: 16, rlim_max: 16 };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0
                || libc::signal(libc::SIGXFSZ, libc::SIG_IGN) == libc::SIG_ERR
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cut_short.output().expect("run nasd manager");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the manager cannot start without its key file: {stderr}");
    assert!(stderr.contains("manager.key"), "the error names the key file: {stderr}");
    assert!(!data.join("manager.key").exists(), "no partial manager.key is left behind");
    assert!(!data.join("manager.key.tmp").exists(), "nor its staging file");

    // With room to write, the manager starts on the same directory.
    let mut m = manager(&data, &tmp.path().join("manager.log"));
    nasd_crypto::read_key_file(&data.join("manager.key")).expect("a whole key");
    m.terminate();
}

/// A drive process in `dir`/drive on a fixed loopback address, committing
/// only every hour: a SIGKILL loses everything not explicitly flushed.
struct LazyDrive {
    data: PathBuf,
    log: PathBuf,
    addr: SocketAddr,
    daemon: Daemon,
    /// The master key the drive made as it first started.
    master: nasd_crypto::Key,
}

impl LazyDrive {
    fn start(dir: &Path) -> LazyDrive {
        let (data, log, addr) = (dir.join("drive"), dir.join("drive.log"), free_addr());
        let daemon = lazy_drive(&data, addr, &log);
        let master = master_key(&data);
        LazyDrive { data, log, addr, daemon, master }
    }

    /// SIGKILL, and start again on the same data and address.
    fn crash_and_restart(&mut self) {
        self.daemon.kill();
        self.daemon = lazy_drive(&self.data, self.addr, &self.log);
    }
}

fn lazy_drive(data: &Path, addr: SocketAddr, log: &Path) -> Daemon {
    let data = data.to_path_buf();
    let d = Daemon::start("drive", &files::parent_dir(log), log, Some(addr), move |addr| {
        vec![
            "drive".into(),
            "--data".into(),
            data.clone().into(),
            "--listen".into(),
            addr.to_string().into(),
            "--capacity".into(),
            "256MiB".into(),
            "--commit-interval-ms".into(),
            "3600000".into(),
        ]
    });
    // The manager knows the drive by its address: a restarted drive must keep it.
    assert_eq!(d.addr, addr, "the drive could not listen on its address again");
    d
}

/// A drive connection using `access` as the manager says: its capability,
/// with at least the protection the capability demands.
async fn capability_client(addr: SocketAddr, access: &nasd_proto::manager::FileAccess) -> DriveClient {
    let mut c = DriveClient::connect(addr).await.expect("connect");
    let credential = Credential::Capability {
        token: access.components[0].token.clone(),
        key: nasd_crypto::Key::from_bytes(access.components[0].key),
        algorithm: MacAlgorithm::from_id(access.algorithm).unwrap(),
    };
    let min = Protection::from_bits(access.min_protection).unwrap();
    c.set_auth(Auth::new(credential, min.union(Protection::INTEGRITY_ARGS)));
    c
}

/// A manager (no maintenance task: nothing but a request itself may make its
/// effects durable) on the drive at `addr`, logged in as `admin`, and the
/// root directory's entry for that session.
async fn manager_with_admin(
    dir: &Path,
    addr: SocketAddr,
    master: &nasd_crypto::Key,
) -> (std::sync::Arc<Manager>, Session, Entry) {
    let m = Manager::open(dir, ManagerConfig { pool_target: 4, ..Default::default() }).unwrap();
    m.add_drive(&addr.to_string(), master).await.expect("add the drive");
    m.bootstrap_admin("admin", "admin password").await.unwrap();
    let admin = m.open_session("admin", "admin password").await.unwrap();
    let walk_root = ManagerRequest::Walk { path: "/".into(), follow: false, open: OpenMode::None };
    let ManagerReply::Entry(root) = m.handle(&admin, walk_root).await.unwrap() else { panic!("walk /") };
    (m, admin, root)
}

#[test]
fn a_truncation_survives_a_drive_crash_right_after_the_reply() {
    let tmp = tempfile::tempdir().unwrap();
    let mut drive = LazyDrive::start(tmp.path());
    let addr = drive.addr;
    runtime().block_on(async {
        let (m, admin, root) = manager_with_admin(&tmp.path().join("manager"), addr, &drive.master).await;
        // Two files of 4 KiB each, durable on the drive.
        let mut files = Vec::new();
        for name in ["by-setattr", "by-create"] {
            let create = ManagerRequest::Create {
                parent: root.handle(),
                name: name.into(),
                mode: 0o644,
                exclusive: true,
                truncate: false,
            };
            let ManagerReply::Entry(e) = m.handle(&admin, create).await.unwrap() else { panic!("create") };
            let access = e.access.clone().expect("a capability");
            let mut c = capability_client(addr, &access).await;
            let (p, o) = (access.components[0].object.partition, access.components[0].object.object);
            c.write(p, o, &[nasd_proto::Region { offset: 0, length: 4096 }], &[7u8; 4096]).await.expect("write");
            c.flush(p, &[o]).await.expect("flush");
            files.push((e, access));
        }

        // Cut one by SETATTR of its size, the other by CREATE with truncate...
        let truncate = ManagerRequest::SetAttr {
            handle: files[0].0.handle(),
            mask: set_mask::SIZE,
            mode: 0,
            uid: 0,
            gid: 0,
            size: 100,
            atime_ns: 0,
            mtime_ns: 0,
        };
        m.handle(&admin, truncate).await.expect("truncate");
        let recreate = ManagerRequest::Create {
            parent: root.handle(),
            name: "by-create".into(),
            mode: 0o644,
            exclusive: false,
            truncate: true,
        };
        m.handle(&admin, recreate).await.expect("create with truncate");

        // ...and the drive dies right after, well inside its commit interval.
        drive.crash_and_restart();
        readmit_without_recovery(&m, files[0].1.map_epoch).await;
        for ((_, access), want) in files.iter().zip([100, 0]) {
            let mut c = capability_client(addr, access).await;
            let size = c
                .getattr(access.components[0].object.partition, access.components[0].object.object)
                .await
                .expect("getattr")
                .logical_size;
            assert_eq!(size, want, "a crashed drive must not bring truncated bytes back under the recorded size");
        }
    });
    drive.daemon.terminate();
}

/// Ends the fence of the manager's one drive after its restart (`SET_MAP_EPOCH`
/// at `epoch`) *without* the recovery that normally precedes it: recovery
/// re-applies the logged revocations and removals, which would hide a drive
/// that lost them — the durability these tests check.
async fn readmit_without_recovery(m: &nasd_manager::Manager, epoch: u32) {
    let drives = m.drives();
    assert_eq!(drives.len(), 1, "one drive");
    drives[0].set_map_epoch(epoch.max(1)).await.expect("readmit the restarted drive");
}

#[test]
fn a_revocation_survives_a_drive_crash_right_after_the_reply() {
    let tmp = tempfile::tempdir().unwrap();
    let mut drive = LazyDrive::start(tmp.path());
    let addr = drive.addr;
    runtime().block_on(async {
        // No maintenance task: the test runs the passes itself.
        let (m, admin, root) = manager_with_admin(&tmp.path().join("manager"), addr, &drive.master).await;
        let create = ManagerRequest::Create {
            parent: root.handle(),
            name: "f".into(),
            mode: 0o644,
            exclusive: true,
            truncate: false,
        };
        let ManagerReply::Entry(e) = m.handle(&admin, create).await.unwrap() else { panic!("create") };
        let access = e.access.clone().expect("a capability");
        let use_it = || async {
            let mut c = capability_client(addr, &access).await;
            c.getattr(access.components[0].object.partition, access.components[0].object.object).await
        };
        use_it().await.expect("the capability works");

        // chmod revokes it before the reply...
        let chmod = ManagerRequest::SetAttr {
            handle: e.handle(),
            mask: set_mask::MODE,
            mode: 0o600,
            uid: 0,
            gid: 0,
            size: 0,
            atime_ns: 0,
            mtime_ns: 0,
        };
        m.handle(&admin, chmod).await.expect("chmod");
        assert_eq!(use_it().await.expect_err("revoked").status(), Some(Status::AccessRevoked));

        // ...and the drive dies right after, well inside its commit interval: the reply did not
        // wait for the drive's flush (issue 24.4), so the drive may have lost the new version.
        // It restarts fenced, and its recovery carries the logged revocation out again before it
        // readmits the drive: the old capability never works again.
        drive.crash_and_restart();
        let fenced = use_it().await.expect_err("a restarted drive is fenced until readmitted");
        assert_eq!(fenced.status(), Some(Status::MapEpochMoved));
        // What the heartbeat does when it finds the drive restarted, then the pass that recovers it.
        m.drives()[0].readmission_due();
        m.recover().await;
        let after = use_it().await.expect_err("a crashed drive must not bring the old access control version back");
        assert!(matches!(after.status(), Some(Status::AccessRevoked | Status::MapEpochMoved)), "{after:?}");

        // The maintenance pass's batched flush makes a revocation durable on the drive itself:
        // after it, a crash loses nothing even if the drive were readmitted without recovery.
        let chmod = ManagerRequest::SetAttr {
            handle: e.handle(),
            mask: set_mask::MODE,
            mode: 0o640,
            uid: 0,
            gid: 0,
            size: 0,
            atime_ns: 0,
            mtime_ns: 0,
        };
        let ManagerReply::Entry(again) = m
            .handle(&admin, ManagerRequest::GetAttr { handle: e.handle(), open: nasd_proto::manager::OpenMode::Read })
            .await
            .unwrap()
        else {
            panic!("getattr")
        };
        let access = again.access.clone().expect("a capability");
        let use_it = || async {
            let mut c = capability_client(addr, &access).await;
            c.getattr(access.components[0].object.partition, access.components[0].object.object).await
        };
        // Minted with the new version: it works only if recovery set it on the drive again.
        use_it().await.expect("the drive holds the logged access control version again");
        m.handle(&admin, chmod).await.expect("chmod");
        m.maintain().await;
        drive.crash_and_restart();
        readmit_without_recovery(&m, access.map_epoch).await;
        let after = use_it().await.expect_err("flushed by the maintenance pass: the revocation survived the crash");
        assert_eq!(after.status(), Some(Status::AccessRevoked));
    });
    drive.daemon.terminate();
}

/// A TLS connection, not logged in, to the manager at `addr` from the
/// loopback address `from` (each 127.0.0.N is a host of its own).
async fn tls_from(
    from: std::net::Ipv4Addr,
    addr: SocketAddr,
    ca: &Path,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((from, 0).into())?;
    let stream = socket.connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    nasd_fs::connector(ca).expect("connector").connect(name, stream).await
}

/// Sends one `LOGIN` and reads the reply: whether it logged in; `None` if
/// the manager closed the connection instead.
async fn try_login(s: &mut (impl AsyncReadExt + AsyncWriteExt + Unpin), user: &str, password: &str) -> Option<bool> {
    let login = ManagerRequest::Login { version: 1, user: user.into(), password: password.into() }.encode(1);
    s.write_all(&(login.len() as u32).to_le_bytes()).await.ok()?;
    s.write_all(&login).await.ok()?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.ok()?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).await.ok()?;
    let (_, reply) = ManagerReply::decode(&body).expect("a well-formed reply");
    Some(matches!(reply, Ok(ManagerReply::LoggedIn { .. })))
}

/// Sixteen clients, from sixteen hosts, guessing the administrator's
/// password leave the manager's resident memory within the argon2 workers'
/// fixed buffers of where it was (`ARGON2_WORKERS` × ~19 MiB, each reused)
/// while they guess and after. Every check used to allocate a fresh 19 MiB
/// on whichever blocking thread ran it; the allocator kept them (seen:
/// 50 MB → 2.5 GB, still 2.2 GB minutes later). Each host's guesses are
/// also spaced by the per-host back-off, so this takes some seconds.
#[test]
fn password_guessing_leaves_the_managers_memory_bounded() {
    use common::{rss, MIB};
    use nasd_manager::passwords::{ARGON2_MEMORY_BYTES, ARGON2_WORKERS};
    const CLIENTS: u8 = 16;
    const GUESSES: usize = 12;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("manager");
    let m = manager(&data, &tmp.path().join("manager.log"));
    let (addr, ca, pid) = (m.addr, data.join("tls").join("ca.pem"), m.pid());
    let password = password_in(&data.join("admin.password"));
    runtime().block_on(async move {
        login(addr, &ca, "admin", &password).await.expect("the administrator logs in");
        let baseline = rss(pid);
        let mut guessers = tokio::task::JoinSet::new();
        for client in 0..CLIENTS {
            let ca = ca.clone();
            guessers.spawn(async move {
                let host = std::net::Ipv4Addr::new(127, 0, 0, 20 + client);
                let mut guessed = 0;
                while guessed < GUESSES {
                    let mut s = tls_from(host, addr, &ca).await.expect("TLS with the manager");
                    // Until the manager closes the connection (too many failures, or LOGIN_TIMEOUT).
                    while guessed < GUESSES {
                        match try_login(&mut s, "admin", &format!("guess {client} {guessed}")).await {
                            Some(logged_in) => assert!(!logged_in, "a guess logged in"),
                            None => break,
                        }
                        guessed += 1;
                    }
                }
            });
        }
        let mut peak = 0;
        let guessing = async {
            while let Some(done) = guessers.join_next().await {
                done.expect("a guesser");
            }
        };
        tokio::pin!(guessing);
        loop {
            tokio::select! {
                () = &mut guessing => break,
                () = tokio::time::sleep(Duration::from_millis(50)) => peak = peak.max(rss(pid)),
            }
        }
        let after = rss(pid);
        eprintln!(
            "manager RSS: {} MiB before, {} MiB at most while guessed at, {} MiB after",
            baseline / MIB,
            peak / MIB,
            after / MIB
        );
        let bound = baseline + (ARGON2_WORKERS * ARGON2_MEMORY_BYTES) as u64 + 48 * MIB;
        assert!(peak <= bound, "guessing raised RSS from {baseline} to {peak} bytes (bound {bound})");
        assert!(after <= bound, "RSS stayed at {after} bytes (bound {bound})");
    });
    drop(m);
}
