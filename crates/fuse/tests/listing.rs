//! `ls -l` of a large directory through the kernel, counted in manager
//! requests: the listing's attributes say which inodes have no extended
//! attributes, so the `getxattr`/`listxattr` calls `ls` makes per entry
//! are answered without asking — and an inode that has some still shows
//! them, also ones another client set after the listing.

mod common;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
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

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn setxattr(p: &Path, name: &str, value: &[u8]) {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let r = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(r, 0, "setxattr {name}: {}", std::io::Error::last_os_error());
}

fn getxattr(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; 1024];
    // SAFETY: valid NUL-terminated strings and a buffer of the length given.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    buf.truncate(r as usize);
    Ok(buf)
}

fn listxattr(p: &Path) -> Vec<String> {
    let p = cpath(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: a valid NUL-terminated path and a buffer of the length given.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(r >= 0, "listxattr: {}", std::io::Error::last_os_error());
    buf.truncate(r as usize);
    buf.split(|&b| b == 0).filter(|n| !n.is_empty()).map(|n| String::from_utf8_lossy(n).into_owned()).collect()
}

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
    setxattr(&user, "user.color", b"red");
    setxattr(&security, "security.label", b"secret");

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
    assert_eq!(getxattr(&user, "user.color"), Ok(b"red".to_vec()));
    assert_eq!(listxattr(&user), ["user.color"]);
    assert_eq!(getxattr(&security, "security.label"), Ok(b"secret".to_vec()));
    assert_eq!(listxattr(&security), ["security.label"]);
    assert_eq!(getxattr(&plain, "security.selinux"), Err(libc::ENODATA));
    assert!(listxattr(&plain).is_empty());
    // Namespaces the manager does not keep are still its to refuse.
    assert_eq!(getxattr(&plain, "system.nasd"), Err(libc::EOPNOTSUPP));

    // This mount's own change shows at once; another client's through the change feed.
    setxattr(&plain, "security.mine", b"1");
    assert_eq!(getxattr(&plain, "security.mine"), Ok(b"1".to_vec()));
    let other = dir.join("entry-02000");
    assert_eq!(getxattr(&other, "security.theirs"), Err(libc::ENODATA));
    let second = env.mount();
    setxattr(&second.join("big/entry-02000"), "security.theirs", b"2");
    let deadline = Instant::now() + FEED_WAIT_MAX;
    while getxattr(&other, "security.theirs") != Ok(b"2".to_vec()) {
        assert!(Instant::now() < deadline, "another client's extended attribute never reached the mount");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(listxattr(&other), ["security.theirs"]);
    env.stop();
}
