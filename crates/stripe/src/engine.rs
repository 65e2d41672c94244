//! The I/O engine: reads and writes of a striped object's file bytes over
//! its component objects, in batches of whole stripes, with every
//! component of a batch in flight at once and the next batch issued before
//! the previous one is consumed.
//!
//! A batch covers [`Striper::batch_stripes`] stripes: as many as keep the
//! bytes of every component of the batch within [`BATCH_BYTES_MAX`] (at
//! least one stripe). Each component gets one request per batch (a
//! contiguous range, or a few regions for read-modify-write); at most
//! `1 + BATCHES_AHEAD_MAX` batches are in memory at once.

mod digests;
mod hints;
mod seek;

pub use digests::ColumnDigests;
pub use seek::{Seek, SEEK_REQUESTS_PER_COLUMN_MAX};

use crate::coding::Coder;
use crate::error::{ComponentFailure, FailureCause, StripeError};
use crate::geometry::{Geometry, Role};
use crate::pool::{Deadlines, DrivePool};
use crate::request::{Req, Shared, Task, TaskError};
use crate::target::{Binder, Target};
use nasd_proto::layout::{ComponentState, Scheme};
use nasd_proto::Region;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Component bytes one batch moves, all components together (a batch is at
/// least one stripe, so a layout whose stripe is larger moves one stripe).
/// With [`BATCHES_AHEAD_MAX`] it bounds an operation's buffers: about
/// `(1 + BATCHES_AHEAD_MAX) × BATCH_BYTES_MAX` plus, for Reed-Solomon
/// writes, one batch of parity.
pub const BATCH_BYTES_MAX: u64 = 16 * 1024 * 1024;
/// Batches issued beyond the one being consumed (read) or prepared (write):
/// the pipelining depth. Each costs up to a batch of memory.
pub const BATCHES_AHEAD_MAX: usize = 1;
/// How long one component request may take (connecting included) before
/// the component counts as failed for the operation: a hung drive delays a
/// read by this much, once. A batch's request moves at most a stripe unit
/// per stripe of the batch (≤ `BATCH_BYTES_MAX` or one 16 MiB unit), so
/// this allows ≥ 0.5 MiB/s.
pub const REQUEST_DEADLINE_MS: u64 = 30_000;
/// How long connecting to a drive (TCP and `HELLO`) may take.
pub const CONNECT_DEADLINE_MS: u64 = 10_000;

const _: () = assert!(CONNECT_DEADLINE_MS <= REQUEST_DEADLINE_MS);
const _: () = assert!(REQUEST_DEADLINE_MS as u128 <= nasd_client::DRIVE_WAIT_MAX.as_millis());

/// Tunables of a [`Striper`], validated by [`Striper::with_options`].
#[derive(Debug, Clone)]
pub struct Options {
    /// Deadline of one component request ([`REQUEST_DEADLINE_MS`]).
    pub request_deadline: Duration,
    /// Deadline of connecting to a drive ([`CONNECT_DEADLINE_MS`]); at most
    /// `request_deadline`.
    pub connect_deadline: Duration,
    /// Bound on each single wait for a drive within a request — to connect,
    /// to take the request or its next chunk, to send a reply or its next
    /// chunk (`DriveClient::set_timeout`). Taken as at most
    /// `request_deadline`, which it is by default ([`REQUEST_DEADLINE_MS`]).
    /// A shorter one ends a request whose reply stalls sooner, with an error
    /// naming the drive and the step.
    pub wait_deadline: Duration,
    /// Component bytes per batch ([`BATCH_BYTES_MAX`]); 1 ..= `BATCH_BYTES_MAX`.
    pub batch_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            request_deadline: Duration::from_millis(REQUEST_DEADLINE_MS),
            connect_deadline: Duration::from_millis(CONNECT_DEADLINE_MS),
            wait_deadline: Duration::from_millis(REQUEST_DEADLINE_MS),
            batch_bytes: BATCH_BYTES_MAX,
        }
    }
}

/// Components that failed during a read, for the caller to pass on (the
/// file-system client tells the manager; scrub healing rewrites the range).
/// Each failed component is listed once, with its first failure; after it,
/// the operation no longer used it. Components the manager already marked
/// `Stale` or `Down` are not listed (they were never tried).
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The failures, in the order seen.
    pub failed: Vec<ComponentFailure>,
}

impl Report {
    /// Whether every component answered.
    pub fn is_clean(&self) -> bool {
        self.failed.is_empty()
    }

    /// Folds a later report of the same object into this one.
    pub fn merge(&mut self, other: Report) {
        for f in other.failed {
            if !self.failed.iter().any(|g| g.component == f.component) {
                self.failed.push(f);
            }
        }
    }
}

/// What a write (or flush) did.
#[derive(Debug, Clone, Default)]
pub struct WriteOutcome {
    /// Components that did not take every write of the operation (they
    /// failed, or were `Down` or already failed and so not written). They
    /// miss data the others hold: the caller has the manager mark them stale.
    pub missed: BTreeSet<usize>,
    /// Components that took at least one write (to flush).
    pub written: BTreeSet<usize>,
    /// Why each failed component failed (not listed: components skipped
    /// for being `Down`).
    pub failed: Vec<ComponentFailure>,
}

impl WriteOutcome {
    /// Folds a later outcome of the same object into this one.
    pub fn merge(&mut self, other: WriteOutcome) {
        self.missed.extend(other.missed);
        self.written.extend(other.written);
        for f in other.failed {
            if !self.failed.iter().any(|g| g.component == f.component) {
                self.failed.push(f);
            }
        }
    }
}

/// Moves bytes between a caller and the component objects of one striped
/// object ([`Target`] from a [`Binder`]), over a shared [`DrivePool`].
///
/// Cheap to clone (an `Arc`); operations on one `Striper` may run
/// concurrently, but the caller orders writes that overlap (in stripes, for
/// Reed-Solomon) with each other and with reads.
#[derive(Clone)]
pub struct Striper {
    shared: Arc<Shared>,
    batch_bytes: u64,
    /// Rotates the mirror copy reads start from, batch by batch.
    spread: Arc<AtomicU64>,
}

impl std::fmt::Debug for Striper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Striper").field("layout", &self.shared.binder.current().layout).finish()
    }
}

/// Per data column, the component ranges an operation wants (sorted,
/// disjoint, not empty).
type Wants = Vec<Vec<Range<u64>>>;

/// A batch's reads in flight: per data column, the component and the task;
/// for Reed-Solomon with data columns known unreadable when the batch was
/// issued, the other chunks their stripes decode from.
struct Fetch {
    size: u64,
    wants: Wants,
    tasks: Vec<Option<(usize, Task)>>,
    chunks: Vec<ChunkRead>,
}

/// Chunks of one component read ahead for decoding: the component, its
/// regions, the task.
type ChunkRead = (usize, Vec<Range<u64>>, Task);

