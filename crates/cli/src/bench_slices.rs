//! `nasd bench slices` (issue 30): the NASD paper's informed-prefetching
//! experiment (seed `000_…` §4.6, XDataSlice). A cube of `--cube`³ 32-bit
//! values is stored as one file striped over the drives (x fastest, then y,
//! then z); `--slices` planar slices at random orientations through it
//! (from a printed seed) are rendered twice — once reading the pages each
//! slice needs one after the other, once with the same reads hinted to the
//! drives first (`nasd_fs::HintedReads`, the `prefetch-v1` extension) — and
//! the mean time per slice compared. Before every slice the drives' files
//! are flushed and dropped from the kernel's page cache
//! (`POSIX_FADV_DONTNEED` on each `blocks.dat`), so every block comes from
//! the disk; the renders of both passes must agree pixel for pixel.
//!
//! With `--media-seek-ms`, every block a drive reads from its file that the
//! kernel's page cache does not hold first waits that long, one read at a
//! time per drive (`StoreOptions::media_seek`): the paper's regime, where a
//! disk seek dwarfs a network round trip.
//!
//! The renderer asks for each `--page` of the cube a slice touches once (its
//! own cache), in the order its image rows reach them: the pattern of
//! small, scattered reads that defeats sequential read-ahead and that an
//! application knowing its slice can announce.

use crate::daemons::{ClusterSetup, LocalCluster};
use crate::fs_cmd;
use crate::size::{human, parse_size};
use crate::xorshift::Rng;
use anyhow::Context;
use nasd_fs::{File, HintedReads, Layout};
use nasd_manager::ManagerConfig;
use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// `nasd bench slices` flags.
#[derive(clap::Args)]
pub struct SlicesArgs {
    /// Edge of the cube in values (the paper's 256: 64 MiB of 32-bit values).
    #[arg(long, default_value_t = 256)]
    cube: u32,
    /// Slices rendered in each pass (the paper's 25).
    #[arg(long, default_value_t = 25)]
    slices: u32,
    /// The renderer's read size.
    #[arg(long, default_value = "4KiB")]
    page: String,
    /// Drives the cube is striped over.
    #[arg(long, default_value_t = 4)]
    drives: u32,
    /// The cube file's layout.
    #[arg(long, default_value = "stripe:4@64K")]
    layout: String,
    /// Emulated media seek, in milliseconds: every block a drive reads from
    /// its file and the page cache does not hold waits this long first, one
    /// at a time (a disk arm; a
    /// benchmark aid for the paper's disk-bound regime) [default: none, the
    /// machine's own disk].
    #[arg(long)]
    media_seek_ms: Option<u64>,
    /// Seed of the slices' orientations [default: from the clock; printed].
    #[arg(long)]
    seed: Option<u64>,
    /// Directory for the cluster's data [default: a temporary directory].
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

/// Most values on a cube's edge.
const CUBE_MAX: u32 = 1024;

pub async fn run(args: SlicesArgs) -> anyhow::Result<()> {
    anyhow::ensure!((16..=CUBE_MAX).contains(&args.cube), "--cube must be 16..={CUBE_MAX}");
    anyhow::ensure!(args.slices > 0, "--slices must be at least 1");
    let page = parse_size(&args.page).map_err(anyhow::Error::msg)?;
    anyhow::ensure!((4..=1 << 20).contains(&page) && page % 4 == 0, "--page must be 4 B..1 MiB, a multiple of 4");
    let layout = Layout::parse(&args.layout).map_err(|e| anyhow::anyhow!("--layout: {e}"))?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    let tmp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let n = u64::from(args.cube);
    let size = n * n * n * 4;
    let setup = ClusterSetup {
        drives: args.drives,
        capacity: (size * 2).max(1 << 30),
        throttle_bytes_per_sec: None,
        media_seek: args.media_seek_ms.map(Duration::from_millis),
        manager: ManagerConfig::default(),
        own_runtimes: true,
        auth: false,
    };
    let cluster = LocalCluster::start_with(&dir, setup).await?;
    let result = measure(&cluster, &dir, &args, layout, page, seed).await;
    cluster.stop().await?;
    result
}

async fn measure(
    cluster: &LocalCluster,
    dir: &Path,
    args: &SlicesArgs,
    layout: Layout,
    page: u64,
    seed: u64,
) -> anyhow::Result<()> {
    let fs = fs_cmd::login(&cluster.client, None).await?;
    fs.set_layout("/", Some(layout)).await?;
    let n = u64::from(args.cube);
    let size = n * n * n * 4;
    println!(
        "## Informed prefetching: {} slices through a {n}³ cube of 32-bit values ({}), {} reads, {} drives, {layout}, media seek {}, seed {seed}",
        args.slices,
        human(size),
        human(page),
        args.drives,
        args.media_seek_ms.map_or("none (the machine's disk)".into(), |ms| format!("{ms} ms emulated"))
    );
    println!();
    write_cube(&fs, n).await?;
    let blocks: Vec<std::path::PathBuf> =
        (0..args.drives).map(|i| dir.join(format!("drive-{i}")).join("blocks.dat")).collect();
    let file = fs.open("/cube", false).await?;
    let slices: Vec<Slice> = {
        let mut rng = Rng(seed | 1);
        (0..args.slices).map(|_| Slice::random(&mut rng, n)).collect()
    };
    let mut rows = Vec::new();
    let mut renders = Vec::new();
    for hinted in [false, true] {
        let mut spent = Duration::ZERO;
        let (mut reads, mut bytes) = (0u64, 0u64);
        let mut images = Vec::new();
        for s in &slices {
            drop_page_cache(&blocks)?;
            let pages = s.pages(n, page);
            reads += pages.len() as u64;
            bytes += pages.len() as u64 * page;
            let t = Instant::now();
            images.push(render(&file, s, n, page, &pages, hinted).await?);
            spent += t.elapsed();
        }
        let per_slice = spent.as_secs_f64() / f64::from(args.slices);
        rows.push((hinted, per_slice, reads / u64::from(args.slices), bytes));
        renders.push(images);
    }
    anyhow::ensure!(renders[0] == renders[1], "the hinted renders differ from the plain ones");
    let hits = cluster.drive_prefetch_cache_hits()();
    println!("| pass | seconds per slice | reads per slice | speed-up |");
    println!("|---|---:|---:|---:|");
    let plain = rows[0].1;
    for (hinted, per_slice, reads, _) in &rows {
        let what = if *hinted { "reads hinted first (prefetch-v1)" } else { "reads one after the other" };
        println!("| {what} | {per_slice:.3} | {reads} | {:.2} |", plain / per_slice);
    }
    println!();
    println!(
        "Blocks served from the drives' prefetch caches: {hits}. The paper (§4.6): 120.2 s → 68.1 s per slice, 1.76× \
         (its drive striped over three local disks). Renders of both passes equal."
    );
    Ok(())
}

/// Writes the cube: value (x, y, z) = x + 1 000·y + 1 000 000·z.
async fn write_cube(fs: &nasd_fs::FsClient, n: u64) -> anyhow::Result<()> {
    let f = fs.create("/cube", 0o644, true, true).await.context("create /cube")?;
    let plane = n * n;
    for z in 0..n {
        let mut buf = Vec::with_capacity((plane * 4) as usize);
        for y in 0..n {
            for x in 0..n {
                buf.extend_from_slice(&(value(x, y, z)).to_le_bytes());
            }
        }
        f.write_at(z * plane * 4, &buf).await?;
    }
    f.close().await?;
    Ok(())
}

fn value(x: u64, y: u64, z: u64) -> u32 {
    (x + 1_000 * y + 1_000_000 * z) as u32
}

/// Flushes the drives' files and drops them from the page cache, so the
/// next reads come from the disk.
fn drop_page_cache(files: &[std::path::PathBuf]) -> anyhow::Result<()> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    for path in files {
        let f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor, whole file; advice only.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        anyhow::ensure!(rc == 0, "posix_fadvise({}): error {rc}", path.display());
    }
    Ok(())
}

