//! nasd-vfs: the file-system layer every gateway shares (the FUSE mount,
//! the CLI's copies; NFS, S3 and the Python gateway next), between
//! [`nasd_fs::FsClient`] and the adapters. A gateway translates its
//! protocol and its errors; everything with delicate semantics is here,
//! written once:
//!
//! - **Files by inode and by path**: a [`Vfs`] holds, for every inode its
//!   client refers to, the manager's handle and last attributes
//!   (`inodes.rs`); [`Vfs::resolve`] addresses one by path.
//! - **Open-file sharing**: every open descriptor of an inode reads and
//!   writes through one [`nasd_fs::File`], so a write through one is read
//!   through another at once (POSIX within one host), and two descriptors
//!   never hold two write transactions on one file.
//! - **Unlink of open files**: the manager destroys a file's data when its
//!   last name goes; a name removed (or replaced by a rename) while its file
//!   is open here is renamed to a hidden name (`.nasd-unlinked-…`, NFS's
//!   silly rename) and removed at the last close.
//! - **Directory cursors that survive concurrent changes** (`dir.rs`):
//!   offsets for the gateway, pages by name at the manager.
//! - **Atomic create-and-replace** ([`Replacement`]): a file written under a
//!   temporary name beside its destination and renamed (or hard-linked)
//!   into place only when whole.
//! - **Caches kept true by the manager's change feed** (`feed.rs`): the
//!   answer to the extended-attribute question the kernel asks before every
//!   write, the data-cache stamps, and the gateway's own caches through an
//!   [`Invalidator`]; while the feed is live and the client has one manager,
//!   gateways may keep attributes and names for [`ATTR_TTL_FED`]
//!   ([`Vfs::attr_ttl`]), else for the configured attribute timeout.
//! - **Handles that outlive the gateway** ([`PersistentHandle`]): the
//!   manager's handle carries its own MAC, so a gateway restarted (or
//!   another process of the same user) reopens it without any table.
//!
//! Every operation takes the client it runs as (`cx`): the gateway's own,
//! or one acting for a local caller ([`nasd_fs::FsClient::as_user`]).
//! Reads and writes of open files run as the client that opened them.
//!
//! ```no_run
//! # async fn demo(fs: nasd_fs::FsClient) -> Result<(), nasd_vfs::VfsError> {
//! let vfs = nasd_vfs::Vfs::start(fs.clone(), nasd_vfs::VfsConfig::default()).await?;
//! let e = vfs.lookup(&fs, nasd_fs::ROOT_INO, "docs").await?;
//! let dir = vfs.opendir(e.attr.ino)?;
//! vfs.readdir(&fs, dir, 2, |_next, item| { println!("{}", item.name); false }).await?;
//! vfs.releasedir(dir);
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod dir;
mod feed;
mod handle;
mod inodes;
mod negative;
mod ops;
mod replace;

pub use dir::{DirItem, FIRST_ENTRY, UNKNOWN_INO};
pub use feed::Invalidator;
pub use handle::{PersistentHandle, PERSISTENT_HANDLE_LEN};
pub use ops::{CreateFlags, Opened, StatFs, WRITE_CHECK_XATTR};
pub use replace::{temp_name, Replacement, TEMP_SUFFIX};

use inodes::Inodes;
use nasd_fs::{Change, FsClient, FsError, Ino};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// How long gateways may keep attributes and names by default when the
/// change feed cannot vouch for them: the bound within which a change made
/// through another client becomes visible.
pub const ATTR_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);
/// Longest attribute timeout a gateway may configure.
pub const ATTR_TTL_MAX: Duration = Duration::from_secs(60);
/// How long gateways may keep attributes and names while the change feed
/// is live and the client uses one manager (whose feed sees every change):
/// the feed invalidates what changes, so this only bounds what a lost
/// invalidation could cost.
pub const ATTR_TTL_FED: Duration = ATTR_TTL_MAX;
/// Open file descriptions one `Vfs` keeps; more opens fail with `ENFILE`.
pub const OPEN_FILES_MAX: usize = 65_536;
/// Open directory cursors one `Vfs` keeps; more fail with `ENFILE`.
pub const OPEN_DIRS_MAX: usize = 16_384;
/// Prefix of the hidden name a file unlinked while open lives on under.
pub const HIDDEN_PREFIX: &str = ".nasd-unlinked-";

const _: () = assert!(ATTR_TIMEOUT_DEFAULT.as_nanos() <= ATTR_TTL_MAX.as_nanos());
const _: () = assert!(ATTR_TTL_FED.as_nanos() <= ATTR_TTL_MAX.as_nanos());