/// Bytes read for some regions of one component.
struct Fetched {
    regions: Vec<Range<u64>>,
    data: Vec<u8>,
}

impl Fetched {
    /// The bytes of `range`, which lies within one region.
    fn slice(&self, range: Range<u64>) -> &[u8] {
        if range.is_empty() {
            return &[];
        }
        let mut at = 0usize;
        for r in &self.regions {
            if r.start <= range.start && range.end <= r.end {
                let from = at + (range.start - r.start) as usize;
                return &self.data[from..from + (range.end - range.start) as usize];
            }
            at += (r.end - r.start) as usize;
        }
        panic!("range {range:?} is not within the fetched regions {:?}", self.regions);
    }
}

/// A batch's writes in flight and what must hold after them.
struct WriteBatch {
    tasks: Vec<(usize, Option<Range<u64>>, Task)>,
    check: BatchCheck,
}

/// A stripe's `k + m` shards, `None` where missing.
type Shards = Vec<Option<Vec<u8>>>;

/// One stripe of a Reed-Solomon write: the components written in it (and
/// whether with their whole chunk), and the data columns it did not touch.
type StripeWrites = (Vec<(usize, bool)>, Vec<usize>);

enum BatchCheck {
    /// Nothing (the caller checks).
    Nothing,
    /// Every write must succeed.
    All,
    /// Each of these columns keeps a written copy.
    Columns(Vec<usize>),
    /// Per stripe: the components written in it (and whether with its
    /// whole chunk), and the data columns it did not touch (which still
    /// hold its bytes); `k` of them must hold it.
    Stripes(Vec<StripeWrites>),
}

fn region(r: &Range<u64>) -> Region {
    Region { offset: r.start, length: r.end - r.start }
}

/// Appends `r` to `list`, merging it with the last range if they touch.
fn push_range(list: &mut Vec<Range<u64>>, r: Range<u64>) {
    if r.is_empty() {
        return;
    }
    match list.last_mut() {
        Some(last) if last.end == r.start => last.end = r.end,
        _ => list.push(r),
    }
}

fn total(ranges: &[Range<u64>]) -> usize {
    ranges.iter().map(|r| (r.end - r.start) as usize).sum()
}

/// One operation's view: the target it started with and the components
/// that failed so far (not used again by it).
struct Op {
    shared: Arc<Shared>,
    target: Arc<Target>,
    g: Geometry,
    coder: Option<Coder>,
    batch_stripes: u64,
    spread: Arc<AtomicU64>,
    failed: BTreeMap<usize, ComponentFailure>,
    /// Components the caller asked not to use (the one being rebuilt).
    excluded: BTreeSet<usize>,
    report: Report,
}

impl Striper {
    /// The environment the engine runs in (its pool's).
    pub fn env(&self) -> &nasd_env::Env {
        self.shared.pool.env()
    }

    /// An engine for the object `binder` names, with default [`Options`].
    pub fn new(pool: Arc<DrivePool>, binder: Arc<dyn Binder>) -> Striper {
        Striper::with_options(pool, binder, Options::default()).expect("the default options are valid")
    }

    /// An engine with `options`.
    ///
    /// # Errors
    /// [`StripeError::BadTarget`] naming an option out of its bounds.
    pub fn with_options(
        pool: Arc<DrivePool>,
        binder: Arc<dyn Binder>,
        options: Options,
    ) -> Result<Striper, StripeError> {
        let (request, connect) = (options.request_deadline, options.connect_deadline);
        if connect.is_zero() || connect > request || options.wait_deadline.is_zero() {
            return Err(StripeError::BadTarget("deadlines: 0 < connect ≤ request, 0 < wait".into()));
        }
        // No single wait outlasts the request it is part of.
        let wait = options.wait_deadline.min(request);
        if !(1..=BATCH_BYTES_MAX).contains(&options.batch_bytes) {
            return Err(StripeError::BadTarget(format!("batch_bytes must be 1..={BATCH_BYTES_MAX}")));
        }
        let shared = Shared {
            pool,
            binder,
            refresh_lock: tokio::sync::Mutex::new(()),
            pal_refreshes: std::sync::atomic::AtomicU64::new(0),
            request_deadline: request,
            deadlines: Deadlines { connect, wait },
        };
        Ok(Striper { shared: Arc::new(shared), batch_bytes: options.batch_bytes, spread: Arc::new(AtomicU64::new(0)) })
    }

    /// The binder's current target.
    pub fn target(&self) -> Arc<Target> {
        self.shared.binder.current()
    }

    /// Stripes per batch for `geometry`: as many as keep every component's
    /// share of the batch within the batch bytes, at least one.
    pub fn batch_stripes(&self, geometry: &Geometry) -> u64 {
        (self.batch_bytes / (geometry.unit() * geometry.components() as u64)).max(1)
    }

    fn op(&self) -> Result<Op, StripeError> {
        let target = self.shared.binder.current();
        target.check()?;
        let g = Geometry::new(target.layout).map_err(|e| StripeError::BadTarget(e.to_string()))?;
        let coder = match target.layout.scheme {
            Scheme::ReedSolomon { data, parity } => {
                Some(Coder::new(data as usize, parity as usize).map_err(|e| StripeError::BadTarget(e.to_string()))?)
            }
            _ => None,
        };
        Ok(Op {
            shared: self.shared.clone(),
            batch_stripes: self.batch_stripes(&g),
            target,
            g,
            coder,
            spread: self.spread.clone(),
            failed: BTreeMap::new(),
            excluded: BTreeSet::new(),
            report: Report::default(),
        })
    }

    /// Reads up to `len` bytes at `offset` of an object of `size` bytes
    /// (what the caller knows the file's size to be): stops at `size`;
    /// bytes below it that no component holds (holes, short components)
    /// read as zeros. Returns the bytes and the components that failed.
    ///
    /// # Errors
    /// [`StripeError::Unavailable`] if more components failed than the
    /// layout tolerates (naming their drives); [`StripeError::OutOfRange`]
    /// if `size` exceeds what the layout holds; binding errors.
    ///
    /// # Cancel safety
    /// Dropping the future aborts its requests; nothing is changed.
    pub async fn read(&self, offset: u64, len: u64, size: u64) -> Result<(Vec<u8>, Report), StripeError> {
        let mut out = Vec::new();
        let (_, report) = self.read_to(offset, len, size, &mut out).await?;
        Ok((out, report))
    }

