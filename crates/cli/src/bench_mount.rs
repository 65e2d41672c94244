//! `nasd bench mount`: the POSIX mount measured with fio beside a local
//! directory in the same run — 1 MiB sequential writes and reads, 4 KiB
//! random reads — the rate of create, stat and unlink of empty files (one
//! writer, and four in four directories), `ls -l` of a large directory with
//! the manager requests it cost, a real tree extracted with `tar x`, read
//! back and compared, and the CLI's small-file path (`nasd put -r`). Disk
//! flushes (`fsync`, `fdatasync`, `syncfs`, `sync` system calls of this
//! process: the cluster and the mount, counted by `perf stat`) and bytes
//! written to storage (`/proc/self/io`) are counted per phase. The cluster
//! runs in this process (a TLS manager and four drives on loopback, files
//! laid out `rs:2+1` as `nasd up` does), mounted with FUSE (root, or a user
//! allowed to mount).

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
pub async fn mount_bench(
    size: u64,
    files: u32,
    runtime_secs: u64,
    dir: Option<&Path>,
    extra: Extra,
) -> anyhow::Result<()> {
    which("fio").context("fio is needed (apt-get install fio)")?;
    let tmp = tempfile::tempdir_in(dir.unwrap_or(&std::env::temp_dir()))?;
    let cluster = LocalCluster::start(tmp.path(), 4, (size * 4).max(4 << 30)).await?;
    let fs = fs_cmd::login(&cluster.client, None).await?;
    fs.set_layout("/", Some(nasd_fs::Layout::parse("rs:2+1").map_err(|e| anyhow::anyhow!("{e}"))?)).await?;
    let mountpoint = tmp.path().join("mnt");
    let local = tmp.path().join("local");
    std::fs::create_dir_all(&mountpoint)?;
    std::fs::create_dir_all(&local)?;
    let mount_config = nasd_fuse::MountConfig::new(&mountpoint);
    let mut mount = nasd_fuse::Mount::start(fs.clone(), mount_config.clone()).await?;
    let (m, l) = (mountpoint.clone(), local.clone());
    let manager = cluster.manager().clone();
    let served = move || manager.requests_served();
    let drive_read = cluster.drive_bytes_read();
    let drive_read = move || drive_read().iter().sum::<u64>();
    let probe = {
        let (manager, metrics, drives) =
            (cluster.manager().clone(), mount_config.metrics.clone(), cluster.drive_requests());
        std::sync::Arc::new(move || Counts {
            fuse: metrics.requests_by_op(),
            manager: manager.requests_served(),
            drive: drives(),
            metadata_flushes: manager.metadata_durability().syncs,
            cpu_ns: cpu_ns(),
        }) as std::sync::Arc<Probe>
    };
    let probe_put = probe.clone();
    let extra_rows = extra.clone();
    let rows = tokio::task::spawn_blocking(move || -> anyhow::Result<(Vec<Row>, Vec<String>)> {
        let mut rows =
            if extra_rows.fio { measure(&m, &l, size, files, runtime_secs, &drive_read)? } else { Vec::new() };
        let mut costs = Vec::new();
        if !extra_rows.fio {
            let (rates, c) = name_rates(&m, &l, files, &*probe)?;
            for (what, mount_v, local_v) in rates {
                rows.push(Row { what, mount: mount_v, local: local_v, unit: "per second" });
            }
            costs = c;
        }
        rows.extend(parallel_creates(&m, &l, files)?);
        rows.extend(listing(&m, &l, extra_rows.listing, &served)?);
        if let Some(tree) = &extra_rows.tree {
            rows.extend(untar(&m, &l, tree)?);
        }
        Ok((rows, costs))
    })
    .await?;
    let put_rows = match &rows {
        Ok(_) if extra.put_files > 0 => put_small_files(&fs, tmp.path(), extra.put_files, &*probe_put).await?,
        _ => (Vec::new(), None),
    };
    let mut rows = rows;
    if let Ok((r, costs)) = &mut rows {
        r.extend(put_rows.0);
        costs.extend(put_rows.1);
    }
    mount.unmount()?;
    mount.ended().await?;
    cluster.stop().await?;
    let (rows, costs) = rows?;
    println!(
        "nasd mount (FUSE, 4 drives on loopback, rs:2+1, TLS manager, INTEGRITY_ARGS|INTEGRITY_DATA|HASH_AND_MAC) \
         beside a local directory ({}), fio {} file:",
        local_fs(&local),
        human(size)
    );
    println!("| measurement | nasd mount | local directory | unit |");
    println!("|---|---:|---:|---|");
    for r in rows {
        let local = if r.local.is_nan() { "-".to_string() } else { format!("{:.1}", r.local) };
        let digits = if r.unit == "ratio" { 3 } else { 1 };
        println!("| {} | {:.*} | {} | {} |", r.what, digits, r.mount, local, r.unit);
    }
    println!();
    for c in costs {
        println!("- {c}");
    }
    Ok(())
}

