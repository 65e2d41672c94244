//! A file's global ACL flattened into the access PAL its component objects
//! carry on their drives (DSFS §3.2), and pushed there.
//!
//! **Flattening.** A PAL names users and roles; the manager's ACL names the
//! owner (the mode's user triple), the group and others (the other two
//! triples) and named users and groups. The PAL gets the entries a drive can
//! match by the credential alone: the **owner**, with the rights of the
//! owner triple, and every **named user**, with the rights of its entry.
//! `r` becomes `READ|GETATTR`, `w` becomes `WRITE|APPEND|FLUSH|GETATTR`;
//! `x` and `c` carry nothing to a drive; a principal left with no rights
//! gets no entry. The group and other triples and group entries are not
//! flattened (a drive knows no group membership): those callers go through
//! capabilities, so a partition whose users rely on them runs the scheme
//! `both`.
//!
//! **Overflow.** The owner and the named users may be one more than
//! `PAL_ENTRIES_MAX` (an ACL holds `ACL_ENTRIES_MAX` = `PAL_ENTRIES_MAX`
//! named entries). `SET_ACL` refuses such a list up front on a PAL
//! partition (`TOO_BIG`); one reached otherwise (a chown to a user not
//! named) is cut to the owner and the lowest-numbered named users — a PAL
//! grants nothing the ACL does not, and the users left out go through
//! capabilities.
//!
//! **Push.** On create, after every ACL, mode or owner change, and after
//! `SET_LAYOUT` re-places a file, the manager sets the PAL on every
//! component object (repair and rebalance set it on a new object before it
//! becomes a component) (`SET_PAL` under the drive key,
//! durable when it returns) and answers only once every drive answered:
//! from then on, a request by identity is checked against the new list.

use crate::{Failure, Manager};
use nasd_meta::Inode;
use nasd_proto::acl::{AclEntry, AclWho, ACL_READ, ACL_WRITE};
use nasd_proto::fs::FsStatus;
use nasd_proto::limits::PAL_ENTRIES_MAX;
use nasd_proto::{rights, ObjectPal, Pal, PalEntry, Principal};

/// Drive rights for ACL (or mode-triple) bits `r`/`w`.
fn drive_rights(acl_rights: u8) -> u32 {
    let mut r = 0;
    if acl_rights & ACL_READ != 0 {
        r |= rights::READ | rights::GETATTR;
    }
    if acl_rights & ACL_WRITE != 0 {
        r |= rights::WRITE | rights::APPEND | rights::FLUSH | rights::GETATTR;
    }
    r
}

/// How many PAL entries `owner` and the named users of `entries` need.
pub fn pal_len(owner: u32, entries: &[AclEntry]) -> usize {
    let named = entries.iter().filter(|e| matches!(e.who, AclWho::User(u) if u != owner)).count();
    named + 1
}

/// The access PAL of a file with owner, mode and named entries: see the
/// module documentation. At most `PAL_ENTRIES_MAX` entries.
pub fn flatten(uid: u32, mode: u32, entries: &[AclEntry]) -> Pal {
    let mut out = Vec::with_capacity(PAL_ENTRIES_MAX);
    let owner = drive_rights(((mode >> 6) & 0o7) as u8);
    let named_owner = entries.iter().find(|e| e.who == AclWho::User(uid)).map_or(0, |e| drive_rights(e.rights));
    if owner | named_owner != 0 {
        out.push(PalEntry { principal: Principal::User(uid), rights: owner | named_owner });
    }
    for e in entries {
        if out.len() == PAL_ENTRIES_MAX {
            tracing::warn!(
                owner = uid,
                "ACL over PAL_ENTRIES_MAX users: the PAL keeps the first; others use capabilities"
            );
            break;
        }
        if let AclWho::User(u) = e.who {
            let r = drive_rights(e.rights);
            if u != uid && r != 0 {
                out.push(PalEntry { principal: Principal::User(u), rights: r });
            }
        }
    }
    Pal::new(out)
}

impl Manager {
    /// Whether the file system's partition accepts PALs (so files carry them).
    pub(crate) fn pushes_pals(&self) -> bool {
        self.config().auth_scheme.pals()
    }

    /// The access PAL of file `ino` as its ACL now stands.
    pub(crate) async fn pal_of(&self, ino: nasd_proto::fs::Ino) -> Result<ObjectPal, Failure> {
        let info = self.meta(move |ns| ns.get_acl(ino)).await?;
        Ok(ObjectPal { collection: 0, pal: flatten(info.uid, info.mode, &info.entries) })
    }

    /// Flattens `inode`'s ACL and sets it on every component object; returns
    /// once every drive answered. A regular file only; nothing when the
    /// partition takes capabilities alone.
    ///
    /// # Errors
    /// `DRIVE_UNAVAILABLE` naming the drives that did not take the PAL (the
    /// change itself is committed).
    pub(crate) async fn push_pal(&self, inode: &Inode) -> Result<(), Failure> {
        if !self.pushes_pals() || inode.components.is_empty() {
            return Ok(());
        }
        let pal = self.pal_of(inode.attr.ino).await?;
        let ino = inode.attr.ino;
        let mut work = Vec::with_capacity(inode.components.len());
        for c in &inode.components {
            work.push((self.drive(c.object.drive)?, c.object.object));
        }
        let pushes = work.iter().map(|(d, object)| {
            let pal = &pal;
            async move { (d.drive, d.set_pal(*object, pal).await) }
        });
        let failed: Vec<String> = futures::future::join_all(pushes)
            .await
            .into_iter()
            .filter_map(|(drive, r)| r.err().map(|e| format!("drive {drive}: {e}")))
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            tracing::warn!(ino, "PAL not set on every component: {}", failed.join("; "));
            Err(Failure::new(
                FsStatus::DriveUnavailable,
                format!("the change is made but its PAL did not reach every drive ({})", failed.join("; ")),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_proto::acl::{ACL_EXECUTE, ACL_SET_ACL};

    #[test]
    fn owner_and_named_users_flatten_groups_do_not() {
        let e = |who, rights| AclEntry { who, rights, flags: 0 };
        let acl = [e(AclWho::User(7), ACL_READ), e(AclWho::User(8), ACL_EXECUTE | ACL_SET_ACL), e(AclWho::Group(9), 6)];
        let pal = flatten(5, 0o640, &acl);
        let read = rights::READ | rights::GETATTR;
        let write = rights::WRITE | rights::APPEND | rights::FLUSH | rights::GETATTR;
        assert_eq!(pal.rights_for(5, 0), Some(read | write), "the owner triple");
        assert_eq!(pal.rights_for(7, 0), Some(read));
        assert_eq!(pal.rights_for(8, 0), None, "x and c carry nothing to a drive");
        assert_eq!(pal.rights_for(9, 0), None, "groups are not flattened");
        assert_eq!(flatten(5, 0o040, &[]).entries.len(), 0, "an owner without r or w gets no entry");
        assert_eq!(flatten(5, 0o400, &[e(AclWho::User(5), ACL_WRITE)]).rights_for(5, 0), Some(read | write));
        let full: Vec<_> = (100..100 + PAL_ENTRIES_MAX as u32).map(|u| e(AclWho::User(u), ACL_READ)).collect();
        assert_eq!(pal_len(5, &full), PAL_ENTRIES_MAX + 1);
        assert_eq!(flatten(5, 0o600, &full).entries.len(), PAL_ENTRIES_MAX, "cut, never over");
        assert_eq!(flatten(5, 0o600, &full).rights_for(5, 0), Some(read | write), "the owner is kept");
    }
}
