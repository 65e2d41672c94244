//! What a manager counts, for Prometheus (`nasd-metrics` serves it).
//!
//! Each [`Manager`](crate::Manager) has its [`ManagerMetrics`]
//! ([`Manager::metrics`](crate::Manager::metrics)); the embedding process
//! registers them under `nasd_manager_` ([`ManagerMetrics::register`]).
//!
//! | family | labels | what |
//! |---|---|---|
//! | `nasd_manager_requests_total` | `op` | requests after login, by operation (`begin-write`, `commit`, …: the protocol's names) |
//! | `nasd_manager_request_duration_seconds` | `op` | from a request decoded to its reply ready; `op="commit"` is the commit latency of write transactions |
//! | `nasd_manager_failures_total` | `status` | requests answered with an error, by status (`not_found`, `permission_denied`, `busy`, …) |
//! | `nasd_manager_sessions` | | logged-in connections open |
//! | `nasd_manager_logins_total` | | logins that succeeded |
//! | `nasd_manager_login_failures_total` | `status` | logins refused (`bad_credentials`, `not_logged_in`, …) |
//! | `nasd_manager_metadata_sync_duration_seconds` | | each flush of the metadata's log (what makes acknowledged changes durable) |
//! | `nasd_manager_metadata_sync_failures_total` | | flushes that failed |
//! | `nasd_manager_transactions_begun_total` | | write transactions begun (clients' and the manager's own: repairs, size changes) |
//! | `nasd_manager_transactions_rolled_back_total` | | write transactions rolled back (lease ran out, writer gone, aborted) |
//! | `nasd_manager_write_conflicts_total` | | turns a begin or small write found the file held by another writer's transaction and tried again (those that gave up are `failures_total{status="busy"}`) |
//! | `nasd_manager_degraded_files` | | files with a component stale or on a drive that does not serve (as `nasd status` counts them; refreshed every [`CLUSTER_GAUGES_INTERVAL`] and at each change of a drive's health) |
//! | `nasd_manager_drives` | `state` (`up`, `down`, `out`) | drives by state: out of service, else serving clients or not |
//! | `nasd_manager_repaired_files_total`, `nasd_manager_repaired_bytes_total` | `task` (`rebuild`, `rebalance`) | files (and component bytes copied) resynced or rebuilt, and moved by rebalancing |
//! | `nasd_manager_repair_progress_files`, `nasd_manager_repair_progress_bytes` | `task` (`rebuild`, `rebalance`, `scrub`), `of` (`done`, `planned`) | the running pass, as `nasd status` shows it (a scrub counts drives as files), read at each scrape |
//! | `nasd_manager_scrubs_total` | | scrub passes finished |
//! | `nasd_manager_scrub_checked_blocks_total` | | blocks the drives read back and checked against their digests |
//! | `nasd_manager_scrub_corrupt_blocks_total` | `outcome` (`healed`, `unrecoverable`, `not_healed`) | blocks that failed their digest: healed from redundancy, in a file without redundancy, or not healed yet (tried again next scrub) |
//!
//! Every label set is created once, at start; an operation's label is a
//! `&'static str` from the protocol, so no request allocates for its labels.

use crate::repair::RepairState;
use nasd_metrics::CountersByCode;
use nasd_proto::fs::FsStatus;
use nasd_proto::manager::{Progress, ScrubSummary};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How often the manager counts degraded files and drives by state for
/// `nasd_manager_degraded_files` and `nasd_manager_drives` (and at each
/// change of a drive's health): two counting queries of the metadata, made
/// only while the metrics are registered.
pub const CLUSTER_GAUGES_INTERVAL: Duration = Duration::from_secs(5);

/// A label set of one pair whose value is fixed at start.
type Fixed = [(&'static str, &'static str); 1];

/// The `task` label values of repair counters.
const REBUILD: &str = "rebuild";
const REBALANCE: &str = "rebalance";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Debug)]
struct Families {
    requests: Family<OpLabels, Counter>,
    duration: Family<OpLabels, Histogram, fn() -> Histogram>,
    failures: CountersByCode,
    sessions: Gauge,
    logins: Counter,
    login_failures: CountersByCode,
    metadata_sync: Histogram,
    metadata_sync_failures: Counter,
    transactions_begun: Counter,
    transactions_rolled_back: Counter,
    write_conflicts: Counter,
    degraded_files: Gauge,
    drives: Family<Fixed, Gauge>,
    drives_up: Gauge,
    drives_down: Gauge,
    drives_out: Gauge,
    repaired_files: Family<Fixed, Counter>,
    repaired_bytes: Family<Fixed, Counter>,
    scrubs: Counter,
    scrub_checked: Counter,
    scrub_corrupt: Family<Fixed, Counter>,
    /// The repair task's state, read at each scrape.
    repair: Mutex<Weak<Mutex<RepairState>>>,
    /// Registered in a registry: the cluster gauges are worth computing.
    registered: AtomicBool,
}