/// What `nasd bench mount` measures beyond fio and the name rates.
#[derive(Debug, Clone)]
pub struct Extra {
    /// Run the fio jobs (the name-space rows run either way).
    pub fio: bool,
    /// Entries of the directory `ls -l` lists.
    pub listing: u32,
    /// A tree to extract with `tar x` (a copy made with `tar c`).
    pub tree: Option<std::path::PathBuf>,
    /// 4 KiB files `nasd put -r` copies (0: none).
    pub put_files: u32,
}

/// Disk flushes (`fsync`, `fdatasync`, `syncfs`, `sync`) this process makes
/// while one runs, counted by `perf stat` attached to it (threads made later
/// inherit the counters), and the bytes it writes to storage
/// (`/proc/self/io`, `write_bytes`).
struct Flushes {
    perf: Option<std::process::Child>,
    written: u64,
}

/// The system calls [`Flushes`] counts.
const FLUSH_EVENTS: &str =
    "syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync,syscalls:sys_enter_syncfs,syscalls:sys_enter_sync";

impl Flushes {
    fn start() -> Flushes {
        let perf = Command::new("perf")
            .args(["stat", "-x", ",", "-e", FLUSH_EVENTS, "-p", &std::process::id().to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .ok();
        // perf attaches within a moment; what it misses before is not counted.
        std::thread::sleep(Duration::from_millis(300));
        Flushes { perf, written: written_bytes() }
    }

    /// (flushes, bytes written) since `start`; flushes `NaN` without perf.
    fn stop(self) -> (f64, f64) {
        let written = written_bytes().saturating_sub(self.written) as f64;
        let Some(perf) = self.perf else { return (f64::NAN, written) };
        // SAFETY: kill(2) of the child we started; SIGINT makes perf print its counts.
        unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
        let out = perf.wait_with_output().map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_default();
        let count: f64 = out
            .lines()
            .filter(|l| l.contains("syscalls:sys_enter_"))
            .filter_map(|l| l.split(',').next()?.trim().parse::<f64>().ok())
            .sum();
        (count, written)
    }
}

fn written_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("write_bytes:").map(|v| v.trim().parse().ok()))?)
        .unwrap_or(0)
}

/// Creates `files` empty files in each of `dirs` directories under `root`,
/// one thread per directory; the aggregate rate.
fn creates_in(root: &Path, dirs: u32, files: u32, tag: &str) -> anyhow::Result<f64> {
    let t = Instant::now();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..dirs)
            .map(|d| {
                let dir = root.join(format!("{tag}-{d}"));
                scope.spawn(move || -> anyhow::Result<()> {
                    std::fs::create_dir(&dir)?;
                    for i in 0..files {
                        std::fs::File::create(dir.join(format!("f{i}")))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| anyhow::anyhow!("a writer panicked"))??;
        }
        Ok(())
    })?;
    Ok(f64::from(dirs * files) / t.elapsed().as_secs_f64())
}

/// One writer creating `files` files, then four in four directories each
/// creating `files`, on the mount and locally; with the mount's flushes
/// per create.
fn parallel_creates(mount: &Path, local: &Path, files: u32) -> anyhow::Result<Vec<Row>> {
    let flushes = Flushes::start();
    let one = creates_in(mount, 1, files, "one")?;
    let (flushed, written) = flushes.stop();
    let four = creates_in(mount, 4, files, "four")?;
    let (one_l, four_l) = (creates_in(local, 1, files, "one")?, creates_in(local, 4, files, "four")?);
    Ok(vec![
        Row { what: format!("create, 1 writer, {files} files"), mount: one, local: one_l, unit: "per second" },
        Row {
            what: format!("create, 4 writers in 4 directories, {files} files each"),
            mount: four,
            local: four_l,
            unit: "per second",
        },
        Row {
            what: "create, 1 writer: disk flushes per create (nasd processes)".into(),
            mount: flushed / f64::from(files),
            local: f64::NAN,
            unit: "flushes",
        },
        Row {
            what: "create, 1 writer: bytes written to storage per create".into(),
            mount: written / f64::from(files),
            local: f64::NAN,
            unit: "bytes",
        },
    ])
}

