//! The whole-cluster world: the real authentication server
//! (`nasd_auth::AuthServer`, its SQLite database on its simulated disk;
//! [`auth`]), the real file manager (`nasd_manager::Manager`, its SQLite
//! metadata on its simulated disk, linked to the authentication server),
//! secured drives, and clients that log in at the authentication server and
//! work on files through the real file-system client (`nasd_fs`) over
//! striped, mirrored and Reed-Solomon layouts — under faults drawn from the
//! seed, with every read checked against each file's model.
//!
//! Among their operations the clients send `SYNC`s and, as administrators,
//! start a rebalance or a scrub now and then (`REPAIR`), which move
//! components and heal rot while the workload and the faults go on.
//!
//! Each client owns its files (no two clients write one file), so a file's
//! acknowledged history is one sequence. What a name may hold is a
//! [`Maybe`]: exactly one state after every acknowledged operation, one of
//! several after an operation that failed (it may or may not have happened,
//! or be rolled back later), never resolved by reading (a write
//! transaction left open is rolled back when its lease runs out).
//!
//! What is checked:
//! - every read returns a state the name's model allows: after an
//!   acknowledged create/write/truncate/rename/unlink exactly its result; after
//!   a failed one, one of the states it may have left, each stripe (each
//!   stripe unit where there is no parity) from one of them — old or new,
//!   never anything else — and a size one of them has;
//! - a name the model says is absent is absent, and a directory lists no
//!   name the model does not allow;
//! - no request is served under a capability older than a revocation
//!   that returned: chmod and ACL changes of a file, and two rotations of a
//!   drive's working key, race a holder's reads with a capability obtained
//!   before them, at times drawn from the seed ([`revocation`]);
//! - the manager opens again after every crash, every drive after every
//!   crash; no daemon task panics (a panic aborts the process, and the panic
//!   hook names the seed).
//!
//! Faults: drive crashes that lose what was not synced (power loss) and
//! restarts, a drive's disk full for a while (then its process restarted,
//! as an operator restarts a store that failed a commit), the manager killed (`kill -9`:
//! its disk keeps its writes) and restarted, the manager's power loss (its
//! disk keeps only what SQLite synced, through the simulated VFS) and
//! restart, the authentication server's power loss and restart (clients
//! renew their identities there meanwhile), partitions between a client
//! and the manager or a drive and between the manager and a drive, a slow
//! link (a drive's, the manager's or a client's: its segments fall behind
//! others', so messages reorder across connections), a connection of a
//! drive or of the manager reset, bit rot (a bit of a drive's stored blocks
//! flipped at rest), a host's clock jumping within the skew the drives
//! allow, and at most once a drive gone for good. At the end the faults
//! stop, everything but a gone drive comes back, and every file of every
//! client is read (a `stripe` file may be unreadable after rot or with a
//! component on the gone drive, never read wrong) and every directory
//! listed; then, within two minutes, the manager's repair must have
//! brought every component on the drives left back to `Ok`, and rebuilt
//! elsewhere every component of the gone drive whose layout has redundancy
//! and fits on the drives left (a mirror on three drives does; `rs:2+1`
//! does not, and must still read).
//!
//! A manager power loss may take the changes acknowledged in the last
//! `metadata_sync_ms` (docs/ARCHITECTURE.md, "Durability"): each name keeps
//! its recent models, and at a power loss its model widens to every state
//! from the last one acknowledged more than `metadata_sync_ms` (the
//! default) and a flush's time ago on,
//! with the states operations pass through (a whole-file write's
//! truncation). Anything older must hold — and so must everything
//! acknowledged before an acknowledged `SYNC` was sent (the clients send
//! one now and then, among their operations): a `SYNC` narrows the window,
//! and half the power losses come soon after one returned. (A manager that
//! answered `SYNC` alone without a flush went unnoticed in the 35 seeds tried: the
//! unlinks, renames and revocations of the workload each flush the
//! metadata before touching a drive, which covers what the `SYNC` should
//! have; `skip-metadata-sync`, which skips every flush, is caught.)
//!
//! Found and fixed: seed 13 (`--duration 60`, once the manager's power
//! loss joined the faults): a rename over a file removed the old file's
//! objects on the drives at once; the power loss 57 ms later undid the
//! rename (not yet flushed), and the name was back on an inode whose
//! objects were gone. The manager now makes its metadata durable before
//! any effect on the drives that cannot be undone
//! (`Manager::durable_before_drive_effects`).
//!
//! Found and fixed: seed 12 (`--duration 60`, once bit rot and clock jumps
//! joined the faults) read an `rs:2+1` file with one stripe torn — its
//! first data unit zeros, its second the old bytes — right after the
//! manager came back: it had been killed during the size change of a
//! truncating `CREATE`, which it makes as the writer under a transaction
//! of its own; the change had reached one component and the intent stayed
//! Open until its lease ended. The manager's own transactions are now
//! recorded as `MANAGER_WRITER_UID`'s, and one this process is not making
//! is rolled back at once (`nasd_manager`'s `coordinator.rs`, `orphaned`).
//!
//! Found and fixed: seeds 5, 11 and 14 (`--duration 60`) and 3
//! (`--duration 30`) ended with a `stripe:2` file unreadable, a component
//! Stale: an overwrite begun while one of the file's drives was down (its
//! write transaction not opened there) failed, and the rollback at the
//! lease's end marked the component stale, as the coordinator must when a
//! writer may have written there without undo (a write names no
//! transaction, so a drive cannot refuse one outside it); with no
//! redundancy nothing could resync it. On such a layout the manager now
//! begins no transaction it could not undo everywhere, and a rollback waits
//! for a down drive instead of marking it (`nasd_manager`'s
//! `coordinator.rs`).
//!
//! Not yet here: the cross-name prefix property of a power loss, several
//! managers or authentication servers, the manager's quotas (the
//! drives-only run checks the drives' partition quotas).

mod auth;
mod revocation;

use auth::AuthSlot;

