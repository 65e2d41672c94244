//! User and administrator commands: they log in to the manager named in the
//! `[client]` section and move file data straight to and from the drives.

use crate::config::ClientSection;
use crate::size;
use crate::transfer::{self, CopyOptions, Loc};
use anyhow::Context;
use clap::Subcommand;
use nasd_fs::{FileKind, FsClient, FsError, FsStatus};
use std::path::PathBuf;

/// Prefix that marks a path in nasd (rather than on this machine) in `cp`.
const REMOTE_PREFIX: &str = "nasd:";

/// How a command logs in to the manager: every command that does takes `--user`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Login {
    /// Log in as this user instead of the configured one (password from
    /// $NASD_PASSWORD, else asked for).
    #[arg(long, env = "NASD_USER", value_name = "NAME")]
    pub user: Option<String>,
}

#[derive(Subcommand)]
pub enum FsCommand {
    /// List a directory (or describe a file).
    Ls {
        /// Long format: mode, links, owner, group, size, time.
        #[arg(short, long)]
        long: bool,
        /// Paths in nasd [default: /].
        paths: Vec<String>,
        #[command(flatten)]
        login: Login,
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
        #[command(flatten)]
        login: Login,
    },
    /// Copy a local file (or with -r a directory tree) into nasd.
    ///
    /// REMOTE may be a directory: the copy goes into it under its own name.
    /// A trailing slash (`/docs/`) says REMOTE is a directory that must exist.
    /// An existing file is replaced whole, keeping its permission bits; a
    /// failed or interrupted copy leaves nothing behind.
    Put {
        /// Copy a directory and everything under it.
        #[arg(short, long)]
        recursive: bool,
        /// Never replace an existing file (it is named on stderr and left
        /// alone); without -n it is replaced whole.
        #[arg(short, long)]
        no_clobber: bool,
        /// The file or directory on this machine.
        local: PathBuf,
        /// Where in nasd: a file, or a directory to copy into.
        remote: String,
        #[command(flatten)]
        login: Login,
    },
    /// Copy a file (or with -r a directory tree) out of nasd.
    ///
    /// LOCAL may be a directory: the copy goes into it under its own name.
    /// A trailing slash says LOCAL is a directory that must exist. An existing
    /// file is replaced whole, keeping its permission bits; a failed or
    /// interrupted copy leaves nothing behind.
    Get {
        /// Copy a directory and everything under it.
        #[arg(short, long)]
        recursive: bool,
        /// Never replace an existing file (it is named on stderr and left
        /// alone); without -n it is replaced whole.
        #[arg(short, long)]
        no_clobber: bool,
        /// The file or directory in nasd.
        remote: String,
        /// Where on this machine: a file, or a directory to copy into [default: .].
        local: Option<PathBuf>,
        #[command(flatten)]
        login: Login,
    },
    /// Copy files; paths in nasd start with `nasd:` (e.g. nasd cp big.iso nasd:/data/).
    ///
    /// Into, out of or within nasd, as put and get do (-r for trees, a
    /// trailing slash for a directory that must exist). An existing file is
    /// replaced whole (-n leaves it alone); a failed or interrupted copy
    /// leaves nothing behind.
    Cp {
        /// Copy a directory and everything under it.
        #[arg(short, long)]
        recursive: bool,
        /// Never replace an existing file (it is named on stderr and left
        /// alone); without -n it is replaced whole.
        #[arg(short, long)]
        no_clobber: bool,
        /// What to copy: a local path, or nasd:PATH.
        source: String,
        /// Where to: a local path, or nasd:PATH (a directory to copy into, or a file).
        destination: String,
        #[command(flatten)]
        login: Login,
    },
    /// Print files to standard output.
    Cat {
        /// Print only these reads of the one file, in order: READS lists
        /// one `OFFSET LENGTH` per line (sizes like 4KiB allowed; `-` is
        /// standard input). They are sent to the drives first as hints, so
        /// the drives read them from disk ahead (informed prefetching).
        #[arg(long, value_name = "READS")]
        reads: Option<std::path::PathBuf>,
        /// Files in nasd.
        #[arg(required = true)]
        paths: Vec<String>,
        #[command(flatten)]
        login: Login,
    },
    /// Remove files (and with -r, directories and everything under them).
    Rm {
        /// Remove directories and their contents.
        #[arg(short, long)]
        recursive: bool,
        /// Paths in nasd.
        #[arg(required = true)]
        paths: Vec<String>,
        #[command(flatten)]
        login: Login,
    },
    /// Remove empty directories.
    Rmdir {
        /// Directories in nasd.
        #[arg(required = true)]
        paths: Vec<String>,
        #[command(flatten)]
        login: Login,
    },
    /// Rename or move (atomically; replaces an existing target).
    Mv {
        /// What to move, in nasd.
        source: String,
        /// The new name, or a directory to move into (a trailing slash: one that must exist).
        destination: String,
        #[command(flatten)]
        login: Login,
    },
    /// Make a link: hard by default, symbolic with -s.
    Ln {
        /// Symbolic link.
        #[arg(short, long)]
        symbolic: bool,
        /// What the link points to (for a hard link, an existing file in nasd).
        target: String,
        /// The new link's path in nasd.
        link: String,
        #[command(flatten)]
        login: Login,
    },
    /// Show a file's attributes (as the manager records them, like `ls -l`).
    Stat {
        /// A path in nasd.
        path: String,
        #[command(flatten)]
        login: Login,
    },
    /// Change permission bits (octal, e.g. 640).
    Chmod {
        /// Permission bits, octal (e.g. 640).
        mode: String,
        /// A path in nasd.
        path: String,
        #[command(flatten)]
        login: Login,
    },
    /// Change owner and/or group: UID, UID:GID, :GID, or user names (administrators).
    Chown {
        /// OWNER, OWNER:GROUP or :GROUP; numbers or user names.
        owner: String,
        /// A path in nasd.
        path: String,
        #[command(flatten)]
        login: Login,
    },
    /// Space on every drive and what the file system holds.
    Df {
        #[command(flatten)]
        login: Login,
    },
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
        #[command(flatten)]
        login: Login,
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

impl FsCommand {
    /// How this command logs in.
    pub fn login(&self) -> &Login {
        use FsCommand::*;
        match self {
            Ls { login, .. } | Mkdir { login, .. } | Put { login, .. } | Get { login, .. } | Cp { login, .. } => login,
            Cat { login, .. } | Rm { login, .. } | Rmdir { login, .. } | Mv { login, .. } | Ln { login, .. } => login,
            Stat { login, .. } | Chmod { login, .. } | Chown { login, .. } | Df { login } => login,
            Quota { login, .. } => login,
        }
    }
}

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Create a user; the password is read from $NASD_NEW_PASSWORD or asked for.
    AddUser {
        /// The new user's name.
        name: String,
        /// User id [default: the next free one from 1000].
        #[arg(long)]
        uid: Option<u32>,
        /// Group id [default: the uid].
        #[arg(long)]
        gid: Option<u32>,
        /// May run administrator commands.
        #[arg(long)]
        admin: bool,
        /// Supplementary group ids (comma-separated or repeated; at most 32).
        #[arg(long, value_delimiter = ',')]
        groups: Vec<u32>,
        #[command(flatten)]
        login: Login,
    },
    /// Replace a user's supplementary groups (none given: no supplementary
    /// groups). Open sessions of the user use them from their next request.
    SetGroups {
        /// Whose groups.
        name: String,
        /// Group ids (at most 32).
        groups: Vec<u32>,
        #[command(flatten)]
        login: Login,
    },
    /// Let a user act as a gateway (a POSIX mount serving many local users,
    /// `nasd mount --map-users`) for the local users whose uid and groups
    /// all lie in IDS, without their passwords; or no longer (--none).
    SetGateway {
        /// The gateway's user name.
        name: String,
        /// Inclusive id range FIRST-LAST (e.g. 1000-60000; 0-4294967295:
        /// every id, root included).
        #[arg(long, value_parser = parse_id_range, required_unless_present = "none", conflicts_with = "none")]
        ids: Option<(u32, u32)>,
        /// Take the grant away.
        #[arg(long)]
        none: bool,
        #[command(flatten)]
        login: Login,
    },
    /// List users.
    Users {
        #[command(flatten)]
        login: Login,
    },
    /// Change a password (yours, or anyone's as administrator).
    Passwd {
        /// Whose password [default: yours].
        name: Option<String>,
        #[command(flatten)]
        login: Login,
    },
    /// Set a user's password directly in the manager's metadata, without
    /// logging in (when no administrator can: the admin password was lost).
    /// Run it where the manager's data is, with the manager stopped. The new
    /// password is $NASD_NEW_PASSWORD, or else a random one written to
    /// --password-file.
    ResetPassword {
        /// Whose password.
        name: String,
        /// The manager's data directory (for `nasd up`, DATA/manager)
        /// [default: [manager] data from the config file].
        #[arg(long)]
        data: Option<PathBuf>,
        /// Where the manager's metadata is, if not in DATA: sqlite:PATH or
        /// postgres://USER@HOST[:PORT]/DB [default: [manager] metadata from
        /// the config file, else DATA/meta.sqlite].
        #[arg(long)]
        metadata: Option<String>,
        /// Where to write the new password (0600) [default: DATA/NAME.password,
        /// for admin the file `nasd up` and `nasd manager` use].
        #[arg(long)]
        password_file: Option<PathBuf>,
    },
    /// Write the bundle another manager joins this one's database with
    /// (`nasd manager --join FILE`): this manager's key, the cluster CA (its
    /// certificate and key, so the new manager issues itself a certificate
    /// clients trust) and the metadata location without a password; with
    /// the authentication server's auth.key too when its state is in that
    /// database (`nasd auth --join FILE` starts another one on it). Run it
    /// where the manager's data is; no login. The file is a secret (0600):
    /// copy it to the new machine, use it once, delete it.
    JoinBundle {
        /// The file to write (must not exist).
        out: PathBuf,
        /// The manager's data directory (for `nasd up`, DATA/manager)
        /// [default: [manager] data from the config file].
        #[arg(long)]
        data: Option<PathBuf>,
        /// The metadata the new manager uses: postgres://USER@HOST[:PORT]/DB
        /// [default: [manager] metadata from the config file].
        #[arg(long)]
        metadata: Option<String>,
        /// The authentication server's data directory, whose auth.key the
        /// bundle carries [default: DATA/../auth, where `nasd up` keeps it, if
        /// its state is in the database].
        #[arg(long)]
        auth_data: Option<PathBuf>,
    },
    /// Take a drive out of service: nothing new goes to it and its
    /// components are rebuilt on other drives (to replace or retire it).
    DriveOut {
        /// The drive's number (see `nasd status`).
        drive: u32,
        #[command(flatten)]
        login: Login,
    },
    /// Put a drive taken out back into service.
    DriveIn {
        /// The drive's number (see `nasd status`).
        drive: u32,
        #[command(flatten)]
        login: Login,
    },
    /// Add a manager to the routing table (it serves the same database):
    /// it takes floor(64/(N+1)) of the 64 routing sites from the managers
    /// holding most. Clients move to the new table at their next request.
    AddManager {
        /// The manager's client address (host:port), as clients reach it.
        addr: String,
        #[command(flatten)]
        login: Login,
    },
    /// Remove a manager from the routing table: its sites go to the
    /// managers holding fewest. Stop it afterwards.
    RemoveManager {
        /// The manager's address as the routing table names it.
        addr: String,
        #[command(flatten)]
        login: Login,
    },
    /// Show the routing table: its version, policy, and the sites each
    /// manager holds.
    Routing {
        #[command(flatten)]
        login: Login,
    },
    /// Take a fresh drive into service with its master key.
    AddDrive {
        /// The drive's address (host:port).
        addr: String,
        /// File with the drive's master key (64 hex digits).
        #[arg(long)]
        master_key_file: PathBuf,
        #[command(flatten)]
        login: Login,
    },
}

