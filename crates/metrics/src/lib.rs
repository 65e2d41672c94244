//! nasd's metrics: the registry every daemon fills with its own families, and
//! the small HTTP endpoint that serves it to Prometheus.
//!
//! [`Metrics`] owns one `prometheus_client` registry whose names all start
//! with `nasd_`. A daemon creates its families (counters, gauges, histograms
//! — atomics, nothing allocated per request: label sets are pre-created at
//! start) and registers them under its own prefix (`drive`, `manager`, …),
//! with a label such as `drive="3"` when one process runs several of the same
//! kind ([`Metrics::register`]). This crate knows no daemon: the daemons
//! depend on it, never the reverse.
//!
//! [`serve`] answers `GET /metrics` (and `HEAD`) with the OpenMetrics text
//! encoding of the registry at that moment; any other path is 404, any other
//! method 405, and a request hyper cannot parse gets its 4xx from hyper
//! (400, or 431 for a head over [`REQUEST_HEAD_MAX`]) while the endpoint
//! goes on serving. Every input is bounded: the request head
//! ([`REQUEST_HEAD_MAX`]), the time to send it ([`REQUEST_HEAD_TIMEOUT`]), a
//! connection's whole life ([`CONNECTION_LIFETIME_MAX`]) and the connections
//! open at once ([`CONNECTIONS_MAX`]; more are closed at accept). Request
//! bodies are never read.
//!
//! The endpoint has no authentication: it exposes counts, sizes and timings
//! — never a key, a capability, a user's or a file's name — and belongs on
//! loopback or a monitoring network (SECURITY.md, Metrics endpoint).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub use prometheus_client;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use nasd_proto::fs::FsStatus;
use nasd_proto::Status;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Longest request line plus headers the endpoint reads (hyper's smallest
/// read buffer); a longer head is refused with 431.
pub const REQUEST_HEAD_MAX: usize = 8 * 1024;
/// Time a client has to send a request's head once it connected (or after
/// the previous reply, on a kept-alive connection).
pub const REQUEST_HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection may stay open, whatever it does.
pub const CONNECTION_LIFETIME_MAX: Duration = Duration::from_secs(60);
/// Connections served at once; more are closed as they are accepted.
pub const CONNECTIONS_MAX: usize = 16;
/// The path the endpoint serves.
pub const METRICS_PATH: &str = "/metrics";
/// The content type of the OpenMetrics text format.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The registry of one process: clones share it.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// An empty registry whose metric names all start with `nasd_`.
    pub fn new() -> Metrics {
        Metrics { registry: Arc::new(Mutex::new(Registry::with_prefix("nasd"))) }
    }

    /// Lets `register` add families under `nasd_<prefix>_`, each sample
    /// labelled with `label` if there is one (several drives in one process:
    /// `("drive", "3")`).
    pub fn register(&self, prefix: &str, label: Option<(&'static str, String)>, register: impl FnOnce(&mut Registry)) {
        let mut registry = self.registry.lock().expect("metrics registry poisoned");
        let sub = registry.sub_registry_with_prefix(prefix);
        match label {
            Some((name, value)) => register(sub.sub_registry_with_label((Cow::Borrowed(name), Cow::Owned(value)))),
            None => register(sub),
        }
    }

    /// The registry's samples now, in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let registry = self.registry.lock().expect("metrics registry poisoned");
        let mut text = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encoding into a String cannot fail");
        text
    }
}

/// Serves `metrics` on `listener` until `shutdown` completes (see the
/// module doc for what it answers and its limits).
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = open.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, "metrics endpoint: connection limit reached; closing");
                    continue;
                };
                let metrics = metrics.clone();
                connections.spawn(async move {
                    serve_connection(socket, peer, metrics).await;
                    drop(permit);
                });
            }
        }
    }
    Ok(())
}

async fn serve_connection(socket: tokio::net::TcpStream, peer: SocketAddr, metrics: Metrics) {
    let service = hyper::service::service_fn(move |request| {
        let metrics = metrics.clone();
        async move { Ok::<_, Infallible>(answer(&request, &metrics)) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(REQUEST_HEAD_TIMEOUT)
        .max_buf_size(REQUEST_HEAD_MAX)
        .max_headers(64);
    let connection = http.serve_connection(TokioIo::new(socket), service);
    match tokio::time::timeout(CONNECTION_LIFETIME_MAX, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics endpoint: connection ended"),
        Err(_) => tracing::debug!(%peer, "metrics endpoint: connection open too long; closed"),
    }
}

/// The reply to one request.
fn answer(request: &Request<Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    if request.uri().path() != METRICS_PATH {
        return plain(StatusCode::NOT_FOUND, "not found: the metrics are at /metrics\n");
    }
    let head = match *request.method() {
        Method::GET => false,
        Method::HEAD => true,
        _ => {
            let mut reply = plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed: GET or HEAD\n");
            reply.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
            return reply;
        }
    };
    let text = metrics.encode();
    let body = if head { Bytes::new() } else { Bytes::from(text) };
    let mut reply = Response::new(Full::new(body));
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS_CONTENT_TYPE));
    reply
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut reply = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *reply.status_mut() = status;
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    reply
}

/// Buckets for request latencies in seconds: 50 µs to about 26 s, doubling.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(50e-6, 2.0, 20)
}