/// `ls -l` of a directory of `entries` files made beforehand, its names and
/// inodes dropped from the kernel's caches first: its time, and the manager
/// requests it cost per 100 entries.
fn listing(mount: &Path, local: &Path, entries: u32, served: &dyn Fn() -> u64) -> anyhow::Result<Vec<Row>> {
    if entries == 0 {
        return Ok(Vec::new());
    }
    let mut rows = Vec::new();
    let mut times = Vec::new();
    let mut per_100 = 0.0;
    for dir in [mount, local] {
        let d = dir.join("listing");
        std::fs::create_dir(&d)?;
        for i in 0..entries {
            std::fs::File::create(d.join(format!("entry-{i:06}")))?;
        }
        // Dentries and inodes out of the kernel's caches: the listing asks the file system.
        std::fs::write("/proc/sys/vm/drop_caches", b"2").context("drop the kernel's dentry and inode caches")?;
        let before = served();
        let t = Instant::now();
        let out = Command::new("ls").arg("-l").arg(&d).output().context("run ls -l")?;
        anyhow::ensure!(out.status.success(), "ls -l {} failed", d.display());
        times.push(t.elapsed());
        let lines = String::from_utf8_lossy(&out.stdout).lines().count();
        anyhow::ensure!(lines == entries as usize + 1, "ls -l listed {lines} lines for {entries} entries");
        if dir == mount {
            per_100 = (served() - before) as f64 * 100.0 / f64::from(entries);
        }
    }
    rows.push(Row {
        what: format!("ls -l of a {entries}-entry directory (cold kernel caches)"),
        mount: times[0].as_secs_f64(),
        local: times[1].as_secs_f64(),
        unit: "seconds",
    });
    rows.push(Row {
        what: "ls -l: manager requests per 100 entries".into(),
        mount: per_100,
        local: f64::NAN,
        unit: "requests",
    });
    Ok(rows)
}

/// `tar c TREE | tar x` into the mount and into the local directory, each
/// copy compared with the source (`diff -r`, after the kernel's caches were
/// dropped, so the mount's copy is read back from the drives): the time of
/// each extraction, and the mount's flushes per entry.
fn untar(mount: &Path, local: &Path, tree: &Path) -> anyhow::Result<Vec<Row>> {
    let entries =
        Command::new("find").arg(tree).output().context("run find")?.stdout.iter().filter(|&&b| b == b'\n').count();
    let mut times = Vec::new();
    let mut per_entry = (0.0, 0.0);
    for dir in [mount, local] {
        let d = dir.join("tree");
        std::fs::create_dir(&d)?;
        let flushes = (dir == mount).then(Flushes::start);
        let t = Instant::now();
        let script = format!("tar -C '{}' -cf - . | tar -C '{}' -xf -", tree.display(), d.display());
        let status = Command::new("sh").arg("-c").arg(&script).status().context("run tar")?;
        anyhow::ensure!(status.success(), "tar into {} failed", d.display());
        times.push(t.elapsed());
        if let Some(f) = flushes {
            let (flushed, written) = f.stop();
            per_entry = (flushed / entries as f64, written / entries as f64);
        }
        std::fs::write("/proc/sys/vm/drop_caches", b"3").context("drop the page cache")?;
        let diff = Command::new("diff").arg("-r").arg(tree).arg(&d).output().context("run diff")?;
        anyhow::ensure!(
            diff.status.success(),
            "the copy in {} differs: {}{}",
            d.display(),
            String::from_utf8_lossy(&diff.stdout),
            String::from_utf8_lossy(&diff.stderr)
        );
    }
    Ok(vec![
        Row {
            what: format!("tar x of {} ({entries} entries), compared equal", tree.display()),
            mount: times[0].as_secs_f64(),
            local: times[1].as_secs_f64(),
            unit: "seconds",
        },
        Row {
            what: "tar x: disk flushes per entry (nasd processes)".into(),
            mount: per_entry.0,
            local: f64::NAN,
            unit: "flushes",
        },
        Row {
            what: "tar x: bytes written to storage per entry".into(),
            mount: per_entry.1,
            local: f64::NAN,
            unit: "bytes",
        },
    ])
}

