//! The manager's cluster map: the drive table with each drive's service
//! state (in/out) and health (up/down, from [`crate::health`]), the map
//! epoch, the heartbeat loop that keeps health current, and what placement,
//! repair and `CLUSTER_STATUS` read from it.
//!
//! The map epoch (a metadata setting) moves whenever a drive joins, changes
//! state, or a component moves. Capabilities carry the epoch they were
//! minted under; when a component moves off a drive the manager raises that
//! drive's minimum epoch for the partition, so a client still bound there
//! gets `MAP_EPOCH_MOVED` (or `NO_SUCH_OBJECT`) and rebinds with `GETATTR`.
//!
//! **Readmission.** Removing, replacing or re-protecting a file finishes on
//! the drives before the reply (`Manager::apply`) — except on a drive that
//! is down or does not answer: its share stays in the intention logs
//! (written in the change's own metadata transaction), the drive is marked
//! unrecovered, and the request succeeds. The **fence** keeps a returning
//! drive from serving old capabilities meanwhile: a drive whose partition
//! has a minimum map epoch (every drive a manager placed objects on) starts
//! fenced and refuses every capability with `MAP_EPOCH_MOVED` until
//! `SET_MAP_EPOCH` readmits it. The manager readmits a drive only at the end
//! of its recovery (`recover_drive`): working key, open transactions
//! resolved, every logged revocation and removal for it carried out and
//! flushed, orphans collected, then `SET_MAP_EPOCH`. Recovery is due at
//! start, when the heartbeat sees the drive go down or come up, when it
//! reaches the drive on a new connection after its last one broke (a
//! restart within the missed beats), or when the manager's own connection,
//! refused before, connects again (`DriveHandle::readmission_due`). Until
//! then the manager does not serve the drive (`Manager::serving`): lookups
//! mark its components `Down`, placement skips it. A client that meets the
//! fence rebinds (at most twice per request) and reads around the component
//! or lets a write miss it. Not covered: a drive that stays up but that the
//! manager cannot reach keeps honouring capabilities minted before a change
//! until the manager reaches it or they expire (closing that needs
//! drive-side leases renewed by heartbeats, which nasd does not have).

use crate::health::{self, Transition};
use crate::metrics::CLUSTER_GAUGES_INTERVAL;
use crate::placement::Candidate;
use crate::{DriveHandle, Failure, Manager};
use nasd_proto::fs::FsStatus;
use nasd_proto::manager::{ClusterStatus, DriveState, DriveStatus, DRIVES_MAX};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The heartbeat's connection to one drive, and whether its last attempt
/// found the connection broken (the drive may be restarting).
#[derive(Default)]
pub(crate) struct Heartbeat {
    conn: Option<nasd_client::DriveClient>,
    suspect: bool,
}

impl Manager {
    /// Whether drive `drive` answers heartbeats (as the manager last saw;
    /// a drive not probed yet counts as up).
    pub(crate) fn is_up(&self, drive: u32) -> bool {
        self.health.lock().expect("health lock").get(&drive).is_none_or(|h| h.is_up())
    }

    /// Whether drive `drive` serves clients: it answers heartbeats and,
    /// if it may have restarted, its manager readmitted it. Lookups mark the
    /// components of other drives `Down`, placement skips them, and the
    /// cluster status shows them down.
    pub(crate) fn serving(&self, drive: u32) -> bool {
        self.is_up(drive) && self.drive(drive).is_ok_and(|d| d.admitted())
    }

    /// How long drive `drive` has been down, if it is.
    pub(crate) fn down_for(&self, drive: u32, now: Instant) -> Option<Duration> {
        self.health.lock().expect("health lock").get(&drive).and_then(|h| h.down_for(now))
    }

    /// Whether drive `drive` is out of service.
    pub(crate) fn is_out(&self, drive: u32) -> bool {
        self.out_of_service.lock().expect("out lock").contains(&drive)
    }

    /// The current cluster map epoch.
    pub(crate) fn epoch(&self) -> u32 {
        self.map_epoch.load(Ordering::SeqCst)
    }

    /// Moves the map epoch on (a drive changed health, a component moved).
    pub(crate) async fn bump_epoch(&self) -> Result<u32, Failure> {
        let epoch = self.meta(|ns| ns.bump_map_epoch()).await?;
        self.map_epoch.fetch_max(epoch, Ordering::SeqCst);
        Ok(epoch)
    }

    /// Drives that may take a new component: in service and up, with what
    /// placement weighs them by.
    pub(crate) fn candidates(&self) -> Vec<Candidate> {
        let now = Instant::now();
        let health = self.health.lock().expect("health lock").clone();
        let mut recent = self.recent.lock().expect("recent lock");
        self.drives()
            .into_iter()
            .filter(|d| !self.is_out(d.drive) && d.admitted() && health.get(&d.drive).is_none_or(|h| h.is_up()))
            .map(|d| {
                let reported = health.get(&d.drive).and_then(|h| h.reported.clone()).unwrap_or_default();
                Candidate {
                    drive: d.drive,
                    failure_domain: reported.failure_domain.clone(),
                    free_bytes: reported.free_bytes(),
                    recent: recent.of(d.drive, now),
                }
            })
            .collect()
    }