    /// As [`read`](Self::read), streaming the bytes into `dst` batch by
    /// batch (memory stays at a few batches whatever `len`); returns the
    /// bytes written to `dst`. On an error, `dst` holds the batches before
    /// the one that failed, each whole and correct.
    ///
    /// # Errors
    /// As [`read`](Self::read), and [`StripeError::Io`] if `dst` fails.
    ///
    /// # Cancel safety
    /// Dropping the future aborts its requests; `dst` may have received
    /// some batches.
    pub async fn read_to(
        &self,
        offset: u64,
        len: u64,
        size: u64,
        dst: &mut (impl AsyncWrite + Unpin),
    ) -> Result<(u64, Report), StripeError> {
        let mut op = self.op()?;
        op.check_size(size)?;
        let end = offset.saturating_add(len).min(size);
        if offset >= end {
            return Ok((0, op.report));
        }
        let sb = op.g.stripe_bytes();
        let (first, last) = (offset / sb, (end - 1) / sb);
        let mut queue = VecDeque::new();
        let (mut next, mut done) = (first, 0u64);
        loop {
            while queue.len() <= BATCHES_AHEAD_MAX && next <= last {
                let upto = (next + op.batch_stripes).min(last + 1);
                let (a, b) = (offset.max(next * sb), end.min(upto * sb));
                let wants = op.wants_for(a, b);
                queue.push_back((a, b, op.issue_fetch(size, wants)));
                next = upto;
            }
            let Some((a, b, fetch)) = queue.pop_front() else { break };
            let lows: Vec<u64> = fetch.wants.iter().map(|w| w.first().map_or(0, |r| r.start)).collect();
            let columns = op.complete_fetch(fetch).await?;
            for e in op.g.extents(a, b - a) {
                let at = (e.comp_offset - lows[e.column]) as usize;
                dst.write_all(&columns[e.column][at..at + e.len as usize]).await?;
            }
            done += b - a;
        }
        dst.flush().await?;
        Ok((done, op.report))
    }

    /// Writes `data` at `offset` of an object that was `size_before` bytes
    /// long; afterwards it is `max(size_before, offset + data.len())`.
    ///
    /// Stripe: every component must take its chunks. Mirror: every copy
    /// gets the bytes; a copy that fails is `missed` while each column keeps
    /// a written copy. Reed-Solomon: whole stripes are encoded in the
    /// client; a partial stripe is read (degraded if need be), merged,
    /// encoded, and its touched data chunks and all its parity chunks are
    /// written; failures are `missed` while every stripe keeps `k` chunks
    /// holding it. `Down` components are never written; `Stale` ones are
    /// written if they answer (they stay stale: the caller's business).
    ///
    /// # Preconditions
    /// `size_before` is the object's size, and component bytes past it read
    /// as zeros (the drive's zero-past-end rule, and the manager's rule that
    /// a file's size covers what its data components hold): parity is
    /// computed as if they were.
    ///
    /// # Errors
    /// [`StripeError::Unavailable`] if too many components failed; the
    /// range's bytes are then undefined (some batches may have been
    /// written). [`StripeError::OutOfRange`] past what the layout holds.
    ///
    /// # Cancel safety
    /// Dropping the future aborts its requests (a write cut short is
    /// discarded by its drive); the range's bytes are then undefined.
    pub async fn write(&self, offset: u64, data: &[u8], size_before: u64) -> Result<WriteOutcome, StripeError> {
        let mut op = self.op()?;
        let len = data.len() as u64;
        op.check_size(size_before)?;
        op.check_range(offset, len)?;
        let mut outcome = WriteOutcome::default();
        if len == 0 {
            return Ok(outcome);
        }
        let end = offset + len;
        let new_size = size_before.max(end);
        let sb = op.g.stripe_bytes();
        let (first, last) = (offset / sb, (end - 1) / sb);
        let mut queue = VecDeque::new();
        let mut next = first;
        while next <= last {
            let upto = (next + op.batch_stripes).min(last + 1);
            let (a, b) = (offset.max(next * sb), end.min(upto * sb));
            let bytes = &data[(a - offset) as usize..(b - offset) as usize];
            let batch = match op.coder {
                Some(_) => op.prepare_rs(a, bytes, size_before, new_size, &mut outcome).await?,
                None => op.prepare_copies(a, bytes, &mut outcome)?,
            };
            queue.push_back(batch);
            if queue.len() > BATCHES_AHEAD_MAX {
                op.complete_write(queue.pop_front().expect("not empty"), &mut outcome).await?;
            }
            next = upto;
        }
        while let Some(batch) = queue.pop_front() {
            op.complete_write(batch, &mut outcome).await?;
        }
        Ok(outcome)
    }

    /// Makes `components` durable (`FLUSH`, all at once). Components that
    /// are `Down` or fail are `missed`.
    ///
    /// # Errors
    /// [`StripeError::Unavailable`] if the missed components are more than
    /// the layout tolerates.
    pub async fn flush(&self, components: &BTreeSet<usize>) -> Result<WriteOutcome, StripeError> {
        let mut op = self.op()?;
        let mut outcome = WriteOutcome::default();
        let mut tasks = Vec::new();
        for &c in components.iter().filter(|&&c| c < op.g.components()) {
            if op.writable(c) {
                tasks.push((c, None, op.spawn(c, Req::Flush)));
            } else {
                outcome.missed.insert(c);
            }
        }
        let batch = WriteBatch { tasks, check: BatchCheck::Nothing };
        op.join_writes(batch, &mut outcome).await?;
        if !op.g.survives(&outcome.missed) {
            let failures = outcome.missed.iter().map(|&c| op.why_unusable(c)).collect();
            return Err(StripeError::unavailable(op.g.layout().tolerates(), failures));
        }
        Ok(outcome)
    }

    /// Component `component`'s bytes `[comp_offset, comp_offset + len)`
    /// for an object of `size` bytes (clamped to the component's length
    /// then), rebuilt from the other components without reading this one:
    /// another mirror copy, or the stripe's other chunks decoded. For
    /// rebuilding a lost component onto a new object, or healing a rotten
    /// range.
    ///
    /// # Errors
    /// [`StripeError::Unavailable`] if the others cannot rebuild it (always
    /// for a stripe layout).
    pub async fn read_component(
        &self,
        component: usize,
        comp_offset: u64,
        len: u64,
        size: u64,
    ) -> Result<(Vec<u8>, Report), StripeError> {
        let mut op = self.op()?;
        op.check_size(size)?;
        if component >= op.g.components() {
            return Err(StripeError::BadTarget(format!("no component {component}")));
        }
        op.excluded.insert(component);
        let u = op.g.unit();
        let end = comp_offset.saturating_add(len).min(op.g.component_len(size, component));
        let mut out = Vec::with_capacity(end.saturating_sub(comp_offset) as usize);
        let role = op.g.role(component);
        let k = op.g.data_columns();
        // Batches are issued ahead as a read's are (`BATCHES_AHEAD_MAX`): the
        // sources never wait for the previous batch to be decoded.
        let mut queue = VecDeque::new();
        let mut next = comp_offset;
        loop {
            while queue.len() <= BATCHES_AHEAD_MAX && next < end {
                let upto = ((next / u + op.batch_stripes) * u).min(end);
                let wants: Wants = match role {
                    Role::Data { column, .. } => {
                        let mut wants = vec![Vec::new(); k];
                        wants[column].push(next..upto);
                        wants
                    }
                    // The whole stripes: every data chunk the parity is encoded from.
                    Role::Parity { .. } => {
                        let stripes = next / u * u..(upto - 1) / u * u + u;
                        vec![vec![stripes]; k]
                    }
                };
                queue.push_back((next..upto, op.issue_fetch(size, wants)));
                next = upto;
            }
            let Some((range, fetch)) = queue.pop_front() else { break };
            let mut columns = op.complete_fetch(fetch).await?;
            match role {
                Role::Data { column, .. } => out.append(&mut columns[column]),
                Role::Parity { index } => op.encode_parity(size, range, index, &columns, &mut out)?,
            }
        }
        Ok((out, op.report))
    }

