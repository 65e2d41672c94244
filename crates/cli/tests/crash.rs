//! Crash consistency of the real `nasd drive` binary.
//!
//! Each test runs the drive as a child process on a fresh data directory and,
//! three times over on the same directory:
//!
//! 1. drives a write-heavy workload from concurrent clients (each on its own
//!    connection): creates, unaligned single- and multi-region overwrites from a
//!    few bytes to ~300 KiB, fastcopies, `setattr(logical_size)` truncations and
//!    extensions, removes, frequent flushes of the objects touched and the
//!    occasional `flush_partition`;
//! 2. SIGKILLs the drive at a random moment in the middle of that workload;
//! 3. restarts it and checks every object against the model: an object whose
//!    flush was acknowledged exists, and its content is the image it had when
//!    that flush was sent or one of the states later operations took it
//!    through (for an object with no later operation: exactly the image);
//!    unflushed creations may be lost and unflushed removals undone, a
//!    removal made durable by `flush_partition` may not be; at most the
//!    in-flight creations may have left objects the clients never heard of;
//! 4. stops the drive cleanly (SIGTERM) and opens the data directory with
//!    [`Store::open`] (`verify_reads`), reading every object of every
//!    partition in full, so every stored block is checked against its stored
//!    digest, and compares the contents with the model again.
//!
//! The drive enforces security (its master key file in the data directory;
//! the test sets a drive key once). The workload's requests carry
//! `INTEGRITY_ARGS | INTEGRITY_DATA` (every write's data under incremental
//! MACs), and after each restart every object is read in full twice, under
//! the per-byte MAC and under Hash-and-MAC (whose tags are built from the
//! digests the drive stored before the kill), plus once from an unaligned
//! offset under Hash-and-MAC: any stale digest would show as a MAC failure
//! there, and any MAC failure fails the test ("zero stale digests, zero
//! false MAC failures").
//!
//! The model only has to be a lower bound: the content when a flush was sent
//! is all the flush guarantees, and every operation is atomic with respect to
//! commits, so what a crash leaves is one of the states in between.
//!
//! The schedule (kill delays, workload choices) comes from one seed, printed
//! at the start and on failure; `NASD_CRASH_SEED=N` replays it (thread timing
//! still varies from run to run).

mod common;

use common::{log_tail, Daemon};
use nasd_client::{Auth, Credential, DriveClient};
use nasd_crypto::Key;
use nasd_proto::well_known::{FIRST_USER_OBJECT, PARTITION_CONTENTS};
use nasd_proto::{AttrMask, Attributes, Protection, Region};
use nasd_store::{Store, StoreOptions, VecSink};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PARTITION: u64 = 1;
const CAPACITY: &str = "2GiB";
const CAPACITY_BYTES: u64 = 2 << 30;
const BLOCK_SIZE: &str = "4KiB";
const BLOCK_SIZE_BYTES: u32 = 4096;
const QUOTA_BYTES: u64 = 1 << 30;
/// Kill/restart cycles per test, on the same data directory.
const CYCLES: usize = 3;
/// Concurrent clients, each on its own connection with its own objects.
const WORKERS: usize = 3;
/// A worker creates objects up to this many ...
const CREATE_UP_TO: usize = 5;
/// ... and fastcopies up to this many.
const FASTCOPY_UP_TO: usize = 7;
/// Objects never grow past this (keeps the model small).
const OBJECT_BYTES_MAX: u64 = 768 << 10;
/// Most bytes one write carries.
const WRITE_BYTES_MAX: u64 = 300 << 10;
/// An object with this many operations since its last flush gets flushed.
const OPS_BEFORE_FLUSH: usize = 8;
/// Kill delay range after the workload starts, milliseconds.
const KILL_AFTER_MS: std::ops::RangeInclusive<u64> = 500..=2500;
/// How the workload's requests are protected: every write's data carries
/// incremental MACs the drive checks before it stores a chunk.
const WORKLOAD_PROTECTION: Protection = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);
/// Each object is read back under each of these after a restart.
const CHECK_PROTECTIONS: [Protection; 2] = [WORKLOAD_PROTECTION, WORKLOAD_PROTECTION.union(Protection::HASH_AND_MAC)];