/// Why a file-system layer call failed. One mapping to `errno`:
/// [`VfsError::errno`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VfsError {
    /// The client library (the manager, a drive, the connection) failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The inode is not held (the gateway forgot it, or never had it):
    /// `ESTALE`.
    #[error("inode {0} is not held")]
    Stale(Ino),
    /// No such open file or directory cursor: `EBADF`.
    #[error("no such open file or directory")]
    BadDescriptor,
    /// Too many open files or cursors ([`OPEN_FILES_MAX`],
    /// [`OPEN_DIRS_MAX`]): `ENFILE`.
    #[error("too many open files")]
    TooManyOpen,
    /// An argument the file system cannot take (a name that is not UTF-8,
    /// a flag it does not know): `EINVAL`.
    #[error("{0}")]
    Invalid(&'static str),
    /// Not supported by nasd: `EOPNOTSUPP`.
    #[error("{0}")]
    NotSupported(&'static str),
    /// A refusal remembered from the manager (`errno`), answered from a cache.
    #[error("refused (errno {0})")]
    Refused(i32),
    /// Permission denied before asking the manager: `EACCES`.
    #[error("permission denied")]
    Denied,
    /// A persistent handle that does not decode: `ESTALE` (a handle from
    /// another file system, another version, or damaged).
    #[error("{0}")]
    BadHandle(String),
}

impl VfsError {
    /// The POSIX `errno` this failure maps to.
    pub fn errno(&self) -> i32 {
        match self {
            VfsError::Fs(e) => e.errno(),
            VfsError::Stale(_) | VfsError::BadHandle(_) => libc_errno::ESTALE,
            VfsError::BadDescriptor => libc_errno::EBADF,
            VfsError::TooManyOpen => libc_errno::ENFILE,
            VfsError::Invalid(_) => libc_errno::EINVAL,
            VfsError::NotSupported(_) => libc_errno::EOPNOTSUPP,
            VfsError::Refused(errno) => *errno,
            VfsError::Denied => libc_errno::EACCES,
        }
    }

    /// The manager's status, if it refused.
    pub fn status(&self) -> Option<nasd_fs::FsStatus> {
        match self {
            VfsError::Fs(e) => e.status(),
            _ => None,
        }
    }
}

/// The Linux `errno` values used here (the crate needs no libc).
mod libc_errno {
    pub const EBADF: i32 = 9;
    pub const EACCES: i32 = 13;
    pub const EINVAL: i32 = 22;
    pub const ENFILE: i32 = 23;
    pub const ENODATA: i32 = 61;
    pub const EOPNOTSUPP: i32 = 95;
    pub const ESTALE: i32 = 116;
}

/// How a [`Vfs`] runs.
#[derive(Debug, Clone)]
pub struct VfsConfig {
    /// How long attributes and names may be kept when the change feed
    /// cannot vouch for them (at most [`ATTR_TTL_MAX`]).
    pub attr_timeout: Duration,
    /// Follow the manager's change feed (long-lived gateways); a short
    /// command (the CLI's copies) does without.
    pub follow_feed: bool,
}

impl Default for VfsConfig {
    fn default() -> Self {
        VfsConfig { attr_timeout: ATTR_TIMEOUT_DEFAULT, follow_feed: true }
    }
}

/// One open file description.
#[derive(Debug, Clone, Copy)]
struct OpenFile {
    ino: Ino,
    /// Opened for writing: its `close` commits the file's writes.
    write: bool,
}

/// The file-system layer of one gateway. Cheap to clone; clones share
/// everything.
#[derive(Clone)]
pub struct Vfs {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Vfs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vfs").field("inodes", &lock(&self.shared.inodes).len()).finish_non_exhaustive()
    }
}

/// Everything a `Vfs`'s clones share.
struct Shared {
    /// The gateway's own client (background work, hidden-name clean-up).
    fs: FsClient,
    config: VfsConfig,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, OpenFile>>,
    dirs: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<dir::DirCursor>>>>,
    next_fh: AtomicU64,
    hidden_seq: AtomicU64,
    /// The gateway's own caches, told what the feed invalidates.
    invalidator: OnceLock<Arc<dyn Invalidator>>,
    /// The change feed answered its last wait and lost nothing since:
    /// what it has not reported has not changed (with one manager).
    fed: AtomicBool,
    /// Cache invalidations sent to the gateway from the change feed.
    invalidations: AtomicU64,
    /// Changes the feed reported that this gateway made itself (skipped).
    own_skipped: AtomicU64,
    /// When a call that does not wait last tried the manager during an outage.
    outage_try: Mutex<Option<std::time::Instant>>,
    /// Changes this gateway is making itself, which the feed will report:
    /// its client learnt them from the replies, so they are skipped.
    own: Mutex<HashMap<Change, (u32, std::time::Instant)>>,
    /// The change feed's connection: absent names are answered only while
    /// it is open and idle (a manager that stopped closed it, or said so on it).
    watch_link: Option<nasd_fs::WatchLink>,
    /// Names known absent ([`negative`]).
    negatives: Mutex<negative::Negatives>,
    /// Lookups answered from [`Shared::negatives`] (tests, diagnostics).
    negative_hits: AtomicU64,
    /// The task following the change feed.
    feed_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(t) = lock(&self.feed_task).take() {
            t.abort();
        }
    }
}

