//! One request from a logged-in caller: check it against policy in the
//! metadata store (one transaction), do what drives must do before the reply
//! (revoke, remove, truncate, measure), and mint the capabilities the caller
//! may have.

use crate::drives::{DriveHandle, ATTR_RIGHTS, READ_RIGHTS, WRITE_RIGHTS};
use crate::{Failure, Manager};
use nasd_meta::{
    take_pooled, Caller, DriveState, Effects, Inode, Namespace, Placer, QuotaSubject, SetAttrs, Store, Txn, User,
};
use nasd_proto::fs::{FileKind, FsStatus, Ino, ObjectRef};
use nasd_proto::layout::{ComponentState, Layout};
use nasd_proto::manager::{
    set_mask, Change, DriveUsage, Entry, FileAccess, ManagerReply, ManagerRequest, OpenMode, QuotaInfo, QuotaOf,
    UserInfo, DRIVES_MAX, MANAGER_MESSAGE_MAX, READDIR_ENTRIES_MAX, USERS_MAX, WATCH_WAIT_MAX_MS,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Longest a new file's placement keeps refilling the drives' object pools
/// and trying again while concurrent creates take what each refill made
/// (64 clients creating at once drained pools faster than one refill and
/// retry could keep up with, and got `NO_SPACE` from drives with room).
/// Placement fails sooner if a refill round makes no object and a drive
/// could not be refilled: the drives cannot provide them.
pub const PLACEMENT_WAIT_MAX: Duration = Duration::from_secs(30);

/// What one round of pool refills did.
#[derive(Debug, Clone, Copy, Default)]
struct Refilled {
    /// Objects created, all drives together.
    created: usize,
    /// Drives whose refill failed.
    failed: usize,
}

/// Who a connection is, once logged in.
#[derive(Debug, Clone)]
pub struct Session {
    /// User name.
    pub user: String,
    /// Credentials for permission checks: uid, gid and supplementary groups.
    pub caller: Caller,
    /// May run administrator requests.
    pub admin: bool,
    /// The manager's users epoch when the credentials above were read: a
    /// session behind it reloads its user ([`Manager::refresh_session`]).
    pub(crate) users_epoch: u64,
    /// The uid the session's file handles are bound to: its user's, also
    /// while it acts for another (`AS_USER`).
    pub(crate) handle_uid: u32,
    /// The ids the user may act for as a gateway (`AS_USER`), if any.
    pub(crate) gateway: Option<(u32, u32)>,
    /// The identity credential the session logged in with
    /// (`LOGIN_IDENTITY`), if not a password: checked for expiry and a
    /// retired key id before each request.
    pub(crate) identity: Option<nasd_proto::IdentityData>,
    /// When the authentication server last confirmed the identity
    /// session's user (`ManagerConfig::identity_recheck`).
    pub(crate) identity_checked: Option<tokio::time::Instant>,
    /// The routing table version the session routes by (`GET_ROUTING`);
    /// `None`: it never asked, and is never refused as stale
    /// ([`Manager::check_routing`]).
    pub(crate) routing_version: Option<u64>,
    /// The manager protocol version the session logged in with: its
    /// replies carry nothing a later version added
    /// ([`ManagerReply::for_version`]).
    pub(crate) protocol: u8,
}

impl Session {
    /// A session of the manager itself (repair, resize): never refreshed.
    pub(crate) fn internal(user: &str, caller: Caller) -> Session {
        Session {
            user: user.into(),
            handle_uid: caller.uid,
            caller,
            admin: true,
            users_epoch: u64::MAX,
            gateway: None,
            identity: None,
            identity_checked: None,
            routing_version: None,
            protocol: nasd_proto::manager::MANAGER_PROTOCOL_VERSION,
        }
    }

    /// The session of a user who logged in, as of users epoch `epoch`.
    fn of(user: &User, epoch: u64) -> Session {
        Session {
            user: user.name.clone(),
            caller: Caller { uid: user.uid, gid: user.gid, groups: user.groups.clone(), role: 0 },
            admin: user.admin,
            users_epoch: epoch,
            handle_uid: user.uid,
            gateway: user.gateway,
            identity: None,
            identity_checked: None,
            routing_version: None,
            protocol: nasd_proto::manager::MANAGER_PROTOCOL_VERSION,
        }
    }

    /// The session of a user who logged in with an identity key: who the
    /// authentication server says the user is.
    pub(crate) fn of_identity(
        user: &nasd_proto::auth::AuthUser,
        credential: nasd_proto::IdentityData,
        epoch: u64,
    ) -> Session {
        Session {
            user: user.name.clone(),
            caller: Caller { uid: user.uid, gid: user.gid, groups: user.groups.clone(), role: credential.role },
            admin: user.admin,
            users_epoch: epoch,
            handle_uid: user.uid,
            gateway: None,
            identity: Some(credential),
            identity_checked: Some(tokio::time::Instant::now()),
            routing_version: None,
            protocol: nasd_proto::manager::MANAGER_PROTOCOL_VERSION,
        }
    }

    /// The session a gateway's `AS_USER` request runs in: the caller it
    /// names, no administrator rights, the gateway's handles.
    ///
    /// # Errors
    /// `NOT_PERMITTED` unless the session's user holds a gateway grant
    /// covering the uid, the gid and every supplementary group.
    fn acting_for(&self, uid: u32, gid: u32, groups: &[u32]) -> Result<Session, Failure> {
        let Some((lo, hi)) = self.gateway else {
            return Err(Failure::new(
                FsStatus::NotPermitted,
                format!("user '{}' is not a gateway: it may not act for other users", self.user),
            ));
        };
        let outside = std::iter::once(&uid).chain(std::iter::once(&gid)).chain(groups).find(|&&id| id < lo || id > hi);
        if let Some(id) = outside {
            return Err(Failure::new(
                FsStatus::NotPermitted,
                format!("gateway '{}' may act for ids {lo}..={hi} only, not {id}", self.user),
            ));
        }
        Ok(Session {
            user: format!("{} for uid {uid}", self.user),
            caller: Caller { uid, gid, groups: groups.to_vec(), role: 0 },
            admin: false,
            users_epoch: self.users_epoch,
            handle_uid: self.handle_uid,
            gateway: None,
            identity: self.identity,
            identity_checked: self.identity_checked,
            // The wrapping request was checked against the routing table.
            routing_version: None,
            protocol: self.protocol,
        })
    }
}

/// What a request changes if it succeeds, for the change feed: names in
/// directories, and inodes whose attributes or data it moves. (An existing
/// file a `CREATE` truncated is recorded by `create`.)
fn changes_of(req: &ManagerRequest) -> Vec<Change> {
    use ManagerRequest as R;
    let entry = |dir: &nasd_proto::manager::Handle, name: &str| Change::Entry { dir: dir.ino, name: name.to_string() };
    match req {
        R::Mkdir { parent, name, .. }
        | R::Create { parent, name, .. }
        | R::Symlink { parent, name, .. }
        | R::Mknod { parent, name, .. }
        | R::Unlink { parent, name }
        | R::Rmdir { parent, name } => vec![entry(parent, name), Change::Inode(parent.ino)],
        R::Link { handle, new_parent, new_name } => {
            vec![entry(new_parent, new_name), Change::Inode(new_parent.ino), Change::Inode(handle.ino)]
        }
        R::Rename { parent, name, new_parent, new_name } => {
            let mut c = vec![entry(parent, name), entry(new_parent, new_name), Change::Inode(parent.ino)];
            if new_parent.ino != parent.ino {
                c.push(Change::Inode(new_parent.ino));
            }
            c
        }
        R::SetAttr { handle, .. }
        | R::Commit { handle, .. }
        | R::SetXattr { handle, .. }
        | R::RemoveXattr { handle, .. }
        | R::WriteSmall { handle, .. }
        | R::SetAcl { handle, .. } => vec![Change::Inode(handle.ino)],
        _ => Vec::new(),
    }
}

/// A placement the cluster cannot make however full the pools: the layout,
/// and how many drives are in service.
type Shortage = Option<(Layout, usize)>;

/// The placement policy: `layout.components()` distinct drives in service,
/// taken in `order` (round robin from the manager's next drive), skipping
/// drives whose pool is empty, one pooled object from each. `NoSpace` if
/// too few drives have pooled objects; also if too few are in service at
/// all, which it records in `short` (refilling pools cannot help then).
fn placer<'a>(
    order: &'a [u32],
    short: &'a mut Shortage,
) -> impl FnMut(&Layout, &mut dyn Txn) -> Result<Vec<ObjectRef>, FsStatus> + 'a {
    move |layout, t| {
        // A transaction that conflicts runs again, and its placer with it: only the last
        // attempt's shortage counts.
        *short = None;
        let want = layout.components();
        let mut in_service = Vec::with_capacity(order.len());
        for &drive in order {
            if t.get_drive(drive)?.is_some_and(|rec| rec.state == DriveState::In) {
                in_service.push(drive);
            }
        }
        if in_service.len() < want {
            *short = Some((*layout, in_service.len()));
            return Err(FsStatus::NoSpace);
        }
        let mut placed = Vec::with_capacity(want);
        for drive in in_service {
            if placed.len() == want {
                break;
            }
            placed.extend(take_pooled(t, drive)?);
        }
        if placed.len() < want {
            return Err(FsStatus::NoSpace);
        }
        Ok(placed)
    }
}

