//! `nasd`: start a cluster, run its daemons, use and administer the file
//! system, look after drives, measure.

mod bench;
mod bench_fs;
mod bench_mount;
mod cluster_cmd;
mod config;
mod daemons;
mod drive_admin;
mod fs_cmd;
mod mount_cmd;
mod size;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// nasd: secure, scalable network-attached storage.
#[derive(Parser)]
#[command(name = "nasd", version, about, long_about = None)]
struct Cli {
    /// Configuration file (TOML) [default: ./nasd-data/nasd.toml if it exists].
    /// Command-line flags override it.
    #[arg(long, global = true, env = "NASD_CONFIG")]
    config: Option<PathBuf>,
    /// Log in as this user instead of the configured one (password from
    /// $NASD_PASSWORD or asked for).
    #[arg(long, global = true, env = "NASD_USER")]
    user: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a whole cluster on this machine: a manager and N drives under
    /// one data directory (./nasd-data). Run it again to resume.
    Up(daemons::UpArgs),
    /// Run a file manager: names, users and capabilities, over TLS.
    Manager(daemons::ManagerArgs),
    /// Run a storage drive: keeps objects in DIR and serves them on ADDR.
    Drive(daemons::DriveArgs),
    #[command(flatten)]
    Fs(fs_cmd::FsCommand),
    /// Mount the file system at MOUNTPOINT (FUSE) and serve it until Ctrl-C,
    /// SIGTERM or `fusermount3 -u MOUNTPOINT`.
    Mount(mount_cmd::MountArgs),
    /// How files are spread over drives: show or set a layout (striping,
    /// mirroring, Reed-Solomon).
    #[command(subcommand)]
    Layout(cluster_cmd::LayoutCommand),
    /// Drives (up, down, out of service), degraded files and repair progress.
    Status,
    /// Rebuild lost redundancy, scrub and heal rot, or rebalance onto new
    /// drives, and follow it (administrators).
    Repair(cluster_cmd::RepairArgs),
    /// Administrator commands: users and drives (all but reset-password log in
    /// to the manager).
    #[command(subcommand)]
    Admin(fs_cmd::AdminCommand),
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
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("NASD_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let (file, _) = config::find(cli.config.as_deref())?;
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    match cli.command {
        Command::Up(args) => rt.block_on(daemons::up(args, file)),
        Command::Manager(args) => rt.block_on(daemons::run_manager(args, file.manager)),
        Command::Drive(args) => rt.block_on(daemons::run_drive(args, file.drive)),
        Command::Fs(cmd) => rt.block_on(async {
            let fs = fs_cmd::login(&file.client, cli.user.as_deref()).await?;
            fs_cmd::run(&fs, cmd).await
        }),
        Command::Mount(args) => rt.block_on(async {
            let fs = fs_cmd::login(&file.client, cli.user.as_deref()).await?;
            mount_cmd::run(fs, args).await
        }),
        Command::Layout(cmd) => rt.block_on(async {
            let fs = fs_cmd::login(&file.client, cli.user.as_deref()).await?;
            cluster_cmd::layout(&fs, cmd).await
        }),
        Command::Status => rt.block_on(async {
            let fs = fs_cmd::login(&file.client, cli.user.as_deref()).await?;
            cluster_cmd::status(&fs).await
        }),
        Command::Repair(args) => rt.block_on(async {
            let fs = fs_cmd::login(&file.client, cli.user.as_deref()).await?;
            cluster_cmd::repair(&fs, args).await
        }),
        Command::Admin(fs_cmd::AdminCommand::ResetPassword { name, data, password_file }) => {
            daemons::reset_password(&name, data.or(file.manager.data), password_file)
        }
        Command::Admin(cmd) => rt.block_on(async {
            let fs = fs_cmd::login(&file.client, cli.user.as_deref()).await?;
            fs_cmd::run_admin(&fs, cmd).await
        }),
        Command::Inquiry { drive } => rt.block_on(drive_admin::inquiry(&drive)),
        Command::Bench(b) => rt.block_on(bench::run(b)),
        Command::SetDriveKey { drive, master_key_file, drive_key_file } => {
            rt.block_on(drive_admin::set_drive_key(&drive, &master_key_file, &drive_key_file))
        }
        Command::Audit { drive, drive_key_file, after, max } => {
            rt.block_on(drive_admin::audit(&drive, &drive_key_file, after, max))
        }
        Command::Scrub { drive, drive_key_file } => rt.block_on(drive_admin::scrub(&drive, &drive_key_file)),
    }
}
