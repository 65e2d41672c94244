//! Background repair: resync
//! stale components, rebuild components of drives that stay down or were
//! taken out of service, heal rot found by scrub, and rebalance onto new
//! drives. Every repair of a file runs as a write transaction of the manager
//! on it (so it is atomic, and client writes to that file wait for it);
//! reads go on.
//!
//! The manager moves file data here, and only here: it reconstructs
//! components from redundancy (`nasd_stripe::Striper::read_component`) and
//! copies components; clients never route data through it.
//!
//! - **Resync**: a stale component whose drive is up gets its missed ranges
//!   reconstructed from the other components and rewritten, stretch by
//!   stretch of whole stripes (`verify::stretches`): where the components
//!   recorded stale are few enough for the layout it is rebuilt from the
//!   others (two components stale in different stripes repair each other);
//!   where more are recorded stale than the layout tolerates and every drive
//!   is up, the bytes decide (`verify::current_in_stripe`), and where they
//!   cannot, the stripe stays stale and unreadable — never rebuilt from a
//!   guess — until its stale ranges change. A Stale component without ranges
//!   is stale whole. A resync reads the ranges to rewrite under its
//!   transaction and records what it made current in the metadata
//!   transaction of its commit (`Namespace::commit_repair`): recorded
//!   earlier, a crash or rollback in between would leave a component marked
//!   current over bytes the rollback took back.
//! - **Rebuild**: a component on a drive down longer than `rebuild_delay`
//!   (or out of service, `nasd admin drive-out`) is reconstructed whole into
//!   a fresh pooled object on a drive placement chooses (reserved, so no
//!   orphan collection takes it), which replaces it in the metadata; the old
//!   object is doomed. The swap happens in the same metadata call that moves
//!   the intent's deadline, so no writer changed the component since it was
//!   copied.
//! - **Scrub** asks every drive to check its blocks against their stored
//!   digests and heals each rotten block from the file's redundancy (blocks
//!   of files without redundancy are reported unrecoverable).
//! - **Rebalance** (growth): after `nasd admin add-drive`, components move
//!   from the fullest drives to the new one until it holds about its share,
//!   file by file, each move a repair-style transaction (copy, swap, doom the
//!   old object). Only a current component moves: a Stale one, copied as it
//!   is and swapped in as Ok, would pass for the file's bytes, so it is left
//!   to its resync. Readers keep reading the old component until the swap,
//!   then get `MAP_EPOCH_MOVED`/`NO_SUCH_OBJECT` and rebind: no read fails.
//!
//! A repair may outlast the write lease: while it runs the manager moves its
//! own intent's deadline a lease ahead every quarter lease, and stops,
//! recording nothing, if the intent is no longer open. Its intent says it
//! changes no component (it writes only bytes every component is meant to
//! hold, or a new object), so its rollback marks nothing. Progress shows in
//! `nasd status`; `nasd repair` starts a rebuild, scrub or rebalance and
//! follows it: a requested pass shows from its request until it has ended,
//! so `nasd repair` never returns before the round began or between its
//! halves.

use crate::drives::DriveHandle;
use crate::placement::{self, Candidate};
use crate::verify;
use crate::{Failure, Manager};
use nasd_client::{Auth, Credential};
use nasd_meta::{Caller, Inode, StaleRange};
use nasd_proto::fs::{FsStatus, Ino, ObjectRef};
use nasd_proto::layout::ComponentState;
use nasd_proto::manager::{Progress, ScrubSummary};
use nasd_proto::Protection;
use nasd_stripe::geometry::Geometry;
use nasd_stripe::{Binding, StaticBinder, Striper, Target};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tokio::time::Instant;

/// Component bytes copied per step of a repair (one read, one write; the
/// next chunk is read while one is written, so a repair holds two).
pub const REPAIR_CHUNK_BYTES: u64 = 8 * 1024 * 1024;
/// Files looked at per metadata query of the repair loop.
const REPAIR_PAGE: usize = 256;
/// Corrupt blocks one drive's scrub reports at most per pass.
const SCRUB_REPORT_PER_PASS: u16 = nasd_proto::limits::SCRUB_REPORT_MAX as u16;
/// Component bytes of each component read at a time when checking which
/// components hold a file's bytes ([`verify`]).
const CHECK_CHUNK_BYTES: u64 = 1024 * 1024;
/// Files remembered as undecided by their bytes ([`Manager::check_overloaded`]);
/// past it the memory starts afresh (they are read again).
const UNDECIDED_MAX: usize = 4096;
/// A drive counts as holding its share when within this fraction of the average.
const REBALANCE_TOLERANCE: f64 = 0.05;
/// How many times per write lease a repair's own write transaction has its
/// deadline moved a lease ahead: a renewal late by up to
/// `(LEASE_RENEWALS - 1) / LEASE_RENEWALS` of a lease still lands in time.
const LEASE_RENEWALS: u32 = 4;

/// What the repair task has done and is doing, for `CLUSTER_STATUS`.
#[derive(Debug, Default, Clone)]
pub struct RepairState {
    /// Rebuilds and resyncs of the current round.
    pub rebuild: Progress,
    /// Moves of the current rebalance.
    pub rebalance: Progress,
    /// Drives scrubbed of the current scrub (as files).
    pub scrub: Progress,
    /// The last finished scrub.
    pub last_scrub: ScrubSummary,
    /// A rebalance was asked for.
    pub rebalance_requested: bool,
    /// A scrub was asked for.
    pub scrub_requested: bool,
    /// Rebuild now, not after `rebuild_delay`.
    pub rebuild_now: bool,
    /// A rebuild was asked for (`REPAIR rebuild`) and no pass has taken the
    /// request yet.
    pub rebuild_asked: bool,
    /// The pass that took a rebuild request is running.
    pub rebuild_round: bool,
}