fn drive_unavailable(drive: u32, e: impl std::fmt::Display) -> Failure {
    Failure::new(
        FsStatus::DriveUnavailable,
        format!("drive {drive} did not answer ({e}); the change is recorded and will be finished in the background"),
    )
}

/// Why `AS_USER` is refused on a partition that accepts PALs only.
pub const GATEWAY_NEEDS_CAPABILITIES: &str =
    "a gateway acting for other users (AS_USER: `nasd mount --allow-other --map-users`) needs capabilities, and \
     this file system's partition accepts PALs only (its drives would check the gateway's own identity, not the \
     user's): set [manager] auth_scheme = \"both\"";

/// Why `ADD_USER` is refused at a manager linked to an authentication
/// server: users are made there.
pub const ADD_USER_AT_AUTH_SERVER: &str =
    "this manager keeps no users of its own: it is linked to an authentication server, which is where users \
     are made: run `nasd auth add-user NAME --uid UID` (as an administrator there)";

/// Why `SET_PASSWORD` is refused at a manager linked to an authentication
/// server: it takes no passwords, so the ones that log in are kept there.
pub const PASSWORDS_AT_AUTH_SERVER: &str =
    "this manager takes no passwords: it is linked to an authentication server, which keeps them: run \
     `nasd auth passwd` to change yours, or `nasd auth passwd USER` as an administrator there";

impl Manager {
    /// Refuses a request about users' passwords where they are not kept:
    /// at a manager linked to an authentication server.
    fn refuse_if_linked(&self, why: &'static str) -> Result<(), Failure> {
        match self.config.auth {
            Some(_) => Err(Failure::new(FsStatus::NotSupported, why)),
            None => Ok(()),
        }
    }

    /// At a manager linked to an authentication server, which makes no
    /// users over the wire (`ADD_USER` is refused), makes the manager's
    /// record of user `name` if it has none: a gateway grant lives there
    /// ([`Manager::open_identity_session`] reads it by name and uid). The
    /// uid and gid are the authentication server's (`USER_BY_NAME`); the
    /// password is random and never shown (this manager takes none).
    /// Unlinked, or with a record already: nothing.
    async fn ensure_linked_user_record(&self, name: &str) -> Result<(), Failure> {
        if self.config.auth.is_none() {
            return Ok(());
        }
        let n = name.to_string();
        if self.meta(move |ns| ns.user(&n)).await?.is_some() {
            return Ok(());
        }
        let n = name.to_string();
        let user = self
            .with_auth(move |c| {
                let n = n.clone();
                Box::pin(async move { c.user_by_name(&n).await })
            })
            .await?;
        let unusable = nasd_crypto::Key::random().to_hex();
        self.add_user_in_groups(&user.name, &unusable, user.uid, user.gid, &[], false).await?;
        tracing::info!(user = name, uid = user.uid, "made the manager's record of an authentication-server user");
        Ok(())
    }

