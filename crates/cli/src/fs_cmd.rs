//! User and administrator commands: they log in to the manager named in the
//! `[client]` section and move file data straight to and from the drives.

use crate::config::ClientSection;
use crate::size;
use anyhow::Context;
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};
use nasd_fs::{FileKind, FsClient, FsConfig, FsError, FsStatus};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Files at least this large get a progress bar (on a terminal).
const PROGRESS_MIN_BYTES: u64 = 4 * 1024 * 1024;

/// Prefix that marks a path in nasd (rather than on this machine) in `cp`.
const REMOTE_PREFIX: &str = "nasd:";

#[derive(Subcommand)]
pub enum FsCommand {
    /// List a directory (or describe a file).
    Ls {
        /// Long format: mode, links, owner, group, size, time.
        #[arg(short, long)]
        long: bool,
        /// Paths in nasd [default: /].
        paths: Vec<String>,
    },
    /// Create directories.
    Mkdir {
        /// Create missing parents too; existing directories are fine.
        #[arg(short, long)]
        parents: bool,
        /// Permission bits, octal.
        #[arg(long, default_value = "755")]
        mode: String,
        /// Paths in nasd.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Copy a local file into nasd (REMOTE may be a directory).
    Put { local: PathBuf, remote: String },
    /// Copy a file out of nasd (LOCAL may be a directory; default: current directory).
    Get { remote: String, local: Option<PathBuf> },
    /// Copy files; paths in nasd start with `nasd:` (e.g. nasd cp big.iso nasd:/data/).
    Cp { source: String, destination: String },
    /// Print files to standard output.
    Cat {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Remove files (and with -r, directories and everything under them).
    Rm {
        /// Remove directories and their contents.
        #[arg(short, long)]
        recursive: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Remove empty directories.
    Rmdir {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Rename or move (atomically; replaces an existing target).
    Mv { source: String, destination: String },
    /// Make a link: hard by default, symbolic with -s.
    Ln {
        /// Symbolic link.
        #[arg(short, long)]
        symbolic: bool,
        target: String,
        link: String,
    },
    /// Show a file's attributes (size and times from its drive).
    Stat { path: String },
    /// Change permission bits (octal, e.g. 640).
    Chmod { mode: String, path: String },
    /// Change owner and/or group: UID, UID:GID, :GID, or user names (administrators).
    Chown { owner: String, path: String },
    /// Space on every drive and what the file system holds.
    Df,
    /// Show a quota (your own uid's by default; --uid or --dir for another),
    /// or, with --bytes or --files, set it (administrators; `none` removes a
    /// limit, both `none` the quota). Over a quota, writes fail with EDQUOT.
    Quota {
        /// The quota of this uid.
        #[arg(long, conflicts_with = "dir")]
        uid: Option<u32>,
        /// The quota of this directory's tree (a path in nasd).
        #[arg(long)]
        dir: Option<String>,
        /// Set the byte limit: a size (10GiB, 500M, 4096) or `none`.
        #[arg(long, value_parser = parse_byte_limit)]
        bytes: Option<Limit>,
        /// Set the inode limit: a count or `none`.
        #[arg(long, value_parser = parse_count_limit)]
        files: Option<Limit>,
    },
}

/// A quota limit given on the command line: a value or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(Option<u64>);

fn parse_byte_limit(s: &str) -> Result<Limit, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Limit(None));
    }
    crate::size::parse_size(s).map(|v| Limit(Some(v)))
}

fn parse_count_limit(s: &str) -> Result<Limit, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Limit(None));
    }
    s.trim().parse::<u64>().map(|v| Limit(Some(v))).map_err(|e| format!("'{s}' is not a count: {e}"))
}

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Create a user; the password is read from $NASD_NEW_PASSWORD or asked for.
    AddUser {
        name: String,
        /// User id [default: next free from 1000].
        #[arg(long, default_value_t = 0)]
        uid: u32,
        /// Group id [default: the uid].
        #[arg(long, default_value_t = 0)]
        gid: u32,
        /// May run administrator commands.
        #[arg(long)]
        admin: bool,
        /// Supplementary group ids (comma-separated or repeated; at most 32).
        #[arg(long, value_delimiter = ',')]
        groups: Vec<u32>,
    },
    /// Replace a user's supplementary groups (none given: no supplementary
    /// groups). Open sessions of the user use them from their next request.
    SetGroups {
        name: String,
        /// Group ids (at most 32).
        groups: Vec<u32>,
    },
    /// Let a user act as a gateway (a POSIX mount serving many local users,
    /// `nasd mount --map-users`) for the local users whose uid and groups
    /// all lie in IDS, without their passwords; or no longer (--none).
    SetGateway {
        name: String,
        /// Inclusive id range FIRST-LAST (e.g. 1000-60000; 0-4294967295:
        /// every id, root included).
        #[arg(long, value_parser = parse_id_range, required_unless_present = "none", conflicts_with = "none")]
        ids: Option<(u32, u32)>,
        /// Take the grant away.
        #[arg(long)]
        none: bool,
    },
    /// List users.
    Users,
    /// Change a password (yours, or anyone's as administrator).
    Passwd { name: Option<String> },
    /// Set a user's password directly in the manager's metadata, without
    /// logging in (when no administrator can: the admin password was lost).
    /// Run it where the manager's data is, with the manager stopped. The new
    /// password is $NASD_NEW_PASSWORD, or else a random one written to
    /// --password-file.
    ResetPassword {
        name: String,
        /// The manager's data directory (for `nasd up`, DATA/manager)
        /// [default: [manager] data from the config file].
        #[arg(long)]
        data: Option<PathBuf>,
        /// Where to write the new password (0600) [default: DATA/NAME.password,
        /// for admin the file `nasd up` and `nasd manager` use].
        #[arg(long)]
        password_file: Option<PathBuf>,
    },
    /// Take a drive out of service: nothing new goes to it and its
    /// components are rebuilt on other drives (to replace or retire it).
    DriveOut {
        /// The drive's number (see `nasd status`).
        drive: u32,
    },
    /// Put a drive taken out back into service.
    DriveIn {
        /// The drive's number (see `nasd status`).
        drive: u32,
    },
    /// Take a fresh drive into service with its master key.
    AddDrive {
        /// The drive's address (host:port).
        addr: String,
        /// File with the drive's master key (64 hex digits).
        #[arg(long)]
        master_key_file: PathBuf,
    },
}

