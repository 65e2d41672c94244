//! The mount end to end through the kernel, as programs use it: regular
//! files, directories, symbolic and hard links, rename (and the renameat2
//! flags it refuses), chmod/chown/utimens, truncate, fsync, O_APPEND, sparse
//! files, statfs, a large directory, an open file unlinked, stable inode
//! numbers across the kernel forgetting them.

mod common;

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

/// Each test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(600);

fn env(name: &str) -> common::Env {
    common::Env::start(name, LIMIT, common::ClusterOptions::default())
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    common::cluster::pattern(seed, len)
}

#[test]
fn files_directories_and_links() {
    require_fuse!();
    let mut env = env("files_directories_and_links");
    let m = env.mount();

    // A regular file, written and read back.
    let data = pattern(1, 3 * 1024 * 1024 + 17);
    fs::write(m.join("a.bin"), &data).expect("write a file");
    assert_eq!(fs::read(m.join("a.bin")).expect("read it back"), data);
    assert_eq!(fs::metadata(m.join("a.bin")).unwrap().len(), data.len() as u64);

    // Directories.
    fs::create_dir_all(m.join("d/e/f")).expect("mkdir -p");
    fs::write(m.join("d/e/f/g.txt"), b"deep").unwrap();
    let mut names: Vec<_> = fs::read_dir(m.join("d")).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["e"]);
    assert_eq!(fs::remove_dir(m.join("d/e")).unwrap_err().raw_os_error(), Some(libc::ENOTEMPTY));
    assert!(fs::metadata(m.join("d/e")).unwrap().is_dir());

    // Symbolic links.
    std::os::unix::fs::symlink("e/f/g.txt", m.join("d/link")).expect("symlink");
    assert_eq!(fs::read_link(m.join("d/link")).unwrap(), Path::new("e/f/g.txt"));
    assert_eq!(fs::read(m.join("d/link")).unwrap(), b"deep");
    assert!(fs::symlink_metadata(m.join("d/link")).unwrap().file_type().is_symlink());

    // Hard links share the inode and count each other.
    fs::hard_link(m.join("a.bin"), m.join("d/a-again")).expect("link");
    let (a, b) = (fs::metadata(m.join("a.bin")).unwrap(), fs::metadata(m.join("d/a-again")).unwrap());
    assert_eq!(a.ino(), b.ino());
    assert_eq!(b.nlink(), 2);
    fs::remove_file(m.join("a.bin")).unwrap();
    assert_eq!(fs::read(m.join("d/a-again")).unwrap(), data, "the other name keeps the data");
    assert_eq!(fs::metadata(m.join("d/a-again")).unwrap().nlink(), 1);

    // Rename, replacing; and the renameat2 flags the manager cannot honour.
    fs::write(m.join("x"), b"x").unwrap();
    fs::write(m.join("y"), b"y").unwrap();
    fs::rename(m.join("x"), m.join("d/y2")).unwrap();
    fs::rename(m.join("d/y2"), m.join("y")).unwrap();
    assert_eq!(fs::read(m.join("y")).unwrap(), b"x");
    assert!(!m.join("x").exists());
    // RENAME_NOREPLACE onto an existing name is the kernel's EEXIST; onto a
    // free one, and RENAME_EXCHANGE, reach the mount, which refuses (EINVAL).
    for (flag, to, expect) in [
        (libc::RENAME_NOREPLACE, "d/a-again", libc::EEXIST),
        (libc::RENAME_NOREPLACE, "free-name", libc::EINVAL),
        (libc::RENAME_EXCHANGE, "d/a-again", libc::EINVAL),
    ] {
        let (from, to) = (cstr(&m.join("y")), cstr(&m.join(to)));
        // SAFETY: two valid NUL-terminated paths.
        let rc = unsafe {
            libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), flag)
        };
        assert_eq!(rc, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(expect), "renameat2 flag {flag}");
    }
    assert!(!m.join("free-name").exists());
    assert_eq!(fs::read(m.join("y")).unwrap(), b"x", "a refused rename changes nothing");

    fs::remove_dir_all(m.join("d")).expect("rm -r");
    assert!(!m.join("d").exists());
    env.stop();
}

