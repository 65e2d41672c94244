//! Write transactions: an object's data and length, put back as they were on
//! abort (PROTOCOL.md, "Write transactions"). The file manager opens one on
//! every component of a file (`TXN_BEGIN`), the client writes and flushes,
//! and the manager commits or aborts each (`TXN_END`), so after any crash
//! every stripe reads old or new.
//!
//! In memory an `Object` has an optional `Txn`: its id, when it began, the
//! object's `logical_size` then, and `undo`, each logical block the
//! transaction changed → the mapping it had before the first change (a
//! block or a hole). Every change of a block map goes through
//! [`Meta::set_block`]: the first change of a block under a transaction
//! moves the index's reference into the undo instead of dropping it (the
//! old block stays in use and charged); later changes of the same block drop
//! the blocks the transaction wrote, as without one. Commit drops the undo's
//! references (their blocks released by the usual rule: reused only after a
//! commit that no longer references them); abort puts every mapping back,
//! frees the transaction's blocks, restores the size and sets
//! `data_modify_time`. `FASTCOPY` of an object with a transaction is
//! refused, so a block a transaction wrote is referenced by its object alone
//! and an abort frees it: **an abort never raises a partition's charge**
//! (asserted).
//!
//! On disk a transaction is its `txns` row and its `undo` rows, written by
//! [`Store::commit`] with the index in the same SQLite transaction. Each
//! index change and its undo entry are made in one critical section of the
//! metadata lock, which the commit's snapshot takes too, so:
//! - a crash before a commit loses what was written since together with its
//!   undo (a transaction begun since is gone: its `TXN_END` reports it was
//!   not open);
//! - after a commit, every block the durable index or undo references was
//!   written before the commit's `fdatasync`, so an abort after a restart
//!   restores the state before `TXN_BEGIN` byte for byte, and a commit keeps
//!   the flushed state;
//! - a block only undo references is in use at open and never handed out.
//!
//! Memory: one undo entry per logical block changed, at most
//! [`TXN_UNDO_BYTES_PER_BLOCK`] (measured by `tests/txn_memory.rs`). Every
//! entry holds a charged block, so the partition's quota bounds the undo.
//! Format version 1 stores had no transactions and migrate at open
//! (`db.rs`); an older binary refuses a newer format, so it never opens a
//! store with undo it does not know.

use super::*;
use nasd_proto::OpenTxn;
use std::ops::Bound;

impl Store {
    /// Opens write transaction `txn` on an object, remembering its
    /// `logical_size`. The same transaction already open is fine
    /// (idempotent); another is [`StoreError::TxnConflict`]. `txn` 0 is
    /// invalid. Like every change, durable after the next commit.
    pub fn txn_begin(&self, p: u64, o: u64, txn: u64) -> Result<(), StoreError> {
        self.check_healthy()?;
        Self::check_txn_target(o, txn)?;
        // The object's write lock: no write installs while the transaction
        // begins. A write that installs after it — even one whose data was
        // streaming already — is recorded in its undo (writes record undo
        // as they install, `Meta::set_block`).
        let _g = self.stripe(p, o).write().expect("object lock poisoned");
        let now = self.now_ns();
        let mut m = lock(&self.meta);
        let obj = m.object_mut(p, o)?;
        match &obj.txn {
            Some(t) if t.id == txn => return Ok(()),
            Some(t) => return Err(StoreError::TxnConflict { partition: p, object: o, open: t.id }),
            None => {}
        }
        let old_size = obj.attrs.logical_size;
        obj.txn = Some(Box::new(Txn { id: txn, begun_ns: now, old_size, undo: BTreeMap::new() }));
        m.partition_mut(p)?.txn_objects.insert(o);
        m.dirty_object(p, o).txn = true;
        Ok(())
    }

