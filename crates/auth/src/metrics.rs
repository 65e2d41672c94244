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

use nasd_metrics::CountersByCode;
use nasd_proto::fs::FsStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

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
    login_failures: CountersByCode,
    refusals: CountersByCode,
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

impl AuthMetrics {
    /// Fresh families, every label created.
    pub fn new() -> AuthMetrics {
        let logins = Family::<KindLabels, Counter>::default();
        let families = Families {
            sessions: Gauge::default(),
            user_logins: logins.get_or_create_owned(&KindLabels { kind: "user" }),
            service_logins: logins.get_or_create_owned(&KindLabels { kind: "service" }),
            logins,
            login_failures: CountersByCode::fs_statuses("status"),
            refusals: CountersByCode::fs_statuses("status"),
        };
        AuthMetrics { families: Arc::new(families) }
    }

    /// Registers the families in `metrics` under `nasd_auth_`.
    pub fn register(&self, metrics: &nasd_metrics::Metrics) {
        let f = &self.families;
        metrics.register("auth", None, |r: &mut Registry| {
            r.register("sessions", "Logged-in connections open", f.sessions.clone());
            r.register("logins", "Logins that succeeded, by kind", f.logins.clone());
            r.register("login_failures", "Logins refused, by status", f.login_failures.family());
            r.register("refusals", "Requests after login refused, by status", f.refusals.family());
        });
    }

    /// Counts a login that succeeded: a user's or a service's.
    pub(crate) fn logged_in(&self, user: bool) {
        let f = &self.families;
        if user { &f.user_logins } else { &f.service_logins }.inc();
    }

    pub(crate) fn login_refused(&self, status: FsStatus) {
        self.families.login_failures.inc(status as usize);
    }

    pub(crate) fn refused(&self, status: FsStatus) {
        self.families.refusals.inc(status as usize);
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
