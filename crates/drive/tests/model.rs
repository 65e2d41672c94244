//! Model-based tests of the drive through its real network path.
//!
//! `drive_matches_model` serves a tempdir store with `nasd_drive::serve` on
//! 127.0.0.1:0, drives it with a `nasd_client::DriveClient`, and runs random
//! operation sequences (multi-region reads and writes with odd chunk sizes,
//! fastcopy, setattr, flush, getattr, remove, blocksrequired, partition
//! operations, write transactions, graceful restarts) against an in-memory model of what every
//! reply must be: statuses, attributes the model can predict, and every byte
//! read. `concurrent_clients_*` checks that writes from many connections are
//! atomic and ordered.

use nasd_client::{ClientError, DriveClient};
use nasd_drive::DriveConfig;
use nasd_proto::limits::FS_SPECIFIC_LEN;
use nasd_proto::well_known::{FIRST_OBJECT, FIRST_USER_OBJECT, PARTITION_CONTENTS, PARTITION_CONTROL};
use nasd_proto::{AttrMask, Attributes, PartitionControl, Region, Status};
use nasd_store::{Store, StoreOptions, OBJECTS_PER_PARTITION_MAX};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const BS: u64 = 4096;
const CAP_BLOCKS: u64 = 4096;
const BAD_OBJECT: u64 = 9_999;
/// Longest any single network step may take before the test fails.
const STEP: Duration = Duration::from_secs(20);

async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(STEP, f).await.expect("step timed out: the drive hung")
}

fn rg(offset: u64, length: u64) -> Region {
    Region { offset, length }
}

/// Deterministic bytes, never zero (so zeroed bytes are recognisable).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5DEE_CE66_D1CE_4E5B;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as u8) | 1
        })
        .collect()
}

/// A refusal's status; a transport or protocol failure fails the test.
fn st<T>(r: Result<T, ClientError>) -> Result<T, Status> {
    r.map_err(|e| e.status().unwrap_or_else(|| panic!("not a drive status: {e}")))
}

fn is_control(o: u64) -> bool {
    (1..=3).contains(&o)
}

// ------------------------------------------------------------------- drive

/// A drive served from a tempdir store, restartable on the same directory.
struct Drive {
    dir: tempfile::TempDir,
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<std::io::Result<()>>>,
    store: Weak<Store>,
    read_chunk: u32,
}

fn store_opts() -> StoreOptions {
    StoreOptions { block_size: BS as u32, capacity_bytes: CAP_BLOCKS * BS, ..StoreOptions::default() }
}

impl Drive {
    async fn start(read_chunk: u32) -> Drive {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut d = Drive {
            dir,
            addr: "127.0.0.1:1".parse().unwrap(),
            shutdown: None,
            server: None,
            store: Weak::new(),
            read_chunk,
        };
        d.serve().await;
        d
    }

    async fn serve(&mut self) {
        let store = Arc::new(open_store(self.dir.path()).await);
        self.store = Arc::downgrade(&store);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        self.addr = listener.local_addr().expect("local addr");
        let (tx, rx) = oneshot::channel::<()>();
        // No background commits: durability comes only from flush and shutdown.
        let config = DriveConfig {
            commit_interval: Duration::from_secs(3600),
            chunk_len: Some(self.read_chunk),
            ..DriveConfig::unauthenticated()
        };
        self.server = Some(tokio::spawn(nasd_drive::serve(listener, store, config, async move {
            let _ = rx.await;
        })));
        self.shutdown = Some(tx);
    }

    async fn client(&self, write_chunk: u32) -> DriveClient {
        let mut c = to(DriveClient::connect(self.addr)).await.expect("connect");
        c.set_chunk_len(write_chunk);
        c
    }

    /// Graceful shutdown (the drive commits), then the store is reopened from
    /// its directory and served again. The caller drops its clients first.
    async fn restart(&mut self) {
        self.stop().await;
        self.serve().await;
    }

