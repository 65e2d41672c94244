//! One request from a logged-in caller: check it against policy in the
//! metadata store (one transaction), do what drives must do before the reply
//! (revoke, remove, truncate, measure), and mint the capabilities the caller
//! may have.

use crate::drives::{DriveHandle, ATTR_RIGHTS, READ_RIGHTS, WRITE_RIGHTS};
use crate::{Failure, Manager};
use nasd_meta::{Caller, Effects, Inode, SetAttrs};
use nasd_proto::fs::{FileKind, FsStatus, Ino, ObjectRef};
use nasd_proto::manager::{
    set_mask, DriveUsage, Entry, ManagerReply, ManagerRequest, OpenMode, UserInfo, DRIVES_MAX, MANAGER_MESSAGE_MAX,
    READDIR_ENTRIES_MAX, USERS_MAX,
};
use std::sync::atomic::Ordering;

/// Who a connection is, once logged in.
#[derive(Debug, Clone)]
pub struct Session {
    /// User name.
    pub user: String,
    /// Credentials for permission checks.
    pub caller: Caller,
    /// May run administrator requests.
    pub admin: bool,
}

/// A drive did not carry out a size change. Unlike revocations and removals,
/// size changes are not in an intention log: the drive keeps its old length.
fn size_not_changed(drive: u32, e: impl std::fmt::Display) -> Failure {
    Failure::new(
        FsStatus::DriveUnavailable,
        format!("drive {drive} did not answer ({e}); the file's length on the drive is unchanged: try again"),
    )
}

/// A drive changed a file's length but did not make the change durable.
/// Nothing is recorded, and the drive may come back with either length.
fn size_not_durable(drive: u32, e: impl std::fmt::Display) -> Failure {
    Failure::new(
        FsStatus::DriveUnavailable,
        format!("drive {drive} did not make the file's new length durable ({e}); nothing is recorded: try again"),
    )
}

fn drive_unavailable(drive: u32, e: impl std::fmt::Display) -> Failure {
    Failure::new(
        FsStatus::DriveUnavailable,
        format!("drive {drive} did not answer ({e}); the change is recorded and will be finished in the background"),
    )
}

impl Manager {
    /// Checks a login request; the session it opens.
    pub async fn open_session(&self, user: &str, password: &str) -> Result<Session, Failure> {
        let (caller, admin) = self.login(user, password).await?;
        Ok(Session { user: user.to_string(), caller, admin })
    }

