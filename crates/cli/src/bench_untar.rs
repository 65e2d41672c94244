//! `nasd bench untar` (issue 14): Slice's name-intensive untar workload
//! (seed `004_ee4abfb56b0cb206.txt` §5) on one manager over SQLite and on
//! 1, 2 and 4 managers over one real PostgreSQL server, in one run.
//!
//! Each of `--clients` concurrent clients unpacks its own copy of one
//! deterministic tree of empty files, shaped like a source distribution,
//! under its own top directory, one request at a time as `tar` does. Per
//! file it sends what an NFS client sends for Slice's `tar x` (lookup,
//! access, create, getattr, lookup, setattr, setattr), as `nasd_fs` calls:
//!
//! 1. `lookup(parent, name)`, which must fail with `NOT_FOUND`;
//! 2. `getattr(parent)`: nasd has no ACCESS request (the manager checks
//!    permission on every request), so a client deciding access itself
//!    reads the directory's attributes, which is what this stands for;
//! 3. `CREATE` (exclusive, mode 0600);
//! 4. `getattr(file)`;
//! 5. `lookup(parent, name)`, which must name the created inode;
//! 6. `setattr` of the mode the archive records;
//! 7. `setattr` of the archive's access and modification times.
//!
//! A directory costs two requests (a lookup that fails, `MKDIR`). With
//! several managers, every added one joins the routing table (as `nasd
//! admin add-manager` does) before the clients log in, and clients route by
//! it (docs/ARCHITECTURE.md, "Routing by request class"): each request
//! naming a handle goes to the manager holding its site, the rest to the
//! client's home manager (spread round-robin). Under mkdir switching (the
//! default) the root is in site 0, which the first manager keeps, and a
//! client's top directory leaves it only with the redirect probability (1/N
//! for N managers), so most trees, and their requests, stay with the first
//! manager; `--routing name-hashing` (or a higher `--redirect-probability`)
//! spreads them. The table shows how the
//! requests spread (the busiest manager's share) and how many were refused
//! as `STALE_ROUTING` and sent again. A request the manager refuses as
//! `BUSY` (its transaction conflicted on every attempt, nothing changed) is
//! sent again, a bounded number of times, and counted in its own column: a
//! benchmark that hid them would flatter the rate. The managers' writers run
//! at once on PostgreSQL (issue 24); the conflicts they retry themselves
//! are counted from the server's log. With `--one-way-delay-us` the
//! managers reach the server through a proxy that adds that latency each
//! way (`nasd_meta::pg_server::DelayProxy`), as a database on another
//! machine would be reached. After each configuration every
//! client's tree is walked through the first manager and compared with the
//! archive, name by name, mode and times, so a broken run reports no rate.

use crate::daemons::{ClusterSetup, LocalCluster};
use crate::fs_cmd;
use anyhow::Context;
use nasd_fs::{FsClient, FsStatus, SetAttr};
use nasd_manager::{Location, ManagerConfig};
use nasd_meta::pg_server::{DelayProxy, PgServer};
use nasd_proto::fs::FileKind;
use nasd_proto::manager::{Handle, ManagerReply, ManagerRequest};
use nasd_proto::routing::RoutingPolicy;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most directories in the tree.
pub const DIRS_MAX: u32 = 100_000;
/// Most files in the tree.
pub const FILES_MAX: u32 = 1_000_000;
/// Most concurrent clients.
pub const CLIENTS_MAX: u32 = 64;
/// Deepest directory below a client's top directory.
const DEPTH_MAX: u32 = 12;
/// Requests per file (see the module documentation).
const REQUESTS_PER_FILE: u64 = 7;
/// Requests per directory.
const REQUESTS_PER_DIR: u64 = 2;
/// Managers on PostgreSQL measured, in order.
const PG_MANAGERS: [u32; 3] = [1, 2, 4];
/// Modification time of the archive's first entry (2000-01-01, Slice's
/// year); each later entry is one second younger.
const MTIME_BASE_NS: i64 = 946_684_800 * 1_000_000_000;
/// Most times one request is sent again after the manager answered `BUSY`
/// (its transaction conflicted on every attempt and was not committed).
const BUSY_RETRIES_MAX: u32 = 50;
/// Pause before sending a request again after `BUSY`.
const BUSY_PAUSE: Duration = Duration::from_millis(5);
/// Entries of a directory asked for per `READDIR` page while verifying.
const VERIFY_PAGE: u16 = 512;

