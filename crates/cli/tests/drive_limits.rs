//! The real `nasd drive` binary under faults and floods: a panic in a store
//! task stops it (fail-stop); one host cannot take every connection; idle
//! unauthenticated connections are dropped; a thousand connections
//! announcing huge writes leave its memory where it was.

mod common;

use common::{Daemon, DAEMON_WAIT_MAX};
use nasd_client::{Auth, Credential, DriveClient};
use nasd_crypto::Key;
use nasd_drive::{UNAUTHENTICATED_AUDIT_BURST, UNAUTHENTICATED_AUDIT_PER_SEC};
use nasd_proto::well_known::PARTITION_CONTENTS;
use nasd_proto::{not_itemized, opcode, AuditRecord, Protection, Status};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// The drive binary on `dir`/drive (security off unless `secure`), with `env`
/// added to its environment.
fn drive(dir: &Path, secure: bool, env: &[(&str, &str)]) -> Daemon {
    let data = dir.join("drive");
    Daemon::start_with_env("drive", dir, &dir.join("drive.log"), None, env, move |addr| {
        let mut args: Vec<OsString> = vec!["drive".into(), "--data".into(), data.clone().into()];
        args.extend(["--listen".into(), addr.to_string().into(), "--capacity".into(), "64MiB".into()]);
        if !secure {
            args.push("--no-security".into());
        }
        args
    })
}

/// A panic in a store task stops the drive process: the request gets no
/// reply, the process aborts and says why (fail-stop, ARCHITECTURE.md). It
/// used to become an `IO_ERROR` reply — the task's `JoinError` mapped to
/// `StoreError::Corrupt` — and the drive went on serving from whatever state
/// the panic left. The panic is injected by the drive's test-only fault
/// point (cargo feature `fault-injection`, armed by the environment).
#[test]
fn a_panic_in_a_store_task_stops_the_drive() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let getattr = format!("{:#06x}", nasd_proto::opcode::GETATTR);
    let mut d = drive(tmp.path(), false, &[("NASD_FAULT_PANIC_IN_OPCODE", &getattr)]);
    let addr = d.addr;
    runtime().block_on(async {
        let mut c = DriveClient::connect(addr).await.expect("connect");
        c.create_partition(1).await.expect("other store tasks run");
        let (object, _) = c.create(1).await.expect("create");
        let e = tokio::time::timeout(DAEMON_WAIT_MAX, c.getattr(1, object))
            .await
            .expect("the drive neither answered nor closed the connection")
            .expect_err("a panicked store task gets no reply");
        assert!(e.status().is_none(), "the drive answered the request with a status: {e}");
    });
    let status = d.wait_exit().unwrap_or_else(|| panic!("the drive is still running; log:\n{}", d.log_tail()));
    assert_eq!(status.signal(), Some(libc::SIGABRT), "{status}; log:\n{}", d.log_tail());
    assert!(d.output().contains("a drive task panicked"), "the drive says why it stopped:\n{}", d.log_tail());
}

