//! Identities from the authentication server (DSFS §3.1) at the manager:
//! the shared keys K it fetches and installs on its drives, and the
//! `LOGIN_IDENTITY` check that lets a client in with an identity key
//! instead of a password.
//!
//! The manager logs in to the authentication server with a service token
//! ([`AuthLink`]) and keeps one connection to it. `IDENTITY_KEYS` gives the
//! live shared keys and the highest key id ever made; [`Manager::sync_identity_keys`]
//! installs the live ones on every drive (`SET_IDENTITY_KEY`, ascending ids)
//! and retires every other id up to the highest (`RETIRE_IDENTITY_KEY`).
//! It runs at each maintenance pass and on an administrator's
//! `SYNC_IDENTITY_KEYS`, which returns only once every drive has answered.
//!
//! The link is the database's (setting [`AUTH_LINK_SETTING`], sealed under
//! `manager.key`): a manager configured with one records it, and a manager
//! started without one on a database that holds one takes it as its own
//! ([`settle_link`]), so once one manager of a database is linked every
//! manager of it refuses passwords. Several authentication servers are
//! tried in order ([`AuthLink::addrs`]); the connection stays with the one
//! that answered.
//!
//! `LOGIN_IDENTITY` (credential and a proof derived one-way from `idkey`) is
//! checked against the manager's copy of K and the expiry, and — one
//! `USER_INFO` round trip over the one service connection, no argon2 — the
//! user being enabled and the key id still live; the session's uid, gid,
//! groups, role and administrator flag are the authentication server's, and
//! it ends at the first request after expiry or retirement. Identity logins
//! need the authentication server up (`BUSY` otherwise); open sessions and
//! the drives do not. A linked manager refuses password `LOGIN`, and
//! `ADD_USER`/`SET_PASSWORD` (users live at the authentication server); it
//! makes a user record only for `SET_GATEWAY`, from the authentication
//! server's user of that name (`USER_BY_NAME`).

use crate::{Failure, Manager};
use nasd_crypto::{ct_eq, identity_key, identity_login_proof, Key};
use nasd_login::auth_client::{connector_from_pem, AuthClient, AuthError};
use nasd_proto::auth::AuthUser;
use nasd_proto::fs::FsStatus;
use nasd_proto::IdentityData;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, RwLock};

/// Where the manager's authentication servers are, and how it logs in there.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthLink {
    /// `host:port` of each, tried in this order (1..=[`AUTH_SERVERS_MAX`]).
    pub addrs: Vec<String>,
    /// The name their TLS certificates carry.
    pub server_name: String,
    /// The CA certificate(s), PEM, that signed theirs (at most [`AUTH_CA_PEM_MAX`] bytes).
    pub ca_pem: Vec<u8>,
    /// The service token they were given.
    pub token: Key,
}

impl std::fmt::Debug for AuthLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthLink")
            .field("addrs", &self.addrs)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// Most authentication servers one link names.
pub const AUTH_SERVERS_MAX: usize = 16;
/// Largest CA certificate file a link carries, in bytes.
pub const AUTH_CA_PEM_MAX: usize = 16 * 1024;
/// The metadata setting that holds the link, sealed under `manager.key`.
pub const AUTH_LINK_SETTING: &str = "auth_link";
/// What the sealed link is bound to.
const AUTH_LINK_CONTEXT: &[u8] = b"nasd manager auth link v1";
/// Version byte of the link's encoding.
const AUTH_LINK_VERSION: u8 = 1;