/// A client of the test's drive, authorized by its drive key.
async fn connect(addr: SocketAddr, drive_key: &Key, protection: Protection) -> Result<DriveClient, String> {
    let mut c = DriveClient::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    c.set_auth(Auth::new(Credential::Drive(drive_key.clone()), protection));
    Ok(c)
}

/// Sets a fresh drive key on a new drive (authorized by the master key file
/// the drive created in its data directory).
async fn set_up_keys(addr: SocketAddr, data: &Path) -> Result<Key, String> {
    let master = nasd_crypto::read_key_file(&data.join("master.key")).map_err(|e| e.to_string())?;
    let drive_key = Key::random();
    let mut c = DriveClient::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    c.set_drive_key(&master, &drive_key).await.map_err(|e| format!("set_drive_key: {e}"))?;
    Ok(drive_key)
}

#[test]
fn crash_with_short_commit_interval() {
    run_crash_test("short-commit", 50);
}

#[test]
fn crash_with_long_commit_interval() {
    run_crash_test("long-commit", 60_000);
}

// ------------------------------------------------------------------- model

/// One operation as the model applies it to an object's state (`None`: the
/// object does not exist).
#[derive(Debug, Clone)]
enum Op {
    /// `create` (empty) or `fastcopy` (a copy of its source's content).
    Create(Vec<u8>),
    /// (offset, bytes) per region.
    Write(Vec<(u64, Vec<u8>)>),
    /// `setattr(logical_size)`: truncate or extend with zeros.
    Resize(u64),
    /// `remove`.
    Remove,
}

fn apply(state: &mut Option<Vec<u8>>, op: &Op) {
    match (op, state.as_mut()) {
        (Op::Create(content), None) => *state = Some(content.clone()),
        (Op::Write(parts), Some(content)) => {
            for (off, data) in parts {
                let (off, end) = (*off as usize, *off as usize + data.len());
                if content.len() < end {
                    content.resize(end, 0);
                }
                content[off..end].copy_from_slice(data);
            }
        }
        (Op::Resize(n), Some(content)) => content.resize(*n as usize, 0),
        (Op::Remove, Some(_)) => *state = None,
        (op, state) => panic!(
            "model bug: {} on an object that {}",
            describe_op(op),
            if state.is_some() { "exists" } else { "does not exist" }
        ),
    }
}

/// What the test knows about one object.
#[derive(Debug, Clone)]
struct ObjModel {
    /// Durable lower bound: the state when the last acknowledged flush that
    /// covered the object was sent, or as recovered after a restart; `None`
    /// for an object whose creation was never flushed.
    base: Option<Vec<u8>>,
    /// Operations issued since `base`, in order; the last may have been in
    /// flight at the kill.
    ops: Vec<Op>,
    /// `base` with every op applied.
    current: Option<Vec<u8>>,
}

impl ObjModel {
    fn created(content: Vec<u8>) -> Self {
        ObjModel { base: None, ops: vec![Op::Create(content.clone())], current: Some(content) }
    }

    fn recovered(content: Vec<u8>) -> Self {
        ObjModel { base: Some(content.clone()), ops: Vec::new(), current: Some(content) }
    }

    fn push(&mut self, op: Op) {
        apply(&mut self.current, &op);
        self.ops.push(op);
    }

    fn flushed(&mut self) {
        self.base = self.current.clone();
        self.ops.clear();
    }

    fn len(&self) -> u64 {
        self.current.as_ref().map_or(0, |c| c.len() as u64)
    }

    /// Which state since `base` (0 = base, k = after k ops) `got` equals.
    fn match_state(&self, got: Option<&[u8]>) -> Option<usize> {
        let mut state = self.base.clone();
        if state.as_deref() == got {
            return Some(0);
        }
        for (i, op) in self.ops.iter().enumerate() {
            apply(&mut state, op);
            if state.as_deref() == got {
                return Some(i + 1);
            }
        }
        None
    }

