//! End-to-end benchmarks. Every figure is reported beside a baseline measured
//! in the same run on the same machine, so ratios stay meaningful across hosts.

use crate::size::{human, parse_size};
use anyhow::Context;
use nasd_client::DriveClient;
use nasd_proto::Region;
use nasd_store::{Store, StoreOptions, BLOCK_SIZE_DEFAULT};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What to measure.
#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Striping over drives (issue 10), in one process: a TLS manager and
    /// eight drives on loopback, each drive paced to --drive-mib-per-sec
    /// (emulated slow media, a test aid). One client writes and reads one
    /// large file per layout (stripe:1/2/4/8, mirror:2x4, rs:4+2) against
    /// the ideal data columns × per-drive rate and against the same transfer
    /// unpaced with its CPU time (the machine's limit); reads a Reed-Solomon
    /// file with one and two drives stopped; rebuilds their components and
    /// reports the rate; and compares an unpaced put and get with iperf3 and
    /// a raw TCP copy on loopback.
    Stripe(crate::bench_stripe::StripeArgs),
    /// The data path's CPU cost model (issue 29), in one process: a TLS
    /// manager and unpaced drives on loopback. One file written and read
    /// per layout (stripe:4, mirror:2, rs:2+1, rs:4+2), with and without
    /// data protection; the CPU-seconds per GiB of the client, the drives
    /// and the manager beside the floor computed from the hashing, parity,
    /// loopback TCP and memcpy rates measured in the same run.
    Cost(crate::bench_cost::CostArgs),
    /// Hardening soak (issue 11): a manager and drives as separate
    /// processes; legitimate clients run mixed operations (create, put, get,
    /// stat, ls, rm, rename; every answer checked) beside idle and slow-drip
    /// hostile connections from other loopback addresses, while each
    /// daemon's resident memory is sampled. Fails if a legitimate client saw
    /// an error.
    Soak(crate::bench_soak::SoakArgs),
    /// Name-space scale-out (issue 14): Slice's untar workload — per empty
    /// file lookup, getattr (for ACCESS), create, getattr, lookup, setattr
    /// mode, setattr times — by concurrent clients, each unpacking its own
    /// copy of a source-like tree, against one manager on SQLite and 1, 2
    /// and 4 managers on one real PostgreSQL server started for the run
    /// (clients pinned round-robin to managers); every tree checked after.
    Untar(crate::bench_untar::UntarArgs),
    /// Informed prefetching (issue 30, NASD §4.6's XDataSlice experiment):
    /// random planar slices through a cube of 32-bit values striped over
    /// the drives, rendered with and without the reads hinted to the drives
    /// first (`prefetch-v1`), the drives' files dropped from the page cache
    /// before every slice; mean time per slice and the speed-up.
    Slices(crate::bench_slices::SlicesArgs),
    /// Decentralized authorization (issue 13), DSFS's Tables 3 and 4 and
    /// its chmod cost: two clusters in one process (an authentication
    /// server, a manager and four drives each on loopback), one with
    /// `auth_scheme = "capabilities"` and one with `"pals"`. Open latency
    /// at the manager (capabilities minted per component vs none), a 4 KiB
    /// per-drive read and write with the capability held (cache hit), or
    /// fetched first (miss), or by identity under PALs, and chmod (the
    /// access-control version bump, and under PALs the PAL pushed to every
    /// component drive), on files of 1 and of 4 drives; mean and p99 with
    /// ratios to baselines measured in the same run.
    Dsfs(crate::bench_dsfs::DsfsArgs),
    /// The whole system in one process (a TLS manager and four drives on
    /// loopback): `nasd cp` of one file up and down beside a raw loopback TCP
    /// copy, then create/stat/unlink of many empty files per second.
    Fs {
        /// Size of the file copied up and down.
        #[arg(long, default_value = "1GiB")]
        size: String,
        /// Number of empty files created, stat-ed and unlinked.
        #[arg(long, default_value_t = 10_000)]
        files: u32,
        /// Where the cluster keeps its files [default: a temporary directory].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// Small files (issue 14 item 4), in one process: two clusters of a TLS
    /// manager and four drives on loopback, one with the small-file path
    /// (`[manager] small_file_threshold`, the default) and one without (0:
    /// every byte striped over drives); on each, --files files of --size
    /// bytes created, written and closed, then opened and read back (every
    /// byte checked). Reports both rates and their ratio.
    SmallFiles {
        /// Number of files.
        #[arg(long, default_value_t = 10_000)]
        files: u32,
        /// Bytes per file.
        #[arg(long, default_value = "4KiB")]
        size: String,
        /// Where the clusters keep their files [default: a temporary directory].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
    },
    /// The POSIX mount (FUSE) of an in-process cluster measured with fio beside a
    /// local directory: 1 MiB sequential write and read, 4 KiB random read, and
    /// create/stat/unlink of empty files per second (needs root and fio).
    Mount {
        /// Size of fio's file.
        #[arg(long, default_value = "1GiB")]
        size: String,
        /// Number of empty files created, stat-ed and unlinked.
        #[arg(long, default_value_t = 2_000)]
        files: u32,
        /// Longest a read job runs, in seconds.
        #[arg(long, default_value_t = 30)]
        runtime: u64,
        /// Where the cluster, the mount point and the local directory live [default: a temporary directory].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Skip the fio jobs (name-space, listing, tar and put rows only).
        #[arg(long)]
        no_fio: bool,
        /// Entries of the directory `ls -l` lists (0: no listing).
        #[arg(long, default_value_t = 10_000)]
        listing: u32,
        /// A tree to copy into the mount with `tar c | tar x` and compare.
        #[arg(long)]
        tree: Option<std::path::PathBuf>,
        /// Files of 4 KiB `nasd put -r` copies (0: none).
        #[arg(long, default_value_t = 1_000)]
        put_files: u32,
    },
    /// One client writes then reads SIZE sequentially in REQUEST-sized
    /// requests over loopback, beside a raw TCP copy of the same bytes.
    Drive {
        /// Total bytes to write and read.
        #[arg(long, default_value = "1GiB")]
        size: String,
        /// Bytes per request.
        #[arg(long, default_value = "1MiB")]
        request: String,
        /// Block size of the drive under test (comma-separated to compare several).
        #[arg(long, default_value = "64KiB")]
        block_size: String,
        /// Where the drive under test keeps its files [default: a temporary directory].
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Check stored digests on every read.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        verify_reads: bool,
        /// Data chunk length on the wire, both directions.
        #[arg(long, default_value = "256KiB")]
        chunk: String,
    },
    /// One write and two reads of SIZE, each a single request, against a
    /// running drive under INTEGRITY_DATA (per-chunk cumulative MACs; the
    /// second read under Hash-and-MAC), reporting throughput and this
    /// client's peak resident memory.
    Transfer {
        /// The drive's address.
        #[arg(long, default_value = "127.0.0.1:7400")]
        drive: String,
        /// File holding the drive key (64 hex digits).
        #[arg(long)]
        drive_key_file: std::path::PathBuf,
        /// Bytes to write, then read back, in one request each.
        #[arg(long, default_value = "4GiB")]
        size: String,
        /// Partition to use (created if missing, removed afterwards).
        #[arg(long, default_value_t = 4242)]
        partition: u64,
    },
    /// Read throughput on a secured drive at NO_PROTECTION, INTEGRITY_DATA
    /// with a per-byte MAC, and INTEGRITY_DATA with Hash-and-MAC, in one run;
    /// then Hash-and-MAC over unaligned sizes (the saw-tooth). The drive runs
    /// on a runtime of its own and the client on a thread of its own, as two
    /// processes would.
    Integrity {
        /// Bytes read per option.
        #[arg(long, default_value = "1GiB")]
        total: String,
        /// Bytes per aligned read.
        #[arg(long, default_value = "1MiB")]
        request: String,
        /// Data chunk length of the drive's read replies.
        #[arg(long, default_value = "256KiB")]
        chunk: String,
        /// Also measure unaligned read sizes (the saw-tooth).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        saw_tooth: bool,
        /// Give client and drive a core each: the client's thread on CPU 0,
        /// every drive thread on CPU 1 (for all options alike).
        #[arg(long)]
        pin: bool,
        /// The drive checks stored digests on reads (its default). Under
        /// Hash-and-MAC it checks only blocks it sends in part: the client
        /// checks the stored digests of whole blocks end to end.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        verify_reads: bool,
        /// Run the drive on this command's runtime and the client on its main
        /// thread, as this bench first did (for comparison): the client's
        /// socket events are then polled by the drive's busy threads.
        #[arg(long, conflicts_with = "pin")]
        shared_runtime: bool,
    },
    /// Latency of small reads on a secured drive under each protection
    /// option, measured in one run with one client and one capability.
    Security {
        /// Reads per protection option.
        #[arg(long, default_value_t = 20_000)]
        reads: u32,
        /// Bytes per read.
        #[arg(long, default_value = "4KiB")]
        size: String,
    },
}

pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Mount { size, files, runtime, dir, no_fio, listing, tree, put_files } => {
            let size = parse_size(&size).map_err(anyhow::Error::msg)?;
            let extra = crate::bench_mount::Extra { fio: !no_fio, listing, tree, put_files };
            crate::bench_mount::mount_bench(size, files, runtime, dir.as_deref(), extra).await
        }
        BenchCommand::Stripe(args) => crate::bench_stripe::run(args).await,
        BenchCommand::Cost(args) => crate::bench_cost::run(args).await,
        BenchCommand::Soak(args) => crate::bench_soak::run(args).await,
        BenchCommand::Untar(args) => crate::bench_untar::run(args).await,
        BenchCommand::Slices(args) => crate::bench_slices::run(args).await,
        BenchCommand::Dsfs(args) => crate::bench_dsfs::run(args).await,
        BenchCommand::Fs { size, files, dir } => {
            let size = parse_size(&size).map_err(anyhow::Error::msg)?;
            crate::bench_fs::fs_bench(size, files, dir.as_deref()).await
        }
        BenchCommand::SmallFiles { files, size, dir } => {
            let size = parse_size(&size).map_err(anyhow::Error::msg)?;
            crate::bench_small::small_files_bench(files, size, dir.as_deref()).await
        }
        BenchCommand::Transfer { drive, drive_key_file, size, partition } => {
            let size = parse_size(&size).map_err(anyhow::Error::msg)?;
            transfer(&drive, &drive_key_file, size, partition).await
        }
        BenchCommand::Integrity { total, request, chunk, saw_tooth, pin, verify_reads, shared_runtime } => {
            let total = parse_size(&total).map_err(anyhow::Error::msg)?;
            let request = parse_size(&request).map_err(anyhow::Error::msg)?;
            let chunk = u32::try_from(parse_size(&chunk).map_err(anyhow::Error::msg)?).context("--chunk too large")?;
            let setup = IntegritySetup { total, request, chunk, saw_tooth, pin, verify_reads, shared_runtime };
            integrity(setup).await
        }
        BenchCommand::Security { reads, size } => {
            let size = parse_size(&size).map_err(anyhow::Error::msg)?;
            security_latency(reads, size).await
        }
        BenchCommand::Drive { size, request, block_size, dir, verify_reads, chunk } => {
            let size = parse_size(&size).map_err(anyhow::Error::msg)?;
            let chunk = parse_size(&chunk).map_err(anyhow::Error::msg)? as u32;
            let request = parse_size(&request).map_err(anyhow::Error::msg)?;
            anyhow::ensure!(request > 0 && size >= request, "--size must be at least --request, and --request above 0");
            let (raw_up, raw_down) = raw_tcp(size, request as usize).await?;
            println!("| what | bytes | request | block | MiB/s | ratio to raw TCP |");
            println!("|---|---|---|---|---|---|");
            println!(
                "| raw TCP copy, client → server | {} | {} | – | {:.0} | 1.00 |",
                human(size),
                human(request),
                mib_s(size, raw_up)
            );
            println!(
                "| raw TCP copy, server → client | {} | {} | – | {:.0} | 1.00 |",
                human(size),
                human(request),
                mib_s(size, raw_down)
            );
            let disk = raw_disk(size, request as usize, dir.as_deref())?;
            println!(
                "| raw file write + fdatasync (disk baseline) | {} | {} | – | {:.0} | {:.2} |",
                human(size),
                human(request),
                mib_s(size, disk),
                raw_up.as_secs_f64() / disk.as_secs_f64()
            );
            for bs in block_size.split(',') {
                let bs = parse_size(bs).map_err(anyhow::Error::msg)? as u32;
                let (w, r, small) = drive_seq(size, request, bs, dir.as_deref(), verify_reads, chunk).await?;
                println!(
                    "| nasd write + flush | {} | {} | {} | {:.0} | {:.2} |",
                    human(size),
                    human(request),
                    human(bs as u64),
                    mib_s(size, w),
                    raw_up.as_secs_f64() / w.as_secs_f64()
                );
                println!(
                    "| nasd read | {} | {} | {} | {:.0} | {:.2} |",
                    human(size),
                    human(request),
                    human(bs as u64),
                    mib_s(size, r),
                    raw_down.as_secs_f64() / r.as_secs_f64()
                );
                let bytes = SMALL_WRITES * SMALL_WRITE_LEN;
                println!(
                    "| nasd random 4 KiB overwrites + flush ({SMALL_WRITES} of them) | {} | 4.0 KiB | {} | {:.0} ({:.0} writes/s) | – |",
                    human(bytes), human(bs as u64), mib_s(bytes, small), SMALL_WRITES as f64 / small.as_secs_f64()
                );
            }
            Ok(())
        }
    }
}

