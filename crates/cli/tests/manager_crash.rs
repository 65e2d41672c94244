//! Crash consistency of the real `nasd manager` binary.
//!
//! The test runs two `nasd drive` processes and a `nasd manager` process (TLS,
//! security on, a small object pool so pools are refilled often, working keys
//! rotated every two seconds) on loopback, takes both drives into service
//! through the client library as `admin`, and then, three times over on the
//! same data directories:
//!
//! 1. runs a burst of name-space operations from concurrent clients, each in
//!    its own subtree (`/w0`, `/w1`, …): mkdir, create + write + flush +
//!    close, overwrite (create with truncate), rename (within and across
//!    directories, of files, symlinks and directories, onto free names and
//!    replacing files, symlinks, empty directories and other links of the
//!    same file), unlink, rmdir, symlink and hard link, recording every
//!    operation the manager acknowledged in a model of the subtree;
//! 2. SIGKILLs the manager while the clients are still issuing requests; the
//!    one operation each client had in flight may have happened or not (or,
//!    for the multi-request create/overwrite, stopped between requests);
//! 3. while the manager is down, creates objects on every drive behind its
//!    back (with the drive key from the manager's sealed drive table): what
//!    a crash between "object created on the drive" and "object recorded"
//!    leaves;
//! 4. restarts the manager on the same data, reconnects and checks every
//!    subtree against the model: the same names, kinds, symlink targets,
//!    hard-link groups, link counts, recorded sizes, and every file's content
//!    read back byte for byte from its drive (so no file points at a missing
//!    object); the in-flight operation may have any of its outcomes, nothing
//!    else may differ. The injected objects must be gone (orphans collected).
//!
//! Then the manager and the drives stop cleanly (SIGTERM) and the test opens
//! the manager's metadata (`nasd_meta`) and each drive's store (`nasd_store`)
//! directly: the metadata's tree is the model, each file's object holds the
//! model's content and the access control version the manager mints
//! capabilities with, every ordinary object in each drive's partition is
//! known to the manager (a file's, pooled, or doomed) and every file's and
//! pooled object is on its drive, and — right after a recovery — both
//! intention logs are empty.
//!
//! Orphan collection at start removes any object nothing records, so it
//! would also hide a leak of the ordinary (crash-free) paths. So the test
//! restarts everything once more, runs a last burst without a kill, checks
//! the tree online, stops cleanly and checks the disks again (doomed objects
//! may still be logged, but must already be off their drives). That check is
//! then run once more after planting a stray object and deleting a file's
//! object in the opened stores, and must report both — so it is not vacuous.
//!
//! The schedule (kill delays, operations) comes from one seed, printed at the
//! start and on failure; `NASD_CRASH_SEED=N` replays it (thread timing still
//! varies from run to run).

mod common;

use common::{log_tail, Daemon};
use nasd_client::{Auth, Credential, DriveClient};
use nasd_fs::{FileAttr, FileKind, FsClient, FsConfig, FsError};
use nasd_manager::keys::DriveKeys;
use nasd_meta::{AcvIntent, Caller, Inode, Layout, Namespace, ObjectRef, Sqlite, ROOT_INO};
use nasd_proto::well_known::{FIRST_USER_OBJECT, PARTITION_CONTENTS};
use nasd_proto::{AttrMask, Attributes, Protection, Region, Status};
use nasd_store::{Store, StoreOptions, VecSink};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The partition the manager uses on every drive (its default).
const PARTITION: u64 = 1;
const DRIVES: usize = 2;
const DRIVE_CAPACITY: &str = "1GiB";
const DRIVE_CAPACITY_BYTES: u64 = 1 << 30;
/// Empty objects the manager keeps ready per drive: small, so refills (drive
/// creates, then one recording transaction) happen all through the burst.
const OBJECT_POOL: usize = 8;
/// Working-key rotation interval and capability lifetimes, seconds.
const KEY_ROTATION_SECS: u64 = 2;
/// Write-transaction lease, seconds. A worker's transaction open when its
/// manager was killed holds the file until the lease runs out (a new
/// `BEGIN_WRITE` on it waits at most 10 s, then answers `BUSY`).
const WRITE_LEASE_SECS: u64 = 2;
/// Kill/restart rounds on the same data.
const ROUNDS: usize = 3;
/// Concurrent clients, each with its own subtree and connection.
const WORKERS: usize = 3;
/// Kill delay range after the burst starts, milliseconds.
const KILL_AFTER_MS: std::ops::RangeInclusive<u64> = 1000..=2000;
/// Objects planted on each drive while the manager is down.
const PLANTED_PER_DRIVE: usize = 2;
/// A subtree with more entries than this mostly shrinks.
const ENTRIES_SOFT_MAX: usize = 60;
/// Longest file content written.
const CONTENT_MAX: usize = 3000;
/// Longest a single step may take before the test calls it a hang (not a
/// timing assertion: every step normally takes a small fraction of it).
const STEP: Duration = Duration::from_secs(60);

#[test]
fn manager_sigkill_during_namespace_burst() {
    // Unoptimized builds give long `async fn`s big poll frames: run the
    // scenario on a thread (and runtime workers) with roomy stacks.
    std::thread::Builder::new()
        .name("scenario".into())
        .stack_size(64 << 20)
        .spawn(run_test)
        .expect("spawn the scenario thread")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

// ------------------------------------------------------------------- model

/// A name in a subtree, as the model knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MNode {
    Dir,
    /// A regular file, by model file id (hard links share it).
    File(u64),
    Symlink(String),
}

/// A regular file's state.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileState {
    /// The bytes on its drive object.
    content: Vec<u8>,
    /// The size the manager has recorded (set at create/truncate and at the writer's commit).
    recorded: u64,
}

/// One client's subtree. Paths are relative to the subtree's root ("" is the
/// root itself, never stored), components joined with '/'.
#[derive(Debug, Clone, Default)]
struct Model {
    nodes: BTreeMap<String, MNode>,
    files: BTreeMap<u64, FileState>,
    next_fid: u64,
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Whether `path` is `dir` or lies below it.
fn within(path: &str, dir: &str) -> bool {
    dir.is_empty() || path == dir || (path.starts_with(dir) && path.as_bytes().get(dir.len()) == Some(&b'/'))
}

impl Model {
    fn dirs(&self) -> Vec<String> {
        let mut d = vec![String::new()];
        d.extend(self.nodes.iter().filter(|(_, n)| **n == MNode::Dir).map(|(p, _)| p.clone()));
        d
    }

    fn paths_where(&self, f: impl Fn(&MNode) -> bool) -> Vec<String> {
        self.nodes.iter().filter(|(_, n)| f(n)).map(|(p, _)| p.clone()).collect()
    }

