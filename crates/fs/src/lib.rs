//! The nasd file-system client library.
//!
//! An [`FsClient`] logs in to a file manager over TLS and asks it for names,
//! attributes and capabilities; file data then moves directly between the
//! client and the drives (NASD §3.1), protected with the capability keys. A
//! regular file is spread over component objects on several drives by its
//! layout (stripe, mirror, Reed-Solomon); a [`File`] reads and writes them all
//! at once through the striping engine (`nasd_stripe`), reading around failed
//! components while the layout's redundancy allows, and writes inside write
//! transactions the manager coordinates (`BEGIN_WRITE`, `COMMIT`), so a crash
//! leaves every stripe old or new. Capabilities are cached per file and
//! refreshed transparently — before they expire, and again if a drive refuses
//! one as expired, revoked or made with a retired key — so a transfer longer
//! than a capability's lifetime works.
//!
//! A client logged in with an identity (DSFS) gives it to its drive pool
//! (`nasd_stripe::DrivePool::set_identity`, again at every renewal:
//! `renew.rs`), so on a partition that accepts PALs requests go under the
//! identity and elsewhere under the capability, the caller noticing
//! neither. A client acting as a gateway for another user
//! ([`FsClient::as_user`], `AS_USER`) uses a second pool without the
//! identity: a drive must not judge another user's requests by the
//! gateway's own PAL entries, so those go under the capabilities minted for
//! that user (a PALs-only partition mints none, and the manager refuses
//! `AS_USER` there). `stat` and `lstat` take attributes from the manager
//! alone: a regular file's size and times are what its writers' commits
//! recorded. Manager connections, failover and routing: `conn.rs`; waiting
//! out a manager's outage: [`with_manager_wait`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), nasd_fs::FsError> {
//! let fs = nasd_fs::FsClient::connect(&nasd_fs::FsConfig {
//!     manager: "127.0.0.1:7300".into(),
//!     server_name: "localhost".into(),
//!     ca_cert: "nasd-data/tls/ca.pem".into(),
//!     user: "alice".into(),
//!     password: "correct horse".into(),
//!     ..Default::default()
//! }).await?;
//! fs.mkdir("/docs", 0o755).await?;
//! fs.write_file("/docs/hello.txt", b"hello").await?;
//! assert_eq!(fs.read_file("/docs/hello.txt").await?, b"hello");
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod binder;
mod cache;
mod checksum;
mod conn;
mod file;
mod hints;
mod pipeline;
mod renew;
mod txn;
mod wait;

pub use cache::HELD_CAPABILITIES_MAX;
pub use checksum::{file_checksum, CHECKSUM_CONTEXT};
pub use conn::{
    connector, ChangeBatch, Identity, RoutingStats, WatchLink, Watcher, MANAGER_CONNECTIONS_MAX, MANAGER_DOWN_AVOID,
    MANAGER_IDLE_REUSE_MAX, STALE_ROUTING_RESENDS_MAX,
};
pub use file::{File, HOLE_SKIP_FILE_BYTES_MIN};
pub use hints::{HintedReads, HINTS_AHEAD_MAX, PROGRESS_EVERY};
pub use nasd_proto::acl::{
    AclEntry, AclInfo, AclWho, ACL_ENTRIES_MAX, ACL_EXECUTE, ACL_INHERIT, ACL_READ, ACL_SET_ACL, ACL_SHARED, ACL_WRITE,
};
pub use nasd_proto::fs::{FileAttr, FileKind, FsStatus, Ino, ObjectRef, GROUPS_MAX, ROOT_INO, XATTR_NAME_MAX};
pub use nasd_proto::layout::{Component, ComponentState, Layout, Scheme};
pub use nasd_proto::manager::{
    Change, ClusterStatus, DriveState, DriveStatus, DriveUsage, Handle, LayoutInfo, OpenMode, Progress, QuotaInfo,
    QuotaOf, RepairAction, ScrubSummary, UserInfo, XattrMode, CONNECTION_REQUESTS_MAX,
};
pub use nasd_proto::routing::{RoutingPolicy, RoutingTable, ROUTING_SITES};
pub use nasd_stripe::{BoxFuture, ComponentFailure, FailureCause, Seek, StripeError};
pub use renew::{renew_margin, IdentitySource, RENEW_MARGIN_DIVISOR, RENEW_MARGIN_MAX, RENEW_RETRY_PAUSE};
pub use txn::{TXN_BYTES_MAX, TXN_LEASE_FRACTION};
pub use wait::{
    with_manager_wait, Interrupted, ManagerWait, INTERRUPT_POLL, MANAGER_PROBE_PAUSE, MANAGER_WAIT_BOUND_MAX,
    OUTAGE_LOG_TARGET,
};

use cache::Held;
use conn::ManagerPool;
use nasd_client::ClientError;
use nasd_proto::manager::{set_mask, FileAccess as Access, ManagerReply, ManagerRequest};
pub use nasd_proto::manager::{Entry, READDIR_ENTRIES_MAX};
use nasd_proto::Protection;
use nasd_stripe::{DrivePool, Target};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use thiserror::Error;
use tokio::time::Instant;