/// Random small overwrites per block size: what large blocks cost (each
/// partial block is read, merged, digested and written whole).
const SMALL_WRITES: u64 = 4096;
const SMALL_WRITE_LEN: u64 = 4096;

pub(crate) fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

/// Copies `size` bytes over loopback in `request`-sized writes, each way.
pub(crate) async fn raw_tcp(size: u64, request: usize) -> anyhow::Result<(Duration, Duration)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; request];
        let mut got = 0u64;
        while got < size {
            let n = s.read(&mut buf).await?;
            anyhow::ensure!(n > 0, "raw client hung up");
            got += n as u64;
        }
        s.write_all(&[1]).await?;
        let mut sent = 0u64;
        while sent < size {
            let n = (size - sent).min(request as u64) as usize;
            s.write_all(&buf[..n]).await?;
            sent += n as u64;
        }
        anyhow::Ok(())
    });
    let mut c = TcpStream::connect(addr).await?;
    c.set_nodelay(true)?;
    let buf = vec![0x5au8; request];
    let t = Instant::now();
    let mut sent = 0u64;
    while sent < size {
        let n = (size - sent).min(request as u64) as usize;
        c.write_all(&buf[..n]).await?;
        sent += n as u64;
    }
    let mut ack = [0u8; 1];
    c.read_exact(&mut ack).await?;
    let up = t.elapsed();
    let mut rbuf = vec![0u8; request];
    let t = Instant::now();
    let mut got = 0u64;
    while got < size {
        let n = c.read(&mut rbuf).await?;
        anyhow::ensure!(n > 0, "raw server hung up");
        got += n as u64;
    }
    let down = t.elapsed();
    server.await??;
    Ok((up, down))
}

