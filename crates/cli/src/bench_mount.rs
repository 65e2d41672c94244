//! `nasd bench mount`: the POSIX mount measured with fio beside a local
//! directory in the same run — 1 MiB sequential writes and reads, 4 KiB
//! random reads — and the rate of create, stat and unlink of empty files.
//! The cluster runs in this process (a TLS manager and four drives on
//! loopback, files laid out `rs:2+1` as `nasd up` does), mounted with FUSE
//! (root, or a user allowed to mount).

use crate::daemons::LocalCluster;
use crate::fs_cmd;
use crate::size::human;
use anyhow::Context;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// One measured line.
struct Row {
    what: String,
    mount: f64,
    local: f64,
    unit: &'static str,
}

/// Runs the benchmark: fio jobs of `size` bytes (random reads for at most
/// `runtime_secs`) and `files` empty files.
pub async fn mount_bench(size: u64, files: u32, runtime_secs: u64, dir: Option<&Path>) -> anyhow::Result<()> {
    which("fio").context("fio is needed (apt-get install fio)")?;
    let tmp = tempfile::tempdir_in(dir.unwrap_or(&std::env::temp_dir()))?;
    let cluster = LocalCluster::start(tmp.path(), 4, (size * 4).max(4 << 30)).await?;
    let fs = fs_cmd::login(&cluster.client, None).await?;
    fs.set_layout("/", Some(nasd_fs::Layout::parse("rs:2+1").map_err(|e| anyhow::anyhow!("{e}"))?)).await?;
    let mountpoint = tmp.path().join("mnt");
    let local = tmp.path().join("local");
    std::fs::create_dir_all(&mountpoint)?;
    std::fs::create_dir_all(&local)?;
    let mut mount = nasd_fuse::Mount::start(fs, nasd_fuse::MountConfig::new(&mountpoint)).await?;
    let (m, l) = (mountpoint.clone(), local.clone());
    let rows = tokio::task::spawn_blocking(move || measure(&m, &l, size, files, runtime_secs)).await?;
    mount.unmount()?;
    mount.ended().await?;
    cluster.stop().await?;
    let rows = rows?;
    println!(
        "nasd mount (FUSE, 4 drives on loopback, rs:2+1, TLS manager, INTEGRITY_ARGS|INTEGRITY_DATA|HASH_AND_MAC) \
         beside a local directory ({}), fio {} file:",
        local_fs(&local),
        human(size)
    );
    println!("| measurement | nasd mount | local directory | unit |");
    println!("|---|---:|---:|---|");
    for r in rows {
        println!("| {} | {:.1} | {:.1} | {} |", r.what, r.mount, r.local, r.unit);
    }
    Ok(())
}

fn which(tool: &str) -> anyhow::Result<()> {
    let ok = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    anyhow::ensure!(ok, "`{tool}` not found");
    Ok(())
}

fn local_fs(dir: &Path) -> String {
    Command::new("df")
        .args(["--output=fstype"])
        .arg(dir)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().nth(1).map(str::trim).map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn measure(mount: &Path, local: &Path, size: u64, files: u32, runtime: u64) -> anyhow::Result<Vec<Row>> {
    let jobs: [(&str, &str, &str, &str); 3] = [
        ("sequential write, 1 MiB requests (end fsync)", "write", "1M", "MiB/s"),
        ("sequential read, 1 MiB requests (cold cache)", "read", "1M", "MiB/s"),
        ("random read, 4 KiB requests (cold cache)", "randread", "4k", "IOPS"),
    ];
    let mut rows = Vec::new();
    for (what, rw, bs, unit) in jobs {
        let on = |dir: &Path| fio(dir, rw, bs, size, runtime);
        let (mount_v, local_v) = (on(mount)?, on(local)?);
        let pick = |(bw_kib, iops): (f64, f64)| if unit == "IOPS" { iops } else { bw_kib / 1024.0 };
        rows.push(Row { what: what.into(), mount: pick(mount_v), local: pick(local_v), unit });
    }
    for (what, mount_v, local_v) in name_rates(mount, local, files)? {
        rows.push(Row { what, mount: mount_v, local: local_v, unit: "per second" });
    }
    Ok(rows)
}

/// One fio job in `dir`: (bandwidth KiB/s, IOPS) of its direction.
fn fio(dir: &Path, rw: &str, bs: &str, size: u64, runtime: u64) -> anyhow::Result<(f64, f64)> {
    let mut cmd = Command::new("fio");
    cmd.arg("--name=nasd")
        .arg(format!("--directory={}", dir.display()))
        .arg("--filename=fio.dat")
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .arg(format!("--size={size}"))
        .args(["--ioengine=psync", "--direct=0", "--invalidate=1", "--output-format=terse", "--terse-version=3"]);
    if rw == "write" {
        cmd.arg("--end_fsync=1");
    } else {
        cmd.arg(format!("--runtime={runtime}")).arg("--time_based=0");
    }
    let out = cmd.output().context("run fio")?;
    anyhow::ensure!(
        out.status.success(),
        "fio {rw} in {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("3;")).context("no terse line in fio's output")?;
    let fields: Vec<&str> = line.split(';').collect();
    // Terse v3: read bandwidth (KiB/s) and IOPS are fields 7 and 8, write's 48 and 49.
    let (bw, iops) = if rw == "write" { (47, 48) } else { (6, 7) };
    let num = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).context("a malformed fio terse line");
    Ok((num(bw)?, num(iops)?))
}

/// Create, stat and unlink of `files` empty files: (what, mount, local) per second.
fn name_rates(mount: &Path, local: &Path, files: u32) -> anyhow::Result<Vec<(String, f64, f64)>> {
    let run = |dir: &Path| -> anyhow::Result<[Duration; 3]> {
        let d = dir.join("names");
        std::fs::create_dir(&d)?;
        let t = Instant::now();
        for i in 0..files {
            std::fs::File::create(d.join(format!("f{i}")))?;
        }
        let create = t.elapsed();
        let t = Instant::now();
        for i in 0..files {
            std::fs::metadata(d.join(format!("f{i}")))?;
        }
        let stat = t.elapsed();
        let t = Instant::now();
        for i in 0..files {
            std::fs::remove_file(d.join(format!("f{i}")))?;
        }
        Ok([create, stat, t.elapsed()])
    };
    let (m, l) = (run(mount)?, run(local)?);
    let rate = |d: Duration| f64::from(files) / d.as_secs_f64();
    Ok(["create (open O_CREAT + close)", "stat (just created: cached)", "unlink"]
        .iter()
        .enumerate()
        .map(|(i, what)| (format!("{what}, {files} empty files"), rate(m[i]), rate(l[i])))
        .collect())
}