    fn is_empty_dir(&self, dir: &str) -> bool {
        self.nodes.get(dir) == Some(&MNode::Dir) && !self.nodes.keys().any(|p| p != dir && within(p, dir))
    }

    /// Removes one name (a non-directory or an empty directory); a file's
    /// state goes with its last name.
    fn remove(&mut self, path: &str) {
        if let Some(MNode::File(fid)) = self.nodes.remove(path) {
            if !self.nodes.values().any(|n| *n == MNode::File(fid)) {
                self.files.remove(&fid);
            }
        }
    }

    /// POSIX rename of a (valid) move: replaces `dst`, carries a directory's subtree.
    fn rename(&mut self, src: &str, dst: &str) {
        match (self.nodes.get(src), self.nodes.get(dst)) {
            (Some(MNode::File(a)), Some(MNode::File(b))) if a == b => return,
            _ => {}
        }
        if self.nodes.contains_key(dst) {
            self.remove(dst);
        }
        let moved: Vec<String> = self.nodes.keys().filter(|p| within(p, src)).cloned().collect();
        for p in moved {
            let node = self.nodes.remove(&p).expect("listed above");
            self.nodes.insert(format!("{dst}{}", &p[src.len()..]), node);
        }
    }

    fn new_file(&mut self, path: &str, state: FileState) -> u64 {
        let fid = self.next_fid;
        self.next_fid += 1;
        self.nodes.insert(path.to_string(), MNode::File(fid));
        self.files.insert(fid, state);
        fid
    }

    /// What can be compared with what the manager serves.
    fn normalize(&self) -> Tree {
        let mut links: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for (p, n) in &self.nodes {
            if let MNode::File(fid) = n {
                links.entry(*fid).or_default().push(p.clone());
            }
        }
        self.nodes
            .iter()
            .map(|(p, n)| {
                let norm = match n {
                    MNode::Dir => Norm::Dir,
                    MNode::Symlink(t) => Norm::Symlink(t.clone()),
                    MNode::File(fid) => {
                        let s = &self.files[fid];
                        Norm::File {
                            links: links[fid].clone(),
                            content: read_view(&s.content, s.recorded),
                            recorded: s.recorded,
                        }
                    }
                };
                (p.clone(), norm)
            })
            .collect()
    }
}

/// What a client reads of an object holding `content` under the recorded
/// size: up to the size, the bytes the object lacks below it as zeros. Bytes
/// past it are a write transaction's not yet committed (the manager rolls it
/// back when its lease runs out) and nobody reads them.
fn read_view(content: &[u8], recorded: u64) -> Vec<u8> {
    let mut v = content[..content.len().min(recorded as usize)].to_vec();
    v.resize(recorded as usize, 0);
    v
}

/// A name as observed (or as a model predicts it): files carry every name of
/// their inode, so hard-link groups are compared too.
#[derive(Clone, PartialEq, Eq)]
enum Norm {
    Dir,
    File {
        links: Vec<String>,
        content: Vec<u8>,
        recorded: u64,
    },
    Symlink(String),
    /// A FIFO, socket or device (the workload makes none; shown if one appears).
    Special(FileKind),
}

impl std::fmt::Debug for Norm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Norm::Dir => write!(f, "dir"),
            Norm::Symlink(t) => write!(f, "symlink -> {t:?}"),
            Norm::Special(kind) => write!(f, "{kind:?}"),
            Norm::File { links, content, recorded } => write!(
                f,
                "file of {} bytes (fnv {:016x}), recorded size {recorded}, names {links:?}",
                content.len(),
                fnv(content)
            ),
        }
    }
}

type Tree = BTreeMap<String, Norm>;

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Where two trees differ (at most 20 lines).
fn diff(got: &Tree, want: &Tree) -> String {
    let mut out = Vec::new();
    for (p, g) in got {
        match want.get(p) {
            None => out.push(format!("  {p}: unexpected {g:?}")),
            Some(w) if w != g => out.push(format!("  {p}: found {g:?}, expected {w:?}")),
            Some(_) => {}
        }
    }
    for (p, w) in want {
        if !got.contains_key(p) {
            out.push(format!("  {p}: missing {w:?}"));
        }
    }
    let n = out.len();
    out.truncate(20);
    if n > 20 {
        out.push(format!("  ... and {} more", n - 20));
    }
    out.join("\n")
}

// ------------------------------------------------------------- operations

#[derive(Debug, Clone)]
enum Op {
    Mkdir(String),
    /// Exclusive create, then write + flush (if any content) and close.
    Create(String, Vec<u8>),
    /// Create with truncate on an existing file, then write + flush + close.
    Overwrite(String, Vec<u8>),
    Rename(String, String),
    Unlink(String),
    Rmdir(String),
    /// (link path, target)
    Symlink(String, String),
    /// (existing file, new name)
    Link(String, String),
}

impl Op {
    fn kind(&self) -> &'static str {
        match self {
            Op::Mkdir(..) => "mkdir",
            Op::Create(..) => "create",
            Op::Overwrite(..) => "overwrite",
            Op::Rename(..) => "rename",
            Op::Unlink(..) => "unlink",
            Op::Rmdir(..) => "rmdir",
            Op::Symlink(..) => "symlink",
            Op::Link(..) => "link",
        }
    }

    fn describe(&self) -> String {
        match self {
            Op::Create(p, d) | Op::Overwrite(p, d) => format!("{} {p} ({} bytes)", self.kind(), d.len()),
            Op::Mkdir(p) | Op::Unlink(p) | Op::Rmdir(p) => format!("{} {p}", self.kind()),
            Op::Rename(a, b) | Op::Link(a, b) => format!("{} {a} -> {b}", self.kind()),
            Op::Symlink(p, t) => format!("symlink {p} -> {t:?}"),
        }
    }

    /// The states the subtree can be left in by this operation, in order:
    /// after each of its requests (the last: completed). An operation of one
    /// request has one. `Overwrite` also lists the state between the drive
    /// truncation the manager does first and its metadata commit (recorded
    /// size 0): a kill in between leaves the object empty under the old
    /// recorded size (read as zeros up to it; never old bytes under a
    /// committed truncation). Written bytes not yet committed (the writer's
    /// write transaction open at the kill) lie past the recorded size, which
    /// readers stop at.
    fn outcomes(&self, m: &Model) -> Vec<Model> {
        let mut after = m.clone();
        match self {
            Op::Mkdir(p) => {
                after.nodes.insert(p.clone(), MNode::Dir);
            }
            Op::Create(p, data) => {
                let fid = after.new_file(p, FileState { content: Vec::new(), recorded: 0 });
                if data.is_empty() {
                    return vec![after];
                }
                let mut written = after.clone();
                written.files.insert(fid, FileState { content: data.clone(), recorded: 0 });
                let mut closed = written.clone();
                closed.files.insert(fid, FileState { content: data.clone(), recorded: data.len() as u64 });
                return vec![after, written, closed];
            }
            Op::Overwrite(p, data) => {
                let MNode::File(fid) = after.nodes[p] else { panic!("overwrite of a non-file") };
                after.files.get_mut(&fid).expect("file state").content = Vec::new();
                let mut truncated = after.clone();
                truncated.files.insert(fid, FileState { content: Vec::new(), recorded: 0 });
                if data.is_empty() {
                    return vec![after, truncated];
                }
                let mut written = truncated.clone();
                written.files.insert(fid, FileState { content: data.clone(), recorded: 0 });
                let mut closed = written.clone();
                closed.files.insert(fid, FileState { content: data.clone(), recorded: data.len() as u64 });
                return vec![after, truncated, written, closed];
            }
            Op::Rename(a, b) => after.rename(a, b),
            Op::Unlink(p) | Op::Rmdir(p) => after.remove(p),
            Op::Symlink(p, t) => {
                after.nodes.insert(p.clone(), MNode::Symlink(t.clone()));
            }
            Op::Link(existing, new) => {
                let node = after.nodes[existing].clone();
                after.nodes.insert(new.clone(), node);
            }
        }
        vec![after]
    }
}