impl RepairState {
    /// The rebuild progress `CLUSTER_STATUS` shows: while a requested
    /// rebuild round is pending or running, at least one file more than done
    /// (the round may still find work), so that whoever asked and polls
    /// (`nasd repair`) does not take a round not begun, or between its
    /// resyncs and its rebuilds, for finished; when it ends, nothing.
    pub fn rebuild_shown(&self) -> Progress {
        let mut p = self.rebuild;
        if self.rebuild_asked || self.rebuild_round {
            p.files_total = p.files_total.max(p.files_done + 1);
        }
        p
    }
}

/// The manager acting as a writer of its own.
const MANAGER: Caller = Caller::ROOT;

impl Manager {
    /// `REPAIR`: asks the repair task to start `action` at once. A scrub or
    /// a rebalance with something to do shows in the status from now on
    /// (a scrub: `scrub.files_total` > 0 until a pass begun after this has
    /// finished; a rebalance: what it is to move, nothing moved yet), so
    /// that whoever asked and then polls `CLUSTER_STATUS` (`nasd repair`)
    /// never takes an earlier task's result, or one not started yet, for
    /// its own.
    pub(crate) fn request_repair(&self, action: nasd_proto::manager::RepairAction) {
        use nasd_proto::manager::RepairAction;
        let up = self.scrub_targets().len() as u64;
        let to_move = match action {
            RepairAction::Rebalance => self.rebalance_to_move(&self.used_by_drive()),
            _ => 0,
        };
        {
            let mut r = self.repair.lock().expect("repair lock");
            match action {
                RepairAction::Rebuild => {
                    r.rebuild_now = true;
                    r.rebuild_asked = true;
                }
                RepairAction::Scrub => {
                    r.scrub_requested = true;
                    if r.scrub.files_total == 0 {
                        r.scrub = Progress { files_total: up, ..Progress::default() };
                    }
                }
                RepairAction::Rebalance => {
                    r.rebalance_requested = true;
                    if r.rebalance == Progress::default() {
                        r.rebalance.bytes_total = to_move;
                    }
                }
            }
        }
        self.repair_kick.notify_one();
    }

    /// The drives a scrub reads: those up.
    fn scrub_targets(&self) -> Vec<std::sync::Arc<DriveHandle>> {
        self.drives().into_iter().filter(|d| self.is_up(d.drive)).collect()
    }

    /// One pass of the repair loop: resync, rebuild, scrub, rebalance.
    pub(crate) async fn repair_pass(&self) {
        let asked = {
            let mut r = self.repair.lock().expect("repair lock");
            let asked = std::mem::take(&mut r.rebuild_asked);
            r.rebuild_round |= asked;
            asked
        };
        // Each step its own operation (trace id), so its drive requests can be told apart.
        self.background("resync", self.resync_stale()).await;
        self.background("rebuild", self.rebuild_lost()).await;
        {
            // The pass is over (what is left is for a later one); a requested round shows until
            // then, and a new request's from its start.
            let mut r = self.repair.lock().expect("repair lock");
            if asked {
                r.rebuild_round = false;
            }
            if !r.rebuild_asked {
                r.rebuild = Progress::default();
            }
        }
        if std::mem::take(&mut self.repair.lock().expect("repair lock").scrub_requested) {
            self.background("scrub", self.scrub_all()).await;
        }
        if std::mem::take(&mut self.repair.lock().expect("repair lock").rebalance_requested) {
            self.background("rebalance", self.rebalance()).await;
        }
    }

    /// The repair loop: a pass every maintenance interval, or at once when
    /// woken (a drive came back, `REPAIR`), until shutdown.
    pub(crate) async fn repair_loop(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.config.maintenance_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = tick.tick() => self.repair_pass().await,
                _ = self.repair_kick.notified() => self.repair_pass().await,
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }

    // ------------------------------------------------------------ engine

    /// A striper over `inode`'s components with the manager's drive-key
    /// credentials, in their recorded states; `unreadable` components are
    /// not read (their state is taken as stale), and those on drives that
    /// are down neither read nor written (`Down`).
    pub(crate) fn striper_for(&self, inode: &Inode, unreadable: &BTreeSet<usize>) -> Result<Striper, Failure> {
        self.striper_with(inode, |i, c| if unreadable.contains(&i) { ComponentState::Stale } else { c.state })
    }

    /// A striper that reads every component of `inode` but `unreadable`
    /// (and those on drives that are down), whatever their recorded state:
    /// for reading stripes in which the recorded stale ranges of the others
    /// lie elsewhere ([`verify::stretches`]).
    fn striper_over(&self, inode: &Inode, unreadable: &BTreeSet<usize>) -> Result<Striper, Failure> {
        self.striper_with(
            inode,
            |i, _| if unreadable.contains(&i) { ComponentState::Stale } else { ComponentState::Ok },
        )
    }

    fn striper_with(
        &self,
        inode: &Inode,
        state: impl Fn(usize, &nasd_proto::layout::Component) -> ComponentState,
    ) -> Result<Striper, Failure> {
        let layout = inode.layout.ok_or_else(|| Failure::new(FsStatus::InvalidArgument, "not a regular file"))?;
        let mut components = Vec::with_capacity(inode.components.len());
        for (i, c) in inode.components.iter().enumerate() {
            let d = self.drive(c.object.drive)?;
            let state = if self.is_up(d.drive) { state(i, c) } else { ComponentState::Down };
            components.push(self.binding(&d, c.object.object, state));
        }
        self.striper(Target { layout, components })
    }

    fn binding(&self, d: &DriveHandle, object: u64, state: ComponentState) -> Binding {
        let protection = d.protection.union(Protection::INTEGRITY_ARGS).union(Protection::INTEGRITY_DATA);
        Binding {
            drive: d.drive,
            addr: d.addr.clone(),
            drive_id: d.drive_id,
            partition: d.partition,
            object,
            auth: Auth::new(Credential::Drive(d.keys().drive), protection.union(Protection::HASH_AND_MAC)),
            state,
        }
    }

    fn striper(&self, target: Target) -> Result<Striper, Failure> {
        let binder = StaticBinder::new(target).map_err(|e| Failure::new(FsStatus::Internal, e.to_string()))?;
        Ok(Striper::new(self.data_pool.clone(), Arc::new(binder)))
    }

