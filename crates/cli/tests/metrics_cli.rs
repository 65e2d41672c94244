//! `nasd up` serves every daemon's metrics on one loopback endpoint, named
//! in its banner: scraped over HTTP while files are written and read, a
//! drive is sent a forged request, a login fails and the S3 gateway gets an
//! unsigned request, the counters of each daemon move by what was done; a request the endpoint cannot parse gets a
//! 4xx and it goes on serving. A manager of separate drive processes
//! serving its own endpoint shows a drive SIGKILLed in its degraded-file
//! gauge, and the drive's return in its repair counters. `nasd nfs` serves
//! its own, moved by libnfs's calls. One `nasd put` or `get` has one trace
//! id in the JSON log lines of the client, the manager and the drives; so
//! has one S3 request (its `x-amz-request-id`) in the gateway's, the
//! manager's and the drives', and one NFS call in the NFS gateway's and the
//! manager's; the manager's background passes have their own.

mod common;

use common::up::Up;
use nasd_client::{Auth, ClientError, Credential, DriveClient};
use nasd_crypto::{mint_capability, Key, MacAlgorithm};
use nasd_metrics::{scrape, sum_of, Sample};
use nasd_proto::{rights, CapabilityArgs, Protection, Status};
use std::io::{Read, Write};
use std::net::SocketAddr;

/// The HTTP endpoint the banner names on its line starting with `what`.
fn endpoint(up: &Up, what: &str) -> SocketAddr {
    let banner = up.daemon.output_once(&format!("  {what}"));
    let line = banner.lines().find_map(|l| l.trim().strip_prefix(what)).expect("the banner names it");
    let url = line.trim_start().strip_prefix("http://").expect("a URL");
    url.split(['/', ' ']).next().unwrap().parse().expect("an IP:PORT")
}

/// Sends `request` raw to `at`; the reply's status line.
fn status_line(at: SocketAddr, request: &[u8]) -> String {
    let mut socket = std::net::TcpStream::connect(at).unwrap();
    socket.set_read_timeout(Some(common::DAEMON_WAIT_MAX)).unwrap();
    socket.write_all(request).unwrap();
    let mut reply = Vec::new();
    let _ = socket.read_to_end(&mut reply);
    String::from_utf8_lossy(&reply).lines().next().unwrap_or_default().to_string()
}

/// The samples of one scrape.
fn samples(rt: &tokio::runtime::Runtime, at: SocketAddr) -> Vec<Sample> {
    rt.block_on(scrape(at)).expect("the endpoint answers")
}

/// How much `name{labels}` (summed over other labels) grew between two scrapes.
fn moved(before: &[Sample], after: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    sum_of(after, name, labels) - sum_of(before, name, labels)
}

/// A read of object 1 under a capability minted with a key the drive never
/// had: refused before anything is read. Returns the status.
async fn forged_read(drive: SocketAddr) -> Status {
    let mut client = DriveClient::connect(drive).await.expect("the drive answers");
    let args = CapabilityArgs {
        algorithm: MacAlgorithm::Blake3 as u8,
        min_protection: Protection::INTEGRITY_ARGS,
        key_version: 1,
        drive_id: client.drive_id(),
        partition: 1,
        object: 1,
        region: CapabilityArgs::WHOLE_OBJECT,
        access_control_version: 0,
        rights: rights::ALL,
        map_epoch: 0,
        expiration_ns: u64::MAX,
        audit_id: 1,
    };
    let (token, key) = mint_capability(&Key::random(), &args, false).unwrap();
    let forged = Credential::Capability { token, key, algorithm: MacAlgorithm::Blake3 };
    client.set_auth(Auth::new(forged, Protection::INTEGRITY_ARGS));
    match client.getattr(1, 1).await {
        Err(ClientError::Status { status, .. }) => status,
        other => panic!("a forged capability was not refused: {other:?}"),
    }
}

