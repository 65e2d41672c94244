//! `nasd bench dsfs`: DSFS's Tables 3 and 4 and its chmod cost (§5.3,
//! §5.5) on loopback, in one run. Two clusters in this process, each an
//! authentication server, a manager and four drives as `nasd up` runs them,
//! differ only in `[manager] auth_scheme`: `capabilities` (the manager mints
//! a capability per component object on every open) and `pals` (it mints
//! none; the drives check the client's identity against the PAL the manager
//! pushed). The administrator logs in to both by identity.
//!
//! Measured at the client, each case's operations interleaved with the
//! others' in rounds (so a slow spell on the shared machine touches every
//! case alike), on files of one drive (4 KiB) and striped over four
//! (`stripe:4@4K`, 16 KiB: 4 KiB on each drive, as DSFS's trace runs read
//! 4 KiB per storage device):
//! - open at the manager: `GETATTR` asking for read access, beside the
//!   same `GETATTR` asking for none (the baseline: no authorization work);
//! - a 4 KiB-per-drive read and write through the striping engine — what
//!   the file-system client runs — with the layout (and capability) held
//!   (DSFS's "metadata known": the capability cache hit, or PALs), and
//!   fetched from the manager first (its "unknown": a capability cache
//!   miss, or PALs' layout fetch, which mints nothing);
//! - chmod (`SETATTR` mode), which answers only after the drives have the
//!   new access-control version and, under PALs, the new PAL;
//! - one user's read access granted to, then taken from, every file of the
//!   striped directory (DSFS §4.1's PAL collections): file by file
//!   (`SET_ACL` of each file: one PAL per component of every file) against
//!   once on the directory as a shared entry (one super PAL per drive), with
//!   the PAL writes the manager sent counted and checked.

use crate::daemons::{ClusterSetup, LocalCluster};
use crate::fs_cmd;
use anyhow::Context;
use nasd_client::{Auth, Credential};
use nasd_fs::{FsClient, Handle, Layout, OpenMode};
use nasd_login::auth_client::IdentityGrant;
use nasd_manager::ManagerConfig;
use nasd_proto::manager::{FileAccess, ManagerReply, ManagerRequest};
use nasd_proto::{AuthScheme, Protection};
use nasd_stripe::{DrivePool, StaticBinder, Striper, Target};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `nasd bench dsfs`.
#[derive(clap::Args)]
pub struct DsfsArgs {
    /// Files per scheme and layout (DSFS used 512).
    #[arg(long, default_value_t = 64)]
    files: u32,
    /// Timed operations per case.
    #[arg(long, default_value_t = 2_000)]
    ops: u32,
    /// Rounds the timed operations are interleaved in.
    #[arg(long, default_value_t = 10)]
    rounds: u32,
    /// Where the clusters keep their files [default: a temporary directory].
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

/// Lifetime of every capability in the run.
const CAPABILITY_LIFETIME: Duration = Duration::from_secs(3600);
/// Bytes each drive holds of a file, and every I/O moves per drive.
const PER_DRIVE: usize = 4096;
/// The layouts: one drive, and striped over four in 4 KiB units.
const LAYOUTS: [(&str, &str); 2] = [("stripe:1@4K", "1"), ("stripe:4@4K", "4")];
/// Protection of every drive request in every case (the client's default
/// for identities; capabilities get the same, so only authorization differs).
fn protection() -> Protection {
    Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA)
}

/// One cluster and what its cases use.
struct Side {
    name: &'static str,
    cluster: LocalCluster,
    fs: FsClient,
    /// Connections whose requests go under the administrator's identity
    /// where the partition accepts PALs (as `FsClient`'s).
    pool: Arc<DrivePool>,
    /// Per layout: the files' handles, and a striper per file built once
    /// from an open (the held layout and capabilities).
    files: Vec<Vec<(Handle, Striper)>>,
    /// Per layout: files only chmod touches.
    chmod_files: Vec<Vec<Handle>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `GETATTR` without access.
    Stat,
    /// `GETATTR` with read access.
    Open,
    /// Read with the held striper.
    ReadHeld,
    /// Write with the held striper.
    WriteHeld,
    /// `GETATTR` with read-write access, then read.
    ReadFetched,
    /// `GETATTR` with read-write access, then write.
    WriteFetched,
    /// `SETATTR` mode, alternating 0644 and 0640.
    Chmod,
}

