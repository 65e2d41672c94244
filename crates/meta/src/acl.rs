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
//!   default ACLs; and a file's effective ACL is its own rows plus, for a
//!   regular file, its collection's shared rows (below), so the manager can
//!   flatten it without walking up the tree.
//! - **Shared entries, granted live** (DSFS §4.1, PAL collections). A
//!   directory's entries with `ACL_SHARED` are not copied onto the regular
//!   files created in it: each such file becomes a **member** of the
//!   directory's collection (`pal_members`, recorded at create and kept
//!   through renames and links: a file has one collection, the directory
//!   it was made in, whose inode number names it), and the directory's
//!   shared entries count as the member's own. So one change of them
//!   reaches every member — on the drives, one super PAL per drive instead
//!   of one access PAL per component of every file. A change of the shared
//!   entries, or the removal of a directory that had some, is recorded in
//!   `collection_pending` in its transaction (the manager then sets the
//!   super PAL on every drive) and revokes every member's capabilities
//!   when a right is taken away. At most `PAL_COLLECTIONS_MAX` directories
//!   have shared entries, as a drive holds at most that many super PALs.
//!   With `ACL_INHERIT` as well, a new subdirectory gets the entry with both
//!   flags (a collection of its own; once the bound is reached, with the
//!   inherit flag alone, so its files get copies); other new inodes that
//!   are not regular files get a plain copy.
//! - **Who changes it.** The owner, the superuser, or a caller holding
//!   `ACL_SET_ACL` through a named entry. `set_acl` of a regular file bumps
//!   its access-control version as a chmod does (capabilities minted under
//!   the old entries are revoked before `SET_ACL` answers) — unless the name
//!   space mints no capabilities (`Namespace::with_capabilities(false)`, a
//!   PALs-only partition), where chmod, chown and `SET_ACL` bump none: the
//!   PAL takes the right away. Taking a shared right away revokes every
//!   member's capabilities in one transaction, reading the members
//!   `MEMBERS_PER_READ` at a time.

use crate::backend::{Backend, PalPush, Txn};
use crate::namespace::{get, now_ns, revoke};
use crate::perm::{check_mode, owns};
use crate::types::{Caller, Effects, Inode};
use crate::Namespace;
use nasd_proto::acl::{canonical_acl, AclEntry, AclInfo, AclWho, ACL_SET_ACL, ACL_SHARED};
use nasd_proto::fs::{FileKind, FsStatus, Ino, MODE_MASK};
use nasd_proto::limits::PAL_COLLECTIONS_MAX;

/// Members revoked per read while a collection's shared entries lose a
/// right (all in the one transaction; this bounds each read).
const MEMBERS_PER_READ: usize = 1024;

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
    let mut have = (a.mode >> shift) & 0o7 | u32::from(granted(caller, &t.get_acl(a.ino)?));
    if have & want != want && a.kind == FileKind::File {
        if let Some(collection) = t.pal_member(a.ino)? {
            have |= u32::from(granted(caller, &shared_entries(t, collection)?));
        }
    }
    if have & want == want {
        Ok(())
    } else {
        by_mode
    }
}

/// The shared entries of directory `collection` (none once it is gone).
pub(crate) fn shared_entries(t: &mut dyn Txn, collection: Ino) -> Result<Vec<AclEntry>, FsStatus> {
    Ok(t.get_acl(collection)?.into_iter().filter(AclEntry::shared).collect())
}

/// Whether one more directory may get shared entries: fewer than
/// `PAL_COLLECTIONS_MAX` have some.
fn collection_room(t: &mut dyn Txn) -> Result<bool, FsStatus> {
    Ok(t.shared_collections(PAL_COLLECTIONS_MAX)?.len() < PAL_COLLECTIONS_MAX)
}

/// Whether some principal holds a right under `old` it does not under `new`.
fn takes_away(old: &[AclEntry], new: &[AclEntry]) -> bool {
    old.iter().any(|o| {
        let kept = new.iter().find(|n| n.who == o.who).map_or(0, |n| n.rights);
        o.rights & !kept != 0
    })
}

