//! Size changes of a file's data (`SETATTR` of size, `CREATE` with
//! truncate): the manager is the writer, under a write transaction of its
//! own, so a crash anywhere rolls the change back on every component and the
//! new size is recorded in the same metadata transaction that commits it
//! (`Namespace::setattr_committing`).

use crate::service::Session;
use crate::{Failure, Manager};
use nasd_meta::{AcvIntent, Caller, Inode, SetAttrs, StaleRange};
use nasd_proto::fs::{FsStatus, Ino};
use nasd_proto::limits::OBJECT_SIZE_MAX;
use nasd_proto::manager::ManagerReply;
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
        let ManagerReply::Began { txn, .. } = self.begin_write(&manager, ino).await? else {
            unreachable!("begin_write answers Began")
        };
        let changed = async {
            let inode = self.meta(move |ns| ns.getattr(ino)).await?;
            self.resize_components(&inode, size).await?;
            let c = s.caller.clone();
            self.meta(move |ns| ns.setattr_committing(&c, ino, &set, txn)).await
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
    /// (a drive that died before the heartbeat noticed), misses it and is
    /// marked stale whole — as a client's write misses it — as long as the
    /// layout tolerates the components missed; past that the change fails
    /// (and is rolled back).
    async fn resize_components(&self, inode: &Inode, size: u64) -> Result<(), Failure> {
        let layout = inode.layout.ok_or_else(|| Failure::new(FsStatus::InvalidArgument, "not a regular file"))?;
        let g = Geometry::new(layout).map_err(|e| Failure::new(FsStatus::Internal, e.to_string()))?;
        let ino = inode.attr.ino;
        let mut missed = BTreeSet::new();
        let mut failures = Vec::new();
        let mut miss = |idx: usize, drive: u32, e: &dyn std::fmt::Display, missed: &mut BTreeSet<usize>| {
            tracing::info!(ino, idx, drive, error = %e, "a component missed a size change; it is marked stale");
            failures.push(drive_failure(drive, e));
            missed.insert(idx);
        };
        for (idx, c) in inode.components.iter().enumerate() {
            if !self.is_up(c.object.drive) {
                missed.insert(idx);
                continue;
            }
            let d = self.drive(c.object.drive)?;
            let len = g.component_len(size, idx);
            if let Err(e) = d.set_size(c.object.object, len).await {
                miss(idx, d.drive, &e, &mut missed);
            }
        }
        let shrinks_mid_stripe = size < inode.attr.size && !size.is_multiple_of(g.stripe_bytes());
        if g.survives(&missed) && g.parity() > 0 && shrinks_mid_stripe {
            self.reencode_last_stripe(inode, &g, size, &missed).await?;
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
        for idx in missed {
            self.meta(move |ns| ns.mark_stale(ino, idx, &[WHOLE])).await?;
        }
        Ok(())
    }

    /// Recomputes the parity chunks of the stripe that holds byte `size - 1`
    /// from the (already cut) data chunks.
    async fn reencode_last_stripe(
        &self,
        inode: &Inode,
        g: &Geometry,
        size: u64,
        missed: &BTreeSet<usize>,
    ) -> Result<(), Failure> {
        let stripe = (size - 1) / g.stripe_bytes();
        let parity: Vec<usize> =
            (0..g.components()).filter(|&i| matches!(g.role(i), Role::Parity { .. }) && !missed.contains(&i)).collect();
        let striper = self.striper_for(inode, &parity.iter().copied().collect())?;
        for p in parity {
            let at = stripe * g.unit();
            let (bytes, _) = striper.read_component(p, at, g.unit(), size).await.map_err(stripe_failure)?;
            striper.write_component(p, at, &bytes).await.map_err(stripe_failure)?;
        }
        Ok(())
    }
}

fn drive_failure(drive: u32, e: impl std::fmt::Display) -> Failure {
    Failure::new(FsStatus::DriveUnavailable, format!("drive {drive} did not change the file's length ({e}): try again"))
}

fn stripe_failure(e: nasd_stripe::StripeError) -> Failure {
    Failure::new(FsStatus::DriveUnavailable, e.to_string())
}