struct Case {
    side: usize,
    layout: usize,
    op: Op,
    samples: Vec<u64>,
    /// Capabilities in the replies of its manager requests (per request).
    minted: u64,
    requests: u64,
}

/// The bytes of file `i` of layout `l`: distinct per file.
fn contents(l: usize, i: usize, len: usize) -> Vec<u8> {
    crate::bench_small::pattern((l as u64) << 32 | i as u64, len)
}

fn file_len(l: usize) -> usize {
    PER_DRIVE * if l == 0 { 1 } else { 4 }
}

/// Runs the benchmark.
pub async fn run(args: DsfsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.files > 0 && args.ops > 0 && args.rounds > 0, "--files, --ops and --rounds must be above 0");
    anyhow::ensure!(args.ops >= args.rounds, "--ops must be at least --rounds");
    let base = tempfile::tempdir_in(args.dir.as_deref().unwrap_or(&std::env::temp_dir()))?;
    let mut sides = Vec::new();
    for (name, scheme) in [("capabilities", AuthScheme::CAPABILITIES), ("pals", AuthScheme::PALS)] {
        sides.push(start(base.path(), name, scheme, args.files).await?);
    }
    let mut result = measure(&sides, &args).await;
    if result.is_ok() {
        result = acl_changes(&sides, &args).await;
    }
    for s in sides {
        drop(s.files);
        drop(s.fs);
        s.cluster.stop().await?;
    }
    result
}

async fn start(base: &std::path::Path, name: &'static str, scheme: AuthScheme, files: u32) -> anyhow::Result<Side> {
    let data = base.join(name);
    std::fs::create_dir_all(&data)?;
    let setup = ClusterSetup {
        drives: 4,
        capacity: 1 << 30,
        throttle_bytes_per_sec: None,
        media_seek: None,
        // Every byte on the drives (no small-file path through the manager).
        // Capabilities live an hour (DSFS's fine-grained lifetime), so a held one stays a hit.
        manager: ManagerConfig {
            auth_scheme: scheme,
            small_file_threshold: 0,
            read_lifetime: CAPABILITY_LIFETIME,
            write_lifetime: CAPABILITY_LIFETIME,
            rotate_interval: CAPABILITY_LIFETIME,
            ..ManagerConfig::default()
        },
        own_runtimes: false,
        auth: true,
    };
    let cluster = LocalCluster::start_with(&data, setup).await?;
    let (_, grant, user) = crate::auth_cmd::login_auth(&cluster.client, None, None).await?;
    let fs = fs_cmd::login_with_identity(&cluster.client, &grant, &user).await?;
    // The shared keys and the partition's scheme on every drive before the first request.
    fs.sync_identity_keys().await.context("installing the identity keys on the drives")?;
    let pool = Arc::new(DrivePool::with_identity(Some(identity_auth(&grant))));
    let (mut per_layout, mut chmod_files) = (Vec::new(), Vec::new());
    for (l, (layout, _)) in LAYOUTS.iter().enumerate() {
        let dir = format!("/l{l}");
        fs.mkdir(&dir, 0o755).await?;
        fs.set_layout(&dir, Some(Layout::parse(layout).map_err(|e| anyhow::anyhow!("{layout}: {e}"))?)).await?;
        let (mut held, mut chmods) = (Vec::new(), Vec::new());
        for i in 0..files as usize {
            let path = format!("{dir}/f{i:04}");
            let f = fs.create(&path, 0o644, true, false).await?;
            f.write_at(0, &contents(l, i, file_len(l))).await?;
            f.close().await?;
            let e = fs.walk(&path, OpenMode::None).await?;
            let access = open(&fs, e.handle(), OpenMode::ReadWrite).await?.0;
            held.push((e.handle(), striper(&pool, &access)?));
            let path = format!("{dir}/m{i:04}");
            fs.create(&path, 0o644, true, false).await?.close().await?;
            chmods.push(fs.walk(&path, OpenMode::None).await?.handle());
        }
        per_layout.push(held);
        chmod_files.push(chmods);
    }
    Ok(Side { name, cluster, fs, pool, files: per_layout, chmod_files })
}

