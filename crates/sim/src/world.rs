//! The simulated world: one seed, one clock, one network, and nodes that
//! each see it through their own [`nasd_env::Env`].

use crate::baton::{self, Baton};
use crate::disk::{Disk, NodeDisk};
use crate::net::{Latency, Net};
use nasd_env::{BoxFuture, Bug, Env, Listener, Stream, World};
use rand::{Rng, RngCore, SeedableRng};
use std::collections::BTreeSet;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The wall clock at the start of every run: 2030-01-01T00:00:00Z.
pub const WALL_EPOCH_NS: u64 = 1_893_456_000 * 1_000_000_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().expect("simulated world mutex poisoned")
}

/// What a run found and did: its failures (each also in the event log),
/// the operations its clients started and the faults it injected.
#[derive(Default)]
pub struct Tally {
    failures: Mutex<Vec<String>>,
    requests: std::sync::atomic::AtomicU64,
    faults: std::sync::atomic::AtomicU64,
}

impl Tally {
    /// A property broke: logged in `core`'s event log, and the run fails.
    pub fn fail(&self, core: &Core, what: String) {
        core.log(format!("FAILED {what}"));
        lock(&self.failures).push(what);
    }

    /// The failures so far.
    pub fn failures(&self) -> Vec<String> {
        lock(&self.failures).clone()
    }

    /// One more operation started by a client.
    pub fn request(&self) {
        self.requests.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// One more fault injected.
    pub fn fault(&self) {
        self.faults.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Operations started and faults injected.
    pub fn counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.requests.load(Relaxed), self.faults.load(Relaxed))
    }
}

/// The event log: every line is hashed (BLAKE3), and the last
/// [`EventLog::TAIL_MAX`] kept to print when a run fails.
pub struct EventLog {
    hasher: blake3::Hasher,
    tail: std::collections::VecDeque<String>,
    lines: u64,
    /// Print every line as it is logged.
    pub echo: bool,
}

impl EventLog {
    /// Lines kept for a failure report.
    pub const TAIL_MAX: usize = 200;

    fn new(echo: bool) -> Self {
        EventLog { hasher: blake3::Hasher::new(), tail: Default::default(), lines: 0, echo }
    }

    fn push(&mut self, line: String) {
        self.hasher.update(line.as_bytes());
        self.hasher.update(b"\n");
        self.lines += 1;
        if self.echo {
            eprintln!("{line}");
        }
        if self.tail.len() == Self::TAIL_MAX {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    /// The hash of every line so far.
    pub fn hash(&self) -> String {
        self.hasher.finalize().to_hex().to_string()
    }

    /// Lines logged so far.
    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// The last lines.
    pub fn tail(&self) -> impl Iterator<Item = &String> {
        self.tail.iter()
    }
}

/// What every node of a world shares.
pub struct Core {
    /// The run's seed.
    pub seed: u64,
    /// Every decision of the run is drawn from here.
    pub rng: Arc<Mutex<rand::rngs::StdRng>>,
    /// The network.
    pub net: Arc<Net>,
    log: Mutex<EventLog>,
    start: tokio::time::Instant,
    bugs: BTreeSet<Bug>,
}

impl Core {
    /// A world for `seed`, started now (call inside the simulation's runtime).
    pub fn new(seed: u64, latency: Latency, bugs: BTreeSet<Bug>, echo: bool) -> Arc<Core> {
        let rng = Arc::new(Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)));
        Arc::new(Core {
            seed,
            net: Net::new(latency, rng.clone()),
            rng,
            log: Mutex::new(EventLog::new(echo)),
            start: tokio::time::Instant::now(),
            bugs,
        })
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        tokio::time::Instant::now() - self.start
    }

    /// Logs one event, stamped with the simulated time.
    pub fn log(&self, line: impl AsRef<str>) {
        let t = self.elapsed();
        lock(&self.log).push(format!("{:>6}.{:06} {}", t.as_secs(), t.subsec_micros(), line.as_ref()));
    }