fn content(rng: &mut StdRng) -> Vec<u8> {
    let len = match rng.gen_range(0..10) {
        0 => 0,
        1..=6 => rng.gen_range(1..=200),
        _ => rng.gen_range(201..=CONTENT_MAX),
    };
    let mut data = vec![0u8; len];
    rng.fill_bytes(&mut data);
    data
}

fn pick<T: Clone>(rng: &mut StdRng, v: &[T]) -> Option<T> {
    (!v.is_empty()).then(|| v[rng.gen_range(0..v.len())].clone())
}

/// A random operation that is valid on `m` (so the manager must accept it).
fn next_op(rng: &mut StdRng, m: &Model, counter: &mut u64) -> Op {
    let mut fresh = |prefix: &str| {
        *counter += 1;
        format!("{prefix}{counter}")
    };
    let dirs = m.dirs();
    let files = m.paths_where(|n| matches!(n, MNode::File(_)));
    let nondirs = m.paths_where(|n| *n != MNode::Dir);
    let empty_dirs: Vec<String> =
        m.paths_where(|n| *n == MNode::Dir).into_iter().filter(|d| m.is_empty_dir(d)).collect();
    let crowded = m.nodes.len() > ENTRIES_SOFT_MAX;
    for _ in 0..16 {
        let mut r = rng.gen_range(0..100);
        if crowded && !(37..81).contains(&r) && rng.gen_bool(0.6) {
            r = rng.gen_range(63..81); // unlink or rmdir instead of growing
        }
        let op = match r {
            0..=11 => Some(Op::Mkdir(join(&pick(rng, &dirs).unwrap(), &fresh("d")))),
            12..=36 => Some(Op::Create(join(&pick(rng, &dirs).unwrap(), &fresh("f")), content(rng))),
            37..=44 => pick(rng, &files).map(|f| Op::Overwrite(f, content(rng))),
            45..=62 => {
                let all: Vec<String> = m.nodes.keys().cloned().collect();
                pick(rng, &all).and_then(|src| {
                    let is_dir = m.nodes[&src] == MNode::Dir;
                    let replaceable: Vec<String> = if is_dir {
                        empty_dirs.iter().filter(|d| !within(d, &src)).cloned().collect()
                    } else {
                        nondirs.iter().filter(|p| **p != src).cloned().collect()
                    };
                    if rng.gen_bool(0.4) {
                        if let Some(dst) = pick(rng, &replaceable) {
                            return Some(Op::Rename(src, dst));
                        }
                    }
                    let parents: Vec<String> = dirs.iter().filter(|d| !is_dir || !within(d, &src)).cloned().collect();
                    pick(rng, &parents).map(|parent| Op::Rename(src, join(&parent, &fresh("r"))))
                })
            }
            63..=74 => pick(rng, &nondirs).map(Op::Unlink),
            75..=80 => pick(rng, &empty_dirs).map(Op::Rmdir),
            81..=89 => {
                let target = match rng.gen_range(0..3) {
                    0 => fresh("nowhere-"),
                    1 => format!("../{}", pick(rng, &nondirs).unwrap_or_else(|| "x".into())),
                    _ => format!("/w0/{}", pick(rng, &files).unwrap_or_else(|| "y".into())),
                };
                Some(Op::Symlink(join(&pick(rng, &dirs).unwrap(), &fresh("s")), target))
            }
            _ => pick(rng, &files).map(|f| Op::Link(f, join(&pick(rng, &dirs).unwrap(), &fresh("h")))),
        };
        if let Some(op) = op {
            return op;
        }
    }
    Op::Create(fresh("f"), content(rng))
}

async fn execute(fs: &FsClient, root: &str, op: &Op) -> Result<(), FsError> {
    let abs = |p: &str| format!("{root}/{p}");
    match op {
        Op::Mkdir(p) => fs.mkdir(&abs(p), 0o755).await.map(drop),
        Op::Create(p, data) | Op::Overwrite(p, data) => {
            let overwrite = matches!(op, Op::Overwrite(..));
            let f = fs.create(&abs(p), 0o644, !overwrite, overwrite).await?;
            if !data.is_empty() {
                f.write_at(0, data).await?;
                f.flush().await?;
            }
            f.close().await.map(drop)
        }
        Op::Rename(a, b) => fs.rename(&abs(a), &abs(b)).await,
        Op::Unlink(p) => fs.unlink(&abs(p)).await,
        Op::Rmdir(p) => fs.rmdir(&abs(p)).await,
        Op::Symlink(p, target) => fs.symlink(target, &abs(p)).await.map(drop),
        Op::Link(existing, new) => fs.link(&abs(existing), &abs(new)).await.map(drop),
    }
}

// ------------------------------------------------------------------ worker

struct WorkerOut {
    /// The model with every acknowledged operation applied.
    model: Model,
    counter: u64,
    /// Acknowledged operations, by kind.
    acked: BTreeMap<&'static str, usize>,
    /// The operation in flight at the kill and the states it may have left
    /// (besides `model` itself).
    in_flight: Option<(Op, Vec<Model>)>,
    /// A failure the kill does not explain.
    error: Option<String>,
}

