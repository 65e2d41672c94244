//! Quotas: limits on the bytes (what regular files' data takes,
//! `Inode::allocated`: the bytes their data components store as the manager
//! last measured them, `Inode::data_bytes`, plus their bytes below the
//! small-file threshold; a hole costs nothing, so a sparse file may be
//! larger than its quota) and the inodes of a user (the inodes it owns) or
//! of a directory's tree.
//!
//! - **Which tree counts an inode**: each inode records the directory whose
//!   quota counts it (`Inode::qdir`, 0: none) — the parent, if it has a
//!   quota, else the parent's own `qdir`, when the inode is made. Setting a
//!   quota on a directory moves its tree (down to nested quota
//!   directories, which keep theirs) from the enclosing quota to the new
//!   one; removing it moves the tree back. A quota is not hierarchical: a
//!   nested quota's tree counts in the nested quota only (as XFS project
//!   quotas). A rename or hard link that would move an inode between trees
//!   is `CROSS_QUOTA` (`EXDEV`: `mv` copies instead).
//! - **Usage** is kept for subjects that have a quota, updated in the same
//!   transaction as every inode change ([`put`], [`remove`]); setting a
//!   quota computes it.
//! - **Enforcement**: whatever makes an inode, or grows a file past its
//!   size, is refused with `QUOTA_EXCEEDED` if it would take a subject past
//!   its limit — counting the **escrow** of every open write transaction:
//!   `BEGIN_WRITE` reserves up to [`ESCROW_BYTES_MAX`] of the room left for
//!   the writer to extend the file with (the seed's quota escrow against a
//!   write capability's lifetime: here the write transaction's lease), and
//!   the writer may make the file at most its size then plus that escrow
//!   (`Intent::size_limit`). A `COMMIT` within it always succeeds; one past
//!   it is refused. An owner change (`chown`, the superuser's) moves usage
//!   between users without a check, as root's `chown` does on Linux.

use crate::backend::{Backend, Txn};
use crate::namespace::get;
use crate::types::{Inode, IntentState, Quota, QuotaSubject};
use crate::{Namespace, BATCH_MAX};
use nasd_proto::fs::{FileKind, FsStatus, Ino};

/// Most bytes one write transaction reserves to extend its file with. A
/// writer that needs more commits and begins again (a fresh escrow).
pub const ESCROW_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// The subjects whose quotas count `n`: its owner, and its tree if any.
fn subjects(n: &Inode) -> impl Iterator<Item = QuotaSubject> {
    let tree = (n.qdir != 0).then_some(QuotaSubject::Dir(n.qdir));
    std::iter::once(QuotaSubject::User(n.attr.uid)).chain(tree)
}

/// What `n` counts for: (bytes, inodes). A regular file's bytes are what
/// its data takes ([`Inode::allocated`]): a hole costs nothing.
fn usage(n: &Inode) -> (u64, u64) {
    (if n.attr.kind == FileKind::File { n.allocated() } else { 0 }, 1)
}

/// The changes of usage per subject from `old` to `new` (either absent).
fn deltas(old: Option<&Inode>, new: Option<&Inode>) -> Vec<(QuotaSubject, i128, i128)> {
    let mut out: Vec<(QuotaSubject, i128, i128)> = Vec::new();
    let mut add = |n: &Inode, sign: i128| {
        let (bytes, files) = usage(n);
        for s in subjects(n) {
            match out.iter_mut().find(|(t, _, _)| *t == s) {
                Some(e) => {
                    e.1 += sign * bytes as i128;
                    e.2 += sign * files as i128;
                }
                None => out.push((s, sign * bytes as i128, sign * files as i128)),
            }
        }
    };
    if let Some(o) = old {
        add(o, -1);
    }
    if let Some(n) = new {
        add(n, 1);
    }
    out.retain(|(_, b, f)| *b != 0 || *f != 0);
    out
}

fn apply(used: u64, delta: i128) -> u64 {
    (used as i128 + delta).clamp(0, u64::MAX as i128) as u64
}

/// Charges the change from `old` to `new` to the subjects that have quotas.
fn charge(t: &mut dyn Txn, old: Option<&Inode>, new: Option<&Inode>) -> Result<(), FsStatus> {
    for (s, bytes, files) in deltas(old, new) {
        if let Some(mut q) = t.get_quota(s)? {
            q.bytes_used = apply(q.bytes_used, bytes);
            q.files_used = apply(q.files_used, files);
            t.put_quota(&q)?;
        }
    }
    Ok(())
}

