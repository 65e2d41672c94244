//! `nasd put`, `get` and `cp` as a user meets them, with the real binary on
//! a real `nasd up` cluster (one for the whole file, started once): a copy
//! that fails leaves the name space (or the local directory) as it was and
//! names the real cause once; a trailing slash means a directory that must
//! exist; `-n/--no-clobber` leaves existing files byte for byte; `put -r`
//! then `get -r` (and `cp -r`) give back identical trees; piped, a copy
//! prints nothing, on a terminal it ends with one summary line.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::up::{drives_holding, local_tree, name_space, on_terminal, pattern, rot, runtime, text, Entry, Up};
use common::DAEMON_WAIT_MAX;

/// Drives of the cluster (rs:2+1 by default).
const DRIVES: u16 = 3;

/// The local tree the copies start from: nested directories with their own
/// modes, an empty file, an empty directory, a larger file, a symbolic link.
/// Returns its total file bytes.
fn make_tree(root: &Path) -> u64 {
    let mode = |p: PathBuf, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(root.join("emptydir")).unwrap();
    std::fs::write(root.join("a.txt"), b"alpha\n").unwrap();
    std::fs::write(root.join("empty"), b"").unwrap();
    std::fs::write(root.join("sub/b.txt"), b"bravo\n").unwrap();
    std::fs::write(root.join("sub/deeper/c.bin"), pattern(b"tree", 300_000)).unwrap();
    std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
    mode(root.join("a.txt"), 0o640);
    mode(root.join("empty"), 0o600);
    mode(root.join("sub"), 0o750);
    mode(root.join("emptydir"), 0o700);
    6 + 6 + 300_000
}

/// The process's umask (files made by `get` get their mode less it, as any new file).
fn umask() -> u32 {
    // SAFETY: umask(2) only swaps the process's mask; it is put back at once,
    // and this test makes no file and starts no child in between.
    unsafe {
        let mask = libc::umask(0o022);
        libc::umask(mask);
        mask as u32
    }
}

/// A local tree with file modes less `mask` (directories get their modes exactly).
fn masked(tree: Vec<(PathBuf, Entry)>, mask: u32) -> Vec<(PathBuf, Entry)> {
    tree.into_iter()
        .map(|(p, e)| match e {
            Entry::File(m, bytes) => (p, Entry::File(m & !mask, bytes)),
            e => (p, e),
        })
        .collect()
}

/// The summary of a copy of the tree of [`make_tree`] (4 files of `bytes`).
fn tree_summary(bytes: u64) -> String {
    format!("copied 4 files, 4 directories, 1 symbolic link ({:.1} KiB) in ", bytes as f64 / 1024.0)
}

#[test]
fn copies_through_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    // Three drives of 128 MiB: room for the large file the interrupted copies move.
    let mut up = Up::start(cwd, DRIVES, &["--drive-capacity", "128MiB"]);
    let rt = runtime();
    let fs = up.admin(&rt);
    up.quiet(&["mkdir", "/docs"]);
    std::fs::write(cwd.join("note.txt"), b"first version\n").unwrap();
    std::fs::write(cwd.join("other.txt"), b"second version\n").unwrap();
    let tree_bytes = make_tree(&cwd.join("tree"));

    failed_copies_leave_the_name_space_unchanged(&up, &rt, &fs);
    a_trailing_slash_means_a_directory(&up, &rt, &fs);
    no_clobber_leaves_existing_files_alone(&up, &rt, &fs);
    trees_go_in_and_come_back_identical(&up, tree_bytes);
    cat_prints_the_reads_it_is_given(&up);
    a_failed_get_leaves_no_local_file(&up);
    interrupted_copies_leave_nothing(&up, &rt, &fs);
    a_file_growing_while_put_is_said(&up, &rt, &fs);
    a_wide_tree_goes_in_whole(&up, &rt, &fs);
    drop(fs);
    up.daemon.terminate();
}

