//! fsx (the Rust port of the File System eXerciser) against the mount:
//! 100 000 random reads, writes, mmap reads and writes, truncations, fsyncs
//! and close/reopens of one file, each read checked against fsx's own copy.

mod common;

use std::process::Command;
use std::time::Duration;

/// Operations fsx runs.
const FSX_OPS: u64 = 100_000;
/// The test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(1200);

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
    require_fuse!();
    let Some(fsx) = common::tool("fsx") else { return };
    let mut env = common::Env::start("fsx", LIMIT, common::ClusterOptions::default());
    let m = env.mount();
    let config = env.scratch().join("fsx.toml");
    std::fs::write(&config, FSX_CONFIG).unwrap();
    let started = std::time::Instant::now();
    let out = Command::new(fsx)
        .arg("-N")
        .arg(FSX_OPS.to_string())
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
    eprintln!("fsx: {FSX_OPS} operations in {:.1} s", started.elapsed().as_secs_f64());
    env.stop();
}