    /// Ends transaction `txn` on an object: `commit` keeps its changes and
    /// releases the blocks it held; otherwise every block it changed gets
    /// its old mapping back, the object its old `logical_size`, and
    /// `data_modify_time` (and `fs_data_modify_time`) become now. Returns
    /// whether the transaction was open: ending one that is not is a no-op
    /// (recovery may end a transaction twice). Another transaction open on
    /// the object is [`StoreError::TxnConflict`].
    pub fn txn_end(&self, p: u64, o: u64, txn: u64, commit: bool) -> Result<bool, StoreError> {
        self.check_healthy()?;
        Self::check_txn_target(o, txn)?;
        let _g = self.stripe(p, o).write().expect("object lock poisoned");
        let now = self.now_ns();
        let mut m = lock(&self.meta);
        let obj = m.object_mut(p, o)?;
        match &obj.txn {
            None => return Ok(false),
            Some(t) if t.id != txn => return Err(StoreError::TxnConflict { partition: p, object: o, open: t.id }),
            Some(_) => {}
        }
        let t = obj.txn.take().expect("checked above");
        m.partition_mut(p)?.txn_objects.remove(&o);
        m.dirty_object(p, o).txn = true;
        if commit {
            for r in t.undo.values().flatten() {
                m.deref_block(p, r.phys);
            }
        } else {
            self.roll_back(&mut m, p, o, *t, now);
        }
        Ok(true)
    }

    /// Open transactions of partition `p` on objects above `after`, in
    /// ascending object order, at most `max`.
    pub fn txn_list(&self, p: u64, after: u64, max: usize) -> Result<Vec<OpenTxn>, StoreError> {
        let m = lock(&self.meta);
        let part = m.partition(p)?;
        Ok(part
            .txn_objects
            .range((Bound::Excluded(after), Bound::Unbounded))
            .take(max)
            .map(|o| {
                let t = part.objects[o].txn.as_ref().expect("listed objects have a transaction");
                OpenTxn { object: *o, txn: t.id, begun_ns: t.begun_ns }
            })
            .collect())
    }

    fn check_txn_target(o: u64, txn: u64) -> Result<(), StoreError> {
        if txn == 0 {
            return Err(StoreError::BadArgument("transaction 0 is reserved"));
        }
        if is_control(o) {
            return Err(StoreError::ReadOnlyObject(o));
        }
        Ok(())
    }

    /// Puts back every mapping `t` changed (caller holds the object's write
    /// lock and the metadata lock). Frees the blocks the transaction wrote;
    /// never raises the partition's charge.
    fn roll_back(&self, m: &mut Meta, p: u64, o: u64, t: Txn, now: u64) {
        let charged_before = m.partitions[&p].charged_blocks();
        let old_slack = m.partitions[&p].objects[&o].slack();
        for (l, prev) in t.undo {
            let obj = m.object_mut(p, o).expect("object of an open transaction");
            // The held block's reference moves back to the index.
            let written = match prev {
                Some(b) => obj.blocks.insert(l, b),
                None => obj.blocks.remove(&l),
            };
            if let Some(w) = written {
                assert_eq!(m.refcount.get(&w.phys), Some(&1), "block {} written in a transaction is shared", w.phys);
                m.deref_block(p, w.phys);
            }
            m.dirty_object(p, o).blocks.insert(l);
        }
        let bs = self.bs();
        let obj = m.object_mut(p, o).expect("object of an open transaction");
        assert!(
            obj.blocks.range(t.old_size.div_ceil(bs)..).next().is_none(),
            "a block past the size a transaction restores survived its rollback"
        );
        obj.attrs.logical_size = t.old_size;
        obj.attrs.data_modify_time = now;
        obj.attrs.fs_data_modify_time = now;
        let new_slack = obj.slack();
        let part = m.partitions.get_mut(&p).expect("partition");
        part.slack_blocks = part.slack_blocks - old_slack + new_slack;
        assert!(part.charged_blocks() <= charged_before, "a rollback raised the partition's charge");
        m.dirty_object(p, o);
    }
}