/// The master key a drive serving `dir`/drive made as it started (it
/// listens first, so wait for the file).
fn master_key(dir: &Path) -> Key {
    let deadline = Instant::now() + DAEMON_WAIT_MAX;
    loop {
        match nasd_crypto::read_key_file(&dir.join("drive").join("master.key")) {
            Ok(k) => return k,
            Err(e) => assert!(Instant::now() < deadline, "no master key: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A connection authorized by `drive_key`, with integrity on arguments.
async fn drive_key_client(addr: SocketAddr, drive_key: &Key) -> DriveClient {
    let mut c = DriveClient::connect(addr).await.expect("connect");
    c.set_auth(Auth::new(Credential::Drive(drive_key.clone()), Protection::INTEGRITY_ARGS));
    c
}

async fn timed<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DAEMON_WAIT_MAX, f).await.unwrap_or_else(|_| panic!("{what} hung"))
}

/// Key management writes its setting (an SQLite commit with fsync) without
/// the key ring's lock, on a blocking thread: while one such write stalls,
/// other requests — whose key lookups read the ring — go on. The ring's
/// mutex used to be held across the commit, on an async thread: every
/// request's key lookup waited behind it, and with both of the runtime's
/// threads blocked the drive stopped answering anyone. The stall is the
/// drive's test-only fault point (a settings write waits while a file exists).
#[test]
fn requests_go_on_while_a_key_change_waits_for_the_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let stall = tmp.path().join("stall");
    let d = drive(tmp.path(), true, &[("NASD_FAULT_STALL_SETTINGS_WHILE", stall.to_str().unwrap())]);
    let (master, drive_key, partition_key) = (master_key(tmp.path()), Key::random(), Key::random());
    runtime().block_on(async {
        let mut admin = DriveClient::connect(d.addr).await.expect("connect");
        timed("set drive key", admin.set_drive_key(&master, &drive_key)).await.expect("drive key");
        admin.set_auth(Auth::new(Credential::Drive(drive_key.clone()), Protection::INTEGRITY_ARGS));
        timed("create partition", admin.create_partition(1)).await.expect("partition");
        timed("partition key", admin.set_partition_key(&drive_key, 1, &partition_key)).await.expect("key");

        std::fs::write(&stall, b"").unwrap();
        let (pk, wk) = (partition_key.clone(), Key::random());
        let key_change = tokio::spawn(async move { admin.set_working_key(&pk, 1, 1, &wk).await });
        let mut reached = stall.clone().into_os_string();
        reached.push(".reached");
        timed("the key change reaching the disk", async {
            while !Path::new(&reached).exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;

        // The key change is stuck in its commit. Requests that look keys up go on.
        let mut other = timed("connect", drive_key_client(d.addr, &drive_key)).await;
        for _ in 0..10 {
            timed("a request while a key change waits for the disk", other.getattr(1, PARTITION_CONTENTS))
                .await
                .expect("getattr");
        }
        assert!(!key_change.is_finished(), "the key change is still waiting for its commit");
        std::fs::remove_file(&stall).unwrap();
        timed("the key change", key_change).await.unwrap().expect("the key change completes once the disk does");
    });
}

/// Refusals of requests that proved no key are itemized in the audit trail
/// at a bounded rate and counted beyond it — never lost silently. Anyone on
/// the network can send them as fast as the link allows; each used to cost
/// a row, and a full buffer (65 536 of them) was written synchronously on
/// the async thread that recorded the last one.
#[test]
fn unauthenticated_refusals_are_audited_at_a_bounded_rate_and_all_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let d = drive(tmp.path(), true, &[]);
    let (master, drive_key) = (master_key(tmp.path()), Key::random());
    let sent = 4 * UNAUTHENTICATED_AUDIT_BURST;
    runtime().block_on(async {
        let mut admin = DriveClient::connect(d.addr).await.expect("connect");
        timed("set drive key", admin.set_drive_key(&master, &drive_key)).await.expect("drive key");
        let started = Instant::now();
        let mut anonymous = DriveClient::connect(d.addr).await.expect("connect");
        for _ in 0..sent {
            let e = timed("a refusal", anonymous.getattr(1, 16)).await.expect_err("no key, no access");
            assert_eq!(e.status(), Some(Status::WrongKeyType), "{e}");
        }
        let elapsed = started.elapsed();
        let mut records = Vec::new();
        loop {
            let after = records.last().map_or(0, |r: &AuditRecord| r.sequence);
            let batch = timed("read audit", admin.read_audit(&drive_key, after, 512)).await.expect("audit");
            // Each READ_AUDIT is audited too: done when nothing else is left.
            if batch.iter().all(|r| r.opcode == opcode::READ_AUDIT) {
                break;
            }
            records.extend(batch);
        }
        let itemized = records.iter().filter(|r| r.opcode == opcode::GETATTR).count() as u64;
        let counted: u64 = records
            .iter()
            .filter(|r| r.opcode == opcode::NOT_ITEMIZED && r.partition == not_itemized::UNAUTHENTICATED_REFUSALS)
            .map(|r| r.object)
            .sum();
        assert_eq!(itemized + counted, sent, "every refusal itemized or counted");
        let allowed = UNAUTHENTICATED_AUDIT_BURST + UNAUTHENTICATED_AUDIT_PER_SEC * (elapsed.as_secs() + 1);
        assert!(itemized <= allowed, "{itemized} itemized in {elapsed:?}: over the rate");
        assert!(itemized >= UNAUTHENTICATED_AUDIT_BURST.min(sent), "the burst is itemized");
    });
}
