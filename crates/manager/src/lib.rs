//! The nasd file manager (NASD §3, Figure 1): owns the name space and
//! policy, stays off the data path.
//!
//! Clients log in over TLS ([`server`]), resolve names and get capabilities
//! for a file's object, then read and write the drive directly. The manager
//! keeps names, layout and users in a metadata store ([`nasd_meta`]), sets
//! drives up and holds their keys ([`drives`], [`keys`]), and finishes what a
//! name-space change asks of drives — revocations, removals — from intention
//! logs written in the same transaction (`maintenance.rs`).
//!
//! Where things are: `server.rs` TLS sessions (login first, bounded
//! sessions in all and per host); `service.rs` one request — a metadata
//! transaction, the drive work that must precede the reply, capability
//! minting; a [`Session`] holds the caller's uid, gid and groups as of the
//! users epoch and reloads them once an administrator changed them; `AS_USER`
//! runs a wrapped request acting for the caller it names (checked against
//! the gateway grant), with handles bound to the gateway's uid; every
//! successful request's changes go to the change feed (`changes.rs`, behind
//! `WATCH`: the last `CHANGE_LOG_MAX` changes within a random incarnation).
//! [`handles`] (file handles keyed from `manager.key` and the database's
//! `file_system_id`; checked before every request), [`drives`] (one
//! connection per drive, replaced before use once the drive closed it,
//! provisioning, minting; every drive call bounded by `DRIVE_TIMEOUT`),
//! [`keys`], [`files`] (the TLS and password files through
//! `nasd_crypto::durable`), `placement.rs` (pure policy; the placer runs
//! inside the creating transaction and, short of pooled objects, refills
//! pools within [`PLACEMENT_WAIT_MAX`] before `NoSpace`), [`health`] and
//! `cluster.rs` (the cluster map, readmission), `coordinator.rs` (write
//! transactions), `resize.rs`, `repair.rs` and `verify.rs`, [`identity`],
//! [`pals`], [`shared`], [`routing`]. Three loops run beside requests
//! (`spawn_maintenance`): maintenance — intention logs, pools, key rotation
//! keeping the previous key, expired leases; a drive whose upkeep fails is
//! retried with a backoff doubling up to `DRIVE_RETRY_MAX` —, heartbeats,
//! and repair, so a long repair delays neither of the others.
//!
//! - **No open-file state** (NFS-on-NASD, NASD §3.1): removing a file's last
//!   name removes its objects before the reply, so other clients that still
//!   have it open lose its data at once (`NO_SUCH_OBJECT`) — unlike POSIX.
//! - **Revocation** (chmod, chown, `SET_ACL`, unlink or rename over a file)
//!   bumps the inode's access-control version in the transaction, sets it on
//!   every component's drive and flushes before the reply, so capabilities
//!   minted earlier are refused at once and stay refused across a crash.
//! - **Handles, not inode numbers**: every request names an inode by a
//!   handle the manager made for that user; a `READDIR` without search
//!   permission hands out no handle.
//! - **Write protection**: no capability that allows writing demands less
//!   than `ManagerConfig::write_protection`; the policy travels in the
//!   capability, so the drive enforces it.
//! - **File data** passes through the manager only to repair it (`repair.rs`,
//!   `resize.rs`), under its drive keys and inside a write transaction of
//!   its own, and below a file's small-file threshold (`WRITE_SMALL`,
//!   `READ_SMALL`).
//! - The administrator's password file is written and synced before the
//!   `admin` user is committed: a crash in between leaves a file but no
//!   user, and the next start writes a new password and creates the user.
//! - A panic inside a metadata task aborts the process (`Manager::meta`):
//!   the interrupted transaction never committed, and a restart recovers.
#![deny(missing_docs)]

mod changes;
mod cluster;
mod coordinator;
pub mod drives;
pub mod files;
pub mod handles;
pub mod health;
pub mod identity;
pub mod keys;
pub use nasd_login::login_backoff;
mod maintenance;
pub mod metrics;
pub mod pals;
pub use nasd_login::passwords;
mod placement;
mod repair;
mod resize;
pub mod routing;
pub mod server;
mod service;
pub mod shared;
mod verify;
pub use nasd_meta::Location;
pub use service::{Session, ADD_USER_AT_AUTH_SERVER, PASSWORDS_AT_AUTH_SERVER, PLACEMENT_WAIT_MAX};
#[cfg(test)]
mod tests;
pub use nasd_login::tls;

use anyhow::Context;
use drives::DriveHandle;
use keys::DriveKeys;
use nasd_crypto::Key;
use nasd_meta::{Backend, DriveRecord, DriveState, Namespace, Store, User};
use nasd_proto::fs::FsStatus;
use nasd_proto::layout::Layout;
use nasd_proto::manager::{DRIVES_MAX, DRIVE_ADDR_MAX};
use nasd_proto::Protection;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// File name of the metadata database inside the manager's directory.
pub const META_DB: &str = "meta.sqlite";
/// File name of the key that seals the drive keys in the database.
pub const KEK_FILE: &str = "manager.key";
/// Objects a partition holds when new: the three control objects and the
/// first ordinary object (`well_known`).
const FRESH_PARTITION_OBJECTS: u64 = 4;
/// Most password hashes computed at once (logins, new users, new
/// passwords): the argon2 worker threads ([`passwords::Pool`]); more wait
/// their turn.
pub const ARGON2_CONCURRENT_MAX: usize = passwords::ARGON2_WORKERS;
/// The least protection of capabilities that allow writing, unless an
/// administrator lowers it ([`ManagerConfig::write_protection`]): arguments
/// and data MACed, so no byte reaches a drive unauthenticated.
pub const WRITE_PROTECTION_DEFAULT: Protection = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);

/// Locks that serialize the requests which check permissions and then
/// change a file's data on its drive before committing (size changes) with
/// those that change the permissions (chmod, chown), and small writes
/// (`WRITE_SMALL`) with both: one per inode number modulo this. Two inodes may share one; a request holds only one. (On a
/// shared database, an inode lease serializes them across managers too:
/// [`shared`].)
const INODE_LOCK_STRIPES: usize = 64;