    /// Serves one request of a logged-in session. Every file handle it names
    /// is checked first (`BAD_HANDLE`); inode numbers are then the handles'.
    pub async fn handle(&self, s: &Session, req: ManagerRequest) -> Result<ManagerReply, Failure> {
        use ManagerRequest as R;
        self.check_handles(s, &req)?;
        let c = s.caller.clone();
        match req {
            R::Login { .. } => Err(Failure::new(FsStatus::BadRequest, "already logged in")),
            R::Walk { path, follow, open } => {
                let inode = self.meta(move |ns| ns.walk(&c, &path, follow)).await?;
                self.entry(s, inode, open).await
            }
            R::Lookup { parent, name, open } => {
                let inode = self.meta(move |ns| ns.lookup(&c, parent.ino, &name)).await?;
                self.entry(s, inode, open).await
            }
            R::GetAttr { handle, open } => {
                // Like fstat on an open descriptor: the handle proves the inode was reached by name.
                let inode = self.meta(move |ns| ns.getattr(handle.ino)).await?;
                self.entry(s, inode, open).await
            }
            R::ReadDir { dir, after, limit } => self.readdir(s, dir.ino, after, limit).await,
            R::Mkdir { parent, name, mode } => {
                let inode = self.meta(move |ns| ns.mkdir(&c, parent.ino, &name, mode)).await?;
                self.entry(s, inode, OpenMode::None).await
            }
            R::Create { parent, name, mode, exclusive, truncate } => {
                self.create(s, parent.ino, name, mode, exclusive, truncate).await
            }
            R::Symlink { parent, name, target } => {
                let inode = self.meta(move |ns| ns.symlink(&c, parent.ino, &name, &target)).await?;
                self.entry(s, inode, OpenMode::None).await
            }
            R::Link { handle, new_parent, new_name } => {
                // Like Linux's protected_hardlinks, only the owner or someone
                // who may read and write the file may link it.
                let ino = handle.ino;
                let target = self.meta(move |ns| ns.getattr(ino)).await?;
                if c.uid != 0 && c.uid != target.attr.uid {
                    let c2 = c.clone();
                    self.meta(move |ns| ns.check_access(&c2, ino, true, true)).await?;
                }
                let inode = self.meta(move |ns| ns.link(&c, ino, new_parent.ino, &new_name)).await?;
                self.entry(s, inode, OpenMode::None).await
            }
            R::Unlink { parent, name } => {
                let effects = self.meta(move |ns| ns.unlink(&c, parent.ino, &name)).await?;
                self.apply(effects).await.map(|()| ManagerReply::Done)
            }
            R::Rmdir { parent, name } => {
                self.meta(move |ns| ns.rmdir(&c, parent.ino, &name)).await?;
                Ok(ManagerReply::Done)
            }
            R::Rename { parent, name, new_parent, new_name } => {
                let (from, to) = (parent.ino, new_parent.ino);
                let effects = self.meta(move |ns| ns.rename(&c, from, &name, to, &new_name)).await?;
                self.apply(effects).await.map(|()| ManagerReply::Done)
            }
            R::SetAttr { handle, mask, mode, uid, gid, size, atime_ns, mtime_ns } => {
                let pick = |bit: u8| mask & bit != 0;
                let set = SetAttrs {
                    mode: pick(set_mask::MODE).then_some(mode),
                    uid: pick(set_mask::UID).then_some(uid),
                    gid: pick(set_mask::GID).then_some(gid),
                    size: pick(set_mask::SIZE).then_some(size),
                    atime_ns: pick(set_mask::ATIME).then_some(atime_ns),
                    mtime_ns: pick(set_mask::MTIME).then_some(mtime_ns),
                };
                self.setattr(s, handle.ino, set).await
            }
            R::Close { handle } => self.close(s, handle.ino).await,
            R::StatFs => self.statfs().await,
            R::AddUser { name, password, uid, gid, admin } => {
                self.require_admin(s)?;
                self.add_user_next_free(&name, &password, uid, gid, admin).await.map(|()| ManagerReply::Done)
            }
            R::ListUsers => {
                self.require_admin(s)?;
                let users = self.meta(|ns| ns.users()).await?;
                let users = users
                    .into_iter()
                    .take(USERS_MAX)
                    .map(|u| UserInfo { name: u.name, uid: u.uid, gid: u.gid, admin: u.admin })
                    .collect();
                Ok(ManagerReply::Users(users))
            }
            R::SetPassword { name, password } => {
                if name != s.user {
                    self.require_admin(s)?;
                }
                self.set_password(&name, &password).await.map(|()| ManagerReply::Done)
            }
            R::AddDrive { addr, master_key } => {
                self.require_admin(s)?;
                let master = nasd_crypto::Key::from_bytes(master_key);
                let drive = self.add_drive(&addr, &master).await?;
                Ok(ManagerReply::DriveAdded { drive })
            }
        }
    }

    fn require_admin(&self, s: &Session) -> Result<(), Failure> {
        if s.admin {
            Ok(())
        } else {
            Err(Failure::new(FsStatus::NotAdmin, format!("user '{}' is not an administrator", s.user)))
        }
    }

    async fn add_user_next_free(&self, name: &str, pw: &str, uid: u32, gid: u32, admin: bool) -> Result<(), Failure> {
        let uid = if uid == 0 {
            let users = self.meta(|ns| ns.users()).await?;
            let highest = users.iter().map(|u| u.uid).max().unwrap_or(0);
            highest
                .checked_add(1)
                .ok_or_else(|| {
                    Failure::new(
                        FsStatus::InvalidArgument,
                        format!("no uid above {highest} is free: give one explicitly"),
                    )
                })?
                .max(1000)
        } else {
            uid
        };
        let gid = if gid == 0 { uid } else { gid };
        self.add_user(name, pw, uid, gid, admin).await
    }

    async fn set_password(&self, name: &str, password: &str) -> Result<(), Failure> {
        if password.len() < crate::passwords::PASSWORD_MIN {
            return Err(Failure::new(
                FsStatus::InvalidArgument,
                format!("passwords need at least {} characters", crate::passwords::PASSWORD_MIN),
            ));
        }
        let password = password.to_string();
        let hash = self.argon2(move |memory| crate::passwords::hash_with(memory, &password)).await?;
        let name = name.to_string();
        self.meta(move |ns| ns.set_password(&name, &hash)).await
    }

    /// The reply for an inode, with capabilities if asked for and allowed.
    async fn entry(&self, s: &Session, inode: Inode, open: OpenMode) -> Result<ManagerReply, Failure> {
        let access = match open {
            OpenMode::None => None,
            _ => self.access_for(s, &inode, open).await?,
        };
        Ok(ManagerReply::Entry(self.entry_of(s, inode, access)))
    }

