//! `nasd bench stripe` and `nasd bench cost` end to end on tiny sizes: they
//! complete (every case, drives stopped and rebuilt included) and print
//! their tables. No figure is checked: on a shared machine timings are not
//! test material.

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

#[test]
fn a_tiny_cost_bench_completes_and_prints_every_row() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let out = Command::new(env!("CARGO_BIN_EXE_nasd"))
        .args(["bench", "cost", "--size", "4MiB", "--dir"])
        .arg(dir.path())
        .env_remove("NASD_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run nasd bench cost");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "nasd bench cost failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    for line in [
        "## The necessary work's rates",
        "| BLAKE3 of 64 KiB blocks |",
        "| Reed-Solomon 2+1 parity, per GiB of data |",
        "| Reed-Solomon 4+2 parity, per GiB of data |",
        "## CPU-seconds per GiB of file data",
    ] {
        assert!(stdout.contains(line), "no '{line}' in\n{stdout}\nstderr:\n{stderr}");
    }
    for layout in ["stripe:4@1M", "mirror:2@1M", "rs:2+1@1M", "rs:4+2@1M"] {
        for protection in ["default (Hash-and-MAC)", "no data protection"] {
            for dir in ["write", "read"] {
                let row = format!("| {layout} | {protection} | {dir} |");
                assert!(stdout.contains(&row), "no row '{row}' in\n{stdout}");
            }
        }
    }
}
