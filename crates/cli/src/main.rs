//! `nasd`: run a drive, ask a drive about itself, measure a drive.

mod bench;
mod config;
mod size;

use anyhow::Context;
use clap::{Parser, Subcommand};
use nasd_store::{Store, StoreOptions, BLOCK_SIZE_DEFAULT};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// nasd: secure, scalable network-attached storage.
#[derive(Parser)]
#[command(name = "nasd", version, about, long_about = None)]
struct Cli {
    /// Configuration file (TOML). Command-line flags override it.
    #[arg(long, global = true, env = "NASD_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a storage drive: keeps objects in DIR and serves them on ADDR.
    Drive(DriveArgs),
    /// Ask a drive for its identity, capacity and partitions.
    Inquiry {
        /// The drive's address.
        #[arg(long, default_value = "127.0.0.1:7400")]
        drive: String,
    },
    /// Measure throughput end to end against a raw TCP baseline.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Set a drive's drive key (authorized by its master key) and save it to a file.
    SetDriveKey {
        /// The drive's address.
        #[arg(long, default_value = "127.0.0.1:7400")]
        drive: String,
        /// File holding the drive's master key (64 hex digits).
        #[arg(long)]
        master_key_file: PathBuf,
        /// Where to write the new drive key (created 0600; must not exist).
        #[arg(long)]
        drive_key_file: PathBuf,
    },
    /// Re-read every block a drive stores and check it against its stored
    /// digest; report rot (authorized by the drive key).
    Scrub {
        /// The drive's address.
        #[arg(long, default_value = "127.0.0.1:7400")]
        drive: String,
        /// File holding the drive key (64 hex digits).
        #[arg(long)]
        drive_key_file: PathBuf,
    },
    /// Show a drive's audit trail (authorized by its drive key).
    Audit {
        /// The drive's address.
        #[arg(long, default_value = "127.0.0.1:7400")]
        drive: String,
        /// File holding the drive key (64 hex digits).
        #[arg(long)]
        drive_key_file: PathBuf,
        /// Show records after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Most records to show.
        #[arg(long, default_value_t = 100)]
        max: u16,
    },
}

#[derive(clap::Args)]
struct DriveArgs {
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
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("NASD_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let file = match &cli.config {
        Some(p) => config::load(p)?,
        None => config::ConfigFile::default(),
    };
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    match cli.command {
        Command::Drive(args) => rt.block_on(run_drive(args, file.drive)),
        Command::Inquiry { drive } => rt.block_on(inquiry(&drive)),
        Command::Bench(b) => rt.block_on(bench::run(b)),
        Command::SetDriveKey { drive, master_key_file, drive_key_file } => {
            rt.block_on(set_drive_key(&drive, &master_key_file, &drive_key_file))
        }
        Command::Audit { drive, drive_key_file, after, max } => rt.block_on(audit(&drive, &drive_key_file, after, max)),
        Command::Scrub { drive, drive_key_file } => rt.block_on(scrub(&drive, &drive_key_file)),
    }
}

async fn run_drive(args: DriveArgs, file: config::DriveSection) -> anyhow::Result<()> {
    // The drive's files hold its keys: everything it creates is owner-only.
    // SAFETY: umask only changes this process's file-creation mask.
    unsafe { libc::umask(0o077) };
    let data = args
        .data
        .or(file.data)
        .context("no data directory: pass --data DIR (or set [drive] data in the config file)")?;
    let listen = args.listen.or(file.listen).unwrap_or_else(|| "127.0.0.1:7400".into());
    let listen: SocketAddr =
        listen.parse().with_context(|| format!("--listen '{listen}' is not an address like 127.0.0.1:7400"))?;
    let block_size = match args.block_size.or(file.block_size) {
        Some(s) => u32::try_from(size::parse_size(&s).map_err(anyhow::Error::msg)?).context("block size too large")?,
        None => BLOCK_SIZE_DEFAULT,
    };
    std::fs::create_dir_all(&data).with_context(|| format!("cannot create data directory {}", data.display()))?;
    let capacity_bytes = match args.capacity.or(file.capacity) {
        Some(s) => size::parse_size(&s).map_err(anyhow::Error::msg)?,
        None => default_capacity(&data)?,
    };
    let opts = StoreOptions {
        block_size,
        capacity_bytes,
        verify_reads: args.verify_reads.or(file.verify_reads).unwrap_or(true),
        extensions: Vec::new(),
    };
    let store = tokio::task::spawn_blocking({
        let data = data.clone();
        move || Store::open(&data, &opts)
    })
    .await?
    .with_context(|| format!("cannot open drive storage in {}", data.display()))?;
    let store = Arc::new(store);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}: is another drive already using it?"))?;
    let security = if args.no_security || file.no_security.unwrap_or(false) {
        nasd_drive::SecurityMode::Disabled
    } else {
        let path = args.master_key_file.or(file.master_key_file).unwrap_or_else(|| data.join("master.key"));
        nasd_drive::SecurityMode::Enforced { master_key: Some(master_key(&path)?) }
    };
    let config = nasd_drive::DriveConfig {
        commit_interval: Duration::from_millis(args.commit_interval_ms.or(file.commit_interval_ms).unwrap_or(2000)),
        security,
        ..Default::default()
    };
    let info = store.info();
    eprintln!(
        "nasd drive {} serving {} on {} ({} capacity, {} blocks); Ctrl-C stops it",
        hex_id(&info.drive_id),
        data.display(),
        listener.local_addr()?,
        size::human(info.capacity_bytes),
        size::human(info.block_size as u64),
    );
    nasd_drive::serve(listener, store, config, shutdown_signal()).await?;
    eprintln!("nasd drive stopped cleanly");
    Ok(())
}

