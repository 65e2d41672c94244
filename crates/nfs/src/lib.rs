//! nasd-nfs: the NFSv3 gateway — an [`nfs_rpc::NfsFileSystem`] over the
//! shared file-system layer ([`nasd_vfs::Vfs`]), the only crate that knows
//! NFS semantics (LegionFS's user-level NFS daemon, with nasd's security).
//!
//! - **Sealed handles** (`handle.rs`): each NFS handle is the layer's
//!   persistent handle (the manager's 41-byte MAC'd handle inside) and the
//!   export it was reached through, tagged with the gateway's key. A handle
//!   whose tag does not check is `NFS3ERR_BADHANDLE` before any manager
//!   request; a sealed one names its file after a gateway restart with no
//!   table (the manager checks its own MAC when the inode is not held).
//! - **Users**: every call runs as its AUTH_SYS uid, gid and groups through
//!   the gateway's grant (`AS_USER`, [`nasd_fs::FsClient::as_user`]), so the
//!   manager's modes and ACLs decide it, and ids outside the grant are
//!   refused there. uid 0 is squashed to the anonymous ids unless the
//!   configuration says otherwise; AUTH_NONE calls are refused.
//! - **Writes** (`open.rs`): WRITEs go into the open file's write-behind
//!   (the layer's shared [`nasd_fs::File`]); UNSTABLE ones are answered at
//!   once and made durable by COMMIT (the write transaction's commit and
//!   the manager's `SYNC`); FILE_SYNC and DATA_SYNC ones are committed
//!   before the reply. The write verifier is random per gateway start, so
//!   clients resend what a restarted gateway never committed.
//! - **Listings** (`dirs.rs`): READDIR cookies are offsets of a layer
//!   directory cursor named by the cookie verifier, so a directory that
//!   changes during a listing neither repeats nor skips an unchanged entry.
//! - **Bounded**: inodes held for clients ([`INODES_HELD_MAX`]), open files
//!   ([`OPENS_MAX`]), cursors ([`CURSORS_MAX`]), the climb that keeps a
//!   `..` inside its export ([`DOTDOT_CLIMB_MAX`]).
#![deny(missing_docs)]

mod attr;
mod dirs;
mod handle;
mod metrics;
mod open;

pub use handle::{Sealer, NFS_HANDLE_LEN, TAG_LEN};
pub use metrics::NfsMetrics;

use nasd_fs::{FileKind, FsClient, Ino, SetAttr};
use nasd_vfs::{CreateFlags, Vfs, VfsError};
use nfs_rpc::nfs::{cookieverf3, fattr3, ftype3, nfsstat3, nfstime3, sattr3, writeverf3};
use nfs_rpc::{Auth, Caller, CreateHow, DirPage, FileHandle, FsStat, NfsResult, Stable};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

/// Inodes the gateway holds in the layer for its clients; past it the
/// oldest are let go (a client's next use of their handle reopens them).
pub const INODES_HELD_MAX: usize = 65_536;
/// Open files kept between WRITEs and READs; past it the oldest is closed.
pub const OPENS_MAX: usize = 1024;
/// Directory cursors kept for listings in progress.
pub const CURSORS_MAX: usize = 1024;
/// Directories a LOOKUP of `..` climbs to check that its answer lies in
/// the handle's export (one manager request each); a deeper directory's
/// `..` is refused `NFS3ERR_ACCES`.
pub const DOTDOT_CLIMB_MAX: usize = 256;
/// The uid and gid squashed callers run as unless configured.
pub const ANON_ID_DEFAULT: u32 = 65_534;

/// One exported directory.
#[derive(Debug, Clone)]
pub struct Export {
    /// Its nasd path (absolute), also the path clients mount.
    pub path: String,
}