impl AuthLink {
    /// A link to the servers `addrs` (tried in order), whose certificates
    /// carry `server_name` and were signed by the CA in the PEM file `ca_cert`.
    ///
    /// # Errors
    /// No address, more than [`AUTH_SERVERS_MAX`], an address over
    /// `MANAGER_ADDR_MAX` bytes, or a CA file that cannot be read or is over
    /// [`AUTH_CA_PEM_MAX`].
    pub fn new(addrs: Vec<String>, server_name: String, ca_cert: &std::path::Path, token: Key) -> anyhow::Result<Self> {
        let ca_pem = std::fs::read(ca_cert)
            .map_err(|e| anyhow::anyhow!("cannot read the authentication server's CA {}: {e}", ca_cert.display()))?;
        let link = AuthLink { addrs, server_name, ca_pem, token };
        link.check()?;
        Ok(link)
    }

    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (1..=AUTH_SERVERS_MAX).contains(&self.addrs.len()),
            "an authentication link names 1 to {AUTH_SERVERS_MAX} servers"
        );
        let max = nasd_proto::routing::MANAGER_ADDR_MAX;
        anyhow::ensure!(
            self.addrs.iter().chain([&self.server_name]).all(|a| !a.is_empty() && a.len() <= max),
            "authentication server addresses and names are 1 to {max} bytes"
        );
        anyhow::ensure!(
            !self.ca_pem.is_empty() && self.ca_pem.len() <= AUTH_CA_PEM_MAX,
            "the authentication server's CA certificate is empty or over {AUTH_CA_PEM_MAX} bytes"
        );
        Ok(())
    }

    /// The addresses, for messages: `a, b`.
    pub fn servers(&self) -> String {
        self.addrs.join(", ")
    }

    fn encode(&self) -> Vec<u8> {
        let mut w = nasd_proto::codec::Writer::with_capacity(64 + self.ca_pem.len());
        w.u8(AUTH_LINK_VERSION).u16(self.addrs.len() as u16);
        for a in &self.addrs {
            w.str(a);
        }
        w.str(&self.server_name).bytes(&self.ca_pem).raw(self.token.expose());
        w.into_vec()
    }

    fn decode(bytes: &[u8]) -> anyhow::Result<Self> {
        let max = nasd_proto::routing::MANAGER_ADDR_MAX;
        let mut r = nasd_proto::codec::Reader::new(bytes);
        let version = r.u8()?;
        anyhow::ensure!(version == AUTH_LINK_VERSION, "authentication link version {version} is unknown");
        let n = r.count(AUTH_SERVERS_MAX, "addrs")?;
        let addrs = (0..n).map(|_| r.str(max, "addr")).collect::<Result<Vec<_>, _>>()?;
        let server_name = r.str(max, "server_name")?;
        let ca_pem = r.bytes(AUTH_CA_PEM_MAX, "ca_pem")?.to_vec();
        let token = Key::from_bytes(r.array()?);
        r.finish()?;
        let link = AuthLink { addrs, server_name, ca_pem, token };
        link.check()?;
        Ok(link)
    }
}

/// The manager's link as the database and its configuration settle it:
/// `configured` is recorded in `ns` (sealed under `kek`) and returned; with
/// none configured, the one recorded by a manager before, if any.
///
/// # Errors
/// The recorded link does not open under `kek` (another file system's key?)
/// or does not decode; the database fails.
pub fn settle_link(
    ns: &nasd_meta::Namespace<nasd_meta::Store>,
    kek: &Key,
    configured: Option<AuthLink>,
) -> anyhow::Result<Option<AuthLink>> {
    let stored = ns
        .setting(AUTH_LINK_SETTING)
        .map_err(|s| anyhow::anyhow!("cannot read the authentication link from the metadata: {}", s.describe()))?;
    let recorded = match &stored {
        None => None,
        Some(sealed) => {
            let plain = nasd_crypto::open(kek, AUTH_LINK_CONTEXT, sealed).map_err(|_| {
                anyhow::anyhow!(
                    "the authentication link in the metadata does not open with {}: wrong key file for this database?",
                    crate::KEK_FILE
                )
            })?;
            Some(
                AuthLink::decode(&plain)
                    .map_err(|e| anyhow::anyhow!("the authentication link in the metadata: {e}"))?,
            )
        }
    };
    match configured {
        None => {
            if let Some(link) = &recorded {
                tracing::info!(servers = %link.servers(), "linked to the authentication server the metadata database names");
            }
            Ok(recorded)
        }
        Some(link) => {
            if recorded.as_ref() != Some(&link) {
                let sealed = nasd_crypto::seal(kek, AUTH_LINK_CONTEXT, &link.encode());
                ns.set_setting(AUTH_LINK_SETTING, &sealed).map_err(|s| {
                    anyhow::anyhow!("cannot record the authentication link in the metadata: {}", s.describe())
                })?;
            }
            Ok(Some(link))
        }
    }
}

