//! The long-running commands: `nasd drive`, `nasd manager`, and `nasd up`
//! (a manager and N drives in one process under one data directory).
//!
//! `nasd up` saves each drive's drive key for the drive tools
//! (`DATA/drive-N/drive.key`, 0600), records the drives in `DATA/nasd.toml`
//! (`[[drives]]`: number, address, key file), and opens the authentication
//! server in `DATA/auth` on the port below the manager's (or any free one,
//! `[up] auth_port`) with the manager's certificate, its administrator made
//! with the manager's `admin` password. It links the manager to it
//! (`ManagerConfig::auth`), so the manager takes identities only and `[client]
//! auth` is written: commands log in there and by identity at the manager.
//! Gateway grants stay in the manager's user records (made only for
//! `SET_GATEWAY`, from the authentication server's user of that name).
//!
//! A drive's capacity is kept in its directory (`capacity`) from its first
//! start; every start refuses a capacity the disk cannot back — its free
//! space plus what the block files occupy — unless `--force-capacity`
//! (`drive_capacity`, `check_backing`; `nasd up` weighs its drives
//! together). `--metadata` with a password in it is refused: no secret on
//! a command line (it would be in `ps`); secrets reach the processes nasd
//! starts only in files or the environment. `nasd manager --join BUNDLE`
//! installs a join bundle (`nasd admin join-bundle`: `manager.key`, the
//! cluster CA's certificate and key, the metadata location without a
//! password) in a new directory, refusing one that holds another manager's
//! key; the drives and the authentication link come from the database.

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

/// Registers for Ctrl-C and SIGTERM *now* and returns a future that resolves
/// on either. Registration is synchronous so that a signal arriving between
/// the readiness message and the first poll is caught, not fatal: callers
/// take it before they say they are up.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).ok();
    let mut term = signal(SignalKind::terminate()).ok();
    async move {
        tokio::select! {
            () = wait_for(interrupt.as_mut()) => {}
            () = wait_for(term.as_mut()) => {}
        }
    }
}

