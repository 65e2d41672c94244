//! Global access-control lists (DSFS §4.1: kept with the metadata, as rows
//! of `acl_entries`): named user and group entries that add rights to the
//! POSIX mode bits (`nasd_proto::acl`), and role entries that add them to
//! whoever acts in a role (`Caller::role`, from the identity credential).
//!
//! - **Base.** The owner, group and other entries are the mode's triples
//!   (`chmod` and `chown` change them); the named entries are rows of their
//!   own, which survive both.
//! - **Check.** [`check`] asks the mode bits first (`perm::check_mode`, as
//!   POSIX) and reads the named entries only if they refuse: a caller holds
//!   a right its class's triple gives or a named entry matching it (its uid,
//!   its primary or a supplementary group) gives. Entries only add. The
//!   superuser is judged by the mode alone (it bypasses everything but
//!   execute on a file with no execute bit). Symbolic links have no ACL.
//! - **Inheritance, copied at create.** A directory's entries with
//!   `ACL_INHERIT` are copied onto each inode made in it: onto a directory
//!   with the flag (so they propagate down), onto anything else without.
//!   Changing a directory's ACL changes nothing already below it, as POSIX
//!   default ACLs; and a file's effective ACL is its own rows alone, so the
//!   manager can flatten it without walking up the tree.
//! - **Who changes it.** The owner, the superuser, or a caller holding
//!   `ACL_SET_ACL` through a named entry.

use crate::backend::{Backend, Txn};
use crate::namespace::{get, now_ns, revoke};
use crate::perm::{check_mode, owns};
use crate::types::{AcvIntent, Caller, Inode};
use crate::Namespace;
use nasd_proto::acl::{canonical_acl, AclEntry, AclInfo, AclWho, ACL_INHERIT, ACL_SET_ACL};
use nasd_proto::fs::{FileKind, FsStatus, Ino, MODE_MASK};

/// The rights the named entries of `entries` grant `caller`: the union of
/// the user entry naming its uid, the group entries naming its groups and
/// the role entry naming its role (none for role 0).
pub fn granted(caller: &Caller, entries: &[AclEntry]) -> u8 {
    entries
        .iter()
        .filter(|e| match e.who {
            AclWho::User(uid) => uid == caller.uid,
            AclWho::Group(gid) => caller.in_group(gid),
            AclWho::Role(role) => role != nasd_proto::ROLE_NONE && role == caller.role,
        })
        .fold(0, |rights, e| rights | e.rights)
}

/// Checks that `caller` holds every bit of `want` (`perm::R`, `W`, `X`, the
/// same bits as `ACL_READ`, `ACL_WRITE`, `ACL_EXECUTE`) on `inode`: by its
/// mode bits, else by its named entries (read only then).
pub(crate) fn check(t: &mut dyn Txn, caller: &Caller, inode: &Inode, want: u32) -> Result<(), FsStatus> {
    let by_mode = check_mode(caller, inode, want);
    if by_mode.is_ok() || caller.is_root() || inode.attr.kind == FileKind::Symlink {
        return by_mode;
    }
    let a = &inode.attr;
    let shift = if caller.uid == a.uid {
        6
    } else if caller.in_group(a.gid) {
        3
    } else {
        0
    };
    let have = (a.mode >> shift) & 0o7 | u32::from(granted(caller, &t.get_acl(a.ino)?));
    if have & want == want {
        Ok(())
    } else {
        by_mode
    }
}

/// Copies `dir`'s inheritable entries onto `child`, just made in it (no-op
/// for symbolic links, which have no ACL).
pub(crate) fn inherit(t: &mut dyn Txn, dir: &Inode, child: &Inode) -> Result<(), FsStatus> {
    if child.attr.kind == FileKind::Symlink {
        return Ok(());
    }
    let mut entries: Vec<AclEntry> = t.get_acl(dir.attr.ino)?.into_iter().filter(AclEntry::inherits).collect();
    if entries.is_empty() {
        return Ok(());
    }
    if child.attr.kind != FileKind::Dir {
        entries.iter_mut().for_each(|e| e.flags &= !ACL_INHERIT);
    }
    t.put_acl(child.attr.ino, &entries)
}

fn info(n: &Inode, entries: Vec<AclEntry>) -> AclInfo {
    AclInfo { uid: n.attr.uid, gid: n.attr.gid, mode: n.attr.mode & MODE_MASK, entries }
}

impl<B: Backend> Namespace<B> {
    /// `ino`'s ACL: owner, group, mode and named entries. Needs no
    /// permission on the inode (as `stat`).
    ///
    /// # Errors
    /// `NOT_FOUND`.
    pub fn get_acl(&self, ino: Ino) -> Result<AclInfo, FsStatus> {
        self.backend.read(|t| {
            let n = get(t, ino)?;
            Ok(info(&n, t.get_acl(ino)?))
        })
    }