/// Policy knobs (the `[manager]` section of the config file).
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// The partition the file system uses on every drive.
    pub partition: u64,
    /// Lifetime of read-only capabilities.
    pub read_lifetime: Duration,
    /// Lifetime of capabilities that allow writing (short: NASD §3.2).
    pub write_lifetime: Duration,
    /// How often each drive's working key is replaced. Capabilities minted
    /// just before a rotation stay valid one more interval (the drive keeps
    /// the previous key), so this must be at least the longest lifetime.
    pub rotate_interval: Duration,
    /// Least protection drives demand with capabilities.
    pub protection: Protection,
    /// Least protection of capabilities that allow writing, on top of
    /// `protection`: [`WRITE_PROTECTION_DEFAULT`] (data integrity: write data
    /// MACed chunk by chunk, whatever a client is configured with) unless an
    /// administrator lowers it explicitly (`[manager] write_data_integrity =
    /// false`), accepting writes whose data no MAC covers.
    pub write_protection: Protection,
    /// Drives whose file-system partition the administrator exempted from
    /// `write_protection` (`[manager] write_data_integrity_waived = [N, ...]`):
    /// their write capabilities demand only `protection`. Each drive holds one
    /// partition of the file system, so this is the per-partition policy;
    /// every other partition keeps data integrity for writes.
    pub write_integrity_waived: std::collections::BTreeSet<u32>,
    /// Empty objects kept ready on each drive for new files.
    pub pool_target: usize,
    /// How often intention logs and pools are looked after.
    pub maintenance_interval: Duration,
    /// The file system's default layout: the root directory's, which every
    /// new file takes unless a directory above it has its own. Only a new
    /// file system takes it: an existing root keeps the layout it has.
    pub default_layout: Layout,
    /// How long a write transaction may stay open: a writer commits within
    /// it, and one that does not (it died) is rolled back after it.
    pub write_lease: Duration,
    /// How long a drive may be down before its components are rebuilt on
    /// other drives (until then, writes miss it and it is resynced when it
    /// comes back, which costs far less than a rebuild).
    pub rebuild_delay: Duration,
    /// Where the metadata lives: `None` is SQLite in the manager's
    /// directory ([`META_DB`]); a PostgreSQL database for one that another
    /// machine holds (and, later, several managers share). The manager's
    /// directory keeps its key ([`KEK_FILE`]) either way: the database holds
    /// the drive keys sealed with it.
    pub metadata: Option<Location>,
    /// Bytes of each new regular file kept on the small-file path (issue
    /// 14): below this offset its bytes live in the metadata store and move
    /// through the manager (`READ_SMALL`, `WRITE_SMALL`); the rest is
    /// striped over its components. 0: every byte on the components. A
    /// file keeps the threshold it was created with.
    pub small_file_threshold: u32,
    /// The authentication server whose identities the manager accepts
    /// (`LOGIN_IDENTITY`) and whose shared keys it installs on its drives;
    /// `None`: passwords only.
    pub auth: Option<identity::AuthLink>,
    /// Which credentials the file system's partition accepts on every
    /// drive (`SET_AUTH_SCHEME`, set with the identity keys at each
    /// maintenance pass): capabilities (the default), PALs, or both. When it
    /// accepts PALs the manager flattens each file's ACL into an access PAL
    /// on every component object ([`pals`]).
    pub auth_scheme: nasd_proto::AuthScheme,
    /// How often a session logged in with an identity asks the
    /// authentication server again (`USER_INFO`, before its next request
    /// once due) whether its user still exists, is enabled and holds the
    /// session's role, and for its groups: a user disabled or a role taken
    /// away ends such sessions within this long. Zero: before every request.
    pub identity_recheck: Duration,
    /// How old a client's temporary copy ([`TEMPORARY_SUFFIX`]) with no
    /// write transaction open must be before the manager removes it (its
    /// client died mid-copy); `None`: never ([`TEMPORARIES_AGE_DEFAULT`]).
    pub temporaries_age: Option<Duration>,
    /// How new inodes choose their routing site when this manager makes
    /// the file system's first routing table (`[manager] routing`); an
    /// existing table's policy wins ([`routing`]).
    pub routing: nasd_proto::routing::RoutingPolicy,
    /// The probability that a new directory leaves its parent's routing
    /// site under mkdir switching (`[manager] redirect_probability`);
    /// `None`: 1/N for N managers in the routing table.
    pub redirect_probability: Option<f64>,
    /// The client address this manager puts in the first routing table
    /// (`[manager] advertise`); `None`: the address it listens on.
    pub advertise: Option<String>,
    /// Longest an acknowledged change may stay durable against a crash of
    /// the manager's process only, not yet against power loss (`[manager]
    /// metadata_sync_ms`): the metadata's log is flushed at least this
    /// often while changes come in, and at every client's `SYNC` (its
    /// `fsync`). See docs/ARCHITECTURE.md, "Durability".
    pub metadata_sync_interval: Duration,
    /// The newest manager protocol version this manager serves:
    /// [`MANAGER_PROTOCOL_VERSION`](nasd_proto::manager::MANAGER_PROTOCOL_VERSION)
    /// unless lowered (Rust API only). Lowered, the manager answers at login
    /// as a manager of that version does — a `LOGIN` offering a newer
    /// version is refused `BAD_REQUEST` before any credential is checked —
    /// and refuses what that version lacks (a `TRACED` envelope below
    /// version 3), so clients can be tested against an older manager
    /// (docs/PROTOCOL.md, "Manager protocol versions").
    pub protocol_version_max: u8,
}

/// The default [`ManagerConfig::metadata_sync_interval`].
pub const METADATA_SYNC_INTERVAL_DEFAULT: Duration = Duration::from_millis(500);
/// The longest [`ManagerConfig::metadata_sync_interval`] accepted.
pub const METADATA_SYNC_INTERVAL_MAX: Duration = Duration::from_secs(60);

/// The default [`ManagerConfig::identity_recheck`].
pub const IDENTITY_RECHECK_DEFAULT: Duration = Duration::from_secs(30);