#[test]
fn nasd_up_serves_every_daemons_metrics_and_they_move() {
    let tmp = tempfile::tempdir().unwrap();
    let up = Up::start(tmp.path(), 2, &[]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let at = endpoint(&up, "metrics");
    let s3 = endpoint(&up, "s3");
    assert!(at.ip().is_loopback(), "nasd up serves metrics on loopback: {at}");
    let recorded = std::fs::read_to_string(up.data().join("nasd.toml")).unwrap();
    assert!(recorded.contains(&format!("up = \"{at}\"")), "the endpoint is recorded: {recorded}");

    // Files written and read back: drive data bytes, manager requests and auth logins move.
    let before = samples(&rt, at);
    let len = 3 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(tmp.path().join("in.bin"), &data).unwrap();
    up.ok(&["put", "in.bin", "/f.bin"]);
    up.ok(&["get", "/f.bin", "out.bin"]);
    assert_eq!(std::fs::read(tmp.path().join("out.bin")).unwrap(), data);
    let after = samples(&rt, at);
    let written = moved(&before, &after, "nasd_drive_data_bytes_total", &[("op", "write")]);
    let read = moved(&before, &after, "nasd_drive_data_bytes_total", &[("op", "read")]);
    // The file's first bytes live at the manager (small files); the rest only on drives.
    let on_drives = (len - nasd_manager::SMALL_FILE_THRESHOLD_DEFAULT as usize) as f64;
    assert!(written >= on_drives, "drives stored {written} bytes of a {len}-byte file");
    assert!(read >= on_drives, "drives sent {read} bytes of a {len}-byte file");
    assert!(moved(&before, &after, "nasd_drive_requests_total", &[("op", "write")]) >= 1.0);
    assert!(moved(&before, &after, "nasd_drive_requests_total", &[("op", "read")]) >= 1.0);
    assert!(moved(&before, &after, "nasd_manager_requests_total", &[("op", "create")]) >= 1.0);
    assert!(moved(&before, &after, "nasd_manager_request_duration_seconds_count", &[]) >= 2.0);
    assert!(moved(&before, &after, "nasd_manager_logins_total", &[]) >= 2.0, "each command logs in");
    assert!(moved(&before, &after, "nasd_auth_logins_total", &[("kind", "user")]) >= 2.0);
    for drive in 0..2u16 {
        let label = format!("127.0.0.1:{}", up.first_drive_port + drive);
        let capacity = sum_of(&after, "nasd_drive_capacity_bytes", &[("drive", &label)]);
        assert!(capacity > 0.0, "drive {label} reports its capacity");
    }

    // A forged request to a drive: its refusal is counted by reason, on that drive.
    let drive = format!("127.0.0.1:{}", up.first_drive_port);
    let status = rt.block_on(forged_read(drive.parse().unwrap()));
    let reason = status.name().to_ascii_lowercase();
    let refused = samples(&rt, at);
    let labels = [("drive", drive.as_str()), ("reason", reason.as_str())];
    assert_eq!(moved(&after, &refused, "nasd_drive_refusals_total", &labels), 1.0, "{status} counted");

    // A wrong password at the authentication server.
    let auth = format!("127.0.0.1:{}", up.auth_port());
    let ca = up.data().join("manager").join("tls").join("ca.pem");
    let tls = nasd_login::auth_client::connector(&ca).unwrap();
    let login = nasd_login::auth_client::AuthClient::login(&auth, "localhost", &tls, "admin", "not the password", 0);
    assert!(rt.block_on(login).is_err(), "a wrong password logs in");
    let failed = samples(&rt, at);
    let bad = [("status", "bad_credentials")];
    assert_eq!(moved(&refused, &failed, "nasd_auth_login_failures_total", &bad), 1.0);

    // An unsigned request to the S3 gateway: refused, and counted as a 4xx GET.
    let line = status_line(s3, b"GET /anything HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(line.contains(" 403 "), "an unsigned S3 request got {line:?}");
    let s3_after = samples(&rt, at);
    assert_eq!(moved(&failed, &s3_after, "nasd_s3_requests_total", &[("method", "GET")]), 1.0);
    assert_eq!(moved(&failed, &s3_after, "nasd_s3_responses_total", &[("class", "4xx")]), 1.0);
    assert_eq!(moved(&failed, &s3_after, "nasd_s3_responses_total", &[("class", "2xx")]), 0.0);

    // Requests the endpoint cannot serve get their 4xx; it goes on serving.
    for (request, want) in [
        (&b"BREW /coffee HTCPCP/1.0\r\n\r\n"[..], " 400 "),
        (b"GET /keys HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", " 404 "),
    ] {
        let line = status_line(at, request);
        assert!(line.contains(want), "{line:?}, want{want}");
    }
    assert!(!samples(&rt, at).is_empty(), "still serving");
}

/// `nasd drive --metrics ADDR` serves its own metrics, unlabelled: an
/// INQUIRY is counted, and the capacity it was given is reported.
#[test]
fn a_drive_alone_serves_its_metrics_where_told() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("drive");
    let drive = common::Daemon::start("drive", tmp.path(), &tmp.path().join("drive.log"), None, move |addr| {
        ["drive", "--data", common::cluster::path_str(&data), "--capacity", "64MiB", "--no-security"]
            .into_iter()
            .map(Into::into)
            .chain(["--listen".into(), addr.to_string().into(), "--metrics".into(), "127.0.0.1:0".into()])
            .collect()
    });
    let log = drive.output_once("metrics at http://");
    let url = log.lines().find_map(|l| l.strip_prefix("metrics at http://")).expect("the drive names its endpoint");
    let at: SocketAddr = url.trim_end_matches("/metrics").parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let before = samples(&rt, at);
    assert_eq!(sum_of(&before, "nasd_drive_capacity_bytes", &[]), (64 << 20) as f64);
    assert!(before.iter().all(|s| s.labels.iter().all(|(k, _)| k != "drive")), "one drive: no drive label");
    rt.block_on(async {
        let mut client = DriveClient::connect(drive.addr).await.unwrap();
        client.inquiry().await.unwrap();
    });
    let after = samples(&rt, at);
    assert_eq!(moved(&before, &after, "nasd_drive_requests_total", &[("op", "inquiry")]), 1.0);
    assert_eq!(moved(&before, &after, "nasd_drive_refusals_total", &[]), 0.0);
}

/// The address a daemon's log names on its `metrics at http://ADDR/metrics` line.
fn logged_endpoint(log: &std::path::Path) -> SocketAddr {
    let mut at = None;
    common::until("the daemon names its metrics endpoint", || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        at = text
            .lines()
            .find_map(|l| l.strip_prefix("metrics at http://"))
            .map(|u| u.trim_end_matches("/metrics").to_string());
        at.is_some()
    });
    at.unwrap().parse().expect("an IP:PORT")
}