fn read_key(path: &std::path::Path) -> anyhow::Result<nasd_drive::Key> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read key file {}", path.display()))?;
    nasd_drive::Key::from_hex(&text).with_context(|| format!("{} does not hold a key (64 hex digits)", path.display()))
}

fn write_new_key_file(path: &std::path::Path, key: &nasd_drive::Key) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create key file {} (it must not exist yet)", path.display()))?;
    writeln!(f, "{}", key.to_hex())?;
    f.sync_all()?;
    Ok(())
}

async fn connect(addr: &str) -> anyhow::Result<nasd_client::DriveClient> {
    nasd_client::DriveClient::connect(addr)
        .await
        .with_context(|| format!("cannot reach a drive at {addr}: is `nasd drive` running there?"))
}

async fn set_drive_key(addr: &str, master_file: &std::path::Path, out: &std::path::Path) -> anyhow::Result<()> {
    let master = read_key(master_file)?;
    let key = nasd_drive::Key::random();
    // Write the file first: a key the drive holds but nobody kept would lock the admin out.
    write_new_key_file(out, &key)?;
    let mut c = connect(addr).await?;
    if let Err(e) = c.set_drive_key(&master, &key).await {
        let _ = std::fs::remove_file(out);
        return Err(e).context("the drive refused the new drive key (is this its master key?)");
    }
    println!("drive key set; saved to {}", out.display());
    Ok(())
}

async fn audit(addr: &str, drive_key_file: &std::path::Path, after: u64, max: u16) -> anyhow::Result<()> {
    let key = read_key(drive_key_file)?;
    let mut c = connect(addr).await?;
    let records = c.read_audit(&key, after, max).await.context("the drive refused to show its audit trail")?;
    println!(
        "{:>8}  {:>20}  {:>8}  {:>6}  {:>6}  {:>22}  {:>8}  {:>10}  region",
        "seq", "time (ns)", "audit id", "key", "op", "status", "part", "object"
    );
    for r in &records {
        let status =
            nasd_proto::Status::from_code(r.status).map_or_else(|| r.status.to_string(), |s| s.name().to_string());
        println!(
            "{:>8}  {:>20}  {:>8}  {:>6}  {:#06x}  {:>22}  {:>8}  {:>10}  {}+{}",
            r.sequence,
            r.time_ns,
            r.audit_id,
            r.key_type,
            r.opcode,
            status,
            r.partition,
            r.object,
            r.region.offset,
            r.region.length
        );
    }
    if records.is_empty() {
        println!("(no records after {after})");
    }
    Ok(())
}

async fn scrub(addr: &str, drive_key_file: &std::path::Path) -> anyhow::Result<()> {
    let key = read_key(drive_key_file)?;
    let mut c = connect(addr).await?;
    let (checked, total, corrupt) = c.scrub(&key, 1024).await.context("the drive refused to scrub")?;
    println!("checked {checked} blocks: {total} corrupt");
    for (p, o, b) in &corrupt {
        println!("  partition {p} object {o} block {b}: bytes no longer match the stored digest");
    }
    anyhow::ensure!(total == 0, "{total} corrupt blocks: restore them from a replica or backup");
    Ok(())
}

/// Reads the master key file, creating it (mode 0600) with a fresh key if it
/// does not exist. A drive that already has a master key keeps its own.
fn master_key(path: &std::path::Path) -> anyhow::Result<nasd_drive::Key> {
    if path.exists() {
        return read_key(path).context("cannot use the master key file");
    }
    let key = nasd_drive::Key::random();
    write_new_key_file(path, &key)?;
    eprintln!("created master key {} (keep it safe: it controls this drive)", path.display());
    Ok(key)
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

/// 90% of the free space of the file system holding `dir`.
fn default_capacity(dir: &std::path::Path) -> anyhow::Result<u64> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let path = CString::new(dir.as_os_str().as_bytes()).context("data directory path contains a NUL byte")?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid NUL-terminated string and `st` a valid out-pointer.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
    anyhow::ensure!(rc == 0, "cannot measure free space of {}: {}", dir.display(), std::io::Error::last_os_error());
    let free = st.f_bavail as u64 * st.f_frsize as u64;
    Ok(free / 10 * 9)
}

fn hex_id(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

async fn inquiry(addr: &str) -> anyhow::Result<()> {
    let mut c = nasd_client::DriveClient::connect(addr)
        .await
        .with_context(|| format!("cannot reach a drive at {addr}: is `nasd drive` running there?"))?;
    let d = c.inquiry().await?;
    println!("drive     {}", hex_id(&d.drive_id));
    println!("vendor    {} {} {}", d.vendor, d.model, d.firmware);
    println!(
        "capacity  {} ({} used), block size {}",
        size::human(d.capacity_bytes),
        size::human(d.used_bytes),
        size::human(d.block_size as u64)
    );
    println!("partitions {}", d.partitions.len());
    for p in &d.partitions {
        println!(
            "  {:>6}  quota {:>10}  used {:>10}  objects {}",
            p.partition,
            size::human(p.quota_bytes),
            size::human(p.used_bytes),
            p.objects
        );
    }
    Ok(())
}