    /// How `got` differs from every allowed state.
    fn explain_mismatch(&self, got: Option<&[u8]>) -> String {
        let show = |s: Option<&[u8]>| s.map_or("absent".to_string(), |c| format!("{} bytes", c.len()));
        let mut out = format!(
            "found {}; durable image {}; {} later op(s): {}\n",
            show(got),
            show(self.base.as_deref()),
            self.ops.len(),
            self.ops.iter().map(describe_op).collect::<Vec<_>>().join(", ")
        );
        let mut state = self.base.clone();
        for i in 0..=self.ops.len() {
            if i > 0 {
                apply(&mut state, &self.ops[i - 1]);
            }
            let first_diff = match (state.as_deref(), got) {
                (Some(a), Some(b)) => {
                    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then_some(a.len().min(b.len())))
                }
                _ => None,
            };
            out += &format!("  state {i}: {}, first differing byte: {first_diff:?}\n", show(state.as_deref()));
        }
        out
    }
}

fn describe_op(op: &Op) -> String {
    match op {
        Op::Create(c) => format!("create({} bytes)", c.len()),
        Op::Write(parts) => {
            let r: Vec<String> = parts.iter().map(|(o, d)| format!("{o}+{}", d.len())).collect();
            format!("write[{}]", r.join(" "))
        }
        Op::Resize(n) => format!("resize({n})"),
        Op::Remove => "remove".into(),
    }
}

// ------------------------------------------------------------------ worker

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    writes: u64,
    bytes: u64,
    flushes: u64,
    partition_flushes: u64,
    creates: u64,
    fastcopies: u64,
    resizes: u64,
    removes: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.writes += o.writes;
        self.bytes += o.bytes;
        self.flushes += o.flushes;
        self.partition_flushes += o.partition_flushes;
        self.creates += o.creates;
        self.fastcopies += o.fastcopies;
        self.resizes += o.resizes;
        self.removes += o.removes;
    }
}

struct WorkerOut {
    objects: BTreeMap<u64, ObjModel>,
    /// Objects whose removal a `flush_partition` made durable.
    gone: BTreeSet<u64>,
    stats: Stats,
    /// The operation that was in flight (or being issued) when the drive died.
    in_flight: Option<&'static str>,
    /// A create or fastcopy was in flight: it may have left an object we never
    /// heard of.
    creation_in_flight: bool,
    /// A failure that the kill does not explain.
    error: Option<String>,
}

fn random_len(rng: &mut StdRng) -> u64 {
    match rng.gen_range(0..10) {
        0..=3 => rng.gen_range(1..=64),
        4..=6 => rng.gen_range(65..=16 << 10),
        7..=8 => rng.gen_range((16 << 10) + 1..=128 << 10),
        _ => rng.gen_range((128 << 10) + 1..=WRITE_BYTES_MAX),
    }
}

/// Random non-overlapping regions (1..=4, in random order) with random data.
fn random_write(rng: &mut StdRng, cur_len: u64) -> (Vec<Region>, Vec<u8>, Op) {
    let nregions = if rng.gen_bool(0.65) { 1 } else { rng.gen_range(2..=4) };
    let mut regions: Vec<Region> = Vec::new();
    let mut total = 0u64;
    for _ in 0..nregions {
        let len = random_len(rng).min(WRITE_BYTES_MAX - total);
        if len == 0 {
            break;
        }
        for _attempt in 0..8 {
            let max_off = (cur_len + (64 << 10)).min(OBJECT_BYTES_MAX - len);
            let off = rng.gen_range(0..=max_off);
            let r = Region { offset: off, length: len };
            if regions.iter().all(|q| r.end() <= q.offset || q.end() <= r.offset) {
                regions.push(r);
                total += len;
                break;
            }
        }
    }
    if regions.is_empty() {
        regions.push(Region { offset: rng.gen_range(0..=cur_len.min(OBJECT_BYTES_MAX - 1)), length: 1 });
        total = 1;
    }
    let mut data = vec![0u8; total as usize];
    rng.fill_bytes(&mut data);
    let mut parts = Vec::with_capacity(regions.len());
    let mut pos = 0usize;
    for r in &regions {
        parts.push((r.offset, data[pos..pos + r.length as usize].to_vec()));
        pos += r.length as usize;
    }
    (regions, data, Op::Write(parts))
}

