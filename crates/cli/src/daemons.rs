//! The long-running commands: `nasd drive`, `nasd manager`, and `nasd up`
//! (a manager and N drives in one process under one data directory).

use crate::config::{self, ConfigFile};
use crate::{drive_admin::hex_id, size};
use anyhow::Context;
use nasd_crypto::Key;
use nasd_manager::{files, Manager, ManagerConfig};
use nasd_proto::Protection;
use nasd_store::{Store, StoreOptions, BLOCK_SIZE_DEFAULT};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Everything the daemons create holds keys or private data: owner-only.
fn private_umask() {
    // SAFETY: umask only changes this process's file-creation mask.
    unsafe { libc::umask(0o077) };
}

/// Free space of the file system holding `dir`.
fn free_space(dir: &Path) -> anyhow::Result<u64> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let path = CString::new(dir.as_os_str().as_bytes()).context("data directory path contains a NUL byte")?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `st` a valid out-pointer.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    anyhow::ensure!(rc == 0, "cannot measure free space of {}: {}", dir.display(), std::io::Error::last_os_error());
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// How to open and serve one drive.
pub struct DriveSetup {
    pub data: PathBuf,
    pub listen: SocketAddr,
    pub block_size: u32,
    pub capacity_bytes: Option<u64>,
    pub commit_interval: Duration,
    pub verify_reads: bool,
    /// `None`: security disabled.
    pub master_key_file: Option<PathBuf>,
    /// Reported by INQUIRY; empty: the drive alone.
    pub failure_domain: String,
    /// Emulated slow media (a test aid): data bytes per second; `None`: no pacing.
    pub throttle_bytes_per_sec: Option<u64>,
    /// Most connections from one host.
    pub connections_per_peer: usize,
}

/// A drive opened and bound, ready to serve.
pub struct OpenDrive {
    pub store: Arc<Store>,
    pub listener: tokio::net::TcpListener,
    pub config: nasd_drive::DriveConfig,
    pub master_key: Option<Key>,
}

/// Reads the master key file, creating it with a fresh key if missing.
fn master_key(path: &Path) -> anyhow::Result<Key> {
    let (key, created) = nasd_crypto::load_or_create_key_file(path).context("cannot use the master key file")?;
    if created {
        eprintln!("created master key {} (keep it safe: it controls this drive)", path.display());
    }
    Ok(key)
}

/// Opens a drive's storage, binds its port and loads its master key.
pub async fn open_drive(setup: DriveSetup) -> anyhow::Result<OpenDrive> {
    let data = setup.data;
    std::fs::create_dir_all(&data).with_context(|| format!("cannot create data directory {}", data.display()))?;
    let capacity_bytes = match setup.capacity_bytes {
        Some(c) => c,
        None => free_space(&data)? / 10 * 9,
    };
    let opts = StoreOptions {
        block_size: setup.block_size,
        capacity_bytes,
        verify_reads: setup.verify_reads,
        extensions: Vec::new(),
    };
    let store = tokio::task::spawn_blocking({
        let data = data.clone();
        move || Store::open(&data, &opts)
    })
    .await?
    .with_context(|| format!("cannot open drive storage in {}", data.display()))?;
    // The master key file exists before the drive listens: whoever sees the port open can read it.
    let master_key = setup.master_key_file.as_deref().map(master_key).transpose()?;
    let listener = tokio::net::TcpListener::bind(setup.listen).await.with_context(|| {
        format!("cannot listen on {}: is another drive or `nasd up` already using it?", setup.listen)
    })?;
    let security = match &master_key {
        Some(k) => nasd_drive::SecurityMode::Enforced { master_key: Some(k.clone()) },
        None => nasd_drive::SecurityMode::Disabled,
    };
    anyhow::ensure!(
        (1..=nasd_drive::CONNECTIONS_MAX).contains(&setup.connections_per_peer),
        "connections per peer must be 1..={}",
        nasd_drive::CONNECTIONS_MAX
    );
    let config = nasd_drive::DriveConfig {
        commit_interval: setup.commit_interval,
        security,
        failure_domain: setup.failure_domain,
        throttle_bytes_per_sec: setup.throttle_bytes_per_sec,
        max_connections_per_peer: setup.connections_per_peer,
        ..Default::default()
    };
    // Refuse a configuration the drive cannot serve now, not after binding and announcing it.
    config.check(store.block_size())?;
    Ok(OpenDrive { store: Arc::new(store), listener, config, master_key })
}