/// How a burst ends.
#[derive(Clone, Default)]
struct Flags {
    /// Set just before the manager is SIGKILLed: failures from now on are the kill's.
    killed: Arc<AtomicBool>,
    /// Set to end a burst without a kill: workers stop between operations.
    stop: Arc<AtomicBool>,
}

/// Issues operations until the manager dies under it (or `stop`).
async fn worker(cfg: FsConfig, root: String, model: Model, counter: u64, seed: u64, flags: Flags) -> WorkerOut {
    let killed = flags.killed;
    let mut out = WorkerOut { model, counter, acked: BTreeMap::new(), in_flight: None, error: None };
    let fs = match FsClient::connect(&cfg).await {
        Ok(fs) => fs,
        Err(e) => {
            // A login the kill cut short did nothing; one that failed without a kill is a failure.
            if !killed.load(Ordering::SeqCst) {
                out.error = Some(format!("{root}: log in failed with no kill to explain it: {e}"));
            }
            return out;
        }
    };
    let mut rng = StdRng::seed_from_u64(seed);
    while !flags.stop.load(Ordering::SeqCst) {
        let op = next_op(&mut rng, &out.model, &mut out.counter);
        let mut states = op.outcomes(&out.model);
        match execute(&fs, &root, &op).await {
            Ok(()) => {
                out.model = states.pop().expect("an operation has an outcome");
                *out.acked.entry(op.kind()).or_default() += 1;
            }
            Err(e) => {
                if !killed.load(Ordering::SeqCst) {
                    out.error = Some(format!("{root}: {} failed with no kill to explain it: {e}", op.describe()));
                } else if let Some(status) = e.status() {
                    // A dead manager answers nothing: a refusal is a real answer to a valid request.
                    out.error = Some(format!("{root}: the manager refused {} ({status:?}): {e}", op.describe()));
                }
                out.in_flight = Some((op, states));
                return out;
            }
        }
    }
    out
}

/// Runs one burst of all workers: until `delay` has passed, then SIGKILLs
/// the manager (`kill`) or stops the workers between operations.
#[allow(clippy::too_many_arguments)]
fn burst(
    rt: &tokio::runtime::Runtime,
    cfg: &FsConfig,
    roots: &[String],
    models: &[Model],
    counters: &[u64],
    seeds: &[u64],
    delay: Duration,
    kill: Option<&mut Daemon>,
) -> Vec<WorkerOut> {
    let flags = Flags::default();
    rt.block_on(async {
        let handles: Vec<_> = (0..roots.len())
            .map(|w| {
                let (cfg, root, model) = (cfg.clone(), roots[w].clone(), models[w].clone());
                tokio::spawn(worker(cfg, root, model, counters[w], seeds[w], flags.clone()))
            })
            .collect();
        tokio::time::sleep(delay).await;
        match kill {
            Some(manager) => {
                flags.killed.store(true, Ordering::SeqCst);
                manager.kill();
            }
            None => flags.stop.store(true, Ordering::SeqCst),
        }
        let mut outs = Vec::new();
        for h in handles {
            outs.push(step("a client at the end of a burst", h).await.expect("worker panicked"));
        }
        outs
    })
}

// --------------------------------------------------------------- observing

/// Everything under `root` as the manager and the drives serve it, plus the
/// invariants that hold whatever the model says (link counts, directory
/// sizes, every file readable).
async fn observe(fs: &FsClient, root: &str) -> Result<Tree, String> {
    struct Seen {
        kind: FileKind,
        attr: FileAttr,
        target: String,
    }
    let mut problems = Vec::new();
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let root_attr = fs.stat(root).await.map_err(|e| format!("stat {root}: {e}"))?.attr;
    let mut dirs = vec![(String::new(), root_attr)];
    while let Some((dir, attr)) = dirs.pop() {
        let abs = if dir.is_empty() { root.to_string() } else { format!("{root}/{dir}") };
        let entries = fs.readdir(&abs).await.map_err(|e| format!("readdir {abs}: {e}"))?;
        let subdirs = entries.iter().filter(|(_, a)| a.kind == FileKind::Dir).count() as u64;
        if attr.size != entries.len() as u64 || attr.nlink as u64 != 2 + subdirs {
            problems.push(format!(
                "directory {abs}: size {} and nlink {} but {} entries, {subdirs} subdirectories",
                attr.size,
                attr.nlink,
                entries.len()
            ));
        }
        for (name, a) in entries {
            let path = join(&dir, &name);
            let target = match a.kind {
                FileKind::Symlink => {
                    fs.readlink(&format!("{root}/{path}")).await.map_err(|e| format!("readlink {root}/{path}: {e}"))?
                }
                _ => String::new(),
            };
            if a.kind == FileKind::Dir {
                dirs.push((path.clone(), a.clone()));
            }
            seen.insert(path, Seen { kind: a.kind, attr: a, target });
        }
    }
    let mut by_ino: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (p, s) in &seen {
        if s.kind == FileKind::File {
            by_ino.entry(s.attr.ino).or_default().push(p.clone());
        }
    }
    let mut contents: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for (ino, links) in &by_ino {
        let first = &seen[&links[0]];
        if first.attr.nlink as usize != links.len() {
            problems.push(format!(
                "{root}/{}: nlink {} but {} names {links:?}",
                links[0],
                first.attr.nlink,
                links.len()
            ));
        }
        let abs = format!("{root}/{}", links[0]);
        match fs.read_file(&abs).await {
            Ok(data) => {
                contents.insert(*ino, data);
            }
            Err(e) => problems.push(format!("{abs}: cannot read its content (missing object?): {e}")),
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    Ok(seen
        .into_iter()
        .map(|(p, s)| {
            let norm = match s.kind {
                FileKind::Dir => Norm::Dir,
                FileKind::Symlink => Norm::Symlink(s.target),
                kind @ (FileKind::Fifo | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice) => {
                    Norm::Special(kind)
                }
                FileKind::File => Norm::File {
                    links: by_ino[&s.attr.ino].clone(),
                    content: contents[&s.attr.ino].clone(),
                    recorded: s.attr.size,
                },
            };
            (p, norm)
        })
        .collect())
}

/// Checks a subtree after a restart: it must be the model, or — for the
/// operation in flight at the kill — one of its outcomes. Returns the state
/// found (the new model) and which outcome it was (0: not done).
async fn check_subtree(
    fs: &FsClient,
    root: &str,
    model: &Model,
    in_flight: &Option<(Op, Vec<Model>)>,
) -> Result<(Model, usize), String> {
    let got = observe(fs, root).await?;
    let mut candidates = vec![model.clone()];
    if let Some((_, states)) = in_flight {
        candidates.extend(states.iter().cloned());
    }
    for (i, c) in candidates.iter().enumerate() {
        if c.normalize() == got {
            return Ok((c.clone(), i));
        }
    }
    let mut msg = format!(
        "{root} matches no allowed state; in flight at the kill: {}\nagainst the acknowledged state:\n{}",
        in_flight.as_ref().map_or("nothing".into(), |(op, _)| op.describe()),
        diff(&got, &model.normalize())
    );
    if let Some((_, states)) = in_flight {
        msg += &format!(
            "\nagainst the in-flight operation completed:\n{}",
            diff(&got, &states.last().unwrap().normalize())
        );
    }
    Err(msg)
}

// ----------------------------------------------------------------- daemons

/// `text` without terminal escape sequences (`ESC [ ... letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn start_manager(dir: &Path, data: &Path, config: &Path, prefer: Option<SocketAddr>) -> Daemon {
    let (data, config) = (data.to_path_buf(), config.to_path_buf());
    Daemon::start("manager", dir, &dir.join("manager.log"), prefer, move |addr| {
        vec![
            "--config".into(),
            config.clone().into(),
            "manager".into(),
            "--data".into(),
            data.clone().into(),
            "--listen".into(),
            addr.to_string().into(),
        ]
    })
}

/// Prints the seed if the test panics.
struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("[manager-crash] FAILED with seed {} (replay the schedule: NASD_CRASH_SEED={})", self.0, self.0);
        }
    }
}

