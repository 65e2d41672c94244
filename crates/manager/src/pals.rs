//! A file's global ACL flattened into the access PAL its component objects
//! carry on their drives (DSFS §3.2), pushed there on every change, set
//! again durably after a failed push, and on demand when a drive refuses a
//! client by it (DSFS §3.3).
//!
//! **Flattening.** A PAL names users, roles and everyone; the manager's ACL
//! names the owner (the mode's user triple), the group and others (the
//! other two triples) and named users, groups and roles. The PAL gets the
//! entries a drive can match by the credential alone: the **owner**, with
//! the rights of the owner triple, every **named user** and every **role**,
//! with the rights of its entry (a role entry matches a request whose
//! identity credential carries the role, exactly as the manager's own check
//! matches a session logged in with it), and **everyone**, with the rights
//! the owner, group and other triples all give ([`everyone_rights`]: the
//! manager gives every caller its class's triple and entries only add, so
//! every caller holds those; a world-readable `0644` file is readable from
//! the drives by every identity). `r` becomes `READ|GETATTR`, `w` becomes
//! `WRITE|APPEND|FLUSH|GETATTR`; `x` and `c` carry nothing to a drive; a
//! principal left with no rights, or none beyond everyone's, gets no entry.
//!
//! **Groups are not flattened**, and not folded into roles: a group (the
//! authentication server's, made by users themselves) is a set of users a
//! user is in all at once, a role one the user picks per session, and a
//! credential names one role; a group entry made a role entry would grant
//! nobody (no one acts in a group), and listing its members as users would
//! make a membership change at the authentication server a push to every
//! file naming the group, with no event to drive it. So the rights of the
//! group triple and of group entries, and those of the other triple beyond
//! what the group triple also gives (a mode like `0604`, where the group
//! class is denied what others get: a drive cannot tell a group member from
//! anyone else, so the everyone entry must not carry them), go through
//! capabilities: a partition whose users rely on them runs the scheme
//! `both`, where the client falls back to the capability the manager minted
//! at open when a drive says `NOT_IN_PAL`. Name a role (`nasd acl add
//! role:N:rw`) to give a set of users rights a drive checks by identity.
//!
//! **Overflow.** The owner, everyone, the named users and the roles may be
//! two more than `PAL_ENTRIES_MAX` (an ACL holds `ACL_ENTRIES_MAX` =
//! `PAL_ENTRIES_MAX` named entries). `SET_ACL` refuses such a list up front
//! on a PAL partition (`TOO_BIG`); one reached otherwise (a chown to a user
//! not named, a chmod that gives everyone rights) is cut to the owner,
//! everyone and the first named entries in canonical order (users by uid,
//! then roles) — a PAL grants nothing the ACL does not, and the principals
//! left out go through capabilities.
//!
//! **Push.** On create, after every ACL, mode or owner change, and after
//! `SET_LAYOUT` re-places a file, the manager sets the PAL on every
//! component object (repair and rebalance set it on a new object before it
//! becomes a component) (`SET_PAL` under the drive key, durable when it
//! returns) and answers only once every drive answered: from then on, a
//! request by identity is checked against the new list. Pushes of one PAL
//! take turns (`Manager::pal_turn`: a lock, and a lease on a shared
//! database), each reading the ACL only once it has the turn, so a slower
//! push of an older list (a retry's, another manager's) never lands after
//! a newer one.
//!
//! **Durable retry.** A drive that did not take it makes the request
//! `DRIVE_UNAVAILABLE` (the change is committed) and the file is recorded
//! in the metadata store (`Namespace::pal_undelivered`, table
//! `pal_pending`) before the manager answers. Every maintenance pass, the
//! manager holding the lease [`PAL_LEASE`] (any one, on a shared database;
//! this one, on SQLite) sets the PAL of up to [`PAL_RETRY_BATCH`] recorded
//! files again, as the ACL stands then, and clears a record once every
//! component took it — unless a push failed again meanwhile (the record's
//! sequence number grew). A restart loses nothing; a file removed
//! meanwhile takes its record with it.
//!
//! **On demand** (`REFRESH_PAL`). A client whose request by identity a
//! drive refused with `NOT_IN_PAL` (the drive lost or never got the PAL,
//! or it was changed behind the manager's back) asks the manager for the
//! file with the rights it needed. The manager checks them through the ACL
//! as an open would and, only if granted, sets the PAL again on every
//! component before answering; the client retries once. A refused caller
//! gets `PERMISSION_DENIED` and no drive is written; the file's
//! collection's super PAL is set again on its components' drives as well.
//!
//! **Super PALs** (DSFS §4.1–4.2). Every regular file is a member of the
//! PAL collection of the directory it was created in (`nasd_meta::acl`);
//! its access PAL names that collection, and the directory's **shared**
//! entries (`ACL_SHARED`), flattened as above (users and roles; no owner),
//! are the collection's super PAL, which the drive joins to the access PAL
//! of every member. A change of the shared entries (or the removal of a
//! directory that had some) is recorded in the metadata store in the
//! change's own transaction; the manager then sets the super PAL on every
//! drive in service — one `SET_SUPER_PAL` per drive, however many members —
//! and answers only once each answered, as for access PALs; a drive that
//! did not keeps the record, retried each maintenance pass. A drive the
//! manager meets for the first time in a run gets every super PAL when its
//! scheme is set (`sync_identity_keys`).

