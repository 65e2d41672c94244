//! The environment seam: everything nasd's daemons and clients take from the
//! world outside the process — the wall clock, randomness, tasks, the
//! network and the disk — goes through an [`Env`], passed explicitly.
//!
//! [`Env::real`] (the [`Default`]) is the operating system: the system clock,
//! the OS random source, tokio's tasks and sockets, files and `fsync`. It is
//! a `None` inside the handle, so every call is a branch and a direct call to
//! what the code called before: no allocation, no dynamic dispatch on the
//! hot path (a [`net::Stream`] over TCP is the `TcpStream`, a
//! [`disk::DiskFile`] the `File`).
//!
//! [`Env::simulated`] hands every one of those calls to a [`World`] — the
//! deterministic simulator (`nasd-sim`), which runs a whole cluster in one
//! process from one seed: simulated time, an in-memory network that delays,
//! partitions and resets, disks that lose what was not synced at a crash.
//!
//! **Architecture Invariant:** nothing below the seam reads the wall clock,
//! the OS random source, the network or the disk except through an `Env`
//! (ARCHITECTURE.md, "The environment seam").
//!
//! ```
//! let env = nasd_env::Env::real();
//! assert!(env.is_real());
//! let a = env.now_ns();
//! assert!(env.now_ns() >= a.saturating_sub(1_000_000_000));
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod clock;
pub mod disk;
pub mod net;
pub mod task;

pub use disk::{DirLock, DiskFile};
pub use net::{Listener, ReadHalf, Stream, StreamProbe, WriteHalf};

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

/// A boxed future, as a [`World`] hands them out.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The environment a component runs in: the real operating system, or a
/// simulated [`World`]. Cheap to clone (an `Option<Arc>`).
#[derive(Clone, Default)]
pub struct Env {
    world: Option<Arc<dyn World>>,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.world {
            None => f.write_str("Env::real"),
            Some(w) => write!(f, "Env::simulated({})", w.name()),
        }
    }
}

/// Deliberate bugs a simulated world may arm to show that the simulator's
/// checkers catch them (`nasd-sim`'s `injected_bug` tests). Compiled into a
/// component only with its `sim-bugs` cargo feature, and armed only by a
/// [`World`]: [`Env::real`] never arms one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Bug {
    /// The store commits its index without first syncing the block file:
    /// an acknowledged flush may name blocks a crash then loses.
    SkipBlockSync,
    /// The drive accepts a capability whose access-control version is older
    /// than the object's: a revocation does not stop it.
    AcceptStaleAcv,
    /// The manager never rebuilds a lost drive's components elsewhere:
    /// files stay short of their redundancy after a drive is gone for good.
    SkipRebuild,
    /// The manager's metadata flush (periodic, before removals, `SYNC`)
    /// does nothing: a power loss takes changes acknowledged longer ago
    /// than `metadata_sync_ms`.
    SkipMetadataSync,
    /// The manager answers a chmod, chown or ACL change before the drives
    /// refuse the old capabilities: it leaves the revocations it logged to
    /// its next maintenance pass instead of carrying them out first.
    SkipRevocation,
    /// The drive keeps its oldest working key as the previous one when a
    /// new one is set: a capability minted under a key two rotations old
    /// is still honoured.
    KeepRetiredWorkingKey,
    /// The manager answers an administrator's `SYNC_IDENTITY_KEYS` at once,
    /// leaving the shared keys to its next maintenance pass: a key the
    /// authentication server retired still serves open identity sessions
    /// after the synchronization returned.
    SkipIdentityKeySync,
}

/// A simulated world as one component sees it (its node: its clock, its
/// disk, its network address). Implemented by the simulator; every method
/// is called on the simulator's one thread, or on a blocking task it runs
/// in turn with that thread.
pub trait World: Send + Sync + 'static {
    /// The node's name, for logs.
    fn name(&self) -> &str;
    /// The node's wall clock: nanoseconds since the Unix epoch.
    fn now_ns(&self) -> u64;
    /// Fills `buf` from the world's seeded randomness.
    fn fill_random(&self, buf: &mut [u8]);
    /// Records a task spawned on behalf of the node, so that a crash of the
    /// node ends it.
    fn track(&self, task: tokio::task::AbortHandle);
    /// Runs `f` as a blocking task: the returned future completes when `f`
    /// has returned (resuming its panic if it panicked). `f` may wait on
    /// futures with [`World::block_on`].
    fn run_blocking(&self, f: Box<dyn FnOnce() + Send>) -> BoxFuture<()>;
    /// Runs `fut` to completion from a blocking task started by
    /// [`World::run_blocking`], letting the rest of the world run meanwhile.
    fn block_on(&self, fut: Pin<&mut dyn Future<Output = ()>>);
    /// Opens a connection from this node to `addr`.
    fn connect(&self, addr: SocketAddr) -> BoxFuture<io::Result<Stream>>;
    /// Listens on `addr` on this node (port 0: any free port).
    fn bind(&self, addr: SocketAddr) -> io::Result<Listener>;
    /// The node's disk.
    fn disk(&self) -> &dyn disk::SimDisk;
    /// Whether the world armed `bug` for this node.
    fn injected_bug(&self, bug: Bug) -> bool {
        let _ = bug;
        false
    }
}

impl Env {
    /// The operating system.
    pub fn real() -> Env {
        Env { world: None }
    }

    /// A simulated world.
    pub fn simulated(world: Arc<dyn World>) -> Env {
        Env { world: Some(world) }
    }

