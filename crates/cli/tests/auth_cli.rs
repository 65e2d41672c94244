//! The authentication server through the real `nasd` binary: `nasd up`
//! runs it beside the manager; with `auth` set in `[client]`, commands log
//! in there (password, role of the user's choice) and use the identity key
//! with the manager; `nasd auth` administers users, roles, groups and the
//! shared keys, whose rotation and retirement reach every drive.

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Output, Stdio};

mod common;

use common::Daemon;

fn nasd(cwd: &Path, config: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nasd"))
        .arg("--config")
        .arg(config)
        .args(args)
        .current_dir(cwd)
        .env_remove("NASD_CONFIG")
        .env_remove("NASD_NEW_PASSWORD")
        .env_remove("NASD_PASSWORD")
        .env_remove("NASD_USER")
        .env_remove("NASD_ROLE")
        .env_remove("NASD_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run nasd")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn ok(out: Output) -> String {
    assert!(out.status.success(), "nasd failed: {}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

#[track_caller]
fn fails(out: Output) -> String {
    assert!(!out.status.success(), "nasd succeeded: {}", text(&out.stdout));
    text(&out.stderr)
}

#[test]
fn identities_through_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let daemon = Daemon::start("nasd up", cwd, &cwd.join("up.log"), None, |addr| {
        let args = ["up", "--drives", "2", "--manager-port", &addr.port().to_string()];
        args.iter().map(OsString::from).collect()
    });
    let recorded = std::fs::read_to_string(cwd.join("nasd-data/nasd.toml")).unwrap();
    let auth_port: u16 = recorded
        .lines()
        .find_map(|l| l.strip_prefix("auth_port = "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no auth_port recorded in {recorded}"));
    // The same cluster, with commands logging in at the authentication server.
    let with_auth = recorded.replacen("[client]\n", &format!("[client]\nauth = \"127.0.0.1:{auth_port}\"\n"), 1);
    assert_ne!(with_auth, recorded, "a [client] section to add auth to");
    let config = cwd.join("auth.toml");
    std::fs::write(&config, with_auth).unwrap();
    let plain = cwd.join("nasd-data/nasd.toml");

    // The administrator (the manager's, same password) logs in there.
    let who = ok(nasd(cwd, &config, &["auth", "login"], &[]));
    assert!(who.contains("uid 0") && who.contains("(administrator)") && who.contains("identity key id 1"), "{who}");
    ok(nasd(cwd, &config, &["auth", "add-role", "7", "staff"], &[]));
    ok(nasd(cwd, &config, &["auth", "add-user", "alice", "--uid", "1000"], &[("NASD_NEW_PASSWORD", "alice password")]));
    ok(nasd(cwd, &config, &["auth", "grant-role", "alice", "7"], &[]));
    ok(nasd(cwd, &config, &["mkdir", "/shared", "--mode", "777"], &[]));

    // Alice picks her role; one she does not hold is refused.
    let alice = [("NASD_PASSWORD", "alice password")];
    let who = ok(nasd(cwd, &config, &["--user", "alice", "auth", "login", "--role", "7"], &alice));
    assert!(who.contains("uid 1000") && who.contains("this session's role 7"), "{who}");
    let err = fails(nasd(cwd, &config, &["--user", "alice", "auth", "login", "--role", "8"], &alice));
    assert!(err.contains("does not hold role 8"), "{err}");
    let wrong = fails(nasd(cwd, &config, &["--user", "alice", "ls", "/"], &[("NASD_PASSWORD", "not it at all")]));
    assert!(wrong.contains("wrong user name or password"), "{wrong}");

    // By identity at the manager: alice's files are hers.
    let src = cwd.join("hello.txt");
    std::fs::write(&src, b"hello by identity").unwrap();
    ok(nasd(cwd, &config, &["--user", "alice", "put", src.to_str().unwrap(), "/shared/hello"], &alice));
    let listing = ok(nasd(cwd, &config, &["--user", "alice", "ls", "-l", "/shared"], &alice));
    assert!(listing.contains(" alice ") && listing.contains("hello"), "owned by alice: {listing}");
    // Groups alice makes herself.
    let gid = ok(nasd(cwd, &config, &["--user", "alice", "auth", "create-group", "project"], &alice));
    assert!(gid.trim().parse::<u32>().unwrap() >= 1 << 20, "{gid}");

    // Key rotation and retirement reach the drives through the manager.
    let rotated = ok(nasd(cwd, &config, &["auth", "rotate-key"], &[]));
    assert!(rotated.contains("shared key 2") && rotated.contains("every drive has the change"), "{rotated}");
    let retired = ok(nasd(cwd, &config, &["auth", "retire-key", "1"], &[]));
    assert!(retired.contains("every drive has the change"), "{retired}");
    let who = ok(nasd(cwd, &config, &["--user", "alice", "auth", "login"], &alice));
    assert!(who.contains("identity key id 2"), "{who}");
    let err = fails(nasd(cwd, &config, &["auth", "retire-key", "9"], &[]));
    assert!(err.contains("no shared key 9"), "{err}");

    // A disabled user is refused; only administrators disable.
    let err = fails(nasd(cwd, &config, &["--user", "alice", "auth", "disable", "admin"], &alice));
    assert!(err.contains("only administrators"), "{err}");
    ok(nasd(cwd, &config, &["auth", "disable", "alice"], &[]));
    let err = fails(nasd(cwd, &config, &["--user", "alice", "ls", "/"], &alice));
    assert!(err.contains("disabled"), "{err}");

    // The password login at the manager still works beside identities.
    ok(nasd(cwd, &plain, &["ls", "/shared"], &[]));
    drop(daemon);
}