    /// Bytes in use on every drive in service that is up, as last reported.
    pub(crate) fn used_by_drive(&self) -> Vec<(u32, u64)> {
        let health = self.health.lock().expect("health lock").clone();
        self.drives()
            .into_iter()
            .filter(|d| !self.is_out(d.drive))
            .filter_map(|d| {
                let h = health.get(&d.drive)?;
                Some((d.drive, h.reported.as_ref().filter(|_| h.is_up())?.used_bytes))
            })
            .collect()
    }

    /// One round of heartbeats to every drive, in parallel; acts on changes
    /// of health: a new map epoch, and for a drive that came back, its open
    /// transactions resolved and repair woken.
    pub(crate) async fn heartbeat(&self, conns: &tokio::sync::Mutex<HashMap<u32, Heartbeat>>) {
        self.probe_drives(self.drives(), conns).await;
    }

    /// Probes the drives in service no heartbeat has reported on yet (a drive
    /// just added), so that a plan made now (a rebalance) weighs them too.
    pub(crate) async fn probe_unreported(&self) {
        let unreported: Vec<_> = {
            let health = self.health.lock().expect("health lock");
            self.drives()
                .into_iter()
                .filter(|d| !self.is_out(d.drive))
                .filter(|d| health.get(&d.drive).is_none_or(|h| h.reported.is_none()))
                .collect()
        };
        if !unreported.is_empty() {
            self.probe_drives(unreported, &tokio::sync::Mutex::new(HashMap::new())).await;
        }
    }

    async fn probe_drives(&self, drives: Vec<Arc<DriveHandle>>, conns: &tokio::sync::Mutex<HashMap<u32, Heartbeat>>) {
        let mut conns = conns.lock().await;
        let probes = drives.iter().map(|d| {
            let Heartbeat { conn, suspect } = conns.remove(&d.drive).unwrap_or_default();
            let mut conn = conn;
            let (addr, id, drive) = (d.addr.clone(), d.drive_id, d.drive);
            let env = self.env.clone();
            async move {
                let probe = health::probe(&env, &mut conn, &addr, id).await;
                (drive, conn, suspect, probe)
            }
        });
        let answers = futures::future::join_all(probes).await;
        let now = Instant::now();
        let mut changed = Vec::new();
        {
            let mut health = self.health.lock().expect("health lock");
            for (drive, conn, suspect, probe) in answers {
                // A drive that answers on a new connection after its last one broke (not merely
                // timed out) may have restarted within the misses that would make it down, and
                // fenced itself: it is not served to clients again until readmitted. Recorded
                // before the answer counts, so no lookup finds it up and admitted in between.
                let suspect = suspect || probe.broken;
                if probe.answer.is_some() && probe.fresh && suspect {
                    self.readmission_due(drive);
                }
                let suspect = suspect && probe.answer.is_none();
                conns.insert(drive, Heartbeat { conn, suspect });
                let t = health.entry(drive).or_default().observe(now, probe.answer);
                if t != Transition::None {
                    changed.push((drive, t));
                }
            }
        }
        drop(conns);
        for (drive, t) in changed {
            self.on_health_change(drive, t).await;
        }
    }

    /// `drive` may have restarted — it went down, or the heartbeat reached
    /// it on a new connection after the last one broke — and a restarted
    /// drive refuses capabilities until it is readmitted: it is not served
    /// to clients until then, and its recovery — which finishes what was
    /// logged for it, then readmits it — runs at the next maintenance pass,
    /// whatever backoff its earlier failures earned.
    fn readmission_due(&self, drive: u32) {
        if let Ok(d) = self.drive(drive) {
            d.readmission_due();
        }
    }

    async fn on_health_change(&self, drive: u32, t: Transition) {
        match t {
            Transition::WentDown => {
                tracing::warn!(drive, "drive is down: reads go around it, writes miss it");
                self.readmission_due(drive);
            }
            Transition::CameUp => tracing::info!(drive, "drive is up again"),
            Transition::None => return,
        }
        if let Err(e) = self.bump_epoch().await {
            tracing::warn!(error = %e, "cannot move the map epoch");
        }
        if t == Transition::CameUp {
            if let Ok(d) = self.drive(drive) {
                if let Err(e) = self.resolve_drive_txns(&d).await {
                    tracing::info!(drive, error = %e, "open transactions resolved later");
                }
                // What happened while it was down (revocations, removals) is finished by its
                // recovery, which then readmits it.
                self.readmission_due(drive);
            }
            self.repair_kick.notify_one();
        }
        self.refresh_cluster_gauges().await;
    }

