//! The first hour of a new user, with the real `nasd` binary and a real
//! `nasd up` cluster: the README's tour as written, copies that fail
//! without leaving anything behind, trailing slashes, `--no-clobber`,
//! trees, the drive tools on the quick-start cluster (scrub finds a block
//! rotted on disk), the recorded drive capacity, plain logs in files, one
//! source of file times, and progress output only on a terminal.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

mod common;

use common::up::{drives_holding, local_tree, name_space, nasd_in, on_terminal, pattern, rot, runtime, text, Up};

/// The README's tour, run line by line as written (the alias pointing at
/// the binary under test) in a directory holding the repository's README
/// and docs, against `nasd up` started there as the README says.
#[test]
fn the_readme_tour_runs_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let tour = &readme[readme.find("## A short tour").expect("README has a tour")..];
    let block = &tour[tour.find("```sh\n").expect("the tour has a sh block") + 6..];
    let block = &block[..block.find("```").unwrap()];
    let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines[0].starts_with("alias nasd="), "the tour starts with its alias: {}", lines[0]);
    for needed in ["nasd put -r ", "nasd get -r ", "nasd scrub", "nasd audit --drive"] {
        assert!(lines.iter().any(|l| l.contains(needed)), "the tour shows `{needed}`");
    }

    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    std::fs::write(cwd.join("README.md"), &readme).unwrap();
    let docs = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs"));
    std::fs::create_dir(cwd.join("docs")).unwrap();
    for e in std::fs::read_dir(docs).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), cwd.join("docs").join(e.file_name())).unwrap();
        }
    }
    // Four drives, as the README's `nasd up` (small ones: the disk is shared).
    let mut up = Up::start_with(cwd, 4, None, &["--drive-capacity", "256MiB"], &[]);
    let alias = format!("alias nasd={}", env!("CARGO_BIN_EXE_nasd"));
    let mut outputs = Vec::new();
    for line in &lines[1..] {
        let script = format!("shopt -s expand_aliases\n{alias}\n{line}\n");
        let out = Command::new("bash")
            .arg("-c")
            .arg(&script)
            .current_dir(cwd)
            .env_remove("NASD_CONFIG")
            .env_remove("NASD_PASSWORD")
            .env_remove("NASD_NEW_PASSWORD")
            .env_remove("NASD_USER")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        if line.contains("# refused") {
            assert!(!out.status.success(), "`{line}` was to be refused: {stdout}");
            assert!(stderr.to_lowercase().contains("permission denied"), "`{line}`: {stderr}");
        } else {
            assert!(out.status.success(), "`{line}` failed:\n{stdout}\n{stderr}\nnasd up:\n{}", up.daemon.log_tail());
        }
        outputs.push((line.to_string(), stdout, stderr));
    }
    let said = |cmd: &str| {
        let (_, out, err) = outputs.iter().find(|(l, _, _)| l.starts_with(cmd)).unwrap();
        format!("{out}{err}")
    };
    assert!(said("nasd scrub ").contains("scrubbed 4 drives"), "{}", said("nasd scrub "));
    assert!(said("nasd inquiry --drive 0").contains("number    0"), "{}", said("nasd inquiry --drive 0"));
    assert!(said("nasd put -n ").contains("not overwritten (--no-clobber): /docs/README.md exists"));
    assert!(!cwd.join("docs-copy").exists(), "the tour removes its copy");

    // The tree went in whole.
    let listing = up.ok(&["ls", "/docs/docs"]);
    for e in std::fs::read_dir(cwd.join("docs")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(listing.lines().any(|l| l == name), "{name} missing from /docs/docs:\n{listing}");
    }
    // Without --drive, inquiry asks every drive `nasd up` recorded.
    let all = up.ok(&["inquiry"]);
    assert_eq!(all.matches("\nnumber    ").count() + usize::from(all.starts_with("number    ")), 4, "{all}");
    up.daemon.terminate();
}