/// Locks a mutex, taking it over if a panicking request left it poisoned
/// (every critical section leaves the tables consistent between statements).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Vfs {
    /// The layer over `fs`, holding its root directory; with
    /// [`VfsConfig::follow_feed`], it first takes a place in the manager's
    /// change feed (every change made after `start` returns is reported)
    /// and follows it from a task of its own on the current runtime.
    ///
    /// # Errors
    /// The root directory cannot be reached; an attribute timeout over
    /// [`ATTR_TTL_MAX`].
    pub async fn start(fs: FsClient, config: VfsConfig) -> Result<Vfs, VfsError> {
        if config.attr_timeout > ATTR_TTL_MAX {
            return Err(VfsError::Invalid("the attribute timeout is over ATTR_TTL_MAX"));
        }
        let root = fs.root().await?;
        let watcher = if config.follow_feed {
            let mut watcher = fs.watcher();
            let started = match watcher.wait(Duration::ZERO).await {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "the manager's change feed is not reachable yet: the attribute timeout bounds staleness until it is");
                    false
                }
            };
            Some((watcher, started))
        } else {
            None
        };
        let vfs = Vfs {
            shared: Arc::new(Shared {
                fs,
                config,
                inodes: Mutex::new(Inodes::new(&root)),
                files: Mutex::new(HashMap::new()),
                dirs: Mutex::new(HashMap::new()),
                next_fh: AtomicU64::new(1),
                hidden_seq: AtomicU64::new(0),
                invalidator: OnceLock::new(),
                fed: AtomicBool::new(false),
                invalidations: AtomicU64::new(0),
                own_skipped: AtomicU64::new(0),
                outage_try: Mutex::new(None),
                own: Mutex::new(HashMap::new()),
                watch_link: watcher.as_ref().map(|(w, _)| w.link()),
                negatives: Mutex::new(negative::Negatives::default()),
                negative_hits: AtomicU64::new(0),
                feed_task: Mutex::new(None),
            }),
        };
        if let Some((watcher, started)) = watcher {
            vfs.shared.fed.store(started, std::sync::atomic::Ordering::SeqCst);
            // The task holds only a weak reference: the layer ends when its last clone goes.
            let task = tokio::spawn(feed::follow(Arc::downgrade(&vfs.shared), watcher, started));
            *lock(&vfs.shared.feed_task) = Some(task);
        }
        Ok(vfs)
    }

    /// Tells the layer where the gateway's own caches are (once; later
    /// calls are ignored): the change feed's invalidations go there too.
    pub fn set_invalidator(&self, invalidator: Arc<dyn Invalidator>) {
        let _ = self.shared.invalidator.set(invalidator);
    }

    /// The gateway's own client.
    pub fn fs(&self) -> &FsClient {
        &self.shared.fs
    }

    /// How long a gateway may keep the attributes and names this layer
    /// hands out: [`ATTR_TTL_FED`] while the change feed is live and the
    /// client uses one manager (the feed then reports every change, and
    /// the layer invalidates it), else the configured attribute timeout.
    pub fn attr_ttl(&self) -> Duration {
        if self.fed() {
            ATTR_TTL_FED
        } else {
            self.shared.config.attr_timeout
        }
    }

    /// Whether the change feed vouches for cached attributes now.
    fn fed(&self) -> bool {
        if !self.shared.fed.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        // Another manager's changes reach only its own feed.
        self.shared.fs.routing_table().is_none_or(|t| t.managers.len() <= 1)
    }

    /// Cache invalidations the change feed sent the gateway so far.
    pub fn invalidations(&self) -> u64 {
        self.shared.invalidations.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Changes the feed reported that this gateway made itself, and which
    /// it therefore did not invalidate (its client took them from the replies).
    pub fn own_changes_skipped(&self) -> u64 {
        self.shared.own_skipped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Lookups answered "no such name" from the names this layer knows are
    /// absent, without the manager (tests, diagnostics).
    pub fn negative_hits(&self) -> u64 {
        self.shared.negative_hits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Directories and names held in the table of absent names now (tests, diagnostics).
    pub fn negative_entries(&self) -> usize {
        lock(&self.shared.negatives).len()
    }

    /// Inodes held now (for tests and diagnostics).
    pub fn inodes_held(&self) -> usize {
        lock(&self.shared.inodes).len()
    }

    /// Stops following the change feed (the gateway ends): cached
    /// attributes are then kept only for the attribute timeout.
    pub fn stop_feed(&self) {
        self.shared.fed.store(false, std::sync::atomic::Ordering::SeqCst);
        lock(&self.shared.negatives).clear();
        if let Some(t) = lock(&self.shared.feed_task).take() {
            t.abort();
        }
    }

    /// Removes the hidden names left when the gateway ends with files open
    /// (FUSE releases every descriptor before a session ends; this is for a
    /// session that was cut off).
    pub async fn remove_hidden(&self) {
        let hidden = lock(&self.shared.inodes).take_hidden();
        for h in hidden {
            ops::remove_hidden_name(&h).await;
        }
    }
}