use crate::drives::DriveHandle;
use crate::{Failure, Manager};
use nasd_meta::{Inode, PalPush};
use nasd_proto::acl::{AclEntry, AclWho, ACL_READ, ACL_WRITE};
use nasd_proto::fs::{FileKind, FsStatus, Ino};
use nasd_proto::limits::PAL_ENTRIES_MAX;
use nasd_proto::manager::ManagerReply;
use nasd_proto::{rights, ObjectPal, Pal, PalEntry, Principal};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Most recorded files one maintenance pass sets PALs again for (the rest
/// wait for the next pass): bounds a pass's drive requests after a long
/// outage.
pub const PAL_RETRY_BATCH: usize = 256;

/// The lease whose holder retries recorded PAL pushes (one manager at a
/// time on a shared database; if it lapses mid-pass, two may push the same
/// PAL, which is idempotent).
pub const PAL_LEASE: &str = "pals";

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

/// The drive rights of the everyone entry of a file of mode `mode`: those
/// its owner, group and other triples all give. The manager's check gives
/// every caller (but the superuser, who needs none) the triple of its class
/// and named entries only add, so every caller holds these; a right one
/// class lacks is left to the entries and capabilities of those who hold it.
pub fn everyone_rights(mode: u32) -> u32 {
    drive_rights(((mode >> 6) & (mode >> 3) & mode & 0o7) as u8)
}

/// The access PAL entries of a file, uncut, in the order a cut keeps them:
/// the owner, everyone, then the named users and roles in `entries`' order.
/// An entry whose rights everyone's cover is left out (it would grant
/// nothing more).
fn pal_entries(uid: u32, mode: u32, entries: &[AclEntry]) -> Vec<PalEntry> {
    let everyone = everyone_rights(mode);
    let mut out = Vec::with_capacity(PAL_ENTRIES_MAX + 2);
    let owner = drive_rights(((mode >> 6) & 0o7) as u8);
    let named_owner = entries.iter().find(|e| e.who == AclWho::User(uid)).map_or(0, |e| drive_rights(e.rights));
    if (owner | named_owner) & !everyone != 0 {
        out.push(PalEntry { principal: Principal::User(uid), rights: owner | named_owner });
    }
    if everyone != 0 {
        out.push(PalEntry { principal: Principal::Everyone, rights: everyone });
    }
    for e in entries {
        let principal = match e.who {
            AclWho::User(u) if u != uid => Principal::User(u),
            AclWho::Role(r) => Principal::Role(r),
            AclWho::User(_) | AclWho::Group(_) => continue,
        };
        let rights = drive_rights(e.rights);
        if rights & !everyone != 0 {
            out.push(PalEntry { principal, rights });
        }
    }
    out
}

/// How many PAL entries a file owned by `owner` with mode `mode` and named
/// entries `entries` needs, uncut — counting the owner's even when the mode
/// gives it nothing of its own, so a later chmod that does never cuts a
/// named entry.
pub fn pal_len(owner: u32, mode: u32, entries: &[AclEntry]) -> usize {
    let flat = pal_entries(owner, mode, entries);
    let owner_counted = flat.iter().any(|e| e.principal == Principal::User(owner));
    flat.len() + usize::from(!owner_counted)
}

/// The access PAL of a file with owner, mode and named entries: see the
/// module documentation. At most `PAL_ENTRIES_MAX` entries.
pub fn flatten(uid: u32, mode: u32, entries: &[AclEntry]) -> Pal {
    let mut out = pal_entries(uid, mode, entries);
    if out.len() > PAL_ENTRIES_MAX {
        tracing::warn!(
            owner = uid,
            "ACL over PAL_ENTRIES_MAX users and roles: the PAL keeps the first; others use capabilities"
        );
        out.truncate(PAL_ENTRIES_MAX);
    }
    Pal::new(out)
}

/// The super PAL of a collection whose directory has the shared entries
/// `shared`: each named user and each role with its entry's drive rights
/// (groups are not flattened, as for access PALs). At most
/// `ACL_ENTRIES_MAX` = `PAL_ENTRIES_MAX` entries, so it always fits.
pub fn flatten_shared(shared: &[AclEntry]) -> Pal {
    let entries: Vec<PalEntry> = shared
        .iter()
        .filter_map(|e| {
            let principal = match e.who {
                AclWho::User(u) => Principal::User(u),
                AclWho::Role(r) => Principal::Role(r),
                AclWho::Group(_) => return None,
            };
            let rights = drive_rights(e.rights);
            (rights != 0).then_some(PalEntry { principal, rights })
        })
        .collect();
    assert!(entries.len() <= PAL_ENTRIES_MAX, "an ACL holds at most PAL_ENTRIES_MAX entries");
    Pal::new(entries)
}

impl Manager {
    /// Whether the file system's partition accepts PALs (so files carry them).
    pub(crate) fn pushes_pals(&self) -> bool {
        self.config().auth_scheme.pals()
    }

    /// The access PAL of file `ino` as its ACL now stands, naming its
    /// collection.
    pub(crate) async fn pal_of(&self, ino: Ino) -> Result<ObjectPal, Failure> {
        let (info, collection) = self.meta_after_write(move |ns| ns.pal_source(ino)).await?;
        Ok(ObjectPal { collection, pal: flatten(info.uid, info.mode, &info.entries) })
    }

    /// Sets collection `collection`'s super PAL on `drives`; the drives
    /// that did not take it.
    async fn set_super_pal_on(&self, drives: &[Arc<DriveHandle>], collection: Ino, pal: &Pal) -> Vec<String> {
        self.pal_writes.fetch_add(drives.len() as u64, Ordering::Relaxed);
        let pushes = drives.iter().map(|d| async move { (d.drive, d.set_super_pal(collection, pal).await) });
        futures::future::join_all(pushes)
            .await
            .into_iter()
            .filter_map(|(drive, r)| r.err().map(|e| format!("drive {drive}: {e}")))
            .collect()
    }

    /// The drives a super PAL belongs on: every drive in service.
    fn super_pal_drives(&self) -> Vec<Arc<DriveHandle>> {
        self.drives().into_iter().filter(|d| !self.is_out(d.drive)).collect()
    }

    /// Sets the super PAL of each collection in `collections` whose change
    /// is recorded as due, as its shared entries now stand, on every drive
    /// in service, and clears the record once each drive took it (on a
    /// partition without PALs, clears it: no drive holds super PALs).
    ///
    /// # Errors
    /// `DRIVE_UNAVAILABLE` naming the drives that did not take one (the
    /// change is committed and its record kept for the maintenance pass).
    pub(crate) async fn push_super_pals(&self, collections: &[Ino]) -> Result<(), Failure> {
        let mut failed = Vec::new();
        for &collection in collections {
            // Only drive writes need the turn: without PALs the record is merely cleared.
            let _turn = match self.pushes_pals() {
                true => Some(self.pal_turn(PalPush::Collection, collection).await?),
                false => None,
            };
            let Some((seq, shared)) = self.meta_after_write(move |ns| ns.collection_due(collection)).await? else {
                continue; // delivered meanwhile (a maintenance pass, another manager)
            };
            let missed = if self.pushes_pals() {
                self.set_super_pal_on(&self.super_pal_drives(), collection, &flatten_shared(&shared)).await
            } else {
                Vec::new()
            };
            if missed.is_empty() {
                self.meta_after_write(move |ns| ns.pal_delivered(PalPush::Collection, collection, seq)).await?;
            } else {
                tracing::warn!(collection, "super PAL not set on every drive: {}", missed.join("; "));
                failed.extend(missed);
            }
        }
        if failed.is_empty() {
            return Ok(());
        }
        Err(Failure::new(
            FsStatus::DriveUnavailable,
            format!(
                "the change is made but the directory's shared entries did not reach every drive ({}); \
                 set again at the next maintenance pass",
                failed.join("; ")
            ),
        ))
    }

    /// Sets every collection's super PAL on drive `d` (a drive this
    /// manager run meets for the first time). Nothing on a partition
    /// without PALs.
    pub(crate) async fn super_pals_to(&self, d: &Arc<DriveHandle>) -> Result<(), Failure> {
        if !self.pushes_pals() {
            return Ok(());
        }
        let collections = self.meta(|ns| ns.collections()).await?;
        for collection in collections {
            let _turn = self.pal_turn(PalPush::Collection, collection).await?;
            let shared = self.meta(move |ns| ns.collection_entries(collection)).await?;
            let missed = self.set_super_pal_on(std::slice::from_ref(d), collection, &flatten_shared(&shared)).await;
            if let Some(e) = missed.into_iter().next() {
                return Err(Failure::new(FsStatus::DriveUnavailable, e));
            }
        }
        Ok(())
    }

    /// Flattens `inode`'s ACL and sets it on every component object; returns
    /// once every drive answered. A regular file only; nothing when the
    /// partition takes capabilities alone. A push some drive did not take
    /// is recorded in the metadata store and retried ([`Manager::retry_pals`]).
    ///
    /// # Errors
    /// `DRIVE_UNAVAILABLE` naming the drives that did not take the PAL (the
    /// change itself is committed).
    pub(crate) async fn push_pal(&self, inode: &Inode) -> Result<(), Failure> {
        let ino = inode.attr.ino;
        let failed = self.set_pal_everywhere(inode).await?;
        if failed.is_empty() {
            return Ok(());
        }
        tracing::warn!(ino, "PAL not set on every component: {}", failed.join("; "));
        let recorded = match self.meta_after_write(move |ns| ns.pal_undelivered(PalPush::File, ino)).await {
            Ok(()) => "set again at the next maintenance pass".to_string(),
            Err(f) => {
                tracing::error!(ino, error = %f.message, "a failed PAL push is not recorded: not retried");
                format!("and not recorded for a retry ({}): change the file again", f.message)
            }
        };
        Err(Failure::new(
            FsStatus::DriveUnavailable,
            format!("the change is made but its PAL did not reach every drive ({}); {recorded}", failed.join("; ")),
        ))
    }

    /// Sets `inode`'s PAL as its ACL now stands on every component; the
    /// drives that did not take it. Nothing for a file without components
    /// or on a partition without PALs.
    async fn set_pal_everywhere(&self, inode: &Inode) -> Result<Vec<String>, Failure> {
        if !self.pushes_pals() || inode.components.is_empty() {
            return Ok(Vec::new());
        }
        let _turn = self.pal_turn(PalPush::File, inode.attr.ino).await?;
        let pal = self.pal_of(inode.attr.ino).await?;
        let mut work = Vec::with_capacity(inode.components.len());
        for c in &inode.components {
            work.push((self.drive(c.object.drive)?, c.object.object));
        }
        self.pal_writes.fetch_add(work.len() as u64, Ordering::Relaxed);
        let pushes = work.iter().map(|(d, object)| {
            let pal = &pal;
            async move { (d.drive, d.set_pal(*object, pal).await) }
        });
        Ok(futures::future::join_all(pushes)
            .await
            .into_iter()
            .filter_map(|(drive, r)| r.err().map(|e| format!("drive {drive}: {e}")))
            .collect())
    }

    /// Sets the PAL again on every component of each recorded file whose
    /// push failed (a maintenance pass), under the lease [`PAL_LEASE`] on a
    /// shared database, at most [`PAL_RETRY_BATCH`] files; clears a record
    /// once every drive took it. A file gone meanwhile lost its record.
    pub(crate) async fn retry_pals(&self) {
        let held = if self.shared_database() {
            match self.acquire(PAL_LEASE.to_string(), crate::shared::DRIVE_LEASE_TTL).await {
                Ok(Some(held)) => Some(held),
                Ok(None) => return,
                Err(f) => {
                    tracing::warn!(error = %f.message, "PAL retries skipped: lease not taken");
                    return;
                }
            }
        } else {
            None
        };
        match self.meta(move |ns| ns.pals_undelivered(PalPush::File, PAL_RETRY_BATCH)).await {
            Ok(due) => {
                for (ino, seq) in due {
                    self.retry_pal(ino, seq).await;
                }
            }
            Err(f) => tracing::warn!(error = %f.message, "recorded PAL pushes not read"),
        }
        match self.meta(move |ns| ns.pals_undelivered(PalPush::Collection, PAL_RETRY_BATCH)).await {
            Ok(due) => {
                let collections: Vec<Ino> = due.into_iter().map(|(c, _)| c).collect();
                match self.push_super_pals(&collections).await {
                    Ok(()) if !collections.is_empty() => tracing::info!(?collections, "super PALs set again"),
                    Ok(()) => {}
                    Err(f) => tracing::debug!("super PALs still not on every drive: {}", f.message),
                }
            }
            Err(f) => tracing::warn!(error = %f.message, "recorded super PAL pushes not read"),
        }
        if let Some(held) = held {
            self.release(held).await;
        }
    }

    async fn retry_pal(&self, ino: Ino, seq: u64) {
        let inode = match self.meta(move |ns| ns.getattr(ino)).await {
            Ok(inode) => inode,
            Err(f) if f.status == FsStatus::NotFound => {
                let _ = self.meta(move |ns| ns.pal_delivered(PalPush::File, ino, seq)).await;
                return;
            }
            Err(f) => {
                tracing::warn!(ino, error = %f.message, "PAL not retried");
                return;
            }
        };
        match self.set_pal_everywhere(&inode).await {
            Ok(failed) if failed.is_empty() => {
                match self.meta(move |ns| ns.pal_delivered(PalPush::File, ino, seq)).await {
                    Ok(()) => tracing::info!(ino, "PAL set on every component again"),
                    Err(f) => tracing::warn!(ino, error = %f.message, "PAL set again; its record stays for now"),
                }
            }
            Ok(failed) => tracing::debug!(ino, "PAL still not on every component: {}", failed.join("; ")),
            Err(f) => tracing::warn!(ino, error = %f.message, "PAL not retried"),
        }
    }

    /// `REFRESH_PAL` (see the module documentation): `rights` are
    /// `ACL_READ`/`ACL_WRITE` bits, checked by the decoder.
    ///
    /// # Errors
    /// `BAD_REQUEST` on a partition without PALs, `INVALID_ARGUMENT` for
    /// anything but a regular file, `PERMISSION_DENIED` if the ACL does not
    /// grant the caller `rights`, `DRIVE_UNAVAILABLE` as [`Manager::push_pal`].
    pub(crate) async fn refresh_pal(
        &self,
        caller: &nasd_meta::Caller,
        ino: Ino,
        rights: u8,
    ) -> Result<ManagerReply, Failure> {
        if !self.pushes_pals() {
            return Err(Failure::new(
                FsStatus::BadRequest,
                "this file system's partition takes capabilities only: its files carry no PAL",
            ));
        }
        let inode = self.meta(move |ns| ns.getattr(ino)).await?;
        if inode.attr.kind != FileKind::File {
            return Err(Failure::new(FsStatus::InvalidArgument, "only a regular file's objects carry a PAL"));
        }
        let c = caller.clone();
        let (read, write) = (rights & ACL_READ != 0, rights & ACL_WRITE != 0);
        self.meta(move |ns| ns.check_access(&c, ino, read, write)).await?;
        tracing::info!(ino, uid = caller.uid, role = caller.role, "PAL set again on demand");
        let super_pal = self.refresh_super_pal(&inode).await;
        self.push_pal(&inode).await?;
        super_pal?;
        Ok(ManagerReply::Done)
    }

    /// Sets the super PAL of `inode`'s collection, as it now stands, on the
    /// drives of its components (on demand: one of them may have missed it).
    async fn refresh_super_pal(&self, inode: &Inode) -> Result<(), Failure> {
        let ino = inode.attr.ino;
        let (_, collection) = self.meta(move |ns| ns.pal_source(ino)).await?;
        if collection == 0 {
            return Ok(());
        }
        let _turn = self.pal_turn(PalPush::Collection, collection).await?;
        let shared = self.meta(move |ns| ns.collection_entries(collection)).await?;
        let mut drives: Vec<Arc<DriveHandle>> = Vec::new();
        for c in &inode.components {
            if !drives.iter().any(|d| d.drive == c.object.drive) {
                drives.push(self.drive(c.object.drive)?);
            }
        }
        let missed = self.set_super_pal_on(&drives, collection, &flatten_shared(&shared)).await;
        if missed.is_empty() {
            return Ok(());
        }
        Err(Failure::new(
            FsStatus::DriveUnavailable,
            format!("the file's collection's super PAL did not reach every drive ({})", missed.join("; ")),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_proto::acl::{ACL_EXECUTE, ACL_SET_ACL};

    #[test]
    fn owner_named_users_and_roles_flatten_groups_do_not() {
        let e = |who, rights| AclEntry { who, rights, flags: 0 };
        let acl = [e(AclWho::User(7), ACL_READ), e(AclWho::User(8), ACL_EXECUTE | ACL_SET_ACL), e(AclWho::Group(9), 6)];
        let pal = flatten(5, 0o640, &acl);
        let read = rights::READ | rights::GETATTR;
        let write = rights::WRITE | rights::APPEND | rights::FLUSH | rights::GETATTR;
        assert_eq!(pal.rights_for(5, 0), Some(read | write), "the owner triple");
        assert_eq!(pal.rights_for(7, 0), Some(read));
        assert_eq!(pal.rights_for(8, 0), None, "x and c carry nothing to a drive");
        assert_eq!(pal.rights_for(9, 0), None, "groups are not flattened");
        let roles = [e(AclWho::User(7), ACL_READ), e(AclWho::Group(3), ACL_WRITE), e(AclWho::Role(3), ACL_WRITE)];
        let pal = flatten(5, 0o600, &roles);
        assert_eq!(pal.rights_for(8, 3), Some(write), "anyone acting in role 3");
        assert_eq!(pal.rights_for(7, 3), Some(read | write), "user and role entries join");
        assert_eq!(pal.rights_for(8, 0), None, "no role, not named");
        assert_eq!(pal.rights_for(8, 4), None, "another role");
        assert_eq!(pal_len(5, 0o600, &roles), 3, "owner, user 7, role 3; not the group");
        assert_eq!(flatten(5, 0o600, &[e(AclWho::Role(3), ACL_EXECUTE)]).entries.len(), 1, "x gives a role nothing");
        assert_eq!(flatten(5, 0o040, &[]).entries.len(), 0, "an owner without r or w gets no entry");
        assert_eq!(flatten(5, 0o400, &[e(AclWho::User(5), ACL_WRITE)]).rights_for(5, 0), Some(read | write));
        let full: Vec<_> = (100..100 + PAL_ENTRIES_MAX as u32).map(|u| e(AclWho::User(u), ACL_READ)).collect();
        assert_eq!(pal_len(5, 0o600, &full), PAL_ENTRIES_MAX + 1);
        assert_eq!(flatten(5, 0o600, &full).entries.len(), PAL_ENTRIES_MAX, "cut, never over");
        assert_eq!(flatten(5, 0o600, &full).rights_for(5, 0), Some(read | write), "the owner is kept");
        let mut mixed: Vec<_> = (100..100 + PAL_ENTRIES_MAX as u32 - 1).map(|u| e(AclWho::User(u), ACL_READ)).collect();
        mixed.push(e(AclWho::Role(9), ACL_READ));
        assert_eq!(pal_len(5, 0o600, &mixed), PAL_ENTRIES_MAX + 1);
        assert_eq!(flatten(5, 0o600, &mixed).rights_for(1, 9), None, "roles are cut first");
    }

    /// Every caller the manager's check lets read (by mode or entries) may
    /// read by identity what the PAL grants it, and the PAL grants no one
    /// more than the check does: the everyone entry carries only what all
    /// three triples give. Others used to get no entry at all, so a
    /// world-readable file could not be read from the drives on a PALs-only
    /// partition by anyone but its owner.
    #[test]
    fn everyone_gets_what_every_class_of_the_mode_gives() {
        let e = |who, rights| AclEntry { who, rights, flags: 0 };
        let read = rights::READ | rights::GETATTR;
        let write = rights::WRITE | rights::APPEND | rights::FLUSH | rights::GETATTR;
        let pal = flatten(5, 0o644, &[]);
        assert_eq!(pal.rights_for(9, 0), Some(read), "anyone reads a 0644 file");
        assert_eq!(pal.rights_for(5, 0), Some(read | write), "the owner writes it too");
        assert_eq!(pal.entries.len(), 2);
        assert_eq!(flatten(5, 0o666, &[]).rights_for(9, 4), Some(read | write));
        assert_eq!(flatten(5, 0o666, &[]).entries.len(), 1, "the owner has nothing beyond everyone");
        // A class denied what others get: a drive cannot tell its members, so no one gets it.
        assert_eq!(flatten(5, 0o604, &[]).rights_for(9, 0), None, "0604: the group class may not read");
        assert_eq!(flatten(5, 0o064, &[]).rights_for(9, 0), None, "0064: the owner may not read");
        assert_eq!(flatten(5, 0o640, &[]).rights_for(9, 0), None, "0640: others may not read");
        assert_eq!(flatten(5, 0o646, &[]).rights_for(9, 0), Some(read), "0646: all may read, not all write");
        // Entries everyone's rights cover are left out; those that add stay.
        let acl = [e(AclWho::User(7), ACL_READ), e(AclWho::User(8), ACL_WRITE), e(AclWho::Role(3), ACL_READ)];
        let pal = flatten(5, 0o644, &acl);
        assert_eq!(pal.entries.len(), 3, "owner, user 8, everyone");
        assert_eq!(pal.rights_for(8, 0), Some(read | write));
        assert_eq!(pal.rights_for(7, 3), Some(read));
        assert_eq!(pal_len(5, 0o644, &acl), 3);
        assert_eq!(pal_len(5, 0o000, &acl), 4, "the owner is counted whatever the mode");
        assert_eq!(pal_len(5, 0o666, &[]), 2, "the owner and everyone");
        // Cut: the owner and everyone are kept first.
        let full: Vec<_> = (100..100 + PAL_ENTRIES_MAX as u32).map(|u| e(AclWho::User(u), ACL_WRITE)).collect();
        assert_eq!(pal_len(5, 0o644, &full), PAL_ENTRIES_MAX + 2);
        let cut = flatten(5, 0o644, &full);
        assert_eq!(cut.entries.len(), PAL_ENTRIES_MAX);
        assert_eq!(cut.rights_for(1, 0), Some(read), "everyone is kept");
        assert_eq!(cut.rights_for(5, 0), Some(read | write), "the owner is kept");
    }

    /// Over every mode and a caller of each class, with and without a named
    /// entry: what the PAL grants a caller's identity is within what the
    /// manager's check (class triple, plus matching entries) grants it.
    #[test]
    fn a_pal_never_grants_what_the_mode_and_entries_do_not() {
        let e = |who, rights| AclEntry { who, rights, flags: 0 };
        for mode in 0..0o1000 {
            for acl in [vec![], vec![e(AclWho::User(7), ACL_READ)], vec![e(AclWho::Role(3), ACL_WRITE)]] {
                let pal = flatten(5, mode, &acl);
                // (uid, role, class shift): the owner, another user with and without role 3.
                for (uid, role, shift) in [(5, 0, 6), (7, 0, 0), (7, 3, 0), (9, 0, 0), (9, 3, 3), (9, 0, 3)] {
                    let triple = ((mode >> shift) & 0o7) as u8;
                    let by_entries = acl
                        .iter()
                        .filter(|x| x.who == AclWho::User(uid) || (role != 0 && x.who == AclWho::Role(role)))
                        .fold(0, |r, x| r | x.rights);
                    let allowed = drive_rights(triple | by_entries);
                    let granted = pal.rights_for(uid, role).unwrap_or(0);
                    assert_eq!(
                        granted & !allowed,
                        0,
                        "mode {mode:o}, acl {acl:?}, uid {uid} role {role} class {shift}"
                    );
                }
            }
        }
    }

    #[test]
    fn shared_entries_flatten_to_a_super_pal_of_users_and_roles() {
        let e = |who, rights| AclEntry { who, rights, flags: nasd_proto::acl::ACL_SHARED };
        let shared = [e(AclWho::User(7), ACL_READ), e(AclWho::Group(8), ACL_READ), e(AclWho::Role(3), ACL_WRITE)];
        let sup = flatten_shared(&shared);
        assert_eq!(sup.entries.len(), 2, "no group, no owner");
        assert_eq!(sup.rights_for(7, 0), Some(rights::READ | rights::GETATTR));
        assert_eq!(sup.rights_for(9, 3), Some(rights::WRITE | rights::APPEND | rights::FLUSH | rights::GETATTR));
        assert_eq!(sup.rights_for(8, 0), None);
        assert!(flatten_shared(&[e(AclWho::User(7), ACL_EXECUTE)]).is_empty(), "x carries nothing");
        let full: Vec<_> = (0..PAL_ENTRIES_MAX as u32).map(|u| e(AclWho::User(u), ACL_READ)).collect();
        assert_eq!(flatten_shared(&full).entries.len(), PAL_ENTRIES_MAX, "a full ACL fits");
    }
}