/// Renders slice `s`: reads `pages` (its pages, in order), hinted first or
/// not, and returns the image (one value per pixel, 0 outside the cube).
async fn render(file: &File, s: &Slice, n: u64, page: u64, pages: &[u64], hinted: bool) -> anyhow::Result<Vec<u32>> {
    let mut have = std::collections::HashMap::with_capacity(pages.len());
    if hinted {
        let mut reads = HintedReads::new(file, pages.iter().map(|&p| (p * page, page)).collect()).await?;
        while let Some((offset, bytes)) = reads.next_read().await? {
            have.insert(offset / page, bytes);
        }
        reads.end().await;
    } else {
        for &p in pages {
            have.insert(p, file.read_at(p * page, page).await?);
        }
    }
    let image = s
        .pixels(n)
        .map(|voxel| {
            voxel.map_or(0, |offset| {
                let bytes = &have[&(offset / page)];
                let at = (offset % page) as usize;
                u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
            })
        })
        .collect();
    Ok(image)
}

/// A plane through the cube: a centre and two orthonormal directions; its
/// image is n × n pixels one voxel apart.
struct Slice {
    centre: [f64; 3],
    u: [f64; 3],
    v: [f64; 3],
}

impl Slice {
    fn random(rng: &mut Rng, n: u64) -> Slice {
        let half = n as f64 / 2.0;
        let centre = [0, 1, 2].map(|_| half + (rng.unit() - 0.5) * half);
        let normal = normalize([0, 1, 2].map(|_| rng.unit() - 0.5));
        // Any direction not along the normal, made orthogonal to it.
        let other = if normal[0].abs() < 0.9 { [1.0, 0.0, 0.0] } else { [0.0, 1.0, 0.0] };
        let u = normalize(cross(normal, other));
        let v = cross(normal, u);
        Slice { centre, u, v }
    }

    /// Each pixel's voxel byte offset in the file (None outside the cube), row by row.
    fn pixels(&self, n: u64) -> impl Iterator<Item = Option<u64>> + '_ {
        let half = n as f64 / 2.0;
        (0..n).flat_map(move |j| {
            (0..n).map(move |i| {
                let (a, b) = (i as f64 - half, j as f64 - half);
                let p: [f64; 3] = [0, 1, 2].map(|k| self.centre[k] + a * self.u[k] + b * self.v[k]);
                if p.iter().any(|&c| c < 0.0 || c >= n as f64) {
                    return None;
                }
                let [x, y, z] = p.map(|c| c as u64);
                Some(((z * n + y) * n + x) * 4)
            })
        })
    }

    /// The pages the image needs, each once, in the order rows reach them.
    fn pages(&self, n: u64, page: u64) -> Vec<u64> {
        let mut seen = HashSet::new();
        self.pixels(n).flatten().map(|offset| offset / page).filter(|p| seen.insert(*p)).collect()
    }
}

fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
}

fn normalize(a: [f64; 3]) -> [f64; 3] {
    let len = (a[0] * a[0] + a[1] * a[1] + a[2] * a[2]).sqrt().max(1e-12);
    a.map(|c| c / len)
}