/// A request-latency histogram over [`latency_buckets`], the constructor
/// every daemon's `Family` of latencies takes.
pub fn latency_histogram() -> prometheus_client::metrics::histogram::Histogram {
    prometheus_client::metrics::histogram::Histogram::new(latency_buckets())
}

/// The label set of a [`CountersByCode`] sample: one `name="value"` pair.
pub type CodeLabel = [(&'static str, String); 1];

/// A counter family labelled by a status code (`status="not_found"`), whose
/// counters are all created at start and found by code: counting allocates
/// nothing and every label shows, at 0, before its first use. Drive refusals,
/// manager failures and the authentication server's refusals are all one.
#[derive(Debug)]
pub struct CountersByCode {
    family: Family<CodeLabel, Counter>,
    /// Indexed by code; `None` for a code without a label (`OK`).
    by_code: Vec<Option<Counter>>,
}

impl CountersByCode {
    /// A family labelled `label` with one counter per `(code, value)`.
    pub fn new(label: &'static str, codes: impl IntoIterator<Item = (usize, String)>) -> CountersByCode {
        let family = Family::<CodeLabel, Counter>::default();
        let mut by_code = Vec::new();
        for (code, value) in codes {
            if by_code.len() <= code {
                by_code.resize(code + 1, None);
            }
            by_code[code] = Some(family.get_or_create_owned(&[(label, value)]));
        }
        CountersByCode { family, by_code }
    }

    /// One counter per file-system status but `OK` (`FsStatus::NotFound` →
    /// `not_found`), labelled `label`: what manager and authentication
    /// server answer.
    pub fn fs_statuses(label: &'static str) -> CountersByCode {
        let failures = FsStatus::ALL.into_iter().filter(|&s| s != FsStatus::Ok);
        CountersByCode::new(label, failures.map(|s| (s as usize, snake_case(&format!("{s:?}")))))
    }

    /// One counter per drive status but `OK`, labelled `label` with the
    /// status's PROTOCOL.md name in lower case (`nonce_replayed`).
    pub fn drive_statuses(label: &'static str) -> CountersByCode {
        let refusals = Status::ALL.iter().copied().filter(|&s| s != Status::Ok);
        CountersByCode::new(label, refusals.map(|s| (s as usize, s.name().to_ascii_lowercase())))
    }

    /// Counts one of `code`; a code without a counter counts nothing.
    pub fn inc(&self, code: usize) {
        debug_assert!(self.by_code.get(code).is_some_and(Option::is_some), "code {code} has no counter");
        if let Some(Some(counter)) = self.by_code.get(code) {
            counter.inc();
        }
    }

    /// The family, to register.
    pub fn family(&self) -> Family<CodeLabel, Counter> {
        self.family.clone()
    }
}

/// A Rust variant name as a label value: `NotFound` → `not_found`.
pub fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// A scraped sample: `name{labels} value`, parsed from the text format for
/// tests and tools. Only what nasd's own endpoint writes is understood.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name (`nasd_drive_requests_total`).
    pub name: String,
    /// Its labels in order, as written.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
}

/// Parses the samples of an OpenMetrics text exposition (comment lines and
/// `# EOF` skipped); `None` if a line does not parse.
pub fn parse_samples(text: &str) -> Option<Vec<Sample>> {
    text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).map(parse_sample).collect()
}

fn parse_sample(line: &str) -> Option<Sample> {
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        None => (series, Vec::new()),
        Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}')?)?),
    };
    Some(Sample { name: name.to_string(), labels, value })
}

fn parse_labels(mut rest: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"")?;
        let end = after.find('"')?;
        labels.push((name.to_string(), after[..end].to_string()));
        rest = after[end + 1..].strip_prefix(',').unwrap_or(&after[end + 1..]);
    }
    Some(labels)
}

/// The sum of the samples named `name` whose labels include every pair of
/// `labels` (0 if none).
pub fn sum_of(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v)))
        .map(|s| s.value)
        .sum()
}

/// Most bytes [`scrape`] reads of a reply.
pub const SCRAPE_REPLY_MAX: u64 = 16 * 1024 * 1024;
/// Longest [`scrape`] waits for a whole reply.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(30);

/// Fetches `GET /metrics` from an endpoint at `addr` and parses its samples
/// (for tests and tools: one request, `Connection: close`).
pub async fn scrape(addr: SocketAddr) -> std::io::Result<Vec<Sample>> {
    let body = scrape_text(addr).await?;
    parse_samples(&body)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "metrics reply: a sample does not parse"))
}

