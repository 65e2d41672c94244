//! The authentication server through the real `nasd` binary: `nasd up`
//! runs it beside the manager and sets `auth` in `[client]`, so commands log
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
    // `nasd up` points [client] at its authentication server: commands log in there.
    let config = cwd.join("nasd-data/nasd.toml");
    let recorded = std::fs::read_to_string(&config).unwrap();
    let auth_line = format!("auth = \"127.0.0.1:{}\"\n", up.auth_port());
    let client_at = recorded.find("[client]\n").expect("a [client] section");
    assert!(recorded[client_at..].contains(&auth_line), "[client] names the authentication server: {recorded}");

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

    // The manager takes no passwords: a [client] without auth, logging in with the right
    // password of admin, is told to log in at the authentication server.
    let (head, tail) = recorded.split_at(client_at);
    let without = format!("{head}{}", tail.replacen(&auth_line, "", 1));
    let password_config = cwd.join("password.toml");
    std::fs::write(&password_config, without).unwrap();
    let err = fails(nasd_with_config(cwd, &password_config, &["ls", "/shared"], &[]));
    assert!(err.contains("takes no passwords") && err.contains("nasd auth login"), "{err}");
    drop(up);
}

/// `[manager] auth_scheme = "pals"` under `nasd up`: the drives take identities only and the
/// manager mints no capabilities, and the commands (logged in by identity) copy files up and
/// down without noticing; a mount acting for many users (`--map-users`), which would need
/// capabilities minted for each user, is refused before it mounts, saying what to set.
#[test]
fn a_pals_only_cluster_serves_identities_and_refuses_a_mapping_gateway() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    std::fs::create_dir(cwd.join("nasd-data")).unwrap();
    std::fs::write(cwd.join("nasd-data/nasd.toml"), "[manager]\nauth_scheme = \"pals\"\n").unwrap();
    let first = common::up::free_ports(1).to_string();
    let up = Up::start(cwd, 1, &["--first-drive-port", &first]);
    let config = up.data().join("nasd.toml");
    let src = cwd.join("note.txt");
    std::fs::write(&src, b"by identity, no capability").unwrap();
    ok(nasd_with_config(cwd, &config, &["put", src.to_str().unwrap(), "/note"], &[]));
    assert_eq!(ok(nasd_with_config(cwd, &config, &["cat", "/note"], &[])), "by identity, no capability");

    let mountpoint = cwd.join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let err = fails(nasd_with_config(
        cwd,
        &config,
        &["mount", "--allow-other", "--map-users", mountpoint.to_str().unwrap()],
        &[],
    ));
    assert!(err.contains("--map-users") && err.contains("auth_scheme = \"both\""), "{err}");
    drop(up);
}