/// Writes `size` bytes to a plain file in `request`-sized writes and fdatasyncs it:
/// what the disk under the drive can do.
pub(crate) fn raw_disk(size: u64, request: usize, dir: Option<&std::path::Path>) -> anyhow::Result<Duration> {
    use std::io::Write;
    let tmp = tempfile::NamedTempFile::new_in(dir.map(|d| d.to_path_buf()).unwrap_or_else(std::env::temp_dir))?;
    let mut f = tmp.as_file();
    let buf = vec![0xa5u8; request];
    let t = Instant::now();
    let mut off = 0;
    while off < size {
        let n = (size - off).min(request as u64) as usize;
        f.write_all(&buf[..n])?;
        off += n as u64;
    }
    f.sync_data()?;
    Ok(t.elapsed())
}

/// A drive served by this process on a loopback port until [`LocalDrive::stop`].
struct LocalDrive {
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    /// The drive's own runtime, when it has one ([`LocalDrive::start_apart`]).
    _runtime: Option<OwnRuntime>,
}

/// A runtime owned by a bench drive, shut down without waiting when dropped
/// (dropping a runtime inside another one's task would panic).
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl LocalDrive {
    async fn start(store: Arc<Store>, config: nasd_drive::DriveConfig) -> anyhow::Result<LocalDrive> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(nasd_drive::serve(listener, store, config, async {
            let _ = stopped.await;
        }));
        Ok(LocalDrive { addr, stop, server, _runtime: None })
    }

    /// Like [`LocalDrive::start`], but on a multi-threaded runtime of its own
    /// (worker and blocking threads apart from the caller's), as a drive
    /// process has; with `cpu`, every thread of it runs on that CPU only.
    fn start_apart(
        store: Arc<Store>,
        config: nasd_drive::DriveConfig,
        cpu: Option<usize>,
    ) -> anyhow::Result<LocalDrive> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("nasd-bench-drive")
            .on_thread_start(move || {
                if let Some(cpu) = cpu {
                    if let Err(e) = pin_to_cpu(cpu) {
                        tracing::warn!(cpu, error = %e, "cannot pin a drive thread");
                    }
                }
            })
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = runtime.spawn(async move {
            let listener = TcpListener::from_std(listener)?;
            nasd_drive::serve(listener, store, config, async {
                let _ = stopped.await;
            })
            .await
        });
        Ok(LocalDrive { addr, stop, server, _runtime: Some(OwnRuntime(Some(runtime))) })
    }

    /// Stops serving, waits for the final commit.
    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.server.await??;
        Ok(())
    }
}