/// The next delivery of `signal`; never, if it could not be registered.
async fn wait_for(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
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

/// Where a drive records the capacity it was given at its first start
/// (`BYTES\n`), so later starts keep it rather than recompute it from
/// whatever the disk has free then.
pub const CAPACITY_FILE: &str = "capacity";

/// The capacity a drive in `dir` serves: `explicit` (and recorded) if given,
/// else the one recorded at its first start, else `first` (recorded).
pub fn drive_capacity(
    dir: &Path,
    explicit: Option<u64>,
    first: impl FnOnce() -> anyhow::Result<u64>,
) -> anyhow::Result<u64> {
    let file = dir.join(CAPACITY_FILE);
    let recorded = match std::fs::read_to_string(&file) {
        Ok(text) => Some(text.trim().parse::<u64>().with_context(|| {
            format!("{} does not hold a capacity in bytes: fix it, or start with --capacity", file.display())
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    let capacity = match (explicit, recorded) {
        (Some(c), _) => c,
        (None, Some(r)) => r,
        (None, None) => first()?,
    };
    if recorded != Some(capacity) {
        let staged = nasd_crypto::durable::with_suffix(&file, "tmp")?;
        nasd_crypto::durable::write_staged(&staged, format!("{capacity}\n"), 0o600)?;
        nasd_crypto::durable::install(&staged, &file).with_context(|| format!("cannot record {}", file.display()))?;
    }
    Ok(capacity)
}

/// Bytes of disk a drive's block file already occupies.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir.join("blocks.dat")).map_or(0, |m| m.blocks() * 512)
}

/// What is wrong if the file system holding `on` cannot back the drives
/// `drives` (directory, capacity) all filling up — each still needs its
/// capacity less what its block file occupies already (its blocks in use:
/// the store gives freed space back) — with the largest capacity per drive
/// it can back.
fn unbacked(on: &Path, drives: &[(PathBuf, u64)]) -> anyhow::Result<Option<(String, u64)>> {
    let held: Vec<u64> = drives.iter().map(|(dir, _)| allocated(dir)).collect();
    let need: u64 = drives.iter().zip(&held).map(|((_, cap), h)| cap.saturating_sub(*h)).sum();
    let free = free_space(on)?;
    let total: u64 = drives.iter().map(|(_, c)| *c).sum();
    let held_all: u64 = held.iter().sum();
    let (what, need_who) = match drives {
        [_] => (format!("the drive's capacity ({})", size::human(total)), "it needs"),
        _ => (format!("the {} drives' capacity ({} in all)", drives.len(), size::human(total)), "they need"),
    };
    let backable = (free.saturating_add(held_all) / drives.len().max(1) as u64) >> 20 << 20;
    Ok((need > free).then(|| {
        let message = format!(
            "{what} is more than the disk under {} can back: it has {} free, the drives hold {}, and {need_who} \
             {} more to fill up",
            on.display(),
            size::human(free),
            size::human(held_all),
            size::human(need)
        );
        (message, backable)
    }))
}

/// What to do about a capacity the disk cannot back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Not checked here: the caller checks its drives together (`nasd up`,
    /// whose drives share one disk), or does not care (benchmarks).
    Unchecked,
    /// Refuse to start.
    Refuse,
    /// Start anyway with a warning (`--force-capacity`): writes fail with
    /// "no space" once the disk is full.
    Warn,
}

/// Refuses — or with [`Backing::Warn`] warns of — drives (directory,
/// capacity) whose capacity the disk under `on` cannot back; `flag` is the
/// option that sets their capacity.
fn check_backing(on: &Path, drives: &[(PathBuf, u64)], backing: Backing, flag: &str) -> anyhow::Result<()> {
    if backing == Backing::Unchecked {
        return Ok(());
    }
    let Some((problem, backable)) = unbacked(on, drives)? else { return Ok(()) };
    anyhow::ensure!(
        backing == Backing::Warn,
        "{problem}. Writes would fail, and the drives refuse every change, once the disk is full. Start with \
         a smaller capacity ({flag} {}MiB or less per drive), free space there, or pass --force-capacity to start \
         anyway",
        backable >> 20
    );
    eprintln!("warning: {problem}; started anyway (--force-capacity): writes fail once the disk is full");
    Ok(())
}

/// A port bound but not yet listening. Start-up takes every port it needs
/// first, before it creates anything (directories, keys, certificates), so a
/// port in use stops it with nothing half made; and nothing can connect
/// before the daemon behind the port is ready (a connection attempt is
/// refused until [`ReservedPort::listen`]).
pub struct ReservedPort {
    socket: tokio::net::TcpSocket,
    addr: SocketAddr,
}

/// Connections a listening daemon queues before it accepts them.
const LISTEN_BACKLOG: u32 = 1024;

impl ReservedPort {
    /// Binds `addr` (port 0: any free port) for `who`, the daemon that will
    /// listen there ("drive", "manager", …, for the message).
    pub fn take(addr: SocketAddr, who: &str) -> anyhow::Result<ReservedPort> {
        let in_use = || format!("cannot listen on {addr}: is another {who} or `nasd up` already using it?");
        let socket = match Self::bind(addr, false) {
            Ok(socket) => socket,
            // Connections of an earlier run linger (TIME_WAIT): bind over them, as std and
            // tokio listeners do.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Self::bind(addr, true).with_context(in_use)?,
            Err(e) => return Err(e).with_context(in_use),
        };
        let addr = socket.local_addr()?;
        Ok(ReservedPort { socket, addr })
    }

    /// A socket bound to `addr`. Without `SO_REUSEADDR` the port is really
    /// held: another socket (this process's or another's, `SO_REUSEADDR` or
    /// not) cannot bind it before this one listens. With it, lingering
    /// connections of an earlier run are bound over, but so is another
    /// unlistened socket. [`ReservedPort::listen`] sets it either way.
    fn bind(addr: SocketAddr, reuse: bool) -> std::io::Result<tokio::net::TcpSocket> {
        let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() }?;
        socket.set_reuseaddr(reuse)?;
        socket.bind(addr)?;
        Ok(socket)
    }

    /// The address, with the port chosen if 0 was asked for.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts listening (inside a Tokio runtime).
    pub fn listen(self) -> anyhow::Result<tokio::net::TcpListener> {
        let addr = self.addr;
        // Inherited by the connections it accepts, so that their lingering
        // (TIME_WAIT) does not keep the next start from binding the port.
        self.socket.set_reuseaddr(true).with_context(|| format!("cannot listen on {addr}"))?;
        self.socket.listen(LISTEN_BACKLOG).with_context(|| format!("cannot listen on {addr}"))
    }
}

/// Takes the port of a daemon's metrics endpoint (`[metrics]`, `--metrics`)
/// if it has one.
pub fn metrics_port(addr: Option<&str>, who: &str) -> anyhow::Result<Option<ReservedPort>> {
    let Some(addr) = addr else { return Ok(None) };
    let addr = parse_listen(addr)?;
    if !addr.ip().is_loopback() {
        eprintln!(
            "warning: the {who}'s metrics on {addr} are served without login to anyone who can reach them (counts \
             and timings, no keys or names): keep that address on a monitoring network"
        );
    }
    ReservedPort::take(addr, &format!("{who}'s metrics endpoint")).map(Some)
}

/// Serves `metrics` on `port` (`nasd_metrics::serve`) until `stop`; returns
/// the endpoint's address.
pub fn serve_metrics(
    port: ReservedPort,
    metrics: nasd_metrics::Metrics,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let addr = port.addr();
    let listener = port.listen()?;
    Ok((addr, tokio::spawn(nasd_metrics::serve(listener, metrics, stop))))
}

/// How to open and serve one drive.
pub struct DriveSetup {
    pub data: PathBuf,
    /// The drive's port, taken before anything was created.
    pub port: ReservedPort,
    pub block_size: u32,
    /// The capacity given now; `None`: the one recorded at the first start
    /// (see [`drive_capacity`]).
    pub capacity_bytes: Option<u64>,
    /// The capacity of a first start without one given; `None`: 90% of the
    /// free space under `data`.
    pub first_capacity: Option<u64>,
    /// What to do if the disk cannot back the capacity (a drive alone on
    /// its disk; `nasd up` checks its drives together).
    pub backing: Backing,
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
    /// Bytes the drive's prefetch cache may hold (0: no `prefetch-v1`).
    pub prefetch_cache_bytes: u64,
    /// Emulated media seek per block read (a benchmark aid; `StoreOptions::media_seek`).
    pub media_seek: Option<Duration>,
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
    let capacity_bytes = drive_capacity(&data, setup.capacity_bytes, || match setup.first_capacity {
        Some(c) => Ok(c),
        None => Ok(free_space(&data)? / 10 * 9),
    })?;
    let opts = StoreOptions {
        block_size: setup.block_size,
        capacity_bytes,
        verify_reads: setup.verify_reads,
        prefetch_cache_bytes: setup.prefetch_cache_bytes,
        media_seek: setup.media_seek,
        ..StoreOptions::default()
    };
    let store = tokio::task::spawn_blocking({
        let data = data.clone();
        move || Store::open(&data, &opts)
    })
    .await?
    .with_context(|| format!("cannot open drive storage in {}", data.display()))?;
    // After the open, which gives back what the drive no longer holds.
    check_backing(&data, &[(data.clone(), store.info().capacity_bytes)], setup.backing, "--capacity")?;
    // The master key file exists before the drive listens: whoever sees the port open can read it.
    let master_key = setup.master_key_file.as_deref().map(master_key).transpose()?;
    let listener = setup.port.listen()?;
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
    /// Bytes of storage the drive may use, e.g. 100GiB [default: the one
    /// recorded at its first start, then 90% of the free space under --data].
    #[arg(long)]
    capacity: Option<String>,
    /// Milliseconds between background commits of unflushed work.
    #[arg(long)]
    commit_interval_ms: Option<u64>,
    /// Check every block read against its stored digest.
    #[arg(long)]
    verify_reads: Option<bool>,
    /// Bytes of blocks the drive may read ahead for clients that hint their
    /// reads (`prefetch-v1`), e.g. 256MiB; 0 turns the extension off
    /// [default: 64MiB].
    #[arg(long)]
    prefetch_cache: Option<String>,
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
    /// Start even if the disk cannot back the capacity (free space plus what
    /// the drive holds): writes then fail once the disk is full.
    #[arg(long)]
    force_capacity: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics [default: `[metrics]
    /// drive`, else none].
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
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
pub async fn run_drive(
    args: DriveArgs,
    file: config::DriveSection,
    metrics_file: config::MetricsSection,
) -> anyhow::Result<()> {
    private_umask();
    let data = args
        .data
        .or(file.data)
        .context("no data directory: pass --data DIR (or set [drive] data in the config file)")?;
    let listen = parse_listen(&args.listen.or(file.listen).unwrap_or_else(|| "127.0.0.1:7400".into()))?;
    let port = ReservedPort::take(listen, "drive")?;
    let metrics_port = metrics_port(args.metrics.as_deref().or(metrics_file.drive.as_deref()), "drive")?;
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
        port,
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
        first_capacity: None,
        backing: if args.force_capacity { Backing::Warn } else { Backing::Refuse },
        prefetch_cache_bytes: match args.prefetch_cache.or(file.prefetch_cache) {
            Some(s) => size::parse_size(&s).map_err(anyhow::Error::msg).context("--prefetch-cache")?,
            None => nasd_store::PREFETCH_CACHE_BYTES_DEFAULT,
        },
        media_seek: None,
    })
    .await?;
    let metrics = metrics_port
        .map(|port| {
            let registry = nasd_metrics::Metrics::new();
            drive.config.metrics.register(&registry, None);
            drive.config.metrics.serving(&drive.store);
            serve_metrics(port, registry, std::future::pending())
        })
        .transpose()?;
    let info = drive.store.info();
    let stop = shutdown_signal();
    eprintln!(
        "nasd drive {} serving {} on {} ({} capacity, {} blocks); Ctrl-C stops it",
        hex_id(&info.drive_id),
        data.display(),
        drive.listener.local_addr()?,
        size::human(info.capacity_bytes),
        size::human(info.block_size as u64),
    );
    if let Some((addr, _)) = &metrics {
        eprintln!("metrics at http://{addr}/metrics");
    }
    nasd_drive::serve(drive.listener, drive.store, drive.config, stop).await?;
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
    /// Where the metadata lives: sqlite:PATH or
    /// postgres://USER[:PASSWORD]@HOST[:PORT]/DB (the database and its
    /// tables are made on first use) [default: sqlite:DATA/meta.sqlite].
    #[arg(long)]
    metadata: Option<String>,
    /// Join the database of an existing manager with the bundle `nasd admin
    /// join-bundle` wrote there: its key and the cluster CA go into --data
    /// (a new directory, or one that joined before), this manager issues
    /// itself a certificate for its --tls-name, and takes the metadata
    /// location from the bundle unless one is given. The drives and the
    /// link to the authentication server come from the database.
    #[arg(long, value_name = "BUNDLE")]
    join: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics [default: `[metrics]
    /// manager`, else none].
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

/// What a manager joining a database needs from one already on it
/// (`nasd admin join-bundle`, `nasd manager --join`); TOML, 0600.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinBundle {
    /// `manager.key`, 64 hex digits.
    manager_key: String,
    /// The cluster CA certificate (PEM).
    ca_cert: String,
    /// The cluster CA's key (PEM).
    ca_key: String,
    /// The metadata location, without a password.
    metadata: String,
    /// The authentication server's `auth.key`, 64 hex digits, when its
    /// state is in the database (`nasd auth --join`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    auth_key: Option<String>,
}

/// The header of a bundle file: what it is and how to handle it.
const JOIN_BUNDLE_HEADER: &str = "# nasd join bundle (`nasd manager --join THIS_FILE`, `nasd auth --join THIS_FILE`). \
     SECRET: it holds manager.key, the cluster CA's key (and auth.key).\n# Copy it to the new machine, use it once, \
     then delete it.\n";

/// `nasd admin join-bundle`: writes `out` (0600, new) from the manager in `data`.
pub fn write_join_bundle(
    out: &Path,
    data: Option<PathBuf>,
    metadata: Option<String>,
    auth_data: Option<PathBuf>,
) -> anyhow::Result<()> {
    private_umask();
    let data = data.context(
        "no data directory: pass --data DIR, the manager's directory (for `nasd up`, DATA/manager), or set \
         [manager] data in the config file",
    )?;
    let metadata = metadata.context(
        "no metadata location: pass --metadata postgres://USER@HOST/DB, or set [manager] metadata (several \
         managers share a PostgreSQL database)",
    )?;
    let location = parse_metadata(Some(metadata.clone()))?.expect("some");
    anyhow::ensure!(location.is_shared(), "several managers share a PostgreSQL database, not {location}");
    anyhow::ensure!(
        !nasd_meta::pg_connect::has_password(&metadata),
        "the metadata location holds a password: give it without (the new manager finds its own: $PGPASSWORD, \
         ~/.pgpass or [manager] metadata_password_file)"
    );
    let key = nasd_crypto::read_key_file(&data.join(nasd_manager::KEK_FILE))
        .with_context(|| format!("no manager in {}", data.display()))?;
    let tls = nasd_manager::tls::TlsFiles::in_dir(&data.join("tls"));
    let read = |p: &Path| std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()));
    // The authentication server's key, if its state is in the database (no auth.sqlite).
    let auth_dir = auth_data.or_else(|| data.parent().map(|d| d.join("auth")));
    let auth_key = match auth_dir {
        Some(dir) if dir.join(nasd_auth::AUTH_KEK_FILE).exists() && !dir.join(nasd_auth::AUTH_DB).exists() => {
            let key = nasd_crypto::read_key_file(&dir.join(nasd_auth::AUTH_KEK_FILE))
                .with_context(|| format!("cannot read {}", dir.join(nasd_auth::AUTH_KEK_FILE).display()))?;
            Some(key.to_hex())
        }
        _ => None,
    };
    let with_auth = auth_key.is_some();
    let bundle = JoinBundle {
        manager_key: key.to_hex(),
        ca_cert: read(&tls.ca)?,
        ca_key: read(&data.join("tls").join(nasd_login::tls::CA_KEY))?,
        metadata,
        auth_key,
    };
    let text = format!("{JOIN_BUNDLE_HEADER}{}", toml::to_string_pretty(&bundle)?);
    nasd_crypto::durable::create_new(out, text, 0o600).with_context(|| format!("cannot write {}", out.display()))?;
    println!("wrote {} (secret: copy it to the new manager's machine, use it once, delete it)", out.display());
    let name = out.file_name().map_or_else(|| out.display().to_string(), |n| n.to_string_lossy().into_owned());
    println!("there: nasd manager --join {name} --data DIR --tls-name NAME --listen ADDR");
    if with_auth {
        println!(
            "or, for another authentication server: nasd auth --join {name} --data DIR --tls-name NAME --listen ADDR"
        );
    }
    Ok(())
}