/// Passwords under `nasd up`, where the authentication server keeps them: `nasd auth passwd`
/// changes one's own (the old one no longer logs in, the new one does), an administrator's sets
/// anyone's, a user cannot set another's; the linked manager's `nasd admin add-user` and
/// `nasd admin passwd` say to use `nasd auth` instead, before asking for any password; and the
/// offline `nasd admin reset-password` still resets the administrator at both.
#[test]
fn passwords_change_at_the_authentication_server() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let mut up = Up::start(cwd, 1, &[]);
    let config = cwd.join("nasd-data/nasd.toml");
    let nasd = |args: &[&str], env: &[(&str, &str)]| nasd_with_config(cwd, &config, args, env);
    for (name, uid) in [("alice", "1000"), ("bob", "1001")] {
        let pw = format!("{name} password");
        ok(nasd(&["auth", "add-user", name, "--uid", uid], &[("NASD_NEW_PASSWORD", &pw)]));
    }
    let help = ok(nasd(&["auth", "passwd", "--help"], &[]));
    assert!(help.contains("[USER]") && help.contains("NASD_NEW_PASSWORD") && help.contains("stay valid"), "{help}");

    // Alice changes her own: the old password is the one she logs in with.
    let changed = ok(nasd(
        &["--user", "alice", "auth", "passwd"],
        &[("NASD_PASSWORD", "alice password"), ("NASD_NEW_PASSWORD", "alice's second one")],
    ));
    assert!(changed.contains("password of alice changed") && changed.contains("stay valid"), "{changed}");
    let old = fails(nasd(&["--user", "alice", "ls", "/"], &[("NASD_PASSWORD", "alice password")]));
    assert!(old.contains("wrong user name or password"), "{old}");
    ok(nasd(&["--user", "alice", "ls", "/"], &[("NASD_PASSWORD", "alice's second one")]));
    // A wrong current password changes nothing.
    let wrong = fails(nasd(
        &["--user", "alice", "auth", "passwd"],
        &[("NASD_PASSWORD", "not hers"), ("NASD_NEW_PASSWORD", "alice's third one")],
    ));
    assert!(wrong.contains("wrong user name or password"), "{wrong}");
    ok(nasd(&["--user", "alice", "auth", "login"], &[("NASD_PASSWORD", "alice's second one")]));
    // A new password too short: refused, saying the bounds, and not echoed.
    let short = fails(nasd(
        &["--user", "alice", "auth", "passwd", "alice"],
        &[("NASD_PASSWORD", "alice's second one"), ("NASD_NEW_PASSWORD", "tiny")],
    ));
    assert!(short.contains("passwords need 8 to 1024 bytes") && !short.contains("tiny"), "{short}");

    // Alice cannot set bob's; the administrator can, without bob's old one.
    let err = fails(nasd(
        &["--user", "alice", "auth", "passwd", "bob"],
        &[("NASD_PASSWORD", "alice's second one"), ("NASD_NEW_PASSWORD", "alice picked it")],
    ));
    assert!(err.contains("only administrators") && err.contains("cannot change the password of bob"), "{err}");
    ok(nasd(&["--user", "bob", "auth", "login"], &[("NASD_PASSWORD", "bob password")]));
    let set = ok(nasd(&["auth", "passwd", "bob"], &[("NASD_NEW_PASSWORD", "set by admin")]));
    assert!(set.contains("password of bob changed"), "{set}");
    fails(nasd(&["--user", "bob", "auth", "login"], &[("NASD_PASSWORD", "bob password")]));
    ok(nasd(&["--user", "bob", "auth", "login"], &[("NASD_PASSWORD", "set by admin")]));

    // The linked manager keeps no users or passwords: the commands that would set them there
    // say what to run instead, with or without a new password at hand (stdin is closed: no prompt).
    for env in [&[("NASD_NEW_PASSWORD", "dan password")][..], &[]] {
        let err = fails(nasd(&["admin", "add-user", "dan", "--uid", "1003"], env));
        assert!(err.contains("nasd auth add-user NAME --uid UID") && !err.contains("dan password"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line, no cause chain: {err}");
        let err = fails(nasd(&["admin", "passwd", "alice"], env));
        assert!(err.contains("nasd auth passwd"), "{err}");
    }
    fails(nasd(&["--user", "dan", "auth", "login"], &[("NASD_PASSWORD", "dan password")]));

    // `nasd admin reset-password` on nasd up's layout (stopped) resets the administrator at the
    // manager and at the authentication server beside it; the new password is in the file
    // [client] reads, and logs in.
    let addr = up.daemon.addr;
    up.daemon.terminate();
    let reset = ok(nasd(&["admin", "reset-password", "admin", "--data", "nasd-data/manager"], &[]));
    assert!(reset.contains("password of admin reset") && reset.contains("authentication server"), "{reset}");
    let _up = common::up::Up::start_with(cwd, 1, Some(addr), &[], &[]);
    let who = ok(nasd(&["auth", "login"], &[]));
    assert!(who.contains("(administrator)"), "{who}");
    ok(nasd(&["--user", "alice", "ls", "/"], &[("NASD_PASSWORD", "alice's second one")]));
}