/// Writes then reads `size` bytes through a drive served in this process.
async fn drive_seq(
    size: u64,
    request: u64,
    block_size: u32,
    dir: Option<&std::path::Path>,
    verify_reads: bool,
    chunk: u32,
) -> anyhow::Result<(Duration, Duration, Duration)> {
    let tmp;
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let dir = dir.join(format!("bench-drive-{block_size}"));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = StoreOptions {
        block_size: if block_size == 0 { BLOCK_SIZE_DEFAULT } else { block_size },
        capacity_bytes: size * 3,
        verify_reads,
        ..StoreOptions::default()
    };
    let store = Arc::new(Store::open(&dir, &opts).context("cannot open the bench drive's store")?);
    let config = nasd_drive::DriveConfig { chunk_len: Some(chunk), ..nasd_drive::DriveConfig::unauthenticated() };
    let drive = LocalDrive::start(store, config).await?;
    let mut c = DriveClient::connect(drive.addr).await?;
    c.set_chunk_len(chunk);
    c.create_partition(1).await?;
    c.resize_partition(1, size * 2).await?;
    let (obj, _) = c.create(1).await?;
    let data = vec![0xa5u8; request as usize];
    let t = Instant::now();
    let mut off = 0;
    while off < size {
        let n = (size - off).min(request);
        c.write(1, obj, &[Region { offset: off, length: n }], &data[..n as usize]).await?;
        off += n;
    }
    c.flush(1, &[obj]).await?;
    let w = t.elapsed();
    let mut sink = tokio::io::sink();
    let t = Instant::now();
    let mut off = 0;
    while off < size {
        let n = (size - off).min(request);
        c.read_to(1, obj, &[Region { offset: off, length: n }], &mut sink).await?;
        off += n;
    }
    let r = t.elapsed();
    let small = vec![0x3cu8; SMALL_WRITE_LEN as usize];
    let slots = size / SMALL_WRITE_LEN;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let t = Instant::now();
    for _ in 0..SMALL_WRITES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let off = (x % slots) * SMALL_WRITE_LEN;
        c.write(1, obj, &[Region { offset: off, length: SMALL_WRITE_LEN }], &small).await?;
    }
    c.flush(1, &[obj]).await?;
    let small_t = t.elapsed();
    drop(c);
    drive.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((w, r, small_t))
}

/// A drive with security enforced, served in this process: key hierarchy set
/// up over the wire, drive minimum protection NONE, one object of
/// `object_len` bytes, and a read capability for it (minimum NONE).
struct SecuredDrive {
    _dir: tempfile::TempDir,
    client: DriveClient,
    object: u64,
    token: Vec<u8>,
    key: nasd_crypto::Key,
    drive: LocalDrive,
}

/// Where a bench drive runs: on the caller's runtime, or on one of its own
/// (see [`LocalDrive::start_apart`]).
#[derive(Clone, Copy)]
enum DriveRuntime {
    Shared,
    Apart { cpu: Option<usize> },
}

