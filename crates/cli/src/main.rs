//! `nasd`: start a cluster, run its daemons, use and administer the file
//! system, look after drives, measure.
//!
//! Only wires the libraries together. Logs go to stderr, coloured only on a
//! terminal (and `NO_COLOR` unset). A command (not a daemon) whose standard
//! output is closed under it exits 141 quietly, as if by SIGPIPE, which
//! stays ignored (a peer hanging up is an error, not death). A unit test
//! walks every command's `--help` (clap's `debug_assert`, help on every
//! positional argument, each default shown once, `--user` only where a
//! command logs in).

mod acl_cmd;
mod auth_cmd;
mod bench;
mod bench_cost;
mod bench_dsfs;
mod bench_fs;
mod bench_mount;
mod bench_slices;
mod bench_small;
mod bench_soak;
mod bench_stripe;
mod bench_untar;
mod cluster_cmd;
mod config;
mod daemons;
mod drive_admin;
mod fs_cmd;
mod mount_cmd;
mod nfs_cmd;
mod s3_cmd;
mod size;
mod transfer;
mod xorshift;

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
    /// How log lines are written: `text`, or `json` (one JSON object a line,
    /// with the spans it was logged in) [default: [log] format from the
    /// config file, else text].
    #[arg(long, global = true, value_enum, hide_possible_values = true, env = "NASD_LOG_FORMAT")]
    log_format: Option<config::LogFormat>,
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
    /// Serve the file system over S3 (plain HTTP on loopback by default)
    /// until Ctrl-C or SIGTERM: buckets are top-level directories, keys are
    /// paths, each request runs as the nasd user whose access key signed it.
    S3(s3_cmd::S3Args),
    /// S3 access keys: create, list, revoke.
    #[command(subcommand)]
    S3Key(s3_cmd::S3KeyCommand),
    /// Serve the file system over NFSv3 (TCP, with MOUNT, on one port)
    /// until Ctrl-C or SIGTERM: each call runs as its AUTH_SYS user through
    /// the gateway grant; file handles are sealed and survive restarts.
    Nfs(nfs_cmd::NfsArgs),
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
    /// Show drives' audit trails (authorized by each drive's drive key).
    Audit {
        /// The drive: its number (from [[drives]] in the config file) or
        /// HOST:PORT [default: every drive the config file records, else
        /// [drive] listen, else 127.0.0.1:7400].
        #[arg(long, value_name = "N|HOST:PORT")]
        drive: Option<String>,
        /// File holding the drive key (64 hex digits) [default: the one the
        /// config file records for the drive].
        #[arg(long)]
        drive_key_file: Option<PathBuf>,
        /// Show records after this sequence number (each drive numbers its own).
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
            Command::S3(args) => Some(&args.login),
            Command::Nfs(args) => Some(&args.login),
            Command::S3Key(cmd) => Some(cmd.login()),
            Command::Admin(cmd) => cmd.login(),
            Command::Auth(auth_cmd::AuthArgs { command: Some(c), .. }) if !c.is_offline() => Some(&AUTH_LOGIN),
            _ => None,
        }
    }
}

impl Command {
    /// Serves until stopped (daemons, a mount) rather than running one command.
    fn is_daemon(&self) -> bool {
        matches!(
            self,
            Command::Up(_)
                | Command::Manager(_)
                | Command::Drive(_)
                | Command::Mount(_)
                | Command::S3(_)
                | Command::Nfs(_)
                | Command::Auth(auth_cmd::AuthArgs { command: None, .. })
        )
    }
}

/// Exit status of a command whose reader went away, as a shell reports a
/// process ended by SIGPIPE (128 + 13).
const EXIT_OUTPUT_CLOSED: i32 = 141;

