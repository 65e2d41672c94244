//! Small files (issue 14, Slice §3.1 and §4.4): the bytes of a regular file
//! below its small-file threshold live in the metadata store, in one row
//! per file beside its inode, and move through the manager; the bytes at
//! and past the threshold are striped over the file's components as any
//! other file's. The threshold is fixed when the file is created (the
//! manager's `[manager] small_file_threshold` then) and kept in the inode
//! row ([`Inode::small_threshold`]), so an open learns it with the inode
//! and no other read; files created with 0, or before this existed, keep
//! every byte on their components. Changing the configuration never moves
//! bytes.
//!
//! The row holds at most `threshold` bytes; bytes past the stored ones up
//! to the file's size read as zeros (a sparse or extended file). Every size
//! change cuts the stored bytes to the new size, so a file cut short and
//! extended again reads zeros where the old bytes were.
//!
//! **Under a write transaction** (`nasd_manager`'s `coordinator.rs`) a
//! small write is *staged*: the bytes below the threshold as the
//! transaction leaves them are kept apart, keyed by the file and the
//! transaction id (one per file, as a file has one writer at a time), and
//! readers keep seeing the committed bytes. The transaction's `COMMIT`
//! ([`Namespace::commit_write`]) installs them in the same metadata
//! transaction that records its size and makes its intent Committed; a
//! rollback ([`Namespace::finish_intent`] of an aborted intent — also after
//! a manager restart, from the intent log) drops them. So a write that
//! crosses the threshold is old or new as a whole, head and striped tail
//! together. A small write with no transaction open is its own transaction:
//! one metadata transaction with the size, stable when it returns.

use crate::acl::check;
use crate::backend::{Backend, Txn};
use crate::namespace::{check_sizable, get, now_ns};
use crate::perm::{owns, R, W};
use crate::quotas;
use crate::types::{Caller, Inode, IntentState};
use crate::Namespace;
use nasd_proto::fs::{FsStatus, Ino};
use nasd_proto::manager::{SMALL_FILE_THRESHOLD_MAX, SMALL_IO_MAX};

/// Cuts the small-file bytes of file `n` (if it has any), and those a
/// write transaction staged for it, to `size`: inside every transaction
/// that sets a file's size.
pub(crate) fn cut_small(t: &mut dyn Txn, n: &Inode, size: u64) -> Result<(), FsStatus> {
    if n.small_threshold == 0 || size >= u64::from(n.small_threshold) {
        return Ok(());
    }
    let ino = n.attr.ino;
    if let Some(mut bytes) = t.get_small(ino)? {
        if (bytes.len() as u64) > size {
            bytes.truncate(size as usize);
            t.put_small(ino, &bytes)?;
        }
    }
    if let Some((txn, mut bytes)) = t.get_staged(ino)? {
        if (bytes.len() as u64) > size {
            bytes.truncate(size as usize);
            t.put_staged(ino, txn, &bytes)?;
        }
    }
    Ok(())
}

/// Installs what write transaction `txn` staged for file `n` (if anything),
/// cut to the file's size: inside its `COMMIT`'s transaction, after the
/// size is set. Staged bytes of another transaction (none can be: they go
/// with their transaction) are dropped.
pub(crate) fn install_staged(t: &mut dyn Txn, n: &Inode, txn: u64) -> Result<(), FsStatus> {
    if n.small_threshold == 0 {
        return Ok(());
    }
    let ino = n.attr.ino;
    if let Some((staged_txn, mut bytes)) = t.get_staged(ino)? {
        if staged_txn == txn {
            bytes.truncate(n.attr.size.min(bytes.len() as u64) as usize);
            t.put_small(ino, &bytes)?;
        }
        t.delete_staged(ino)?;
    }
    Ok(())
}

/// Drops what write transaction `txn` of file `ino` staged (it is rolled
/// back, or ended): inside the transaction that forgets its intent.
pub(crate) fn drop_staged(t: &mut dyn Txn, ino: Ino, txn: u64) -> Result<(), FsStatus> {
    if t.get_staged(ino)?.is_some_and(|(staged_txn, _)| staged_txn == txn) {
        t.delete_staged(ino)?;
    }
    Ok(())
}

impl<B: Backend> Namespace<B> {
    /// The same name space giving new regular files `threshold` bytes on
    /// the small-file path (0: none).
    ///
    /// # Errors
    /// `InvalidArgument` above [`SMALL_FILE_THRESHOLD_MAX`].
    pub fn with_small_file_threshold(self, threshold: u32) -> Result<Self, FsStatus> {
        if threshold > SMALL_FILE_THRESHOLD_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        Ok(Namespace { small_threshold: threshold, ..self })
    }

    /// The threshold new regular files get.
    pub fn small_file_threshold(&self) -> u32 {
        self.small_threshold
    }

