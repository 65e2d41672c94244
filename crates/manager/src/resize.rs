//! Size changes of a file's data (`SETATTR` of size, `CREATE` with
//! truncate): the manager is the writer, under a write transaction of its
//! own, so a crash anywhere rolls the change back on every component and the
//! new size is recorded in the same metadata transaction that commits it
//! (`Namespace::setattr_committing`), with the components that missed it
//! (stale from the first stripe the change touches), so a component is
//! recorded stale only for a change that was committed.

use crate::service::Session;
use crate::{Failure, Manager};
use nasd_meta::{AcvIntent, Caller, Inode, Intent, SetAttrs, StaleRange};
use nasd_proto::fs::{FsStatus, Ino};
use nasd_proto::limits::OBJECT_SIZE_MAX;
use nasd_stripe::geometry::{Geometry, Role};
use std::collections::BTreeSet;

/// A component range that covers everything: the whole component missed a
/// change (its drive was down), so all of it is rewritten when resynced.
pub(crate) const WHOLE: StaleRange = StaleRange { offset: 0, length: OBJECT_SIZE_MAX };

impl Manager {
    /// Sets `ino`'s length to `set.size` on every component and records
    /// `set` (checked again by the metadata) in the transaction's commit.
    /// The caller checked the request (`Namespace::check_setattr`) and holds
    /// the inode lock.
    pub(crate) async fn resize_file(
        &self,
        s: &Session,
        ino: Ino,
        set: SetAttrs,
    ) -> Result<(Inode, Vec<AcvIntent>), Failure> {
        let size = set.size.expect("a size change");
        let manager = Session::internal("(resize)", Caller::ROOT);
        // The change touches only the components its transaction is open on (their drives keep
        // undo for it), and the intent says so before any is touched: a rollback then marks stale
        // no component the change never reached. On a layout without redundancy a stale
        // component has nothing to be resynced from: a size change that failed while a drive was
        // down left the file unreadable after the drive came back with its bytes intact
        // (nasd-sim --cluster, seeds 1 and 3).
        let _own = self.own_write(ino);
        let began = self.begin_scoped(&manager, ino, Intent::ALL, crate::coordinator::Writer::Manager).await?;
        let (txn, writes) = (began.txn, Intent::ALL & !began.unopened);
        if began.unopened != 0 {
            if let Err(e) = self.meta(move |ns| ns.scope_intent(ino, txn, writes, 0).map(|_| ())).await {
                self.abort(txn).await;
                return Err(e);
            }
        }
        let changed = async {
            // The intent is committed: a short outage is waited out (`meta_after_write`).
            let inode = self.meta_after_write(move |ns| ns.getattr(ino)).await?;
            let missed = self.resize_components(&inode, size, writes).await?;
            let range = missed_range(&geometry_of(&inode)?, inode.attr.size, size);
            let missed: Vec<(usize, StaleRange)> = missed.into_iter().map(|idx| (idx, range)).collect();
            // What the components store after the change (quotas count it).
            let set = SetAttrs { data_bytes: Some(self.stored_bytes(&inode, size).await), ..set };
            let c = s.caller.clone();
            // An outage before the commit was sent changed nothing: made again once the database
            // answers (`meta_after_write`). One whose outcome is unknown is not (`INTERNAL`).
            self.meta_after_write(move |ns| ns.setattr_committing(&c, ino, &set, txn, &missed)).await
        };
        match changed.await {
            Ok((inode, intents)) => {
                let _ = self.meta(move |ns| ns.finish_intent(txn)).await;
                self.end_in_background(&inode, txn, true);
                Ok((inode, intents))
            }
            Err(e) => {
                self.abort(txn).await;
                Err(e)
            }
        }
    }

