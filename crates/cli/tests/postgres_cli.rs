//! The real `nasd` binary with its metadata on PostgreSQL (a real server
//! the test starts): `nasd up --metadata postgres://…` serves files (put,
//! ls, get, mv, rm through the binary), records the location so a restart
//! finds the same files, refuses to move an existing cluster's metadata, and
//! `nasd admin reset-password --metadata` works on it (and resets the
//! password at `nasd up`'s authentication server too, which is where it logs in).

use nasd_meta::testing::PgServer;
use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Output, Stdio};

mod common;

use common::{free_addr, Daemon};

/// `nasd up` on `data` (one drive of 64 MiB), with `extra` arguments; the
/// drive's port is chosen at the first start only (then it is recorded).
fn up(data: &Path, log: &Path, extra: &[&str]) -> Daemon {
    let (dir, extra): (OsString, Vec<String>) = (data.into(), extra.iter().map(|s| s.to_string()).collect());
    Daemon::start("nasd up", data, log, None, move |addr| {
        let mut args: Vec<OsString> = vec!["up".into(), "--data".into(), dir.clone(), "--drives".into(), "1".into()];
        args.extend(["--manager-port".into(), addr.port().to_string().into()]);
        if !Path::new(&dir).join("nasd.toml").exists() {
            args.extend(["--first-drive-port".into(), free_addr().port().to_string().into()]);
        }
        args.extend(["--drive-capacity".into(), "64MiB".into()]);
        args.extend(extra.iter().map(OsString::from));
        args
    })
}

/// Runs `nasd ARGS` with the cluster's config file.
fn nasd(data: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nasd"))
        .arg("--config")
        .arg(data.join("nasd.toml"))
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("NASD_CONFIG")
        .env_remove("NASD_NEW_PASSWORD")
        .env_remove("NASD_PASSWORD")
        .stdin(Stdio::null())
        .output()
        .expect("run nasd")
}

#[track_caller]
fn ok(out: Output) -> String {
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn nasd_up_serves_files_with_its_metadata_on_postgres() {
    let server = PgServer::start().unwrap_or_else(|e| panic!("cannot start a PostgreSQL test server: {e}"));
    let url = server.fresh_url();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("cluster");
    std::fs::create_dir_all(&data).unwrap();
    let log = tmp.path().join("up.log");

    let mut d = up(&data, &log, &["--metadata", &url]);
    let out = d.output();
    assert!(out.contains(&format!("metadata  {url}")), "the banner names the metadata:\n{out}");
    assert!(!data.join("manager").join(nasd_manager::META_DB).exists(), "no SQLite file beside PostgreSQL");
    let local = tmp.path().join("local.bin");
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&local, &bytes).unwrap();
    ok(nasd(&data, &["mkdir", "/docs"]));
    ok(nasd(&data, &["put", local.to_str().unwrap(), "/docs/a.bin"]));
    ok(nasd(&data, &["mv", "/docs/a.bin", "/docs/b.bin"]));
    assert!(ok(nasd(&data, &["ls", "/docs"])).contains("b.bin"));
    d.terminate();

    // A restart without --metadata uses the recorded location: the file is there.
    let mut d = up(&data, &log, &[]);
    let back = tmp.path().join("back.bin");
    ok(nasd(&data, &["get", "/docs/b.bin", back.to_str().unwrap()]));
    assert!(std::fs::read(&back).unwrap() == bytes, "the file reads back after a restart");
    ok(nasd(&data, &["rm", "/docs/b.bin"]));
    assert!(!ok(nasd(&data, &["ls", "/docs"])).contains("b.bin"));
    d.terminate();

    // The metadata of an existing cluster does not move.
    let other = server.fresh_url();
    let moved = Command::new(env!("CARGO_BIN_EXE_nasd"))
        .args(["up", "--data", data.to_str().unwrap(), "--metadata", &other])
        .env_remove("NASD_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!moved.status.success());
    assert!(String::from_utf8_lossy(&moved.stderr).contains("run without --metadata"), "{moved:?}");

    // The offline password reset finds the metadata through --metadata (or the config file).
    let manager_dir = data.join("manager");
    let reset = |metadata: &str| {
        Command::new(env!("CARGO_BIN_EXE_nasd"))
            .args(["admin", "reset-password", "admin", "--data", manager_dir.to_str().unwrap(), "--metadata", metadata])
            .env_remove("NASD_CONFIG")
            .env("NASD_NEW_PASSWORD", "a new admin password")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    // `nasd up` logs in at its authentication server: the reset changes the password there too.
    assert!(ok(reset(&url)).contains("at the manager and at the authentication server"), "both reset");
    let none = reset(&other);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no metadata at"), "{none:?}");
    std::fs::write(manager_dir.join("admin.password"), "a new admin password\n").unwrap();
    let mut d = up(&data, &log, &[]);
    assert!(ok(nasd(&data, &["ls", "/"])).contains("docs"), "the reset password logs in");
    d.terminate();
}
