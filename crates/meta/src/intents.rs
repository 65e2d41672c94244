//! Write intents: Slice's coordinator intention log (§3.3.2) for writes
//! that span several component objects.
//!
//! Before a client writes a file the manager logs an intent (a transaction
//! id) in state Open; when the client commits, the manager records the new
//! size and the components that missed writes (Stale, with the ranges they
//! missed) and sets the intent Committed; if the client dies (its deadline
//! passes), the manager sets it Aborting, rolls back on the drives the
//! components the writer may have changed, and marks stale whole only those
//! that may keep the writer's bytes (drive down, or transaction never opened
//! there). Either way the manager then forgets the intent
//! ([`Namespace::finish_intent`]). A file has at most one intent (a unique
//! key, so a constraint of the store, not only a check), so one writer at a
//! time; the log survives a manager crash, and a restarted manager finds
//! every write that may be half done in it. An intent goes when the file's
//! last name goes, with its stale ranges and every component (all doomed).
//!
//! An intent ([`Namespace::begin_write`]) holds a transaction id from the
//! `next_txn` counter, its state, the writer's uid, a deadline, the quota
//! escrow and size limit, and ([`Namespace::scope_intent`]) the components
//! the writer may change and those the transaction could not be opened on.
//! [`Namespace::commit_write`] records the new size (`max(size,
//! written_end)`) and the components that missed writes (Stale, with the
//! component-space ranges they missed, merged; only Stale components have
//! stale ranges); [`Namespace::abort_intent`] sets it Aborting.

use crate::acl::check;
use crate::backend::Backend;
use crate::components::{check_ranges, forget_stale_in, mark_stale_in};
use crate::namespace::get;
use crate::perm::{owns, W};
use crate::types::{Caller, Inode, Intent, IntentState, StaleRange, MANAGER_WRITER_UID};
use crate::{Namespace, BATCH_MAX, COMMIT_STALE_MAX};
use nasd_proto::fs::{FileKind, FsStatus, Ino};
use nasd_proto::layout::ComponentState;
use std::collections::BTreeMap;

impl<B: Backend> Namespace<B> {
    /// Opens a write transaction on regular file `ino` for `caller`: records
    /// an Open intent with a new transaction id (from the `next_txn`
    /// counter: ascending, never reused, never 0) and the deadline the
    /// manager waits for the writer until. The caller must be allowed to
    /// write the file or own it (the owner override of
    /// `OpenMode::RefreshWrite`: a file created read-only stays writable for
    /// its owner).
    ///
    /// # Errors
    /// `IsDir`; `InvalidArgument` (a symbolic link); `PermissionDenied`;
    /// `Busy` (the file has an intent already, in any state: one writer at a
    /// time, and a finished write must be finished first); `NotFound`.
    pub fn begin_write(&self, caller: &Caller, ino: Ino, deadline_ns: i64) -> Result<u64, FsStatus> {
        // No user (or id a gateway acts for) writes as the manager.
        if caller.uid == MANAGER_WRITER_UID {
            return Err(FsStatus::PermissionDenied);
        }
        self.begin_write_as(caller, ino, deadline_ns, caller.uid)
    }