    /// Writes `data` at `comp_offset` of component `component` as it is (no
    /// striping, no parity): the other half of rebuilding or healing.
    ///
    /// # Errors
    /// [`StripeError::Unavailable`] naming the component if it failed.
    pub async fn write_component(&self, component: usize, comp_offset: u64, data: &[u8]) -> Result<(), StripeError> {
        let mut op = self.op()?;
        if component >= op.g.components() {
            return Err(StripeError::BadTarget(format!("no component {component}")));
        }
        let max = nasd_proto::limits::OBJECT_SIZE_MAX;
        if comp_offset.checked_add(data.len() as u64).is_none_or(|e| e > max) {
            return Err(StripeError::OutOfRange { offset: comp_offset, len: data.len() as u64, max });
        }
        let piece = self.batch_bytes as usize;
        for (i, chunk) in data.chunks(piece).enumerate() {
            let at = comp_offset + (i * piece) as u64;
            let r = at..at + chunk.len() as u64;
            let task = op.spawn(component, Req::Write(vec![region(&r)], Arc::new(chunk.to_vec())));
            let batch = WriteBatch { tasks: vec![(component, Some(r), task)], check: BatchCheck::All };
            op.join_writes(batch, &mut WriteOutcome::default()).await?;
        }
        Ok(())
    }
}

impl Op {
    /// Refuses a size past what the layout holds.
    fn check_size(&self, size: u64) -> Result<(), StripeError> {
        let max = self.g.file_size_max();
        if size > max {
            return Err(StripeError::OutOfRange { offset: 0, len: size, max });
        }
        Ok(())
    }

    /// Refuses a write range past what the layout holds.
    fn check_range(&self, offset: u64, len: u64) -> Result<(), StripeError> {
        let max = self.g.file_size_max();
        if offset.checked_add(len).is_none_or(|end| end > max) {
            return Err(StripeError::OutOfRange { offset, len, max });
        }
        Ok(())
    }

    fn spawn(&self, component: usize, req: Req) -> Task {
        Task::spawn(&self.shared, self.target.layout, component, req)
    }

    fn state(&self, c: usize) -> ComponentState {
        self.target.components[c].state
    }

    fn readable(&self, c: usize) -> bool {
        !self.failed.contains_key(&c) && !self.excluded.contains(&c) && self.state(c).readable()
    }

    fn writable(&self, c: usize) -> bool {
        !self.failed.contains_key(&c) && self.state(c) != ComponentState::Down
    }

    /// Why `c` cannot be used, for an `Unavailable` error.
    fn why_unusable(&self, c: usize) -> ComponentFailure {
        if let Some(f) = self.failed.get(&c) {
            return f.clone();
        }
        let cause =
            if self.excluded.contains(&c) { FailureCause::Excluded } else { FailureCause::State(self.state(c)) };
        ComponentFailure { component: c, drive: self.target.components[c].drive, range: None, cause }
    }

    fn unavailable(&self, components: impl IntoIterator<Item = usize>) -> StripeError {
        let failures = components.into_iter().map(|c| self.why_unusable(c)).collect();
        StripeError::unavailable(self.g.layout().tolerates(), failures)
    }

    /// Records that `c` failed; the operation does not use it again.
    fn record(&mut self, c: usize, range: Option<Range<u64>>, cause: FailureCause) {
        tracing::debug!(component = c, %cause, "component request failed");
        let f = ComponentFailure { component: c, drive: self.target.components[c].drive, range, cause };
        if !self.failed.contains_key(&c) {
            self.report.failed.push(f.clone());
            self.failed.insert(c, f);
        }
    }

    /// Per data column, the component range of file bytes `[a, b)` (one
    /// batch: contiguous in every column).
    fn wants_for(&self, a: u64, b: u64) -> Wants {
        let mut wants: Wants = vec![Vec::new(); self.g.data_columns()];
        for e in self.g.extents(a, b - a) {
            push_range(&mut wants[e.column], e.comp_offset..e.comp_offset + e.len);
        }
        assert!(wants.iter().all(|w| w.len() <= 1), "a batch's range is contiguous in every column");
        wants
    }

    /// `wants` of column `column` clamped to the column's length under `size`.
    fn clamped(&self, size: u64, column: usize, wants: &[Range<u64>]) -> Vec<Range<u64>> {
        let len = self.g.component_len(size, column);
        wants.iter().map(|r| r.start..r.end.min(len)).filter(|r| !r.is_empty()).collect()
    }

    /// Issues the reads of `wants` from one component per column (a mirror's
    /// copies taken in turn), skipping components that cannot be read.
    fn issue_fetch(&mut self, size: u64, wants: Wants) -> Fetch {
        let spread = self.spread.fetch_add(1, Ordering::Relaxed) as usize;
        let mut tasks = Vec::with_capacity(wants.len());
        for (c, w) in wants.iter().enumerate() {
            let regions = self.clamped(size, c, w);
            let copies = self.g.copies();
            let pick =
                (0..copies).map(|i| self.g.data_component(c, (spread + c + i) % copies)).find(|&x| self.readable(x));
            tasks.push(match pick {
                Some(comp) if !regions.is_empty() => {
                    Some((comp, self.spawn(comp, Req::Read(regions.iter().map(region).collect()))))
                }
                _ => None,
            });
        }
        let chunks = self.prefetch_chunks(size, &wants, &tasks);
        Fetch { size, wants, tasks, chunks }
    }

    /// Reed-Solomon: for the data columns of a batch that cannot be read
    /// (their components down, stale or failed earlier in the operation),
    /// reads the chunks their stripes decode from — parity, and data columns
    /// the batch does not read whole — beside the batch's own reads rather
    /// than after them, so a degraded read keeps its pipelining.
    fn prefetch_chunks(&mut self, size: u64, wants: &Wants, tasks: &[Option<(usize, Task)>]) -> Vec<ChunkRead> {
        if !matches!(self.target.layout.scheme, Scheme::ReedSolomon { .. }) {
            return Vec::new();
        }
        let k = self.g.data_columns();
        let missing: Vec<usize> =
            (0..k).filter(|&c| tasks[c].is_none() && !self.clamped(size, c, &wants[c]).is_empty()).collect();
        if missing.is_empty() {
            return Vec::new();
        }
        let runs = self.stripe_runs(size, wants, &missing);
        let Some(chosen) = self.k_chunk_components() else { return Vec::new() };
        let mut reads = Vec::new();
        for comp in chosen {
            if comp < k && tasks[comp].is_some() && self.holds_chunks(size, comp, &wants[comp], &runs) {
                continue; // its bytes come with the batch
            }
            let regions = self.chunk_regions(size, &runs, comp);
            if !regions.is_empty() {
                let task = self.spawn(comp, Req::Read(regions.iter().map(region).collect()));
                reads.push((comp, regions, task));
            }
        }
        reads
    }