/// Issue 15 item 1: a directory as source, a missing source, a trailing slash to a
/// missing directory, a copy over a quota: each refused or failed copy
/// leaves every name (temporary ones included), size and mode as it was,
/// and its error names the real cause, once.
fn failed_copies_leave_the_name_space_unchanged(up: &Up, rt: &tokio::runtime::Runtime, fs: &nasd_fs::FsClient) {
    let cwd = &up.cwd;
    // A directory with a quota, holding a file a failed copy must not touch.
    up.quiet(&["mkdir", "/q"]);
    up.quiet(&["put", "note.txt", "/q/keep.txt"]);
    up.ok(&["quota", "--dir", "/q", "--bytes", "64KiB"]);
    std::fs::write(cwd.join("big.bin"), pattern(b"big", 1 << 20)).unwrap();
    let before = name_space(rt, fs);
    let unchanged = |what: &str| assert_eq!(name_space(rt, fs), before, "{what} changed the name space");

    // The issue's case: a directory without -r. Refused before anything is made, blamed on
    // the source (not on the manager), said once.
    for args in [&["put", "tree", "/docs/"][..], &["cp", "tree", "nasd:/docs/"], &["put", "tree/", "/docs/"]] {
        let e = up.fails(args);
        assert_eq!(e.lines().count(), 1, "{args:?}: one line: {e}");
        assert_eq!(e.matches("is a directory").count(), 1, "{args:?}: {e}");
        assert!(e.contains("tree") && e.contains("-r"), "{args:?}: {e}");
        assert!(!e.contains("manager") && !e.contains("os error"), "{args:?}: {e}");
        unchanged(&format!("{args:?}"));
    }
    let e = up.fails(&["get", "/docs", "."]);
    assert!(e.contains("/docs is a directory") && e.contains("-r"), "{e}");

    // A missing source: named, with the system's reason, once.
    for args in [
        &["put", "missing.txt", "/docs/"][..],
        &["put", "-r", "missing", "/docs/"],
        &["cp", "missing.txt", "nasd:/docs/"],
    ] {
        let e = up.fails(args);
        assert!(e.contains("missing") && e.contains("No such file or directory"), "{args:?}: {e}");
        assert_eq!(e.matches("No such file or directory").count(), 1, "{args:?}: {e}");
        assert!(!e.contains("manager"), "{args:?}: {e}");
        unchanged(&format!("{args:?}"));
    }
    let e = up.fails(&["cp", "nasd:/docs/missing.txt", "nasd:/q/"]);
    assert!(e.contains("/docs/missing.txt"), "{e}");
    unchanged("cp of a missing nasd file");

    // A trailing slash to a directory that does not exist: no file of its name appears.
    for args in
        [&["put", "note.txt", "/nodir/"][..], &["put", "-r", "tree", "/nodir/"], &["cp", "note.txt", "nasd:/nodir/"]]
    {
        let e = up.fails(args);
        assert!(e.contains("no such directory: /nodir/"), "{args:?}: {e}");
        unchanged(&format!("{args:?}"));
    }
    let e = up.fails(&["put", "note.txt", "/nodir/x.txt"]);
    assert!(e.contains("no such directory: /nodir"), "{e}");
    unchanged("put into a missing directory");

    // Over a directory's quota: the copy fails part way, and neither its temporary file nor
    // (for a tree) the directories it made stay; a file it was to replace keeps its bytes.
    let e = up.fails(&["put", "big.bin", "/q/"]);
    assert!(e.contains("big.bin") && e.to_lowercase().contains("quota"), "the error names the cause: {e}");
    unchanged("a put over the quota");
    let e = up.fails(&["put", "big.bin", "/q/keep.txt"]);
    assert!(e.to_lowercase().contains("quota"), "{e}");
    unchanged("a put replacing a file, over the quota");
    assert_eq!(up.ok(&["cat", "/q/keep.txt"]), "first version\n", "the old file is whole");
    std::fs::create_dir_all(cwd.join("bigtree/d")).unwrap();
    std::fs::write(cwd.join("bigtree/a.txt"), b"fits").unwrap();
    std::fs::copy(cwd.join("big.bin"), cwd.join("bigtree/d/z.bin")).unwrap();
    let e = up.fails(&["put", "-r", "bigtree", "/q/"]);
    assert!(e.contains("z.bin") && e.to_lowercase().contains("quota"), "{e}");
    unchanged("a put -r over the quota");
    let e = up.fails(&["cp", "-r", "bigtree", "nasd:/q/"]);
    assert!(e.to_lowercase().contains("quota"), "{e}");
    unchanged("a cp -r over the quota");
    up.ok(&["quota", "--dir", "/q", "--bytes", "none", "--files", "none"]);
}