/// Runs operations until the drive dies under it.
async fn worker(
    addr: SocketAddr,
    drive_key: Key,
    objects: BTreeMap<u64, ObjModel>,
    seed: u64,
    killed: Arc<AtomicBool>,
) -> WorkerOut {
    let mut out = WorkerOut {
        objects,
        gone: BTreeSet::new(),
        stats: Stats::default(),
        in_flight: None,
        creation_in_flight: false,
        error: None,
    };
    let result = worker_loop(addr, &drive_key, &mut out, seed).await;
    if let Err(e) = result {
        if !killed.load(Ordering::SeqCst) {
            out.error = Some(format!("{} failed before the kill: {e}", out.in_flight.unwrap_or("connect")));
        }
    }
    out
}

async fn worker_loop(addr: SocketAddr, drive_key: &Key, out: &mut WorkerOut, seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = connect(addr, drive_key, WORKLOAD_PROTECTION).await?;
    // Live objects with operations since the last acknowledged flush of them.
    let mut touched: BTreeSet<u64> = BTreeSet::new();
    loop {
        let live: Vec<u64> = out.objects.iter().filter(|(_, o)| o.current.is_some()).map(|(&id, _)| id).collect();
        let n = live.len();
        let overdue = touched.iter().any(|id| out.objects[id].ops.len() >= OPS_BEFORE_FLUSH);
        let pick = |rng: &mut StdRng| live[rng.gen_range(0..n)];
        if n == 0 || (n < CREATE_UP_TO && rng.gen_bool(0.06)) {
            out.in_flight = Some("create");
            out.creation_in_flight = true;
            let (id, attrs) = c.create(PARTITION).await.map_err(|e| e.to_string())?;
            out.creation_in_flight = false;
            if attrs.logical_size != 0 || out.objects.contains_key(&id) {
                return Err(format!("create returned object {id} of size {}", attrs.logical_size));
            }
            out.objects.insert(id, ObjModel::created(Vec::new()));
            touched.insert(id);
            out.stats.creates += 1;
        } else if !overdue && rng.gen_bool(0.015) {
            // Everything in the partition, removals included, is durable after this.
            out.in_flight = Some("flush_partition");
            c.flush_partition(PARTITION).await.map_err(|e| e.to_string())?;
            out.objects.retain(|&id, o| {
                o.flushed();
                if o.current.is_none() {
                    out.gone.insert(id);
                }
                o.current.is_some()
            });
            touched.clear();
            out.stats.partition_flushes += 1;
        } else if overdue || rng.gen_bool(0.08) {
            // Flushes only the live objects touched; a removal stays unflushed
            // (it may be undone by a crash) until a flush_partition or restart.
            let list: Vec<u64> = touched.iter().copied().collect();
            out.in_flight = Some("flush");
            c.flush(PARTITION, &list).await.map_err(|e| e.to_string())?;
            for id in &list {
                out.objects.get_mut(id).expect("flushed object is modelled").flushed();
            }
            touched.clear();
            out.stats.flushes += 1;
        } else if n < FASTCOPY_UP_TO && rng.gen_bool(0.03) {
            let src = pick(&mut rng);
            let content = out.objects[&src].current.clone().expect("live");
            out.in_flight = Some("fastcopy");
            out.creation_in_flight = true;
            let (id, attrs) = c.fastcopy(PARTITION, src).await.map_err(|e| e.to_string())?;
            out.creation_in_flight = false;
            if attrs.logical_size != content.len() as u64 || out.objects.contains_key(&id) {
                return Err(format!("fastcopy of {src} returned object {id} of size {}", attrs.logical_size));
            }
            out.objects.insert(id, ObjModel::created(content));
            touched.insert(id);
            out.stats.fastcopies += 1;
        } else if n > 2 && rng.gen_bool(0.02) {
            let id = pick(&mut rng);
            out.objects.get_mut(&id).expect("object").push(Op::Remove);
            touched.remove(&id);
            out.in_flight = Some("remove");
            c.remove(PARTITION, id).await.map_err(|e| e.to_string())?;
            out.stats.removes += 1;
        } else if rng.gen_bool(0.07) {
            let id = pick(&mut rng);
            let o = out.objects.get_mut(&id).expect("object");
            let cur = o.len();
            let size = if cur > 0 && rng.gen_bool(0.7) {
                rng.gen_range(0..cur)
            } else {
                (cur + rng.gen_range(1..=12_000)).min(OBJECT_BYTES_MAX)
            };
            o.push(Op::Resize(size));
            touched.insert(id);
            out.in_flight = Some("setattr(logical_size)");
            let attrs = Attributes { logical_size: size, ..Attributes::default() };
            let got = c.setattr(PARTITION, id, AttrMask::LOGICAL_SIZE, &attrs).await.map_err(|e| e.to_string())?;
            if got.logical_size != size {
                return Err(format!("setattr({id}, logical_size {size}) returned size {}", got.logical_size));
            }
            out.stats.resizes += 1;
        } else {
            let id = pick(&mut rng);
            let o = out.objects.get_mut(&id).expect("object");
            let (regions, data, op) = random_write(&mut rng, o.len());
            o.push(op);
            touched.insert(id);
            out.in_flight = Some("write");
            let written = c.write(PARTITION, id, &regions, &data).await.map_err(|e| e.to_string())?;
            if written != data.len() as u64 {
                return Err(format!("write of {} bytes to {id} acknowledged {written}", data.len()));
            }
            out.stats.writes += 1;
            out.stats.bytes += written;
        }
        out.in_flight = None;
    }
}

