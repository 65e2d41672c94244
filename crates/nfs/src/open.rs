//! Open files between NFS calls (NFS has no OPEN or CLOSE): one layer
//! descriptor per (inode, uid, gid, reading or writing), opened as the
//! first caller that needs it (the manager's permission check), kept while
//! used and closed after [`OPEN_IDLE`] or when [`OPENS_MAX`] are open.
//! Closing a descriptor open for writing commits its writes; a commit that
//! fails there is reported at the file's next COMMIT.

use crate::{err, lock, Gateway, OPENS_MAX};
use nasd_fs::{FsClient, Ino};
use nfs_rpc::nfs::nfsstat3;
use nfs_rpc::NfsResult;
use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, Weak};
use std::time::{Duration, Instant};

/// How long an unused descriptor stays open.
pub const OPEN_IDLE: Duration = Duration::from_secs(30);
/// How often idle descriptors are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

type Key = (Ino, u32, u32, bool);

#[derive(Default)]
pub(crate) struct Opens {
    slots: Mutex<HashMap<Key, (u64, Instant)>>,
    /// Inodes whose writes failed to commit when their descriptor closed.
    failed: Mutex<HashSet<Ino>>,
}

fn key(cx: &FsClient, ino: Ino, write: bool) -> Key {
    let id = cx.identity();
    (ino, id.uid, id.gid, write)
}

impl Opens {
    /// The descriptor `cx` reads (or writes) `ino` through, opened if needed.
    pub async fn get(&self, gw: &Gateway, cx: &FsClient, ino: Ino, write: bool) -> NfsResult<u64> {
        let k = key(cx, ino, write);
        if let Some(slot) = lock(&self.slots).get_mut(&k) {
            slot.1 = Instant::now();
            return Ok(slot.0);
        }
        let opened = gw.vfs.open(cx, ino, write).await.map_err(err)?;
        Ok(self.insert(gw, k, opened.fh).await)
    }

    /// Keeps descriptor `fh` (open for writing, from a CREATE) for `cx`.
    pub async fn adopt(&self, gw: &Gateway, cx: &FsClient, ino: Ino, fh: u64) {
        self.insert(gw, key(cx, ino, true), fh).await;
    }

    /// Records `fh` under `k` (one already there is kept and `fh` closed);
    /// closes the oldest past [`OPENS_MAX`]. Returns the descriptor kept.
    async fn insert(&self, gw: &Gateway, k: Key, fh: u64) -> u64 {
        let (kept, mut to_close) = {
            let mut slots = lock(&self.slots);
            if let Some(slot) = slots.get_mut(&k) {
                slot.1 = Instant::now();
                (slot.0, vec![(k.0, fh)])
            } else {
                slots.insert(k, (fh, Instant::now()));
                (fh, Vec::new())
            }
        };
        {
            let mut slots = lock(&self.slots);
            while slots.len() > OPENS_MAX {
                let Some((&old, _)) = slots.iter().min_by_key(|(_, (_, used))| *used) else { break };
                if let Some((fh, _)) = slots.remove(&old) {
                    to_close.push((old.0, fh));
                }
            }
        }
        for (ino, fh) in to_close {
            self.close(gw, ino, fh).await;
        }
        kept
    }

    async fn close(&self, gw: &Gateway, ino: Ino, fh: u64) {
        if let Err(e) = gw.vfs.release(fh).await {
            tracing::warn!(ino, error = %e, "committing an NFS client's writes at close failed");
            lock(&self.failed).insert(ino);
        }
    }

    /// COMMIT: the writes held for `ino` committed (the write transaction's
    /// commit) and made durable (the manager's `SYNC`).
    pub async fn commit(&self, gw: &Gateway, ino: Ino) -> NfsResult<()> {
        if lock(&self.failed).remove(&ino) {
            return Err(nfsstat3::NFS3ERR_IO);
        }
        let writer = lock(&self.slots).iter().find(|(k, _)| k.0 == ino && k.3).map(|(_, (fh, _))| *fh);
        match writer {
            // The layer's descriptors of one inode share one file: one commit covers all.
            Some(fh) => gw.vfs.fsync(fh).await.map_err(err),
            None => gw.vfs.sync().await.map_err(err),
        }
    }

    /// Closes every descriptor.
    pub async fn close_all(&self, gw: &Gateway) {
        let all: Vec<(Ino, u64)> = lock(&self.slots).drain().map(|(k, (fh, _))| (k.0, fh)).collect();
        for (ino, fh) in all {
            self.close(gw, ino, fh).await;
        }
    }

    /// Closes descriptors unused for [`OPEN_IDLE`].
    async fn close_idle_now(&self, gw: &Gateway) {
        let idle: Vec<(Ino, u64)> = {
            let mut slots = lock(&self.slots);
            let old: Vec<Key> =
                slots.iter().filter(|(_, (_, used))| used.elapsed() >= OPEN_IDLE).map(|(k, _)| *k).collect();
            old.into_iter().filter_map(|k| slots.remove(&k).map(|(fh, _)| (k.0, fh))).collect()
        };
        for (ino, fh) in idle {
            self.close(gw, ino, fh).await;
        }
    }
}

/// Closes idle descriptors and directory cursors while the gateway lives.
pub(crate) async fn close_idle(gw: Weak<Gateway>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let Some(gw) = gw.upgrade() else { return };
        gw.cursors.close_idle(&gw);
        gw.opens.close_idle_now(&gw).await;
    }
}
