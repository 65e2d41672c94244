//! A whole nasd cluster in this process, on loopback: drives with security
//! enforced (each with its own master key, temporary directory, TCP
//! listener and tokio runtime — so killing one drops its listener and every
//! connection at once, as a crashed drive would), the real manager serving
//! TLS with certificates from `nasd_manager::tls`, the drives taken into
//! service with `Manager::add_drive`, an administrator and two users, and
//! optionally a layout on the root directory (set with `SET_LAYOUT`).
//! Everything lives under one temporary directory, removed when the cluster
//! is dropped.

#![allow(dead_code)]

pub mod raw;
pub mod seeded;

use nasd_crypto::Key;
use nasd_drive::{DriveConfig, SecurityMode};
use nasd_fs::{FsClient, FsConfig, Layout};
use nasd_manager::{Manager, ManagerConfig};
use nasd_store::{Store, StoreOptions};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Longest any single step may take before the test fails (a hang, not a
/// timing assertion: every step normally takes a small fraction of it).
pub const STEP: Duration = Duration::from_secs(120);

pub const ADMIN: &str = "admin";
pub const ADMIN_PW: &str = "admin password";
pub const USER_A: &str = "alice";
pub const PW_A: &str = "alice password";
pub const UID_A: u32 = 1000;
pub const USER_B: &str = "bob";
pub const PW_B: &str = "bob password";
pub const UID_B: u32 = 1001;

/// Bytes of block storage each drive has (a sparse file).
pub const DRIVE_CAPACITY: u64 = 1 << 30;

/// Stack of the thread that drives a scenario. Unoptimized builds give a
/// long `async fn` a poll frame with a slot for every temporary of every
/// await (well over a megabyte for the tree scenario), more than the test
/// harness's 2 MiB threads have.
const SCENARIO_STACK: usize = 64 * 1024 * 1024;

/// Runs a scenario on a multi-threaded runtime of its own, from a thread
/// with a large stack; panics (fails the test) if the scenario panicked.
pub fn run<F: Future<Output = ()> + Send + 'static>(scenario: F) {
    std::thread::Builder::new()
        .name("scenario".into())
        .stack_size(SCENARIO_STACK)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(scenario);
        })
        .expect("spawn the scenario thread")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

/// Fails the test if `f` takes longer than [`STEP`].
pub async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(STEP, f).await.expect("step timed out: the manager, a drive or the client hung")
}