impl AdminCommand {
    /// How this command logs in (`None`: it does not).
    pub fn login(&self) -> Option<&Login> {
        use AdminCommand::*;
        match self {
            AddUser { login, .. } | Users { login } | Passwd { login, .. } => Some(login),
            SetGroups { login, .. } | SetGateway { login, .. } => Some(login),
            DriveOut { login, .. } | DriveIn { login, .. } | AddDrive { login, .. } => Some(login),
            AddManager { login, .. } | RemoveManager { login, .. } | Routing { login } => Some(login),
            ResetPassword { .. } | JoinBundle { .. } => None,
        }
    }
}

/// Logs in with the `[client]` settings (overridable with `--user`).
pub async fn login(section: &ClientSection, user: Option<&str>) -> anyhow::Result<FsClient> {
    login_as(section, user, false).await
}

/// [`login`] for a long-lived client (`nasd mount`): with an
/// authentication server, the client renews its identity before it expires
/// by logging in there again with the same user, role and password
/// (`nasd_profile::relogin`), so it outlives `identity_lifetime_secs`.
pub async fn login_renewing(section: &ClientSection, user: Option<&str>) -> anyhow::Result<FsClient> {
    login_as(section, user, true).await
}

async fn login_as(section: &ClientSection, user: Option<&str>, renew: bool) -> anyhow::Result<FsClient> {
    let user = section.login_name(user)?;
    let password = zeroize::Zeroizing::new(password_for(&user, section)?);
    let how = nasd_profile::Login { user: &user, password: &password, role: None, renew, on_wait: Some(say_once()) };
    nasd_profile::login(section, how).await
}