    /// Runs `work` as a write transaction of the manager on `ino`: begins
    /// (waiting for a client's to end) and opens it on the drives; keeps it
    /// open while `work` runs ([`keep_open`](Self::keep_open): a repair may
    /// take longer than the write lease, and a transaction whose lease ran
    /// out is rolled back by whoever notices); commits on success or rolls
    /// back on failure. `work` is handed the transaction id, and says what
    /// the commit records besides ([`Record`]).
    ///
    /// A repair writes only what every component is meant to hold already
    /// (bytes rebuilt from the others under the transaction, the recorded
    /// length) or a new object: its intent says it changes no component
    /// (`Intent::writes` empty), so neither a component its transaction
    /// could not be opened on nor one whose drive its rollback cannot reach
    /// is marked stale for it.
    async fn as_writer<T, F: std::future::Future<Output = Result<(T, Record), Failure>>>(
        &self,
        ino: Ino,
        work: impl FnOnce(u64) -> F,
    ) -> Result<T, Failure> {
        let session = crate::service::Session::internal("(repair)", MANAGER);
        let _own = self.own_write(ino);
        let txn = self.begin_scoped(&session, ino, 0, crate::coordinator::Writer::Manager).await?.txn;
        let done = tokio::select! {
            biased;
            done = work(txn) => done,
            lost = self.keep_open(txn) => Err(lost),
        };
        let committed = match done {
            Ok((v, Record::Nothing)) => {
                self.commit_write(&session, ino, txn, 0, Vec::new(), Vec::new()).await.map(|_| v)
            }
            Ok((v, Record::Current(ranges))) => self.commit_repair(ino, txn, ranges).await.map(|()| v),
            Err(e) => Err(e),
        };
        if committed.is_err() {
            // Refused for an intent that is Committed already (the commit went through and a
            // step after it failed): nothing is rolled back then.
            self.abort(txn).await;
        }
        committed
    }

    /// Moves the deadline of the manager's own transaction `txn` a lease
    /// ahead every [`LEASE_RENEWALS`]th of a lease, for as long as it is
    /// polled. Returns only if it cannot: the transaction is no longer Open
    /// (it was rolled back: its work must stop and record nothing) or the
    /// metadata failed.
    async fn keep_open(&self, txn: u64) -> Failure {
        let lease = self.config.write_lease;
        loop {
            tokio::time::sleep(lease / LEASE_RENEWALS).await;
            let deadline = self.now_ns().saturating_add(lease.as_nanos() as i64);
            if let Err(f) = self.meta(move |ns| ns.extend_intent(txn, deadline)).await {
                tracing::warn!(txn, error = %f, "a repair's write transaction could not be kept open");
                return Failure::new(f.status, format!("write transaction {txn} could not be kept open: {f}"));
            }
        }
    }

    /// Commits the repair transaction `txn` of `ino`, recording the
    /// component ranges in `current` up to date at once, and ends it on the
    /// drives.
    async fn commit_repair(&self, ino: Ino, txn: u64, current: Vec<(usize, StaleRange)>) -> Result<(), Failure> {
        let inode = self.meta(move |ns| ns.commit_repair(ino, txn, &current)).await?;
        if let Err(e) = self.meta(move |ns| ns.finish_intent(txn)).await {
            // Committed: maintenance finishes a Committed intent it finds.
            tracing::info!(txn, error = %e, "a committed resync's intent is finished later");
        }
        self.end_in_background(&inode, txn, true);
        Ok(())
    }

    // ------------------------------------------------------------ resync

    /// Rewrites the missed ranges of every stale component whose drive is up.
    async fn resync_stale(&self) {
        let mut after = (0, 0);
        loop {
            let Ok(page) = self.meta(move |ns| ns.stale_components(after, REPAIR_PAGE)).await else { return };
            let Some(&last) = page.last() else { return };
            after = last;
            self.plan_rebuild_files(page.len() as u64);
            for (ino, idx) in page.iter().copied() {
                if let Err(e) = self.counted(self.resync(ino, idx)).await {
                    tracing::info!(ino, idx, error = %e, "resync of a stale component deferred");
                }
            }
            if page.len() < REPAIR_PAGE {
                return;
            }
        }
    }

    /// Brings stale component `idx` of `ino` up to date in place, stretch by
    /// stretch of whole stripes ([`verify::stretches`]): where the
    /// components recorded stale there are few enough for the layout, its
    /// bytes are rebuilt from the others (which are read there whatever
    /// their recorded state: their stale ranges lie elsewhere); where more
    /// are recorded stale than the layout tolerates and every drive is up,
    /// what the drives hold decides which of them are current
    /// ([`verify::current_in_stripe`]) before anything is rebuilt. What was
    /// rebuilt or found current is recorded in the commit; the rest stays
    /// stale (a drive is down, or the bytes cannot tell).
    async fn resync(&self, ino: Ino, idx: usize) -> Result<(), Failure> {
        let inode = self.meta(move |ns| ns.getattr(ino)).await?;
        let Some(c) = inode.components.get(idx).copied() else { return Ok(()) };
        if c.state != ComponentState::Stale || !self.is_up(c.object.drive) || self.is_out(c.object.drive) {
            return Ok(());
        }
        let outcome = self
            .as_writer(ino, |_| async {
                // Read the file, and the ranges its components missed, afresh under the
                // transaction: no writer changes them now, and a writer that committed while this
                // one waited to begin may have added ranges.
                let inode = self.meta(move |ns| ns.getattr(ino)).await?;
                if inode.components.get(idx).map(|c| (c.object, c.state)) != Some((c.object, ComponentState::Stale)) {
                    return Ok((None, Record::Nothing)); // resynced or replaced meanwhile
                }
                let mut stale = self.stale_map(&inode).await?;
                let mut current = self.check_overloaded(&inode, &stale).await?;
                for (c, r) in &current {
                    let left = nasd_meta::subtract_ranges(&stale[c], std::slice::from_ref(r));
                    stale.insert(*c, left);
                }
                let (rebuilt, waiting) = self.rebuild_stale(&inode, idx, &stale).await?;
                current.extend(rebuilt.iter().cloned());
                if current.is_empty() {
                    return Err(Failure::new(
                        FsStatus::DriveUnavailable,
                        format!("component {idx} cannot be rebuilt yet: {}", waiting.unwrap_or_default()),
                    ));
                }
                Ok((Some(waiting), Record::Current(bounded(current))))
            })
            .await?;
        match outcome {
            Some(None) => tracing::info!(ino, idx, "stale component resynced"),
            Some(Some(why)) => tracing::info!(ino, idx, why, "stale component partly resynced"),
            None => {}
        }
        Ok(())
    }

