//! What an authentication server counts, for Prometheus (`nasd-metrics`
//! serves it): [`AuthMetrics`], registered under `nasd_auth_`
//! ([`AuthMetrics::register`]; [`AuthServer::metrics`](crate::AuthServer::metrics)).
//!
//! | family | labels | what |
//! |---|---|---|
//! | `nasd_auth_sessions` | | logged-in connections open |
//! | `nasd_auth_logins_total` | `kind` (`user`, `service`) | logins that succeeded (a user's issues an identity key) |
//! | `nasd_auth_login_failures_total` | `status` (`bad_credentials`, `bad_request`, `not_logged_in`, …) | logins refused; `bad_credentials` are wrong passwords or tokens, which the login back-off paces |
//! | `nasd_auth_refusals_total` | `status` | requests after login refused |
//!
//! Every label set is created at start: counting allocates nothing.

use nasd_proto::fs::FsStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Debug)]
struct Families {
    sessions: Gauge,
    logins: Family<KindLabels, Counter>,
    user_logins: Counter,
    service_logins: Counter,
    login_failures: Family<StatusLabels, Counter>,
    login_failures_by_status: Vec<Counter>,
    refusals: Family<StatusLabels, Counter>,
    refusals_by_status: Vec<Counter>,
}

/// An authentication server's metrics; clones share them.
#[derive(Clone, Debug)]
pub struct AuthMetrics {
    families: Arc<Families>,
}

impl Default for AuthMetrics {
    fn default() -> Self {
        AuthMetrics::new()
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

impl AuthMetrics {
    /// Fresh families, every label created.
    pub fn new() -> AuthMetrics {
        let logins = Family::<KindLabels, Counter>::default();
        let (login_failures, refusals) = (Family::default(), Family::default());
        let families = Families {
            sessions: Gauge::default(),
            user_logins: logins.get_or_create_owned(&KindLabels { kind: "user" }),
            service_logins: logins.get_or_create_owned(&KindLabels { kind: "service" }),
            logins,
            login_failures_by_status: by_status(&login_failures),
            login_failures,
            refusals_by_status: by_status(&refusals),
            refusals,
        };
        AuthMetrics { families: Arc::new(families) }
    }

    /// Registers the families in `metrics` under `nasd_auth_`.
    pub fn register(&self, metrics: &nasd_metrics::Metrics) {
        let f = &self.families;
        metrics.register("auth", None, |r: &mut Registry| {
            r.register("sessions", "Logged-in connections open", f.sessions.clone());
            r.register("logins", "Logins that succeeded, by kind", f.logins.clone());
            r.register("login_failures", "Logins refused, by status", f.login_failures.clone());
            r.register("refusals", "Requests after login refused, by status", f.refusals.clone());
        });
    }

    /// Counts a login that succeeded: a user's or a service's.
    pub(crate) fn logged_in(&self, user: bool) {
        let f = &self.families;
        if user { &f.user_logins } else { &f.service_logins }.inc();
    }

    pub(crate) fn login_refused(&self, status: FsStatus) {
        self.families.login_failures_by_status[status as usize].inc();
    }

    pub(crate) fn refused(&self, status: FsStatus) {
        self.families.refusals_by_status[status as usize].inc();
    }

    /// A session logged in; the gauge goes down when the guard drops.
    pub(crate) fn session_opened(&self) -> OpenSession {
        self.families.sessions.inc();
        OpenSession(self.clone())
    }
}

/// Holds one session in `nasd_auth_sessions`.
pub(crate) struct OpenSession(AuthMetrics);

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.0.families.sessions.dec();
    }
}