async fn secured_drive(
    object_len: u64,
    chunk_len: u32,
    runtime: DriveRuntime,
    verify_reads: bool,
) -> anyhow::Result<SecuredDrive> {
    use nasd_client::{Auth, Credential};
    use nasd_crypto::{mint_capability, Key, MacAlgorithm};
    use nasd_proto::{rights, CapabilityArgs, Protection};
    let tmp = tempfile::tempdir()?;
    let store = Arc::new(Store::open(
        tmp.path(),
        &StoreOptions { capacity_bytes: object_len + (1 << 30), verify_reads, ..Default::default() },
    )?);
    let master = Key::random();
    let config = nasd_drive::DriveConfig {
        security: nasd_drive::SecurityMode::Enforced { master_key: Some(master.clone()) },
        chunk_len: Some(chunk_len),
        ..Default::default()
    };
    let drive = match runtime {
        DriveRuntime::Shared => LocalDrive::start(store, config).await?,
        DriveRuntime::Apart { cpu } => LocalDrive::start_apart(store, config, cpu)?,
    };
    let mut c = DriveClient::connect(drive.addr).await?;
    let (drive_key, part_key, working) = (Key::random(), Key::random(), Key::random());
    c.set_drive_key(&master, &drive_key).await?;
    c.set_auth(Auth::new(Credential::Drive(drive_key.clone()), Protection::INTEGRITY_ARGS));
    c.create_partition(1).await?;
    c.resize_partition(1, object_len + (64 << 20)).await?;
    c.set_partition_key(&drive_key, 1, &part_key).await?;
    c.set_working_key(&part_key, 1, 1, &working).await?;
    c.set_min_protection(&Credential::Drive(drive_key.clone()), 0, Protection::NONE).await?;
    let (object, _) = c.create(1).await?;
    let block = vec![7u8; 1 << 20];
    let mut off = 0;
    while off < object_len {
        let n = (object_len - off).min(block.len() as u64);
        c.write(1, object, &[Region { offset: off, length: n }], &block[..n as usize]).await?;
        off += n;
    }
    c.flush(1, &[object]).await?;
    let cap = CapabilityArgs {
        algorithm: MacAlgorithm::Blake3 as u8,
        min_protection: Protection::NONE,
        key_version: 1,
        drive_id: c.drive_id(),
        partition: 1,
        object,
        region: CapabilityArgs::WHOLE_OBJECT,
        access_control_version: 0,
        rights: rights::READ | rights::GETATTR,
        map_epoch: 0,
        expiration_ns: c.drive_time_ns() + 3_600_000_000_000,
        audit_id: 1,
    };
    let (token, key) = mint_capability(&working, &cap, false).context("mint capability")?;
    Ok(SecuredDrive { _dir: tmp, client: c, object, token, key, drive })
}

impl SecuredDrive {
    fn use_capability(&mut self, protection: nasd_proto::Protection) {
        use nasd_client::{Auth, Credential};
        self.client.set_auth(Auth::new(
            Credential::Capability {
                token: self.token.clone(),
                key: self.key.clone(),
                algorithm: nasd_crypto::MacAlgorithm::Blake3,
            },
            protection,
        ));
    }

    async fn stop(self) -> anyhow::Result<()> {
        drop(self.client);
        self.drive.stop().await
    }
}

/// Reads of `size` bytes at offsets stepping through the object until
/// `total` bytes were read; returns the time taken.
async fn timed_reads(
    d: &mut SecuredDrive,
    object_len: u64,
    size: u64,
    total: u64,
    off: &mut u64,
) -> anyhow::Result<Duration> {
    let mut sink = tokio::io::sink();
    let t = Instant::now();
    let mut done = 0u64;
    while done < total {
        if *off + size > object_len {
            *off = 0;
        }
        d.client.read_to(1, d.object, &[Region { offset: *off, length: size }], &mut sink).await?;
        done += size;
        *off += size;
    }
    Ok(t.elapsed())
}

/// Reads `total` bytes of `size`-byte reads under each option, interleaved
/// in rounds so that the machine's noise falls on every option alike;
/// returns MiB/s per option.
async fn interleaved_rates(
    d: &mut SecuredDrive,
    object_len: u64,
    size: u64,
    total: u64,
    options: &[nasd_proto::Protection],
) -> anyhow::Result<Vec<f64>> {
    const ROUNDS: u64 = 16;
    let per_round = (total / ROUNDS).max(size);
    let mut spent = vec![Duration::ZERO; options.len()];
    let mut off = 0;
    for (i, p) in options.iter().enumerate() {
        d.use_capability(*p);
        timed_reads(d, object_len, size, per_round, &mut off).await?; // warm-up
        spent[i] = Duration::ZERO;
    }
    for _ in 0..ROUNDS {
        for (i, p) in options.iter().enumerate() {
            d.use_capability(*p);
            spent[i] += timed_reads(d, object_len, size, per_round, &mut off).await?;
        }
    }
    Ok(spent.iter().map(|t| mib_s(per_round * ROUNDS, *t)).collect())
}

/// What `nasd bench integrity` measures, and how.
#[derive(Clone, Copy)]
struct IntegritySetup {
    total: u64,
    request: u64,
    chunk: u32,
    saw_tooth: bool,
    pin: bool,
    verify_reads: bool,
    shared_runtime: bool,
}