async fn step<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(STEP, f).await.unwrap_or_else(|_| panic!("{what}: no answer in {STEP:?} (a hang)"))
}

/// Logs in, retrying while the restarted manager is still recovering.
async fn login(cfg: &FsConfig) -> FsClient {
    let deadline = Instant::now() + STEP;
    loop {
        match FsClient::connect(cfg).await {
            Ok(fs) => return fs,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot log in to the manager: {e}"),
        }
    }
}

// ----------------------------------------------------- drives, behind the back

/// A connection to a drive with the drive key from the manager's (sealed)
/// drive table, as the manager itself would have.
struct DriveAccess {
    drive: u32,
    addr: String,
    key: nasd_crypto::Key,
}

/// Reads the drive keys out of a stopped manager's state.
fn drive_access(manager_dir: &Path) -> Vec<DriveAccess> {
    let kek = nasd_crypto::read_key_file(&manager_dir.join("manager.key")).expect("manager.key");
    let ns = Namespace::new(Sqlite::open(&manager_dir.join("meta.sqlite")).expect("open meta.sqlite"), Layout::SINGLE)
        .expect("ns");
    ns.drives()
        .expect("drive table")
        .into_iter()
        .map(|rec| {
            assert_eq!(rec.partition, PARTITION);
            let keys = DriveKeys::open(&kek, rec.drive, &rec.sealed_keys).expect("drive keys open with manager.key");
            DriveAccess { drive: rec.drive, addr: rec.addr, key: keys.drive }
        })
        .collect()
}

async fn drive_client(d: &DriveAccess) -> DriveClient {
    let mut c = DriveClient::connect(d.addr.as_str()).await.expect("connect to a drive");
    c.set_auth(Auth::new(Credential::Drive(d.key.clone()), Protection::INTEGRITY_ARGS));
    c
}

/// Creates (durably) objects the manager never hears of: what a crash
/// between a pool refill's creates and its recording transaction leaves.
async fn plant_orphans(drives: &[DriveAccess]) -> Vec<(u32, u64)> {
    let mut planted = Vec::new();
    for d in drives {
        let mut c = drive_client(d).await;
        for _ in 0..PLANTED_PER_DRIVE {
            let (id, _) = c.create(PARTITION).await.expect("create an orphan");
            planted.push((d.drive, id));
        }
        c.flush_partition(PARTITION).await.expect("flush the orphans");
    }
    planted
}

/// The planted objects still present.
async fn still_present(drives: &[DriveAccess], planted: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let mut present = Vec::new();
    for d in drives {
        let mut c = drive_client(d).await;
        for &(drive, id) in planted.iter().filter(|(drive, _)| *drive == d.drive) {
            match c.getattr(PARTITION, id).await {
                Err(e) if e.status() == Some(Status::NoSuchObject) => {}
                Ok(_) => present.push((drive, id)),
                Err(e) => panic!("getattr of planted object {id} on drive {drive}: {e}"),
            }
        }
    }
    present
}

// ------------------------------------------------------------ offline checks

/// Ordinary objects of the partition, read from the store's contents object.
fn store_objects(store: &Store) -> BTreeSet<u64> {
    let len = store.getattr(PARTITION, PARTITION_CONTENTS).expect("getattr(contents)").logical_size;
    let mut sink = VecSink::default();
    store.read(PARTITION, PARTITION_CONTENTS, &[Region { offset: 0, length: len }], &mut sink).expect("read contents");
    sink.data
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .filter(|&id| id >= FIRST_USER_OBJECT)
        .collect()
}

fn store_read(store: &Store, object: u64) -> Result<(Attributes, Vec<u8>), String> {
    let attrs = store.getattr(PARTITION, object).map_err(|e| format!("getattr({object}): {e}"))?;
    let mut sink = VecSink::default();
    if attrs.logical_size > 0 {
        store
            .read(PARTITION, object, &[Region { offset: 0, length: attrs.logical_size }], &mut sink)
            .map_err(|e| format!("read({object}): {e}"))?;
    }
    Ok((attrs, sink.data))
}

/// Every name in the metadata, by absolute path, read straight from the database.
fn meta_tree(ns: &Namespace<Sqlite>) -> BTreeMap<String, Inode> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![(String::new(), ROOT_INO)];
    while let Some((path, ino)) = dirs.pop() {
        let mut after = String::new();
        loop {
            let page = ns.readdir(&Caller::ROOT, ino, &after, nasd_meta::READDIR_ENTRIES_MAX).expect("readdir");
            let Some(last) = page.last() else { break };
            after = last.name.clone();
            for e in page {
                let p = format!("{path}/{}", e.name);
                if e.inode.attr.kind == FileKind::Dir {
                    dirs.push((p.clone(), e.inode.attr.ino));
                }
                out.insert(p, e.inode);
            }
        }
    }
    out
}

/// A stopped cluster's state, opened directly: the manager's metadata and
/// every drive's store (by drive number).
struct Stopped {
    ns: Namespace<Sqlite>,
    stores: BTreeMap<u32, Store>,
}

