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
