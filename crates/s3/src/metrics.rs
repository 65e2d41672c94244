//! What the S3 gateway counts, for Prometheus (`nasd-metrics` serves it):
//! [`S3Metrics`], registered under `nasd_s3_` ([`S3Metrics::register`]) and
//! given to the gateway with [`Gateway::with_metrics`](crate::Gateway::with_metrics).
//!
//! | family | labels | what |
//! |---|---|---|
//! | `nasd_s3_requests_total` | `method` (`GET`, `PUT`, `POST`, `DELETE`, `HEAD`, `other`) | HTTP requests |
//! | `nasd_s3_request_duration_seconds` | `method` | from a request's head read to its response's head ready |
//! | `nasd_s3_responses_total` | `class` (`2xx`, `3xx`, `4xx`, `5xx`, `error`) | responses by status class: `4xx` holds refused signatures (403) and missing keys, `5xx` `SlowDown` (503) and failures behind the gateway; `error` is a request the service could not answer |
//! | `nasd_s3_connections_refused_total` | `reason` (`gateway_limit`, `peer_limit`) | connections closed at accept |
//!
//! Label sets are fixed and created at start: counting allocates nothing.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::time::Duration;

/// The `method` labels, `other` last.
const METHODS: [&str; 6] = ["GET", "PUT", "POST", "DELETE", "HEAD", "other"];
/// The `class` labels, by the status's first digit; `error` for no response (or a 1xx).
const CLASSES: [&str; 5] = ["2xx", "3xx", "4xx", "5xx", "error"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug)]
struct Families {
    requests: Family<MethodLabels, Counter>,
    duration: Family<MethodLabels, Histogram>,
    responses: Family<ClassLabels, Counter>,
    refused: Family<ReasonLabels, Counter>,
    /// By `METHODS` index.
    per_method: Vec<(Counter, Histogram)>,
    /// By `CLASSES` index.
    per_class: Vec<Counter>,
    gateway_limit: Counter,
    peer_limit: Counter,
}

/// The gateway's metrics; clones share them.
#[derive(Clone, Debug)]
pub struct S3Metrics {
    families: Arc<Families>,
}

impl Default for S3Metrics {
    fn default() -> Self {
        S3Metrics::new()
    }
}

impl S3Metrics {
    /// Fresh families, every label created.
    pub fn new() -> S3Metrics {
        let requests = Family::<MethodLabels, Counter>::default();
        let duration = Family::<MethodLabels, Histogram>::new_with_constructor(
            nasd_metrics::latency_histogram as fn() -> Histogram,
        );
        let per_method = METHODS
            .iter()
            .map(|&method| {
                let labels = MethodLabels { method };
                (requests.get_or_create_owned(&labels), duration.get_or_create_owned(&labels))
            })
            .collect();
        let responses = Family::<ClassLabels, Counter>::default();
        let per_class = CLASSES.iter().map(|&class| responses.get_or_create_owned(&ClassLabels { class })).collect();
        let refused = Family::<ReasonLabels, Counter>::default();
        let families = Families {
            per_method,
            per_class,
            gateway_limit: refused.get_or_create_owned(&ReasonLabels { reason: "gateway_limit" }),
            peer_limit: refused.get_or_create_owned(&ReasonLabels { reason: "peer_limit" }),
            requests,
            duration,
            responses,
            refused,
        };
        S3Metrics { families: Arc::new(families) }
    }

    /// Registers the families in `metrics` under `nasd_s3_`.
    pub fn register(&self, metrics: &nasd_metrics::Metrics) {
        let f = &self.families;
        metrics.register("s3", None, |r: &mut Registry| {
            r.register("requests", "HTTP requests, by method", f.requests.clone());
            r.register_with_unit(
                "request_duration",
                "From a request's head read to its response's head ready, by method",
                Unit::Seconds,
                f.duration.clone(),
            );
            r.register("responses", "Responses by status class", f.responses.clone());
            r.register("connections_refused", "Connections closed at accept, by limit", f.refused.clone());
        });
    }

    /// Counts a request of `method` answered with `status` (`None`: not
    /// answered) after `took`.
    pub(crate) fn request(&self, method: &hyper::Method, status: Option<hyper::StatusCode>, took: Duration) {
        let f = &self.families;
        let m = METHODS.iter().position(|&name| name == method.as_str()).unwrap_or(METHODS.len() - 1);
        let (requests, duration) = &f.per_method[m];
        requests.inc();
        duration.observe(took.as_secs_f64());
        let class = match status.map(|s| s.as_u16() / 100) {
            Some(2) => 0,
            Some(3) => 1,
            Some(4) => 2,
            Some(5) => 3,
            _ => 4,
        };
        f.per_class[class].inc();
    }

    pub(crate) fn refused_gateway_limit(&self) {
        self.families.gateway_limit.inc();
    }

    pub(crate) fn refused_peer_limit(&self) {
        self.families.peer_limit.inc();
    }
}