/// Reads a join bundle.
fn read_join_bundle(bundle: &Path) -> anyhow::Result<JoinBundle> {
    let text = std::fs::read_to_string(bundle).with_context(|| format!("cannot read {}", bundle.display()))?;
    toml::from_str(&text).with_context(|| format!("{} is not a join bundle", bundle.display()))
}

/// Installs `key` as the key file `path`, unless it holds that key already;
/// another key there is refused (`what` names its owner).
fn install_key_file(path: &Path, key: &nasd_crypto::Key, what: &str) -> anyhow::Result<()> {
    match nasd_crypto::read_key_file(path) {
        Ok(have) if have == *key => Ok(()),
        Ok(_) => anyhow::bail!(
            "{} holds another {what}'s key: --join needs a new directory (or the one that joined with this bundle)",
            path.parent().unwrap_or(path).display()
        ),
        Err(_) if !path.exists() => Ok(nasd_crypto::create_key_file(path, key)?),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Installs the cluster CA of `b` as `data/tls` if it has none.
fn install_ca(b: &JoinBundle, data: &Path) -> anyhow::Result<()> {
    let tls = data.join("tls");
    let files = nasd_manager::tls::TlsFiles::in_dir(&tls);
    if !files.ca.exists() {
        let staged = files::with_suffix(&tls, "join")?;
        let _ = std::fs::remove_dir_all(&staged);
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o700).create(&staged)?;
        }
        files::write_staged(&staged.join(nasd_login::tls::CA_KEY), b.ca_key.as_bytes(), 0o600)?;
        files::write_staged(&staged.join(nasd_login::tls::CA_CERT), b.ca_cert.as_bytes(), 0o644)?;
        let _ = std::fs::remove_dir(&tls);
        files::install(&staged, &tls).with_context(|| format!("cannot install {}", tls.display()))?;
    }
    Ok(())
}

/// Puts what `bundle` holds for another authentication server into its new
/// directory `data`: `auth.key` and the cluster CA; returns the metadata
/// location it names. A bundle without `auth.key` (the first server keeps
/// its state in auth.sqlite) is refused.
pub fn install_auth_join(bundle: &Path, data: &Path) -> anyhow::Result<String> {
    let b = read_join_bundle(bundle)?;
    let hex = b.auth_key.as_deref().with_context(|| {
        format!(
            "{} carries no auth.key: the authentication server it was made beside keeps its state in {} (or \
             none was found: pass --auth-data DIR to `nasd admin join-bundle`)",
            bundle.display(),
            nasd_auth::AUTH_DB
        )
    })?;
    let key = nasd_crypto::Key::from_hex(hex)
        .with_context(|| format!("{}: auth_key is not 64 hex digits", bundle.display()))?;
    std::fs::create_dir_all(data).with_context(|| format!("cannot create {}", data.display()))?;
    install_key_file(&data.join(nasd_auth::AUTH_KEK_FILE), &key, "authentication server")?;
    install_ca(&b, data)?;
    Ok(b.metadata)
}

/// Puts what `bundle` holds into the new manager's directory `data`:
/// `manager.key` and the CA (`tls/ca.pem`, `tls/ca.key`); returns the
/// metadata location it names. A directory that holds another manager's
/// key is refused (it belongs to another file system); one that joined with
/// the same bundle before is taken as it is.
fn install_join(bundle: &Path, data: &Path) -> anyhow::Result<String> {
    let b = read_join_bundle(bundle)?;
    let key = nasd_crypto::Key::from_hex(&b.manager_key)
        .with_context(|| format!("{}: manager_key is not 64 hex digits", bundle.display()))?;
    std::fs::create_dir_all(data).with_context(|| format!("cannot create {}", data.display()))?;
    install_key_file(&data.join(nasd_manager::KEK_FILE), &key, "manager")?;
    install_ca(&b, data)?;
    Ok(b.metadata)
}

/// Parses a metadata location (`--metadata`, `[manager] metadata`).
pub fn parse_metadata(text: Option<String>) -> anyhow::Result<Option<nasd_manager::Location>> {
    text.map(|t| t.parse().map_err(|e| anyhow::anyhow!("--metadata / [manager] metadata: {e}"))).transpose()
}

/// Why a password in `--metadata` is refused.
pub const PASSWORD_ON_COMMAND_LINE: &str = "--metadata holds a password, which every local user would see in the \
     process list (ps): give the URL without it and put the password in $PGPASSWORD, in ~/.pgpass (or \
     $PGPASSFILE), or in a file named by [manager] metadata_password_file";

/// The metadata location: `--metadata` (`flag`, which may hold no
/// password: a command line is public), else `[manager] metadata`; with the
/// password file `[manager] metadata_password_file` names.
pub fn metadata_location(
    flag: Option<&str>,
    file: &config::ManagerSection,
) -> anyhow::Result<Option<nasd_manager::Location>> {
    if flag.is_some_and(nasd_meta::pg_connect::has_password) {
        anyhow::bail!("{PASSWORD_ON_COMMAND_LINE}");
    }
    let text = flag.map(str::to_owned).or(file.metadata.clone());
    Ok(parse_metadata(text)?.map(|l| l.with_password_file(file.metadata_password_file.clone())))
}

/// A metadata location as [`metadata_location`] reads it, for any section:
/// the flag (no password), else `text` (named `setting` in errors), with
/// `password_file`.
pub fn location_of(
    flag: Option<&str>,
    text: Option<String>,
    password_file: Option<PathBuf>,
    setting: &str,
) -> anyhow::Result<Option<nasd_manager::Location>> {
    if flag.is_some_and(nasd_meta::pg_connect::has_password) {
        anyhow::bail!("{PASSWORD_ON_COMMAND_LINE}");
    }
    let text = flag.map(str::to_owned).or(text);
    let location = text.map(|t| t.parse().map_err(|e| anyhow::anyhow!("--metadata / {setting}: {e}"))).transpose()?;
    Ok(location.map(|l: nasd_manager::Location| l.with_password_file(password_file)))
}