/// Scrapes `at` until `done` holds of the samples (a hang after
/// `DAEMON_WAIT_MAX`, not a timing assertion); the samples that satisfied it.
fn scrape_until(
    rt: &tokio::runtime::Runtime,
    at: SocketAddr,
    what: &str,
    done: impl Fn(&[Sample]) -> bool,
) -> Vec<Sample> {
    let mut last = Vec::new();
    common::until(what, || {
        last = samples(rt, at);
        done(&last)
    });
    last
}

/// A manager serving its own metrics (`[metrics] manager` in the config)
/// over three drives holding `rs:2+1` files: the degraded-file gauge and
/// the drive states follow a drive SIGKILLed and started again; a file
/// written while it is down is resynced when it is back, counted as a
/// rebuilt file with its bytes; a scrub is counted with the blocks it
/// checked and its progress shows; write transactions are counted.
#[test]
fn a_killed_drive_moves_the_managers_degraded_files_and_its_return_the_repair_counters() {
    use common::cluster::{path_str, Cluster, Options};
    let settings = "default_layout = \"rs:2+1@64K\"\nrebuild_delay_secs = 3600\nsmall_file_threshold = 0\n\n\
                    [metrics]\nmanager = \"127.0.0.1:0\"\n";
    let mut c = Cluster::start(Options { drives: 3, manager: settings.to_string(), drive_args: Vec::new() });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let at = logged_endpoint(&c.dir().join("manager.log"));
    let gauge = |s: &[Sample], name: &str, labels: &[(&str, &str)]| sum_of(s, name, labels);
    let write = |c: &Cluster, name: &str, seed: u8| {
        let data: Vec<u8> = (0..(1 << 20) + 4321).map(|i: u32| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        let local = c.dir().join(name);
        std::fs::write(&local, &data).unwrap();
        c.run_ok(&["put", path_str(&local), &format!("/{name}")]);
        data
    };

    let a = write(&c, "a.bin", 1);
    let healthy = scrape_until(&rt, at, "three drives up and nothing degraded", |s| {
        gauge(s, "nasd_manager_drives", &[("state", "up")]) == 3.0
            && gauge(s, "nasd_manager_degraded_files", &[]) == 0.0
    });
    assert!(gauge(&healthy, "nasd_manager_transactions_begun_total", &[]) >= 1.0, "the put's write transaction");
    assert_eq!(gauge(&healthy, "nasd_manager_drives", &[("state", "down")]), 0.0);

    // Killed: the file with a component there is degraded.
    let victim = c.drives[0].number;
    c.drive(victim).kill();
    let down = scrape_until(&rt, at, "the killed drive down and a file degraded", |s| {
        gauge(s, "nasd_manager_drives", &[("state", "down")]) == 1.0
            && gauge(s, "nasd_manager_degraded_files", &[]) >= 1.0
    });
    assert_eq!(gauge(&down, "nasd_manager_drives", &[("state", "up")]), 2.0);

    // The file rewritten in place meanwhile misses the drive; back, it is resynced and nothing is
    // degraded.
    let mut a = a;
    let patch: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    a[1000..1000 + patch.len()].copy_from_slice(&patch);
    rt.block_on(async {
        let fs = c.login().await;
        let f = fs.open("/a.bin", true).await.expect("open for writing");
        f.write_at(1000, &patch).await.expect("a write with a drive down");
        f.close().await.expect("close");
    });
    c.drive(victim).start();
    let back = scrape_until(&rt, at, "the drive back, the missed writes resynced", |s| {
        gauge(s, "nasd_manager_drives", &[("state", "up")]) == 3.0
            && gauge(s, "nasd_manager_degraded_files", &[]) == 0.0
            && gauge(s, "nasd_manager_repaired_files_total", &[("task", "rebuild")]) >= 1.0
    });
    assert!(gauge(&back, "nasd_manager_repaired_bytes_total", &[("task", "rebuild")]) > 0.0, "the resync copied bytes");
    assert_eq!(gauge(&back, "nasd_manager_repaired_files_total", &[("task", "rebalance")]), 0.0);
    assert!(moved(&healthy, &back, "nasd_manager_transactions_begun_total", &[]) >= 2.0, "the rewrite and the resync");
    let out = c.dir().join("a.back");
    c.run_ok(&["get", "/a.bin", path_str(&out)]);
    assert_eq!(std::fs::read(&out).unwrap(), a, "the file after the drive's return");

    // A scrub: counted with what it checked, its progress reported (done, nothing planned).
    c.run_ok(&["repair", "scrub"]);
    let scrubbed = samples(&rt, at);
    assert_eq!(moved(&back, &scrubbed, "nasd_manager_scrubs_total", &[]), 1.0);
    assert!(moved(&back, &scrubbed, "nasd_manager_scrub_checked_blocks_total", &[]) > 0.0, "blocks checked");
    assert_eq!(gauge(&scrubbed, "nasd_manager_scrub_corrupt_blocks_total", &[]), 0.0, "nothing rotten");
    let progress = [("task", "scrub"), ("of", "planned")];
    assert!(scrubbed.iter().any(|s| s.name == "nasd_manager_repair_progress_files"
        && progress.iter().all(|(k, v)| s.labels.iter().any(|(sk, sv)| sk == k && sv == v))));
}

/// Every PromQL expression of `ops/grafana/nasd.json` (its `expr` fields)
/// and of `ops/prometheus/nasd-alerts.yml` (its `expr:` lines).
fn shipped_queries() -> Vec<(String, String)> {
    fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                        _ => exprs(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
            _ => {}
        }
    }
    let ops = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ops");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ops.join("grafana/nasd.json")).unwrap()).expect("valid JSON");
    let mut ids: Vec<u64> = dashboard["panels"].as_array().unwrap().iter().map(|p| p["id"].as_u64().unwrap()).collect();
    let panels = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), panels, "panel ids are unique");
    let mut found = Vec::new();
    exprs(&dashboard, &mut found);
    let mut queries: Vec<(String, String)> = found.into_iter().map(|e| ("grafana/nasd.json".to_string(), e)).collect();
    let rules = std::fs::read_to_string(ops.join("prometheus/nasd-alerts.yml")).unwrap();
    let alerts = rules.lines().filter_map(|l| l.trim().strip_prefix("expr:")).map(|e| e.trim().to_string());
    queries.extend(alerts.map(|e| ("prometheus/nasd-alerts.yml".to_string(), e)));
    queries
}