/// `nasd drive` flags.
#[derive(clap::Args)]
pub struct DriveArgs {
    /// Directory holding the drive's blocks and metadata (created if missing).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long)]
    listen: Option<String>,
    /// Block size of a new drive (existing drives keep theirs), e.g. 64KiB.
    #[arg(long)]
    block_size: Option<String>,
    /// Bytes of storage the drive may use, e.g. 100GiB [default: 90% of the
    /// free space under --data].
    #[arg(long)]
    capacity: Option<String>,
    /// Milliseconds between background commits of unflushed work.
    #[arg(long)]
    commit_interval_ms: Option<u64>,
    /// Check every block read against its stored digest.
    #[arg(long)]
    verify_reads: Option<bool>,
    /// File holding the master key (64 hex digits) for a drive that has none
    /// yet [default: DIR/master.key, created with a fresh key if missing].
    #[arg(long)]
    master_key_file: Option<PathBuf>,
    /// Accept unauthenticated requests: no keys, no capabilities. Only for a
    /// trusted network; anyone who can reach the drive can do anything.
    #[arg(long)]
    no_security: bool,
    /// What this drive can fail together with (a host, rack or power feed),
    /// reported by INQUIRY so copies of a stripe land in different ones; at
    /// most 64 bytes [default: none, the drive alone].
    #[arg(long)]
    failure_domain: Option<String>,
    /// Test aid for benchmarks, emulated slow media: pace the data the drive
    /// reads from and writes to its store to this many MiB/s, all
    /// connections together [default: no pacing].
    #[arg(long)]
    throttle_mib_per_sec: Option<u64>,
    /// Most connections one host (an IPv4 address, an IPv6 /64) may hold at
    /// once [default: 128]; raise it for many clients behind one address.
    #[arg(long)]
    connections_per_peer: Option<usize>,
}

fn parse_listen(s: &str) -> anyhow::Result<SocketAddr> {
    s.parse().with_context(|| format!("'{s}' is not an address like 127.0.0.1:7400"))
}

/// `throttle_mib_per_sec` in bytes per second, refusing 0 and overflow.
fn throttle_bytes(mib_per_sec: Option<u64>) -> anyhow::Result<Option<u64>> {
    mib_per_sec
        .map(|m| {
            anyhow::ensure!(m > 0, "throttle_mib_per_sec must be at least 1 (leave it out for no pacing)");
            m.checked_mul(1 << 20).context("throttle_mib_per_sec is too large")
        })
        .transpose()
}

/// `nasd drive`.
pub async fn run_drive(args: DriveArgs, file: config::DriveSection) -> anyhow::Result<()> {
    private_umask();
    let data = args
        .data
        .or(file.data)
        .context("no data directory: pass --data DIR (or set [drive] data in the config file)")?;
    let listen = parse_listen(&args.listen.or(file.listen).unwrap_or_else(|| "127.0.0.1:7400".into()))?;
    let block_size = match args.block_size.or(file.block_size) {
        Some(s) => u32::try_from(size::parse_size(&s).map_err(anyhow::Error::msg)?).context("block size too large")?,
        None => BLOCK_SIZE_DEFAULT,
    };
    let capacity_bytes =
        args.capacity.or(file.capacity).map(|s| size::parse_size(&s).map_err(anyhow::Error::msg)).transpose()?;
    let no_security = args.no_security || file.no_security.unwrap_or(false);
    let master_key_file = (!no_security)
        .then(|| args.master_key_file.or(file.master_key_file).unwrap_or_else(|| data.join("master.key")));
    let drive = open_drive(DriveSetup {
        data: data.clone(),
        listen,
        block_size,
        capacity_bytes,
        commit_interval: Duration::from_millis(args.commit_interval_ms.or(file.commit_interval_ms).unwrap_or(2000)),
        verify_reads: args.verify_reads.or(file.verify_reads).unwrap_or(true),
        master_key_file,
        failure_domain: args.failure_domain.or(file.failure_domain).unwrap_or_default(),
        throttle_bytes_per_sec: throttle_bytes(args.throttle_mib_per_sec.or(file.throttle_mib_per_sec))?,
        connections_per_peer: args
            .connections_per_peer
            .or(file.connections_per_peer)
            .unwrap_or(nasd_drive::CONNECTIONS_PER_PEER_MAX),
    })
    .await?;
    let info = drive.store.info();
    eprintln!(
        "nasd drive {} serving {} on {} ({} capacity, {} blocks); Ctrl-C stops it",
        hex_id(&info.drive_id),
        data.display(),
        drive.listener.local_addr()?,
        size::human(info.capacity_bytes),
        size::human(info.block_size as u64),
    );
    nasd_drive::serve(drive.listener, drive.store, drive.config, shutdown_signal()).await?;
    eprintln!("nasd drive stopped cleanly");
    Ok(())
}

