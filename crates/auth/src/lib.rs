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
//! The state is in SQLite beside the server (`auth.sqlite`), or — when the
//! file managers keep their metadata in PostgreSQL — in their database
//! ([`pg`]), where several servers share it: each reads the shared keys
//! from the database at every use, so a key rotated or retired through one
//! is what all issue and answer from their next request on. Servers on one
//! database share `auth.key` (which seals the shared keys and the service
//! token there; the join bundle carries it) and learn the service token
//! from the database.
//!
//! Layering: above `nasd_proto`, `nasd_crypto`, `nasd_login` and
//! `nasd_meta::pg_connect` (how PostgreSQL is reached), beside the file
//! manager; nothing below depends on it.
#![deny(missing_docs)]

pub mod metrics;
pub mod pg;
pub mod server;
pub mod store;

use anyhow::Context;
use nasd_crypto::{identity_key, Key, MacAlgorithm};
use nasd_login::passwords;
use nasd_proto::auth::{AuthReply, AuthRequest, AuthUser, SharedKey, AUTH_USERS_MAX, ROLES_PER_USER_MAX};
use nasd_proto::fs::FsStatus;
use nasd_proto::manager::PASSWORD_MAX;
use nasd_proto::{IdentityData, ROLE_NONE};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use store::{Db, Refusal, Store};

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

/// The authentication server.
pub struct AuthServer {
    /// Where it runs: its clock, its tasks and sessions, its database's disk.
    env: nasd_env::Env,
    store: Store,
    kek: Key,
    service_token: Key,
    config: AuthConfig,
    argon2: passwords::Pool,
    decoy_hash: String,
    pub(crate) login_backoff: nasd_login::login_backoff::LoginBackoff,
    /// What it counts, for Prometheus ([`metrics`]).
    pub(crate) metrics: metrics::AuthMetrics,
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

/// Where a server keeps its state: [`AuthServer::open_on`].
#[derive(Clone, Default)]
pub enum Backing {
    /// `auth.sqlite` in the server's directory.
    #[default]
    Sqlite,
    /// The file managers' PostgreSQL database (several servers share it).
    Postgres(Box<nasd_meta::pg_connect::PgTarget>),
}

/// Why a server cannot join a database whose state another `auth.key` sealed.
const FOREIGN_KEY: &str = "was sealed under another auth.key: every authentication server of one database holds \
     the first one's auth.key (`nasd admin join-bundle` carries it; `nasd auth --join BUNDLE` installs it)";

/// Sets user `name`'s password in the authentication server kept in `dir`
/// (its state there, or in the database `backing` names), offline (the way
/// back in for an administrator who lost the password; a running server
/// sees it at the next login, since every login reads the user's row). The
/// server's state must exist already.
pub async fn reset_password(dir: &Path, backing: Backing, name: &str, password: &str) -> anyhow::Result<()> {
    anyhow::ensure!(!password.is_empty() && password.len() <= PASSWORD_MAX, "a password needs 1 to PASSWORD_MAX bytes");
    let path = dir.join(AUTH_DB);
    let store = match backing {
        Backing::Postgres(target) if !path.exists() => {
            anyhow::ensure!(
                dir.join(AUTH_KEK_FILE).exists(),
                "no authentication server at {} (no {AUTH_KEK_FILE})",
                dir.display()
            );
            Store::Postgres(Arc::new(pg::PgDb::open(*target).await.map_err(|e| anyhow::anyhow!(e))?))
        }
        _ => {
            anyhow::ensure!(path.exists(), "no authentication server data at {}", dir.display());
            let db = Db::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
            Store::Sqlite(Arc::new(Mutex::new(db)), nasd_env::Env::real())
        }
    };
    let hash = passwords::hash(password);
    store.set_hash(name, &hash).await.map_err(|(_, m)| anyhow::anyhow!("{m} at the authentication server"))
}

/// What the service token is sealed to in the database (under `auth.key`).
const SERVICE_TOKEN_CONTEXT: &[u8] = b"nasd auth service token";

/// Suffix `auth.sqlite` gets once [`migrate_to_postgres`] moved it.
pub const MIGRATED_SUFFIX: &str = ".migrated";

/// What [`migrate_to_postgres`] moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// Users (with their password hashes, enabled and administrator flags).
    pub users: usize,
    /// Roles.
    pub roles: usize,
    /// Groups.
    pub groups: usize,
    /// Shared keys, live and retired (sealed under `auth.key`, as they were).
    pub shared_keys: usize,
    /// Where `auth.sqlite` is now.
    pub old_file: std::path::PathBuf,
}