/// A client network (`addr/prefix`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for Network {
    type Err = String;
    fn from_str(s: &str) -> Result<Network, String> {
        let (a, p) = s.split_once('/').unwrap_or((s, ""));
        let addr: IpAddr = a.parse().map_err(|_| format!("{s:?} is not an address/prefix"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if p.is_empty() { max } else { p.parse().map_err(|_| format!("{s:?}: bad prefix"))? };
        if prefix > max {
            return Err(format!("{s:?}: prefix over {max}"));
        }
        Ok(Network { addr, prefix })
    }
}

impl Network {
    /// Whether `ip` lies in the network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// The allowed client networks.
#[derive(Debug, Clone)]
pub struct Clients(pub Vec<Network>);

impl nfs_rpc::PeerFilter for Clients {
    fn allows(&self, peer: &SocketAddr) -> bool {
        self.0.iter().any(|n| n.contains(peer.ip()))
    }
}

/// How the gateway serves.
#[derive(Debug, Clone)]
pub struct NfsConfig {
    /// The exported directories (at most 255).
    pub exports: Vec<Export>,
    /// Run uid 0 as the anonymous ids.
    pub root_squash: bool,
    /// The ids squashed callers run as.
    pub anon: (u32, u32),
}

/// The NFS file system over one layer.
pub struct Gateway {
    vfs: Vfs,
    sealer: Sealer,
    config: NfsConfig,
    /// The export roots' inodes, as held at start.
    roots: Vec<Ino>,
    verifier: writeverf3,
    held: Mutex<Held>,
    opens: open::Opens,
    cursors: dirs::Cursors,
    metrics: NfsMetrics,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("exports", &self.config.exports).finish_non_exhaustive()
    }
}

/// Inodes held for clients, oldest first.
#[derive(Default)]
struct Held {
    refs: HashMap<Ino, u64>,
    order: VecDeque<Ino>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The NFS status for a layer failure.
pub fn status_of(e: &VfsError) -> nfsstat3 {
    use nfsstat3::*;
    match e {
        // The layer let the inode go meanwhile (over INODES_HELD_MAX): the retry reopens it.
        VfsError::Stale(_) => NFS3ERR_JUKEBOX,
        VfsError::BadHandle(_) => NFS3ERR_STALE,
        VfsError::BadDescriptor => NFS3ERR_IO,
        _ => match e.errno() {
            1 => NFS3ERR_PERM,
            2 => NFS3ERR_NOENT,
            // Busy (another writer's transaction, a manager failing over): the client retries.
            11 => NFS3ERR_JUKEBOX,
            13 => NFS3ERR_ACCES,
            17 => NFS3ERR_EXIST,
            18 => NFS3ERR_XDEV,
            20 => NFS3ERR_NOTDIR,
            21 => NFS3ERR_ISDIR,
            22 => NFS3ERR_INVAL,
            27 => NFS3ERR_FBIG,
            28 => NFS3ERR_NOSPC,
            30 => NFS3ERR_ROFS,
            31 => NFS3ERR_MLINK,
            36 => NFS3ERR_NAMETOOLONG,
            39 => NFS3ERR_NOTEMPTY,
            95 => NFS3ERR_NOTSUPP,
            116 => NFS3ERR_STALE,
            122 => NFS3ERR_DQUOT,
            _ => NFS3ERR_IO,
        },
    }
}

fn err(e: VfsError) -> nfsstat3 {
    let s = status_of(&e);
    if matches!(s, nfsstat3::NFS3ERR_IO) {
        tracing::warn!(error = %e, "an NFS call failed");
    }
    s
}

/// The access and modification times an exclusive CREATE keeps its
/// verifier in: whole seconds, the verifier's first and last four bytes.
fn verifier_times(v: &nfs_rpc::nfs::createverf3) -> (i64, i64) {
    let secs = |b: &[u8]| i64::from(u32::from_be_bytes(b.try_into().expect("four bytes"))) * 1_000_000_000;
    (secs(&v[..4]), secs(&v[4..]))
}

/// A name from the wire: UTF-8, not empty, no `/` or NUL.
fn name_of(n: &[u8]) -> NfsResult<&str> {
    let s = std::str::from_utf8(n).map_err(|_| nfsstat3::NFS3ERR_INVAL)?;
    if s.is_empty() || s.contains(['/', '\0']) {
        return Err(nfsstat3::NFS3ERR_INVAL);
    }
    Ok(s)
}

/// A name a call may make or remove (not `.` or `..`).
fn new_name(n: &[u8]) -> NfsResult<&str> {
    let s = name_of(n)?;
    if s == "." || s == ".." {
        return Err(nfsstat3::NFS3ERR_INVAL);
    }
    Ok(s)
}

impl Gateway {
    /// The gateway over `vfs` (whose client holds a gateway grant for the
    /// ids it will act for), sealing handles with `key` and counting in
    /// `metrics`; the exports are resolved now.
    ///
    /// # Errors
    /// An export that is not a directory the gateway's user reaches, or more than 255.
    pub async fn start(
        vfs: Vfs,
        key: &nasd_crypto::Key,
        config: NfsConfig,
        metrics: NfsMetrics,
    ) -> Result<Arc<Gateway>, String> {
        if config.exports.is_empty() || config.exports.len() > 255 {
            return Err("between 1 and 255 exports are needed".into());
        }
        let mut roots = Vec::new();
        for e in &config.exports {
            let entry = vfs.resolve(vfs.fs(), &e.path).await.map_err(|err| format!("export {}: {err}", e.path))?;
            if entry.attr.kind != FileKind::Dir {
                return Err(format!("export {} is not a directory", e.path));
            }
            roots.push(entry.attr.ino);
        }
        let gateway = Arc::new(Gateway {
            vfs,
            sealer: Sealer::new(key),
            config,
            roots,
            verifier: nasd_crypto::random_bytes::<8>(),
            held: Mutex::new(Held::default()),
            opens: open::Opens::default(),
            cursors: dirs::Cursors::default(),
            metrics,
        });
        tokio::spawn(open::close_idle(Arc::downgrade(&gateway)));
        Ok(gateway)
    }

    /// The metrics the gateway counts in (register them to serve them).
    pub fn metrics(&self) -> &NfsMetrics {
        &self.metrics
    }

    /// The export holding `path` (the longest whose path is a prefix of it
    /// at a `/`) and the rest of the path below it.
    fn export_of_path<'p>(&self, path: &'p str) -> Option<(usize, &'p str)> {
        let mut best: Option<(usize, &str)> = None;
        for (i, e) in self.config.exports.iter().enumerate() {
            let root = e.path.trim_end_matches('/');
            let Some(rest) = path.strip_prefix(root) else { continue };
            if !(rest.is_empty() || rest.starts_with('/')) {
                continue;
            }
            if best.is_none_or(|(b, _)| self.config.exports[b].path.len() < e.path.len()) {
                best = Some((i, rest));
            }
        }
        best
    }

    /// Closes every open file (committing what clients wrote to them) and
    /// directory cursor: the gateway is stopping.
    pub async fn close_all(&self) {
        self.opens.close_all(self).await;
        self.cursors.close_all(self);
    }

    /// The client a call runs as: its AUTH_SYS ids (uid 0 squashed unless
    /// configured) acting through the gateway's grant.
    fn cx(&self, caller: &Caller) -> NfsResult<FsClient> {
        let Auth::Sys { uid, gid, groups } = &caller.auth else { return Err(nfsstat3::NFS3ERR_ACCES) };
        let (uid, gid, groups) = if *uid == 0 && self.config.root_squash {
            (self.config.anon.0, self.config.anon.1, Vec::new())
        } else {
            (*uid, *gid, groups.clone())
        };
        self.vfs.fs().as_user(uid, gid, &groups).map_err(|_| nfsstat3::NFS3ERR_ACCES)
    }

    /// The export a handle claims and its inode, held in the layer: the
    /// tag checked first (`BADHANDLE`, no manager request), then, for an
    /// inode not held, the manager's own check of its handle (`STALE`).
    async fn resolve(&self, cx: &FsClient, fh: &FileHandle) -> NfsResult<(u8, Ino)> {
        let bytes = fh.as_bytes();
        let export = Sealer::export_of(bytes).ok_or(nfsstat3::NFS3ERR_BADHANDLE)?;
        let path = &self.config.exports.get(usize::from(export)).ok_or(nfsstat3::NFS3ERR_BADHANDLE)?.path;
        let inner = self.sealer.open(path, bytes).ok_or(nfsstat3::NFS3ERR_BADHANDLE)?;
        let ino = inner.ino();
        if self.vfs.handle_of(ino).is_ok() {
            return Ok((export, ino));
        }
        let e = self.vfs.open_persistent(cx, inner.as_bytes()).await.map_err(|e| match status_of(&e) {
            nfsstat3::NFS3ERR_NOENT => nfsstat3::NFS3ERR_STALE,
            s => s,
        })?;
        self.note_held(e.attr.ino);
        Ok((export, e.attr.ino))
    }

    /// Counts one layer reference taken for clients; lets the oldest go past
    /// [`INODES_HELD_MAX`].
    fn note_held(&self, ino: Ino) {
        let mut held = lock(&self.held);
        let first = {
            let n = held.refs.entry(ino).or_insert(0);
            *n += 1;
            *n == 1
        };
        if first {
            held.order.push_back(ino);
        }
        while held.refs.len() > INODES_HELD_MAX {
            let Some(old) = held.order.pop_front() else { break };
            if let Some(n) = held.refs.remove(&old) {
                self.vfs.forget(old, n);
            }
        }
    }

    /// Whether directory `dir` (a `..` answer) lies in `export`: its
    /// parents climbed as the caller, at most [`DOTDOT_CLIMB_MAX`], until
    /// the export's root (inside) or the file system's root (outside).
    ///
    /// # Errors
    /// A climb refused (`NFS3ERR_ACCES`, …), or one past [`DOTDOT_CLIMB_MAX`]
    /// (`NFS3ERR_ACCES`: the answer cannot be shown to be inside).
    async fn inside_export(&self, cx: &FsClient, export: u8, dir: &nasd_fs::Entry) -> NfsResult<bool> {
        let root = self.roots[usize::from(export)];
        let mut at = dir.handle();
        for _ in 0..DOTDOT_CLIMB_MAX {
            if at.ino == root {
                return Ok(true);
            }
            let up = cx.lookup(at, "..").await.map_err(|e| err(e.into()))?.handle();
            if up.ino == at.ino {
                return Ok(false);
            }
            at = up;
        }
        tracing::warn!(dir = dir.attr.ino, "a `..` lookup over DOTDOT_CLIMB_MAX directories below its export refused");
        Err(nfsstat3::NFS3ERR_ACCES)
    }

    /// The sealed handle of held inode `ino` in `export`.
    fn seal(&self, export: u8, ino: Ino) -> NfsResult<FileHandle> {
        let inner = self.vfs.persistent_handle(ino).map_err(err)?;
        let path = &self.config.exports[usize::from(export)].path;
        FileHandle::new(self.sealer.seal(export, path, &inner)).ok_or(nfsstat3::NFS3ERR_SERVERFAULT)
    }

    /// A handle and attributes of an entry just handed to the layer.
    fn made(&self, export: u8, e: &nasd_fs::Entry) -> NfsResult<(FileHandle, fattr3)> {
        self.note_held(e.attr.ino);
        Ok((self.seal(export, e.attr.ino)?, attr::fattr(&e.attr)))
    }

    async fn attr_of(&self, cx: &FsClient, ino: Ino) -> NfsResult<fattr3> {
        Ok(attr::fattr(&self.vfs.getattr(cx, ino).await.map_err(err)?))
    }

    /// The attributes READ and WRITE answer beside their data: the layer's
    /// while recent ([`nasd_vfs::Vfs::getattr_recent`]), so a data call
    /// asks the manager nothing (GETATTR itself always asks).
    async fn recent_attr_of(&self, cx: &FsClient, ino: Ino) -> NfsResult<fattr3> {
        Ok(attr::fattr(&self.vfs.getattr_recent(cx, ino).await.map_err(err)?))
    }

    /// `sattr3` as the layer's change (`None` fields left alone).
    fn set_of(set: &sattr3) -> SetAttr {
        use nfs_rpc::nfs::{set_atime, set_gid3, set_mode3, set_mtime, set_size3, set_uid3};
        let now =
            || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64);
        let t = |t: nfstime3| i64::from(t.seconds) * 1_000_000_000 + i64::from(t.nseconds);
        SetAttr {
            mode: match set.mode {
                set_mode3::mode(m) => Some(m & 0o7777),
                set_mode3::Void => None,
            },
            uid: match set.uid {
                set_uid3::uid(u) => Some(u),
                set_uid3::Void => None,
            },
            gid: match set.gid {
                set_gid3::gid(g) => Some(g),
                set_gid3::Void => None,
            },
            size: match set.size {
                set_size3::size(s) => Some(s),
                set_size3::Void => None,
            },
            atime_ns: match set.atime {
                set_atime::SET_TO_CLIENT_TIME(c) => Some(t(c)),
                set_atime::SET_TO_SERVER_TIME => Some(now()),
                set_atime::DONT_CHANGE => None,
            },
            mtime_ns: match set.mtime {
                set_mtime::SET_TO_CLIENT_TIME(c) => Some(t(c)),
                set_mtime::SET_TO_SERVER_TIME => Some(now()),
                set_mtime::DONT_CHANGE => None,
            },
            open_writer: false,
        }
    }

    /// Applies the parts of `set` a make call could not (owner, times).
    async fn apply_rest(&self, cx: &FsClient, ino: Ino, set: &sattr3) -> NfsResult<()> {
        let mut changes = Self::set_of(set);
        changes.mode = None;
        changes.size = None;
        if changes != SetAttr::default() {
            self.vfs.setattr(cx, ino, changes).await.map_err(err)?;
        }
        Ok(())
    }

    fn mode_of(set: &sattr3, default: u32) -> u32 {
        match set.mode {
            nfs_rpc::nfs::set_mode3::mode(m) => m & 0o7777,
            nfs_rpc::nfs::set_mode3::Void => default,
        }
    }
}

