//! What a drive counts, for Prometheus (`nasd-metrics` serves it).
//!
//! [`DriveMetrics`] holds the drive's families; the embedding process
//! registers them ([`DriveMetrics::register`], under `nasd_drive_`) and hands
//! a clone to [`crate::serve`] in [`crate::DriveConfig::metrics`]. Unregistered
//! (the default) they count all the same and nobody reads them.
//!
//! | family | labels | what |
//! |---|---|---|
//! | `nasd_drive_requests_total` | `op` | requests read whole, by operation (`unknown` for an opcode that names none), whatever their outcome |
//! | `nasd_drive_request_duration_seconds` | `op` | from a request's frame (header and arguments) read to its reply sent, a write's or read's data included (a refused request too) |
//! | `nasd_drive_refusals_total` | `reason` | requests answered with a status other than OK (and frames refused before they were read whole), by status (`bad_digest`, `nonce_replayed`, `capability_expired`, `access_revoked`, `not_in_pal`, …: PROTOCOL.md's names, lower case) |
//! | `nasd_drive_data_bytes_total` | `op` (`read`, `write`) | object bytes sent by reads and stored by writes that succeeded |
//! | `nasd_drive_connections` | | connections open |
//! | `nasd_drive_connections_accepted_total` | | connections admitted |
//! | `nasd_drive_connections_refused_total` | `reason` (`drive_limit`, `peer_limit`) | connections closed at accept |
//! | `nasd_drive_capability_key_cache_total` | `result` (`hit`, `miss`) | capability keys found in the cache or computed |
//! | `nasd_drive_capacity_bytes`, `nasd_drive_used_bytes` | | the store's size and use, read at each scrape |
//! | `nasd_drive_prefetch_hints_total` | `outcome` (`queued`, `read`, `passed`, `expired`, `revoked`, `failed`) | `prefetch-v1` hints accepted, read ahead, or dropped (the client had read past them; the credential expired; the object's access control version or PALs changed; the store could not read them) |
//! | `nasd_drive_prefetch_cache_bytes`, `nasd_drive_prefetch_cache_hits_total` | | bytes the prefetch cache holds, and blocks reads found there, read at each scrape |
//!
//! The hot path touches atomics only: every label set is created here, once,
//! and a request finds its counters by index (opcode table, status code).

use nasd_metrics::{CountersByCode, Metrics};
use nasd_proto::opcode::*;
use nasd_proto::Status;
use nasd_store::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Every operation the drive knows, with its `op` label.
const OPERATIONS: &[(u16, &str)] = &[
    (HELLO, "hello"),
    (CREATE, "create"),
    (REMOVE, "remove"),
    (GETATTR, "getattr"),
    (SETATTR, "setattr"),
    (READ, "read"),
    (WRITE, "write"),
    (FASTCOPY, "fastcopy"),
    (FLUSH, "flush"),
    (BLOCKS_REQUIRED, "blocks_required"),
    (TXN_BEGIN, "txn_begin"),
    (TXN_END, "txn_end"),
    (SET_PAL, "set_pal"),
    (GET_PAL, "get_pal"),
    (EXTENTS, "extents"),
    (DIGESTS, "digests"),
    (EXTENSION, "extension"),
    (CREATE_PARTITION, "create_partition"),
    (REMOVE_PARTITION, "remove_partition"),
    (RESIZE_PARTITION, "resize_partition"),
    (FLUSH_PARTITION, "flush_partition"),
    (SET_PARTITION_KEY, "set_partition_key"),
    (SET_WORKING_KEY, "set_working_key"),
    (SET_MIN_PROTECTION, "set_min_protection"),
    (TXN_LIST, "txn_list"),
    (SET_MAP_EPOCH, "set_map_epoch"),
    (SET_AUTH_SCHEME, "set_auth_scheme"),
    (GET_AUTH_SCHEME, "get_auth_scheme"),
    (SET_SUPER_PAL, "set_super_pal"),
    (GET_SUPER_PAL, "get_super_pal"),
    (INITIALIZE, "initialize"),
    (SET_DRIVE_KEY, "set_drive_key"),
    (INQUIRY, "inquiry"),
    (READ_AUDIT, "read_audit"),
    (SCRUB, "scrub"),
    (SET_IDENTITY_KEY, "set_identity_key"),
    (RETIRE_IDENTITY_KEY, "retire_identity_key"),
];

/// The `op` label of an opcode that names no operation.
const UNKNOWN_OP: &str = "unknown";

/// The name of `opcode` (its `op` label; `unknown` for one that names no
/// operation), as metrics and log spans show it.
pub(crate) fn op_label(opcode: u16) -> &'static str {
    OPERATIONS.iter().find(|&&(code, _)| code == opcode).map_or(UNKNOWN_OP, |&(_, op)| op)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// One operation's counters, found by index on the hot path.