/// The names the samples of the families an exposition declares (its
/// `# TYPE` lines) are written under: a counter `x` as `x_total`, a
/// histogram as `x_bucket`, `x_count` and `x_sum`, a gauge as `x`. (A family
/// with no label set yet is not written at all.)
pub fn family_sample_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let Some((name, kind)) = rest.split_once(' ') else { continue };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => names.extend(["_bucket", "_count", "_sum"].map(|s| format!("{name}{s}"))),
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// Fetches `GET /metrics` from an endpoint at `addr`: the exposition's text.
pub async fn scrape_text(addr: SocketAddr) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut socket = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET {METRICS_PATH} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        socket.write_all(request.as_bytes()).await?;
        let mut reply = Vec::new();
        socket.take(SCRAPE_REPLY_MAX).read_to_end(&mut reply).await?;
        Ok::<_, std::io::Error>(reply)
    };
    let reply = tokio::time::timeout(SCRAPE_TIMEOUT, fetch)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "metrics endpoint did not answer"))??;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("metrics reply: {what}"));
    let reply = String::from_utf8(reply).map_err(|_| bad("not UTF-8"))?;
    let (head, body) = reply.split_once("\r\n\r\n").ok_or_else(|| bad("no end of head"))?;
    if !head.starts_with("HTTP/1.1 200 ") {
        return Err(bad(head.lines().next().unwrap_or("empty")));
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_parse_back_with_their_labels() {
        let metrics = Metrics::new();
        let reads = Counter::<u64>::default();
        metrics.register("drive", Some(("drive", "3".to_string())), |r| {
            r.register("reads", "Reads.", reads.clone());
        });
        reads.inc_by(7);
        let samples = parse_samples(&metrics.encode()).expect("parses");
        assert_eq!(sum_of(&samples, "nasd_drive_reads_total", &[("drive", "3")]), 7.0);
        assert_eq!(sum_of(&samples, "nasd_drive_reads_total", &[("drive", "4")]), 0.0);
        assert!(parse_samples("nasd_x{a=\"1\" 2\n").is_none(), "an unclosed label set is refused");
        assert_eq!(snake_case("NotFound"), "not_found");
    }

    #[test]
    fn counters_by_code_show_every_label_at_zero_and_count_by_code() {
        let metrics = Metrics::new();
        let failures = CountersByCode::fs_statuses("status");
        let refusals = CountersByCode::drive_statuses("reason");
        metrics.register("x", None, |r| {
            r.register("failures", "Failures.", failures.family());
            r.register("refusals", "Refusals.", refusals.family());
        });
        failures.inc(FsStatus::Busy as usize);
        failures.inc(FsStatus::Busy as usize);
        refusals.inc(Status::NonceReplayed as usize);
        let samples = parse_samples(&metrics.encode()).expect("parses");
        let named = |name: &str| samples.iter().filter(|s| s.name == name).count();
        assert_eq!(named("nasd_x_failures_total"), FsStatus::ALL.len() - 1, "every status but OK, at start");
        assert_eq!(named("nasd_x_refusals_total"), Status::ALL.len() - 1);
        assert_eq!(sum_of(&samples, "nasd_x_failures_total", &[("status", "busy")]), 2.0);
        assert_eq!(sum_of(&samples, "nasd_x_failures_total", &[]), 2.0);
        assert_eq!(sum_of(&samples, "nasd_x_refusals_total", &[("reason", "nonce_replayed")]), 1.0);
        assert!(!samples.iter().any(|s| s.labels.iter().any(|(_, v)| v == "ok")), "OK is no failure");
    }

    #[test]
    fn family_sample_names_are_what_each_type_is_written_under() {
        let metrics = Metrics::new();
        let seconds =
            Family::<CodeLabel, prometheus_client::metrics::histogram::Histogram>::new_with_constructor(|| {
                prometheus_client::metrics::histogram::Histogram::new(latency_buckets())
            });
        let _ = seconds.get_or_create_owned(&[("op", "read".to_string())]);
        metrics.register("x", None, |r| {
            r.register("reads", "Reads.", Counter::<u64>::default());
            r.register_with_unit("latency", "Latency.", prometheus_client::registry::Unit::Seconds, seconds.clone());
            r.register("open", "Open.", prometheus_client::metrics::gauge::Gauge::<i64>::default());
        });
        let names = family_sample_names(&metrics.encode());
        let want = ["nasd_x_reads_total", "nasd_x_latency_seconds_bucket", "nasd_x_latency_seconds_count"];
        for name in want.iter().chain(&["nasd_x_latency_seconds_sum", "nasd_x_open"]) {
            assert!(names.contains(*name), "{name} in {names:?}");
        }
        assert_eq!(names.len(), 5, "{names:?}");
        assert_eq!(snake_case("Busy"), "busy");
    }
}