    /// Every Stale component of `inode` with the ranges it is recorded to
    /// have missed (stale whole: one range over everything).
    async fn stale_map(&self, inode: &Inode) -> Result<BTreeMap<usize, Vec<StaleRange>>, Failure> {
        let ino = inode.attr.ino;
        let stale: Vec<usize> =
            (0..inode.components.len()).filter(|&i| inode.components[i].state == ComponentState::Stale).collect();
        self.meta(move |ns| {
            let mut out = BTreeMap::new();
            for idx in stale {
                let mut ranges = ns.stale_ranges(ino, idx)?;
                if ranges.is_empty() {
                    ranges.push(StaleRange { offset: 0, length: u64::MAX });
                }
                out.insert(idx, ranges);
            }
            Ok(out)
        })
        .await
    }

    /// Where more of `inode`'s components are recorded stale than its layout
    /// tolerates and every drive of the file is up: the component ranges
    /// that its bytes show to be current ([`verify::current_in_stripe`]).
    /// A file whose stale ranges have not changed since its bytes last
    /// could not tell is not read again.
    async fn check_overloaded(
        &self,
        inode: &Inode,
        stale: &BTreeMap<usize, Vec<StaleRange>>,
    ) -> Result<Vec<(usize, StaleRange)>, Failure> {
        let g = geometry(inode)?;
        let extent = g.stripes(inode.attr.size).saturating_mul(g.unit());
        let overloaded: Vec<verify::Stretch> =
            verify::stretches(stale, g.unit(), extent).into_iter().filter(|s| !g.survives(&s.suspects)).collect();
        if overloaded.is_empty() || inode.components.iter().any(|c| !self.is_up(c.object.drive)) {
            return Ok(Vec::new());
        }
        let ino = inode.attr.ino;
        let fingerprint = fingerprint(inode.attr.size, stale);
        if self.undecided.lock().expect("undecided lock").get(&ino) == Some(&fingerprint) {
            return Ok(Vec::new());
        }
        let mut current = Vec::new();
        for s in &overloaded {
            current.extend(self.check_stretch(inode, &g, s).await?);
        }
        let span_bytes: u64 = overloaded.iter().map(|s| s.span.end - s.span.start).sum();
        let current_bytes: u64 = current.iter().map(|(_, r)| r.length).sum();
        tracing::warn!(
            ino,
            components = ?overloaded.iter().flat_map(|s| s.suspects.iter().copied()).collect::<BTreeSet<_>>(),
            span_bytes,
            current_bytes,
            "more components recorded stale than the layout tolerates: checked what the drives hold"
        );
        let mut undecided = self.undecided.lock().expect("undecided lock");
        if current.is_empty() {
            if undecided.len() >= UNDECIDED_MAX {
                undecided.clear();
            }
            undecided.insert(ino, fingerprint);
        } else {
            undecided.remove(&ino);
        }
        Ok(current)
    }

    /// The suspects of stretch `s` of `inode` found current, stripe by
    /// stripe, from every component's bytes ([`CHECK_CHUNK_BYTES`] of each
    /// at a time, read from its drive, which checks them against their
    /// stored digests).
    async fn check_stretch(
        &self,
        inode: &Inode,
        g: &Geometry,
        s: &verify::Stretch,
    ) -> Result<Vec<(usize, StaleRange)>, Failure> {
        let u = g.unit();
        let drives: Vec<Arc<DriveHandle>> =
            inode.components.iter().map(|c| self.drive(c.object.drive)).collect::<Result<_, _>>()?;
        let per_read = (CHECK_CHUNK_BYTES / u).max(1);
        let mut found: Vec<(usize, StaleRange)> = Vec::new();
        let (mut stripe, end) = (s.span.start / u, s.span.end / u);
        while stripe < end {
            let upto = (stripe + per_read).min(end);
            let reads = inode.components.iter().zip(&drives).map(|(c, d)| async move {
                let want = (upto - stripe) * u;
                let mut bytes = d.read(c.object.object, stripe * u, want).await.ok()?;
                bytes.resize(want as usize, 0);
                Some(bytes)
            });
            let held: Vec<Option<Vec<u8>>> = futures::future::join_all(reads).await;
            for st in stripe..upto {
                let at = ((st - stripe) * u) as usize;
                let chunks: Vec<Option<Vec<u8>>> =
                    held.iter().map(|b| b.as_ref().map(|b| b[at..at + u as usize].to_vec())).collect();
                for c in verify::current_in_stripe(g, inode.attr.size, st, &chunks, &s.suspects) {
                    add_range(&mut found, c, st * u, u);
                }
            }
            stripe = upto;
        }
        Ok(found)
    }