use crate::world::{between, jump_a_clock, reset_a_connection, slow_a_link, Core, Host, Node, Tally};
use crate::Config;
use nasd_drive::{DriveConfig, SecurityMode};
use nasd_fs::{FsClient, FsConfig, FsError};
use nasd_manager::{Manager, ManagerConfig};
use nasd_proto::fs::FsStatus;
use nasd_proto::layout::{ComponentState, Layout, Scheme};
use nasd_proto::manager::{LayoutInfo, RepairAction};
use nasd_store::{Store, StoreOptions};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Block size of the simulated drives.
const BLOCK_SIZE: u32 = 4096;
/// Block storage of each drive.
const DRIVE_CAPACITY_BYTES: u64 = 24 << 20;
/// Each drive's simulated disk.
const DRIVE_DISK_BYTES: u64 = 64 << 20;
/// The manager's simulated disk (its metadata database and log).
const MANAGER_DISK_BYTES: u64 = 64 << 20;
/// Largest file the clients write.
const FILE_BYTES_MAX: u64 = 40 * 1024;
/// Files per client in each layout's directory.
const FILES_PER_DIR: usize = 4;
/// Most states a name's model keeps before it stops judging the name
/// (failures piling up on one file).
const MAYBE_MAX: usize = 12;
/// The drives' port.
const DRIVE_PORT: u16 = 7400;
/// Where the store lives on a drive's disk.
const STORE_DIR: &str = "/drive";
/// The administrator, as whom the clients work (every file is a client's own).
const ADMIN: &str = "admin";
const ADMIN_PW: &str = "simulated-admin-password";
/// How long a client waits for the manager or a drive at any step.
const CLIENT_WAIT: Duration = Duration::from_secs(20);
/// The layouts the workload spreads files over, each in a directory of its
/// name. Units of one block, so 40 KiB files span several stripes.
const LAYOUTS: [(&str, &str); 3] = [("stripe", "stripe:2@4K"), ("mirror", "mirror:2@4K"), ("rs", "rs:2+1@4K")];

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().expect("cluster mutex poisoned")
}

fn drive_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 10, i as u8 + 1))
}
fn client_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 20, i as u8 + 1))
}
const MANAGER_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 40, 1));
const MANAGER_PORT: u16 = 7300;
const CHECKER_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 60, 1));

/// What a name may hold: absent (`None`) or a file's bytes.
type Content = Option<Vec<u8>>;

/// A name's recent models: when each was set, and whether it is a state an
/// operation passes through (not one it leaves).
type History = Vec<(Instant, Maybe, bool)>;

/// How long a name's models are remembered (longer than any power-loss
/// window: `metadata_sync_ms` and [`FLUSH_MARGIN`]).
const HISTORY_KEPT: Duration = Duration::from_secs(10);

/// What a power loss may take beyond `metadata_sync_ms`: time for the
/// flush itself to run.
const FLUSH_MARGIN: Duration = Duration::from_millis(100);

const _: () = assert!(
    nasd_manager::METADATA_SYNC_INTERVAL_DEFAULT.as_millis() + FLUSH_MARGIN.as_millis() < HISTORY_KEPT.as_millis()
);

/// A name's model: the states an acknowledged history allows.
#[derive(Debug, Clone)]
enum Maybe {
    /// Exactly this (after an acknowledged operation).
    Exact(Content),
    /// One of these, each stripe of a file from one of them (after failed
    /// operations).
    OneOf(Vec<Content>),
    /// Too many failures piled up: not judged until an acknowledged
    /// operation says exactly what it holds.
    Unknown,
}

impl Maybe {
    fn states(&self) -> Option<Vec<Content>> {
        match self {
            Maybe::Exact(c) => Some(vec![c.clone()]),
            Maybe::OneOf(v) => Some(v.clone()),
            Maybe::Unknown => None,
        }
    }

    /// The model after an operation that failed, which may have left any of
    /// `after` (or nothing changed).
    fn or(&self, after: Vec<Content>) -> Maybe {
        let Some(mut states) = self.states() else { return Maybe::Unknown };
        for a in after {
            if !states.contains(&a) {
                states.push(a);
            }
        }
        if states.len() > MAYBE_MAX {
            Maybe::Unknown
        } else {
            Maybe::OneOf(states)
        }
    }

    /// Every state mapped by `f` (an acknowledged operation applied to a
    /// name whose state was not known exactly).
    fn map(&self, f: impl Fn(&Content) -> Content) -> Maybe {
        match self {
            Maybe::Exact(c) => Maybe::Exact(f(c)),
            Maybe::OneOf(v) => {
                let mut out: Vec<Content> = Vec::new();
                for c in v.iter().map(f) {
                    if !out.contains(&c) {
                        out.push(c);
                    }
                }
                if out.len() == 1 {
                    Maybe::Exact(out.pop().expect("one state"))
                } else {
                    Maybe::OneOf(out)
                }
            }
            Maybe::Unknown => Maybe::Unknown,
        }
    }

    /// Whether the name surely holds a file (an operation on it is valid).
    fn surely_file(&self) -> bool {
        self.states().is_some_and(|s| s.iter().all(Option::is_some))
    }

    fn surely_absent(&self) -> bool {
        matches!(self, Maybe::Exact(None))
    }

    /// Whether `got` is a state this model allows, with stripes of `chunk`
    /// bytes (each from one state).
    fn allows(&self, got: &Content, chunk: u64) -> bool {
        let Some(states) = self.states() else { return true };
        if states.contains(got) {
            return true;
        }
        let Some(got) = got else { return false };
        let files: Vec<&Vec<u8>> = states.iter().flatten().collect();
        if !files.iter().any(|f| f.len() == got.len()) {
            return false;
        }
        got.chunks(chunk as usize).enumerate().all(|(i, piece)| {
            let at = i * chunk as usize;
            files.iter().any(|f| (0..piece.len()).all(|k| piece[k] == f.get(at + k).copied().unwrap_or(0)))
        })
    }
}

impl Maybe {
    /// For a failure message: the first stripe of `got` that no state
    /// holds, and for each state how many of its first bytes match there.
    fn mismatch(&self, got: &Content, chunk: u64) -> String {
        let (Some(states), Some(got)) = (self.states(), got) else { return String::new() };
        let files: Vec<&Vec<u8>> = states.iter().flatten().collect();
        let byte = |f: &Vec<u8>, at: usize| f.get(at).copied().unwrap_or(0);
        for (i, piece) in got.chunks(chunk as usize).enumerate() {
            let at = i * chunk as usize;
            let matched: Vec<usize> =
                files.iter().map(|f| (0..piece.len()).take_while(|&k| piece[k] == byte(f, at + k)).count()).collect();
            if matched.iter().all(|&m| m < piece.len()) {
                return format!(
                    " (stripe at byte {at} of {}: bytes matching each state from there: {matched:?})",
                    piece.len()
                );
            }
        }
        String::new()
    }
}

/// Short text for the log: a content's length and digest prefix.
fn describe(c: &Content) -> String {
    match c {
        None => "absent".into(),
        Some(b) => format!("{} bytes {}", b.len(), &blake3::hash(b).to_hex()[..8]),
    }
}

fn describe_maybe(m: &Maybe) -> String {
    match m {
        Maybe::Exact(c) => describe(c),
        Maybe::OneOf(v) => format!("one of [{}]", v.iter().map(describe).collect::<Vec<_>>().join(", ")),
        Maybe::Unknown => "unknown".into(),
    }
}