fn identity_auth(grant: &IdentityGrant) -> Auth {
    Auth::new(Credential::Identity { data: grant.credential, key: grant.idkey.clone() }, protection())
}

/// `GETATTR` of `handle` asking for `open`: the file access, and how many
/// capabilities the reply carried.
async fn open(fs: &FsClient, handle: Handle, mode: OpenMode) -> anyhow::Result<(FileAccess, u64)> {
    match fs.call(&ManagerRequest::GetAttr { handle, open: mode }).await? {
        ManagerReply::Entry(e) => {
            let a = e.access.context("the manager gave no file access")?;
            let minted = a.components.iter().filter(|c| !c.token.is_empty()).count() as u64;
            Ok((a, minted))
        }
        other => anyhow::bail!("unexpected reply {other:?}"),
    }
}

fn striper(pool: &Arc<DrivePool>, access: &FileAccess) -> anyhow::Result<Striper> {
    let p = Protection::from_bits(access.min_protection).unwrap_or(Protection::INTEGRITY_ARGS).union(protection());
    let target = Target::from_access(access, p)?;
    Ok(Striper::new(pool.clone(), Arc::new(StaticBinder::new(target)?)))
}

async fn read_check(s: &Striper, l: usize, i: usize) -> anyhow::Result<()> {
    let len = file_len(l);
    let (bytes, _) = s.read(0, len as u64, len as u64).await?;
    anyhow::ensure!(bytes == contents(l, i, len), "file {i} of layout {l}: read back other bytes than were written");
    Ok(())
}

async fn write(s: &Striper, l: usize, i: usize) -> anyhow::Result<()> {
    let len = file_len(l);
    let out = s.write(0, &contents(l, i, len), len as u64).await?;
    anyhow::ensure!(out.missed.is_empty(), "file {i} of layout {l}: a component missed the write");
    Ok(())
}

/// One operation of `case` on file `i`; the time it took and the
/// capabilities its manager reply carried.
async fn once(side: &Side, case: &Case, i: usize, flip: bool) -> anyhow::Result<(u64, Option<u64>)> {
    let (l, fs) = (case.layout, &side.fs);
    let (handle, held) = &side.files[l][i];
    let t = Instant::now();
    let minted = match case.op {
        Op::Stat => {
            fs.getattr(*handle).await?;
            Some(0)
        }
        Op::Open => Some(open(fs, *handle, OpenMode::Read).await?.1),
        Op::ReadHeld => {
            read_check(held, l, i).await?;
            None
        }
        Op::WriteHeld => {
            write(held, l, i).await?;
            None
        }
        Op::ReadFetched | Op::WriteFetched => {
            let (access, minted) = open(fs, *handle, OpenMode::ReadWrite).await?;
            let s = striper(&side.pool, &access)?;
            if matches!(case.op, Op::ReadFetched) {
                read_check(&s, l, i).await?;
            } else {
                write(&s, l, i).await?;
            }
            Some(minted)
        }
        Op::Chmod => {
            let mode = if flip { 0o640 } else { 0o644 };
            let set = nasd_fs::SetAttr { mode: Some(mode), ..nasd_fs::SetAttr::default() };
            // Files of their own: a chmod revokes the capabilities held for its file.
            fs.setattr(side.chmod_files[l][i], &set).await?;
            Some(0)
        }
    };
    Ok((t.elapsed().as_nanos() as u64, minted))
}

