//! The manager as coordinator of write transactions (Slice §3.3.2): a write
//! that changes several drives must not leave a stripe half old and half
//! new after a crash (the RAID write hole). The drives can roll back
//! (`nasd_store`'s undo); the manager keeps the intention log.
//!
//! 1. `BEGIN_WRITE` logs an **intent** (`nasd_meta` `intents.rs`: txn id,
//!    inode, writer, lease deadline, the components the writer may change —
//!    all for a client, none for the manager's repairs — and those the
//!    transaction could not be opened on) and opens transaction `txn` on
//!    every component's drive (`TXN_BEGIN`, drive key). A component it cannot
//!    be opened on is not marked stale (it missed nothing yet); it is
//!    recorded with the intent. One transaction per file: another writer
//!    waits up to [`BEGIN_WAIT`], then `BUSY`.
//! 2. The client writes under its capabilities; each drive keeps undo for
//!    the blocks the transaction overwrites, durably with its index.
//! 3. To commit (`flush`, `fsync`, `close`, or when the transaction grows old
//!    or large) the client `FLUSH`es every component it wrote and sends
//!    `COMMIT`. One metadata transaction records the outcome: the intent
//!    Committed, the size and times, the components that missed writes
//!    stale with their dirty ranges (at most `nasd_meta::STALE_RANGES_MAX` per
//!    component, merged beyond). Then `TXN_END commit` on the drives drops
//!    the undo, and the intent is forgotten.
//! 4. A writer whose lease runs out is rolled back (`Manager::abort`):
//!    intent Aborting, the file's capabilities revoked, on each component
//!    the writer may have changed the access-control version set and then
//!    `TXN_END abort` and a flush, and only then the intent deleted.
//!    The manager's own transactions (size changes, repairs) run inside one
//!    request or pass; one whose process died (recorded as
//!    `MANAGER_WRITER_UID`'s, not being made here, on a metadata store no
//!    other manager shares) is rolled back at once ([`Manager::orphaned`]).
//!
//! So every stripe reads old or new after a crash of the client, the
//! manager or drives at any point: before the commit record, recovery rolls
//! back; after it, every drive already holds the new data durably and
//! recovery rolls forward. Recovery (at start, and whenever a drive comes
//! back) lists each drive's open transactions (`TXN_LIST`): one whose intent
//! is Open is left to its writer or its lease, Aborting is aborted, and one
//! with no intent is committed — an intent is deleted without drive work
//! only when committed, an aborted one stays until every drive made its
//! abort durable, so a transaction unknown to the manager was committed
//! (presumed commit). Compared with Slice, the drives' undo replaces the
//! coordinator's probing of participants, the commit record rides on the
//! size update `COMMIT` needs anyway, and intents are logged once per
//! transaction, not per write.
//!
//! **Invariant:** a component is recorded Stale only if it may differ from
//! what the file holds: it missed a committed write or size change (recorded
//! in the commit's own metadata transaction), or it may keep bytes of a
//! transaction rolled back without it. An operation that merely could not
//! reach a drive marks nothing.
//!
//! Small writes (`write_small`) obey the same one-writer rule: under the
//! writer's open transaction they are staged (`nasd_meta` `small.rs`);
//! outside one, each is its own metadata transaction; while another
//! writer's transaction holds the file they wait like `BEGIN_WRITE`, then
//! answer `BUSY`; each attempt holds the file's `Manager::inode_lock`.

use crate::drives::DriveHandle;
use crate::service::Session;
use crate::{Failure, Manager};
use nasd_meta::{Inode, Intent, IntentState, StaleRange, MANAGER_WRITER_UID};
use nasd_proto::fs::{FsStatus, Ino, ObjectRef};
use nasd_proto::layout::ComponentState;
use nasd_proto::manager::{ManagerReply, DIRTY_RANGES_MAX};
use nasd_proto::Status;
use nasd_stripe::geometry::{Geometry, Role};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// How long `BEGIN_WRITE` waits for another writer's transaction on the
/// same file to end before answering `BUSY`.
pub const BEGIN_WAIT: Duration = Duration::from_secs(10);
/// How often a waiting `BEGIN_WRITE` looks again.
const BEGIN_POLL: Duration = Duration::from_millis(20);
/// Open transactions listed per `TXN_LIST` request during recovery.
const TXN_LIST_PAGE: u16 = 1024;
/// Who makes a write transaction ([`Manager::begin_scoped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writer {
    /// A client, which writes under capabilities and commits with `COMMIT`.
    Client,
    /// The manager itself (a size change, a repair), inside one request or
    /// pass of this process.
    Manager,
}

/// This process is making a transaction of its own on an inode: while it
/// lives the transaction is not taken for an orphan ([`Manager::orphaned`]).
pub(crate) struct OwnWrite<'a> {
    manager: &'a Manager,
    ino: Ino,
}

impl Drop for OwnWrite<'_> {
    fn drop(&mut self) {
        let mut writing = self.manager.own_writes.lock().expect("own writes lock");
        if let Some(n) = writing.get_mut(&self.ino) {
            *n -= 1;
            if *n == 0 {
                writing.remove(&self.ino);
            }
        }
    }
}