/// Stores `n` (its `attr.allocated` brought up to date first), charging
/// what changed since the stored row to the quotas.
pub(crate) fn put(t: &mut dyn Txn, n: &mut Inode) -> Result<(), FsStatus> {
    n.refresh_allocated();
    let old = t.get_inode(n.attr.ino)?;
    charge(t, old.as_ref(), Some(n))?;
    t.put_inode(n)
}

/// Deletes `n`, giving back what it used.
pub(crate) fn remove(t: &mut dyn Txn, n: &Inode) -> Result<(), FsStatus> {
    charge(t, Some(n), None)?;
    t.delete_inode(n.attr.ino)
}

/// The escrow of open write transactions (but `except`) on files subject
/// `s` counts.
fn held_escrow(t: &mut dyn Txn, s: QuotaSubject, except: Option<u64>) -> Result<u64, FsStatus> {
    let mut held = 0u64;
    let mut after = 0;
    loop {
        let batch = t.list_intents(after, BATCH_MAX)?;
        let Some(last) = batch.last() else { break };
        after = last.txn;
        for i in batch.iter().filter(|i| i.state == IntentState::Open && i.escrow > 0 && Some(i.txn) != except) {
            if let Some(n) = t.get_inode(i.ino)? {
                if subjects(&n).any(|x| x == s) {
                    held = held.saturating_add(i.escrow);
                }
            }
        }
    }
    Ok(held)
}

/// Fails with `QUOTA_EXCEEDED` if changing `old` into `new` would take a
/// subject's usage, with the escrow others hold, past its limit. Only
/// growth is checked: what shrinks or stays is always allowed.
pub(crate) fn check_room(t: &mut dyn Txn, old: Option<&Inode>, new: &Inode) -> Result<(), FsStatus> {
    for (s, bytes, files) in deltas(old, Some(new)) {
        if bytes <= 0 && files <= 0 {
            continue;
        }
        let Some(q) = t.get_quota(s)? else { continue };
        let held = held_escrow(t, s, None)?;
        let over_bytes =
            bytes > 0 && q.bytes_limit.is_some_and(|l| q.bytes_used as i128 + held as i128 + bytes > l as i128);
        let over_files = files > 0 && q.files_limit.is_some_and(|l| q.files_used as i128 + files > l as i128);
        if over_bytes || over_files {
            return Err(FsStatus::QuotaExceeded);
        }
    }
    Ok(())
}

/// The escrow a writer of `n` gets and the size it may make the file:
/// `(0, u64::MAX)` when no byte limit applies.
pub(crate) fn escrow_for(t: &mut dyn Txn, n: &Inode) -> Result<(u64, u64), FsStatus> {
    let mut room: Option<u64> = None;
    for s in subjects(n).collect::<Vec<_>>() {
        let Some(q) = t.get_quota(s)? else { continue };
        let Some(limit) = q.bytes_limit else { continue };
        let held = held_escrow(t, s, None)?;
        let left = limit.saturating_sub(q.bytes_used.saturating_add(held));
        room = Some(room.map_or(left, |r| r.min(left)));
    }
    Ok(match room {
        None => (0, u64::MAX),
        Some(r) => {
            let escrow = r.min(ESCROW_BYTES_MAX);
            (escrow, n.attr.size.saturating_add(escrow))
        }
    })
}

/// The tree an inode made in directory `dir` belongs to.
pub(crate) fn tree_below(t: &mut dyn Txn, dir: &Inode) -> Result<Ino, FsStatus> {
    if t.get_quota(QuotaSubject::Dir(dir.attr.ino))?.is_some() {
        Ok(dir.attr.ino)
    } else {
        Ok(dir.qdir)
    }
}