    /// Replaces `ino`'s named entries with `entries` (put in canonical
    /// order; ctime becomes now). A regular file's capabilities are revoked
    /// as by `chmod` (its ACV is bumped, an ACV intent recorded per
    /// component): a capability minted under the old entries stops working
    /// once the manager has set the new ACV on the drives. Returns the
    /// inode, its ACL as it now is, and the intents.
    ///
    /// # Errors
    /// `NOT_PERMITTED` (neither the owner, the superuser, nor a holder of
    /// `ACL_SET_ACL`), `INVALID_ARGUMENT` (a principal named twice, an entry
    /// without rights or with undefined bits, an inherit flag on anything
    /// but a directory, any entry on a symbolic link), `TOO_BIG` (more than
    /// `ACL_ENTRIES_MAX` entries), `NOT_FOUND`.
    pub fn set_acl(
        &self,
        caller: &Caller,
        ino: Ino,
        entries: Vec<AclEntry>,
    ) -> Result<(Inode, AclInfo, Vec<AcvIntent>), FsStatus> {
        if entries.len() > nasd_proto::acl::ACL_ENTRIES_MAX {
            return Err(FsStatus::TooBig);
        }
        let entries = canonical_acl(entries).map_err(|_| FsStatus::InvalidArgument)?;
        self.backend.transact(|t| {
            let mut n = get(t, ino)?;
            if n.attr.kind == FileKind::Symlink && !entries.is_empty() {
                return Err(FsStatus::InvalidArgument);
            }
            if n.attr.kind != FileKind::Dir && entries.iter().any(AclEntry::inherits) {
                return Err(FsStatus::InvalidArgument);
            }
            if !owns(caller, &n) && granted(caller, &t.get_acl(ino)?) & ACL_SET_ACL == 0 {
                return Err(FsStatus::NotPermitted);
            }
            t.put_acl(ino, &entries)?;
            n.attr.ctime_ns = now_ns();
            let intents = revoke(t, &mut n)?;
            crate::quotas::put(t, &n)?;
            let now = info(&n, entries.clone());
            Ok((n, now, intents))
        })
    }

    /// Records that file `ino`'s access PAL did not reach every component:
    /// the manager sets it again at its maintenance passes (whichever
    /// manager runs them), across restarts, until [`Namespace::pal_delivered`].
    /// A file removed meanwhile loses its record with it.
    pub fn pal_undelivered(&self, ino: Ino) -> Result<(), FsStatus> {
        self.backend.transact(|t| t.pal_pending_put(ino))
    }

    /// Forgets `ino`'s record as [`Namespace::pals_undelivered`] listed it
    /// (sequence number `seq`): its PAL is on every component. A failure
    /// recorded since (a greater number) keeps the record.
    pub fn pal_delivered(&self, ino: Ino, seq: u64) -> Result<(), FsStatus> {
        self.backend.transact(|t| t.pal_pending_delete(ino, seq))
    }

    /// The files recorded by [`Namespace::pal_undelivered`] with their
    /// records' sequence numbers, ascending, at most `limit`.
    pub fn pals_undelivered(&self, limit: usize) -> Result<Vec<(Ino, u64)>, FsStatus> {
        self.backend.read(|t| t.pal_pending_list(limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_proto::acl::{ACL_EXECUTE, ACL_READ, ACL_WRITE};

    #[test]
    fn granted_is_the_union_of_matching_entries() {
        let e = |who, rights| AclEntry { who, rights, flags: 0 };
        let acl = [e(AclWho::User(5), ACL_READ), e(AclWho::Group(7), ACL_WRITE), e(AclWho::Group(9), ACL_EXECUTE)];
        assert_eq!(granted(&Caller::new(5, 1), &acl), ACL_READ);
        assert_eq!(
            granted(&Caller { uid: 5, gid: 1, groups: vec![7, 9], role: 0 }, &acl),
            ACL_READ | ACL_WRITE | ACL_EXECUTE
        );
        assert_eq!(granted(&Caller::new(6, 7), &acl), ACL_WRITE);
        assert_eq!(granted(&Caller::new(6, 8), &acl), 0);
        let acl = [e(AclWho::User(5), ACL_READ), e(AclWho::Role(3), ACL_WRITE)];
        assert_eq!(granted(&Caller { role: 3, ..Caller::new(6, 8) }, &acl), ACL_WRITE, "acting in role 3");
        assert_eq!(granted(&Caller { role: 4, ..Caller::new(6, 8) }, &acl), 0, "another role");
        assert_eq!(granted(&Caller::new(6, 8), &acl), 0, "no role");
    }
}