/// Deterministic bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5DEE_CE66_D1CE_4E5B;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// `NASD_LOG=debug cargo test -p nasd-fs` shows the daemons' logs.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NASD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// A drive served by this process, on a tokio runtime of its own: stopping
/// it ends its serve loop (with its final commit) and then shuts the runtime
/// down, which drops every connection it still had — as a drive process
/// that stops would, and unlike a serve loop that merely returns. Killing it
/// shuts the runtime down at once, as a crash would.
pub struct TestDrive {
    pub addr: SocketAddr,
    pub master: Key,
    pub dir: PathBuf,
    /// How long the drive keeps an idle connection (kept across [`TestDrive::halt`]).
    pub idle_timeout: Duration,
    /// What the drive counts (its bytes read among them).
    pub metrics: nasd_drive::DriveMetrics,
    stop: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Receiver<std::io::Result<()>>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl TestDrive {
    /// A drive with the default idle timeout (`nasd_drive::IDLE_TIMEOUT`).
    pub async fn start(dir: PathBuf) -> TestDrive {
        Self::start_with_idle_timeout(dir, nasd_drive::IDLE_TIMEOUT).await
    }

    /// A drive that closes connections idle for `idle_timeout`.
    pub async fn start_with_idle_timeout(dir: PathBuf, idle_timeout: Duration) -> TestDrive {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a drive listener");
        Self::serve(dir, listener, Key::random(), idle_timeout)
    }

    fn serve(dir: PathBuf, listener: std::net::TcpListener, master: Key, idle_timeout: Duration) -> TestDrive {
        let opts = StoreOptions { capacity_bytes: DRIVE_CAPACITY, ..Default::default() };
        let store = Arc::new(Store::open(&dir, &opts).expect("open the drive's store"));
        let metrics = nasd_drive::DriveMetrics::new();
        let config = DriveConfig {
            security: SecurityMode::Enforced { master_key: Some(master.clone()) },
            idle_timeout,
            metrics: metrics.clone(),
            ..Default::default()
        };
        let addr = listener.local_addr().expect("drive address");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the drive's runtime");
        let (stop, stopped) = oneshot::channel::<()>();
        let (done_tx, done) = oneshot::channel();
        rt.spawn(async move {
            let listener = TcpListener::from_std(listener).expect("listener");
            let r = nasd_drive::serve(listener, store, config, async {
                let _ = stopped.await;
            })
            .await;
            let _ = done_tx.send(r);
        });
        TestDrive { addr, master, dir, idle_timeout, metrics, stop: Some(stop), done: Some(done), rt: Some(rt) }
    }

    /// Stops the drive cleanly (its final commit included).
    pub async fn stop(mut self) {
        if let (Some(stop), Some(done)) = (self.stop.take(), self.done.take()) {
            let _ = stop.send(());
            to(done).await.expect("drive task").expect("drive stopped cleanly");
        }
        if let Some(rt) = self.rt.take() {
            tokio::task::spawn_blocking(move || rt.shutdown_timeout(Duration::from_secs(10)))
                .await
                .expect("shut the drive's runtime down");
        }
    }

    /// Stops the drive at once, as a crash would: its listener and every
    /// connection close, nothing more is committed.
    pub fn kill(&mut self) {
        self.stop = None;
        self.done = None;
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }

    /// Whether the drive runs (was not killed).
    pub fn running(&self) -> bool {
        self.rt.is_some()
    }

    /// Stops the drive; [`StoppedDrive::start`] serves the same store on the same address again.
    pub async fn halt(self) -> StoppedDrive {
        let (addr, master, dir, idle_timeout) = (self.addr, self.master.clone(), self.dir.clone(), self.idle_timeout);
        self.stop().await;
        StoppedDrive { addr, master, dir, idle_timeout }
    }
}

/// A drive stopped by [`TestDrive::halt`].
pub struct StoppedDrive {
    pub addr: SocketAddr,
    pub master: Key,
    pub dir: PathBuf,
    pub idle_timeout: Duration,
}

impl StoppedDrive {
    /// Serves the drive again on its old address, with its idle timeout.
    pub async fn start(self) -> TestDrive {
        let mut tries = 0;
        let listener = loop {
            match std::net::TcpListener::bind(self.addr) {
                Ok(l) => break l,
                Err(e) if tries < 100 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("rebind {}: {e}", self.addr),
            }
        };
        TestDrive::serve(self.dir, listener, self.master, self.idle_timeout)
    }

    /// Flips one byte of the physical block that holds logical block `block`
    /// of object `object` in partition `partition`: rot the drive's digest
    /// check will find.
    pub fn rot(&self, partition: u64, object: u64, block: u64) {
        use std::os::unix::fs::FileExt;
        let opts = StoreOptions { capacity_bytes: DRIVE_CAPACITY, ..Default::default() };
        let (phys, bs) = {
            let store = Store::open(&self.dir, &opts).expect("open the stopped drive's store");
            let map = store.block_map(partition, object).expect("block map");
            let (_, b) = map.iter().find(|(l, _)| *l == block).expect("the block is stored");
            (b.phys, store.block_size() as u64)
        };
        let f = std::fs::OpenOptions::new().read(true).write(true).open(self.dir.join("blocks.dat")).expect("blocks");
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, phys * bs + 17).expect("read");
        byte[0] ^= 0x40;
        f.write_all_at(&byte, phys * bs + 17).expect("write");
        f.sync_all().expect("sync");
    }
}