    /// The event log.
    pub fn event_log(&self) -> MutexGuard<'_, EventLog> {
        lock(&self.log)
    }

    /// A draw from the run's generator.
    pub fn gen_range(&self, range: std::ops::Range<u64>) -> u64 {
        lock(&self.rng).gen_range(range)
    }

    /// True with probability `p`.
    pub fn chance(&self, p: f64) -> bool {
        lock(&self.rng).gen_bool(p)
    }

    /// Random bytes.
    pub fn bytes(&self, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        lock(&self.rng).fill_bytes(&mut v);
        v
    }
}

/// A node's lasting identity: its address, disk and clock survive restarts.
pub struct Host {
    /// The node's name.
    pub name: String,
    /// Its address.
    pub ip: IpAddr,
    /// Its disk.
    pub disk: Arc<Disk>,
    /// Its clock's offset from true time, ns.
    pub clock_offset_ns: AtomicI64,
    core: Arc<Core>,
}

impl Host {
    /// A host `name` at `ip` with a disk of `disk_bytes`.
    pub fn new(core: &Arc<Core>, name: &str, ip: IpAddr, disk_bytes: u64) -> Arc<Host> {
        Arc::new(Host {
            name: name.to_string(),
            ip,
            disk: Disk::new(name, disk_bytes, core.rng.clone()),
            clock_offset_ns: AtomicI64::new(0),
            core: core.clone(),
        })
    }

    /// Starts an incarnation of the host: a node with no task yet.
    pub fn boot(self: &Arc<Self>) -> Arc<Node> {
        Arc::new(Node {
            host: self.clone(),
            alive: AtomicBool::new(true),
            tasks: Mutex::new(Vec::new()),
            batons: Mutex::new(Vec::new()),
            disk: NodeDisk(self.disk.clone()),
        })
    }

    /// The host's wall clock.
    pub fn now_ns(&self) -> u64 {
        let true_ns = WALL_EPOCH_NS as i128 + self.core.elapsed().as_nanos() as i128;
        (true_ns + self.clock_offset_ns.load(Ordering::Relaxed) as i128).clamp(0, u64::MAX as i128) as u64
    }
}

/// One incarnation of a host: its tasks and blocking tasks, which a crash ends.
pub struct Node {
    /// The host it runs on.
    pub host: Arc<Host>,
    alive: AtomicBool,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    batons: Mutex<Vec<Arc<Baton>>>,
    disk: NodeDisk,
}

impl Node {
    /// The node's environment.
    pub fn env(self: &Arc<Self>) -> Env {
        Env::simulated(self.clone())
    }

    /// Kills the incarnation as `kill -9` would: its disk loses what it had
    /// not synced (or keeps it, or tears it), its connections are reset, its
    /// tasks end and its blocking tasks unwind. Returns what the disk did.
    pub fn crash(&self) -> Vec<String> {
        self.alive.store(false, Ordering::Release);
        let lost = self.host.disk.crash();
        self.end_tasks();
        lost
    }

    /// Kills the process alone, as `kill -9` does on a machine that stays
    /// up: its connections are reset and its tasks end, and its disk keeps
    /// every write, synced or not (the page cache outlives the process).
    pub fn kill(&self) {
        self.alive.store(false, Ordering::Release);
        self.host.disk.process_died();
        self.end_tasks();
    }

    fn end_tasks(&self) {
        self.host.core.net.crash_host(self.host.ip);
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        let batons: Vec<_> = lock(&self.batons).drain(..).collect();
        for b in batons {
            b.kill();
        }
    }

    /// True until crashed.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
}

impl World for Node {
    fn name(&self) -> &str {
        &self.host.name
    }

    fn now_ns(&self) -> u64 {
        self.host.now_ns()
    }

    fn fill_random(&self, buf: &mut [u8]) {
        lock(&self.host.core.rng).fill_bytes(buf);
    }