    /// The reply form of `inode` for `s`, with its handle for `s`.
    fn entry_of(&self, s: &Session, inode: Inode, access: Option<nasd_proto::manager::Access>) -> Entry {
        let handle_mac = self.handle_for(s, inode.attr.ino).mac;
        Entry { attr: inode.attr, handle_mac, target: inode.target.unwrap_or_default(), access }
    }

    /// Capabilities for `inode` limited to what `s` may do: read-only
    /// callers get read rights only, writers get short-lived write rights.
    /// `ReadWrite` of a file the mode lets the caller write but not read
    /// gives write rights only (POSIX `O_WRONLY`). `ReadIfAllowed` of a file
    /// the caller may not read gives attribute rights only: `stat` asks the
    /// drive for the size and times it shows anyway (POSIX `stat` needs no
    /// permission on the file itself; the handle proves the lookup).
    async fn access_for(
        &self,
        s: &Session,
        inode: &Inode,
        open: OpenMode,
    ) -> Result<Option<nasd_proto::manager::Access>, Failure> {
        if inode.object.is_none() {
            return match (open, inode.attr.kind) {
                (OpenMode::Best | OpenMode::ReadIfAllowed | OpenMode::RefreshWrite, _) => Ok(None),
                (_, FileKind::Dir) => Err(FsStatus::IsDir.into()),
                _ => Err(Failure::new(FsStatus::InvalidArgument, "only regular files have data to open")),
            };
        };
        let may = |read: bool, write: bool| {
            let (c, ino) = (s.caller.clone(), inode.attr.ino);
            self.meta(move |ns| ns.check_access(&c, ino, read, write))
        };
        // knfsd's owner override: a writer refreshing its capability keeps
        // read and write while it owns the file, whatever the mode says (the
        // owner could chmod it anyway), so a file created read-only stays
        // writable for its creator, as an open descriptor would.
        let owner_override = open == OpenMode::RefreshWrite && s.caller.uid == inode.attr.uid;
        let (read, write) = match open {
            OpenMode::None => return Ok(None),
            OpenMode::Read => (may(true, false).await.map(|_| true)?, false),
            OpenMode::ReadWrite => (may(true, false).await.is_ok(), may(false, true).await.map(|_| true)?),
            OpenMode::Best => (may(true, false).await.is_ok(), may(false, true).await.is_ok()),
            OpenMode::ReadIfAllowed if may(true, false).await.is_ok() => (true, false),
            OpenMode::ReadIfAllowed => return self.mint_attr_only(s, inode),
            OpenMode::RefreshWrite if owner_override => (true, true),
            OpenMode::RefreshWrite => (may(true, false).await.is_ok(), may(false, true).await.is_ok()),
        };
        self.mint_for(s, inode, read, write)
    }

    /// A capability for `inode`'s object with read and/or write rights
    /// (none if neither): write capabilities get the short lifetime.
    fn mint_for(
        &self,
        s: &Session,
        inode: &Inode,
        read: bool,
        write: bool,
    ) -> Result<Option<nasd_proto::manager::Access>, Failure> {
        let Some(object) = inode.object else { return Ok(None) };
        if !read && !write {
            return Ok(None);
        }
        let mut rights = 0;
        if read {
            rights |= READ_RIGHTS;
        }
        if write {
            rights |= WRITE_RIGHTS;
        }
        let lifetime = if write { self.config.write_lifetime } else { self.config.read_lifetime };
        let d = self.drive(object.drive)?;
        Ok(Some(d.mint(object.object, inode.acv, rights, lifetime, s.caller.uid as u64)))
    }

    /// A capability for `inode`'s object that allows reading its attributes
    /// and nothing else, with the read-only lifetime.
    fn mint_attr_only(&self, s: &Session, inode: &Inode) -> Result<Option<nasd_proto::manager::Access>, Failure> {
        let Some(object) = inode.object else { return Ok(None) };
        let d = self.drive(object.drive)?;
        let lifetime = self.config.read_lifetime;
        Ok(Some(d.mint(object.object, inode.acv, ATTR_RIGHTS, lifetime, s.caller.uid as u64)))
    }

    /// Fails unless `s` may write `ino` (POSIX `w`; the superuser may).
    async fn require_write(&self, s: &Session, ino: Ino) -> Result<Inode, Failure> {
        let c = s.caller.clone();
        self.meta(move |ns| ns.check_access(&c, ino, false, true)).await
    }