    /// Reed-Solomon: the components `k` chunks of a stripe are read from —
    /// the readable data columns and as many readable parity components as
    /// data columns are not — or `None` if too few are readable.
    fn k_chunk_components(&self) -> Option<Vec<usize>> {
        let (k, m) = (self.g.data_columns(), self.g.parity());
        let lost_data = (0..k).filter(|&c| !self.readable(c)).count();
        let parity: Vec<usize> = (k..k + m).filter(|&c| self.readable(c)).take(lost_data).collect();
        (parity.len() == lost_data).then(|| (0..k).filter(|&c| self.readable(c)).chain(parity).collect())
    }

    /// Component `comp`'s chunks of the stripes in `runs`, clamped to its
    /// length under `size` (empty ranges left out).
    fn chunk_regions(&self, size: u64, runs: &[Range<u64>], comp: usize) -> Vec<Range<u64>> {
        let (u, len) = (self.g.unit(), self.g.component_len(size, comp));
        runs.iter().map(|r| r.start * u..(r.end * u).min(len)).filter(|r| !r.is_empty()).collect()
    }

    /// `data` (the bytes of `clamped`, each clamped range within the want
    /// at its position) laid out as `wants`, zeros elsewhere.
    fn lay_out(wants: &[Range<u64>], clamped: &[Range<u64>], data: Vec<u8>) -> Vec<u8> {
        if wants == clamped {
            return data;
        }
        let mut out = vec![0u8; total(wants)];
        let (mut at_out, mut at_in, mut next) = (0usize, 0usize, 0usize);
        for w in wants {
            while let Some(c) = clamped.get(next).filter(|c| c.start >= w.start && c.end <= w.end) {
                let (from, len) = (at_out + (c.start - w.start) as usize, (c.end - c.start) as usize);
                out[from..from + len].copy_from_slice(&data[at_in..at_in + len]);
                at_in += len;
                next += 1;
            }
            at_out += (w.end - w.start) as usize;
        }
        assert_eq!(at_in, data.len(), "every fetched byte is laid out");
        out
    }

    /// Waits for a batch's reads and serves every column that failed from
    /// redundancy. Returns per data column the bytes of its wants.
    async fn complete_fetch(&mut self, fetch: Fetch) -> Result<Vec<Vec<u8>>, StripeError> {
        let Fetch { size, wants, tasks, chunks } = fetch;
        let k = self.g.data_columns();
        let mut out: Vec<Option<Vec<u8>>> = vec![None; k];
        for (c, task) in tasks.into_iter().enumerate() {
            let clamped = self.clamped(size, c, &wants[c]);
            if clamped.is_empty() {
                out[c] = Some(vec![0u8; total(&wants[c])]);
                continue;
            }
            let Some((comp, task)) = task else { continue };
            if let Some(data) = self.join_read(comp, &clamped, task).await? {
                out[c] = Some(Self::lay_out(&wants[c], &clamped, data));
            }
        }
        match self.target.layout.scheme {
            Scheme::Stripe { .. } => {
                let missing: Vec<usize> = (0..k).filter(|&c| out[c].is_none()).collect();
                if !missing.is_empty() {
                    return Err(self.unavailable(missing));
                }
            }
            Scheme::Mirror { .. } => self.mirror_fallback(size, &wants, &mut out).await?,
            Scheme::ReedSolomon { .. } => self.reconstruct_columns(size, &wants, &mut out, chunks).await?,
        }
        Ok(out.into_iter().map(|c| c.expect("every column served")).collect())
    }

    /// Joins a read; `None` (and the failure recorded) if the component failed.
    async fn join_read(
        &mut self,
        comp: usize,
        regions: &[Range<u64>],
        task: Task,
    ) -> Result<Option<Vec<u8>>, StripeError> {
        match task.join().await {
            Ok(data) => {
                let data = data.expect("a read returns bytes");
                assert_eq!(data.len(), total(regions), "reads are padded to their regions");
                Ok(Some(data))
            }
            Err(TaskError::Fatal(e)) => Err(e),
            Err(TaskError::Component(cause)) => {
                let span = regions.first().map(|f| f.start..regions.last().expect("not empty").end);
                self.record(comp, span, cause);
                Ok(None)
            }
        }
    }

    /// Reads every missing column from its other copies, in turn.
    async fn mirror_fallback(
        &mut self,
        size: u64,
        wants: &Wants,
        out: &mut [Option<Vec<u8>>],
    ) -> Result<(), StripeError> {
        loop {
            let missing: Vec<usize> = (0..out.len()).filter(|&c| out[c].is_none()).collect();
            if missing.is_empty() {
                return Ok(());
            }
            let mut tasks = Vec::new();
            for c in missing {
                let copies: Vec<usize> = (0..self.g.copies()).map(|r| self.g.data_component(c, r)).collect();
                let Some(&comp) = copies.iter().find(|&&x| self.readable(x)) else {
                    return Err(self.unavailable(copies));
                };
                let clamped = self.clamped(size, c, &wants[c]);
                tasks.push((
                    c,
                    comp,
                    clamped.clone(),
                    self.spawn(comp, Req::Read(clamped.iter().map(region).collect())),
                ));
            }
            for (c, comp, clamped, task) in tasks {
                if let Some(data) = self.join_read(comp, &clamped, task).await? {
                    out[c] = Some(Self::lay_out(&wants[c], &clamped, data));
                }
            }
        }
    }

    /// The stripes the wants of `columns` touch, as runs of consecutive stripes.
    fn stripe_runs(&self, size: u64, wants: &Wants, columns: &[usize]) -> Vec<Range<u64>> {
        let u = self.g.unit();
        let mut stripes = BTreeSet::new();
        for &c in columns {
            for r in self.clamped(size, c, &wants[c]) {
                stripes.extend(r.start / u..=(r.end - 1) / u);
            }
        }
        let mut runs: Vec<Range<u64>> = Vec::new();
        for s in stripes {
            push_range(&mut runs, s..s + 1);
        }
        runs
    }