/// Polls `check` until it succeeds or [`EVENTUALLY_MAX`] passes (a bound on
/// a hang, not a timing assertion); its last result.
fn eventually<T, E>(mut check: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let deadline = std::time::Instant::now() + EVENTUALLY_MAX;
    loop {
        let r = check();
        if r.is_ok() || std::time::Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How long [`eventually`] waits.
const EVENTUALLY_MAX: Duration = Duration::from_secs(30);

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

#[test]
fn attributes_truncate_append_sparse_and_statfs() {
    require_fuse!();
    let mut env = env("attributes_truncate_append_sparse_and_statfs");
    let m = env.mount();
    let f = m.join("f");
    fs::write(&f, b"0123456789").unwrap();

    // chmod, chown, utimens.
    fs::set_permissions(&f, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o640);
    std::os::unix::fs::chown(&f, Some(4242), Some(4343)).expect("chown as root");
    let md = fs::metadata(&f).unwrap();
    assert_eq!((md.uid(), md.gid()), (4242, 4343));
    let when = std::time::UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    let file = OpenOptions::new().write(true).open(&f).unwrap();
    file.set_times(fs::FileTimes::new().set_accessed(when).set_modified(when)).expect("futimens");
    drop(file);
    let md = fs::metadata(&f).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000_000, 123_456_789));
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 123_456_789));

    // Truncate down and up (the new bytes read as zeros), through a path and an open file.
    let file = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    file.set_len(4).unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"0123");
    file.set_len(8).unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"0123\0\0\0\0");
    drop(file);

    // Writes then a truncate on the same descriptor: the truncate wins.
    let mut file = OpenOptions::new().read(true).write(true).open(&f).unwrap();
    file.write_all(&[b'w'; 100]).unwrap();
    file.set_len(50).unwrap();
    file.sync_all().expect("fsync");
    drop(file);
    assert_eq!(fs::read(&f).unwrap(), vec![b'w'; 50]);

    // O_APPEND from two descriptors.
    let mut a1 = OpenOptions::new().append(true).open(&f).unwrap();
    let mut a2 = OpenOptions::new().append(true).open(&f).unwrap();
    a1.write_all(b"A").unwrap();
    a2.write_all(b"B").unwrap();
    a1.write_all(b"C").unwrap();
    drop((a1, a2));
    let got = fs::read(&f).unwrap();
    assert_eq!(&got[50..], b"ABC");

    // A sparse file: a write far past the end leaves a hole of zeros.
    let mut s = OpenOptions::new().create(true).truncate(true).read(true).write(true).open(m.join("sparse")).unwrap();
    s.seek(SeekFrom::Start(10 * 1024 * 1024)).unwrap();
    s.write_all(b"end").unwrap();
    s.seek(SeekFrom::Start(5 * 1024 * 1024)).unwrap();
    let mut hole = vec![1u8; 4096];
    s.read_exact(&mut hole).unwrap();
    assert!(hole.iter().all(|&b| b == 0));
    drop(s);
    assert_eq!(fs::metadata(m.join("sparse")).unwrap().len(), 10 * 1024 * 1024 + 3);

    // Reads through another descriptor see a write not yet committed.
    let mut w = OpenOptions::new().write(true).open(m.join("sparse")).unwrap();
    w.write_all(b"fresh").unwrap();
    let mut r = fs::File::open(m.join("sparse")).unwrap();
    let mut head = [0u8; 5];
    r.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"fresh");
    drop((w, r));

    // statfs reports the drives' space.
    let st = statvfs(&m);
    assert!(st.f_blocks > 0 && st.f_bfree <= st.f_blocks, "{} {}", st.f_blocks, st.f_bfree);
    assert_eq!(st.f_namemax, 255);

    // An exclusive create of an existing name.
    let e = OpenOptions::new().write(true).create_new(true).open(&f).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    env.stop();
}

fn statvfs(p: &Path) -> libc::statvfs {
    let c = cstr(p);
    // SAFETY: a valid path and a zeroed out-struct the call fills.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(c.as_ptr(), &mut st), 0, "statvfs: {}", std::io::Error::last_os_error());
        st
    }
}

