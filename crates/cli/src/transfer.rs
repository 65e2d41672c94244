//! Copies into, out of and within nasd (`put`, `get`, `cp`): one file, or
//! with `-r` a whole tree.
//!
//! A copy never leaves a partial file behind. Each file is written under a
//! temporary name beside its destination (`.NAME.XXXXXXXX.nasd-tmp`), made
//! durable, and only then renamed onto the destination, so the destination
//! shows the old file or the new one, never part of either. Nothing is
//! created before the source has been opened. A copy that fails, or is
//! interrupted with Ctrl-C, removes its temporary files and everything it
//! created (files, links, directories); files it already replaced stay
//! replaced (each whole). A file whose copy lost the manager part-way (its
//! connection broke with a request in flight: the manager killed) is
//! copied again from the start under a new temporary name, through the
//! next manager that answers (at most [`MANAGER_LOST_COPIES_MAX`] times).
//! A replaced file keeps its permission bits (and,
//! when an administrator copies, its owner and group); a new one gets the
//! source's. With `--no-clobber` an existing destination is left alone
//! (and named on stderr); the final step is then a hard link, which fails
//! rather than replaces if the name appeared meanwhile.
//!
//! A trailing slash on the destination means a directory that must exist.
//! Copies show one progress bar for all their bytes on a terminal and end
//! with a one-line summary there; piped, they print nothing but errors and
//! skipped names.

use crate::size;
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use nasd_fs::{FileAttr, FileKind, FsClient, FsError, FsStatus};
use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Copies at least this large get a progress bar on a terminal (trees always do).
const PROGRESS_MIN_BYTES: u64 = 4 * 1024 * 1024;
/// Most entries (files, directories, links) one recursive copy takes on:
/// the plan of a copy is held in memory, about 100 bytes an entry.
pub const TREE_ENTRIES_MAX: usize = 1_000_000;
/// Files one copy writes at once: each waits on the manager and the drives
/// for most of its time, and the manager's pipelined connection and group
/// commit take several files' requests together. Memory: a read buffer of
/// 1 MiB and the file's write-behind per file.
const FILES_IN_FLIGHT_MAX: usize = 12;
/// Times one file is copied again, from the start under a new temporary
/// name, after the manager went away part-way through ([`manager_lost`]).
const MANAGER_LOST_COPIES_MAX: usize = 2;

/// Whether a copy failed because the connection to the manager broke with
/// a request in flight (`FsError::Io`: the manager killed, or the network
/// cut): whether that request was carried out is unknown, so the fs layer
/// does not send it again — but the copy as a whole may start over, since
/// only its final rename shows it: the file is written again under a new
/// temporary name (to the next manager that answers) and renamed onto the
/// destination, which then holds the new file whether or not the first
/// rename happened. With `--no-clobber`, a first link that did happen
/// makes the second one report the destination as existing.
fn manager_lost(e: &anyhow::Error) -> bool {
    // The file-system layer's errors wrap the client's transparently: their
    // source is the client error's source, so `FsError` itself is not in the chain.
    let lost = |f: Option<&FsError>| matches!(f, Some(FsError::Io(_)));
    e.chain().any(|c| {
        lost(c.downcast_ref::<FsError>())
            || lost(match c.downcast_ref::<nasd_vfs::VfsError>() {
                Some(nasd_vfs::VfsError::Fs(f)) => Some(f),
                _ => None,
            })
    })
}

/// Suffix of the temporary names files are written under.
const TMP_SUFFIX: &str = nasd_fs::TEMPORARY_SUFFIX;

/// How to copy.
#[derive(Clone, Copy, Debug, Default)]
pub struct CopyOptions {
    /// Copy directories and everything under them.
    pub recursive: bool,
    /// Leave existing destination files alone.
    pub no_clobber: bool,
}

/// One side of a copy.
#[derive(Clone, Debug)]
pub enum Loc {
    /// A path on this machine.
    Local(PathBuf),
    /// An absolute path in nasd.
    Remote(String),
}

impl std::fmt::Display for Loc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Loc::Local(p) => write!(f, "{}", p.display()),
            Loc::Remote(p) => write!(f, "{p}"),
        }
    }
}

/// What a source entry is.
#[derive(Clone, Debug)]
enum Kind {
    Dir { mode: u32 },
    File { len: u64, mode: u32 },
    Symlink { target: String },
}

/// One entry of a copy's plan: its path relative to the source root (""
/// for the root itself; '/'-separated).
#[derive(Clone, Debug)]
struct Item {
    rel: String,
    kind: Kind,
}

/// Something this copy created, to remove again if it fails.
#[derive(Clone, Debug, PartialEq)]
enum Made {
    RemoteTmp(String),
    RemoteFile(String),
    RemoteDir(String),
    LocalFile(PathBuf),
    LocalDir(PathBuf),
}

/// What a copy made so far, in order (shared with the caller, which
/// removes it if the copy fails or is interrupted).
#[derive(Debug, Default)]
pub struct Undo {
    made: Mutex<Vec<Made>>,
}

impl Undo {
    fn push(&self, m: Made) {
        self.made.lock().expect("undo lock").push(m);
    }

    /// Runs `request`, which makes `m` in nasd. `m` is recorded first: a
    /// copy interrupted while the request is in flight (the manager may have
    /// done it, the reply not yet read) still removes it. A refusal by the
    /// manager says nothing was made, and the record goes; after any other
    /// failure the outcome is unknown and removal is tried (finding nothing
    /// is fine).
    async fn making<T>(
        &self,
        m: Made,
        request: impl std::future::Future<Output = Result<T, FsError>>,
    ) -> Result<T, FsError> {
        self.push(m.clone());
        let r = request.await;
        if matches!(&r, Err(e) if e.status().is_some()) {
            let mut made = self.made.lock().expect("undo lock");
            if let Some(at) = made.iter().rposition(|x| *x == m) {
                made.remove(at);
            }
        }
        r
    }

    /// Forgets a destination this copy did not make after all (`--no-clobber`
    /// found it there).
    fn forget_made(&self, dst: &str) {
        self.made.lock().expect("undo lock").retain(|m| !matches!(m, Made::RemoteFile(f) if f == dst));
    }

    /// Forgets a temporary name once it was renamed onto its destination.
    fn published(&self, tmp: &str) {
        self.made.lock().expect("undo lock").retain(|m| !matches!(m, Made::RemoteTmp(t) if t == tmp));
    }