// ------------------------------------------------------------------- drive

/// The drive binary on `data` as a child process, committing every
/// `commit_interval_ms`, on a free loopback port.
fn start_drive(data: &Path, log: &Path, commit_interval_ms: u64) -> Daemon {
    let data = data.to_path_buf();
    Daemon::start("drive", &nasd_manager::files::parent_dir(log), log, None, move |addr| {
        let mut args: Vec<OsString> = vec!["drive".into(), "--data".into(), data.clone().into()];
        args.extend(["--listen".into(), addr.to_string().into()]);
        args.extend(["--capacity", CAPACITY, "--block-size", BLOCK_SIZE].map(OsString::from));
        args.extend(["--commit-interval-ms".into(), commit_interval_ms.to_string().into()]);
        args
    })
}

/// Prints the seed if the test panics.
struct SeedGuard {
    name: &'static str,
    seed: u64,
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "[{}] FAILED with seed {} (replay the schedule: NASD_CRASH_SEED={})",
                self.name, self.seed, self.seed
            );
        }
    }
}

// ---------------------------------------------------------------- checking

/// User objects of `PARTITION` as the drive lists them.
async fn list_objects(c: &mut DriveClient) -> Result<BTreeSet<u64>, String> {
    let len =
        c.getattr(PARTITION, PARTITION_CONTENTS).await.map_err(|e| format!("getattr(contents): {e}"))?.logical_size;
    let (_, bytes) = c
        .read(PARTITION, PARTITION_CONTENTS, &[Region { offset: 0, length: len }])
        .await
        .map_err(|e| format!("read(contents): {e}"))?;
    Ok(bytes
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .filter(|&id| id >= FIRST_USER_OBJECT)
        .collect())
}

async fn read_whole(c: &mut DriveClient, id: u64) -> Result<Vec<u8>, String> {
    let size = c.getattr(PARTITION, id).await.map_err(|e| format!("getattr({id}): {e}"))?.logical_size;
    read_from(c, id, 0, size).await
}

/// Reads bytes `offset..size` of object `id`, which must all be there.
async fn read_from(c: &mut DriveClient, id: u64, offset: u64, size: u64) -> Result<Vec<u8>, String> {
    if offset >= size {
        return Ok(Vec::new());
    }
    let length = size - offset;
    let protection = c.auth().protection;
    let (lengths, data) = c
        .read(PARTITION, id, &[Region { offset, length }])
        .await
        .map_err(|e| format!("read({id}, {offset}+{length}) under {protection:?}: {e}"))?;
    if lengths != [length] || data.len() as u64 != length {
        return Err(format!("read({id}) of {length} bytes returned {lengths:?} / {} bytes", data.len()));
    }
    Ok(data)
}