/// Where an authentication server keeps its state when the managers'
/// metadata is at `location`: their PostgreSQL database, else SQLite.
pub fn auth_backing(location: Option<&nasd_manager::Location>) -> anyhow::Result<nasd_auth::Backing> {
    Ok(match location {
        Some(nasd_manager::Location::Postgres { url, options }) => nasd_auth::Backing::Postgres(Box::new(
            nasd_meta::pg_connect::PgTarget::parse(url, options).map_err(|e| anyhow::anyhow!("{e}"))?,
        )),
        _ => nasd_auth::Backing::Sqlite,
    })
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
        write_integrity_waived: file.write_data_integrity_waived.iter().flatten().copied().collect(),
        metadata: metadata_location(args.and_then(|a| a.metadata.as_deref()), file)?,
        small_file_threshold: file.small_file_threshold.unwrap_or(d.small_file_threshold),
        metadata_sync_interval: file.metadata_sync_ms.map_or(d.metadata_sync_interval, Duration::from_millis),
        identity_recheck: secs(None, file.identity_recheck_secs, d.identity_recheck),
        temporaries_age: match file.temporaries_age_secs {
            None => d.temporaries_age,
            Some(0) => None,
            Some(s) => Some(Duration::from_secs(s)),
        },
        routing: match &file.routing {
            None => d.routing,
            Some(text) => text.parse().map_err(|e| anyhow::anyhow!("[manager] routing = \"{text}\": {e}"))?,
        },
        redirect_probability: file.redirect_probability,
        advertise: file.advertise.clone(),
        auth: match &file.auth {
            None => None,
            Some(addr) => {
                let token_file = file
                    .auth_token_file
                    .clone()
                    .context("[manager] auth needs auth_token_file (the authentication server's service.token)")?;
                let ca_cert = file.auth_ca_cert.clone().context(
                    "[manager] auth needs auth_ca_cert: the CA that signed the authentication server's \
                         certificate (`nasd auth` keeps it as tls/ca.pem in its data directory)",
                )?;
                let addrs = std::iter::once(addr.clone()).chain(file.auth_failover.iter().cloned()).collect();
                Some(nasd_manager::identity::AuthLink::new(
                    addrs,
                    file.auth_server_name.clone().unwrap_or_else(|| "localhost".into()),
                    &ca_cert,
                    nasd_crypto::read_key_file(&token_file)?,
                )?)
            }
        },
        auth_scheme: match file.auth_scheme.as_deref() {
            None | Some("capabilities") => nasd_proto::AuthScheme::CAPABILITIES,
            Some("pals") => nasd_proto::AuthScheme::PALS,
            Some("both") => nasd_proto::AuthScheme::BOTH,
            Some(other) => {
                anyhow::bail!("[manager] auth_scheme = \"{other}\": expected capabilities, pals or both")
            }
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
        // Linked to an authentication server, the manager takes no password: admin logs in there.
        let linked = manager.config().auth.is_some();
        if !linked && users.iter().any(|u| u == ADMIN_USER) && !password_file.exists() {
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
pub fn reset_password(
    user: &str,
    data: Option<PathBuf>,
    metadata: Option<&nasd_manager::Location>,
    password_file: Option<PathBuf>,
) -> anyhow::Result<()> {
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
    let reset = nasd_manager::PasswordReset::prepare(&data, metadata, user, &password)?;
    // `nasd up` keeps its authentication server beside the manager (DATA/auth), and the same
    // administrator logs in there: the password that logs in is that one, so it changes too.
    let auth_dir = data.parent().map(|d| d.join("auth")).filter(|d| d.join(nasd_auth::AUTH_KEK_FILE).exists());
    let auth_backing = auth_backing(metadata)?;
    match &file {
        Some(file) => {
            let staged = files::with_suffix(file, "new")?;
            files::write_staged(&staged, format!("{password}\n"), 0o600)?;
            if let Err(e) =
                reset.commit().and_then(|()| reset_at_auth(auth_dir.as_deref(), &auth_backing, user, &password))
            {
                let _ = std::fs::remove_file(&staged);
                return Err(e);
            }
            files::install(&staged, file).with_context(|| {
                format!("the password of {user} was reset, and the new password is in {}", staged.display())
            })?;
        }
        None => {
            reset.commit()?;
            reset_at_auth(auth_dir.as_deref(), &auth_backing, user, &password)?;
        }
    }
    match file {
        Some(f) => println!("password of {user} reset; the new password is in {}", f.display()),
        None => println!("password of {user} reset"),
    }
    if let Some(dir) = auth_dir {
        println!("(at the manager and at the authentication server in {})", dir.display());
    }
    Ok(())
}

/// The offline reset at `nasd up`'s authentication server, if it has one.
fn reset_at_auth(
    auth_dir: Option<&Path>,
    backing: &nasd_auth::Backing,
    user: &str,
    password: &str,
) -> anyhow::Result<()> {
    let Some(dir) = auth_dir else { return Ok(()) };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(nasd_auth::reset_password(dir, backing.clone(), user, password))
}

/// Serves the manager until `stop` turns true; returns when it has stopped.
async fn serve_manager(
    m: &OpenManager,
    listener: tokio::net::TcpListener,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
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
pub async fn run_manager(
    args: ManagerArgs,
    file: config::ManagerSection,
    metrics_file: config::MetricsSection,
) -> anyhow::Result<()> {
    private_umask();
    let data = args
        .data
        .clone()
        .or(file.data.clone())
        .context("no data directory: pass --data DIR (or set [manager] data in the config file)")?;
    let listen = parse_listen(args.listen.as_deref().or(file.listen.as_deref()).unwrap_or("127.0.0.1:7300"))?;
    let port = ReservedPort::take(listen, "manager")?;
    let metrics_port = metrics_port(args.metrics.as_deref().or(metrics_file.manager.as_deref()), "manager")?;
    let names = if args.tls_names.is_empty() {
        file.tls_names.clone().unwrap_or_else(default_tls_names)
    } else {
        args.tls_names.clone()
    };
    let mut file = file;
    if let Some(bundle) = &args.join {
        let joined = install_join(bundle, &data)?;
        if args.metadata.is_none() && file.metadata.is_none() {
            file.metadata = Some(joined);
        }
    }
    let config = manager_config(&file, Some(&args))?;
    let metadata = config.metadata(&data);
    let m = open_manager(&data, &names, config).await?;
    let listener = port.listen()?;
    let metrics = metrics_port
        .map(|port| {
            let registry = nasd_metrics::Metrics::new();
            m.manager.metrics().register(&registry);
            serve_metrics(port, registry, std::future::pending())
        })
        .transpose()?;
    let stop = shutdown_signal();
    eprintln!(
        "nasd manager serving {} on {listen} (TLS; clients trust {}; metadata {metadata}); {} drives; Ctrl-C \
         stops it",
        data.display(),
        m.tls.ca.display(),
        m.manager.drives().len()
    );
    if let Some((addr, _)) = &metrics {
        eprintln!("metrics at http://{addr}/metrics");
    }
    print_client_section(&m, listen, &names)?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        stop.await;
        let _ = tx.send(true);
    });
    serve_manager(&m, listener, rx).await?;
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
    // Linked to an authentication server, the manager takes identities only: clients log in
    // there, with their user and password at that server (not the manager's password file).
    let auth = m.manager.config().auth.as_ref().map(|l| l.addrs[0].clone());
    let auth_failover = m.manager.config().auth.as_ref().map(|l| l.addrs[1..].to_vec()).unwrap_or_default();
    let client = config::ClientSection {
        failover: Vec::new(),
        manager: Some(manager),
        server_name: Some(server_name),
        ca_cert: Some(absolute(&m.tls.ca)),
        user: Some(ADMIN_USER.into()),
        password_file: (auth.is_none() && m.password_file.exists()).then(|| absolute(&m.password_file)),
        data_integrity: None,
        reply_timeout_secs: None,
        metadata_wait_secs: None,
        auth: auth.clone(),
        auth_failover,
        role: None,
    };
    let section = toml::to_string_pretty(&OnlyClient { client })?;
    let section = section.trim();
    eprintln!();
    eprintln!("Clients connect with this section in their config file (--config FILE or $NASD_CONFIG):");
    eprintln!();
    eprintln!("{section}");
    eprintln!();
    if auth.is_some() {
        eprintln!("This manager takes no passwords: users log in at the authentication server (auth) with theirs.");
    }
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
    /// Capacity of each drive, e.g. 20GiB [default: the one recorded at the
    /// first start, then 90% of the free space shared among the drives].
    #[arg(long)]
    drive_capacity: Option<String>,
    /// Start even if the disk cannot back the drives' capacity (free space
    /// plus what they hold): writes then fail once the disk is full.
    #[arg(long)]
    force_capacity: bool,
    /// Where the manager keeps its metadata (first start only; recorded in
    /// DATA/nasd.toml): sqlite:PATH or postgres://USER[:PASSWORD]@HOST[:PORT]/DB
    /// [default: sqlite:DATA/manager/meta.sqlite].
    #[arg(long)]
    metadata: Option<String>,
    /// Do not serve S3 this time (`[up] s3 = false` turns it off for good).
    #[arg(long)]
    no_s3: bool,
}

/// The metadata location of the `nasd up` cluster in `data`: the one
/// recorded at its first start, else `requested` for a new cluster. Moving
/// an existing cluster's metadata is refused: its drives are known to the
/// metadata it has.
fn up_metadata(data: &Path, recorded: Option<&str>, requested: Option<&str>) -> anyhow::Result<Option<String>> {
    let parse = |t: &str| parse_metadata(Some(t.to_owned())).map(|l| l.expect("some"));
    match (recorded, requested) {
        (Some(r), Some(q)) if parse(r)? != parse(q)? => anyhow::bail!(
            "the cluster in {} keeps its metadata at {} (recorded in DATA/nasd.toml); run without --metadata",
            data.display(),
            parse(r)?
        ),
        (Some(r), _) => Ok(Some(r.to_owned())),
        (None, Some(q)) => {
            let existing = data.join("manager").join(nasd_manager::META_DB);
            anyhow::ensure!(
                !existing.exists(),
                "the cluster in {} keeps its metadata in {}; --metadata is for a new cluster",
                data.display(),
                existing.display()
            );
            parse(q)?;
            Ok(Some(q.to_owned()))
        }
        (None, None) => Ok(None),
    }
}

/// The resolved `[up]` settings, written to `DATA/nasd.toml` on first start.
fn up_settings(args: &UpArgs, file: &ConfigFile) -> anyhow::Result<(PathBuf, u32, u16, u16, Option<u64>)> {
    let data = args.data.clone().or(file.up.data.clone()).unwrap_or_else(|| PathBuf::from("nasd-data"));
    // Nothing is created yet: start-up takes its ports first.
    let data = match data.canonicalize() {
        Ok(d) => d,
        Err(_) => std::path::absolute(&data).with_context(|| format!("cannot use {}", data.display()))?,
    };
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
    if args.metadata.as_deref().is_some_and(nasd_meta::pg_connect::has_password) {
        anyhow::bail!("{PASSWORD_ON_COMMAND_LINE}");
    }
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
    let s3 = up_s3_port(&args, &file, &cluster)?;
    let ports = UpPorts::take(n, first_port, manager_port, cluster.up.auth_port, s3)?;
    let metrics_port = up_metrics_port(&cluster, ports.manager.addr().port())?;
    // The metadata is reached before anything is made: a database that cannot be reached (or
    // refuses) leaves no half-made data directory behind.
    cluster.manager.metadata = up_metadata(&data, cluster.manager.metadata.as_deref(), args.metadata.as_deref())?;
    if let Some(location) = metadata_location(None, &cluster.manager)?.filter(nasd_manager::Location::is_shared) {
        let reached =
            tokio::task::spawn_blocking(move || location.open().map(drop).map_err(|e| Box::new((location, e))));
        if let Err(failed) = reached.await? {
            let (location, e) = *failed;
            anyhow::bail!("cannot reach the metadata at {location} (nothing was made): {e}");
        }
    }
    std::fs::create_dir_all(&data).with_context(|| format!("cannot create {}", data.display()))?;
    // Used only by drives starting for the first time.
    let share = free_space(&data)? / 10 * 9 / n as u64;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut drive_tasks = Vec::new();
    let mut drives = Vec::new();
    let mut opened = Vec::new();
    // Every daemon of the cluster registers its families here; one endpoint serves them.
    let metrics = nasd_metrics::Metrics::new();
    for (i, port) in ports.drives.into_iter().enumerate() {
        let dir = data.join(format!("drive-{i}"));
        let listen = port.addr();
        let d = open_drive(DriveSetup {
            data: dir.clone(),
            port,
            block_size: BLOCK_SIZE_DEFAULT,
            capacity_bytes: capacity,
            first_capacity: Some(share),
            backing: Backing::Unchecked,
            commit_interval: Duration::from_secs(2),
            verify_reads: true,
            master_key_file: Some(dir.join("master.key")),
            // One machine: every drive could fail with it, but a local
            // cluster is for trying nasd, so each counts as its own domain.
            failure_domain: String::new(),
            throttle_bytes_per_sec: None,
            connections_per_peer: nasd_drive::CONNECTIONS_PER_PEER_MAX,
            prefetch_cache_bytes: nasd_store::PREFETCH_CACHE_BYTES_DEFAULT,
            media_seek: None,
        })
        .await?;
        d.config.metrics.register(&metrics, Some(listen.to_string()));
        d.config.metrics.serving(&d.store);
        let info = d.store.info();
        let master = d.master_key.clone().expect("security is on in nasd up");
        drives.push(UpDrive { listen, id: info.drive_id, master, dir, capacity: info.capacity_bytes });
        opened.push(d);
    }
    // The drives share one disk: it must back them all, before any serves.
    let backing: Vec<(PathBuf, u64)> = drives.iter().map(|d| (d.dir.clone(), d.capacity)).collect();
    let force = if args.force_capacity { Backing::Warn } else { Backing::Refuse };
    check_backing(&data, &backing, force, "--drive-capacity")?;
    for d in opened {
        drive_tasks.push(tokio::spawn(nasd_drive::serve(d.listener, d.store, d.config, stopped(stop_rx.clone()))));
    }
    let manager_listen = ports.manager.addr();
    if cluster.manager.default_layout.is_none() {
        cluster.manager.default_layout = Some(up_default_layout(n).to_string());
    }
    // The authentication server: its own directory, the manager's certificate, its port
    // (UpPorts). The manager accepts its identities and installs its shared keys on the drives.
    let auth_listen = ports.auth.addr();
    let auth_port = auth_listen.port();
    let auth_dir = data.join("auth");
    let mut config = manager_config(&cluster.manager, None)?;
    // On PostgreSQL its state is in the managers' database, where more servers may join it
    // (`nasd auth --join`); the manager's link lists them after it (`[manager] auth_failover`).
    let auth_backing = auth_backing(config.metadata.as_ref())?;
    let auth_config = crate::auth_cmd::auth_config(&cluster.auth);
    let auth = nasd_auth::AuthServer::open_on(&auth_dir, auth_config.clone(), auth_backing.clone()).await?;
    let manager_tls = nasd_manager::tls::ensure_certificates(&data.join("manager").join("tls"), &default_tls_names())?;
    let auth_addrs =
        std::iter::once(auth_listen.to_string()).chain(cluster.manager.auth_failover.iter().cloned()).collect();
    config.auth = Some(nasd_manager::identity::AuthLink::new(
        auth_addrs,
        "localhost".into(),
        &manager_tls.ca,
        auth.service_token().clone(),
    )?);
    drop(auth);
    let metadata = config.metadata(&data.join("manager"));
    let m = open_manager(&data.join("manager"), &default_tls_names(), config).await?;
    m.manager.metrics().register(&metrics);
    // Its administrator is the manager's, with the same password.
    let admin_password = std::fs::read_to_string(&m.password_file).ok().map(|p| p.trim_end().to_string());
    let auth = crate::auth_cmd::open_auth(&auth_dir, auth_config, auth_backing, admin_password).await?;
    auth.metrics().register(&metrics);
    let auth_task = tokio::spawn(crate::auth_cmd::serve_auth(
        auth,
        ports.auth.listen()?,
        nasd_manager::tls::acceptor(&m.tls)?,
        stop_rx.clone(),
    ));
    for d in &drives {
        if !m.manager.drives().iter().any(|h| h.drive_id == d.id) {
            m.manager
                .add_drive(&d.listen.to_string(), &d.master)
                .await
                .map_err(|f| anyhow::anyhow!("cannot take drive {} into service: {f}", d.listen))?;
        }
    }
    // The shared keys and the partition's scheme on every drive before the first client is
    // served (a PALs-only partition serves no one until then); maintenance retries what fails.
    if let Err(f) = m.manager.sync_identity_keys().await {
        eprintln!("warning: identity keys not yet on every drive ({f}); retried at each maintenance pass");
    }
    // The drive tools (`nasd audit`, `nasd scrub --drive`) get each drive's number, address and
    // drive key; entries for drives not of this cluster are kept.
    let ours: Vec<String> = drives.iter().map(|d| d.listen.to_string()).collect();
    cluster.drives.retain(|k| !ours.contains(&k.addr));
    for d in &drives {
        cluster.drives.push(save_drive_key(&m.manager, d)?);
    }
    cluster.drives.sort_by_key(|k| k.number);
    cluster.up = config::UpSection {
        data: Some(data.clone()),
        drives: Some(n),
        manager_port: Some(manager_port),
        first_drive_port: Some(first_port),
        drive_capacity: capacity.map(size::human),
        auth_port: Some(auth_port),
        s3: cluster.up.s3,
        nfs: cluster.up.nfs.or(file.up.nfs),
    };
    let nfs_on = cluster.up.nfs == Some(true);
    if nfs_on {
        let fallback = format!("127.0.0.1:{}", manager_port.saturating_add(NFS_PORT_ABOVE_MANAGER));
        cluster.nfs.listen = Some(cluster.nfs.listen.take().unwrap_or(fallback));
        cluster.nfs.handle_key = Some(cluster.nfs.handle_key.take().unwrap_or_else(|| data.join("nfs/handle.key")));
    }
    cluster.metrics.up = Some(metrics_port.addr().to_string());
    let s3_keys = cluster.s3.keys.clone().unwrap_or_else(|| data.join("s3"));
    if let Some(port) = &ports.s3 {
        cluster.s3.listen = Some(port.addr().to_string());
        cluster.s3.keys = Some(s3_keys.clone());
    }
    cluster.client = config::ClientSection {
        failover: Vec::new(),
        manager: Some(manager_listen.to_string()),
        server_name: Some("localhost".into()),
        ca_cert: Some(m.tls.ca.clone()),
        user: Some(ADMIN_USER.into()),
        password_file: Some(m.password_file.clone()),
        data_integrity: cluster.client.data_integrity,
        reply_timeout_secs: cluster.client.reply_timeout_secs,
        metadata_wait_secs: cluster.client.metadata_wait_secs,
        // The manager takes identities only (it is linked to the authentication server):
        // commands log in there, as `admin` with the same password.
        auth: cluster.client.auth.clone().or_else(|| Some(auth_listen.to_string())),
        auth_failover: cluster.client.auth_failover.clone(),
        role: cluster.client.role,
    };
    config::save(&config_path, &cluster, "# Written by `nasd up`; edit freely (it is read on every start).\n")?;
    let stop = shutdown_signal();
    // Everything listens before the banner says so.
    let manager_listener = ports.manager.listen()?;
    let s3 = ports.s3.map(|p| p.listen().map(|l| (l, s3_keys))).transpose()?;
    let s3_endpoint = s3.as_ref().map(|(l, _)| l.local_addr()).transpose()?;
    let s3_metrics = nasd_s3::S3Metrics::new();
    if s3.is_some() {
        s3_metrics.register(&metrics);
    }
    let nfs_metrics = nasd_nfs::NfsMetrics::new();
    if nfs_on {
        nfs_metrics.register(&metrics);
    }
    let (metrics_endpoint, metrics_task) = serve_metrics(metrics_port, metrics, stopped(stop_rx.clone()))?;
    let s3_scheme = if crate::s3_cmd::serves_https(&cluster.s3) { "https" } else { "http" };
    let endpoints = UpEndpoints { s3: s3_endpoint.map(|a| (s3_scheme, a)), metrics: metrics_endpoint };
    print_banner(&data, &config_path, manager_listen, auth_listen, &drives, &metadata, endpoints);
    // The gateway logs in to the manager served below; it failing leaves the rest serving.
    let s3_task = s3.map(|(listener, keys)| {
        let served = crate::s3_cmd::serve_for_up(
            cluster.client.clone(),
            cluster.s3.clone(),
            keys,
            listener,
            s3_metrics.clone(),
            stopped(stop_rx.clone()),
        );
        tokio::spawn(async move {
            if let Err(e) = served.await {
                eprintln!("warning: S3 is not served: {e:#}");
            }
        })
    });
    let nfs_task = nfs_on.then(|| {
        let served = crate::nfs_cmd::serve_for_up(
            cluster.client.clone(),
            cluster.nfs.clone(),
            nfs_metrics.clone(),
            stopped(stop_rx.clone()),
        );
        tokio::spawn(async move {
            if let Err(e) = served.await {
                eprintln!("warning: NFS is not served: {e:#}");
            }
        })
    });
    let server = serve_manager(&m, manager_listener, stop_rx.clone());
    tokio::pin!(server);
    // The manager ends on Ctrl-C, or by itself if it cannot serve (its port is taken): then the
    // drives are stopped too and the error reported, rather than waiting for a Ctrl-C.
    let served = tokio::select! {
        r = &mut server => r,
        () = stop => {
            eprintln!("stopping: finishing requests and committing drives...");
            let _ = stop_tx.send(true);
            server.await
        }
    };
    let _ = stop_tx.send(true);
    for t in drive_tasks {
        t.await??;
    }
    auth_task.await??;
    metrics_task.await??;
    if let Some(t) = s3_task {
        t.await?;
    }
    if let Some(t) = nfs_task {
        t.await?;
    }
    served?;
    eprintln!("nasd stopped cleanly; `nasd up` again resumes the same data");
    Ok(())
}

/// Where `nasd up` serves NFS (`[up] nfs = true`) unless `[nfs] listen` says: this above the manager's port.
pub const NFS_PORT_ABOVE_MANAGER: u16 = 300;

/// Every port `nasd up` serves on, taken before it creates anything.
struct UpPorts {
    drives: Vec<ReservedPort>,
    manager: ReservedPort,
    auth: ReservedPort,
    /// The S3 gateway's, unless it is off.
    s3: Option<ReservedPort>,
}

/// Where `nasd up` serves S3.
enum UpS3 {
    Off,
    /// Recorded at an earlier start (`[s3] listen`).
    At(SocketAddr),
    /// The manager's port + 200 if free, else any.
    Default,
}

/// Whether and where `nasd up` serves S3: off with `--no-s3` or `[up] s3 =
/// false`; at the recorded `[s3] listen`, which must be loopback unless
/// `[s3] tls` asks for HTTPS (plain HTTP stays on loopback); else beside
/// the manager's port.
fn up_s3_port(args: &UpArgs, file: &ConfigFile, cluster: &ConfigFile) -> anyhow::Result<UpS3> {
    if args.no_s3 || cluster.up.s3.or(file.up.s3) == Some(false) {
        return Ok(UpS3::Off);
    }
    let Some(listen) = &cluster.s3.listen else { return Ok(UpS3::Default) };
    let addr: SocketAddr =
        listen.parse().with_context(|| format!("[s3] listen = {listen:?} in DATA/nasd.toml is not an IP:PORT"))?;
    anyhow::ensure!(
        addr.ip().is_loopback() || crate::s3_cmd::serves_https(&cluster.s3),
        "[s3] listen = {addr} in DATA/nasd.toml is not loopback: `nasd up` serves S3 as plain HTTP on loopback only \
         (set [s3] tls = true in DATA/nasd.toml to serve HTTPS there, or run `nasd s3 --plain-http-off-loopback` \
         behind a TLS proxy instead, with [up] s3 = false)"
    );
    Ok(UpS3::At(addr))
}

impl UpPorts {
    /// The drives' `n` ports from `first_drive`, the manager's, and the
    /// authentication server's: the one recorded at the first start, else
    /// the port below the manager's, else any free one (recorded either way).
    fn take(n: u32, first_drive: u16, manager: u16, recorded_auth: Option<u16>, s3: UpS3) -> anyhow::Result<UpPorts> {
        let local = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        anyhow::ensure!(manager > 1, "--manager-port must be above 1 (the authentication server takes the port below)");
        let mut ours = OwnPorts::default();
        let drives =
            (0..n).map(|i| ours.take(local(first_drive + i as u16), "drive")).collect::<anyhow::Result<Vec<_>>>()?;
        let manager = ours.take(local(manager), "manager")?;
        let auth = match recorded_auth {
            Some(port) => ours.take(local(port), "authentication server")?,
            None => ours
                .take(local(manager.addr().port() - 1), "authentication server")
                .or_else(|_| ours.take(local(0), "authentication server"))?,
        };
        let s3 = match s3 {
            UpS3::Off => None,
            UpS3::At(addr) => Some(ours.take(addr, "S3 gateway")?),
            UpS3::Default => {
                let beside = manager.addr().port().checked_add(S3_PORT_ABOVE_MANAGER).unwrap_or(0);
                Some(ours.take(local(beside), "S3 gateway").or_else(|_| ours.take(local(0), "S3 gateway"))?)
            }
        };
        Ok(UpPorts { drives, manager, auth, s3 })
    }
}

/// The ports one `nasd up` has taken so far, by whom: two of its daemons
/// never share one (the drive ports run into the manager's, or the port
/// below the manager's is a drive's). The kernel would let both bind when
/// an earlier run's connections linger, and the second to listen would fail.
#[derive(Default)]
struct OwnPorts(Vec<(SocketAddr, String)>);

impl OwnPorts {
    fn take(&mut self, addr: SocketAddr, who: &str) -> anyhow::Result<ReservedPort> {
        if let Some((_, owner)) = self.0.iter().find(|(a, _)| addr.port() != 0 && *a == addr) {
            anyhow::bail!("cannot listen on {addr} for the {who}: `nasd up` gives that port to its {owner} already");
        }
        let port = ReservedPort::take(addr, who)?;
        self.0.push((port.addr(), who.to_string()));
        Ok(port)
    }
}

/// One drive of `nasd up`, opened.
struct UpDrive {
    listen: SocketAddr,
    id: [u8; 16],
    master: Key,
    dir: PathBuf,
    capacity: u64,
}

/// Where `nasd up` keeps each drive's drive key for the drive tools: the
/// drive's directory, beside its master key (0600, as that one).
pub const DRIVE_KEY_FILE: &str = "drive.key";

/// Writes the drive key the manager holds for `d` to `DIR/drive.key` (0600;
/// rewritten only if it differs) and returns the drive's `[[drives]]` entry.
/// Nothing new is exposed: the master key beside it, as readable, controls
/// the drive entirely.
fn save_drive_key(manager: &Manager, d: &UpDrive) -> anyhow::Result<config::KnownDrive> {
    let handle = manager
        .drives()
        .into_iter()
        .find(|h| h.drive_id == d.id)
        .with_context(|| format!("drive {} is not in the manager's drive table", d.listen))?;
    let key = handle.keys().drive;
    let file = d.dir.join(DRIVE_KEY_FILE);
    match nasd_crypto::read_key_file(&file) {
        Ok(k) if k == key => {}
        Ok(_) => write_secret_file(&file, &format!("{}\n", key.to_hex()))?,
        Err(_) if !file.exists() => nasd_crypto::create_key_file(&file, &key)
            .with_context(|| format!("cannot save the drive key to {}", file.display()))?,
        Err(_) => write_secret_file(&file, &format!("{}\n", key.to_hex()))?,
    }
    Ok(config::KnownDrive { number: handle.drive, addr: d.listen.to_string(), drive_key_file: Some(file) })
}

/// How far above the manager's port `nasd up` serves S3 by default (7300: 7500, `nasd s3`'s default).
const S3_PORT_ABOVE_MANAGER: u16 = 200;
/// How far above the manager's port `nasd up` serves its metrics by default (7300: 9300).
const METRICS_PORT_ABOVE_MANAGER: u16 = 2000;

/// Where `nasd up` serves its metrics: the recorded `[metrics] up`, which
/// must be loopback (the endpoint has no login), else beside the manager's
/// port, else any free port.
fn up_metrics_port(cluster: &ConfigFile, manager: u16) -> anyhow::Result<ReservedPort> {
    const WHO: &str = "metrics endpoint";
    if let Some(listen) = &cluster.metrics.up {
        let addr: SocketAddr =
            listen.parse().with_context(|| format!("[metrics] up = {listen:?} in DATA/nasd.toml is not an IP:PORT"))?;
        anyhow::ensure!(
            addr.ip().is_loopback(),
            "[metrics] up = {addr} in DATA/nasd.toml is not loopback: `nasd up` serves its metrics, which have no \
             login, on loopback only"
        );
        return ReservedPort::take(addr, WHO);
    }
    let local = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    manager
        .checked_add(METRICS_PORT_ABOVE_MANAGER)
        .map_or_else(|| ReservedPort::take(local(0), WHO), |p| ReservedPort::take(local(p), WHO))
        .or_else(|_| ReservedPort::take(local(0), WHO))
}

/// The HTTP endpoints `nasd up` serves, for its banner.
struct UpEndpoints {
    /// The S3 gateway's scheme and address, unless it is off.
    s3: Option<(&'static str, SocketAddr)>,
    metrics: SocketAddr,
}

fn print_banner(
    data: &Path,
    config: &Path,
    manager: SocketAddr,
    auth: SocketAddr,
    drives: &[UpDrive],
    metadata: &nasd_manager::Location,
    endpoints: UpEndpoints,
) {
    let first = drives.first().map(|d| d.listen.to_string()).unwrap_or_default();
    let last = drives.last().map(|d| d.listen.to_string()).unwrap_or_default();
    let capacity = match drives.iter().map(|d| d.capacity).min() {
        Some(min) if drives.iter().all(|d| d.capacity == min) => size::human(min),
        _ => "various".to_string(),
    };
    eprintln!();
    eprintln!("nasd is up");
    eprintln!("  manager   {manager} (TLS)");
    eprintln!("  auth      {auth} (TLS; commands log in there: the manager takes identities, not passwords)");
    eprintln!("  drives    {} x {capacity} ({first} .. {last})", drives.len());
    eprintln!("  data      {}", data.display());
    eprintln!("  metadata  {metadata}");
    eprintln!("  config    {}", config.display());
    if let Some((scheme, s3)) = endpoints.s3 {
        eprintln!("  s3        {scheme}://{s3} (path-style, us-east-1; keys: nasd s3-key create)");
    }
    eprintln!("  metrics   http://{}/metrics (Prometheus; loopback only)", endpoints.metrics);
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
    drives: Vec<ClusterDrive>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// The manager's runtime, with [`ClusterSetup::own_runtimes`].
    _manager_runtime: Option<OwnRuntime>,
    /// The first manager's directory, configuration and TLS files: what
    /// [`add_manager`](Self::add_manager) shares.
    manager_dir: PathBuf,
    manager_config: ManagerConfig,
    tls: nasd_manager::tls::TlsFiles,
    /// Managers added by [`add_manager`](Self::add_manager).
    more_managers: u32,
    /// The first manager (benchmarks in this process read its counters).
    manager: Arc<Manager>,
}

/// How [`LocalCluster::start_with`] sets a cluster up.
#[derive(Clone)]
pub struct ClusterSetup {
    /// Number of drives.
    pub drives: u32,
    /// Bytes of storage each drive may use.
    pub capacity: u64,
    /// Emulated slow media on every drive (`DriveConfig::throttle_bytes_per_sec`,
    /// a test aid for benchmarks): data bytes per second; `None`: no pacing.
    pub throttle_bytes_per_sec: Option<u64>,
    /// Emulated media seek on every drive (`StoreOptions::media_seek`, a
    /// benchmark aid); `None`: none.
    pub media_seek: Option<Duration>,
    /// The manager's configuration (default layout, repair delay, ...).
    pub manager: ManagerConfig,
    /// Serve each drive, and the manager, on a runtime of its own, as
    /// separate processes would: their threads are named `nasd-drive-N` and
    /// `nasd-manager` (so their CPU time can be told apart from the
    /// caller's, [`THREAD_PREFIX_DRIVE`]), and [`LocalCluster::stop_drive`]
    /// can take a drive away with its connections. Otherwise everything
    /// runs on the caller's runtime, as `nasd up` runs it.
    pub own_runtimes: bool,
    /// Run an authentication server beside the manager, as `nasd up` does
    /// (`ManagerConfig::auth` set to it, its administrator the manager's
    /// with the same password, the drives given its shared keys at the
    /// first maintenance pass), and log the client in there
    /// ([`config::ClientSection::auth`]): the manager then takes identities
    /// only, so the partition may use PALs (`ManagerConfig::auth_scheme`).
    pub auth: bool,
}

/// Thread-name prefix of drives served on runtimes of their own.
pub const THREAD_PREFIX_DRIVE: &str = "nasd-drive-";
/// Thread name of a manager served on a runtime of its own.
pub const THREAD_NAME_MANAGER: &str = "nasd-manager";
/// How long an idle blocking thread of those runtimes lives: long enough
/// that a benchmark's per-thread CPU accounting does not lose threads.
const OWN_RUNTIME_KEEP_ALIVE: Duration = Duration::from_secs(3600);

/// One drive of a [`LocalCluster`].
struct ClusterDrive {
    addr: SocketAddr,
    /// What the drive counts (benchmarks in this process read them).
    metrics: nasd_drive::DriveMetrics,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    runtime: Option<OwnRuntime>,
}

/// A runtime owned by a cluster member, shut down without waiting when
/// dropped (dropping a runtime inside another one's task would panic): the
/// tasks still on it — a stopped drive's open connections — end at once.
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl OwnRuntime {
    fn new(name: String, workers: usize) -> anyhow::Result<OwnRuntime> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name(name)
            .thread_keep_alive(OWN_RUNTIME_KEEP_ALIVE)
            .enable_all()
            .build()?;
        Ok(OwnRuntime(Some(rt)))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("runtime present until dropped").handle()
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl LocalCluster {
    /// Starts `drives` drives of `capacity` bytes each and a manager under
    /// `data`, all on the caller's runtime, with the default manager config.
    pub async fn start(data: &Path, drives: u32, capacity: u64) -> anyhow::Result<LocalCluster> {
        let setup = ClusterSetup {
            drives,
            capacity,
            throttle_bytes_per_sec: None,
            media_seek: None,
            manager: ManagerConfig::default(),
            own_runtimes: false,
            auth: false,
        };
        Self::start_with(data, setup).await
    }

    /// Starts a cluster as `setup` says under `data`.
    pub async fn start_with(data: &Path, setup: ClusterSetup) -> anyhow::Result<LocalCluster> {
        let (stop, stop_rx) = watch::channel(false);
        let mut drives = Vec::new();
        let mut added = Vec::new();
        for i in 0..setup.drives {
            let dir = data.join(format!("drive-{i}"));
            let d = open_drive(DriveSetup {
                data: dir.clone(),
                port: ReservedPort::take(([127, 0, 0, 1], 0).into(), "drive")?,
                block_size: BLOCK_SIZE_DEFAULT,
                capacity_bytes: Some(setup.capacity),
                first_capacity: None,
                backing: Backing::Unchecked,
                commit_interval: Duration::from_secs(2),
                verify_reads: true,
                master_key_file: Some(dir.join("master.key")),
                failure_domain: String::new(),
                throttle_bytes_per_sec: setup.throttle_bytes_per_sec,
                connections_per_peer: nasd_drive::CONNECTIONS_PER_PEER_MAX,
                prefetch_cache_bytes: nasd_store::PREFETCH_CACHE_BYTES_DEFAULT,
                media_seek: setup.media_seek,
            })
            .await?;
            let addr = d.listener.local_addr()?;
            added.push((addr, d.master_key.clone().expect("security on")));
            let (drive_stop, rx) = watch::channel(false);
            let OpenDrive { store, listener, config, .. } = d;
            let metrics = config.metrics.clone();
            let (task, runtime) = if setup.own_runtimes {
                // One worker, a drive process's network side; its store work runs on blocking
                // threads. The listener moves to the drive's runtime (its reactor).
                let rt = OwnRuntime::new(format!("{THREAD_PREFIX_DRIVE}{i}"), 1)?;
                let listener = listener.into_std()?;
                let task = rt.handle().spawn(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    nasd_drive::serve(listener, store, config, stopped(rx)).await.map_err(anyhow::Error::from)
                });
                (task, Some(rt))
            } else {
                let task = tokio::spawn(async move {
                    nasd_drive::serve(listener, store, config, stopped(rx)).await.map_err(anyhow::Error::from)
                });
                (task, None)
            };
            drives.push(ClusterDrive { addr, metrics, stop: drive_stop, task: Some(task), runtime });
        }
        // The authentication server, as `nasd up` starts it: its service token goes into the
        // manager's configuration before the manager opens, its administrator after (with the
        // manager's administrator's password), and it serves under the manager's certificate.
        let mut manager_config = setup.manager.clone();
        let auth = if setup.auth {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let dir = data.join("auth");
            let token = nasd_auth::AuthServer::open(&dir, nasd_auth::AuthConfig::default())?.service_token().clone();
            let tls = nasd_manager::tls::ensure_certificates(&data.join("manager").join("tls"), &default_tls_names())?;
            manager_config.auth = Some(nasd_manager::identity::AuthLink::new(
                vec![listener.local_addr()?.to_string()],
                "localhost".into(),
                &tls.ca,
                token,
            )?);
            Some((listener, dir))
        } else {
            None
        };
        let m = open_manager(&data.join("manager"), &default_tls_names(), manager_config.clone()).await?;
        let mut tasks = Vec::new();
        let auth_addr = match auth {
            None => None,
            Some((listener, dir)) => {
                let addr = listener.local_addr()?.to_string();
                let password = std::fs::read_to_string(&m.password_file)?.trim_end().to_string();
                let server = crate::auth_cmd::open_auth(
                    &dir,
                    nasd_auth::AuthConfig::default(),
                    nasd_auth::Backing::Sqlite,
                    Some(password),
                )
                .await?;
                let tls = nasd_manager::tls::acceptor(&m.tls)?;
                tasks.push(tokio::spawn(crate::auth_cmd::serve_auth(server, listener, tls, stop_rx.clone())));
                Some(addr)
            }
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let client = config::ClientSection {
            failover: Vec::new(),
            manager: Some(listener.local_addr()?.to_string()),
            server_name: Some("localhost".into()),
            ca_cert: Some(m.tls.ca.clone()),
            user: Some("admin".into()),
            password_file: Some(m.password_file.clone()),
            data_integrity: Some(true),
            reply_timeout_secs: None,
            metadata_wait_secs: None,
            auth: auth_addr,
            auth_failover: Vec::new(),
            role: None,
        };
        let acceptor = nasd_manager::tls::acceptor(&m.tls)?;
        let (manager_dir, tls) = (data.join("manager"), m.tls.clone());
        let manager = m.manager.clone();
        let serve = async move {
            for (addr, master) in &added {
                manager.add_drive(&addr.to_string(), master).await.map_err(|f| anyhow::anyhow!("{f}"))?;
            }
            let maintenance = manager.spawn_maintenance(stop_rx.clone());
            Ok::<_, anyhow::Error>(async move {
                manager.serve(listener, acceptor, stop_rx).await;
                maintenance.await?;
                Ok(())
            })
        };
        let (task, manager_runtime) = if setup.own_runtimes {
            let rt = OwnRuntime::new(THREAD_NAME_MANAGER.into(), 1)?;
            let listener_moved = async move {
                // Drives added and the server started on the manager's runtime.
                let served = serve.await?;
                served.await
            };
            (rt.handle().spawn(listener_moved), Some(rt))
        } else {
            let served = serve.await?;
            (tokio::spawn(served), None)
        };
        let cluster = LocalCluster {
            client,
            stop,
            drives,
            tasks: {
                tasks.push(task);
                tasks
            },
            _manager_runtime: manager_runtime,
            manager_dir,
            manager_config,
            tls,
            more_managers: 0,
            manager: m.manager.clone(),
        };
        if cluster._manager_runtime.is_some() {
            // Drives are added on the manager's runtime: wait until they all are.
            cluster.wait_for_drives(&m.manager).await?;
        }
        Ok(cluster)
    }

    /// The first manager, in this process.
    pub fn manager(&self) -> &Arc<Manager> {
        &self.manager
    }

    /// Counters of the object bytes each drive of the cluster (in the order
    /// of [`drive_addrs`](Self::drive_addrs)) has sent in reads so far; they
    /// keep counting after this returns.
    pub fn drive_bytes_read(&self) -> impl Fn() -> Vec<u64> + Send + 'static {
        let drives: Vec<nasd_drive::DriveMetrics> = self.drives.iter().map(|d| d.metrics.clone()).collect();
        move || drives.iter().map(nasd_drive::DriveMetrics::read_bytes_total).collect()
    }

    /// Counters of the requests the cluster's drives have answered so far,
    /// all drives and operations together.
    pub fn drive_requests(&self) -> impl Fn() -> u64 + Send + Sync + 'static {
        let drives: Vec<nasd_drive::DriveMetrics> = self.drives.iter().map(|d| d.metrics.clone()).collect();
        move || drives.iter().map(nasd_drive::DriveMetrics::requests_all).sum()
    }

    /// Counts of the blocks reads found in the drives' prefetch caches, summed.
    pub fn drive_prefetch_cache_hits(&self) -> impl Fn() -> u64 + Send + 'static {
        let drives: Vec<nasd_drive::DriveMetrics> = self.drives.iter().map(|d| d.metrics.clone()).collect();
        move || drives.iter().map(nasd_drive::DriveMetrics::prefetch_cache_hits).sum()
    }

    /// Starts one more manager on the first one's metadata, which must be a
    /// shared database (`ManagerConfig::metadata` a PostgreSQL URL; a second
    /// manager on the first one's SQLite file is refused): in its own
    /// directory (`DATA/manager-N`, holding a copy of `manager.key`, so
    /// handles either one issues check at both), with the same
    /// configuration and TLS certificate, serving on another ephemeral
    /// loopback port with its own maintenance, as `nasd manager` on another
    /// machine would (docs/ARCHITECTURE.md, "Several managers on one
    /// database"). Returns how a client reaches it (pinned to it: no
    /// failover list).
    pub async fn add_manager(&mut self) -> anyhow::Result<config::ClientSection> {
        anyhow::ensure!(
            self.manager_config.metadata.as_ref().is_some_and(nasd_manager::Location::is_shared),
            "several managers need their metadata in a shared database (PostgreSQL), not a manager's own SQLite file"
        );
        anyhow::ensure!(
            self._manager_runtime.is_none(),
            "added managers run on the caller's runtime, as the first must"
        );
        self.more_managers += 1;
        let dir = self.manager_dir.with_file_name(format!("manager-{}", self.more_managers + 1));
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let kek = nasd_manager::KEK_FILE;
        std::fs::copy(self.manager_dir.join(kek), dir.join(kek))
            .with_context(|| format!("cannot copy {kek} to {}", dir.display()))?;
        let manager = Manager::open(&dir, self.manager_config.clone())?;
        manager.recover().await;
        let acceptor = nasd_manager::tls::acceptor(&self.tls)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let client = config::ClientSection { manager: Some(listener.local_addr()?.to_string()), ..self.client.clone() };
        let stop_rx = self.stop.subscribe();
        let maintenance = manager.spawn_maintenance(stop_rx.clone());
        self.tasks.push(tokio::spawn(async move {
            manager.serve(listener, acceptor, stop_rx).await;
            maintenance.await?;
            Ok(())
        }));
        Ok(client)
    }

    /// The drives' addresses, in the order they were started.
    pub fn drive_addrs(&self) -> Vec<SocketAddr> {
        self.drives.iter().map(|d| d.addr).collect()
    }

    /// Stops drive `i` (its index in [`drive_addrs`](Self::drive_addrs)) as a
    /// power-off after a clean shutdown would: it stops accepting, commits,
    /// and its open connections close. Needs [`ClusterSetup::own_runtimes`]
    /// (on a shared runtime its open connections would go on being served).
    pub async fn stop_drive(&mut self, i: usize) -> anyhow::Result<()> {
        let d = self.drives.get_mut(i).with_context(|| format!("no drive {i}"))?;
        anyhow::ensure!(d.runtime.is_some(), "stopping one drive needs drives on runtimes of their own");
        let _ = d.stop.send(true);
        if let Some(task) = d.task.take() {
            task.await??;
        }
        d.runtime = None;
        Ok(())
    }

    /// Waits (bounded) until the manager knows every drive.
    async fn wait_for_drives(&self, manager: &Manager) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while manager.drives().len() < self.drives.len() {
            if self.tasks.iter().any(|t| t.is_finished()) {
                anyhow::bail!("the manager stopped while taking its drives into service");
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "the manager did not take its drives into service");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Stops everything and waits for the drives' final commits.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        for d in &mut self.drives {
            let _ = d.stop.send(true);
        }
        let mut result = Ok(());
        for t in self.tasks.drain(..).chain(self.drives.iter_mut().filter_map(|d| d.task.take())) {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = result.and(Err(e)),
                Err(e) => result = result.and(Err(e.into())),
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// `[manager] auth` needs the authentication server's CA, named (there is
    /// no default to fall back on), and the message says where it is.
    #[test]
    fn a_linked_manager_needs_the_auth_servers_ca() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("service.token");
        nasd_crypto::create_key_file(&token, &Key::random()).unwrap();
        let mut file = config::ManagerSection {
            auth: Some("127.0.0.1:7299".into()),
            auth_token_file: Some(token),
            ..Default::default()
        };
        let e = manager_config(&file, None).expect_err("no CA named");
        assert!(format!("{e:#}").contains("auth_ca_cert") && format!("{e:#}").contains("tls/ca.pem"), "{e:#}");
        file.auth_ca_cert = Some(dir.path().join("ca.pem"));
        let e = manager_config(&file, None).expect_err("the CA file is missing");
        assert!(format!("{e:#}").contains("ca.pem"), "{e:#}");
        std::fs::write(dir.path().join("ca.pem"), "-----BEGIN CERTIFICATE-----\n").unwrap();
        let linked = manager_config(&file, None).unwrap().auth.expect("linked");
        assert_eq!(linked.ca_pem, b"-----BEGIN CERTIFICATE-----\n");
        assert_eq!(linked.addrs, ["127.0.0.1:7299"]);
    }

    /// The port below the manager's, where `nasd up` puts the authentication
    /// server, is a drive's: the server goes elsewhere instead of sharing it
    /// (the drive then could not listen: CI, stop 35); a manager port among
    /// the drives' is refused with the reason; and another process cannot
    /// bind a port `nasd up` has taken, `SO_REUSEADDR` or not.
    #[test]
    fn up_never_gives_one_port_to_two_daemons() {
        let first = nasd_meta::pg_server::free_loopback_port().unwrap();
        let ports = UpPorts::take(2, first, first + 2, None, UpS3::Off).unwrap();
        assert_eq!(ports.manager.addr().port(), first + 2);
        let auth = ports.auth.addr().port();
        assert!(auth != first && auth != first + 1 && auth != first + 2, "auth server on {auth}");
        let stolen = std::net::TcpListener::bind(ports.drives[1].addr());
        assert!(stolen.is_err(), "another listener bound a drive's port while `nasd up` held it");
        drop(ports);

        let first = nasd_meta::pg_server::free_loopback_port().unwrap();
        let e = UpPorts::take(3, first, first + 1, None, UpS3::Off).err().expect("a manager port among the drives'");
        assert!(format!("{e:#}").contains("gives that port to its drive already"), "{e:#}");
    }

    /// `nasd up` whose manager cannot listen: it says why at once, before it has made anything
    /// (not even the data directory); the drive ports recorded at a first start cannot move.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn up_reports_a_taken_port_before_making_anything_and_keeps_drive_ports() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("nasd-data");
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let manager_port = taken.local_addr().unwrap().port();
        let first = free_port();
        let args = |first_drive_port| UpArgs {
            data: Some(data.clone()),
            drives: Some(1),
            manager_port: Some(manager_port),
            first_drive_port,
            drive_capacity: Some("64MiB".into()),
            force_capacity: false,
            metadata: None,
            no_s3: false,
        };
        let up_once = |first_drive_port| async move {
            tokio::time::timeout(Duration::from_secs(60), up(args(first_drive_port), ConfigFile::default()))
                .await
                .expect("nasd up waited for a Ctrl-C instead of reporting the failure")
        };
        let e = up_once(Some(first)).await.expect_err("the manager's port is taken");
        assert!(format!("{e:#}").contains(&format!("cannot listen on 127.0.0.1:{manager_port}")), "{e:#}");
        assert!(!data.exists(), "nothing is made when a port is taken");

        // A cluster whose first start recorded its drive ports: moving them is refused (the
        // manager knows the drives by address), before anything else happens.
        std::fs::create_dir(&data).unwrap();
        let recorded = ConfigFile {
            up: config::UpSection { first_drive_port: Some(first), drives: Some(1), ..Default::default() },
            ..Default::default()
        };
        config::save(&data.join("nasd.toml"), &recorded, "").unwrap();
        let e = up_once(Some(first.wrapping_add(1))).await.expect_err("drive ports cannot move");
        assert!(format!("{e:#}").contains("run without --first-drive-port"), "{e:#}");
        // Without the flag, the recorded ports are taken (here: refused for the manager's).
        let e = up_once(None).await.expect_err("the manager's port is still taken");
        assert!(format!("{e:#}").contains("cannot listen"), "{e:#}");
        assert_eq!(std::fs::read_dir(&data).unwrap().count(), 1, "nothing but nasd.toml is made");
        drop(taken);
    }
}