    /// True for [`Env::real`].
    pub fn is_real(&self) -> bool {
        self.world.is_none()
    }

    /// The simulated world, if any.
    pub fn world(&self) -> Option<&Arc<dyn World>> {
        self.world.as_ref()
    }

    /// The wall clock: nanoseconds since the Unix epoch (0 before it).
    pub fn now_ns(&self) -> u64 {
        match &self.world {
            None => clock::system_ns(),
            Some(w) => w.now_ns(),
        }
    }

    /// The wall clock in whole seconds since the Unix epoch.
    pub fn now_secs(&self) -> u64 {
        self.now_ns() / 1_000_000_000
    }

    /// Fills `buf` with random bytes: the OS random source, or the world's
    /// seeded one. Good for key material in the real environment.
    ///
    /// # Panics
    /// If the OS random source fails (as `nasd_crypto::random_bytes`).
    pub fn fill_random(&self, buf: &mut [u8]) {
        match &self.world {
            None => getrandom::getrandom(buf).expect("the OS random source failed"),
            Some(w) => w.fill_random(buf),
        }
    }

    /// A random `u64` ([`Env::fill_random`]).
    pub fn random_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        self.fill_random(&mut b);
        u64::from_le_bytes(b)
    }

    /// A generator for decisions (placement, shuffles, back-off jitter): the
    /// thread's generator in the real environment, the world's otherwise.
    pub fn rng(&self) -> EnvRng<'_> {
        EnvRng { env: self }
    }

    /// Whether a simulated world armed `bug` (never in the real environment).
    pub fn injected_bug(&self, bug: Bug) -> bool {
        self.world.as_ref().is_some_and(|w| w.injected_bug(bug))
    }

    /// The simulated disk, if any.
    pub(crate) fn sim_disk(&self) -> Option<&dyn disk::SimDisk> {
        self.world.as_ref().map(|w| w.disk())
    }

    /// Connects to `addr` (resolved by tokio in the real environment; a
    /// simulated world knows only socket addresses).
    ///
    /// # Errors
    /// As `TcpStream::connect`.
    pub async fn connect(&self, addr: impl tokio::net::ToSocketAddrs) -> io::Result<Stream> {
        match &self.world {
            None => Ok(Stream::from(tokio::net::TcpStream::connect(addr).await?)),
            Some(w) => {
                let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to");
                for a in tokio::net::lookup_host(addr).await? {
                    match w.connect(a).await {
                        Ok(s) => return Ok(s),
                        Err(e) => last = e,
                    }
                }
                Err(last)
            }
        }
    }

    /// Listens on `addr`.
    ///
    /// # Errors
    /// As `TcpListener::bind`.
    pub async fn bind(&self, addr: impl tokio::net::ToSocketAddrs) -> io::Result<Listener> {
        match &self.world {
            None => Ok(Listener::from(tokio::net::TcpListener::bind(addr).await?)),
            Some(w) => {
                let a = tokio::net::lookup_host(addr)
                    .await?
                    .next()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to bind"))?;
                w.bind(a)
            }
        }
    }

    /// Opens (creating it if asked) a file for positioned reads and writes.
    ///
    /// # Errors
    /// As `OpenOptions::open`.
    pub fn open_file(&self, path: &Path, create: bool) -> io::Result<DiskFile> {
        disk::open_file(self, path, create)
    }

    /// Creates a directory and its parents.
    ///
    /// # Errors
    /// As `std::fs::create_dir_all`.
    pub fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        match self.sim_disk() {
            None => std::fs::create_dir_all(path),
            Some(d) => d.create_dir_all(path),
        }
    }

    /// Makes the directory's entries durable (`fsync` of the directory).
    ///
    /// # Errors
    /// As `File::sync_all`.
    pub fn sync_dir(&self, path: &Path) -> io::Result<()> {
        match self.sim_disk() {
            None => std::fs::File::open(path)?.sync_all(),
            Some(d) => d.sync_dir(path),
        }
    }

    /// Takes the exclusive lock file `path` (created if missing), held until
    /// the returned lock is dropped; fails at once if another holder has it.
    ///
    /// # Errors
    /// `WouldBlock` if it is held; otherwise as `OpenOptions::open`.
    pub fn lock_file(&self, path: &Path) -> io::Result<DirLock> {
        disk::lock_file(self, path)
    }

    /// Opens (creating it if needed) the SQLite database `path`: on the real
    /// file system, or through the simulated disk's VFS.
    ///
    /// # Errors
    /// As `rusqlite::Connection::open`.
    pub fn open_sqlite(&self, path: &Path) -> rusqlite::Result<rusqlite::Connection> {
        match self.sim_disk() {
            None => rusqlite::Connection::open(path),
            Some(d) => {
                let (vfs, name) = d.sqlite_vfs(path);
                rusqlite::Connection::open_with_flags_and_vfs(name, rusqlite::OpenFlags::default(), &vfs)
            }
        }
    }
}

/// [`Env::rng`]: a `rand::RngCore` over the environment's randomness.
pub struct EnvRng<'a> {
    env: &'a Env,
}

impl rand::RngCore for EnvRng<'_> {
    fn next_u32(&mut self) -> u32 {
        self.next_u64() as u32
    }
    fn next_u64(&mut self) -> u64 {
        match &self.env.world {
            None => rand::thread_rng().next_u64(),
            Some(_) => self.env.random_u64(),
        }
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        match &self.env.world {
            None => rand::thread_rng().fill_bytes(dest),
            Some(w) => w.fill_random(dest),
        }
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}