/// The README's mount example, run line by line as written (its mount
/// point moved into a temporary directory, the alias pointing at the binary
/// under test) in a directory holding a copy of the repository's `crates`,
/// against `nasd up`: the mount in the background, the sources copied in
/// and compared, an extended attribute set and read back, a quota.
#[test]
fn the_readme_mount_example_runs_as_written() {
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        eprintln!("SKIPPED: /dev/fuse cannot be opened ({e}): FUSE mounts need root and the fuse module");
        return;
    }
    for tool in ["fusermount3", "setfattr", "getfattr"] {
        let found = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().unwrap();
        if !found.status.success() {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "`{tool}` is missing (.ci/run installs it)");
            eprintln!("SKIPPED: `{tool}` is not installed");
            return;
        }
    }
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let section = &readme[readme.find("As a file system").expect("README shows the mount")..];
    let block = &section[section.find("```sh\n").expect("a sh block") + 6..];
    let lines: Vec<&str> = block[..block.find("```").unwrap()].lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines[0].contains("nasd mount /mnt/nasd &"), "the example starts with the mount: {}", lines[0]);

    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let crates = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    assert!(Command::new("cp").args(["-a", crates]).arg(cwd.join("crates")).status().unwrap().success());
    let mnt = cwd.join("mnt").join("nasd");
    let here = |line: &str| line.replace("/mnt/nasd", mnt.to_str().unwrap());
    let mut up = Up::start_with(cwd, 4, None, &["--drive-capacity", "256MiB"], &[]);
    let bash = |line: &str| {
        let mut c = Command::new("bash");
        let alias = format!("alias nasd={}", env!("CARGO_BIN_EXE_nasd"));
        c.arg("-c").arg(format!("shopt -s expand_aliases\n{alias}\n{}\n", here(line))).current_dir(cwd);
        c.env_remove("NASD_CONFIG").env_remove("NASD_PASSWORD").env_remove("NASD_USER").stdin(Stdio::null());
        c
    };
    // The first line as a shell runs it: the mount stays in the background.
    let mount_line = lines[0].split('#').next().unwrap().trim().trim_end_matches('&');
    let mut mount = bash(mount_line).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mounted = || std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(mnt.to_str().unwrap());
    let waited = std::time::Instant::now();
    while !mounted() {
        assert!(mount.try_wait().unwrap().is_none(), "the mount ended: {:?}", mount.wait_with_output());
        assert!(waited.elapsed() < common::DAEMON_WAIT_MAX, "not mounted");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut outputs = String::new();
    for line in &lines[1..] {
        let out = bash(line).output().unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "`{line}` failed:\n{stdout}\n{stderr}\nnasd up:\n{}", up.daemon.log_tail());
        outputs += &stdout;
    }
    assert!(outputs.contains("user.note=\"hi\""), "getfattr shows the attribute: {outputs}");
    let listed = up.ok(&["ls", "/crates"]);
    assert!(listed.lines().any(|l| l.trim_end_matches('/') == "cli"), "the sources are in nasd: {listed}");
    assert!(Command::new("fusermount3").arg("-u").arg(&mnt).status().unwrap().success());
    let ended = mount.wait_with_output().unwrap();
    assert!(ended.status.success(), "the mount ends cleanly when unmounted: {}", text(&ended.stderr));
    up.daemon.terminate();
}