/// Pins the calling thread to one CPU.
fn pin_to_cpu(cpu: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data, zeroed is its empty set, and CPU_SET
    // and sched_setaffinity get a valid pointer and its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Runs the integrity bench as one client process and one drive process
/// would: the drive on a runtime of its own ([`LocalDrive::start_apart`]),
/// the client on a thread of its own with a single-threaded runtime, so that
/// neither one's socket events wait on a thread the other keeps busy. With
/// `pin`, the client's thread runs on CPU 0 and every drive thread on CPU 1.
async fn integrity(setup: IntegritySetup) -> anyhow::Result<()> {
    if setup.shared_runtime {
        return integrity_client(setup).await;
    }
    if setup.pin {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        anyhow::ensure!(cpus >= 2, "--pin needs two CPUs; this machine offers {cpus}");
    }
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("nasd-bench-client".into()).spawn(move || {
        let run = || -> anyhow::Result<()> {
            if setup.pin {
                pin_to_cpu(0).context("cannot pin the client thread to CPU 0")?;
            }
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(integrity_client(setup))
        };
        let _ = done.send(run());
    })?;
    result.await.context("the bench client thread died")?
}

async fn integrity_client(setup: IntegritySetup) -> anyhow::Result<()> {
    use nasd_proto::Protection;
    let IntegritySetup { total, request, chunk, saw_tooth, pin, verify_reads, shared_runtime } = setup;
    let object_len = 256 << 20;
    let placement = if shared_runtime { DriveRuntime::Shared } else { DriveRuntime::Apart { cpu: pin.then_some(1) } };
    let mut d = secured_drive(object_len, chunk, placement, verify_reads).await?;
    let data = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);
    let hash_and_mac = data.union(Protection::HASH_AND_MAC);
    let names = ["NO_PROTECTION", "INTEGRITY_DATA, per-byte MAC", "INTEGRITY_DATA, Hash-and-MAC"];
    let rates = interleaved_rates(&mut d, object_len, request, total, &[Protection::NONE, data, hash_and_mac]).await?;
    println!("| protection | read size | MiB/s | ratio to NO_PROTECTION |");
    println!("|---|---|---|---|");
    for (name, rate) in names.iter().zip(&rates) {
        println!("| {name} | {} | {rate:.0} | {:.2} |", human(request), rate / rates[0]);
    }
    if !saw_tooth {
        return d.stop().await;
    }
    println!();
    println!("| read size | MiB/s, Hash-and-MAC | MiB/s, NO_PROTECTION | ratio |");
    println!("|---|---|---|---|");
    for size in [65536 - 1, 65536, 65536 + 1, 98304, 131072 - 1, 131072, 131072 + 1, 262144 - 1, 262144, 262144 + 1] {
        let r = interleaved_rates(&mut d, object_len, size, total / 4, &[Protection::NONE, hash_and_mac]).await?;
        println!("| {size} B | {:.0} | {:.0} | {:.2} |", r[1], r[0], r[1] / r[0]);
    }
    d.stop().await
}

/// Small-read latency under each protection option on a drive with security
/// enforced: key hierarchy set up over the wire, one capability minted as a
/// file manager would, then the same reads at each option.
async fn security_latency(reads: u32, size: u64) -> anyhow::Result<()> {
    use nasd_proto::Protection;
    let mut d = secured_drive(size, nasd_proto::limits::CHUNK_LEN_DEFAULT, DriveRuntime::Shared, true).await?;
    let options = [
        ("NO_PROTECTION", Protection::NONE),
        ("INTEGRITY_ARGS", Protection::INTEGRITY_ARGS),
        ("INTEGRITY_ARGS + INTEGRITY_DATA", Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA)),
        ("PRIVACY_ARGS (+ INTEGRITY_ARGS)", Protection::INTEGRITY_ARGS.union(Protection::PRIVACY_ARGS)),
        (
            "PRIVACY_DATA (+ all integrity, PRIVACY_ARGS)",
            Protection::INTEGRITY_ARGS
                .union(Protection::INTEGRITY_DATA)
                .union(Protection::PRIVACY_ARGS)
                .union(Protection::PRIVACY_DATA),
        ),
    ];
    println!("| protection | reads of {} | mean µs | p50 µs | p99 µs | ratio to NO_PROTECTION (mean) |", human(size));
    println!("|---|---|---|---|---|---|");
    let mut base = None;
    for (name, protection) in options {
        d.use_capability(protection);
        let mut sink = tokio::io::sink();
        for _ in 0..reads / 10 {
            d.client.read_to(1, d.object, &[Region { offset: 0, length: size }], &mut sink).await?;
        }
        let mut lat = Vec::with_capacity(reads as usize);
        for _ in 0..reads {
            let t = Instant::now();
            d.client.read_to(1, d.object, &[Region { offset: 0, length: size }], &mut sink).await?;
            lat.push(t.elapsed().as_nanos() as u64);
        }
        lat.sort_unstable();
        let mean = lat.iter().sum::<u64>() as f64 / lat.len() as f64 / 1000.0;
        let pct = |q: f64| lat[((lat.len() as f64 - 1.0) * q) as usize] as f64 / 1000.0;
        let base_mean = *base.get_or_insert(mean);
        println!("| {name} | {reads} | {mean:.1} | {:.1} | {:.1} | {:.2} |", pct(0.5), pct(0.99), mean / base_mean);
    }
    d.stop().await
}