    fn track(&self, task: tokio::task::AbortHandle) {
        if !self.is_alive() {
            task.abort();
            return;
        }
        let mut tasks = lock(&self.tasks);
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    fn run_blocking(&self, f: Box<dyn FnOnce() + Send>) -> BoxFuture<()> {
        let (b, proxy) = baton::spawn(f, tokio::runtime::Handle::current());
        if !self.is_alive() {
            b.kill();
        }
        let mut batons = lock(&self.batons);
        batons.retain(|b| !b.is_done());
        batons.push(b);
        Box::pin(proxy)
    }

    fn block_on(&self, fut: Pin<&mut dyn Future<Output = ()>>) {
        baton::block_on(fut)
    }

    fn connect(&self, addr: SocketAddr) -> BoxFuture<io::Result<Stream>> {
        let (net, ip, alive) = (self.host.core.net.clone(), self.host.ip, self.is_alive());
        Box::pin(async move {
            if !alive {
                return Err(io::Error::other("the simulated node crashed"));
            }
            net.connect(ip, addr).await
        })
    }

    fn bind(&self, addr: SocketAddr) -> io::Result<Listener> {
        if !self.is_alive() {
            return Err(io::Error::other("the simulated node crashed"));
        }
        self.host.core.net.bind(self.host.ip, addr)
    }

    fn disk(&self) -> &dyn nasd_env::disk::SimDisk {
        &self.disk
    }

    fn injected_bug(&self, bug: Bug) -> bool {
        self.host.core.bugs.contains(&bug)
    }
}

/// Each host's clock is off true time by at most this much, so two clocks
/// differ by at most twice it — within the drives' nonce skew
/// (`nasd_store::DEFAULT_SKEW_NS`, 5 s).
pub const CLOCK_OFFSET_MAX: Duration = Duration::from_millis(2400);
const _: () = assert!(2 * CLOCK_OFFSET_MAX.as_nanos() < nasd_store::DEFAULT_SKEW_NS as u128);

/// A fault: one of `hosts`, drawn, has its clock jump to an offset drawn
/// within [`CLOCK_OFFSET_MAX`] of true time (logged).
pub fn jump_a_clock(core: &Core, hosts: &[&Host]) {
    let h = hosts[core.gen_range(0..hosts.len() as u64) as usize];
    let span = CLOCK_OFFSET_MAX.as_nanos() as u64;
    let offset = core.gen_range(0..2 * span + 1) as i64 - span as i64;
    h.clock_offset_ns.store(offset, Ordering::Relaxed);
    core.log(format!("{} clock jumps to offset {offset} ns", h.name));
}

/// A fault: every segment to or from `host` takes an
/// extra delay drawn from the seed for a while drawn from the seed, then
/// the link is back to speed. Segments of its connections fall behind
/// those of others: messages reorder across connections.
pub async fn slow_a_link(core: &Core, host: IpAddr) {
    let extra = between(core, Duration::from_millis(20), Duration::from_millis(800));
    core.net.set_slow(host, extra);
    core.log(format!("{host} slow by {extra:?}"));
    tokio::time::sleep(between(core, Duration::from_secs(1), Duration::from_secs(10))).await;
    core.net.set_slow(host, Duration::ZERO);
    core.log(format!("{host} back to speed"));
}

/// A fault: one live connection of `host` (`name` in the log), drawn, is
/// reset (both ends fail at once, whatever was in flight lost).
pub fn reset_a_connection(core: &Core, host: IpAddr, name: &str) {
    let pick = core.gen_range(0..1024) as usize;
    let reset = core.net.reset_one(host, pick);
    core.log(format!("reset a connection of {name}: {reset}"));
}

/// A value drawn uniformly in `lo..=hi` of durations.
pub fn between(core: &Core, lo: Duration, hi: Duration) -> Duration {
    let span = (hi - lo).as_nanos() as u64;
    lo + Duration::from_nanos(if span == 0 { 0 } else { core.gen_range(0..span + 1) })
}
