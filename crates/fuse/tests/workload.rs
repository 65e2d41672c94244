//! A real workload: a source tree of at least 5 000 files (crates from
//! cargo's registry on this machine) copied into the mount with `cp -a` and
//! with `tar`, each copy compared with `diff -r`, then listed with `find`
//! and `ls -lR`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Files the tree holds at least.
const FILES_MIN: usize = 5_000;
/// The test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(1800);

/// Regular files, directories and links under `dir`.
fn count(dir: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let e = e.unwrap();
            n += 1;
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    n
}

/// Crate directories of cargo's registry, in name order, enough for
/// [`FILES_MIN`] entries; `None` if the registry holds fewer.
fn source_crates() -> Option<(PathBuf, Vec<String>)> {
    let home = PathBuf::from(
        std::env::var_os("CARGO_HOME")
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo").into_os_string()))?,
    );
    let src = home.join("registry/src");
    let mut indexes: Vec<PathBuf> = std::fs::read_dir(&src).ok()?.map(|e| e.unwrap().path()).collect();
    indexes.sort();
    let index = indexes.into_iter().next()?;
    let mut crates: Vec<String> =
        std::fs::read_dir(&index).ok()?.map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    crates.sort();
    let (mut picked, mut files) = (Vec::new(), 0);
    for c in crates {
        files += count(&index.join(&c)) + 1;
        picked.push(c);
        if files >= FILES_MIN {
            return Some((index, picked));
        }
    }
    None
}

#[test]
fn a_source_tree_copies_compares_and_lists() {
    require_fuse!();
    let Some((index, crates)) = source_crates() else {
        panic!(
            "cargo's registry holds fewer than {FILES_MIN} files: nothing to copy (building the workspace fills it)"
        );
    };
    let mut env = common::Env::start("workload", LIMIT, common::ClusterOptions::default());
    let m = env.mount();
    // The source as one directory (hard links would cross file systems: copy).
    let tree = env.scratch().join("src");
    std::fs::create_dir(&tree).unwrap();
    common::sh(Command::new("cp").arg("-a").args(crates.iter().map(|c| index.join(c))).arg(&tree));
    let entries = count(&tree);
    assert!(entries >= FILES_MIN, "{entries} entries");

    // cp -a, then diff -r.
    let started = Instant::now();
    common::sh(Command::new("cp").arg("-a").arg(&tree).arg(m.join("cp")));
    let cp_secs = started.elapsed().as_secs_f64();
    common::sh(Command::new("diff").arg("-r").arg(&tree).arg(m.join("cp")));

    // tar c | tar x, then diff -r.
    std::fs::create_dir(m.join("tar")).unwrap();
    let started = Instant::now();
    common::sh(Command::new("sh").arg("-c").arg(format!(
        "tar -C '{}' -cf - . | tar -C '{}' -xf -",
        tree.display(),
        m.join("tar").display()
    )));
    let tar_secs = started.elapsed().as_secs_f64();
    common::sh(Command::new("diff").arg("-r").arg(&tree).arg(m.join("tar")));

    // Listing: find counts what the source holds; ls -laR stats every entry
    // (-a: the crates' dot files, such as .cargo_vcs_info.json, too).
    let found = common::sh(Command::new("find").arg(m.join("cp")));
    assert_eq!(found.lines().count(), entries + 1, "find lists every entry and the top");
    let listed = common::sh(Command::new("ls").arg("-laR").arg(m.join("tar")));
    let files = listed.lines().filter(|l| l.starts_with('-')).count();
    let expect_files = common::sh(Command::new("find").arg(&tree).args(["-type", "f"])).lines().count();
    assert_eq!(files, expect_files, "ls -laR shows every regular file");
    eprintln!(
        "workload: {entries} entries ({expect_files} files) of {} crates: cp -a {cp_secs:.1} s, tar {tar_secs:.1} s",
        crates.len()
    );
    env.stop();
}
