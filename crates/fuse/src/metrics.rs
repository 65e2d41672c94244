//! What a mount counts, for Prometheus (`nasd-metrics` serves it):
//! [`MountMetrics`], registered under `nasd_mount_`
//! ([`MountMetrics::register`]); a [`MountConfig`](crate::MountConfig)
//! carries the mount's.
//!
//! | family | labels | what |
//! |---|---|---|
//! | `nasd_mount_requests_total` | `op` | requests from the kernel answered, by FUSE operation (`lookup`, `read`, `write`, `flush`, …) |
//! | `nasd_mount_request_duration_seconds` | `op` | from the request taken from the kernel (a wait for a free slot included) to its reply |
//! | `nasd_mount_failures_total` | `op` | requests answered with an errno (a lookup of a name that does not exist too) |
//! | `nasd_mount_data_bytes_total` | `op` (`read`, `write`) | file bytes read to and written from the kernel |
//!
//! An operation's label is a `&'static str` chosen in the code, never a name
//! or a path from the request.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;
use std::time::Duration;

/// The `op` label of every FUSE operation the mount answers through a task
/// of its own (the kernel's name for it); each label set is created at start,
/// so a dashboard finds every family before its first request.
const FUSE_OPERATIONS: [&str; 30] = [
    "access",
    "create",
    "fallocate",
    "flush",
    "fsync",
    "fsyncdir",
    "getattr",
    "getxattr",
    "link",
    "listxattr",
    "lookup",
    "lseek",
    "mkdir",
    "mknod",
    "open",
    "opendir",
    "read",
    "readdir",
    "readdirplus",
    "readlink",
    "release",
    "removexattr",
    "rename",
    "rmdir",
    "setattr",
    "setxattr",
    "statfs",
    "symlink",
    "unlink",
    "write",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Debug)]
struct Families {
    requests: Family<OpLabels, Counter>,
    duration: Family<OpLabels, Histogram, fn() -> Histogram>,
    failures: Family<OpLabels, Counter>,
    data_bytes: Family<OpLabels, Counter>,
    read_bytes: Counter,
    written_bytes: Counter,
}

/// A mount's metrics; clones share them.
#[derive(Clone, Debug)]
pub struct MountMetrics {
    families: Arc<Families>,
}

impl Default for MountMetrics {
    fn default() -> Self {
        MountMetrics::new()
    }
}

impl MountMetrics {
    /// Fresh families.
    pub fn new() -> MountMetrics {
        let data_bytes = Family::<OpLabels, Counter>::default();
        let families = Families {
            requests: Family::default(),
            duration: Family::new_with_constructor(nasd_metrics::latency_histogram as fn() -> Histogram),
            failures: Family::default(),
            read_bytes: data_bytes.get_or_create_owned(&OpLabels { op: "read" }),
            written_bytes: data_bytes.get_or_create_owned(&OpLabels { op: "write" }),
            data_bytes,
        };
        for op in FUSE_OPERATIONS {
            let labels = OpLabels { op };
            let _ = families.requests.get_or_create_owned(&labels);
            let _ = families.duration.get_or_create_owned(&labels);
            let _ = families.failures.get_or_create_owned(&labels);
        }
        MountMetrics { families: Arc::new(families) }
    }

    /// Registers the families in `metrics` under `nasd_mount_`.
    pub fn register(&self, metrics: &nasd_metrics::Metrics) {
        let f = &self.families;
        metrics.register("mount", None, |r: &mut Registry| {
            r.register("requests", "Requests from the kernel answered, by FUSE operation", f.requests.clone());
            r.register_with_unit(
                "request_duration",
                "From a request taken from the kernel to its reply, by FUSE operation",
                Unit::Seconds,
                f.duration.clone(),
            );
            r.register("failures", "Requests answered with an errno, by FUSE operation", f.failures.clone());
            r.register("data_bytes", "File bytes read to and written from the kernel", f.data_bytes.clone());
        });
    }

    /// Requests answered so far, by FUSE operation (every label of
    /// [`FUSE_OPERATIONS`], in its order; for benchmarks).
    pub fn requests_by_op(&self) -> Vec<(&'static str, u64)> {
        let f = &self.families;
        FUSE_OPERATIONS.iter().map(|&op| (op, f.requests.get_or_create(&OpLabels { op }).get())).collect()
    }

    /// Counts request `op` answered (with an errno unless `ok`) after `took`.
    pub(crate) fn answered(&self, op: &'static str, ok: bool, took: Duration) {
        debug_assert!(FUSE_OPERATIONS.contains(&op), "{op} is not in FUSE_OPERATIONS");
        let f = &self.families;
        let labels = OpLabels { op };
        f.requests.get_or_create(&labels).inc();
        f.duration.get_or_create(&labels).observe(took.as_secs_f64());
        if !ok {
            f.failures.get_or_create(&labels).inc();
        }
    }

    pub(crate) fn read_bytes(&self, bytes: usize) {
        self.families.read_bytes.inc_by(bytes as u64);
    }

    pub(crate) fn written_bytes(&self, bytes: u32) {
        self.families.written_bytes.inc_by(u64::from(bytes));
    }
}