async fn measure(sides: &[Side], args: &DsfsArgs) -> anyhow::Result<()> {
    let mut cases = Vec::new();
    for side in 0..sides.len() {
        for layout in 0..LAYOUTS.len() {
            for op in [Op::Stat, Op::Open, Op::ReadHeld, Op::WriteHeld, Op::ReadFetched, Op::WriteFetched, Op::Chmod] {
                cases.push(Case { side, layout, op, samples: Vec::new(), minted: 0, requests: 0 });
            }
        }
    }
    let files = args.files as usize;
    // Warm-up: connections to the manager and every drive, the drives' schemes learnt.
    for c in &cases {
        for i in 0..files.min(20) {
            once(&sides[c.side], c, i, false).await?;
        }
    }
    let per_round = (args.ops / args.rounds) as usize;
    let mut next = vec![0usize; cases.len()];
    for _ in 0..args.rounds {
        for (k, c) in cases.iter_mut().enumerate() {
            for _ in 0..per_round {
                let i = next[k] % files;
                let (ns, minted) = once(&sides[c.side], c, i, next[k] / files % 2 == 1).await?;
                next[k] += 1;
                c.samples.push(ns);
                if let Some(m) = minted {
                    c.minted += m;
                    c.requests += 1;
                }
            }
        }
    }
    report(sides, &mut cases, args, mint_cost());
    Ok(())
}

/// What the manager spends per capability it mints (`nasd_crypto::mint_capability`,
/// as `DriveHandle::mint` calls it), in µs: the "MAC per object per client" a
/// PALs-only open saves, alone.
fn mint_cost() -> f64 {
    const N: u64 = 200_000;
    let working = nasd_crypto::Key::random();
    let mut args = nasd_proto::CapabilityArgs {
        algorithm: nasd_client::MacAlgorithm::Blake3 as u8,
        min_protection: Protection::INTEGRITY_ARGS,
        key_version: 1,
        drive_id: [7; 16],
        partition: 1,
        object: 0,
        region: nasd_proto::CapabilityArgs::WHOLE_OBJECT,
        access_control_version: 1,
        rights: nasd_proto::rights::READ,
        map_epoch: 1,
        expiration_ns: u64::MAX / 2,
        audit_id: 0,
    };
    let t = Instant::now();
    for object in 0..N {
        args.object = object;
        std::hint::black_box(nasd_crypto::mint_capability(&working, &args, false));
    }
    t.elapsed().as_secs_f64() * 1e6 / N as f64
}

/// Mean and p99 in µs.
fn stats(samples: &mut [u64]) -> (f64, f64) {
    samples.sort_unstable();
    let mean = samples.iter().sum::<u64>() as f64 / samples.len() as f64 / 1000.0;
    let p99 = samples[((samples.len() as f64 - 1.0) * 0.99) as usize] as f64 / 1000.0;
    (mean, p99)
}