    /// Rebuilds component `idx` of `inode` in place wherever the components
    /// recorded stale there (`stale`) leave enough of the others, then gives
    /// it its recorded length. Returns the ranges now current and, if some
    /// could not be rebuilt, why.
    async fn rebuild_stale(
        &self,
        inode: &Inode,
        idx: usize,
        stale: &BTreeMap<usize, Vec<StaleRange>>,
    ) -> Result<(Vec<(usize, StaleRange)>, Option<String>), Failure> {
        let g = geometry(inode)?;
        let size = inode.attr.size;
        let len = g.component_len(size, idx);
        let extent = g.stripes(size).saturating_mul(g.unit());
        let down: BTreeSet<usize> =
            (0..inode.components.len()).filter(|&i| !self.is_up(inode.components[i].object.drive)).collect();
        let mut rebuilt = Vec::new();
        let mut waiting = None;
        let mine: Vec<verify::Stretch> =
            verify::stretches(stale, g.unit(), extent).into_iter().filter(|s| s.suspects.contains(&idx)).collect();
        let (copied, left): (Vec<&verify::Stretch>, Vec<&verify::Stretch>) =
            mine.iter().partition(|s| g.survives(&s.suspects.union(&down).copied().collect()));
        if let Some(s) = left.first() {
            let why = if down.is_empty() {
                "more components are stale there than the layout tolerates, and their bytes cannot tell which hold \
                 the file's"
            } else {
                "a drive of the file is down"
            };
            waiting = Some(format!("{} stretches from component byte {} on: {why}", left.len(), s.span.start));
        }
        let bytes: u64 = copied.iter().map(|s| s.span.end.min(len).saturating_sub(s.span.start)).sum();
        self.plan_rebuild_bytes(bytes);
        for s in copied {
            let striper = self.striper_over(inode, &s.suspects)?;
            self.copy_reconstructed(&striper, &striper, idx, s.span.start, s.span.end.min(len), size, true).await?;
            add_range(&mut rebuilt, idx, s.span.start, s.span.end - s.span.start);
        }
        if left.len() < mine.len() || mine.is_empty() {
            // Past its recorded length a component holds nothing: what it missed there (a size
            // change) is made good by giving it that length.
            let c = inode.components[idx];
            let d = self.drive(c.object.drive)?;
            let drive_err = |e| Failure::new(FsStatus::DriveUnavailable, format!("drive {}: {e}", d.drive));
            d.set_size(c.object.object, len).await.map_err(drive_err)?;
            d.flush_objects(&[c.object.object]).await.map_err(drive_err)?;
            add_range(&mut rebuilt, idx, extent, u64::MAX - extent);
        }
        Ok((rebuilt, waiting))
    }

    /// Rebuilds `[from, to)` of component `idx` from the others (read
    /// through `source`) and writes it through `dest`, in chunks: the next
    /// chunk is read while the previous one is written (reading never
    /// touches component `idx`, which `read_component` leaves out), so the
    /// sources and the destination work at once. At most two chunks are
    /// held. `rebuilding`: the bytes count in the rebuild progress (a
    /// scrub's heal does not).
    #[allow(clippy::too_many_arguments)]
    async fn copy_reconstructed(
        &self,
        source: &Striper,
        dest: &Striper,
        idx: usize,
        from: u64,
        to: u64,
        size: u64,
        rebuilding: bool,
    ) -> Result<(), Failure> {
        // A chunk read and not yet written: its component offset and bytes.
        let mut unwritten: Option<(u64, Vec<u8>)> = None;
        let mut at = from;
        loop {
            let next = (at < to).then(|| at..at + REPAIR_CHUNK_BYTES.min(to - at));
            let read = async {
                match &next {
                    Some(r) => source.read_component(idx, r.start, r.end - r.start, size).await.map(|(b, _)| Some(b)),
                    None => Ok(None),
                }
            };
            let write = async {
                match &unwritten {
                    Some((offset, bytes)) => dest.write_component(idx, *offset, bytes).await,
                    None => Ok(()),
                }
            };
            let (read, written) = tokio::join!(read, write);
            written.map_err(stripe_failure)?;
            if let Some((_, bytes)) = unwritten.take().filter(|_| rebuilding) {
                self.add_rebuild_bytes(bytes.len() as u64);
            }
            match (next, read.map_err(stripe_failure)?) {
                (Some(r), Some(bytes)) => {
                    at = r.end;
                    unwritten = Some((r.start, bytes));
                }
                _ => return Ok(()),
            }
        }
    }

    // ------------------------------------------------------------ rebuild

    /// Rebuilds elsewhere every component of drives that are out of service
    /// or have been down longer than `rebuild_delay` (or at all, after
    /// `REPAIR rebuild`).
    async fn rebuild_lost(&self) {
        #[cfg(feature = "sim-bugs")]
        if self.env.injected_bug(nasd_env::Bug::SkipRebuild) {
            return;
        }
        let now = Instant::now();
        let rebuild_now = std::mem::take(&mut self.repair.lock().expect("repair lock").rebuild_now);
        for d in self.drives() {
            let down_for = self.down_for(d.drive, now);
            let lost = self.is_out(d.drive) || down_for.is_some_and(|t| rebuild_now || t >= self.config.rebuild_delay);
            if lost {
                self.rebuild_drive(&d).await;
            }
        }
    }

    async fn rebuild_drive(&self, d: &Arc<DriveHandle>) {
        let drive = d.drive;
        loop {
            let Ok(page) = self.meta(move |ns| ns.components_on_drive(drive, (0, 0), REPAIR_PAGE)).await else {
                return;
            };
            if page.is_empty() {
                return;
            }
            self.plan_rebuild_files(page.len() as u64);
            let mut moved = 0;
            for &(ino, idx, _) in &page {
                match self.counted(self.relocate(ino, idx, Relocation::Rebuild)).await {
                    Ok(_) => moved += 1,
                    Err(e) => tracing::warn!(ino, idx, drive, error = %e, "component not rebuilt yet"),
                }
            }
            if moved == 0 {
                return;
            }
        }
    }

