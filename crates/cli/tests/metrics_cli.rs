//! `nasd up` serves every daemon's metrics on one loopback endpoint, named
//! in its banner: scraped over HTTP while files are written and read, a
//! drive is sent a forged request, a login fails and the S3 gateway gets an
//! unsigned request, the counters of each daemon move by what was done; a request the endpoint cannot parse gets a
//! 4xx and it goes on serving.

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