/// Issue 15 item 2: a destination with a trailing slash is a directory that must
/// exist (in nasd and here); without one, an existing directory is copied
/// into and anything else names the copy.
fn a_trailing_slash_means_a_directory(up: &Up, rt: &tokio::runtime::Runtime, fs: &nasd_fs::FsClient) {
    let cwd = &up.cwd;
    up.quiet(&["put", "note.txt", "/docs/"]);
    assert_eq!(up.ok(&["cat", "/docs/note.txt"]), "first version\n");
    up.quiet(&["put", "note.txt", "/docs/named"]);
    assert_eq!(up.ok(&["cat", "/docs/named"]), "first version\n", "no slash, no such name: the copy's name");
    up.quiet(&["put", "other.txt", "/docs"]);
    assert_eq!(up.ok(&["cat", "/docs/other.txt"]), "second version\n", "an existing directory without a slash");

    let before = name_space(rt, fs);
    let e = up.fails(&["put", "other.txt", "/docs/note.txt/"]);
    assert!(e.contains("/docs/note.txt/") && e.contains("not a directory"), "{e}");
    let e = up.fails(&["put", "other.txt", "/docs/note.txt/x.txt"]);
    assert!(e.contains("not a directory"), "{e}");
    let e = up.fails(&["cp", "nasd:/docs/other.txt", "nasd:/docs/note.txt/"]);
    assert!(e.contains("not a directory"), "{e}");
    assert_eq!(name_space(rt, fs), before);
    assert_eq!(up.ok(&["cat", "/docs/note.txt"]), "first version\n");

    // The same for get's local destination.
    let e = up.fails(&["get", "/docs/note.txt", "nolocal/"]);
    assert!(e.contains("no such directory: nolocal/"), "{e}");
    assert!(!cwd.join("nolocal").exists(), "no file nolocal was made");
    let e = up.fails(&["get", "/docs/note.txt", "nolocal/x.txt"]);
    assert!(e.contains("no such directory: nolocal"), "{e}");
    assert!(!cwd.join("nolocal").exists());
    std::fs::write(cwd.join("plain.txt"), b"plain\n").unwrap();
    let e = up.fails(&["get", "/docs/note.txt", "plain.txt/"]);
    assert!(e.contains("plain.txt/: plain.txt is not a directory"), "{e}");
    let e = up.fails(&["get", "/docs/note.txt", "plain.txt/x.txt"]);
    assert!(e.contains("plain.txt/x.txt: plain.txt is not a directory"), "{e}");
    assert_eq!(std::fs::read(cwd.join("plain.txt")).unwrap(), b"plain\n");
    std::fs::create_dir(cwd.join("into")).unwrap();
    up.quiet(&["get", "/docs/note.txt", "into/"]);
    up.quiet(&["get", "/docs/other.txt", "into"]);
    up.quiet(&["get", "/docs/named", "into/renamed.txt"]);
    let got: Vec<_> = local_tree(&cwd.join("into")).into_iter().map(|(p, _)| p).collect();
    assert_eq!(got, [Path::new("note.txt"), Path::new("other.txt"), Path::new("renamed.txt")]);
    assert_eq!(std::fs::read(cwd.join("into/renamed.txt")).unwrap(), b"first version\n");
}