/// What the manager knows of the shared keys, and of each drive's.
#[derive(Default)]
pub(crate) struct IdentityState {
    conn: tokio::sync::Mutex<Option<AuthClient>>,
    keys: RwLock<SharedKeys>,
    /// Per drive number: the key ids known installed there, and those known retired.
    drives: Mutex<HashMap<u32, DriveIds>>,
    /// One synchronization at a time.
    sync: tokio::sync::Mutex<()>,
    /// Per uid a gateway acted for (`AS_USER`): when the authentication
    /// server was last asked, and whether that user may act.
    acted_for: Mutex<HashMap<u32, ActedFor>>,
    /// When an administrator last said users changed at the authentication
    /// server (`SYNC_IDENTITY_KEYS`): identity sessions confirmed before it
    /// are confirmed again at their next request.
    users_told_changed: Mutex<Option<tokio::time::Instant>>,
    /// Drives out of service that a synchronization passed by unsynchronized,
    /// each said once until it is synchronized or back in service.
    passed_out: Mutex<BTreeSet<u32>>,
}

/// The longest the manager trusts its last answer on whether a user a
/// gateway acts for (`AS_USER`) is enabled: a user disabled at the
/// authentication server is refused through every gateway within this long
/// (within [`crate::ManagerConfig::identity_recheck`] if that is shorter).
pub const ACTED_FOR_RECHECK_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// Most users whose answer [`ACTED_FOR_RECHECK_MAX`] remembers; past it the
/// answers are forgotten and asked again.
pub const ACTED_FOR_REMEMBERED_MAX: usize = 4096;

/// One remembered answer on a user a gateway acts for.
#[derive(Clone)]
struct ActedFor {
    asked: std::time::Instant,
    /// `Some(why)`: the user may not act.
    refused: Option<String>,
}

#[derive(Default)]
struct SharedKeys {
    high: u32,
    live: BTreeMap<u32, Key>,
}

#[derive(Default, Clone)]
struct DriveIds {
    installed: BTreeSet<u32>,
    retired: BTreeSet<u32>,
    /// The partition's authorization scheme was set to the configured one.
    scheme_set: bool,
    /// Every collection's super PAL was set (`Manager::super_pals_to`).
    super_pals_set: bool,
}

/// A service login at the first of `link`'s servers that answers; a
/// refusal (a wrong token) ends it at once.
async fn service_login(env: &nasd_env::Env, link: &AuthLink) -> Result<AuthClient, AuthError> {
    let tls = connector_from_pem(&link.ca_pem, "the authentication server's CA")?;
    let mut last = None;
    for addr in &link.addrs {
        match AuthClient::service_login_in(env, addr, &link.server_name, &tls, &link.token).await {
            Ok(c) => return Ok(c),
            Err(e @ AuthError::Refused { .. }) => return Err(e),
            Err(e) => {
                tracing::debug!(%addr, error = %e, "authentication server unreachable; trying the next");
                last = Some(e);
            }
        }
    }
    Err(last.expect("a link names at least one server"))
}

fn auth_failure(e: AuthError) -> Failure {
    match e {
        AuthError::Refused { status, message } => Failure::new(status, format!("authentication server: {message}")),
        other => Failure::new(FsStatus::Busy, format!("the authentication server is unavailable: {other}")),
    }
}

impl Manager {
    fn auth_link(&self) -> Result<&AuthLink, Failure> {
        self.config.auth.as_ref().ok_or_else(|| {
            Failure::new(
                FsStatus::BadRequest,
                "this manager has no authentication server ([manager] auth, or a link another manager of its \
                 database recorded)",
            )
        })
    }