    async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            to(server).await.expect("server task").expect("serve returns Ok");
        }
        // Connection tasks drop their handle on the store when they see EOF.
        to(async {
            while self.store.strong_count() > 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Opens the store, waiting out a previous instance whose last handle is
/// being dropped on another thread (its lock goes with its `Drop`).
async fn open_store(dir: &Path) -> Store {
    to(async {
        loop {
            match Store::open(dir, &store_opts()) {
                Err(nasd_store::StoreError::Locked(_)) => tokio::time::sleep(Duration::from_millis(2)).await,
                other => return other.expect("store opens"),
            }
        }
    })
    .await
}

// ------------------------------------------------------------------- model

#[derive(Clone, Debug)]
struct MObj {
    data: Vec<u8>,
    /// Logical block → a token naming the stored block (shared by copies).
    blocks: BTreeMap<u64, u64>,
    reserved: u64,
    copied: u64,
    acv: u64,
    nearby: u64,
    fs: u8,
    txn: Option<MTxn>,
}

/// An open write transaction: the bytes an abort brings back (kept whole,
/// independently of the undo) and the tokens it holds.
#[derive(Clone, Debug)]
struct MTxn {
    id: u64,
    old_data: Vec<u8>,
    undo: BTreeMap<u64, Option<u64>>,
}

impl MObj {
    fn new() -> Self {
        MObj { data: Vec::new(), blocks: BTreeMap::new(), reserved: 0, copied: 0, acv: 0, nearby: 0, fs: 0, txn: None }
    }
    /// Tokens the object references: its blocks and those its transaction holds.
    fn tokens(&self) -> impl Iterator<Item = u64> + '_ {
        self.blocks.values().copied().chain(self.txn.iter().flat_map(|t| t.undo.values().flatten().copied()))
    }
    fn slack(&self) -> u64 {
        self.reserved.saturating_sub(self.blocks.len() as u64)
    }
}

#[derive(Clone, Debug)]
struct MPart {
    quota_blocks: u64,
    objects: BTreeMap<u64, MObj>,
}

impl MPart {
    fn new() -> Self {
        let mut objects = BTreeMap::new();
        objects.insert(FIRST_OBJECT, MObj::new());
        MPart { quota_blocks: 0, objects }
    }
}

#[derive(Clone, Debug, Default)]
struct Model {
    parts: BTreeMap<u64, MPart>,
    refs: HashMap<u64, u32>,
    next_token: u64,
}

fn touched(regions: &[Region]) -> BTreeSet<u64> {
    regions.iter().flat_map(|r| r.offset / BS..=(r.end() - 1) / BS).collect()
}

fn overlapping(regions: &[Region]) -> bool {
    let mut v = regions.to_vec();
    v.sort();
    v.windows(2).any(|w| w[0].end() > w[1].offset)
}

/// Whether block `l` of an object holding `data` is all zeros (the drive
/// stores it as a hole).
fn zero_block(data: &[u8], l: u64) -> bool {
    let start = (l * BS) as usize;
    data.get(start..data.len().min(start + BS as usize)).is_none_or(|b| b.iter().all(|&x| x == 0))
}

fn apply(model: &mut Vec<u8>, regions: &[Region], data: &[u8]) {
    let mut pos = 0;
    for r in regions {
        let end = r.end() as usize;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[r.offset as usize..end].copy_from_slice(&data[pos..pos + r.length as usize]);
        pos += r.length as usize;
    }
}

fn expect_read(bytes: &[u8], regions: &[Region]) -> (Vec<u64>, Vec<u8>) {
    let size = bytes.len() as u64;
    let mut lengths = Vec::new();
    let mut data = Vec::new();
    for r in regions {
        let n = r.end().min(size).saturating_sub(r.offset);
        lengths.push(n);
        if n > 0 {
            data.extend_from_slice(&bytes[r.offset as usize..(r.offset + n) as usize]);
        }
    }
    (lengths, data)
}

impl Model {
    fn token(&mut self) -> u64 {
        self.next_token += 1;
        self.refs.insert(self.next_token, 1);
        self.next_token
    }
    fn unref(&mut self, t: u64) {
        let c = self.refs.get_mut(&t).expect("token referenced");
        *c -= 1;
        if *c == 0 {
            self.refs.remove(&t);
        }
    }
    fn part(&self, p: u64) -> Result<&MPart, Status> {
        self.parts.get(&p).ok_or(Status::NoSuchPartition)
    }
    fn obj(&self, p: u64, o: u64) -> Result<&MObj, Status> {
        self.part(p)?.objects.get(&o).ok_or(Status::NoSuchObject)
    }
    fn obj_mut(&mut self, p: u64, o: u64) -> &mut MObj {
        self.parts.get_mut(&p).unwrap().objects.get_mut(&o).unwrap()
    }
    fn charged(&self, p: u64) -> u64 {
        let part = &self.parts[&p];
        let phys: HashSet<u64> = part.objects.values().flat_map(MObj::tokens).collect();
        phys.len() as u64 + part.objects.values().map(MObj::slack).sum::<u64>()
    }
    fn quota_ok(&self, p: u64, extra: u64) -> Result<(), Status> {
        if self.charged(p) + extra > self.parts[&p].quota_blocks {
            Err(Status::QuotaExceeded)
        } else {
            Ok(())
        }
    }
    fn blocks_used(&self, o: &MObj) -> u64 {
        let share: f64 = o.tokens().map(|t| 1.0 / self.refs[&t] as f64).sum();
        share.round() as u64
    }
    fn take(&mut self, p: u64, o: u64) -> MObj {
        self.parts.get_mut(&p).unwrap().objects.remove(&o).unwrap()
    }
    fn put(&mut self, p: u64, o: u64, obj: MObj) {
        self.parts.get_mut(&p).unwrap().objects.insert(o, obj);
    }
    fn added(&self, obj: &MObj, touched: &BTreeSet<u64>) -> (u64, u64) {
        let (mut added, mut newly) = (0, 0);
        for l in touched {
            match obj.blocks.get(l) {
                None => {
                    added += 1;
                    newly += 1;
                }
                Some(t) if self.refs[t] > 1 => added += 1,
                // Held by the transaction, so not replaced one for one.
                Some(_) if obj.txn.as_ref().is_some_and(|x| !x.undo.contains_key(l)) => added += 1,
                Some(_) => {}
            }
        }
        (added, newly)
    }

    fn create(&self, p: u64, reserve: u64) -> Result<(), Status> {
        self.part(p)?;
        self.quota_ok(p, reserve)
    }

    fn write(&mut self, p: u64, o: u64, regions: &[Region], data: &[u8]) -> Result<u64, Status> {
        if overlapping(regions) {
            return Err(Status::RegionsOverlap);
        }
        if is_control(o) {
            return Err(Status::ReadOnlyObject);
        }
        let obj = self.obj(p, o)?;
        let t = touched(regions);
        let (added, newly) = self.added(obj, &t);
        self.quota_ok(p, added - newly.min(obj.slack()))?;
        let mut obj = self.take(p, o);
        apply(&mut obj.data, regions, data);
        for l in t {
            // A block the write leaves all zeros is a hole.
            let new = (!zero_block(&obj.data, l)).then(|| self.token());
            self.remap(&mut obj, l, new);
        }
        self.put(p, o, obj);
        Ok(data.len() as u64)
    }

    fn truncate(&mut self, p: u64, o: u64, size: u64) -> Result<(), Status> {
        let obj = self.obj(p, o)?;
        let old = obj.data.len() as u64;
        let first_dropped = size.div_ceil(BS);
        // A mapped tail block is rewritten with zeros past the new end.
        let zero_tail = size < old && old.min(first_dropped * BS) > size && obj.blocks.contains_key(&(size / BS));
        let tail_charge = zero_tail && !self.frees(obj, size / BS);
        self.quota_ok(p, tail_charge as u64)?;
        if size < old {
            let kept = obj.blocks.range(..first_dropped).count() as u64;
            let freed = obj.blocks.range(first_dropped..).filter(|(l, _)| self.frees(obj, **l)).count() as u64;
            let gain = obj.reserved.saturating_sub(kept) - obj.slack();
            if gain > freed {
                self.quota_ok(p, tail_charge as u64 + gain - freed)?;
            }
        }
        let mut obj = self.take(p, o);
        obj.data.resize(size as usize, 0);
        if zero_tail {
            let new = (!zero_block(&obj.data, size / BS)).then(|| self.token());
            self.remap(&mut obj, size / BS, new);
        }
        if size < old {
            let dropped: Vec<u64> = obj.blocks.range(first_dropped..).map(|(l, _)| *l).collect();
            for l in dropped {
                self.remap(&mut obj, l, None);
            }
        }
        self.put(p, o, obj);
        Ok(())
    }

    fn reserve(&mut self, p: u64, o: u64, blocks: u64) -> Result<(), Status> {
        let obj = self.obj(p, o)?;
        let old = obj.slack();
        let new = blocks.saturating_sub(obj.blocks.len() as u64);
        if new > old {
            self.quota_ok(p, new - old)?;
        }
        self.obj_mut(p, o).reserved = blocks;
        Ok(())
    }

    fn fastcopy(&mut self, p: u64, o: u64) -> Result<MObj, Status> {
        if is_control(o) {
            return Err(Status::ReadOnlyObject);
        }
        let src = self.obj(p, o)?.clone();
        if src.txn.is_some() {
            return Err(Status::TxnConflict);
        }
        self.quota_ok(p, src.slack())?;
        Ok(src)
    }

    fn install_copy(&mut self, p: u64, source: u64, src: MObj, id: u64) {
        for t in src.blocks.values() {
            *self.refs.get_mut(t).unwrap() += 1;
        }
        self.put(p, id, MObj { copied: source, ..src });
    }

    fn remove(&mut self, p: u64, o: u64) -> Result<(), Status> {
        if o <= FIRST_OBJECT {
            return Err(Status::ReadOnlyObject);
        }
        self.obj(p, o)?;
        let obj = self.take(p, o);
        for t in obj.tokens() {
            self.unref(t);
        }
        Ok(())
    }

    /// Whether replacing or dropping block `l` of `obj` frees its token.
    fn frees(&self, obj: &MObj, l: u64) -> bool {
        self.refs[&obj.blocks[&l]] == 1 && obj.txn.as_ref().is_none_or(|t| t.undo.contains_key(&l))
    }

    /// Maps block `l` to `new`; the first change under a transaction hands
    /// the old token to the undo instead of dropping it.
    fn remap(&mut self, obj: &mut MObj, l: u64, new: Option<u64>) {
        let old = match new {
            Some(t) => obj.blocks.insert(l, t),
            None => obj.blocks.remove(&l),
        };
        if let Some(txn) = obj.txn.as_mut() {
            match txn.undo.get(&l) {
                None => {
                    if old.is_some() || new.is_some() {
                        txn.undo.insert(l, old);
                    }
                    return;
                }
                Some(None) if new.is_none() => {
                    txn.undo.remove(&l);
                }
                Some(_) => {}
            }
        }
        if let Some(t) = old {
            self.unref(t);
        }
    }

    fn txn_target(&self, p: u64, o: u64, id: u64) -> Result<&MObj, Status> {
        if id == 0 {
            return Err(Status::BadArguments);
        }
        if is_control(o) {
            return Err(Status::ReadOnlyObject);
        }
        self.obj(p, o)
    }

    fn txn_begin(&mut self, p: u64, o: u64, id: u64) -> Result<(), Status> {
        match &self.txn_target(p, o, id)?.txn {
            Some(t) if t.id == id => return Ok(()),
            Some(_) => return Err(Status::TxnConflict),
            None => {}
        }
        let obj = self.obj_mut(p, o);
        obj.txn = Some(MTxn { id, old_data: obj.data.clone(), undo: BTreeMap::new() });
        Ok(())
    }

    fn txn_end(&mut self, p: u64, o: u64, id: u64, commit: bool) -> Result<bool, Status> {
        match &self.txn_target(p, o, id)?.txn {
            None => return Ok(false),
            Some(t) if t.id != id => return Err(Status::TxnConflict),
            Some(_) => {}
        }
        let mut obj = self.take(p, o);
        let t = obj.txn.take().unwrap();
        for (l, prev) in t.undo {
            if commit {
                if let Some(held) = prev {
                    self.unref(held);
                }
                continue;
            }
            let cur = match prev {
                Some(held) => obj.blocks.insert(l, held),
                None => obj.blocks.remove(&l),
            };
            if let Some(c) = cur {
                self.unref(c);
            }
        }
        if !commit {
            obj.data = t.old_data;
        }
        self.put(p, o, obj);
        Ok(true)
    }

    /// Open transactions of `p` above `after`, at most `max`: (object, id).
    fn txn_list(&self, p: u64, after: u64, max: u16) -> Result<Vec<(u64, u64)>, Status> {
        let part = self.part(p)?;
        Ok(part
            .objects
            .range(after.saturating_add(1)..)
            .filter_map(|(&o, mo)| mo.txn.as_ref().map(|t| (o, t.id)))
            .take(max as usize)
            .collect())
    }

    fn resize(&mut self, p: u64, quota: u64) -> Result<(), Status> {
        self.part(p)?;
        if quota < self.charged(p) * BS {
            return Err(Status::QuotaBelowUsage);
        }
        let others: u64 = self.parts.iter().filter(|(&id, _)| id != p).map(|(_, q)| q.quota_blocks * BS).sum();
        if others + quota > CAP_BLOCKS * BS {
            return Err(Status::NoSpace);
        }
        self.parts.get_mut(&p).unwrap().quota_blocks = quota / BS;
        Ok(())
    }

    fn create_partition(&mut self, p: u64) -> Result<(), Status> {
        if p == 0 {
            return Err(Status::BadArguments);
        }
        if self.parts.contains_key(&p) {
            return Err(Status::PartitionExists);
        }
        self.parts.insert(p, MPart::new());
        Ok(())
    }

    fn remove_partition(&mut self, p: u64, force: bool) -> Result<(), Status> {
        let part = self.part(p)?;
        let holds_data = part.objects.iter().any(|(&id, o)| id >= FIRST_USER_OBJECT || !o.data.is_empty());
        if holds_data && !force {
            return Err(Status::PartitionNotEmpty);
        }
        let part = self.parts.remove(&p).unwrap();
        for t in part.objects.values().flat_map(MObj::tokens) {
            self.unref(t);
        }
        Ok(())
    }

    fn control_bytes(&self, p: u64, o: u64) -> Result<Vec<u8>, Status> {
        let part = self.part(p)?;
        Ok(match o {
            PARTITION_CONTROL => PartitionControl {
                quota_bytes: part.quota_blocks * BS,
                used_bytes: self.charged(p) * BS,
                objects_in_use: part.objects.len() as u64 + 3,
                objects_max: OBJECTS_PER_PARTITION_MAX,
            }
            .encode(),
            PARTITION_CONTENTS => {
                [1, 2, 3].into_iter().chain(part.objects.keys().copied()).flat_map(u64::to_le_bytes).collect()
            }
            _ => unreachable!("only partition control and contents are modelled"),
        })
    }

    fn read(&self, p: u64, o: u64, regions: &[Region]) -> Result<(Vec<u64>, Vec<u8>), Status> {
        if overlapping(regions) {
            return Err(Status::RegionsOverlap);
        }
        if is_control(o) {
            return Ok(expect_read(&self.control_bytes(p, o)?, regions));
        }
        Ok(expect_read(&self.obj(p, o)?.data, regions))
    }

    /// The stored byte ranges from `offset` on: the blocks the model maps,
    /// each cut to `[offset, size)`, runs joined, at most `max`; and how far
    /// the answer goes.
    fn extents(&self, p: u64, o: u64, offset: u64, max: u16) -> Result<(Vec<Region>, u64), Status> {
        if max == 0 {
            return Err(Status::BadArguments);
        }
        if is_control(o) {
            let len = self.control_bytes(p, o)?.len() as u64;
            let all = if offset < len { vec![rg(offset, len - offset)] } else { vec![] };
            return Ok((all, len.max(offset)));
        }
        let obj = self.obj(p, o)?;
        let size = obj.data.len() as u64;
        let stored = |b: u64| obj.blocks.contains_key(&b);
        let mut out: Vec<Region> = Vec::new();
        let mut at = offset;
        while at < size {
            if !stored(at / BS) {
                at = (at / BS + 1) * BS;
                continue;
            }
            if out.len() == max as usize {
                return Ok((out, at));
            }
            let mut end = at;
            while end < size && stored(end / BS) {
                end = ((end / BS + 1) * BS).min(size);
            }
            out.push(rg(at, end - at));
            at = end;
        }
        Ok((out, size.max(offset)))
    }

    fn blocks_required(&self, p: u64, o: u64, regions: &[Region]) -> Result<(u64, u64), Status> {
        if overlapping(regions) {
            return Err(Status::RegionsOverlap);
        }
        if is_control(o) {
            return Err(Status::ReadOnlyObject);
        }
        let (added, _) = self.added(self.obj(p, o)?, &touched(regions));
        Ok((added, added))
    }

    #[track_caller]
    fn check_attrs(&self, p: u64, o: u64, a: &Attributes, what: &str) {
        let m = &self.parts[&p].objects[&o];
        let expect = (
            m.data.len() as u64,
            m.reserved.max(m.blocks.len() as u64),
            self.blocks_used(m),
            m.copied,
            m.acv,
            m.nearby,
            Some(m.fs),
            BS as u32,
        );
        let fs = Some(a.fs_specific[0]).filter(|&b| a.fs_specific.iter().all(|&x| x == b));
        let got = (
            a.logical_size,
            a.blocks_allocated,
            a.blocks_used,
            a.copied_object,
            a.access_control_version,
            a.nearby_object,
            fs,
            a.block_size,
        );
        assert_eq!(got, expect, "{what}: attributes of {p}/{o} (size, allocated, used, copied, acv, nearby, fs, bs)");
        assert!(
            a.create_time <= a.data_modify_time && a.create_time <= a.attribute_modify_time,
            "{what}: times before creation"
        );
    }
}

// --------------------------------------------------------------- operations

#[derive(Debug, Clone)]
enum Op {
    Create {
        p: u64,
        reserve: Option<u64>,
    },
    Write {
        p: u64,
        o: u8,
        regions: Vec<Region>,
        overlap: bool,
        seed: u64,
    },
    /// A write whose frame carries the wrong number of data bytes.
    WriteWrongLength {
        p: u64,
        o: u8,
        regions: Vec<Region>,
        delta: i8,
    },
    Read {
        p: u64,
        o: u8,
        regions: Vec<Region>,
        overlap: bool,
    },
    Truncate {
        p: u64,
        o: u8,
        size: u64,
    },
    ReserveAndTruncate {
        p: u64,
        o: u8,
        blocks: u64,
        size: Option<u64>,
    },
    SetMisc {
        p: u64,
        o: u8,
        acv: u64,
        nearby: u64,
        fs: u8,
    },
    SetDriveMaintained {
        p: u64,
        o: u8,
        bit: u8,
    },
    FastCopy {
        p: u64,
        o: u8,
    },
    Remove {
        p: u64,
        o: u8,
    },
    BlocksRequired {
        p: u64,
        o: u8,
        regions: Vec<Region>,
    },
    Extents {
        p: u64,
        o: u8,
        offset: u64,
        max: u16,
    },
    GetAttr {
        p: u64,
        o: u8,
    },
    Flush {
        p: u64,
        objects: Vec<u8>,
    },
    FlushPartition {
        p: u64,
    },
    Resize {
        p: u64,
        blocks: u64,
    },
    CreatePartition {
        p: u64,
    },
    RemovePartition {
        p: u64,
        force: bool,
    },
    TxnBegin {
        p: u64,
        o: u8,
        id: u64,
    },
    /// `open`: end a transaction that is open, under its own id.
    TxnEnd {
        p: u64,
        o: u8,
        id: u64,
        commit: bool,
        open: bool,
    },
    TxnList {
        p: u64,
        after: u8,
        max: u16,
    },
    Inquiry,
    Restart,
}

fn part() -> impl Strategy<Value = u64> {
    prop_oneof![10 => Just(1u64), 8 => Just(2u64), 2 => Just(3u64), 1 => Just(0u64)]
}

fn regions() -> impl Strategy<Value = Vec<Region>> {
    let gap = prop_oneof![Just(0u64), 0..64u64, 0..2 * BS];
    let len = prop_oneof![Just(BS), 1..256u64, 1..3 * BS];
    (prop::collection::vec((gap, len), 1..=5), any::<bool>()).prop_map(|(parts, rev)| {
        let mut pos = 0;
        let mut v = Vec::new();
        for (gap, length) in parts {
            pos += gap;
            v.push(Region { offset: pos, length });
            pos += length;
        }
        if rev {
            v.reverse();
        }
        v
    })
}

fn op() -> impl Strategy<Value = Op> {
    let o = any::<u8>;
    prop_oneof![
        3 => (part(), prop::option::weighted(0.2, 0..6u64)).prop_map(|(p, reserve)| Op::Create { p, reserve }),
        8 => (part(), o(), regions(), prop::bool::weighted(0.05), any::<u64>())
            .prop_map(|(p, o, regions, overlap, seed)| Op::Write { p, o, regions, overlap, seed }),
        1 => (part(), o(), regions(), prop_oneof![Just(-1i8), Just(1i8), -100..100i8])
            .prop_map(|(p, o, regions, delta)| Op::WriteWrongLength { p, o, regions, delta: if delta == 0 { 1 } else { delta } }),
        5 => (part(), o(), regions(), prop::bool::weighted(0.05)).prop_map(|(p, o, regions, overlap)| Op::Read { p, o, regions, overlap }),
        2 => (part(), o(), prop_oneof![0..8 * BS, (0..8u64).prop_map(|b| b * BS)]).prop_map(|(p, o, size)| Op::Truncate { p, o, size }),
        1 => (part(), o(), 0..6u64, prop::option::of(0..8 * BS))
            .prop_map(|(p, o, blocks, size)| Op::ReserveAndTruncate { p, o, blocks, size }),
        1 => (part(), o(), any::<u64>(), prop_oneof![Just(0u64), Just(FIRST_OBJECT), 16..40u64], any::<u8>())
            .prop_map(|(p, o, acv, nearby, fs)| Op::SetMisc { p, o, acv, nearby, fs }),
        1 => (part(), o(), prop::sample::select(vec![2u8, 5, 7, 8, 9])).prop_map(|(p, o, bit)| Op::SetDriveMaintained { p, o, bit }),
        2 => (part(), o()).prop_map(|(p, o)| Op::FastCopy { p, o }),
        1 => (part(), o()).prop_map(|(p, o)| Op::Remove { p, o }),
        2 => (part(), o(), regions()).prop_map(|(p, o, regions)| Op::BlocksRequired { p, o, regions }),
        1 => (part(), o(), prop_oneof![0..9 * BS, (0..9u64).prop_map(|b| b * BS)], prop_oneof![1 => Just(0u16), 6 => 1..4u16, 3 => Just(1024u16)])
            .prop_map(|(p, o, offset, max)| Op::Extents { p, o, offset, max }),
        1 => (part(), o()).prop_map(|(p, o)| Op::GetAttr { p, o }),
        1 => (part(), prop::collection::vec(o(), 0..4)).prop_map(|(p, objects)| Op::Flush { p, objects }),
        1 => part().prop_map(|p| Op::FlushPartition { p }),
        1 => (part(), prop_oneof![4 => 0..64u64, 1 => Just(CAP_BLOCKS)]).prop_map(|(p, blocks)| Op::Resize { p, blocks }),
        1 => part().prop_map(|p| Op::CreatePartition { p }),
        1 => (part(), prop::bool::weighted(0.15)).prop_map(|(p, force)| Op::RemovePartition { p, force }),
        2 => (part(), o(), txn_id()).prop_map(|(p, o, id)| Op::TxnBegin { p, o, id }),
        2 => (part(), o(), txn_id(), any::<bool>(), prop::bool::weighted(0.7))
            .prop_map(|(p, o, id, commit, open)| Op::TxnEnd { p, o, id, commit, open }),
        1 => (part(), o(), 0..4u16).prop_map(|(p, after, max)| Op::TxnList { p, after, max }),
        1 => Just(Op::Inquiry),
        1 => Just(Op::Restart),
    ]
}

/// Transaction identifiers: a few, so that ends find what began and
/// conflicts happen; 0 (invalid) now and then.
fn txn_id() -> impl Strategy<Value = u64> {
    prop_oneof![1 => Just(0u64), 12 => 1..4u64]
}

/// Maps a selector to an object: mostly existing ones, sometimes a control
/// object or one that does not exist.
fn pick(model: &Model, p: u64, sel: u8) -> u64 {
    match sel {
        250 => PARTITION_CONTENTS,
        251 => PARTITION_CONTROL,
        252.. => BAD_OBJECT,
        _ => match model.parts.get(&p) {
            Some(part) => *part.objects.keys().nth(sel as usize % part.objects.len()).unwrap(),
            None => FIRST_USER_OBJECT,
        },
    }
}

/// Identifiers handed out per partition (across restarts, never reused).
#[derive(Default)]
struct Ids {
    issued: BTreeMap<u64, u64>,
    exact: BTreeMap<u64, bool>,
}

impl Ids {
    #[track_caller]
    fn check(&mut self, p: u64, id: u64, model: &Model, what: &str) {
        let last = self.issued.get(&p).copied().unwrap_or(FIRST_USER_OBJECT - 1);
        assert!(id > last, "{what}: identifier {id} in partition {p} not above those issued before ({last})");
        if self.exact.get(&p).copied().unwrap_or(true) {
            assert_eq!(id, last + 1, "{what}: identifiers are sequential between restarts");
        }
        assert!(!model.parts[&p].objects.contains_key(&id), "{what}: identifier {id} in use");
        self.issued.insert(p, id);
        self.exact.insert(p, true);
    }
    /// A new incarnation of a partition starts again at the first identifier.
    fn reset(&mut self, p: u64) {
        self.issued.remove(&p);
        self.exact.remove(&p);
    }
}

static COVERAGE: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

fn count<T>(op: &Op, want: &Result<T, Status>) {
    let name = format!("{op:?}");
    let name = name.split([' ', '(']).next().unwrap_or("?").to_string();
    let key = match want {
        Ok(_) => format!("{name} ok"),
        Err(s) => format!("{name} {}", s.name()),
    };
    *COVERAGE.lock().unwrap().entry(key).or_default() += 1;
}

async fn read_all(c: &mut DriveClient, p: u64, o: u64) -> Vec<u8> {
    let size = to(c.getattr(p, o)).await.expect("getattr").logical_size;
    if size == 0 {
        return Vec::new();
    }
    let (lengths, data) = to(c.read(p, o, &[rg(0, size)])).await.expect("read");
    assert_eq!(lengths, vec![size]);
    data
}

async fn check_all(c: &mut DriveClient, model: &Model, what: &str) {
    let info = to(c.inquiry()).await.expect("inquiry");
    let listed: Vec<(u64, u64, u64, u64)> =
        info.partitions.iter().map(|p| (p.partition, p.quota_bytes, p.used_bytes, p.objects)).collect();
    let expect: Vec<(u64, u64, u64, u64)> = model
        .parts
        .iter()
        .map(|(&p, mp)| (p, mp.quota_blocks * BS, model.charged(p) * BS, mp.objects.len() as u64 + 3))
        .collect();
    assert_eq!(listed, expect, "{what}: inquiry partitions (id, quota, used, objects)");
    assert_eq!((info.block_size, info.capacity_bytes), (BS as u32, CAP_BLOCKS * BS));
    for (&p, mp) in &model.parts {
        for (&o, mo) in &mp.objects {
            let a = to(c.getattr(p, o)).await.expect("getattr");
            model.check_attrs(p, o, &a, what);
            assert!(read_all(c, p, o).await == mo.data, "{what}: data of {p}/{o}");
        }
        let got = to(c.txn_list(p, 0, 1024)).await.expect("txn_list");
        let got: Vec<(u64, u64)> = got.iter().map(|t| (t.object, t.txn)).collect();
        assert_eq!(got, model.txn_list(p, 0, 1024).unwrap(), "{what}: open transactions of partition {p}");
    }
}

struct Case {
    q1: u64,
    q2: u64,
    read_chunk: u32,
    write_chunk: u32,
    ops: Vec<Op>,
}

async fn run(case: Case) {
    let mut drive = Drive::start(case.read_chunk).await;
    let mut c = drive.client(case.write_chunk).await;
    let mut model = Model::default();
    for (p, q) in [(1, case.q1), (2, case.q2)] {
        to(c.create_partition(p)).await.unwrap();
        to(c.resize_partition(p, q * BS)).await.unwrap();
        model.create_partition(p).unwrap();
        model.resize(p, q * BS).unwrap();
    }
    let mut ids = Ids::default();
    for (i, op) in case.ops.iter().enumerate() {
        let what = format!("op {i} {op:?}");
        match op.clone() {
            Op::Create { p, reserve } => {
                let got = match reserve {
                    Some(n) => {
                        let a = Attributes { blocks_allocated: n, ..Attributes::default() };
                        to(c.create_with(p, AttrMask::BLOCKS_ALLOCATED, &a)).await
                    }
                    None => to(c.create(p)).await,
                };
                let want = model.create(p, reserve.unwrap_or(0));
                count(op, &want);
                match (st(got), want) {
                    (Ok((id, a)), Ok(())) => {
                        ids.check(p, id, &model, &what);
                        model.put(p, id, MObj { reserved: reserve.unwrap_or(0), ..MObj::new() });
                        model.check_attrs(p, id, &a, &what);
                    }
                    (got, want) => assert_eq!(got.map(drop), want, "{what}"),
                }
            }
            Op::Write { p, o, mut regions, overlap, seed } => {
                let o = pick(&model, p, o);
                if overlap {
                    let r = regions[0];
                    regions.push(Region { offset: r.offset + r.length / 2, length: r.length });
                }
                let data = pattern(seed, regions.iter().map(|r| r.length).sum::<u64>() as usize);
                let got = st(to(c.write(p, o, &regions, &data)).await);
                let want = model.write(p, o, &regions, &data);
                count(op, &want);
                assert_eq!(got, want, "{what}");
            }
            Op::WriteWrongLength { p, o, regions, delta } => {
                let o = pick(&model, p, o);
                let need: u64 = regions.iter().map(|r| r.length).sum();
                let len = (need as i64 + delta as i64).max(0) as u64;
                let data = pattern(7, len as usize);
                let got = st(to(c.write_from(p, o, &regions, len, &mut &data[..])).await);
                // The frame is checked before the store sees it: whatever the object.
                let want: Result<u64, Status> = Err(Status::DataLengthMismatch);
                count(op, &want);
                assert_eq!(got, want, "{what}");
            }
            Op::Read { p, o, mut regions, overlap } => {
                let o = pick(&model, p, o);
                if overlap {
                    regions.push(regions[0]);
                }
                let got = st(to(c.read(p, o, &regions)).await);
                let want = model.read(p, o, &regions);
                count(op, &want);
                assert!(
                    got == want,
                    "{what}: read differs (lengths {:?}, want {:?})",
                    got.as_ref().map(|g| &g.0),
                    want.as_ref().map(|w| &w.0)
                );
            }
            Op::Truncate { p, o, size } => {
                let o = pick(&model, p, o);
                let a = Attributes { logical_size: size, ..Attributes::default() };
                let got = st(to(c.setattr(p, o, AttrMask::LOGICAL_SIZE, &a)).await);
                let want = if is_control(o) { Err(Status::ReadOnlyObject) } else { model.truncate(p, o, size) };
                count(op, &want);
                match (got, want) {
                    (Ok(a), Ok(())) => model.check_attrs(p, o, &a, &what),
                    (got, want) => assert_eq!(got.map(drop), want, "{what}"),
                }
            }
            Op::ReserveAndTruncate { p, o, blocks, size } => {
                let o = pick(&model, p, o);
                let mut mask = AttrMask::BLOCKS_ALLOCATED;
                let mut a = Attributes { blocks_allocated: blocks, ..Attributes::default() };
                if let Some(size) = size {
                    mask = mask.union(AttrMask::LOGICAL_SIZE);
                    a.logical_size = size;
                }
                let got = st(to(c.setattr(p, o, mask, &a)).await);
                let saved = model.clone();
                let want = if is_control(o) {
                    Err(Status::ReadOnlyObject)
                } else {
                    model.reserve(p, o, blocks).and_then(|()| size.map_or(Ok(()), |size| model.truncate(p, o, size)))
                };
                if want.is_err() {
                    model = saved; // one request: all or nothing
                }
                count(op, &want);
                match (got, want) {
                    (Ok(a), Ok(())) => model.check_attrs(p, o, &a, &what),
                    (got, want) => assert_eq!(got.map(drop), want, "{what}"),
                }
            }
            Op::SetMisc { p, o, acv, nearby, fs } => {
                let o = pick(&model, p, o);
                let a = Attributes {
                    access_control_version: acv,
                    nearby_object: nearby,
                    fs_specific: [fs; FS_SPECIFIC_LEN],
                    fs_data_modify_time: 77,
                    ..Attributes::default()
                };
                let mask = AttrMask::ACCESS_CONTROL_VERSION
                    .union(AttrMask::NEARBY_OBJECT)
                    .union(AttrMask::FS_SPECIFIC)
                    .union(AttrMask::FS_DATA_MODIFY_TIME);
                let got = st(to(c.setattr(p, o, mask, &a)).await);
                let want = if is_control(o) { Err(Status::ReadOnlyObject) } else { model.obj(p, o).map(drop) };
                count(op, &want);
                match (got, want) {
                    (Ok(a), Ok(())) => {
                        let m = model.obj_mut(p, o);
                        (m.acv, m.nearby, m.fs) = (acv, nearby, fs);
                        model.check_attrs(p, o, &a, &what);
                        assert_eq!(a.fs_data_modify_time, 77, "{what}");
                        assert_eq!(a.fs_attribute_modify_time, a.attribute_modify_time, "{what}");
                    }
                    (got, want) => assert_eq!(got.map(drop), want, "{what}"),
                }
            }
            Op::SetDriveMaintained { p, o, bit } => {
                let o = pick(&model, p, o);
                let mask = AttrMask(1 << bit).union(AttrMask::ACCESS_CONTROL_VERSION);
                let a = Attributes { access_control_version: 1, ..Attributes::default() };
                let a = Attributes {
                    copied_object: 1,
                    blocks_used: 1,
                    create_time: 1,
                    data_modify_time: 1,
                    attribute_modify_time: 1,
                    ..a
                };
                let got = st(to(c.setattr(p, o, mask, &a)).await);
                // Refused before the object is even looked up.
                let want: Result<(), Status> =
                    Err(if is_control(o) { Status::ReadOnlyObject } else { Status::AttributeNotSettable });
                count(op, &want);
                assert_eq!(got.map(drop), want, "{what}");
            }
            Op::FastCopy { p, o } => {
                let o = pick(&model, p, o);
                let got = st(to(c.fastcopy(p, o)).await);
                let want = model.fastcopy(p, o);
                count(op, &want);
                match (got, want) {
                    (Ok((id, a)), Ok(src)) => {
                        ids.check(p, id, &model, &what);
                        model.install_copy(p, o, src, id);
                        model.check_attrs(p, id, &a, &what);
                        model.check_attrs(p, o, &to(c.getattr(p, o)).await.unwrap(), &what);
                    }
                    (got, want) => assert_eq!(got.map(drop), want.map(drop), "{what}"),
                }
            }
            Op::Remove { p, o } => {
                let o = pick(&model, p, o);
                let got = st(to(c.remove(p, o)).await);
                let want = model.remove(p, o);
                count(op, &want);
                assert_eq!(got, want, "{what}");
            }
            Op::BlocksRequired { p, o, regions } => {
                let o = pick(&model, p, o);
                let got = st(to(c.blocks_required(p, o, &regions)).await);
                let want = model.blocks_required(p, o, &regions);
                count(op, &want);
                assert_eq!(got, want, "{what}");
            }
            Op::Extents { p, o, offset, max } => {
                let o = pick(&model, p, o);
                let got = st(to(c.extents(p, o, offset, max)).await);
                let want = model.extents(p, o, offset, max);
                count(op, &want);
                assert_eq!(got, want, "{what}");
            }
            Op::GetAttr { p, o } => {
                let o = pick(&model, p, o);
                let got = st(to(c.getattr(p, o)).await);
                if is_control(o) {
                    let want = model.control_bytes(p, o).map(|b| b.len() as u64);
                    count(op, &want);
                    assert_eq!(got.map(|a| a.logical_size), want, "{what}");
                } else {
                    let want = model.obj(p, o).map(drop);
                    count(op, &want);
                    match (got, want) {
                        (Ok(a), Ok(())) => model.check_attrs(p, o, &a, &what),
                        (got, want) => assert_eq!(got.map(drop), want, "{what}"),
                    }
                }
            }
            Op::Flush { p, objects } => {
                let objects: Vec<u64> = objects.iter().map(|&s| pick(&model, p, s)).collect();
                let got = st(to(c.flush(p, &objects)).await);
                let want = model.part(p).map(drop).and_then(|()| {
                    objects.iter().filter(|&&o| !is_control(o)).try_for_each(|&o| model.obj(p, o).map(drop))
                });
                count(op, &want);
                assert_eq!(got, want, "{what}");
            }
            Op::FlushPartition { p } => {
                let got = st(to(c.flush_partition(p)).await);
                let want = model.part(p).map(drop);
                count(op, &want);
                assert_eq!(got, want, "{what}");
            }
            Op::Resize { p, blocks } => {
                let got = st(to(c.resize_partition(p, blocks * BS)).await);
                let want = model.resize(p, blocks * BS);
                count(op, &want);
                assert_eq!(got, want, "{what}");
            }
            Op::CreatePartition { p } => {
                let got = st(to(c.create_partition(p)).await);
                let want = model.create_partition(p);
                count(op, &want);
                assert_eq!(got, want, "{what}");
                if want.is_ok() {
                    ids.reset(p);
                }
            }
            Op::RemovePartition { p, force } => {
                let got = st(to(c.remove_partition(p, force)).await);
                let want = model.remove_partition(p, force);
                count(op, &want);
                assert_eq!(got, want, "{what}");
            }
            Op::TxnBegin { p, o, id } => {
                let o = pick(&model, p, o);
                let got = st(to(c.txn_begin(p, o, id)).await);
                let want = model.txn_begin(p, o, id);
                count(op, &want);
                assert_eq!(got, want, "{what}");
            }
            Op::TxnEnd { p, o: sel, mut id, commit, open } => {
                let mut o = pick(&model, p, sel);
                let open_txns = model.txn_list(p, 0, u16::MAX).unwrap_or_default();
                if open && !open_txns.is_empty() {
                    (o, id) = open_txns[sel as usize % open_txns.len()];
                }
                let got = st(to(c.txn_end(p, o, id, commit)).await);
                let want = model.txn_end(p, o, id, commit);
                count(op, &want);
                if want == Ok(true) {
                    let key = if commit { "TxnEnd committed" } else { "TxnEnd aborted" };
                    *COVERAGE.lock().unwrap().entry(key.into()).or_default() += 1;
                }
                assert_eq!(got, want, "{what}");
                if got.is_ok() {
                    model.check_attrs(p, o, &to(c.getattr(p, o)).await.unwrap(), &what);
                    assert!(
                        read_all(&mut c, p, o).await == model.obj(p, o).unwrap().data,
                        "{what}: data after the end"
                    );
                }
            }
            Op::TxnList { p, after, max } => {
                let after = pick(&model, p, after);
                let got = st(to(c.txn_list(p, after, max)).await);
                let want = model.txn_list(p, after, max);
                count(op, &want);
                assert_eq!(got.map(|v| v.iter().map(|t| (t.object, t.txn)).collect::<Vec<_>>()), want, "{what}");
            }
            Op::Inquiry => {
                count(op, &Ok::<_, Status>(()));
                let info = to(c.inquiry()).await.expect("inquiry");
                let listed: Vec<u64> = info.partitions.iter().map(|p| p.partition).collect();
                assert_eq!(listed, model.parts.keys().copied().collect::<Vec<_>>(), "{what}");
            }
            Op::Restart => {
                count(op, &Ok::<_, Status>(()));
                drop(c);
                drive.restart().await;
                c = drive.client(case.write_chunk).await;
                // A graceful shutdown commits: everything is still there.
                for e in ids.exact.values_mut() {
                    *e = false;
                }
                check_all(&mut c, &model, &what).await;
            }
        }
        // Per-partition charges after every operation.
        let info = to(c.inquiry()).await.expect("inquiry");
        for pi in &info.partitions {
            let p = pi.partition;
            assert_eq!(
                (pi.quota_bytes, pi.used_bytes),
                (model.parts[&p].quota_blocks * BS, model.charged(p) * BS),
                "{what}: partition {p} quota and usage"
            );
        }
    }
    check_all(&mut c, &model, "end").await;
    drop(c);
    drive.stop().await;
    // And the store on disk, reopened directly, agrees.
    let s = open_store(drive.path()).await;
    let info = s.info();
    let listed: Vec<(u64, u64, u64)> =
        info.partitions.iter().map(|p| (p.partition, p.quota_bytes, p.used_bytes)).collect();
    let expect: Vec<(u64, u64, u64)> =
        model.parts.iter().map(|(&p, mp)| (p, mp.quota_blocks * BS, model.charged(p) * BS)).collect();
    assert_eq!(listed, expect, "after the final shutdown");
}

#[test]
fn drive_matches_model() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // Deterministic by default; NASD_MODEL_CASES / NASD_MODEL_SEED explore further.
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let config = Config {
        cases: env("NASD_MODEL_CASES").unwrap_or(64) as u32,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(env("NASD_MODEL_SEED").unwrap_or(0x6e61_7364_0002)),
        max_shrink_iters: 1_000,
        max_shrink_time: 120_000,
        ..Config::default()
    };
    let strategy = (
        prop_oneof![1 => Just(0u64), 6 => 4..48u64, 1 => Just(256u64)],
        prop_oneof![1 => Just(0u64), 6 => 4..48u64],
        prop_oneof![Just(512u32), 512..9000u32, Just(64 * 1024)],
        prop_oneof![Just(512u32), 512..9000u32, Just(256 * 1024)],
        prop::collection::vec(op(), 40..80),
    );
    let mut runner = TestRunner::new(config);
    let result = runner.run(&strategy, |(q1, q2, read_chunk, write_chunk, ops)| {
        rt.block_on(run(Case { q1, q2, read_chunk, write_chunk, ops }));
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let coverage = COVERAGE.lock().unwrap();
    eprintln!("drive model coverage: {coverage:#?}");
    for key in [
        "Create ok",
        "Create QUOTA_EXCEEDED",
        "Create NO_SUCH_PARTITION",
        "Write ok",
        "Write QUOTA_EXCEEDED",
        "Write REGIONS_OVERLAP",
        "Write READ_ONLY_OBJECT",
        "Write NO_SUCH_OBJECT",
        "WriteWrongLength DATA_LENGTH_MISMATCH",
        "Read ok",
        "Read REGIONS_OVERLAP",
        "Truncate ok",
        "ReserveAndTruncate ok",
        "ReserveAndTruncate QUOTA_EXCEEDED",
        "SetMisc ok",
        "SetDriveMaintained ATTRIBUTE_NOT_SETTABLE",
        "FastCopy ok",
        "Remove ok",
        "Remove READ_ONLY_OBJECT",
        "BlocksRequired ok",
        "Extents ok",
        "Extents BAD_ARGUMENTS",
        "GetAttr ok",
        "Flush ok",
        "Flush NO_SUCH_OBJECT",
        "FlushPartition ok",
        "FlushPartition NO_SUCH_PARTITION",
        "Resize ok",
        "Resize QUOTA_BELOW_USAGE",
        "Resize NO_SPACE",
        "CreatePartition ok",
        "CreatePartition PARTITION_EXISTS",
        "CreatePartition BAD_ARGUMENTS",
        "RemovePartition ok",
        "RemovePartition PARTITION_NOT_EMPTY",
        "FastCopy TXN_CONFLICT",
        "TxnBegin ok",
        "TxnBegin TXN_CONFLICT",
        "TxnBegin BAD_ARGUMENTS",
        "TxnEnd ok",
        "TxnEnd TXN_CONFLICT",
        "TxnEnd committed",
        "TxnEnd aborted",
        "TxnList ok",
        "Restart ok",
    ] {
        assert!(coverage.get(key).copied().unwrap_or(0) > 0, "the drive model test never saw {key}");
    }
}

// -------------------------------------------------------------- concurrency

/// Eight clients on their own connections write and read their own objects
/// and overwrite one shared object as a whole, each write with one byte value
/// in small chunks and two regions. Writes are atomic and ordered: every read
/// of the shared object sees one writer's value throughout, and so does the
/// final state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_write_atomically() {
    const CLIENTS: u8 = 8;
    const ROUNDS: u64 = 12;
    const SHARED_LEN: u64 = 5 * BS + 123;
    let mut drive = Drive::start(1000).await;
    let mut admin = drive.client(512).await;
    to(admin.create_partition(1)).await.unwrap();
    to(admin.resize_partition(1, 2048 * BS)).await.unwrap();
    let (shared, _) = to(admin.create(1)).await.unwrap();
    to(admin.write(1, shared, &[rg(0, SHARED_LEN)], &vec![0xEE; SHARED_LEN as usize])).await.unwrap();

    let mut tasks = Vec::new();
    for t in 1..=CLIENTS {
        let mut c = drive.client(512).await;
        tasks.push(tokio::spawn(async move {
            let (mine, _) = to(c.create(1)).await.unwrap();
            let mut model = Vec::new();
            for i in 0..ROUNDS {
                // The shared object, whole, in two regions listed back to front.
                let half = SHARED_LEN / 2 + t as u64 * 7;
                let regions = [rg(half, SHARED_LEN - half), rg(0, half)];
                let n = to(c.write(1, shared, &regions, &vec![t; SHARED_LEN as usize])).await.unwrap();
                assert_eq!(n, SHARED_LEN);
                let (lengths, got) = to(c.read(1, shared, &[rg(0, SHARED_LEN + 100)])).await.unwrap();
                assert_eq!(lengths, vec![SHARED_LEN]);
                assert!(got.iter().all(|&b| b == got[0]), "client {t}: a read saw a mix of writes");
                // Its own object: multi-region writes, read back at once.
                let seed = t as u64 * 1000 + i;
                let regions = [rg(i * 1000 + 17, 3000), rg(20_000 + i * 100, 50), rg(30_000 + i, BS)];
                let data = pattern(seed, 3000 + 50 + BS as usize);
                to(c.write(1, mine, &regions, &data)).await.unwrap();
                apply(&mut model, &regions, &data);
                let (_, got) = to(c.read(1, mine, &[rg(0, model.len() as u64)])).await.unwrap();
                assert!(got == model, "client {t}: its own object differs after round {i}");
                if i % 4 == 3 {
                    to(c.flush(1, &[mine, shared])).await.unwrap();
                }
            }
            (mine, model)
        }));
    }
    let mut own = Vec::new();
    for task in tasks {
        own.push(to(task).await.expect("client task"));
    }
    let (_, got) = to(admin.read(1, shared, &[rg(0, SHARED_LEN)])).await.unwrap();
    assert!((1..=CLIENTS).contains(&got[0]) && got.iter().all(|&b| b == got[0]), "final shared object is one writer's");
    for (mine, model) in &own {
        let (_, data) = to(admin.read(1, *mine, &[rg(0, model.len() as u64)])).await.unwrap();
        assert!(&data == model);
    }
    // The same after a restart.
    drop(admin);
    drive.restart().await;
    let mut c = drive.client(4096).await;
    let (_, again) = to(c.read(1, shared, &[rg(0, SHARED_LEN)])).await.unwrap();
    assert_eq!(again, got);
    for (mine, model) in &own {
        let (_, data) = to(c.read(1, *mine, &[rg(0, model.len() as u64)])).await.unwrap();
        assert!(&data == model);
    }
    drop(c);
    drive.stop().await;
}

/// The last write to complete wins: two clients alternate strictly (each
/// waits for the other's reply), so the final value is the last one written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_see_each_others_completed_writes() {
    let mut drive = Drive::start(4096).await;
    let mut a = drive.client(512).await;
    let mut b = drive.client(700).await;
    to(a.create_partition(1)).await.unwrap();
    to(a.resize_partition(1, 64 * BS)).await.unwrap();
    let (o, _) = to(a.create(1)).await.unwrap();
    for i in 0..20u8 {
        let (w, r) = if i % 2 == 0 { (&mut a, &mut b) } else { (&mut b, &mut a) };
        let data = pattern(i as u64, 2 * BS as usize + i as usize);
        to(w.write(1, o, &[rg(0, data.len() as u64)], &data)).await.unwrap();
        let (_, got) = to(r.read(1, o, &[rg(0, data.len() as u64)])).await.unwrap();
        assert!(got == data, "round {i}: the other connection sees the completed write");
        let attrs = to(r.getattr(1, o)).await.unwrap();
        assert_eq!(attrs.logical_size, 2 * BS + i as u64);
    }
    drop((a, b));
    drive.stop().await;
}