/// Moves the state of the authentication server kept in `dir`
/// (`auth.sqlite`: users, roles, groups, shared keys; and
/// `service.token`) into the PostgreSQL database `target` names, offline
/// (the server stopped): one transaction, refused if that database holds an
/// authentication server's state already; then `auth.sqlite` is renamed
/// `auth.sqlite.migrated`, so the server started on the database
/// ([`AuthServer::open_on`]) serves the same users, passwords, roles,
/// groups, key ids and service token — and more servers can join it.
///
/// # Errors
/// No `auth.sqlite` or `auth.key` in `dir`; shared keys that do not open
/// under `auth.key`; the database unreachable or holding state; the rename.
pub async fn migrate_to_postgres(dir: &Path, target: nasd_meta::pg_connect::PgTarget) -> anyhow::Result<Moved> {
    let path = dir.join(AUTH_DB);
    anyhow::ensure!(path.exists(), "no {AUTH_DB} in {}: nothing to move", dir.display());
    let kek = nasd_crypto::read_key_file(&dir.join(AUTH_KEK_FILE))
        .with_context(|| format!("no {AUTH_KEK_FILE} in {}", dir.display()))?;
    let service_token = nasd_crypto::read_key_file(&dir.join(SERVICE_TOKEN_FILE))
        .with_context(|| format!("no {SERVICE_TOKEN_FILE} in {}", dir.display()))?;
    let dump = {
        let mut db = Db::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
        // Every shared key opens under this auth.key: the right key file for this state.
        db.shared_keys(&kek).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        db.dump().with_context(|| format!("cannot read {}", path.display()))?
    };
    let db = pg::PgDb::open(target).await.map_err(|e| anyhow::anyhow!(e))?;
    let sealed_token = nasd_crypto::seal_key(&kek, SERVICE_TOKEN_CONTEXT, &service_token);
    db.load(&dump, &sealed_token).await.map_err(|(_, m)| anyhow::anyhow!(m))?;
    let old_file = dir.join(format!("{AUTH_DB}{MIGRATED_SUFFIX}"));
    std::fs::rename(&path, &old_file).with_context(|| {
        format!(
            "the state is in {} now, but {} could not be renamed: move it aside before starting the server",
            db.describe(),
            path.display()
        )
    })?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(Moved {
        users: dump.users.len(),
        roles: dump.roles.len(),
        groups: dump.groups.len(),
        shared_keys: dump.shared_keys.len(),
        old_file,
    })
}

impl AuthServer {
    /// Opens the server kept in `dir` (created if new): its database, its
    /// key, its service token; makes shared key 1 if there is none yet.
    /// SQLite; [`AuthServer::open_on`] for PostgreSQL.
    pub fn open(dir: &Path, config: AuthConfig) -> anyhow::Result<AuthServer> {
        AuthServer::open_in(&nasd_env::Env::real(), dir, config)
    }