    /// Places component `idx` of `ino` on a new drive: reconstructed from
    /// the others (rebuild) or copied (move), then swapped in. Whether it
    /// was: not if it moved meanwhile, nor a move of a component that is not
    /// current (Stale: its bytes lack what it missed, and a copy of them
    /// swapped in as Ok would be read as the file's — a resync brings it up
    /// to date first).
    async fn relocate(&self, ino: Ino, idx: usize, how: Relocation) -> Result<bool, Failure> {
        let inode = self.meta(move |ns| ns.getattr(ino)).await?;
        let Some(old) = inode.components.get(idx).map(|c| c.object) else { return Ok(false) };
        let target = match how {
            Relocation::Move { to } => to,
            Relocation::Rebuild => self.replacement_drive(&inode)?,
        };
        let d = self.drive(target)?;
        let new = self.reserve_object(target).await?;
        let swapped = std::sync::atomic::AtomicBool::new(false);
        let (flag, d) = (&swapped, &d);
        let result = self
            .as_writer(ino, |txn| async move {
                let inode = self.meta(move |ns| ns.getattr(ino)).await?;
                if inode.components.get(idx).map(|c| c.object) != Some(old) {
                    return Ok((false, Record::Nothing)); // moved meanwhile
                }
                if matches!(how, Relocation::Move { .. }) && inode.components[idx].state != ComponentState::Ok {
                    return Ok((false, Record::Nothing)); // stale: copied, it would pass for current
                }
                let g = geometry(&inode)?;
                let len = g.component_len(inode.attr.size, idx);
                match how {
                    Relocation::Rebuild => {
                        self.plan_rebuild_bytes(len);
                        let source = self.striper_for(&inode, &BTreeSet::from([idx]))?;
                        let mut dest_target = target_of(&source);
                        dest_target.components[idx] = self.binding(d, new.object, ComponentState::Ok);
                        let dest = self.striper(dest_target)?;
                        self.copy_reconstructed(&source, &dest, idx, 0, len, inode.attr.size, true).await?;
                    }
                    Relocation::Move { .. } => self.copy_component(old, new, len).await?,
                }
                let drive_err = |e| Failure::new(FsStatus::DriveUnavailable, format!("drive {target}: {e}"));
                d.set_acv(new.object, inode.acv).await.map_err(drive_err)?;
                if self.pushes_pals() {
                    // The file's PAL is on the new object before it becomes a component.
                    let pal = self.pal_of(ino).await?;
                    d.set_pal(new.object, &pal).await.map_err(drive_err)?;
                }
                d.flush_objects(&[new.object]).await.map_err(drive_err)?;
                // Swapped in only while the transaction is surely open — its deadline moved a
                // lease ahead in the same metadata call — so no writer changed the component
                // since it was copied.
                let deadline = self.now_ns().saturating_add(self.config.write_lease.as_nanos() as i64);
                let effects = self
                    .meta(move |ns| {
                        ns.extend_intent(txn, deadline)?;
                        ns.replace_component(ino, idx, new, ComponentState::Ok)
                    })
                    .await?;
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                // A component now: known whatever becomes of its reservation, which lapses if
                // this fails.
                if let Err(e) = self.meta(move |ns| ns.unreserve_object(&new)).await {
                    tracing::debug!(error = %e, "a repair's reservation is left to lapse");
                }
                if let Err(e) = self.apply(effects).await {
                    tracing::info!(ino, idx, error = %e, "the old component is removed in the background");
                }
                // An ACL change between the PAL set above and the swap went to the old component:
                // set it again on all of them now.
                if let Ok(now) = self.meta(move |ns| ns.getattr(ino)).await {
                    if let Err(e) = self.push_pal(&now).await {
                        tracing::warn!(ino, error = %e, "a relocated file's PAL not set everywhere again");
                    }
                }
                Ok((true, Record::Nothing))
            })
            .await;
        let relocated = match result {
            Ok(relocated) => relocated,
            // The new object is the file's component now (whole and durable): it stays. The
            // transaction, which wrote nothing, is rolled back.
            Err(e) if swapped.load(std::sync::atomic::Ordering::SeqCst) => {
                tracing::info!(ino, idx, error = %e, "a relocated component's transaction did not commit");
                true
            }
            Err(e) => {
                self.release_object(new).await;
                return Err(e);
            }
        };
        if !relocated {
            self.release_object(new).await;
            return Ok(false);
        }
        self.map_moved(old.drive).await;
        tracing::info!(ino, idx, from = old.drive, to = target, "component relocated");
        Ok(true)
    }

    /// Copies `len` bytes of component object `from` to object `to` (a move).
    async fn copy_component(&self, from: ObjectRef, to: ObjectRef, len: u64) -> Result<(), Failure> {
        let (src, dst) = (self.drive(from.drive)?, self.drive(to.drive)?);
        let mut at = 0;
        while at < len {
            let n = REPAIR_CHUNK_BYTES.min(len - at);
            let bytes = src
                .read(from.object, at, n)
                .await
                .map_err(|e| Failure::new(FsStatus::DriveUnavailable, format!("drive {}: {e}", src.drive)))?;
            dst.write(to.object, at, &bytes)
                .await
                .map_err(|e| Failure::new(FsStatus::DriveUnavailable, format!("drive {}: {e}", dst.drive)))?;
            at += n;
        }
        Ok(())
    }

    /// A drive for a new copy of one of `inode`'s components: up, in
    /// service, not holding another component of the file, by placement.
    fn replacement_drive(&self, inode: &Inode) -> Result<u32, Failure> {
        let used: BTreeSet<u32> = inode.components.iter().map(|c| c.object.drive).collect();
        let candidates: Vec<Candidate> = self.candidates().into_iter().filter(|c| !used.contains(&c.drive)).collect();
        let mut rng = self.env.rng();
        placement::choose(1, &candidates, &mut rng)
            .map(|p| p[0])
            .map_err(|e| Failure::new(FsStatus::NoSpace, format!("no drive can take a rebuilt component: {e}")))
    }

    /// After a component moved off `drive`: a new map epoch, which `drive`
    /// enforces, so clients bound to the old place rebind.
    async fn map_moved(&self, drive: u32) {
        let epoch = match self.bump_epoch().await {
            Ok(e) => e,
            Err(e) => return tracing::warn!(error = %e, "cannot move the map epoch"),
        };
        if let Ok(d) = self.drive(drive) {
            if self.is_up(drive) {
                if let Err(e) = d.set_map_epoch(epoch).await {
                    tracing::info!(drive, error = %e, "the drive learns the new map epoch later");
                }
            }
        }
    }

