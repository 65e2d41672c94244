//! fsx (the Rust port of the File System eXerciser) against the mount:
//! random reads, writes, mmap reads and writes, truncations, fsyncs and
//! close/reopens of one file, each read checked against fsx's own copy.
//! The test command runs 20 000 operations; the ignored 100 000-operation
//! test is run by hand (about 12 minutes on a loaded two-core machine with a
//! debug build, too long for CI; figures in docs/BENCHMARKS.md).

mod common;

use std::process::Command;
use std::time::Duration;

/// Operations the test command's run makes.
const FSX_OPS: u64 = 20_000;
/// Operations of the long run (`cargo test -p nasd-fuse --test fsx -- --ignored`).
const FSX_OPS_LONG: u64 = 100_000;
/// The test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(2400);

const FSX_CONFIG: &str = r#"
flen = 262144
[opsize]
max = 65536
min = 0
align = 1
[weights]
close_open = 1
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 2
fsync = 1
fdatasync = 1
"#;

#[test]
fn fsx_runs_its_operations_without_error() {
    fsx(FSX_OPS);
}

#[test]
#[ignore = "11 minutes: run by hand (cargo test -p nasd-fuse --test fsx -- --ignored), figures in docs/BENCHMARKS.md"]
fn fsx_runs_100_000_operations_without_error() {
    fsx(FSX_OPS_LONG);
}

fn fsx(ops: u64) {
    require_fuse!();
    let Some(fsx) = common::tool("fsx") else { return };
    let mut env = common::Env::start("fsx", LIMIT, common::ClusterOptions::default());
    let m = env.mount();
    let config = env.scratch().join("fsx.toml");
    std::fs::write(&config, FSX_CONFIG).unwrap();
    let started = std::time::Instant::now();
    let out = Command::new(fsx)
        .arg("-N")
        .arg(ops.to_string())
        .args(["-S", "20240601", "-q", "-f"])
        .arg(&config)
        .arg("-P")
        .arg(env.scratch())
        .arg(m.join("fsx.data"))
        .output()
        .expect("run fsx");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("All operations completed A-OK!"),
        "fsx failed ({}):\n{stdout}\n{}",
        out.status,
        stderr.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    eprintln!("fsx: {ops} operations in {:.1} s", started.elapsed().as_secs_f64());
    env.stop();
}