/// Peak resident set size of this process (VmHWM), in bytes.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()))
        .map_or(0, |kb| kb * 1024)
}

/// A reader of `len` pseudo-random bytes that never holds more than its buffer.
struct PatternReader {
    left: u64,
    state: u64,
}

impl tokio::io::AsyncRead for PatternReader {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let n = (buf.remaining() as u64).min(self.left) as usize;
        let mut out = vec![0u8; n];
        for b in out.iter_mut() {
            self.state = self.state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            *b = (self.state >> 56) as u8;
        }
        buf.put_slice(&out);
        self.left -= n as u64;
        std::task::Poll::Ready(Ok(()))
    }
}

/// A writer that checks what it receives against the same pattern.
struct PatternChecker {
    state: u64,
    seen: u64,
    mismatches: u64,
}

impl tokio::io::AsyncWrite for PatternChecker {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        for &b in buf {
            self.state = self.state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if b != (self.state >> 56) as u8 {
                self.mismatches += 1;
            }
        }
        self.seen += buf.len() as u64;
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// One `size`-byte write and one `size`-byte read, each a single request,
/// under INTEGRITY_DATA with the drive key.
async fn transfer(addr: &str, drive_key_file: &std::path::Path, size: u64, partition: u64) -> anyhow::Result<()> {
    use nasd_client::{Auth, Credential};
    use nasd_proto::Protection;
    let text =
        std::fs::read_to_string(drive_key_file).with_context(|| format!("cannot read {}", drive_key_file.display()))?;
    let key = nasd_crypto::Key::from_hex(&text).context("the drive key file does not hold 64 hex digits")?;
    let mut c = DriveClient::connect(addr).await?;
    let protection = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);
    c.set_auth(Auth::new(Credential::Drive(key), protection));
    match c.create_partition(partition).await {
        Ok(()) => {}
        Err(e) if e.status() == Some(nasd_proto::Status::PartitionExists) => {}
        Err(e) => return Err(e.into()),
    }
    c.resize_partition(partition, size + (64 << 20)).await?;
    let (obj, _) = c.create(partition).await?;
    let rss_before = peak_rss_bytes();
    let region = [Region { offset: 0, length: size }];
    let t = Instant::now();
    c.write_from(partition, obj, &region, size, &mut PatternReader { left: size, state: 7 }).await?;
    c.flush(partition, &[obj]).await?;
    let w = t.elapsed();
    let mut reads = Vec::new();
    for (name, read_protection) in
        [("per-byte MAC", protection), ("Hash-and-MAC", protection.union(Protection::HASH_AND_MAC))]
    {
        let credential = c.auth().credential.clone();
        c.set_auth(Auth::new(credential, read_protection));
        let mut check = PatternChecker { state: 7, seen: 0, mismatches: 0 };
        let t = Instant::now();
        c.read_to(partition, obj, &region, &mut check).await?;
        reads.push((name, t.elapsed()));
        anyhow::ensure!(
            check.seen == size && check.mismatches == 0,
            "read back {} bytes with {} mismatches ({name})",
            check.seen,
            check.mismatches
        );
    }
    c.remove_partition(partition, true).await?;
    println!("| direction | bytes | requests | protection | MiB/s |");
    println!("|---|---|---|---|---|");
    println!("| write + flush | {} | 1 | INTEGRITY_ARGS + INTEGRITY_DATA | {:.0} |", human(size), mib_s(size, w));
    for (name, r) in reads {
        println!(
            "| read (verified byte for byte) | {} | 1 | INTEGRITY_ARGS + INTEGRITY_DATA, {name} | {:.0} |",
            human(size),
            mib_s(size, r)
        );
    }
    println!("client peak RSS: {} before the transfers, {} after", human(rss_before), human(peak_rss_bytes()));
    Ok(())
}