    /// Gives every component the length it has for a file of `size` bytes
    /// and, for Reed-Solomon, the parity of a new partial last stripe; then
    /// flushes them. A component whose drive is down, or fails the change
    /// (a drive that died before the heartbeat noticed), misses it — as a
    /// client's write misses it — as long as the layout tolerates the
    /// components missed; past that the change fails (and is rolled back).
    /// Components outside the bit set `writes` (those of the transaction's
    /// intent) are not touched: they miss it too.
    /// Returns the components that missed it, for the commit to record.
    async fn resize_components(&self, inode: &Inode, size: u64, writes: u64) -> Result<BTreeSet<usize>, Failure> {
        let layout = inode.layout.ok_or_else(|| Failure::new(FsStatus::InvalidArgument, "not a regular file"))?;
        let g = geometry_of(inode)?;
        let ino = inode.attr.ino;
        let shrinks_mid_stripe = size < inode.attr.size && !size.is_multiple_of(g.stripe_bytes());
        // What the new last stripe keeps, read before anything is cut (around
        // components that are down: the stripe's parity still matches its
        // old data), for its parity to be encoded from once it is cut.
        let last_stripe = if g.parity() > 0 && shrinks_mid_stripe {
            Some(self.read_last_stripe(inode, &g, size).await?)
        } else {
            None
        };
        let mut missed = BTreeSet::new();
        let mut failures = Vec::new();
        let mut miss = |idx: usize, drive: u32, e: &dyn std::fmt::Display, missed: &mut BTreeSet<usize>| {
            tracing::info!(ino, idx, drive, error = %e, "a component missed a size change; its commit marks it stale");
            failures.push(drive_failure(drive, e));
            missed.insert(idx);
        };
        for (idx, c) in inode.components.iter().enumerate() {
            if !crate::coordinator::holds(writes, idx) || !self.is_up(c.object.drive) {
                missed.insert(idx);
                continue;
            }
            let d = self.drive(c.object.drive)?;
            let len = g.component_len(size, idx);
            if let Err(e) = d.set_size(c.object.object, len).await {
                miss(idx, d.drive, &e, &mut missed);
            }
        }
        if let Some(kept) = last_stripe.filter(|_| g.survives(&missed)) {
            self.reencode_last_stripe(inode, &g, size, &kept, &missed).await?;
        }
        for (idx, c) in inode.components.iter().enumerate() {
            if missed.contains(&idx) {
                continue;
            }
            let d = self.drive(c.object.drive)?;
            if let Err(e) = d.flush_objects(&[c.object.object]).await {
                miss(idx, d.drive, &e, &mut missed);
            }
        }
        if !g.survives(&missed) {
            return Err(failures.into_iter().next().unwrap_or_else(|| {
                Failure::new(
                    FsStatus::DriveUnavailable,
                    format!("too many drives of the file's components are down for its layout {layout}: try again"),
                )
            }));
        }
        Ok(missed)
    }

    /// The bytes of the stripe that holds byte `size - 1` up to `size`, as
    /// the file holds them now (components whose drive is down read around).
    async fn read_last_stripe(&self, inode: &Inode, g: &Geometry, size: u64) -> Result<Vec<u8>, Failure> {
        let start = (size - 1) / g.stripe_bytes() * g.stripe_bytes();
        let striper = self.striper_for(inode, &BTreeSet::new())?;
        let (bytes, _) = striper.read(start, size - start, inode.attr.size).await.map_err(stripe_failure)?;
        Ok(bytes)
    }

    /// Writes the parity chunks of the stripe that holds byte `size - 1`,
    /// encoded from `kept` (that stripe's bytes up to `size`; zeros after),
    /// on every parity component that did not miss the change. Encoded from
    /// what was read before the cut, not from the cut data chunks, so a data
    /// chunk whose drive is down is not needed.
    async fn reencode_last_stripe(
        &self,
        inode: &Inode,
        g: &Geometry,
        size: u64,
        kept: &[u8],
        missed: &BTreeSet<usize>,
    ) -> Result<(), Failure> {
        let stripe = (size - 1) / g.stripe_bytes();
        let unit = g.unit() as usize;
        let columns: Vec<&[u8]> = (0..g.data_columns())
            .map(|c| &kept[(c * unit).min(kept.len())..((c + 1) * unit).min(kept.len())])
            .collect();
        let coder = nasd_stripe::coding::Coder::new(g.data_columns(), g.parity())
            .map_err(|e| Failure::new(FsStatus::Internal, e.to_string()))?;
        let shards = coder.encode(&columns, unit).map_err(|e| Failure::new(FsStatus::Internal, e.to_string()))?;
        let parity: Vec<(usize, usize)> = (0..g.components())
            .filter_map(|i| match g.role(i) {
                Role::Parity { index } if !missed.contains(&i) => Some((i, index)),
                _ => None,
            })
            .collect();
        let striper = self.striper_for(inode, &BTreeSet::new())?;
        for (p, index) in parity {
            striper.write_component(p, stripe * g.unit(), &shards[index]).await.map_err(stripe_failure)?;
        }
        Ok(())
    }
}

/// What a component that missed a change of the size from `old` to `new`
/// bytes lacks: everything from the stripe holding the first byte the change
/// touches (the new last stripe, cut and re-encoded, or the old one, grown)
/// on.
fn missed_range(g: &Geometry, old: u64, new: u64) -> StaleRange {
    let offset = old.min(new) / g.stripe_bytes() * g.unit();
    StaleRange { offset, length: OBJECT_SIZE_MAX.saturating_sub(offset).max(1) }
}

fn geometry_of(inode: &Inode) -> Result<Geometry, Failure> {
    let layout = inode.layout.ok_or_else(|| Failure::new(FsStatus::InvalidArgument, "not a regular file"))?;
    Geometry::new(layout).map_err(|e| Failure::new(FsStatus::Internal, e.to_string()))
}

fn drive_failure(drive: u32, e: impl std::fmt::Display) -> Failure {
    Failure::new(FsStatus::DriveUnavailable, format!("drive {drive} did not change the file's length ({e}): try again"))
}

fn stripe_failure(e: nasd_stripe::StripeError) -> Failure {
    Failure::new(FsStatus::DriveUnavailable, e.to_string())
}