/// A command whose standard output is closed under it (`nasd ls -l / | head
/// -1`) stops at once and quietly, as `ls` does by SIGPIPE, instead of
/// panicking in `println!`. Rust ignores SIGPIPE so that a peer closing a
/// socket is an error, not death: restoring it would turn a manager or drive
/// hanging up into a silent exit, so the print's own failure is caught here.
fn stop_quietly_when_output_is_closed() {
    QUIET_ON_CLOSED_OUTPUT.store(true, std::sync::atomic::Ordering::Relaxed);
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // std's words for it: "failed printing to stdout: Broken pipe (os error 32)".
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        let broken_pipe = std::io::Error::from_raw_os_error(libc::EPIPE).to_string();
        if message.starts_with("failed printing to stdout") && message.ends_with(&broken_pipe) {
            std::process::exit(EXIT_OUTPUT_CLOSED);
        }
        default(info)
    }));
}

/// Set for a command (not a daemon): a closed standard output ends it
/// quietly, whether a `println!` or a write of its own (`nasd cat`) found it.
static QUIET_ON_CLOSED_OUTPUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The command failed because its standard output is a pipe nobody reads any
/// more: a broken pipe is among the causes, and stdout itself reports the
/// error condition (poll's POLLERR on a pipe with no reader). A connection
/// to a manager or drive broken the same way, with stdout still read, is
/// still reported.
fn output_closed(e: &anyhow::Error) -> bool {
    let broken_pipe = std::io::Error::from_raw_os_error(libc::EPIPE).to_string();
    let broken = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || c.to_string().ends_with(&broken_pipe)
    });
    let mut stdout = libc::pollfd { fd: libc::STDOUT_FILENO, events: libc::POLLOUT, revents: 0 };
    // SAFETY: one valid pollfd, no wait.
    let ready = unsafe { libc::poll(&mut stdout, 1, 0) };
    broken && ready == 1 && stdout.revents & libc::POLLERR != 0
}

/// `nasd auth` subcommands log in at the authentication server as the
/// top-level `--user` (or the configured user).
static AUTH_LOGIN: Login = Login { user: None };

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if QUIET_ON_CLOSED_OUTPUT.load(std::sync::atomic::Ordering::Relaxed) && output_closed(&e) => {
            std::process::ExitCode::from(EXIT_OUTPUT_CLOSED as u8)
        }
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

/// `fut` as the command's one user-level operation: one trace id (docs/PROTOCOL.md, "Trace
/// ids") on everything it asks the manager and the drives, and on its own log lines.
fn operation<F: std::future::Future>(op: &'static str, fut: F) -> impl std::future::Future<Output = F::Output> {
    nasd_client::trace::operation(&nasd_env::Env::real(), op, fut)
}