/// Why a file-system call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FsError {
    /// The manager refused: the status says why (POSIX `errno` via [`FsError::errno`]).
    #[error("{message}")]
    Fs {
        /// The status.
        status: FsStatus,
        /// The manager's explanation.
        message: String,
    },
    /// More of a file's component objects failed (or are down or stale) than
    /// its layout tolerates: the bytes cannot be read, or a write could not
    /// reach enough components. No partial or wrong data was returned. The
    /// message names the drives and says what to do.
    #[error("{message}")]
    Unavailable {
        /// The manager's numbers of the drives of the unavailable components.
        missing_drives: Vec<u32>,
        /// How many unavailable components the file's layout tolerates.
        tolerates: usize,
        /// Each unavailable component and why.
        failures: Vec<ComponentFailure>,
        /// What happened and what to do.
        message: String,
    },
    /// The striping engine refused the operation otherwise (a range past
    /// what the layout holds, the layout changed while the file was open, a
    /// bad binding from the manager).
    #[error("{0}")]
    Stripe(StripeError),
    /// A drive refused or could not be reached.
    #[error("drive: {0}")]
    Drive(#[from] ClientError),
    /// The connection to the manager failed.
    #[error("connection to the manager failed: {0}")]
    Io(#[from] std::io::Error),
    /// Reading the caller's source or writing its destination failed.
    #[error("local I/O failed: {0}")]
    Local(std::io::Error),
    /// Configuration or connection set-up is wrong; the message says what to fix.
    #[error("{0}")]
    Setup(String),
    /// No manager could be reached: none accepted a connection (or each
    /// closed it before the login finished), after waiting as long as the
    /// request's [`ManagerWait`] allows. The request was not sent.
    #[error("{message}")]
    ManagerUnreachable {
        /// Which managers, why, and how long the request waited.
        message: String,
    },
    /// The request's caller was interrupted while the request waited for a
    /// manager ([`with_manager_wait`]). The request was not sent.
    #[error("{message}")]
    Interrupted {
        /// What the request was waiting for.
        message: String,
    },
    /// A peer broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
}

/// `errno` values [`FsError::errno`] uses beyond the manager's statuses.
mod errno {
    pub const EINTR: i32 = 4;
    pub const EIO: i32 = 5;
    pub const EACCES: i32 = 13;
    pub const EFBIG: i32 = 27;
    pub const ENOSPC: i32 = 28;
}

/// Whether a drive's status means it is out of space.
pub(crate) fn no_space(status: Option<nasd_proto::Status>) -> bool {
    matches!(status, Some(nasd_proto::Status::NoSpace | nasd_proto::Status::QuotaExceeded))
}

impl FsError {
    /// The manager's status, if it refused.
    pub fn status(&self) -> Option<FsStatus> {
        match self {
            FsError::Fs { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The POSIX `errno` this failure maps to.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Fs { status, .. } => status.errno(),
            FsError::Unavailable { failures, .. } => {
                if !failures.is_empty() && failures.iter().all(|f| no_space(f.cause.status())) {
                    errno::ENOSPC
                } else {
                    errno::EIO
                }
            }
            FsError::Stripe(StripeError::OutOfRange { .. }) => errno::EFBIG,
            FsError::Stripe(_) => errno::EIO,
            FsError::Drive(e) => match e.status() {
                s if no_space(s) => errno::ENOSPC,
                Some(nasd_proto::Status::RightsInsufficient | nasd_proto::Status::AccessRevoked) => errno::EACCES,
                _ => errno::EIO,
            },
            // Not EINVAL: the caller's arguments are not what is wrong.
            FsError::Io(_) | FsError::Local(_) | FsError::Protocol(_) | FsError::Setup(_) => errno::EIO,
            FsError::ManagerUnreachable { .. } => errno::EIO,
            FsError::Interrupted { .. } => errno::EINTR,
        }
    }

    fn fs(status: FsStatus, message: impl Into<String>) -> Self {
        FsError::Fs { status, message: message.into() }
    }
}

/// How to reach and log in to a manager. `Debug` redacts the password.
#[derive(Clone)]
pub struct FsConfig {
    /// The manager's `host:port`.
    pub manager: String,
    /// More managers serving the same file system (one database, one
    /// `manager.key`), tried in order after `manager` when the one in use
    /// cannot be reached: a new connection goes to the first that answers
    /// (within [`FAILOVER_WAIT_MAX`] in all), and stays with it. At most
    /// [`MANAGERS_MAX`] addresses in all. Empty: one manager.
    pub failover: Vec<String>,
    /// The name the manager's TLS certificate is checked against.
    pub server_name: String,
    /// The cluster CA certificate (PEM) that signed the manager's certificate.
    pub ca_cert: PathBuf,
    /// User name.
    pub user: String,
    /// Password.
    pub password: String,
    /// Protect file data on the wire (`INTEGRITY_DATA`, with Hash-and-MAC
    /// reads) on top of what capabilities demand. On by default: the
    /// network is not trusted.
    pub data_integrity: bool,
    /// Bytes a [`File`] moves per striping-engine operation in large
    /// transfers (capabilities are checked, and refreshed if near expiry,
    /// before each; sequential pieces are read through the read-ahead
    /// window). The client holds one piece per transfer in memory.
    pub transfer_piece: usize,
    /// How long the client waits for the manager or a drive at any one step
    /// (to connect, to take a request, to send a reply or its next chunk)
    /// before the call fails with a time-out naming the peer and the step
    /// ([`WAIT_MAX`] by default). A drive's waits are bounded by the striping
    /// engine's deadline for a whole component request too
    /// ([`nasd_stripe::REQUEST_DEADLINE_MS`], 30 s): a longer setting does
    /// not lengthen them.
    pub reply_timeout: Duration,
    /// An identity from the authentication server (the credential and its
    /// identity key, `nasd_login::auth_client::AuthClient::login`): when
    /// set, the client logs in to the manager with it (`LOGIN_IDENTITY`)
    /// instead of `user` and `password`.
    pub identity: Option<(nasd_proto::IdentityData, nasd_crypto::Key)>,
    /// Where fresh identities come from when `identity` nears expiry (a
    /// login at the authentication server again): the client renews before
    /// it expires, and after a refusal for expiry, for the manager and the
    /// drives alike (see [`IdentitySource`]). `None`: the identity is never
    /// renewed, and the client's requests are refused once it expires.
    pub identity_source: Option<Arc<dyn IdentitySource>>,
    /// How long a request waits out an outage of the manager's metadata
    /// database (`METADATA_UNAVAILABLE`: the request changed nothing), sent
    /// again with back-off until it is served or this long has passed
    /// ([`METADATA_WAIT_DEFAULT`]; zero: not at all).
    pub metadata_wait: Duration,
    /// Told once per wait, with the manager's message naming the database,
    /// when a request starts to wait out an outage (the CLI prints it).
    pub on_wait: Option<WaitNotice>,
    /// The clock, randomness, tasks and network the client runs on: the
    /// operating system's ([`nasd_env::Env::real`], the default), or a
    /// simulated world's.
    pub env: nasd_env::Env,
}

/// What [`FsConfig::on_wait`] calls with the manager's message.
pub type WaitNotice = Arc<dyn Fn(&str) + Send + Sync>;

/// The default [`FsConfig::metadata_wait`]: an outage a database fails over
/// or restarts in is waited out.
pub const METADATA_WAIT_DEFAULT: Duration = Duration::from_secs(60);
/// The longest of the pauses between the tries while the metadata database
/// is unreachable (they start at 100 ms and double).
pub const METADATA_RETRY_PAUSE_MAX: Duration = Duration::from_secs(2);

impl std::fmt::Debug for FsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsConfig")
            .field("manager", &self.manager)
            .field("failover", &self.failover)
            .field("server_name", &self.server_name)
            .field("ca_cert", &self.ca_cert)
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .field("data_integrity", &self.data_integrity)
            .field("transfer_piece", &self.transfer_piece)
            .field("reply_timeout", &self.reply_timeout)
            .field("identity", &self.identity.as_ref().map(|(credential, _)| credential))
            .field("identity_source", &self.identity_source.is_some())
            .field("metadata_wait", &self.metadata_wait)
            .finish()
    }
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            manager: "127.0.0.1:7300".into(),
            failover: Vec::new(),
            server_name: "localhost".into(),
            ca_cert: PathBuf::new(),
            user: String::new(),
            password: String::new(),
            data_integrity: true,
            transfer_piece: TRANSFER_PIECE_DEFAULT,
            reply_timeout: WAIT_MAX,
            identity: None,
            identity_source: None,
            metadata_wait: METADATA_WAIT_DEFAULT,
            on_wait: None,
            env: nasd_env::Env::real(),
        }
    }
}

/// How long a client waits for the manager or a drive at any one step by
/// default (see [`FsConfig::reply_timeout`]): a peer that stops answering,
/// or a reply cut short or lengthened in flight, ends the call with an error
/// instead of a wait without end. The manager's longest requests take a few
/// drive calls of at most `DRIVE_TIMEOUT` (10 s) each.
pub const WAIT_MAX: Duration = nasd_client::DRIVE_WAIT_MAX;

/// Most manager addresses a client is given (`manager` and `failover` together).
pub const MANAGERS_MAX: usize = 16;
/// Longest a client tries the managers it knows, round after round, for a
/// new connection after the one in use stopped answering (a manager that
/// died, one restarting): past it, the request fails.
pub const FAILOVER_WAIT_MAX: Duration = Duration::from_secs(10);
/// Longest a client waits for one manager to accept a connection when it
/// has others to try: a machine that is gone answers nothing, and the next
/// manager is tried after this.
pub const FAILOVER_CONNECT_WAIT: Duration = Duration::from_secs(2);

/// Default bytes per engine operation in large transfers.
pub const TRANSFER_PIECE_DEFAULT: usize = 8 * 1024 * 1024;
/// Largest transfer piece (the client buffers one piece per transfer).
pub const TRANSFER_PIECE_MAX: usize = 64 * 1024 * 1024;