    /// [`begin_write`](Self::begin_write), the intent recording `writer`
    /// as who began it: [`MANAGER_WRITER_UID`] for the manager's own
    /// transactions (size changes, repairs), which a restarted manager
    /// rolls back at once — no client will ever commit them.
    ///
    /// # Errors
    /// As [`begin_write`](Self::begin_write).
    pub fn begin_write_as(&self, caller: &Caller, ino: Ino, deadline_ns: i64, writer: u32) -> Result<u64, FsStatus> {
        self.backend.transact(|t| {
            let n = get(t, ino)?;
            match n.attr.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(FsStatus::IsDir),
                _ => return Err(FsStatus::InvalidArgument),
            }
            if check(t, caller, &n, W).is_err() && !owns(caller, &n) {
                return Err(FsStatus::PermissionDenied);
            }
            if t.intent_of_inode(ino)?.is_some() {
                return Err(FsStatus::Busy);
            }
            let txn = t.alloc_txn()?;
            let (escrow, size_limit) = crate::quotas::escrow_for(t, &n)?;
            t.put_intent(&Intent {
                txn,
                ino,
                state: IntentState::Open,
                uid: writer,
                deadline_ns,
                escrow,
                size_limit,
                writes: Intent::ALL,
                unopened: 0,
            })?;
            Ok(txn)
        })
    }

    /// The write intent of a file, if any.
    ///
    /// # Errors
    /// `Internal`.
    pub fn intent_of(&self, ino: Ino) -> Result<Option<Intent>, FsStatus> {
        self.backend.read(|t| t.intent_of_inode(ino))
    }

    /// A write intent by transaction id, if it is still recorded.
    ///
    /// # Errors
    /// `Internal`.
    pub fn intent(&self, txn: u64) -> Result<Option<Intent>, FsStatus> {
        self.backend.read(|t| t.get_intent(txn))
    }

    /// Up to `limit` (at most [`BATCH_MAX`]) write intents with transaction
    /// ids above `after_txn`, ascending (start with 0).
    ///
    /// # Errors
    /// `Internal`.
    pub fn intents(&self, after_txn: u64, limit: usize) -> Result<Vec<Intent>, FsStatus> {
        self.backend.read(|t| t.list_intents(after_txn, limit.min(BATCH_MAX)))
    }

    /// Commits write transaction `txn` of file `ino`: the intent becomes
    /// Committed; the small-file bytes it staged become the file's
    /// (`small.rs`); the size becomes `max(size, written_end)` and
    /// [`Inode::data_bytes`] `data_bytes` (what the components store now, as
    /// the manager measured it); if anything was
    /// written (`written_end > 0` or stale ranges are reported) mtime and
    /// ctime become `now_ns`; every component listed in `stale` becomes
    /// Stale with its listed ranges (component-space bytes it missed) added
    /// to those recorded, merged as [`mark_stale`](Self::mark_stale) does.
    /// Returns the inode as committed.
    ///
    /// Quotas count what the file's data takes ([`Inode::allocated`]), not
    /// its size: a commit that grows it by at most the transaction's escrow
    /// always succeeds; past that, only if the quotas still have room (with
    /// what other writers hold in escrow), else `QUOTA_EXCEEDED` and the
    /// manager rolls the transaction back. A hole costs nothing, so a sparse
    /// file may be larger than its quota.
    ///
    /// # Errors
    /// `InvalidArgument`: no intent `txn`, or it is for another file, or it
    /// is not Open (committed already, or aborted: the write may be lost —
    /// begin again); a component index the file lacks; an empty range or
    /// one past `u64::MAX`; more than [`COMMIT_STALE_MAX`] stale entries.
    /// `NotPermitted`: the intent is another user's (only its writer, or
    /// root, commits it). `QuotaExceeded` (above). `NotFound`.
    #[allow(clippy::too_many_arguments)]
    pub fn commit_write(
        &self,
        caller: &Caller,
        ino: Ino,
        txn: u64,
        written_end: u64,
        data_bytes: u64,
        stale: &[(usize, StaleRange)],
        now_ns: i64,
    ) -> Result<Inode, FsStatus> {
        if stale.len() > COMMIT_STALE_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        check_ranges(stale.iter().map(|(_, r)| r))?;
        let mut by_component: BTreeMap<usize, Vec<StaleRange>> = BTreeMap::new();
        for &(idx, range) in stale {
            by_component.entry(idx).or_default().push(range);
        }
        self.backend.transact(|t| {
            let mut n = get(t, ino)?;
            let mut intent = t.get_intent(txn)?.filter(|i| i.ino == ino).ok_or(FsStatus::InvalidArgument)?;
            if intent.uid != caller.uid && !caller.is_root() {
                return Err(FsStatus::NotPermitted);
            }
            if intent.state != IntentState::Open || by_component.keys().any(|&idx| idx >= n.components.len()) {
                return Err(FsStatus::InvalidArgument);
            }
            let old = n.clone();
            intent.state = IntentState::Committed;
            t.put_intent(&intent)?;
            n.attr.size = n.attr.size.max(written_end);
            n.data_bytes = data_bytes;
            if written_end > 0 || !stale.is_empty() {
                n.attr.mtime_ns = now_ns;
                n.attr.ctime_ns = now_ns;
            }
            for (&idx, ranges) in &by_component {
                mark_stale_in(t, &mut n, idx, ranges)?;
            }
            if n.allocated() > old.allocated().saturating_add(intent.escrow) {
                // Past the escrow it was given (no longer held: the intent is
                // committed): only while the quotas have room. Else the
                // manager rolls it back.
                crate::quotas::check_room(t, Some(&old), &n)?;
            }
            crate::quotas::put(t, &mut n)?;
            // The bytes it staged below the small-file threshold become the
            // file's with the rest of it.
            crate::small::install_staged(t, &n, txn)?;
            Ok(n)
        })
    }

    /// Records what write transaction `txn` of file `ino` may change and
    /// could not be opened on ([`Intent::writes`], [`Intent::unopened`]; the
    /// latter is kept within the former), while it is Open. Returns the
    /// intent as recorded now.
    ///
    /// # Errors
    /// `NotFound` (no such intent); `InvalidArgument` (another file's, or
    /// not Open).
    pub fn scope_intent(&self, ino: Ino, txn: u64, writes: u64, unopened: u64) -> Result<Intent, FsStatus> {
        self.backend.transact(|t| {
            let mut intent = t.get_intent(txn)?.ok_or(FsStatus::NotFound)?;
            if intent.ino != ino || intent.state != IntentState::Open {
                return Err(FsStatus::InvalidArgument);
            }
            intent.writes = writes;
            intent.unopened = unopened & writes;
            t.put_intent(&intent)?;
            Ok(intent)
        })
    }

    /// Commits write transaction `txn` of file `ino` under which the manager
    /// brought component `idx` up to date (a resync): in one metadata
    /// transaction the intent becomes Committed and a Stale component
    /// becomes Ok with its stale ranges forgotten (a component in another
    /// state is left as it is). A crash leaves both or neither, so a
    /// component is never recorded current while the transaction that made
    /// it so can still be rolled back. Returns the inode as committed.
    ///
    /// # Errors
    /// `InvalidArgument` (no Open intent `txn` of `ino`; not a regular file;
    /// no component `idx`); `NotFound`.
    pub fn commit_resync(&self, ino: Ino, txn: u64, idx: usize) -> Result<Inode, FsStatus> {
        self.commit_repair(ino, txn, &[(idx, StaleRange { offset: 0, length: u64::MAX })])
    }

    /// Commits the manager's repair transaction `txn` of file `ino`, under
    /// which it found or made the component ranges in `current` hold what
    /// the file holds (resynced, or checked against the other components):
    /// in one metadata transaction the intent becomes Committed and each
    /// range is taken out of its component's recorded stale ranges (a Stale
    /// component without ranges counts as stale whole); a Stale component
    /// left with none becomes Ok. Components in another state are left as
    /// they are. A crash leaves both or neither, so a component is never
    /// recorded current while the transaction that made it so can still be
    /// rolled back. Returns the inode as committed.
    ///
    /// # Errors
    /// `InvalidArgument` (no Open intent `txn` of `ino`; not a regular file;
    /// a component index the file lacks; more than [`COMMIT_STALE_MAX`]
    /// ranges, an empty one or one past `u64::MAX`); `NotFound`.
    pub fn commit_repair(&self, ino: Ino, txn: u64, current: &[(usize, StaleRange)]) -> Result<Inode, FsStatus> {
        if current.len() > COMMIT_STALE_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        check_ranges(current.iter().map(|(_, r)| r))?;
        let mut by_component: BTreeMap<usize, Vec<StaleRange>> = BTreeMap::new();
        for &(idx, range) in current {
            by_component.entry(idx).or_default().push(range);
        }
        self.backend.transact(|t| {
            let mut n = get(t, ino)?;
            if n.attr.kind != FileKind::File || by_component.keys().any(|&idx| idx >= n.components.len()) {
                return Err(FsStatus::InvalidArgument);
            }
            let mut intent = t.get_intent(txn)?.filter(|i| i.ino == ino).ok_or(FsStatus::InvalidArgument)?;
            if intent.state != IntentState::Open {
                return Err(FsStatus::InvalidArgument);
            }
            intent.state = IntentState::Committed;
            t.put_intent(&intent)?;
            for (&idx, ranges) in &by_component {
                if n.components[idx].state == ComponentState::Stale {
                    forget_stale_in(t, &mut n, idx, ranges)?;
                }
            }
            Ok(n)
        })
    }

    /// Gives up on write transaction `txn` (its writer died or its deadline
    /// passed): Open becomes Aborting, for the manager to probe the
    /// components and then [`finish_intent`](Self::finish_intent). An
    /// Aborting intent is returned as is (aborting twice is harmless).
    /// Returns the intent as recorded now.
    ///
    /// # Errors
    /// `NotFound` (no such intent); `InvalidArgument` (it is Committed).
    pub fn abort_intent(&self, txn: u64) -> Result<Intent, FsStatus> {
        self.backend.transact(|t| {
            let mut intent = t.get_intent(txn)?.ok_or(FsStatus::NotFound)?;
            match intent.state {
                IntentState::Committed => return Err(FsStatus::InvalidArgument),
                IntentState::Aborting => return Ok(intent),
                IntentState::Open => intent.state = IntentState::Aborting,
            }
            t.put_intent(&intent)?;
            Ok(intent)
        })
    }

    /// Forgets write intent `txn` (the manager finished what it asked for)
    /// and drops the small-file bytes it staged and did not commit; nothing
    /// if it is gone already. The file may be written again.
    ///
    /// # Errors
    /// `Internal`.
    pub fn finish_intent(&self, txn: u64) -> Result<(), FsStatus> {
        self.backend.transact(|t| {
            // Small-file bytes it staged and did not commit go with it: a
            // rolled-back transaction leaves nothing, head or tail.
            if let Some(intent) = t.get_intent(txn)? {
                crate::small::drop_staged(t, intent.ino, txn)?;
            }
            t.delete_intent(txn)
        })
    }

    /// Moves the deadline of Open write intent `txn` (a writer that is
    /// still alive); returns the intent as recorded now.
    ///
    /// # Errors
    /// `NotFound` (no such intent); `InvalidArgument` (not Open).
    pub fn extend_intent(&self, txn: u64, deadline_ns: i64) -> Result<Intent, FsStatus> {
        self.backend.transact(|t| {
            let mut intent = t.get_intent(txn)?.ok_or(FsStatus::NotFound)?;
            if intent.state != IntentState::Open {
                return Err(FsStatus::InvalidArgument);
            }
            intent.deadline_ns = deadline_ns;
            t.put_intent(&intent)?;
            Ok(intent)
        })
    }
}