    /// Runs `f` on the service connection to the authentication server,
    /// logging in first if there is none; a connection that broke is
    /// replaced once.
    pub(crate) async fn with_auth<R>(
        &self,
        f: impl for<'a> Fn(&'a mut AuthClient) -> futures::future::BoxFuture<'a, Result<R, AuthError>>,
    ) -> Result<R, Failure> {
        let link = self.auth_link()?;
        let mut slot = self.identity.conn.lock().await;
        for attempt in 0..2 {
            if slot.is_none() {
                *slot = Some(service_login(&self.env, link).await.map_err(auth_failure)?);
            }
            let c = slot.as_mut().expect("connected above");
            match f(c).await {
                Ok(r) => return Ok(r),
                Err(e @ AuthError::Refused { .. }) => return Err(auth_failure(e)),
                Err(e) => {
                    *slot = None;
                    if attempt == 1 {
                        return Err(auth_failure(e));
                    }
                }
            }
        }
        unreachable!("two attempts return")
    }

    /// Fetches the live shared keys into the manager's cache.
    async fn refresh_shared_keys(&self) -> Result<(), Failure> {
        let (high, keys) = self.with_auth(|c| Box::pin(c.identity_keys())).await?;
        let live = keys.into_iter().map(|k| (k.key_id, Key::from_bytes(k.key))).collect();
        *self.identity.keys.write().expect("identity keys lock") = SharedKeys { high, live };
        Ok(())
    }

    /// The live shared key `key_id`, fetching the keys once if the cache
    /// has never heard of it.
    async fn shared_key(&self, key_id: u32) -> Result<Option<Key>, Failure> {
        {
            let k = self.identity.keys.read().expect("identity keys lock");
            if let Some(key) = k.live.get(&key_id) {
                return Ok(Some(key.clone()));
            }
            if key_id <= k.high {
                return Ok(None);
            }
        }
        self.refresh_shared_keys().await?;
        Ok(self.identity.keys.read().expect("identity keys lock").live.get(&key_id).cloned())
    }

    /// True if the manager last heard that `key_id` is live.
    pub(crate) fn identity_key_live(&self, key_id: u32) -> bool {
        self.identity.keys.read().expect("identity keys lock").live.contains_key(&key_id)
    }

    /// Fetches the shared keys from the authentication server and brings
    /// every drive up to date: the partition's authorization scheme set to
    /// `ManagerConfig::auth_scheme` and every collection's super PAL (once
    /// per drive and manager run), live keys installed in ascending id
    /// order, every other id up to the highest retired. Returns once every drive
    /// answered; a drive that did not is named in the error (and caught up
    /// at a later pass) — unless it is out of service, which is passed by
    /// (not tried while down) and said once ([`Manager::passed_out_of_service`]).
    pub async fn sync_identity_keys(&self) -> Result<(), Failure> {
        let _one = self.identity.sync.lock().await;
        self.refresh_shared_keys().await?;
        let (high, live): (u32, Vec<(u32, Key)>) = {
            let k = self.identity.keys.read().expect("identity keys lock");
            (k.high, k.live.iter().map(|(id, key)| (*id, key.clone())).collect())
        };
        let mut failed = Vec::new();
        for d in self.drives() {
            let out = self.is_out(d.drive);
            if out && !self.is_up(d.drive) {
                self.passed_out_of_service(d.drive, "it does not answer");
                continue;
            }
            let mut ids =
                self.identity.drives.lock().expect("identity drives lock").get(&d.drive).cloned().unwrap_or_default();
            let r: Result<(), crate::drives::DriveError> = async {
                if !ids.scheme_set {
                    d.set_auth_scheme(self.config().auth_scheme).await?;
                    ids.scheme_set = true;
                }
                for (id, key) in &live {
                    if !ids.installed.contains(id) {
                        d.set_identity_key(*id, key).await?;
                        ids.installed.insert(*id);
                    }
                }
                for id in 1..=high {
                    if !live.iter().any(|(l, _)| *l == id) && !ids.retired.contains(&id) {
                        d.retire_identity_key(id).await?;
                        ids.installed.remove(&id);
                        ids.retired.insert(id);
                    }
                }
                Ok(())
            }
            .await;
            let mut r = r.map_err(|e| e.to_string());
            if r.is_ok() && !ids.super_pals_set {
                r = self.super_pals_to(&d).await.map_err(|f| f.message);
                ids.super_pals_set = r.is_ok();
            }
            self.identity.drives.lock().expect("identity drives lock").insert(d.drive, ids);
            if r.is_ok() || !out {
                self.identity.passed_out.lock().expect("passed-out lock").remove(&d.drive);
            }
            match r {
                Err(e) if out => self.passed_out_of_service(d.drive, &e),
                Err(e) => {
                    tracing::warn!(drive = d.drive, error = %e, "identity keys or super PALs not brought up to date");
                    failed.push(format!("drive {}: {e}", d.drive));
                }
                Ok(()) => {}
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(Failure::new(
                FsStatus::DriveUnavailable,
                format!(
                    "identity keys not installed everywhere ({}); retried at the next maintenance pass",
                    failed.join("; ")
                ),
            ))
        }
    }

    /// Says (once, until it is synchronized or back in service) that drive
    /// `drive`, out of service, is passed by unsynchronized because of
    /// `why`: nothing is placed on it, so it fails no synchronization; one
    /// that answers is still brought up to date (a retired key must not stay
    /// usable on a drive that holds components), and one that comes back is
    /// at the next pass.
    fn passed_out_of_service(&self, drive: u32, why: &str) {
        if self.identity.passed_out.lock().expect("passed-out lock").insert(drive) {
            tracing::info!(drive, why, "identity keys not brought to a drive out of service until it answers");
        }
    }

    /// Checks a `LOGIN_IDENTITY`: the credential's key id is live, the
    /// proof is `identity_login_proof(MAC_K(credential), credential)`, the
    /// credential has not expired, and the authentication server says the
    /// user exists, is enabled and the key id still live. The session's
    /// uid, groups and administrator flag are the authentication server's.
    pub async fn open_identity_session(
        &self,
        credential: &IdentityData,
        proof: &[u8; 32],
    ) -> Result<crate::Session, Failure> {
        let bad = || {
            Failure::new(FsStatus::BadCredentials, "the identity does not verify: log in at the authentication server")
        };
        let Some(shared) = self.shared_key(credential.key_id).await? else {
            return Err(Failure::new(
                FsStatus::BadCredentials,
                format!(
                    "identity key {} is retired or unknown: log in at the authentication server again",
                    credential.key_id
                ),
            ));
        };
        let idkey = identity_key(&shared, credential).ok_or_else(bad)?;
        let expected = identity_login_proof(&idkey, credential).ok_or_else(bad)?;
        if !ct_eq(&expected, proof) {
            return Err(bad());
        }
        if self.env.now_ns() > credential.expiration_ns {
            return Err(Failure::new(
                FsStatus::NotLoggedIn,
                "the identity key has expired: log in at the authentication server again",
            ));
        }
        let (uid, key_id) = (credential.user, credential.key_id);
        let (user, key_live): (AuthUser, bool) = self.with_auth(move |c| Box::pin(c.user_info(uid, key_id))).await?;
        if !key_live {
            self.identity.keys.write().expect("identity keys lock").live.remove(&key_id);
            return Err(Failure::new(
                FsStatus::BadCredentials,
                format!("identity key {key_id} is retired: log in at the authentication server again"),
            ));
        }
        may_act(&user, credential)?;
        let epoch = self.users_epoch();
        let mut session = crate::Session::of_identity(&user, *credential, epoch);
        session.gateway = self.gateway_of(&user.name, user.uid).await?;
        Ok(session)
    }

    /// The gateway grant (`SET_GATEWAY`) of identity user `name` with `uid`:
    /// the manager's to give, so it lives in the manager's record of the
    /// user of that name and uid (which holds no usable password here).
    pub(crate) async fn gateway_of(&self, name: &str, uid: u32) -> Result<Option<(u32, u32)>, Failure> {
        let name = name.to_string();
        Ok(self.meta(move |ns| ns.user(&name)).await?.filter(|u| u.uid == uid).and_then(|u| u.gateway))
    }
}