struct Inner {
    config: FsConfig,
    identity: Identity,
    /// The identity from the authentication server, if the client logged
    /// in with one, and its renewal.
    id_cell: Arc<renew::IdentityCell>,
    manager: ManagerPool,
    /// Connections to drives, shared by every file; holding the session's
    /// identity, if it logged in with one.
    drives: Arc<DrivePool>,
    /// Connections to drives without the identity, for requests made while
    /// acting as a gateway for another user (`AS_USER`): the drive must not
    /// judge them by the gateway's own PAL entries. Capabilities only.
    gateway_drives: Arc<DrivePool>,
    held: Mutex<HashMap<Ino, Held>>,
}

/// A logged-in file-system client. Cheap to clone; clones share connections
/// (up to [`MANAGER_CONNECTIONS_MAX`] to the manager, a pool per drive) and
/// the capability cache, and may be used from many tasks at once.
#[derive(Clone)]
pub struct FsClient {
    inner: Arc<Inner>,
    /// The local user a gateway acts for ([`FsClient::as_user`]), if any.
    acting: Option<Arc<Acting>>,
}

/// Who a gateway's requests run as (`AS_USER`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Acting {
    uid: u32,
    gid: u32,
    /// Sorted, without repeats, at most [`GROUPS_MAX`].
    groups: Vec<u32>,
}

impl std::fmt::Debug for FsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FsClient")
            .field("manager", &self.inner.config.manager)
            .field("user", &self.inner.config.user)
            .finish_non_exhaustive()
    }
}

/// A file's status as `stat` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Attributes, as the manager records them: a regular file's size and
    /// modification time are what its writers' last `COMMIT` made them.
    pub attr: FileAttr,
    /// Symbolic-link target (empty otherwise).
    pub target: String,
}

/// Attribute changes for [`FsClient::setattr`]: `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (within `0o7777`).
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Length: truncates or extends (with zeros) the file.
    pub size: Option<u64>,
    /// Last access, nanoseconds since the Unix epoch.
    pub atime_ns: Option<i64>,
    /// Last data change, nanoseconds since the Unix epoch.
    pub mtime_ns: Option<i64>,
    /// The size change comes from a descriptor open for writing
    /// (`ftruncate`): the file's owner may make it whatever the mode says.
    pub open_writer: bool,
}

impl SetAttr {
    /// The `SETATTR` request for `handle`.
    fn request(&self, handle: Handle) -> ManagerRequest {
        let bit = |set: bool, bit: u8| if set { bit } else { 0 };
        let mask = bit(self.mode.is_some(), set_mask::MODE)
            | bit(self.uid.is_some(), set_mask::UID)
            | bit(self.gid.is_some(), set_mask::GID)
            | bit(self.size.is_some(), set_mask::SIZE)
            | bit(self.atime_ns.is_some(), set_mask::ATIME)
            | bit(self.mtime_ns.is_some(), set_mask::MTIME)
            | bit(self.open_writer && self.size.is_some(), set_mask::OPEN_WRITER);
        ManagerRequest::SetAttr {
            handle,
            mask,
            mode: self.mode.unwrap_or(0),
            uid: self.uid.unwrap_or(0),
            gid: self.gid.unwrap_or(0),
            size: self.size.unwrap_or(0),
            atime_ns: self.atime_ns.unwrap_or(0),
            mtime_ns: self.mtime_ns.unwrap_or(0),
        }
    }
}

/// One entry of a [`DirPage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Its name in the directory.
    pub name: String,
    /// What it is.
    pub kind: FileKind,
    /// Its attributes and handle, when the caller may search the directory.
    pub entry: Option<Entry>,
}

/// One page of a directory listing ([`FsClient::readdir_page`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirPage {
    /// Entries in name order.
    pub entries: Vec<DirEntry>,
    /// Whether entries after the last one follow (ask again with its name).
    pub more: bool,
}

/// `groups` sorted and without repeats, as the protocol carries them;
/// `INVALID_ARGUMENT` if more than [`GROUPS_MAX`] remain (never cut short:
/// dropping a group can grant access a mode denies the group).
pub fn canonical_groups(groups: &[u32]) -> Result<Vec<u32>, FsError> {
    let set: BTreeSet<u32> = groups.iter().copied().collect();
    if set.len() > GROUPS_MAX {
        return Err(FsError::fs(
            FsStatus::InvalidArgument,
            format!("{} supplementary groups: at most {GROUPS_MAX} are supported (GROUPS_MAX)", set.len()),
        ));
    }
    Ok(set.into_iter().collect())
}

/// Splits an absolute path into its parent path and last name.
pub fn split_path(path: &str) -> Result<(&str, &str), FsError> {
    let trimmed = path.trim_end_matches('/');
    if !path.starts_with('/') {
        return Err(FsError::fs(FsStatus::InvalidArgument, format!("'{path}' is not an absolute path")));
    }
    // "/" (or "//") trims to nothing: the root, which has no parent.
    let Some(cut) = trimmed.rfind('/') else {
        return Err(FsError::fs(FsStatus::InvalidArgument, "the root directory has no parent"));
    };
    let (parent, name) = (&trimmed[..cut.max(1)], &trimmed[cut + 1..]);
    Ok((if cut == 0 { "/" } else { parent }, name))
}

pub use nasd_proto::manager::TEMPORARY_SUFFIX;

/// A fresh temporary name beside the absolute `path`, in its directory:
/// `DIR/.NAME.XXXXXXXX.nasd-tmp` (eight random hex digits). Writers that
/// replace a file whole write it under such a name and rename it onto
/// `path`, so readers see the old file or the new one, never part of either.
pub fn temporary_name(path: &str) -> Result<String, FsError> {
    let (dir, name) = split_path(path)?;
    let tag: [u8; 4] = nasd_crypto::random_bytes();
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{}/.{name}.{tag}{TEMPORARY_SUFFIX}", dir.trim_end_matches('/')))
}

impl FsClient {
    /// Connects to the manager over TLS and logs in.
    pub async fn connect(config: &FsConfig) -> Result<FsClient, FsError> {
        if config.transfer_piece == 0 || config.transfer_piece > TRANSFER_PIECE_MAX {
            return Err(FsError::Setup(format!("transfer_piece must be 1..={TRANSFER_PIECE_MAX} bytes")));
        }
        if config.reply_timeout.is_zero() {
            return Err(FsError::Setup("reply_timeout must be positive".into()));
        }
        let tls = connector(&config.ca_cert)?;
        // The drive pool's connections hold the identity (set, and swapped at every renewal, by the cell).
        let drives = Arc::new(DrivePool::new_in(&config.env));
        let id_cell = renew::IdentityCell::new(config.identity.clone(), config.identity_source.clone(), drives.clone());
        let (manager, identity) = ManagerPool::open(config, id_cell.clone(), &tls).await?;
        Ok(FsClient {
            inner: Arc::new(Inner {
                config: config.clone(),
                identity,
                id_cell,
                manager,
                drives,
                gateway_drives: Arc::new(DrivePool::new_in(&config.env)),
                held: Mutex::new(HashMap::new()),
            }),
            acting: None,
        })
    }

    /// This client acting, as a gateway, for the local user `uid` with
    /// group `gid` and supplementary `groups` (`AS_USER`): name-space and
    /// file requests run as that user (permissions, ownership of what it
    /// makes); connections, capabilities and handles stay shared with
    /// `self`. The manager refuses them (`NOT_PERMITTED`) unless this
    /// client's user holds a gateway grant covering every id.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT`: more than [`GROUPS_MAX`] distinct groups (never
    /// cut short).
    pub fn as_user(&self, uid: u32, gid: u32, groups: &[u32]) -> Result<FsClient, FsError> {
        let groups = canonical_groups(groups)?;
        Ok(FsClient { inner: self.inner.clone(), acting: Some(Arc::new(Acting { uid, gid, groups })) })
    }