/// Logs in with the `[client]` settings (overridable with `--user`).
pub async fn login(section: &ClientSection, user: Option<&str>) -> anyhow::Result<FsClient> {
    let hint = "run `nasd up` first, or point --config / $NASD_CONFIG at a config file with a [client] section";
    let manager = section.manager.clone().with_context(|| format!("no manager address configured: {hint}"))?;
    let ca_cert = section.ca_cert.clone().with_context(|| format!("no ca_cert configured: {hint}"))?;
    let user =
        user.map(str::to_string).or(section.user.clone()).context("no user: pass --user or set [client] user")?;
    let password = password_for(&user, section)?;
    let config = FsConfig {
        manager: manager.clone(),
        server_name: section.server_name.clone().unwrap_or_else(|| "localhost".into()),
        ca_cert,
        user: user.clone(),
        password,
        data_integrity: section.data_integrity.unwrap_or(true),
        reply_timeout: section.reply_timeout_secs.map_or(nasd_fs::WAIT_MAX, std::time::Duration::from_secs),
        ..Default::default()
    };
    FsClient::connect(&config).await.map_err(|e| match e.status() {
        Some(FsStatus::BadCredentials) => {
            anyhow::anyhow!("login as '{user}' at {manager} failed: wrong user or password")
        }
        _ => anyhow::anyhow!("{e}"),
    })
}

/// $NASD_PASSWORD, else the configured password file (only for the
/// configured user), else a prompt.
fn password_for(user: &str, section: &ClientSection) -> anyhow::Result<String> {
    if let Ok(p) = std::env::var("NASD_PASSWORD") {
        return Ok(p);
    }
    if let (Some(file), Some(configured)) = (&section.password_file, &section.user) {
        if configured == user {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read password file {}", file.display()))?;
            return Ok(text.trim_end_matches(['\n', '\r']).to_string());
        }
    }
    rpassword::prompt_password(format!("password for {user}: ")).context("cannot read a password (set NASD_PASSWORD)")
}

fn parse_mode(s: &str) -> anyhow::Result<u32> {
    let mode = u32::from_str_radix(s, 8).with_context(|| format!("mode '{s}' is not octal, e.g. 644"))?;
    anyhow::ensure!(mode <= 0o7777, "mode '{s}' is over 7777");
    Ok(mode)
}

/// Makes a nasd path absolute (relative paths are taken from the root).
fn abs(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    }
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

fn base_name(path: &str) -> anyhow::Result<&str> {
    path.trim_end_matches('/').rsplit('/').next().filter(|n| !n.is_empty()).context("path has no file name")
}

