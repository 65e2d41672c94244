//! `nasd bench untar` end to end on tiny sizes, on the real binary: it
//! starts its own PostgreSQL server (like the other PostgreSQL tests, this
//! fails if the server binaries are missing; `.ci/run` installs them),
//! unpacks the tree on every configuration, checks every tree, and prints
//! one row per configuration. No figure is checked beyond the baseline's own
//! ratio: on a shared machine timings are not test material.

use std::process::{Command, Output, Stdio};

fn bench_untar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nasd"))
        .args(["bench", "untar"])
        .args(args)
        .env_remove("NASD_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run nasd bench untar")
}

/// The rows `nasd bench untar` printed: metadata, managers, the seven
/// numbers (seconds, requests/s, files/s, ratio, busy retries, stale
/// refusals, the busiest manager's share of requests in %) and conflicts
/// ("-" on SQLite); each checked for what it must be whatever the timing.
fn rows(stdout: &str) -> Vec<(String, u32, Vec<f64>, String)> {
    let rows: Vec<(String, u32, Vec<f64>, String)> = stdout
        .lines()
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            match cols.as_slice() {
                [what @ ("SQLite" | "PostgreSQL"), managers, rest @ .., conflicts] if rest.len() == 7 => Some((
                    what.to_string(),
                    managers.parse().ok()?,
                    rest.iter().map(|v| v.trim_end_matches('%').parse().expect("a number")).collect(),
                    conflicts.to_string(),
                )),
                _ => None,
            }
        })
        .collect();
    for (what, managers, values, conflicts) in &rows {
        assert!(values[..4].iter().all(|v| v.is_finite() && *v > 0.0), "{what} ×{managers}: {values:?}\n{stdout}");
        assert!(values[5] >= 0.0 && values[5].fract() == 0.0, "stale refusals are a count: {values:?}\n{stdout}");
        // No conflict reaches a client: the managers retry conflicting transactions themselves
        // (on PostgreSQL, an attempt after three conflicts in a row runs alone among the writers).
        assert_eq!(values[4], 0.0, "{what} ×{managers}: requests refused as BUSY\n{stdout}");
        if what == "SQLite" {
            assert_eq!(conflicts, "-", "{stdout}");
        } else {
            assert!(conflicts.parse::<u64>().is_ok(), "{what} ×{managers}: conflicts are a count\n{stdout}");
        }
        if *managers == 1 {
            assert_eq!(values[6], 100.0, "one manager takes every request: {values:?}\n{stdout}");
        } else {
            // Every manager learned the routing table before the clients logged in.
            assert_eq!(values[5], 0.0, "{what} ×{managers}: no STALE_ROUTING: {values:?}\n{stdout}");
            assert!(values[6] > 0.0 && values[6] <= 100.0, "{what} ×{managers}: a share: {values:?}\n{stdout}");
        }
    }
    rows
}

#[test]
fn a_tiny_untar_bench_measures_sqlite_and_one_two_four_managers_on_postgres() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let out = bench_untar(&["--dirs", "6", "--files", "40", "--clients", "4", "--dir", dir.path().to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "nasd bench untar failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("4 clients, each unpacking 6 directories and 40 empty files"), "{stdout}");
    assert!(stdout.contains("every client's tree checked afterwards"), "{stdout}");
    assert!(stdout.contains("managers reach PostgreSQL directly"), "{stdout}");
    let rows = rows(&stdout);
    let configs: Vec<(&str, u32)> = rows.iter().map(|(w, m, _, _)| (w.as_str(), *m)).collect();
    assert_eq!(
        configs,
        [("SQLite", 1), ("PostgreSQL", 1), ("PostgreSQL", 2), ("PostgreSQL", 4)],
        "one row per configuration, in order:\n{stdout}"
    );
    assert_eq!(rows[0].2[3], 1.0, "the baseline's ratio to itself:\n{stdout}");
    // No cluster directory is left behind in --dir.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "files left in --dir");
}

/// The same through the benchmark's own delaying proxy (a link to the
/// database with a round trip of about 1 ms), without the SQLite row, one
/// writer per manager, routing by name hashing: every tree unpacked and
/// checked, no request refused.
#[test]
fn a_tiny_untar_bench_reaches_postgresql_through_a_delaying_proxy() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let out = bench_untar(&[
        "--dirs",
        "4",
        "--files",
        "24",
        "--clients",
        "4",
        "--one-way-delay-us",
        "500",
        "--pg-writers",
        "1",
        "--no-sqlite",
        "--routing",
        "name-hashing",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "nasd bench untar failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("through a proxy adding 500µs each way"), "{stdout}");
    assert!(stdout.contains("routing: name-hashing"), "{stdout}");
    let rows = rows(&stdout);
    let configs: Vec<(&str, u32)> = rows.iter().map(|(w, m, _, _)| (w.as_str(), *m)).collect();
    assert_eq!(configs, [("PostgreSQL", 1), ("PostgreSQL", 2), ("PostgreSQL", 4)], "{stdout}");
    assert_eq!(rows[0].2[3], 1.0, "the first PostgreSQL row is the baseline:\n{stdout}");
}

#[test]
fn bad_sizes_are_refused_with_the_limit() {
    for (args, says) in [
        (["--clients", "0"], "--clients must be between 1 and 64"),
        (["--clients", "65"], "--clients must be between 1 and 64"),
        (["--files", "0"], "--files must be between 1 and 1000000"),
        (["--dirs", "100001"], "--dirs 100001 is more than the 100000"),
        (["--redirect-probability", "1.5"], "--redirect-probability must be between 0 and 1"),
    ] {
        let out = bench_untar(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