/// The metric names `expr` queries, each with the label values its
/// selector asks for (`k="v"`, and each alternative of `k=~"a|b"`).
fn queried(expr: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("nasd_") {
        let after = &rest[at..];
        let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
        let (name, tail) = after.split_at(end);
        let mut wanted = Vec::new();
        if let Some(selector) = tail.strip_prefix('{').and_then(|t| t.split_once('}')).map(|(s, _)| s) {
            for matcher in selector.split(',').map(str::trim).filter(|m| !m.is_empty()) {
                let (key, value) = matcher.split_once('=').expect("a label matcher");
                let (regex, value) = match value.strip_prefix('~') {
                    Some(v) => (true, v),
                    None => (false, value),
                };
                let value = value.trim_matches('"');
                let values: Vec<&str> = if regex { value.split('|').collect() } else { vec![value] };
                wanted.extend(values.into_iter().map(|v| (key.to_string(), v.to_string())));
            }
        }
        out.push((name.to_string(), wanted));
        rest = tail;
    }
    out
}

/// The shipped Grafana dashboard and alert rules query only metrics nasd
/// serves, with label values it writes: their names against what a running
/// `nasd up` (after a file written and read back, a login refused and an
/// S3 request) and a mount's families declare, so neither can rot as
/// metrics are renamed. Every daemon has its panels.
#[test]
fn the_dashboard_and_alert_rules_query_only_metrics_that_exist() {
    let tmp = tempfile::tempdir().unwrap();
    let up = Up::start(tmp.path(), 2, &[]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (at, s3) = (endpoint(&up, "metrics"), endpoint(&up, "s3"));
    std::fs::write(tmp.path().join("in.bin"), vec![7u8; 2 << 20]).unwrap();
    up.ok(&["put", "in.bin", "/f.bin"]);
    up.ok(&["get", "/f.bin", "out.bin"]);
    status_line(s3, b"GET /anything HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mount = nasd_metrics::Metrics::new();
    nasd_fuse::MountMetrics::new().register(&mount);
    nasd_nfs::NfsMetrics::new().register(&mount);
    let text = rt.block_on(nasd_metrics::scrape_text(at)).expect("the endpoint answers") + &mount.encode();
    let names = nasd_metrics::family_sample_names(&text);
    let samples = nasd_metrics::parse_samples(&text.replace("# EOF\n", "")).expect("parses");

    let queries = shipped_queries();
    assert!(queries.len() >= 30, "{} queries found", queries.len());
    for (file, expr) in &queries {
        let metrics = queried(expr);
        assert!(!metrics.is_empty(), "{file}: {expr:?} queries no nasd metric");
        for (name, labels) in metrics {
            assert!(names.contains(&name), "{file}: {expr:?} queries {name}, which nothing serves");
            for (key, value) in labels {
                let written =
                    samples.iter().any(|s| s.name == name && s.labels.iter().any(|(k, v)| *k == key && *v == value));
                assert!(written, "{file}: {expr:?} selects {name}{{{key}=\"{value}\"}}, which is never written");
            }
        }
    }
    for daemon in ["drive", "manager", "auth", "s3", "mount", "nfs"] {
        let prefix = format!("nasd_{daemon}_");
        assert!(queries.iter().any(|(f, e)| f.starts_with("grafana") && e.contains(&prefix)), "no panel for {daemon}");
    }
}

/// `nasd drive --log-format json` writes one JSON object a line, and what
/// it logs while handling a request carries that request's span: a forged
/// request's refusal is logged with the peer, the operation and the frame's
/// request id (in the line's `span`), its own message intact.
#[test]
fn a_drive_logs_json_lines_in_the_span_of_each_request() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, log) = (tmp.path().join("drive"), tmp.path().join("drive.log"));
    let args = move |addr: SocketAddr| -> Vec<std::ffi::OsString> {
        let data = common::cluster::path_str(&data).to_string();
        let listen = addr.to_string();
        ["--log-format", "json", "drive", "--data", &data, "--capacity", "64MiB", "--listen", &listen]
            .into_iter()
            .map(Into::into)
            .collect()
    };
    let drive = common::Daemon::start_with_env("drive", tmp.path(), &log, None, &[("NASD_LOG", "debug")], args);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let status = rt.block_on(forged_read(drive.addr));
    let refused = status.name().to_string();
    let mut found = None;
    common::until("the refusal logged", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        assert!(lines.iter().any(|l| l["fields"]["message"] == "store opened"), "the drive's info lines are JSON");
        found = lines.into_iter().find(|l| l["fields"]["message"] == "request refused");
        found.is_some()
    });
    let line = found.unwrap();
    assert_eq!(line["level"], "DEBUG", "{line}");
    assert!(line["fields"]["status"].as_str().is_some_and(|s| s.contains(&refused)), "{line}");
    let span = &line["span"];
    assert_eq!((span["name"].as_str(), span["op"].as_str()), (Some("request"), Some("getattr")), "{line}");
    assert!(span["id"].as_u64().is_some(), "the frame's request id: {line}");
    assert!(span["peer"].as_str().is_some_and(|p| p.starts_with("127.0.0.1:")), "{line}");
}

