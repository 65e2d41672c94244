//! One request to one component: lease a connection, send, and — for a
//! refusal a fresh binding may cure, or a reused connection that broke —
//! try once more. Runs as its own task so the engine can keep requests to
//! every component in flight at once.
//!
//! The whole request is bounded by [`crate::REQUEST_DEADLINE_MS`] and each
//! wait within it by `Options::wait_deadline`. A refusal in [`refreshable`]
//! (expired, revoked, retired key, nonce window, no such object,
//! `MAP_EPOCH_MOVED`) gets one refresh of the binding, shared by concurrent
//! refusals; `NOT_IN_PAL` one `Binder::refresh_pal`; an identity's expiry
//! one `Binder::renew_identity`. A reused connection that broke gets one
//! reconnect — never a request that timed out: a drive that did not answer
//! in time has failed it (`FailureCause::is_time_out`).

use crate::error::{FailureCause, StripeError};
use crate::pool::{unusable_connection, Deadlines, DrivePool};
use crate::target::{Binder, Binding, Target};
use nasd_client::ClientError;
use nasd_proto::layout::Layout;
use nasd_proto::limits::DIGESTS_MAX;
use nasd_proto::{Region, Status};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Binding refreshes one component request may trigger: a request the drive
/// refused as stale is tried again with a fresh target, at most twice —
/// during a rebalance two binding changes can land within one request (a
/// move off the drive raises its map epoch, refusing every capability there;
/// the fresh ones may still name a component that moves next, and whose old
/// object is then gone).
const REFRESHES_PER_REQUEST_MAX: usize = 2;
/// New connections one component request may try after a reused (idle)
/// connection broke: the drive may have closed it while it sat idle, just
/// after the pool found it open. Never after a time-out: a drive that did
/// not answer in time counts as failed for the request at once.
const RECONNECTS_PER_REQUEST_MAX: usize = 1;

/// Refusals a fresh binding may cure: a capability that expired, was
/// revoked, or was made with a retired working key; a nonce the drive's
/// clock put outside its window (the refusal taught the client the clock);
/// an object that does not exist (the component may have moved to another
/// object or drive); and a cluster map that moved past the capabilities'
/// epoch (`MAP_EPOCH_MOVED`).
///
/// `MAP_EPOCH_MOVED` is matched by its wire name rather than by variant, so
/// this compiles against a `nasd_proto::Status` that has it and one that
/// does not yet. Every other refusal is final for the request. This is the
/// one list; extend it here.
pub fn refreshable(status: Status) -> bool {
    matches!(
        status,
        Status::CapabilityExpired
            | Status::AccessRevoked
            | Status::KeyVersionRetired
            | Status::NonceOutsideWindow
            | Status::NoSuchObject
    ) || status.name() == "MAP_EPOCH_MOVED"
}

/// A failure of the connection itself (not a refusal, not a time-out).
fn broken_connection(cause: &FailureCause) -> bool {
    !cause.is_time_out()
        && matches!(cause, FailureCause::Drive(e) if matches!(**e, ClientError::Io(_) | ClientError::Broken))
}

/// What one component request does.
#[derive(Debug)]
pub(crate) enum Req {
    /// Read these regions; the reply is their bytes, each zero-padded to its
    /// region's length (bytes past the object's end read as zeros).
    Read(Vec<Region>),
    /// Write these bytes (the regions' bytes in order).
    Write(Vec<Region>, Arc<Vec<u8>>),
    /// Make the object durable.
    Flush,
    /// The object's stored byte ranges from `offset` on, at most `max`
    /// (`EXTENTS`).
    Extents {
        offset: u64,
        max: u16,
    },
    /// The stored digests of the component's blocks from block
    /// `from_block` on (at its drive's block size), as many as one
    /// `DIGESTS` request takes, up to the block holding byte
    /// `column_len - 1` (`column_len > 0`).
    Digests {
        from_block: u64,
        column_len: u64,
    },
    Prefetch(nasd_proto::extension::PrefetchCall),
}

/// What a component request answered.
#[derive(Debug)]
pub(crate) enum Answer {
    /// A read's bytes.
    Bytes(Vec<u8>),
    /// `EXTENTS`: the stored ranges, and how far the answer goes.
    Extents(Vec<Region>, u64),
    /// `DIGESTS`: the drive's block size, the object's size, the digests.
    Digests(u32, u64, Vec<nasd_crypto::BlockDigest>),
    /// `prefetch-v1`: the read hints the drive queued.
    Queued(u16),
    /// Nothing to return (a write, a flush).
    Done,
}

/// Why a component request did not succeed.
#[derive(Debug)]
pub(crate) enum TaskError {
    /// The component failed; the operation may go on without it.
    Component(FailureCause),
    /// The operation cannot go on (the layout changed, the target is bad).
    Fatal(StripeError),
}