fn open_stopped(dir: &Path, manager_dir: &Path) -> Stopped {
    let ns = Namespace::new(Sqlite::open(&manager_dir.join("meta.sqlite")).expect("open meta.sqlite"), Layout::SINGLE)
        .expect("ns");
    let opts = StoreOptions {
        capacity_bytes: DRIVE_CAPACITY_BYTES,
        block_size: 4096,
        verify_reads: true,
        ..StoreOptions::default()
    };
    let recs = ns.drives().expect("drive table");
    assert_eq!(recs.len(), DRIVES, "drive table: {recs:?}");
    let mut stores = BTreeMap::new();
    for i in 0..DRIVES {
        let store = Store::open(&dir.join(format!("drive-{i}")), &opts).expect("open a drive's store");
        let rec = recs.iter().find(|r| r.drive_id == store.drive_id()).expect("every drive is in the drive table");
        stores.insert(rec.drive, store);
    }
    Stopped { ns, stores }
}

/// Compares the metadata's tree with the models (and `extra`: files outside
/// the workers' subtrees with their content), reading every file's content
/// and access control version from its drive's store. Returns the problems
/// and every regular file's object (by one of its paths).
fn check_stopped_tree(
    st: &Stopped,
    roots: &[String],
    models: &[Model],
    extra: &[(&str, &[u8])],
) -> (Vec<String>, Vec<(String, ObjectRef)>) {
    let tree = meta_tree(&st.ns);
    let mut problems = Vec::new();
    let mut top: Vec<&str> = tree.keys().filter(|p| !p[1..].contains('/')).map(|p| &p[1..]).collect();
    top.sort();
    let mut want_top: Vec<&str> = roots.iter().map(|r| &r[1..]).chain(extra.iter().map(|(p, _)| &p[1..])).collect();
    want_top.sort();
    if top != want_top {
        problems.push(format!("the root lists {top:?}, expected {want_top:?}"));
    }
    let mut files: Vec<(String, ObjectRef)> = Vec::new();
    let mut seen_ino = BTreeSet::new();
    // A file's object: its content, checked to carry the manager's ACV.
    let mut object_content = |path: &str, inode: &Inode, problems: &mut Vec<String>| -> Vec<u8> {
        // The cluster runs the default layout: one component object per file.
        let obj = match &inode.components[..] {
            [only] => only.object,
            other => panic!("{path}: one component expected under the default layout, found {other:?}"),
        };
        if seen_ino.insert(inode.attr.ino) {
            files.push((path.to_string(), obj));
        }
        match st.stores.get(&obj.drive).map(|s| store_read(s, obj.object)) {
            Some(Ok((attrs, data))) => {
                if attrs.access_control_version != inode.acv {
                    problems.push(format!(
                        "{path}: object {} has access control version {}, the manager mints with {}",
                        obj.object, attrs.access_control_version, inode.acv
                    ));
                }
                data
            }
            Some(Err(e)) => {
                problems.push(format!("{path}: its object {} on drive {}: {e}", obj.object, obj.drive));
                Vec::new()
            }
            None => {
                problems.push(format!("{path}: on drive {}, which is not in the drive table", obj.drive));
                Vec::new()
            }
        }
    };
    for (root, model) in roots.iter().zip(models) {
        let prefix = format!("{root}/");
        let mine: Vec<(&String, &Inode)> = tree.iter().filter(|(p, _)| p.starts_with(&prefix)).collect();
        let mut by_ino: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for (p, inode) in &mine {
            if inode.attr.kind == FileKind::File {
                by_ino.entry(inode.attr.ino).or_default().push(p[prefix.len()..].to_string());
            }
        }
        let mut got = Tree::new();
        for (p, inode) in mine {
            let norm = match inode.attr.kind {
                FileKind::Dir => Norm::Dir,
                FileKind::Symlink => Norm::Symlink(inode.target.clone().unwrap_or_default()),
                kind @ (FileKind::Fifo | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice) => {
                    Norm::Special(kind)
                }
                FileKind::File => Norm::File {
                    links: by_ino[&inode.attr.ino].clone(),
                    content: read_view(&object_content(p, inode, &mut problems), inode.attr.size),
                    recorded: inode.attr.size,
                },
            };
            got.insert(p[prefix.len()..].to_string(), norm);
        }
        let want = model.normalize();
        if got != want {
            problems.push(format!("{root} in the metadata differs from the model:\n{}", diff(&got, &want)));
        }
    }
    for (path, data) in extra {
        match tree.get(*path) {
            Some(inode) if inode.attr.kind == FileKind::File => {
                if object_content(path, inode, &mut problems) != *data {
                    problems.push(format!("{path}: its object does not hold what was written"));
                }
            }
            other => problems.push(format!("{path}: expected a regular file, found {other:?}")),
        }
    }
    (problems, files)
}

/// What the leak check looks at.
struct Offline {
    /// Ordinary objects in each drive's partition.
    on_drive: BTreeMap<u32, BTreeSet<u64>>,
    /// `known_objects(drive)`: files ∪ pool ∪ doomed.
    known: BTreeMap<u32, BTreeSet<u64>>,
    /// Every regular file's object, by one of its paths.
    files: Vec<(String, ObjectRef)>,
    doomed: Vec<ObjectRef>,
    intents: Vec<AcvIntent>,
}

fn offline(st: &Stopped, files: &[(String, ObjectRef)]) -> Offline {
    Offline {
        on_drive: st.stores.iter().map(|(&d, s)| (d, store_objects(s))).collect(),
        known: st.stores.keys().map(|&d| (d, st.ns.known_objects(d).expect("known objects"))).collect(),
        files: files.to_vec(),
        doomed: st.ns.doomed(nasd_meta::BATCH_MAX).expect("doomed"),
        intents: st.ns.acv_intents(nasd_meta::BATCH_MAX).expect("acv intents"),
    }
}