#[async_trait::async_trait]
impl nfs_rpc::NfsFileSystem for Gateway {
    fn answered(&self, proc: &'static str, outcome: &'static str, took: std::time::Duration) {
        self.metrics.answered(proc, outcome, took);
    }

    /// Each call is one operation with a fresh trace id (`nasd_client::trace`)
    /// that every manager and drive request it makes carries, on a `request`
    /// span (`proc`, `peer`, `trace_id`) ended by a debug line "request done":
    /// the call's lines in the gateway's, the manager's and the drives' logs
    /// share the id.
    fn operation<'a>(&'a self, proc: &'static str, caller: &'a Caller, call: nfs_rpc::Call<'a>) -> nfs_rpc::Call<'a> {
        use tracing::Instrument;
        let trace = nasd_client::trace::fresh(self.vfs.fs().env());
        let span = tracing::info_span!("request", proc, peer = %caller.peer, trace_id = %trace);
        let done = async move {
            let started = std::time::Instant::now();
            let result = call.await;
            tracing::debug!(elapsed_us = started.elapsed().as_micros() as u64, "request done");
            result
        };
        Box::pin(nasd_client::trace::scope(Some(trace), done.instrument(span)))
    }

    async fn mount(&self, caller: &Caller, path: &[u8]) -> NfsResult<FileHandle> {
        let cx = self.cx(caller)?;
        let path = std::str::from_utf8(path).map_err(|_| nfsstat3::NFS3ERR_NOENT)?;
        let (export, rest) = self.export_of_path(path).ok_or(nfsstat3::NFS3ERR_NOENT)?;
        // The caller must reach the export (a stat as that user), and each
        // directory below it by name (no `..`, no symbolic link followed).
        let mut ino = self.roots[export];
        self.vfs.getattr(&cx, ino).await.map_err(err)?;
        for name in rest.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if name == ".." {
                return Err(nfsstat3::NFS3ERR_NOENT);
            }
            let e = self.vfs.lookup(&cx, ino, name).await.map_err(err)?;
            self.note_held(e.attr.ino);
            if e.attr.kind != FileKind::Dir {
                return Err(nfsstat3::NFS3ERR_NOTDIR);
            }
            ino = e.attr.ino;
        }
        self.seal(export as u8, ino)
    }

    fn exports(&self) -> Vec<Vec<u8>> {
        self.config.exports.iter().map(|e| e.path.as_bytes().to_vec()).collect()
    }

    fn write_verifier(&self) -> writeverf3 {
        self.verifier
    }

    async fn getattr(&self, caller: &Caller, fh: &FileHandle) -> NfsResult<fattr3> {
        let cx = self.cx(caller)?;
        let (_, ino) = self.resolve(&cx, fh).await?;
        self.attr_of(&cx, ino).await
    }

    async fn setattr(
        &self,
        caller: &Caller,
        fh: &FileHandle,
        set: sattr3,
        guard: Option<nfstime3>,
    ) -> NfsResult<fattr3> {
        let cx = self.cx(caller)?;
        let (_, ino) = self.resolve(&cx, fh).await?;
        if let Some(g) = guard {
            let now = self.attr_of(&cx, ino).await?;
            if (now.ctime.seconds, now.ctime.nseconds) != (g.seconds, g.nseconds) {
                return Err(nfsstat3::NFS3ERR_NOT_SYNC);
            }
        }
        // Writes held for the file are committed first (the layer does so).
        let a = self.vfs.setattr(&cx, ino, Self::set_of(&set)).await.map_err(err)?;
        Ok(attr::fattr(&a))
    }

    async fn lookup(&self, caller: &Caller, dir: &FileHandle, name: &[u8]) -> NfsResult<(FileHandle, fattr3)> {
        let cx = self.cx(caller)?;
        let (export, ino) = self.resolve(&cx, dir).await?;
        let name = name_of(name)?;
        // `..` of an export's root is the root: nothing above it is served.
        if name == "." || (name == ".." && ino == self.roots[usize::from(export)]) {
            return Ok((self.seal(export, ino)?, self.attr_of(&cx, ino).await?));
        }
        let e = self.vfs.lookup(&cx, ino, name).await.map_err(err)?;
        if name == ".." && !self.inside_export(&cx, export, &e).await? {
            // A directory renamed out of the export since its handle was
            // made: its parent is not served, the export's root answers.
            self.vfs.forget(e.attr.ino, 1);
            let root = self.roots[usize::from(export)];
            return Ok((self.seal(export, root)?, self.attr_of(&cx, root).await?));
        }
        self.made(export, &e)
    }

    async fn access(&self, caller: &Caller, fh: &FileHandle, mask: u32) -> NfsResult<(u32, fattr3)> {
        let cx = self.cx(caller)?;
        let (_, ino) = self.resolve(&cx, fh).await?;
        let a = self.vfs.getattr(&cx, ino).await.map_err(err)?;
        Ok((attr::access(&a, &cx, &caller.auth, mask), attr::fattr(&a)))
    }

    async fn readlink(&self, caller: &Caller, fh: &FileHandle) -> NfsResult<(Vec<u8>, fattr3)> {
        let cx = self.cx(caller)?;
        let (_, ino) = self.resolve(&cx, fh).await?;
        let target = self.vfs.readlink(&cx, ino).await.map_err(err)?;
        Ok((target.into_bytes(), self.attr_of(&cx, ino).await?))
    }

    async fn read(
        &self,
        caller: &Caller,
        fh: &FileHandle,
        offset: u64,
        count: u32,
    ) -> NfsResult<(Vec<u8>, bool, fattr3)> {
        let cx = self.cx(caller)?;
        let (_, ino) = self.resolve(&cx, fh).await?;
        let open = self.opens.get(self, &cx, ino, false).await?;
        let data = self.vfs.read(open, offset, count).await.map_err(err)?;
        self.metrics.read_bytes(data.len());
        let end = offset.saturating_add(data.len() as u64);
        let mut a = self.recent_attr_of(&cx, ino).await?;
        if data.len() < count as usize || end > a.size {
            // At or past the end the held size would tell EOF by: the
            // manager's size decides (another client may have changed it).
            a = self.attr_of(&cx, ino).await?;
        }
        Ok((data, end >= a.size, a))
    }

    async fn write(
        &self,
        caller: &Caller,
        fh: &FileHandle,
        offset: u64,
        data: &[u8],
        stable: Stable,
    ) -> NfsResult<(Stable, fattr3)> {
        let cx = self.cx(caller)?;
        let (_, ino) = self.resolve(&cx, fh).await?;
        let open = self.opens.get(self, &cx, ino, true).await?;
        self.vfs.write(open, offset, data).await.map_err(err)?;
        self.metrics.written_bytes(data.len());
        let kept = if stable == Stable::Unstable {
            Stable::Unstable
        } else {
            self.vfs.fsync(open).await.map_err(err)?;
            Stable::FileSync
        };
        Ok((kept, self.recent_attr_of(&cx, ino).await?))
    }

    async fn create(
        &self,
        caller: &Caller,
        dir: &FileHandle,
        name: &[u8],
        how: CreateHow,
    ) -> NfsResult<(FileHandle, fattr3)> {
        let cx = self.cx(caller)?;
        let (export, parent) = self.resolve(&cx, dir).await?;
        let name = new_name(name)?;
        let (set, exclusive, verifier) = match &how {
            CreateHow::Unchecked(s) => (*s, false, None),
            CreateHow::Guarded(s) => (*s, true, None),
            CreateHow::Exclusive(v) => (sattr3::default(), true, Some(*v)),
        };
        let truncate = matches!(set.size, nfs_rpc::nfs::set_size3::size(0));
        let flags = CreateFlags { exclusive, truncate, write: true };
        let made = self.vfs.create(&cx, parent, name, Self::mode_of(&set, 0o644), flags).await;
        let (e, opened) = match (made, verifier) {
            (Ok(m), _) => m,
            // An exclusive CREATE resent: the file its first try made answers again.
            (Err(e), Some(v)) if status_of(&e) == nfsstat3::NFS3ERR_EXIST => {
                let found = self.vfs.lookup(&cx, parent, name).await.map_err(err)?;
                self.note_held(found.attr.ino);
                if found.attr.kind != FileKind::File || verifier_times(&v) != (found.attr.atime_ns, found.attr.mtime_ns)
                {
                    return Err(nfsstat3::NFS3ERR_EXIST);
                }
                return Ok((self.seal(export, found.attr.ino)?, attr::fattr(&found.attr)));
            }
            (Err(e), _) => return Err(err(e)),
        };
        self.opens.adopt(self, &cx, e.attr.ino, opened.fh).await;
        match verifier {
            // Kept in the times, as Linux's server does (the client sets them next).
            Some(v) => {
                let (atime_ns, mtime_ns) = verifier_times(&v);
                let keep = SetAttr { atime_ns: Some(atime_ns), mtime_ns: Some(mtime_ns), ..SetAttr::default() };
                let a = self.vfs.setattr(&cx, e.attr.ino, keep).await.map_err(err)?;
                self.note_held(e.attr.ino);
                Ok((self.seal(export, e.attr.ino)?, attr::fattr(&a)))
            }
            None => {
                self.apply_rest(&cx, e.attr.ino, &set).await?;
                self.made(export, &e)
            }
        }
    }

    async fn mkdir(
        &self,
        caller: &Caller,
        dir: &FileHandle,
        name: &[u8],
        set: sattr3,
    ) -> NfsResult<(FileHandle, fattr3)> {
        let cx = self.cx(caller)?;
        let (export, parent) = self.resolve(&cx, dir).await?;
        let e = self.vfs.mkdir(&cx, parent, new_name(name)?, Self::mode_of(&set, 0o755)).await.map_err(err)?;
        self.apply_rest(&cx, e.attr.ino, &set).await?;
        self.made(export, &e)
    }

    async fn symlink(
        &self,
        caller: &Caller,
        dir: &FileHandle,
        name: &[u8],
        target: &[u8],
        _set: sattr3,
    ) -> NfsResult<(FileHandle, fattr3)> {
        let cx = self.cx(caller)?;
        let (export, parent) = self.resolve(&cx, dir).await?;
        let target = std::str::from_utf8(target).map_err(|_| nfsstat3::NFS3ERR_INVAL)?;
        let e = self.vfs.symlink(&cx, parent, new_name(name)?, target).await.map_err(err)?;
        self.made(export, &e)
    }

    async fn mknod(
        &self,
        caller: &Caller,
        dir: &FileHandle,
        name: &[u8],
        kind: ftype3,
        set: sattr3,
        rdev: (u32, u32),
    ) -> NfsResult<(FileHandle, fattr3)> {
        let cx = self.cx(caller)?;
        let (export, parent) = self.resolve(&cx, dir).await?;
        let kind = match kind {
            ftype3::NF3CHR => FileKind::CharDevice,
            ftype3::NF3BLK => FileKind::BlockDevice,
            ftype3::NF3SOCK => FileKind::Socket,
            ftype3::NF3FIFO => FileKind::Fifo,
            _ => return Err(nfsstat3::NFS3ERR_BADTYPE),
        };
        let rdev = attr::join_dev(rdev.0, rdev.1);
        let mode = Self::mode_of(&set, 0o644);
        let e = self.vfs.mknod(&cx, parent, new_name(name)?, Some(kind), mode, rdev).await.map_err(err)?;
        self.apply_rest(&cx, e.attr.ino, &set).await?;
        self.made(export, &e)
    }

    async fn remove(&self, caller: &Caller, dir: &FileHandle, name: &[u8]) -> NfsResult<()> {
        let cx = self.cx(caller)?;
        let (_, parent) = self.resolve(&cx, dir).await?;
        self.vfs.unlink(&cx, parent, new_name(name)?).await.map_err(err)
    }

    async fn rmdir(&self, caller: &Caller, dir: &FileHandle, name: &[u8]) -> NfsResult<()> {
        let cx = self.cx(caller)?;
        let (_, parent) = self.resolve(&cx, dir).await?;
        self.vfs.rmdir(&cx, parent, new_name(name)?).await.map_err(err)
    }

    async fn rename(&self, caller: &Caller, from: (&FileHandle, &[u8]), to: (&FileHandle, &[u8])) -> NfsResult<()> {
        let cx = self.cx(caller)?;
        let (from_export, from_dir) = self.resolve(&cx, from.0).await?;
        let (to_export, to_dir) = self.resolve(&cx, to.0).await?;
        if from_export != to_export {
            return Err(nfsstat3::NFS3ERR_XDEV);
        }
        self.vfs.rename(&cx, (from_dir, new_name(from.1)?), (to_dir, new_name(to.1)?)).await.map_err(err)
    }

    async fn link(&self, caller: &Caller, file: &FileHandle, dir: &FileHandle, name: &[u8]) -> NfsResult<fattr3> {
        let cx = self.cx(caller)?;
        let (file_export, ino) = self.resolve(&cx, file).await?;
        let (dir_export, parent) = self.resolve(&cx, dir).await?;
        if file_export != dir_export {
            return Err(nfsstat3::NFS3ERR_XDEV);
        }
        let e = self.vfs.link(&cx, ino, parent, new_name(name)?).await.map_err(err)?;
        self.note_held(e.attr.ino);
        Ok(attr::fattr(&e.attr))
    }

    async fn readdir(
        &self,
        caller: &Caller,
        dir: &FileHandle,
        cookie: u64,
        verifier: cookieverf3,
        max_entries: usize,
        plus: bool,
    ) -> NfsResult<DirPage> {
        let cx = self.cx(caller)?;
        let (export, ino) = self.resolve(&cx, dir).await?;
        dirs::page(self, &cx, export, ino, cookie, verifier, max_entries, plus).await
    }

    async fn fsstat(&self, caller: &Caller, fh: &FileHandle) -> NfsResult<(FsStat, fattr3)> {
        let cx = self.cx(caller)?;
        let (_, ino) = self.resolve(&cx, fh).await?;
        let s = self.vfs.statfs(&cx).await.map_err(err)?;
        let files_max = u64::from(u32::MAX);
        let stat = FsStat {
            total_bytes: s.capacity_bytes,
            free_bytes: s.free_bytes,
            avail_bytes: s.free_bytes,
            total_files: files_max.max(s.inodes),
            free_files: files_max.saturating_sub(s.inodes),
            avail_files: files_max.saturating_sub(s.inodes),
        };
        Ok((stat, self.attr_of(&cx, ino).await?))
    }

    async fn commit(&self, caller: &Caller, fh: &FileHandle, _offset: u64, _count: u32) -> NfsResult<fattr3> {
        let cx = self.cx(caller)?;
        let (_, ino) = self.resolve(&cx, fh).await?;
        self.opens.commit(self, ino).await?;
        self.attr_of(&cx, ino).await
    }
}