#[derive(Debug)]
struct PerOp {
    requests: Counter,
    duration: Histogram,
}

#[derive(Debug)]
struct Families {
    requests: Family<OpLabels, Counter>,
    duration: Family<OpLabels, Histogram>,
    refusals: CountersByCode,
    data_bytes: Family<OpLabels, Counter>,
    connections: Gauge,
    accepted: Counter,
    connections_refused: Family<ReasonLabels, Counter>,
    capability_key_cache: Family<ResultLabels, Counter>,
    prefetch_hints: Family<OutcomeLabels, Counter>,
    /// Indexed like `OPERATIONS`, then `unknown`.
    per_op: Vec<PerOp>,
    read_bytes: Counter,
    written_bytes: Counter,
    refused_drive_limit: Counter,
    refused_peer_limit: Counter,
    cache_hits: Counter,
    cache_misses: Counter,
    /// The store whose size a scrape reports (the one being served).
    store: Mutex<Weak<Store>>,
}

/// A drive's metrics; clones share them (see the module doc).
#[derive(Clone, Debug)]
pub struct DriveMetrics {
    families: Arc<Families>,
}

impl Default for DriveMetrics {
    fn default() -> Self {
        DriveMetrics::new()
    }
}

impl DriveMetrics {
    /// Fresh families, every label set created.
    pub fn new() -> DriveMetrics {
        let requests = Family::<OpLabels, Counter>::default();
        let duration =
            Family::<OpLabels, Histogram>::new_with_constructor(nasd_metrics::latency_histogram as fn() -> Histogram);
        let per_op = OPERATIONS
            .iter()
            .map(|&(_, op)| op)
            .chain([UNKNOWN_OP])
            .map(|op| PerOp {
                requests: requests.get_or_create_owned(&OpLabels { op }),
                duration: duration.get_or_create_owned(&OpLabels { op }),
            })
            .collect();
        let data_bytes = Family::<OpLabels, Counter>::default();
        let connections_refused = Family::<ReasonLabels, Counter>::default();
        let refused = |reason: &str| connections_refused.get_or_create_owned(&ReasonLabels { reason: reason.into() });
        let capability_key_cache = Family::<ResultLabels, Counter>::default();
        let families = Families {
            per_op,
            read_bytes: data_bytes.get_or_create_owned(&OpLabels { op: "read" }),
            written_bytes: data_bytes.get_or_create_owned(&OpLabels { op: "write" }),
            refused_drive_limit: refused("drive_limit"),
            refused_peer_limit: refused("peer_limit"),
            cache_hits: capability_key_cache.get_or_create_owned(&ResultLabels { result: "hit" }),
            cache_misses: capability_key_cache.get_or_create_owned(&ResultLabels { result: "miss" }),
            requests,
            duration,
            refusals: CountersByCode::drive_statuses("reason"),
            data_bytes,
            connections: Gauge::default(),
            accepted: Counter::default(),
            connections_refused,
            capability_key_cache,
            prefetch_hints: Family::default(),
            store: Mutex::new(Weak::new()),
        };
        DriveMetrics { families: Arc::new(families) }
    }

    /// Registers the families in `metrics` under `nasd_drive_`, each sample
    /// labelled `drive="<label>"` if `label` is given (several drives in one
    /// process).
    pub fn register(&self, metrics: &Metrics, label: Option<String>) {
        let f = &self.families;
        metrics.register("drive", label.map(|l| ("drive", l)), |r: &mut Registry| {
            r.register("requests", "Requests by operation, whatever their outcome", f.requests.clone());
            r.register_with_unit(
                "request_duration",
                "From a request's last byte read to its reply's last byte sent",
                Unit::Seconds,
                f.duration.clone(),
            );
            r.register("refusals", "Requests answered with a status other than OK, by status", f.refusals.family());
            r.register("data_bytes", "Object bytes sent by reads and stored by writes", f.data_bytes.clone());
            r.register("connections", "Connections open", f.connections.clone());
            r.register("connections_accepted", "Connections admitted", f.accepted.clone());
            r.register("connections_refused", "Connections closed at accept, by limit", f.connections_refused.clone());
            r.register(
                "capability_key_cache",
                "Capability keys found cached or computed",
                f.capability_key_cache.clone(),
            );
            r.register(
                "prefetch_hints",
                "prefetch-v1 hints accepted, read ahead, or dropped, by outcome",
                f.prefetch_hints.clone(),
            );
            r.register_collector(Box::new(StoreSize(self.families.clone())));
        });
    }

    /// Counts one request with opcode `opcode` that ended with `status`
    /// after `took`.
    pub(crate) fn request(&self, opcode: u16, status: Status, took: Duration) {
        let index = OPERATIONS.iter().position(|&(code, _)| code == opcode).unwrap_or(OPERATIONS.len());
        let op = &self.families.per_op[index];
        op.requests.inc();
        op.duration.observe(took.as_secs_f64());
        if status != Status::Ok {
            self.families.refusals.inc(status as usize);
        }
    }

