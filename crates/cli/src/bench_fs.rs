//! `nasd bench fs`: the whole system in one process — a manager and four
//! drives on loopback — measured the way users meet it: `nasd cp` of one
//! large file up and down beside a raw loopback TCP copy of the same bytes,
//! and name-space operations per second.

use crate::bench::{mib_s, raw_disk, raw_tcp};
use crate::daemons::LocalCluster;
use crate::fs_cmd;
use crate::size::human;
use nasd_fs::FsClient;
use nasd_proto::manager::{ManagerReply, ManagerRequest};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Runs the benchmark with a `size`-byte file and `files` empty files.
pub async fn fs_bench(size: u64, files: u32, dir: Option<&std::path::Path>) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir_in(dir.unwrap_or(&std::env::temp_dir()))?;
    let cluster = LocalCluster::start(tmp.path(), 4, (size * 2).max(1 << 30)).await?;
    let fs = fs_cmd::login(&cluster.client, None).await?;
    let result = async {
        copy_rates(&fs, tmp.path(), size).await?;
        name_space_rates(&fs, files).await
    }
    .await;
    drop(fs);
    cluster.stop().await?;
    result
}

async fn copy_rates(fs: &FsClient, dir: &std::path::Path, size: u64) -> anyhow::Result<()> {
    let local = dir.join("source.bin");
    write_pattern(&local, size).await?;
    let back = dir.join("back.bin");
    let t = Instant::now();
    fs_cmd::copy(fs, &local.to_string_lossy(), "nasd:/big.bin", Default::default()).await?;
    let up = t.elapsed();
    let t = Instant::now();
    fs_cmd::copy(fs, "nasd:/big.bin", &back.to_string_lossy(), Default::default()).await?;
    let down = t.elapsed();
    anyhow::ensure!(files_equal(&local, &back)?, "the copy that came back differs from the original");
    let (raw_up, raw_down) = raw_tcp(size, 1 << 20).await?;
    let disk = {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || raw_disk(size, 1 << 20, Some(&dir))).await??
    };
    println!("nasd cp of {} (4 drives, TLS manager, INTEGRITY_ARGS|INTEGRITY_DATA|HASH_AND_MAC):", human(size));
    row("up   (local file → nasd)", size, up, raw_up);
    row("down (nasd → local file, fsynced)", size, down, raw_down);
    println!(
        "  (the disk under both: a raw {} write + fdatasync runs at {:.1} MiB/s; every copy ends durable)",
        human(size),
        mib_s(size, disk)
    );
    Ok(())
}

fn row(what: &str, size: u64, d: Duration, raw: Duration) {
    println!(
        "  {what:<36} {:>8.1} MiB/s   raw loopback TCP {:>8.1} MiB/s   ratio {:.2}",
        mib_s(size, d),
        mib_s(size, raw),
        raw.as_secs_f64() / d.as_secs_f64()
    );
}

async fn write_pattern(path: &std::path::Path, size: u64) -> anyhow::Result<()> {
    let mut f = tokio::io::BufWriter::new(tokio::fs::File::create(path).await?);
    let mut block = vec![0u8; 1 << 20];
    let mut written = 0u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    while written < size {
        for chunk in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        let n = (size - written).min(block.len() as u64) as usize;
        f.write_all(&block[..n]).await?;
        written += n as u64;
    }
    f.flush().await?;
    Ok(())
}

fn files_equal(a: &std::path::Path, b: &std::path::Path) -> anyhow::Result<bool> {
    use std::io::Read;
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba)?;
        let mut m = 0;
        while m < n {
            let k = fb.read(&mut bb[m..n])?;
            if k == 0 {
                return Ok(false);
            }
            m += k;
        }
        if n == 0 {
            return Ok(fb.read(&mut bb)? == 0);
        }
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Creates, stats and unlinks `files` empty files in one directory, one
/// request at a time, reporting each phase's rate.
async fn name_space_rates(fs: &FsClient, files: u32) -> anyhow::Result<()> {
    fs.mkdir("/many", 0o755).await?;
    let dir = fs.walk("/many", nasd_fs::OpenMode::None).await?.handle();
    let name = |i: u32| format!("f{i:06}");
    let t = Instant::now();
    for i in 0..files {
        let req = ManagerRequest::Create { parent: dir, name: name(i), mode: 0o644, exclusive: true, truncate: false };
        expect_entry(fs.call(&req).await?)?;
    }
    let create = t.elapsed();
    let t = Instant::now();
    for i in 0..files {
        let st = fs.stat(&format!("/many/{}", name(i))).await?;
        anyhow::ensure!(st.attr.size == 0, "a new file is not empty");
    }
    let stat = t.elapsed();
    let t = Instant::now();
    for i in 0..files {
        match fs.call(&ManagerRequest::Unlink { parent: dir, name: name(i) }).await? {
            ManagerReply::Done => {}
            other => anyhow::bail!("unexpected unlink reply {other:?}"),
        }
    }
    let unlink = t.elapsed();
    anyhow::ensure!(fs.readdir("/many").await?.is_empty(), "files left after unlink");
    fs.rmdir("/many").await?;
    println!("{files} empty files, one client, one request at a time:");
    for (what, d) in [("create", create), ("stat (manager walk)", stat), ("unlink", unlink)] {
        println!("  {what:<36} {:>8.0} /s", files as f64 / d.as_secs_f64());
    }
    Ok(())
}

fn expect_entry(r: ManagerReply) -> anyhow::Result<()> {
    match r {
        ManagerReply::Entry(_) => Ok(()),
        other => anyhow::bail!("unexpected reply {other:?}"),
    }
}