impl Drop for TestDrive {
    fn drop(&mut self) {
        // Never drop a runtime inside asynchronous code.
        self.kill();
    }
}

/// How to build a cluster.
pub struct ClusterOptions {
    pub config: ManagerConfig,
    pub drives: usize,
    /// Run `spawn_maintenance` (else tests call `Manager::maintain` themselves).
    pub maintenance: bool,
    /// The root directory's layout (set with `SET_LAYOUT` by the
    /// administrator once the cluster runs), which new files take.
    pub root_layout: Option<Layout>,
    /// How long the drives keep an idle connection.
    pub drive_idle_timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            // A small pool keeps start-up quick. Every byte on the drives (no small-file
            // path): these tests check what the drives hold and the capabilities that guard
            // it; small files have their own tests (`small.rs`) with an explicit threshold.
            // Everything else is the default policy.
            config: ManagerConfig { pool_target: 8, small_file_threshold: 0, ..ManagerConfig::default() },
            drives: 4,
            maintenance: false,
            root_layout: None,
            drive_idle_timeout: nasd_drive::IDLE_TIMEOUT,
        }
    }
}

/// A running cluster.
pub struct Cluster {
    pub manager: Arc<Manager>,
    pub addr: SocketAddr,
    pub ca: PathBuf,
    pub drives: Vec<TestDrive>,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<()>,
    maintenance: Option<JoinHandle<()>>,
    dir: tempfile::TempDir,
}

impl Cluster {
    pub async fn start(opts: ClusterOptions) -> Cluster {
        init_logging();
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut drives = Vec::new();
        for i in 0..opts.drives {
            let drive_dir = dir.path().join(format!("drive-{i}"));
            drives.push(TestDrive::start_with_idle_timeout(drive_dir, opts.drive_idle_timeout).await);
        }

        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let files = nasd_manager::tls::ensure_certificates(&dir.path().join("tls"), &names).expect("certificates");
        let acceptor = nasd_manager::tls::acceptor(&files).expect("TLS acceptor");
        let manager = Manager::open(&dir.path().join("manager"), opts.config).expect("open the manager");
        to(manager.recover()).await;
        for d in &drives {
            to(manager.add_drive(&d.addr.to_string(), &d.master)).await.expect("add a drive");
        }
        assert!(to(manager.bootstrap_admin(ADMIN, ADMIN_PW)).await.expect("bootstrap the administrator"));

        let (shutdown, shutdown_rx) = watch::channel(false);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the manager listener");
        let addr = listener.local_addr().expect("manager address");
        let server = tokio::spawn(manager.clone().serve(listener, acceptor, shutdown_rx.clone()));
        let maintenance = opts.maintenance.then(|| manager.spawn_maintenance(shutdown_rx));

        let cluster = Cluster { manager, addr, ca: files.ca, drives, shutdown, server, maintenance, dir };
        if cluster.manager.config().auth.is_some() {
            // Linked to an authentication server, the manager takes no passwords: its records of
            // A and B (where gateway grants live) go straight in; they log in by identity.
            assert!(opts.root_layout.is_none(), "a root layout needs the administrator's identity: set it in the test");
            to(cluster.manager.add_user(USER_A, PW_A, UID_A, UID_A, false)).await.expect("add user A");
            to(cluster.manager.add_user(USER_B, PW_B, UID_B, UID_B, false)).await.expect("add user B");
            return cluster;
        }
        // Users: A over the wire as the administrator would, B straight through the manager.
        let admin = cluster.login(ADMIN, ADMIN_PW).await;
        to(admin.add_user(USER_A, PW_A, UID_A, UID_A, false)).await.expect("add user A");
        to(cluster.manager.add_user(USER_B, PW_B, UID_B, UID_B, false)).await.expect("add user B");
        if let Some(layout) = opts.root_layout {
            to(admin.set_layout("/", Some(layout))).await.expect("set the root directory's layout");
        }
        cluster
    }