#[test]
fn open_files_survive_unlink_and_inodes_stay_put() {
    require_fuse!();
    let mut env = env("open_files_survive_unlink_and_inodes_stay_put");
    let m = env.mount();
    let data = pattern(7, 1024 * 1024);
    fs::write(m.join("open"), &data).unwrap();
    let ino = fs::metadata(m.join("open")).unwrap().ino();

    // Unlinked while open: readable and writable until the last close (POSIX),
    // though the manager would destroy the data of a file's last name at once.
    let mut f = OpenOptions::new().read(true).write(true).open(m.join("open")).unwrap();
    fs::remove_file(m.join("open")).expect("unlink an open file");
    assert!(!m.join("open").exists());
    assert_eq!(f.metadata().unwrap().nlink(), 0, "fstat after unlink counts no name");
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, data);
    f.write_all(b"more").unwrap();
    f.sync_all().unwrap();
    let hidden: Vec<_> = fs::read_dir(&m).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(hidden.len(), 1, "the file lives on under a hidden name: {hidden:?}");
    drop(f);
    // The kernel sends the release after close(2) returns.
    let left = eventually(|| {
        let left: Vec<_> = fs::read_dir(&m).unwrap().map(|e| e.unwrap().file_name()).collect();
        left.is_empty().then_some(()).ok_or(left)
    });
    assert!(left.is_ok(), "the last close removes the hidden name: {left:?}");

    // Replaced by a rename while open: the same.
    fs::write(m.join("old"), b"old data").unwrap();
    fs::write(m.join("new"), b"new data").unwrap();
    let mut f = fs::File::open(m.join("old")).unwrap();
    fs::rename(m.join("new"), m.join("old")).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "old data");
    drop(f);
    assert_eq!(fs::read(m.join("old")).unwrap(), b"new data");

    // Inode numbers are the file system's own: they survive the kernel forgetting them.
    fs::create_dir(m.join("dir")).unwrap();
    fs::write(m.join("dir/file"), b"x").unwrap();
    let before = (fs::metadata(m.join("dir")).unwrap().ino(), fs::metadata(m.join("dir/file")).unwrap().ino());
    fs::write("/proc/sys/vm/drop_caches", b"2").expect("drop the kernel's dentries and inodes");
    let after = (fs::metadata(m.join("dir")).unwrap().ino(), fs::metadata(m.join("dir/file")).unwrap().ino());
    assert_eq!(before, after);
    assert_ne!(ino, before.1, "inode numbers are never reused");
    env.stop();
}

#[test]
fn a_large_directory_lists_whole() {
    require_fuse!();
    let mut env = env("a_large_directory_lists_whole");
    let m = env.mount();
    let dir = m.join("big");
    fs::create_dir(&dir).unwrap();
    // More than two manager pages (READDIR_ENTRIES_MAX = 1024 each).
    const N: usize = 2600;
    for i in 0..N {
        fs::File::create(dir.join(format!("entry-{i:05}"))).unwrap();
    }
    let mut names: Vec<String> =
        fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let expect: Vec<String> = (0..N).map(|i| format!("entry-{i:05}")).collect();
    assert_eq!(names, expect);
    // `ls -l` stats every entry too.
    let out = common::sh(std::process::Command::new("ls").arg("-l").arg(&dir));
    assert_eq!(out.lines().filter(|l| l.starts_with('-')).count(), N);
    env.stop();
}

/// Attributes the kernel takes from a reply that names an inode (a lookup,
/// a new hard link) while its file holds writes not yet committed show the
/// size those writes made, also past 2 GiB, and after the close.
#[test]
fn replies_show_the_size_of_uncommitted_writes() {
    use std::os::unix::fs::FileExt;
    require_fuse!();
    let mut env = env("replies_show_uncommitted_size");
    let mut config = nasd_fuse::MountConfig::new("");
    config.attr_timeout = nasd_fuse::ATTR_TIMEOUT_MAX;
    let m = env.mount_with(common::ADMIN, common::ADMIN_PW, config);
    for offset in [5u64, (1 << 31) + 1, 1 << 33] {
        let path = m.join(format!("f{offset}"));
        let f = OpenOptions::new().write(true).create(true).truncate(true).open(&path).unwrap();
        f.write_at(b"data", offset).unwrap();
        // The LINK reply carries the inode's attributes, which the kernel caches.
        fs::hard_link(&path, m.join(format!("g{offset}"))).unwrap();
        assert_eq!(fs::symlink_metadata(&path).unwrap().len(), offset + 4, "while open, at {offset}");
        drop(f);
        assert_eq!(fs::symlink_metadata(&path).unwrap().len(), offset + 4, "after the close, at {offset}");
        let mut back = [0u8; 4];
        fs::File::open(m.join(format!("g{offset}"))).unwrap().read_exact_at(&mut back, offset).unwrap();
        assert_eq!(&back, b"data");
    }
    env.stop();
}
