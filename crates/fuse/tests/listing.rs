//! `ls -l` of a large directory through the kernel, counted in manager
//! requests: the listing's attributes say which inodes have no extended
//! attributes, so the `getxattr`/`listxattr` calls `ls` makes per entry
//! are answered without asking — and an inode that has some still shows
//! them, also ones another client set after the listing.

mod common;

use common::xattr::{getxattr, listxattr, setxattr};

use std::fs;
use std::time::{Duration, Instant};

/// The test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(600);
/// Entries of the listed directory: two manager pages and some.
const ENTRIES: usize = 2500;
/// The bound issue 24 sets: manager requests per 100 entries of `ls -l`.
const REQUESTS_PER_100_MAX: usize = 2;
/// How long another client's change may take to reach the mount through
/// the change feed (a bound on a wait, not a timing assertion).
const FEED_WAIT_MAX: Duration = Duration::from_secs(60);

#[test]
fn ls_l_of_a_large_directory_asks_the_manager_per_page_not_per_entry() {
    require_fuse!();
    let mut env = common::Env::start("ls_l_requests", LIMIT, common::ClusterOptions::default());
    let m = env.mount();
    let dir = m.join("big");
    fs::create_dir(&dir).unwrap();
    for i in 0..ENTRIES {
        fs::File::create(dir.join(format!("entry-{i:05}"))).unwrap();
    }
    let (user, security, plain) = (dir.join("entry-00007"), dir.join("entry-01500"), dir.join("entry-02499"));
    setxattr(&user, "user.color", b"red", 0).unwrap();
    setxattr(&security, "security.label", b"secret", 0).unwrap();

    // Names and inodes out of the kernel's caches: `ls -l` asks the mount.
    fs::write("/proc/sys/vm/drop_caches", b"2").expect("drop the kernel's dentry and inode caches");
    let served = || env.cluster().manager.requests_served();
    let before = served();
    let out = common::sh(std::process::Command::new("ls").arg("-l").arg(&dir));
    let requests = (served() - before) as usize;
    assert_eq!(out.lines().filter(|l| l.starts_with('-')).count(), ENTRIES);
    println!("ls -l of {ENTRIES} entries: {requests} manager requests");
    assert!(
        requests * 100 <= REQUESTS_PER_100_MAX * ENTRIES,
        "ls -l of {ENTRIES} entries cost {requests} manager requests (at most {} allowed)",
        REQUESTS_PER_100_MAX * ENTRIES / 100
    );

    // What the listing said has attributes still shows them; what it said has none has none.
    assert_eq!(getxattr(&user, "user.color", 1024), Ok(b"red".to_vec()));
    assert_eq!(listxattr(&user), ["user.color"]);
    assert_eq!(getxattr(&security, "security.label", 1024), Ok(b"secret".to_vec()));
    assert_eq!(listxattr(&security), ["security.label"]);
    assert_eq!(getxattr(&plain, "security.selinux", 1024), Err(libc::ENODATA));
    assert!(listxattr(&plain).is_empty());
    // Namespaces the manager does not keep are still its to refuse.
    assert_eq!(getxattr(&plain, "system.nasd", 1024), Err(libc::EOPNOTSUPP));

    // This mount's own change shows at once; another client's through the change feed.
    setxattr(&plain, "security.mine", b"1", 0).unwrap();
    assert_eq!(getxattr(&plain, "security.mine", 1024), Ok(b"1".to_vec()));
    let other = dir.join("entry-02000");
    assert_eq!(getxattr(&other, "security.theirs", 1024), Err(libc::ENODATA));
    let second = env.mount();
    setxattr(&second.join("big/entry-02000"), "security.theirs", b"2", 0).unwrap();
    let deadline = Instant::now() + FEED_WAIT_MAX;
    while getxattr(&other, "security.theirs", 1024) != Ok(b"2".to_vec()) {
        assert!(Instant::now() < deadline, "another client's extended attribute never reached the mount");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(listxattr(&other), ["security.theirs"]);
    env.stop();
}