/// The JSON objects among `text`'s lines.
fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines().filter(|l| l.starts_with('{')).filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// The trace id of the spans `line` was logged in, if one has one.
fn trace_of(line: &serde_json::Value) -> Option<String> {
    let spans = line["spans"].as_array()?;
    spans.iter().find_map(|s| s["trace_id"].as_str().map(str::to_string))
}

/// One `nasd put` is one operation: the trace id its own JSON log lines
/// carry is on the lines the manager and the drives log for the requests it
/// made them (docs/PROTOCOL.md, "Trace ids"), and a `nasd get` after it has
/// another, which the drives log for its reads.
#[test]
fn one_command_has_one_trace_id_from_client_to_manager_to_drives() {
    let tmp = tempfile::tempdir().unwrap();
    let daemons = [("NASD_LOG", "nasd_manager=debug,nasd_drive=debug,warn"), ("NASD_LOG_FORMAT", "json")];
    let _up = Up::start_with(tmp.path(), 2, None, &[], &daemons);
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 13 % 251) as u8).collect();
    std::fs::write(tmp.path().join("in.bin"), &data).unwrap();
    let client = [("NASD_LOG", "nasd_client=debug"), ("NASD_LOG_FORMAT", "json")];
    let command_trace = |args: &[&str]| -> String {
        let out = common::up::nasd_in(tmp.path(), args, &client);
        let stderr = common::up::text(&out.stderr);
        assert!(out.status.success(), "nasd {args:?} failed: {stderr}");
        let done = json_lines(&stderr)
            .into_iter()
            .find(|l| l["fields"]["message"] == "operation done")
            .unwrap_or_else(|| panic!("nasd {args:?} logged no operation line: {stderr}"));
        assert_eq!(done["span"]["name"], "operation", "{done}");
        assert_eq!(done["span"]["op"], args[0], "{done}");
        let id = trace_of(&done).expect("the operation's span has a trace id");
        assert!(id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        id
    };
    let put = command_trace(&["put", "in.bin", "/f.bin"]);
    let get = command_trace(&["get", "/f.bin", "out.bin"]);
    assert_eq!(std::fs::read(tmp.path().join("out.bin")).unwrap(), data);
    assert_ne!(put, get, "each command is its own operation");

    // The daemons' lines for each operation: requests the manager answered, and requests the
    // drives answered (writes for the put, reads for the get).
    let logged = |id: &str, target: &str, op: Option<&str>| -> usize {
        let text = std::fs::read_to_string(tmp.path().join("up.log")).unwrap();
        json_lines(&text)
            .iter()
            .filter(|l| l["target"].as_str().is_some_and(|t| t.starts_with(target)))
            .filter(|l| l["fields"]["message"] == "request done" && trace_of(l).as_deref() == Some(id))
            .filter(|l| op.is_none_or(|op| l["span"]["op"] == op))
            .count()
    };
    common::until("the daemons logged both operations", || {
        logged(&put, "nasd_drive", Some("write")) > 0 && logged(&get, "nasd_drive", Some("read")) > 0
    });
    assert!(logged(&put, "nasd_manager", Some("create")) > 0, "the manager logged the put's create under its id");
    assert!(logged(&put, "nasd_manager", Some("commit")) > 0, "… and its commit");
    assert!(logged(&get, "nasd_manager", None) > 0, "the manager logged the get's requests under its id");
    assert_eq!(logged(&put, "nasd_drive", Some("read")), 0, "the put read nothing from the drives");
}