/// Everything wrong between the metadata and the drives. Strict: an object
/// on a drive that nothing records is a leak however it got there (an
/// interrupted pool refill, an unlink that forgot its object, a create the
/// manager lost track of), and every file's and pooled object must be on its
/// drive. A doomed object is removed from its drive before the reply that
/// dooms it, so it must be gone even while its log entry waits for the next
/// maintenance pass; `after_recovery` (nothing happened since `recover`
/// finished the logs) demands both logs empty.
fn leak_problems(o: &Offline, after_recovery: bool) -> Vec<String> {
    let mut problems = Vec::new();
    for (drive, on) in &o.on_drive {
        let known = o.known.get(drive).cloned().unwrap_or_default();
        let doomed: BTreeSet<u64> = o.doomed.iter().filter(|r| r.drive == *drive).map(|r| r.object).collect();
        let leaked: Vec<&u64> = on.difference(&known).collect();
        if !leaked.is_empty() {
            problems.push(format!("drive {drive}: objects no file, pool entry or log knows (leaked): {leaked:?}"));
        }
        let missing: Vec<&u64> = known.difference(on).filter(|id| !doomed.contains(id)).collect();
        if !missing.is_empty() {
            problems.push(format!("drive {drive}: file or pool objects the drive lacks: {missing:?}"));
        }
        let undead: Vec<&u64> = doomed.intersection(on).collect();
        if !undead.is_empty() {
            problems.push(format!("drive {drive}: doomed objects still on the drive: {undead:?}"));
        }
    }
    for (path, obj) in &o.files {
        if !o.on_drive.get(&obj.drive).is_some_and(|on| on.contains(&obj.object)) {
            problems.push(format!("{path} points at object {} of drive {}, which is missing", obj.object, obj.drive));
        }
    }
    if after_recovery && !o.doomed.is_empty() {
        problems.push(format!("doomed objects left after recovery: {:?}", o.doomed));
    }
    if after_recovery && !o.intents.is_empty() {
        problems.push(format!("ACV intents left after recovery: {:?}", o.intents));
    }
    problems
}

fn summary(o: &Offline, st: &Stopped) -> String {
    let objects: usize = o.on_drive.values().map(|s| s.len()).sum();
    let pooled: usize = st.stores.keys().map(|&d| st.ns.pool_len(d).expect("pool")).sum();
    format!(
        "{objects} objects on {DRIVES} drives: {} files', {pooled} pooled; {} doomed and {} ACV intents pending",
        o.files.len(),
        o.doomed.len(),
        o.intents.len()
    )
}

// -------------------------------------------------------------------- test

fn start_drive(dir: &Path, i: usize, prefer: Option<SocketAddr>) -> Daemon {
    let data = dir.join(format!("drive-{i}"));
    let d = Daemon::start("drive", dir, &dir.join(format!("drive-{i}.log")), prefer, move |addr| {
        vec![
            "drive".into(),
            "--data".into(),
            data.clone().into(),
            "--listen".into(),
            addr.to_string().into(),
            "--capacity".into(),
            DRIVE_CAPACITY.into(),
            "--block-size".into(),
            "4KiB".into(),
        ]
    });
    // The manager knows a drive by its address: a restarted drive must keep it.
    if let Some(a) = prefer {
        assert_eq!(a, d.addr, "drive {i} could not listen on its address again");
    }
    d
}

