//! nasd's deterministic simulator.
//!
//! One seed decides a whole run: several secured drives (the real
//! `nasd_drive::serve` over the real `nasd_store::Store`), an administrator
//! that provisions them and mints capabilities, and several clients (the real
//! `nasd_client::DriveClient`), all in one process on one thread, on
//! simulated time, through [`nasd_env::Env`]s that hand the clock, the
//! randomness, the network and the disk to this crate's [`world`]. Faults —
//! crashes that lose what was not synced, torn writes, rot, a full disk,
//! failed syncs, partitions, slow links, resets, clock jumps within the
//! configured skew, replayed traffic, a drive gone for good, a manager's
//! power loss (half of them soon after a client's `SYNC`) — come from the
//! same seed, and checkers ([`drives`], [`cluster`], [`model`]) judge every
//! reply. The whole-cluster world ([`cluster`]) adds the real
//! authentication server and file manager, each on SQLite on its simulated
//! disk, with clients that log in at the one and work on files through the
//! other. Revocations race requests in flight from the seed too: access
//! control versions bumped and working keys rotated under the clients
//! ([`drives`]); chmod, ACL changes and the manager's working-key
//! rotations under a holder of an older capability, and shared identity
//! keys retired at the authentication server under a holder of an identity
//! session ([`cluster`]'s revocation races): once a revocation returned, no
//! request sent after it under the older capability or key is served.
//!
//! [`run`] plays one seed and returns a [`Report`]; a failing report says
//! how to replay it ([`Report::replay_command`]); the event log's hash is
//! the run's fingerprint: the same seed gives the same hash.
//!
//! # Design
//!
//! - **Time and scheduling.** One current-thread tokio runtime with paused
//!   time: idle time is skipped, so a simulated hour takes seconds. Every
//!   decision of the run — delays, faults, workload, crash outcomes — is
//!   drawn from one seeded generator ([`world`]).
//! - **Blocking work** (`Env::spawn_blocking`: the store's tasks) runs on
//!   threads that take turns with the runtime's thread, one at a time
//!   ([`baton`]), handing over only where a blocking task waits for the
//!   runtime (`Env::recv_blocking`, `Env::send_blocking`) — where, by the
//!   store's invariant, it holds no lock — so the interleaving is the seed's.
//! - **Network** ([`net`]): per-connection FIFO with per-segment delay, so
//!   messages of different connections reorder; partitions hold traffic
//!   until they heal; resets; a crashed node's connections reset.
//! - **Disk** ([`disk`]): per node, each file's synced bytes kept apart from
//!   its unsynced changes (writes, length changes, punched holes). A crash
//!   keeps any subset of the unsynced writes, tears some at sector
//!   boundaries and loses the rest — what `fsync`'s contract allows — and a
//!   name is kept only if its directory was synced. SQLite runs on it
//!   through a VFS ([`sqlite`]).
//! - **Crash and restart.** A crash aborts every task the node spawned
//!   (`World::track`) and unwinds its blocking tasks at their next
//!   hand-over, then the node's disk loses what was not synced; a restart
//!   opens the store and the drive again on what survived.
//! - **Event log.** Requests, replies, faults and checks, stamped with
//!   simulated time; its BLAKE3 hash is the run's fingerprint
//!   (`tests/determinism.rs`: the same seed gives the same hash).
//!
//! # Running it
//!
//! `cargo test -p nasd-sim` plays 16 fixed seeds, the regression seeds, the
//! determinism test and the deliberate bugs (`--bug NAME`: each is caught
//! within the fixed seeds, `tests/injected_bugs.rs`); `nasd-sim --seeds N --from F`
//! (or the ignored `many_seeds` test) plays thousands. A failure prints the
//! command that replays it: `nasd-sim --seed S … --log` writes the whole
//! event log.
//!
//! ```no_run
//! let report = nasd_sim::run(7, &nasd_sim::Config::default());
//! assert!(report.passed(), "{}", report.summary());
//! ```
#![deny(missing_docs)]

pub mod baton;
pub mod cluster;
pub mod disk;
pub mod drives;
pub mod model;
pub mod net;
pub mod sqlite;
pub mod world;

use nasd_env::Bug;
use std::collections::BTreeSet;
use std::time::Duration;

/// What a run simulates.
#[derive(Debug, Clone)]
pub struct Config {
    /// Drives.
    pub drives: usize,
    /// Clients.
    pub clients: usize,
    /// Objects each client owns (spread over the drives).
    pub objects_per_client: usize,
    /// Simulated time the workload runs.
    pub duration: Duration,
    /// Whether faults are injected.
    pub faults: bool,
    /// Whether a drive may be lost for good.
    pub drive_loss: bool,
    /// Deliberate bugs armed in every node.
    pub bugs: BTreeSet<Bug>,
    /// Print the event log as it is written.
    pub echo: bool,
    /// The whole cluster ([`cluster`]: the manager, drives, file-system
    /// clients) instead of drives and direct clients ([`drives`]).
    pub cluster: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            drives: 3,
            clients: 3,
            objects_per_client: 3,
            duration: Duration::from_secs(120),
            faults: true,
            drive_loss: true,
            bugs: BTreeSet::new(),
            echo: false,
            cluster: false,
        }
    }
}