impl Manager {
    /// Marks that this process makes a transaction of its own on `ino`,
    /// until the returned guard is dropped.
    pub(crate) fn own_write(&self, ino: Ino) -> OwnWrite<'_> {
        *self.own_writes.lock().expect("own writes lock").entry(ino).or_insert(0) += 1;
        OwnWrite { manager: self, ino }
    }

    fn writing_here(&self, ino: Ino) -> bool {
        self.own_writes.lock().expect("own writes lock").contains_key(&ino)
    }

    /// Whether `intent` is a transaction of the manager's own whose writer
    /// is gone: recorded as [`MANAGER_WRITER_UID`]'s and not being made by
    /// this process, on a metadata store no other manager shares — the
    /// process that began it died (a killed manager's size change): no one
    /// will commit it, and its cut may have reached some components, so it
    /// is rolled back at once rather than readable, torn, until its lease
    /// ends (nasd-sim's cluster seed 12). On a shared database another
    /// manager may be making it: its lease decides.
    pub(crate) fn orphaned(&self, intent: &Intent) -> bool {
        intent.uid == MANAGER_WRITER_UID && !self.shared_database() && !self.writing_here(intent.ino)
    }
}

impl Manager {
    /// Whether `inode`'s bytes can still be read, so resynced, from its
    /// components outside `out` that are `Ok` on drives up: a component of
    /// `out` marked stale could then be resynced from them. A layout without
    /// redundancy never can; a redundant one that already lost what it
    /// tolerates (a component on a drive gone, or stale) cannot either:
    /// nasd-sim's cluster seed 8 (60 s) marked stale the `rs:2+1`
    /// component of a drive that was down during a failed truncation, with
    /// another component on a drive gone for good, and the file's committed
    /// bytes — intact on the drive once it was back — were never readable
    /// again.
    fn resyncable_without(&self, inode: &Inode, out: impl Fn(usize) -> bool) -> bool {
        let Some(layout) = inode.layout.as_ref() else { return false };
        let needed = inode.components.len().saturating_sub(layout.tolerates());
        let sources = inode
            .components
            .iter()
            .enumerate()
            .filter(|(i, c)| !out(*i) && c.state == ComponentState::Ok && self.is_up(c.object.drive))
            .count();
        layout.tolerates() > 0 && sources >= needed
    }
}

/// Most stale ranges recorded per component per commit; more are merged
/// into ranges covering them.
const STALE_RANGES_PER_COMMIT_MAX: usize = DIRTY_RANGES_MAX;

/// A write transaction [`Manager::begin_scoped`] opened.
#[derive(Debug)]
pub(crate) struct Began {
    /// Its id.
    pub txn: u64,
    /// The size the writer may make the file, at most.
    pub size_limit: u64,
    /// The components the transaction could not be opened on (a bit set):
    /// a write there would have no undo.
    pub unopened: u64,
}

// A file's components fit the bit sets of its intent.
const _: () = assert!(nasd_proto::layout::COMPONENTS_MAX <= 64);

/// Component indices as the bit set [`Intent::writes`] uses.
fn component_bits(components: &BTreeSet<usize>) -> u64 {
    components.iter().filter(|&&i| i < 64).fold(0, |bits, &i| bits | 1 << i)
}

/// Whether the bit set `bits` holds component `idx`.
pub(crate) fn holds(bits: u64, idx: usize) -> bool {
    idx < 64 && bits & (1 << idx) != 0
}

/// The component ranges that the file ranges `dirty` touch in component `idx`
/// of a file laid out by `g`, merged and at most
/// [`STALE_RANGES_PER_COMMIT_MAX`] of them (neighbours merged first).
pub(crate) fn component_ranges(g: &Geometry, idx: usize, dirty: &[(u64, u64)]) -> Vec<StaleRange> {
    let unit = g.unit();
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let role = g.role(idx);
    for &(offset, length) in dirty {
        match role {
            nasd_stripe::geometry::Role::Data { column, .. } => {
                for e in g.extents(offset, length) {
                    if e.column == column {
                        ranges.push((e.comp_offset, e.comp_offset + e.len));
                    }
                }
            }
            nasd_stripe::geometry::Role::Parity { .. } => {
                let first = g.locate(offset).stripe;
                let last = g.locate(offset + length - 1).stripe;
                ranges.push((first * unit, (last + 1) * unit));
            }
        }
    }
    merge_ranges(ranges, STALE_RANGES_PER_COMMIT_MAX)
}

/// Sorts and merges overlapping or touching ranges, then merges the
/// closest neighbours until at most `max` remain.
fn merge_ranges(mut ranges: Vec<(u64, u64)>, max: usize) -> Vec<StaleRange> {
    assert!(max > 0);
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    while merged.len() > max {
        let i = (0..merged.len() - 1).min_by_key(|&i| merged[i + 1].0 - merged[i].1).expect("two ranges or more");
        merged[i].1 = merged[i + 1].1;
        merged.remove(i + 1);
    }
    merged.into_iter().map(|(a, b)| StaleRange { offset: a, length: b - a }).collect()
}

impl Manager {
    /// `BEGIN_WRITE`: opens a write transaction on `ino` for `s`, waiting up
    /// to [`BEGIN_WAIT`] for another writer's to end, rolling back one whose
    /// lease ran out. The writer may change every component.
    pub(crate) async fn begin_write(&self, s: &Session, ino: Ino) -> Result<ManagerReply, Failure> {
        let began = self.begin_scoped(s, ino, Intent::ALL, Writer::Client).await?;
        let lease_ms = self.config.write_lease.as_millis().min(u32::MAX as u128) as u32;
        Ok(ManagerReply::Began { txn: began.txn, lease_ms, size_limit: began.size_limit })
    }