    /// A client configuration for `user`.
    pub fn fs_config(&self, user: &str, password: &str) -> FsConfig {
        FsConfig {
            manager: self.addr.to_string(),
            server_name: "localhost".into(),
            ca_cert: self.ca.clone(),
            user: user.into(),
            password: password.into(),
            ..Default::default()
        }
    }

    /// A logged-in client.
    pub async fn login(&self, user: &str, password: &str) -> FsClient {
        to(FsClient::connect(&self.fs_config(user, password))).await.expect("log in")
    }

    /// Stops the manager (its listener and maintenance) and opens it again
    /// on the same directory with `config`, as a restart of its process
    /// would: what it kept in memory alone is gone, its database and key
    /// stay. It listens on a new address; the drives keep running.
    #[allow(dead_code)] // not every test target restarts its manager
    pub async fn restart_manager(&mut self, config: ManagerConfig, maintenance: bool) {
        let _ = self.shutdown.send(true);
        to(&mut self.server).await.expect("manager task");
        if let Some(m) = self.maintenance.take() {
            to(m).await.expect("maintenance task");
        }
        let files = nasd_manager::tls::ensure_certificates(&self.dir().join("tls"), &["localhost".to_string()])
            .expect("certificates");
        let acceptor = nasd_manager::tls::acceptor(&files).expect("TLS acceptor");
        self.manager = Manager::open(&self.dir().join("manager"), config).expect("open the manager again");
        to(self.manager.recover()).await;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the manager listener");
        self.addr = listener.local_addr().expect("manager address");
        self.server = tokio::spawn(self.manager.clone().serve(listener, acceptor, shutdown_rx.clone()));
        self.maintenance = maintenance.then(|| self.manager.spawn_maintenance(shutdown_rx));
        self.shutdown = shutdown;
    }

    /// Stops the manager as [`Cluster::restart_manager`] does (its listener,
    /// every session and its maintenance end) without starting it again:
    /// clients find nothing at its address until [`Cluster::resume_manager`].
    #[allow(dead_code)] // not every test target stops its manager
    pub async fn halt_manager(&mut self) {
        let _ = self.shutdown.send(true);
        to(&mut self.server).await.expect("manager task");
        // A finished task in its place, so a later stop or restart has one to wait for.
        self.server = tokio::spawn(async {});
        if let Some(m) = self.maintenance.take() {
            to(m).await.expect("maintenance task");
        }
    }

    /// Opens the manager halted by [`Cluster::halt_manager`] again on its
    /// directory, with `config`, and serves it on its old address.
    #[allow(dead_code)]
    pub async fn resume_manager(&mut self, config: ManagerConfig, maintenance: bool) {
        let files = nasd_manager::tls::ensure_certificates(&self.dir().join("tls"), &["localhost".to_string()])
            .expect("certificates");
        let acceptor = nasd_manager::tls::acceptor(&files).expect("TLS acceptor");
        self.manager = Manager::open(&self.dir().join("manager"), config).expect("open the manager again");
        to(self.manager.recover()).await;
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 100 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("rebind the manager at {}: {e}", self.addr),
            }
        };
        let (shutdown, shutdown_rx) = watch::channel(false);
        self.server = tokio::spawn(self.manager.clone().serve(listener, acceptor, shutdown_rx.clone()));
        self.maintenance = maintenance.then(|| self.manager.spawn_maintenance(shutdown_rx));
        self.shutdown = shutdown;
    }

    /// The data directory (removed on drop).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Stops the manager, its maintenance and the drives; removes the directory.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        to(self.server).await.expect("manager task");
        if let Some(m) = self.maintenance {
            to(m).await.expect("maintenance task");
        }
        for d in self.drives {
            if d.running() {
                d.stop().await;
            }
        }
        drop(self.manager);
        drop(self.dir);
    }
}

/// Another manager of a cluster, on the same metadata (a PostgreSQL
/// database) and drives: its own directory holding a copy of the first
/// manager's key (`manager.key`: the drive keys in the database are sealed
/// with it, and file handles derive from it), its own listener and
/// maintenance.
pub struct OtherManager {
    pub manager: Arc<Manager>,
    pub addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<()>,
    maintenance: Option<JoinHandle<()>>,
}