fn run_test() {
    let seed: u64 = match std::env::var("NASD_CRASH_SEED") {
        Ok(s) => s.trim().parse().expect("NASD_CRASH_SEED must be a u64"),
        Err(_) => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
            t ^ (std::process::id() as u64).rotate_left(32)
        }
    };
    eprintln!("[manager-crash] seed {seed} (replay with NASD_CRASH_SEED={seed})");
    let _guard = SeedGuard(seed);
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .thread_stack_size(16 << 20)
        .enable_all()
        .build()
        .expect("runtime");

    // ---- two drives and a manager
    let mut drives: Vec<Daemon> = (0..DRIVES).map(|i| start_drive(dir, i, None)).collect();
    let manager_dir = dir.join("manager");
    let manager_log = dir.join("manager.log");
    let config = dir.join("nasd.toml");
    // Short capability lifetimes and key rotation every KEY_ROTATION_SECS:
    // rotations (record the new key, then install it on the drive) happen
    // during the bursts too, and clients refresh capabilities all along.
    // Every byte on the drives (small_file_threshold = 0): the offline check
    // reads each file's bytes from the stopped drives' objects.
    let settings = format!(
        "[manager]\nobject_pool = {OBJECT_POOL}\nread_capability_secs = {KEY_ROTATION_SECS}\n\
         write_capability_secs = {KEY_ROTATION_SECS}\nkey_rotation_secs = {KEY_ROTATION_SECS}\n\
         write_lease_secs = {WRITE_LEASE_SECS}\nsmall_file_threshold = 0\n"
    );
    std::fs::write(&config, settings).expect("config file");
    let mut manager = start_manager(dir, &manager_dir, &config, None);
    let password = std::fs::read_to_string(manager_dir.join("admin.password")).expect("admin.password");
    let mut cfg = FsConfig {
        manager: manager.addr.to_string(),
        server_name: "localhost".into(),
        ca_cert: manager_dir.join("tls").join("ca.pem"),
        user: "admin".into(),
        password: password.trim().to_string(),
        ..Default::default()
    };
    let roots: Vec<String> = (0..WORKERS).map(|w| format!("/w{w}")).collect();
    rt.block_on(async {
        let admin = step("log in", login(&cfg)).await;
        for (i, d) in drives.iter().enumerate() {
            let master = nasd_crypto::read_key_file(&dir.join(format!("drive-{i}")).join("master.key")).expect("key");
            step("add a drive", admin.add_drive(&d.addr.to_string(), &master)).await.expect("add a drive");
        }
        for root in &roots {
            step("mkdir", admin.mkdir(root, 0o755)).await.expect("make a worker's root");
        }
    });

    let mut models: Vec<Model> = vec![Model::default(); WORKERS];
    let mut counters: Vec<u64> = vec![0; WORKERS];
    let mut total_acked = 0usize;
    for round in 1..=ROUNDS {
        // ---- burst, and SIGKILL in the middle of it
        let seeds: Vec<u64> = (0..WORKERS).map(|_| rng.gen()).collect();
        let delay = Duration::from_millis(rng.gen_range(KILL_AFTER_MS));
        let outs = burst(&rt, &cfg, &roots, &models, &counters, &seeds, delay, Some(&mut manager));
        let mut acked: BTreeMap<&str, usize> = BTreeMap::new();
        let mut in_flight = Vec::new();
        for (w, out) in outs.iter().enumerate() {
            if let Some(e) = &out.error {
                panic!("round {round}: {e}\nmanager log:\n{}", log_tail(&manager_log));
            }
            for (k, n) in &out.acked {
                *acked.entry(k).or_default() += n;
            }
            in_flight.push(format!(
                "{}: {}",
                roots[w],
                out.in_flight.as_ref().map_or("nothing".into(), |(op, _)| op.describe())
            ));
        }
        let n: usize = acked.values().sum();
        total_acked += n;
        eprintln!(
            "[manager-crash] round {round}: SIGKILL after {} ms; {n} operations acknowledged before it {acked:?}; \
             in flight: {in_flight:?}",
            delay.as_millis()
        );
        assert!(n > 0, "round {round}: no operation was acknowledged before the kill");

        // ---- objects created on the drives but never recorded
        let access = drive_access(&manager_dir);
        let planted = rt.block_on(step("plant orphans", plant_orphans(&access)));

        // ---- restart; every acknowledged operation is there
        let log_before = std::fs::metadata(&manager_log).map_or(0, |m| m.len() as usize);
        manager = start_manager(dir, &manager_dir, &config, Some(manager.addr));
        cfg.manager = manager.addr.to_string();
        let mut outcomes = Vec::new();
        rt.block_on(async {
            let fs = step("log in after the restart", login(&cfg)).await;
            // Logged in: the manager finished `recover` before it served.
            let left = step("planted objects", still_present(&access, &planted)).await;
            assert!(
                left.is_empty(),
                "round {round}: objects created on drives behind the manager's back survived its recovery: {left:?}"
            );
            let listed: Vec<String> =
                step("readdir /", fs.readdir("/")).await.expect("readdir /").into_iter().map(|(n, _)| n).collect();
            assert_eq!(listed, roots.iter().map(|r| r[1..].to_string()).collect::<Vec<_>>(), "round {round}: /");
            for (w, out) in outs.into_iter().enumerate() {
                let (model, which) = step("check a subtree", check_subtree(&fs, &roots[w], &out.model, &out.in_flight))
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: {e}\nmanager log:\n{}", log_tail(&manager_log)));
                outcomes.push(match (&out.in_flight, which) {
                    (None, _) => "-".to_string(),
                    (Some(_), 0) => "not done".to_string(),
                    (Some((_, s)), k) if k == s.len() => "done".to_string(),
                    (Some((_, s)), k) => format!("stopped after step {k} of {}", s.len()),
                });
                models[w] = model;
                counters[w] = out.counter;
            }
        });
        // What the manager says it collected (informational: the planted
        // ones, plus any a kill in the middle of a pool refill left).
        let log = std::fs::read(&manager_log).unwrap_or_default();
        let collected: usize = strip_ansi(&String::from_utf8_lossy(&log[log_before.min(log.len())..]))
            .lines()
            .filter(|l| l.contains("removed objects no file referenced"))
            .filter_map(|l| l.split("orphans=").nth(1)?.split_whitespace().next()?.parse::<usize>().ok())
            .sum();
        let entries: usize = models.iter().map(|m| m.nodes.len()).sum();
        let files: usize = models.iter().map(|m| m.files.len()).sum();
        eprintln!(
            "[manager-crash] round {round}: restarted; {entries} names ({files} files) match the model, every file read \
             back; in-flight operations: {outcomes:?}; {} planted orphans gone (the manager's log reports {collected} \
             collected)",
            planted.len()
        );
    }

    // ---- right after the last recovery: stop everything, look at the disks
    manager.terminate();
    for d in &mut drives {
        d.terminate();
    }
    {
        let st = open_stopped(dir, &manager_dir);
        let (mut problems, files) = check_stopped_tree(&st, &roots, &models, &[]);
        let o = offline(&st, &files);
        problems.extend(leak_problems(&o, true));
        assert!(problems.is_empty(), "after the last recovery, stopped cleanly:\n{}", problems.join("\n"));
        eprintln!("[manager-crash] after the last recovery, offline: {}", summary(&o, &st));
    }

    // ---- and once more after a burst with no kill and no recovery after it:
    // a leak in the ordinary paths (not one a crash explains, which the next
    // start's orphan collection would hide) shows here.
    drives = (0..DRIVES).map(|i| start_drive(dir, i, Some(drives[i].addr))).collect();
    manager = start_manager(dir, &manager_dir, &config, Some(manager.addr));
    cfg.manager = manager.addr.to_string();
    let seeds: Vec<u64> = (0..WORKERS).map(|_| rng.gen()).collect();
    let outs = burst(&rt, &cfg, &roots, &models, &counters, &seeds, Duration::from_millis(1000), None);
    let mut acked = 0;
    for (w, out) in outs.into_iter().enumerate() {
        if let Some(e) = &out.error {
            panic!("final burst: {e}\nmanager log:\n{}", log_tail(&manager_log));
        }
        assert!(out.in_flight.is_none(), "final burst: an operation failed with no kill");
        acked += out.acked.values().sum::<usize>();
        models[w] = out.model;
    }
    total_acked += acked;
    // One more file outside the subtrees, so the negative check below always has one.
    let sentinel = b"a file whose object the negative check deletes".to_vec();
    rt.block_on(async {
        let fs = step("log in", login(&cfg)).await;
        for (w, root) in roots.iter().enumerate() {
            let got = step("observe", observe(&fs, root)).await.unwrap_or_else(|e| panic!("final burst: {e}"));
            let want = models[w].normalize();
            assert!(got == want, "final burst: {root} differs from the model:\n{}", diff(&got, &want));
        }
        step("write /sentinel", fs.write_file("/sentinel", &sentinel)).await.expect("write /sentinel");
    });
    manager.terminate();
    for d in &mut drives {
        d.terminate();
    }
    let st = open_stopped(dir, &manager_dir);
    let (mut problems, files) = check_stopped_tree(&st, &roots, &models, &[("/sentinel", &sentinel)]);
    let o = offline(&st, &files);
    problems.extend(leak_problems(&o, false));
    assert!(
        problems.is_empty(),
        "after a final burst of {acked} operations, stopped cleanly:\n{}",
        problems.join("\n")
    );
    eprintln!("[manager-crash] after a final burst of {acked} operations, offline: {}", summary(&o, &st));

    // The check is not vacuous: plant a stray object and delete the sentinel's
    // object in the opened stores (never committed); both must be reported.
    let sentinel_obj = files.iter().find(|(p, _)| p == "/sentinel").expect("sentinel").1;
    let stray = st.stores[&0].create(PARTITION, AttrMask(0), &Attributes::default()).expect("plant a stray object").0;
    st.stores[&sentinel_obj.drive].remove(PARTITION, sentinel_obj.object).expect("delete the sentinel's object");
    let problems = leak_problems(&offline(&st, &files), false);
    let text = problems.join("\n");
    assert!(
        problems.iter().any(|p| p.starts_with("drive 0: objects no file") && p.contains(&stray.to_string())),
        "the leak check missed a stray object {stray}: {text}"
    );
    assert!(
        problems.iter().any(|p| p.starts_with("/sentinel points at object")),
        "the leak check missed a file whose object is gone: {text}"
    );
    eprintln!(
        "[manager-crash] passed in {:.1} s: {ROUNDS} kill/restart rounds and a final burst, {total_acked} \
         acknowledged operations",
        started.elapsed().as_secs_f64()
    );
}
