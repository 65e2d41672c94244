//! Disk space as a user of `nasd up` meets it (issue 23.3, 23.4), with the
//! real binary: freed space goes back to the disk, a sparse file costs what
//! it holds, and a capacity the disk cannot back is refused unless forced.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::up::{pattern, runtime, text, Up};
use common::{free_addr, Daemon};

const MIB: u64 = 1 << 20;
/// Longest a drive may take to remove a file's objects and commit (the
/// manager's maintenance pass, the drive's commit interval): a hang bound.
const SETTLE_MAX: Duration = Duration::from_secs(120);

/// Bytes the drives' block files occupy on disk, and their apparent sizes.
fn block_files(data: &Path, drives: usize) -> (u64, u64) {
    let (mut on_disk, mut len) = (0, 0);
    for i in 0..drives {
        let m = std::fs::metadata(data.join(format!("drive-{i}")).join("blocks.dat")).unwrap();
        on_disk += m.blocks() * 512;
        len += m.len();
    }
    (on_disk, len)
}

/// Bytes the drives say they use (`nasd df`'s figures).
fn drives_used(fs: &nasd_fs::FsClient, rt: &tokio::runtime::Runtime) -> u64 {
    let (_, _, drives) = rt.block_on(fs.statfs()).unwrap();
    drives.iter().map(|d| d.used_bytes).sum()
}

/// Runs `cmd` to its end, output piped; `None` if it is still running after
/// [`SETTLE_MAX`] (a daemon that started instead of refusing: killed).
fn finished(cmd: &mut Command) -> Option<std::process::Output> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run nasd");
    let deadline = Instant::now() + SETTLE_MAX;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(child.wait_with_output().unwrap())
}

