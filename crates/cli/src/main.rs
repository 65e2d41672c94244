//! `nasd`: start a cluster, run its daemons, use and administer the file
//! system, look after drives, measure.

mod acl_cmd;
mod auth_cmd;
mod bench;
mod bench_fs;
mod bench_mount;
mod bench_soak;
mod bench_stripe;
mod cluster_cmd;
mod config;
mod daemons;
mod drive_admin;
mod fs_cmd;
mod mount_cmd;
mod size;
mod transfer;

use anyhow::Context;
use clap::{Parser, Subcommand};
use fs_cmd::Login;
use std::io::IsTerminal;
use std::path::PathBuf;

/// nasd: secure, scalable network-attached storage.
#[derive(Parser)]
#[command(name = "nasd", version, about, long_about = None)]
struct Cli {
    /// Configuration file (TOML) [default: ./nasd-data/nasd.toml if it exists].
    /// Command-line flags override it.
    #[arg(long, global = true, env = "NASD_CONFIG")]
    config: Option<PathBuf>,
    /// `nasd --user NAME COMMAND`: the same as `--user` after a command that
    /// logs in (kept for scripts; shown on those commands).
    #[arg(long, hide = true, value_name = "NAME")]
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
    /// Run the authentication server (users, roles, groups, identity keys),
    /// or, with a subcommand, log in there or administer it.
    Auth(auth_cmd::AuthArgs),
    #[command(flatten)]
    Fs(fs_cmd::FsCommand),
    /// Mount the file system at MOUNTPOINT (FUSE) and serve it until Ctrl-C,
    /// SIGTERM or `fusermount3 -u MOUNTPOINT`.
    Mount(mount_cmd::MountArgs),
    /// How files are spread over drives: show or set a layout (striping,
    /// mirroring, Reed-Solomon).
    #[command(subcommand)]
    Layout(cluster_cmd::LayoutCommand),
    /// Global ACLs: grant users and groups rights on files and directories
    /// beyond the mode bits (get, set, add, remove).
    #[command(subcommand)]
    Acl(acl_cmd::AclCommand),
    /// Drives (up, down, out of service), degraded files and repair progress.
    Status {
        #[command(flatten)]
        login: Login,
    },
    /// Rebuild lost redundancy, scrub and heal rot, or rebalance onto new
    /// drives, and follow it (administrators).
    Repair(cluster_cmd::RepairArgs),
    /// Administrator commands: users and drives (all but reset-password log in
    /// to the manager).
    #[command(subcommand)]
    Admin(fs_cmd::AdminCommand),
    /// Ask drives for their identity, capacity and partitions.
    Inquiry {
        /// A drive: its number (`nasd status` shows them; from [[drives]] in the
        /// config file, which `nasd up` writes) or HOST:PORT [default: every
        /// drive the config file records, else [drive] listen, else
        /// 127.0.0.1:7400].
        #[arg(long, value_name = "N|HOST:PORT")]
        drive: Option<String>,
    },
    /// Measure throughput end to end against a raw TCP baseline.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Set a drive's drive key (authorized by its master key) and save it to a
    /// file. Only for a drive no manager looks after: a manager holds the
    /// drive keys of its drives (`nasd up` saves them for the drive tools).
    SetDriveKey {
        /// The drive's address [default: [drive] listen from the config file, else 127.0.0.1:7400].
        #[arg(long, value_name = "HOST:PORT")]
        drive: Option<String>,
        /// File holding the drive's master key (64 hex digits).
        #[arg(long)]
        master_key_file: PathBuf,
        /// Where to write the new drive key (created 0600; must not exist).
        #[arg(long)]
        drive_key_file: PathBuf,
    },
    /// Find rot: every drive re-reads every block it stores and checks it
    /// against its stored digest.
    ///
    /// Without --drive, through the manager (administrators): every drive is
    /// scrubbed and each rotten block is healed from its file's redundancy;
    /// `nasd status` shows the last result. With --drive, one drive directly,
    /// authorized by its drive key: rot is reported, not healed.
    Scrub {
        /// Scrub only this drive, directly: its number (from [[drives]] in the
        /// config file) or HOST:PORT [default: every drive, through the manager].
        #[arg(long, value_name = "N|HOST:PORT")]
        drive: Option<String>,
        /// File holding the drive key (64 hex digits) [default: the one the
        /// config file records for the drive].
        #[arg(long, requires = "drive")]
        drive_key_file: Option<PathBuf>,
        #[command(flatten)]
        login: Login,
    },
    /// Show a drive's audit trail (authorized by its drive key).
    Audit {
        /// The drive: its number (from [[drives]] in the config file) or
        /// HOST:PORT [default: the only drive the config file records, else
        /// [drive] listen, else 127.0.0.1:7400].
        #[arg(long, value_name = "N|HOST:PORT")]
        drive: Option<String>,
        /// File holding the drive key (64 hex digits) [default: the one the
        /// config file records for the drive].
        #[arg(long)]
        drive_key_file: Option<PathBuf>,
        /// Show records after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Most records to show.
        #[arg(long, default_value_t = 100)]
        max: u16,
    },
}