    /// Opens a write transaction on `ino` for `s` (as
    /// [`begin_write`](Self::begin_write)) whose writer changes at most the
    /// components in the bit set `writes` ([`Intent::writes`]).
    ///
    /// A component the transaction cannot be opened on (its drive is down,
    /// or dead and not noticed yet, or failed `TXN_BEGIN`) is not marked
    /// stale: it has missed nothing yet. Were the writer to land bytes there
    /// and the transaction be rolled back, they would have no undo; so such
    /// a component among `writes` is recorded with the intent
    /// ([`Intent::unopened`]) and the rollback marks it stale
    /// ([`abort`](Self::abort)). A commit needs nothing of it: the writer
    /// reports the components its writes missed. On a layout without
    /// redundancy, which could never resync it, such a transaction is not
    /// begun: `DRIVE_UNAVAILABLE` (the file cannot be written while a drive
    /// of its is down; found by nasd-sim's seeds 3, 5, 11 and 14); nor on a
    /// redundant one whose other components cannot rebuild it
    /// ([`Manager::resyncable_without`]: seed 8).
    ///
    /// The manager's own transactions ([`Writer::Manager`]) are recorded as
    /// [`MANAGER_WRITER_UID`]'s; the caller holds an [`OwnWrite`] for `ino`
    /// until the transaction is committed or rolled back.
    pub(crate) async fn begin_scoped(
        &self,
        s: &Session,
        ino: Ino,
        writes: u64,
        writer: Writer,
    ) -> Result<Began, Failure> {
        let lease = self.config.write_lease;
        let waited_since = tokio::time::Instant::now();
        let txn = loop {
            let (c, deadline) = (s.caller.clone(), self.now_ns().saturating_add(lease.as_nanos() as i64));
            let begun = match writer {
                Writer::Client => self.meta(move |ns| ns.begin_write(&c, ino, deadline)).await,
                Writer::Manager => {
                    debug_assert!(self.writing_here(ino), "an own transaction is begun under an OwnWrite");
                    self.meta(move |ns| ns.begin_write_as(&c, ino, deadline, MANAGER_WRITER_UID)).await
                }
            };
            match begun {
                Ok(txn) => {
                    self.metrics.transaction_begun();
                    break txn;
                }
                Err(f) if f.status == FsStatus::Busy => {
                    self.wait_for_writer(ino, waited_since).await?;
                }
                Err(f) => return Err(f),
            }
        };
        // The intent is durable before any drive opens the transaction (write-ahead): a power
        // loss that took the intent back would leave the drives' transaction without one, which
        // recovery resolves as committed — the writer's unacknowledged changes (a truncating
        // CREATE's cut to size 0) kept under the metadata's old size (nasd-sim --cluster, seed
        // 170). It also keeps the transaction id from being issued again after such a loss.
        if let Err(e) = self.durable_before_drive_effects().await {
            self.abort(txn).await;
            return Err(e);
        }
        // The intent is committed: what follows waits out a short database outage rather than
        // leave the request partly done (found by netns_cluster, PostgreSQL killed in between).
        let inode = self.meta_after_write(move |ns| ns.getattr(ino)).await?;
        let unopened: BTreeSet<usize> = self.open_on_drives(&inode, txn).await.into_iter().collect();
        let unguarded = component_bits(&unopened) & writes;
        if unguarded != 0 && !self.resyncable_without(&inode, |i| unopened.contains(&i)) {
            return Err(self.refuse_unguarded_begin(&inode, txn, &unopened).await);
        }
        let intent = if writes != Intent::ALL || unguarded != 0 {
            Some(self.meta_after_write(move |ns| ns.scope_intent(ino, txn, writes, unguarded)).await?)
        } else {
            self.meta_after_write(move |ns| ns.intent(txn)).await?
        };
        let size_limit = intent.map_or(u64::MAX, |i| i.size_limit);
        Ok(Began { txn, size_limit, unopened: component_bits(&unopened) })
    }