/// The default small-file threshold (Slice's 64 KiB).
pub const SMALL_FILE_THRESHOLD_DEFAULT: u32 = 64 * 1024;

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            partition: 1,
            read_lifetime: Duration::from_secs(300),
            write_lifetime: Duration::from_secs(30),
            rotate_interval: Duration::from_secs(3600),
            protection: Protection::INTEGRITY_ARGS,
            write_protection: WRITE_PROTECTION_DEFAULT,
            write_integrity_waived: std::collections::BTreeSet::new(),
            pool_target: 128,
            maintenance_interval: Duration::from_secs(1),
            default_layout: Layout::SINGLE,
            write_lease: Duration::from_secs(60),
            rebuild_delay: Duration::from_secs(600),
            metadata: None,
            small_file_threshold: SMALL_FILE_THRESHOLD_DEFAULT,
            auth: None,
            auth_scheme: nasd_proto::AuthScheme::CAPABILITIES,
            identity_recheck: IDENTITY_RECHECK_DEFAULT,
            temporaries_age: Some(TEMPORARIES_AGE_DEFAULT),
            routing: nasd_proto::routing::RoutingPolicy::MkdirSwitching,
            redirect_probability: None,
            advertise: None,
            metadata_sync_interval: METADATA_SYNC_INTERVAL_DEFAULT,
            protocol_version_max: nasd_proto::manager::MANAGER_PROTOCOL_VERSION,
        }
    }
}

impl ManagerConfig {
    /// Where the metadata of the manager in `dir` lives.
    pub fn metadata(&self, dir: &Path) -> Location {
        self.metadata.clone().unwrap_or_else(|| Location::Sqlite(dir.join(META_DB)))
    }

    fn check(&self) -> anyhow::Result<()> {
        let longest = self.read_lifetime.max(self.write_lifetime);
        anyhow::ensure!(
            self.rotate_interval >= longest,
            "key rotation interval ({:?}) is shorter than the longest capability lifetime ({longest:?})",
            self.rotate_interval
        );
        anyhow::ensure!(self.partition != 0, "partition 0 names the whole drive; choose another");
        // A refill records its objects in one batch; a larger one would fail after creating them on
        // the drive, leaking them on every maintenance pass.
        anyhow::ensure!(
            (1..=nasd_meta::BATCH_MAX).contains(&self.pool_target),
            "object pool size ([manager] object_pool) {} must be 1..={}",
            self.pool_target,
            nasd_meta::BATCH_MAX
        );
        anyhow::ensure!(self.protection.is_consistent(), "inconsistent protection options");
        {
            use nasd_proto::manager::{MANAGER_PROTOCOL_VERSION, MANAGER_PROTOCOL_VERSION_MIN};
            anyhow::ensure!(
                (MANAGER_PROTOCOL_VERSION_MIN..=MANAGER_PROTOCOL_VERSION).contains(&self.protocol_version_max),
                "the newest protocol version served ({}) must be {MANAGER_PROTOCOL_VERSION_MIN}..={MANAGER_PROTOCOL_VERSION}",
                self.protocol_version_max
            );
        }
        if let Some(p) = self.redirect_probability {
            anyhow::ensure!(
                (0.0..=1.0).contains(&p),
                "the redirect probability ([manager] redirect_probability) {p} is not within 0..=1"
            );
        }
        if let Some(a) = &self.advertise {
            anyhow::ensure!(
                !a.is_empty() && a.len() <= nasd_proto::routing::MANAGER_ADDR_MAX,
                "the advertised address ([manager] advertise) must be 1 to {} bytes",
                nasd_proto::routing::MANAGER_ADDR_MAX
            );
        }
        anyhow::ensure!(
            self.auth_scheme.capabilities() || self.auth.is_some(),
            "auth_scheme = \"pals\" needs an authentication server ([manager] auth): without one no client has \
             an identity, and the manager mints no capabilities on a PALs-only partition"
        );
        anyhow::ensure!(
            self.small_file_threshold <= nasd_proto::manager::SMALL_FILE_THRESHOLD_MAX,
            "the small-file threshold ([manager] small_file_threshold) {} is above its most, {}",
            self.small_file_threshold,
            nasd_proto::manager::SMALL_FILE_THRESHOLD_MAX
        );
        self.default_layout.validate().map_err(|e| anyhow::anyhow!("default layout {}: {e}", self.default_layout))?;
        anyhow::ensure!(
            self.protection.union(self.write_protection).is_consistent(),
            "inconsistent protection options for writes"
        );
        anyhow::ensure!(
            !self.write_lifetime.is_zero() && !self.read_lifetime.is_zero(),
            "capability lifetimes must be positive"
        );
        anyhow::ensure!(
            !self.metadata_sync_interval.is_zero() && self.metadata_sync_interval <= METADATA_SYNC_INTERVAL_MAX,
            "the metadata sync interval ([manager] metadata_sync_ms) must be from 1 ms to {} s",
            METADATA_SYNC_INTERVAL_MAX.as_secs()
        );
        anyhow::ensure!(
            self.write_lease >= Duration::from_secs(1) && self.write_lease.as_millis() <= u32::MAX as u128,
            "the write lease must be from 1 s to 49 days"
        );
        Ok(())
    }
}

tokio::task_local! {
    /// Whether the request this task serves has committed a metadata
    /// transaction yet ([`Manager::meta`]); set per request by the server.
    pub(crate) static REQUEST_WROTE: std::cell::Cell<bool>;
}

/// How long a request that committed something waits for an unavailable
/// metadata database to finish the rest ([`Manager::meta_after_write`]),
/// well within a client's reply timeout.
const AFTER_WRITE_WAIT: Duration = Duration::from_secs(20);
/// Longest pause between two of those attempts.
const AFTER_WRITE_PAUSE_MAX: Duration = Duration::from_secs(1);

pub use nasd_proto::manager::TEMPORARY_SUFFIX;
/// The default [`ManagerConfig::temporaries_age`]: an hour without a write.
pub const TEMPORARIES_AGE_DEFAULT: Duration = Duration::from_secs(3600);
/// Most temporaries one sweep removes (the next sweep takes the rest).
pub const TEMPORARIES_PER_SWEEP: usize = 256;
/// Longest time between sweeps for temporaries.
pub const TEMPORARIES_SWEEP_INTERVAL_MAX: Duration = Duration::from_secs(60);

/// Why a request failed: a status and a message for the user (never a key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The status.
    pub status: FsStatus,
    /// What happened and, where useful, what to do.
    pub message: String,
}

