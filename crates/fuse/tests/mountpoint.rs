//! The mount refuses what would surprise (issue 23.5), on a real cluster and
//! real mounts: a second mount on a directory that already is a mount point
//! is refused (never stacked), and so is a directory with entries unless
//! `nonempty` says to mount over them (which leaves them untouched); an
//! `ioctl` on a file — Python's `open` asks `isatty` of every file — is
//! answered `ENOTTY` without a line in the user's terminal.

mod common;

use common::{errno_of, Env, ADMIN, ADMIN_PW};
use nasd_fuse::MountConfig;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

/// Each test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(300);

/// Log lines of the binary's tests; each test takes it before its cluster
/// starts (the first installs the collector).
fn logs() -> common::Logs {
    common::capture_logs("fuser=warn,nasd_fuse=warn,nasd_fs=warn")
}

/// The mounts at `point` in this process's mount table.
fn mounts_at(point: &Path) -> usize {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap();
    table.lines().filter(|l| l.split(' ').nth(4) == point.to_str()).count()
}

#[test]
fn a_second_mount_on_the_same_directory_is_refused() {
    require_fuse!();
    let _logs = logs();
    let mut env = Env::start("second_mount", LIMIT, common::ClusterOptions::default());
    let m = env.mount();
    fs::write(m.join("first"), b"in the first mount").unwrap();
    for nonempty in [false, true] {
        let mut again = MountConfig::new(&m);
        again.nonempty = nonempty;
        let e = env.try_mount_at(ADMIN, ADMIN_PW, again).expect_err("a second mount on the same directory");
        assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
        let message = e.to_string();
        assert!(message.contains("already a mount point (fuse") && message.contains("from nasd"), "{message}");
        assert!(
            message.contains("unmount it first") && message.contains("another directory"),
            "says what to do: {message}"
        );
        // Nothing was stacked: the first mount is the one there.
        assert_eq!(mounts_at(&m), 1);
        assert_eq!(fs::read(m.join("first")).unwrap(), b"in the first mount");
    }
    // Unmounted, the directory mounts again.
    env.unmount(0);
    assert_eq!(mounts_at(&m), 0);
    env.try_mount_at(ADMIN, ADMIN_PW, MountConfig::new(&m)).expect("the directory, empty again, mounts");
    assert_eq!(fs::read(m.join("first")).unwrap(), b"in the first mount");
    env.stop();
}

#[test]
fn a_directory_with_entries_is_refused_unless_nonempty() {
    require_fuse!();
    let _logs = logs();
    let mut env = Env::start("nonempty", LIMIT, common::ClusterOptions::default());
    let dir = env.scratch().join("full");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("keep.txt"), b"local bytes").unwrap();

    let e = env.try_mount_at(ADMIN, ADMIN_PW, MountConfig::new(&dir)).expect_err("a directory with entries");
    assert_eq!(e.kind(), ErrorKind::DirectoryNotEmpty, "{e}");
    let message = e.to_string();
    assert!(message.contains("is not empty") && message.contains("keep.txt"), "{message}");
    assert!(message.contains("--nonempty") && message.contains("empty directory"), "says what to do: {message}");
    assert_eq!(mounts_at(&dir), 0, "nothing mounted");
    assert_eq!(fs::read(dir.join("keep.txt")).unwrap(), b"local bytes");

    // With nonempty the mount goes over the entries, which it hides and leaves alone.
    let mut config = MountConfig::new(&dir);
    config.nonempty = true;
    env.try_mount_at(ADMIN, ADMIN_PW, config).expect("mounting over the entries when asked to");
    assert_eq!(mounts_at(&dir), 1);
    assert!(!dir.join("keep.txt").exists(), "the mount shows nasd's root, not the directory's entries");
    fs::write(dir.join("in-nasd"), b"nasd bytes").unwrap();
    env.unmount(0);
    assert_eq!(fs::read(dir.join("keep.txt")).unwrap(), b"local bytes");
    assert!(!dir.join("in-nasd").exists());
    env.stop();
}

#[test]
fn ioctls_are_answered_enotty_without_a_log_line() {
    require_fuse!();
    let logs = logs();
    let mut env = Env::start("ioctl", LIMIT, common::ClusterOptions::default());
    let m = env.mount();
    let path = m.join("script.txt");
    fs::write(&path, b"print('hello')\n").unwrap();

    let file = fs::File::open(&path).unwrap();
    // isatty (TCGETS), a terminal's size (TIOCGWINSZ), lsattr (FS_IOC_GETFLAGS).
    for (name, cmd) in [("TCGETS", libc::TCGETS), ("TIOCGWINSZ", libc::TIOCGWINSZ), ("FS_IOC_GETFLAGS", 0x8008_6601)] {
        let mut out = [0u8; 64];
        // SAFETY: an open descriptor and a buffer larger than any of these requests writes.
        let r = unsafe { libc::ioctl(file.as_raw_fd(), cmd, out.as_mut_ptr()) };
        let e = std::io::Error::last_os_error();
        assert_eq!((r, errno_of(&e)), (-1, libc::ENOTTY), "{name}: {e}");
    }
    drop(file);
    // What the issue saw: every open() from Python asks isatty.
    if let Some(python) = common::tool("python3") {
        let script = "import sys\nfor i in range(20):\n    assert open(sys.argv[1]).read() == \"print('hello')\\n\"\n    open(sys.argv[1], 'rb').read()\n";
        common::sh(std::process::Command::new(python).arg("-c").arg(script).arg(&path));
    }
    env.stop();
    let lines = logs.lines_with(&["ioctl"]);
    assert!(lines.is_empty(), "an unsupported ioctl logged {} lines:\n{}", lines.len(), lines.join("\n"));
}