/// An S3 request is one operation with an id of its own: the id boto3 gets
/// as the response's `x-amz-request-id` (its `RequestId`) is the trace id of
/// the gateway's request span, and of the manager's and the drives' lines
/// for the requests that PUT made. The manager's background work has ids of
/// its own (a `background` span naming the work), which its drive requests
/// carry, so those are told apart from the client's.
#[test]
fn an_s3_request_has_one_trace_id_from_gateway_to_manager_to_drives() {
    let tmp = tempfile::tempdir().unwrap();
    let daemons = [("NASD_LOG", "nasd_s3=debug,nasd_manager=debug,nasd_drive=debug,warn"), ("NASD_LOG_FORMAT", "json")];
    let up = Up::start_with(tmp.path(), 2, None, &[], &daemons);
    let endpoint = format!("http://{}", endpoint(&up, "s3"));
    let script = r#"
import sys, boto3
from botocore.config import Config
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
s3.create_bucket(Bucket="traced")
r = s3.put_object(Bucket="traced", Key="object.bin", Body=bytes(range(256)) * 4096)
print(r["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"])
print(r["ResponseMetadata"]["RequestId"])
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, &endpoint])
        .env("AWS_SHARED_CREDENTIALS_FILE", up.data().join("s3").join("credentials"))
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_PROFILE")
        .output()
        .expect("run python3 (boto3)");
    let said = common::up::text(&out.stdout);
    assert!(out.status.success(), "boto3: {said}{}", common::up::text(&out.stderr));
    let ids: Vec<&str> = said.lines().collect();
    assert_eq!(ids.len(), 2, "{said}");
    let put = ids[0].to_string();
    assert_eq!(ids[1], put, "boto3 takes the header as the request id");
    assert!(put.len() == 32 && put.bytes().all(|b| b.is_ascii_hexdigit()), "{put}");

    let lines = || json_lines(&std::fs::read_to_string(tmp.path().join("up.log")).unwrap());
    let done_by = |lines: &[serde_json::Value], target: &str, id: &str, op: Option<&str>| -> usize {
        lines
            .iter()
            .filter(|l| l["target"].as_str().is_some_and(|t| t.starts_with(target)))
            .filter(|l| l["fields"]["message"] == "request done" && trace_of(l).as_deref() == Some(id))
            .filter(|l| op.is_none_or(|op| l["span"]["op"] == op))
            .count()
    };
    // The manager's background passes: their ids, by the work they name.
    let background = |lines: &[serde_json::Value], work: &str| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["fields"]["message"] == "background work done" && l["span"]["work"] == work)
            .filter_map(trace_of)
            .collect()
    };
    common::until("the gateway, the manager and the drives logged the PUT, and heartbeats went out", || {
        let lines = lines();
        done_by(&lines, "nasd_drive", &put, Some("write")) > 0
            && done_by(&lines, "nasd_s3", &put, None) > 0
            && background(&lines, "heartbeat").iter().any(|id| done_by(&lines, "nasd_drive", id, None) > 0)
    });
    let lines = lines();
    let gateway = lines
        .iter()
        .find(|l| {
            l["target"] == "nasd_s3" && l["fields"]["message"] == "request done" && trace_of(l).as_deref() == Some(&put)
        })
        .expect("the gateway's line for the PUT");
    assert_eq!(gateway["span"]["name"], "request", "{gateway}");
    assert_eq!(gateway["span"]["method"], "PUT", "{gateway}");
    assert_eq!(gateway["span"]["path"], "/traced/object.bin", "{gateway}");
    assert!(
        done_by(&lines, "nasd_manager", &put, Some("create")) > 0,
        "the manager logged the PUT's create under its id"
    );
    assert!(done_by(&lines, "nasd_manager", &put, None) > 1, "… and the rest of its requests");

    // Background work: each pass its own id, none of them a client's.
    let heartbeats = background(&lines, "heartbeat");
    let maintenance = background(&lines, "maintenance");
    assert!(!maintenance.is_empty(), "maintenance passes ran under ids of their own");
    let all: Vec<&String> = heartbeats.iter().chain(&maintenance).collect();
    let distinct: std::collections::HashSet<&String> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "each pass has an id of its own");
    assert!(!distinct.contains(&put), "no background pass has the client's id");
}