impl Failure {
    /// A failure with a specific message.
    pub fn new(status: FsStatus, message: impl Into<String>) -> Self {
        Failure { status, message: message.into() }
    }
}

impl From<FsStatus> for Failure {
    fn from(status: FsStatus) -> Self {
        Failure { status, message: status.describe().to_string() }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for Failure {}

/// A running file manager.
pub struct Manager {
    /// The clock, randomness, tasks, network and disk the manager runs on
    /// ([`Manager::open_in`]).
    env: nasd_env::Env,
    ns: Arc<Namespace<Store>>,
    /// This manager's id: the holder of its leases ([`shared`]).
    id: String,
    kek: Key,
    /// Makes and checks file handles ([`handles`]).
    handles: nasd_crypto::FileHandleKey,
    config: ManagerConfig,
    drives: RwLock<Vec<Arc<DriveHandle>>>,
    /// The cluster map epoch capabilities are minted under, as the metadata
    /// held it at open. Whatever moves the epoch on (`Namespace::bump_map_epoch`,
    /// `Namespace::set_drive_state`) must store the new value here too.
    map_epoch: AtomicU32,
    /// Verified for unknown user names (see [`passwords::decoy`]).
    decoy_hash: String,
    /// Serializes drive set-up, pool refills and key rotation.
    drive_admin: tokio::sync::Mutex<()>,
    /// Maintenance steps failing now, with their last error.
    failing: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// Drives whose upkeep is failing: when to try again.
    drive_backoff: std::sync::Mutex<std::collections::HashMap<u32, maintenance::Backoff>>,
    /// The threads that compute argon2 (each in one ~19 MiB buffer of its
    /// own, reused): logins come from unauthenticated peers.
    argon2: passwords::Pool,
    /// Failed logins per host, which space that host's further attempts.
    pub(crate) login_backoff: login_backoff::LoginBackoff,
    /// What it counts, for Prometheus ([`metrics`]).
    metrics: metrics::ManagerMetrics,
    /// [`INODE_LOCK_STRIPES`] locks; see [`Manager::inode_lock`].
    inode_locks: Box<[tokio::sync::Mutex<()>]>,
    /// [`INODE_LOCK_STRIPES`] locks; see [`Manager::pal_turn`].
    pal_locks: Box<[tokio::sync::Mutex<()>]>,
    /// Each drive's health from heartbeats ([`health`]).
    health: std::sync::Mutex<std::collections::HashMap<u32, health::DriveHealth>>,
    /// Recent placements, which placement spreads away from.
    recent: std::sync::Mutex<placement::Recent>,
    /// Connections the manager's own data movements (repair) use.
    data_pool: Arc<nasd_stripe::DrivePool>,
    /// Progress and requests of the repair task ([`repair`]).
    /// (Shared with [`metrics`], which reports it at each scrape.)
    repair: Arc<std::sync::Mutex<repair::RepairState>>,
    /// Wakes the repair task early.
    repair_kick: tokio::sync::Notify,
    /// Drives out of service (a cache of the drive table's state, read
    /// again every maintenance pass: [`Manager::refresh_shared`]).
    out_of_service: std::sync::Mutex<std::collections::HashSet<u32>>,
    /// Capabilities minted for clients since start ([`Manager::capabilities_minted`]).
    minted: AtomicU64,
    /// PALs and super PALs sent to drives since start ([`Manager::pal_writes`]).
    pal_writes: AtomicU64,
    /// Requests of logged-in sessions handled since start ([`Manager::requests_served`]).
    served: AtomicU64,
    /// Moves on whenever a user's groups (or other credentials a session
    /// holds) change: a session that saw an older value reloads its user
    /// before its next request ([`Manager::refresh_session`]).
    users_epoch: AtomicU64,
    /// The database's users epoch as this manager last saw it
    /// ([`shared::USERS_EPOCH_SETTING`]): another manager changed users when
    /// it moves.
    shared_users_epoch: AtomicU64,
    /// What changed, for `WATCH` ([`changes`]).
    changes: changes::ChangeFeed,
    /// Shared identity keys and the connection to the authentication server.
    identity: identity::IdentityState,
    /// Inodes this process makes transactions of its own on, with how
    /// many (`coordinator::OwnWrite`).
    own_writes: std::sync::Mutex<std::collections::HashMap<nasd_proto::fs::Ino, usize>>,
    /// Rollbacks of write transactions under way in this process: per
    /// transaction, the components already rolled back durably. A rollback
    /// revokes the file's capabilities as it enters this map, once
    /// ([`coordinator`]).
    rollbacks: std::sync::Mutex<std::collections::HashMap<u64, std::collections::BTreeSet<usize>>>,
    /// Files whose stripes the repair could not decide by their bytes
    /// ([`verify`]), with a digest of their size and stale ranges then: not
    /// read again until those change (`repair::UNDECIDED_MAX` at most).
    undecided: std::sync::Mutex<std::collections::HashMap<nasd_proto::fs::Ino, u64>>,
    /// The routing table this manager holds ([`routing`]).
    routing: routing::RoutingState,
    /// Password logins refused at a linked manager (one log line per interval).
    refused_password_logins: nasd_meta::LogLimit,
    /// What names the metadata database in messages (never a password).
    metadata_target: String,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Manager {
    /// Opens (or creates) the manager's state in `dir`: the metadata
    /// database and the key-encryption key. Drives are not contacted until
    /// [`recover`](Self::recover).
    pub fn open(dir: &Path, config: ManagerConfig) -> anyhow::Result<Arc<Manager>> {
        Manager::open_in(&nasd_env::Env::real(), dir, config)
    }

    /// [`Manager::open`] in `env`: the metadata database on the
    /// environment's disk; its tasks, connections, clock and randomness the
    /// environment's. The key files (`manager.key`, `manager.id`) are always
    /// the real file system's (written whole and synced, nothing a crash can
    /// tear).
    pub fn open_in(env: &nasd_env::Env, dir: &Path, config: ManagerConfig) -> anyhow::Result<Arc<Manager>> {
        config.check()?;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        if !env.is_real() {
            env.create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let (kek, _) = nasd_crypto::load_or_create_key_file(&dir.join(KEK_FILE))?;
        let id = shared::manager_id(dir)?;
        let location = config.metadata(dir);
        let metadata_target = location.to_string();
        let backend =
            location.open_in(env).map_err(|e| anyhow::anyhow!("cannot open the metadata at {location}: {e}"))?;
        let ns = Namespace::new(backend, config.default_layout)
            .and_then(|ns| ns.with_small_file_threshold(config.small_file_threshold))
            .map(|ns| ns.with_capabilities(config.auth_scheme.capabilities()))
            .map_err(|e| anyhow::anyhow!("cannot open the name space: {e}"))?;
        let handles = handles::load_handle_key(&ns, &kek)?;
        let config = ManagerConfig { auth: identity::settle_link(&ns, &kek, config.auth)?, ..config };
        let map_epoch = ns.map_epoch().map_err(|e| anyhow::anyhow!("cannot read the cluster map epoch: {e}"))?;
        let users_epoch =
            ns.counter(shared::USERS_EPOCH_SETTING).map_err(|e| anyhow::anyhow!("cannot read the users epoch: {e}"))?;
        let manager = Manager {
            env: env.clone(),
            ns: Arc::new(ns),
            id,
            kek,
            handles,
            config,
            drives: RwLock::new(Vec::new()),
            map_epoch: AtomicU32::new(map_epoch),
            decoy_hash: passwords::decoy(),
            drive_admin: tokio::sync::Mutex::new(()),
            failing: Default::default(),
            drive_backoff: Default::default(),
            argon2: passwords::Pool::start_in(env),
            login_backoff: Default::default(),
            inode_locks: (0..INODE_LOCK_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            pal_locks: (0..INODE_LOCK_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            health: Default::default(),
            metrics: Default::default(),
            recent: Default::default(),
            data_pool: Arc::new(nasd_stripe::DrivePool::new_in(env)),
            repair: Default::default(),
            repair_kick: tokio::sync::Notify::new(),
            out_of_service: Default::default(),
            minted: AtomicU64::new(0),
            pal_writes: AtomicU64::new(0),
            served: AtomicU64::new(0),
            users_epoch: AtomicU64::new(0),
            shared_users_epoch: AtomicU64::new(users_epoch),
            changes: changes::ChangeFeed::new(),
            identity: Default::default(),
            own_writes: Default::default(),
            rollbacks: Default::default(),
            undecided: Default::default(),
            routing: Default::default(),
            refused_password_logins: nasd_meta::LogLimit::new(),
            metadata_target,
        };
        manager.metrics.watch_repair(&manager.repair);
        manager.ns.set_site_policy(manager.config.routing, manager.config.redirect_probability.unwrap_or(1.0));
        for rec in manager.ns.drives().map_err(|e| anyhow::anyhow!("cannot read the drive table: {e}"))? {
            let keys = DriveKeys::open(&manager.kek, rec.drive, &rec.sealed_keys).with_context(|| {
                format!(
                    "the keys of drive {} do not open with {KEK_FILE}: wrong key file for this database?",
                    rec.drive
                )
            })?;
            if rec.state == DriveState::Out {
                manager.out_of_service.lock().expect("out lock").insert(rec.drive);
            }
            manager.attach(&rec, keys);
        }
        Ok(Arc::new(manager))
    }

    /// The environment the manager runs in.
    pub fn env(&self) -> &nasd_env::Env {
        &self.env
    }

    /// The wall clock, nanoseconds since the Unix epoch (as an `i64`, as
    /// write intents keep deadlines).
    pub(crate) fn now_ns(&self) -> i64 {
        self.env.now_ns().min(i64::MAX as u64) as i64
    }

    fn attach(&self, rec: &DriveRecord, keys: DriveKeys) -> Arc<DriveHandle> {
        let handle = Arc::new(
            DriveHandle::new(
                rec.drive,
                rec.drive_id,
                rec.addr.clone(),
                rec.partition,
                self.config.protection,
                if self.config.write_integrity_waived.contains(&rec.drive) {
                    self.config.protection
                } else {
                    self.config.protection.union(self.config.write_protection)
                },
                keys,
            )
            .in_env(&self.env),
        );
        self.drives.write().expect("drives lock").push(handle.clone());
        handle
    }

    /// The policy in force.
    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    /// Capabilities this manager has minted for clients since it started
    /// (one per component object of each file access it answered with):
    /// none on a partition that accepts PALs only.
    pub fn capabilities_minted(&self) -> u64 {
        self.minted.load(Ordering::Relaxed)
    }

    /// PAL writes this manager has sent to drives since it started: one per
    /// component object for an access PAL (`SET_PAL`), one per drive for a
    /// collection's super PAL (`SET_SUPER_PAL`), retries included.
    pub fn pal_writes(&self) -> u64 {
        self.pal_writes.load(Ordering::Relaxed)
    }

    /// Requests of logged-in sessions this manager has handled since it
    /// started (logins not counted; `WATCH` waits are): what benchmarks
    /// count round trips by.
    pub fn requests_served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// The metadata's commits, how many of them are durable against power
    /// loss, and the disk flushes that made them so (for tests and
    /// benchmarks; PostgreSQL reports its commits durable at once).
    pub fn metadata_durability(&self) -> nasd_meta::Durability {
        nasd_meta::Backend::durability(self.ns.backend())
    }

    /// Makes every metadata change committed so far durable against power
    /// loss, if it is not yet: called before a change's effect on the
    /// drives that cannot be undone (an object removed, an access control
    /// version raised), so that no power loss can undo the change and keep
    /// its effect — a file naming objects that are gone, or refused by its
    /// drives. Write-ahead, as a log is. Group-committed with every other
    /// caller ([`Manager::sync_metadata`]).
    ///
    /// # Errors
    /// `INTERNAL` if the flush failed.
    pub(crate) async fn durable_before_drive_effects(&self) -> Result<(), Failure> {
        let d = self.metadata_durability();
        if d.durable >= d.committed {
            return Ok(());
        }
        self.sync_metadata().await
    }

    /// Makes every change acknowledged so far durable against power loss
    /// (`SYNC`): one flush of the metadata's log, shared by concurrent
    /// callers.
    ///
    /// # Errors
    /// `INTERNAL` if the flush failed (the manager then refuses changes
    /// until restarted).
    pub async fn sync_metadata(&self) -> Result<(), Failure> {
        #[cfg(feature = "sim-bugs")]
        if self.env.injected_bug(nasd_env::Bug::SkipMetadataSync) {
            return Ok(());
        }
        self.meta(|ns| nasd_meta::Backend::sync(ns.backend()).map_err(FsStatus::from)).await
    }

    /// Flushes the metadata's log every `metadata_sync_interval` while
    /// changes came in since the last flush, until `shutdown`, and once
    /// more then: the bound on what a power loss can take of what was
    /// acknowledged.
    pub fn spawn_metadata_sync(
        self: &Arc<Self>,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        self.env.spawn(async move {
            let mut tick = tokio::time::interval(me.config.metadata_sync_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    _ = tick.tick() => {}
                    _ = shutdown.changed() => {}
                }
                let d = me.metadata_durability();
                if d.durable < d.committed {
                    let started = std::time::Instant::now();
                    let synced = me.sync_metadata().await;
                    me.metrics.metadata_synced(synced.is_ok(), started.elapsed());
                    if let Err(f) = synced {
                        tracing::error!(error = %f.message, "flushing the metadata failed");
                    }
                }
                if *shutdown.borrow() {
                    return;
                }
            }
        })
    }

    /// What this manager counts; register it to have it served.
    pub fn metrics(&self) -> &metrics::ManagerMetrics {
        &self.metrics
    }

    /// The drives, in drive-number order.
    pub fn drives(&self) -> Vec<Arc<DriveHandle>> {
        self.drives.read().expect("drives lock").clone()
    }

    fn drive(&self, drive: u32) -> Result<Arc<DriveHandle>, Failure> {
        self.drives().into_iter().find(|d| d.drive == drive).ok_or_else(|| {
            Failure::new(
                FsStatus::Internal,
                format!("drive {drive} is named by the metadata but not in the drive table"),
            )
        })
    }

    /// Runs `f` on the name space off the async threads (the metadata calls block).
    ///
    /// An outage of the database is `METADATA_UNAVAILABLE` naming it — as
    /// long as the request (the task running it, [`REQUEST_WROTE`]) has
    /// committed nothing yet: a request that has is `INTERNAL`, "may be
    /// partly done", so no client sends it again blindly.
    async fn meta<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Namespace<Store>) -> Result<R, FsStatus> + Send + 'static,
    ) -> Result<R, Failure> {
        let ns = self.ns.clone();
        let run = move || {
            let before = nasd_meta::commits_on_this_thread();
            let r = f(&ns);
            (r, nasd_meta::commits_on_this_thread() != before)
        };
        match self.env.spawn_blocking(run).await {
            Ok((r, wrote)) => {
                if wrote {
                    let _ = REQUEST_WROTE.try_with(|w| w.set(true));
                }
                r.map_err(|status| self.failure(status))
            }
            // A panic in the metadata is a broken invariant: fail-stop (STYLE.md).
            // The interrupted transaction was not committed; a restart recovers.
            Err(e) if e.is_panic() => {
                tracing::error!(error = %e, "a metadata task panicked: stopping the manager");
                eprintln!("fatal: a metadata task panicked ({e}); stopping (a restart recovers)");
                std::process::abort()
            }
            Err(e) => Err(Failure::new(FsStatus::Internal, format!("metadata task failed: {e}"))),
        }
    }

    /// A metadata call that may be made again (a read, or a write that sets
    /// what it sets), which a request may make after it committed something
    /// ([`REQUEST_WROTE`]): while the database is unavailable it is tried
    /// again, pausing 100 ms doubling to [`AFTER_WRITE_PAUSE_MAX`], for up to
    /// [`AFTER_WRITE_WAIT`], rather than leave the request partly done; past
    /// that the request fails as partly done. Before the request committed
    /// anything it is [`Manager::meta`]: `METADATA_UNAVAILABLE` goes back to
    /// the client, which waits the outage out and sends the request again.
    pub(crate) async fn meta_after_write<R: Send + 'static>(
        &self,
        f: impl Fn(&Namespace<Store>) -> Result<R, FsStatus> + Send + Sync + 'static,
    ) -> Result<R, Failure> {
        let f = Arc::new(f);
        let deadline = tokio::time::Instant::now() + AFTER_WRITE_WAIT;
        let mut pause = Duration::from_millis(100);
        loop {
            if !REQUEST_WROTE.try_with(std::cell::Cell::get).unwrap_or(false) {
                return self.meta(move |ns| f(ns)).await;
            }
            let g = f.clone();
            let attempt = self.meta(move |ns| match g(ns) {
                Err(FsStatus::MetadataUnavailable) => Ok(None),
                r => r.map(Some),
            });
            match attempt.await? {
                Some(r) => return Ok(r),
                None if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(AFTER_WRITE_PAUSE_MAX);
                }
                None => return self.meta(move |ns| f(ns)).await,
            }
        }
    }

    /// Runs `work`, bookkeeping a request does on the way (taking a lease,
    /// refilling an object pool) that is none of the changes the request
    /// asks for, without its commits counting as the request's
    /// ([`REQUEST_WROTE`]): a database outage after it still finds the
    /// request unchanged (`METADATA_UNAVAILABLE`, sent again by the client),
    /// not partly done.
    pub(crate) async fn bookkeeping<T>(work: impl std::future::Future<Output = T>) -> T {
        let wrote = REQUEST_WROTE.try_with(std::cell::Cell::get).ok();
        let out = work.await;
        if let Some(wrote) = wrote {
            let _ = REQUEST_WROTE.try_with(|w| w.set(wrote));
        }
        out
    }

    /// The failure of a metadata call that returned `status`.
    fn failure(&self, status: FsStatus) -> Failure {
        if status != FsStatus::MetadataUnavailable {
            return Failure::from(status);
        }
        if REQUEST_WROTE.try_with(std::cell::Cell::get).unwrap_or(false) {
            return Failure::new(
                FsStatus::Internal,
                format!(
                    "the metadata database {} went away part-way through this request: it may be partly done; \
                     look before doing it again",
                    self.metadata_target
                ),
            );
        }
        Failure::new(
            FsStatus::MetadataUnavailable,
            format!("the metadata database {} cannot be reached; nothing was changed", self.metadata_target),
        )
    }

    /// Runs one argon2 hash or verification on a worker of the argon2 pool
    /// (off the async threads, at most [`ARGON2_CONCURRENT_MAX`] at once,
    /// each in its worker's buffer). A caller that gives up (a login timing
    /// out) does not free the worker while the hash is being computed.
    pub(crate) async fn argon2<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut passwords::Memory) -> R + Send + 'static,
    ) -> Result<R, Failure> {
        self.argon2.run(f).await.map_err(|e| Failure::new(FsStatus::Internal, e))
    }

    /// Creates the administrator `name` (uid 0) if no user exists yet.
    /// Returns whether it was created.
    pub async fn bootstrap_admin(&self, name: &str, password: &str) -> Result<bool, Failure> {
        if !self.meta(|ns| ns.users()).await?.is_empty() {
            return Ok(false);
        }
        self.add_user(name, password, 0, 0, true).await?;
        Ok(true)
    }

    /// Grants user `name` the right to act for the ids in `ids` (inclusive)
    /// as a gateway (`AS_USER`), or takes it away (`None`); open sessions
    /// of the user see the change at their next request.
    pub async fn set_gateway(&self, name: &str, ids: Option<(u32, u32)>) -> Result<(), Failure> {
        let name = name.to_string();
        self.meta(move |ns| ns.set_gateway(&name, ids)).await?;
        self.users_changed().await;
        Ok(())
    }

    /// The names of every user, in name order.
    pub async fn user_names(&self) -> Result<Vec<String>, Failure> {
        Ok(self.meta(|ns| ns.users()).await?.into_iter().map(|u| u.name).collect())
    }

    /// Adds a user without supplementary groups.
    pub async fn add_user(&self, name: &str, password: &str, uid: u32, gid: u32, admin: bool) -> Result<(), Failure> {
        self.add_user_in_groups(name, password, uid, gid, &[], admin).await
    }

    /// Adds a user with supplementary groups (strictly ascending, at most
    /// `GROUPS_MAX`).
    pub async fn add_user_in_groups(
        &self,
        name: &str,
        password: &str,
        uid: u32,
        gid: u32,
        groups: &[u32],
        admin: bool,
    ) -> Result<(), Failure> {
        nasd_proto::fs::validate_groups(groups).map_err(|e| Failure::new(FsStatus::InvalidArgument, e))?;
        if name.is_empty() || name.len() > nasd_proto::manager::USER_NAME_MAX || name.contains(['/', ':', '\0']) {
            return Err(Failure::new(FsStatus::InvalidArgument, "user names are 1-64 bytes without '/', ':' or NUL"));
        }
        if password.len() < passwords::PASSWORD_MIN {
            return Err(Failure::new(
                FsStatus::InvalidArgument,
                format!("passwords need at least {} characters", passwords::PASSWORD_MIN),
            ));
        }
        let password = password.to_string();
        let hash = self.argon2(move |memory| passwords::hash_with(memory, &password)).await?;
        let user = User {
            name: name.to_string(),
            uid,
            gid,
            password_hash: hash,
            admin,
            groups: groups.to_vec(),
            gateway: None,
        };
        self.meta(move |ns| ns.add_user(&user)).await.map_err(|f| match f.status {
            FsStatus::Exists => Failure::new(FsStatus::Exists, "a user with that name or uid exists"),
            _ => f,
        })
    }

    /// Checks a login; the user it stands for.
    async fn login(&self, name: &str, password: &str) -> Result<User, Failure> {
        let name = name.to_string();
        let user = self.meta(move |ns| ns.user(&name)).await?;
        let hash = match &user {
            Some(u) => u.password_hash.clone(),
            None => self.decoy_hash.clone(),
        };
        let password = password.to_string();
        let ok = self.argon2(move |memory| passwords::verify_with(memory, &password, &hash)).await?;
        match (ok, user) {
            (true, Some(user)) => Ok(user),
            _ => Err(FsStatus::BadCredentials.into()),
        }
    }

    /// The value of [`Manager::users_epoch`] now.
    pub(crate) fn users_epoch(&self) -> u64 {
        self.users_epoch.load(Ordering::SeqCst)
    }

    /// Records that users' credentials changed: every session of this
    /// manager reloads its user before its next request
    /// ([`Manager::users_changed`] tells the other managers too).
    pub(crate) fn users_changed_here(&self) {
        self.users_epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Takes a fresh drive into service: initializes it with its master
    /// key, gives it a new drive key, creates the file system's partition
    /// with its keys, records it, and fills its object pool.
    ///
    /// "Fresh" means no partitions, or exactly one: the file system's
    /// partition holding no more objects than a new partition has
    /// (`FRESH_PARTITION_OBJECTS`), which is what an add-drive interrupted
    /// before it recorded the drive leaves; such a drive is set up again.
    ///
    /// # Errors
    /// `InvalidArgument` (a drive holding other partitions or objects, an
    /// address over `DRIVE_ADDR_MAX`), `Exists` (in service already),
    /// `NoSpace` (`DRIVES_MAX` drives already), `DriveUnavailable` (the
    /// drive did not answer within `DRIVE_TIMEOUT`, or refused).
    pub async fn add_drive(&self, addr: &str, master: &Key) -> Result<u32, Failure> {
        let handle = self.provision_drive(addr, master).await?;
        if let Err(e) = self.refill_pool(&handle).await {
            tracing::warn!(drive = handle.drive, error = %e, "could not fill the new drive's object pool yet");
        }
        Ok(handle.drive)
    }

    async fn provision_drive(&self, addr: &str, master: &Key) -> Result<Arc<DriveHandle>, Failure> {
        if addr.len() > DRIVE_ADDR_MAX {
            return Err(Failure::new(
                FsStatus::InvalidArgument,
                format!("drive addresses are at most {DRIVE_ADDR_MAX} bytes (DRIVE_ADDR_MAX)"),
            ));
        }
        let _admin = self.drive_admin.lock().await;
        if self.drives().len() >= DRIVES_MAX {
            return Err(Failure::new(
                FsStatus::NoSpace,
                format!("the manager has {DRIVES_MAX} drives, the most it serves (DRIVES_MAX)"),
            ));
        }
        let unavailable = |e: nasd_client::ClientError| {
            Failure::new(FsStatus::DriveUnavailable, format!("cannot set up the drive at {addr}: {e}"))
        };
        // Timed: the drive-admin lock is held, and pool refills, key rotation
        // and orphan collection wait for it.
        let connect = nasd_client::DriveClient::connect_in(&self.env, addr, nasd_client::DRIVE_WAIT_MAX);
        let mut client = drives::timed(connect).await.map_err(unavailable)?;
        let info = drives::timed(client.inquiry()).await.map_err(unavailable)?;
        let existing = self.drives();
        if existing.iter().any(|d| d.drive_id == info.drive_id) {
            return Err(Failure::new(FsStatus::Exists, format!("the drive at {addr} is already in service")));
        }
        // A drive holding only this file system's partition, still empty, was
        // being set up when a manager stopped before recording it: set it up
        // again. Anything else may be someone's data.
        let half_provisioned = matches!(&info.partitions[..], [p]
            if p.partition == self.config.partition && p.objects <= FRESH_PARTITION_OBJECTS);
        if !info.partitions.is_empty() && !half_provisioned {
            return Err(Failure::new(
                FsStatus::InvalidArgument,
                format!(
                    "the drive at {addr} already holds partitions; only a fresh drive (or one holding just an \
                     empty partition {}, left by an interrupted add-drive) can be added",
                    self.config.partition
                ),
            ));
        }
        let keys = DriveKeys::generate(self.env.now_secs());
        let quota = info.capacity_bytes;
        DriveHandle::provision(&mut client, master, &keys, self.config.partition, quota, self.config.protection)
            .await
            .map_err(|e| unavailable(e.0))?;
        let drive = existing.iter().map(|d| d.drive + 1).max().unwrap_or(0);
        let rec = DriveRecord {
            drive,
            drive_id: info.drive_id,
            addr: addr.to_string(),
            partition: self.config.partition,
            sealed_keys: keys.seal(&self.kek, drive),
            capacity_bytes: info.capacity_bytes,
            failure_domain: String::new(),
            state: DriveState::In,
        };
        let stored = rec.clone();
        self.meta(move |ns| ns.add_drive(&stored)).await?;
        let handle = self.attach(&rec, keys);
        // Provisioning installed working key 1: nothing is pending.
        handle.set_keys_installed(handle.keys());
        // A minimum map epoch from the start, so that the drive fences itself
        // whenever it restarts; if it cannot be set now, recovery does it.
        match self.readmit(&handle).await {
            Ok(()) => handle.set_recovered(),
            Err(e) => tracing::info!(drive, error = %e, "the drive's map epoch is set by its recovery"),
        }
        tracing::info!(drive, addr, "drive added");
        Ok(handle)
    }
}

