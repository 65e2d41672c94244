//! Global ACLs through the real `nasd` binary on a real cluster (`nasd up`):
//! a user grants another read on a file, who then reads it and still
//! cannot write it; the grant is revoked and the reader refused; an
//! inherited directory entry reaches a file created later.

mod common;

use common::up::{fails, nasd_with_config, ok, Up};

#[test]
fn acls_through_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let up = Up::start(cwd, 2, &[]);
    let config = up.data().join("nasd.toml");
    // The administrator makes two users (at the authentication server: the manager takes
    // identities only) and a shared directory.
    for (name, uid) in [("alice", "2000"), ("bob", "2001")] {
        let pw = format!("{name} password");
        ok(nasd_with_config(cwd, &config, &["auth", "add-user", name, "--uid", uid], &[("NASD_NEW_PASSWORD", &pw)]));
    }
    ok(nasd_with_config(cwd, &config, &["mkdir", "/shared", "--mode", "777"], &[]));
    let alice = |args: &[&str]| {
        let mut all = vec!["--user", "alice"];
        all.extend_from_slice(args);
        nasd_with_config(cwd, &config, &all, &[("NASD_PASSWORD", "alice password")])
    };
    let bob = |args: &[&str]| {
        let mut all = vec!["--user", "bob"];
        all.extend_from_slice(args);
        nasd_with_config(cwd, &config, &all, &[("NASD_PASSWORD", "bob password")])
    };

    // Alice's private directory and file: bob gets nothing from the mode bits.
    let src = cwd.join("plan.txt");
    std::fs::write(&src, b"alice's plan").unwrap();
    let other = cwd.join("other.txt");
    std::fs::write(&other, b"bob was here").unwrap();
    ok(alice(&["mkdir", "/shared/a", "--mode", "700"]));
    ok(alice(&["put", src.to_str().unwrap(), "/shared/a/plan"]));
    ok(alice(&["chmod", "600", "/shared/a/plan"]));
    let e = fails(bob(&["cat", "/shared/a/plan"]));
    assert!(e.to_lowercase().contains("permission denied"), "{e}");

    // Alice grants bob search on the directory and read on the file.
    ok(alice(&["acl", "add", "/shared/a", "user:2001:x"]));
    ok(alice(&["acl", "add", "/shared/a/plan", "user:2001:r"]));
    let shown = ok(alice(&["acl", "get", "/shared/a/plan"]));
    assert!(shown.contains("# owner: 2000") && shown.contains("user::rw-") && shown.contains("other::---"), "{shown}");
    assert!(shown.contains("user:2001:r--"), "{shown}");
    assert_eq!(ok(bob(&["cat", "/shared/a/plan"])), "alice's plan");
    // Read is not write: bob's overwrite is refused, and so is changing the ACL.
    let e = fails(bob(&["put", other.to_str().unwrap(), "/shared/a/plan"]));
    assert!(e.to_lowercase().contains("permission denied"), "{e}");
    let e = fails(bob(&["acl", "add", "/shared/a/plan", "user:2001:rw"]));
    assert!(e.to_lowercase().contains("not permitted"), "{e}");
    assert_eq!(ok(alice(&["cat", "/shared/a/plan"])), "alice's plan", "unchanged");
    // chmod keeps the named entry (it changes the base entries only).
    ok(alice(&["chmod", "640", "/shared/a/plan"]));
    let shown = ok(bob(&["acl", "get", "/shared/a/plan"]));
    assert!(shown.contains("group::r--") && shown.contains("user:2001:r--"), "{shown}");

    // Revoked: bob is refused again.
    ok(alice(&["acl", "remove", "/shared/a/plan", "user:2001"]));
    let e = fails(bob(&["cat", "/shared/a/plan"]));
    assert!(e.to_lowercase().contains("permission denied"), "{e}");
    let e = fails(alice(&["acl", "remove", "/shared/a/plan", "user:2001"]));
    assert!(e.contains("no entry for user:2001"), "{e}");

    // An inheritable entry on the directory reaches a file made afterwards.
    ok(alice(&["acl", "set", "/shared/a", "user:2001:rx:inherit"]));
    ok(alice(&["put", src.to_str().unwrap(), "/shared/a/later"]));
    ok(alice(&["chmod", "600", "/shared/a/later"]));
    let shown = ok(alice(&["acl", "get", "/shared/a/later"]));
    assert!(shown.contains("user:2001:r-x\n") && !shown.contains("inherit"), "{shown}");
    assert_eq!(ok(bob(&["cat", "/shared/a/later"])), "alice's plan");
    let e = fails(bob(&["cat", "/shared/a/plan"]));
    assert!(e.to_lowercase().contains("permission denied"), "the old file got nothing: {e}");
    let e = fails(alice(&["acl", "add", "/shared/a/plan", "user:2001:r:inherit"]));
    assert!(e.to_lowercase().contains("invalid argument"), "inherit is for directories: {e}");
    let e = fails(alice(&["acl", "add", "/shared/a/plan", "user:bob:r"]));
    assert!(e.contains("an ACL entry is"), "{e}");

    // Role entries (for sessions logged in at the authentication server in that role).
    ok(alice(&["acl", "add", "/shared/a/plan", "role:7:rw"]));
    let shown = ok(alice(&["acl", "get", "/shared/a/plan"]));
    assert!(shown.contains("role:7:rw-\n"), "{shown}");
    let e = fails(bob(&["cat", "/shared/a/plan"]));
    assert!(e.to_lowercase().contains("permission denied"), "a password session acts in no role: {e}");
    let e = fails(alice(&["acl", "add", "/shared/a/plan", "role:0:r"]));
    assert!(e.contains("an ACL entry is"), "{e}");
    ok(alice(&["acl", "remove", "/shared/a/plan", "r:7"]));
    assert!(!ok(alice(&["acl", "get", "/shared/a/plan"])).contains("role:"));

    // A shared entry on the directory holds live for every file made in it — the ones made
    // before too — and leaves them all with one change; a copied entry stays with its file.
    ok(alice(&["acl", "set", "/shared/a", "user:2001:rx:shared"]));
    let shown = ok(alice(&["acl", "get", "/shared/a"]));
    assert!(shown.contains("user:2001:r-x:shared\n"), "{shown}");
    assert!(ok(alice(&["acl", "get", "/shared/a/plan"])).lines().all(|l| !l.starts_with("user:2001")), "not copied");
    assert_eq!(ok(bob(&["cat", "/shared/a/plan"])), "alice's plan", "granted through the directory");
    ok(alice(&["acl", "set", "/shared/a", "user:2001:x"]));
    let e = fails(bob(&["cat", "/shared/a/plan"]));
    assert!(e.to_lowercase().contains("permission denied"), "taken away from every file at once: {e}");
    assert_eq!(ok(bob(&["cat", "/shared/a/later"])), "alice's plan", "its copied entry is its own");
    let e = fails(alice(&["acl", "add", "/shared/a/plan", "user:2001:r:shared"]));
    assert!(e.to_lowercase().contains("invalid argument"), "shared is for directories: {e}");

    // --help says what an entry is.
    let help = ok(nasd_with_config(cwd, &config, &["acl", "set", "--help"], &[]));
    assert!(help.contains("user:UID:RIGHTS[:FLAG...]") && help.contains("inherit"), "{help}");
    assert!(help.contains("role:ROLE:RIGHTS[:FLAG...]") && help.contains("`shared`"), "{help}");
    drop(up);
}
