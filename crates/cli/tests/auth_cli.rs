//! The authentication server through the real `nasd` binary: `nasd up`
//! runs it beside the manager; with `auth` set in `[client]`, commands log
//! in there (password, role of the user's choice) and use the identity key
//! with the manager; `nasd auth` administers users, roles, groups and the
//! shared keys, whose rotation and retirement reach every drive.

mod common;

use common::up::{fails, nasd_with_config, ok, Up};

#[test]
fn identities_through_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let up = Up::start(cwd, 2, &[]);
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
    let who = ok(nasd_with_config(cwd, &config, &["auth", "login"], &[]));
    assert!(who.contains("uid 0") && who.contains("(administrator)") && who.contains("identity key id 1"), "{who}");
    ok(nasd_with_config(cwd, &config, &["auth", "add-role", "7", "staff"], &[]));
    ok(nasd_with_config(
        cwd,
        &config,
        &["auth", "add-user", "alice", "--uid", "1000"],
        &[("NASD_NEW_PASSWORD", "alice password")],
    ));
    ok(nasd_with_config(cwd, &config, &["auth", "grant-role", "alice", "7"], &[]));
    ok(nasd_with_config(cwd, &config, &["mkdir", "/shared", "--mode", "777"], &[]));

    // Alice picks her role; one she does not hold is refused.
    let alice = [("NASD_PASSWORD", "alice password")];
    let who = ok(nasd_with_config(cwd, &config, &["--user", "alice", "auth", "login", "--role", "7"], &alice));
    assert!(who.contains("uid 1000") && who.contains("this session's role 7"), "{who}");
    let err = fails(nasd_with_config(cwd, &config, &["--user", "alice", "auth", "login", "--role", "8"], &alice));
    assert!(err.contains("does not hold role 8"), "{err}");
    let wrong =
        fails(nasd_with_config(cwd, &config, &["--user", "alice", "ls", "/"], &[("NASD_PASSWORD", "not it at all")]));
    assert!(wrong.contains("wrong user name or password"), "{wrong}");

    // By identity at the manager: alice's files are hers.
    let src = cwd.join("hello.txt");
    std::fs::write(&src, b"hello by identity").unwrap();
    ok(nasd_with_config(cwd, &config, &["--user", "alice", "put", src.to_str().unwrap(), "/shared/hello"], &alice));
    let listing = ok(nasd_with_config(cwd, &config, &["--user", "alice", "ls", "-l", "/shared"], &alice));
    assert!(listing.contains(" alice ") && listing.contains("hello"), "owned by alice: {listing}");
    // Groups alice makes herself.
    let gid = ok(nasd_with_config(cwd, &config, &["--user", "alice", "auth", "create-group", "project"], &alice));
    assert!(gid.trim().parse::<u32>().unwrap() >= 1 << 20, "{gid}");

    // Key rotation and retirement reach the drives through the manager.
    let rotated = ok(nasd_with_config(cwd, &config, &["auth", "rotate-key"], &[]));
    assert!(rotated.contains("shared key 2") && rotated.contains("every drive has the change"), "{rotated}");
    let retired = ok(nasd_with_config(cwd, &config, &["auth", "retire-key", "1"], &[]));
    assert!(retired.contains("every drive has the change"), "{retired}");
    let who = ok(nasd_with_config(cwd, &config, &["--user", "alice", "auth", "login"], &alice));
    assert!(who.contains("identity key id 2"), "{who}");
    let err = fails(nasd_with_config(cwd, &config, &["auth", "retire-key", "9"], &[]));
    assert!(err.contains("no shared key 9"), "{err}");

    // A disabled user is refused; only administrators disable.
    let err = fails(nasd_with_config(cwd, &config, &["--user", "alice", "auth", "disable", "admin"], &alice));
    assert!(err.contains("only administrators"), "{err}");
    ok(nasd_with_config(cwd, &config, &["auth", "disable", "alice"], &[]));
    let err = fails(nasd_with_config(cwd, &config, &["--user", "alice", "ls", "/"], &alice));
    assert!(err.contains("disabled"), "{err}");

    // The password login at the manager still works beside identities.
    ok(nasd_with_config(cwd, &plain, &["ls", "/shared"], &[]));
    drop(up);
}