/// Logs in to the manager with an identity from the authentication server.
pub async fn login_with_identity(
    section: &ClientSection,
    grant: &nasd_login::auth_client::IdentityGrant,
    user: &str,
) -> anyhow::Result<FsClient> {
    nasd_profile::login_with_identity(section, grant, user, None, Some(say_once())).await
}

/// $NASD_PASSWORD, else the configured password file (only for the
/// configured user), else a prompt.
pub(crate) fn password_for(user: &str, section: &ClientSection) -> anyhow::Result<String> {
    password_asking(user, section, "password for")
}

/// [`password_for`], asking `{prompt} {user}: ` if it must ask.
pub(crate) fn password_asking(user: &str, section: &ClientSection, prompt: &str) -> anyhow::Result<String> {
    if let Ok(p) = std::env::var("NASD_PASSWORD") {
        return Ok(p);
    }
    if let Some(p) = section.password_from_file(user)? {
        return Ok(p);
    }
    rpassword::prompt_password(format!("{prompt} {user}: ")).context("cannot read a password (set NASD_PASSWORD)")
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

/// Runs one user command.
pub async fn run(fs: &FsClient, cmd: FsCommand) -> anyhow::Result<()> {
    match cmd {
        FsCommand::Ls { long, paths, .. } => {
            ls(fs, long, if paths.is_empty() { vec!["/".into()] } else { paths }).await
        }
        FsCommand::Mkdir { parents, mode, paths, .. } => {
            let mode = parse_mode(&mode)?;
            for p in paths {
                let p = abs(&p);
                if parents { fs.mkdir_all(&p, mode).await } else { fs.mkdir(&p, mode).await.map(|_| ()) }
                    .with_context(|| format!("mkdir {p}"))?;
            }
            Ok(())
        }
        FsCommand::Put { recursive, no_clobber, local, remote, .. } => {
            let opts = CopyOptions { recursive, no_clobber };
            transfer::copy(fs, Loc::Local(local), Loc::Remote(abs(&remote)), opts).await
        }
        FsCommand::Get { recursive, no_clobber, remote, local, .. } => {
            let local = local.unwrap_or_else(|| PathBuf::from("."));
            let opts = CopyOptions { recursive, no_clobber };
            transfer::copy(fs, Loc::Remote(abs(&remote)), Loc::Local(local), opts).await
        }
        FsCommand::Cp { recursive, no_clobber, source, destination, .. } => {
            copy(fs, &source, &destination, CopyOptions { recursive, no_clobber }).await
        }
        FsCommand::Cat { reads: Some(list), paths, .. } => {
            anyhow::ensure!(paths.len() == 1, "--reads takes one file, not {}", paths.len());
            let p = abs(&paths[0]);
            let reads = read_list(&list)?;
            let f = fs.open(&p, false).await.with_context(|| format!("cat {p}"))?;
            let mut hinted = nasd_fs::HintedReads::new(&f, reads).await.with_context(|| format!("cat {p}"))?;
            let mut out = tokio::io::stdout();
            while let Some((_, bytes)) = hinted.next_read().await.with_context(|| format!("cat {p}"))? {
                tokio::io::AsyncWriteExt::write_all(&mut out, &bytes).await?;
            }
            hinted.end().await;
            tokio::io::AsyncWriteExt::flush(&mut out).await?;
            Ok(())
        }
        FsCommand::Cat { paths, .. } => {
            for p in paths {
                let p = abs(&p);
                let f = fs.open(&p, false).await.with_context(|| format!("cat {p}"))?;
                f.read_to(0, f.size(), &mut tokio::io::stdout()).await.with_context(|| format!("cat {p}"))?;
            }
            Ok(())
        }
        FsCommand::Rm { recursive, paths, .. } => {
            for p in paths {
                let p = abs(&p);
                anyhow::ensure!(!p.trim_end_matches('/').is_empty(), "refusing to remove the root directory");
                remove(fs, &p, recursive).await.with_context(|| format!("rm {p}"))?;
            }
            Ok(())
        }
        FsCommand::Rmdir { paths, .. } => {
            for p in paths {
                let p = abs(&p);
                fs.rmdir(&p).await.with_context(|| format!("rmdir {p}"))?;
            }
            Ok(())
        }
        FsCommand::Mv { source, destination, .. } => mv(fs, &abs(&source), &abs(&destination)).await,
        FsCommand::Ln { symbolic, target, link, .. } => {
            let link = abs(&link);
            if symbolic {
                fs.symlink(&target, &link).await.with_context(|| format!("ln -s {target} {link}"))?;
            } else {
                fs.link(&abs(&target), &link).await.with_context(|| format!("ln {target} {link}"))?;
            }
            Ok(())
        }
        FsCommand::Stat { path, .. } => stat(fs, &abs(&path)).await,
        FsCommand::Chmod { mode, path, .. } => {
            let path = abs(&path);
            fs.chmod(&path, parse_mode(&mode)?).await.with_context(|| format!("chmod {path}"))?;
            Ok(())
        }
        FsCommand::Chown { owner, path, .. } => chown(fs, &owner, &abs(&path)).await,
        FsCommand::Df { .. } => df(fs).await,
        FsCommand::Quota { uid, dir, bytes, files, .. } => quota(fs, uid, dir, bytes, files).await,
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

/// A time to the nanosecond, as `stat` shows it: "2023-11-14 22:13:20.000000123".
fn precise_time(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let rem = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:09}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ns.rem_euclid(1_000_000_000)
    )
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

/// `nasd cp`: paths in nasd carry the `nasd:` prefix.
pub async fn copy(fs: &FsClient, source: &str, destination: &str, opts: CopyOptions) -> anyhow::Result<()> {
    let side = |p: &str| match p.strip_prefix(REMOTE_PREFIX) {
        Some(remote) => Loc::Remote(abs(remote)),
        None => Loc::Local(PathBuf::from(p)),
    };
    match (side(source), side(destination)) {
        (Loc::Local(_), Loc::Local(_)) => {
            anyhow::bail!("one side of `nasd cp` must be in nasd: prefix it with `nasd:` (nasd cp a.txt nasd:/docs/)")
        }
        (from, to) => transfer::copy(fs, from, to, opts).await,
    }
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
    let is_dir = fs.lstat(source).await.with_context(|| format!("mv {source}"))?.attr.kind == FileKind::Dir;
    let to = transfer::resolve_remote(fs, destination, base_name(source)?, is_dir).await?;
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
    println!("  access  {} UTC", precise_time(a.atime_ns));
    println!("  modify  {} UTC", precise_time(a.mtime_ns));
    println!("  change  {} UTC", precise_time(a.ctime_ns));
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
        AdminCommand::AddUser { name, uid, gid, admin, groups, .. } => {
            let password = new_password(&name)?;
            // 0 asks the manager for the next free uid, and for a gid equal to the uid.
            fs.add_user_in_groups(&name, &password, uid.unwrap_or(0), gid.unwrap_or(0), &groups, admin)
                .await
                .with_context(|| format!("cannot add user {name}"))?;
            println!("user {name} added");
        }
        AdminCommand::SetGroups { name, groups, .. } => {
            fs.set_user_groups(&name, &groups).await.with_context(|| format!("cannot set the groups of {name}"))?;
            println!("groups of {name} set");
        }
        AdminCommand::SetGateway { name, ids, .. } => {
            fs.set_gateway(&name, ids).await.with_context(|| format!("cannot set the gateway grant of {name}"))?;
            match ids {
                Some((lo, hi)) => println!("{name} may act for ids {lo}-{hi}"),
                None => println!("{name} is no longer a gateway"),
            }
        }
        AdminCommand::Users { .. } => {
            println!("{:<20} {:>8} {:>8}  {:<5}  {:<23}  groups", "name", "uid", "gid", "admin", "gateway for");
            for u in fs.users().await? {
                let groups = u.groups.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
                let gateway = u.gateway.map(|(lo, hi)| format!("{lo}-{hi}")).unwrap_or_default();
                let admin = if u.admin { "yes" } else { "" };
                println!("{:<20} {:>8} {:>8}  {admin:<5}  {gateway:<23}  {groups}", u.name, u.uid, u.gid);
            }
        }
        AdminCommand::Passwd { name, .. } => {
            let name = name.unwrap_or_else(|| fs.user().to_string());
            let password = new_password(&name)?;
            fs.set_password(&name, &password).await.with_context(|| format!("cannot change the password of {name}"))?;
            println!("password of {name} changed");
        }
        AdminCommand::ResetPassword { .. } | AdminCommand::JoinBundle { .. } => {
            anyhow::bail!("reset-password and join-bundle work on the manager's data directly, without logging in")
        }
        AdminCommand::DriveOut { drive, .. } => {
            crate::cluster_cmd::drive_state(fs, drive, nasd_fs::DriveState::Out).await?;
        }
        AdminCommand::DriveIn { drive, .. } => {
            crate::cluster_cmd::drive_state(fs, drive, nasd_fs::DriveState::In).await?;
        }
        AdminCommand::AddDrive { addr, master_key_file, .. } => {
            let key = nasd_crypto::read_key_file(&master_key_file)?;
            let drive = fs.add_drive(&addr, &key).await.with_context(|| format!("cannot add the drive at {addr}"))?;
            println!("drive {addr} in service as drive {drive}");
        }
        AdminCommand::AddManager { addr, .. } => {
            let now = fs.get_routing().await.context("cannot read the routing table")?;
            let next = now.with_manager(&addr)?;
            let moved = moved_sites(&now, &next);
            let stored = fs.set_routing(next).await.with_context(|| format!("cannot add the manager at {addr}"))?;
            println!("manager {addr} added: routing table version {}, {moved} of 64 sites moved", stored.version);
        }
        AdminCommand::RemoveManager { addr, .. } => {
            let now = fs.get_routing().await.context("cannot read the routing table")?;
            let next = now.without_manager(&addr)?;
            let moved = moved_sites(&now, &next);
            let stored = fs.set_routing(next).await.with_context(|| format!("cannot remove the manager at {addr}"))?;
            println!("manager {addr} removed: routing table version {}, {moved} of 64 sites moved", stored.version);
        }
        AdminCommand::Routing { .. } => {
            print!("{}", show_routing(&fs.get_routing().await.context("cannot read the routing table")?));
        }
    }
    Ok(())
}

/// Sites whose manager differs between two tables.
fn moved_sites(a: &nasd_fs::RoutingTable, b: &nasd_fs::RoutingTable) -> usize {
    (0..nasd_fs::ROUTING_SITES as u8).filter(|s| a.manager_of(*s) != b.manager_of(*s)).count()
}

/// The routing table as `nasd admin routing` prints it: version and policy,
/// then per manager its site count and sites (ranges).
fn show_routing(t: &nasd_fs::RoutingTable) -> String {
    let mut out = format!("routing table version {}, {}\n", t.version, t.policy.name());
    for (i, m) in t.managers.iter().enumerate() {
        let sites: Vec<usize> = (0..nasd_fs::ROUTING_SITES).filter(|s| usize::from(t.sites[*s]) == i).collect();
        let mut ranges = Vec::new();
        let mut k = 0;
        while k < sites.len() {
            let start = sites[k];
            while k + 1 < sites.len() && sites[k + 1] == sites[k] + 1 {
                k += 1;
            }
            ranges.push(if sites[k] == start { start.to_string() } else { format!("{start}-{}", sites[k]) });
            k += 1;
        }
        out.push_str(&format!("{m:<24} {:>2} sites  {}\n", sites.len(), ranges.join(",")));
    }
    out
}

#[cfg(test)]
mod routing_tests {
    use nasd_fs::{RoutingPolicy, RoutingTable};

    #[test]
    fn the_table_shows_each_managers_sites_as_ranges() {
        let t = RoutingTable::single("a:1", RoutingPolicy::MkdirSwitching).with_manager("b:1").unwrap();
        assert_eq!(
            super::show_routing(&t),
            "routing table version 2, mkdir-switching\na:1                      32 sites  0-31\nb:1                      32 sites  32-63\n"
        );
        assert_eq!(super::moved_sites(&RoutingTable::single("a:1", RoutingPolicy::MkdirSwitching), &t), 32);
    }
}

/// $NASD_NEW_PASSWORD, else asked twice.
pub(crate) fn new_password(name: &str) -> anyhow::Result<String> {
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

    use indicatif::ProgressBar;

    /// Runs `body` as `nasd` runs a command: polled on a thread with the
    /// main thread's stack (8 MiB), not a 2 MiB test thread, which a copy's
    /// futures overflow in a debug build.
    fn as_a_command(body: impl std::future::Future<Output = ()> + Send + 'static) {
        let thread = std::thread::Builder::new().stack_size(8 << 20).spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            rt.block_on(body);
        });
        thread.expect("spawn").join().expect("the test body");
    }

    #[test]
    fn cp_refuses_to_copy_a_file_onto_itself() {
        as_a_command(cp_refuses_to_copy_a_file_onto_itself_body());
    }

    async fn cp_refuses_to_copy_a_file_onto_itself_body() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = crate::daemons::LocalCluster::start(dir.path(), 1, 64 << 20).await.unwrap();
        let fs = login(&cluster.client, None).await.unwrap();
        fs.mkdir("/d", 0o755).await.unwrap();
        fs.write_file("/d/a", b"precious").await.unwrap();
        fs.link("/d/a", "/d/hard").await.unwrap();
        let opts = CopyOptions::default();
        for to in ["nasd:/d/a", "nasd:/d", "nasd:/d/", "nasd:/d/hard"] {
            let e = copy(&fs, "nasd:/d/a", to, opts).await.expect_err(to);
            assert!(e.to_string().contains("are the same file"), "{to}: {e:#}");
            assert_eq!(fs.read_file("/d/a").await.unwrap(), b"precious", "cp nasd:/d/a {to} kept the data");
        }
        copy(&fs, "nasd:/d/a", "nasd:/d/b", opts).await.expect("a copy to another file");
        assert_eq!(fs.read_file("/d/b").await.unwrap(), b"precious");

        // Within nasd, cp shows progress like put and get: the bar counts every byte.
        let big = vec![7u8; 3 * nasd_fs::TRANSFER_PIECE_DEFAULT / 2];
        fs.write_file("/d/big", &big).await.unwrap();
        let shown = std::sync::Arc::new(std::sync::Mutex::new(None));
        let keep = shown.clone();
        let (from, to) = (Loc::Remote("/d/big".into()), Loc::Remote("/d/big2".into()));
        transfer::copy_with(&fs, from, to, opts, move |len, name, _| {
            let bar = ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::hidden());
            bar.set_message(name.to_string());
            *keep.lock().unwrap() = Some(bar.clone());
            bar
        })
        .await
        .unwrap();
        let bar = shown.lock().unwrap().take().expect("cp made a progress bar");
        assert_eq!((bar.position(), bar.length()), (big.len() as u64, Some(big.len() as u64)));
        // The bar names the file being copied.
        assert_eq!(bar.message(), "/d/big");
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