/// Issue 23 item 2: a full disk costs nothing afterwards. `cp` of a file
/// larger than the cluster into the mount fails (ENOSPC); by the time it
/// has failed, the drives hold nothing of it (the writer gave its
/// transaction up: `ABORT_WRITE`; it used to hold the space until its
/// write lease ran out, a minute later), and the next `nasd put` succeeds
/// without a word.
#[test]
fn a_full_disk_costs_nothing_afterwards() {
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        eprintln!("SKIPPED: /dev/fuse cannot be opened ({e}): FUSE mounts need root and the fuse module");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let mut up = Up::start_with(cwd, 3, None, &["--drive-capacity", "48MiB"], &[]);
    let rt = runtime();
    let fs = up.admin(&rt);
    let used = || -> u64 { rt.block_on(fs.statfs()).unwrap().2.iter().map(|d| d.used_bytes).sum() };
    let empty = used();
    let mnt = cwd.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mut mount = Command::new(env!("CARGO_BIN_EXE_nasd"))
        .arg("mount")
        .arg(&mnt)
        .current_dir(cwd)
        .env_remove("NASD_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let waited = std::time::Instant::now();
    while !std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(mnt.to_str().unwrap()) {
        assert!(mount.try_wait().unwrap().is_none(), "the mount ended: {:?}", mount.wait_with_output());
        assert!(waited.elapsed() < common::DAEMON_WAIT_MAX, "not mounted");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Three drives of 48 MiB hold 96 MiB of rs:2+1 data: 160 MiB cannot fit.
    let big = pattern(b"too big", 160 << 20);
    let e = std::fs::write(mnt.join("big.bin"), &big).expect_err("the cluster is full");
    assert!(
        matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)),
        "a full cluster is ENOSPC (or EDQUOT), not {e}"
    );
    // What a flush committed before the drives filled stays, as on a local disk (a slow run
    // commits a part of the copy by the transaction's age): that much, and not a byte more.
    let kept = std::fs::metadata(mnt.join("big.bin")).map_or(0, |m| m.len());
    let footprint = kept.div_ceil(2) * 3; // rs:2+1: each of the three components holds half
    let after = used();
    assert!(
        after <= empty + footprint + (1 << 20),
        "the failed write still holds {after} bytes of the drives ({empty} before, {kept} bytes of the file committed)"
    );
    // The next copy: no log line, no word at all.
    std::fs::write(cwd.join("small.txt"), b"fits\n").unwrap();
    up.quiet(&["put", "small.txt", "/small.txt"]);
    assert_eq!(up.ok(&["cat", "/small.txt"]), "fits\n");
    drop(fs);
    assert!(Command::new("fusermount3").arg("-u").arg(&mnt).status().unwrap().success());
    let ended = mount.wait_with_output().unwrap();
    assert!(ended.status.success(), "{}", text(&ended.stderr));
    up.daemon.terminate();
}

/// Scrub on a fresh `nasd up`: a block of a file rotted on one drive's disk
/// is found by `nasd scrub --drive N` (the drive key `nasd up` saved), and
/// healed by `nasd scrub` from the file's redundancy; the file reads back whole.
#[test]
fn scrub_on_a_fresh_up_finds_and_heals_a_block_rotted_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let mut up = Up::start_with(tmp.path(), 3, None, &["--drive-capacity", "256MiB"], &[]);
    let data = up.data();
    let content = pattern(b"scrub-me", 300_000);
    std::fs::write(tmp.path().join("precious.bin"), &content).unwrap();
    up.ok(&["put", "precious.bin", "/precious.bin"]);

    // The drive key files are the administrator's alone.
    for d in 0..3 {
        let key = data.join(format!("drive-{d}")).join("drive.key");
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600, "{}", key.display());
    }
    // Nothing is rotten yet: every drive scrubs clean.
    for d in ["0", "1", "2"] {
        let out = up.ok(&["scrub", "--drive", d]);
        assert!(out.contains(", 0 corrupt"), "{out}");
    }

    // Past the small-file threshold (64 KiB): the bytes below it live in the manager's store.
    let needle = &content[100_000..100_064];
    let holding = drives_holding(&data, 3, needle);
    let victim = holding[0];
    assert!(rot(&data, victim, needle));
    let victim_arg = victim.to_string();
    let found = up.nasd(&["scrub", "--drive", &victim_arg]);
    let out = text(&found.stdout);
    assert!(!found.status.success(), "a scrub that finds rot fails: {out}");
    assert!(out.contains(", 1 corrupt"), "{out}");
    assert!(out.contains("bytes no longer match the stored digest"), "{out}");
    assert!(text(&found.stderr).contains("`nasd scrub` (without --drive) heals them"), "{}", text(&found.stderr));
    // The audit trail of the drive is there with the same key.
    let audit = up.ok(&["audit", "--drive", &victim_arg, "--max", "5"]);
    assert!(audit.contains("seq"), "{audit}");

    let healed = up.ok(&["scrub"]);
    assert!(healed.contains("1 corrupt, 1 healed from redundancy, 0 unrecoverable"), "{healed}");
    let again = up.ok(&["scrub", "--drive", &victim_arg]);
    assert!(again.contains(", 0 corrupt"), "healed on the drive itself: {again}");
    up.ok(&["get", "/precious.bin", "back.bin"]);
    assert!(std::fs::read(tmp.path().join("back.bin")).unwrap() == content, "the file reads back whole");

    // A drive a manager looks after keeps its drive key.
    let refused = up.fails_stdout_unchecked(&[
        "set-drive-key",
        "--drive",
        "0",
        "--master-key-file",
        data.join("drive-0/master.key").to_str().unwrap(),
        "--drive-key-file",
        tmp.path().join("new.key").to_str().unwrap(),
    ]);
    assert!(refused.contains("looked after by a manager"), "{refused}");
    assert!(!tmp.path().join("new.key").exists());
    // A reader that goes away (`nasd audit | head -1`) stops the command quietly, no panic.
    for args in [&["audit"][..], &["inquiry"], &["ls", "-l", "/"], &["cat", "/precious.bin"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nasd"))
            .args(args)
            .current_dir(tmp.path())
            .env_remove("NASD_CONFIG")
            .env_remove("NASD_LOG")
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // closed before the first line is printed
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(141), "nasd {args:?}: {}", text(&out.stderr));
        assert!(out.stderr.is_empty(), "nasd {args:?} says nothing: {}", text(&out.stderr));
    }
    // Without --drive, audit shows every drive's trail, each with the key `nasd up` saved.
    let every = up.ok(&["audit", "--max", "3"]);
    for d in 0..3 {
        let header = format!("drive {d} (127.0.0.1:{}):", up.first_drive_port + d);
        assert!(every.lines().any(|l| l == header), "{header} missing:\n{every}");
    }
    assert_eq!(every.matches("audit id").count(), 3, "{every}");
    // One key file is one drive's.
    let one_key = data.join("drive-0/drive.key");
    let e = up.fails_stdout_unchecked(&["audit", "--drive-key-file", one_key.to_str().unwrap()]);
    assert!(e.contains("--drive-key-file is one drive's key"), "{e}");
    up.daemon.terminate();
}