/// The shared state component requests need.
pub(crate) struct Shared {
    pub(crate) pool: Arc<DrivePool>,
    pub(crate) binder: Arc<dyn Binder>,
    /// Serializes refreshes, so requests that failed together refresh once.
    pub(crate) refresh_lock: tokio::sync::Mutex<()>,
    /// How many times the binder set the PALs again (`Binder::refresh_pal`):
    /// requests refused together ask once.
    pub(crate) pal_refreshes: std::sync::atomic::AtomicU64,
    pub(crate) request_deadline: Duration,
    pub(crate) deadlines: Deadlines,
}

/// A spawned component request, aborted if dropped before it finished (so a
/// cancelled operation leaves no request running; an aborted request's
/// connection is closed, and a write cut short is discarded by the drive).
pub(crate) struct Task {
    handle: JoinHandle<Result<Answer, TaskError>>,
}

impl Drop for Task {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

impl Task {
    pub(crate) fn spawn(shared: &Arc<Shared>, layout: Layout, component: usize, req: Req) -> Task {
        let shared = shared.clone();
        let env = shared.pool.env().clone();
        // The request belongs to the caller's operation: it carries its trace id.
        let trace = nasd_client::trace::current();
        let request = async move { shared.request(layout, component, &req).await };
        Task { handle: env.spawn(nasd_client::trace::scope(trace, request)) }
    }

    /// The request's result: `Some(bytes)` for a read.
    pub(crate) async fn join(self) -> Result<Option<Vec<u8>>, TaskError> {
        Ok(match self.answer().await? {
            Answer::Bytes(b) => Some(b),
            Answer::Extents(..) | Answer::Digests(..) | Answer::Queued(_) | Answer::Done => None,
        })
    }

    /// An `EXTENTS` request's result.
    pub(crate) async fn join_extents(self) -> Result<(Vec<Region>, u64), TaskError> {
        match self.answer().await? {
            Answer::Extents(extents, covered_end) => Ok((extents, covered_end)),
            other => Err(TaskError::Fatal(StripeError::Bind(format!("extents request answered {other:?}")))),
        }
    }

    /// A `DIGESTS` request's result: block size, object size, digests.
    pub(crate) async fn join_queued(self) -> Result<u16, TaskError> {
        match self.answer().await? {
            Answer::Queued(n) => Ok(n),
            _ => Ok(0),
        }
    }

    pub(crate) async fn join_digests(self) -> Result<(u32, u64, Vec<nasd_crypto::BlockDigest>), TaskError> {
        match self.answer().await? {
            Answer::Digests(block_size, logical_size, digests) => Ok((block_size, logical_size, digests)),
            other => Err(TaskError::Fatal(StripeError::Bind(format!("digests request answered {other:?}")))),
        }
    }

    async fn answer(mut self) -> Result<Answer, TaskError> {
        match (&mut self.handle).await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(TaskError::Fatal(StripeError::Bind(format!("component request task ended: {e}")))),
        }
    }
}

impl Shared {
    async fn request(&self, layout: Layout, component: usize, req: &Req) -> Result<Answer, TaskError> {
        let mut target = self.binder.current();
        let (mut refreshes, mut reconnects, mut pal_asked, mut renewed) = (0, 0, false, false);
        loop {
            let pals_seen = self.pal_refreshes.load(std::sync::atomic::Ordering::SeqCst);
            if target.layout != layout {
                return Err(TaskError::Fatal(StripeError::LayoutChanged { before: layout, after: target.layout }));
            }
            let Some(binding) = target.components.get(component) else {
                return Err(TaskError::Fatal(StripeError::BadTarget(format!("no binding for component {component}"))));
            };
            let cause = match self.attempt(binding, req).await {
                Ok(v) => return Ok(v),
                Err((cause, reused)) => {
                    if reconnects < RECONNECTS_PER_REQUEST_MAX && reused && broken_connection(&cause) {
                        reconnects += 1;
                        continue;
                    }
                    cause
                }
            };
            if !renewed && self.identity_ran_out(cause.status()) {
                // The identity key ran out: renewed (or found renewed by another request), retried once.
                renewed = true;
                if self.binder.renew_identity().await.map_err(TaskError::Fatal)? {
                    continue;
                }
            }
            if !pal_asked && cause.status() == Some(Status::NotInPal) {
                // The drive has no PAL entry for the identity: asked set again, retried once.
                pal_asked = true;
                let write = !matches!(req, Req::Read(_) | Req::Extents { .. } | Req::Digests { .. } | Req::Prefetch(_));
                if self.refresh_pal(pals_seen, write).await.map_err(TaskError::Fatal)? {
                    continue;
                }
            }
            if refreshes < REFRESHES_PER_REQUEST_MAX && cause.status().is_some_and(refreshable) {
                refreshes += 1;
                if let Some(t) = self.refresh(&target).await.map_err(TaskError::Fatal)? {
                    target = t;
                    continue;
                }
            }
            return Err(TaskError::Component(cause));
        }
    }