/// `nasd put -r` (the CLI's copy, in this process) of `files` files of 4 KiB:
/// files per second, with flushes and bytes written per file, and what
/// each file cost ([`Counts::per_op`]).
async fn put_small_files(
    fs: &nasd_fs::FsClient,
    scratch: &Path,
    files: u32,
    probe: &Probe,
) -> anyhow::Result<(Vec<Row>, Option<String>)> {
    let src = scratch.join("put-src");
    std::fs::create_dir_all(&src)?;
    for i in 0..files {
        std::fs::write(src.join(format!("f{i:05}")), vec![(i % 251) as u8; 4096])?;
    }
    let flushes = tokio::task::spawn_blocking(Flushes::start).await?;
    let before = probe();
    let t = Instant::now();
    let opts = crate::transfer::CopyOptions { recursive: true, no_clobber: false };
    let to = crate::transfer::Loc::Remote("/put".into());
    crate::transfer::copy(fs, crate::transfer::Loc::Local(src.clone()), to, opts).await?;
    let took = t.elapsed();
    let after = probe();
    let (flushed, written) = tokio::task::spawn_blocking(move || flushes.stop()).await?;
    let cost = format!("nasd put -r, per file: {}", before.per_op(&after, files, flushed));
    let n = f64::from(files);
    let rows = vec![
        Row {
            what: format!("nasd put -r of {files} files of 4 KiB"),
            mount: n / took.as_secs_f64(),
            local: f64::NAN,
            unit: "files per second",
        },
        Row {
            what: "nasd put -r: disk flushes per file (nasd processes)".into(),
            mount: flushed / n,
            local: f64::NAN,
            unit: "flushes",
        },
        Row {
            what: "nasd put -r: bytes written to storage per file".into(),
            mount: written / n,
            local: f64::NAN,
            unit: "bytes",
        },
    ];
    Ok((rows, Some(cost)))
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

/// The fio jobs and the name rates; beside the sequential read, the bytes
/// the drives sent (`drive_read`) per byte fio read.
fn measure(
    mount: &Path,
    local: &Path,
    size: u64,
    files: u32,
    runtime: u64,
    drive_read: &dyn Fn() -> u64,
) -> anyhow::Result<Vec<Row>> {
    let jobs: [(&str, &str, &str, &str); 3] = [
        ("sequential write, 1 MiB requests (end fsync)", "write", "1M", "MiB/s"),
        ("sequential read, 1 MiB requests (cold cache)", "read", "1M", "MiB/s"),
        ("random read, 4 KiB requests (cold cache)", "randread", "4k", "IOPS"),
    ];
    let mut rows = Vec::new();
    for (what, rw, bs, unit) in jobs {
        let on = |dir: &Path| fio(dir, rw, bs, size, runtime);
        let before = drive_read();
        let mount_v = on(mount)?;
        let sent = drive_read() - before;
        let local_v = on(local)?;
        let pick = |(bw_kib, iops, _): (f64, f64, f64)| if unit == "IOPS" { iops } else { bw_kib / 1024.0 };
        rows.push(Row { what: what.into(), mount: pick(mount_v), local: pick(local_v), unit });
        if rw == "read" {
            rows.push(Row {
                what: "drive bytes read per byte of the sequential read".into(),
                mount: sent as f64 / (mount_v.2 * 1024.0),
                local: f64::NAN,
                unit: "ratio",
            });
        }
    }
    // What each create and unlink costs is counted without fio (`--no-fio`).
    let (rates, _) = name_rates(mount, local, files, &|| Counts::default())?;
    for (what, mount_v, local_v) in rates {
        rows.push(Row { what, mount: mount_v, local: local_v, unit: "per second" });
    }
    Ok(rows)
}

/// One fio job in `dir`: (bandwidth KiB/s, IOPS, KiB moved) of its direction.
fn fio(dir: &Path, rw: &str, bs: &str, size: u64, runtime: u64) -> anyhow::Result<(f64, f64, f64)> {
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
    // Terse v3: read KiB, bandwidth (KiB/s) and IOPS are fields 6, 7 and 8, write's 47, 48 and 49.
    let (kib, bw, iops) = if rw == "write" { (46, 47, 48) } else { (5, 6, 7) };
    let num = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).context("a malformed fio terse line");
    Ok((num(bw)?, num(iops)?, num(kib)?))
}