/// Reads object `id` in full under every protection of [`CHECK_PROTECTIONS`]
/// (one client each) and from an unaligned offset under Hash-and-MAC; every
/// read must verify and agree.
async fn read_checked(clients: &mut [DriveClient], id: u64) -> Result<Vec<u8>, String> {
    let first = read_whole(&mut clients[0], id).await?;
    for c in clients.iter_mut().skip(1) {
        let again = read_whole(c, id).await?;
        if again != first {
            return Err(format!("object {id} reads differently under {:?}", c.auth().protection));
        }
    }
    let hash_and_mac = clients.last_mut().expect("clients");
    let offset = (first.len() as u64 / 3) | 1;
    let tail = read_from(hash_and_mac, id, offset, first.len() as u64).await?;
    if first.get(offset as usize..).is_some_and(|t| t != tail.as_slice()) {
        return Err(format!("object {id}: unaligned Hash-and-MAC read from {offset} differs"));
    }
    Ok(first)
}

#[derive(Debug, Default)]
struct Recovery {
    /// Found at their latest issued state.
    latest: usize,
    /// Found at an earlier state than their latest (unflushed ops lost).
    rolled_back: usize,
    /// Absent, as allowed: unflushed creations lost or removals kept.
    absent: usize,
    /// Objects from creations whose reply the kill swallowed.
    orphans: usize,
}

/// Checks the restarted drive against the model, then makes the model what
/// was recovered (durable now: the drive loaded it from its durable state).
async fn check_recovery(
    addr: SocketAddr,
    drive_key: &Key,
    model: &mut BTreeMap<u64, ObjModel>,
    gone: &mut BTreeSet<u64>,
    orphans_max: usize,
) -> Result<Recovery, String> {
    let mut readers = Vec::new();
    for protection in CHECK_PROTECTIONS {
        readers.push(connect(addr, drive_key, protection).await.map_err(|e| format!("after restart: {e}"))?);
    }
    let mut c = connect(addr, drive_key, WORKLOAD_PROTECTION).await.map_err(|e| format!("after restart: {e}"))?;
    let present = list_objects(&mut c).await?;
    let mut rec = Recovery::default();
    let mut failures = Vec::new();
    let resurrected: Vec<&u64> = present.intersection(gone).collect();
    if !resurrected.is_empty() {
        failures.push(format!("objects whose removal was flushed exist again: {resurrected:?}"));
    }
    let mut found = BTreeMap::new();
    for (&id, obj) in model.iter() {
        let got = if present.contains(&id) { Some(read_checked(&mut readers, id).await?) } else { None };
        match obj.match_state(got.as_deref()) {
            Some(_) if got.is_none() => rec.absent += 1,
            Some(k) if k == obj.ops.len() => rec.latest += 1,
            Some(_) => rec.rolled_back += 1,
            None => failures.push(format!(
                "object {id}: state is none of those since its last acknowledged flush: {}",
                obj.explain_mismatch(got.as_deref())
            )),
        }
        found.insert(id, got);
    }
    let orphans: Vec<u64> =
        present.iter().copied().filter(|id| !model.contains_key(id) && !gone.contains(id)).collect();
    if orphans.len() > orphans_max {
        failures.push(format!(
            "{} objects nobody created: {orphans:?} (only {orphans_max} creations were in flight at the kill)",
            orphans.len()
        ));
    }
    if !failures.is_empty() {
        return Err(failures.join("\n"));
    }
    // The recovered state is the new durable baseline.
    for (id, got) in found {
        match got {
            Some(content) => {
                model.insert(id, ObjModel::recovered(content));
            }
            None => {
                model.remove(&id);
                gone.insert(id);
            }
        }
    }
    for &id in &orphans {
        // Readable (a create leaves an empty object, a fastcopy a copy of some
        // state of its source); then removed.
        read_checked(&mut readers, id).await?;
        c.remove(PARTITION, id).await.map_err(|e| format!("remove({id}): {e}"))?;
        gone.insert(id);
    }
    c.flush_partition(PARTITION).await.map_err(|e| format!("flush_partition: {e}"))?;
    rec.orphans = orphans.len();
    Ok(rec)
}