    /// Takes an object from `drive`'s pool for a component being rebuilt
    /// or moved there. Until the component is swapped in it belongs to no
    /// table: it is reserved in the database
    /// ([`nasd_meta::Namespace::reserve_pooled_object`]), which every
    /// manager's orphan collection respects, so a crash of the manager
    /// mid-repair leaves a reservation that lapses after
    /// [`RESERVATION_TTL`](crate::shared::RESERVATION_TTL) and then an orphan
    /// that the next collection removes — never a half-written object that
    /// anything refers to.
    async fn reserve_object(&self, drive: u32) -> Result<ObjectRef, Failure> {
        let id = self.id().to_string();
        let taken = self.meta(move |ns| ns.reserve_pooled_object(drive, &id, crate::shared::RESERVATION_TTL)).await?;
        taken.ok_or_else(|| Failure::new(FsStatus::NoSpace, format!("drive {drive} has no pooled object now")))
    }

    /// Gives up an object taken for a repair that did not happen: removes it
    /// from its drive (it may hold partial data), then its reservation; if
    /// the removal fails, the next orphan collection removes it.
    async fn release_object(&self, object: ObjectRef) {
        if let Ok(d) = self.drive(object.drive) {
            if d.remove(object.object).await.is_err() {
                d.set_unrecovered();
            }
        }
        if let Err(e) = self.meta(move |ns| ns.unreserve_object(&object)).await {
            tracing::debug!(error = %e, "a repair's reservation is left to lapse");
        }
    }

    // ------------------------------------------------------------ scrub