    /// Removes the temporary files made so far for destination `dst` and
    /// forgets them (best effort: one left behind is swept by the manager
    /// after `[manager] temporaries_age_secs`), before it is copied again;
    /// other files' temporaries (copied at the same time) are theirs.
    async fn discard_temporaries_of(&self, fs: &FsClient, dst: &str) {
        let tmps: Vec<String> = {
            let mut made = self.made.lock().expect("undo lock");
            let tmps = made.iter().filter_map(|m| match m {
                Made::RemoteTmp(t) if is_temporary_of(t, dst) => Some(t.clone()),
                _ => None,
            });
            let tmps = tmps.collect();
            made.retain(|m| !matches!(m, Made::RemoteTmp(t) if is_temporary_of(t, dst)));
            tmps
        };
        for t in tmps {
            if let Err(e) = remote_gone(fs.unlink(&t).await) {
                tracing::info!(temporary = %t, error = %e, "a temporary file is left for the manager to sweep");
            }
        }
    }

    /// Removes everything made, newest first. Best effort: what cannot be
    /// removed is named on stderr.
    pub async fn roll_back(&self, fs: &FsClient) {
        let made = std::mem::take(&mut *self.made.lock().expect("undo lock"));
        for m in made.into_iter().rev() {
            let (what, r) = match &m {
                Made::RemoteTmp(p) | Made::RemoteFile(p) => (p.clone(), remote_gone(fs.unlink(p).await)),
                Made::RemoteDir(p) => (p.clone(), remote_gone(fs.rmdir(p).await)),
                Made::LocalFile(p) => (p.display().to_string(), local_gone(std::fs::remove_file(p))),
                Made::LocalDir(p) => (p.display().to_string(), local_gone(std::fs::remove_dir(p))),
            };
            if let Err(e) = r {
                eprintln!("warning: could not remove {what} after the failed copy: {e}");
            }
        }
    }
}

/// Whether nasd path `tmp` is a temporary name of destination `dst`
/// (`DIR/.NAME.XXXXXXXX.nasd-tmp`, [`nasd_vfs::temp_name`]).
fn is_temporary_of(tmp: &str, dst: &str) -> bool {
    let (Ok((tmp_dir, tmp_name)), Ok((dir, name))) = (nasd_fs::split_path(tmp), nasd_fs::split_path(dst)) else {
        return false;
    };
    let tag = tmp_name.strip_prefix(&format!(".{name}.")).and_then(|rest| rest.strip_suffix(TMP_SUFFIX));
    tmp_dir == dir && tag.is_some_and(|t| t.len() == 8 && t.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A removal's outcome: absent already (an interrupted request that was
/// never carried out) counts as removed.
fn remote_gone<T>(r: Result<T, FsError>) -> Result<(), String> {
    match r {
        Err(e) if !not_found(&e) => Err(e.to_string()),
        _ => Ok(()),
    }
}

fn local_gone(r: std::io::Result<()>) -> Result<(), String> {
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.to_string()),
        _ => Ok(()),
    }
}

/// Counts for the summary.
#[derive(Debug, Default)]
struct Stats {
    files: u64,
    dirs: u64,
    links: u64,
    bytes: u64,
    skipped: u64,
}

/// Whether a copy is done or was left alone (`--no-clobber`).
enum Outcome {
    Copied,
    Skipped,
}

/// Copies `from` to `to`; on failure or Ctrl-C removes what it made. At
/// least one side is in nasd.
pub async fn copy(fs: &FsClient, from: Loc, to: Loc, opts: CopyOptions) -> anyhow::Result<()> {
    copy_with(fs, from, to, opts, progress).await
}

/// [`copy`] showing its progress on `bar_for(total bytes, name, whether a tree)`.
pub async fn copy_with(
    fs: &FsClient,
    from: Loc,
    to: Loc,
    opts: CopyOptions,
    bar_for: impl FnOnce(u64, &str, bool) -> ProgressBar,
) -> anyhow::Result<()> {
    let undo = Undo::default();
    let result = tokio::select! {
        r = run(fs, &from, &to, opts, &undo, bar_for) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted: nothing of this copy is left behind")),
    };
    let changed = match result {
        Ok(changed) => changed,
        Err(e) => {
            undo.roll_back(fs).await;
            return Err(e);
        }
    };
    // Copied, but not as they are now: kept (each whole, as read), and said, as `tar` does.
    for c in &changed {
        eprintln!("warning: {c}");
    }
    anyhow::ensure!(
        changed.is_empty(),
        "{} of the files changed while they were copied: copy them again once they stop changing",
        changed.len()
    );
    Ok(())
}

async fn run(
    fs: &FsClient,
    from: &Loc,
    to: &Loc,
    opts: CopyOptions,
    undo: &Undo,
    bar_for: impl FnOnce(u64, &str, bool) -> ProgressBar,
) -> anyhow::Result<Vec<String>> {
    let started = Instant::now();
    let root = root_item(fs, from).await?;
    if matches!(root.kind, Kind::Dir { .. }) && !opts.recursive {
        anyhow::bail!("{from} is a directory: copy it and everything under it with -r");
    }
    let name = source_name(from)?;
    let target = resolve_target(fs, to, &name, matches!(root.kind, Kind::Dir { .. })).await?;
    if let (Loc::Remote(src), Loc::Remote(dst)) = (from, &target) {
        let inside = dst.strip_prefix(src.trim_end_matches('/')).is_some_and(|rest| rest.starts_with('/'));
        anyhow::ensure!(!(opts.recursive && inside), "cannot copy {src} into itself ({dst})");
    }
    let plan = match root.kind {
        Kind::Dir { .. } => list_tree(fs, from, root).await?,
        _ => vec![root],
    };
    let total: u64 = plan.iter().map(|i| if let Kind::File { len, .. } = i.kind { len } else { 0 }).sum();
    let bar = bar_for(total, &name, opts.recursive);
    let c = Copier {
        fs,
        opts,
        undo,
        bar: bar.clone(),
        stats: Mutex::default(),
        fix_modes: Mutex::default(),
        changed: Mutex::default(),
        vfs: tokio::sync::OnceCell::new(),
        dirs: Mutex::default(),
        made_dirs: Mutex::default(),
    };
    c.copy_plan(from, &target, &plan).await?;
    c.fix_dir_modes().await?;
    if matches!(target, Loc::Remote(_)) {
        // Everything copied durable against power loss too, with one flush at the manager.
        fs.sync().await.context("cannot make the copy durable")?;
    }
    bar.finish_and_clear();
    if !bar.is_hidden() {
        eprintln!("{}", summary(&lock(&c.stats), started.elapsed()));
    }
    Ok(c.changed.into_inner().unwrap_or_else(|p| p.into_inner()))
}