/// Waits until `settled` holds (the drives removed and committed), or
/// fails with what `show` says after [`SETTLE_MAX`].
fn wait_until(what: &str, mut settled: impl FnMut() -> bool, show: impl Fn() -> String) {
    let deadline = Instant::now() + SETTLE_MAX;
    while !settled() {
        assert!(Instant::now() < deadline, "{what}: not so after {} s: {}", SETTLE_MAX.as_secs(), show());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Writing and removing a 64 MiB file four times leaves the drives' block
/// files occupying what `nasd df` says is used — not four files' worth —
/// and never larger than one file's worth: freed blocks are reused before a
/// block file grows, and their space is given back to the disk once their
/// release is durable. It used to grow with every write (the allocator
/// reused freed blocks only once it reached the capacity) and hold 4× the
/// file with `nasd df` at 0 B.
#[test]
fn freed_space_goes_back_to_the_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    const DRIVES: usize = 3;
    let mut up = Up::start(cwd, DRIVES as u16, &["--drive-capacity", "512MiB"]);
    let rt = runtime();
    let fs = up.admin(&rt);
    std::fs::write(cwd.join("big"), pattern(b"churn", (64 * MIB) as usize)).unwrap();
    let baseline = drives_used(&fs, &rt);
    // rs:2+1 (nasd up's layout for three drives): 32 MiB on each drive.
    let per_file = 96 * MIB;
    let slack = 2 * MIB * DRIVES as u64;
    for round in 1..=4 {
        up.ok(&["put", "big", "/big"]);
        let (on_disk, _) = block_files(&up.data(), DRIVES);
        assert!(on_disk >= per_file / 10 * 9, "round {round}: the file is on the drives' disks ({on_disk} bytes)");
        up.ok(&["rm", "/big"]);
        wait_until(
            &format!("round {round}: the block files occupy what the drives use"),
            || {
                let used = drives_used(&fs, &rt);
                used <= baseline + slack && block_files(&up.data(), DRIVES).0 <= used + slack
            },
            || format!("drives use {} bytes; block files {:?}", drives_used(&fs, &rt), block_files(&up.data(), DRIVES)),
        );
        let (_, len) = block_files(&up.data(), DRIVES);
        assert!(len <= per_file + slack, "round {round}: the block files grew past one file's worth ({len} bytes)");
    }
    drop(fs);
    up.daemon.terminate();
}

/// A capacity larger than the disk can back (its free space plus what the
/// drives hold) is refused at start-up, by `nasd drive` and by `nasd up`
/// (whose drives share one disk), with a message saying what to do;
/// `--force-capacity` starts anyway, with a warning. Both used to start
/// with the warning alone, and the disk then filled: every change refused.
#[test]
fn a_capacity_the_disk_cannot_back_is_refused_unless_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let data = cwd.join("big-drive");
    let addr = free_addr().to_string();
    let drive = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nasd"));
        cmd.args(["drive", "--data", data.to_str().unwrap(), "--listen", &addr, "--capacity", "64TiB"]);
        cmd.args(extra).current_dir(cwd).env_remove("NASD_CONFIG").stdin(Stdio::null());
        cmd
    };
    let out = finished(&mut drive(&[])).expect("a 64 TiB drive on this disk started, and served");
    assert!(!out.status.success(), "a 64 TiB drive started: {}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains("the drive's capacity (64.0 TiB) is more than the disk under"), "{said}");
    assert!(said.contains("--capacity ") && said.contains("--force-capacity"), "says what to do: {said}");
    assert!(!data.join("blocks.dat").exists() || std::fs::metadata(data.join("blocks.dat")).unwrap().len() == 0);

    let log = cwd.join("drive.log");
    let mut d = Daemon::start("drive", cwd, &log, None, {
        let data = data.clone();
        move |addr| {
            ["drive", "--data", data.to_str().unwrap(), "--listen", &addr.to_string(), "--capacity", "64TiB"]
                .iter()
                .map(OsString::from)
                .chain([OsString::from("--force-capacity")])
                .collect()
        }
    });
    let said = d.output();
    assert!(said.contains("warning: the drive's capacity (64.0 TiB) is more than the disk under"), "{said}");
    assert!(said.contains("started anyway (--force-capacity)"), "{said}");
    d.kill();

    // `nasd up` weighs its drives together.
    let big = cwd.join("big-up");
    std::fs::create_dir(&big).unwrap();
    let first = common::up::free_ports(2).to_string();
    let manager = free_addr().port().to_string();
    let up = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nasd"));
        cmd.args(["up", "--drives", "2", "--manager-port", &manager, "--first-drive-port", &first]);
        cmd.args(["--drive-capacity", "64TiB"]).args(extra).current_dir(&big).env_remove("NASD_CONFIG");
        finished(cmd.stdin(Stdio::null())).expect("nasd up with 2 × 64 TiB drives on this disk started, and served")
    };
    let out = up(&[]);
    assert!(!out.status.success(), "nasd up started 2 × 64 TiB: {}", text(&out.stderr));
    let said = text(&out.stderr);
    assert!(said.contains("the 2 drives' capacity (128.0 TiB in all) is more than the disk under"), "{said}");
    assert!(said.contains("--drive-capacity ") && said.contains("--force-capacity"), "{said}");
    assert!(!text(&out.stdout).contains("nasd is up"), "{}", text(&out.stdout));
    let mut up = Up::start_with(&big, 2, None, &["--drive-capacity", "64TiB", "--force-capacity"], &[]);
    let said = up.daemon.output();
    assert!(said.contains("warning: the 2 drives' capacity (128.0 TiB in all) is more than the disk under"), "{said}");
    up.daemon.terminate();
}

/// `nasd put` of a 256 MiB sparse local file — a little data at its start
/// and end, zeros between — stores what the file holds: the drives take a
/// few blocks, not 256 MiB (with parity, 384 MiB: every block of zeros was
/// stored), and the file comes back byte for byte.
#[test]
fn a_sparse_file_put_costs_what_it_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    const DRIVES: usize = 3;
    let mut up = Up::start(cwd, DRIVES as u16, &["--drive-capacity", "512MiB"]);
    let rt = runtime();
    let fs = up.admin(&rt);
    let local = cwd.join("sparse");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&local).unwrap();
        f.write_all_at(&pattern(b"head", 100_000), 0).unwrap();
        f.set_len(256 * MIB).unwrap();
        f.write_all_at(b"end", 256 * MIB - 3).unwrap();
    }
    let baseline = drives_used(&fs, &rt);
    up.ok(&["put", "sparse", "/sparse"]);
    let stored = drives_used(&fs, &rt) - baseline;
    assert!(stored <= 4 * MIB, "the drives store {stored} bytes for a file holding 100 003");
    let (_, file_bytes, _) = rt.block_on(fs.statfs()).unwrap();
    assert!(file_bytes <= 2 * MIB, "nasd df's bytes in files count what the files hold: {file_bytes}");
    up.ok(&["get", "/sparse", "back"]);
    assert!(std::fs::read(cwd.join("back")).unwrap() == std::fs::read(&local).unwrap(), "the file comes back whole");
    drop(fs);
    up.daemon.terminate();
}