/// Issue 15 item 3: with -n (--no-clobber) put, get and cp leave an existing
/// destination byte for byte and name it; without, they replace it (the
/// default scripts rely on); --help says both.
fn no_clobber_leaves_existing_files_alone(up: &Up, rt: &tokio::runtime::Runtime, fs: &nasd_fs::FsClient) {
    let cwd = &up.cwd;
    let remote = |path: &str| rt.block_on(fs.read_file(path)).unwrap();
    // /docs/note.txt holds "first version\n"; other.txt here "second version\n".
    for flag in ["-n", "--no-clobber"] {
        let out = up.nasd(&["put", flag, "other.txt", "/docs/note.txt"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stderr), "not overwritten (--no-clobber): /docs/note.txt exists\n");
        assert_eq!(remote("/docs/note.txt"), b"first version\n");
        let out = up.nasd(&["cp", flag, "nasd:/docs/other.txt", "nasd:/docs/note.txt"]);
        assert!(out.status.success() && text(&out.stderr).contains("not overwritten"), "{}", text(&out.stderr));
        assert_eq!(remote("/docs/note.txt"), b"first version\n");
        let out = up.nasd(&["get", flag, "/docs/note.txt", "other.txt"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stderr), "not overwritten (--no-clobber): other.txt exists\n");
        assert_eq!(std::fs::read(cwd.join("other.txt")).unwrap(), b"second version\n");
    }
    // A destination that is missing is copied as usual with -n.
    up.quiet(&["put", "-n", "other.txt", "/docs/fresh.txt"]);
    assert_eq!(remote("/docs/fresh.txt"), b"second version\n");

    // -r -n merges: files already there stay, the others arrive.
    std::fs::create_dir_all(cwd.join("merge/sub")).unwrap();
    std::fs::write(cwd.join("merge/kept.txt"), b"old\n").unwrap();
    up.quiet(&["put", "-r", "merge", "/docs/"]);
    std::fs::write(cwd.join("merge/kept.txt"), b"new\n").unwrap();
    std::fs::write(cwd.join("merge/sub/added.txt"), b"added\n").unwrap();
    let out = up.nasd(&["put", "-r", "-n", "merge", "/docs/"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "not overwritten (--no-clobber): /docs/merge/kept.txt exists\n");
    assert_eq!(remote("/docs/merge/kept.txt"), b"old\n");
    assert_eq!(remote("/docs/merge/sub/added.txt"), b"added\n");

    // Without -n, put and get replace (whole).
    up.quiet(&["put", "other.txt", "/docs/note.txt"]);
    assert_eq!(remote("/docs/note.txt"), b"second version\n");
    std::fs::write(cwd.join("local.txt"), b"local\n").unwrap();
    up.quiet(&["get", "/docs/fresh.txt", "local.txt"]);
    assert_eq!(std::fs::read(cwd.join("local.txt")).unwrap(), b"second version\n");

    for cmd in ["put", "get", "cp"] {
        let help = up.ok(&[cmd, "--help"]);
        assert!(help.contains("-n, --no-clobber"), "{cmd} --help: {help}");
        assert!(help.contains("An existing file is replaced"), "{cmd} --help says the default: {help}");
    }
}

/// Issue 15 items 1 and 9: put -r, cp -r and get -r copy whole trees (nested
/// directories with their modes, an empty file, an empty directory, a
/// link) and give back identical ones; piped they print nothing, on a
/// terminal they end with one summary line.
fn trees_go_in_and_come_back_identical(up: &Up, tree_bytes: u64) {
    let cwd = &up.cwd;
    let mask = umask();
    let original = masked(local_tree(&cwd.join("tree")), mask);
    assert_eq!(original.len(), 8, "{original:?}");

    up.quiet(&["mkdir", "/t"]);
    up.quiet(&["put", "-r", "tree", "/t/"]);
    let ls = up.ok(&["ls", "-l", "/t/tree", "/t/tree/sub"]);
    assert!(ls.contains("drwxr-x---") && ls.contains("-rw-r-----"), "modes kept: {ls}");
    up.quiet(&["get", "-r", "/t/tree", "back"]);
    assert_eq!(local_tree(&cwd.join("back")), original, "put -r then get -r gives the tree back");

    // Within nasd, and with cp both ways.
    up.quiet(&["cp", "-r", "nasd:/t/tree", "nasd:/t/copy"]);
    up.quiet(&["cp", "-r", "nasd:/t/copy", "back2"]);
    assert_eq!(local_tree(&cwd.join("back2")), original, "cp -r within nasd then out");
    up.quiet(&["cp", "-r", "tree", "nasd:/t/viacp"]);
    std::fs::create_dir(cwd.join("into-dir")).unwrap();
    up.quiet(&["get", "-r", "/t/viacp", "into-dir/"]);
    assert_eq!(local_tree(&cwd.join("into-dir/viacp")), original, "cp -r in, get -r into a directory");

    // On a terminal: one bar for the whole tree (every frame drawn counts toward the tree's
    // total), then one summary line naming what was copied and its bytes.
    let whole = format!("/{} ", indicatif::HumanBytes(tree_bytes));
    for (args, into) in
        [(&["put", "-r", "tree", "/t/term"][..], None), (&["get", "-r", "/t/term", "back3"], Some("back3"))]
    {
        let (status, shown) = on_terminal(cwd, args, &[]);
        assert!(status.success(), "{args:?}: {shown}");
        assert_eq!(shown.matches("copied ").count(), 1, "{args:?}: one summary: {shown:?}");
        let last = final_line(&shown);
        assert!(last.starts_with(&tree_summary(tree_bytes)) && last.ends_with("/s"), "{args:?}: {shown:?}");
        for frame in frames(&shown).filter(|f| f.contains(" ETA ")) {
            assert!(frame.contains(&whole), "{args:?}: a frame of another bar: {frame:?}");
        }
        if let Some(into) = into {
            assert_eq!(local_tree(&cwd.join(into)), original);
        }
    }
    // A small file gets no bar, and so no summary (as cp prints nothing); a large one both.
    let (status, shown) = on_terminal(cwd, &["put", "note.txt", "/t/"], &[]);
    assert!(status.success() && shown.is_empty(), "{shown:?}");
    std::fs::write(cwd.join("five.bin"), pattern(b"five", 5 << 20)).unwrap();
    up.quiet(&["put", "five.bin", "/t/"]);
    let (status, shown) = on_terminal(cwd, &["get", "/t/five.bin", "five-back.bin"], &[]);
    assert!(status.success(), "{shown}");
    let last = final_line(&shown);
    assert!(last.starts_with("copied 1 file (5.0 MiB) in ") && last.ends_with("/s"), "{shown:?}");
    assert!(std::fs::read(cwd.join("five-back.bin")).unwrap() == pattern(b"five", 5 << 20));
}

/// What a terminal shows in turn: the text between carriage returns and
/// newlines, less indicatif's erase-line code.
/// Issue 30 item 5: `nasd cat --reads` makes the listed reads, in order,
/// hinted to the drives first; a bad list or two files are refused.
fn cat_prints_the_reads_it_is_given(up: &Up) {
    let text: String = (0..20_000).map(|i| format!("line {i:05}\n")).collect();
    std::fs::write(up.cwd.join("lines.txt"), &text).unwrap();
    up.quiet(&["put", "lines.txt", "/docs/lines.txt"]);
    std::fs::write(up.cwd.join("reads"), "# offset length\n110KiB 11\n0 11\n\n55 22\n").unwrap();
    let want = [&text[110 * 1024..110 * 1024 + 11], &text[0..11], &text[55..77]].concat();
    assert_eq!(up.ok(&["cat", "--reads", "reads", "/docs/lines.txt"]), want);
    let e = up.fails(&["cat", "--reads", "reads", "/docs/lines.txt", "/docs/note.txt"]);
    assert!(e.contains("one file"), "{e}");
    std::fs::write(up.cwd.join("bad"), "12\n").unwrap();
    let e = up.fails(&["cat", "--reads", "bad", "/docs/lines.txt"]);
    assert!(e.contains("bad:1") && e.contains("OFFSET LENGTH"), "{e}");
}

fn frames(shown: &str) -> impl Iterator<Item = &str> {
    shown.split(['\r', '\n']).map(|f| f.trim_start_matches("\x1b[2K").trim_end()).filter(|f| !f.is_empty())
}

/// The last thing a terminal shows.
fn final_line(shown: &str) -> &str {
    frames(shown).last().unwrap_or_default()
}

/// Issue 15 item 1 for get: a get that fails (a block of a file without redundancy
/// rotted on disk) leaves no local file, not even a temporary one, and
/// leaves a file it was to replace as it was.
fn a_failed_get_leaves_no_local_file(up: &Up) {
    let cwd = &up.cwd;
    std::fs::create_dir(cwd.join("out")).unwrap();
    let e = up.fails(&["get", "/docs/missing.txt", "out/"]);
    assert!(e.contains("/docs/missing.txt"), "{e}");
    assert_eq!(local_tree(&cwd.join("out")), [], "a get of a missing file makes nothing");

    up.quiet(&["mkdir", "/plain"]);
    up.ok(&["layout", "set", "/plain", "stripe:1"]);
    let fragile = pattern(b"fragile", 300_000);
    std::fs::write(cwd.join("fragile.bin"), &fragile).unwrap();
    up.quiet(&["put", "fragile.bin", "/plain/"]);
    up.quiet(&["put", "note.txt", "/plain/"]);
    // Past the 64 KiB small-file threshold: the bytes below it live in the
    // manager's store, not in any drive's blocks.dat.
    let needle = &fragile[102_000..102_064];
    for d in drives_holding(&up.data(), DRIVES as usize, needle) {
        assert!(rot(&up.data(), d, needle));
    }
    let e = up.fails(&["get", "/plain/fragile.bin", "out/"]);
    assert!(e.contains("/plain/fragile.bin"), "the error names the file: {e}");
    assert_eq!(local_tree(&cwd.join("out")), [], "a failed get leaves nothing behind");
    let e = up.fails(&["get", "-r", "/plain", "out/"]);
    assert!(e.contains("fragile.bin"), "{e}");
    assert_eq!(local_tree(&cwd.join("out")), [], "a failed get -r leaves nothing behind, note.txt included");
    std::fs::write(cwd.join("out/fragile.bin"), b"older copy\n").unwrap();
    let e = up.fails(&["get", "/plain/fragile.bin", "out/"]);
    assert!(e.contains("fragile.bin"), "{e}");
    let left = local_tree(&cwd.join("out"));
    assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
    assert!(matches!(&left[0].1, Entry::File(_, b) if b.0 == b"older copy\n"), "the old file is whole: {left:?}");
}

/// Bytes of the file the interrupted copies move: enough that the copy is
/// still writing when the test sees its temporary file.
const LARGE: usize = 48 << 20;

/// `nasd ARGS` in the background in `cwd`, output piped.
fn spawn(cwd: &Path, args: &[&str]) -> Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_nasd"))
        .args(args)
        .current_dir(cwd)
        .env_remove("NASD_CONFIG")
        .env_remove("NASD_PASSWORD")
        .env_remove("NASD_USER")
        .env_remove("NASD_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nasd")
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0, "{}", std::io::Error::last_os_error());
}