/// `nasd bench untar` flags.
#[derive(clap::Args)]
pub struct UntarArgs {
    /// Directories in the tree each client unpacks (nested like a source
    /// tree below the client's top directory).
    #[arg(long, default_value_t = 200)]
    dirs: u32,
    /// Zero-length files in the tree each client unpacks.
    #[arg(long, default_value_t = 5_000)]
    files: u32,
    /// Concurrent clients, each unpacking its own copy of the tree into its
    /// own top directory, spread round-robin over the managers.
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Drives of each cluster (the files are empty: drives only fill the
    /// managers' pools of fresh objects).
    #[arg(long, default_value_t = 1)]
    drives: u32,
    /// Where the clusters keep their files [default: a temporary directory].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Latency added to the managers' link to PostgreSQL, each way, in
    /// microseconds: the managers reach the server through a proxy the
    /// benchmark starts, which holds every byte back this long
    /// (`nasd_meta::pg_server::DelayProxy`); 500 is a round trip of about
    /// 1 ms, a database on another machine of the same network. 0: no proxy.
    #[arg(long, default_value_t = 0)]
    one_way_delay_us: u64,
    /// Most metadata transactions that write each manager runs at once on
    /// PostgreSQL [default: `nasd_meta::WRITERS_MAX`].
    #[arg(long)]
    pg_writers: Option<usize>,
    /// Skip the SQLite baseline (its ratio column is then against the first
    /// PostgreSQL row).
    #[arg(long)]
    no_sqlite: bool,
    /// How new inodes choose their routing site (`[manager] routing`):
    /// `mkdir-switching` or `name-hashing`.
    #[arg(long, default_value = "mkdir-switching")]
    routing: RoutingPolicy,
    /// Under mkdir switching, the probability that a new directory leaves
    /// its parent's site (`[manager] redirect_probability`) [default: 1/N
    /// for N managers].
    #[arg(long)]
    redirect_probability: Option<f64>,
}

/// One entry of the archive, in the order `tar` meets it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Member {
    /// Directory `index` (into the tree's directories) in `parent`.
    Dir { index: usize, parent: Option<usize>, name: String },
    /// A zero-length file in `parent` (`None`: the top directory).
    File { parent: Option<usize>, name: String, mode: u32, mtime_ns: i64 },
}

/// The archive every client unpacks: members in `tar` order (a directory
/// before what it holds) and each directory's path below the top.
#[derive(Debug)]
struct Archive {
    members: Vec<Member>,
    dir_paths: Vec<String>,
    dirs: usize,
    files: usize,
}

/// xorshift64: the same tree on every run and machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Directory names of a source distribution (numbered to stay unique).
const DIR_NAMES: [&str; 12] =
    ["sys", "kern", "lib", "libc", "net", "dev", "include", "bin", "usr.bin", "contrib", "share", "tools"];
/// File suffixes, in rough source-tree proportions.
const FILE_SUFFIXES: [&str; 8] = ["c", "c", "c", "h", "h", "S", "mk", "8"];