    /// `READ_SMALL`: up to `len` bytes at `offset` of the file's bytes below
    /// its threshold, stopping at the threshold and at its size; zeros past
    /// the stored bytes. Needs read permission.
    ///
    /// # Errors
    /// `InvalidArgument` (`len` over [`SMALL_IO_MAX`], or the file has no
    /// small-file bytes: not a regular file, or created without them),
    /// `IsDir`, `PermissionDenied`, `NotFound`.
    pub fn read_small(&self, caller: &Caller, ino: Ino, offset: u64, len: u32) -> Result<Vec<u8>, FsStatus> {
        if len as usize > SMALL_IO_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.read(|t| {
            let n = get(t, ino)?;
            check_sizable(&n)?;
            check(t, caller, &n, R)?;
            let threshold = n.small_threshold;
            if threshold == 0 {
                return Err(FsStatus::InvalidArgument);
            }
            let bytes = t.get_small(ino)?.unwrap_or_default();
            let end = offset.saturating_add(len as u64).min(threshold as u64).min(n.attr.size);
            if offset >= end {
                return Ok(Vec::new());
            }
            let mut out = vec![0u8; (end - offset) as usize];
            let stored = bytes.len() as u64;
            if offset < stored {
                let upto = end.min(stored);
                out[..(upto - offset) as usize].copy_from_slice(&bytes[offset as usize..upto as usize]);
            }
            Ok(out)
        })
    }

    /// `WRITE_SMALL`: writes `data` at `offset` below the file's threshold.
    /// Needs write permission, or ownership (as `SETATTR`'s open-writer
    /// rule: the creator of a file made read-only writes what it opened for
    /// writing).
    ///
    /// `txn` 0 (no write transaction): in one transaction with the file's
    /// size (at least the end written), its modification and change times
    /// and its quota usage; returns the inode as written. `txn` the
    /// caller's Open write transaction on the file: staged under it (see
    /// the module documentation of `small.rs`) — the size, times and quota move
    /// at its `COMMIT`, with the end the writer reports there; returns the
    /// inode as committed so far (unchanged).
    ///
    /// # Errors
    /// `InvalidArgument` (`data` over [`SMALL_IO_MAX`], ending past the
    /// threshold, or no small-file bytes), `Busy` (another writer's write
    /// transaction is open on the file: [`Intent`](crate::Intent) of it
    /// returned by [`Namespace::intent_of`]), `Aborted` (`txn` is not an
    /// open transaction on the file), `NotPermitted` (it is another
    /// user's), `QuotaExceeded`, `IsDir`, `PermissionDenied`, `NotFound`.
    pub fn write_small(
        &self,
        caller: &Caller,
        ino: Ino,
        txn: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<Inode, FsStatus> {
        if data.len() > SMALL_IO_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        let now = now_ns();
        self.backend.transact(|t| {
            let mut n = get(t, ino)?;
            check_sizable(&n)?;
            if !owns(caller, &n) {
                check(t, caller, &n, W)?;
            }
            let threshold = n.small_threshold;
            let end = offset.checked_add(data.len() as u64).ok_or(FsStatus::InvalidArgument)?;
            if threshold == 0 || end > threshold as u64 {
                return Err(FsStatus::InvalidArgument);
            }
            // One writer at a time, as BEGIN_WRITE keeps it: another's open
            // transaction holds the file.
            let staged = match t.intent_of_inode(ino)?.filter(|i| i.state != IntentState::Committed) {
                Some(i) if i.txn != txn => return Err(FsStatus::Busy),
                Some(i) if i.uid != caller.uid && !caller.is_root() => return Err(FsStatus::NotPermitted),
                Some(i) if i.state == IntentState::Open => true,
                // The caller's own, being rolled back; or none while it names one.
                Some(_) => return Err(FsStatus::Aborted),
                None if txn != 0 => return Err(FsStatus::Aborted),
                None => false,
            };
            if data.is_empty() {
                return Ok(n);
            }
            // Staged: on what this transaction staged before, or else the committed bytes.
            let before = if staged { t.get_staged(ino)?.filter(|(s, _)| *s == txn).map(|(_, b)| b) } else { None };
            let mut bytes = match before {
                Some(bytes) => bytes,
                None => t.get_small(ino)?.unwrap_or_default(),
            };
            if (bytes.len() as u64) < end {
                bytes.resize(end as usize, 0);
            }
            bytes[offset as usize..end as usize].copy_from_slice(data);
            if staged {
                t.put_staged(ino, txn, &bytes)?;
                return Ok(n);
            }
            let old = n.clone();
            n.attr.size = n.attr.size.max(end);
            n.attr.mtime_ns = now;
            n.attr.ctime_ns = now;
            if n.attr.size > old.attr.size {
                quotas::check_room(t, Some(&old), &n)?;
            }
            t.put_small(ino, &bytes)?;
            quotas::put(t, &mut n)?;
            Ok(n)
        })
    }
}
