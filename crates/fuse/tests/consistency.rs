//! Two mounts of one file system (two clients, as on two hosts): data is
//! close-to-open — a write in one is seen in the other after the writer's
//! close and the reader's open — and attribute and name changes are seen
//! within the stated bound (the attribute timeout) without either.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

/// The test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(600);

/// The bound both mounts state (their attribute and entry timeout).
const BOUND: Duration = Duration::from_millis(500);
/// What the kernel's clock (jiffies) may add to the bound before a cached
/// attribute counts as expired.
const CLOCK_SLACK: Duration = Duration::from_millis(100);

fn mount(env: &mut common::Env) -> std::path::PathBuf {
    let mut config = nasd_fuse::MountConfig::new("");
    config.attr_timeout = BOUND;
    env.mount_with(common::ADMIN, common::ADMIN_PW, config)
}

/// Waits out the bound.
fn after_the_bound() {
    std::thread::sleep(BOUND + CLOCK_SLACK);
}

#[test]
fn two_mounts_see_each_others_changes() {
    require_fuse!();
    let mut env = common::Env::start("two_mounts", LIMIT, common::ClusterOptions::default());
    let (a, b) = (mount(&mut env), mount(&mut env));

    // Close-to-open: written and closed in A, opened and read in B.
    let v1 = common::cluster::pattern(1, 300_000);
    fs::write(a.join("shared"), &v1).unwrap();
    assert_eq!(fs::read(b.join("shared")).unwrap(), v1);

    // Rewritten in A with the same length (only the contents and the
    // modification time change): B's next open drops its cached pages.
    let v2 = common::cluster::pattern(2, 300_000);
    fs::write(a.join("shared"), &v2).unwrap();
    assert_eq!(fs::read(b.join("shared")).unwrap(), v2, "B reads what A closed, not its page cache");

    // Grown in A while B keeps it open: B's next open sees the new length.
    let mut kept = fs::File::open(b.join("shared")).unwrap();
    let mut w = fs::OpenOptions::new().append(true).open(a.join("shared")).unwrap();
    w.write_all(b"tail").unwrap();
    drop(w);
    let mut grown = Vec::new();
    fs::File::open(b.join("shared")).unwrap().read_to_end(&mut grown).unwrap();
    assert_eq!(grown.len(), v2.len() + 4);
    assert_eq!(&grown[v2.len()..], b"tail");
    let mut through_kept = Vec::new();
    kept.read_to_end(&mut through_kept).unwrap();
    assert_eq!(through_kept, grown, "the descriptor kept open shares the mount's view");
    drop(kept);

    // Written in B: A sees it after B's close and A's open.
    fs::write(b.join("from-b"), b"hello from B").unwrap();
    assert_eq!(fs::read(a.join("from-b")).unwrap(), b"hello from B");

    // Attributes: a chmod and a truncate in A show in B within the bound.
    let _ = fs::metadata(b.join("shared")).unwrap(); // B caches the attributes now
    fs::set_permissions(a.join("shared"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::OpenOptions::new().write(true).open(a.join("shared")).unwrap().set_len(10).unwrap();
    after_the_bound();
    let md = fs::metadata(b.join("shared")).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o600);
    assert_eq!(md.len(), 10);

    // Names: a file made in A is listed and found in B at once (neither
    // listings nor missing names are cached); one removed in A is gone
    // from B within the bound.
    fs::write(a.join("new"), b"n").unwrap();
    let names: Vec<_> = fs::read_dir(&b).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(names.iter().any(|n| n == "new"), "{names:?}");
    assert_eq!(fs::read(b.join("new")).unwrap(), b"n");
    fs::remove_file(a.join("new")).unwrap();
    after_the_bound();
    assert!(!b.join("new").exists());
    env.stop();
}

/// How long a change may take to reach the other mount through the change
/// feed before the test fails: a hang bound, far below the attribute
/// timeout the mounts state (without the feed the kernel would show the old
/// attributes that long).
const FEED_BOUND: Duration = Duration::from_secs(20);

/// Polls `check` until it holds or [`FEED_BOUND`] passes.
fn within_feed_bound(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + FEED_BOUND;
    while !check() {
        assert!(std::time::Instant::now() < deadline, "{what}: not seen within {FEED_BOUND:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_change_feed_reaches_a_mount_before_its_caches_expire() {
    require_fuse!();
    let mut env = common::Env::start("change_feed", LIMIT, common::ClusterOptions::default());
    let long = || {
        let mut config = nasd_fuse::MountConfig::new("");
        config.attr_timeout = nasd_fuse::ATTR_TIMEOUT_MAX;
        config
    };
    let a = env.mount_with(common::ADMIN, common::ADMIN_PW, long());
    let b = env.mount_with(common::ADMIN, common::ADMIN_PW, long());
    fs::write(a.join("f"), b"version one").unwrap();
    fs::write(a.join("doomed"), b"x").unwrap();
    // B caches f's attributes and the name `doomed` for a minute.
    assert_eq!(fs::metadata(b.join("f")).unwrap().permissions().mode() & 0o777, 0o644);
    assert!(b.join("doomed").exists());
    let before = env.mounted(1).invalidations();

    fs::set_permissions(a.join("f"), fs::Permissions::from_mode(0o600)).unwrap();
    within_feed_bound("a chmod", || fs::metadata(b.join("f")).unwrap().permissions().mode() & 0o777 == 0o600);
    fs::remove_file(a.join("doomed")).unwrap();
    within_feed_bound("an unlink", || !b.join("doomed").exists());
    // Data: B holds f open and reads it again after A rewrote it in place.
    let mut held = fs::File::open(b.join("f")).unwrap();
    let mut first = String::new();
    held.read_to_string(&mut first).unwrap();
    assert_eq!(first, "version one");
    fs::OpenOptions::new().write(true).open(a.join("f")).unwrap().write_all(b"VERSION").unwrap();
    within_feed_bound("a rewrite", || {
        let mut again = String::new();
        let mut f = fs::File::open(b.join("f")).unwrap();
        f.read_to_string(&mut again).unwrap();
        again == "VERSION one"
    });
    assert!(env.mounted(1).invalidations() > before, "the feed, not the timeout, brought them");
    // A made every change itself: its feed skips them rather than drop what its
    // kernel holds (creates, writes, a chmod, a truncate, an unlink, a rewrite: 10 at least).
    within_feed_bound("A's own changes reported", || env.mounted(0).own_changes_skipped() >= 10);
    assert_eq!(env.mounted(0).invalidations(), 0, "nothing of A's own was invalidated in A");
    drop(held);
    env.stop();
}
