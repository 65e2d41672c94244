//! The real `nasd drive` binary under faults and floods: a panic in a store
//! task stops it (fail-stop); one host cannot take every connection; idle
//! unauthenticated connections are dropped; a thousand connections
//! announcing huge writes leave its memory where it was.

mod common;

use common::{Daemon, DAEMON_WAIT_MAX};
use nasd_client::DriveClient;
use std::ffi::OsString;
use std::path::Path;

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