    /// Runs `fut` as the user-level operation `op` (a gateway's request, a
    /// command): every manager and drive request it makes carries one trace
    /// id, the caller's if it runs in one already (see
    /// [`nasd_client::trace::operation`]; docs/PROTOCOL.md, "Trace ids").
    pub fn operation<F: std::future::Future>(
        &self,
        op: &'static str,
        fut: F,
    ) -> impl std::future::Future<Output = F::Output> {
        nasd_client::trace::operation(&self.inner.config.env, op, fut)
    }

    /// The environment the client runs in (its clock, randomness and
    /// network; `FsConfig::env`): a gateway draws each request's trace id
    /// from it ([`nasd_client::trace::fresh`]).
    pub fn env(&self) -> &nasd_env::Env {
        &self.inner.config.env
    }

    /// Whether this client acts for a local user ([`FsClient::as_user`]).
    pub fn is_acting(&self) -> bool {
        self.acting.is_some()
    }

    /// A watcher of the manager's change feed (`WATCH`) on a connection of
    /// its own, so its long waits hold none of the shared ones.
    pub fn watcher(&self) -> Watcher {
        self.inner.manager.watcher()
    }

    /// The user name this client logged in as.
    pub fn user(&self) -> &str {
        &self.inner.config.user
    }

    /// Who the manager says this client is; the local user it acts for,
    /// if it does ([`FsClient::as_user`]).
    pub fn identity(&self) -> Identity {
        match &self.acting {
            Some(a) => Identity { uid: a.uid, gid: a.gid, admin: false },
            None => self.inner.identity,
        }
    }

    /// The identity credential the client holds now (public; the latest
    /// renewed one), if it logged in with one.
    pub fn identity_credential(&self) -> Option<nasd_proto::IdentityData> {
        self.inner.id_cell.credential()
    }

    /// How many times the client renewed its identity so far (tests,
    /// diagnostics).
    pub fn identity_renewals(&self) -> u64 {
        self.inner.id_cell.renewals()
    }

    /// How many times renewing the identity failed so far (the identity
    /// source refused or could not be reached; tests, diagnostics).
    pub fn identity_renewal_failures(&self) -> u64 {
        self.inner.id_cell.failures()
    }

    /// Renews the identity now if it is within its margin of expiry (in the
    /// background while still valid) or has expired; what every manager
    /// request and file operation does first.
    pub(crate) async fn ensure_identity_fresh(&self) {
        self.inner.id_cell.ensure_fresh().await;
    }

    /// After a drive refused a request as made under an expired identity:
    /// whether a fresher one is held now (renewed here or by another request).
    pub(crate) async fn renew_identity_after_refusal(&self) -> bool {
        let generation = self.inner.id_cell.generation();
        self.inner.id_cell.renew_after_refusal(generation).await
    }

    /// Sends one request to the manager on the least busy connection, beside
    /// up to [`CONNECTION_REQUESTS_MAX`] others on it (opening another, up
    /// to [`MANAGER_CONNECTIONS_MAX`], when all are that busy). A request
    /// that failed is never resent; the connection it failed on is closed.
    ///
    /// # Cancel safety
    /// Dropping the future stops the wait; the request may or may not have
    /// reached the manager (its reply, if one comes, is dropped).
    pub async fn call(&self, req: &ManagerRequest) -> Result<ManagerReply, FsError> {
        match &self.acting {
            Some(a) if req.may_run_as_user() => {
                let wrapped = ManagerRequest::AsUser {
                    uid: a.uid,
                    gid: a.gid,
                    groups: a.groups.clone(),
                    request: Box::new(req.clone()),
                };
                self.inner.manager.call(&wrapped).await
            }
            _ => self.inner.manager.call(req).await,
        }
    }

    /// The address of the manager the client uses now (`FsConfig::manager`
    /// until it failed over to one of `FsConfig::failover`).
    pub fn current_manager(&self) -> String {
        self.inner.manager.current_manager()
    }

    /// How long no manager has answered this client, if none answers now:
    /// its last attempt at a new connection failed and none succeeded since
    /// (see [`with_manager_wait`]). `None` while connections can be made.
    pub fn manager_outage(&self) -> Option<Duration> {
        self.inner.manager.outage()
    }

    /// What routing by request class did so far: the table version, requests
    /// per manager, `STALE_ROUTING` refusals, reroutes (tests, diagnostics).
    pub fn routing_stats(&self) -> RoutingStats {
        self.inner.manager.routing_stats()
    }

    /// The routing table the client routes by, if a manager gave one.
    pub fn routing_table(&self) -> Option<std::sync::Arc<nasd_proto::routing::RoutingTable>> {
        self.inner.manager.routing_table()
    }

    /// The routing table the manager holds (`GET_ROUTING`).
    pub async fn get_routing(&self) -> Result<RoutingTable, FsError> {
        match self.call(&ManagerRequest::GetRouting).await? {
            ManagerReply::Routing(t) => Ok(t),
            other => Err(FsError::Protocol(format!("unexpected GET_ROUTING reply {other:?}"))),
        }
    }

    /// Stores the next routing table (`SET_ROUTING`, administrators):
    /// `table.version` must be the stored one plus one (`STALE_ROUTING`
    /// otherwise). The table as stored.
    pub async fn set_routing(&self, table: RoutingTable) -> Result<RoutingTable, FsError> {
        match self.call(&ManagerRequest::SetRouting { table }).await? {
            ManagerReply::Routing(t) => Ok(t),
            other => Err(FsError::Protocol(format!("unexpected SET_ROUTING reply {other:?}"))),
        }
    }

    /// Idle connections to the manager (for tests and diagnostics).
    pub fn idle_manager_connections(&self) -> usize {
        self.inner.manager.idle_connections()
    }

    /// Idle connections to the drive at `addr` that are still open (those
    /// the drive closed are dropped first), for tests and diagnostics.
    pub fn idle_drive_connections(&self, addr: &str) -> usize {
        self.drive_pool().idle_connections(addr)
    }