impl Cluster {
    /// Starts another manager on this cluster's metadata (`config.metadata`
    /// must name the first manager's database) in `DIR/NAME`.
    pub async fn start_other_manager(&self, name: &str, config: ManagerConfig, maintenance: bool) -> OtherManager {
        let dir = self.dir().join(name);
        std::fs::create_dir_all(&dir).expect("the other manager's directory");
        std::fs::copy(self.dir().join("manager").join(nasd_manager::KEK_FILE), dir.join(nasd_manager::KEK_FILE))
            .expect("copy the manager key");
        let files = nasd_manager::tls::ensure_certificates(&self.dir().join("tls"), &["localhost".to_string()])
            .expect("certificates");
        let acceptor = nasd_manager::tls::acceptor(&files).expect("TLS acceptor");
        let manager = Manager::open(&dir, config).expect("open the other manager");
        to(manager.recover()).await;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the other manager's listener");
        let addr = listener.local_addr().expect("manager address");
        let server = tokio::spawn(manager.clone().serve(listener, acceptor, shutdown_rx.clone()));
        let maintenance = maintenance.then(|| manager.spawn_maintenance(shutdown_rx));
        OtherManager { manager, addr, shutdown, server, maintenance }
    }

    /// A logged-in client of the manager at `addr`.
    pub async fn login_at(&self, addr: SocketAddr, user: &str, password: &str) -> FsClient {
        let config = FsConfig { manager: addr.to_string(), ..self.fs_config(user, password) };
        to(FsClient::connect(&config)).await.expect("log in")
    }
}

impl OtherManager {
    /// Stops the manager and its maintenance.
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        to(self.server).await.expect("manager task");
        if let Some(m) = self.maintenance {
            to(m).await.expect("maintenance task");
        }
    }
}

/// A TCP relay in front of a drive (or the manager), for faults the daemon
/// itself never makes: cutting every connection, holding requests back (on
/// every connection, or on one), holding replies back past some bytes,
/// altering one byte of a request or of a reply (on every connection, or on
/// one). Take the drive into service at [`Proxy::addr`] and the manager and
/// every client reach it through the relay.
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<ProxyState>,
    accept: JoinHandle<()>,
}

struct ProxyState {
    target: SocketAddr,
    /// While set, connections are closed as soon as they are accepted.
    cut: std::sync::atomic::AtomicBool,
    /// Bumped to end every live connection.
    kill: watch::Sender<u64>,
    /// Which connections' bytes towards the daemon are held back.
    paused: watch::Sender<Hold>,
    /// Connections accepted so far (each numbered in order from 0).
    accepted: std::sync::atomic::AtomicUsize,
    /// Bytes towards the drive read while paused and not yet passed on.
    held: std::sync::atomic::AtomicUsize,
    /// Bytes of drive replies (all connections together) still to pass
    /// before the one to flip; `None`: nothing to alter.
    tamper: std::sync::Mutex<Option<usize>>,
    /// Like `tamper`, on one connection only: its index (in accept order)
    /// and its reply bytes still to pass before the one to flip.
    tamper_on: std::sync::Mutex<Option<(usize, usize)>>,
    /// Like `tamper`, for bytes towards the drive (requests and their data).
    tamper_requests: std::sync::Mutex<Option<usize>>,
    /// Bytes of replies (all connections together) still to pass before the
    /// rest is held back, connections left open; `None`: nothing held.
    hold_after: std::sync::Mutex<Option<usize>>,
    /// Bumped when replies are let through again.
    released: watch::Sender<u64>,
    /// Each connection's bytes towards the daemon, by accept order, when
    /// the relay records ([`Proxy::recording`]).
    sent: Option<std::sync::Mutex<std::collections::BTreeMap<usize, Vec<u8>>>>,
}