impl Command {
    /// How the command logs in to the manager; `None` if it does not.
    fn login(&self) -> Option<&Login> {
        match self {
            Command::Fs(cmd) => Some(cmd.login()),
            Command::Layout(cmd) => Some(cmd.login()),
            Command::Acl(cmd) => Some(cmd.login()),
            Command::Status { login } | Command::Scrub { drive: None, login, .. } => Some(login),
            Command::Repair(args) => Some(&args.login),
            Command::Mount(args) => Some(&args.login),
            Command::Admin(cmd) => cmd.login(),
            Command::Auth(auth_cmd::AuthArgs { command: Some(_), .. }) => Some(&AUTH_LOGIN),
            _ => None,
        }
    }
}

/// `nasd auth` subcommands log in at the authentication server as the
/// top-level `--user` (or the configured user).
static AUTH_LOGIN: Login = Login { user: None };

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each said once: a cause whose text
/// its context already quotes (many errors include their source's message)
/// is not repeated.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if s.is_empty() || text.contains(&s) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&s);
    }
    text
}

fn run() -> anyhow::Result<()> {
    // Colour only for a person at a terminal: a log file gets plain text.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("NASD_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
    let cli = Cli::parse();
    let (file, _) = config::find(cli.config.as_deref())?;
    let user = match (cli.command.login(), cli.user) {
        (Some(login), top) => top.or(login.user.clone()),
        (None, Some(_)) => anyhow::bail!("--user is for commands that log in to the manager; this one does not"),
        (None, None) => None,
    };
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let login = || async { fs_cmd::login(&file.client, user.as_deref()).await };
    match cli.command {
        Command::Up(args) => rt.block_on(daemons::up(args, file)),
        Command::Manager(args) => rt.block_on(daemons::run_manager(args, file.manager)),
        Command::Drive(args) => rt.block_on(daemons::run_drive(args, file.drive)),
        Command::Auth(auth_cmd::AuthArgs { command: Some(cmd), .. }) => {
            rt.block_on(auth_cmd::run(&file.client, user.as_deref(), cmd))
        }
        Command::Auth(args) => rt.block_on(auth_cmd::run_daemon(args, file.auth)),
        Command::Fs(cmd) => rt.block_on(async { fs_cmd::run(&login().await?, cmd).await }),
        Command::Mount(args) => rt.block_on(async { mount_cmd::run(login().await?, args).await }),
        Command::Layout(cmd) => rt.block_on(async { cluster_cmd::layout(&login().await?, cmd).await }),
        Command::Acl(cmd) => rt.block_on(async { acl_cmd::run(&login().await?, cmd).await }),
        Command::Status { .. } => rt.block_on(async { cluster_cmd::status(&login().await?).await }),
        Command::Repair(args) => rt.block_on(async { cluster_cmd::repair(&login().await?, args).await }),
        Command::Admin(fs_cmd::AdminCommand::ResetPassword { name, data, metadata, password_file }) => {
            let metadata = daemons::parse_metadata(metadata.or(file.manager.metadata))?;
            daemons::reset_password(&name, data.or(file.manager.data), metadata.as_ref(), password_file)
        }
        Command::Admin(cmd) => rt.block_on(async { fs_cmd::run_admin(&login().await?, cmd).await }),
        Command::Inquiry { drive } => {
            let drives = drive_admin::resolve(drive.as_deref(), &file)?;
            rt.block_on(drive_admin::inquiry(&drives))
        }
        Command::Bench(b) => rt.block_on(bench::run(b)),
        Command::SetDriveKey { drive, master_key_file, drive_key_file } => {
            // Named, a drive the config file records is found (and refused: a manager's);
            // by default, the standalone drive of the [drive] section.
            let drive = match drive.as_deref() {
                Some(d) => drive_admin::resolve_one(Some(d), &file)?,
                None => {
                    drive_admin::resolve_one(None, &config::ConfigFile { drive: file.drive, ..Default::default() })?
                }
            };
            rt.block_on(drive_admin::set_drive_key(&drive, &master_key_file, &drive_key_file))
        }
        Command::Audit { drive, drive_key_file, after, max } => {
            let drive = drive_admin::resolve_one(drive.as_deref(), &file)?;
            rt.block_on(drive_admin::audit(&drive, drive_key_file, after, max))
        }
        Command::Scrub { drive: None, .. } => rt.block_on(async { cluster_cmd::scrub_all(&login().await?).await }),
        Command::Scrub { drive: Some(drive), drive_key_file, .. } => {
            let drive = drive_admin::resolve_one(Some(&drive), &file)?;
            rt.block_on(drive_admin::scrub(&drive, drive_key_file))
        }
    }
}