/// `nasd nfs --metrics ADDR` serves the NFS gateway's metrics: a file copied
/// in and out with libnfs and a read of a name that does not exist move its
/// calls by procedure, their latency, the bytes read and written, and the
/// errors by status (`noent`).
#[test]
fn the_nfs_gateway_serves_its_metrics_by_procedure_and_status() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let json = [("NASD_LOG", "nasd_manager=debug,warn"), ("NASD_LOG_FORMAT", "json")];
    let up = Up::start_with(cwd, 2, None, &["--no-s3"], &json);
    up.ok(&["admin", "set-gateway", "admin", "--ids", "1000-60000"]);
    up.ok(&["mkdir", "/pub"]);
    up.ok(&["chmod", "777", "/pub"]);
    let gateway_log = [("NASD_LOG", "nasd_nfs=debug,warn"), ("NASD_LOG_FORMAT", "json")];
    let gateway = common::Daemon::start_with_env("nasd nfs", cwd, &cwd.join("nfs.log"), None, &gateway_log, |addr| {
        ["nfs", "--listen", &addr.to_string(), "--metrics", "127.0.0.1:0"].into_iter().map(Into::into).collect()
    });
    let line = gateway.output_once("metrics at http://");
    let at: SocketAddr = line
        .lines()
        .find_map(|l| l.strip_prefix("metrics at http://"))
        .and_then(|l| l.strip_suffix("/metrics"))
        .expect("the gateway names its endpoint")
        .parse()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let before = samples(&rt, at);
    assert!(
        sum_of(&before, "nasd_nfs_requests_total", &[("proc", "write")]) == 0.0
            && before.iter().any(|s| s.name == "nasd_nfs_errors_total"),
        "every family is served before the first call"
    );

    let data: Vec<u8> = (0..(1u32 << 20) + 5).map(|i| (i * 31 % 253) as u8).collect();
    std::fs::write(cwd.join("in.bin"), &data).unwrap();
    let port = gateway.addr.port();
    let url = |path: &str| format!("nfs://127.0.0.1{path}?nfsport={port}&mountport={port}&uid=1000&gid=1000");
    let libnfs = |tool: &str, args: &[&str]| {
        std::process::Command::new(tool)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {tool} (libnfs-utils): {e}"))
    };
    let copied = libnfs("nfs-cp", &[cwd.join("in.bin").to_str().unwrap(), &url("/pub/in.bin")]);
    assert!(copied.status.success(), "nfs-cp: {}", String::from_utf8_lossy(&copied.stderr));
    let read = libnfs("nfs-cat", &[&url("/pub/in.bin")]);
    assert!(read.status.success() && read.stdout == data, "nfs-cat: {}", String::from_utf8_lossy(&read.stderr));
    let missing = libnfs("nfs-cat", &[&url("/pub/not-there")]);
    assert!(!missing.status.success(), "nfs-cat of a missing file succeeded");

    let after = samples(&rt, at);
    let len = data.len() as f64;
    assert!(moved(&before, &after, "nasd_nfs_requests_total", &[("proc", "write")]) >= 1.0);
    assert!(moved(&before, &after, "nasd_nfs_requests_total", &[("proc", "read")]) >= 1.0);
    assert!(moved(&before, &after, "nasd_nfs_requests_total", &[("proc", "lookup")]) >= 2.0);
    assert!(moved(&before, &after, "nasd_nfs_request_duration_seconds_count", &[("proc", "read")]) >= 1.0);
    assert_eq!(moved(&before, &after, "nasd_nfs_data_bytes_total", &[("op", "write")]), len, "bytes written");
    assert!(moved(&before, &after, "nasd_nfs_data_bytes_total", &[("op", "read")]) >= len, "bytes read");
    assert!(moved(&before, &after, "nasd_nfs_errors_total", &[("status", "noent")]) >= 1.0, "the missing name");
    assert_eq!(moved(&before, &after, "nasd_nfs_errors_total", &[("status", "io")]), 0.0);

    // Each call is one operation: nfs-cp's CREATE has a trace id of its own on the gateway's
    // request span, and the manager logged the create it made under that id.
    let calls = json_lines(&std::fs::read_to_string(cwd.join("nfs.log")).unwrap());
    let create = calls
        .iter()
        .find(|l| l["fields"]["message"] == "request done" && l["span"]["proc"] == "create")
        .unwrap_or_else(|| panic!("no request line of the CREATE: {calls:?}"));
    assert_eq!(create["span"]["name"], "request", "{create}");
    let id = trace_of(create).expect("the call's span has a trace id");
    let others: std::collections::HashSet<String> =
        calls.iter().filter(|l| l["fields"]["message"] == "request done").filter_map(trace_of).collect();
    assert!(others.len() > 2, "each call its own id: {others:?}");
    common::until("the manager logged the CREATE's create under its id", || {
        let text = std::fs::read_to_string(cwd.join("up.log")).unwrap();
        json_lines(&text).iter().any(|l| {
            l["target"].as_str().is_some_and(|t| t.starts_with("nasd_manager"))
                && l["fields"]["message"] == "request done"
                && l["span"]["op"] == "create"
                && trace_of(l).as_deref() == Some(id.as_str())
        })
    });
}