fn run() -> anyhow::Result<()> {
    // Colour only for a person at a terminal: a log file gets plain text.
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // The name of the command, for its operation's span.
    let op: &'static str = Box::leak(matches.subcommand_name().unwrap_or("nasd").to_string().into_boxed_str());

    // A command says what went wrong in its own words (and a successful one prints no log line:
    // what the library tells a daemon's log, such as a component that missed a write the manager
    // repairs, is no news to it); a daemon logs warnings.
    let default_level =
        if cli.command.is_daemon() { format!("warn,{}=info", nasd_fs::OUTAGE_LOG_TARGET) } else { "error".into() };
    if !cli.command.is_daemon() {
        stop_quietly_when_output_is_closed();
    }
    // Read before logging starts, which it configures (a file that does not parse is an error
    // printed as any other).
    let (file, _) = match (&cli.command, cli.config.as_deref()) {
        // `nasd up` writes DATA/nasd.toml at its first start: named before it exists (as the
        // banner's `export NASD_CONFIG=…` line leads one to do), it says where DATA is.
        (Command::Up(_), Some(named)) if !named.exists() => (config::for_first_up(named)?, None),
        (_, named) => config::find(named)?,
    };
    // Daemons: warnings, and the end of a manager outage a mount logged the start of.
    let filter = tracing_subscriber::EnvFilter::try_from_env("NASD_LOG").unwrap_or_else(|_| default_level.into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format.or(file.log.format).unwrap_or_default() {
        config::LogFormat::Text => logs.with_ansi(colour).init(),
        config::LogFormat::Json => logs.json().with_current_span(true).with_span_list(true).init(),
    }
    let user = match (cli.command.login(), cli.user) {
        (Some(login), top) => top.or(login.user.clone()),
        (None, Some(_)) => anyhow::bail!("--user is for commands that log in to the manager; this one does not"),
        (None, None) => None,
    };
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let login = || async { fs_cmd::login(&file.client, user.as_deref()).await };
    match cli.command {
        Command::Up(args) => rt.block_on(daemons::up(args, file)),
        Command::Manager(args) => rt.block_on(daemons::run_manager(args, file.manager, file.metrics)),
        Command::Drive(args) => rt.block_on(daemons::run_drive(args, file.drive, file.metrics)),
        Command::Auth(auth_cmd::AuthArgs {
            command: Some(auth_cmd::AuthCommand::Migrate { data, metadata }), ..
        }) => rt.block_on(auth_cmd::migrate(data, metadata, &file.auth, &file.manager)),
        Command::Auth(auth_cmd::AuthArgs { command: Some(cmd), .. }) => {
            rt.block_on(auth_cmd::run(&file.client, user.as_deref(), cmd))
        }
        Command::Auth(args) => rt.block_on(auth_cmd::run_daemon(args, file.auth, file.metrics)),
        Command::Fs(cmd) => rt.block_on(operation(op, async { fs_cmd::run(&login().await?, cmd).await })),
        // A mount runs for weeks: it renews its identity (the password stays in its memory).
        Command::Mount(args) => rt.block_on(async {
            // A mount point refused before a password is asked for.
            mount_cmd::check(&args)?;
            let fs = fs_cmd::login_renewing(&file.client, user.as_deref()).await?;
            mount_cmd::run(fs, args, &file.mount, &file.metrics).await
        }),
        Command::S3(args) => rt.block_on(async {
            let fs = fs_cmd::login_renewing(&file.client, user.as_deref()).await?;
            s3_cmd::run(fs, args, &file.s3, &file.metrics).await
        }),
        Command::Nfs(args) => rt.block_on(async {
            let fs = fs_cmd::login_renewing(&file.client, user.as_deref()).await?;
            nfs_cmd::run(fs, args, &file.nfs, &file.metrics).await
        }),
        Command::S3Key(cmd) => {
            rt.block_on(async { s3_cmd::run_key(&login().await?, &file.client, cmd, &file.s3).await })
        }
        Command::Layout(cmd) => rt.block_on(operation(op, async { cluster_cmd::layout(&login().await?, cmd).await })),
        Command::Acl(cmd) => rt.block_on(operation(op, async { acl_cmd::run(&login().await?, cmd).await })),
        Command::Status { .. } => rt.block_on(operation(op, async { cluster_cmd::status(&login().await?).await })),
        Command::Repair(args) => rt.block_on(operation(op, async { cluster_cmd::repair(&login().await?, args).await })),
        Command::Admin(fs_cmd::AdminCommand::ResetPassword { name, data, metadata, password_file }) => {
            let metadata = daemons::metadata_location(metadata.as_deref(), &file.manager)?;
            daemons::reset_password(&name, data.or(file.manager.data), metadata.as_ref(), password_file)
        }
        Command::Admin(fs_cmd::AdminCommand::JoinBundle { out, data, metadata, auth_data }) => {
            daemons::write_join_bundle(
                &out,
                data.or(file.manager.data),
                metadata.or(file.manager.metadata),
                auth_data.or(file.auth.data),
            )
        }
        // Linked to an authentication server, the manager refuses these: say so before logging in
        // and asking for a password it would not take.
        Command::Admin(fs_cmd::AdminCommand::AddUser { .. }) if file.client.auth.is_some() => {
            anyhow::bail!("{}", nasd_manager::ADD_USER_AT_AUTH_SERVER)
        }
        Command::Admin(fs_cmd::AdminCommand::Passwd { .. }) if file.client.auth.is_some() => {
            anyhow::bail!("{}", nasd_manager::PASSWORDS_AT_AUTH_SERVER)
        }
        Command::Admin(cmd) => rt.block_on(operation(op, async { fs_cmd::run_admin(&login().await?, cmd).await })),
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
            let drives = drive_admin::resolve(drive.as_deref(), &file)?;
            rt.block_on(drive_admin::audit(&drives, drive_key_file, after, max))
        }
        Command::Scrub { drive: None, .. } => rt.block_on(async { cluster_cmd::scrub_all(&login().await?).await }),
        Command::Scrub { drive: Some(drive), drive_key_file, .. } => {
            let drive = drive_admin::resolve_one(Some(&drive), &file)?;
            rt.block_on(drive_admin::scrub(&drive, drive_key_file))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{error_text, Cli};
    use clap::CommandFactory;

    /// Every command of `nasd`, with its path (`nasd admin add-user`), built
    /// as `--help` shows it.
    fn every_command() -> Vec<(String, clap::Command)> {
        fn walk(path: String, cmd: &clap::Command, out: &mut Vec<(String, clap::Command)>) {
            for sub in cmd.get_subcommands() {
                walk(format!("{path} {}", sub.get_name()), sub, out);
            }
            out.push((path, cmd.clone()));
        }
        let mut cli = Cli::command();
        cli.build();
        let mut out = Vec::new();
        walk("nasd".into(), &cli, &mut out);
        out
    }

    /// An argument's whole help: the long one (a doc comment of several
    /// paragraphs; it starts with the short one) if it has one.
    fn help_text(arg: &clap::Arg) -> String {
        arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default()
    }

    /// clap's own consistency checks, on every command.
    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every positional argument of every command says what it is, and no
    /// option shows its default twice (once written in its help, once added
    /// by clap from its default value).
    #[test]
    fn every_positional_is_explained_and_every_default_shown_once() {
        let mut wrong = Vec::new();
        let commands = every_command();
        assert!(commands.len() > 60, "walked {} commands", commands.len());
        for (path, cmd) in &commands {
            for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                let help = help_text(arg);
                if arg.is_positional() && help.trim().is_empty() {
                    wrong.push(format!("{path}: <{}> has no help", arg.get_id()));
                }
                let written = help.matches("[default").count();
                let added = usize::from(!arg.get_default_values().is_empty() && !arg.is_hide_default_value_set());
                if written + added > 1 || help.lines().any(|l| l.matches("[default").count() > 1) {
                    wrong.push(format!("{path}: {} shows its default twice", arg.get_id()));
                }
            }
            // And as rendered: no line of --help carries two defaults.
            let rendered = cmd.clone().render_long_help().to_string();
            for line in rendered.lines().filter(|l| l.matches("[default").count() > 1) {
                wrong.push(format!("{path} --help: {line}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// `--user` is offered exactly where a command logs in to the manager or
    /// the authentication server, never on daemons or drive tools.
    #[test]
    fn user_is_offered_only_where_a_command_logs_in() {
        let takes_user =
            |cmd: &clap::Command| cmd.get_arguments().any(|a| !a.is_hide_set() && a.get_long() == Some("user"));
        let commands = every_command();
        let find =
            |path: &str| &commands.iter().find(|(p, _)| p == path).unwrap_or_else(|| panic!("no command {path}")).1;
        for path in [
            "nasd up",
            "nasd manager",
            "nasd drive",
            "nasd auth",
            "nasd inquiry",
            "nasd set-drive-key",
            "nasd audit",
            "nasd admin reset-password",
            "nasd bench",
        ] {
            assert!(!takes_user(find(path)), "{path} offers --user");
        }
        for path in ["nasd ls", "nasd put", "nasd get", "nasd status", "nasd scrub", "nasd repair", "nasd mount"] {
            assert!(takes_user(find(path)), "{path} does not offer --user");
        }
        for (path, cmd) in commands.iter().filter(|(p, _)| p.starts_with("nasd bench ")) {
            assert!(!takes_user(cmd), "{path} offers --user");
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        // An error whose message quotes its source (thiserror's `#[from]`) under a context.
        let io = std::io::Error::from_raw_os_error(21);
        let e = anyhow::Error::new(nasd_fs::FsError::Io(io)).context("cannot create /docs/x");
        let text = error_text(&e);
        assert_eq!(text, "cannot create /docs/x: connection to the manager failed: Is a directory (os error 21)");
        // Causes that add something are all kept, in order.
        let e = anyhow::anyhow!("no space left on drive 2").context("cannot write /docs/big").context("put big");
        assert_eq!(error_text(&e), "put big: cannot write /docs/big: no space left on drive 2");
    }
}