    /// `WRITE_SMALL`: writes bytes below the file's small-file threshold in
    /// one metadata transaction — staged under `txn` if the caller names its
    /// open write transaction, installed by its `COMMIT` and dropped at its
    /// rollback (nasd-meta's `small.rs`) — waiting up to [`BEGIN_WAIT`] for
    /// another writer's write transaction to end, as `BEGIN_WRITE` does,
    /// rolling back one whose lease ran out.
    ///
    /// Each attempt holds the inode's serialization ([`Manager::inode_lock`]:
    /// on a database several managers share, the inode's lease row there),
    /// so small writes of one file through different managers take turns,
    /// and none lands inside another manager's `SETATTR` or truncating
    /// `CREATE` of the file (between its permission check and its commit).
    /// The wait for another writer's transaction is on the intent log in the
    /// database, whichever manager began it; the lease is not held while
    /// waiting.
    pub(crate) async fn write_small(
        &self,
        s: &Session,
        ino: Ino,
        txn: u64,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Inode, Failure> {
        let data = Arc::new(data);
        let waited_since = tokio::time::Instant::now();
        loop {
            let (c, d) = (s.caller.clone(), data.clone());
            let attempt = {
                let _serial = self.inode_lock(ino).await?;
                self.meta(move |ns| ns.write_small(&c, ino, txn, offset, &d)).await
            };
            match attempt {
                Err(f) if f.status == FsStatus::Busy => {
                    self.wait_for_writer(ino, waited_since).await?;
                }
                Err(f) if f.status == FsStatus::Aborted => {
                    return Err(Failure::new(
                        FsStatus::Aborted,
                        format!(
                            "write transaction {txn} is no longer open: it was rolled back (its lease ran out) or \
                             ended; the writes made under it are gone"
                        ),
                    ))
                }
                other => return other,
            }
        }
    }

    /// One turn of waiting for the writer whose transaction holds `ino`:
    /// rolls it back if its lease ran out, else sleeps [`BEGIN_POLL`]; `Busy`
    /// once `waited_since` is [`BEGIN_WAIT`] ago and the writer still holds it.
    async fn wait_for_writer(&self, ino: Ino, waited_since: tokio::time::Instant) -> Result<(), Failure> {
        self.metrics.write_conflict();
        let blocker = self.meta(move |ns| ns.intent_of(ino)).await?;
        if let Some(intent) = blocker {
            if !self.clear_intent(&intent).await && waited_since.elapsed() >= BEGIN_WAIT {
                return Err(Failure::new(FsStatus::Busy, "another writer has the file open for writing: try again"));
            }
        }
        tokio::time::sleep(BEGIN_POLL).await;
        Ok(())
    }

    /// Ends `intent` if it no longer holds the file: rolls it back if its
    /// lease ran out, finishes an abort. Returns whether it is gone.
    async fn clear_intent(&self, intent: &Intent) -> bool {
        match intent.state {
            IntentState::Open if intent.deadline_ns >= self.now_ns() && !self.orphaned(intent) => false,
            IntentState::Open | IntentState::Aborting => self.abort(intent.txn).await,
            // A committed intent is finished by whoever committed it; it is about to go.
            IntentState::Committed => {
                let txn = intent.txn;
                self.meta(move |ns| ns.finish_intent(txn)).await.is_ok()
            }
        }
    }

    /// Ends transaction `txn`, just begun on `inode` and opened on every
    /// component but `unopened`, before its writer had it: on a layout
    /// without redundancy a component the writer may change but no undo
    /// guards could only be marked stale at a rollback, and nothing could
    /// ever resync it — the file's committed bytes would be lost to a write
    /// that failed. Nothing was written under `txn`: its ends are tidiness
    /// (a drive that misses one resolves the transaction as committed, a
    /// no-op), and the intent goes without a rollback.
    async fn refuse_unguarded_begin(&self, inode: &Inode, txn: u64, unopened: &BTreeSet<usize>) -> Failure {
        let ends = inode.components.iter().enumerate().filter(|(idx, _)| !unopened.contains(idx)).map(|(_, c)| async {
            let Ok(d) = self.drive(c.object.drive) else { return };
            if let Err(e) = d.txn_end(c.object.object, txn, false).await {
                tracing::debug!(drive = d.drive, txn, error = %e, "an unused transaction is left to recovery");
            }
        });
        futures::future::join_all(ends).await;
        if let Err(f) = self.meta_after_write(move |ns| ns.finish_intent(txn)).await {
            // Its lease ends it: a rollback of a layout without redundancy waits for the drives.
            tracing::warn!(txn, error = %f, "an unused write intent is left to its lease");
        }
        let down: Vec<String> =
            unopened.iter().filter_map(|&idx| inode.components.get(idx)).map(|c| c.object.drive.to_string()).collect();
        Failure::new(
            FsStatus::DriveUnavailable,
            format!(
                "drive {} of this file does not answer and the file has no redundancy left: it cannot be \
                 written until the drive is back (nasd status shows the drives)",
                down.join(", ")
            ),
        )
    }

    /// Opens `txn` on every component of `inode`; returns the components it
    /// could not open it on (their drive is down or failed). A drive still
    /// holding an older transaction on the object (its end was lost) has it
    /// resolved first.
    async fn open_on_drives(&self, inode: &Inode, txn: u64) -> Vec<usize> {
        let opens = inode.components.iter().map(|c| self.open_component(c.object, txn));
        let opened = futures::future::join_all(opens).await;
        opened.iter().enumerate().filter(|(_, ok)| !**ok).map(|(i, _)| i).collect()
    }

    async fn open_component(&self, object: ObjectRef, txn: u64) -> bool {
        let Ok(d) = self.drive(object.drive) else { return false };
        if !self.is_up(d.drive) {
            return false;
        }
        for _ in 0..2 {
            match d.txn_begin(object.object, txn).await {
                Ok(()) => return true,
                Err(e) if e.status() == Some(Status::TxnConflict) => {
                    if let Err(e) = self.resolve_object_txns(&d, object.object).await {
                        tracing::warn!(drive = d.drive, object = object.object, error = %e, "cannot resolve an old transaction");
                        return false;
                    }
                }
                Err(e) => {
                    tracing::info!(drive = d.drive, object = object.object, txn, error = %e, "transaction not opened on a drive");
                    return false;
                }
            }
        }
        false
    }

    /// `ABORT_WRITE`: `s` gives up its transaction `txn` on `ino` (a write
    /// failed): rolled back at once, so the drive space and the quota escrow
    /// it held come back now, not when its lease runs out. Only its writer,
    /// or root. `Done` also when it is gone already or committed (nothing to
    /// roll back); a rollback a drive holds up is finished by maintenance.
    pub(crate) async fn abort_write(&self, s: &Session, ino: Ino, txn: u64) -> Result<ManagerReply, Failure> {
        let Some(intent) = self.meta(move |ns| ns.intent(txn)).await? else { return Ok(ManagerReply::Done) };
        if intent.ino != ino {
            return Err(Failure::new(FsStatus::InvalidArgument, format!("transaction {txn} is another file's")));
        }
        if intent.uid != s.caller.uid && !s.caller.is_root() {
            return Err(Failure::new(FsStatus::NotPermitted, format!("transaction {txn} is another user's")));
        }
        if intent.state != IntentState::Committed && !self.abort(txn).await {
            tracing::info!(txn, "a given-up write transaction is rolled back by maintenance once its drives answer");
        }
        Ok(ManagerReply::Done)
    }

    /// `COMMIT`: records the outcome of `s`'s transaction `txn` on `ino`.
    pub(crate) async fn commit_write(
        &self,
        s: &Session,
        ino: Ino,
        txn: u64,
        written_end: u64,
        missed: Vec<u8>,
        dirty: Vec<(u64, u64)>,
    ) -> Result<Inode, Failure> {
        match self.meta(move |ns| ns.intent(txn)).await? {
            Some(i) if i.ino != ino => {
                return Err(Failure::new(FsStatus::InvalidArgument, format!("transaction {txn} is another file's")))
            }
            Some(i) if i.state == IntentState::Open => {}
            // Committed by this request sent before, whose answer the database's going away
            // withheld ([`resolve_commit`](Self::resolve_commit)): the answer now.
            Some(i) if i.state == IntentState::Committed && (i.uid == s.caller.uid || s.caller.is_root()) => {
                return self.committed_before(ino, txn).await;
            }
            _ => {
                return Err(Failure::new(
                    FsStatus::Aborted,
                    format!(
                        "write transaction {txn} is no longer open: it was rolled back (its lease ran out) or ended; \
                         the writes made under it are gone"
                    ),
                ))
            }
        }
        let inode = self.meta(move |ns| ns.getattr(ino)).await?;
        let layout = inode.layout.ok_or_else(|| Failure::new(FsStatus::InvalidArgument, "not a regular file"))?;
        let g = Geometry::new(layout).map_err(|e| Failure::new(FsStatus::Internal, e.to_string()))?;
        let mut stale = Vec::new();
        for m in missed {
            let idx = m as usize;
            if idx >= inode.components.len() {
                return Err(Failure::new(FsStatus::InvalidArgument, format!("the file has no component {idx}")));
            }
            stale.extend(component_ranges(&g, idx, &dirty).into_iter().map(|r| (idx, r)));
        }
        // What the file's data takes now (quotas count it, not the size).
        let stored = self.stored_bytes(&inode, inode.attr.size.max(written_end)).await;
        let c = s.caller.clone();
        let now = self.now_ns();
        let committed = self.meta(move |ns| ns.commit_write(&c, ino, txn, written_end, stored, &stale, now)).await;
        let inode = match committed {
            Err(f) if f.status == FsStatus::QuotaExceeded => {
                // Past the escrow it was given: nothing of it may become the file's.
                self.abort(txn).await;
                return Err(Failure::new(
                    FsStatus::QuotaExceeded,
                    format!(
                        "write transaction {txn} wrote up to byte {written_end}, past the size its quota escrow \
                         allowed: rolled back"
                    ),
                ));
            }
            // Only a database across the network leaves a commit's outcome unknown.
            Err(f) if f.status == FsStatus::Internal && self.metadata_remote() => {
                return self.resolve_commit(ino, txn, f).await
            }
            other => other?,
        };
        // Committed: the writes are the file's. Forgetting the intent is tidiness that a
        // maintenance pass does too (it finishes every Committed intent it finds), so a database
        // that goes away now does not make the commit look failed, or "partly done", to a writer
        // that would then take its acknowledged writes for lost.
        if let Err(f) = self.meta(move |ns| ns.finish_intent(txn)).await {
            tracing::info!(txn, error = %f.message, "a committed write intent is left for maintenance to forget");
        }
        self.end_in_background(&inode, txn, true);
        Ok(inode)
    }

    /// Whether the metadata is on a database server (PostgreSQL), not in a
    /// local SQLite file.
    fn metadata_remote(&self) -> bool {
        matches!(self.config.metadata, Some(nasd_meta::Location::Postgres { .. }))
    }

    /// The answer to a `COMMIT` of `txn` whose transaction failed at the
    /// database (`failed`) — which, for a `COMMIT` sent as the server went
    /// away, leaves unknown whether it committed. The intent says: Committed,
    /// it did (the answer is given now); Open, it did not, and the request
    /// is `METADATA_UNAVAILABLE`, which the writer sends again once the
    /// database answers; unreadable (the database still away), the same —
    /// sent again, a commit that did happen finds its intent Committed and
    /// is answered as done ([`commit_write`](Self::commit_write)), so the
    /// writes are committed once either way and the writer is never told
    /// they are lost when they are not.
    async fn resolve_commit(&self, ino: Ino, txn: u64, failed: Failure) -> Result<Inode, Failure> {
        let again = || {
            Failure::new(
                FsStatus::MetadataUnavailable,
                format!(
                    "the metadata database {} failed as write transaction {txn} was committed ({}); send the \
                     commit again: it is made once",
                    self.metadata_target, failed.message
                ),
            )
        };
        match self.meta(move |ns| ns.intent(txn)).await {
            Ok(Some(i)) if i.state == IntentState::Committed => self.committed_before(ino, txn).await,
            Ok(Some(i)) if i.state == IntentState::Open => Err(again()),
            Err(f) if f.status == FsStatus::MetadataUnavailable => Err(again()),
            _ => Err(failed),
        }
    }

    /// The answer to a `COMMIT` of `txn` on `ino` that was made before
    /// (its intent is Committed): the file as it is, the intent forgotten
    /// (or left to maintenance), the drives told the transaction ended.
    async fn committed_before(&self, ino: Ino, txn: u64) -> Result<Inode, Failure> {
        let inode = self.meta(move |ns| ns.getattr(ino)).await?;
        if let Err(f) = self.meta(move |ns| ns.finish_intent(txn)).await {
            tracing::info!(txn, error = %f.message, "a committed write intent is left for maintenance to forget");
        }
        self.end_in_background(&inode, txn, true);
        Ok(inode)
    }

    /// The bytes `inode`'s data components store now, for a file of `size`
    /// bytes ([`nasd_meta::Inode::data_bytes`]): per data column, what its
    /// first Ok copy whose drive answers `GETATTR` holds (`blocks_allocated`
    /// blocks), all components asked at once. A column no copy answers for
    /// counts as dense, its bytes under `size`: an overestimate, never less.
    /// Parity is not counted (a quota counts a file's data, as its size did).
    pub(crate) async fn stored_bytes(&self, inode: &Inode, size: u64) -> u64 {
        let Some(g) = inode.layout.and_then(|l| Geometry::new(l).ok()) else { return 0 };
        let asks = (0..g.components().min(inode.components.len()))
            .filter(|&c| matches!(g.role(c), Role::Data { .. }))
            .map(|c| async move { (c, self.component_stored(inode, c).await) });
        let answers: Vec<(usize, Option<u64>)> = futures::future::join_all(asks).await;
        let answered = |c: usize| answers.iter().find(|(x, _)| *x == c).and_then(|(_, v)| *v);
        (0..g.data_columns())
            .map(|column| {
                (0..g.copies())
                    .find_map(|copy| answered(g.data_component(column, copy)))
                    .unwrap_or_else(|| g.component_len(size, g.data_component(column, 0)))
            })
            .sum()
    }

    /// What component `c` of `inode` stores, if it is Ok and its drive says.
    async fn component_stored(&self, inode: &Inode, c: usize) -> Option<u64> {
        let component = inode.components.get(c).filter(|x| x.state == ComponentState::Ok)?;
        let d = self.drive(component.object.drive).ok().filter(|d| self.is_up(d.drive))?;
        match d.getattr(component.object.object).await {
            Ok(a) => Some(a.blocks_allocated.saturating_mul(u64::from(a.block_size))),
            Err(e) => {
                tracing::debug!(drive = d.drive, object = component.object.object, error = %e, "not measured");
                None
            }
        }
    }

    /// Ends `txn` on every component's drive in the background (after a
    /// commit: if one is lost, recovery commits the unknown transaction).
    pub(crate) fn end_in_background(&self, inode: &Inode, txn: u64, commit: bool) {
        let ends: Vec<(Arc<DriveHandle>, u64)> =
            inode.components.iter().filter_map(|c| Some((self.drive(c.object.drive).ok()?, c.object.object))).collect();
        // Under the request's trace id: its drive requests are the request's.
        let trace = nasd_client::trace::current();
        self.env.spawn(nasd_client::trace::scope(trace, async move {
            for (d, object) in ends {
                if let Err(e) = d.txn_end(object, txn, commit).await {
                    tracing::debug!(drive = d.drive, object, txn, error = %e, "transaction end left to recovery");
                }
            }
        }));
    }

    /// Rolls transaction `txn` back on every component its writer may have
    /// changed ([`Intent::writes`]) and forgets its intent once every drive
    /// made the rollback durable. Returns whether the intent is gone (false:
    /// a drive did not answer; the next pass, or a waiting `BEGIN_WRITE`,
    /// tries again).
    ///
    /// A component is marked stale here only where the writer's bytes may
    /// outlive the rollback: its drive is down (it keeps what it has, and
    /// resolves the transaction as committed when it is back), or the
    /// transaction was never opened on it ([`Intent::unopened`]: no undo).
    /// On a layout without redundancy, or a redundant one with no
    /// redundancy left ([`Manager::resyncable_without`]), where a stale
    /// component could never be resynced, the rollback instead waits for a
    /// down drive (the file cannot be read without it anyway), and a
    /// transaction is never begun
    /// with a component unopened ([`begin_scoped`](Self::begin_scoped)).
    /// Components the writer did not change (all of them, for the manager's
    /// repairs) are never marked, and a drive of theirs that does not answer
    /// holds nothing up: ending the transaction there is tidiness, and a
    /// transaction without an intent is committed when its drive is
    /// recovered — a no-op where nothing was written.
    ///
    /// The file's capabilities are revoked once per rollback (and once more
    /// after a restart of the manager) of a writer that may have changed a
    /// component, not at every attempt: a
    /// `BEGIN_WRITE` waiting on a rollback a drive holds up tries again every
    /// [`BEGIN_POLL`], and each revocation makes every reader of the file
    /// fetch new capabilities — at that rate, faster than they can use them.
    /// Each attempt still sets the file's access-control version on a
    /// component before it rolls it back (`set_acv` only ever raises it), so
    /// a writer that is late, not dead, cannot land writes after the
    /// rollback, outside any transaction: they are refused with
    /// `ACCESS_REVOKED`, and its `COMMIT` with `ABORTED`. A component once
    /// rolled back durably is not visited again.
    pub(crate) async fn abort(&self, txn: u64) -> bool {
        let intent = match self.meta(move |ns| ns.abort_intent(txn)).await {
            Ok(i) => i,
            Err(f) if f.status == FsStatus::NotFound => {
                self.rollbacks.lock().expect("rollbacks lock").remove(&txn);
                return true;
            }
            Err(f) => {
                tracing::warn!(txn, error = %f, "cannot record an abort");
                return false;
            }
        };
        let ino = intent.ino;
        let first = !self.rollbacks.lock().expect("rollbacks lock").contains_key(&txn);
        // A writer that changes no component (the manager's repairs, which write under drive keys
        // that no access-control version stops) has nothing to fence off.
        if first {
            let revoked =
                if intent.writes == 0 { Ok(None) } else { self.meta(move |ns| ns.bump_acv(ino)).await.map(Some) };
            match revoked {
                // Revoked; or the file is gone (its objects are doomed, and their transactions
                // go with them) or has no components.
                Ok(_) => {}
                Err(f) if matches!(f.status, FsStatus::NotFound | FsStatus::InvalidArgument) => {}
                Err(f) => {
                    tracing::warn!(ino, txn, error = %f, "cannot revoke the capabilities of a rolled-back writer");
                    return false;
                }
            }
            self.rollbacks.lock().expect("rollbacks lock").entry(txn).or_default();
        }
        let (components, acv, redundant) = match self.meta(move |ns| ns.getattr(ino)).await {
            Ok(inode) => {
                // The components it may mark stale are those of drives down.
                let redundant = self.resyncable_without(&inode, |_| false);
                (inode.components, inode.acv, redundant)
            }
            Err(_) => (Vec::new(), 0, true),
        };
        let done = self.rollbacks.lock().expect("rollbacks lock").get(&txn).cloned().unwrap_or_default();
        let mut all = true;
        // Components that may keep the writer's bytes after the rollback.
        let mut kept = Vec::new();
        for (idx, c) in components.iter().enumerate() {
            if done.contains(&idx) {
                continue;
            }
            let Ok(d) = self.drive(c.object.drive) else { continue };
            if !holds(intent.writes, idx) {
                if self.is_up(d.drive) {
                    if let Err(e) = d.txn_end(c.object.object, txn, false).await {
                        tracing::debug!(drive = d.drive, txn, error = %e, "an unchanged component's transaction is left to recovery");
                    }
                }
                self.rolled_back(txn, idx);
                continue;
            }
            if !self.is_up(d.drive) {
                if redundant {
                    kept.push(idx);
                } else {
                    // Stale, it could never be resynced: the rollback waits for the drive, whose
                    // undo gives the component its committed bytes back.
                    tracing::debug!(drive = d.drive, txn, "rollback waits for the drive (no redundancy)");
                    all = false;
                }
                continue;
            }
            let ended = async {
                d.set_acv(c.object.object, acv).await?;
                d.txn_end(c.object.object, txn, false).await?;
                d.flush_objects(&[c.object.object]).await
            };
            match ended.await {
                Ok(()) => {}
                Err(e) if e.status() == Some(Status::NoSuchObject) => {}
                Err(e) => {
                    tracing::info!(drive = d.drive, txn, error = %e, "rollback waits for the drive");
                    all = false;
                    continue;
                }
            }
            if holds(intent.unopened, idx) {
                kept.push(idx);
            }
            self.rolled_back(txn, idx);
        }
        if !all {
            return false;
        }
        // A component whose drive is down keeps what it has until it is back: whatever the
        // transaction left there (its end, when the drive resolves it, commits an intent no
        // longer known), a whole resync replaces it with the rolled-back content. So does one
        // the transaction never reached, which took the writer's bytes without undo.
        let finished = self
            .meta(move |ns| {
                for &idx in &kept {
                    ns.mark_stale(ino, idx, &[crate::resize::WHOLE])?;
                }
                ns.finish_intent(txn)
            })
            .await;
        if finished.is_ok() {
            self.rollbacks.lock().expect("rollbacks lock").remove(&txn);
            self.metrics.transaction_rolled_back();
        }
        tracing::info!(txn, ino, "write transaction rolled back");
        finished.is_ok()
    }

    /// Records that component `idx` needs nothing more from rollback `txn`.
    fn rolled_back(&self, txn: u64, idx: usize) {
        if let Some(done) = self.rollbacks.lock().expect("rollbacks lock").get_mut(&txn) {
            done.insert(idx);
        }
    }

    /// Rolls back every transaction whose lease ran out, and finishes
    /// aborts a drive held up (maintenance).
    pub(crate) async fn abort_expired(&self) {
        // Rollbacks whose intent went another way (the file was removed) are forgotten.
        let pending: Vec<u64> = self.rollbacks.lock().expect("rollbacks lock").keys().copied().collect();
        for txn in pending {
            if let Ok(None) = self.meta(move |ns| ns.intent(txn)).await {
                self.rollbacks.lock().expect("rollbacks lock").remove(&txn);
            }
        }
        let mut after = 0;
        loop {
            let Ok(page) = self.meta(move |ns| ns.intents(after, nasd_meta::BATCH_MAX)).await else { return };
            let Some(last) = page.last() else { return };
            after = last.txn;
            let now = self.now_ns();
            for intent in &page {
                let expired = intent.state == IntentState::Open && (intent.deadline_ns < now || self.orphaned(intent));
                if expired || intent.state == IntentState::Aborting {
                    self.abort(intent.txn).await;
                } else if intent.state == IntentState::Committed {
                    // Committed, and the manager stopped before forgetting it: drives that did not
                    // hear the end commit it when resolved (a transaction without an intent).
                    let txn = intent.txn;
                    let _ = self.meta(move |ns| ns.finish_intent(txn)).await;
                }
            }
            if page.len() < nasd_meta::BATCH_MAX {
                return;
            }
        }
    }

    /// Resolves every open transaction on drive `d` against the intents:
    /// `Aborting` → rolled back, none → committed, `Open` → left to its
    /// writer or its lease (recovery, and when a drive comes back).
    pub(crate) async fn resolve_drive_txns(&self, d: &DriveHandle) -> Result<(), Failure> {
        let mut after = 0;
        loop {
            let page = d
                .txn_list(after, TXN_LIST_PAGE)
                .await
                .map_err(|e| Failure::new(FsStatus::DriveUnavailable, format!("drive {}: {e}", d.drive)))?;
            for &(object, txn, _) in &page {
                self.resolve_one(d, object, txn).await?;
            }
            match page.last() {
                Some(&(object, _, _)) if page.len() == TXN_LIST_PAGE as usize => after = object,
                _ => return Ok(()),
            }
        }
    }

    /// Resolves the open transaction(s) of one object on `d`.
    async fn resolve_object_txns(&self, d: &DriveHandle, object: u64) -> Result<(), Failure> {
        let page = d
            .txn_list(object.saturating_sub(1), 1)
            .await
            .map_err(|e| Failure::new(FsStatus::DriveUnavailable, format!("drive {}: {e}", d.drive)))?;
        for &(o, txn, _) in page.iter().filter(|(o, _, _)| *o == object) {
            self.resolve_one(d, o, txn).await?;
        }
        Ok(())
    }

    async fn resolve_one(&self, d: &DriveHandle, object: u64, txn: u64) -> Result<(), Failure> {
        let state = self.meta(move |ns| ns.intent(txn)).await?.map(|i| i.state);
        let commit = match state {
            Some(IntentState::Open) => return Ok(()),
            Some(IntentState::Aborting) => false,
            // No intent: the transaction was committed (an aborted intent stays until every drive
            // made its rollback durable). A committed one is as good as gone.
            None | Some(IntentState::Committed) => true,
        };
        let unavailable =
            |e: crate::drives::DriveError| Failure::new(FsStatus::DriveUnavailable, format!("drive {}: {e}", d.drive));
        d.txn_end(object, txn, commit).await.map_err(unavailable)?;
        tracing::info!(drive = d.drive, object, txn, commit, "resolved a transaction left open on a drive");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_proto::layout::Layout;

    fn g(text: &str) -> Geometry {
        Geometry::new(Layout::parse(text).unwrap()).unwrap()
    }

    #[test]
    fn dirty_file_ranges_map_to_component_ranges() {
        // stripe:2 with 4 KiB units: bytes 0..10000 are unit 0 (comp 0), 1 (comp 1), 2 (comp 0 at 4096).
        let s = g("stripe:2@4K");
        let r = |idx| component_ranges(&s, idx, &[(0, 10_000)]);
        assert_eq!(r(0), vec![StaleRange { offset: 0, length: 4096 + (10_000 - 8192) }]);
        assert_eq!(r(1), vec![StaleRange { offset: 0, length: 4096 }]);
        // rs:2+1: parity (component 2) misses whole stripes.
        let rs = g("rs:2+1@4K");
        assert_eq!(component_ranges(&rs, 2, &[(100, 10), (9000, 10)]), vec![StaleRange { offset: 0, length: 8192 }]);
        // mirror:2: copy 1 (component 1) is column 0 again.
        let m = g("mirror:2@4K");
        assert_eq!(component_ranges(&m, 1, &[(5, 5)]), vec![StaleRange { offset: 5, length: 5 }]);
    }

    #[test]
    fn ranges_merge_down_to_the_limit() {
        let many: Vec<(u64, u64)> = (0..200).map(|i| (i * 100, i * 100 + 10)).collect();
        let merged = merge_ranges(many, 8);
        assert_eq!(merged.len(), 8);
        assert_eq!(merged.first().unwrap().offset, 0);
        assert_eq!(merged.last().map(StaleRange::end), Some(199 * 100 + 10));
        let total: u64 = merged.iter().map(|r| r.length).sum();
        assert!(total >= 200 * 10, "every byte still covered");
    }
}