    /// Checks a login request; the session it opens.
    ///
    /// # Errors
    /// `BAD_CREDENTIALS` for a wrong user or password, and always where the
    /// manager is linked to an authentication server (it takes identities
    /// only, `LOGIN_IDENTITY`).
    pub async fn open_session(&self, user: &str, password: &str) -> Result<Session, Failure> {
        if self.config.auth.is_some() {
            return Err(crate::server::password_login_refused(self.config.auth.as_ref()));
        }
        // Read before the user: a change after the read moves the epoch past it.
        let epoch = self.users_epoch();
        let user = self.login(user, password).await?;
        Ok(Session::of(&user, epoch))
    }

    /// Reloads the session's user if users' credentials changed since it
    /// read them (an administrator changed groups): the next request runs
    /// with the new ones, as a Unix process would after a new login.
    ///
    /// # Errors
    /// `NotLoggedIn` if the user no longer exists: the session must end.
    pub async fn refresh_session(&self, s: &mut Session) -> Result<(), Failure> {
        if let Some(id) = &s.identity {
            // Who the user is comes from the authentication server at login;
            // what can end the session is the identity key's life.
            let now = self.env.now_ns();
            if now > id.expiration_ns {
                return Err(Failure::new(FsStatus::NotLoggedIn, "the identity key has expired: log in again"));
            }
            if !self.identity_key_live(id.key_id) {
                return Err(Failure::new(
                    FsStatus::NotLoggedIn,
                    format!("identity key {} is retired: log in again", id.key_id),
                ));
            }
            if self.identity_recheck_due(s.identity_checked) {
                self.recheck_identity(s).await?;
            }
            // The manager's own part of the user (its gateway grant) follows SET_GATEWAY.
            let epoch = self.users_epoch();
            if s.users_epoch != epoch {
                s.gateway = self.gateway_of(&s.user, s.caller.uid).await?;
                s.users_epoch = epoch;
            }
            return Ok(());
        }
        let epoch = self.users_epoch();
        if s.users_epoch == epoch {
            return Ok(());
        }
        let name = s.user.clone();
        let user = self.meta(move |ns| ns.user(&name)).await?;
        let user = user.ok_or_else(|| Failure::new(FsStatus::NotLoggedIn, format!("user '{}' is gone", s.user)))?;
        let routing_version = s.routing_version;
        *s = Session::of(&user, epoch);
        s.routing_version = routing_version;
        Ok(())
    }

    /// Asks the authentication server again about an identity session's
    /// user: gone, disabled, its role taken away or its key id retired ends
    /// the session; its groups and administrator flag are refreshed. An
    /// unreachable server keeps the session as it is until the next check.
    async fn recheck_identity(&self, s: &mut Session) -> Result<(), Failure> {
        let Some(credential) = s.identity else { return Ok(()) };
        let (uid, key_id) = (credential.user, credential.key_id);
        s.identity_checked = Some(tokio::time::Instant::now());
        let (user, key_live) = match self.with_auth(move |c| Box::pin(c.user_info(uid, key_id))).await {
            Ok(r) => r,
            Err(f) if f.status == FsStatus::Busy => {
                tracing::warn!(uid, error = %f.message, "identity not checked again: the authentication server is unreachable");
                return Ok(());
            }
            Err(f) => return Err(Failure::new(FsStatus::NotLoggedIn, f.message)),
        };
        if !key_live {
            return Err(Failure::new(FsStatus::NotLoggedIn, format!("identity key {key_id} is retired: log in again")));
        }
        crate::identity::may_act(&user, &credential)?;
        s.caller.gid = user.gid;
        s.caller.groups = user.groups.clone();
        s.admin = user.admin;
        Ok(())
    }

    /// Serves one request of a logged-in session. Every file handle it names
    /// is checked first (`BAD_HANDLE`); inode numbers are then the handles'.
    /// What a successful request changed goes to the change feed.
    pub async fn handle(&self, s: &Session, req: ManagerRequest) -> Result<ManagerReply, Failure> {
        self.served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.check_routing(s, &req)?;
        let changes = changes_of(&req);
        let reply = self.serve_request(s, req).await?;
        if !changes.is_empty() {
            self.changes.record(changes);
        }
        Ok(reply)
    }

