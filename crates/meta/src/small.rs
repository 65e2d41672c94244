//! Small files (issue 14, Slice §3.1 and §4.4): the bytes of a regular file
//! below its small-file threshold live in the metadata store, in one row
//! per file beside its inode, and move through the manager; the bytes at
//! and past the threshold are striped over the file's components as any
//! other file's. The threshold is fixed when the file is created (the
//! manager's `[manager] small_file_threshold` then; files created with 0,
//! or before this existed, have no row and keep every byte on their
//! components), so changing the configuration never moves bytes.
//!
//! The row holds at most `threshold` bytes; bytes past the stored ones up
//! to the file's size read as zeros (a sparse or extended file). Every size
//! change cuts the stored bytes to the new size, so a file cut short and
//! extended again reads zeros where the old bytes were.

use crate::backend::{Backend, Txn};
use crate::namespace::{check_sizable, get, now_ns};
use crate::perm::{check, owns, R, W};
use crate::quotas;
use crate::types::{Caller, Inode, IntentState};
use crate::Namespace;
use nasd_proto::fs::{FsStatus, Ino};
use nasd_proto::manager::{SMALL_FILE_THRESHOLD_MAX, SMALL_IO_MAX};

/// Cuts the small-file bytes of `ino` (if it has any) to `size`: inside
/// every transaction that sets a file's size.
pub(crate) fn cut_small(t: &mut dyn Txn, ino: Ino, size: u64) -> Result<(), FsStatus> {
    if let Some((threshold, mut bytes)) = t.get_small(ino)? {
        if (bytes.len() as u64) > size {
            bytes.truncate(size as usize);
            t.put_small(ino, threshold, &bytes)?;
        }
    }
    Ok(())
}

/// Gives a new regular file its small-file row (`threshold` 0: none).
pub(crate) fn start_small(t: &mut dyn Txn, ino: Ino, threshold: u32) -> Result<(), FsStatus> {
    if threshold > 0 {
        t.put_small(ino, threshold, &[])?;
    }
    Ok(())
}

/// The small-file threshold of `ino` (0: none).
pub(crate) fn threshold_of(t: &mut dyn Txn, ino: Ino) -> Result<u32, FsStatus> {
    Ok(t.get_small(ino)?.map_or(0, |(threshold, _)| threshold))
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

    /// A file's small-file threshold (0: it keeps every byte on its components).
    ///
    /// # Errors
    /// `Internal`.
    pub fn small_threshold_of(&self, ino: Ino) -> Result<u32, FsStatus> {
        self.backend.read(|t| threshold_of(t, ino))
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
            check(caller, &n, R)?;
            let (threshold, bytes) = t.get_small(ino)?.ok_or(FsStatus::InvalidArgument)?;
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

    /// `WRITE_SMALL`: writes `data` at `offset` below the file's threshold,
    /// in one transaction with its size (at least the end written), its
    /// modification and change times and its quota usage. Needs write
    /// permission, or ownership (as `SETATTR`'s open-writer rule: the
    /// creator of a file made read-only writes what it opened for writing).
    /// `txn`: the caller's open write transaction on the file, 0 if none.
    ///
    /// # Errors
    /// `InvalidArgument` (`data` over [`SMALL_IO_MAX`], ending past the
    /// threshold, or no small-file bytes), `Busy` (another writer's write
    /// transaction is open on the file: [`Intent`](crate::Intent) of it
    /// returned by [`Namespace::intent_of`]), `Aborted` (`txn` is not an
    /// open transaction of the caller on the file), `QuotaExceeded`,
    /// `IsDir`, `PermissionDenied`, `NotFound`.
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
                check(caller, &n, W)?;
            }
            let (threshold, mut bytes) = t.get_small(ino)?.ok_or(FsStatus::InvalidArgument)?;
            let end = offset.checked_add(data.len() as u64).ok_or(FsStatus::InvalidArgument)?;
            if end > threshold as u64 {
                return Err(FsStatus::InvalidArgument);
            }
            // One writer at a time, as BEGIN_WRITE keeps it: another's open
            // transaction holds the file.
            match t.intent_of_inode(ino)?.filter(|i| i.state != IntentState::Committed) {
                Some(i) if i.txn != txn => return Err(FsStatus::Busy),
                Some(i) if i.uid != caller.uid && !caller.is_root() => return Err(FsStatus::NotPermitted),
                Some(i) if i.state == IntentState::Open => {}
                // The caller's own, being rolled back; or none while it names one.
                Some(_) => return Err(FsStatus::Aborted),
                None if txn != 0 => return Err(FsStatus::Aborted),
                None => {}
            }
            if data.is_empty() {
                return Ok(n);
            }
            if (bytes.len() as u64) < end {
                bytes.resize(end as usize, 0);
            }
            bytes[offset as usize..end as usize].copy_from_slice(data);
            let old = n.clone();
            n.attr.size = n.attr.size.max(end);
            n.attr.mtime_ns = now;
            n.attr.ctime_ns = now;
            if n.attr.size > old.attr.size {
                quotas::check_room(t, Some(&old), &n)?;
            }
            t.put_small(ino, threshold, &bytes)?;
            quotas::put(t, &n)?;
            Ok(n)
        })
    }
}