impl Archive {
    /// A tree of `dirs` directories and `files` empty files: each new
    /// directory goes under a random earlier one or the top (a random
    /// recursive tree, a few levels deep like a source tree, at most
    /// [`DEPTH_MAX`]), files under directories with a skew towards the
    /// earlier, shallower ones; every 16th file is executable.
    fn new(dirs: u32, files: u32) -> Archive {
        let mut rng = Rng(0x05ee_d0f5_110e_u64);
        let (dirs, files) = (dirs as usize, files as usize);
        // parent and depth of each directory; `None` is the top (depth 0).
        let mut parent: Vec<Option<usize>> = Vec::with_capacity(dirs);
        let mut depth: Vec<u32> = Vec::with_capacity(dirs);
        for i in 0..dirs {
            let pick = rng.below(i as u64 + 1) as usize;
            let p = if pick == i || depth[pick] >= DEPTH_MAX { None } else { Some(pick) };
            depth.push(p.map_or(1, |p| depth[p] + 1));
            parent.push(p);
        }
        let dir_name = |i: usize| format!("{}{i}", DIR_NAMES[i % DIR_NAMES.len()]);
        // Files per directory slot: 0 is the top, d + 1 directory d.
        let mut files_in: Vec<Vec<usize>> = vec![Vec::new(); dirs + 1];
        for f in 0..files {
            let slots = dirs as u64 + 1;
            let bound = rng.below(slots) + 1;
            let slot = rng.below(bound) as usize;
            files_in[slot].push(f);
        }
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); dirs + 1];
        for (d, p) in parent.iter().enumerate() {
            children[p.map_or(0, |p| p + 1)].push(d);
        }
        let mut dir_paths = vec![String::new(); dirs];
        let mut members = Vec::with_capacity(dirs + files);
        // Depth first, as tar lists a tree: a directory, its files, then its subdirectories.
        let mut stack: Vec<Option<usize>> = vec![None];
        while let Some(at) = stack.pop() {
            let slot = at.map_or(0, |d| d + 1);
            if let Some(d) = at {
                let base = parent[d].map_or(String::new(), |p| dir_paths[p].clone());
                dir_paths[d] = format!("{base}/{}", dir_name(d));
                members.push(Member::Dir { index: d, parent: parent[d], name: dir_name(d) });
            }
            for &f in &files_in[slot] {
                let name = format!("f{f}.{}", FILE_SUFFIXES[f % FILE_SUFFIXES.len()]);
                let mode = if f % 16 == 15 { 0o755 } else { 0o644 };
                let mtime_ns = MTIME_BASE_NS + members.len() as i64 * 1_000_000_000;
                members.push(Member::File { parent: at, name, mode, mtime_ns });
            }
            stack.extend(children[slot].iter().rev().map(|&c| Some(c)));
        }
        Archive { members, dir_paths, dirs, files }
    }

    /// Requests one client sends to unpack it.
    fn requests(&self) -> u64 {
        self.files as u64 * REQUESTS_PER_FILE + self.dirs as u64 * REQUESTS_PER_DIR
    }

    /// What a client's tree must hold once unpacked: path below the top →
    /// (kind, mode, mtime; directories' times are not checked).
    fn expected(&self) -> BTreeMap<String, (FileKind, u32, Option<i64>)> {
        let mut out = BTreeMap::new();
        for m in &self.members {
            match m {
                Member::Dir { index, .. } => {
                    out.insert(self.dir_paths[*index].clone(), (FileKind::Dir, 0o755, None));
                }
                Member::File { parent, name, mode, mtime_ns } => {
                    let base = parent.map_or("", |p| self.dir_paths[p].as_str());
                    out.insert(format!("{base}/{name}"), (FileKind::File, *mode, Some(*mtime_ns)));
                }
            }
        }
        out
    }
}

/// One measured configuration.
struct Row {
    metadata: &'static str,
    managers: u32,
    elapsed: Duration,
    requests: u64,
    files: u64,
    /// `BUSY` answers retried (not counted in `requests`).
    busy: u64,
    /// `STALE_ROUTING` answers (each followed by a table fetch and a resend).
    stale: u64,
    /// The share of the manager requests the busiest manager received.
    busiest: f64,
    /// Serialization failures the PostgreSQL server logged in this
    /// configuration's database (each one a transaction the manager rolled
    /// back and ran again); `None` on SQLite.
    conflicts: Option<usize>,
}