/// `c` with `data` written at `offset` (zeros filling any gap).
fn written(c: &Content, offset: u64, data: &[u8]) -> Content {
    let mut b = c.clone().unwrap_or_default();
    let end = offset as usize + data.len();
    if b.len() < end {
        b.resize(end, 0);
    }
    b[offset as usize..end].copy_from_slice(data);
    Some(b)
}

/// `c` cut or zero-extended to `size`.
fn resized(c: &Content, size: u64) -> Content {
    let mut b = c.clone().unwrap_or_default();
    b.resize(size as usize, 0);
    Some(b)
}

/// The bytes within which one write transaction leaves a file old or new:
/// a stripe where parity ties its units together, a stripe unit otherwise.
fn chunk_of(layout: &Layout) -> u64 {
    match layout.scheme {
        Scheme::ReedSolomon { .. } => layout.stripe_bytes(),
        _ => u64::from(layout.stripe_unit),
    }
}

struct DriveSlot {
    index: usize,
    host: Arc<Host>,
    addr: SocketAddr,
    master: nasd_crypto::Key,
    node: Mutex<Option<Arc<Node>>>,
    /// Gone for good: never started again.
    gone: AtomicBool,
}

/// The manager's host and its running incarnation.
struct ManagerSlot {
    host: Arc<Host>,
    /// The real directory of its key files and TLS material (the metadata is
    /// on the simulated disk, at the same path there).
    dir: PathBuf,
    tls: nasd_manager::tls::TlsFiles,
    running: Mutex<Option<Running>>,
}

/// A running manager: its node, and the shutdown signal its loops watch
/// (kept so that they run until the node is killed).
struct Running {
    node: Arc<Node>,
    manager: Arc<Manager>,
    _stop: watch::Sender<bool>,
}

/// The world of one run.
pub struct Cluster {
    core: Arc<Core>,
    cfg: Config,
    drives: Vec<DriveSlot>,
    manager: ManagerSlot,
    auth: AuthSlot,
    clients: Vec<Arc<Host>>,
    /// Per client: every name it used, by path, with its model.
    models: Vec<Mutex<BTreeMap<String, Maybe>>>,
    /// Per client: each name's recent models, for a manager power loss.
    histories: Vec<Mutex<BTreeMap<String, History>>>,
    /// When the latest acknowledged `SYNC` was sent: every change
    /// acknowledged before then survives a power loss of the manager.
    synced_through: Mutex<Option<Instant>>,
    /// The manager's `metadata_sync_ms`.
    metadata_sync: Duration,
    tally: Tally,
    /// A drive's disk rotted (a bit flipped at rest): a file without
    /// redundancy may be unreadable from then on — never read wrong.
    rotted: AtomicBool,
    end: Instant,
    /// Kept until the run ends: the manager's real directory.
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Builds the hosts of a run (inside its runtime).
    pub fn new(core: Arc<Core>, cfg: Config) -> Arc<Cluster> {
        let key = |core: &Core| nasd_crypto::Key::from_bytes(core.bytes(32).try_into().expect("32 bytes"));
        let drives = (0..cfg.drives.max(3))
            .map(|i| DriveSlot {
                index: i,
                host: Host::new(&core, &format!("drive-{i}"), drive_ip(i), DRIVE_DISK_BYTES),
                addr: SocketAddr::new(drive_ip(i), DRIVE_PORT),
                master: key(&core),
                node: Mutex::new(None),
                gone: AtomicBool::new(false),
            })
            .collect();
        let dir = tempfile::tempdir().expect("a temporary directory for the manager's key files");
        let names = vec!["localhost".to_string()];
        let tls = nasd_manager::tls::ensure_certificates(&dir.path().join("tls"), &names).expect("TLS certificates");
        let manager = ManagerSlot {
            host: Host::new(&core, "manager", MANAGER_IP, MANAGER_DISK_BYTES),
            dir: dir.path().join("manager"),
            tls,
            running: Mutex::new(None),
        };
        let auth = AuthSlot::new(&core, dir.path());
        let clients =
            (0..cfg.clients).map(|i| Host::new(&core, &format!("client-{i}"), client_ip(i), 1 << 20)).collect();
        let models = (0..cfg.clients).map(|_| Mutex::new(BTreeMap::new())).collect();
        let histories = (0..cfg.clients).map(|_| Mutex::new(BTreeMap::new())).collect();
        let end = Instant::now() + cfg.duration;
        let (tally, rotted) = (Tally::default(), AtomicBool::new(false));
        let metadata_sync = nasd_manager::METADATA_SYNC_INTERVAL_DEFAULT;
        Arc::new(Cluster {
            core,
            cfg,
            drives,
            manager,
            auth,
            clients,
            models,
            histories,
            synced_through: Mutex::new(None),
            metadata_sync,
            tally,
            rotted,
            end,
            _dir: dir,
        })
    }

    /// A property broke: logged, and the run fails.
    fn fail(&self, what: String) {
        self.tally.fail(&self.core, what);
    }

    /// The failures so far.
    pub fn failures(&self) -> Vec<String> {
        self.tally.failures()
    }

    /// Operations the clients started, and faults injected.
    pub fn counts(&self) -> (u64, u64) {
        self.tally.counts()
    }

    /// The whole run: drives, the manager (which takes the drives into
    /// service), the layouts' directories, then the clients and the faults
    /// until the end; then everything back up and every file checked.
    pub async fn run(self: Arc<Self>) {
        if let Err(e) = self.start_auth(true).await {
            self.fail(format!("the authentication server did not start: {e}"));
            return;
        }
        for d in &self.drives {
            if let Err(e) = self.start_drive(d).await {
                self.fail(format!("drive-{} did not start: {e}", d.index));
                return;
            }
        }
        if let Err(e) = self.first_start().await {
            self.fail(format!("the cluster could not be set up: {e}"));
            return;
        }
        let mut tasks = Vec::new();
        for c in 0..self.clients.len() {
            let s = self.clone();
            tasks.push(tokio::spawn(async move { s.client(c).await }));
        }
        if self.cfg.faults {
            let s = self.clone();
            tasks.push(tokio::spawn(async move { s.faults().await }));
        }
        let s = self.clone();
        tasks.push(tokio::spawn(async move { s.revocation_races().await }));
        for t in tasks {
            if let Err(e) = t.await {
                self.fail(format!("a simulation task failed: {e}"));
            }
        }
        self.quiesce().await;
        self.final_check().await;
        self.redundancy_check().await;
    }

    // ------------------------------------------------------------ daemons