/// `nasd manager` flags.
#[derive(clap::Args)]
pub struct ManagerArgs {
    /// Directory holding the metadata database, the manager's key and its
    /// TLS files (created if missing).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Address to listen on (TLS).
    #[arg(long)]
    listen: Option<String>,
    /// Host names or addresses clients use to reach the manager (its TLS
    /// certificate names them); repeatable [default: localhost, 127.0.0.1].
    #[arg(long = "tls-name")]
    tls_names: Vec<String>,
    /// Lifetime of read capabilities, seconds.
    #[arg(long)]
    read_capability_secs: Option<u64>,
    /// Lifetime of write capabilities, seconds.
    #[arg(long)]
    write_capability_secs: Option<u64>,
    /// Working-key rotation interval, seconds.
    #[arg(long)]
    key_rotation_secs: Option<u64>,
}

fn manager_config(file: &config::ManagerSection, args: Option<&ManagerArgs>) -> anyhow::Result<ManagerConfig> {
    let d = ManagerConfig::default();
    let secs = |a: Option<u64>, f: Option<u64>, default: Duration| a.or(f).map_or(default, Duration::from_secs);
    let default_layout = match &file.default_layout {
        Some(text) => nasd_proto::layout::Layout::parse(text)
            .map_err(|e| anyhow::anyhow!("[manager] default_layout = \"{text}\": {e}"))?,
        None => d.default_layout,
    };
    Ok(ManagerConfig {
        read_lifetime: secs(args.and_then(|a| a.read_capability_secs), file.read_capability_secs, d.read_lifetime),
        write_lifetime: secs(args.and_then(|a| a.write_capability_secs), file.write_capability_secs, d.write_lifetime),
        rotate_interval: secs(args.and_then(|a| a.key_rotation_secs), file.key_rotation_secs, d.rotate_interval),
        pool_target: file.object_pool.unwrap_or(d.pool_target),
        default_layout,
        write_lease: secs(None, file.write_lease_secs, d.write_lease),
        rebuild_delay: secs(None, file.rebuild_delay_secs, d.rebuild_delay),
        write_protection: match file.write_data_integrity {
            Some(false) => Protection::INTEGRITY_ARGS,
            _ => nasd_manager::WRITE_PROTECTION_DEFAULT,
        },
        ..d
    })
}

/// The layout a new `nasd up` file system gets on `drives` drives: one that
/// survives a drive down where there are enough drives for it.
fn up_default_layout(drives: u32) -> &'static str {
    match drives {
        1 => "stripe:1",
        2 => "mirror:2",
        _ => "rs:2+1",
    }
}

/// A manager opened, its administrator ensured, TLS ready.
struct OpenManager {
    manager: Arc<Manager>,
    tls: nasd_manager::tls::TlsFiles,
    password_file: PathBuf,
}

/// The administrator `nasd up` and `nasd manager` create on first start.
const ADMIN_USER: &str = "admin";
/// Where that administrator's password is kept, inside the manager's directory.
const ADMIN_PASSWORD_FILE: &str = "admin.password";

