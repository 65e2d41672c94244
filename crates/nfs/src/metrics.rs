//! What the NFS gateway counts, for Prometheus (`nasd-metrics` serves it):
//! [`NfsMetrics`], registered under `nasd_nfs_` ([`NfsMetrics::register`])
//! and given to the gateway with [`Gateway::with_metrics`](crate::Gateway::with_metrics).
//!
//! | family | labels | what |
//! |---|---|---|
//! | `nasd_nfs_requests_total` | `proc` (`getattr`, `lookup`, `read`, `write`, `commit`, …, RFC 1813's names; `other`) | NFSv3 calls answered |
//! | `nasd_nfs_request_duration_seconds` | `proc` | from a call read to its reply ready |
//! | `nasd_nfs_errors_total` | `status` (`noent`, `acces`, `dquot`, `jukebox`, `stale`, …: an `nfsstat3` without `NFS3ERR_`; `garbage_args`, `proc_unavail`, `other`) | calls answered with anything but `NFS3_OK` |
//! | `nasd_nfs_data_bytes_total` | `op` (`read`, `write`) | file bytes READ sent and WRITE took |
//!
//! Label sets are fixed (`nfs_rpc::proc_name`, `nfs_rpc::OUTCOMES`) and
//! created at start, so a dashboard finds every family before its first call.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProcLabels {
    proc: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Debug)]
struct Families {
    requests: Family<ProcLabels, Counter>,
    duration: Family<ProcLabels, Histogram, fn() -> Histogram>,
    errors: Family<StatusLabels, Counter>,
    data_bytes: Family<OpLabels, Counter>,
    read_bytes: Counter,
    written_bytes: Counter,
}

/// The gateway's metrics; clones share them.
#[derive(Clone, Debug)]
pub struct NfsMetrics {
    families: Arc<Families>,
}

impl Default for NfsMetrics {
    fn default() -> Self {
        NfsMetrics::new()
    }
}

impl NfsMetrics {
    /// Fresh families, every label created.
    pub fn new() -> NfsMetrics {
        let requests = Family::<ProcLabels, Counter>::default();
        let duration = Family::<ProcLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            nasd_metrics::latency_histogram as fn() -> Histogram,
        );
        for proc in (0..=22).map(nfs_rpc::proc_name) {
            let _ = requests.get_or_create(&ProcLabels { proc });
            let _ = duration.get_or_create(&ProcLabels { proc });
        }
        let errors = Family::<StatusLabels, Counter>::default();
        for status in nfs_rpc::OUTCOMES.iter().skip(1) {
            let _ = errors.get_or_create(&StatusLabels { status });
        }
        let data_bytes = Family::<OpLabels, Counter>::default();
        let read_bytes = data_bytes.get_or_create_owned(&OpLabels { op: "read" });
        let written_bytes = data_bytes.get_or_create_owned(&OpLabels { op: "write" });
        NfsMetrics {
            families: Arc::new(Families { requests, duration, errors, data_bytes, read_bytes, written_bytes }),
        }
    }

    /// Registers the families in `metrics` under `nasd_nfs_`.
    pub fn register(&self, metrics: &nasd_metrics::Metrics) {
        let f = &self.families;
        metrics.register("nfs", None, |r: &mut Registry| {
            r.register("requests", "NFSv3 calls answered, by procedure", f.requests.clone());
            r.register_with_unit(
                "request_duration",
                "From an NFSv3 call read to its reply ready, by procedure",
                Unit::Seconds,
                f.duration.clone(),
            );
            r.register("errors", "NFSv3 calls not answered NFS3_OK, by status", f.errors.clone());
            r.register("data_bytes", "File bytes READ sent and WRITE took", f.data_bytes.clone());
        });
    }

    /// Counts a call of procedure `proc` answered with `outcome` after `took`.
    pub(crate) fn answered(&self, proc: &'static str, outcome: &'static str, took: Duration) {
        let f = &self.families;
        let labels = ProcLabels { proc };
        f.requests.get_or_create(&labels).inc();
        f.duration.get_or_create(&labels).observe(took.as_secs_f64());
        if outcome != "ok" {
            f.errors.get_or_create(&StatusLabels { status: outcome }).inc();
        }
    }

    pub(crate) fn read_bytes(&self, n: usize) {
        self.families.read_bytes.inc_by(n as u64);
    }

    pub(crate) fn written_bytes(&self, n: usize) {
        self.families.written_bytes.inc_by(n as u64);
    }
}