/// An offline password reset: sets a user's password directly in the
/// metadata of a manager (in its directory, or where its configuration
/// says), without logging in — the way back when no administrator can log
/// in (`nasd admin reset-password`). Meant for a stopped manager; the
/// database's transactions keep it safe beside a running one, whose sessions
/// already logged in go on.
/// [`PasswordReset::prepare`] checks and hashes, [`PasswordReset::commit`]
/// changes: the caller can store the new password somewhere durable in
/// between, and keep the old one if either fails.
pub struct PasswordReset {
    ns: Namespace<Store>,
    /// Where the metadata is (never shows a password).
    location: Location,
    name: String,
    hash: String,
}

impl std::fmt::Debug for PasswordReset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PasswordReset").field("name", &self.name).finish_non_exhaustive()
    }
}

impl PasswordReset {
    /// Opens the metadata of the manager in `dir` (at `metadata` if given,
    /// else `DIR/`[`META_DB`]), checks the password's length and that user
    /// `name` exists, and hashes the password. Creates and changes nothing.
    ///
    /// # Errors
    /// No metadata there, a password shorter than
    /// [`passwords::PASSWORD_MIN`] or longer than a `LOGIN` can carry, no
    /// such user, the database cannot be read.
    pub fn prepare(dir: &Path, metadata: Option<&Location>, name: &str, password: &str) -> anyhow::Result<Self> {
        let location = metadata.cloned().unwrap_or_else(|| Location::Sqlite(dir.join(META_DB)));
        let backend = match location.open_existing() {
            Err(nasd_meta::MetaError::Missing(_)) if metadata.is_none() => anyhow::bail!(
                "{} holds no manager metadata ({META_DB}): give the manager's data directory (for `nasd up`, \
                 DATA/manager)",
                dir.display()
            ),
            Err(e) => anyhow::bail!("cannot open the metadata at {location}: {e}"),
            Ok(backend) => backend,
        };
        anyhow::ensure!(
            (passwords::PASSWORD_MIN..=nasd_proto::manager::PASSWORD_MAX).contains(&password.len()),
            "passwords need {} to {} bytes",
            passwords::PASSWORD_MIN,
            nasd_proto::manager::PASSWORD_MAX
        );
        let has_root = backend
            .read(|t| t.get_inode(nasd_proto::fs::ROOT_INO))
            .map_err(|e| anyhow::anyhow!("cannot read the metadata at {location}: {}", e.describe()))?;
        anyhow::ensure!(has_root.is_some(), "the metadata at {location} holds no file system");
        // The root exists, so it keeps its layout.
        let ns =
            Namespace::new(backend, Layout::SINGLE).map_err(|e| anyhow::anyhow!("cannot open the name space: {e}"))?;
        match ns.user(name) {
            Ok(Some(_)) => {}
            Ok(None) => anyhow::bail!("no user '{name}' in {location}"),
            Err(e) => anyhow::bail!("cannot read the user '{name}': {}", e.describe()),
        }
        Ok(PasswordReset { ns, location, name: name.to_string(), hash: passwords::hash(password) })
    }

    /// Sets the password, in one transaction.
    ///
    /// # Errors
    /// The user is gone, or the database cannot be written (busy beside a
    /// running manager, read-only, full); nothing changed.
    pub fn commit(self) -> anyhow::Result<()> {
        let name = &self.name;
        match self.ns.set_password(name, &self.hash) {
            Ok(()) => Ok(()),
            Err(FsStatus::NotFound) => anyhow::bail!("no user '{name}' in {}", self.location),
            Err(e) => anyhow::bail!("cannot set the password of '{name}': {}", e.describe()),
        }
    }
}
