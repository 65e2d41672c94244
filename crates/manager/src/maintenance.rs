//! What the manager does for drives outside of requests: recovery after a
//! restart (working keys, orphan collection), finishing intention logs
//! (revocations, removals) durably, keeping object pools full, rotating
//! working keys.
//!
//! Every step is idempotent, so a crash anywhere is repaired by doing the
//! same step again.

use crate::drives::{DriveError, DriveHandle};
use crate::keys::DriveKeys;
use crate::{Failure, Manager};
use nasd_meta::AcvIntent;
use nasd_proto::fs::{FsStatus, ObjectRef};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Most intention-log entries one maintenance pass finishes.
const INTENTS_PER_PASS_MAX: usize = 4096;
/// Wait before retrying a drive's upkeep (recovery, pool refill, key
/// rotation) after it first fails; each further failure doubles it.
pub const DRIVE_RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest wait between retries of a failing drive's upkeep. Recovery of a
/// drive reads its whole `PARTITION_CONTENTS` (up to 512 MiB at
/// `PARTITION_OBJECTS_MAX`), so a drive that keeps failing must not cost that
/// every pass; it is retried at least this often.
pub const DRIVE_RETRY_MAX: Duration = Duration::from_secs(60);

const _: () = assert!(DRIVE_RETRY_MIN.as_nanos() > 0 && DRIVE_RETRY_MIN.as_nanos() <= DRIVE_RETRY_MAX.as_nanos());

/// Bounded exponential backoff of one drive's upkeep.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// Failures in a row.
    failures: u32,
    /// No retry before this.
    not_before: Option<Instant>,
}

impl Backoff {
    /// Whether the upkeep may run at `now`.
    pub(crate) fn ready(&self, now: Instant) -> bool {
        !matches!(self.not_before, Some(t) if now < t)
    }

    /// Failures in a row so far.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }

    /// Records a failure at `now`; returns the wait before the next try.
    pub(crate) fn failed(&mut self, now: Instant) -> Duration {
        self.failures = self.failures.saturating_add(1);
        // 2^16 × DRIVE_RETRY_MIN is past DRIVE_RETRY_MAX already; the cap keeps the shift in range.
        let doublings = (self.failures - 1).min(16);
        let wait = DRIVE_RETRY_MIN.saturating_mul(1 << doublings).min(DRIVE_RETRY_MAX);
        self.not_before = Some(now + wait);
        wait
    }
}

fn drive_failure(drive: u32, e: DriveError) -> Failure {
    Failure::new(FsStatus::DriveUnavailable, format!("drive {drive}: {e}"))
}

impl Manager {
    /// Brings drives back in line with the metadata after a start: makes
    /// sure each has the current working key, removes objects no file, pool
    /// or log knows (left by a crash between creating objects on a drive and
    /// recording them), then finishes the intention logs and fills pools.
    /// A drive that does not answer is reported, and every maintenance pass
    /// tries again until it has been recovered.
    ///
    /// On a metadata store no other manager shares, the pools are renewed
    /// first: a power loss may have undone creates that were acknowledged
    /// (within `metadata_sync_ms`) and put their objects back in the pool
    /// after their clients wrote to them, and a pooled object must be empty
    /// (a new file's bytes past its end read as zeros, never another file's).
    /// Each pooled object is doomed, removed before its drive is readmitted,
    /// and the pool filled again with new ones.
    pub async fn recover(&self) {
        self.background("recovery", async {
            if !self.shared_database() {
                self.renew_pools().await;
            }
            self.maintain().await;
        })
        .await
    }

    /// Runs `work`, the manager's own (a maintenance pass, a repair step,
    /// heartbeats; not a client's request), as one operation under a fresh
    /// trace id: in a `background` span (`work`, `trace_id`) ended by a
    /// debug line "background work done", every drive request it makes
    /// carrying the id, so that its requests can be told apart from
    /// clients' and from other background work's in the drives' logs
    /// (docs/PROTOCOL.md, "Trace ids").
    pub(crate) fn background<F: std::future::Future>(
        &self,
        work: &'static str,
        fut: F,
    ) -> impl std::future::Future<Output = F::Output> {
        use tracing::Instrument;
        let trace = nasd_client::trace::fresh(&self.env);
        let span = tracing::info_span!("background", work, trace_id = %trace);
        // Boxed: the work (a whole maintenance pass holds resync, rebuild, scrub and
        // rebalance, each wrapped here) would otherwise sit inline in every layer
        // below, and an unoptimised build overflows a 2 MiB worker stack moving it.
        let fut = Box::pin(fut);
        let done = async move {
            let started = std::time::Instant::now();
            let out = fut.await;
            tracing::debug!(elapsed_us = started.elapsed().as_micros() as u64, "background work done");
            out
        };
        nasd_client::trace::scope(Some(trace), done.instrument(span))
    }