    /// [`AuthServer::open`] in `env`: the database on the environment's
    /// disk; its clock, tasks, sessions and argon2 work the environment's.
    /// The key files (`auth.key`, `service.token`) are always the real file
    /// system's (written whole and synced, nothing a crash can tear).
    pub fn open_in(env: &nasd_env::Env, dir: &Path, config: AuthConfig) -> anyhow::Result<AuthServer> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        if !env.is_real() {
            env.create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let (kek, _) = nasd_crypto::load_or_create_key_file(&dir.join(AUTH_KEK_FILE))?;
        let (service_token, _) = nasd_crypto::load_or_create_key_file(&dir.join(SERVICE_TOKEN_FILE))?;
        let path = dir.join(AUTH_DB);
        let mut db = Db::open_in(env, &path).with_context(|| format!("cannot open {}", path.display()))?;
        db.shared_keys(&kek).map_err(|e| anyhow::anyhow!(e))?;
        db.first_key(&kek).map_err(|(_, m)| anyhow::anyhow!(m))?;
        // The database's name is made durable once: its log, synced later, is found after a power loss.
        env.sync_dir(dir).with_context(|| format!("cannot sync {}", dir.display()))?;
        let store = Store::Sqlite(Arc::new(Mutex::new(db)), env.clone());
        Ok(AuthServer::with_store(env, store, kek, service_token, config))
    }

    /// Opens the server kept in `dir` with its state where `backing` says.
    /// On PostgreSQL: `dir` holds `auth.key` (made for a new database,
    /// required for one that holds state already: the first server's) and
    /// the TLS files; the service token is the database's (sealed under
    /// `auth.key`; a new database gets `dir`'s, made if need be), written
    /// to `dir/service.token` for the managers' configuration. A directory
    /// that holds `auth.sqlite` keeps its state there (a server made before
    /// its state moved to the database), with a warning.
    pub async fn open_on(dir: &Path, config: AuthConfig, backing: Backing) -> anyhow::Result<AuthServer> {
        let target = match backing {
            Backing::Sqlite => return AuthServer::open(dir, config),
            Backing::Postgres(_) if dir.join(AUTH_DB).exists() => {
                tracing::warn!(
                    dir = %dir.display(),
                    "this authentication server keeps its state in {AUTH_DB} (made before it moved to the \
                     metadata database): it serves alone; several servers need their state in the database"
                );
                return AuthServer::open(dir, config);
            }
            Backing::Postgres(target) => target,
        };
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let db = pg::PgDb::open(*target).await.map_err(|e| anyhow::anyhow!(e))?;
        let new = db.is_new().await.map_err(|(_, m)| anyhow::anyhow!(m))?;
        let kek_file = dir.join(AUTH_KEK_FILE);
        anyhow::ensure!(
            new || kek_file.exists(),
            "the database {} holds an authentication server's state already, and {} has no {AUTH_KEK_FILE}: \
             join it with `nasd auth --join BUNDLE` (the bundle `nasd admin join-bundle` makes carries the first \
             server's {AUTH_KEK_FILE})",
            db.describe(),
            dir.display()
        );
        let (kek, _) = nasd_crypto::load_or_create_key_file(&kek_file)?;
        let service_token = Self::shared_service_token(&db, dir, &kek).await?;
        let store = Store::Postgres(Arc::new(db));
        store.shared_keys(&kek).await.map_err(|(_, m)| anyhow::anyhow!("{m}: the database's state {FOREIGN_KEY}"))?;
        if store.first_key(&kek).await.map_err(|(_, m)| anyhow::anyhow!(m))? {
            tracing::info!(database = %store.describe(), "shared identity key 1 made");
        }
        Ok(AuthServer::with_store(&nasd_env::Env::real(), store, kek, service_token, config))
    }