    async fn readdir(&self, s: &Session, dir: Ino, after: String, limit: u16) -> Result<ManagerReply, Failure> {
        // One entry past the page is read to learn whether more follow, and the
        // name space returns at most its own READDIR_ENTRIES_MAX: the page stays
        // below that, or a full page would always report `more: false`.
        let limit = (limit as usize).clamp(1, READDIR_ENTRIES_MAX.min(nasd_meta::READDIR_ENTRIES_MAX - 1));
        let c = s.caller.clone();
        let (found, searchable) = self.meta(move |ns| ns.readdir_searchable(&c, dir, &after, limit + 1)).await?;
        let mut more = found.len() > limit;
        if !searchable {
            // Read without search permission: names and kinds only, no
            // attributes and no handles (a handle proves a name was looked up).
            let names = found.into_iter().take(limit).map(|e| (e.name, e.inode.attr.kind)).collect();
            return Ok(ManagerReply::Names { names, more });
        }
        // The reply must also fit in one message: a page of symlinks with long
        // targets would not. Stop early and say there is more.
        let mut room = MANAGER_MESSAGE_MAX - ManagerReply::DIR_OVERHEAD;
        let mut entries = Vec::with_capacity(found.len().min(limit));
        for e in found.into_iter().take(limit) {
            let entry = self.entry_of(s, e.inode, None);
            let len = 2 + e.name.len() + entry.encoded_len();
            if len > room {
                more = true;
                break;
            }
            room -= len;
            entries.push((e.name, entry));
        }
        Ok(ManagerReply::Dir { entries, more })
    }

    /// The drives in placement order for the next new file (round robin).
    fn placement(&self) -> Vec<u32> {
        let drives = self.drives();
        if drives.is_empty() {
            return Vec::new();
        }
        let start = self.next_drive.fetch_add(1, Ordering::Relaxed) % drives.len();
        (0..drives.len()).map(|i| drives[(start + i) % drives.len()].drive).collect()
    }

    async fn create(
        &self,
        s: &Session,
        parent: Ino,
        name: String,
        mode: u32,
        exclusive: bool,
        truncate: bool,
    ) -> Result<ManagerReply, Failure> {
        if self.drives().is_empty() {
            return Err(Failure::new(
                FsStatus::NoSpace,
                "the manager has no drives: add one with `nasd admin add-drive`",
            ));
        }
        // Held until the truncation is committed (see `truncate_existing`).
        let _serial = if truncate && !exclusive { self.truncate_existing(s, parent, &name).await? } else { None };
        let mut refilled = false;
        let (inode, created) = loop {
            let (c, name, order) = (s.caller.clone(), name.clone(), self.placement());
            match self.meta(move |ns| ns.create(&c, parent, &name, mode, exclusive, truncate, &order)).await {
                Err(f) if f.status == FsStatus::NoSpace && !refilled => {
                    refilled = true;
                    self.refill_all_pools().await;
                }
                Err(f) if f.status == FsStatus::NoSpace => {
                    return Err(Failure::new(FsStatus::NoSpace, "no drive could provide an object for a new file"))
                }
                r => break r?,
            }
        };
        if created {
            // POSIX: the creator's open succeeds whatever mode it gave the new file.
            let access = self.mint_for(s, &inode, true, true)?;
            return Ok(ManagerReply::Entry(self.entry_of(s, inode, access)));
        }
        self.entry(s, inode, OpenMode::ReadWrite).await
    }