/// Opens the manager in `dir`; on first start creates TLS files and the
/// `admin` user, whose password goes to `DIR/admin.password` (0600).
async fn open_manager(dir: &Path, names: &[String], config: ManagerConfig) -> anyhow::Result<OpenManager> {
    let manager = Manager::open(dir, config)?;
    let tls = nasd_manager::tls::ensure_certificates(&dir.join("tls"), names)?;
    warn_missing_names(&tls, names);
    let password_file = dir.join(ADMIN_PASSWORD_FILE);
    ensure_admin(&manager, &password_file, dir).await?;
    Ok(OpenManager { manager, tls, password_file })
}

/// Warns if the manager's certificate lacks names it is configured with.
fn warn_missing_names(tls: &nasd_manager::tls::TlsFiles, names: &[String]) {
    match nasd_manager::tls::names_missing(tls, names) {
        Ok(missing) if missing.is_empty() => {}
        Ok(missing) => eprintln!(
            "warning: the manager certificate {} is not valid for {} (configured in tls_names / --tls-name): \
             clients that connect by {} will fail TLS. To add them, stop the manager, delete {} and {}, and \
             start it again: the same CA issues a new certificate, so clients keep trusting {}.",
            tls.cert.display(),
            missing.join(", "),
            if missing.len() == 1 { "that name" } else { "those names" },
            tls.cert.display(),
            tls.key.display(),
            tls.ca.display()
        ),
        Err(e) => eprintln!("warning: cannot check the names of the manager certificate: {e:#}"),
    }
}

/// On first start (no users yet) creates the administrator. Its password is
/// written durably to `password_file` *before* the user is committed, so a
/// crash in between cannot leave an administrator whose password nobody
/// has (the next start, still without users, writes a new one). If the
/// administrator exists and the file does not, says how to get back in.
async fn ensure_admin(manager: &Manager, password_file: &Path, dir: &Path) -> anyhow::Result<()> {
    let users = manager.user_names().await?;
    if !users.is_empty() {
        if users.iter().any(|u| u == ADMIN_USER) && !password_file.exists() {
            eprintln!(
                "warning: user '{ADMIN_USER}' exists but its password file {} does not. If the password is lost, \
                 stop the manager and run `nasd admin reset-password {ADMIN_USER} --data {}`: it writes a new \
                 password to that file.",
                password_file.display(),
                dir.display()
            );
        }
        return Ok(());
    }
    let password = nasd_crypto::Key::random().to_hex()[..24].to_string();
    write_secret_file(password_file, &format!("{password}\n"))?;
    if manager.bootstrap_admin(ADMIN_USER, &password).await? {
        eprintln!("created user '{ADMIN_USER}' (password in {})", password_file.display());
    }
    Ok(())
}

/// Writes `text` to `path` (0600) durably, replacing it atomically: a new
/// staging file, synced, renamed over `path`, and the directory synced.
fn write_secret_file(path: &Path, text: &str) -> anyhow::Result<()> {
    let staged = files::with_suffix(path, "tmp")?;
    files::write_staged(&staged, text, 0o600)?;
    Ok(files::install(&staged, path)?)
}

/// `nasd admin reset-password`: a new password for `user`, set directly in
/// the metadata in `data` (no login needed). The password is
/// `$NASD_NEW_PASSWORD` or, if unset, a random one, written to
/// `password_file` (default `DATA/USER.password`, which for `admin` is the
/// file `nasd up` and `nasd manager` use). The length and the user are
/// checked first; the password goes to `FILE.new` (synced) before the change
/// is committed and replaces `FILE` only after: a reset that fails leaves
/// `FILE` as it was, and one interrupted after the commit leaves the new
/// password in `FILE.new`.
pub fn reset_password(user: &str, data: Option<PathBuf>, password_file: Option<PathBuf>) -> anyhow::Result<()> {
    private_umask();
    let data = data.context(
        "no data directory: pass --data DIR, the manager's directory (for `nasd up`, DATA/manager), \
         or set [manager] data in the config file",
    )?;
    anyhow::ensure!(!user.is_empty() && !user.contains(['/', '\0']), "'{user}' is not a user name");
    let (password, file) = match std::env::var("NASD_NEW_PASSWORD") {
        Ok(p) => (p, password_file),
        Err(_) => (
            nasd_crypto::Key::random().to_hex()[..24].to_string(),
            Some(password_file.unwrap_or_else(|| data.join(format!("{user}.password")))),
        ),
    };
    let reset = nasd_manager::PasswordReset::prepare(&data, user, &password)?;
    match &file {
        Some(file) => {
            let staged = files::with_suffix(file, "new")?;
            files::write_staged(&staged, format!("{password}\n"), 0o600)?;
            if let Err(e) = reset.commit() {
                let _ = std::fs::remove_file(&staged);
                return Err(e);
            }
            files::install(&staged, file).with_context(|| {
                format!("the password of {user} was reset, and the new password is in {}", staged.display())
            })?;
        }
        None => reset.commit()?,
    }
    match file {
        Some(f) => println!("password of {user} reset; the new password is in {}", f.display()),
        None => println!("password of {user} reset"),
    }
    Ok(())
}