/// How a run went.
#[derive(Debug, Clone)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The bugs that were armed.
    pub bugs: BTreeSet<Bug>,
    /// What was simulated.
    pub config: Config,
    /// BLAKE3 of the event log.
    pub hash: String,
    /// Lines in the event log.
    pub events: u64,
    /// Simulated time the run covered.
    pub simulated: Duration,
    /// Requests the clients sent.
    pub requests: u64,
    /// Faults injected.
    pub faults: u64,
    /// Properties that broke.
    pub failures: Vec<String>,
    /// The last lines of the event log.
    pub tail: Vec<String>,
}

/// The command-line name of a bug (`--bug NAME`).
pub fn bug_name(bug: Bug) -> &'static str {
    match bug {
        Bug::SkipBlockSync => "skip-block-sync",
        Bug::AcceptStaleAcv => "accept-stale-acv",
        Bug::SkipRebuild => "skip-rebuild",
        Bug::SkipMetadataSync => "skip-metadata-sync",
        Bug::SkipRevocation => "skip-revocation",
        Bug::KeepRetiredWorkingKey => "keep-retired-working-key",
        Bug::SkipIdentityKeySync => "skip-identity-key-sync",
        _ => "unknown",
    }
}

/// The bug named `name` (`--bug NAME`).
pub fn bug_by_name(name: &str) -> Option<Bug> {
    [
        Bug::SkipBlockSync,
        Bug::AcceptStaleAcv,
        Bug::SkipRebuild,
        Bug::SkipMetadataSync,
        Bug::SkipRevocation,
        Bug::KeepRetiredWorkingKey,
        Bug::SkipIdentityKeySync,
    ]
    .into_iter()
    .find(|b| bug_name(*b) == name)
}

impl Report {
    /// True if no property broke.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The command that replays this run exactly.
    pub fn replay_command(&self) -> String {
        let bugs: String = self.bugs.iter().map(|b| format!(" --bug {}", bug_name(*b))).collect();
        let c = &self.config;
        let cluster = if c.cluster { " --cluster" } else { "" };
        format!(
            "cargo run -p nasd-sim --release -- --seed {}{cluster}{bugs} --duration {} --drives {} --clients {} --log",
            self.seed,
            c.duration.as_secs(),
            c.drives,
            c.clients
        )
    }

    /// One paragraph: the outcome, and for a failure what broke, the end of
    /// the event log and how to replay it.
    pub fn summary(&self) -> String {
        let head = format!(
            "seed {}: {} requests, {} faults, {:.0} s simulated, {} events, log hash {}",
            self.seed,
            self.requests,
            self.faults,
            self.simulated.as_secs_f64(),
            self.events,
            &self.hash[..16]
        );
        if self.passed() {
            return format!("{head}: passed");
        }
        let mut s = format!("{head}: FAILED\n");
        for f in &self.failures {
            s += &format!("  broke: {f}\n");
        }
        s += "  last events:\n";
        for line in self.tail.iter().rev().take(40).rev() {
            s += &format!("    {line}\n");
        }
        s += &format!("  replay: {}\n", self.replay_command());
        s
    }
}

thread_local! {
    static RUNNING: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Installs (once) a panic hook that names the seed of the run a panic
/// happened in: a drive task's panic aborts the process (fail-stop), so the
/// hook is where the seed gets said.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            if let Some(seed) = RUNNING.with(|r| r.get()) {
                eprintln!("nasd-sim: a panic in the simulated world of seed {seed} (replay it with nasd-sim --seed {seed} --log and the same options)");
            }
        }));
    });
}

/// Plays `seed` under `cfg`.
///
/// # Panics
/// If the simulation's runtime cannot be built.
pub fn run(seed: u64, cfg: &Config) -> Report {
    install_panic_hook();
    RUNNING.with(|r| r.set(Some(seed)));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let report = rt.block_on(async {
        let core = world::Core::new(
            seed,
            net::Latency { base: Duration::from_micros(100), jitter: Duration::from_millis(3) },
            cfg.bugs.clone(),
            cfg.echo,
        );
        core.log(format!("seed {seed} bugs {:?}", cfg.bugs));
        let (requests, faults, failures) = if cfg.cluster {
            let world = cluster::Cluster::new(core.clone(), cfg.clone());
            world.clone().run().await;
            let (requests, faults) = world.counts();
            (requests, faults, world.failures())
        } else {
            let scenario = drives::Scenario::new(core.clone(), cfg.clone());
            scenario.clone().run().await;
            let (requests, faults) = scenario.counts();
            (requests, faults, scenario.failures())
        };
        core.log(format!("done: {requests} requests, {faults} faults, {} failures", failures.len()));
        let log = core.event_log();
        Report {
            seed,
            bugs: cfg.bugs.clone(),
            config: cfg.clone(),
            hash: log.hash(),
            events: log.lines(),
            simulated: core.elapsed(),
            requests,
            faults,
            failures,
            tail: log.tail().cloned().collect(),
        }
    });
    drop(rt);
    RUNNING.with(|r| r.set(None));
    report
}