fn report(sides: &[Side], cases: &mut [Case], args: &DsfsArgs, mint_us: f64) {
    let find = |cases: &[Case], side: usize, layout: usize, op: Op| {
        cases.iter().position(|c| c.side == side && c.layout == layout && c.op == op).expect("every case runs")
    };
    let mut mean = vec![0.0; cases.len()];
    let mut p99 = vec![0.0; cases.len()];
    for (k, c) in cases.iter_mut().enumerate() {
        (mean[k], p99[k]) = stats(&mut c.samples);
    }
    let per_request = |c: &Case| if c.requests == 0 { 0.0 } else { c.minted as f64 / c.requests as f64 };
    println!(
        "two clusters in one process, each an authentication server, a manager (SQLite) and 4 drives on loopback, \
         differing only in [manager] auth_scheme ({}); the administrator logged in by identity; {} files per \
         layout, {} timed operations per case in {} interleaved rounds; every drive request under \
         INTEGRITY_ARGS + INTEGRITY_DATA; times at the client in µs",
        sides.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        args.files,
        (args.ops / args.rounds) * args.rounds,
        args.rounds
    );
    println!();
    println!(
        "Open at the manager (DSFS Table 3); baseline: GETATTR asking for no access, capabilities cluster, 1 drive"
    );
    println!(
        "(minting one capability alone, in this process: {mint_us:.2} µs — what an open saves per component under PALs)"
    );
    println!(
        "| scheme | drives | request | capabilities minted per request | mean µs | p99 µs | ratio to baseline (mean) | \
         ratio to the same cluster's GETATTR, same drives |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let base = mean[find(cases, 0, 0, Op::Stat)];
    for (side, s) in sides.iter().enumerate() {
        for (l, (_, drives)) in LAYOUTS.iter().enumerate() {
            for (op, what) in [(Op::Stat, "GETATTR, no access"), (Op::Open, "open (GETATTR, read access)")] {
                let k = find(cases, side, l, op);
                let own = mean[find(cases, side, l, Op::Stat)];
                println!(
                    "| {} | {drives} | {what} | {:.0} | {:.1} | {:.1} | {:.2} | {:.2} |",
                    s.name,
                    per_request(&cases[k]),
                    mean[k],
                    p99[k],
                    mean[k] / base,
                    mean[k] / own
                );
            }
        }
    }
    println!();
    println!(
        "Read and write, 4 KiB per drive (DSFS Table 4); baseline: capabilities with the capability held (cache hit), \
         same drives"
    );
    println!(
        "| scheme | drives | layout at the client | capability | write mean µs | write p99 µs | write ratio | \
         read mean µs | read p99 µs | read ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (l, (_, drives)) in LAYOUTS.iter().enumerate() {
        let (wb, rb) = (mean[find(cases, 0, l, Op::WriteHeld)], mean[find(cases, 0, l, Op::ReadHeld)]);
        for (side, s) in sides.iter().enumerate() {
            for (w, r, known) in
                [(Op::WriteHeld, Op::ReadHeld, "known"), (Op::WriteFetched, Op::ReadFetched, "fetched (GETATTR)")]
            {
                let cap = match (side, known) {
                    (0, "known") => "cache hit".to_string(),
                    (0, _) => format!("cache miss ({:.0} minted)", per_request(&cases[find(cases, side, l, w)])),
                    (_, "known") => "none (identity)".to_string(),
                    _ => format!("none (identity; {:.0} minted)", per_request(&cases[find(cases, side, l, w)])),
                };
                let (kw, kr) = (find(cases, side, l, w), find(cases, side, l, r));
                println!(
                    "| {} | {drives} | {known} | {cap} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} |",
                    s.name,
                    mean[kw],
                    p99[kw],
                    mean[kw] / wb,
                    mean[kr],
                    p99[kr],
                    mean[kr] / rb
                );
            }
        }
    }
    println!();
    println!(
        "chmod (DSFS §5.5): SETATTR mode, answered after every component's drive has the new access-control version \
         (and, under PALs, the new PAL); baseline: capabilities, same drives"
    );
    println!("| scheme | drives | mean µs | p99 µs | ratio to baseline (mean) |");
    println!("|---|---|---|---|---|");
    for (l, (_, drives)) in LAYOUTS.iter().enumerate() {
        let b = mean[find(cases, 0, l, Op::Chmod)];
        for (side, s) in sides.iter().enumerate() {
            let k = find(cases, side, l, Op::Chmod);
            println!("| {} | {drives} | {:.1} | {:.1} | {:.2} |", s.name, mean[k], p99[k], mean[k] / b);
        }
    }
}

/// How one user's read access reaches the files of a directory.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spread {
    /// `SET_ACL` of every file.
    PerFile,
    /// One `SET_ACL` of the directory, the entry shared.
    Shared,
}

/// The user the ACL changes grant and take away (no session uses it).
const GRANTEE: u32 = 4242;