/// What a phase through the mount costs, whatever the machine's load:
/// requests the kernel sent (by FUSE operation), requests the manager and
/// the drives answered, the manager's metadata flushes, and the CPU time of
/// this process (the cluster, the mount and the calling thread).
#[derive(Debug, Clone, Default)]
struct Counts {
    fuse: Vec<(&'static str, u64)>,
    manager: u64,
    drive: u64,
    metadata_flushes: u64,
    cpu_ns: u64,
}

/// One name-space rate: what, through the mount, in the local directory.
type Rate = (String, f64, f64);

/// Reads [`Counts`] now.
type Probe = dyn Fn() -> Counts + Send + Sync;

/// User and system CPU time of this process so far.
fn cpu_ns() -> u64 {
    // SAFETY: getrusage(2) writes only the struct it is handed.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage of our own.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

impl Counts {
    /// Per operation, from `self` (taken before) to `after`, over `n`
    /// operations, with the disk flushes `flushes` counted: one line.
    fn per_op(&self, after: &Counts, n: u32, flushes: f64) -> String {
        let n = f64::from(n);
        let mut fuse_total = 0;
        let mut by_op = Vec::new();
        for ((op, before), (_, now)) in self.fuse.iter().zip(&after.fuse) {
            let d = now - before;
            fuse_total += d;
            if d > 0 {
                by_op.push(format!("{op} {:.2}", d as f64 / n));
            }
        }
        format!(
            "FUSE requests {:.2} ({}), manager requests {:.2}, drive requests {:.2}, metadata flushes {:.3}, \
             disk flushes {:.3}, CPU {:.3} ms",
            fuse_total as f64 / n,
            by_op.join(", "),
            (after.manager - self.manager) as f64 / n,
            (after.drive - self.drive) as f64 / n,
            (after.metadata_flushes - self.metadata_flushes) as f64 / n,
            flushes / n,
            (after.cpu_ns - self.cpu_ns) as f64 / n / 1e6,
        )
    }
}

/// Create, stat and unlink of `files` empty files: (what, mount, local) per
/// second, and what each create and unlink through the mount cost
/// ([`Counts::per_op`]).
fn name_rates(mount: &Path, local: &Path, files: u32, probe: &Probe) -> anyhow::Result<(Vec<Rate>, Vec<String>)> {
    let mut costs = Vec::new();
    let mut run = |dir: &Path, counted: bool| -> anyhow::Result<[Duration; 4]> {
        let d = dir.join("names");
        std::fs::create_dir(&d)?;
        let counting = |what: &'static str, costs: &mut Vec<String>, f: &mut dyn FnMut() -> anyhow::Result<()>| {
            let flushes = counted.then(Flushes::start);
            let before = probe();
            let t = Instant::now();
            f()?;
            let took = t.elapsed();
            let after = probe();
            if let Some(flushes) = flushes {
                let (flushed, _) = flushes.stop();
                costs.push(format!("{what}, per file: {}", before.per_op(&after, files, flushed)));
            }
            anyhow::Ok(took)
        };
        let create = counting("create (open O_CREAT + close)", &mut costs, &mut || {
            for i in 0..files {
                std::fs::File::create(d.join(format!("f{i}")))?;
            }
            Ok(())
        })?;
        let t = Instant::now();
        for i in 0..files {
            std::fs::metadata(d.join(format!("f{i}")))?;
        }
        let stat = t.elapsed();
        // Past the attribute timeout the kernel would ask again, unless the change feed vouches.
        std::thread::sleep(nasd_fuse::ATTR_TIMEOUT_DEFAULT + Duration::from_millis(500));
        let t = Instant::now();
        for i in 0..files {
            std::fs::metadata(d.join(format!("f{i}")))?;
        }
        let stat_later = t.elapsed();
        let unlink = counting("unlink", &mut costs, &mut || {
            for i in 0..files {
                std::fs::remove_file(d.join(format!("f{i}")))?;
            }
            Ok(())
        })?;
        Ok([create, stat, stat_later, unlink])
    };
    let (m, l) = (run(mount, true)?, run(local, false)?);
    let rate = |d: Duration| f64::from(files) / d.as_secs_f64();
    let what = [
        "create (open O_CREAT + close)",
        "stat (just created: cached)",
        "stat (made more than the 1 s attribute timeout ago)",
        "unlink",
    ];
    let rates =
        what.iter().enumerate().map(|(i, what)| (format!("{what}, {files} empty files"), rate(m[i]), rate(l[i])));
    Ok((rates.collect(), costs))
}
