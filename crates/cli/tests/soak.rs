//! `nasd bench soak` on a small scale (issue 11): real daemons as separate
//! processes, legitimate clients doing mixed operations beside idle and
//! slow-drip connections from other loopback addresses. The legitimate
//! clients must see no error and every answer must match what they did; the
//! daemons must stop cleanly. No timing is checked.

use std::process::{Command, Stdio};

/// The number in column `col` of the last table row starting with
/// `| {kind} |` (the soak round's, after the baseline's).
fn cell(report: &str, kind: &str, col: usize) -> u64 {
    let row = report
        .lines()
        .rev()
        .find(|l| l.starts_with(&format!("| {kind} |")))
        .unwrap_or_else(|| panic!("no row '{kind}' in\n{report}"));
    let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
    cells[col].parse().unwrap_or_else(|_| panic!("column {col} of '{row}' is not a number"))
}

#[test]
fn legitimate_clients_see_no_error_beside_idle_and_slow_connections() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let out = Command::new(env!("CARGO_BIN_EXE_nasd"))
        .args([
            "bench",
            "soak",
            "--seconds",
            "20",
            "--baseline-seconds",
            "5",
            "--clients",
            "8",
            "--idle",
            "50",
            "--slow",
            "50",
            "--file-size-max",
            "256KiB",
            "--cool-down-secs",
            "1",
            "--dir",
        ])
        .arg(dir.path())
        .env_remove("NASD_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run nasd bench soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the soak failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    // Both rounds: the baseline (clients only) and the soak beside the hostile connections.
    assert_eq!(stdout.matches("Legitimate clients: 0 errors").count(), 2, "{stdout}");
    assert_eq!(stdout.matches("Daemons stopped by SIGTERM: all exited cleanly.").count(), 2, "{stdout}");
    assert!(stdout.contains("## Memory with the hostile connections against the baseline"), "{stdout}");
    // The clients did work of every kind, and the hostile connections were there.
    for op in ["put (create, write, flush, close)", "get (open, read, compare)", "ls (names compared)", "rename", "rm"]
    {
        assert!(cell(&stdout, op, 1) > 0, "no '{op}' done:\n{stdout}");
    }
    assert!(cell(&stdout, "idle", 2) >= 50, "idle connections not opened:\n{stdout}");
    assert!(cell(&stdout, "slow drip", 2) >= 50, "slow-drip connections not opened:\n{stdout}");
}