    async fn scrub_all(&self) {
        let drives = self.scrub_targets();
        {
            let mut r = self.repair.lock().expect("repair lock");
            r.scrub = Progress { files_done: 0, files_total: drives.len() as u64, ..Progress::default() };
        }
        let mut summary = ScrubSummary::default();
        for d in drives {
            match d.scrub(SCRUB_REPORT_PER_PASS).await {
                Ok((checked, corrupt)) => {
                    summary.blocks_checked += checked;
                    summary.corrupt += corrupt.len() as u64;
                    for (_, object, block) in corrupt {
                        match self.heal(&d, object, block).await {
                            Ok(true) => summary.healed += 1,
                            Ok(false) => summary.unrecoverable += 1,
                            Err(e) => {
                                tracing::warn!(drive = d.drive, object, block, error = %e, "rot not healed yet");
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(drive = d.drive, error = %e, "scrub failed"),
            }
            self.repair.lock().expect("repair lock").scrub.files_done += 1;
        }
        let next_total = self.scrub_targets().len().max(1) as u64;
        let mut r = self.repair.lock().expect("repair lock");
        r.last_scrub = summary;
        self.metrics.scrubbed(&summary);
        // Asked for again while this pass ran: the next pass is that request's, still under way.
        r.scrub = if r.scrub_requested {
            Progress { files_total: next_total, ..Progress::default() }
        } else {
            Progress::default()
        };
        tracing::info!(?summary, "scrub finished");
    }

    /// Rewrites rotten block `block` of `object` on `d` from the file's
    /// redundancy. Ok(false): the file has none (or the object is no file's).
    async fn heal(&self, d: &DriveHandle, object: u64, block: u64) -> Result<bool, Failure> {
        let oref = ObjectRef { drive: d.drive, partition: d.partition, object };
        let Some((ino, idx)) = self.meta(move |ns| ns.component_of(&oref)).await? else { return Ok(false) };
        let inode = self.meta(move |ns| ns.getattr(ino)).await?;
        if !inode.layout.is_some_and(|l| l.is_redundant()) {
            return Ok(false);
        }
        let bs = d.block_size().await.map_err(|e| Failure::new(FsStatus::DriveUnavailable, e.to_string()))? as u64;
        self.as_writer(ino, |_| async {
            let inode = self.meta(move |ns| ns.getattr(ino)).await?;
            let g = geometry(&inode)?;
            let len = g.component_len(inode.attr.size, idx);
            let (from, to) = (block * bs, ((block + 1) * bs).min(len));
            if from < to {
                let striper = self.striper_for(&inode, &BTreeSet::from([idx]))?;
                self.copy_reconstructed(&striper, &striper, idx, from, to, inode.attr.size, false).await?;
            }
            d.flush_objects(&[object])
                .await
                .map_err(|e| Failure::new(FsStatus::DriveUnavailable, format!("drive {}: {e}", d.drive)))?;
            tracing::info!(ino, idx, drive = d.drive, block, "rotten block healed from redundancy");
            Ok((true, Record::Nothing))
        })
        .await
    }

    // ------------------------------------------------------------ rebalance

    /// Moves components from drives above the average use to drives below
    /// it until every drive in service is within [`REBALANCE_TOLERANCE`]
    /// of its share.
    async fn rebalance(&self) {
        self.probe_unreported().await;
        let mut used = self.used_by_drive();
        let to_move = self.rebalance_to_move(&used);
        if to_move == 0 {
            self.repair.lock().expect("repair lock").rebalance = Progress::default();
            return;
        }
        let average = used.iter().map(|(_, u)| *u as f64).sum::<f64>() / used.len() as f64;
        {
            let mut r = self.repair.lock().expect("repair lock");
            r.rebalance = Progress { files_done: 0, files_total: 0, bytes_done: 0, bytes_total: to_move };
        }
        loop {
            used.sort_by_key(|(_, u)| *u);
            let (low, low_used) = used[0];
            let (high, high_used) = used[used.len() - 1];
            if (low_used as f64) >= average * (1.0 - REBALANCE_TOLERANCE) || high == low {
                break;
            }
            match self.move_one(high, low).await {
                Ok(Some(bytes)) => {
                    used[0].1 += bytes;
                    let last = used.len() - 1;
                    used[last].1 = high_used.saturating_sub(bytes);
                    let mut r = self.repair.lock().expect("repair lock");
                    r.rebalance.files_done += 1;
                    r.rebalance.files_total = r.rebalance.files_total.max(r.rebalance.files_done);
                    r.rebalance.bytes_done += bytes;
                    self.metrics.moved(bytes);
                }
                Ok(None) | Err(_) => break,
            }
        }
        self.repair.lock().expect("repair lock").rebalance = Progress::default();
    }

    /// Bytes a rebalance over drives using `used` bytes would move: what
    /// the drives below the average lack of it (0 with fewer than two drives).
    fn rebalance_to_move(&self, used: &[(u32, u64)]) -> u64 {
        if used.len() < 2 {
            return 0;
        }
        let average = used.iter().map(|(_, u)| *u as f64).sum::<f64>() / used.len() as f64;
        used.iter().filter(|(_, u)| (*u as f64) < average).map(|(_, u)| (average - *u as f64) as u64).sum()
    }

    /// Moves one component from drive `from` to drive `to` (a current one,
    /// whose file has none on `to` yet: a Stale component is left to its
    /// resync, never copied as it is). Its bytes, or None if no component
    /// can move.
    async fn move_one(&self, from: u32, to: u32) -> Result<Option<u64>, Failure> {
        let mut after = (0, 0);
        loop {
            let page = self.meta(move |ns| ns.components_on_drive(from, after, REPAIR_PAGE)).await?;
            let Some(&(ino, idx, _)) = page.last() else { return Ok(None) };
            after = (ino, idx);
            for &(ino, idx, _) in &page {
                let inode = self.meta(move |ns| ns.getattr(ino)).await?;
                let current = inode.components.get(idx).is_some_and(|c| c.state == ComponentState::Ok);
                if !current || inode.components.iter().any(|c| c.object.drive == to) {
                    continue;
                }
                let bytes = geometry(&inode)?.component_len(inode.attr.size, idx);
                if self.relocate(ino, idx, Relocation::Move { to }).await? {
                    return Ok(Some(bytes));
                }
            }
            if page.len() < REPAIR_PAGE {
                return Ok(None);
            }
        }
    }

    // ------------------------------------------------------------ progress

    // The rebuild progress `CLUSTER_STATUS` shows counts the files a pass
    // takes on (resyncs and rebuilds, not a rebalance's moves) and the bytes
    // they plan to copy; an item that fails leaves the pass's totals (it is
    // left for a later pass) with what it did not copy, so the totals stay
    // what the pass will do and never run ahead of it.

    fn plan_rebuild_files(&self, n: u64) {
        self.repair.lock().expect("repair lock").rebuild.files_total += n;
    }

    fn plan_rebuild_bytes(&self, n: u64) {
        self.repair.lock().expect("repair lock").rebuild.bytes_total += n;
    }

    fn add_rebuild_bytes(&self, n: u64) {
        self.repair.lock().expect("repair lock").rebuild.bytes_done += n;
        self.metrics.rebuilt_bytes(n);
    }

    /// Runs one file's resync or rebuild as an item of the rebuild progress
    /// (planned with [`plan_rebuild_files`](Self::plan_rebuild_files)).
    async fn counted<T>(&self, item: impl std::future::Future<Output = Result<T, Failure>>) -> Result<T, Failure> {
        let before = self.repair.lock().expect("repair lock").rebuild;
        let r = item.await;
        let mut p = self.repair.lock().expect("repair lock");
        match &r {
            Ok(_) => {
                p.rebuild.files_done += 1;
                self.metrics.rebuilt_file();
            }
            Err(_) => {
                let planned = p.rebuild.bytes_total - before.bytes_total;
                let copied = p.rebuild.bytes_done - before.bytes_done;
                p.rebuild.bytes_total -= planned.saturating_sub(copied);
                p.rebuild.files_total = p.rebuild.files_total.saturating_sub(1);
            }
        }
        debug_assert!(p.rebuild.files_done <= p.rebuild.files_total && p.rebuild.bytes_done <= p.rebuild.bytes_total);
        r
    }
}

/// What the commit of a repair's write transaction records besides.
#[derive(Debug, Clone)]
enum Record {
    /// Nothing (the work recorded what it changed under the transaction).
    Nothing,
    /// These component ranges, brought up to date in place or found to
    /// hold what the file holds, are current: in the same metadata
    /// transaction as the commit (`Namespace::commit_repair`). Recorded
    /// before the commit, a crash or a rollback in between would leave them
    /// marked current over bytes the rollback took back.
    Current(Vec<(usize, StaleRange)>),
}

/// How a component gets its new place.
#[derive(Debug, Clone, Copy)]
enum Relocation {
    /// Reconstructed from the file's other components onto a drive placement picks.
    Rebuild,
    /// Copied as it is onto drive `to`.
    Move { to: u32 },
}

fn geometry(inode: &Inode) -> Result<Geometry, Failure> {
    let layout = inode.layout.ok_or_else(|| Failure::new(FsStatus::InvalidArgument, "not a regular file"))?;
    Geometry::new(layout).map_err(|e| Failure::new(FsStatus::Internal, e.to_string()))
}

/// Adds `[offset, offset + length)` of component `c` to `ranges`, joined
/// with the last one if they touch.
fn add_range(ranges: &mut Vec<(usize, StaleRange)>, c: usize, offset: u64, length: u64) {
    if length == 0 {
        return;
    }
    match ranges.iter_mut().rev().find(|(x, _)| *x == c) {
        Some((_, last)) if last.end() == offset => last.length += length,
        _ => ranges.push((c, StaleRange { offset, length })),
    }
}

/// At most [`nasd_meta::COMMIT_STALE_MAX`] ranges, as a commit takes: the
/// rest are left out (they stay recorded stale, to be found again).
fn bounded(mut ranges: Vec<(usize, StaleRange)>) -> Vec<(usize, StaleRange)> {
    ranges.truncate(nasd_meta::COMMIT_STALE_MAX);
    ranges
}

/// A digest of a file's size and recorded stale ranges.
fn fingerprint(size: u64, stale: &BTreeMap<usize, Vec<StaleRange>>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (size, stale).hash(&mut h);
    h.finish()
}

fn target_of(s: &Striper) -> Target {
    (*s.target()).clone()
}

fn stripe_failure(e: nasd_stripe::StripeError) -> Failure {
    Failure::new(FsStatus::DriveUnavailable, e.to_string())
}