/// Moves every inode below `dir` counted by tree `from` to tree `to`
/// (stopping at nested quota directories), returning their usage.
fn move_tree(t: &mut dyn Txn, dir: Ino, from: Ino, to: Ino) -> Result<(u64, u64), FsStatus> {
    let (mut bytes, mut files) = (0u64, 0u64);
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        let mut after = String::new();
        loop {
            let entries = t.list_dir(d, &after, BATCH_MAX)?;
            let Some(last) = entries.last() else { break };
            after = last.name.clone();
            for e in entries {
                let mut n = e.inode;
                if n.qdir != from {
                    // A hard link to an inode counted elsewhere, or already moved.
                    continue;
                }
                let (b, f) = usage(&n);
                bytes = bytes.saturating_add(b);
                files += f;
                n.qdir = to;
                t.put_inode(&n)?;
                if n.attr.kind == FileKind::Dir && t.get_quota(QuotaSubject::Dir(n.attr.ino))?.is_none() {
                    stack.push(n.attr.ino);
                }
            }
        }
    }
    Ok((bytes, files))
}

impl<B: Backend> Namespace<B> {
    /// Sets the limits of `subject` (`None`: unlimited); both `None`
    /// removes its quota. A new quota counts what its subject uses now
    /// (a directory's tree moves to it from the enclosing quota); a removed
    /// directory quota gives its tree back to the enclosing one. A limit
    /// below the usage is allowed: nothing more can be added until usage
    /// falls under it. Returns the quota (`None` if removed).
    ///
    /// # Errors
    /// `NotDir` (a directory quota on another kind), `NotFound`.
    pub fn set_quota(
        &self,
        subject: QuotaSubject,
        bytes_limit: Option<u64>,
        files_limit: Option<u64>,
    ) -> Result<Option<Quota>, FsStatus> {
        self.backend.transact(|t| {
            let existing = t.get_quota(subject)?;
            let remove = bytes_limit.is_none() && files_limit.is_none();
            match (subject, existing) {
                (_, Some(mut q)) if !remove => {
                    q.bytes_limit = bytes_limit;
                    q.files_limit = files_limit;
                    t.put_quota(&q)?;
                    Ok(Some(q))
                }
                (_, None) if remove => Ok(None),
                (QuotaSubject::User(_), Some(_)) => {
                    t.delete_quota(subject)?;
                    Ok(None)
                }
                (QuotaSubject::User(uid), None) => {
                    let (bytes_used, files_used) = t.usage_of_uid(uid)?;
                    let q = Quota { subject, bytes_limit, files_limit, bytes_used, files_used };
                    t.put_quota(&q)?;
                    Ok(Some(q))
                }
                (QuotaSubject::Dir(ino), existing) => {
                    let d = get(t, ino)?;
                    if d.attr.kind != FileKind::Dir {
                        return Err(FsStatus::NotDir);
                    }
                    let outer = QuotaSubject::Dir(d.qdir);
                    if existing.is_some() {
                        // Removing: the tree goes back to the enclosing quota.
                        t.delete_quota(subject)?;
                        let (bytes, files) = move_tree(t, ino, ino, d.qdir)?;
                        if let Some(mut q) = t.get_quota(outer)? {
                            q.bytes_used = q.bytes_used.saturating_add(bytes);
                            q.files_used = q.files_used.saturating_add(files);
                            t.put_quota(&q)?;
                        }
                        return Ok(None);
                    }
                    let (bytes_used, files_used) = move_tree(t, ino, d.qdir, ino)?;
                    if d.qdir != 0 {
                        if let Some(mut q) = t.get_quota(outer)? {
                            q.bytes_used = q.bytes_used.saturating_sub(bytes_used);
                            q.files_used = q.files_used.saturating_sub(files_used);
                            t.put_quota(&q)?;
                        }
                    }
                    let q = Quota { subject, bytes_limit, files_limit, bytes_used, files_used };
                    t.put_quota(&q)?;
                    Ok(Some(q))
                }
            }
        })
    }

    /// The quota of `subject`, if it has one, and the escrow open write
    /// transactions hold against it.
    ///
    /// # Errors
    /// `Internal`.
    pub fn quota(&self, subject: QuotaSubject) -> Result<Option<(Quota, u64)>, FsStatus> {
        self.backend.read(|t| {
            let Some(q) = t.get_quota(subject)? else { return Ok(None) };
            let held = held_escrow(t, subject, None)?;
            Ok(Some((q, held)))
        })
    }

    /// Every quota, in subject order (users first).
    ///
    /// # Errors
    /// `Internal`.
    pub fn quotas(&self) -> Result<Vec<Quota>, FsStatus> {
        self.backend.read(|t| t.list_quotas())
    }
}