/// Opens the stopped drive's directory directly and reads every object of
/// every partition with digest verification; compares `PARTITION` with the model.
fn check_store(data: &Path, model: &BTreeMap<u64, ObjModel>) -> Result<(u64, u64), String> {
    let opts = StoreOptions {
        verify_reads: true,
        capacity_bytes: CAPACITY_BYTES,
        block_size: BLOCK_SIZE_BYTES,
        ..StoreOptions::default()
    };
    let store = Store::open(data, &opts).map_err(|e| format!("Store::open after a clean stop: {e}"))?;
    let (mut objects, mut bytes) = (0u64, 0u64);
    let mut seen = BTreeSet::new();
    for part in store.info().partitions {
        let p = part.partition;
        let len =
            store.getattr(p, PARTITION_CONTENTS).map_err(|e| format!("getattr({p}, contents): {e}"))?.logical_size;
        let mut sink = VecSink::default();
        store
            .read(p, PARTITION_CONTENTS, &[Region { offset: 0, length: len }], &mut sink)
            .map_err(|e| format!("read({p}, contents): {e}"))?;
        let ids: Vec<u64> = sink.data.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).collect();
        for id in ids.into_iter().filter(|&id| id > PARTITION_CONTENTS) {
            let size = store.getattr(p, id).map_err(|e| format!("getattr({p}, {id}): {e}"))?.logical_size;
            let mut sink = VecSink::default();
            if size > 0 {
                store
                    .read(p, id, &[Region { offset: 0, length: size }], &mut sink)
                    .map_err(|e| format!("partition {p} object {id}: reading {size} bytes with digest checks: {e}"))?;
            }
            if sink.data.len() as u64 != size {
                return Err(format!("partition {p} object {id}: read {} of {size} bytes", sink.data.len()));
            }
            objects += 1;
            bytes += size;
            if p == PARTITION && id >= FIRST_USER_OBJECT {
                seen.insert(id);
                match model.get(&id) {
                    None => return Err(format!("object {id} exists in the store but not in the model")),
                    Some(m) if m.current.as_deref() != Some(&sink.data[..]) => {
                        return Err(format!(
                            "object {id}: store content differs from what the drive served before the clean stop: {}",
                            m.explain_mismatch(Some(&sink.data))
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
    }
    let missing: Vec<&u64> = model.keys().filter(|id| !seen.contains(id)).collect();
    if !missing.is_empty() {
        return Err(format!("objects missing from the store after a clean stop: {missing:?}"));
    }
    Ok((objects, bytes))
}

// -------------------------------------------------------------------- test

fn run_crash_test(name: &'static str, commit_interval_ms: u64) {
    let seed: u64 = match std::env::var("NASD_CRASH_SEED") {
        Ok(s) => s.trim().parse().expect("NASD_CRASH_SEED must be a u64"),
        Err(_) => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
            t ^ (std::process::id() as u64).rotate_left(32) ^ commit_interval_ms.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        }
    };
    eprintln!("[{name}] seed {seed} (commit interval {commit_interval_ms} ms; replay with NASD_CRASH_SEED={seed})");
    let _guard = SeedGuard { name, seed };
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let log = dir.path().join("drive.log");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model: BTreeMap<u64, ObjModel> = BTreeMap::new();
    // Objects whose absence is durable (removal flushed, or absent at a restart).
    let mut gone: BTreeSet<u64> = BTreeSet::new();
    let mut total = Stats::default();
    let mut drive_key: Option<Key> = None;

    for cycle in 1..=CYCLES {
        // ---- run the workload and kill the drive in the middle of it
        let mut drive = start_drive(&data, &log, commit_interval_ms);
        let addr = drive.addr;
        if cycle == 1 {
            let key = rt
                .block_on(async {
                    let key = set_up_keys(addr, &data).await?;
                    let mut c = connect(addr, &key, WORKLOAD_PROTECTION).await?;
                    c.create_partition(PARTITION).await.map_err(|e| e.to_string())?;
                    c.resize_partition(PARTITION, QUOTA_BYTES).await.map_err(|e| e.to_string())?;
                    c.flush_partition(PARTITION).await.map_err(|e| e.to_string())?;
                    Ok::<_, String>(key)
                })
                .unwrap_or_else(|e| panic!("[{name}] seed {seed}: key and partition setup: {e}"));
            drive_key = Some(key);
        }
        let drive_key = drive_key.clone().expect("set up in cycle 1");
        let mut shares: Vec<BTreeMap<u64, ObjModel>> = vec![BTreeMap::new(); WORKERS];
        for (i, (id, obj)) in std::mem::take(&mut model).into_iter().enumerate() {
            shares[i % WORKERS].insert(id, obj);
        }
        let seeds: Vec<u64> = (0..WORKERS).map(|_| rng.gen()).collect();
        let delay = Duration::from_millis(rng.gen_range(KILL_AFTER_MS));
        let killed = Arc::new(AtomicBool::new(false));
        let outs: Vec<WorkerOut> = rt.block_on(async {
            let handles: Vec<_> = shares
                .into_iter()
                .zip(&seeds)
                .map(|(objs, &s)| tokio::spawn(worker(addr, drive_key.clone(), objs, s, killed.clone())))
                .collect();
            tokio::time::sleep(delay).await;
            killed.store(true, Ordering::SeqCst);
            drive.kill();
            let mut outs = Vec::new();
            for h in handles {
                let out = tokio::time::timeout(Duration::from_secs(30), h)
                    .await
                    .unwrap_or_else(|_| panic!("[{name}] seed {seed}: a client hung after the drive was killed"))
                    .expect("worker panicked");
                outs.push(out);
            }
            outs
        });
        let mut stats = Stats::default();
        let mut in_flight = Vec::new();
        let mut orphans_max = 0;
        for out in outs {
            if let Some(e) = out.error {
                panic!("[{name}] seed {seed} cycle {cycle}: {e}\ndrive log:\n{}", log_tail(&log));
            }
            stats.add(&out.stats);
            in_flight.extend(out.in_flight);
            orphans_max += out.creation_in_flight as usize;
            model.extend(out.objects);
            gone.extend(out.gone);
        }
        total.add(&stats);
        eprintln!(
            "[{name}] cycle {cycle}: SIGKILL after {} ms; acknowledged before it: {} writes ({:.1} MiB), {} flushes \
             + {} flush_partition, {} creates, {} fastcopies, {} setattr(logical_size), {} removes; in flight at the kill: {:?}",
            delay.as_millis(),
            stats.writes,
            stats.bytes as f64 / (1 << 20) as f64,
            stats.flushes,
            stats.partition_flushes,
            stats.creates,
            stats.fastcopies,
            stats.resizes,
            stats.removes,
            in_flight
        );
        assert!(
            stats.writes > 0 && stats.flushes > 0,
            "[{name}] seed {seed}: the workload made no progress before the kill"
        );

        // ---- restart and check what survived
        let mut drive = start_drive(&data, &log, commit_interval_ms);
        let rec =
            rt.block_on(check_recovery(drive.addr, &drive_key, &mut model, &mut gone, orphans_max)).unwrap_or_else(
                |e| panic!("[{name}] seed {seed} cycle {cycle}: after restart:\n{e}\ndrive log:\n{}", log_tail(&log)),
            );
        eprintln!(
            "[{name}] cycle {cycle}: restarted; checked {} objects (each read under the per-byte MAC and Hash-and-MAC): {} at their latest state, {} at an earlier state \
             since their last flush, {} absent (unflushed creation or removal); {} orphans of in-flight creations",
            rec.latest + rec.rolled_back + rec.absent,
            rec.latest,
            rec.rolled_back,
            rec.absent,
            rec.orphans
        );

        // ---- stop cleanly and check every stored block's digest directly
        drive.terminate();
        let (objects, bytes) = check_store(&data, &model).unwrap_or_else(|e| {
            panic!("[{name}] seed {seed} cycle {cycle}: direct store check:\n{e}\ndrive log:\n{}", log_tail(&log))
        });
        eprintln!("[{name}] cycle {cycle}: store reopened directly; {objects} objects, {bytes} bytes read with every block's digest verified");
    }
    eprintln!(
        "[{name}] passed in {:.1} s: {} cycles, {} writes, {} flushes acknowledged in all",
        started.elapsed().as_secs_f64(),
        CYCLES,
        total.writes,
        total.flushes
    );
}
