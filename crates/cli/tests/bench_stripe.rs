//! `nasd bench stripe` end to end on tiny sizes: it completes (every case,
//! drives stopped and rebuilt included) and prints its tables. No figure is
//! checked: on a shared machine timings are not test material.

use std::process::{Command, Stdio};

#[test]
fn a_tiny_stripe_bench_completes_and_prints_every_table() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let out = Command::new(env!("CARGO_BIN_EXE_nasd"))
        .args(["bench", "stripe", "--size", "4MiB", "--put-size", "4MiB", "--drive-mib-per-sec", "100", "--dir"])
        .arg(dir.path())
        .env_remove("NASD_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run nasd bench stripe");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "nasd bench stripe failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    for header in [
        "## Baselines",
        "| baseline | MiB/s | CPU |",
        "## Unthrottled",
        "| layout | direction | MiB/s | client cores | drive cores |",
        "## Unthrottled put and get",
        "## Throttled",
        "| layout | drives | direction | MiB/s | ideal MiB/s |",
        "## Degraded reads",
        "| 2 (data columns 0, 1) |",
        "## Rebuild",
        "| REPAIR sent → last component swapped in |",
        "read back after the rebuild",
    ] {
        assert!(stdout.contains(header), "no '{header}' in\n{stdout}\nstderr:\n{stderr}");
    }
    for layout in ["stripe:1@1M", "stripe:8@1M", "mirror:2x4@1M", "rs:4+2@1M"] {
        assert!(stdout.contains(&format!("| {layout} |")), "no row for {layout} in\n{stdout}");
    }
}