/// The bar: on a terminal only, for copies large enough or of trees.
fn progress(total: u64, what: &str, tree: bool) -> ProgressBar {
    if !(tree || total >= PROGRESS_MIN_BYTES) || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// "copied 3 files, 1 directory (12.0 MiB) in 1.2 s, 10.0 MiB/s; 1 left alone (exists)".
fn summary(s: &Stats, took: Duration) -> String {
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let mut parts = vec![plural(s.files, "file", "files")];
    if s.dirs > 0 {
        parts.push(plural(s.dirs, "directory", "directories"));
    }
    if s.links > 0 {
        parts.push(plural(s.links, "symbolic link", "symbolic links"));
    }
    let secs = took.as_secs_f64().max(0.001);
    let mut line = format!(
        "copied {} ({}) in {:.1} s, {}/s",
        parts.join(", "),
        size::human(s.bytes),
        secs,
        size::human((s.bytes as f64 / secs) as u64)
    );
    if s.skipped > 0 {
        line += &format!("; {} left alone (--no-clobber)", s.skipped);
    }
    line
}

/// The name a copy of `from` gets inside a destination directory ("" for nasd's root).
fn source_name(from: &Loc) -> anyhow::Result<String> {
    match from {
        Loc::Remote(p) => Ok(p.trim_end_matches('/').rsplit('/').next().unwrap_or_default().to_string()),
        Loc::Local(p) => {
            let name = match p.file_name() {
                Some(n) => n.to_os_string(),
                // "." or "dir/..": the name of what it is.
                None => std::fs::canonicalize(p)
                    .with_context(|| format!("cannot read {}", p.display()))?
                    .file_name()
                    .map(|n| n.to_os_string())
                    .unwrap_or_default(),
            };
            utf8(&name, p)
        }
    }
}

fn utf8(name: &std::ffi::OsStr, whole: &Path) -> anyhow::Result<String> {
    name.to_str()
        .map(str::to_string)
        .with_context(|| format!("{}: nasd names are UTF-8, and this one is not", whole.display()))
}

fn join(dir: &str, name: &str) -> String {
    if name.is_empty() {
        return dir.to_string();
    }
    format!("{}/{name}", dir.trim_end_matches('/'))
}

fn join_local(dir: &Path, rel: &str) -> PathBuf {
    if rel.is_empty() {
        dir.to_path_buf()
    } else {
        dir.join(rel)
    }
}

fn not_found(e: &FsError) -> bool {
    e.status() == Some(FsStatus::NotFound)
}

/// A nasd path's attributes without following a final symlink; `None` if absent.
async fn remote_lstat(fs: &FsClient, path: &str) -> anyhow::Result<Option<nasd_fs::Stat>> {
    match fs.lstat(path).await {
        Ok(st) => Ok(Some(st)),
        Err(e) if not_found(&e) => Ok(None),
        Err(e) => Err(anyhow::Error::new(e).context(format!("cannot look up {path}"))),
    }
}

/// The source's root entry (following a symlink, as `cp` does for what it is given).
async fn root_item(fs: &FsClient, from: &Loc) -> anyhow::Result<Item> {
    let kind = match from {
        Loc::Local(p) => {
            let m = std::fs::metadata(p).with_context(|| format!("cannot read {}", p.display()))?;
            local_kind(p, &m)?.with_context(|| format!("{} is not a regular file or a directory", p.display()))?
        }
        Loc::Remote(p) => {
            let st = fs.stat(p).await.with_context(|| format!("cannot read {p}"))?;
            remote_kind(&st.attr, String::new()).with_context(|| format!("{p} is not a regular file or a directory"))?
        }
    };
    Ok(Item { rel: String::new(), kind })
}

fn local_kind(path: &Path, m: &std::fs::Metadata) -> anyhow::Result<Option<Kind>> {
    let mode = m.permissions().mode() & 0o7777;
    let t = m.file_type();
    Ok(if t.is_dir() {
        Some(Kind::Dir { mode })
    } else if t.is_file() {
        Some(Kind::File { len: m.len(), mode })
    } else if t.is_symlink() {
        let target = std::fs::read_link(path).with_context(|| format!("cannot read the link {}", path.display()))?;
        Some(Kind::Symlink { target: utf8(target.as_os_str(), path)? })
    } else {
        None
    })
}

/// What a copy makes of a nasd entry; `None` for a special file (a FIFO,
/// socket or device: skipped, as for local ones).
fn remote_kind(a: &FileAttr, target: String) -> Option<Kind> {
    match a.kind {
        FileKind::Dir => Some(Kind::Dir { mode: a.mode }),
        FileKind::File => Some(Kind::File { len: a.size, mode: a.mode }),
        FileKind::Symlink => Some(Kind::Symlink { target }),
        FileKind::Fifo | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice => None,
    }
}

/// Every entry under a directory, parents before children, in name order.
async fn list_tree(fs: &FsClient, from: &Loc, root: Item) -> anyhow::Result<Vec<Item>> {
    let mut plan = vec![root];
    let mut at = 0;
    while at < plan.len() {
        if matches!(plan[at].kind, Kind::Dir { .. }) {
            let rel = plan[at].rel.clone();
            let children = match from {
                Loc::Local(p) => list_local(&join_local(p, &rel), &rel)?,
                Loc::Remote(p) => list_remote(fs, &join(p, &rel), &rel).await?,
            };
            anyhow::ensure!(
                plan.len() + children.len() <= TREE_ENTRIES_MAX,
                "{from} holds more than {TREE_ENTRIES_MAX} entries: copy it in parts"
            );
            // Depth first keeps each directory's entries right after it.
            plan.splice(at + 1..at + 1, children);
        }
        at += 1;
    }
    Ok(plan)
}

fn child_rel(rel: &str, name: &str) -> String {
    if rel.is_empty() {
        name.to_string()
    } else {
        format!("{rel}/{name}")
    }
}

fn list_local(dir: &Path, rel: &str) -> anyhow::Result<Vec<Item>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        let path = entry.path();
        let m = std::fs::symlink_metadata(&path).with_context(|| format!("cannot read {}", path.display()))?;
        match local_kind(&path, &m)? {
            Some(kind) => out.push(Item { rel: child_rel(rel, &utf8(&entry.file_name(), &path)?), kind }),
            None => eprintln!("skipped {}: not a regular file, directory or symbolic link", path.display()),
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

async fn list_remote(fs: &FsClient, dir: &str, rel: &str) -> anyhow::Result<Vec<Item>> {
    let mut out = Vec::new();
    for (name, attr) in fs.readdir(dir).await.with_context(|| format!("cannot read {dir}"))? {
        let path = join(dir, &name);
        let target = if attr.kind == FileKind::Symlink {
            fs.readlink(&path).await.with_context(|| format!("cannot read the link {path}"))?
        } else {
            String::new()
        };
        match remote_kind(&attr, target) {
            Some(kind) => out.push(Item { rel: child_rel(rel, &name), kind }),
            None => eprintln!("skipped nasd:{path}: not a regular file, directory or symbolic link"),
        }
    }
    Ok(out)
}

/// Where the copy of a source named `name` goes: into `to` if it is a
/// directory; `to` itself otherwise. A trailing slash says `to` must be a
/// directory that exists; without one, `to`'s parent must exist.
pub async fn resolve_target(fs: &FsClient, to: &Loc, name: &str, source_is_dir: bool) -> anyhow::Result<Loc> {
    match to {
        Loc::Remote(p) => Ok(Loc::Remote(resolve_remote(fs, p, name, source_is_dir).await?)),
        Loc::Local(p) => Ok(Loc::Local(resolve_local(p, name, source_is_dir)?)),
    }
}

/// [`resolve_target`] for a nasd path.
pub async fn resolve_remote(fs: &FsClient, to: &str, name: &str, source_is_dir: bool) -> anyhow::Result<String> {
    let slash = to.ends_with('/');
    let trimmed = match to.trim_end_matches('/') {
        "" => "/",
        t => t,
    };
    match fs.stat(trimmed).await {
        Ok(st) if st.attr.kind == FileKind::Dir => Ok(join(trimmed, name)),
        Ok(_) if slash => anyhow::bail!("{to}: {trimmed} is not a directory"),
        Ok(_) if source_is_dir => anyhow::bail!("cannot replace {to}, which is not a directory, with a directory"),
        Ok(_) => Ok(trimmed.to_string()),
        Err(e) if not_found(&e) && slash => {
            anyhow::bail!("no such directory: {to} (make it first: nasd mkdir {trimmed})")
        }
        Err(e) if not_found(&e) => {
            let parent = nasd_fs::split_path(trimmed)?.0;
            match fs.stat(parent).await {
                Ok(st) if st.attr.kind == FileKind::Dir => Ok(trimmed.to_string()),
                Ok(_) => anyhow::bail!("{to}: {parent} is not a directory"),
                Err(e) if not_found(&e) => {
                    anyhow::bail!("no such directory: {parent} (make it first: nasd mkdir -p {parent})")
                }
                Err(e) => Err(anyhow::Error::new(e).context(format!("cannot look up {parent}"))),
            }
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("cannot look up {to}"))),
    }
}

fn resolve_local(to: &Path, name: &str, source_is_dir: bool) -> anyhow::Result<PathBuf> {
    let slash = to.as_os_str().as_bytes().ends_with(b"/");
    match std::fs::metadata(to) {
        Ok(m) if m.is_dir() => Ok(join_local(to, name)),
        Ok(_) if slash => anyhow::bail!("{}: not a directory", to.display()),
        Ok(_) if source_is_dir => {
            anyhow::bail!("cannot replace {}, which is not a directory, with a directory", to.display())
        }
        Ok(_) => Ok(to.to_path_buf()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && slash => {
            anyhow::bail!("no such directory: {} (make it first: mkdir {})", to.display(), to.display())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = match to.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            anyhow::ensure!(
                parent.is_dir(),
                "no such directory: {} (make it first: mkdir -p {})",
                parent.display(),
                parent.display()
            );
            Ok(to.to_path_buf())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => match file_among_ancestors(to) {
            Some(file) => anyhow::bail!("{}: {} is not a directory", to.display(), file.display()),
            None => Err(e).with_context(|| format!("cannot look up {}", to.display())),
        },
        Err(e) => Err(e).with_context(|| format!("cannot look up {}", to.display())),
    }
}

/// The nearest of `path` (less trailing slashes) and its ancestors that
/// exists, if it is not a directory: why the system said "not a directory".
fn file_among_ancestors(path: &Path) -> Option<PathBuf> {
    let bytes = path.as_os_str().as_bytes();
    let end = bytes.iter().rposition(|&b| b != b'/').map_or(bytes.len(), |i| i + 1);
    let trimmed = Path::new(std::ffi::OsStr::from_bytes(&bytes[..end]));
    let found = trimmed
        .ancestors()
        .filter(|a| !a.as_os_str().is_empty())
        .find_map(|a| std::fs::metadata(a).ok().map(|m| (a, m)));
    match found {
        Some((a, m)) if !m.is_dir() => Some(a.to_path_buf()),
        _ => None,
    }
}

/// A temporary name beside `path` in nasd: `DIR/.NAME.XXXXXXXX.nasd-tmp`.
fn remote_tmp_name(path: &str) -> anyhow::Result<String> {
    Ok(nasd_fs::temporary_name(path)?)
}

/// A layer failure as the client library's (what [`Undo::making`] judges):
/// the library's own, or a protocol error naming it.
fn fs_error(e: nasd_vfs::VfsError) -> FsError {
    match e {
        nasd_vfs::VfsError::Fs(e) => e,
        other => FsError::Protocol(other.to_string()),
    }
}

/// A layer failure about nasd path `path`.
fn layer_error(e: nasd_vfs::VfsError, path: &str) -> anyhow::Error {
    anyhow::Error::new(fs_error(e)).context(path.to_string())
}

/// Turns a failure of a file transfer into one message blaming the side that failed.
fn transfer_error(e: FsError, local: &Path, reading_local: bool, remote: &str) -> anyhow::Error {
    match e {
        FsError::Local(io) if reading_local => anyhow::anyhow!("cannot read {}: {io}", local.display()),
        FsError::Local(io) => anyhow::anyhow!("cannot write {}: {io}", local.display()),
        e if reading_local => anyhow::Error::new(e).context(format!("cannot write {remote}")),
        e => anyhow::Error::new(e).context(format!("cannot read {remote}")),
    }
}

/// How the local file `path`, which had the attributes `before` when it was
/// opened and whose first `before.len()` bytes `rest` has read, changed
/// since: it grew (more to read, or a larger size now), was rewritten (a new
/// modification time), or `None`.
async fn changed_since(
    path: &Path,
    before: &std::fs::Metadata,
    rest: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let now = tokio::fs::metadata(path).await.ok();
    let more = rest.read(&mut [0u8; 1]).await.is_ok_and(|n| n > 0);
    let len_now = now.as_ref().map_or(before.len(), |m| m.len());
    if len_now > before.len() {
        return Some(format!("grew from {} to {len_now} bytes", before.len()));
    }
    if more {
        return Some(format!("grew past its {} bytes", before.len()));
    }
    let modified = |m: &std::fs::Metadata| m.modified().ok();
    (now.as_ref().and_then(modified) != modified(before)).then(|| "was modified".to_string())
}

/// One copy's state, shared by the files it copies at once (each field
/// locked only between awaits).
struct Copier<'a> {
    fs: &'a FsClient,
    opts: CopyOptions,
    undo: &'a Undo,
    bar: ProgressBar,
    stats: Mutex<Stats>,
    /// Directories created with owner rights added (to fill them), and the mode they get at the end.
    fix_modes: Mutex<Vec<(Loc, u32)>>,
    /// Local files that changed while they were put: what happened to each.
    changed: Mutex<Vec<String>>,
    /// The file-system layer files are written through (made at the first).
    vfs: tokio::sync::OnceCell<nasd_vfs::Vfs>,
    /// nasd directories this copy resolved or made, by path: their inodes.
    dirs: Mutex<std::collections::HashMap<String, nasd_fs::Ino>>,
    /// nasd directories this copy made (empty when made): nothing of theirs to replace.
    made_dirs: Mutex<std::collections::HashSet<String>>,
}

/// Locks one of a copy's shared tables (no lock is held across an await).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Copier<'_> {
    /// Copies every item of `plan` (parents before children): directories
    /// and symbolic links in order, each file beside up to
    /// [`FILES_IN_FLIGHT_MAX`] - 1 others (a file's directory is made before
    /// it starts). After the first failure no file starts; those under way
    /// finish, and each that fails is named on stderr. The first failure is
    /// the copy's.
    async fn copy_plan(&self, from: &Loc, to: &Loc, plan: &[Item]) -> anyhow::Result<()> {
        use futures::stream::{FuturesUnordered, StreamExt};
        let mut in_flight = FuturesUnordered::new();
        let mut first: Option<anyhow::Error> = None;
        let note = |first: &mut Option<anyhow::Error>, r: anyhow::Result<()>| {
            if let Err(e) = r {
                match first {
                    None => *first = Some(e),
                    Some(_) => self.bar.suspend(|| eprintln!("error: {e:#}")),
                }
            }
        };
        for item in plan {
            if matches!(item.kind, Kind::File { .. }) {
                while in_flight.len() >= FILES_IN_FLIGHT_MAX {
                    if let Some(r) = in_flight.next().await {
                        note(&mut first, r);
                    }
                }
                if first.is_some() {
                    break;
                }
                in_flight.push(self.copy_item(from, to, item));
                continue;
            }
            // Made in order, while the files under way go on.
            let made = self.copy_item(from, to, item);
            tokio::pin!(made);
            let r = loop {
                tokio::select! {
                    r = &mut made => break r,
                    Some(r) = in_flight.next(), if !in_flight.is_empty() => note(&mut first, r),
                }
            };
            note(&mut first, r);
            if first.is_some() {
                break;
            }
        }
        while let Some(r) = in_flight.next().await {
            note(&mut first, r);
        }
        first.map_or(Ok(()), Err)
    }

    async fn copy_item(&self, from: &Loc, to: &Loc, item: &Item) -> anyhow::Result<()> {
        let (src, dst) = match (from, to) {
            (Loc::Local(f), Loc::Remote(t)) => (Loc::Local(join_local(f, &item.rel)), Loc::Remote(join(t, &item.rel))),
            (Loc::Remote(f), Loc::Local(t)) => (Loc::Remote(join(f, &item.rel)), Loc::Local(join_local(t, &item.rel))),
            (Loc::Remote(f), Loc::Remote(t)) => (Loc::Remote(join(f, &item.rel)), Loc::Remote(join(t, &item.rel))),
            (Loc::Local(_), Loc::Local(_)) => anyhow::bail!("one side of a copy must be in nasd"),
        };
        self.bar.set_message(if item.rel.is_empty() { src.to_string() } else { item.rel.clone() });
        let outcome = match &item.kind {
            Kind::Dir { mode } => self.dir(&dst, *mode).await?,
            Kind::Symlink { target } => self.symlink(target, &dst).await?,
            Kind::File { mode, .. } => match (&src, &dst) {
                (Loc::Remote(s), Loc::Local(d)) => self.get_file(s, d).await?,
                (Loc::Local(_), Loc::Local(_)) => unreachable!("refused above"),
                (_, Loc::Remote(d)) => {
                    let mut again = 0;
                    loop {
                        let copied = match &src {
                            Loc::Local(s) => self.put_file(s, d, *mode).await,
                            Loc::Remote(s) => self.copy_file(s, d).await,
                        };
                        match copied {
                            Err(e) if again < MANAGER_LOST_COPIES_MAX && manager_lost(&e) => {
                                again += 1;
                                self.bar.suspend(|| {
                                    eprintln!("{d}: the manager went away part-way ({e:#}); copying it again")
                                });
                                self.undo.discard_temporaries_of(self.fs, d).await;
                            }
                            r => break r?,
                        }
                    }
                }
            },
        };
        if let Outcome::Skipped = outcome {
            lock(&self.stats).skipped += 1;
            self.bar.suspend(|| eprintln!("not overwritten (--no-clobber): {dst} exists"));
            if let Kind::File { len, .. } = item.kind {
                self.bar.inc(len);
            }
        }
        Ok(())
    }

    /// A directory: made if missing (with owner rights while it is filled), merged into if present.
    async fn dir(&self, dst: &Loc, mode: u32) -> anyhow::Result<Outcome> {
        let filling = mode | 0o700;
        match dst {
            Loc::Remote(p) => match remote_lstat(self.fs, p).await? {
                Some(st) if st.attr.kind == FileKind::Dir => return Ok(Outcome::Copied),
                Some(_) => anyhow::bail!("cannot replace {p}, which is not a directory, with a directory"),
                None => {
                    self.undo
                        .making(Made::RemoteDir(p.clone()), self.fs.mkdir(p, filling))
                        .await
                        .with_context(|| format!("cannot make directory {p}"))?;
                    lock(&self.made_dirs).insert(p.clone());
                }
            },
            Loc::Local(p) => match std::fs::symlink_metadata(p) {
                Ok(m) if m.is_dir() => return Ok(Outcome::Copied),
                Ok(_) => anyhow::bail!("cannot replace {}, which is not a directory, with a directory", p.display()),
                Err(_) => {
                    use std::os::unix::fs::DirBuilderExt;
                    std::fs::DirBuilder::new()
                        .mode(filling)
                        .create(p)
                        .with_context(|| format!("cannot make directory {}", p.display()))?;
                    self.undo.push(Made::LocalDir(p.clone()));
                }
            },
        }
        if filling != mode {
            lock(&self.fix_modes).push((dst.clone(), mode));
        }
        lock(&self.stats).dirs += 1;
        Ok(Outcome::Copied)
    }

    /// Gives directories made with owner rights added their own modes, deepest first.
    async fn fix_dir_modes(&self) -> anyhow::Result<()> {
        let fix_modes = std::mem::take(&mut *lock(&self.fix_modes));
        for (dir, mode) in fix_modes.into_iter().rev() {
            match &dir {
                Loc::Remote(p) => {
                    self.fs.chmod(p, mode).await.with_context(|| format!("cannot set the mode of {p}"))?;
                }
                Loc::Local(p) => std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
                    .with_context(|| format!("cannot set the mode of {}", p.display()))?,
            }
        }
        Ok(())
    }

    async fn symlink(&self, target: &str, dst: &Loc) -> anyhow::Result<Outcome> {
        match dst {
            Loc::Remote(p) => {
                let existing = remote_lstat(self.fs, p).await?;
                if existing.is_some() && self.opts.no_clobber {
                    return Ok(Outcome::Skipped);
                }
                let tmp = remote_tmp_name(p)?;
                self.undo
                    .making(Made::RemoteTmp(tmp.clone()), self.fs.symlink(target, &tmp))
                    .await
                    .with_context(|| format!("cannot make the link {p}"))?;
                let outcome = self.publish_remote(&tmp, p, existing.is_some()).await?;
                if let Outcome::Copied = outcome {
                    lock(&self.stats).links += 1;
                }
                Ok(outcome)
            }
            Loc::Local(p) => {
                let exists = std::fs::symlink_metadata(p).is_ok();
                if exists && self.opts.no_clobber {
                    return Ok(Outcome::Skipped);
                }
                let (dir, name) = local_parts(p);
                let tmp = dir.join(format!(".{name}.{}{TMP_SUFFIX}", hex4()));
                std::os::unix::fs::symlink(target, &tmp)
                    .with_context(|| format!("cannot make the link {}", p.display()))?;
                let r = if self.opts.no_clobber {
                    std::fs::hard_link(&tmp, p).and_then(|()| std::fs::remove_file(&tmp))
                } else {
                    std::fs::rename(&tmp, p)
                };
                if let Err(e) = r {
                    let _ = std::fs::remove_file(&tmp);
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        return Ok(Outcome::Skipped);
                    }
                    return Err(e).with_context(|| format!("cannot make the link {}", p.display()));
                }
                if !exists {
                    self.undo.push(Made::LocalFile(p.clone()));
                }
                lock(&self.stats).links += 1;
                Ok(Outcome::Copied)
            }
        }
    }

    /// The mode and owner a new nasd file at `dst` gets; `None` with `--no-clobber` if it exists.
    async fn remote_dest(&self, dst: &str, source_mode: u32) -> anyhow::Result<Option<(Option<FileAttr>, u32)>> {
        let (dir, _) = nasd_fs::split_path(dst)?;
        // A directory this copy made held nothing: no request needed to know `dst` is new
        // (a name another client makes there meanwhile is replaced, or kept with -n).
        let made_here = lock(&self.made_dirs).contains(dir);
        let existing = if made_here { None } else { remote_lstat(self.fs, dst).await?.map(|st| st.attr) };
        match existing {
            Some(a) if a.kind == FileKind::Dir => {
                anyhow::bail!("cannot replace {dst}, a directory, with a file")
            }
            Some(_) if self.opts.no_clobber => Ok(None),
            Some(a) => {
                let mode = a.mode;
                Ok(Some((Some(a), mode)))
            }
            None => Ok(Some((None, source_mode & 0o777))),
        }
    }

    /// `put`: a local file into nasd.
    async fn put_file(&self, src: &Path, dst: &str, mode: u32) -> anyhow::Result<Outcome> {
        // Open the source before anything is made in nasd.
        let file = tokio::fs::File::open(src).await.with_context(|| format!("cannot read {}", src.display()))?;
        let before = file.metadata().await.with_context(|| format!("cannot read {}", src.display()))?;
        let len = before.len();
        let Some((existing, mode)) = self.remote_dest(dst, mode).await? else { return Ok(Outcome::Skipped) };
        let r = self.begin_replace(dst, mode).await?;
        let f = r.file().map_err(|e| layer_error(e, dst))?;
        let mut reader = self.bar.wrap_async_read(tokio::io::BufReader::with_capacity(1 << 20, file));
        match f.write_from(0, len, &mut reader).await {
            Err(FsError::Local(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => anyhow::bail!(
                "{} shrank while it was copied (it had {len} bytes at the start): copy it again once it stops \
                 changing",
                src.display()
            ),
            r => r.map_err(|e| transfer_error(e, src, true, dst))?,
        };
        if let Some(change) = changed_since(src, &before, &mut reader).await {
            lock(&self.changed).push(format!(
                "{} {change} while it was copied to {dst}: {dst} holds its first {len} bytes as they were read",
                src.display()
            ));
        }
        f.flush().await.map_err(|e| transfer_error(e, src, true, dst))?;
        drop(f);
        let outcome = self.publish(r, dst, existing.as_ref()).await?;
        self.count_file(&outcome, len);
        Ok(outcome)
    }

    /// The layer files are written through, made at the first use (it
    /// resolves the root).
    async fn layer(&self) -> anyhow::Result<nasd_vfs::Vfs> {
        let vfs = self
            .vfs
            .get_or_try_init(|| async {
                // A short command: no change feed (nothing it caches outlives the copy).
                let config = nasd_vfs::VfsConfig { follow_feed: false, ..nasd_vfs::VfsConfig::default() };
                nasd_vfs::Vfs::start(self.fs.clone(), config).await.context("cannot reach the root directory")
            })
            .await?;
        Ok(vfs.clone())
    }

    /// The inode of nasd directory `dir`, resolved once per copy.
    async fn dir_ino(&self, dir: &str) -> anyhow::Result<nasd_fs::Ino> {
        if let Some(ino) = lock(&self.dirs).get(dir).copied() {
            return Ok(ino);
        }
        let vfs = self.layer().await?;
        let e = vfs.resolve(self.fs, dir).await.map_err(|e| layer_error(e, dir))?;
        anyhow::ensure!(e.attr.kind == FileKind::Dir, "{dir} is not a directory");
        lock(&self.dirs).insert(dir.to_string(), e.attr.ino);
        Ok(e.attr.ino)
    }

    /// Creates the temporary file beside `dst` (its name recorded first, so
    /// an interruption removes it) and opens it for writing.
    async fn begin_replace(&self, dst: &str, mode: u32) -> anyhow::Result<nasd_vfs::Replacement> {
        let (dir, name) = nasd_fs::split_path(dst)?;
        let parent = self.dir_ino(dir).await?;
        let vfs = self.layer().await?;
        let temp = nasd_vfs::temp_name(name);
        let begin = async { vfs.begin_replace(self.fs, parent, name, &temp, mode).await.map_err(fs_error) };
        self.undo.making(Made::RemoteTmp(join(dir, &temp)), begin).await.with_context(|| format!("cannot create {dst}"))
    }

    /// `cp nasd:A nasd:B`: a file within nasd, piece by piece.
    async fn copy_file(&self, src: &str, dst: &str) -> anyhow::Result<Outcome> {
        let from = self.fs.open(src, false).await.with_context(|| format!("cannot read {src}"))?;
        if let Some(st) = remote_lstat(self.fs, dst).await? {
            anyhow::ensure!(st.attr.ino != from.ino(), "{src} and {dst} are the same file");
        }
        let Some((existing, mode)) = self.remote_dest(dst, from.attr().mode).await? else {
            return Ok(Outcome::Skipped);
        };
        let len = from.size();
        let r = self.begin_replace(dst, mode).await?;
        let to = r.file().map_err(|e| layer_error(e, dst))?;
        let piece = nasd_fs::TRANSFER_PIECE_DEFAULT as u64;
        let mut at = 0;
        while at < len {
            let data = from.read_at(at, piece.min(len - at)).await.with_context(|| format!("cannot read {src}"))?;
            anyhow::ensure!(!data.is_empty(), "{src} shrank while being copied");
            to.write_at(at, &data).await.with_context(|| format!("cannot write {dst}"))?;
            at += data.len() as u64;
            self.bar.inc(data.len() as u64);
        }
        to.flush().await.with_context(|| format!("cannot write {dst}"))?;
        drop(to);
        let outcome = self.publish(r, dst, existing.as_ref()).await?;
        self.count_file(&outcome, len);
        Ok(outcome)
    }

    /// An administrator replacing another user's file gives the new one its owner and group.
    async fn keep_owner(&self, r: &nasd_vfs::Replacement, existing: Option<&FileAttr>) -> anyhow::Result<()> {
        let me = self.fs.identity();
        if let Some(a) = existing {
            if me.admin && (a.uid, a.gid) != (me.uid, me.gid) {
                let vfs = self.layer().await?;
                let change = nasd_fs::SetAttr { uid: Some(a.uid), gid: Some(a.gid), ..Default::default() };
                vfs.setattr(self.fs, r.entry().attr.ino, change)
                    .await
                    .map_err(|e| layer_error(e, r.temp()))
                    .with_context(|| format!("cannot chown {}", r.temp()))?;
            }
        }
        Ok(())
    }

    /// Commits the finished replacement `r` and puts it in place of `dst`:
    /// a rename, or with `--no-clobber` a hard link that fails if `dst`
    /// appeared (the temporary name is removed either way).
    async fn publish(
        &self,
        r: nasd_vfs::Replacement,
        dst: &str,
        existing: Option<&FileAttr>,
    ) -> anyhow::Result<Outcome> {
        self.keep_owner(&r, existing).await?;
        let (dir, _) = nasd_fs::split_path(dst)?;
        let tmp = join(dir, r.temp());
        let no_clobber = self.opts.no_clobber;
        let publish = async { r.publish(no_clobber).await.map_err(fs_error) };
        // The old file, once replaced, stays replaced (by a whole new one).
        let published = if existing.is_some() && !no_clobber {
            publish.await
        } else {
            self.undo.making(Made::RemoteFile(dst.to_string()), publish).await
        };
        let published = published.with_context(|| format!("cannot create {dst}"))?;
        self.undo.published(&tmp);
        if !published {
            self.undo.forget_made(dst);
            return Ok(Outcome::Skipped);
        }
        Ok(Outcome::Copied)
    }

    /// Puts the finished temporary `tmp` (a symbolic link) in place of `dst`:
    /// a rename, or with `--no-clobber` a hard link that fails if `dst` appeared.
    async fn publish_remote(&self, tmp: &str, dst: &str, replaces: bool) -> anyhow::Result<Outcome> {
        let made = Made::RemoteFile(dst.to_string());
        if self.opts.no_clobber {
            match self.undo.making(made, self.fs.link(tmp, dst)).await {
                Ok(_) => {}
                Err(e) if e.status() == Some(FsStatus::Exists) => {
                    self.fs.unlink(tmp).await.with_context(|| format!("cannot remove {tmp}"))?;
                    self.undo.published(tmp);
                    return Ok(Outcome::Skipped);
                }
                Err(e) => return Err(anyhow::Error::new(e).context(format!("cannot create {dst}"))),
            }
            self.fs.unlink(tmp).await.with_context(|| format!("cannot remove {tmp}"))?;
        } else if replaces {
            // The old file, once replaced, stays replaced (by a whole new one).
            self.fs.rename(tmp, dst).await.with_context(|| format!("cannot create {dst}"))?;
        } else {
            self.undo.making(made, self.fs.rename(tmp, dst)).await.with_context(|| format!("cannot create {dst}"))?;
        }
        self.undo.published(tmp);
        Ok(Outcome::Copied)
    }

    /// `get`: a nasd file to this machine.
    async fn get_file(&self, src: &str, dst: &Path) -> anyhow::Result<Outcome> {
        // Open the source before anything is made here.
        let f = self.fs.open(src, false).await.with_context(|| format!("cannot read {src}"))?;
        let existing = match std::fs::symlink_metadata(dst) {
            Ok(m) if m.is_dir() => anyhow::bail!("cannot replace {}, a directory, with a file", dst.display()),
            Ok(_) if self.opts.no_clobber => return Ok(Outcome::Skipped),
            Ok(m) => Some(m.permissions().mode() & 0o7777),
            Err(_) => None,
        };
        let (dir, name) = local_parts(dst);
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(TMP_SUFFIX)
            // The kernel applies the umask, as for any new file.
            .permissions(std::fs::Permissions::from_mode(f.attr().mode & 0o777))
            .tempfile_in(dir)
            .with_context(|| format!("cannot create {}", dst.display()))?;
        let len = f.size();
        let out = tokio::fs::File::from_std(
            tmp.as_file().try_clone().with_context(|| format!("cannot create {}", dst.display()))?,
        );
        let mut writer = self.bar.wrap_async_write(tokio::io::BufWriter::with_capacity(1 << 20, out));
        let got = f.read_to(0, len, &mut writer).await.map_err(|e| transfer_error(e, dst, false, src))?;
        anyhow::ensure!(got == len, "{src} shrank while being copied ({got} of {len} bytes)");
        tmp.as_file().sync_all().with_context(|| format!("cannot write {}", dst.display()))?;
        if let Some(mode) = existing {
            std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("cannot write {}", dst.display()))?;
        }
        // Dropping `tmp` on any failure removes it.
        let persisted = if self.opts.no_clobber { tmp.persist_noclobber(dst) } else { tmp.persist(dst) };
        match persisted {
            Ok(_) => {}
            Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => return Ok(Outcome::Skipped),
            Err(e) => return Err(e.error).with_context(|| format!("cannot create {}", dst.display())),
        }
        if existing.is_none() {
            self.undo.push(Made::LocalFile(dst.to_path_buf()));
        }
        self.count_file(&Outcome::Copied, len);
        Ok(Outcome::Copied)
    }

    fn count_file(&self, outcome: &Outcome, len: u64) {
        if let Outcome::Copied = outcome {
            let mut stats = lock(&self.stats);
            stats.files += 1;
            stats.bytes += len;
        }
    }
}

/// A local path's directory (`.` if none) and name.
fn local_parts(p: &Path) -> (PathBuf, String) {
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    (dir, name)
}

fn hex4() -> String {
    let tag: [u8; 4] = nasd_crypto::random_bytes();
    tag.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_what_was_copied() {
        let s = Stats { files: 3, dirs: 1, links: 0, bytes: 12 << 20, skipped: 0 };
        let line = summary(&s, Duration::from_millis(1200));
        assert_eq!(line, "copied 3 files, 1 directory (12.0 MiB) in 1.2 s, 10.0 MiB/s");
        let s = Stats { files: 1, dirs: 0, links: 2, bytes: 5, skipped: 4 };
        let line = summary(&s, Duration::from_secs(1));
        assert!(line.starts_with("copied 1 file, 2 symbolic links (5 B) in 1.0 s"), "{line}");
        assert!(line.ends_with("; 4 left alone (--no-clobber)"), "{line}");
    }

    #[tokio::test]
    async fn a_name_is_recorded_before_its_request_and_kept_unless_refused() {
        let undo = Undo::default();
        let recorded = |undo: &Undo| undo.made.lock().unwrap().clone();
        let refused = FsError::Fs { status: FsStatus::Exists, message: "exists".into() };
        let r = undo.making(Made::RemoteDir("/a".into()), async { Err::<(), _>(refused) }).await;
        assert!(r.is_err() && recorded(&undo).is_empty(), "refused: nothing was made");
        let lost = FsError::Io(std::io::Error::other("connection reset"));
        let r = undo.making(Made::RemoteTmp("/b".into()), async { Err::<(), _>(lost) }).await;
        assert!(r.is_err());
        assert_eq!(recorded(&undo), [Made::RemoteTmp("/b".into())], "outcome unknown: removal is tried");
        undo.making(Made::RemoteFile("/c".into()), async { Ok::<_, FsError>(()) }).await.unwrap();
        // Interrupted with the request in flight (the future dropped unfinished): still recorded.
        let in_flight = undo.making(Made::RemoteDir("/d".into()), std::future::pending::<Result<(), FsError>>());
        assert!(tokio::time::timeout(Duration::ZERO, in_flight).await.is_err());
        let want = [Made::RemoteTmp("/b".into()), Made::RemoteFile("/c".into()), Made::RemoteDir("/d".into())];
        assert_eq!(recorded(&undo), want);
        undo.published("/b");
        assert_eq!(recorded(&undo), want[1..]);
    }

    #[test]
    fn a_manager_lost_part_way_is_told_through_either_layer() {
        let io = || FsError::Io(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset"));
        assert!(manager_lost(&anyhow::Error::from(io()).context("cannot create /a")));
        assert!(manager_lost(&anyhow::Error::from(nasd_vfs::VfsError::Fs(io())).context("cannot create /a")));
        let refused =
            nasd_vfs::VfsError::Fs(FsError::Fs { status: nasd_fs::FsStatus::NotFound, message: "no such file".into() });
        assert!(!manager_lost(&anyhow::Error::from(refused)));
        assert!(!manager_lost(&anyhow::Error::from(nasd_vfs::VfsError::BadDescriptor)));
    }

    #[test]
    fn a_local_path_under_a_file_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let slash = |p: &Path| PathBuf::from(format!("{}/", p.display()));
        assert_eq!(file_among_ancestors(&slash(&file)), Some(file.clone()));
        assert_eq!(file_among_ancestors(&file.join("x/y")), Some(file.clone()));
        assert_eq!(file_among_ancestors(&dir.path().join("d/x")), None);
        assert_eq!(file_among_ancestors(&dir.path().join("missing/x")), None);
        let e = resolve_local(&slash(&file), "n", false).unwrap_err().to_string();
        assert_eq!(e, format!("{}/: {} is not a directory", file.display(), file.display()));
    }

    #[test]
    fn names_and_temporary_names() {
        assert_eq!(source_name(&Loc::Remote("/docs/a.txt".into())).unwrap(), "a.txt");
        assert_eq!(source_name(&Loc::Remote("/docs/".into())).unwrap(), "docs");
        assert_eq!(source_name(&Loc::Remote("/".into())).unwrap(), "");
        assert_eq!(source_name(&Loc::Local("dir/b.bin".into())).unwrap(), "b.bin");
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/d/", ""), "/d/");
        let t = remote_tmp_name("/d/a.txt").unwrap();
        assert!(t.starts_with("/d/.a.txt.") && t.ends_with(TMP_SUFFIX), "{t}");
        assert_ne!(t, remote_tmp_name("/d/a.txt").unwrap(), "each copy its own");
    }
}
