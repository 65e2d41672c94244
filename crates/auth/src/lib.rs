//! The nasd authentication server (DSFS §3.1; LegionFS §3.3): who users
//! are, and the identity keys that prove it to the file manager and the
//! drives.
//!
//! Users log in over TLS with a password (argon2id, on the bounded worker
//! pool of [`nasd_login::passwords`]) and pick one of their roles for the
//! session; the server answers with an identity credential `K_data` = {key
//! id, user, role, expiration} and the identity key `idkey = MAC_K(K_data)`,
//! K the newest live shared key. Several shared keys live at once, by key
//! id: rotating adds one, so identity keys made with the others stay valid
//! until they expire; retiring a key id revokes every identity key made with
//! it. The file manager logs in with a service token, fetches the live keys
//! (`IDENTITY_KEYS`) to install on its drives (`SET_IDENTITY_KEY`,
//! `RETIRE_IDENTITY_KEY`) and asks who a credential's user is
//! (`USER_INFO`). Users make groups themselves and choose their members.
//!
//! Layering: above `nasd_proto`, `nasd_crypto` and `nasd_login`, beside the
//! file manager; nothing below depends on it.
#![deny(missing_docs)]

pub mod server;
pub mod store;

use anyhow::Context;
use nasd_crypto::{identity_key, Key, MacAlgorithm};
use nasd_login::passwords;
use nasd_proto::auth::{AuthReply, AuthRequest, AuthUser, SharedKey, AUTH_USERS_MAX, ROLES_PER_USER_MAX};
use nasd_proto::fs::FsStatus;
use nasd_proto::limits::IDENTITY_KEYS_MAX;
use nasd_proto::manager::PASSWORD_MAX;
use nasd_proto::{IdentityData, ROLE_NONE};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use store::{Db, Refusal};

/// File name of the database inside the server's directory.
pub const AUTH_DB: &str = "auth.sqlite";
/// File name of the key that seals the shared keys in the database.
pub const AUTH_KEK_FILE: &str = "auth.key";
/// File name of the service token the file manager logs in with (a key
/// file: 64 hex digits, 0600).
pub const SERVICE_TOKEN_FILE: &str = "service.token";
/// Shortest password.
pub const PASSWORD_MIN: usize = passwords::PASSWORD_MIN;

/// Policy knobs (the `[auth]` section of the config file).
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// How long an identity key is valid after login.
    pub identity_lifetime: Duration,
    /// MAC algorithm of identity keys.
    pub algorithm: MacAlgorithm,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig { identity_lifetime: Duration::from_secs(3600), algorithm: MacAlgorithm::Blake3 }
    }
}

/// Who a connection is, once logged in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Principal {
    /// A user (its uid).
    User(u32),
    /// The file manager (service token).
    Service,
}

/// The live shared keys and the highest key id ever made.
struct Keys {
    high: u32,
    live: BTreeMap<u32, Key>,
}

/// The authentication server.
pub struct AuthServer {
    db: Arc<Mutex<Db>>,
    kek: Key,
    service_token: Key,
    config: AuthConfig,
    keys: RwLock<Keys>,
    /// Serializes rotations and retirements (plan, commit, install).
    key_admin: tokio::sync::Mutex<()>,
    argon2: passwords::Pool,
    decoy_hash: String,
    pub(crate) login_backoff: nasd_login::login_backoff::LoginBackoff,
}

fn now_ns() -> u64 {
    nasd_env::clock::system_ns()
}

fn refuse<T>(status: FsStatus, message: impl Into<String>) -> Result<T, Refusal> {
    Err((status, message.into()))
}

/// A new password's length: `PASSWORD_MIN..=PASSWORD_MAX` bytes.
fn check_password_len(password: &str) -> Result<(), Refusal> {
    if password.len() < PASSWORD_MIN || password.len() > PASSWORD_MAX {
        return refuse(FsStatus::InvalidArgument, format!("passwords need {PASSWORD_MIN} to {PASSWORD_MAX} bytes"));
    }
    Ok(())
}