    pub(crate) async fn entry(&self, req: ManagerRequest) -> Result<Entry, FsError> {
        match self.call(&req).await? {
            ManagerReply::Entry(e) => {
                if let Some(a) = &e.access {
                    self.hold(e.attr.ino, a.clone());
                }
                Ok(e)
            }
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Asks the manager to set file `handle`'s PAL again on every component
    /// (`REFRESH_PAL`) after a drive refused a request by identity with
    /// `NOT_IN_PAL`; `rights` are the `ACL_READ`/`ACL_WRITE` bits the
    /// refused request needed. The striping engine calls it, once per
    /// refused request, and retries.
    ///
    /// # Errors
    /// `PERMISSION_DENIED` if the file's ACL does not grant them.
    pub(crate) async fn refresh_pal(&self, handle: Handle, rights: u8) -> Result<(), FsError> {
        self.done(ManagerRequest::RefreshPal { handle, rights }).await
    }

    async fn done(&self, req: ManagerRequest) -> Result<(), FsError> {
        match self.call(&req).await? {
            ManagerReply::Done => Ok(()),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<Ino, Held>> {
        self.inner.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hold(&self, ino: Ino, access: Access) {
        cache::hold(&mut self.held(), ino, Held::new(access), Instant::now());
    }

    /// The capabilities cached for `ino`.
    pub(crate) fn cached(&self, ino: Ino) -> Option<Held> {
        self.held().get(&ino).cloned()
    }

    /// The rights of the capabilities this client holds for inode `ino`, if
    /// any (what its last request for the file was granted).
    pub fn held_rights(&self, ino: Ino) -> Option<u32> {
        self.held().get(&ino).map(|h| h.access.rights)
    }

    pub(crate) fn forget(&self, ino: Ino) {
        self.held().remove(&ino);
    }

    pub(crate) fn drive_pool(&self) -> Arc<DrivePool> {
        if self.acting.is_some() {
            self.inner.gateway_drives.clone()
        } else {
            self.inner.drives.clone()
        }
    }

    /// The engine's target for `access` under this client's protection
    /// policy, with the components in `missed` marked stale.
    pub(crate) fn target_for(&self, access: &Access, missed: &BTreeSet<usize>) -> Result<Target, FsError> {
        let mut target = Target::from_access(access, self.protection_for(access))
            .map_err(|e| FsError::Protocol(format!("the manager's capabilities are unusable: {e}")))?;
        binder::overlay(&mut target, missed);
        Ok(target)
    }

    /// How requests under `access` are protected: at least its minimum and
    /// `INTEGRITY_ARGS`, plus `INTEGRITY_DATA` with Hash-and-MAC reads when
    /// the configuration asks for data integrity.
    pub(crate) fn protection_for(&self, access: &Access) -> Protection {
        let min = Protection::from_bits(access.min_protection).unwrap_or(Protection::INTEGRITY_ARGS);
        let mut p = min.union(Protection::INTEGRITY_ARGS);
        if self.inner.config.data_integrity {
            p = p.union(Protection::INTEGRITY_DATA).union(Protection::HASH_AND_MAC);
        }
        p
    }

    pub(crate) fn transfer_piece(&self) -> usize {
        self.inner.config.transfer_piece
    }

    /// The striping engine's options for this client's files: the engine's
    /// deadline for each component request ([`nasd_stripe::REQUEST_DEADLINE_MS`]),
    /// and each single wait for a drive — connecting included — bounded by
    /// `reply_timeout` as well.
    pub(crate) fn stripe_options(&self) -> nasd_stripe::Options {
        let defaults = nasd_stripe::Options::default();
        let wait = self.inner.config.reply_timeout;
        nasd_stripe::Options {
            connect_deadline: defaults.connect_deadline.min(wait),
            wait_deadline: defaults.wait_deadline.min(wait),
            ..defaults
        }
    }

    // ------------------------------------------------------------ names

    /// Resolves `path` (following symlinks at the end too), asking for `open`.
    pub async fn walk(&self, path: &str, open: OpenMode) -> Result<Entry, FsError> {
        self.entry(ManagerRequest::Walk { path: path.into(), follow: true, open }).await
    }

    async fn dir_handle(&self, path: &str) -> Result<Handle, FsError> {
        let e = self.walk(path, OpenMode::None).await?;
        if e.attr.kind != FileKind::Dir {
            return Err(FsError::fs(FsStatus::NotDir, format!("{path} is not a directory")));
        }
        Ok(e.handle())
    }

    /// `stat`: follows symlinks. Attributes come from the manager alone (a
    /// regular file's size and times are what its writers' commits recorded);
    /// no capability is asked for.
    pub async fn stat(&self, path: &str) -> Result<Stat, FsError> {
        Ok(Self::stat_of(self.walk(path, OpenMode::None).await?))
    }

    /// `lstat`: like [`stat`](Self::stat) but a final symlink is described itself.
    pub async fn lstat(&self, path: &str) -> Result<Stat, FsError> {
        let req = ManagerRequest::Walk { path: path.into(), follow: false, open: OpenMode::None };
        Ok(Self::stat_of(self.entry(req).await?))
    }

    fn stat_of(e: Entry) -> Stat {
        Stat { attr: e.attr, target: e.target }
    }

    /// Every entry of a directory with its attributes, in name order
    /// (readdir-plus). Needs read and search permission on the directory;
    /// with read permission alone, use [`names`](Self::names).
    pub async fn readdir(&self, path: &str) -> Result<Vec<(String, FileAttr)>, FsError> {
        let mut out = Vec::new();
        self.list(path, |page| match page {
            ManagerReply::Dir { entries, .. } => {
                out.extend(entries.into_iter().map(|(n, e)| (n, e.attr)));
                Ok(())
            }
            _ => Err(FsError::fs(
                FsStatus::PermissionDenied,
                format!("no search permission on {path}: only its names can be listed"),
            )),
        })
        .await?;
        Ok(out)
    }

    /// The names and kinds of a directory's entries, in name order. Needs
    /// read permission only (POSIX `readdir` without search permission).
    pub async fn names(&self, path: &str) -> Result<Vec<(String, FileKind)>, FsError> {
        let mut out = Vec::new();
        self.list(path, |page| {
            match page {
                ManagerReply::Dir { entries, .. } => out.extend(entries.into_iter().map(|(n, e)| (n, e.attr.kind))),
                ManagerReply::Names { names, .. } => out.extend(names),
                _ => unreachable!("list passes directory pages only"),
            }
            Ok(())
        })
        .await?;
        Ok(out)
    }

    /// Reads a directory page by page, handing each `Dir` or `Names` reply to `take`.
    async fn list(&self, path: &str, mut take: impl FnMut(ManagerReply) -> Result<(), FsError>) -> Result<(), FsError> {
        let dir = self.dir_handle(path).await?;
        let mut after = String::new();
        loop {
            let reply = self.readdir_reply(dir, &after, READDIR_ENTRIES_MAX as u16).await?;
            let (last, more) = match &reply {
                ManagerReply::Dir { entries, more } => (entries.last().map(|(n, _)| n.clone()), *more),
                ManagerReply::Names { names, more } => (names.last().map(|(n, _)| n.clone()), *more),
                _ => unreachable!("readdir_reply passes directory pages only"),
            };
            take(reply)?;
            match last {
                Some(last) if more => after = last,
                _ => return Ok(()),
            }
        }
    }

    /// Creates a directory.
    pub async fn mkdir(&self, path: &str, mode: u32) -> Result<FileAttr, FsError> {
        let (parent, name) = split_path(path)?;
        let parent = self.dir_handle(parent).await?;
        Ok(self.mkdir_at(parent, name, mode).await?.attr)
    }

    /// Creates a directory and any missing parents (`mkdir -p`).
    pub async fn mkdir_all(&self, path: &str, mode: u32) -> Result<(), FsError> {
        let mut at = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            at.push('/');
            at.push_str(part);
            match self.mkdir(&at, mode).await {
                Ok(_) => {}
                Err(e) if e.status() == Some(FsStatus::Exists) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Creates (or, unless `exclusive`, opens and optionally truncates) a
    /// regular file for writing.
    pub async fn create(&self, path: &str, mode: u32, exclusive: bool, truncate: bool) -> Result<File, FsError> {
        let (parent, name) = split_path(path)?;
        let parent = self.dir_handle(parent).await?;
        let e = self.entry(ManagerRequest::Create { parent, name: name.into(), mode, exclusive, truncate }).await?;
        File::new(self.clone(), e, path, true)
    }

    /// Opens an existing regular file for reading, or reading and writing (a
    /// file the caller may write but not read opens write-only).
    pub async fn open(&self, path: &str, write: bool) -> Result<File, FsError> {
        let open = if write { OpenMode::ReadWrite } else { OpenMode::Read };
        let e = self.walk(path, open).await?;
        if e.attr.kind != FileKind::File {
            return Err(FsError::fs(FsStatus::IsDir, format!("{path} is not a regular file")));
        }
        File::new(self.clone(), e, path, write)
    }

    /// Removes a file or symlink name.
    pub async fn unlink(&self, path: &str) -> Result<(), FsError> {
        let (parent, name) = split_path(path)?;
        let parent = self.dir_handle(parent).await?;
        self.unlink_at(parent, name).await
    }

    /// Removes an empty directory.
    pub async fn rmdir(&self, path: &str) -> Result<(), FsError> {
        let (parent, name) = split_path(path)?;
        let parent = self.dir_handle(parent).await?;
        self.rmdir_at(parent, name).await
    }

    /// Renames atomically, replacing `to` if it exists (POSIX rules).
    pub async fn rename(&self, from: &str, to: &str) -> Result<(), FsError> {
        let (fp, fname) = split_path(from)?;
        let (tp, tname) = split_path(to)?;
        let parent = self.dir_handle(fp).await?;
        let new_parent = self.dir_handle(tp).await?;
        self.rename_at(parent, fname, new_parent, tname).await
    }

    /// Creates a symbolic link at `path` pointing to `target`.
    pub async fn symlink(&self, target: &str, path: &str) -> Result<FileAttr, FsError> {
        let (parent, name) = split_path(path)?;
        let parent = self.dir_handle(parent).await?;
        Ok(self.symlink_at(parent, name, target).await?.attr)
    }

    /// A symbolic link's target.
    pub async fn readlink(&self, path: &str) -> Result<String, FsError> {
        let e = self.entry(ManagerRequest::Walk { path: path.into(), follow: false, open: OpenMode::None }).await?;
        if e.attr.kind != FileKind::Symlink {
            return Err(FsError::fs(FsStatus::InvalidArgument, format!("{path} is not a symbolic link")));
        }
        Ok(e.target)
    }

    /// Creates a hard link `new` to the file at `existing`.
    pub async fn link(&self, existing: &str, new: &str) -> Result<FileAttr, FsError> {
        let target =
            self.entry(ManagerRequest::Walk { path: existing.into(), follow: false, open: OpenMode::None }).await?;
        let (parent, name) = split_path(new)?;
        let new_parent = self.dir_handle(parent).await?;
        Ok(self.link_at(target.handle(), new_parent, name).await?.attr)
    }

    /// Changes permission bits (owner or administrator). Outstanding
    /// capabilities for the file are revoked before this returns.
    pub async fn chmod(&self, path: &str, mode: u32) -> Result<FileAttr, FsError> {
        let handle = self.walk(path, OpenMode::None).await?.handle();
        self.setattr(handle, &SetAttr { mode: Some(mode), ..SetAttr::default() }).await
    }

    /// Changes owner and/or group.
    pub async fn chown(&self, path: &str, uid: Option<u32>, gid: Option<u32>) -> Result<FileAttr, FsError> {
        let handle = self.walk(path, OpenMode::None).await?.handle();
        self.setattr(handle, &SetAttr { uid, gid, ..SetAttr::default() }).await
    }

    /// Sets a file's length.
    pub async fn truncate(&self, path: &str, size: u64) -> Result<FileAttr, FsError> {
        let handle = self.walk(path, OpenMode::None).await?.handle();
        self.setattr(handle, &SetAttr { size: Some(size), ..SetAttr::default() }).await
    }

    // ------------------------------------------------ names by handle
    //
    // What a gateway (the FUSE mount) needs: every call names its inode or
    // directory by the handle an earlier reply gave, so nothing is resolved
    // by path twice. The path calls above are thin wrappers over these.

    /// The root directory's entry (its handle starts every walk by handle).
    pub async fn root(&self) -> Result<Entry, FsError> {
        self.entry(ManagerRequest::Walk { path: "/".into(), follow: false, open: OpenMode::None }).await
    }

    /// Looks `name` up in directory `parent` (no symlink is followed; no
    /// capability is asked for).
    pub async fn lookup(&self, parent: Handle, name: &str) -> Result<Entry, FsError> {
        self.entry(ManagerRequest::Lookup { parent, name: name.into(), open: OpenMode::None }).await
    }

    /// An inode's attributes (and a symlink's target) by handle, from the
    /// manager alone.
    pub async fn getattr(&self, handle: Handle) -> Result<Entry, FsError> {
        self.entry(ManagerRequest::GetAttr { handle, open: OpenMode::None }).await
    }

    /// Changes the attributes `changes` names, all in one request: mode,
    /// owner and group (capabilities held for the file are revoked), size
    /// (truncating or extending every component), times. Returns the new
    /// attributes.
    ///
    /// # Errors
    /// `NOT_PERMITTED` for a mode, owner or time change by other than the
    /// owner (or root), `PERMISSION_DENIED` for a size change without write
    /// permission, `INVALID_ARGUMENT` for an empty change.
    pub async fn setattr(&self, handle: Handle, changes: &SetAttr) -> Result<FileAttr, FsError> {
        let req = changes.request(handle);
        let attr = self.entry(req).await?.attr;
        // Permissions may have changed: capabilities held may be revoked.
        self.forget(handle.ino);
        Ok(attr)
    }

    /// One page of a directory: at most `limit` entries (at most
    /// [`READDIR_ENTRIES_MAX`], and fewer when more would not fit in one
    /// reply) whose names sort after `after` (`""`: from the start), and
    /// whether more follow. With search permission each entry carries its
    /// attributes and handle; with read permission alone, names and kinds.
    pub async fn readdir_page(&self, dir: Handle, after: &str, limit: u16) -> Result<DirPage, FsError> {
        let limit = limit.clamp(1, READDIR_ENTRIES_MAX as u16);
        match self.readdir_reply(dir, after, limit).await? {
            ManagerReply::Dir { entries, more } => Ok(DirPage {
                entries: entries
                    .into_iter()
                    .map(|(name, e)| DirEntry { name, kind: e.attr.kind, entry: Some(e) })
                    .collect(),
                more,
            }),
            ManagerReply::Names { names, more } => Ok(DirPage {
                entries: names.into_iter().map(|(name, kind)| DirEntry { name, kind, entry: None }).collect(),
                more,
            }),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// A `READDIR` reply, checked to be a directory page that ends or goes on.
    async fn readdir_reply(&self, dir: Handle, after: &str, limit: u16) -> Result<ManagerReply, FsError> {
        let reply = self.call(&ManagerRequest::ReadDir { dir, after: after.into(), limit }).await?;
        let (empty, more) = match &reply {
            ManagerReply::Dir { entries, more } => (entries.is_empty(), *more),
            ManagerReply::Names { names, more } => (names.is_empty(), *more),
            other => return Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        };
        if more && empty {
            return Err(FsError::Protocol("an empty directory page that says more follow".into()));
        }
        Ok(reply)
    }

    /// Makes special file `name` in `parent`: a FIFO, a socket, or (the
    /// superuser only) a device with number `rdev`.
    pub async fn mknod_at(
        &self,
        parent: Handle,
        name: &str,
        kind: FileKind,
        mode: u32,
        rdev: u64,
    ) -> Result<Entry, FsError> {
        self.entry(ManagerRequest::Mknod { parent, name: name.into(), kind, mode, rdev }).await
    }

    /// Creates directory `name` in `parent`.
    pub async fn mkdir_at(&self, parent: Handle, name: &str, mode: u32) -> Result<Entry, FsError> {
        self.entry(ManagerRequest::Mkdir { parent, name: name.into(), mode }).await
    }

    /// Creates regular file `name` in `parent` (or, unless `exclusive`, opens
    /// the existing one for writing, optionally truncated) and opens it for
    /// reading and writing (a new file is read-write for its creator whatever
    /// `mode` says, as POSIX `open` with `O_CREAT`).
    pub async fn create_at(
        &self,
        parent: Handle,
        name: &str,
        mode: u32,
        exclusive: bool,
        truncate: bool,
    ) -> Result<File, FsError> {
        let e = self.entry(ManagerRequest::Create { parent, name: name.into(), mode, exclusive, truncate }).await?;
        File::new(self.clone(), e, name, true)
    }

    /// Opens the regular file `handle` names for reading, or for reading and
    /// writing (a file the caller may write but not read opens write-only).
    /// The attributes are fetched afresh (close-to-open: the file's size is
    /// what its writers' last commits made it).
    pub async fn open_handle(&self, handle: Handle, write: bool) -> Result<File, FsError> {
        let open = if write { OpenMode::ReadWrite } else { OpenMode::Read };
        let e = self.entry(ManagerRequest::GetAttr { handle, open }).await?;
        if e.attr.kind != FileKind::File {
            return Err(FsError::fs(FsStatus::IsDir, format!("inode {} is not a regular file", handle.ino)));
        }
        File::new(self.clone(), e, &format!("inode {}", handle.ino), write)
    }

    /// Creates symbolic link `name` in `parent` pointing to `target`.
    pub async fn symlink_at(&self, parent: Handle, name: &str, target: &str) -> Result<Entry, FsError> {
        self.entry(ManagerRequest::Symlink { parent, name: name.into(), target: target.into() }).await
    }

    /// Creates hard link `new_name` in `new_parent` to the file `file` names.
    pub async fn link_at(&self, file: Handle, new_parent: Handle, new_name: &str) -> Result<Entry, FsError> {
        self.entry(ManagerRequest::Link { handle: file, new_parent, new_name: new_name.into() }).await
    }

    /// Removes name `name` (a file or symlink) from `parent`. Removing a
    /// file's last name destroys its data at once (the manager keeps no
    /// open-file state: see `docs/SECURITY.md`).
    pub async fn unlink_at(&self, parent: Handle, name: &str) -> Result<(), FsError> {
        self.done(ManagerRequest::Unlink { parent, name: name.into() }).await
    }

    /// Removes the empty directory `name` from `parent`.
    pub async fn rmdir_at(&self, parent: Handle, name: &str) -> Result<(), FsError> {
        self.done(ManagerRequest::Rmdir { parent, name: name.into() }).await
    }

    /// Renames `parent/name` to `new_parent/new_name` atomically, replacing
    /// the target if it exists (POSIX rules).
    pub async fn rename_at(
        &self,
        parent: Handle,
        name: &str,
        new_parent: Handle,
        new_name: &str,
    ) -> Result<(), FsError> {
        let req = ManagerRequest::Rename { parent, name: name.into(), new_parent, new_name: new_name.into() };
        self.done(req).await
    }

    /// Makes every change the manager acknowledged before this call durable
    /// against power loss (`SYNC`): what an `fsync` adds to a commit. A
    /// change survives a crash of the manager's process as soon as it is
    /// acknowledged; against power loss, at the latest after the manager's
    /// `metadata_sync_interval`, at once after this.
    ///
    /// # Errors
    /// The manager could not flush its metadata (it then refuses changes).
    pub async fn sync(&self) -> Result<(), FsError> {
        self.done(ManagerRequest::Sync).await
    }

    /// Space on every drive and what the name space holds.
    pub async fn statfs(&self) -> Result<(u64, u64, Vec<DriveUsage>), FsError> {
        match self.call(&ManagerRequest::StatFs).await? {
            ManagerReply::StatFs { inodes, file_bytes, drives } => Ok((inodes, file_bytes, drives)),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    // ------------------------------------------------------- whole files

    /// Writes `data` as the whole content of `path` (created 0644 if absent).
    pub async fn write_file(&self, path: &str, data: &[u8]) -> Result<(), FsError> {
        let f = self.create(path, 0o644, false, true).await?;
        f.write_at(0, data).await?;
        f.flush().await?;
        f.close().await.map(|_| ())
    }

    /// The checksum of `path`'s bytes from the digests its drives stored
    /// ([`File::checksum`]; what it depends on: [`file_checksum`]).
    ///
    /// # Errors
    /// As [`open`](Self::open) for reading and [`File::checksum`].
    pub async fn checksum(&self, path: &str) -> Result<[u8; 32], FsError> {
        let f = self.open(path, false).await?;
        let sum = f.checksum().await?;
        f.close().await?;
        Ok(sum)
    }

    /// Reads the whole content of `path`.
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, FsError> {
        let f = self.open(path, false).await?;
        let size = f.size();
        let mut out = Vec::with_capacity(size.min(TRANSFER_PIECE_MAX as u64) as usize);
        f.read_to(0, size, &mut out).await?;
        Ok(out)
    }

    // ---------------------------------------------------- administration

    /// Adds a user (administrators only). `uid` 0 picks the next free one.
    pub async fn add_user(&self, name: &str, password: &str, uid: u32, gid: u32, admin: bool) -> Result<(), FsError> {
        self.add_user_in_groups(name, password, uid, gid, &[], admin).await
    }

    /// Adds a user with supplementary groups (administrators only; at most
    /// [`GROUPS_MAX`], sorted and deduplicated here). `uid` 0 picks the next
    /// free one.
    pub async fn add_user_in_groups(
        &self,
        name: &str,
        password: &str,
        uid: u32,
        gid: u32,
        groups: &[u32],
        admin: bool,
    ) -> Result<(), FsError> {
        let groups = canonical_groups(groups)?;
        self.done(ManagerRequest::AddUser { name: name.into(), password: password.into(), uid, gid, admin, groups })
            .await
    }

    /// Replaces a user's supplementary groups (administrators only; at most
    /// [`GROUPS_MAX`], sorted and deduplicated here; empty: none). The
    /// user's sessions use them from their next request.
    pub async fn set_user_groups(&self, name: &str, groups: &[u32]) -> Result<(), FsError> {
        let groups = canonical_groups(groups)?;
        self.done(ManagerRequest::SetUserGroups { name: name.into(), groups }).await
    }

    /// Administrators: has the manager fetch the authentication server's
    /// shared keys now and install (or retire) them on every drive; returns
    /// once every drive has them (`SYNC_IDENTITY_KEYS`).
    pub async fn sync_identity_keys(&self) -> Result<(), FsError> {
        self.done(ManagerRequest::SyncIdentityKeys).await
    }

    /// Every user (administrators only).
    pub async fn users(&self) -> Result<Vec<UserInfo>, FsError> {
        match self.call(&ManagerRequest::ListUsers).await? {
            ManagerReply::Users(u) => Ok(u),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Makes a special file at `path`: a FIFO, a socket, or (the superuser
    /// only) a device with number `rdev`.
    pub async fn mknod(&self, path: &str, kind: FileKind, mode: u32, rdev: u64) -> Result<FileAttr, FsError> {
        let (parent, name) = split_path(path)?;
        let parent = self.dir_handle(parent).await?;
        let req = ManagerRequest::Mknod { parent, name: name.into(), kind, mode, rdev };
        Ok(self.entry(req).await?.attr)
    }

    /// The quota of a user (one's own; any as administrator) or of a
    /// directory's tree.
    pub async fn quota(&self, of: QuotaOf) -> Result<QuotaInfo, FsError> {
        match self.call(&ManagerRequest::GetQuota { of }).await? {
            ManagerReply::Quota(q) => Ok(q),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Sets a quota's limits (`None`: unlimited; both `None` removes it).
    /// Administrators only.
    pub async fn set_quota(
        &self,
        of: QuotaOf,
        bytes_limit: Option<u64>,
        files_limit: Option<u64>,
    ) -> Result<(), FsError> {
        self.done(ManagerRequest::SetQuota { of, bytes_limit, files_limit }).await
    }

    /// Lets user `name` act for the ids in `ids` (inclusive) as a gateway,
    /// or no longer (`None`). Administrators only.
    pub async fn set_gateway(&self, name: &str, ids: Option<(u32, u32)>) -> Result<(), FsError> {
        self.done(ManagerRequest::SetGateway { name: name.into(), ids }).await
    }

    /// The value of extended attribute `name` of the inode `handle` names.
    pub async fn getxattr(&self, handle: Handle, name: &str) -> Result<Vec<u8>, FsError> {
        match self.call(&ManagerRequest::GetXattr { handle, name: name.into() }).await? {
            ManagerReply::Xattr(v) => Ok(v),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// The names of the extended attributes of the inode `handle` names
    /// that this user may see.
    pub async fn listxattr(&self, handle: Handle) -> Result<Vec<String>, FsError> {
        match self.call(&ManagerRequest::ListXattr { handle }).await? {
            ManagerReply::XattrNames(n) => Ok(n),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Sets extended attribute `name` (in the `user.`, `trusted.` or
    /// `security.` namespace) of the inode `handle` names.
    pub async fn setxattr(&self, handle: Handle, name: &str, value: &[u8], mode: XattrMode) -> Result<(), FsError> {
        self.done(ManagerRequest::SetXattr { handle, name: name.into(), value: value.to_vec(), mode }).await
    }

    /// Removes extended attribute `name` of the inode `handle` names.
    pub async fn removexattr(&self, handle: Handle, name: &str) -> Result<(), FsError> {
        self.done(ManagerRequest::RemoveXattr { handle, name: name.into() }).await
    }

    /// The global ACL of the inode at `path` (symbolic links followed):
    /// owner, group, mode and named entries. Needs only search permission
    /// on the way.
    pub async fn get_acl(&self, path: &str) -> Result<AclInfo, FsError> {
        let handle = self.walk(path, OpenMode::None).await?.handle();
        match self.call(&ManagerRequest::GetAcl { handle }).await? {
            ManagerReply::Acl(info) => Ok(info),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Replaces the named entries of the ACL of the inode at `path` (put in
    /// canonical order here; a principal named twice is `INVALID_ARGUMENT`).
    /// Capabilities for the file are revoked on its drives before the
    /// manager answers; this client forgets the ones it holds. Returns the
    /// ACL as it now is.
    pub async fn set_acl(&self, path: &str, entries: Vec<AclEntry>) -> Result<AclInfo, FsError> {
        let handle = self.walk(path, OpenMode::None).await?.handle();
        self.set_acl_of(handle, entries).await
    }

    /// [`set_acl`](Self::set_acl) of the file `handle` names (whatever name
    /// it has now).
    pub async fn set_acl_of(&self, handle: Handle, entries: Vec<AclEntry>) -> Result<AclInfo, FsError> {
        let entries = nasd_proto::acl::canonical_acl(entries)
            .map_err(|why| FsError::Fs { status: FsStatus::InvalidArgument, message: why.to_string() })?;
        self.forget(handle.ino);
        match self.call(&ManagerRequest::SetAcl { handle, entries }).await? {
            ManagerReply::Acl(info) => Ok(info),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Changes a password (one's own, or anyone's as administrator).
    pub async fn set_password(&self, name: &str, password: &str) -> Result<(), FsError> {
        self.done(ManagerRequest::SetPassword { name: name.into(), password: password.into() }).await
    }

    /// The layout of a file, or the one new files in a directory get.
    pub async fn get_layout(&self, path: &str) -> Result<LayoutInfo, FsError> {
        let handle = self.walk(path, OpenMode::None).await?.handle();
        match self.call(&ManagerRequest::GetLayout { handle }).await? {
            ManagerReply::Layout(info) => Ok(info),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Sets the layout new files in directory `path` get (`None`: inherit
    /// the parent's again), or re-places an empty file with `layout`.
    pub async fn set_layout(&self, path: &str, layout: Option<Layout>) -> Result<(), FsError> {
        let handle = self.walk(path, OpenMode::None).await?.handle();
        self.forget(handle.ino);
        self.done(ManagerRequest::SetLayout { handle, layout }).await
    }

    /// The cluster map, drive health, degraded files and repair progress.
    pub async fn cluster_status(&self) -> Result<ClusterStatus, FsError> {
        match self.call(&ManagerRequest::ClusterStatus).await? {
            ManagerReply::Status(status) => Ok(status),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Takes a drive out of service (its components are rebuilt elsewhere)
    /// or back in (administrators only).
    pub async fn set_drive_state(&self, drive: u32, state: DriveState) -> Result<(), FsError> {
        self.done(ManagerRequest::SetDriveState { drive, state }).await
    }

    /// Starts a repair task (administrators only); follow it with
    /// [`cluster_status`](Self::cluster_status).
    pub async fn repair(&self, action: RepairAction) -> Result<(), FsError> {
        self.done(ManagerRequest::Repair { action }).await
    }

    /// Takes a fresh drive into service (administrators only); its number.
    pub async fn add_drive(&self, addr: &str, master_key: &nasd_crypto::Key) -> Result<u32, FsError> {
        match self.call(&ManagerRequest::AddDrive { addr: addr.into(), master_key: *master_key.expose() }).await? {
            ManagerReply::DriveAdded { drive } => Ok(drive),
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{split_path, ComponentFailure, FailureCause, FsError, StripeError};
    use nasd_client::ClientError;
    use std::sync::Arc;

    fn unavailable(statuses: &[nasd_proto::Status]) -> FsError {
        let failures = statuses
            .iter()
            .enumerate()
            .map(|(i, &status)| ComponentFailure {
                component: i,
                drive: i as u32,
                range: None,
                cause: FailureCause::Drive(Arc::new(ClientError::Status { status, message: String::new() })),
            })
            .collect();
        FsError::Unavailable { missing_drives: vec![], tolerates: 0, failures, message: String::new() }
    }

    #[test]
    fn striping_failures_map_to_errno() {
        use nasd_proto::Status;
        assert_eq!(
            unavailable(&[Status::NoSpace, Status::QuotaExceeded]).errno(),
            28,
            "ENOSPC when every drive is full"
        );
        assert_eq!(unavailable(&[Status::NoSpace, Status::DataCorrupted]).errno(), 5, "EIO otherwise");
        assert_eq!(unavailable(&[]).errno(), 5);
        assert_eq!(FsError::Stripe(StripeError::OutOfRange { offset: 0, len: 1, max: 0 }).errno(), 27, "EFBIG");
        assert_eq!(FsError::Stripe(StripeError::WriteBehindBroken).errno(), 5);
        assert_eq!(FsError::Local(std::io::Error::other("pipe")).errno(), 5);
    }

    #[test]
    fn config_debug_redacts_the_password() {
        let c = super::FsConfig { user: "alice".into(), password: "hunter22-secret".into(), ..Default::default() };
        let debug = format!("{c:?}");
        assert!(debug.contains("alice") && !debug.contains("hunter22-secret"), "{debug}");
    }

    #[test]
    fn groups_are_sorted_deduplicated_and_bounded() {
        assert_eq!(super::canonical_groups(&[5, 1, 5, 3]).unwrap(), [1, 3, 5]);
        let most: Vec<u32> = (0..super::GROUPS_MAX as u32).rev().collect();
        assert_eq!(super::canonical_groups(&most).unwrap().len(), super::GROUPS_MAX);
        let over: Vec<u32> = (0..=super::GROUPS_MAX as u32).collect();
        assert_eq!(super::canonical_groups(&over).unwrap_err().errno(), 22);
    }

    #[test]
    fn paths_split_into_parent_and_name() {
        assert_eq!(split_path("/a").unwrap(), ("/", "a"));
        assert_eq!(split_path("/a/b").unwrap(), ("/a", "b"));
        assert_eq!(split_path("/a/b/").unwrap(), ("/a", "b"));
        assert!(split_path("/").is_err());
        assert!(split_path("a/b").is_err());
    }
}