impl Manager {
    /// Forgets what the authentication server said of users: an
    /// administrator changed some there (`nasd auth disable` and the like
    /// send `SYNC_IDENTITY_KEYS` after), so every identity session and every
    /// user a gateway acts for is asked about again at its next request, not
    /// within [`crate::ManagerConfig::identity_recheck`] or
    /// [`ACTED_FOR_RECHECK_MAX`].
    pub(crate) fn forget_what_auth_said(&self) {
        self.identity.acted_for.lock().expect("acted-for lock").clear();
        *self.identity.users_told_changed.lock().expect("users-told-changed lock") = Some(tokio::time::Instant::now());
    }

    /// Whether an identity session whose user the authentication server
    /// last confirmed at `checked` must be confirmed again now.
    pub(crate) fn identity_recheck_due(&self, checked: Option<tokio::time::Instant>) -> bool {
        let Some(at) = checked else { return true };
        let told = *self.identity.users_told_changed.lock().expect("users-told-changed lock");
        at.elapsed() >= self.config.identity_recheck || told.is_some_and(|t| at <= t)
    }

    /// Whether a gateway may act (`AS_USER`) for `uid`: not for a user the
    /// authentication server knows as disabled. A uid it does not know is
    /// no user of its (a mapped Unix id): the request runs as that bare id,
    /// as on a manager with no authentication server. An unreachable server
    /// keeps the last answer (none: the request runs), as it keeps identity
    /// sessions, and the warning is said once per uid per recheck.
    pub(crate) async fn check_acted_for(&self, uid: u32) -> Result<(), Failure> {
        if self.config.auth.is_none() {
            return Ok(());
        }
        let fresh_for = self.config.identity_recheck.min(ACTED_FOR_RECHECK_MAX);
        let known = self.identity.acted_for.lock().expect("acted-for lock").get(&uid).cloned();
        if let Some(k) = known.as_ref().filter(|k| k.asked.elapsed() < fresh_for) {
            return k.refused.clone().map_or(Ok(()), |why| Err(Failure::new(FsStatus::NotPermitted, why)));
        }
        // Key id 0 is never made: the question is about the user alone.
        let refused = match self.with_auth(move |c| Box::pin(c.user_info(uid, 0))).await {
            Ok((user, _)) if !user.enabled => Some(format!("user '{}' is disabled", user.name)),
            Ok(_) => None,
            Err(f) if f.status == FsStatus::NotFound => None,
            Err(f) if f.status == FsStatus::Busy => {
                tracing::warn!(uid, error = %f.message, "user a gateway acts for not checked: the authentication server is unreachable");
                known.and_then(|k| k.refused)
            }
            Err(f) => return Err(f),
        };
        let mut remembered = self.identity.acted_for.lock().expect("acted-for lock");
        if remembered.len() >= ACTED_FOR_REMEMBERED_MAX {
            remembered.clear();
        }
        remembered.insert(uid, ActedFor { asked: std::time::Instant::now(), refused: refused.clone() });
        refused.map_or(Ok(()), |why| Err(Failure::new(FsStatus::NotPermitted, why)))
    }
}

/// Whether `user`, as the authentication server now knows it, may act
/// under `credential`: enabled, and still holding the credential's role
/// (the session acts in it, and the ACL's role entries match it) — at login
/// and at every later check of an identity session.
pub(crate) fn may_act(user: &AuthUser, credential: &IdentityData) -> Result<(), Failure> {
    if !user.enabled {
        return Err(Failure::new(FsStatus::NotPermitted, format!("user '{}' is disabled", user.name)));
    }
    if credential.role != nasd_proto::ROLE_NONE && !user.roles.contains(&credential.role) {
        return Err(Failure::new(
            FsStatus::NotPermitted,
            format!("user '{}' no longer holds role {}", user.name, credential.role),
        ));
    }
    Ok(())
}
