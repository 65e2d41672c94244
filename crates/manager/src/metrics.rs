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
//!
//! Status labels are created once, at start; an operation's label is a
//! `&'static str` from the protocol, so no request allocates for its labels.

use nasd_proto::fs::FsStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

#[derive(Debug)]
struct Families {
    requests: Family<OpLabels, Counter>,
    duration: Family<OpLabels, Histogram, fn() -> Histogram>,
    failures: Family<StatusLabels, Counter>,
    /// `failures`' counters by status code.
    failures_by_status: Vec<Counter>,
    sessions: Gauge,
    logins: Counter,
    login_failures: Family<StatusLabels, Counter>,
    login_failures_by_status: Vec<Counter>,
    metadata_sync: Histogram,
    metadata_sync_failures: Counter,
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

/// A counter per status (indexed by code) in `family`, every label created.
fn by_status(family: &Family<StatusLabels, Counter>) -> Vec<Counter> {
    let highest = FsStatus::ALL.iter().map(|&s| s as usize).max().expect("statuses exist");
    let mut counters = vec![Counter::default(); highest + 1];
    for status in FsStatus::ALL.into_iter().filter(|&s| s != FsStatus::Ok) {
        let labels = StatusLabels { status: nasd_metrics::snake_case(&format!("{status:?}")) };
        counters[status as usize] = family.get_or_create_owned(&labels);
    }
    counters
}

fn latency_histogram() -> Histogram {
    Histogram::new(nasd_metrics::latency_buckets())
}

impl ManagerMetrics {
    /// Fresh families, every status label created.
    pub fn new() -> ManagerMetrics {
        let failures = Family::default();
        let login_failures = Family::default();
        let families = Families {
            requests: Family::default(),
            duration: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            failures_by_status: by_status(&failures),
            failures,
            sessions: Gauge::default(),
            logins: Counter::default(),
            login_failures_by_status: by_status(&login_failures),
            login_failures,
            metadata_sync: latency_histogram(),
            metadata_sync_failures: Counter::default(),
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
            r.register("failures", "Requests answered with an error, by status", f.failures.clone());
            r.register("sessions", "Logged-in connections open", f.sessions.clone());
            r.register("logins", "Logins that succeeded", f.logins.clone());
            r.register("login_failures", "Logins refused, by status", f.login_failures.clone());
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
        });
    }

    /// Counts request `op` answered with `status` after `took`.
    pub(crate) fn request(&self, op: &'static str, status: FsStatus, took: Duration) {
        let f = &self.families;
        f.requests.get_or_create(&OpLabels { op }).inc();
        f.duration.get_or_create(&OpLabels { op }).observe(took.as_secs_f64());
        if status != FsStatus::Ok {
            f.failures_by_status[status as usize].inc();
        }
    }

    /// Counts a login: `None` if it succeeded, else its status.
    pub(crate) fn login(&self, refused: Option<FsStatus>) {
        match refused {
            None => self.families.logins.inc(),
            Some(status) => self.families.login_failures_by_status[status as usize].inc(),
        };
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