impl Row {
    fn requests_per_sec(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    fn files_per_sec(&self) -> f64 {
        self.files as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs the benchmark.
pub async fn run(args: UntarArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.dirs <= DIRS_MAX, "--dirs {} is more than the {DIRS_MAX} this benchmark allows", args.dirs);
    anyhow::ensure!(
        (1..=FILES_MAX).contains(&args.files),
        "--files must be between 1 and {FILES_MAX}, not {}",
        args.files
    );
    anyhow::ensure!(
        (1..=CLIENTS_MAX).contains(&args.clients),
        "--clients must be between 1 and {CLIENTS_MAX}, not {}",
        args.clients
    );
    anyhow::ensure!((1..=16).contains(&args.drives), "--drives must be between 1 and 16, not {}", args.drives);
    if let Some(p) = args.redirect_probability {
        anyhow::ensure!((0.0..=1.0).contains(&p), "--redirect-probability must be between 0 and 1, not {p}");
    }
    let archive = Arc::new(Archive::new(args.dirs, args.files));
    let tmp = tempfile::tempdir_in(args.dir.as_deref().unwrap_or(&std::env::temp_dir()))?;
    println!(
        "untar: {} clients, each unpacking {} directories and {} empty files into its own top directory \
         ({} requests each: {REQUESTS_PER_FILE} per file, {REQUESTS_PER_DIR} per directory), one request at a \
         time per client; clients route by the routing table (home managers round-robin); {} drive(s)",
        args.clients,
        archive.dirs,
        archive.files,
        archive.requests(),
        args.drives
    );
    let server = tokio::task::spawn_blocking(PgServer::start)
        .await?
        .map_err(|e| anyhow::anyhow!("cannot start a PostgreSQL server for the benchmark: {e}"))?;
    let one_way = Duration::from_micros(args.one_way_delay_us);
    let proxy = if one_way.is_zero() {
        None
    } else {
        let upstream: std::net::SocketAddr = server.host_port().parse()?;
        Some(DelayProxy::start(upstream, one_way).map_err(|e| anyhow::anyhow!("{e}"))?)
    };
    println!(
        "  managers reach PostgreSQL {}; at most {} writing transaction(s) at once per manager",
        match &proxy {
            Some(p) => format!("through a proxy adding {one_way:?} each way ({})", p.addr()),
            None => "directly (loopback)".to_owned(),
        },
        args.pg_writers.unwrap_or(nasd_meta::WRITERS_MAX)
    );
    println!(
        "  routing: {}{}",
        args.routing.name(),
        match (args.routing, args.redirect_probability) {
            (RoutingPolicy::NameHashing, _) => String::new(),
            (_, Some(p)) => format!(", a new directory leaves its parent's site with probability {p}"),
            (_, None) => ", a new directory leaves its parent's site with probability 1/N for N managers".to_owned(),
        }
    );
    let result = async {
        let mut rows = Vec::new();
        if !args.no_sqlite {
            rows.push(measure(&tmp.path().join("sqlite"), None, 1, &args, &archive).await?);
        }
        for managers in PG_MANAGERS {
            let url = server.fresh_url();
            let db = url.rsplit('/').next().unwrap_or_default().to_owned();
            let url = match &proxy {
                Some(p) => format!("postgres://postgres@{}/{db}", p.addr()),
                None => url,
            };
            let dir = tmp.path().join(format!("postgres-{managers}"));
            let mut row = measure(&dir, Some(url), managers, &args, &archive).await?;
            row.conflicts = Some(server.serialization_failures(&db));
            rows.push(row);
        }
        Ok::<_, anyhow::Error>(rows)
    }
    .await;
    // Stopping the proxy and the server waits for them: not on a runtime worker.
    tokio::task::spawn_blocking(move || drop((proxy, server))).await?;
    let rows = result?;
    let base = &rows[0];
    println!(
        "  {:<12} {:>8} {:>9} {:>12} {:>10} {:>14} {:>6} {:>6} {:>9} {:>9}",
        "metadata",
        "managers",
        "seconds",
        "requests/s",
        "files/s",
        if args.no_sqlite { "vs PG ×1" } else { "vs SQLite ×1" },
        "busy",
        "stale",
        "busiest",
        "conflicts"
    );
    for r in &rows {
        println!(
            "  {:<12} {:>8} {:>9.2} {:>12.0} {:>10.0} {:>14.2} {:>6} {:>6} {:>8.0}% {:>9}",
            r.metadata,
            r.managers,
            r.elapsed.as_secs_f64(),
            r.requests_per_sec(),
            r.files_per_sec(),
            r.files_per_sec() / base.files_per_sec(),
            r.busy,
            r.stale,
            r.busiest * 100.0,
            r.conflicts.map_or("-".to_owned(), |n| n.to_string())
        );
    }
    println!("  (every client's tree checked afterwards through the first manager: names, kinds, modes, times;");
    println!("   busy: requests the manager refused as BUSY (its transaction conflicted on every attempt)");
    println!("   that the client sent again, at most {BUSY_RETRIES_MAX} times each; not counted in requests/s;");
    println!("   stale: requests refused as STALE_ROUTING and resent by the fetched table; busiest: the share");
    println!("   of all manager requests, logins and table fetches included, that the busiest manager received;");
    println!("   conflicts: serialization failures the PostgreSQL server logged for that configuration's database,");
    println!("   each a metadata transaction rolled back and run again)");
    Ok(())
}

/// One configuration: a cluster with its metadata at `url` (`None`: the
/// manager's own SQLite file) and `managers` managers, every client
/// unpacking the archive at once; then the trees checked.
async fn measure(
    dir: &Path,
    url: Option<String>,
    managers: u32,
    args: &UntarArgs,
    archive: &Arc<Archive>,
) -> anyhow::Result<Row> {
    let metadata = match &url {
        Some(u) => {
            let at = u.parse::<Location>().map_err(|e| anyhow::anyhow!("the server's URL: {e}"))?;
            Some(match args.pg_writers {
                Some(n) => at.with_writers_max(n),
                None => at,
            })
        }
        None => None,
    };
    let label = if url.is_some() { "PostgreSQL" } else { "SQLite" };
    std::fs::create_dir_all(dir)?;
    let setup = ClusterSetup {
        drives: args.drives,
        capacity: 256 << 20,
        throttle_bytes_per_sec: None,
        media_seek: None,
        manager: ManagerConfig {
            metadata,
            routing: args.routing,
            redirect_probability: args.redirect_probability,
            ..ManagerConfig::default()
        },
        own_runtimes: false,
        auth: false,
    };
    let mut cluster = LocalCluster::start_with(dir, setup).await?;
    let result = async {
        let mut sections = vec![cluster.client.clone()];
        for _ in 1..managers {
            sections.push(cluster.add_manager().await?);
        }
        if managers > 1 {
            join_routing(&sections).await?;
        }
        let mut clients = Vec::new();
        for c in 0..args.clients as usize {
            let section = &sections[c % sections.len()];
            let fs = fs_cmd::login(section, None).await.with_context(|| format!("client {c} logging in"))?;
            clients.push(fs);
        }
        // Top directories, made before the clock starts.
        let mut tops = Vec::new();
        for (c, fs) in clients.iter().enumerate() {
            tops.push(fs.mkdir_at(fs.root().await?.handle(), &top_name(c), 0o755).await?.handle());
        }
        let start = Arc::new(tokio::sync::Barrier::new(clients.len() + 1));
        let mut tasks = Vec::new();
        for (c, (fs, top)) in clients.iter().cloned().zip(tops).enumerate() {
            let (archive, start) = (archive.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                unpack(&fs, top, &archive).await.with_context(|| format!("client {c}"))
            }));
        }
        start.wait().await;
        let t = Instant::now();
        let (mut requests, mut busy) = (0, 0);
        for task in tasks {
            let (r, b) = task.await??;
            requests += r;
            busy += b;
        }
        let elapsed = t.elapsed();
        let mut sent = BTreeMap::<String, u64>::new();
        let mut stale = 0;
        for fs in &clients {
            let stats = fs.routing_stats();
            stale += stats.stale;
            for (addr, n) in stats.sent {
                *sent.entry(addr).or_default() += n;
            }
        }
        let total: u64 = sent.values().sum();
        let busiest = sent.values().max().map_or(1.0, |m| *m as f64 / total.max(1) as f64);
        for (c, fs) in clients.iter().enumerate() {
            let pinned = sections[c % sections.len()].manager.clone().unwrap_or_default();
            anyhow::ensure!(fs.current_manager() == pinned, "client {c} left its manager {pinned}");
        }
        verify(&clients[0], args.clients as usize, archive).await?;
        Ok::<_, anyhow::Error>(Row {
            metadata: label,
            managers,
            elapsed,
            requests,
            busy,
            stale,
            busiest,
            files: archive.files as u64 * args.clients as u64,
            conflicts: None,
        })
    }
    .await;
    let stopped = cluster.stop().await;
    let row = result.with_context(|| format!("{label} with {managers} manager(s)"))?;
    stopped?;
    Ok(row)
}