/// Copies that fail leave nothing behind, trailing slashes, --no-clobber,
/// trees, and what a copy prints on a terminal and through a pipe.
#[test]
fn copies_fail_cleanly_mind_slashes_and_spare_existing_files() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    // Three drives of 64 MiB under rs:2+1: about 128 MiB of file data fit.
    let mut up = Up::start_with(cwd, 3, None, &["--drive-capacity", "64MiB"], &[]);
    let rt = runtime();
    let fs = up.admin(&rt);
    up.ok(&["mkdir", "/docs"]);
    std::fs::write(cwd.join("note.txt"), b"first version\n").unwrap();
    std::fs::write(cwd.join("other.txt"), b"second version\n").unwrap();
    std::fs::create_dir_all(cwd.join("tree/sub/deeper")).unwrap();
    std::fs::write(cwd.join("tree/a.txt"), b"a").unwrap();
    std::fs::write(cwd.join("tree/sub/b.txt"), b"b").unwrap();
    std::fs::write(cwd.join("tree/sub/deeper/c.bin"), pattern(b"tree", 200_000)).unwrap();
    std::os::unix::fs::symlink("a.txt", cwd.join("tree/link")).unwrap();
    std::fs::set_permissions(cwd.join("tree/sub"), std::fs::Permissions::from_mode(0o750)).unwrap();
    let before = name_space(&rt, &fs);

    // 1. A directory without -r: refused before anything is made, blaming the real cause once.
    let e = up.fails_stdout_unchecked(&["put", "tree", "/docs/"]);
    assert_eq!(e.matches("is a directory").count(), 1, "{e}");
    assert!(e.contains("-r") && !e.contains("manager"), "{e}");
    assert_eq!(name_space(&rt, &fs), before, "a refused put leaves the name space as it was");
    let e = up.fails_stdout_unchecked(&["put", "missing.txt", "/docs/"]);
    assert!(e.contains("missing.txt") && e.contains("No such file"), "{e}");
    assert_eq!(name_space(&rt, &fs), before);

    // A copy that fails part way (the drives fill up) leaves nothing, not even its temporary file.
    std::fs::write(cwd.join("huge.bin"), pattern(b"huge", 160 << 20)).unwrap();
    let e = up.fails_stdout_unchecked(&["put", "huge.bin", "/docs/"]);
    assert!(e.contains("no space left"), "the error names the cause: {e}");
    assert_eq!(name_space(&rt, &fs), before, "a failed put leaves the name space unchanged");
    // ... and so does a tree whose last file does not fit: what it made before is removed.
    std::fs::rename(cwd.join("huge.bin"), cwd.join("tree/sub/zz-huge.bin")).unwrap();
    let e = up.fails_stdout_unchecked(&["put", "-r", "tree", "/docs/"]);
    assert!(e.contains("no space left"), "{e}");
    assert_eq!(name_space(&rt, &fs), before, "a failed put -r leaves the name space unchanged");
    std::fs::remove_file(cwd.join("tree/sub/zz-huge.bin")).unwrap();

    // 2. A trailing slash means a directory that must exist.
    let e = up.fails_stdout_unchecked(&["put", "note.txt", "/nodir/"]);
    assert!(e.contains("no such directory: /nodir/"), "{e}");
    assert_eq!(name_space(&rt, &fs), before, "no file /nodir was made");
    up.ok(&["put", "note.txt", "/docs/"]);
    assert_eq!(up.ok(&["cat", "/docs/note.txt"]), "first version\n");
    let e = up.fails_stdout_unchecked(&["put", "other.txt", "/docs/note.txt/"]);
    assert!(e.contains("not a directory"), "{e}");
    let e = up.fails_stdout_unchecked(&["get", "/docs/note.txt", "nolocal/"]);
    assert!(e.contains("no such directory"), "{e}");
    assert!(!cwd.join("nolocal").exists());
    let e = up.fails_stdout_unchecked(&["put", "note.txt", "/nodir/x.txt"]);
    assert!(e.contains("no such directory: /nodir"), "{e}");

    // 3. --no-clobber leaves existing files alone, and says so; without it, a put replaces.
    let out = up.nasd(&["put", "-n", "other.txt", "/docs/note.txt"]);
    assert!(out.status.success());
    assert!(text(&out.stderr).contains("not overwritten (--no-clobber): /docs/note.txt exists"));
    assert_eq!(up.ok(&["cat", "/docs/note.txt"]), "first version\n");
    std::fs::write(cwd.join("local-note.txt"), b"local\n").unwrap();
    let out = up.nasd(&["get", "--no-clobber", "/docs/note.txt", "local-note.txt"]);
    assert!(out.status.success() && text(&out.stderr).contains("not overwritten"), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(cwd.join("local-note.txt")).unwrap(), b"local\n");
    up.ok(&["cp", "nasd:/docs/note.txt", "nasd:/docs/copy.txt"]);
    up.ok(&["put", "other.txt", "/docs/copy.txt"]);
    let out = up.nasd(&["cp", "-n", "nasd:/docs/note.txt", "nasd:/docs/copy.txt"]);
    assert!(out.status.success() && text(&out.stderr).contains("not overwritten"));
    assert_eq!(up.ok(&["cat", "/docs/copy.txt"]), "second version\n");
    up.ok(&["put", "other.txt", "/docs/note.txt"]);
    assert_eq!(up.ok(&["cat", "/docs/note.txt"]), "second version\n");
    for help in [["put", "--help"], ["get", "--help"], ["cp", "--help"]] {
        assert!(up.ok(&help).contains("--no-clobber"), "{help:?}");
    }

    // Trees: put -r, get -r and cp -r copy files, directories (with their modes) and links.
    let out = up.nasd(&["put", "-r", "tree", "/docs/"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "", "piped, a copy prints nothing but errors");
    let ls = up.ok(&["ls", "-l", "/docs/tree", "/docs/tree/sub"]);
    assert!(ls.contains("drwxr-x---") && ls.contains("link") && ls.contains("deeper"), "{ls}");
    up.ok(&["cp", "-r", "nasd:/docs/tree", "nasd:/copied"]);
    up.ok(&["get", "-r", "/copied", "back"]);
    for rel in ["a.txt", "sub/b.txt", "sub/deeper/c.bin"] {
        assert_eq!(
            std::fs::read(cwd.join("back").join(rel)).unwrap(),
            std::fs::read(cwd.join("tree").join(rel)).unwrap()
        );
    }
    assert_eq!(std::fs::read_link(cwd.join("back/link")).unwrap(), Path::new("a.txt"));
    assert_eq!(std::fs::metadata(cwd.join("back/sub")).unwrap().permissions().mode() & 0o777, 0o750);

    // A get that fails (a block of a file without redundancy rotted) leaves no partial copy.
    up.ok(&["mkdir", "/plain"]);
    up.ok(&["layout", "set", "/plain", "stripe:1"]);
    let fragile = pattern(b"fragile", 300_000);
    std::fs::write(cwd.join("fragile.bin"), &fragile).unwrap();
    up.ok(&["put", "fragile.bin", "/plain/"]);
    // Past the small-file threshold (64 KiB): the bytes below it live in the manager's store.
    let needle = &fragile[102_000..102_064];
    for d in drives_holding(&up.data(), 3, needle) {
        assert!(rot(&up.data(), d, needle));
    }
    std::fs::create_dir(cwd.join("out")).unwrap();
    let e = up.fails_stdout_unchecked(&["get", "/plain/fragile.bin", "out/"]);
    assert!(e.contains("fragile.bin"), "{e}");
    assert_eq!(local_tree(&cwd.join("out")), [], "a failed get leaves nothing behind");
    let e = up.fails_stdout_unchecked(&["get", "-r", "/plain", "out/"]);
    assert!(e.contains("fragile.bin"), "{e}");
    assert_eq!(local_tree(&cwd.join("out")), [], "a failed get -r leaves nothing behind");
    let before = name_space(&rt, &fs);
    let e = up.fails_stdout_unchecked(&["cp", "nasd:/plain/fragile.bin", "nasd:/docs/"]);
    assert!(e.contains("fragile.bin"), "{e}");
    let e = up.fails_stdout_unchecked(&["cp", "-r", "nasd:/plain", "nasd:/docs/"]);
    assert!(e.contains("fragile.bin"), "{e}");
    assert_eq!(name_space(&rt, &fs), before, "a failed cp and cp -r leave the name space unchanged");
    up.ok(&["rm", "/plain/fragile.bin"]);

    // 9. On a terminal, a copy ends with a one-line summary (bytes, time, rate).
    std::fs::write(cwd.join("five.bin"), pattern(b"five", 5 << 20)).unwrap();
    let (status, shown) = on_terminal(cwd, &["put", "five.bin", "/docs/"], &[]);
    assert!(status.success(), "{shown}");
    let summary = shown.lines().last().unwrap_or_default();
    assert!(summary.contains("copied 1 file (5.0 MiB) in ") && summary.contains("/s"), "{shown:?}");
    let (status, shown) = on_terminal(cwd, &["get", "-r", "/docs/tree", "terminal-copy"], &[]);
    assert!(status.success(), "{shown}");
    assert!(shown.contains("copied 3 files, 3 directories, 1 symbolic link ("), "{shown:?}");
    let out = up.nasd(&["get", "/docs/five.bin", "five-back.bin"]);
    assert!(out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(), "piped: silent");

    // 7. Logs: colour on a terminal, none through a pipe.
    let (_, shown) = on_terminal(cwd, &["ls", "/"], &[("NASD_LOG", "debug")]);
    assert!(shown.contains("\x1b["), "a terminal gets colour: {shown:?}");
    let piped = nasd_in(cwd, &["ls", "/"], &[("NASD_LOG", "debug")]);
    assert!(!piped.stderr.is_empty() && !piped.stderr.contains(&0x1b), "{}", text(&piped.stderr));
    drop(fs);
    up.daemon.terminate();
}