    async fn start_drive(&self, d: &DriveSlot) -> Result<(), String> {
        let node = d.host.boot();
        let env = node.env();
        let opts = StoreOptions { block_size: BLOCK_SIZE, capacity_bytes: DRIVE_CAPACITY_BYTES, ..Default::default() };
        let store = Store::open_in(&env, Path::new(STORE_DIR), &opts).map_err(|e| format!("store: {e}"))?;
        let listener = env.bind(d.addr).await.map_err(|e| format!("listen: {e}"))?;
        let config = DriveConfig {
            commit_interval: Duration::from_secs(2),
            security: SecurityMode::Enforced { master_key: Some(d.master.clone()) },
            ..DriveConfig::default()
        };
        env.spawn(nasd_drive::serve(listener, Arc::new(store), config, std::future::pending()));
        *lock(&d.node) = Some(node);
        self.core.log(format!("drive-{} up", d.index));
        Ok(())
    }

    fn crash_drive(&self, d: &DriveSlot) {
        let Some(node) = lock(&d.node).take() else { return };
        let lost = node.crash();
        self.core.log(format!("drive-{} crashed (power loss)", d.index));
        for line in lost {
            self.core.log(format!("drive-{} disk: {line}", d.index));
        }
    }

    /// Kills the drive's process (`kill -9`: the disk keeps every write) and
    /// starts it again, as an operator does after its store failed.
    async fn restart_drive_process(&self, d: &DriveSlot) {
        let Some(node) = lock(&d.node).take() else { return };
        node.kill();
        self.core.log(format!("drive-{} restarted by its operator", d.index));
        self.restart_drive(d).await;
    }

    async fn restart_drive(&self, d: &DriveSlot) {
        if lock(&d.node).is_some() || d.gone.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = self.start_drive(d).await {
            self.fail(format!("drive-{} did not open again after a crash: {e}", d.index));
        }
    }

    fn manager_config(&self) -> ManagerConfig {
        ManagerConfig {
            pool_target: 8,
            // Every byte on the drives: the layouts are what is exercised.
            small_file_threshold: 0,
            write_lease: Duration::from_secs(10),
            // A drive down this long is rebuilt elsewhere: longer than any
            // crash or restart here lasts, so only a drive gone for good is.
            rebuild_delay: REBUILD_DELAY,
            metadata_sync_interval: self.metadata_sync,
            // Users are the authentication server's: the manager takes identities only.
            auth: Some(self.auth_link()),
            ..ManagerConfig::default()
        }
    }

    /// Opens the manager on its node and starts serving (recovery, the
    /// background loops, sessions: all the node's tasks, which a crash ends).
    async fn start_manager(&self) -> Result<Arc<Manager>, String> {
        let m = &self.manager;
        let node = m.host.boot();
        let env = node.env();
        let manager = Manager::open_in(&env, &m.dir, self.manager_config()).map_err(|e| format!("open: {e:#}"))?;
        let acceptor = nasd_manager::tls::acceptor(&m.tls).map_err(|e| format!("TLS: {e:#}"))?;
        let listener = env.bind(SocketAddr::new(MANAGER_IP, MANAGER_PORT)).await.map_err(|e| format!("listen: {e}"))?;
        let (stop, stop_rx) = watch::channel(false);
        let recovering = manager.clone();
        env.spawn(async move { recovering.recover().await });
        env.spawn(manager.clone().serve(listener, acceptor, stop_rx.clone()));
        manager.spawn_maintenance(stop_rx);
        *lock(&m.running) = Some(Running { node, manager: manager.clone(), _stop: stop });
        self.core.log("manager up");
        Ok(manager)
    }

    fn kill_manager(&self) {
        let Some(running) = lock(&self.manager.running).take() else { return };
        running.node.kill();
        self.core.log("manager killed (kill -9)");
    }

    /// The manager's host loses power: its disk keeps only what was synced
    /// (of SQLite's log and database, through the simulated VFS), and each
    /// name's model widens to what that may take.
    fn power_off_manager(&self) {
        let Some(running) = lock(&self.manager.running).take() else { return };
        let lost = running.node.crash();
        self.core.log("manager lost power");
        // Its directory's real name is a temporary one: not the seed's.
        let dir = self.manager.dir.display().to_string();
        for line in lost {
            self.core.log(format!("manager disk: {}", line.replace(&dir, "$MANAGER_DIR")));
        }
        self.widen_for_power_loss();
    }

    async fn restart_manager(&self) {
        if lock(&self.manager.running).is_some() {
            return;
        }
        if let Err(e) = self.start_manager().await {
            self.fail(format!("the manager did not open again after a crash: {e}"));
        }
    }

    /// First start: the manager takes every drive into service and makes
    /// the administrator; the layouts' directories and each client's own.
    async fn first_start(&self) -> Result<(), String> {
        let manager = self.start_manager().await?;
        for d in &self.drives {
            manager
                .add_drive(&d.addr.to_string(), &d.master)
                .await
                .map_err(|e| format!("add drive-{}: {e}", d.index))?;
        }
        drop(manager);
        let node = Host::new(&self.core, "setup", IpAddr::V4(Ipv4Addr::new(127, 0, 30, 1)), 1 << 20).boot();
        let fs = self.log_in(&node).await.map_err(|e| format!("log in: {e}"))?;
        for (dir, layout) in LAYOUTS {
            let layout = Layout::parse(layout).map_err(|e| format!("layout {layout}: {e}"))?;
            fs.mkdir(&format!("/{dir}"), 0o755).await.map_err(|e| format!("mkdir /{dir}: {e}"))?;
            fs.set_layout(&format!("/{dir}"), Some(layout)).await.map_err(|e| format!("layout of /{dir}: {e}"))?;
            for c in 0..self.clients.len() {
                fs.mkdir(&format!("/{dir}/c{c}"), 0o755).await.map_err(|e| format!("mkdir /{dir}/c{c}: {e}"))?;
            }
        }
        for (c, models) in self.models.iter().enumerate() {
            let mut models = lock(models);
            for (dir, _) in LAYOUTS {
                for f in 0..FILES_PER_DIR {
                    models.insert(format!("/{dir}/c{c}/f{f}"), Maybe::Exact(None));
                }
            }
        }
        self.core.log("cluster set up");
        Ok(())
    }

    /// How `node` reaches the manager (the identity is [`Self::log_in`]'s).
    fn fs_config(&self, node: &Arc<Node>) -> FsConfig {
        FsConfig {
            manager: SocketAddr::new(MANAGER_IP, MANAGER_PORT).to_string(),
            server_name: "localhost".into(),
            ca_cert: self.manager.tls.ca.clone(),
            reply_timeout: CLIENT_WAIT,
            env: node.env(),
            ..FsConfig::default()
        }
    }