    /// Counts a frame refused before it was read whole (bad framing).
    pub(crate) fn refused(&self, status: Status) {
        debug_assert!(status != Status::Ok);
        self.families.refusals.inc(status as usize);
    }

    pub(crate) fn read_bytes(&self, bytes: u64) {
        self.families.read_bytes.inc_by(bytes);
    }

    /// Object bytes this drive has sent in reads so far
    /// (`nasd_drive_data_bytes_total{op="read"}`).
    pub fn read_bytes_total(&self) -> u64 {
        self.families.read_bytes.get()
    }

    /// Requests of operation `op` (its label, e.g. `"read"`) this drive has
    /// answered so far, whatever their outcome; 0 for an unknown name.
    pub fn requests_total(&self, op: &str) -> u64 {
        OPERATIONS.iter().position(|&(_, name)| name == op).map_or(0, |i| self.families.per_op[i].requests.get())
    }

    /// Requests of every operation this drive has answered so far.
    pub fn requests_all(&self) -> u64 {
        self.families.per_op.iter().map(|op| op.requests.get()).sum()
    }

    pub(crate) fn written_bytes(&self, bytes: u64) {
        self.families.written_bytes.inc_by(bytes);
    }

    /// A connection admitted; the gauge goes down when the guard drops.
    pub(crate) fn connection_opened(&self) -> OpenConnection {
        self.families.accepted.inc();
        self.families.connections.inc();
        OpenConnection(self.clone())
    }

    pub(crate) fn connection_refused_drive_limit(&self) {
        self.families.refused_drive_limit.inc();
    }

    pub(crate) fn connection_refused_peer_limit(&self) {
        self.families.refused_peer_limit.inc();
    }

    /// Counts `n` prefetch hints with `outcome`.
    pub(crate) fn prefetch_hints(&self, outcome: &'static str, n: u64) {
        if n > 0 {
            self.families.prefetch_hints.get_or_create(&OutcomeLabels { outcome }).inc_by(n);
        }
    }

    /// Prefetch hints counted with `outcome` so far.
    pub fn prefetch_hints_total(&self, outcome: &'static str) -> u64 {
        self.families.prefetch_hints.get_or_create(&OutcomeLabels { outcome }).get()
    }

    /// Blocks reads found in the served store's prefetch cache so far.
    pub fn prefetch_cache_hits(&self) -> u64 {
        let store = self.families.store.lock().expect("metrics store slot poisoned").upgrade();
        store.map_or(0, |s| s.block_cache().hits())
    }

    /// Bytes the served store's prefetch cache holds now.
    pub fn prefetch_cache_bytes(&self) -> u64 {
        let store = self.families.store.lock().expect("metrics store slot poisoned").upgrade();
        store.map_or(0, |s| s.block_cache().used())
    }

    pub(crate) fn capability_key_cache(&self, hit: bool) {
        let f = &self.families;
        if hit { &f.cache_hits } else { &f.cache_misses }.inc();
    }

    /// Reports `store`'s size at each scrape from now on ([`crate::serve`]
    /// does it too; a process that announces its endpoint before serving
    /// calls it first, so the first scrape has the size).
    pub fn serving(&self, store: &Arc<Store>) {
        *self.families.store.lock().expect("metrics store slot poisoned") = Arc::downgrade(store);
    }
}

/// Holds one connection in `nasd_drive_connections`.
pub(crate) struct OpenConnection(DriveMetrics);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.families.connections.dec();
    }
}

/// The store's capacity and use, read when scraped.
#[derive(Debug)]
struct StoreSize(Arc<Families>);

impl Collector for StoreSize {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let store = self.0.store.lock().expect("metrics store slot poisoned").upgrade();
        let Some(store) = store else { return Ok(()) };
        let info = store.info();
        for (name, help, value) in [
            ("capacity", "The store's capacity", info.capacity_bytes),
            ("used", "Bytes the store's blocks hold", info.used_bytes),
        ] {
            let gauge = ConstGauge::new(value as i64);
            gauge.encode(encoder.encode_descriptor(name, help, Some(&Unit::Bytes), gauge.metric_type())?)?;
        }
        let cache = store.block_cache();
        let held = ConstGauge::new(cache.used() as i64);
        held.encode(encoder.encode_descriptor(
            "prefetch_cache",
            "Bytes the prefetch cache holds",
            Some(&Unit::Bytes),
            held.metric_type(),
        )?)?;
        let hits = ConstCounter::new(cache.hits());
        hits.encode(encoder.encode_descriptor(
            "prefetch_cache_hits",
            "Blocks reads found in the prefetch cache",
            None,
            hits.metric_type(),
        )?)?;
        Ok(())
    }
}