/// Serves the manager until `stop` turns true; returns when it has stopped.
async fn serve_manager(m: &OpenManager, listen: SocketAddr, stop: watch::Receiver<bool>) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}: is another manager or `nasd up` already using it?"))?;
    let acceptor = nasd_manager::tls::acceptor(&m.tls)?;
    m.manager.recover().await;
    let maintenance = m.manager.spawn_maintenance(stop.clone());
    m.manager.clone().serve(listener, acceptor, stop).await;
    maintenance.await?;
    Ok(())
}

fn default_tls_names() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into()]
}

/// `nasd manager`.
pub async fn run_manager(args: ManagerArgs, file: config::ManagerSection) -> anyhow::Result<()> {
    private_umask();
    let data = args
        .data
        .clone()
        .or(file.data.clone())
        .context("no data directory: pass --data DIR (or set [manager] data in the config file)")?;
    let listen = parse_listen(args.listen.as_deref().or(file.listen.as_deref()).unwrap_or("127.0.0.1:7300"))?;
    let names = if args.tls_names.is_empty() {
        file.tls_names.clone().unwrap_or_else(default_tls_names)
    } else {
        args.tls_names.clone()
    };
    let m = open_manager(&data, &names, manager_config(&file, Some(&args))?).await?;
    eprintln!(
        "nasd manager serving {} on {listen} (TLS; clients trust {}); {} drives; Ctrl-C stops it",
        data.display(),
        m.tls.ca.display(),
        m.manager.drives().len()
    );
    print_client_section(&m, listen, &names)?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = tx.send(true);
    });
    serve_manager(&m, listen, rx).await?;
    eprintln!("nasd manager stopped cleanly");
    Ok(())
}

/// How clients reach a standalone manager: a ready `[client]` section.
fn print_client_section(m: &OpenManager, listen: SocketAddr, names: &[String]) -> anyhow::Result<()> {
    // The first configured name the certificate is valid for.
    let missing = nasd_manager::tls::names_missing(&m.tls, names).unwrap_or_default();
    let server_name =
        names.iter().find(|n| !missing.contains(n)).or(names.first()).cloned().unwrap_or_else(|| "localhost".into());
    // A wildcard address is no address to connect to: the certificate's first name is.
    let manager =
        if listen.ip().is_unspecified() { format!("{server_name}:{}", listen.port()) } else { listen.to_string() };
    let absolute = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    #[derive(serde::Serialize)]
    struct OnlyClient {
        client: config::ClientSection,
    }
    let client = config::ClientSection {
        manager: Some(manager),
        server_name: Some(server_name),
        ca_cert: Some(absolute(&m.tls.ca)),
        user: Some(ADMIN_USER.into()),
        password_file: m.password_file.exists().then(|| absolute(&m.password_file)),
        data_integrity: None,
        reply_timeout_secs: None,
    };
    let section = toml::to_string_pretty(&OnlyClient { client })?;
    let section = section.trim();
    eprintln!();
    eprintln!("Clients connect with this section in their config file (--config FILE or $NASD_CONFIG):");
    eprintln!();
    eprintln!("{section}");
    eprintln!();
    eprintln!("Other users put their own user (and password_file, or $NASD_PASSWORD) in it.");
    eprintln!("Add drives with: nasd admin add-drive HOST:PORT --master-key-file FILE");
    Ok(())
}