    /// Whether a refusal with `status` may mean the pool's identity ran out:
    /// `IDENTITY_EXPIRED`, or `KEY_VERSION_RETIRED` while the pool holds an
    /// identity (its key id retired; the same status says a capability's
    /// working key was retired, which a renewal does not cure, and the
    /// refresh after it does).
    fn identity_ran_out(&self, status: Option<Status>) -> bool {
        match status {
            Some(Status::IdentityExpired) => true,
            Some(Status::KeyVersionRetired) => self.pool.identity().is_some(),
            _ => false,
        }
    }

    /// One try: returns the failure and whether it was on a reused connection.
    async fn attempt(&self, binding: &Binding, req: &Req) -> Result<Answer, (FailureCause, bool)> {
        let mut lease = self.pool.lease(binding).await;
        let reused = lease.reused;
        let r = tokio::time::timeout(self.request_deadline, async {
            let c = lease.client(binding, self.deadlines).await?;
            send(c, binding, req).await.map_err(|e| FailureCause::Drive(Arc::new(e)))
        })
        .await;
        match r {
            Ok(Ok(v)) => {
                lease.release();
                Ok(v)
            }
            Ok(Err(cause)) => {
                match &cause {
                    FailureCause::Drive(e) if unusable_connection(e) => lease.discard(),
                    FailureCause::WrongDrive { .. } => lease.discard(),
                    _ => lease.release(),
                }
                Err((cause, reused))
            }
            // Cut off mid-request: the connection's state is unknown.
            Err(_) => {
                lease.discard();
                Err((FailureCause::Deadline, reused))
            }
        }
    }

    /// Has the binder set the PALs again, unless another request did since
    /// `seen` was read; whether to retry.
    async fn refresh_pal(&self, seen: u64, write: bool) -> Result<bool, StripeError> {
        let _one_at_a_time = self.refresh_lock.lock().await;
        if self.pal_refreshes.load(std::sync::atomic::Ordering::SeqCst) != seen {
            return Ok(true);
        }
        let set = self.binder.refresh_pal(write).await?;
        if set {
            self.pal_refreshes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(set)
    }

    /// A fresh target, unless another request refreshed since `stale` was
    /// current; `None` if the binder could not refresh (the request then
    /// fails with its own cause).
    async fn refresh(&self, stale: &Arc<Target>) -> Result<Option<Arc<Target>>, StripeError> {
        let _one_at_a_time = self.refresh_lock.lock().await;
        let current = self.binder.current();
        if !Arc::ptr_eq(&current, stale) {
            return Ok(Some(current));
        }
        match self.binder.refresh().await {
            Ok(fresh) => {
                fresh.check()?;
                Ok(Some(fresh))
            }
            Err(e) => {
                tracing::warn!(error = %e, "refreshing a striped object's bindings failed");
                Ok(None)
            }
        }
    }
}

async fn send(c: &mut nasd_client::DriveClient, b: &Binding, req: &Req) -> Result<Answer, ClientError> {
    match req {
        Req::Read(regions) => {
            let (lengths, data) = c.read(b.partition, b.object, regions).await?;
            Ok(Answer::Bytes(pad(regions, &lengths, data)))
        }
        Req::Write(regions, data) => {
            let n = c.write(b.partition, b.object, regions, data).await?;
            if n != data.len() as u64 {
                return Err(ClientError::Protocol(format!("drive wrote {n} of {} bytes", data.len())));
            }
            Ok(Answer::Done)
        }
        Req::Flush => c.flush(b.partition, &[b.object]).await.map(|()| Answer::Done),
        Req::Extents { offset, max } => {
            let (extents, covered_end) = c.extents(b.partition, b.object, *offset, *max).await?;
            Ok(Answer::Extents(extents, covered_end))
        }
        Req::Digests { from_block, column_len } => {
            let bs = c.block_size();
            let blocks = column_len.div_ceil(u64::from(bs)).saturating_sub(*from_block).min(DIGESTS_MAX as u64);
            let blocks = u16::try_from(blocks.max(1)).expect("at most DIGESTS_MAX blocks");
            let (logical_size, digests) = c.digests(b.partition, b.object, *from_block, blocks).await?;
            Ok(Answer::Digests(bs, logical_size, digests))
        }
        Req::Prefetch(call) => c.prefetch(b.partition, b.object, call).await.map(Answer::Queued),
    }
}

/// The regions' bytes, each zero-padded to its region's length. The client
/// checked that no length exceeds its region and that they sum to the data.
fn pad(regions: &[Region], lengths: &[u64], data: Vec<u8>) -> Vec<u8> {
    if regions.iter().zip(lengths).all(|(r, l)| r.length == *l) {
        return data;
    }
    let total: u64 = regions.iter().map(|r| r.length).sum();
    let mut out = vec![0u8; total as usize];
    let (mut at_out, mut at_in) = (0usize, 0usize);
    for (r, &l) in regions.iter().zip(lengths) {
        out[at_out..at_out + l as usize].copy_from_slice(&data[at_in..at_in + l as usize]);
        at_out += r.length as usize;
        at_in += l as usize;
    }
    out
}