/// A manager's metrics; clones share them (see the module doc).
#[derive(Clone, Debug)]
pub struct ManagerMetrics {
    families: Arc<Families>,
}

impl Default for ManagerMetrics {
    fn default() -> Self {
        ManagerMetrics::new()
    }
}

impl ManagerMetrics {
    /// Fresh families, every status label created.
    pub fn new() -> ManagerMetrics {
        let drives = Family::<Fixed, Gauge>::default();
        let families = Families {
            requests: Family::default(),
            duration: Family::new_with_constructor(nasd_metrics::latency_histogram as fn() -> Histogram),
            failures: CountersByCode::fs_statuses("status"),
            sessions: Gauge::default(),
            logins: Counter::default(),
            login_failures: CountersByCode::fs_statuses("status"),
            metadata_sync: nasd_metrics::latency_histogram(),
            metadata_sync_failures: Counter::default(),
            transactions_begun: Counter::default(),
            transactions_rolled_back: Counter::default(),
            write_conflicts: Counter::default(),
            degraded_files: Gauge::default(),
            drives_up: drives.get_or_create_owned(&[("state", "up")]),
            drives_down: drives.get_or_create_owned(&[("state", "down")]),
            drives_out: drives.get_or_create_owned(&[("state", "out")]),
            drives,
            repaired_files: labelled("task", &[REBUILD, REBALANCE]),
            repaired_bytes: labelled("task", &[REBUILD, REBALANCE]),
            scrubs: Counter::default(),
            scrub_checked: Counter::default(),
            scrub_corrupt: labelled("outcome", &["healed", "unrecoverable", "not_healed"]),
            repair: Mutex::new(Weak::new()),
            registered: AtomicBool::new(false),
        };
        ManagerMetrics { families: Arc::new(families) }
    }

    /// Registers the families in `metrics` under `nasd_manager_`.
    pub fn register(&self, metrics: &nasd_metrics::Metrics) {
        let f = &self.families;
        metrics.register("manager", None, |r: &mut Registry| {
            r.register("requests", "Requests after login, by operation", f.requests.clone());
            r.register_with_unit(
                "request_duration",
                "From a request decoded to its reply ready, by operation",
                Unit::Seconds,
                f.duration.clone(),
            );
            r.register("failures", "Requests answered with an error, by status", f.failures.family());
            r.register("sessions", "Logged-in connections open", f.sessions.clone());
            r.register("logins", "Logins that succeeded", f.logins.clone());
            r.register("login_failures", "Logins refused, by status", f.login_failures.family());
            r.register_with_unit(
                "metadata_sync_duration",
                "Flushes of the metadata's log",
                Unit::Seconds,
                f.metadata_sync.clone(),
            );
            r.register(
                "metadata_sync_failures",
                "Flushes of the metadata's log that failed",
                f.metadata_sync_failures.clone(),
            );
            r.register("transactions_begun", "Write transactions begun", f.transactions_begun.clone());
            r.register(
                "transactions_rolled_back",
                "Write transactions rolled back",
                f.transactions_rolled_back.clone(),
            );
            r.register(
                "write_conflicts",
                "Turns a write waited for another writer's transaction on its file",
                f.write_conflicts.clone(),
            );
            r.register(
                "degraded_files",
                "Files with a component stale or on a drive not serving",
                f.degraded_files.clone(),
            );
            r.register("drives", "Drives by state", f.drives.clone());
            r.register("repaired_files", "Files resynced, rebuilt or moved, by task", f.repaired_files.clone());
            r.register_with_unit(
                "repaired",
                "Component bytes copied by repairs, by task",
                Unit::Bytes,
                f.repaired_bytes.clone(),
            );
            r.register("scrubs", "Scrub passes finished", f.scrubs.clone());
            r.register(
                "scrub_checked_blocks",
                "Blocks checked against their digests by scrubs",
                f.scrub_checked.clone(),
            );
            r.register("scrub_corrupt_blocks", "Blocks scrubs found corrupt, by outcome", f.scrub_corrupt.clone());
            r.register_collector(Box::new(RepairProgress(self.families.clone())));
        });
        f.registered.store(true, Ordering::Relaxed);
    }

    /// Whether [`register`](Self::register) was called: the cluster gauges
    /// are read by someone.
    pub(crate) fn registered(&self) -> bool {
        self.families.registered.load(Ordering::Relaxed)
    }

    /// Reports `repair`'s progress at each scrape from now on.
    pub(crate) fn watch_repair(&self, repair: &Arc<Mutex<RepairState>>) {
        *self.families.repair.lock().expect("metrics repair slot poisoned") = Arc::downgrade(repair);
    }

    pub(crate) fn transaction_begun(&self) {
        self.families.transactions_begun.inc();
    }

    pub(crate) fn transaction_rolled_back(&self) {
        self.families.transactions_rolled_back.inc();
    }

    pub(crate) fn write_conflict(&self) {
        self.families.write_conflicts.inc();
    }