    /// Fetches, for the stripes in `runs`, every chunk of the components in
    /// `comps` (clamped to their lengths under `size`), all at once.
    /// Returns what arrived; failures are recorded.
    async fn fetch_chunks(
        &mut self,
        size: u64,
        runs: &[Range<u64>],
        comps: &[usize],
    ) -> Result<BTreeMap<usize, Fetched>, StripeError> {
        let mut got = BTreeMap::new();
        let mut tasks = Vec::new();
        for &comp in comps {
            let regions = self.chunk_regions(size, runs, comp);
            if regions.is_empty() {
                got.insert(comp, Fetched { regions, data: Vec::new() });
                continue;
            }
            let task = self.spawn(comp, Req::Read(regions.iter().map(region).collect()));
            tasks.push((comp, regions, task));
        }
        for (comp, regions, task) in tasks {
            if let Some(data) = self.join_read(comp, &regions, task).await? {
                got.insert(comp, Fetched { regions, data });
            }
        }
        Ok(got)
    }

    /// Reed-Solomon: fetches `k` chunks of every stripe of `runs` — the
    /// readable data columns and as many parity components as data columns
    /// are missing — trying other parity components as components fail.
    /// Components in `have` (chunks already read, covering every stripe of
    /// `runs`) are not read again.
    async fn fetch_k_chunks(
        &mut self,
        size: u64,
        runs: &[Range<u64>],
        mut have: BTreeMap<usize, Fetched>,
    ) -> Result<BTreeMap<usize, Fetched>, StripeError> {
        let components = self.g.data_columns() + self.g.parity();
        loop {
            let Some(chosen) = self.k_chunk_components() else {
                return Err(self.unavailable((0..components).filter(|&c| !self.readable(c))));
            };
            have.retain(|c, _| chosen.contains(c));
            let wanted: Vec<usize> = chosen.iter().copied().filter(|c| !have.contains_key(c)).collect();
            if wanted.is_empty() {
                return Ok(have);
            }
            let got = self.fetch_chunks(size, runs, &wanted).await?;
            have.extend(got);
        }
    }

    /// Whether bytes read for `wants` of data column `column` hold the
    /// column's whole chunk (its length under `size`) of every stripe of
    /// `runs`, each within one want.
    fn holds_chunks(&self, size: u64, column: usize, wants: &[Range<u64>], runs: &[Range<u64>]) -> bool {
        let u = self.g.unit();
        runs.iter().flat_map(|r| r.clone()).all(|s| {
            let chunk = s * u..s * u + self.g.chunk_len(size, s, column);
            chunk.is_empty() || wants.iter().any(|w| w.start <= chunk.start && chunk.end <= w.end)
        })
    }

    /// The `k + m` shards of stripe `s` from fetched chunks (`None` where
    /// not fetched), data chunks at their length under `size`.
    fn shards_of(&self, size: u64, s: u64, have: &BTreeMap<usize, Fetched>) -> Vec<Option<Vec<u8>>> {
        let (k, m, u) = (self.g.data_columns(), self.g.parity(), self.g.unit());
        let p = self.g.parity_chunk_len(size, s);
        (0..k + m)
            .map(|c| {
                let len = if c < k { self.g.chunk_len(size, s, c) } else { p };
                have.get(&c).map(|f| f.slice(s * u..s * u + len).to_vec())
            })
            .collect()
    }

    /// Reed-Solomon: serves the columns without bytes from the other chunks
    /// of their stripes.
    async fn reconstruct_columns(
        &mut self,
        size: u64,
        wants: &Wants,
        out: &mut [Option<Vec<u8>>],
        prefetched: Vec<ChunkRead>,
    ) -> Result<(), StripeError> {
        let missing: Vec<usize> = (0..out.len()).filter(|&c| out[c].is_none()).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let runs = self.stripe_runs(size, wants, &missing);
        // Chunks read beside the batch serve if they are the chunks of these stripes (more columns
        // may have failed since, widening the stripes to decode).
        let mut read = BTreeMap::new();
        for (comp, regions, task) in prefetched {
            if let Some(data) = self.join_read(comp, &regions, task).await? {
                if regions == self.chunk_regions(size, &runs, comp) {
                    read.insert(comp, Fetched { regions, data });
                }
            }
        }
        // The columns this batch read already serve their chunks of the stripes to decode where
        // they hold them whole (reading them again would double the data columns' load); they are
        // lent to the decoder and given back.
        let mut lent = Vec::new();
        for (c, bytes) in out.iter_mut().enumerate() {
            if bytes.is_some()
                && !read.contains_key(&c)
                && self.readable(c)
                && self.holds_chunks(size, c, &wants[c], &runs)
            {
                let data = bytes.take().expect("checked");
                read.insert(c, Fetched { regions: wants[c].clone(), data });
                lent.push(c);
            }
        }
        let mut have = self.fetch_k_chunks(size, &runs, read).await?;
        let mut stripes: Vec<(u64, usize, Shards)> = runs
            .iter()
            .flat_map(|r| r.clone())
            .map(|s| (s, self.g.parity_chunk_len(size, s) as usize))
            .filter(|&(_, p)| p > 0)
            .map(|(s, p)| (s, p, self.shards_of(size, s, &have)))
            .collect();
        for c in lent {
            out[c] = Some(have.remove(&c).expect("a column read stays chosen").data);
        }
        drop(have);
        // Decoding a batch takes milliseconds: off the async workers.
        let coder = self.coder.expect("Reed-Solomon has a coder");
        let (stripes, decoded) = self
            .shared
            .pool
            .env()
            .spawn_blocking(move || {
                let decoded = stripes.iter_mut().try_for_each(|(_, p, shards)| coder.reconstruct(shards, *p, false));
                (stripes, decoded)
            })
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        decoded.map_err(|e| self.coding_failed(e))?;
        let u = self.g.unit();
        for &c in &missing {
            out[c] = Some(vec![0u8; total(&wants[c])]);
        }
        for (s, _, shards) in &stripes {
            let s = *s;
            for &c in &missing {
                let shard = shards[c].as_ref().expect("reconstructed");
                let chunk = s * u..s * u + self.g.chunk_len(size, s, c);
                let buf = out[c].as_mut().expect("allocated above");
                let mut at = 0u64;
                for w in &wants[c] {
                    let (lo, hi) = (w.start.max(chunk.start), w.end.min(chunk.end));
                    if lo < hi {
                        let dst = (at + lo - w.start) as usize..(at + hi - w.start) as usize;
                        buf[dst].copy_from_slice(&shard[(lo - chunk.start) as usize..(hi - chunk.start) as usize]);
                    }
                    at += w.end - w.start;
                }
            }
        }
        Ok(())
    }

    fn coding_failed(&self, e: crate::coding::CodingError) -> StripeError {
        // The engine hands the coder k shards of the right lengths; a
        // failure here is a bug, but not one worth a panic in a client.
        StripeError::BadTarget(format!("Reed-Solomon coding failed: {e}"))
    }