    /// The chunk within which a file in `path`'s layout directory is old or new.
    fn chunk_for(path: &str) -> u64 {
        let dir = path.split('/').nth(1).unwrap_or_default();
        let layout = LAYOUTS.iter().find(|(d, _)| *d == dir).map_or("stripe:1@4K", |(_, l)| l);
        chunk_of(&Layout::parse(layout).expect("the workload's layouts parse"))
    }

    // ------------------------------------------------------------ clients

    async fn client(self: Arc<Self>, c: usize) {
        let node = self.clients[c].boot();
        let name = format!("client-{c}");
        let fs = loop {
            match self.log_in(&node).await {
                Ok(fs) => break fs,
                Err(e) => {
                    self.core.log(format!("{name} login failed: {}", short(&e)));
                    if Instant::now() >= self.end {
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        while Instant::now() < self.end {
            self.step(c, &fs).await;
            tokio::time::sleep(between(&self.core, Duration::ZERO, Duration::from_millis(200))).await;
        }
    }

    fn model(&self, c: usize, path: &str) -> Maybe {
        lock(&self.models[c]).get(path).cloned().unwrap_or(Maybe::Exact(None))
    }

    fn set_model(&self, c: usize, path: &str, m: Maybe) {
        let old = lock(&self.models[c]).insert(path.to_string(), m.clone()).unwrap_or(Maybe::Exact(None));
        self.remember(c, path, old, m, false);
    }

    /// Notes that `path` passes through `state` on the way to what an
    /// operation leaves (a whole-file write's truncation by its create): a
    /// power loss of the manager may leave it there.
    fn passes_through(&self, c: usize, path: &str, state: Content) {
        let old = self.model(c, path);
        self.remember(c, path, old, Maybe::Exact(state), true);
    }

    fn remember(&self, c: usize, path: &str, old: Maybe, m: Maybe, transient: bool) {
        let now = Instant::now();
        let mut histories = lock(&self.histories[c]);
        let h = histories.entry(path.to_string()).or_insert_with(|| vec![(self.end - self.cfg.duration, old, false)]);
        h.push((now, m, transient));
        let keep_from = now.checked_sub(HISTORY_KEPT).unwrap_or(now);
        while h.len() > 2 && h[1].0 < keep_from && !h[1].2 {
            h.remove(0);
        }
    }

    /// The manager's power loss: each name may be back at any state it had
    /// at or after the last one acknowledged more than
    /// `metadata_sync_ms` (and [`FLUSH_MARGIN`]) ago (docs/ARCHITECTURE.md, "Durability": a
    /// power loss takes at most the changes acknowledged in the last
    /// `metadata_sync_ms`), including the states operations pass through —
    /// or, if later, the last one acknowledged before an acknowledged
    /// `SYNC` was sent (a client's `SYNC` makes everything acknowledged
    /// before it durable).
    fn widen_for_power_loss(&self) {
        let now = Instant::now();
        let window = now.checked_sub(self.metadata_sync + FLUSH_MARGIN).unwrap_or(now);
        let cutoff = match *lock(&self.synced_through) {
            Some(synced) if synced > window => {
                self.core.log(format!("power loss: a sync sent {:?} ago narrows the window", now - synced));
                synced
            }
            _ => window,
        };
        for c in 0..self.clients.len() {
            let histories = lock(&self.histories[c]).clone();
            for (path, h) in histories {
                let from = h.iter().rposition(|(t, _, transient)| *t < cutoff && !transient).unwrap_or(0);
                let current = self.model(c, &path);
                let mut states: Vec<Content> = Vec::new();
                let mut unknown = false;
                for m in h[from..].iter().map(|(_, m, _)| m).chain([&current]) {
                    match m.states() {
                        Some(v) => {
                            for x in v {
                                if !states.contains(&x) {
                                    states.push(x);
                                }
                            }
                        }
                        None => unknown = true,
                    }
                }
                let widened = if unknown || states.len() > MAYBE_MAX {
                    Maybe::Unknown
                } else if states.len() == 1 {
                    Maybe::Exact(states.pop().expect("one state"))
                } else {
                    Maybe::OneOf(states)
                };
                if format!("{widened:?}") != format!("{current:?}") {
                    self.core.log(format!("{path} after the power loss: {}", describe_maybe(&widened)));
                }
                lock(&self.models[c]).insert(path, widened);
            }
        }
    }

    fn pick_path(&self, c: usize) -> String {
        let (dir, _) = LAYOUTS[self.core.gen_range(0..LAYOUTS.len() as u64) as usize];
        format!("/{dir}/c{c}/f{}", self.core.gen_range(0..FILES_PER_DIR as u64))
    }

    fn content(&self, max: u64) -> Vec<u8> {
        let len = self.core.gen_range(0..max + 1) as usize;
        self.core.bytes(len)
    }

    /// One operation of client `c`, chosen from the seed, and its check.
    async fn step(&self, c: usize, fs: &FsClient) {
        self.tally.request();
        let path = self.pick_path(c);
        let before = self.model(c, &path);
        let who = format!("client-{c}");
        match self.core.gen_range(0..100) {
            // Write the whole file (create or replace its bytes), then close (flush).
            0..=29 => {
                let data = self.content(FILE_BYTES_MAX);
                self.passes_through(c, &path, Some(Vec::new()));
                let done = async {
                    let f = fs.create(&path, 0o644, false, true).await?;
                    f.write_at(0, &data).await?;
                    f.close().await.map(|_| ())
                }
                .await;
                self.settle(c, &who, &format!("write {path} ({})", data.len()), done, &path, |_| Some(data.clone()));
            }
            // Overwrite part of an existing file (it may grow).
            30..=44 if before.surely_file() => {
                let offset = self.core.gen_range(0..FILE_BYTES_MAX);
                let data = self.content(FILE_BYTES_MAX / 4);
                let done = async {
                    let f = fs.open(&path, true).await?;
                    f.write_at(offset, &data).await?;
                    f.close().await.map(|_| ())
                }
                .await;
                let what = format!("overwrite {path} at {offset} ({})", data.len());
                self.settle(c, &who, &what, done, &path, |old| written(old, offset, &data));
            }
            45..=54 if before.surely_file() => {
                let size = self.core.gen_range(0..FILE_BYTES_MAX + 1);
                let done = fs.truncate(&path, size).await.map(|_| ());
                self.settle(c, &who, &format!("truncate {path} to {size}"), done, &path, |old| resized(old, size));
            }
            55..=64 if before.surely_file() => {
                let done = fs.unlink(&path).await;
                self.settle(c, &who, &format!("unlink {path}"), done, &path, |_| None);
            }
            65..=74 if before.surely_file() => {
                // Within the same directory (the same layout), over whatever is there.
                let to = format!(
                    "{}/f{}",
                    &path[..path.rfind('/').expect("a path")],
                    self.core.gen_range(0..FILES_PER_DIR as u64)
                );
                if to == path {
                    return;
                }
                let done = fs.rename(&path, &to).await;
                // Read after: a power loss of the manager meanwhile widened them.
                let (before, target) = (self.model(c, &path), self.model(c, &to));
                let what = format!("rename {path} to {to}");
                match &done {
                    Ok(()) => {
                        self.core.log(format!("{who} {what}: ok"));
                        self.set_model(c, &to, before.clone());
                        self.set_model(c, &path, Maybe::Exact(None));
                    }
                    Err(e) => {
                        self.core.log(format!("{who} {what}: {}", short(e)));
                        if let Some(states) = before.states() {
                            self.set_model(c, &to, target.or(states));
                        } else {
                            self.set_model(c, &to, Maybe::Unknown);
                        }
                        self.set_model(c, &path, before.or(vec![None]));
                    }
                }
            }
            75..=78 => self.sync(fs, &who).await,
            // An administrator's repair task: components moved to even the
            // drives' use out, or every drive scrubbed and rot healed from
            // redundancy — running under the faults and the workload.
            79 => {
                let action = if self.core.chance(0.5) { RepairAction::Rebalance } else { RepairAction::Scrub };
                match fs.repair(action).await {
                    Ok(()) => self.core.log(format!("{who} repair {action:?}: started")),
                    Err(e) => self.core.log(format!("{who} repair {action:?}: {}", short(&e))),
                }
            }
            _ => self.check_read(c, fs, &who, &path).await,
        }
    }

    /// `SYNC`: once it returns, every change acknowledged before it was sent
    /// survives a power loss of the manager ([`Self::widen_for_power_loss`]).
    async fn sync(&self, fs: &FsClient, who: &str) {
        let sent = Instant::now();
        match fs.sync().await {
            Ok(()) => {
                self.core.log(format!("{who} sync: ok"));
                let mut through = lock(&self.synced_through);
                if through.is_none_or(|t| t < sent) {
                    *through = Some(sent);
                }
            }
            Err(e) => self.core.log(format!("{who} sync: {}", short(&e))),
        }
    }

    /// Records the outcome of an operation on `path` whose result, from
    /// each state the name may hold, is `after`: exactly that if it was
    /// acknowledged, else the name may hold that or what it held.
    fn settle(
        &self,
        c: usize,
        who: &str,
        what: &str,
        done: Result<(), FsError>,
        path: &str,
        after: impl Fn(&Content) -> Content,
    ) {
        // Read now, not before the operation: a power loss of the manager
        // meanwhile widened it.
        let before = &self.model(c, path);
        match done {
            Ok(()) => {
                let now = before.map(&after);
                self.core.log(format!("{who} {what}: ok, now {}", describe_maybe(&now)));
                self.set_model(c, path, now);
            }
            Err(e) => {
                let now = match before.states() {
                    Some(states) => {
                        let mut next: Vec<Content> = states.iter().map(&after).collect();
                        // A whole-file write may have stopped after its create truncated the file.
                        next.push(Some(Vec::new()));
                        before.or(next)
                    }
                    None => Maybe::Unknown,
                };
                self.core.log(format!("{who} {what}: {}; now {}", short(&e), describe_maybe(&now)));
                self.set_model(c, path, now);
            }
        }
    }

    /// Reads `path` and checks what came back against its model.
    async fn check_read(&self, c: usize, fs: &FsClient, who: &str, path: &str) {
        let model = self.model(c, path);
        let got: Content = match fs.read_file(path).await {
            Ok(b) => Some(b),
            Err(e) if e.status() == Some(FsStatus::NotFound) => None,
            Err(e) => {
                self.core.log(format!("{who} read {path}: {}", short(&e)));
                return;
            }
        };
        self.judge(who, path, &model, &got);
    }

    fn judge(&self, who: &str, path: &str, model: &Maybe, got: &Content) {
        if model.allows(got, Self::chunk_for(path)) {
            self.core.log(format!("{who} read {path}: {} (allowed)", describe(got)));
        } else {
            self.fail(format!(
                "{who} read {path} as {} but its acknowledged history allows only {}{}",
                describe(got),
                describe_maybe(model),
                model.mismatch(got, Self::chunk_for(path))
            ));
        }
    }

    // ------------------------------------------------------------ faults

    async fn faults(self: Arc<Self>) {
        let quiet = self.end - Duration::from_secs(5);
        // Every other seed loses a drive for good, at a time it draws.
        let lose_a_drive_at = (self.cfg.drive_loss && self.core.chance(0.5))
            .then(|| Instant::now() + between(&self.core, Duration::ZERO, self.cfg.duration / 2));
        let mut gone = false;
        while Instant::now() < quiet {
            tokio::time::sleep(between(&self.core, Duration::from_secs(1), Duration::from_secs(10))).await;
            self.tally.fault();
            let d = &self.drives[self.core.gen_range(0..self.drives.len() as u64) as usize];
            let up = lock(&d.node).is_some();
            let draw = if !gone && up && lose_a_drive_at.is_some_and(|at| Instant::now() >= at) {
                DRIVE_GONE
            } else {
                self.core.gen_range(0..DRIVE_GONE)
            };
            match draw {
                0..=24 if up => {
                    self.crash_drive(d);
                    tokio::time::sleep(between(&self.core, Duration::from_millis(100), Duration::from_secs(8))).await;
                    self.restart_drive(d).await;
                }
                25..=32 if up => {
                    d.host.disk.set_full(true);
                    self.core.log(format!("drive-{} disk full", d.index));
                    tokio::time::sleep(between(&self.core, Duration::from_millis(100), Duration::from_secs(5))).await;
                    d.host.disk.set_full(false);
                    self.core.log(format!("drive-{} disk has room again", d.index));
                    // A store that failed a commit refuses changes until it restarts: its
                    // operator restarts the drive's process (its disk keeps every write).
                    self.restart_drive_process(d).await;
                }
                33..=44 => {
                    self.kill_manager();
                    tokio::time::sleep(between(&self.core, Duration::from_millis(100), Duration::from_secs(6))).await;
                    self.restart_manager().await;
                }
                45..=52 => {
                    if self.core.chance(0.5) {
                        // Soon after a SYNC returned: what it made durable must survive.
                        self.after_the_next_sync().await;
                        tokio::time::sleep(between(&self.core, Duration::ZERO, Duration::from_millis(300))).await;
                    }
                    self.power_off_manager();
                    tokio::time::sleep(between(&self.core, Duration::from_millis(100), Duration::from_secs(6))).await;
                    self.restart_manager().await;
                }
                53..=67 => {
                    let c = self.core.gen_range(0..self.clients.len() as u64) as usize;
                    let (other, name) = if self.core.chance(0.5) {
                        (MANAGER_IP, "the manager".to_string())
                    } else {
                        (d.host.ip, format!("drive-{}", d.index))
                    };
                    self.core.net.partition(self.clients[c].ip, other);
                    self.core.log(format!("partition: client-{c} from {name}"));
                    tokio::time::sleep(between(&self.core, Duration::from_millis(200), Duration::from_secs(8))).await;
                    self.core.net.heal();
                    self.core.log("partitions healed");
                }
                68..=74 => {
                    if let Some(at) = d.host.disk.rot(&Path::new(STORE_DIR).join("blocks.dat"), 0) {
                        self.rotted.store(true, Ordering::Release);
                        self.core.log(format!("drive-{} rot at byte {at} of blocks.dat", d.index));
                    }
                }
                75..=80 => {
                    // Within the skew the drives allow: every two clocks differ by less.
                    let hosts: Vec<&Host> = self
                        .drives
                        .iter()
                        .map(|d| &*d.host)
                        .chain(self.clients.iter().map(|c| &**c))
                        .chain([&*self.manager.host, &*self.auth.host])
                        .collect();
                    jump_a_clock(&self.core, &hosts);
                }
                // Delay: one host's link slow for a while (its segments fall
                // behind others', so messages reorder across connections).
                81..=88 => {
                    let host = match self.core.gen_range(0..3) {
                        0 => d.host.ip,
                        1 => MANAGER_IP,
                        _ => self.clients[self.core.gen_range(0..self.clients.len() as u64) as usize].ip,
                    };
                    slow_a_link(&self.core, host).await;
                }
                // A reset: a connection of a drive (to a client or the
                // manager) or of the manager (a client's session).
                89..=94 => {
                    if self.core.chance(0.5) {
                        reset_a_connection(&self.core, d.host.ip, &format!("drive-{}", d.index));
                    } else {
                        reset_a_connection(&self.core, MANAGER_IP, "the manager");
                    }
                }
                // The authentication server loses power and comes back.
                95..=100 => {
                    self.power_off_auth();
                    tokio::time::sleep(between(&self.core, Duration::from_millis(100), Duration::from_secs(8))).await;
                    self.restart_auth().await;
                }
                // The manager cut off from a drive (both up): its sessions to
                // the drive stall until the partition heals.
                101..=107 => {
                    self.core.net.partition(MANAGER_IP, d.host.ip);
                    self.core.log(format!("partition: the manager from drive-{}", d.index));
                    tokio::time::sleep(between(&self.core, Duration::from_millis(200), Duration::from_secs(8))).await;
                    self.core.net.heal();
                    self.core.log("partitions healed");
                }
                DRIVE_GONE => {
                    gone = true;
                    d.gone.store(true, Ordering::Release);
                    self.crash_drive(d);
                    self.core.log(format!("drive-{} gone for good", d.index));
                }
                // A crash or a full disk drawn for a drive that is down.
                _ => {}
            }
        }
    }

    /// Returns once a client's `SYNC` returned after this call, or after
    /// five seconds without one.
    async fn after_the_next_sync(&self) {
        let before = *lock(&self.synced_through);
        let deadline = Instant::now() + Duration::from_secs(5);
        while *lock(&self.synced_through) == before && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Faults off; every daemon back; time for the manager to readmit the
    /// drives and roll back what was left open.
    async fn quiesce(&self) {
        self.core.net.heal();
        for host in self.drives.iter().map(|d| &d.host).chain(&self.clients).chain([&self.manager.host]) {
            self.core.net.set_slow(host.ip, Duration::ZERO);
        }
        for d in &self.drives {
            d.host.disk.set_full(false);
            self.restart_drive(d).await;
        }
        self.restart_auth().await;
        self.restart_manager().await;
        self.core.log("faults stopped");
        tokio::time::sleep(Duration::from_secs(30)).await;
    }

    /// Every name of every client reads as its model allows, and every
    /// client directory lists only names its model allows.
    async fn final_check(&self) {
        let node = Host::new(&self.core, "checker", CHECKER_IP, 1 << 20).boot();
        let fs = match self.log_in(&node).await {
            Ok(fs) => fs,
            Err(e) => {
                self.fail(format!("the checker could not log in after the faults stopped: {e}"));
                return;
            }
        };
        for c in 0..self.clients.len() {
            let models = lock(&self.models[c]).clone();
            for (path, model) in &models {
                let got = match read_patiently(&fs, path).await {
                    Ok(got) => got,
                    Err(e) if self.lost_to_rot(path, &e) => {
                        self.core.log(format!("checker read {path}: lost to rot (no redundancy): {}", short(&e)));
                        continue;
                    }
                    Err(e) if self.lost_with_the_gone_drive(&fs, path).await => {
                        self.core.log(format!("checker read {path}: lost with the drive gone for good: {}", short(&e)));
                        continue;
                    }
                    Err(e) => {
                        self.fail(format!("{path} cannot be read after the faults stopped: {e}"));
                        continue;
                    }
                };
                self.judge("checker", path, model, &got);
            }
            for (dir, _) in LAYOUTS {
                let dir = format!("/{dir}/c{c}");
                match fs.names(&dir).await {
                    Ok(names) => {
                        for (n, _) in names {
                            let path = format!("{dir}/{n}");
                            if models.get(&path).is_none_or(Maybe::surely_absent) {
                                self.fail(format!("{path} is listed, but no acknowledged history leaves it"));
                            }
                        }
                    }
                    Err(e) => self.fail(format!("{dir} cannot be listed after the faults stopped: {e}")),
                }
            }
        }
        self.core.log("final check done");
    }
}

impl Cluster {
    /// Whether `e`, reading `path`, is what rot does to a file without
    /// redundancy: every failed component's bytes failed their check, on a
    /// `stripe` file, after a disk rotted. A mirrored or Reed-Solomon file
    /// reads around rot; no file is ever read wrong.
    fn lost_to_rot(&self, path: &str, e: &FsError) -> bool {
        let FsError::Unavailable { failures, .. } = e else { return false };
        self.rotted.load(Ordering::Acquire)
            && path.starts_with("/stripe/")
            && !failures.is_empty()
            && failures.iter().all(|f| f.cause.suggests_rot())
    }

    /// The address of the drive gone for good, if one is.
    fn gone_addr(&self) -> Option<String> {
        self.drives.iter().find(|d| d.gone.load(Ordering::Acquire)).map(|d| d.addr.to_string())
    }

    /// Whether `path` cannot be read because a drive is gone for good: a
    /// component of it is still there, and its layout has no redundancy
    /// (`stripe`) or a disk rotted (one failure more than parity covers).
    async fn lost_with_the_gone_drive(&self, fs: &FsClient, path: &str) -> bool {
        let Some(gone) = self.gone_addr() else { return false };
        let Ok(info) = fs.get_layout(path).await else { return false };
        info.components.iter().any(|(_, at)| *at == gone)
            && (matches!(info.layout.scheme, Scheme::Stripe { .. }) || self.rotted.load(Ordering::Acquire))
    }

    /// What keeps a file (`info`: its layout) short of the redundancy its
    /// layout allows, if anything: a component not `Ok` on a drive still
    /// here, or a component left on the drive gone for good though the
    /// layout has redundancy to rebuild it from and the drives left can
    /// hold every component apart.
    fn short_of_redundancy(&self, info: &LayoutInfo) -> Option<String> {
        let gone = self.gone_addr();
        let on_gone = |at: &String| gone.as_ref() == Some(at);
        let here_behind = info.components.iter().any(|(c, at)| !on_gone(at) && c.state != ComponentState::Ok);
        let left_on_gone = info.components.iter().any(|(_, at)| on_gone(at));
        let drives_left = self.drives.iter().filter(|d| !d.gone.load(Ordering::Acquire)).count();
        let rebuildable = !matches!(info.layout.scheme, Scheme::Stripe { .. }) && info.components.len() <= drives_left;
        if !(here_behind || (left_on_gone && rebuildable)) {
            return None;
        }
        let states: Vec<String> = info
            .components
            .iter()
            .map(|(c, at)| format!("{:?}{}", c.state, if on_gone(at) { " (drive gone)" } else { "" }))
            .collect();
        Some(format!("[{}]", states.join(", ")))
    }

    /// Repair converges once the faults stopped: within
    /// [`REPAIR_CONVERGES_WITHIN`] of simulated time every component of
    /// every file is recorded `Ok` again — resynced where it missed writes,
    /// its drive readmitted where it was down — with no help from the
    /// checker (the manager's own repair and maintenance do it).
    async fn redundancy_check(&self) {
        let node = Host::new(&self.core, "repair-checker", CHECKER_IP, 1 << 20).boot();
        let fs = match self.log_in(&node).await {
            Ok(fs) => fs,
            Err(e) => {
                self.fail(format!("the repair checker could not log in: {e}"));
                return;
            }
        };
        let paths: Vec<String> = self.models.iter().flat_map(|m| lock(m).keys().cloned().collect::<Vec<_>>()).collect();
        let deadline = Instant::now() + REPAIR_CONVERGES_WITHIN;
        loop {
            let mut behind = Vec::new();
            for path in &paths {
                match fs.get_layout(path).await {
                    Ok(info) => {
                        if let Some(why) = self.short_of_redundancy(&info) {
                            behind.push(format!("{path} {why}"));
                        }
                    }
                    Err(e) if e.status() == Some(FsStatus::NotFound) => {}
                    Err(e) => behind.push(format!("{path}: {}", short(&e))),
                }
            }
            if behind.is_empty() {
                self.core.log("every component is current");
                return;
            }
            if Instant::now() >= deadline {
                self.fail(format!(
                    "repair did not converge within {REPAIR_CONVERGES_WITHIN:?} after the faults stopped: {}",
                    behind.join("; ")
                ));
                return;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    }
}

/// The fault draw that loses a drive for good (drawn only at the time the
/// seed chose for it; every other fault is a draw below it).
const DRIVE_GONE: u64 = 108;

/// How long after the faults stopped (and the final check) the manager
/// has to bring every component back to `Ok` (its repair pass runs every
/// maintenance interval, a second by default).
const REPAIR_CONVERGES_WITHIN: Duration = Duration::from_secs(120);

/// How long the manager waits for a drive that is down before it rebuilds
/// its components elsewhere (`rebuild_delay`).
const REBUILD_DELAY: Duration = Duration::from_secs(30);

/// Reads `path` (absent: `None`), trying again for a while on failures
/// other than absence: the cluster is coming back.
async fn read_patiently(fs: &FsClient, path: &str) -> Result<Content, FsError> {
    let mut tries = 0;
    loop {
        match fs.read_file(path).await {
            Ok(b) => return Ok(Some(b)),
            Err(e) if e.status() == Some(FsStatus::NotFound) => return Ok(None),
            Err(e) if tries >= 10 => return Err(e),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        }
    }
}

/// An error's kind for the event log: its status, or its variant (whose
/// text may name ports or carry other detail that is not the seed's).
fn short(e: &FsError) -> String {
    match e.status() {
        Some(s) => format!("{s:?}"),
        None => {
            let text = format!("{e:?}");
            text.split(['(', ' ', '{']).next().unwrap_or("error").to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_allows_old_or_new_per_chunk_and_nothing_else() {
        let old = Some(vec![1u8; 10]);
        let new = Some(vec![2u8; 10]);
        let m = Maybe::Exact(old.clone()).or(vec![new.clone()]);
        assert!(m.allows(&old, 4) && m.allows(&new, 4));
        let mut mix = vec![1u8; 10];
        mix[4..8].copy_from_slice(&[2; 4]);
        assert!(m.allows(&Some(mix.clone()), 4), "one chunk new, the others old");
        mix[3] = 2;
        assert!(!m.allows(&Some(mix), 4), "a chunk torn inside");
        assert!(!m.allows(&None, 4), "absent was never a state");
        assert!(!m.allows(&Some(vec![1u8; 9]), 4), "a size neither state has");
        assert!(!Maybe::Exact(old.clone()).allows(&new, 4));
        assert!(Maybe::Exact(None).allows(&None, 4));
        // A shorter state reads as zeros past its end inside a longer one.
        let m = Maybe::Exact(Some(vec![1u8; 4])).or(vec![Some(vec![2u8; 8])]);
        assert!(m.allows(&Some(vec![2, 2, 2, 2, 0, 0, 0, 0]), 4), "the second chunk old: zeros");
        assert!(m.allows(&Some(vec![1, 1, 1, 1, 2, 2, 2, 2]), 4));
        assert!(!m.allows(&Some(vec![1, 1, 1, 1, 9, 2, 2, 2]), 4));
    }

    #[test]
    fn written_and_resized_follow_posix() {
        assert_eq!(written(&None, 2, b"ab"), Some(vec![0, 0, b'a', b'b']));
        assert_eq!(written(&Some(b"xyz".to_vec()), 1, b"A"), Some(b"xAz".to_vec()));
        assert_eq!(resized(&Some(b"xyz".to_vec()), 1), Some(b"x".to_vec()));
        assert_eq!(resized(&Some(b"x".to_vec()), 3), Some(vec![b'x', 0, 0]));
    }
}