    /// The heartbeat loop: a round every [`health::HEARTBEAT_INTERVAL`] until shutdown,
    /// and the cluster gauges refreshed every [`CLUSTER_GAUGES_INTERVAL`] after one.
    pub(crate) async fn heartbeat_loop(&self, shutdown: tokio::sync::watch::Receiver<bool>) {
        let conns = tokio::sync::Mutex::new(HashMap::new());
        let gauges_due = std::sync::Mutex::new(Instant::now());
        let (conns, gauges_due) = (&conns, &gauges_due);
        self.every(health::HEARTBEAT_INTERVAL, shutdown, move || async move {
            self.background("heartbeat", self.heartbeat(conns)).await;
            let now = Instant::now();
            let due = {
                let mut at = gauges_due.lock().expect("gauges lock");
                let due = now >= *at;
                if due {
                    *at = now + CLUSTER_GAUGES_INTERVAL;
                }
                due
            };
            if due {
                self.refresh_cluster_gauges().await;
            }
        })
        .await;
    }

    /// Counts files degraded and drives by state into the metrics, as
    /// `CLUSTER_STATUS` counts them (without asking drives anything); only
    /// while the metrics are registered, so nobody pays for gauges no one reads.
    pub(crate) async fn refresh_cluster_gauges(&self) {
        if !self.metrics.registered() {
            return;
        }
        let counted = async {
            let counts: HashMap<u32, u64> = self.meta(|ns| ns.component_counts()).await?.into_iter().collect();
            let stale_files = self.meta(|ns| ns.degraded_files()).await?;
            Ok::<_, Failure>((counts, stale_files))
        };
        let (counts, stale_files) = match counted.await {
            Ok(c) => c,
            Err(f) => return tracing::debug!(error = %f.message, "degraded files not counted for the metrics"),
        };
        let (mut up, mut down, mut out, mut on_down_drives) = (0, 0, 0, 0);
        for d in self.drives() {
            let serving = self.serving(d.drive);
            if !serving {
                on_down_drives += counts.get(&d.drive).copied().unwrap_or(0);
            }
            match (self.is_out(d.drive), serving) {
                (true, _) => out += 1,
                (false, true) => up += 1,
                (false, false) => down += 1,
            }
        }
        // As `CLUSTER_STATUS`: an upper bound, a file with components on two down drives twice.
        self.metrics.cluster(stale_files + on_down_drives, up, down, out);
    }

    /// `SET_DRIVE_STATE`: takes a drive out of service or back in.
    pub(crate) async fn set_drive_state(&self, drive: u32, state: DriveState) -> Result<(), Failure> {
        self.drive(drive).map_err(|_| Failure::new(FsStatus::NotFound, format!("there is no drive {drive}")))?;
        let epoch = self.meta(move |ns| ns.set_drive_state(drive, state)).await?;
        self.map_epoch.fetch_max(epoch, Ordering::SeqCst);
        let mut out = self.out_of_service.lock().expect("out lock");
        match state {
            DriveState::Out => out.insert(drive),
            DriveState::In => out.remove(&drive),
        };
        drop(out);
        self.repair_kick.notify_one();
        Ok(())
    }

    /// `CLUSTER_STATUS`.
    pub(crate) async fn cluster_status(&self) -> Result<ClusterStatus, Failure> {
        let counts: HashMap<u32, u64> = self.meta(|ns| ns.component_counts()).await?.into_iter().collect();
        let records = self.meta(|ns| ns.drives()).await?;
        let stale_files = self.meta(|ns| ns.degraded_files()).await?;
        let health = self.health.lock().expect("health lock").clone();
        let mut drives = Vec::new();
        let mut on_down_drives = 0;
        for rec in records.into_iter().take(DRIVES_MAX) {
            let h = health.get(&rec.drive).cloned().unwrap_or_default();
            let mut reported = h.reported.clone().unwrap_or_default();
            let components = counts.get(&rec.drive).copied().unwrap_or(0);
            let up = h.is_up() && self.drive(rec.drive).is_ok_and(|d| d.admitted());
            // The space as of now, as `STATFS` (`nasd df`) asks it: the health check's report may
            // be from before the last writes (issue 31.6: df and status disagreed after a put).
            if up {
                if let Ok(d) = self.drive(rec.drive) {
                    if let Ok(info) = d.inquiry().await {
                        reported.capacity_bytes = info.capacity_bytes;
                        reported.used_bytes = info.used_bytes;
                    }
                }
            }
            if !up {
                on_down_drives += components;
            }
            drives.push(DriveStatus {
                drive: rec.drive,
                addr: rec.addr,
                failure_domain: if reported.failure_domain.is_empty() {
                    rec.failure_domain
                } else {
                    reported.failure_domain
                },
                state: rec.state,
                up,
                capacity_bytes: if reported.capacity_bytes > 0 { reported.capacity_bytes } else { rec.capacity_bytes },
                used_bytes: reported.used_bytes,
                components,
            });
        }
        let r = self.repair.lock().expect("repair lock").clone();
        Ok(ClusterStatus {
            map_epoch: self.epoch(),
            drives,
            // Files with a stale component, plus (an upper bound) those with one on a down drive.
            files_degraded: stale_files + on_down_drives,
            rebuild: r.rebuild_shown(),
            rebalance: r.rebalance,
            scrub: r.scrub,
            last_scrub: r.last_scrub,
        })
    }
}