/// Waits (bounded) until `written()` says the copy has its temporary file,
/// then stops the copy (SIGSTOP: it cannot finish meanwhile), sends it
/// Ctrl-C's SIGINT and lets it go on; its exit status and standard error.
fn interrupt_once_writing(mut copy: Child, written: impl Fn() -> bool) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + DAEMON_WAIT_MAX;
    while !written() {
        if let Some(status) = copy.try_wait().unwrap() {
            panic!("the copy ended ({status}) before it could be interrupted (make LARGE larger)");
        }
        assert!(Instant::now() < deadline, "the copy made no temporary file in time");
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(&copy, libc::SIGSTOP);
    signal(&copy, libc::SIGINT);
    signal(&copy, libc::SIGCONT);
    let out = copy.wait_with_output().unwrap();
    (out.status, text(&out.stderr))
}

/// Ctrl-C in the middle of a put -r (a large file being written, directories
/// made before it) or of a get: the copy says so and nothing of it stays,
/// neither in nasd nor here.
fn interrupted_copies_leave_nothing(up: &Up, rt: &tokio::runtime::Runtime, fs: &nasd_fs::FsClient) {
    let cwd = &up.cwd;
    let large = pattern(b"large", LARGE);
    std::fs::create_dir_all(cwd.join("bulk/sub")).unwrap();
    std::fs::write(cwd.join("bulk/a.txt"), b"first\n").unwrap();
    std::fs::write(cwd.join("bulk/sub/z.bin"), &large).unwrap();
    up.quiet(&["mkdir", "/int"]);
    let before = name_space(rt, fs);
    let tmp_in = |dir: &str| {
        rt.block_on(fs.readdir(dir)).map(|e| e.iter().any(|(n, _)| n.ends_with(".nasd-tmp"))).unwrap_or(false)
    };
    let (status, err) = interrupt_once_writing(spawn(cwd, &["put", "-r", "bulk", "/int/"]), || tmp_in("/int/bulk/sub"));
    assert!(!status.success(), "{err}");
    assert!(err.contains("interrupted: nothing of this copy is left behind"), "{err}");
    assert_eq!(name_space(rt, fs), before, "an interrupted put -r leaves the name space unchanged");

    up.quiet(&["put", "bulk/sub/z.bin", "/int/"]);
    std::fs::create_dir(cwd.join("got")).unwrap();
    let got = cwd.join("got");
    let tmp_here =
        || std::fs::read_dir(&got).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".nasd-tmp"));
    let (status, err) = interrupt_once_writing(spawn(cwd, &["get", "/int/z.bin", "got/"]), tmp_here);
    assert!(!status.success() && err.contains("interrupted"), "{err}");
    assert_eq!(local_tree(&got), [], "an interrupted get leaves no local file");
}