/// A drive's capacity is recorded at the first start and kept when the
/// disk's free space changes; a log written to a file has no colour codes; `stat` and
/// `ls -l` show one modification time, the file's.
#[test]
fn capacity_is_kept_logs_are_plain_and_times_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    // NO_COLOR empty is no request: colour would follow the output, a file here.
    let mut up = Up::start_with(cwd, 3, None, &[], &[("NO_COLOR", "")]);
    let rt = runtime();
    // To the byte, as the drives report them.
    let capacities = |up: &Up| {
        rt.block_on(async {
            let mut out = Vec::new();
            for i in 0..3 {
                let addr = format!("127.0.0.1:{}", up.first_drive_port + i);
                let mut c = nasd_client::DriveClient::connect(&addr).await.unwrap();
                out.push(c.inquiry().await.unwrap().capacity_bytes);
            }
            out
        })
    };
    let first = capacities(&up);
    assert!(first.iter().all(|c| *c > 0), "{first:?}");
    let recorded = std::fs::read_to_string(up.data().join("drive-0/capacity")).unwrap();
    assert!(recorded.trim().parse::<u64>().unwrap() > 0);
    let log = up.daemon.output();
    // Log lines were written (NASD_LOG=info), and none of them is coloured.
    assert!(log.contains(" INFO "), "{log}");
    assert!(!log.contains('\x1b'), "no colour codes in a log file:\n{log:?}");
    // On a terminal, NO_COLOR set turns colour off.
    let (status, shown) = on_terminal(cwd, &["ls", "/"], &[("NASD_LOG", "debug"), ("NO_COLOR", "1")]);
    assert!(status.success() && shown.contains("DEBUG"), "{shown}");
    assert!(!shown.contains('\x1b'), "NO_COLOR: no colour on a terminal either: {shown:?}");

    // 8. One modification time: what `stat` shows is what `ls -l` shows, and
    // it is the manager's record of the file (to the nanosecond), made when
    // the file was, and moved by a write.
    let fs = up.admin(&rt);
    std::fs::write(cwd.join("empty"), b"").unwrap();
    up.ok(&["mkdir", "/one"]);
    up.ok(&["layout", "set", "/one", "stripe:1"]);
    let now = || SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64;
    // The file's modification time as `stat`, `ls -l` and the manager show it; all must agree.
    let times_agree = |path: &str| -> i64 {
        let stat = up.ok(&["stat", path]);
        let modify = stat.lines().find_map(|l| l.trim().strip_prefix("modify")).unwrap().trim().to_string();
        let ls = up.ok(&["ls", "-l", path]);
        assert!(ls.contains(&modify[..16]), "{path}: stat says {modify}, ls -l says {ls}");
        let mtime = rt.block_on(fs.lstat(path)).unwrap().attr.mtime_ns;
        let fraction = format!(".{:09} UTC", mtime.rem_euclid(1_000_000_000));
        assert!(modify.ends_with(&fraction), "{path}: stat says {modify}, the manager {mtime} ns");
        mtime
    };
    for dir in ["/", "/one"] {
        let t0 = now();
        let path = format!("{}/empty", dir.trim_end_matches('/'));
        up.ok(&["put", "empty", &path]);
        let made = times_agree(&path);
        assert!(made >= t0, "{path}: modified before it was made ({made} < {t0})");
        // A write moves it, for every view alike.
        let t1 = now();
        rt.block_on(async {
            let f = fs.open(&path, true).await.unwrap();
            f.write_at(0, b"written").await.unwrap();
            f.close().await.unwrap();
        });
        let written = times_agree(&path);
        assert!(written >= t1 && written > made, "{path}: written at {written}, before the write {t1}");
        assert!(up.ok(&["stat", &path]).contains("(7 bytes)"));
    }
    drop(fs);
    up.daemon.terminate();

    // 6. Less free space on the next start does not shrink the drives.
    std::fs::write(cwd.join("filler.bin"), pattern(b"filler", 96 << 20)).unwrap();
    std::fs::File::open(cwd.join("filler.bin")).unwrap().sync_all().unwrap();
    let manager = up.daemon.addr;
    let mut up = Up::start_with(cwd, 3, Some(manager), &[], &[]);
    assert_eq!(capacities(&up), first, "the capacity recorded at the first start is kept");
    up.daemon.terminate();

    // A capacity the disk cannot back: space_cli.rs.
}