    /// Dooms every drive's pooled objects (see [`recover`](Self::recover)).
    async fn renew_pools(&self) {
        for d in self.drives() {
            let drive = d.drive;
            match self.meta(move |ns| ns.doom_pool(drive)).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(drive, objects = n, "pooled objects doomed at start"),
                Err(f) => tracing::warn!(drive, error = %f, "cannot renew the drive's pool at start"),
            }
        }
    }

    /// Recovery of one drive, which ends with its readmission: the
    /// drive's partition refuses every capability after a restart (it is
    /// fenced) until `SET_MAP_EPOCH` readmits it, and that is sent only once
    /// everything logged for the drive while it was away — revocations and
    /// removals a request could not finish on it — is done. So a drive that
    /// was down when a file was removed or replaced never serves the old
    /// file's capabilities again (`cluster.rs`, "Readmission").
    async fn recover_drive(&self, d: &Arc<DriveHandle>) -> Result<(), Failure> {
        self.install_key(d).await?;
        self.resolve_drive_txns(d).await?;
        self.finish_logs_on(d).await?;
        let orphans = match self.collect_orphans(d).await {
            Ok(n) => n,
            // Another manager is looking after the drive now: the whole recovery (each step
            // idempotent) runs again on a later pass, and the drive stays fenced until then.
            Err(f) if f.status == FsStatus::Busy => return Ok(()),
            Err(f) => return Err(f),
        };
        if orphans > 0 {
            tracing::info!(drive = d.drive, orphans, "removed objects no file referenced");
        }
        self.readmit(d).await?;
        d.set_admitted(true);
        d.set_recovered();
        Ok(())
    }

    /// Finishes every revocation and removal logged for drive `d`.
    async fn finish_logs_on(&self, d: &Arc<DriveHandle>) -> Result<(), Failure> {
        let drive = d.drive;
        loop {
            let intents = self.meta(move |ns| ns.acv_intents_on(drive, INTENTS_PER_PASS_MAX)).await?;
            let more = intents.len() == INTENTS_PER_PASS_MAX;
            self.revoke_on(drive, intents).await?;
            if !more {
                break;
            }
        }
        loop {
            let doomed = self.meta(move |ns| ns.doomed_on(drive, INTENTS_PER_PASS_MAX)).await?;
            let more = doomed.len() == INTENTS_PER_PASS_MAX;
            self.remove_on(drive, doomed).await?;
            if !more {
                return Ok(());
            }
        }
    }

    /// Readmits drive `d`: sets its partition's minimum map epoch to the
    /// current one (at least 1, so that the drive fences itself at its next
    /// start), which ends the fence of a restart.
    pub(crate) async fn readmit(&self, d: &Arc<DriveHandle>) -> Result<(), Failure> {
        let epoch = match self.epoch() {
            0 => self.bump_epoch().await?,
            e => e,
        };
        d.set_map_epoch(epoch).await.map_err(|e| drive_failure(d.drive, e))
    }

    /// Removes every object on `d` the metadata does not know; returns how
    /// many. Runs under the drive's lease (`Manager::drive_lease`), which
    /// every manager's pool refill of the drive takes too: the objects a
    /// refill made and did not record are either recorded before this
    /// acquired the lease (and so known here), or never (the refill's fence
    /// fails), so no fresh object is taken for an orphan.
    ///
    /// # Errors
    /// `Busy` if another manager holds the drive's lease; `DriveUnavailable`;
    /// as the metadata.
    pub async fn collect_orphans(&self, d: &DriveHandle) -> Result<usize, Failure> {
        let _admin = self.drive_admin.lock().await;
        let held = self.drive_lease_or_busy(d.drive).await?;
        let r = self.collect_orphans_held(d).await;
        self.release(held).await;
        r
    }

    async fn collect_orphans_held(&self, d: &DriveHandle) -> Result<usize, Failure> {
        let drive = d.drive;
        self.meta(move |ns| ns.drop_lapsed_reservations(drive)).await?;
        // Listed before the metadata is read: an object made after the listing is not in it.
        let on_drive = d.list_objects().await.map_err(|e| drive_failure(d.drive, e))?;
        let known = self.meta(move |ns| ns.known_objects(drive)).await?;
        let orphans: Vec<u64> = on_drive.into_iter().filter(|o| !known.contains(o)).collect();
        for &o in &orphans {
            d.remove(o).await.map_err(|e| drive_failure(d.drive, e))?;
        }
        if !orphans.is_empty() {
            d.flush().await.map_err(|e| drive_failure(d.drive, e))?;
        }
        Ok(orphans.len())
    }

    /// Runs the manager's background work until `shutdown` turns true:
    /// [`maintain`](Self::maintain) every `maintenance_interval`, heartbeats
    /// to every drive (`crate::cluster`), and the repair loop (`crate::repair`),
    /// each in its own loop so a long repair delays neither heartbeats nor
    /// the intention logs.
    pub fn spawn_maintenance(self: &Arc<Self>, shutdown: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        self.env.spawn(async move {
            let maintenance = me.every(me.config.maintenance_interval, shutdown.clone(), || {
                me.background("maintenance", me.maintain())
            });
            let heartbeats = me.heartbeat_loop(shutdown.clone());
            let repair = me.repair_loop(shutdown.clone());
            let sweep = async {
                if let Some(age) = me.config.temporaries_age {
                    let interval = age.clamp(Duration::from_millis(100), crate::TEMPORARIES_SWEEP_INTERVAL_MAX);
                    me.every(interval, shutdown, || me.background("sweep", me.sweep_temporaries(age))).await;
                }
            };
            tokio::join!(maintenance, heartbeats, repair, sweep);
        })
    }

    /// Removes the temporary copies ([`crate::TEMPORARY_SUFFIX`]) that
    /// clients which died mid-copy left: regular files not written for
    /// `age`, with no write transaction open, at most
    /// [`crate::TEMPORARIES_PER_SWEEP`] a sweep. Removal is an unlink as
    /// root (the file's objects doomed as any removal's); a name gone or
    /// replaced meanwhile (another manager swept it, the client renamed it)
    /// is left alone.
    pub async fn sweep_temporaries(&self, age: Duration) {
        let now = nasd_env::clock::system_since_epoch();
        let older_than = now.saturating_sub(age).as_nanos().min(i64::MAX as u128) as i64;
        let found = self
            .meta(move |ns| ns.stale_temporaries(crate::TEMPORARY_SUFFIX, older_than, crate::TEMPORARIES_PER_SWEEP))
            .await;
        let found = match found {
            Ok(f) => f,
            Err(f) => return tracing::warn!(error = %f.message, "cannot look for temporaries clients left"),
        };
        for (dir, name) in found {
            let n = name.clone();
            let removed = async {
                let effects = self.meta(move |ns| ns.unlink(&nasd_meta::Caller::ROOT, dir, &n)).await?;
                self.apply(effects).await
            };
            match removed.await {
                Ok(()) => tracing::info!(dir, name, "removed a temporary copy a client left (not written for {age:?})"),
                Err(f) if f.status == FsStatus::NotFound => {}
                Err(f) => tracing::warn!(dir, name, error = %f.message, "cannot remove a temporary copy a client left"),
            }
        }
    }

    /// Runs `pass` every `interval` until `shutdown` turns true.
    pub(crate) async fn every<F: std::future::Future<Output = ()>>(
        &self,
        interval: Duration,
        mut shutdown: watch::Receiver<bool>,
        mut pass: impl FnMut() -> F,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = tick.tick() => pass().await,
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }

    /// One pass: finish revocations and removals durably, give drives
    /// their pending working keys, fill pools, rotate working keys that are
    /// due. Failures are logged and retried: a pending working key on every
    /// pass (one cheap request), the rest of a failing drive's upkeep after
    /// its backoff.
    pub async fn maintain(&self) {
        // What other managers on the database changed: drives, keys, epochs, users.
        let r = self.refresh_shared().await;
        self.report("shared state", r);
        let r = self.refresh_routing().await;
        self.report("routing table", r);
        self.abort_expired().await;
        if self.config.auth.is_some() {
            if let Err(f) = self.sync_identity_keys().await {
                tracing::warn!(error = %f.message, "identity keys not synchronized");
            }
        }
        self.retry_pals().await;
        let r = self.finish_revocations().await;
        self.report("revocations", r);
        let r = self.finish_removals().await;
        self.report("removals", r);
        for d in self.drives() {
            // Not behind the backoff: until the drive has its current working
            // key, capabilities are minted with the previous one, which the
            // next rotation retires — and rotation waits for the install.
            let r = self.install_key(&d).await;
            let key_ok = r.is_ok();
            self.report(&format!("drive {} working key", d.drive), r);
            if d.take_readmission() {
                self.drive_backoff.lock().expect("backoff lock").remove(&d.drive);
            }
            if !self.backoff(d.drive).ready(Instant::now()) {
                continue;
            }
            let ok = key_ok && self.upkeep(&d).await;
            let mut backoff = self.drive_backoff.lock().expect("backoff lock");
            if ok {
                backoff.remove(&d.drive);
            } else {
                let b = backoff.entry(d.drive).or_default();
                let wait = b.failed(Instant::now());
                tracing::debug!(drive = d.drive, failures = b.failures(), ?wait, "drive upkeep failed; backing off");
            }
        }
    }

    /// The backoff state of `drive`'s upkeep.
    pub(crate) fn backoff(&self, drive: u32) -> Backoff {
        self.drive_backoff.lock().expect("backoff lock").get(&drive).cloned().unwrap_or_default()
    }

    /// One drive's share of a pass once its working key is in place:
    /// recovery (if not done yet), pool refill, key rotation. Whether all of
    /// it succeeded.
    async fn upkeep(&self, d: &Arc<DriveHandle>) -> bool {
        let r = if d.recovered() { Ok(()) } else { self.recover_drive(d).await };
        let ready = r.is_ok();
        self.report(&format!("drive {} recovery", d.drive), r);
        if !ready {
            return false;
        }
        let r = self.refill_pool(d).await.map(|_| ());
        let refilled = r.is_ok();
        self.report(&format!("drive {} object pool", d.drive), r);
        let r = self.rotate_if_due(d).await;
        let rotated = r.is_ok();
        self.report(&format!("drive {} key rotation", d.drive), r);
        refilled && rotated
    }

    /// Logs a maintenance step's failure once when it starts failing and
    /// once when it recovers, not on every pass.
    fn report(&self, step: &str, r: Result<(), Failure>) {
        let mut failing = self.failing.lock().expect("failing lock");
        match r {
            Ok(()) => {
                if failing.remove(step).is_some() {
                    tracing::info!(step, "maintenance step recovered");
                }
            }
            Err(f) => {
                if failing.insert(step.to_string(), f.message.clone()).as_deref() != Some(f.message.as_str()) {
                    tracing::warn!(step, error = %f, "maintenance step failed; will retry");
                }
            }
        }
    }

    /// Sets each logged access control version on its drive, flushes those
    /// drives, then forgets the log entries.
    async fn finish_revocations(&self) -> Result<(), Failure> {
        let intents = self.meta(|ns| ns.acv_intents(INTENTS_PER_PASS_MAX)).await?;
        let mut by_drive: BTreeMap<u32, Vec<AcvIntent>> = BTreeMap::new();
        for i in intents {
            by_drive.entry(i.object.drive).or_default().push(i);
        }
        let mut outcome = Ok(());
        for (drive, intents) in by_drive {
            // One drive that does not answer must not hold up the others.
            outcome = outcome.and(self.revoke_on(drive, intents).await);
        }
        outcome
    }

    /// Carries out `intents`, all of objects on `drive`, flushes, forgets them.
    async fn revoke_on(&self, drive: u32, intents: Vec<AcvIntent>) -> Result<(), Failure> {
        if intents.is_empty() {
            return Ok(());
        }
        self.durable_before_drive_effects().await?;
        let d = self.drive(drive)?;
        for i in &intents {
            d.set_acv(i.object.object, i.acv).await.map_err(|e| drive_failure(drive, e))?;
        }
        d.flush().await.map_err(|e| drive_failure(drive, e))?;
        self.meta(move |ns| intents.iter().try_for_each(|i| ns.forget_acv_intent(i))).await
    }

    /// Removes each doomed object from its drive, flushes, then forgets them.
    async fn finish_removals(&self) -> Result<(), Failure> {
        let doomed = self.meta(|ns| ns.doomed(INTENTS_PER_PASS_MAX)).await?;
        let mut by_drive: BTreeMap<u32, Vec<ObjectRef>> = BTreeMap::new();
        for o in doomed {
            by_drive.entry(o.drive).or_default().push(o);
        }
        let mut outcome = Ok(());
        for (drive, objects) in by_drive {
            outcome = outcome.and(self.remove_on(drive, objects).await);
        }
        outcome
    }

    /// Removes `objects`, all on `drive`, flushes, forgets them (the change
    /// that doomed them made durable first).
    async fn remove_on(&self, drive: u32, objects: Vec<ObjectRef>) -> Result<(), Failure> {
        if objects.is_empty() {
            return Ok(());
        }
        self.durable_before_drive_effects().await?;
        let d = self.drive(drive)?;
        for o in &objects {
            d.remove(o.object).await.map_err(|e| drive_failure(drive, e))?;
        }
        d.flush().await.map_err(|e| drive_failure(drive, e))?;
        self.meta(move |ns| ns.forget_doomed(&objects)).await
    }

    /// Tops the drive's object pool up to `pool_target` when it has fallen
    /// to half. Objects are created and flushed on the drive before they are
    /// recorded; a crash in between leaves orphans that recovery collects.
    /// Under the drive's lease, and recorded only if the lease is still this
    /// manager's ([`nasd_meta::Namespace::pool_add_fenced`]); if another
    /// manager holds the lease (it is refilling or collecting), nothing is
    /// made here (0).
    pub(crate) async fn refill_pool(&self, d: &DriveHandle) -> Result<usize, Failure> {
        let _admin = self.drive_admin.lock().await;
        let drive = d.drive;
        let have = self.meta(move |ns| ns.pool_len(drive)).await?;
        let target = self.config.pool_target;
        if have > target / 2 {
            return Ok(0);
        }
        let Some(held) = self.drive_lease(drive).await? else { return Ok(0) };
        let r = self.refill_pool_held(d, &held).await;
        self.release(held).await;
        r
    }

    async fn refill_pool_held(&self, d: &DriveHandle, held: &crate::shared::Held) -> Result<usize, Failure> {
        let drive = d.drive;
        // Read again under the lease: another manager may have refilled meanwhile.
        let have = self.meta(move |ns| ns.pool_len(drive)).await?;
        let target = self.config.pool_target;
        if have > target / 2 {
            return Ok(0);
        }
        let ids = d.create_objects(target - have).await.map_err(|e| {
            // Objects created before the failure are on the drive but nowhere
            // in the metadata: collect them on a later pass.
            d.set_unrecovered();
            drive_failure(drive, e)
        })?;
        let objects: Vec<ObjectRef> =
            ids.iter().map(|&object| ObjectRef { drive, partition: d.partition, object }).collect();
        let n = objects.len();
        let lease = held.lease.clone();
        self.meta(move |ns| ns.pool_add_fenced(&objects, &lease)).await.inspect_err(|_| d.set_unrecovered())?;
        Ok(n)
    }

    /// Replaces the drive's working key if it is older than the rotation
    /// interval. The new keys are recorded before the drive hears of them,
    /// so a crash in between is repaired by [`recover`](Self::recover)
    /// installing the recorded current key.
    async fn rotate_if_due(&self, d: &DriveHandle) -> Result<(), Failure> {
        if d.keys().age_s(self.env.now_secs()) < self.config.rotate_interval.as_secs().max(1) {
            return Ok(());
        }
        self.rotate_keys(d, false).await
    }

    /// Replaces the drive's working key now, keeping the current one as
    /// previous. A rotation still pending on the drive is installed first
    /// (and this fails if it cannot be): rotating past it would retire the
    /// key the drive still uses as current, which capabilities are minted
    /// with until the install lands.
    ///
    /// # Errors
    /// `Busy` if another manager holds the drive's lease; `DriveUnavailable`;
    /// as the metadata.
    pub async fn rotate(&self, d: &DriveHandle) -> Result<(), Failure> {
        self.rotate_keys(d, true).await
    }

    /// Rotation under the drive's lease, from the keys the database holds
    /// (another manager may have rotated since this one read them): unless
    /// `force`, only if those are older than the rotation interval. Without
    /// `force`, a lease another manager holds is not a failure (it looks
    /// after the drive now).
    async fn rotate_keys(&self, d: &DriveHandle, force: bool) -> Result<(), Failure> {
        self.install_key(d).await?;
        let _admin = self.drive_admin.lock().await;
        let held = match self.drive_lease(d.drive).await? {
            Some(held) => held,
            None if force => return Err(self.lease_busy(d.drive)),
            None => return Ok(()),
        };
        let r = self.rotate_held(d, &held, force).await;
        self.release(held).await;
        r
    }

    async fn rotate_held(&self, d: &DriveHandle, held: &crate::shared::Held, force: bool) -> Result<(), Failure> {
        let drive = d.drive;
        let mut rec =
            self.meta(move |ns| ns.drives()).await?.into_iter().find(|r| r.drive == drive).ok_or_else(|| {
                Failure::new(FsStatus::Internal, format!("drive {drive} vanished from the drive table"))
            })?;
        let recorded = DriveKeys::open(&self.kek, drive, &rec.sealed_keys).ok_or_else(|| {
            Failure::new(FsStatus::Internal, format!("the keys of drive {drive} do not open with this manager's key"))
        })?;
        let have = d.keys();
        if (have.current.0, have.previous.0) != (recorded.current.0, recorded.previous.0) {
            // Another manager rotated: the drive must have that key before it is rotated past.
            d.set_keys(recorded.clone());
            self.install_key(d).await?;
        }
        if !force && recorded.age_s(self.env.now_secs()) < self.config.rotate_interval.as_secs().max(1) {
            return Ok(());
        }
        let next = recorded.rotated(self.env.now_secs());
        rec.sealed_keys = next.seal(&self.kek, drive);
        let lease = held.lease.clone();
        self.meta(move |ns| ns.update_drive_fenced(&rec, &lease)).await?;
        // The drive gets the new key before anything is minted with it: until
        // then the handle mints with the current key, which the drive keeps as
        // its previous one. (Minting first would hand out capabilities the
        // drive refuses as KEY_VERSION_RETIRED until the install lands.) If the
        // drive cannot be told now, the handle takes the recorded keys with the
        // install pending — it mints with their previous key, the drive's
        // current one — and every later pass retries the install.
        let version = next.current.0;
        if let Err(e) = d.install_working_key(&next).await {
            d.set_keys(next);
            return Err(drive_failure(drive, e));
        }
        d.set_keys_installed(next);
        tracing::info!(drive, version, "working key rotated");
        Ok(())
    }

    /// Gives the drive the recorded current working key if it may lack it.
    async fn install_key(&self, d: &DriveHandle) -> Result<(), Failure> {
        if d.key_pending() {
            d.install_working_key(&d.keys()).await.map_err(|e| drive_failure(d.drive, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_bound_and_gates_retries() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        assert!(b.ready(t0), "a drive that never failed is looked after at once");
        let mut waits = Vec::new();
        let mut now = t0;
        for _ in 0..40 {
            let wait = b.failed(now);
            assert!(!b.ready(now), "no retry right after a failure");
            assert!(!b.ready(now + wait - Duration::from_millis(1)));
            assert!(b.ready(now + wait));
            waits.push(wait);
            now += wait;
        }
        assert_eq!(waits[0], DRIVE_RETRY_MIN);
        assert_eq!(waits[1], DRIVE_RETRY_MIN * 2);
        assert_eq!(waits[2], DRIVE_RETRY_MIN * 4);
        assert!(waits.windows(2).all(|w| w[1] >= w[0]), "{waits:?}");
        assert!(waits.iter().all(|&w| w <= DRIVE_RETRY_MAX), "{waits:?}");
        assert_eq!(*waits.last().unwrap(), DRIVE_RETRY_MAX, "bounded, not growing forever");
        // u32::MAX failures in a row do not overflow.
        let mut b = Backoff { failures: u32::MAX, not_before: None };
        assert_eq!(b.failed(t0), DRIVE_RETRY_MAX);
    }
}