    /// The service token of the servers on `db`: the one stored there, else
    /// `dir`'s (made if need be) stored there; `dir/service.token` made or
    /// replaced to match.
    async fn shared_service_token(db: &pg::PgDb, dir: &Path, kek: &Key) -> anyhow::Result<Key> {
        const CONTEXT: &[u8] = SERVICE_TOKEN_CONTEXT;
        let file = dir.join(SERVICE_TOKEN_FILE);
        let stored = match db.secret(pg::SERVICE_TOKEN_SECRET).await.map_err(|(_, m)| anyhow::anyhow!(m))? {
            Some(sealed) => sealed,
            None => {
                let (local, _) = nasd_crypto::load_or_create_key_file(&file)?;
                let sealed = nasd_crypto::seal_key(kek, CONTEXT, &local);
                db.put_secret_once(pg::SERVICE_TOKEN_SECRET, &sealed).await.map_err(|(_, m)| anyhow::anyhow!(m))?
            }
        };
        let token = nasd_crypto::open_key(kek, CONTEXT, &stored)
            .map_err(|_| anyhow::anyhow!("the service token in {} {FOREIGN_KEY}", db.describe()))?;
        match nasd_crypto::read_key_file(&file) {
            Ok(have) if nasd_crypto::ct_eq(have.expose(), token.expose()) => {}
            _ => {
                let _ = std::fs::remove_file(&file);
                nasd_crypto::create_key_file(&file, &token)
                    .with_context(|| format!("cannot write {}", file.display()))?;
            }
        }
        Ok(token)
    }

    fn with_store(env: &nasd_env::Env, store: Store, kek: Key, service_token: Key, config: AuthConfig) -> AuthServer {
        AuthServer {
            env: env.clone(),
            store,
            kek,
            service_token,
            config,
            argon2: passwords::Pool::start_in(env),
            decoy_hash: passwords::decoy(),
            login_backoff: Default::default(),
            metrics: Default::default(),
        }
    }

    /// What this server counts; register it to have it served.
    pub fn metrics(&self) -> &metrics::AuthMetrics {
        &self.metrics
    }

    /// Where the state is: `auth.sqlite`, or the database (no password).
    pub fn store_name(&self) -> String {
        self.store.describe()
    }

    /// Whether there is no user yet (at any server of the store).
    pub async fn no_users(&self) -> Result<bool, Refusal> {
        self.store.no_users().await
    }

    /// The service token (for the file manager's configuration).
    pub fn service_token(&self) -> &Key {
        &self.service_token
    }

    async fn hash(&self, password: String) -> Result<String, Refusal> {
        check_password_len(&password)?;
        self.argon2.run(move |m| passwords::hash_with(m, &password)).await.map_err(|e| (FsStatus::Internal, e))
    }