fn progress(len: u64, what: &str) -> ProgressBar {
    if len < PROGRESS_MIN_BYTES || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Runs one user command.
pub async fn run(fs: &FsClient, cmd: FsCommand) -> anyhow::Result<()> {
    match cmd {
        FsCommand::Ls { long, paths } => ls(fs, long, if paths.is_empty() { vec!["/".into()] } else { paths }).await,
        FsCommand::Mkdir { parents, mode, paths } => {
            let mode = parse_mode(&mode)?;
            for p in paths {
                let p = abs(&p);
                if parents { fs.mkdir_all(&p, mode).await } else { fs.mkdir(&p, mode).await.map(|_| ()) }
                    .with_context(|| format!("mkdir {p}"))?;
            }
            Ok(())
        }
        FsCommand::Put { local, remote } => put(fs, &local, &abs(&remote)).await,
        FsCommand::Get { remote, local } => get(fs, &abs(&remote), local.as_deref().unwrap_or(Path::new("."))).await,
        FsCommand::Cp { source, destination } => copy(fs, &source, &destination).await,
        FsCommand::Cat { paths } => {
            for p in paths {
                let p = abs(&p);
                let f = fs.open(&p, false).await.with_context(|| format!("cat {p}"))?;
                f.read_to(0, f.size(), &mut tokio::io::stdout()).await.with_context(|| format!("cat {p}"))?;
            }
            Ok(())
        }
        FsCommand::Rm { recursive, paths } => {
            for p in paths {
                let p = abs(&p);
                anyhow::ensure!(!p.trim_end_matches('/').is_empty(), "refusing to remove the root directory");
                remove(fs, &p, recursive).await.with_context(|| format!("rm {p}"))?;
            }
            Ok(())
        }
        FsCommand::Rmdir { paths } => {
            for p in paths {
                let p = abs(&p);
                fs.rmdir(&p).await.with_context(|| format!("rmdir {p}"))?;
            }
            Ok(())
        }
        FsCommand::Mv { source, destination } => mv(fs, &abs(&source), &abs(&destination)).await,
        FsCommand::Ln { symbolic, target, link } => {
            let link = abs(&link);
            if symbolic {
                fs.symlink(&target, &link).await.with_context(|| format!("ln -s {target} {link}"))?;
            } else {
                fs.link(&abs(&target), &link).await.with_context(|| format!("ln {target} {link}"))?;
            }
            Ok(())
        }
        FsCommand::Stat { path } => stat(fs, &abs(&path)).await,
        FsCommand::Chmod { mode, path } => {
            let path = abs(&path);
            fs.chmod(&path, parse_mode(&mode)?).await.with_context(|| format!("chmod {path}"))?;
            Ok(())
        }
        FsCommand::Chown { owner, path } => chown(fs, &owner, &abs(&path)).await,
        FsCommand::Df => df(fs).await,
        FsCommand::Quota { uid, dir, bytes, files } => quota(fs, uid, dir, bytes, files).await,
    }
}

fn mode_string(kind: FileKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::File => '-',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::CharDevice => 'c',
        FileKind::BlockDevice => 'b',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn time_string(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}", rem / 3600, rem % 3600 / 60)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (UTC).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// User and group names for the ids `ls -l` shows, as far as this caller
/// may learn them: every user for an administrator (`LIST_USERS`), else
/// only the caller itself (the manager protocol lists users to
/// administrators only). A group is named after the user whose private
/// group it is (gid = uid, the default `add-user` gives). Other ids stay
/// numbers.
#[derive(Debug, Default)]
struct IdNames {
    users: std::collections::HashMap<u32, String>,
    groups: std::collections::HashMap<u32, String>,
}

impl IdNames {
    async fn of(fs: &FsClient) -> IdNames {
        let me = fs.identity();
        let mut known = Vec::new();
        if me.admin {
            // Best effort: numbers if the list cannot be had.
            known = fs.users().await.unwrap_or_default().into_iter().map(|u| (u.name, u.uid, u.gid)).collect();
        }
        known.push((fs.user().to_string(), me.uid, me.gid));
        let mut names = IdNames::default();
        for (name, uid, gid) in known {
            if gid == uid {
                names.groups.insert(gid, name.clone());
            }
            names.users.insert(uid, name);
        }
        names
    }

    fn user(&self, uid: u32) -> String {
        self.users.get(&uid).cloned().unwrap_or_else(|| uid.to_string())
    }

    fn group(&self, gid: u32) -> String {
        self.groups.get(&gid).cloned().unwrap_or_else(|| gid.to_string())
    }
}

/// One `ls -l` line.
fn long_line(name: &str, a: &nasd_fs::FileAttr, names: &IdNames) -> String {
    format!(
        "{} {:>3} {:>8} {:>8} {:>10} {} {name}",
        mode_string(a.kind, a.mode),
        a.nlink,
        names.user(a.uid),
        names.group(a.gid),
        size::human(a.size),
        time_string(a.mtime_ns)
    )
}

async fn ls(fs: &FsClient, long: bool, paths: Vec<String>) -> anyhow::Result<()> {
    let many = paths.len() > 1;
    let names = if long { IdNames::of(fs).await } else { IdNames::default() };
    for p in paths {
        let p = abs(&p);
        let st = fs.lstat(&p).await.with_context(|| format!("ls {p}"))?;
        let entries: Vec<(String, FileKind, Option<nasd_fs::FileAttr>)> = if st.attr.kind == FileKind::Dir {
            list_dir(fs, &p).await.with_context(|| format!("ls {p}"))?
        } else {
            vec![(base_name(&p).unwrap_or("/").to_string(), st.attr.kind, Some(st.attr))]
        };
        if many {
            println!("{p}:");
        }
        for (name, kind, attr) in entries {
            let slash = if kind == FileKind::Dir { "/" } else { "" };
            match attr {
                Some(a) if long => println!("{}", long_line(&name, &a, &names)),
                // Without search permission on the directory only names and kinds are known.
                None if long => println!("?????????? ? ? ? ? ? {name}{slash}"),
                _ => println!("{name}{slash}"),
            }
        }
    }
    Ok(())
}

/// A directory's entries with their attributes, or (with read but no
/// search permission, as POSIX `ls` shows them) names and kinds only.
async fn list_dir(fs: &FsClient, path: &str) -> Result<Vec<(String, FileKind, Option<nasd_fs::FileAttr>)>, FsError> {
    match fs.readdir(path).await {
        Ok(entries) => Ok(entries.into_iter().map(|(n, a)| (n, a.kind, Some(a))).collect()),
        Err(e) if e.status() == Some(FsStatus::PermissionDenied) => {
            Ok(fs.names(path).await?.into_iter().map(|(n, kind)| (n, kind, None)).collect())
        }
        Err(e) => Err(e),
    }
}

/// The nasd path to write a copy of `name` to: into `dest` if it is a directory.
async fn target_path(fs: &FsClient, dest: &str, name: &str) -> anyhow::Result<String> {
    match fs.stat(dest).await {
        Ok(st) if st.attr.kind == FileKind::Dir => Ok(join(dest, name)),
        Ok(_) => Ok(dest.to_string()),
        Err(e) if e.status() == Some(FsStatus::NotFound) => Ok(dest.to_string()),
        Err(e) => Err(e.into()),
    }
}

async fn put(fs: &FsClient, local: &Path, remote: &str) -> anyhow::Result<()> {
    let name = local.file_name().and_then(|n| n.to_str()).context("local path has no file name")?;
    let remote = target_path(fs, remote, name).await?;
    let src = tokio::fs::File::open(local).await.with_context(|| format!("cannot open {}", local.display()))?;
    let len = src.metadata().await?.len();
    let bar = progress(len, name);
    let f = fs.create(&remote, 0o644, false, true).await.with_context(|| format!("cannot create {remote}"))?;
    let mut src = bar.wrap_async_read(tokio::io::BufReader::with_capacity(1 << 20, src));
    f.write_from(0, len, &mut src).await.with_context(|| format!("writing {remote}"))?;
    f.flush().await.with_context(|| format!("flushing {remote}"))?;
    f.close().await?;
    bar.finish_and_clear();
    Ok(())
}

async fn get(fs: &FsClient, remote: &str, local: &Path) -> anyhow::Result<()> {
    let name = base_name(remote)?;
    let local = if local.is_dir() { local.join(name) } else { local.to_path_buf() };
    let f = fs.open(remote, false).await.with_context(|| format!("cannot open {remote}"))?;
    let len = f.size();
    let bar = progress(len, name);
    let file = tokio::fs::File::create(&local).await.with_context(|| format!("cannot create {}", local.display()))?;
    let mut dst = bar.wrap_async_write(tokio::io::BufWriter::with_capacity(1 << 20, file.try_clone().await?));
    let got = f.read_to(0, len, &mut dst).await.with_context(|| format!("reading {remote}"))?;
    anyhow::ensure!(got == len, "{remote} shrank while being copied ({got} of {len} bytes)");
    file.sync_all().await?;
    bar.finish_and_clear();
    Ok(())
}

/// `nasd cp`: paths in nasd carry the `nasd:` prefix.
pub async fn copy(fs: &FsClient, source: &str, destination: &str) -> anyhow::Result<()> {
    match (source.strip_prefix(REMOTE_PREFIX), destination.strip_prefix(REMOTE_PREFIX)) {
        (None, Some(to)) => put(fs, Path::new(source), &abs(to)).await,
        (Some(from), None) => get(fs, &abs(from), Path::new(destination)).await,
        (Some(from), Some(to)) => copy_within(fs, from, to, progress).await,
        (None, None) => {
            anyhow::bail!("one side of `nasd cp` must be in nasd: prefix it with `nasd:` (nasd cp a.txt nasd:/docs/)")
        }
    }
}

/// `nasd cp nasd:FROM nasd:TO`, piece by piece, with the progress bar
/// `bar_for(length, name)` (as put and get have).
async fn copy_within(
    fs: &FsClient,
    from: &str,
    to: &str,
    bar_for: impl FnOnce(u64, &str) -> ProgressBar,
) -> anyhow::Result<()> {
    let (from, name) = (abs(from), base_name(from)?.to_string());
    let to = target_path(fs, &abs(to), &name).await?;
    let src = fs.open(&from, false).await.with_context(|| format!("cannot open {from}"))?;
    // Creating the destination truncates it: if it is the source, the data would be lost.
    match fs.walk(&to, nasd_fs::OpenMode::None).await {
        Ok(e) if e.attr.ino == src.ino() => anyhow::bail!("{from} and {to} are the same file"),
        _ => {}
    }
    let len = src.size();
    let bar = bar_for(len, &name);
    let dst = fs.create(&to, 0o644, false, true).await.with_context(|| format!("cannot create {to}"))?;
    let piece = nasd_fs::TRANSFER_PIECE_DEFAULT as u64;
    let mut at = 0;
    while at < len {
        let data = src.read_at(at, piece.min(len - at)).await?;
        anyhow::ensure!(!data.is_empty(), "{from} shrank while being copied");
        dst.write_at(at, &data).await?;
        at += data.len() as u64;
        bar.inc(data.len() as u64);
    }
    dst.flush().await?;
    dst.close().await?;
    bar.finish_and_clear();
    Ok(())
}

async fn remove(fs: &FsClient, path: &str, recursive: bool) -> Result<(), FsError> {
    let st = fs.lstat(path).await?;
    if st.attr.kind != FileKind::Dir {
        return fs.unlink(path).await;
    }
    if !recursive {
        return Err(FsError::Fs { status: FsStatus::IsDir, message: format!("{path} is a directory (use -r)") });
    }
    for (name, _) in fs.readdir(path).await? {
        Box::pin(remove(fs, &join(path, &name), true)).await?;
    }
    fs.rmdir(path).await
}

async fn mv(fs: &FsClient, source: &str, destination: &str) -> anyhow::Result<()> {
    let to = target_path(fs, destination, base_name(source)?).await?;
    fs.rename(source, &to).await.with_context(|| format!("mv {source} {to}"))?;
    Ok(())
}

async fn stat(fs: &FsClient, path: &str) -> anyhow::Result<()> {
    let st = fs.lstat(path).await.with_context(|| format!("stat {path}"))?;
    let a = &st.attr;
    println!("  path    {path}");
    println!(
        "  kind    {:?}{}",
        a.kind,
        if st.target.is_empty() { String::new() } else { format!(" -> {}", st.target) }
    );
    println!("  size    {} ({} bytes)", size::human(a.size), a.size);
    println!("  mode    {:04o} ({})", a.mode, mode_string(a.kind, a.mode));
    println!("  owner   uid {} gid {}", a.uid, a.gid);
    println!("  links   {}", a.nlink);
    println!("  inode   {}", a.ino);
    println!("  modify  {} UTC", time_string(a.mtime_ns));
    println!("  change  {} UTC", time_string(a.ctime_ns));
    Ok(())
}

/// A uid or gid: a number, or a user name (resolving names needs an administrator).
async fn resolve_id(fs: &FsClient, s: &str, group: bool) -> anyhow::Result<u32> {
    if let Ok(n) = s.parse() {
        return Ok(n);
    }
    let users = fs.users().await.with_context(|| format!("cannot resolve '{s}': use a number"))?;
    let u = users.iter().find(|u| u.name == s).with_context(|| format!("no user '{s}'"))?;
    Ok(if group { u.gid } else { u.uid })
}

async fn chown(fs: &FsClient, owner: &str, path: &str) -> anyhow::Result<()> {
    let (u, g) = owner.split_once(':').map_or((owner, None), |(u, g)| (u, Some(g)));
    let uid = if u.is_empty() { None } else { Some(resolve_id(fs, u, false).await?) };
    let gid = match g {
        Some(g) if !g.is_empty() => Some(resolve_id(fs, g, true).await?),
        _ => None,
    };
    anyhow::ensure!(uid.is_some() || gid.is_some(), "give an owner, owner:group or :group");
    fs.chown(path, uid, gid).await.with_context(|| format!("chown {owner} {path}"))?;
    Ok(())
}

async fn df(fs: &FsClient) -> anyhow::Result<()> {
    let (inodes, file_bytes, drives) = fs.statfs().await?;
    println!("{:>5}  {:<22} {:>10} {:>10} {:>10} {:>5}", "drive", "address", "size", "used", "avail", "use%");
    let (mut total, mut used) = (0u64, 0u64);
    for d in &drives {
        if !d.online {
            println!("{:>5}  {:<22} {:>10}", d.drive, d.addr, "offline");
            continue;
        }
        total += d.capacity_bytes;
        used += d.used_bytes;
        println!(
            "{:>5}  {:<22} {:>10} {:>10} {:>10} {:>4}%",
            d.drive,
            d.addr,
            size::human(d.capacity_bytes),
            size::human(d.used_bytes),
            size::human(d.capacity_bytes.saturating_sub(d.used_bytes)),
            (d.used_bytes * 100).checked_div(d.capacity_bytes).unwrap_or(0)
        );
    }
    println!(
        "{:>5}  {:<22} {:>10} {:>10} {:>10} {:>4}%",
        "all",
        format!("{} drives", drives.len()),
        size::human(total),
        size::human(used),
        size::human(total.saturating_sub(used)),
        (used * 100).checked_div(total).unwrap_or(0)
    );
    println!("{inodes} files and directories, {} in files", size::human(file_bytes));
    Ok(())
}

async fn quota(
    fs: &FsClient,
    uid: Option<u32>,
    dir: Option<String>,
    bytes: Option<Limit>,
    files: Option<Limit>,
) -> anyhow::Result<()> {
    let (of, what) = match &dir {
        Some(path) => {
            let path = abs(path);
            let handle = fs.walk(&path, nasd_fs::OpenMode::None).await.with_context(|| path.clone())?.handle();
            (nasd_fs::QuotaOf::Dir(handle), format!("directory {path}"))
        }
        None => {
            let uid = uid.unwrap_or(fs.identity().uid);
            (nasd_fs::QuotaOf::User(uid), format!("uid {uid}"))
        }
    };
    if bytes.is_some() || files.is_some() {
        let old = fs.quota(of).await.with_context(|| format!("cannot read the quota of {what}"))?;
        let keep = |given: Option<Limit>, old: Option<u64>| given.map_or(old, |l| l.0);
        let (b, f) = (keep(bytes, old.bytes_limit), keep(files, old.files_limit));
        fs.set_quota(of, b, f).await.with_context(|| format!("cannot set the quota of {what}"))?;
    }
    let q = fs.quota(of).await.with_context(|| format!("cannot read the quota of {what}"))?;
    if !q.exists {
        println!("{what}: no quota");
        return Ok(());
    }
    let limit = |l: Option<u64>, show: fn(u64) -> String| l.map_or("no limit".to_string(), show);
    println!(
        "{what}: bytes {} of {} ({} in write escrow), inodes {} of {}",
        crate::size::human(q.bytes_used),
        limit(q.bytes_limit, crate::size::human),
        crate::size::human(q.escrow),
        q.files_used,
        limit(q.files_limit, |v| v.to_string())
    );
    Ok(())
}

/// Parses an inclusive id range `FIRST-LAST`.
fn parse_id_range(s: &str) -> Result<(u32, u32), String> {
    let (lo, hi) = s.split_once('-').ok_or("an id range is FIRST-LAST, e.g. 1000-60000")?;
    let parse = |v: &str| v.trim().parse::<u32>().map_err(|e| format!("'{v}' is not an id: {e}"));
    let (lo, hi) = (parse(lo)?, parse(hi)?);
    if lo > hi {
        return Err(format!("the range {lo}-{hi} runs backwards"));
    }
    Ok((lo, hi))
}

/// Runs one administrator command.
pub async fn run_admin(fs: &FsClient, cmd: AdminCommand) -> anyhow::Result<()> {
    match cmd {
        AdminCommand::AddUser { name, uid, gid, admin, groups } => {
            let password = new_password(&name)?;
            fs.add_user_in_groups(&name, &password, uid, gid, &groups, admin)
                .await
                .with_context(|| format!("cannot add user {name}"))?;
            println!("user {name} added");
        }
        AdminCommand::SetGroups { name, groups } => {
            fs.set_user_groups(&name, &groups).await.with_context(|| format!("cannot set the groups of {name}"))?;
            println!("groups of {name} set");
        }
        AdminCommand::SetGateway { name, ids, none: _ } => {
            fs.set_gateway(&name, ids).await.with_context(|| format!("cannot set the gateway grant of {name}"))?;
            match ids {
                Some((lo, hi)) => println!("{name} may act for ids {lo}-{hi}"),
                None => println!("{name} is no longer a gateway"),
            }
        }
        AdminCommand::Users => {
            println!("{:<20} {:>8} {:>8}  {:<5}  {:<23}  groups", "name", "uid", "gid", "admin", "gateway for");
            for u in fs.users().await? {
                let groups = u.groups.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
                let gateway = u.gateway.map(|(lo, hi)| format!("{lo}-{hi}")).unwrap_or_default();
                let admin = if u.admin { "yes" } else { "" };
                println!("{:<20} {:>8} {:>8}  {admin:<5}  {gateway:<23}  {groups}", u.name, u.uid, u.gid);
            }
        }
        AdminCommand::Passwd { name } => {
            let name = name.unwrap_or_else(|| fs.user().to_string());
            let password = new_password(&name)?;
            fs.set_password(&name, &password).await.with_context(|| format!("cannot change the password of {name}"))?;
            println!("password of {name} changed");
        }
        AdminCommand::ResetPassword { .. } => {
            anyhow::bail!("reset-password works on the manager's data directly, without logging in")
        }
        AdminCommand::DriveOut { drive } => {
            crate::cluster_cmd::drive_state(fs, drive, nasd_fs::DriveState::Out).await?;
        }
        AdminCommand::DriveIn { drive } => {
            crate::cluster_cmd::drive_state(fs, drive, nasd_fs::DriveState::In).await?;
        }
        AdminCommand::AddDrive { addr, master_key_file } => {
            let key = nasd_crypto::read_key_file(&master_key_file)?;
            let drive = fs.add_drive(&addr, &key).await.with_context(|| format!("cannot add the drive at {addr}"))?;
            println!("drive {addr} in service as drive {drive}");
        }
    }
    Ok(())
}

/// $NASD_NEW_PASSWORD, else asked twice.
fn new_password(name: &str) -> anyhow::Result<String> {
    if let Ok(p) = std::env::var("NASD_NEW_PASSWORD") {
        return Ok(p);
    }
    let p = rpassword::prompt_password(format!("new password for {name}: "))?;
    let again = rpassword::prompt_password("again: ")?;
    anyhow::ensure!(p == again, "the passwords differ");
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_limits_parse() {
        assert_eq!(parse_byte_limit("10GiB"), Ok(Limit(Some(10 << 30))));
        assert_eq!(parse_byte_limit("none"), Ok(Limit(None)));
        assert_eq!(parse_count_limit("NONE"), Ok(Limit(None)));
        assert_eq!(parse_count_limit("5000"), Ok(Limit(Some(5000))));
        assert!(parse_count_limit("5k").unwrap_err().contains("not a count"));
        assert!(parse_byte_limit("lots").is_err());
    }

    #[test]
    fn id_ranges_parse_or_say_why_not() {
        assert_eq!(parse_id_range("1000-60000"), Ok((1000, 60000)));
        assert_eq!(parse_id_range("0-4294967295"), Ok((0, u32::MAX)));
        assert_eq!(parse_id_range("7-7"), Ok((7, 7)));
        assert!(parse_id_range("9-8").unwrap_err().contains("backwards"));
        assert!(parse_id_range("1000").unwrap_err().contains("FIRST-LAST"));
        assert!(parse_id_range("a-9").unwrap_err().contains("not an id"));
        assert!(parse_id_range("1-4294967296").unwrap_err().contains("not an id"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cp_refuses_to_copy_a_file_onto_itself() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = crate::daemons::LocalCluster::start(dir.path(), 1, 64 << 20).await.unwrap();
        let fs = login(&cluster.client, None).await.unwrap();
        fs.mkdir("/d", 0o755).await.unwrap();
        fs.write_file("/d/a", b"precious").await.unwrap();
        fs.link("/d/a", "/d/hard").await.unwrap();
        for to in ["nasd:/d/a", "nasd:/d", "nasd:/d/", "nasd:/d/hard"] {
            let e = copy(&fs, "nasd:/d/a", to).await.expect_err(to);
            assert!(e.to_string().contains("are the same file"), "{to}: {e:#}");
            assert_eq!(fs.read_file("/d/a").await.unwrap(), b"precious", "cp nasd:/d/a {to} kept the data");
        }
        copy(&fs, "nasd:/d/a", "nasd:/d/b").await.expect("a copy to another file");
        assert_eq!(fs.read_file("/d/b").await.unwrap(), b"precious");

        // Within nasd, cp shows progress like put and get: the bar counts every byte.
        let big = vec![7u8; 3 * nasd_fs::TRANSFER_PIECE_DEFAULT / 2];
        fs.write_file("/d/big", &big).await.unwrap();
        let shown = std::sync::Arc::new(std::sync::Mutex::new(None));
        let keep = shown.clone();
        copy_within(&fs, "/d/big", "/d/big2", move |len, name| {
            let bar = ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::hidden());
            bar.set_message(name.to_string());
            *keep.lock().unwrap() = Some(bar.clone());
            bar
        })
        .await
        .unwrap();
        let bar = shown.lock().unwrap().take().expect("cp made a progress bar");
        assert_eq!((bar.position(), bar.length()), (big.len() as u64, Some(big.len() as u64)));
        assert_eq!(bar.message(), "big");
        assert!(fs.read_file("/d/big2").await.unwrap() == big);
        drop(fs);
        cluster.stop().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ls_long_shows_the_user_names_the_caller_may_know() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = crate::daemons::LocalCluster::start(dir.path(), 1, 64 << 20).await.unwrap();
        let admin = login(&cluster.client, None).await.unwrap();
        admin.add_user("alice", "alice password", 1000, 0, false).await.unwrap();
        admin.add_user("bob", "bob password", 1001, 500, false).await.unwrap();
        admin.write_file("/a", b"x").await.unwrap();
        admin.chown("/a", Some(1000), Some(1000)).await.unwrap();
        admin.write_file("/b", b"x").await.unwrap();
        admin.chown("/b", Some(1001), Some(500)).await.unwrap();
        admin.write_file("/r", b"x").await.unwrap();
        let attr = |path: &'static str| {
            let fs = admin.clone();
            async move { fs.lstat(path).await.unwrap().attr }
        };
        let (a, b, r) = (attr("/a").await, attr("/b").await, attr("/r").await);

        // An administrator knows every user; a group is named when it is a user's own.
        let names = IdNames::of(&admin).await;
        assert!(long_line("a", &a, &names).contains(" alice    alice "), "{}", long_line("a", &a, &names));
        assert!(long_line("b", &b, &names).contains(" bob      500 "), "{}", long_line("b", &b, &names));
        assert!(long_line("r", &r, &names).contains(" admin "), "{}", long_line("r", &r, &names));

        // Another user knows only itself (LIST_USERS is for administrators).
        let config = nasd_fs::FsConfig {
            manager: cluster.client.manager.clone().unwrap(),
            ca_cert: cluster.client.ca_cert.clone().unwrap(),
            user: "alice".into(),
            password: "alice password".into(),
            ..Default::default()
        };
        let alice = FsClient::connect(&config).await.unwrap();
        let names = IdNames::of(&alice).await;
        assert!(long_line("a", &a, &names).contains(" alice    alice "), "{}", long_line("a", &a, &names));
        assert!(long_line("b", &b, &names).contains(" 1001      500 "), "{}", long_line("b", &b, &names));
        assert!(long_line("r", &r, &names).contains("        0        0 "), "{}", long_line("r", &r, &names));
        drop((admin, alice));
        cluster.stop().await.unwrap();
    }

    #[test]
    fn dates_and_modes_print_like_ls() {
        assert_eq!(time_string(0), "1970-01-01 00:00");
        assert_eq!(time_string(1_700_000_000 * 1_000_000_000), "2023-11-14 22:13");
        assert_eq!(time_string(951_782_400 * 1_000_000_000), "2000-02-29 00:00");
        assert_eq!(mode_string(FileKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(FileKind::File, 0o640), "-rw-r-----");
        assert_eq!(parse_mode("644").unwrap(), 0o644);
        assert!(parse_mode("9").is_err() && parse_mode("17777").is_err());
    }
}