    /// Before `CREATE` with truncate commits size 0, empties an existing
    /// file's object on its drive, durably (if the caller may write it), so
    /// a crash in between can only leave the metadata's cached size stale,
    /// never old bytes under a committed truncation. Returns the file's
    /// inode lock, which the caller holds until it has committed: no chmod
    /// or chown of the file can come between the write check here and the
    /// commit (which checks again), so a refused request has not cut data.
    async fn truncate_existing(
        &self,
        s: &Session,
        parent: Ino,
        name: &str,
    ) -> Result<Option<tokio::sync::MutexGuard<'_, ()>>, Failure> {
        let (c, n) = (s.caller.clone(), name.to_string());
        let Ok(existing) = self.meta(move |ns| ns.lookup(&c, parent, &n)).await else {
            return Ok(None); // absent (or not visible): create reports what applies
        };
        let Some(o) = existing.object else { return Ok(None) };
        let serial = self.inode_lock(existing.attr.ino).await;
        self.require_write(s, existing.attr.ino).await?;
        self.resize_object(o, 0).await?;
        Ok(Some(serial))
    }

    /// Sets an object's length on its drive and makes it durable there, so
    /// a drive crash after the metadata records the new size cannot bring
    /// cut bytes back under it (or lose an extension).
    async fn resize_object(&self, o: ObjectRef, size: u64) -> Result<(), Failure> {
        let d = self.drive(o.drive)?;
        d.set_size(o.object, size).await.map_err(|e| size_not_changed(o.drive, e))?;
        d.flush_objects(&[o.object]).await.map_err(|e| size_not_durable(o.drive, e))
    }

    async fn refill_all_pools(&self) {
        for d in self.drives() {
            if let Err(e) = self.refill_pool(&d).await {
                tracing::warn!(drive = d.drive, error = %e, "object pool not refilled");
            }
        }
    }

    async fn setattr(&self, s: &Session, ino: Ino, set: SetAttrs) -> Result<ManagerReply, Failure> {
        let (inode, intent) = {
            // One SETATTR (or truncating CREATE) of an inode at a time, from the
            // check to the commit: a chmod or chown cannot slip in between and
            // make the commit refuse a size change the drive has carried out.
            let _serial = self.inode_lock(ino).await;
            if let Some(size) = set.size {
                // The drive first, as for CREATE with truncate, but only once every
                // part of the request has passed its permission check: a request
                // refused for its mode, owner or times must not have cut the data.
                let (c, checked) = (s.caller.clone(), set.clone());
                let inode = self.meta(move |ns| ns.check_setattr(&c, ino, &checked)).await?;
                if let Some(o) = inode.object {
                    self.resize_object(o, size).await?;
                }
            }
            let c = s.caller.clone();
            self.meta(move |ns| ns.setattr(&c, ino, &set)).await?
        };
        self.apply(Effects { revoke: intent.into_iter().collect(), doomed: Vec::new() }).await?;
        self.entry(s, inode, OpenMode::None).await
    }

    /// Carries out a committed change's revocations and removals on the
    /// drives, durably, before the reply: no capability outlives the call,
    /// and a drive that crashes afterwards cannot bring an old access control
    /// version (or a removed object) back. The intention logs stay until the
    /// maintenance pass forgets them.
    async fn apply(&self, effects: Effects) -> Result<(), Failure> {
        for i in &effects.revoke {
            let d = self.drive(i.object.drive)?;
            let unavailable = |e| drive_unavailable(i.object.drive, e);
            d.set_acv(i.object.object, i.acv).await.map_err(unavailable)?;
            d.flush_objects(&[i.object.object]).await.map_err(unavailable)?;
        }
        let mut flush = std::collections::BTreeSet::new();
        for o in &effects.doomed {
            let d = self.drive(o.drive)?;
            d.remove(o.object).await.map_err(|e| drive_unavailable(o.drive, e))?;
            flush.insert(o.drive);
        }
        for drive in flush {
            self.drive(drive)?.flush().await.map_err(|e| drive_unavailable(drive, e))?;
        }
        Ok(())
    }

    /// A writer is done: record the object's size and modification time as
    /// the drive reports them (never as the client claims).
    async fn close(&self, s: &Session, ino: Ino) -> Result<ManagerReply, Failure> {
        let inode = self.meta(move |ns| ns.getattr(ino)).await?;
        if s.caller.uid != 0 && s.caller.uid != inode.attr.uid {
            // The owner (who may have created it read-only) or a writer only.
            self.require_write(s, ino).await?;
        }
        let Some(o) = inode.object else {
            return self.entry(s, inode, OpenMode::None).await;
        };
        let d: std::sync::Arc<DriveHandle> = self.drive(o.drive)?;
        let attrs = d.getattr(o.object).await.map_err(|e| drive_unavailable(o.drive, e))?;
        let (size, mtime) = (attrs.logical_size, attrs.data_modify_time as i64);
        let inode = self.meta(move |ns| ns.record_size(ino, size, mtime)).await?;
        self.entry(s, inode, OpenMode::None).await
    }

    async fn statfs(&self) -> Result<ManagerReply, Failure> {
        let (inodes, file_bytes) = self.meta(|ns| ns.usage()).await?;
        let mut drives = Vec::new();
        // ADD_DRIVE keeps the table within DRIVES_MAX; a reply over it could not be encoded.
        for d in self.drives().into_iter().take(DRIVES_MAX) {
            let info = d.inquiry().await;
            drives.push(DriveUsage {
                drive: d.drive,
                addr: d.addr.clone(),
                online: info.is_ok(),
                capacity_bytes: info.as_ref().map_or(0, |i| i.capacity_bytes),
                used_bytes: info.as_ref().map_or(0, |i| i.used_bytes),
            });
        }
        Ok(ManagerReply::StatFs { inodes, file_bytes, drives })
    }
}