/// Issue 23 item 7: a local file that grows while `nasd put` copies it is
/// not stored as a silent prefix: the copy keeps what `stat` said at the
/// start (whole, as read, like `tar`), says the file grew, and exits with a
/// failure so a script notices.
fn a_file_growing_while_put_is_said(up: &Up, rt: &tokio::runtime::Runtime, fs: &nasd_fs::FsClient) {
    let path = up.cwd.join("growing.log");
    let start = pattern(b"growing", 8 << 20);
    std::fs::write(&path, &start).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let appender = std::thread::spawn({
        let (path, stop) = (path.clone(), stop.clone());
        move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
            // Until the copy has ended: the file grows during all of it.
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                f.write_all(&[b'+'; 4096]).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    let out = up.nasd(&["put", "growing.log", "/growing.log"]);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    appender.join().unwrap();
    let said = text(&out.stderr);
    assert!(!out.status.success(), "a file that grew is not a clean copy: {said}");
    assert!(said.contains("warning: ") && said.contains("grew") && said.contains("/growing.log holds its first"));
    assert!(said.contains("copy them again once they stop changing"), "{said}");
    // What it holds is a prefix of the file as it is now, at least what it had at the start.
    let stored = rt.block_on(fs.read_file("/growing.log")).unwrap();
    let now = std::fs::read(&path).unwrap();
    assert!(stored.len() >= start.len() && stored[..] == now[..stored.len()], "{} bytes stored", stored.len());
    assert!(now.len() > stored.len(), "the file grew past what was stored");
}

/// A tree of `files` small files (0 to 8 KiB, some empty) in nested
/// directories, their places and sizes drawn from `seed`.
fn make_wide_tree(root: &Path, files: usize, seed: u64) {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut dirs = vec![root.to_path_buf()];
    for i in 0..files {
        if next().is_multiple_of(16) {
            // A new directory under one already made (nested up to where chance takes it).
            let parent = dirs[(next() % dirs.len() as u64) as usize].clone();
            let dir = parent.join(format!("d{i}"));
            std::fs::create_dir_all(&dir).unwrap();
            dirs.push(dir);
        }
        let dir = &dirs[(next() % dirs.len() as u64) as usize];
        let len = if next().is_multiple_of(10) { 0 } else { (next() % 8192) as usize };
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(format!("f{i}.bin")), pattern(&i.to_le_bytes(), len)).unwrap();
    }
}

/// Issue 24: `put -r` copies several files at once. A tree of a few hundred
/// small files in nested directories goes in and comes back identical; over
/// a quota, files under way fail too, each failure after the first is named,
/// the first decides the error, and nothing of the copy stays.
fn a_wide_tree_goes_in_whole(up: &Up, rt: &tokio::runtime::Runtime, fs: &nasd_fs::FsClient) {
    let cwd = &up.cwd;
    let seed = std::env::var("NASD_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("NASD_TEST_SEED={seed}");
    make_wide_tree(&cwd.join("wide"), 300, seed);
    let original = masked(local_tree(&cwd.join("wide")), umask());
    assert!(original.len() > 300, "{} entries", original.len());

    up.quiet(&["mkdir", "/w"]);
    up.quiet(&["put", "-r", "wide", "/w/"]);
    up.quiet(&["get", "-r", "/w/wide", "wide-back"]);
    assert_eq!(local_tree(&cwd.join("wide-back")), original, "put -r then get -r gives the wide tree back");
    // Again over the copy: every file replaced, whole.
    up.quiet(&["put", "-r", "wide", "/w/"]);
    up.quiet(&["get", "-r", "/w/wide", "wide-back2"]);
    assert_eq!(local_tree(&cwd.join("wide-back2")), original, "put -r over an earlier copy");

    // Over a quota of files: the copy fails part way with the quota named, and rolls back.
    up.quiet(&["mkdir", "/wq"]);
    up.ok(&["quota", "--dir", "/wq", "--files", "40"]);
    let before = name_space(rt, fs);
    let e = up.fails(&["put", "-r", "wide", "/wq/"]);
    assert!(e.to_lowercase().contains("quota"), "the error names the cause: {e}");
    for line in e.lines().filter(|l| l.starts_with("error: ")) {
        assert!(line.contains("/wq/wide/"), "each failure names its file: {line}");
    }
    assert_eq!(name_space(rt, fs), before, "a failed put -r leaves nothing of itself");
    up.ok(&["quota", "--dir", "/wq", "--bytes", "none", "--files", "none"]);
}