/// `nasd up` takes every port it serves on before it creates anything: a
/// drive's or the manager's port in use stops
/// it at once with a message naming the port, and the data directory is not
/// even made (issue 23: it used to make keys first, or print "nasd is up"
/// before its manager failed to listen). Then, with the ports free, it starts,
/// and says "nasd is up" only once its manager accepts connections; its
/// config file may be named before it exists; once stopped, commands say
/// what to start.
#[test]
fn up_takes_its_ports_before_it_makes_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    let first = common::up::free_ports(3);
    let manager = common::up::free_ports(2) + 1;
    let up_args = |first: u16, manager: u16| {
        let (first, manager) = (first.to_string(), manager.to_string());
        nasd_in(cwd, &["up", "--drives", "3", "--first-drive-port", &first, "--manager-port", &manager], &[])
    };
    for (taken, who) in [(first + 2, "another drive"), (manager, "another manager")] {
        let holder = std::net::TcpListener::bind(("127.0.0.1", taken)).unwrap();
        let out = up_args(first, manager);
        let said = text(&out.stderr);
        assert!(!out.status.success(), "port {taken} is taken: {said}");
        assert!(said.contains(&format!("cannot listen on 127.0.0.1:{taken}: is {who}")), "{said}");
        assert!(!said.contains("nasd is up"), "{said}");
        assert!(!cwd.join("nasd-data").exists(), "nothing is made when port {taken} is taken: {said}");
        drop(holder);
    }
    // The config file named before the first start (the banner's `export NASD_CONFIG=…`): it is
    // the one `nasd up` writes, in the data directory it names.
    let named = cwd.join("nasd-data").join("nasd.toml");
    let mut up = Up::start_with(cwd, 3, None, &[], &[("NASD_CONFIG", named.to_str().unwrap())]);
    let log = up.daemon.output();
    let banner = log.find("nasd is up").expect("the banner");
    assert!(!log[..banner].contains("cannot listen"), "{log}");
    std::net::TcpStream::connect(up.daemon.addr).expect("the manager listens once the banner is out");
    assert!(named.exists());
    up.ok(&["ls", "/"]);
    // A missing config file of another name is a typo, not a new cluster.
    let said = text(&nasd_in(cwd, &["--config", "nasd-dat/nasd.tml", "up"], &[]).stderr);
    assert!(said.contains("does not exist; `nasd up` writes its own as DATA/nasd.toml"), "{said}");
    // Stopped, commands say what to start.
    up.daemon.terminate();
    let said = up.fails(&["ls", "/"]);
    assert!(said.contains("is `nasd up` or `nasd auth` running?"), "{said}");
}