/// Directory `dir`'s shared entries change from `old` to `new` (or it goes,
/// `new` empty): records the collection for the manager's super-PAL push
/// and, if a right is taken away and the name space `revokes`
/// capabilities, revokes every member's.
pub(crate) fn collection_changed(
    t: &mut dyn Txn,
    dir: Ino,
    (old, new): (&[AclEntry], &[AclEntry]),
    revokes: bool,
    fx: &mut Effects,
) -> Result<(), FsStatus> {
    if old == new {
        return Ok(());
    }
    t.pal_pending_put(PalPush::Collection, dir)?;
    fx.collections.push(dir);
    if !revokes || !takes_away(old, new) {
        return Ok(());
    }
    let mut after = 0;
    loop {
        let members = t.pal_members(dir, after, MEMBERS_PER_READ)?;
        for &ino in &members {
            if let Some(mut member) = t.get_inode(ino)? {
                let intents = revoke(t, &mut member)?;
                if !intents.is_empty() {
                    t.put_inode(&member)?;
                    fx.revoke.extend(intents);
                }
            }
        }
        match members.last() {
            Some(&last) if members.len() == MEMBERS_PER_READ => after = last,
            _ => return Ok(()),
        }
    }
}

/// Directory `dir` is being removed: if it is a collection, its members
/// lose its shared entries (see [`collection_changed`]).
pub(crate) fn dissolve(t: &mut dyn Txn, dir: &Inode, revokes: bool, fx: &mut Effects) -> Result<(), FsStatus> {
    let shared = shared_entries(t, dir.attr.ino)?;
    collection_changed(t, dir.attr.ino, (&shared, &[]), revokes, fx)
}