/// Flips bit 0 of the byte `at` bytes into the stream from now on, if it is
/// in `buf` (the next `buf.len()` bytes); counts `buf` off otherwise.
fn flip_armed_byte(armed: &std::sync::Mutex<Option<usize>>, buf: &mut [u8]) {
    let mut armed = armed.lock().unwrap();
    match *armed {
        Some(at) if at < buf.len() => {
            buf[at] ^= 0x01;
            *armed = None;
        }
        Some(at) => *armed = Some(at - buf.len()),
        None => {}
    }
}

impl ProxyState {
    /// How many of `len` reply bytes may pass now (taking them from the allowance).
    fn passable(&self, len: usize) -> usize {
        let mut hold = self.hold_after.lock().unwrap();
        match *hold {
            None => len,
            Some(left) => {
                let pass = left.min(len);
                *hold = Some(left - pass);
                pass
            }
        }
    }
}

/// The whole request frames at the start of `stream` (bytes a client sent a
/// drive on one connection).
fn split_frames(mut stream: &[u8]) -> Vec<Vec<u8>> {
    use nasd_proto::limits::HEADER_LEN;
    let mut frames = Vec::new();
    while stream.len() >= HEADER_LEN {
        let header = nasd_proto::FrameHeader::decode(stream[..HEADER_LEN].try_into().expect("a header"))
            .expect("a client sends well-formed headers");
        let tags = header.chunk_count() as usize * header.protection.data_tag_len();
        let len = HEADER_LEN + header.body_len() + header.data_len as usize + tags;
        if stream.len() < len {
            break;
        }
        frames.push(stream[..len].to_vec());
        stream = &stream[len..];
    }
    frames
}

/// What a [`Proxy`] holds back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Hold {
    all: bool,
    /// One connection, by the order it was accepted in.
    conn: Option<usize>,
}