    /// Parity `index` for component range `range` (within a batch of
    /// stripes), encoded from `columns`, the data columns' bytes of those
    /// whole stripes; appended to `out`.
    fn encode_parity(
        &self,
        size: u64,
        range: Range<u64>,
        index: usize,
        columns: &[Vec<u8>],
        out: &mut Vec<u8>,
    ) -> Result<(), StripeError> {
        let (k, u) = (self.g.data_columns(), self.g.unit());
        let (s0, s1) = (range.start / u, (range.end - 1) / u + 1);
        let mut encoder = self.coder.expect("parity components are Reed-Solomon's").encoder();
        for s in s0..s1 {
            let p = self.g.parity_chunk_len(size, s) as usize;
            let at = ((s - s0) * u) as usize;
            let data: Vec<&[u8]> =
                (0..k).map(|c| &columns[c][at..at + self.g.chunk_len(size, s, c) as usize]).collect();
            let chunk = s * u..s * u + p as u64;
            let (lo, hi) = (range.start.max(chunk.start), range.end.min(chunk.end));
            encoder
                .encode_into(&data, p, |j, parity| {
                    if j == index && lo < hi {
                        out.extend_from_slice(&parity[(lo - chunk.start) as usize..(hi - chunk.start) as usize]);
                    }
                })
                .map_err(|e| self.coding_failed(e))?;
        }
        Ok(())
    }

    /// Stripe and mirror: each column's bytes of `[a, a + data.len())` to
    /// every writable copy.
    fn prepare_copies(&mut self, a: u64, data: &[u8], outcome: &mut WriteOutcome) -> Result<WriteBatch, StripeError> {
        let k = self.g.data_columns();
        let mut ranges: Vec<Vec<Range<u64>>> = vec![Vec::new(); k];
        let mut lens = vec![0usize; k];
        for e in self.g.extents(a, data.len() as u64) {
            push_range(&mut ranges[e.column], e.comp_offset..e.comp_offset + e.len);
            lens[e.column] += e.len as usize;
        }
        // Each column's buffer sized once (grown extent by extent,
        // reallocations copied it over and over: `nasd bench cost`).
        let mut bytes: Vec<Vec<u8>> = lens.iter().map(|&len| Vec::with_capacity(len)).collect();
        for e in self.g.extents(a, data.len() as u64) {
            let at = (e.file_offset - a) as usize;
            bytes[e.column].extend_from_slice(&data[at..at + e.len as usize]);
        }
        let touched: Vec<usize> = (0..k).filter(|&c| !ranges[c].is_empty()).collect();
        let copies = self.g.copies();
        for &c in &touched {
            let all: Vec<usize> = (0..copies).map(|r| self.g.data_component(c, r)).collect();
            let ok = all.iter().filter(|&&x| self.writable(x)).count();
            if ok == 0 {
                return Err(self.unavailable(all.into_iter().filter(|&x| !self.writable(x))));
            }
        }
        let mut tasks = Vec::new();
        for &c in &touched {
            let regions: Vec<Region> = ranges[c].iter().map(region).collect();
            let span = ranges[c].first().map(|f| f.start..ranges[c].last().expect("not empty").end);
            let buf = Arc::new(std::mem::take(&mut bytes[c]));
            for r in 0..copies {
                let comp = self.g.data_component(c, r);
                if self.writable(comp) {
                    tasks.push((comp, span.clone(), self.spawn(comp, Req::Write(regions.clone(), buf.clone()))));
                } else {
                    outcome.missed.insert(comp);
                }
            }
        }
        let check = if copies == 1 { BatchCheck::All } else { BatchCheck::Columns(touched) };
        Ok(WriteBatch { tasks, check })
    }

