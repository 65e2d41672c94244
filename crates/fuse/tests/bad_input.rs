//! Requests that fail get an errno, and the mount goes on serving: names the
//! manager refuses (not UTF-8, too long, reserved), a FIFO made twice, a
//! file whose data is unavailable past its layout's redundancy
//! (drives killed), and a flood of failing requests.

mod common;

use nasd_fs::Layout;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

/// The test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(600);

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    common::errno_of(&r.expect_err("the request must fail"))
}

/// The mount still works: a file written and read back, a listing.
fn still_serving(m: &std::path::Path, round: u32) {
    let name = m.join(format!("alive-{round}"));
    fs::write(&name, format!("round {round}")).expect("the mount still takes writes");
    assert_eq!(fs::read_to_string(&name).unwrap(), format!("round {round}"));
    assert!(fs::read_dir(m).unwrap().count() > 0);
}

#[test]
fn failing_requests_get_an_errno_and_the_mount_goes_on() {
    require_fuse!();
    let opts = common::ClusterOptions { root_layout: Some(Layout::parse("rs:2+1@64K").unwrap()), ..Default::default() };
    let mut env = common::Env::start("bad_input", LIMIT, opts);
    let m = env.mount();

    // Names: not UTF-8, over NAME_MAX.
    let bad = m.join(std::ffi::OsStr::from_bytes(b"bad-\xff\xfe"));
    assert_eq!(errno(fs::write(&bad, b"x")), libc::EINVAL);
    assert_eq!(errno(fs::create_dir(&bad)), libc::EINVAL);
    assert_eq!(errno(fs::write(m.join("n".repeat(256)), b"x")), libc::ENAMETOOLONG);
    still_serving(&m, 1);

    // A FIFO is an inode nasd keeps; made twice, the second is EEXIST.
    let fifo = std::ffi::CString::new(m.join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, -1);
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EEXIST));
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fs::symlink_metadata(m.join("fifo")).unwrap().file_type()));
    still_serving(&m, 2);

    // Many failing requests in a row (a name that does not exist is answered with a
    // negative entry, which the kernel keeps: its lookups do not fail at the mount).
    for i in 0..500 {
        assert_eq!(errno(fs::metadata(m.join(format!("missing-{i}")))), libc::ENOENT);
        let bad = [b"bad-\xff-".as_slice(), i.to_string().as_bytes()].concat();
        assert_eq!(errno(fs::metadata(m.join(std::ffi::OsStr::from_bytes(&bad)))), libc::EINVAL);
    }
    assert_eq!(errno(fs::remove_dir(m.join("alive-1"))), libc::ENOTDIR);
    assert_eq!(errno(fs::read_dir(m.join("alive-1"))), libc::ENOTDIR);
    still_serving(&m, 3);

    // Data unavailable: two of the three drives of an rs:2+1 file killed.
    let data = common::cluster::pattern(3, 2 * 1024 * 1024);
    fs::write(m.join("doomed"), &data).unwrap();
    fs::write("/proc/sys/vm/drop_caches", b"3").expect("drop the page cache");
    let fs_client = env.rt().block_on(env.cluster().login(common::ADMIN, common::ADMIN_PW));
    let info = env.rt().block_on(fs_client.get_layout("/doomed")).expect("layout");
    let victims: Vec<String> = info.components.iter().take(2).map(|(_, addr)| addr.clone()).collect();
    let cluster = env.cluster_mut();
    for addr in &victims {
        let i = cluster.drives.iter().position(|d| d.addr.to_string() == *addr).expect("the component's drive");
        cluster.drives[i].kill();
    }
    assert_eq!(errno(fs::read(m.join("doomed"))), libc::EIO);
    assert_eq!(errno(fs::read(m.join("doomed"))), libc::EIO, "and again");
    // The name space lives at the manager: it goes on.
    assert_eq!(fs::metadata(m.join("doomed")).unwrap().len(), data.len() as u64);
    fs::create_dir(m.join("still-here")).expect("mkdir with drives down");
    assert!(fs::read_dir(&m).unwrap().any(|e| e.unwrap().file_name() == "still-here"));
    let (answered, failed) = env.mounted(0).counters();
    assert!(failed > 500 && answered > failed, "{answered} answered, {failed} failed");
    drop(fs_client);
    env.stop();
}