/// --help: one default per option, help on positional arguments, `--user`
/// only where a command logs in.
#[test]
fn help_is_clean() {
    let tmp = tempfile::tempdir().unwrap();
    let help = |args: &[&str]| text(&nasd_in(tmp.path(), args, &[]).stdout);
    let add_user = help(&["admin", "add-user", "--help"]);
    for line in add_user.lines().filter(|l| l.contains("--uid") || l.contains("--gid")) {
        assert_eq!(line.matches("[default").count(), 1, "{line}");
    }
    // Each positional argument has its line of help.
    let explained = |args: &[&str], arg: &str, says: &str| {
        let h = help(args);
        let line = h.lines().find(|l| l.trim_start().starts_with(arg)).unwrap_or_else(|| panic!("{arg}: {h}"));
        assert!(line.contains(says), "{args:?} {arg}: {line}");
    };
    for (args, arg, says) in [
        (&["put", "-h"][..], "<LOCAL>", "The file or directory on this machine"),
        (&["put", "-h"], "<REMOTE>", "Where in nasd"),
        (&["get", "-h"], "<REMOTE>", "The file or directory in nasd"),
        (&["get", "-h"], "[LOCAL]", "Where on this machine"),
        (&["cp", "-h"], "<SOURCE>", "What to copy"),
        (&["cp", "-h"], "<DESTINATION>", "Where to"),
        (&["chown", "-h"], "<OWNER>", "OWNER, OWNER:GROUP or :GROUP"),
    ] {
        explained(args, arg, says);
    }
    for cmd in ["up", "drive", "manager", "inquiry", "audit", "set-drive-key", "bench"] {
        assert!(!help(&[cmd, "--help"]).contains("--user"), "{cmd} takes no --user");
    }
    for cmd in ["ls", "put", "status", "scrub", "repair"] {
        assert!(help(&[cmd, "--help"]).contains("--user"), "{cmd} takes --user");
    }
    let out = nasd_in(tmp.path(), &["--user", "bob", "up"], &[]);
    assert!(!out.status.success() && text(&out.stderr).contains("--user is for commands that log in"));
}