    /// Reed-Solomon: the stripes of `[a, a + data.len())` read where
    /// partial, merged, encoded, and their writes issued.
    async fn prepare_rs(
        &mut self,
        a: u64,
        data: &[u8],
        size_before: u64,
        new_size: u64,
        outcome: &mut WriteOutcome,
    ) -> Result<WriteBatch, StripeError> {
        let (k, m, u) = (self.g.data_columns(), self.g.parity(), self.g.unit());
        let b = a + data.len() as u64;
        let (s0, s1) = (a / self.g.stripe_bytes(), (b - 1) / self.g.stripe_bytes() + 1);
        let n = (s1 - s0) as usize;
        // Per stripe and column: the chunk bytes the write covers.
        let mut touched: Vec<Vec<Option<Range<u64>>>> = vec![vec![None; k]; n];
        for e in self.g.extents(a, data.len() as u64) {
            let lo = e.comp_offset - e.stripe * u;
            touched[(e.stripe - s0) as usize][e.column] = Some(lo..lo + e.len);
        }
        // Old bytes the write does not cover, to merge.
        let mut wants: Wants = vec![Vec::new(); k];
        for (i, row) in touched.iter().enumerate() {
            let s = s0 + i as u64;
            for c in 0..k {
                let old = self.g.chunk_len(size_before, s, c);
                let covered = row[c].as_ref().is_some_and(|t| t.start == 0 && t.end >= old);
                if old > 0 && !covered {
                    push_range(&mut wants[c], s * u..s * u + old);
                }
            }
        }
        let old = if wants.iter().any(|w| !w.is_empty()) {
            let fetch = self.issue_fetch(size_before, wants.clone());
            Some(self.complete_fetch(fetch).await?)
        } else {
            None
        };
        // The stripes' new shards, column by column: column `c` holds chunk
        // `c` of each stripe `i` at `at[i]`, `shard_lens[i]` bytes (a whole
        // unit but perhaps in the last stripe); old bytes, then the write's
        // over them. Column-major, a column is also the bytes its component
        // is written, with no further copy when the write covers it whole.
        let shard_lens: Vec<usize> =
            (0..n).map(|i| self.g.parity_chunk_len(new_size, s0 + i as u64) as usize).collect();
        let at: Vec<usize> = shard_lens.iter().scan(0, |sum, len| Some(std::mem::replace(sum, *sum + len))).collect();
        let column_len: usize = shard_lens.iter().sum();
        let mut columns: Vec<Vec<u8>> = vec![vec![0u8; column_len]; k];
        if let Some(old) = &old {
            for c in 0..k {
                let mut from = 0usize;
                // A want may span stripes (merged with its neighbour): copy unit by unit.
                for w in &wants[c] {
                    let mut x = w.start;
                    while x < w.end {
                        let (i, lo) = ((x / u - s0) as usize, (x % u) as usize);
                        let len = ((u - x % u).min(w.end - x)) as usize;
                        columns[c][at[i] + lo..at[i] + lo + len].copy_from_slice(&old[c][from..from + len]);
                        from += len;
                        x += len as u64;
                    }
                }
            }
        }
        for e in self.g.extents(a, data.len() as u64) {
            let (i, lo, from) = ((e.stripe - s0) as usize, (e.comp_offset % u) as usize, (e.file_offset - a) as usize);
            columns[e.column][at[i] + lo..at[i] + lo + e.len as usize]
                .copy_from_slice(&data[from..from + e.len as usize]);
        }
        let coder = self.coder.expect("Reed-Solomon has a coder");
        // Encoding a batch takes milliseconds: off the async workers, the
        // parity appended to its components' buffers as it is made (each
        // sized once: grown piece by piece, reallocations copied it over and over).
        let (columns, parity) = {
            let (shard_lens, at) = (shard_lens.clone(), at.clone());
            self.shared
                .pool
                .env()
                .spawn_blocking(move || {
                    let mut parity: Vec<Vec<u8>> = (0..m).map(|_| Vec::with_capacity(column_len)).collect();
                    let mut encoder = coder.encoder();
                    let encoded = (0..n).try_for_each(|i| {
                        let shards: Vec<&[u8]> = columns.iter().map(|col| &col[at[i]..at[i] + shard_lens[i]]).collect();
                        encoder.encode_into(&shards, shard_lens[i], |j, shard| parity[j].extend_from_slice(shard))
                    });
                    (columns, encoded.map(|()| parity))
                })
                .await
                .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
        };
        let parity = parity.map_err(|e| self.coding_failed(e))?;
        // Per component: regions and bytes.
        let mut ranges: Vec<Vec<Range<u64>>> = vec![Vec::new(); k + m];
        let mut per_stripe = Vec::with_capacity(n);
        // Per data column: the span of its column the write covers (the
        // touched chunks are consecutive stripes, whole but perhaps the first and last).
        let mut spans: Vec<Option<Range<usize>>> = vec![None; k];
        for i in 0..n {
            let s = s0 + i as u64;
            let (mut written, mut untouched) = (Vec::new(), Vec::new());
            for c in 0..k {
                match &touched[i][c] {
                    Some(t) => {
                        push_range(&mut ranges[c], s * u + t.start..s * u + t.end);
                        let (lo, hi) = (at[i] + t.start as usize, at[i] + t.end as usize);
                        spans[c] = Some(spans[c].as_ref().map_or(lo..hi, |sp| {
                            // What is written must be what the regions say.
                            assert_eq!(sp.end, lo, "a column's touched chunks are consecutive in it");
                            sp.start..hi
                        }));
                        let whole = t.start == 0 && t.end >= self.g.chunk_len(new_size, s, c);
                        written.push((c, whole));
                    }
                    None => untouched.push(c),
                }
            }
            for (j, parity_ranges) in ranges[k..].iter_mut().enumerate() {
                push_range(parity_ranges, s * u..s * u + shard_lens[i] as u64);
                written.push((k + j, true));
            }
            per_stripe.push((written, untouched));
        }
        let mut bytes: Vec<Vec<u8>> = columns
            .into_iter()
            .zip(&spans)
            .map(|(mut column, span)| match span {
                None => Vec::new(),
                Some(span) if span.start == 0 => {
                    column.truncate(span.end);
                    column
                }
                Some(span) => column[span.clone()].to_vec(),
            })
            .collect();
        bytes.extend(parity);
        // Refuse before writing if some stripe cannot keep k chunks.
        for (written, untouched) in &per_stripe {
            if self.holders(written, untouched, |c| self.writable(c)) < k {
                return Err(self.unavailable(self.non_holders(written, untouched, |c| self.writable(c))));
            }
        }
        let mut tasks = Vec::new();
        for c in 0..k + m {
            if ranges[c].is_empty() {
                continue;
            }
            if !self.writable(c) {
                outcome.missed.insert(c);
                continue;
            }
            let regions: Vec<Region> = ranges[c].iter().map(region).collect();
            let span = ranges[c][0].start..ranges[c].last().expect("not empty").end;
            tasks.push((c, Some(span), self.spawn(c, Req::Write(regions, Arc::new(std::mem::take(&mut bytes[c]))))));
        }
        Ok(WriteBatch { tasks, check: BatchCheck::Stripes(per_stripe) })
    }

    /// Components holding a stripe after a write: written ones that `took`
    /// the write and were current or got their whole chunk, and untouched
    /// data columns that are readable.
    fn holders(&self, written: &[(usize, bool)], untouched: &[usize], took: impl Fn(usize) -> bool) -> usize {
        let current = |c: usize| self.state(c) == ComponentState::Ok;
        written.iter().filter(|&&(c, whole)| took(c) && (whole || current(c))).count()
            + untouched.iter().filter(|&&c| self.readable(c)).count()
    }

    /// The components of a stripe that do not hold it (see [`Op::holders`]).
    fn non_holders(&self, written: &[(usize, bool)], untouched: &[usize], took: impl Fn(usize) -> bool) -> Vec<usize> {
        let current = |c: usize| self.state(c) == ComponentState::Ok;
        let lost = written.iter().filter(|&&(c, whole)| !(took(c) && (whole || current(c)))).map(|&(c, _)| c);
        lost.chain(untouched.iter().copied().filter(|&c| !self.readable(c))).collect()
    }

    /// Joins a batch's writes, recording failures as missed.
    async fn join_writes(&mut self, batch: WriteBatch, outcome: &mut WriteOutcome) -> Result<BatchCheck, StripeError> {
        let mut failed_now = Vec::new();
        for (c, span, task) in batch.tasks {
            match task.join().await {
                Ok(_) => {
                    outcome.written.insert(c);
                }
                Err(TaskError::Fatal(e)) => return Err(e),
                Err(TaskError::Component(cause)) => {
                    self.record(c, span, cause);
                    outcome.missed.insert(c);
                    failed_now.push(c);
                }
            }
        }
        for c in &failed_now {
            if !outcome.failed.iter().any(|f| f.component == *c) {
                outcome.failed.push(self.failed[c].clone());
            }
        }
        if matches!(batch.check, BatchCheck::All) && !failed_now.is_empty() {
            return Err(self.unavailable(failed_now));
        }
        Ok(batch.check)
    }

    /// Joins a batch's writes and checks that its bytes stay readable.
    async fn complete_write(&mut self, batch: WriteBatch, outcome: &mut WriteOutcome) -> Result<(), StripeError> {
        match self.join_writes(batch, outcome).await? {
            BatchCheck::Nothing | BatchCheck::All => {}
            BatchCheck::Columns(columns) => {
                for c in columns {
                    let copies: Vec<usize> = (0..self.g.copies()).map(|r| self.g.data_component(c, r)).collect();
                    if copies.iter().all(|x| !outcome.written.contains(x) || outcome.missed.contains(x)) {
                        return Err(self.unavailable(copies));
                    }
                }
            }
            BatchCheck::Stripes(stripes) => {
                let k = self.g.data_columns();
                for (written, untouched) in &stripes {
                    if self.holders(written, untouched, |c| !outcome.missed.contains(&c)) < k {
                        return Err(
                            self.unavailable(self.non_holders(written, untouched, |c| !outcome.missed.contains(&c)))
                        );
                    }
                }
            }
        }
        Ok(())
    }
}