/// Gives `child`, just made in `dir`, what it takes from `dir`: a regular
/// file becomes a member of `dir`'s collection; inheritable entries are
/// copied (see the module documentation). Nothing for symbolic links,
/// which have no ACL.
pub(crate) fn inherit(t: &mut dyn Txn, dir: &Inode, child: &Inode) -> Result<(), FsStatus> {
    let kind = child.attr.kind;
    if kind == FileKind::Symlink {
        return Ok(());
    }
    if kind == FileKind::File {
        t.put_pal_member(child.attr.ino, dir.attr.ino)?;
    }
    let mut entries: Vec<AclEntry> = t.get_acl(dir.attr.ino)?.into_iter().filter(AclEntry::inherits).collect();
    match kind {
        FileKind::File => {
            entries.retain(|e| !e.shared());
            entries.iter_mut().for_each(|e| e.flags = 0);
        }
        FileKind::Dir if entries.iter().any(AclEntry::shared) && !collection_room(t)? => {
            tracing::warn!(
                dir = dir.attr.ino,
                "PAL_COLLECTIONS_MAX directories have shared entries: a new subdirectory inherits them as copies"
            );
            entries.iter_mut().for_each(|e| e.flags &= !ACL_SHARED);
        }
        FileKind::Dir => {}
        _ => entries.iter_mut().for_each(|e| e.flags = 0),
    }
    if entries.is_empty() {
        return Ok(());
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
    /// as by `chmod` when the name space revokes capabilities (its ACV is
    /// bumped, an ACV intent recorded per component): a capability minted
    /// under the old entries stops working once the manager has set the new
    /// ACV on the drives. A directory whose shared entries change is a
    /// changed collection (`collection_changed`: recorded, its members'
    /// capabilities revoked if a right is taken away). Returns the inode,
    /// its ACL as it now is, and the effects (revocations, the collection).
    ///
    /// # Errors
    /// `NOT_PERMITTED` (neither the owner, the superuser, nor a holder of
    /// `ACL_SET_ACL`), `INVALID_ARGUMENT` (a principal named twice, an entry
    /// without rights or with undefined bits, an inherit or shared flag on
    /// anything but a directory, any entry on a symbolic link), `TOO_BIG`
    /// (more than `ACL_ENTRIES_MAX` entries, or shared entries on a
    /// directory beyond the `PAL_COLLECTIONS_MAX` that have some),
    /// `NOT_FOUND`.
    pub fn set_acl(
        &self,
        caller: &Caller,
        ino: Ino,
        entries: Vec<AclEntry>,
    ) -> Result<(Inode, AclInfo, Effects), FsStatus> {
        if entries.len() > nasd_proto::acl::ACL_ENTRIES_MAX {
            return Err(FsStatus::TooBig);
        }
        let entries = canonical_acl(entries).map_err(|_| FsStatus::InvalidArgument)?;
        let new_shared: Vec<AclEntry> = entries.iter().copied().filter(AclEntry::shared).collect();
        self.backend.transact(|t| {
            let mut n = get(t, ino)?;
            if n.attr.kind == FileKind::Symlink && !entries.is_empty() {
                return Err(FsStatus::InvalidArgument);
            }
            if n.attr.kind != FileKind::Dir && entries.iter().any(|e| e.inherits() || e.shared()) {
                return Err(FsStatus::InvalidArgument);
            }
            let old = t.get_acl(ino)?;
            if !owns(caller, &n) && granted(caller, &old) & ACL_SET_ACL == 0 {
                return Err(FsStatus::NotPermitted);
            }
            let old_shared: Vec<AclEntry> = old.into_iter().filter(AclEntry::shared).collect();
            if old_shared.is_empty() && !new_shared.is_empty() && !collection_room(t)? {
                return Err(FsStatus::TooBig);
            }
            t.put_acl(ino, &entries)?;
            n.attr.ctime_ns = now_ns();
            let mut fx = Effects::default();
            if self.revokes_capabilities {
                fx.revoke = revoke(t, &mut n)?;
            }
            crate::quotas::put(t, &mut n)?;
            collection_changed(t, ino, (&old_shared, &new_shared), self.revokes_capabilities, &mut fx)?;
            let now = info(&n, entries.clone());
            Ok((n, now, fx))
        })
    }

    /// What regular file `ino`'s PAL is made of: its ACL (owner, mode, own
    /// entries) and the collection it is a member of (0: none).
    ///
    /// # Errors
    /// `NOT_FOUND`.
    pub fn pal_source(&self, ino: Ino) -> Result<(AclInfo, Ino), FsStatus> {
        self.backend.read(|t| {
            let n = get(t, ino)?;
            let collection = if n.attr.kind == FileKind::File { t.pal_member(ino)?.unwrap_or(0) } else { 0 };
            Ok((info(&n, t.get_acl(ino)?), collection))
        })
    }

    /// The shared entries of collection `collection` as they now stand:
    /// what its super PAL is made of (none once its directory is gone).
    pub fn collection_entries(&self, collection: Ino) -> Result<Vec<AclEntry>, FsStatus> {
        self.backend.read(|t| shared_entries(t, collection))
    }

    /// If collection `collection`'s super PAL is recorded as due (a change
    /// not yet on every drive): the record's sequence number and the shared
    /// entries as they now stand, read together, so a change committed
    /// after this read keeps its record ([`Namespace::pal_delivered`]).
    pub fn collection_due(&self, collection: Ino) -> Result<Option<(u64, Vec<AclEntry>)>, FsStatus> {
        self.backend.read(|t| match t.pal_pending_seq(PalPush::Collection, collection)? {
            None => Ok(None),
            Some(seq) => Ok(Some((seq, shared_entries(t, collection)?))),
        })
    }

    /// The directories that have shared entries (at most
    /// `PAL_COLLECTIONS_MAX`), ascending: the collections whose super PALs
    /// a drive should hold.
    pub fn collections(&self) -> Result<Vec<Ino>, FsStatus> {
        self.backend.read(|t| t.shared_collections(PAL_COLLECTIONS_MAX))
    }

    /// Records that a PAL push did not reach every drive: file `ino`'s
    /// access PAL, or collection `ino`'s super PAL. The manager sets it again
    /// at its maintenance passes (whichever manager runs them), across
    /// restarts, until [`Namespace::pal_delivered`]. A file removed
    /// meanwhile loses its record with it; a collection keeps it (the drives
    /// must forget its super PAL).
    pub fn pal_undelivered(&self, what: PalPush, ino: Ino) -> Result<(), FsStatus> {
        self.backend.transact(|t| t.pal_pending_put(what, ino))
    }

    /// Forgets `ino`'s record as [`Namespace::pals_undelivered`] listed it
    /// (sequence number `seq`): its PAL is on every drive it belongs on. A
    /// failure recorded since (a greater number) keeps the record.
    pub fn pal_delivered(&self, what: PalPush, ino: Ino, seq: u64) -> Result<(), FsStatus> {
        self.backend.transact(|t| t.pal_pending_delete(what, ino, seq))
    }

    /// The files (or collections) recorded by [`Namespace::pal_undelivered`]
    /// with their records' sequence numbers, ascending, at most `limit`.
    pub fn pals_undelivered(&self, what: PalPush, limit: usize) -> Result<Vec<(Ino, u64)>, FsStatus> {
        self.backend.read(|t| t.pal_pending_list(what, limit))
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

    /// At most `PAL_COLLECTIONS_MAX` directories have shared entries (a
    /// drive holds no more super PALs): one more is `TOO_BIG`; a directory
    /// already counted may change its entries; a new subdirectory inherits
    /// a shared entry as a plain inheritable one then.
    #[test]
    fn collections_are_bounded() {
        let ns = Namespace::new(crate::Sqlite::open_in_memory().unwrap(), nasd_proto::layout::Layout::SINGLE).unwrap();
        let root = Caller::new(0, 0);
        let shared =
            |rights| AclEntry { who: AclWho::Role(3), rights, flags: ACL_SHARED | nasd_proto::acl::ACL_INHERIT };
        let dirs: Vec<Ino> = (0..PAL_COLLECTIONS_MAX)
            .map(|i| ns.mkdir(&root, nasd_proto::fs::ROOT_INO, &format!("d{i}"), 0o755).unwrap().attr.ino)
            .collect();
        for &d in &dirs[..PAL_COLLECTIONS_MAX - 1] {
            ns.set_acl(&root, d, vec![shared(nasd_proto::acl::ACL_READ)]).unwrap();
        }
        let last = dirs[PAL_COLLECTIONS_MAX - 1];
        ns.set_acl(&root, last, vec![shared(nasd_proto::acl::ACL_READ)]).unwrap();
        let extra = ns.mkdir(&root, nasd_proto::fs::ROOT_INO, "extra", 0o755).unwrap().attr.ino;
        assert_eq!(ns.set_acl(&root, extra, vec![shared(nasd_proto::acl::ACL_READ)]).err(), Some(FsStatus::TooBig));
        ns.set_acl(&root, last, vec![shared(nasd_proto::acl::ACL_WRITE)]).unwrap();
        let sub = ns.mkdir(&root, last, "sub", 0o755).unwrap().attr.ino;
        let inherited = ns.get_acl(sub).unwrap().entries;
        assert_eq!(inherited.len(), 1);
        assert_eq!(inherited[0].flags, nasd_proto::acl::ACL_INHERIT, "a copy, not a collection past the bound");
        ns.set_acl(&root, dirs[0], Vec::new()).unwrap();
        ns.set_acl(&root, extra, vec![shared(nasd_proto::acl::ACL_READ)]).unwrap();
        assert_eq!(ns.collections().unwrap().len(), PAL_COLLECTIONS_MAX);
    }

    /// A name space that mints no capabilities (a PALs-only partition)
    /// bumps no ACV for chmod, chown or an ACL change, nor for members
    /// losing a shared right: there is nothing to revoke.
    #[test]
    fn no_capabilities_no_revocations() {
        let ns = Namespace::new(crate::Sqlite::open_in_memory().unwrap(), nasd_proto::layout::Layout::SINGLE)
            .unwrap()
            .with_capabilities(false);
        crate::testing::setup(&ns);
        let root = Caller::new(0, 0);
        let d = ns.mkdir(&root, nasd_proto::fs::ROOT_INO, "d", 0o755).unwrap().attr.ino;
        let mut placer = crate::testing::pool_placer(&[1]);
        let (f, _) = ns.create(&root, d, "f", 0o644, true, false, &mut placer).unwrap();
        assert!(!f.components.is_empty());
        let read = AclEntry { who: AclWho::User(7), rights: nasd_proto::acl::ACL_READ, flags: 0 };
        let (n, _, fx) = ns.set_acl(&root, f.attr.ino, vec![read]).unwrap();
        assert!(fx.revoke.is_empty());
        let chmod = crate::SetAttrs { mode: Some(0o600), ..crate::SetAttrs::default() };
        let (m, intents) = ns.setattr(&root, f.attr.ino, &chmod).unwrap();
        assert!(intents.is_empty());
        assert_eq!((n.acv, m.acv), (f.acv, f.acv), "no ACV bump");
        ns.set_acl(&root, d, vec![AclEntry { flags: ACL_SHARED, ..read }]).unwrap();
        let (_, _, fx) = ns.set_acl(&root, d, Vec::new()).unwrap();
        assert_eq!((fx.revoke.len(), fx.collections), (0, vec![d]), "the super PAL only");
    }
}
