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
//! from then on, a request by identity is checked against the new list. A
//! drive that did not take it makes the request `DRIVE_UNAVAILABLE` (the
//! change is committed) and the file is remembered in memory
//! ([`PAL_PENDING_MAX`]) and pushed again at every maintenance pass until
//! every component has it; a manager restart forgets the list (no durable
//! PAL intent yet).

use crate::{Failure, Manager};
use nasd_meta::Inode;
use nasd_proto::acl::{AclEntry, AclWho, ACL_READ, ACL_WRITE};
use nasd_proto::fs::FsStatus;
use nasd_proto::limits::PAL_ENTRIES_MAX;
use nasd_proto::{rights, ObjectPal, Pal, PalEntry, Principal};

/// Most files the manager remembers whose PAL did not reach every
/// component (to set again at the next maintenance pass). Past it a failed
/// push is only logged.
pub const PAL_PENDING_MAX: usize = 65_536;

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
        let mut pending = self.pal_pending.lock().expect("pal pending lock");
        if failed.is_empty() {
            pending.remove(&ino);
            Ok(())
        } else {
            if pending.len() < PAL_PENDING_MAX {
                pending.insert(ino);
            } else {
                tracing::error!(ino, "PAL_PENDING_MAX files await their PAL: this one is not retried");
            }
            drop(pending);
            tracing::warn!(ino, "PAL not set on every component: {}", failed.join("; "));
            Err(Failure::new(
                FsStatus::DriveUnavailable,
                format!(
                    "the change is made but its PAL did not reach every drive ({}); set again at the next \
                     maintenance pass",
                    failed.join("; ")
                ),
            ))
        }
    }

    /// Sets the PAL again on every component of each file whose last push
    /// failed (a maintenance pass). A file gone meanwhile is forgotten.
    pub(crate) async fn retry_pals(&self) {
        let due: Vec<nasd_meta::Ino> = self.pal_pending.lock().expect("pal pending lock").iter().copied().collect();
        for ino in due {
            match self.meta(move |ns| ns.getattr(ino)).await {
                Ok(inode) => {
                    if self.push_pal(&inode).await.is_ok() {
                        tracing::info!(ino, "PAL set on every component again");
                    }
                }
                Err(f) if f.status == FsStatus::NotFound => {
                    self.pal_pending.lock().expect("pal pending lock").remove(&ino);
                }
                Err(f) => tracing::warn!(ino, error = %f.message, "PAL not retried"),
            }
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