/// Puts every manager after the first in the routing table (as `nasd admin
/// add-manager` does), then waits until each holds the final table (they
/// read it at their maintenance passes), so no client starts on an old one.
async fn join_routing(sections: &[crate::config::ClientSection]) -> anyhow::Result<()> {
    let admin = fs_cmd::login(&sections[0], None).await.context("administrator logging in")?;
    let mut table = admin.get_routing().await.context("reading the routing table")?;
    for s in &sections[1..] {
        let addr = s.manager.clone().context("an added manager without an address")?;
        table = admin.set_routing(table.with_manager(&addr)?).await.context("adding a manager to the routing table")?;
    }
    for s in sections {
        let fs = fs_cmd::login(s, None).await.context("logging in to a manager")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while fs.get_routing().await?.version < table.version {
            anyhow::ensure!(Instant::now() < deadline, "a manager did not learn the routing table in 60 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(())
}

fn top_name(client: usize) -> String {
    format!("untar-{client}")
}

/// `$call` (a future of a `Result<_, FsError>`), sent again, at most
/// [`BUSY_RETRIES_MAX`] times, while the manager answers `BUSY`: a request
/// refused as busy changed nothing, so sending it again is safe. Each retry
/// is counted in `$busy` (and reported).
macro_rules! busy_retry {
    ($busy:expr, $call:expr) => {{
        let mut tries = 0u32;
        loop {
            match $call.await {
                Err(e) if e.status() == Some(FsStatus::Busy) && tries < BUSY_RETRIES_MAX => {
                    tries += 1;
                    $busy += 1;
                    tokio::time::sleep(BUSY_PAUSE).await;
                }
                r => break r,
            }
        }
    }};
}

/// Unpacks the archive under `top`, one request at a time; returns the
/// requests answered and the `BUSY` answers retried.
async fn unpack(fs: &FsClient, top: Handle, archive: &Archive) -> anyhow::Result<(u64, u64)> {
    let mut busy = 0u64;
    let mut dirs: Vec<Option<Handle>> = vec![None; archive.dirs];
    let mut requests = 0u64;
    let dir_of = |dirs: &[Option<Handle>], parent: Option<usize>| -> anyhow::Result<Handle> {
        match parent {
            None => Ok(top),
            Some(p) => dirs[p].context("a directory used before it was made (archive order)"),
        }
    };
    for m in &archive.members {
        match m {
            Member::Dir { index, parent, name } => {
                let at = dir_of(&dirs, *parent)?;
                absent(busy_retry!(busy, fs.lookup(at, name)), name)?;
                let e = busy_retry!(busy, fs.mkdir_at(at, name, 0o755)).with_context(|| format!("mkdir {name}"))?;
                dirs[*index] = Some(e.handle());
                requests += REQUESTS_PER_DIR;
            }
            Member::File { parent, name, mode, mtime_ns } => {
                let at = dir_of(&dirs, *parent)?;
                absent(busy_retry!(busy, fs.lookup(at, name)), name)?;
                busy_retry!(busy, fs.getattr(at)).with_context(|| format!("getattr of {name}'s directory"))?;
                let req = ManagerRequest::Create {
                    parent: at,
                    name: name.clone(),
                    mode: 0o600,
                    exclusive: true,
                    truncate: false,
                };
                let made = match busy_retry!(busy, fs.call(&req)).with_context(|| format!("create {name}"))? {
                    ManagerReply::Entry(e) => e,
                    other => anyhow::bail!("create {name}: unexpected reply {other:?}"),
                };
                let handle = made.handle();
                busy_retry!(busy, fs.getattr(handle)).with_context(|| format!("getattr {name}"))?;
                let found = busy_retry!(busy, fs.lookup(at, name))
                    .with_context(|| format!("lookup {name} after creating it"))?;
                anyhow::ensure!(found.attr.ino == made.attr.ino, "lookup {name} names another inode than the create");
                let chmod = SetAttr { mode: Some(*mode), ..SetAttr::default() };
                busy_retry!(busy, fs.setattr(handle, &chmod)).with_context(|| format!("chmod {name}"))?;
                let times = SetAttr { atime_ns: Some(*mtime_ns), mtime_ns: Some(*mtime_ns), ..SetAttr::default() };
                busy_retry!(busy, fs.setattr(handle, &times)).with_context(|| format!("set the times of {name}"))?;
                requests += REQUESTS_PER_FILE;
            }
        }
    }
    Ok((requests, busy))
}

/// A lookup of a name not made yet must fail with `NOT_FOUND`.
fn absent(r: Result<nasd_proto::manager::Entry, nasd_fs::FsError>, name: &str) -> anyhow::Result<()> {
    match r {
        Err(e) if e.status() == Some(FsStatus::NotFound) => Ok(()),
        Err(e) => Err(anyhow::anyhow!("lookup {name} before making it: {e}")),
        Ok(_) => Err(anyhow::anyhow!("{name} exists before it was unpacked")),
    }
}

/// Walks every client's top directory through `fs` and compares it with the
/// archive: the same names, kinds and modes, files empty with the archive's
/// times.
async fn verify(fs: &FsClient, clients: usize, archive: &Archive) -> anyhow::Result<()> {
    let expected = archive.expected();
    let root = fs.root().await?.handle();
    for c in 0..clients {
        let top = fs.lookup(root, &top_name(c)).await.with_context(|| format!("client {c}'s top directory"))?;
        let mut found = BTreeMap::new();
        let mut stack = vec![(String::new(), top.handle())];
        while let Some((path, dir)) = stack.pop() {
            let mut after = String::new();
            loop {
                let page = fs.readdir_page(dir, &after, VERIFY_PAGE).await?;
                for e in &page.entries {
                    let full = format!("{path}/{}", e.name);
                    let entry = e.entry.as_ref().with_context(|| format!("no attributes for {full}"))?;
                    let a = &entry.attr;
                    let mtime = (a.kind == FileKind::File).then_some(a.mtime_ns);
                    if a.kind == FileKind::File {
                        anyhow::ensure!(a.size == 0, "client {c}: {full} is not empty");
                    }
                    if a.kind == FileKind::Dir {
                        stack.push((full.clone(), entry.handle()));
                    }
                    anyhow::ensure!(found.len() < expected.len(), "client {c}: more names than the archive has");
                    found.insert(full, (a.kind, a.mode & 0o7777, mtime));
                }
                match page.entries.last() {
                    Some(last) if page.more => after = last.name.clone(),
                    _ => break,
                }
            }
        }
        if found != expected {
            let missing = expected.keys().find(|k| !found.contains_key(*k));
            let wrong = expected.iter().find(|(k, v)| found.get(*k).is_some_and(|f| f != *v));
            anyhow::bail!(
                "client {c}'s tree differs from the archive: {} names of {}; first missing {missing:?}; first \
                 different {wrong:?}",
                found.len(),
                expected.len()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_deterministic_and_lists_a_directory_before_its_contents() {
        let a = Archive::new(50, 700);
        assert_eq!(a.members, Archive::new(50, 700).members, "the same tree every run");
        assert_eq!((a.dirs, a.files), (50, 700));
        assert_eq!(a.members.len(), 750);
        assert_eq!(a.expected().len(), 750, "every path is unique");
        let mut made = [false; 50];
        for m in &a.members {
            let parent = match m {
                Member::Dir { parent, .. } | Member::File { parent, .. } => *parent,
            };
            assert!(parent.is_none_or(|p| made[p]), "{m:?} comes before its directory");
            if let Member::Dir { index, .. } = m {
                made[*index] = true;
            }
        }
        let deepest = a.dir_paths.iter().map(|p| p.matches('/').count()).max().unwrap();
        assert!((2..=DEPTH_MAX as usize).contains(&deepest), "nested, but not beyond DEPTH_MAX: {deepest}");
        assert_eq!(a.requests(), 700 * 7 + 50 * 2);
    }
}