/// Prints a wait for the metadata database on standard error, once per
/// command: one outage is one line, however many requests wait it out.
pub fn say_once() -> std::sync::Arc<dyn Fn(&str) + Send + Sync> {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    std::sync::Arc::new(|text: &str| {
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            eprintln!("nasd: {text}");
        }
    })
}

/// Most reads `nasd cat --reads` takes.
const READS_MAX: usize = 1 << 20;

/// The `OFFSET LENGTH` lines of `nasd cat --reads` (`-`: standard input);
/// blank lines and `#` comments skipped.
fn read_list(path: &std::path::Path) -> anyhow::Result<Vec<(u64, u64)>> {
    let text = if path == std::path::Path::new("-") {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?
    };
    let mut reads = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let parse = |s: &str| crate::size::parse_size(s).map_err(anyhow::Error::msg);
        let mut words = line.split_whitespace();
        let (Some(offset), Some(length), None) = (words.next(), words.next(), words.next()) else {
            anyhow::bail!("{}:{}: expected OFFSET LENGTH, got {line:?}", path.display(), i + 1);
        };
        reads.push((parse(offset)?, parse(length)?));
        anyhow::ensure!(reads.len() <= READS_MAX, "{}: more than {READS_MAX} reads", path.display());
    }
    Ok(reads)
}