    async fn serve_request(&self, s: &Session, req: ManagerRequest) -> Result<ManagerReply, Failure> {
        use ManagerRequest as R;
        self.check_handles(s, &req)?;
        let c = s.caller.clone();
        match req {
            R::Login { .. } | R::LoginIdentity { .. } => Err(Failure::new(FsStatus::BadRequest, "already logged in")),
            // The server records the version in the session (`Manager::get_routing`); here
            // (a session of the manager's own) the table only.
            R::GetRouting => self.get_routing(&mut s.clone()).await,
            R::SetRouting { table } => self.set_routing(s, table).await,
            R::SyncIdentityKeys => {
                self.require_admin(s)?;
                // Only when an administrator asks: maintenance synchronizes keys too, and
                // must not make every session ask the authentication server again.
                #[cfg(feature = "sim-bugs")]
                if self.env.injected_bug(nasd_env::Bug::SkipIdentityKeySync) {
                    return Ok(ManagerReply::Done);
                }
                self.forget_what_auth_said();
                self.sync_identity_keys().await.map(|()| ManagerReply::Done)
            }
            R::AsUser { uid, gid, groups, request } => {
                if !request.may_run_as_user() {
                    return Err(Failure::new(FsStatus::BadRequest, "AS_USER wraps a name-space or file request only"));
                }
                if !self.config.auth_scheme.capabilities() {
                    // Drives check a request by identity against the PAL of the gateway's own
                    // user, never the user it acts for: only capabilities the manager mints for
                    // that user can carry the user's rights to the drives.
                    return Err(Failure::new(FsStatus::NotSupported, GATEWAY_NEEDS_CAPABILITIES));
                }
                let acting = s.acting_for(uid, gid, &groups)?;
                self.check_acted_for(uid).await?;
                Box::pin(self.handle(&acting, *request)).await
            }
            R::GetQuota { of } => {
                let subject = match of {
                    QuotaOf::User(uid) => {
                        if uid != s.caller.uid {
                            self.require_admin(s)?;
                        }
                        QuotaSubject::User(uid)
                    }
                    QuotaOf::Dir(h) => QuotaSubject::Dir(h.ino),
                };
                let found = self.meta(move |ns| ns.quota(subject)).await?;
                Ok(ManagerReply::Quota(match found {
                    None => QuotaInfo::default(),
                    Some((q, escrow)) => QuotaInfo {
                        exists: true,
                        bytes_limit: q.bytes_limit,
                        files_limit: q.files_limit,
                        bytes_used: q.bytes_used,
                        files_used: q.files_used,
                        escrow,
                    },
                }))
            }
            R::SetQuota { of, bytes_limit, files_limit } => {
                self.require_admin(s)?;
                let subject = match of {
                    QuotaOf::User(uid) => QuotaSubject::User(uid),
                    QuotaOf::Dir(h) => QuotaSubject::Dir(h.ino),
                };
                self.meta(move |ns| ns.set_quota(subject, bytes_limit, files_limit)).await?;
                Ok(ManagerReply::Done)
            }
            R::Mknod { parent, name, kind, mode, rdev } => {
                let inode = self.meta(move |ns| ns.mknod(&c, parent.ino, &name, kind, mode, rdev)).await?;
                self.entry(s, inode, OpenMode::None).await
            }
            R::GetXattr { handle, name } => {
                let value = self.meta(move |ns| ns.getxattr(&c, handle.ino, &name)).await?;
                Ok(ManagerReply::Xattr(value))
            }
            R::ListXattr { handle } => {
                let names = self.meta(move |ns| ns.listxattr(&c, handle.ino)).await?;
                Ok(ManagerReply::XattrNames(names))
            }
            R::SetXattr { handle, name, value, mode } => {
                self.meta(move |ns| ns.setxattr(&c, handle.ino, &name, &value, mode)).await?;
                Ok(ManagerReply::Done)
            }
            R::RemoveXattr { handle, name } => {
                self.meta(move |ns| ns.removexattr(&c, handle.ino, &name)).await?;
                Ok(ManagerReply::Done)
            }
            R::GetAcl { handle } => Ok(ManagerReply::Acl(self.meta(move |ns| ns.get_acl(handle.ino)).await?)),
            R::RefreshPal { handle, rights } => self.refresh_pal(&s.caller, handle.ino, rights).await,
            R::SetAcl { handle, entries } => {
                if self.pushes_pals() {
                    let ino = handle.ino;
                    let attr = self.meta(move |ns| ns.getattr(ino)).await?.attr;
                    if crate::pals::pal_len(attr.uid, attr.mode, &entries) > nasd_proto::limits::PAL_ENTRIES_MAX {
                        return Err(Failure::new(
                            FsStatus::TooBig,
                            format!(
                                "the owner, everyone, the named users and the roles would be more than \
                                 PAL_ENTRIES_MAX ({}) entries of the file's PAL: name a role instead",
                                nasd_proto::limits::PAL_ENTRIES_MAX
                            ),
                        ));
                    }
                }
                let (inode, info, effects) = self.meta(move |ns| ns.set_acl(&c, handle.ino, entries.clone())).await?;
                let revoked = self.apply(effects).await;
                let pushed = self.push_pal(&inode).await;
                revoked?;
                pushed?;
                Ok(ManagerReply::Acl(info))
            }
            R::Watch { incarnation, after, wait_ms } => self.watch(s, incarnation, after, wait_ms).await,
            R::SetGateway { name, ids } => {
                self.require_admin(s)?;
                if ids.is_some() {
                    self.ensure_linked_user_record(&name).await?;
                }
                self.meta_after_write(move |ns| ns.set_gateway(&name, ids)).await.map_err(|f| match f.status {
                    FsStatus::NotFound => Failure::new(FsStatus::NotFound, "no such user"),
                    _ => f,
                })?;
                self.users_changed().await;
                Ok(ManagerReply::Done)
            }
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
                let effects = self.meta(move |ns| ns.rmdir(&c, parent.ino, &name)).await?;
                self.apply(effects).await.map(|()| ManagerReply::Done)
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
                    open_writer: pick(set_mask::OPEN_WRITER),
                    data_bytes: None,
                };
                self.setattr(s, handle.ino, set).await
            }
            R::Commit { handle, txn: 0, .. } => self.close(s, handle.ino).await,
            R::Commit { handle, txn, written_end, missed, dirty } => {
                let inode = self.commit_write(s, handle.ino, txn, written_end, missed, dirty).await?;
                self.entry(s, inode, OpenMode::None).await
            }
            R::BeginWrite { handle } => self.begin_write(s, handle.ino).await,
            R::AbortWrite { handle, txn } => self.abort_write(s, handle.ino, txn).await,
            R::ReadSmall { handle, offset, len } => {
                let bytes = self.meta(move |ns| ns.read_small(&c, handle.ino, offset, len)).await?;
                Ok(ManagerReply::SmallData(bytes))
            }
            R::WriteSmall { handle, txn, offset, data } => {
                let inode = self.write_small(s, handle.ino, txn, offset, data).await?;
                self.entry(s, inode, OpenMode::None).await
            }
            R::GetLayout { handle } => self.get_layout(handle.ino).await,
            R::SetLayout { handle, layout } => self.set_layout(s, handle.ino, layout).await,
            R::ClusterStatus => Ok(ManagerReply::Status(self.cluster_status().await?)),
            R::SetDriveState { drive, state } => {
                self.require_admin(s)?;
                self.set_drive_state(drive, state).await.map(|()| ManagerReply::Done)
            }
            R::Repair { action } => {
                self.require_admin(s)?;
                self.request_repair(action);
                Ok(ManagerReply::Done)
            }
            R::StatFs => self.statfs().await,
            R::Sync => self.sync_metadata().await.map(|()| ManagerReply::Done),
            R::AddUser { name, password, uid, gid, admin, groups } => {
                self.refuse_if_linked(ADD_USER_AT_AUTH_SERVER)?;
                self.require_admin(s)?;
                self.add_user_next_free(&name, &password, uid, gid, &groups, admin).await.map(|()| ManagerReply::Done)
            }
            R::SetUserGroups { name, groups } => {
                self.require_admin(s)?;
                self.meta(move |ns| ns.set_user_groups(&name, &groups)).await.map_err(|f| match f.status {
                    FsStatus::NotFound => Failure::new(FsStatus::NotFound, "no such user"),
                    _ => f,
                })?;
                self.users_changed().await;
                Ok(ManagerReply::Done)
            }
            R::ListUsers => {
                self.require_admin(s)?;
                let users = self.meta(|ns| ns.users()).await?;
                let users = users
                    .into_iter()
                    .take(USERS_MAX)
                    .map(|u| UserInfo {
                        name: u.name,
                        uid: u.uid,
                        gid: u.gid,
                        admin: u.admin,
                        groups: u.groups,
                        gateway: u.gateway,
                    })
                    .collect();
                Ok(ManagerReply::Users(users))
            }
            R::SetPassword { name, password } => {
                self.refuse_if_linked(PASSWORDS_AT_AUTH_SERVER)?;
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

    /// `WATCH`: the change feed after `after`. A session that is neither an
    /// administrator nor a gateway sees a name only in a directory it may
    /// read; a change of a name elsewhere reaches it as a change of the
    /// directory's inode.
    async fn watch(&self, s: &Session, incarnation: u64, after: u64, wait_ms: u32) -> Result<ManagerReply, Failure> {
        let wait = std::time::Duration::from_millis(u64::from(wait_ms.min(WATCH_WAIT_MAX_MS)));
        let mut batch = self.changes.wait(incarnation, after, wait).await;
        if !s.admin && s.gateway.is_none() {
            let dirs: std::collections::BTreeSet<Ino> = batch
                .changes
                .iter()
                .filter_map(|c| match c {
                    Change::Entry { dir, .. } => Some(*dir),
                    Change::Inode(_) => None,
                })
                .collect();
            let c = s.caller.clone();
            let readable = self
                .meta(move |ns| Ok(dirs.into_iter().filter(|d| ns.check_access(&c, *d, true, false).is_ok()).collect()))
                .await?;
            let readable: std::collections::BTreeSet<Ino> = readable;
            for change in &mut batch.changes {
                if let Change::Entry { dir, .. } = change {
                    if !readable.contains(dir) {
                        *change = Change::Inode(*dir);
                    }
                }
            }
        }
        Ok(ManagerReply::Changes {
            incarnation: batch.incarnation,
            next: batch.next,
            lost: batch.lost,
            changes: batch.changes,
        })
    }

    pub(crate) fn require_admin(&self, s: &Session) -> Result<(), Failure> {
        if s.admin {
            Ok(())
        } else {
            Err(Failure::new(FsStatus::NotAdmin, format!("user '{}' is not an administrator", s.user)))
        }
    }

    async fn add_user_next_free(
        &self,
        name: &str,
        pw: &str,
        uid: u32,
        gid: u32,
        groups: &[u32],
        admin: bool,
    ) -> Result<(), Failure> {
        let uid = if uid == 0 {
            let users = self.meta(|ns| ns.users()).await?;
            let highest = users.iter().map(|u| u.uid).max().unwrap_or(0);
            highest
                .checked_add(1)
                .filter(|&next| next != nasd_meta::MANAGER_WRITER_UID)
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
        self.add_user_in_groups(name, pw, uid, gid, groups, admin).await
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
    fn entry_of(&self, s: &Session, inode: Inode, access: Option<FileAccess>) -> Entry {
        let handle = self.handle_for(s, inode.attr.ino, inode.site);
        Entry {
            attr: inode.attr,
            handle_mac: handle.mac,
            site: handle.site,
            target: inode.target.unwrap_or_default(),
            access,
            // Only a listing reads whether the inode has extended attributes.
            no_xattrs: false,
        }
    }

    /// Capabilities for `inode` limited to what `s` may do: read-only
    /// callers get read rights only, writers get short-lived write rights.
    /// `ReadWrite` of a file the mode lets the caller write but not read
    /// gives write rights only (POSIX `O_WRONLY`). `ReadIfAllowed` of a file
    /// the caller may not read gives attribute rights only: `stat` asks the
    /// drive for the size and times it shows anyway (POSIX `stat` needs no
    /// permission on the file itself; the handle proves the lookup).
    async fn access_for(&self, s: &Session, inode: &Inode, open: OpenMode) -> Result<Option<FileAccess>, Failure> {
        if inode.components.is_empty() {
            return match (open, inode.attr.kind) {
                (OpenMode::Best | OpenMode::ReadIfAllowed | OpenMode::RefreshWrite, _) => Ok(None),
                (_, FileKind::Dir) => Err(FsStatus::IsDir.into()),
                _ => Err(Failure::new(FsStatus::InvalidArgument, "only regular files have data to open")),
            };
        };
        let may = |read: bool, write: bool| {
            let (c, ino) = (s.caller.clone(), inode.attr.ino);
            // After a create that committed, an outage is waited out (`meta_after_write`).
            self.meta_after_write(move |ns| ns.check_access(&c, ino, read, write))
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

    /// Capabilities for every component of `inode` with read and/or write
    /// rights (none if neither): write capabilities get the short lifetime.
    fn mint_for(&self, s: &Session, inode: &Inode, read: bool, write: bool) -> Result<Option<FileAccess>, Failure> {
        if inode.components.is_empty() || (!read && !write) {
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
        self.file_access(s, inode, rights, lifetime).map(Some)
    }

    /// The access for every component of a regular file (in component
    /// order, each with its stored state), all minted with `rights` and
    /// `lifetime` under the file's layout and acv, with its small-file
    /// threshold (from the inode row: no other read).
    fn file_access(
        &self,
        s: &Session,
        inode: &Inode,
        rights: u32,
        lifetime: std::time::Duration,
    ) -> Result<FileAccess, Failure> {
        let Some(layout) = inode.layout else {
            return Err(Failure::new(
                FsStatus::Internal,
                format!("inode {} has components but no layout", inode.attr.ino),
            ));
        };
        let epoch = self.epoch();
        let mut components = Vec::with_capacity(inode.components.len());
        // What every component's capability demands (`DriveHandle::min_protection`), together.
        let mut min_protection = self.config.protection;
        // A partition that accepts PALs only refuses every capability: the
        // caller goes under its identity, checked against the PAL pushed on
        // each component, and the reply carries the bindings alone (DSFS: no
        // MAC per object per client at the manager).
        let mint = self.config.auth_scheme.capabilities();
        for c in &inode.components {
            let d = self.drive(c.object.drive)?;
            let mut access = if mint {
                self.minted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                d.mint(c.object.object, inode.acv, rights, lifetime, s.caller.uid as u64, epoch)
            } else {
                d.binding(c.object.object)
            };
            access.state = if self.serving(d.drive) { c.state } else { ComponentState::Down };
            min_protection = min_protection.union(d.min_protection(rights));
            components.push(access);
        }
        Ok(FileAccess {
            layout,
            map_epoch: epoch,
            rights,
            lifetime_ms: lifetime.as_millis().min(u32::MAX as u128) as u32,
            min_protection: min_protection.bits(),
            algorithm: nasd_client::MacAlgorithm::Blake3 as u8,
            small_threshold: inode.small_threshold,
            components,
        })
    }

    /// Capabilities for `inode`'s components that allow reading their
    /// attributes and nothing else, with the read-only lifetime.
    fn mint_attr_only(&self, s: &Session, inode: &Inode) -> Result<Option<FileAccess>, Failure> {
        if inode.components.is_empty() {
            return Ok(None);
        }
        self.file_access(s, inode, ATTR_RIGHTS, self.config.read_lifetime).map(Some)
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
            let entry = Entry { no_xattrs: !e.has_xattrs, ..self.entry_of(s, e.inode, None) };
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
    /// The order in which a new file's drives are tried: every drive that
    /// may take a component, drawn by the placement policy (weighted by free
    /// space and recent placements, spread over failure domains); the
    /// placer takes the first ones that have pooled objects.
    fn placement(&self) -> Vec<u32> {
        let candidates = self.candidates();
        crate::placement::choose(candidates.len(), &candidates, &mut self.env.rng())
            .expect("choosing all candidates always succeeds")
    }

    /// `GET_LAYOUT`.
    pub(crate) async fn get_layout(&self, ino: Ino) -> Result<ManagerReply, Failure> {
        let (layout, explicit) = self.meta(move |ns| ns.effective_layout(ino)).await?;
        let inode = self.meta(move |ns| ns.getattr(ino)).await?;
        let mut components = Vec::with_capacity(inode.components.len());
        for c in &inode.components {
            let addr = self.drive(c.object.drive)?.addr.clone();
            let state = if self.serving(c.object.drive) { c.state } else { ComponentState::Down };
            components.push((nasd_proto::layout::Component { object: c.object, state }, addr));
        }
        Ok(ManagerReply::Layout(nasd_proto::manager::LayoutInfo { layout, explicit, components }))
    }

    /// `SET_LAYOUT`: a directory's layout for new files, or an empty file
    /// re-placed.
    pub(crate) async fn set_layout(
        &self,
        s: &Session,
        ino: Ino,
        layout: Option<Layout>,
    ) -> Result<ManagerReply, Failure> {
        if let Some(l) = layout {
            l.validate().map_err(|e| Failure::new(FsStatus::InvalidArgument, format!("layout {l}: {e}")))?;
            let usable = self.candidates().len();
            if l.components() > usable {
                return Err(Failure::new(
                    FsStatus::NoSpace,
                    format!("layout {l} needs {} drives; {usable} are in service and up", l.components()),
                ));
            }
        }
        let c = s.caller.clone();
        let effects = self.placed(move |ns, place| ns.set_layout(&c, ino, layout, place)).await?;
        self.apply(effects).await?;
        if self.pushes_pals() {
            // A re-placed file's new components get its PAL (a directory has none).
            let inode = self.meta_after_write(move |ns| ns.getattr(ino)).await?;
            self.push_pal(&inode).await?;
        }
        Ok(ManagerReply::Done)
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
        let c = s.caller.clone();
        let (inode, created) =
            self.placed(move |ns, place| ns.create(&c, parent, &name, mode, exclusive, truncate, place)).await?;
        if created {
            let drives: Vec<u32> = inode.components.iter().map(|c| c.object.drive).collect();
            self.recent.lock().expect("recent lock").record(&drives, tokio::time::Instant::now());
            // Its PAL is on every component before the creator hears of it.
            self.push_pal(&inode).await?;
            // POSIX: the creator's open succeeds whatever mode it gave the new file.
            let access = self.mint_for(s, &inode, true, true)?;
            return Ok(ManagerReply::Entry(self.entry_of(s, inode, access)));
        }
        if truncate {
            // An existing file emptied: its data changed (a new file's name is change enough).
            self.changes.record([Change::Inode(inode.attr.ino)]);
        }
        self.entry(s, inode, OpenMode::ReadWrite).await
    }

    /// Before `CREATE` with truncate commits size 0, empties an existing
    /// file's component objects on their drives, durably (if the caller may
    /// write it), so
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
    ) -> Result<Option<crate::shared::InodeGuard<'_>>, Failure> {
        let (c, n) = (s.caller.clone(), name.to_string());
        let Ok(existing) = self.meta(move |ns| ns.lookup(&c, parent, &n)).await else {
            return Ok(None); // absent (or not visible): create reports what applies
        };
        if existing.components.is_empty() {
            return Ok(None);
        }
        let serial = self.inode_lock(existing.attr.ino).await?;
        let ino = existing.attr.ino;
        let set = SetAttrs { size: Some(0), ..SetAttrs::default() };
        let (c, checked) = (s.caller.clone(), set.clone());
        self.meta(move |ns| ns.check_setattr(&c, ino, &checked)).await?;
        self.resize_file(s, ino, set).await?;
        Ok(Some(serial))
    }

    /// Runs `op`, a name-space call that may place components
    /// ([`Namespace::create`], [`Namespace::set_layout`]), with the
    /// placement policy ([`placer`]). Short of pooled objects, it refills
    /// every drive's pool and tries again — as long as refills make objects
    /// (concurrent creates may take them first), within
    /// [`PLACEMENT_WAIT_MAX`]; short of drives in service, it says how many
    /// the layout needs.
    pub(crate) async fn placed<R: Send + 'static>(
        &self,
        op: impl Fn(&Namespace<Store>, &mut Placer<'_>) -> Result<R, FsStatus> + Send + Sync + 'static,
    ) -> Result<R, Failure> {
        let op = Arc::new(op);
        let deadline = Instant::now() + PLACEMENT_WAIT_MAX;
        let mut last_round: Option<Refilled> = None;
        loop {
            let (op, order) = (op.clone(), self.placement());
            // After a truncation this request committed (`truncate_existing`), an outage is
            // waited out; the pool refills below are not the request's changes.
            let (r, short) = self
                .meta_after_write(move |ns| {
                    let mut short = None;
                    let r = op(ns, &mut placer(&order, &mut short));
                    match r {
                        Err(FsStatus::MetadataUnavailable) => Err(FsStatus::MetadataUnavailable),
                        r => Ok((r, short)),
                    }
                })
                .await?;
            match (r, short) {
                (Err(FsStatus::NoSpace), Some((layout, drives))) => {
                    let n = layout.components();
                    return Err(Failure::new(
                        FsStatus::NoSpace,
                        format!("layout {layout} needs {n} drives; the cluster has {drives} in service"),
                    ));
                }
                (Err(FsStatus::NoSpace), None) => {
                    if last_round.is_some_and(|r| r.created == 0 && r.failed > 0) {
                        return Err(Failure::new(
                            FsStatus::NoSpace,
                            "too few drives could provide objects for the file",
                        ));
                    }
                    if Instant::now() >= deadline {
                        return Err(Failure::new(
                            FsStatus::NoSpace,
                            format!(
                                "too few drives could provide objects for the file: concurrent creates took \
                                 every refill for {} s",
                                PLACEMENT_WAIT_MAX.as_secs()
                            ),
                        ));
                    }
                    last_round = Some(Self::bookkeeping(self.refill_all_pools()).await);
                }
                (r, _) => return r.map_err(Failure::from),
            }
        }
    }

    async fn refill_all_pools(&self) -> Refilled {
        let mut round = Refilled::default();
        for d in self.drives() {
            match self.refill_pool(&d).await {
                Ok(n) => round.created += n,
                Err(e) => {
                    round.failed += 1;
                    tracing::warn!(drive = d.drive, error = %e, "object pool not refilled");
                }
            }
        }
        round
    }

    async fn setattr(&self, s: &Session, ino: Ino, set: SetAttrs) -> Result<ManagerReply, Failure> {
        let access_changes = set.changes_access();
        let (inode, intents) = {
            // One SETATTR (or truncating CREATE) of an inode at a time, from the
            // check to the commit: a chmod or chown cannot slip in between and
            // make the commit refuse a size change the drive has carried out.
            // A change of times only takes no turn: it is one transaction that
            // checks and commits, touches no drive, and changes nothing such a
            // commit checks (on a shared database: two lease transactions fewer).
            let _serial = match set.size.is_some() || access_changes {
                true => Some(self.inode_lock(ino).await?),
                false => None,
            };
            // Every part of the request passes its permission check before any
            // data is cut: a request refused for its mode, owner or times must
            // not have changed the file.
            let (c, checked) = (s.caller.clone(), set.clone());
            let inode = self.meta(move |ns| ns.check_setattr(&c, ino, &checked)).await?;
            if set.size.is_some() && !inode.components.is_empty() {
                self.resize_file(s, ino, set).await?
            } else {
                let c = s.caller.clone();
                self.meta(move |ns| ns.setattr(&c, ino, &set)).await?
            }
        };
        // Both run whatever the other's outcome: a drive missing the revocation must not also
        // leave the others with the old PAL.
        let revoked = self.apply(Effects { revoke: intents, doomed: Vec::new(), collections: vec![] }).await;
        let pushed = if access_changes { self.push_pal(&inode).await } else { Ok(()) };
        revoked?;
        pushed?;
        self.entry(s, inode, OpenMode::None).await
    }

    /// Carries out a committed change's revocations and removals on the
    /// drives before the reply: no capability outlives the call. The drive
    /// refuses the old access control version (or the removed object) from
    /// the moment it answers; the disk flush that makes this survive the
    /// drive's crash is the maintenance pass's, one per drive for every
    /// revocation and removal logged since (batched), after which it forgets
    /// the log entries. Until then the logs hold them: a drive that restarts
    /// in between refuses every capability (it fences itself at every start)
    /// until its recovery has carried the logged work out again and
    /// readmitted it (`SET_MAP_EPOCH`, docs/ARCHITECTURE.md "Readmission"),
    /// so a revocation never comes undone (docs/SECURITY.md).
    ///
    /// A drive the manager holds down does not fail the request: the change
    /// is committed and its share of the work is in the logs. The drive is
    /// marked unrecovered, and recovery finishes that share before it
    /// readmits the drive (`SET_MAP_EPOCH`), which after a restart refuses
    /// every capability until then (`cluster.rs`, "Readmission"). A drive
    /// held up that fails its share (it refuses, its store failed, or it does
    /// not answer in time) is marked the same way, and the request fails with
    /// `DRIVE_UNAVAILABLE`, the change committed: that drive may be serving
    /// the old capabilities until its recovery, so the change is not reported
    /// done (nasd-sim's cluster seed 28: a drive whose disk was full refused
    /// the new access control version of a chmod and went on serving reads
    /// under the old one after the chmod returned).
    ///
    /// Then the super PAL of every collection the change touched is set on
    /// the drives ([`Manager::push_super_pals`]): the one part that fails
    /// the request (`DRIVE_UNAVAILABLE`, the change committed and recorded
    /// for a retry), as a missed access PAL does.
    pub(crate) async fn apply(&self, effects: Effects) -> Result<(), Failure> {
        /// Per drive: objects to revoke (object, acv) and objects to remove.
        type DriveWork = (Vec<(u64, u64)>, Vec<u64>);
        let mut by_drive: std::collections::BTreeMap<u32, DriveWork> = Default::default();
        #[cfg(feature = "sim-bugs")]
        let effects = if self.env.injected_bug(nasd_env::Bug::SkipRevocation) {
            // The revocations stay in the log for the next maintenance pass.
            Effects { revoke: Vec::new(), ..effects }
        } else {
            effects
        };
        for i in &effects.revoke {
            by_drive.entry(i.object.drive).or_default().0.push((i.object.object, i.acv));
        }
        for o in &effects.doomed {
            by_drive.entry(o.drive).or_default().1.push(o.object);
        }
        if !by_drive.is_empty() {
            self.durable_before_drive_effects().await?;
        }
        let mut work = Vec::with_capacity(by_drive.len());
        for (drive, (revoke, remove)) in by_drive {
            work.push((self.drive(drive)?, revoke, remove));
        }
        let done = work.into_iter().map(|(d, revoke, remove)| async move {
            if !self.is_up(d.drive) {
                return (d, Err(None));
            }
            let r = async {
                for &(object, acv) in &revoke {
                    d.set_acv(object, acv).await?;
                }
                for &object in &remove {
                    d.remove(object).await?;
                }
                Ok::<(), crate::drives::DriveError>(())
            }
            .await;
            (d, r.map_err(|e| Some((e.to_string(), e.unreachable()))))
        });
        // Drives held up that did not take their share — they refused (a full disk, say)
        // or did not answer in time — may serve the old capabilities until their
        // recovery, so the change is not reported done. A drive that could not be reached
        // at all (its connection refused or broken: it just died, and the manager has not
        // marked it down yet) is left to its recovery, as a drive down is.
        let mut missed = Vec::new();
        for (d, r) in futures::future::join_all(done).await {
            if let Err(e) = r {
                let error = e.as_ref().map_or("down", |(text, _)| text.as_str());
                tracing::info!(drive = d.drive, error, "revocations and removals on a drive left to its recovery");
                d.set_unrecovered();
                if e.is_some_and(|(_, unreachable)| !unreachable) {
                    missed.push(d.drive.to_string());
                }
            }
        }
        let pushed = self.push_super_pals(&effects.collections).await;
        if !missed.is_empty() {
            return Err(Failure::new(
                FsStatus::DriveUnavailable,
                format!(
                    "drive {} did not take the revocation (or removal) this change needs: the change is made, and \
                     the drive refuses the old capabilities once the manager's recovery has carried it out there",
                    missed.join(", ")
                ),
            ));
        }
        pushed
    }

    /// A writer is done (`COMMIT` with txn 0): record a single-component
    /// file's size and modification time as its drive reports them (never
    /// as the client claims). Files of several components are committed
    /// under a write transaction instead.
    async fn close(&self, s: &Session, ino: Ino) -> Result<ManagerReply, Failure> {
        let inode = self.meta(move |ns| ns.getattr(ino)).await?;
        if s.caller.uid != 0 && s.caller.uid != inode.attr.uid {
            // The owner (who may have created it read-only) or a writer only.
            self.require_write(s, ino).await?;
        }
        let o = match &inode.components[..] {
            [] => return self.entry(s, inode, OpenMode::None).await,
            [only] => only.object,
            _ => {
                return Err(Failure::new(
                    FsStatus::InvalidArgument,
                    "a file of several components is committed under its write transaction, not with txn 0",
                ))
            }
        };
        let d: std::sync::Arc<DriveHandle> = self.drive(o.drive)?;
        let attrs = d.getattr(o.object).await.map_err(|e| drive_unavailable(o.drive, e))?;
        let (size, mtime) = (attrs.logical_size, attrs.data_modify_time as i64);
        let stored = attrs.blocks_allocated.saturating_mul(u64::from(attrs.block_size));
        let inode = self.meta(move |ns| ns.record_size(ino, size, stored, mtime)).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_meta::{Backend, DriveRecord};

    fn obj(drive: u32, object: u64) -> ObjectRef {
        ObjectRef { drive, partition: 1, object }
    }

    /// Drives 0..4, objects pooled on all but drive 1.
    fn cluster() -> Namespace<nasd_meta::Sqlite> {
        let ns = Namespace::new(nasd_meta::Sqlite::open_in_memory().unwrap(), Layout::SINGLE).unwrap();
        for d in 0..4u32 {
            let rec = DriveRecord {
                drive: d,
                drive_id: [d as u8; 16],
                addr: format!("127.0.0.1:{}", 7000 + d),
                partition: 1,
                sealed_keys: vec![],
                capacity_bytes: 1 << 30,
                failure_domain: String::new(),
                state: DriveState::In,
            };
            ns.add_drive(&rec).unwrap();
            if d != 1 {
                ns.pool_add(&[obj(d, 10), obj(d, 11)]).unwrap();
            }
        }
        ns
    }

    fn place(ns: &Namespace<nasd_meta::Sqlite>, order: &[u32], layout: &str) -> (Result<Vec<u32>, FsStatus>, Shortage) {
        let layout = Layout::parse(layout).unwrap();
        let (mut short, mut placed) = (None, None);
        // Rolled back, so every call sees the same pools.
        let _ = ns.backend().transact(|t| -> Result<(), FsStatus> {
            placed = Some(placer(order, &mut short)(&layout, t));
            Err(FsStatus::Busy)
        });
        (placed.unwrap().map(|objects| objects.iter().map(|o| o.drive).collect()), short)
    }

    #[test]
    fn placement_takes_distinct_drives_in_order_past_empty_pools_and_drives_out_of_service() {
        let ns = cluster();
        assert_eq!(place(&ns, &[2, 3, 0, 1], "rs:2+1"), (Ok(vec![2, 3, 0]), None), "the order given");
        assert_eq!(place(&ns, &[1, 2, 3, 0], "rs:2+1"), (Ok(vec![2, 3, 0]), None), "drive 1's pool is empty");
        assert_eq!(place(&ns, &[3, 0], "stripe:1"), (Ok(vec![3]), None));
        ns.set_drive_state(3, nasd_meta::DriveState::Out).unwrap();
        let stripe2 = Layout::parse("stripe:2").unwrap();
        assert_eq!(place(&ns, &[3, 1, 0, 2], "stripe:2"), (Ok(vec![0, 2]), None), "drive 3 is out of service");
        assert_eq!(place(&ns, &[0, 1, 2, 3], "rs:2+1"), (Err(FsStatus::NoSpace), None), "pools short: refill helps");
        let (r, short) = place(&ns, &[0, 1, 2, 3], "stripe:4");
        assert_eq!(
            (r, short),
            (Err(FsStatus::NoSpace), Some((Layout { scheme: nasd_meta::Scheme::Stripe { width: 4 }, ..stripe2 }, 3))),
            "too few drives in service: refilling cannot help"
        );
    }
}