/// Sets user `name`'s password in the authentication server kept in `dir`,
/// offline (the way back in for an administrator who lost the password; a
/// running server sees it at the next login, since every login reads the
/// user's row). `dir` must hold a server's database already.
pub fn reset_password(dir: &Path, name: &str, password: &str) -> anyhow::Result<()> {
    anyhow::ensure!(!password.is_empty() && password.len() <= PASSWORD_MAX, "a password needs 1 to PASSWORD_MAX bytes");
    let path = dir.join(AUTH_DB);
    anyhow::ensure!(path.exists(), "no authentication server data at {}", dir.display());
    let mut db = Db::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
    db.set_hash(name, &passwords::hash(password)).map_err(|(_, m)| anyhow::anyhow!("{m} at the authentication server"))
}

impl AuthServer {
    /// Opens the server kept in `dir` (created if new): its database, its
    /// key, its service token; makes shared key 1 if there is none yet.
    pub fn open(dir: &Path, config: AuthConfig) -> anyhow::Result<AuthServer> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let (kek, _) = nasd_crypto::load_or_create_key_file(&dir.join(AUTH_KEK_FILE))?;
        let (service_token, _) = nasd_crypto::load_or_create_key_file(&dir.join(SERVICE_TOKEN_FILE))?;
        let mut db =
            Db::open(&dir.join(AUTH_DB)).with_context(|| format!("cannot open {}", dir.join(AUTH_DB).display()))?;
        let (mut high, mut live) = db.shared_keys(&kek).map_err(|e| anyhow::anyhow!(e))?;
        if high == 0 {
            let k = Key::random();
            db.add_shared_key(&kek, 1, &k).map_err(|(_, m)| anyhow::anyhow!(m))?;
            live.insert(1, k);
            high = 1;
        }
        Ok(AuthServer {
            db: Arc::new(Mutex::new(db)),
            kek,
            service_token,
            config,
            keys: RwLock::new(Keys { high, live }),
            key_admin: tokio::sync::Mutex::new(()),
            argon2: passwords::Pool::start(),
            decoy_hash: passwords::decoy(),
            login_backoff: Default::default(),
        })
    }

    /// The service token (for the file manager's configuration).
    pub fn service_token(&self) -> &Key {
        &self.service_token
    }

    async fn db<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Db) -> Result<R, Refusal> + Send + 'static,
    ) -> Result<R, Refusal> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || f(&mut db.lock().expect("auth database lock poisoned")))
            .await
            .map_err(|e| (FsStatus::Internal, format!("database task failed: {e}")))?
    }

    async fn hash(&self, password: String) -> Result<String, Refusal> {
        check_password_len(&password)?;
        self.argon2.run(move |m| passwords::hash_with(m, &password)).await.map_err(|e| (FsStatus::Internal, e))
    }

    /// Makes the first administrator if there is no user yet; false if
    /// there was one.
    pub async fn bootstrap_admin(&self, name: &str, password: &str, uid: u32) -> Result<bool, Refusal> {
        if !self.db(|db| db.no_users()).await? {
            return Ok(false);
        }
        self.add_user(name, password, uid, 0, true).await?;
        Ok(true)
    }

    /// Adds a user (gid 0: its uid).
    pub async fn add_user(&self, name: &str, password: &str, uid: u32, gid: u32, admin: bool) -> Result<(), Refusal> {
        if name.is_empty() || name.len() > nasd_proto::manager::USER_NAME_MAX {
            return refuse(FsStatus::InvalidArgument, "a user name needs 1 to USER_NAME_MAX bytes");
        }
        let hash = self.hash(password.to_string()).await?;
        let (name, gid) = (name.to_string(), if gid == 0 { uid } else { gid });
        self.db(move |db| db.add_user(&name, uid, gid, &hash, admin)).await
    }

    /// Checks a password login: the identity grant (`LOGGED_IN`).
    pub async fn login(&self, user: &str, password: &str, role: u32) -> Result<AuthReply, Refusal> {
        let name = user.to_string();
        let row = self.db(move |db| db.user_by_name(&name)).await?;
        let (hash, found) = match &row {
            Some(r) => (r.hash.clone(), true),
            None => (self.decoy_hash.clone(), false),
        };
        let pw = password.to_string();
        let ok = self
            .argon2
            .run(move |m| passwords::verify_with(m, &pw, &hash))
            .await
            .map_err(|e| (FsStatus::Internal, e))?;
        let Some(row) = row.filter(|_| ok && found) else {
            tracing::warn!(user, "failed login");
            return refuse(FsStatus::BadCredentials, "wrong user name or password");
        };
        let u = row.user;
        if !u.enabled {
            tracing::warn!(user, "login of a disabled user");
            return refuse(FsStatus::NotPermitted, format!("user '{user}' is disabled"));
        }
        if role != ROLE_NONE && !u.roles.contains(&role) {
            return refuse(FsStatus::NotPermitted, format!("user '{user}' does not hold role {role}"));
        }
        let (credential, idkey) = self.issue(u.uid, role)?;
        tracing::info!(user, role, key_id = credential.key_id, "logged in");
        Ok(AuthReply::LoggedIn {
            uid: u.uid,
            gid: u.gid,
            admin: u.admin,
            roles: u.roles,
            credential,
            idkey: *idkey.expose(),
        })
    }

    /// User `uid` changes its own password: `old` must be the current one
    /// (checked as [`AuthServer::login`] checks a password), `new` is stored
    /// as an argon2id hash with [`AuthServer::add_user`]'s parameters,
    /// durable before this returns. A wrong `old` is `BadCredentials` and
    /// changes nothing. Identity keys already issued stay valid.
    pub async fn change_password(&self, uid: u32, old: &str, new: &str) -> Result<(), Refusal> {
        check_password_len(new)?;
        let row =
            self.db(move |db| db.user_by_uid(uid)).await?.ok_or((FsStatus::NotLoggedIn, "your user is gone".into()))?;
        let (pw, stored) = (old.to_string(), row.hash.clone());
        let ok = self
            .argon2
            .run(move |m| passwords::verify_with(m, &pw, &stored))
            .await
            .map_err(|e| (FsStatus::Internal, e))?;
        let name = row.user.name;
        if !ok {
            tracing::warn!(user = name, "password change with a wrong old password");
            return refuse(FsStatus::BadCredentials, "wrong old password: the password is unchanged");
        }
        let hash = self.hash(new.to_string()).await?;
        let expected = row.hash;
        self.db(move |db| db.replace_hash(uid, &expected, &hash)).await?;
        tracing::info!(user = name, "password changed by its user");
        Ok(())
    }

    /// An administrator sets user `name`'s password (no old one needed);
    /// durable before this returns. Identity keys already issued stay valid.
    pub async fn set_password(&self, name: &str, password: &str) -> Result<(), Refusal> {
        check_password_len(password)?;
        let n = name.to_string();
        if self.db(move |db| db.user_by_name(&n)).await?.is_none() {
            return refuse(FsStatus::NotFound, format!("no user '{name}'"));
        }
        let hash = self.hash(password.to_string()).await?;
        let n = name.to_string();
        self.db(move |db| db.set_hash(&n, &hash)).await?;
        tracing::info!(user = name, "password set by an administrator");
        Ok(())
    }

    /// A credential for `uid` in `role` under the newest live shared key, and its identity key.
    fn issue(&self, uid: u32, role: u32) -> Result<(IdentityData, Key), Refusal> {
        let keys = self.keys.read().expect("keys lock");
        let Some((&key_id, k)) = keys.live.iter().next_back() else {
            return refuse(FsStatus::Internal, "no shared key is live: an administrator must rotate one in");
        };
        let expiration_ns = now_ns().saturating_add(self.config.identity_lifetime.as_nanos() as u64);
        let credential =
            IdentityData { algorithm: self.config.algorithm as u8, key_id, user: uid, role, expiration_ns };
        let idkey = identity_key(k, &credential).ok_or((FsStatus::Internal, "unknown MAC algorithm".to_string()))?;
        Ok((credential, idkey))
    }

    /// Checks a service login.
    pub fn service_login(&self, token: &[u8]) -> Result<(), Refusal> {
        if nasd_crypto::ct_eq(token, self.service_token.expose()) {
            Ok(())
        } else {
            tracing::warn!("failed service login");
            refuse(FsStatus::BadCredentials, "wrong service token")
        }
    }

    /// A new shared key; its key id. New identity keys use it.
    pub async fn rotate_key(&self) -> Result<u32, Refusal> {
        let _admin = self.key_admin.lock().await;
        let (high, live) = {
            let k = self.keys.read().expect("keys lock");
            (k.high, k.live.len())
        };
        if live >= IDENTITY_KEYS_MAX {
            return refuse(
                FsStatus::NoSpace,
                format!("IDENTITY_KEYS_MAX ({IDENTITY_KEYS_MAX}) shared keys are live: retire one first"),
            );
        }
        let key_id = high.checked_add(1).ok_or((FsStatus::NoSpace, "no key id is left".to_string()))?;
        let (k, kek) = (Key::random(), self.kek.clone());
        let stored = k.clone();
        self.db(move |db| db.add_shared_key(&kek, key_id, &stored)).await?;
        let mut keys = self.keys.write().expect("keys lock");
        keys.high = key_id;
        keys.live.insert(key_id, k);
        tracing::info!(key_id, "shared identity key rotated in");
        Ok(key_id)
    }

    /// Retires `key_id`: identity keys made with it are refused from then
    /// on (by the manager at once; by drives once the manager has told
    /// them). Retired already: nothing changes.
    pub async fn retire_key(&self, key_id: u32) -> Result<(), Refusal> {
        let _admin = self.key_admin.lock().await;
        let (high, live) = {
            let k = self.keys.read().expect("keys lock");
            (k.high, k.live.contains_key(&key_id))
        };
        if key_id == 0 || key_id > high {
            return refuse(FsStatus::InvalidArgument, format!("no shared key {key_id} was ever made"));
        }
        if !live {
            return Ok(());
        }
        self.db(move |db| db.retire_shared_key(key_id)).await?;
        self.keys.write().expect("keys lock").live.remove(&key_id);
        tracing::info!(key_id, "shared identity key retired");
        Ok(())
    }

    /// The live shared keys, ascending, and the highest key id ever made.
    pub fn shared_keys(&self) -> (u32, Vec<SharedKey>) {
        let k = self.keys.read().expect("keys lock");
        (k.high, k.live.iter().map(|(&key_id, key)| SharedKey { key_id, key: *key.expose() }).collect())
    }

    /// Whether `key_id` is live.
    pub fn key_live(&self, key_id: u32) -> bool {
        self.keys.read().expect("keys lock").live.contains_key(&key_id)
    }

    /// Enables or disables a user.
    pub async fn set_user_enabled(&self, name: &str, enabled: bool) -> Result<(), Refusal> {
        let name = name.to_string();
        self.db(move |db| db.set_enabled(&name, enabled)).await
    }

    /// Adds a role.
    pub async fn add_role(&self, role: u32, name: &str) -> Result<(), Refusal> {
        if role == ROLE_NONE {
            return refuse(FsStatus::InvalidArgument, "role 0 is no role");
        }
        let name = name.to_string();
        self.db(move |db| db.add_role(role, &name)).await
    }

    /// Gives or takes a role.
    pub async fn set_user_role(&self, user: &str, role: u32, held: bool) -> Result<(), Refusal> {
        let user = user.to_string();
        self.db(move |db| db.set_user_role(&user, role, held)).await
    }

    /// The user with id `uid`.
    pub async fn user(&self, uid: u32) -> Result<Option<AuthUser>, Refusal> {
        Ok(self.db(move |db| db.user_by_uid(uid)).await?.map(|r| r.user))
    }

    /// Serves one request of a logged-in connection.
    pub async fn handle(&self, who: Principal, req: AuthRequest) -> Result<AuthReply, Refusal> {
        use AuthRequest as R;
        let caller = match who {
            Principal::Service => {
                return match req {
                    R::IdentityKeys => {
                        let (high, keys) = self.shared_keys();
                        Ok(AuthReply::IdentityKeys { high, keys })
                    }
                    R::UserInfo { uid, key_id } => {
                        let user = self.user(uid).await?.ok_or((FsStatus::NotFound, format!("no user {uid}")))?;
                        Ok(AuthReply::UserInfo { user, key_live: self.key_live(key_id) })
                    }
                    R::UserByName { name } => {
                        let n = name.clone();
                        let row = self.db(move |db| db.user_by_name(&n)).await?;
                        row.map(|r| AuthReply::User(r.user)).ok_or((FsStatus::NotFound, format!("no user '{name}'")))
                    }
                    _ => refuse(FsStatus::NotPermitted, "the service login asks only for keys and users"),
                };
            }
            Principal::User(uid) => uid,
        };
        // The caller as of now: a user disabled (or demoted) since login loses the session.
        let me = self.user(caller).await?.ok_or((FsStatus::NotLoggedIn, "your user is gone".to_string()))?;
        if !me.enabled {
            return refuse(FsStatus::NotLoggedIn, "your user is disabled");
        }
        let admin_only = |me: &AuthUser| {
            if me.admin {
                Ok(())
            } else {
                refuse(FsStatus::NotAdmin, "only administrators do that")
            }
        };
        match req {
            R::Login { .. } | R::ServiceLogin { .. } => refuse(FsStatus::BadRequest, "already logged in"),
            R::IdentityKeys | R::UserInfo { .. } | R::UserByName { .. } => {
                refuse(FsStatus::NotPermitted, "only the file manager asks that")
            }
            R::CreateGroup { name } => {
                let (gid, member) = self.db(move |db| db.create_group(caller, &name)).await?;
                Ok(AuthReply::Group { gid, member })
            }
            R::SetGroupMember { gid, user, member } => {
                let admin = me.admin;
                self.db(move |db| db.set_group_member(caller, admin, gid, &user, member)).await?;
                Ok(AuthReply::Done)
            }
            R::ChangePassword { old_password, new_password } => {
                self.change_password(caller, &old_password, &new_password).await.map(|()| AuthReply::Done)
            }
            R::SetPassword { user, password } => {
                admin_only(&me)?;
                self.set_password(&user, &password).await.map(|()| AuthReply::Done)
            }
            R::AddUser { name, password, uid, gid, admin } => {
                admin_only(&me)?;
                self.add_user(&name, &password, uid, gid, admin).await.map(|()| AuthReply::Done)
            }
            R::SetUserEnabled { name, enabled } => {
                admin_only(&me)?;
                self.set_user_enabled(&name, enabled).await.map(|()| AuthReply::Done)
            }
            R::AddRole { role, name } => {
                admin_only(&me)?;
                self.add_role(role, &name).await.map(|()| AuthReply::Done)
            }
            R::SetUserRole { user, role, held } => {
                admin_only(&me)?;
                self.set_user_role(&user, role, held).await.map(|()| AuthReply::Done)
            }
            R::RotateKey => {
                admin_only(&me)?;
                self.rotate_key().await.map(|key_id| AuthReply::Key { key_id })
            }
            R::RetireKey { key_id } => {
                admin_only(&me)?;
                self.retire_key(key_id).await.map(|()| AuthReply::Done)
            }
            R::ListUsers => {
                admin_only(&me)?;
                Ok(AuthReply::Users(self.db(|db| db.users(AUTH_USERS_MAX)).await?))
            }
        }
    }
}

const _: () = assert!(ROLES_PER_USER_MAX <= u16::MAX as usize);