impl Hold {
    fn holds(&self, conn: usize) -> bool {
        self.all || self.conn == Some(conn)
    }
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        Self::start_with(target, false).await
    }

    /// A relay that also keeps every byte sent towards the daemon, as a man
    /// in the middle would capture it ([`Proxy::request_frames`]).
    pub async fn recording(target: SocketAddr) -> Proxy {
        Self::start_with(target, true).await
    }

    async fn start_with(target: SocketAddr, record: bool) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a proxy listener");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(ProxyState {
            target,
            cut: Default::default(),
            kill: watch::channel(0).0,
            paused: watch::channel(Hold::default()).0,
            accepted: Default::default(),
            held: Default::default(),
            tamper: Default::default(),
            tamper_on: Default::default(),
            tamper_requests: Default::default(),
            hold_after: Default::default(),
            released: watch::channel(0).0,
            sent: record.then(Default::default),
        });
        let s = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if s.cut.load(std::sync::atomic::Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let index = s.accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let s = s.clone();
                tokio::spawn(async move {
                    let Ok(drive) = tokio::net::TcpStream::connect(s.target).await else { return };
                    let _ = client.set_nodelay(true);
                    let _ = drive.set_nodelay(true);
                    let (client_rd, client_wr) = client.into_split();
                    let (drive_rd, drive_wr) = drive.into_split();
                    let mut kill = s.kill.subscribe();
                    tokio::select! {
                        _ = Self::upstream(&s, index, client_rd, drive_wr) => {}
                        _ = Self::downstream(&s, index, drive_rd, client_wr) => {}
                        _ = kill.changed() => {}
                    }
                });
            }
        });
        Proxy { addr, state, accept }
    }

    /// Client to daemon, held back while paused.
    async fn upstream(
        s: &ProxyState,
        index: usize,
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
    ) {
        use std::sync::atomic::Ordering::SeqCst;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 64 * 1024];
        let mut paused = s.paused.subscribe();
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if paused.borrow_and_update().holds(index) {
                s.held.fetch_add(n, SeqCst);
                while paused.borrow_and_update().holds(index) {
                    if paused.changed().await.is_err() {
                        return;
                    }
                }
                s.held.fetch_sub(n, SeqCst);
            }
            flip_armed_byte(&s.tamper_requests, &mut buf[..n]);
            if let Some(sent) = &s.sent {
                sent.lock().unwrap().entry(index).or_default().extend_from_slice(&buf[..n]);
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    /// Drive to client, with at most one byte flipped when armed (for every
    /// connection, or for this one), and held back past the allowance of
    /// [`Proxy::hold_replies_after`].
    async fn downstream(
        s: &ProxyState,
        index: usize,
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 64 * 1024];
        let mut released = s.released.subscribe();
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            flip_armed_byte(&s.tamper, &mut buf[..n]);
            {
                let mut on = s.tamper_on.lock().unwrap();
                match *on {
                    Some((conn, at)) if conn == index && at < n => {
                        buf[at] ^= 0x01;
                        *on = None;
                    }
                    Some((conn, at)) if conn == index => *on = Some((conn, at - n)),
                    _ => {}
                }
            }
            let mut pending = &buf[..n];
            while !pending.is_empty() {
                let pass = s.passable(pending.len());
                if pass == 0 {
                    if released.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                if to.write_all(&pending[..pass]).await.is_err() {
                    return;
                }
                pending = &pending[pass..];
            }
        }
    }

    /// Cuts the drive off: ends every connection and closes new ones at
    /// once until [`Proxy::reconnect`].
    pub fn cut(&self) {
        self.state.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        self.state.kill.send_modify(|g| *g += 1);
    }

    /// Lets connections through again.
    pub fn reconnect(&self) {
        self.state.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Holds back (`true`) or releases (`false`) everything sent to the drive.
    pub fn pause(&self, paused: bool) {
        self.state.paused.send_modify(|h| h.all = paused);
    }

    /// Holds back what is sent on connection `index` only (in the order
    /// connections were accepted, from 0), or on none.
    pub fn pause_connection(&self, index: Option<usize>) {
        self.state.paused.send_modify(|h| h.conn = index);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Bytes sent towards the drive and held back by [`Proxy::pause`].
    pub fn held(&self) -> usize {
        self.state.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Flips one bit of the byte `at` bytes into what clients send the drive
    /// from now on (counting every connection).
    pub fn tamper_request_at(&self, at: usize) {
        *self.state.tamper_requests.lock().unwrap() = Some(at);
    }

    /// Lets `bytes` more bytes of replies through (counting every
    /// connection), then holds the rest back, connections left open: a
    /// reply cut short by a peer that stopped.
    pub fn hold_replies_after(&self, bytes: usize) {
        *self.state.hold_after.lock().unwrap() = Some(bytes);
    }

    /// Lets held replies through again.
    pub fn release_replies(&self) {
        *self.state.hold_after.lock().unwrap() = None;
        self.state.released.send_modify(|g| *g += 1);
    }

    /// Every whole request frame a [`Proxy::recording`] relay has passed to
    /// a drive so far, exactly as sent (header, capability, arguments,
    /// digest, data chunks and their tags), each connection's in order; a
    /// frame still being sent is left out.
    pub fn request_frames(&self) -> Vec<Vec<u8>> {
        let sent = self.state.sent.as_ref().expect("a recording relay").lock().unwrap();
        sent.values().flat_map(|stream| split_frames(stream)).collect()
    }

    /// Flips one bit of the byte `at` bytes into the drive's replies from
    /// now on (counting every connection).
    pub fn tamper_at(&self, at: usize) {
        *self.state.tamper.lock().unwrap() = Some(at);
    }

    /// Flips one bit of the byte `at` bytes into the replies on connection
    /// `index` (in accept order, from 0; [`Proxy::accepted`] is the next
    /// one's) from now on — from its start, for a connection not yet made.
    pub fn tamper_reply_on(&self, index: usize, at: usize) {
        *self.state.tamper_on.lock().unwrap() = Some((index, at));
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.state.kill.send_modify(|g| *g += 1);
    }
}