/// The size (number and unit, two words) from word `word` on of drive
/// `drive`'s row in a `nasd df` or `nasd status` table.
fn size_at(table: &str, drive: u32, word: usize) -> String {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|words| words.first() == Some(&drive.to_string().as_str()))
        .and_then(|words| words.get(word..word + 2).map(|w| w.join(" ")))
        .unwrap_or_else(|| panic!("no row for drive {drive}:\n{table}"))
}

/// `nasd df` and `nasd status` agree on what each drive uses right after a
/// put (issue 31.6: status showed the health check's older report).
#[test]
fn df_and_status_agree_on_used_space_right_after_a_put() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    const DRIVES: u32 = 2;
    let mut up = Up::start(cwd, DRIVES as u16, &["--drive-capacity", "256MiB"]);
    std::fs::write(cwd.join("f"), pattern(b"used", 3 * MIB as usize)).unwrap();
    up.ok(&["put", "f", "/f"]);
    let (df, status) = (up.ok(&["df"]), up.ok(&["status"]));
    for d in 0..DRIVES {
        // df: drive address SIZE USED …; status: drive address domain state SIZE USED …
        let (by_df, by_status) = (size_at(&df, d, 4), size_at(&status, d, 6));
        assert_eq!(by_df, by_status, "drive {d}: df says {by_df}, status {by_status}\n{df}\n{status}");
        assert_ne!(by_df, "0 B", "the put used space on drive {d}:\n{df}");
    }
    up.daemon.terminate();
}

/// A temporary copy a client left (`.NAME.XXXXXXXX.nasd-tmp`, closed) is
/// removed by the manager once it has not been written for `[manager]
/// temporaries_age_secs`, and its space given back; other files stay
/// (issue 31.5).
#[test]
fn the_manager_removes_temporaries_clients_left() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let mut up = Up::start(cwd, 1, &["--drive-capacity", "64MiB"]);
    let manager = up.daemon.addr;
    up.daemon.terminate();
    let config_path = cwd.join("nasd-data").join("nasd.toml");
    let mut config: toml::Table = toml::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    let section = config.entry("manager").or_insert_with(|| toml::Value::Table(Default::default()));
    section.as_table_mut().unwrap().insert("temporaries_age_secs".into(), 1.into());
    std::fs::write(&config_path, toml::to_string(&config).unwrap()).unwrap();
    let mut up = Up::start_with(cwd, 1, Some(manager), &["--drive-capacity", "64MiB"], &[]);

    std::fs::write(cwd.join("f"), pattern(b"left", 2 * MIB as usize)).unwrap();
    up.ok(&["mkdir", "/d"]);
    up.ok(&["put", "f", "/d/.f.0badc0de.nasd-tmp"]);
    up.ok(&["put", "f", "/d/kept"]);
    wait_until("the leftover removed", || !up.ok(&["ls", "/d"]).contains(".nasd-tmp"), || up.ok(&["ls", "/d"]));
    assert!(up.ok(&["ls", "/d"]).contains("kept"), "other files stay");
    assert!(up.daemon.output().contains("removed a temporary copy a client left"), "{}", up.daemon.log_tail());
    up.ok(&["get", "/d/kept", "back"]);
    assert_eq!(std::fs::read(cwd.join("back")).unwrap(), std::fs::read(cwd.join("f")).unwrap());
    up.daemon.terminate();
}