    /// Sets the cluster gauges: files degraded, drives up, down and out.
    pub(crate) fn cluster(&self, degraded_files: u64, up: u64, down: u64, out: u64) {
        let f = &self.families;
        f.degraded_files.set(gauge_value(degraded_files));
        f.drives_up.set(gauge_value(up));
        f.drives_down.set(gauge_value(down));
        f.drives_out.set(gauge_value(out));
    }

    /// Counts a file resynced or rebuilt.
    pub(crate) fn rebuilt_file(&self) {
        self.families.repaired_files.get_or_create(&[("task", REBUILD)]).inc();
    }

    /// Counts component bytes a resync or rebuild copied.
    pub(crate) fn rebuilt_bytes(&self, bytes: u64) {
        self.families.repaired_bytes.get_or_create(&[("task", REBUILD)]).inc_by(bytes);
    }

    /// Counts a component moved by rebalancing, with its bytes.
    pub(crate) fn moved(&self, bytes: u64) {
        let f = &self.families;
        f.repaired_files.get_or_create(&[("task", REBALANCE)]).inc();
        f.repaired_bytes.get_or_create(&[("task", REBALANCE)]).inc_by(bytes);
    }

    /// Counts a finished scrub pass and what it found: `not_healed` of its
    /// corrupt blocks are neither healed nor unrecoverable (tried again).
    pub(crate) fn scrubbed(&self, summary: &ScrubSummary) {
        let f = &self.families;
        f.scrubs.inc();
        f.scrub_checked.inc_by(summary.blocks_checked);
        let not_healed = summary.corrupt.saturating_sub(summary.healed + summary.unrecoverable);
        for (outcome, n) in
            [("healed", summary.healed), ("unrecoverable", summary.unrecoverable), ("not_healed", not_healed)]
        {
            f.scrub_corrupt.get_or_create(&[("outcome", outcome)]).inc_by(n);
        }
    }

    /// Counts request `op` answered with `status` after `took`.
    pub(crate) fn request(&self, op: &'static str, status: FsStatus, took: Duration) {
        let f = &self.families;
        f.requests.get_or_create(&OpLabels { op }).inc();
        f.duration.get_or_create(&OpLabels { op }).observe(took.as_secs_f64());
        if status != FsStatus::Ok {
            f.failures.inc(status as usize);
        }
    }

    /// Counts a login: `None` if it succeeded, else its status.
    pub(crate) fn login(&self, refused: Option<FsStatus>) {
        match refused {
            None => {
                self.families.logins.inc();
            }
            Some(status) => self.families.login_failures.inc(status as usize),
        }
    }

    /// A session logged in; the gauge goes down when the guard drops.
    pub(crate) fn session_opened(&self) -> OpenSession {
        self.families.sessions.inc();
        OpenSession(self.clone())
    }

    /// Counts a flush of the metadata's log that took `took`.
    pub(crate) fn metadata_synced(&self, ok: bool, took: Duration) {
        self.families.metadata_sync.observe(took.as_secs_f64());
        if !ok {
            self.families.metadata_sync_failures.inc();
        }
    }
}

/// Holds one session in `nasd_manager_sessions`.
pub(crate) struct OpenSession(ManagerMetrics);

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.0.families.sessions.dec();
    }
}

/// A family of one label with every value in `values` created.
fn labelled<M: Default + Clone + prometheus_client::metrics::TypedMetric + EncodeMetric>(
    label: &'static str,
    values: &[&'static str],
) -> Family<Fixed, M> {
    let family = Family::<Fixed, M>::default();
    for &value in values {
        let _ = family.get_or_create_owned(&[(label, value)]);
    }
    family
}

/// A count as a gauge's value (saturating: gauges are `i64`).
fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The repair task's progress, read when scraped.
#[derive(Debug)]
struct RepairProgress(Arc<Families>);

impl Collector for RepairProgress {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let repair = self.0.repair.lock().expect("metrics repair slot poisoned").upgrade();
        let Some(repair) = repair else { return Ok(()) };
        let state = repair.lock().expect("repair lock").clone();
        let tasks: [(&str, Progress); 3] =
            [("rebuild", state.rebuild_shown()), ("rebalance", state.rebalance), ("scrub", state.scrub)];
        let files = |p: &Progress| (p.files_done, p.files_total);
        let bytes = |p: &Progress| (p.bytes_done, p.bytes_total);
        for (name, help, unit, pick) in [
            (
                "repair_progress_files",
                "Files of the running repair pass, by task",
                None,
                &files as &dyn Fn(&Progress) -> (u64, u64),
            ),
            ("repair_progress", "Bytes of the running repair pass, by task", Some(Unit::Bytes), &bytes),
        ] {
            let mut family =
                encoder.encode_descriptor(name, help, unit.as_ref(), prometheus_client::metrics::MetricType::Gauge)?;
            for (task, progress) in &tasks {
                let (done, planned) = pick(progress);
                for (of, value) in [("done", done), ("planned", planned)] {
                    let labels = [("task", *task), ("of", of)];
                    ConstGauge::new(gauge_value(value)).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}