/// `nasd up` flags.
#[derive(clap::Args, Clone)]
pub struct UpArgs {
    /// Directory for everything: drives, manager, TLS files, config.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Number of drives (first start only).
    #[arg(long)]
    drives: Option<u32>,
    /// Manager port; drives use the ports after --first-drive-port.
    #[arg(long)]
    manager_port: Option<u16>,
    /// Port of the first drive.
    #[arg(long)]
    first_drive_port: Option<u16>,
    /// Capacity of each drive, e.g. 20GiB [default: 90% of free space, shared].
    #[arg(long)]
    drive_capacity: Option<String>,
}

/// The resolved `[up]` settings, written to `DATA/nasd.toml` on first start.
fn up_settings(args: &UpArgs, file: &ConfigFile) -> anyhow::Result<(PathBuf, u32, u16, u16, Option<u64>)> {
    let data = args.data.clone().or(file.up.data.clone()).unwrap_or_else(|| PathBuf::from("nasd-data"));
    std::fs::create_dir_all(&data).with_context(|| format!("cannot create {}", data.display()))?;
    let data = data.canonicalize()?;
    let drives = args.drives.or(file.up.drives).unwrap_or(4);
    anyhow::ensure!((1..=64).contains(&drives), "--drives must be 1..=64");
    let manager_port = args.manager_port.or(file.up.manager_port).unwrap_or(7300);
    let first = args.first_drive_port.or(file.up.first_drive_port).unwrap_or(7401);
    anyhow::ensure!(first as u32 + drives <= u16::MAX as u32, "drive ports run past 65535");
    let capacity = args
        .drive_capacity
        .clone()
        .or(file.up.drive_capacity.clone())
        .map(|s| size::parse_size(&s).map_err(anyhow::Error::msg))
        .transpose()?;
    Ok((data, drives, manager_port, first, capacity))
}