    /// Makes the first administrator if there is no user yet; false if
    /// there was one.
    pub async fn bootstrap_admin(&self, name: &str, password: &str, uid: u32) -> Result<bool, Refusal> {
        if !self.store.no_users().await? {
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
        if uid == nasd_meta::MANAGER_WRITER_UID {
            // The managers record their own write transactions as this id.
            return refuse(FsStatus::InvalidArgument, "uid 4294967295 is reserved: give another");
        }
        let hash = self.hash(password.to_string()).await?;
        self.store.add_user(name, uid, if gid == 0 { uid } else { gid }, &hash, admin).await
    }

    /// Checks a password login: the identity grant (`LOGGED_IN`).
    pub async fn login(&self, user: &str, password: &str, role: u32) -> Result<AuthReply, Refusal> {
        let row = self.store.user_by_name(user).await?;
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
        let (credential, idkey) = self.issue(u.uid, role).await?;
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
        let row = self.store.user_by_uid(uid).await?.ok_or((FsStatus::NotLoggedIn, "your user is gone".into()))?;
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
        self.store.replace_hash(uid, &row.hash, &hash).await?;
        tracing::info!(user = name, "password changed by its user");
        Ok(())
    }

    /// An administrator sets user `name`'s password (no old one needed);
    /// durable before this returns. Identity keys already issued stay valid.
    pub async fn set_password(&self, name: &str, password: &str) -> Result<(), Refusal> {
        check_password_len(password)?;
        if self.store.user_by_name(name).await?.is_none() {
            return refuse(FsStatus::NotFound, format!("no user '{name}'"));
        }
        let hash = self.hash(password.to_string()).await?;
        self.store.set_hash(name, &hash).await?;
        tracing::info!(user = name, "password set by an administrator");
        Ok(())
    }

    /// A credential for `uid` in `role` under the newest live shared key
    /// (read from the store now: another server may have rotated or
    /// retired keys), and its identity key.
    async fn issue(&self, uid: u32, role: u32) -> Result<(IdentityData, Key), Refusal> {
        let (_, live) = self.store.shared_keys(&self.kek).await?;
        let Some((&key_id, k)) = live.iter().next_back() else {
            return refuse(FsStatus::Internal, "no shared key is live: an administrator must rotate one in");
        };
        let expiration_ns = self.env.now_ns().saturating_add(self.config.identity_lifetime.as_nanos() as u64);
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

    /// A new shared key; its key id. New identity keys use it, at every
    /// server of the store.
    pub async fn rotate_key(&self) -> Result<u32, Refusal> {
        let key_id = self.store.rotate(&self.kek).await?;
        tracing::info!(key_id, "shared identity key rotated in");
        Ok(key_id)
    }

    /// Retires `key_id`: identity keys made with it are refused from then
    /// on (by the manager at once; by drives once the manager has told
    /// them), at every server of the store. Retired already: nothing changes.
    pub async fn retire_key(&self, key_id: u32) -> Result<(), Refusal> {
        self.store.retire(key_id).await?;
        tracing::info!(key_id, "shared identity key retired");
        Ok(())
    }

    /// The live shared keys, ascending, and the highest key id ever made,
    /// as the store holds them now.
    pub async fn shared_keys(&self) -> Result<(u32, Vec<SharedKey>), Refusal> {
        let (high, live) = self.store.shared_keys(&self.kek).await?;
        Ok((high, live.iter().map(|(&key_id, key)| SharedKey { key_id, key: *key.expose() }).collect()))
    }

    /// Whether `key_id` is live, as the store holds it now.
    pub async fn key_live(&self, key_id: u32) -> Result<bool, Refusal> {
        Ok(self.store.shared_keys(&self.kek).await?.1.contains_key(&key_id))
    }

    /// Enables or disables a user.
    pub async fn set_user_enabled(&self, name: &str, enabled: bool) -> Result<(), Refusal> {
        self.store.set_enabled(name, enabled).await
    }

    /// Adds a role.
    pub async fn add_role(&self, role: u32, name: &str) -> Result<(), Refusal> {
        if role == ROLE_NONE {
            return refuse(FsStatus::InvalidArgument, "role 0 is no role");
        }
        self.store.add_role(role, name).await
    }

    /// Gives or takes a role.
    pub async fn set_user_role(&self, user: &str, role: u32, held: bool) -> Result<(), Refusal> {
        self.store.set_user_role(user, role, held).await
    }

    /// The user with id `uid`.
    pub async fn user(&self, uid: u32) -> Result<Option<AuthUser>, Refusal> {
        Ok(self.store.user_by_uid(uid).await?.map(|r| r.user))
    }

    /// Serves one request of a logged-in connection.
    pub async fn handle(&self, who: Principal, req: AuthRequest) -> Result<AuthReply, Refusal> {
        use AuthRequest as R;
        let caller = match who {
            Principal::Service => {
                return match req {
                    R::IdentityKeys => {
                        let (high, keys) = self.shared_keys().await?;
                        Ok(AuthReply::IdentityKeys { high, keys })
                    }
                    R::UserInfo { uid, key_id } => {
                        let user = self.user(uid).await?.ok_or((FsStatus::NotFound, format!("no user {uid}")))?;
                        Ok(AuthReply::UserInfo { user, key_live: self.key_live(key_id).await? })
                    }
                    R::UserByName { name } => {
                        let row = self.store.user_by_name(&name).await?;
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
                let (gid, member) = self.store.create_group(caller, &name).await?;
                Ok(AuthReply::Group { gid, member })
            }
            R::SetGroupMember { gid, user, member } => {
                let admin = me.admin;
                self.store.set_group_member(caller, admin, gid, &user, member).await?;
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
                Ok(AuthReply::Users(self.store.users(AUTH_USERS_MAX).await?))
            }
        }
    }
}

const _: () = assert!(ROLES_PER_USER_MAX <= u16::MAX as usize);