/// Grants (or takes away) `GRANTEE`'s read access to every file of the
/// striped layout's directory by `spread`: the time it took and the PAL
/// writes the manager sent.
async fn acl_change(side: &Side, dir: Handle, spread: Spread, grant: bool) -> anyhow::Result<(u64, u64)> {
    let flags = if spread == Spread::Shared { nasd_fs::ACL_SHARED } else { 0 };
    let entries = if grant {
        vec![nasd_fs::AclEntry { who: nasd_fs::AclWho::User(GRANTEE), rights: nasd_fs::ACL_READ, flags }]
    } else {
        Vec::new()
    };
    let handles: Vec<Handle> = match spread {
        Spread::PerFile => side.files[1].iter().map(|(h, _)| *h).collect(),
        Spread::Shared => vec![dir],
    };
    let writes = side.cluster.manager().pal_writes();
    let t = Instant::now();
    for handle in handles {
        match side.fs.call(&ManagerRequest::SetAcl { handle, entries: entries.clone() }).await? {
            ManagerReply::Acl(_) => {}
            other => anyhow::bail!("unexpected reply {other:?}"),
        }
    }
    Ok((t.elapsed().as_nanos() as u64, side.cluster.manager().pal_writes() - writes))
}

/// The ACL-change cases: per scheme, file by file and shared, each granted
/// and taken away once per round, interleaved.
async fn acl_changes(sides: &[Side], args: &DsfsArgs) -> anyhow::Result<()> {
    let files = args.files as u64;
    let drives = LAYOUTS[1].1.parse::<u64>().expect("a drive count");
    let mut rows = Vec::new();
    for side in sides {
        let dir = side.fs.walk("/l1", OpenMode::None).await?.handle();
        let pals = side.name == "pals";
        for spread in [Spread::PerFile, Spread::Shared] {
            // Times and PAL writes of grants, then of take-aways.
            rows.push((side, dir, spread, pals, [Vec::new(), Vec::new()], [0u64; 2]));
        }
    }
    for _ in 0..args.rounds {
        for (side, dir, spread, pals, times, writes) in rows.iter_mut() {
            for (k, grant) in [true, false].into_iter().enumerate() {
                let (ns, sent) = acl_change(side, *dir, *spread, grant).await?;
                let expected = match (*pals, *spread) {
                    (false, _) => 0,
                    (true, Spread::PerFile) => files * drives,
                    (true, Spread::Shared) => drives,
                };
                anyhow::ensure!(sent == expected, "{} PAL writes for one change, expected {expected}", sent);
                times[k].push(ns);
                writes[k] = sent;
            }
        }
    }
    println!();
    println!(
        "A directory's ACL change over its {files} files (DSFS §4.1, PAL collections), striped over {drives} drives: \
         one user's read access granted, then taken away (which under capabilities also revokes every file's \
         capabilities: one SET_ACV per component); per file (SET_ACL of each file) or once on the directory as a \
         shared entry (one super PAL per drive); baseline: per file, same scheme and change"
    );
    println!("| scheme | change | how | PAL writes per change | mean ms | p99 ms | ratio to baseline (mean) |");
    println!("|---|---|---|---|---|---|---|");
    let mut baseline = [0.0; 2];
    for (side, _, spread, _, times, writes) in rows.iter_mut() {
        for (k, change) in ["grant", "take away"].into_iter().enumerate() {
            let (mean, p99) = stats(&mut times[k]);
            if *spread == Spread::PerFile {
                baseline[k] = mean;
            }
            let how = match spread {
                Spread::PerFile => "per file",
                Spread::Shared => "directory, shared",
            };
            println!(
                "| {} | {change} | {how} | {} | {:.2} | {:.2} | {:.3} |",
                side.name,
                writes[k],
                mean / 1000.0,
                p99 / 1000.0,
                mean / baseline[k]
            );
        }
    }
    Ok(())
}