/// `nasd up`: a whole cluster on this machine.
pub async fn up(args: UpArgs, file: ConfigFile) -> anyhow::Result<()> {
    private_umask();
    let (data, n, manager_port, first_port, capacity) = up_settings(&args, &file)?;
    let config_path = data.join("nasd.toml");
    let mut cluster = if config_path.exists() { config::load(&config_path)? } else { ConfigFile::default() };
    // The number of drives and their ports are fixed at the first start: the manager's drive
    // table names each drive by its address.
    let n = cluster.up.drives.unwrap_or(n);
    let first_port = match cluster.up.first_drive_port {
        Some(recorded) => {
            anyhow::ensure!(
                args.first_drive_port.unwrap_or(recorded) == recorded,
                "the drives of {} listen on ports from {recorded} (recorded in {}); run without --first-drive-port",
                data.display(),
                config_path.display()
            );
            recorded
        }
        None => first_port,
    };
    anyhow::ensure!(first_port as u32 + n <= u16::MAX as u32, "drive ports run past 65535");
    let manager_port = args.manager_port.or(cluster.up.manager_port).unwrap_or(manager_port);
    let share = match capacity {
        Some(c) => c,
        None => free_space(&data)? / 10 * 9 / n as u64,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut drive_tasks = Vec::new();
    let mut drives = Vec::new();
    for i in 0..n {
        let dir = data.join(format!("drive-{i}"));
        let listen: SocketAddr = ([127, 0, 0, 1], first_port + i as u16).into();
        let d = open_drive(DriveSetup {
            data: dir.clone(),
            listen,
            block_size: BLOCK_SIZE_DEFAULT,
            capacity_bytes: Some(share),
            commit_interval: Duration::from_secs(2),
            verify_reads: true,
            master_key_file: Some(dir.join("master.key")),
            // One machine: every drive could fail with it, but a local
            // cluster is for trying nasd, so each counts as its own domain.
            failure_domain: String::new(),
            throttle_bytes_per_sec: None,
            connections_per_peer: nasd_drive::CONNECTIONS_PER_PEER_MAX,
        })
        .await?;
        let id = d.store.info().drive_id;
        let master = d.master_key.clone().expect("security is on in nasd up");
        drives.push((listen, id, master));
        drive_tasks.push(tokio::spawn(nasd_drive::serve(d.listener, d.store, d.config, stopped(stop_rx.clone()))));
    }
    let manager_listen: SocketAddr = ([127, 0, 0, 1], manager_port).into();
    if cluster.manager.default_layout.is_none() {
        cluster.manager.default_layout = Some(up_default_layout(n).to_string());
    }
    let m = open_manager(&data.join("manager"), &default_tls_names(), manager_config(&cluster.manager, None)?).await?;
    for (addr, id, master) in &drives {
        if !m.manager.drives().iter().any(|d| d.drive_id == *id) {
            m.manager
                .add_drive(&addr.to_string(), master)
                .await
                .map_err(|f| anyhow::anyhow!("cannot take drive {addr} into service: {f}"))?;
        }
    }
    cluster.up = config::UpSection {
        data: Some(data.clone()),
        drives: Some(n),
        manager_port: Some(manager_port),
        first_drive_port: Some(first_port),
        drive_capacity: capacity.map(size::human),
    };
    cluster.client = config::ClientSection {
        manager: Some(manager_listen.to_string()),
        server_name: Some("localhost".into()),
        ca_cert: Some(m.tls.ca.clone()),
        user: Some(ADMIN_USER.into()),
        password_file: Some(m.password_file.clone()),
        data_integrity: cluster.client.data_integrity,
        reply_timeout_secs: cluster.client.reply_timeout_secs,
    };
    config::save(&config_path, &cluster, "# Written by `nasd up`; edit freely (it is read on every start).\n")?;
    print_banner(&data, &config_path, manager_listen, &drives, share);
    let server = serve_manager(&m, manager_listen, stop_rx.clone());
    tokio::pin!(server);
    // The manager ends on Ctrl-C, or by itself if it cannot serve (its port is taken): then the
    // drives are stopped too and the error reported, rather than waiting for a Ctrl-C.
    let served = tokio::select! {
        r = &mut server => r,
        () = shutdown_signal() => {
            eprintln!("stopping: finishing requests and committing drives...");
            let _ = stop_tx.send(true);
            server.await
        }
    };
    let _ = stop_tx.send(true);
    for t in drive_tasks {
        t.await??;
    }
    served?;
    eprintln!("nasd stopped cleanly; `nasd up` again resumes the same data");
    Ok(())
}

fn print_banner(data: &Path, config: &Path, manager: SocketAddr, drives: &[(SocketAddr, [u8; 16], Key)], share: u64) {
    let first = drives.first().map(|d| d.0.to_string()).unwrap_or_default();
    let last = drives.last().map(|d| d.0.to_string()).unwrap_or_default();
    eprintln!();
    eprintln!("nasd is up");
    eprintln!("  manager   {manager} (TLS)");
    eprintln!("  drives    {} x {} ({first} .. {last})", drives.len(), size::human(share));
    eprintln!("  data      {}", data.display());
    eprintln!("  config    {}", config.display());
    eprintln!();
    // Commands find the config by themselves only at ./nasd-data/nasd.toml.
    let found_here = Path::new(config::DEFAULT_CONFIG).canonicalize().is_ok_and(|c| c == config);
    if found_here {
        eprintln!("From this directory, try:   nasd ls /");
        eprintln!("From elsewhere, first:      export NASD_CONFIG={}", config.display());
    } else {
        eprintln!("First:   export NASD_CONFIG={}", config.display());
        eprintln!("Then:    nasd ls /");
    }
    eprintln!("Ctrl-C stops everything cleanly.");
}

/// A manager and drives served by this process on ephemeral loopback ports
/// (benchmarks): what `nasd up` runs, in a directory of the caller's choice.
pub struct LocalCluster {
    /// How a client reaches and logs in to it.
    pub client: config::ClientSection,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl LocalCluster {
    /// Starts `drives` drives of `capacity` bytes each and a manager under `data`.
    pub async fn start(data: &Path, drives: u32, capacity: u64) -> anyhow::Result<LocalCluster> {
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>> = Vec::new();
        let mut added = Vec::new();
        for i in 0..drives {
            let dir = data.join(format!("drive-{i}"));
            let d = open_drive(DriveSetup {
                data: dir.clone(),
                listen: ([127, 0, 0, 1], 0).into(),
                block_size: BLOCK_SIZE_DEFAULT,
                capacity_bytes: Some(capacity),
                commit_interval: Duration::from_secs(2),
                verify_reads: true,
                master_key_file: Some(dir.join("master.key")),
                failure_domain: String::new(),
                throttle_bytes_per_sec: None,
                connections_per_peer: nasd_drive::CONNECTIONS_PER_PEER_MAX,
            })
            .await?;
            added.push((d.listener.local_addr()?, d.master_key.clone().expect("security on")));
            let rx = stop_rx.clone();
            tasks.push(tokio::spawn(async move {
                nasd_drive::serve(d.listener, d.store, d.config, stopped(rx)).await.map_err(anyhow::Error::from)
            }));
        }
        let m = open_manager(&data.join("manager"), &default_tls_names(), ManagerConfig::default()).await?;
        for (addr, master) in &added {
            m.manager.add_drive(&addr.to_string(), master).await.map_err(|f| anyhow::anyhow!("{f}"))?;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let client = config::ClientSection {
            manager: Some(listener.local_addr()?.to_string()),
            server_name: Some("localhost".into()),
            ca_cert: Some(m.tls.ca.clone()),
            user: Some("admin".into()),
            password_file: Some(m.password_file.clone()),
            data_integrity: Some(true),
            reply_timeout_secs: None,
        };
        let acceptor = nasd_manager::tls::acceptor(&m.tls)?;
        let maintenance = m.manager.spawn_maintenance(stop_rx.clone());
        let manager = m.manager.clone();
        tasks.push(tokio::spawn(async move {
            manager.serve(listener, acceptor, stop_rx).await;
            maintenance.await?;
            Ok(())
        }));
        Ok(LocalCluster { client, stop, tasks })
    }

    /// Stops everything and waits for the drives' final commits.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        for t in self.tasks {
            t.await??;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// `nasd up` whose manager cannot listen: it must stop its drives and say why, not wait for a
    /// Ctrl-C; a restart keeps the drive ports recorded at the first start.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn up_reports_a_taken_manager_port_and_keeps_drive_ports() {
        let dir = tempfile::tempdir().unwrap();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let manager_port = taken.local_addr().unwrap().port();
        let first = free_port();
        let args = |first_drive_port| UpArgs {
            data: Some(dir.path().to_path_buf()),
            drives: Some(1),
            manager_port: Some(manager_port),
            first_drive_port,
            drive_capacity: Some("64MiB".into()),
        };
        let up_once = |first_drive_port| {
            let args = args(first_drive_port);
            async move {
                // In one process the drives' stores stay locked until their last connection
                // (the manager's) has wound down.
                for _ in 0..100 {
                    let r = tokio::time::timeout(Duration::from_secs(60), up(args.clone(), ConfigFile::default()))
                        .await
                        .expect("nasd up waited for a Ctrl-C instead of reporting the failure");
                    match r {
                        Err(e) if format!("{e:#}").contains("in use by another process") => {
                            tokio::time::sleep(Duration::from_millis(50)).await
                        }
                        r => return r,
                    }
                }
                panic!("the drives' stores stayed locked")
            }
        };
        let e = up_once(Some(first)).await.expect_err("the manager's port is taken");
        assert!(format!("{e:#}").contains("cannot listen"), "{e:#}");

        // Again without --first-drive-port (and no config file naming it): the recorded ports.
        let e = up_once(None).await.expect_err("the manager's port is still taken");
        assert!(format!("{e:#}").contains("cannot listen"), "{e:#}");
        let recorded = config::load(&dir.path().canonicalize().unwrap().join("nasd.toml")).unwrap();
        assert_eq!(recorded.up.first_drive_port, Some(first));

        // Moving them is refused: the manager knows the drives by address.
        let e = up_once(Some(first.wrapping_add(1))).await.expect_err("drive ports cannot move");
        assert!(format!("{e:#}").contains("run without --first-drive-port"), "{e:#}");
        drop(taken);
    }
}
