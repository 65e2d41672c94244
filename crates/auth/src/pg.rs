//! The authentication server's state in PostgreSQL: the same rows as the
//! SQLite store ([`crate::store::Db`]), in the database the file managers
//! share, so that several authentication servers serve one set of users,
//! roles, groups and shared keys (docs/ARCHITECTURE.md, "Several
//! authentication servers").
//!
//! # Tables
//! `auth_users`, `auth_roles`, `auth_user_roles`, `auth_groups`,
//! `auth_group_members`, `auth_shared_keys` (sealed under `auth.key`, which
//! every server of the database holds and the database never sees) and
//! `auth_secrets` (the service token, sealed under `auth.key` too, so a
//! server joining an existing database learns it from there). They sit
//! beside the managers' tables, with their own schema version
//! (`auth_schema`, [`AUTH_PG_SCHEMA_VERSION`]) and migration chain, run in
//! one transaction under the advisory lock [`AUTH_MIGRATION_LOCK`].
//!
//! # Transactions
//! A read is one statement (a user with its groups and roles is one
//! `SELECT`). Every change is one transaction that first takes the advisory
//! lock [`AUTH_WRITER_LOCK`] (`pg_advisory_xact_lock`): changes take turns
//! across every server of the database, and each statement after the lock
//! sees every change committed before it (`READ COMMITTED` takes a new
//! snapshot per statement), so a check and the write it allows — a name not
//! taken, the next gid, the next shared key id, the bounds on roles and
//! groups — are never interleaved with another server's. Shared keys are
//! never cached: each login, `IDENTITY_KEYS` and `USER_INFO` reads them, so
//! a key rotated or retired through one server is what every server issues
//! and answers from its next request on.
//!
//! # Connections
//! At most [`AUTH_PG_CONNECTIONS_MAX`], opened when needed on the server's
//! runtime and dropped when broken. A server that cannot be reached answers
//! `METADATA_UNAVAILABLE` naming the database (never the password), and the
//! failure is logged at a bounded rate ([`nasd_meta::LogLimit`]).

use crate::store::{key_context, Refusal, UserRow, ROLES_MAX};
use nasd_crypto::{open_key, seal_key, Key};
use nasd_meta::pg_connect::PgTarget;
use nasd_proto::auth::{AuthUser, ROLES_PER_USER_MAX};
use nasd_proto::fs::{FsStatus, GROUPS_MAX};
use nasd_proto::limits::IDENTITY_KEYS_MAX;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Row, Transaction};

/// Version 1: every table.
const V1: &str = r#"
CREATE TABLE auth_users (
    uid BIGINT PRIMARY KEY, name TEXT COLLATE "C" NOT NULL UNIQUE, gid BIGINT NOT NULL,
    hash TEXT NOT NULL, admin BOOLEAN NOT NULL, enabled BOOLEAN NOT NULL);
CREATE TABLE auth_roles (role BIGINT PRIMARY KEY, name TEXT COLLATE "C" NOT NULL UNIQUE);
CREATE TABLE auth_user_roles (
    uid BIGINT NOT NULL REFERENCES auth_users (uid), role BIGINT NOT NULL REFERENCES auth_roles (role),
    PRIMARY KEY (uid, role));
CREATE TABLE auth_groups (
    gid BIGINT PRIMARY KEY, name TEXT COLLATE "C" NOT NULL UNIQUE,
    owner BIGINT NOT NULL REFERENCES auth_users (uid));
CREATE TABLE auth_group_members (
    gid BIGINT NOT NULL REFERENCES auth_groups (gid), uid BIGINT NOT NULL REFERENCES auth_users (uid),
    PRIMARY KEY (gid, uid));
CREATE INDEX auth_group_members_uid ON auth_group_members (uid, gid);
CREATE TABLE auth_shared_keys (key_id BIGINT PRIMARY KEY, sealed BYTEA NOT NULL, retired BOOLEAN NOT NULL);
CREATE TABLE auth_secrets (name TEXT PRIMARY KEY, sealed BYTEA NOT NULL);
"#;

/// The migration chain: entry `i` takes version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[V1];

/// The schema version of the authentication tables this build writes.
pub const AUTH_PG_SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;
/// Advisory lock of the authentication tables' migrations ("nasdau").
pub const AUTH_MIGRATION_LOCK: i64 = 0x6e61_7364_6175;
/// Advisory lock every change of the authentication tables holds
/// ("nasdauwr"): changes take turns across servers.
pub const AUTH_WRITER_LOCK: i64 = 0x6e61_7364_6175_7772;
/// Most connections one authentication server opens to the database.
pub const AUTH_PG_CONNECTIONS_MAX: usize = 4;
/// Longest wait to connect to the database.
pub const AUTH_PG_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest any one statement may run.
pub const AUTH_PG_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The name of the service token in `auth_secrets`.
pub const SERVICE_TOKEN_SECRET: &str = "service_token";

/// The authentication state in a PostgreSQL database.
pub struct PgDb {
    target: PgTarget,
    idle: Mutex<Vec<Client>>,
    slots: Semaphore,
    unreachable: nasd_meta::LogLimit,
}

/// A connection lent out; handed back when dropped unless broken.
struct Lent<'a> {
    db: &'a PgDb,
    client: Option<Client>,
    _slot: SemaphorePermit<'a>,
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.client.take().filter(|c| !c.is_closed()) {
            self.db.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(c);
        }
    }
}

impl Lent<'_> {
    fn client(&mut self) -> &mut Client {
        self.client.as_mut().expect("lent until dropped")
    }
}

fn to_u32(v: i64, what: &str) -> Result<u32, Refusal> {
    u32::try_from(v).map_err(|_| (FsStatus::Internal, format!("authentication database: {what} {v} is out of range")))
}

fn ids(v: Vec<i64>, what: &str) -> Result<Vec<u32>, Refusal> {
    v.into_iter().map(|x| to_u32(x, what)).collect()
}

impl PgDb {
    /// Connects to the database `target` names (creating the database if
    /// the server has none of that name) and brings the authentication
    /// tables to [`AUTH_PG_SCHEMA_VERSION`].
    pub async fn open(target: PgTarget) -> Result<PgDb, String> {
        let target = target.with_defaults(AUTH_PG_CONNECT_TIMEOUT, "nasd auth");
        if let Some(warning) = target.exposure_warning() {
            tracing::warn!("{warning}");
        }
        let db = PgDb {
            target,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(AUTH_PG_CONNECTIONS_MAX),
            unreachable: nasd_meta::LogLimit::new(),
        };
        let client = match db.connect_to(&db.target).await {
            Err(e) if e.code() == Some(&SqlState::INVALID_CATALOG_NAME) => {
                db.create_database().await?;
                db.connect_to(&db.target).await
            }
            other => other,
        }
        .map_err(|e| db.detail(&e))?;
        db.migrate(&client).await?;
        db.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(client);
        Ok(db)
    }

    /// `postgres://USER@HOST:PORT/DB`, never a password.
    pub fn describe(&self) -> &str {
        self.target.describe()
    }

    fn detail(&self, e: &tokio_postgres::Error) -> String {
        format!("authentication database {}: {}", self.describe(), nasd_meta::postgres_detail(e))
    }

    async fn connect_to(&self, target: &PgTarget) -> Result<Client, tokio_postgres::Error> {
        let describe = self.describe().to_string();
        let client = target
            .connect(move |e| {
                tracing::warn!(target = %describe, error = %nasd_meta::postgres_detail(&e), "authentication database connection closed");
            })
            .await?;
        let ms = AUTH_PG_STATEMENT_TIMEOUT.as_millis();
        client
            .batch_execute(&format!("SET statement_timeout = {ms}; SET idle_in_transaction_session_timeout = {ms}"))
            .await?;
        Ok(client)
    }

    async fn create_database(&self) -> Result<(), String> {
        let config = self.target.config();
        let name = config.get_dbname().or(config.get_user()).unwrap_or("").to_owned();
        let client = self.connect_to(&self.target.with_dbname("postgres")).await.map_err(|e| self.detail(&e))?;
        let create = async {
            client.query("SELECT pg_advisory_lock($1)", &[&AUTH_MIGRATION_LOCK]).await?;
            let exists = client.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name]).await?.is_some();
            if !exists {
                client.batch_execute(&format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""))).await?;
            }
            client.query("SELECT pg_advisory_unlock($1)", &[&AUTH_MIGRATION_LOCK]).await?;
            Ok::<_, tokio_postgres::Error>(())
        };
        create.await.map_err(|e| self.detail(&e))
    }

    async fn migrate(&self, client: &Client) -> Result<(), String> {
        let run = async {
            client.batch_execute("BEGIN").await?;
            client.query("SELECT pg_advisory_xact_lock($1)", &[&AUTH_MIGRATION_LOCK]).await?;
            client.batch_execute("CREATE TABLE IF NOT EXISTS auth_schema (version BIGINT NOT NULL)").await?;
            let found: i64 = match client.query_opt("SELECT version FROM auth_schema", &[]).await? {
                Some(row) => row.try_get(0)?,
                None => 0,
            };
            if !(0..=AUTH_PG_SCHEMA_VERSION).contains(&found) {
                client.batch_execute("ROLLBACK").await?;
                return Ok(Err(format!(
                    "the authentication tables of {} are at schema version {found}; this build knows 0 to \
                     {AUTH_PG_SCHEMA_VERSION}",
                    self.describe()
                )));
            }
            for (from, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
                client.batch_execute(sql).await?;
                tracing::info!(target = %self.describe(), version = from + 1, "authentication schema migrated");
            }
            if found < AUTH_PG_SCHEMA_VERSION {
                client.batch_execute("DELETE FROM auth_schema").await?;
                client.execute("INSERT INTO auth_schema (version) VALUES ($1)", &[&AUTH_PG_SCHEMA_VERSION]).await?;
            }
            client.batch_execute("COMMIT").await?;
            Ok(Ok(()))
        };
        match run.await {
            Ok(r) => r,
            Err(e) => {
                let _ = client.batch_execute("ROLLBACK").await;
                Err(self.detail(&e))
            }
        }
    }

    /// A connection: an idle one, else a new one (at most
    /// [`AUTH_PG_CONNECTIONS_MAX`] at once).
    async fn lend(&self) -> Result<Lent<'_>, Refusal> {
        let slot =
            self.slots.acquire().await.map_err(|_| (FsStatus::Internal, "the database pool is closed".into()))?;
        let idle = {
            let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            idle.retain(|c| !c.is_closed());
            idle.pop()
        };
        let client = match idle {
            Some(c) => c,
            None => self.connect_to(&self.target).await.map_err(|e| self.refusal(e))?,
        };
        self.unreachable.reset();
        Ok(Lent { db: self, client: Some(client), _slot: slot })
    }

    /// A failure as the caller's refusal: the database out of reach is
    /// `METADATA_UNAVAILABLE` (logged at a bounded rate), anything else
    /// `INTERNAL`; a name or id taken meanwhile is `EXISTS`.
    fn refusal(&self, e: tokio_postgres::Error) -> Refusal {
        let detail = self.detail(&e);
        match e.code() {
            Some(c) if *c == SqlState::UNIQUE_VIOLATION => (FsStatus::Exists, detail),
            Some(_) => {
                tracing::error!("{detail}");
                (FsStatus::Internal, detail)
            }
            None => {
                self.unreachable.log(|suppressed| {
                    tracing::error!(suppressed, "{detail}: requests that need it fail until it is back");
                });
                let message = format!(
                    "the authentication database {} cannot be reached ({})",
                    self.describe(),
                    nasd_meta::postgres_detail(&e)
                );
                (FsStatus::MetadataUnavailable, message)
            }
        }
    }

    /// Begins a change: a transaction holding [`AUTH_WRITER_LOCK`].
    async fn begin<'c>(&self, client: &'c mut Client) -> Result<Transaction<'c>, Refusal> {
        let t = client.transaction().await.map_err(|e| self.refusal(e))?;
        t.query("SELECT pg_advisory_xact_lock($1)", &[&AUTH_WRITER_LOCK]).await.map_err(|e| self.refusal(e))?;
        Ok(t)
    }

    /// Commits `t`. A connection lost once `COMMIT` was sent leaves the
    /// change unknown: `INTERNAL` ("may be done"), never
    /// `METADATA_UNAVAILABLE`, which says nothing changed.
    async fn commit(&self, t: Transaction<'_>) -> Result<(), Refusal> {
        t.commit().await.map_err(|e| match self.refusal(e) {
            (FsStatus::MetadataUnavailable, message) => {
                (FsStatus::Internal, format!("{message}; the change may be done: look before trying again"))
            }
            other => other,
        })
    }

    /// The live shared keys by key id, and the highest key id ever made.
    pub async fn shared_keys(&self, kek: &Key) -> Result<(u32, BTreeMap<u32, Key>), Refusal> {
        let mut c = self.lend().await?;
        let rows = c
            .client()
            .query("SELECT key_id, sealed, retired FROM auth_shared_keys ORDER BY key_id", &[])
            .await
            .map_err(|e| self.refusal(e))?;
        keys_of(&rows, kek)
    }

    /// Makes shared key 1 if no key was ever made; whether it did.
    pub async fn first_key(&self, kek: &Key) -> Result<bool, Refusal> {
        let mut c = self.lend().await?;
        let t = self.begin(c.client()).await?;
        let any = t.query_opt("SELECT 1 FROM auth_shared_keys LIMIT 1", &[]).await.map_err(|e| self.refusal(e))?;
        if any.is_some() {
            return Ok(false);
        }
        insert_key(&t, kek, 1).await.map_err(|e| self.refusal(e))?;
        self.commit(t).await?;
        Ok(true)
    }

    /// A new shared key above every id ever made: its id. `NoSpace` if
    /// [`IDENTITY_KEYS_MAX`] are live.
    pub async fn rotate(&self, kek: &Key) -> Result<u32, Refusal> {
        let mut c = self.lend().await?;
        let t = self.begin(c.client()).await?;
        let row = t
            .query_one(
                "SELECT COALESCE(MAX(key_id), 0), COUNT(*) FILTER (WHERE NOT retired) FROM auth_shared_keys",
                &[],
            )
            .await
            .map_err(|e| self.refusal(e))?;
        let (high, live): (i64, i64) = (row.get(0), row.get(1));
        check_rotation(to_u32(high, "key id")?, live as usize)?;
        let key_id = to_u32(high, "key id")? + 1;
        insert_key(&t, kek, key_id).await.map_err(|e| self.refusal(e))?;
        self.commit(t).await?;
        Ok(key_id)
    }

    /// Retires `key_id`; `InvalidArgument` if it was never made.
    pub async fn retire(&self, key_id: u32) -> Result<(), Refusal> {
        let mut c = self.lend().await?;
        let t = self.begin(c.client()).await?;
        let high: i64 = t
            .query_one("SELECT COALESCE(MAX(key_id), 0) FROM auth_shared_keys", &[])
            .await
            .map_err(|e| self.refusal(e))?
            .get(0);
        check_retirement(key_id, to_u32(high, "key id")?)?;
        t.execute("UPDATE auth_shared_keys SET retired = TRUE WHERE key_id = $1", &[&i64::from(key_id)])
            .await
            .map_err(|e| self.refusal(e))?;
        self.commit(t).await
    }

    /// The secret `name` (sealed), if stored.
    pub async fn secret(&self, name: &str) -> Result<Option<Vec<u8>>, Refusal> {
        let mut c = self.lend().await?;
        let row = c
            .client()
            .query_opt("SELECT sealed FROM auth_secrets WHERE name = $1", &[&name])
            .await
            .map_err(|e| self.refusal(e))?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Stores the secret `name` unless one is stored; the one stored after.
    pub async fn put_secret_once(&self, name: &str, sealed: &[u8]) -> Result<Vec<u8>, Refusal> {
        let mut c = self.lend().await?;
        let t = self.begin(c.client()).await?;
        t.execute(
            "INSERT INTO auth_secrets (name, sealed) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            &[&name, &sealed],
        )
        .await
        .map_err(|e| self.refusal(e))?;
        let row = t
            .query_one("SELECT sealed FROM auth_secrets WHERE name = $1", &[&name])
            .await
            .map_err(|e| self.refusal(e))?;
        self.commit(t).await?;
        Ok(row.get(0))
    }

    /// Whether the database holds any authentication state (a shared key).
    pub async fn is_new(&self) -> Result<bool, Refusal> {
        let mut c = self.lend().await?;
        let row = c
            .client()
            .query_opt("SELECT 1 FROM auth_shared_keys UNION ALL SELECT 1 FROM auth_secrets LIMIT 1", &[])
            .await
            .map_err(|e| self.refusal(e))?;
        Ok(row.is_none())
    }

    async fn user_where(
        &self,
        clause: &str,
        arg: &(dyn tokio_postgres::types::ToSql + Sync),
    ) -> Result<Option<UserRow>, Refusal> {
        let sql = format!(
            "SELECT u.uid, u.name, u.gid, u.hash, u.admin, u.enabled,
                    ARRAY(SELECT m.gid FROM auth_group_members m WHERE m.uid = u.uid ORDER BY m.gid),
                    ARRAY(SELECT r.role FROM auth_user_roles r WHERE r.uid = u.uid ORDER BY r.role)
             FROM auth_users u WHERE {clause}"
        );
        let mut c = self.lend().await?;
        let row = c.client().query_opt(&sql, &[arg]).await.map_err(|e| self.refusal(e))?;
        row.map(|r| user_row(&r)).transpose()
    }

    /// The user named `name`.
    pub async fn user_by_name(&self, name: &str) -> Result<Option<UserRow>, Refusal> {
        self.user_where("u.name = $1", &name).await
    }

    /// The user with id `uid`.
    pub async fn user_by_uid(&self, uid: u32) -> Result<Option<UserRow>, Refusal> {
        self.user_where("u.uid = $1", &i64::from(uid)).await
    }

    /// Every user, by uid (at most `max`).
    pub async fn users(&self, max: usize) -> Result<Vec<AuthUser>, Refusal> {
        let mut c = self.lend().await?;
        let rows = c
            .client()
            .query(
                "SELECT u.uid, u.name, u.gid, u.hash, u.admin, u.enabled,
                        ARRAY(SELECT m.gid FROM auth_group_members m WHERE m.uid = u.uid ORDER BY m.gid),
                        ARRAY(SELECT r.role FROM auth_user_roles r WHERE r.uid = u.uid ORDER BY r.role)
                 FROM auth_users u ORDER BY u.uid LIMIT $1",
                &[&(max as i64)],
            )
            .await
            .map_err(|e| self.refusal(e))?;
        rows.iter().map(|r| user_row(r).map(|u| u.user)).collect()
    }

    /// Whether there is no user yet.
    pub async fn no_users(&self) -> Result<bool, Refusal> {
        let mut c = self.lend().await?;
        let row = c.client().query_opt("SELECT 1 FROM auth_users LIMIT 1", &[]).await.map_err(|e| self.refusal(e))?;
        Ok(row.is_none())
    }

    /// Adds a user; `Exists` if the name or uid is taken.
    pub async fn add_user(&self, name: &str, uid: u32, gid: u32, hash: &str, admin: bool) -> Result<(), Refusal> {
        let mut c = self.lend().await?;
        let t = self.begin(c.client()).await?;
        let taken = t
            .query_opt("SELECT 1 FROM auth_users WHERE name = $1 OR uid = $2", &[&name, &i64::from(uid)])
            .await
            .map_err(|e| self.refusal(e))?
            .is_some();
        if taken {
            return Err((FsStatus::Exists, format!("user '{name}' or uid {uid} exists already")));
        }
        t.execute(
            "INSERT INTO auth_users (uid, name, gid, hash, admin, enabled) VALUES ($1, $2, $3, $4, $5, TRUE)",
            &[&i64::from(uid), &name, &i64::from(gid), &hash, &admin],
        )
        .await
        .map_err(|e| self.refusal(e))?;
        self.commit(t).await
    }

    /// Replaces a user's password hash.
    pub async fn set_hash(&self, name: &str, hash: &str) -> Result<(), Refusal> {
        let mut c = self.lend().await?;
        let n = c
            .client()
            .execute("UPDATE auth_users SET hash = $2 WHERE name = $1", &[&name, &hash])
            .await
            .map_err(|e| self.refusal(e))?;
        if n == 0 {
            return Err((FsStatus::NotFound, format!("no user '{name}'")));
        }
        Ok(())
    }

    /// Replaces user `uid`'s hash with `new` only if it is still `expected`.
    pub async fn replace_hash(&self, uid: u32, expected: &str, new: &str) -> Result<(), Refusal> {
        let mut c = self.lend().await?;
        let t = self.begin(c.client()).await?;
        let current = t
            .query_opt("SELECT hash FROM auth_users WHERE uid = $1", &[&i64::from(uid)])
            .await
            .map_err(|e| self.refusal(e))?;
        match current.map(|r| r.get::<_, String>(0)) {
            None => return Err((FsStatus::NotFound, format!("no user {uid}"))),
            Some(h) if h != expected => {
                return Err((FsStatus::Busy, "the password was set by someone else meanwhile; try again".to_string()))
            }
            Some(_) => {}
        }
        t.execute("UPDATE auth_users SET hash = $2 WHERE uid = $1", &[&i64::from(uid), &new])
            .await
            .map_err(|e| self.refusal(e))?;
        self.commit(t).await
    }

    /// Enables or disables a user.
    pub async fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), Refusal> {
        let mut c = self.lend().await?;
        let n = c
            .client()
            .execute("UPDATE auth_users SET enabled = $2 WHERE name = $1", &[&name, &enabled])
            .await
            .map_err(|e| self.refusal(e))?;
        if n == 0 {
            return Err((FsStatus::NotFound, format!("no user '{name}'")));
        }
        Ok(())
    }

    /// Adds a role.
    pub async fn add_role(&self, role: u32, name: &str) -> Result<(), Refusal> {
        let mut c = self.lend().await?;
        let t = self.begin(c.client()).await?;
        let row = t
            .query_one(
                "SELECT EXISTS(SELECT 1 FROM auth_roles WHERE role = $1 OR name = $2), (SELECT COUNT(*) FROM auth_roles)",
                &[&i64::from(role), &name],
            )
            .await
            .map_err(|e| self.refusal(e))?;
        let (taken, count): (bool, i64) = (row.get(0), row.get(1));
        if taken {
            return Err((FsStatus::Exists, format!("role {role} or '{name}' exists already")));
        }
        if count as usize >= ROLES_MAX {
            return Err((FsStatus::NoSpace, format!("the server holds ROLES_MAX ({ROLES_MAX}) roles")));
        }
        t.execute("INSERT INTO auth_roles (role, name) VALUES ($1, $2)", &[&i64::from(role), &name])
            .await
            .map_err(|e| self.refusal(e))?;
        self.commit(t).await
    }

    /// Gives or takes a role.
    pub async fn set_user_role(&self, user: &str, role: u32, held: bool) -> Result<(), Refusal> {
        let mut c = self.lend().await?;
        let t = self.begin(c.client()).await?;
        let uid: i64 = t
            .query_opt("SELECT uid FROM auth_users WHERE name = $1", &[&user])
            .await
            .map_err(|e| self.refusal(e))?
            .ok_or_else(|| (FsStatus::NotFound, format!("no user '{user}'")))?
            .get(0);
        let role = i64::from(role);
        let exists = t
            .query_opt("SELECT 1 FROM auth_roles WHERE role = $1", &[&role])
            .await
            .map_err(|e| self.refusal(e))?
            .is_some();
        if !exists {
            return Err((FsStatus::NotFound, format!("no role {role}")));
        }
        if held {
            let n: i64 = t
                .query_one("SELECT COUNT(*) FROM auth_user_roles WHERE uid = $1", &[&uid])
                .await
                .map_err(|e| self.refusal(e))?
                .get(0);
            if n as usize >= ROLES_PER_USER_MAX {
                return Err((
                    FsStatus::NoSpace,
                    format!("'{user}' holds ROLES_PER_USER_MAX ({ROLES_PER_USER_MAX}) roles"),
                ));
            }
            t.execute("INSERT INTO auth_user_roles (uid, role) VALUES ($1, $2) ON CONFLICT DO NOTHING", &[&uid, &role])
                .await
                .map_err(|e| self.refusal(e))?;
        } else {
            t.execute("DELETE FROM auth_user_roles WHERE uid = $1 AND role = $2", &[&uid, &role])
                .await
                .map_err(|e| self.refusal(e))?;
        }
        self.commit(t).await
    }

    /// Makes a group owned by `owner` (see [`crate::store::Db::create_group`]).
    pub async fn create_group(&self, owner: u32, name: &str) -> Result<(u32, bool), Refusal> {
        let mut c = self.lend().await?;
        let t = self.begin(c.client()).await?;
        let owner = i64::from(owner);
        let row = t
            .query_one(
                "SELECT EXISTS(SELECT 1 FROM auth_groups WHERE name = $1),
                        (SELECT COUNT(*) FROM auth_groups WHERE owner = $2),
                        (SELECT COUNT(*) FROM auth_group_members WHERE uid = $2),
                        (SELECT MAX(gid) FROM auth_groups)",
                &[&name, &owner],
            )
            .await
            .map_err(|e| self.refusal(e))?;
        let (taken, owned, member_of, high): (bool, i64, i64, Option<i64>) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let highest = high.map(|h| to_u32(h, "gid")).transpose()?;
        let gid = crate::store::new_group_gid(name, taken, owned, highest)?;
        t.execute("INSERT INTO auth_groups (gid, name, owner) VALUES ($1, $2, $3)", &[&i64::from(gid), &name, &owner])
            .await
            .map_err(|e| self.refusal(e))?;
        let member = (member_of as usize) < GROUPS_MAX;
        if member {
            t.execute("INSERT INTO auth_group_members (gid, uid) VALUES ($1, $2)", &[&i64::from(gid), &owner])
                .await
                .map_err(|e| self.refusal(e))?;
        }
        self.commit(t).await?;
        Ok((gid, member))
    }

    /// Adds or removes a member; only the group's owner or an administrator.
    pub async fn set_group_member(
        &self,
        caller: u32,
        caller_admin: bool,
        gid: u32,
        user: &str,
        member: bool,
    ) -> Result<(), Refusal> {
        let mut c = self.lend().await?;
        let t = self.begin(c.client()).await?;
        let uid: i64 = t
            .query_opt("SELECT uid FROM auth_users WHERE name = $1", &[&user])
            .await
            .map_err(|e| self.refusal(e))?
            .ok_or_else(|| (FsStatus::NotFound, format!("no user '{user}'")))?
            .get(0);
        let owner: i64 = t
            .query_opt("SELECT owner FROM auth_groups WHERE gid = $1", &[&i64::from(gid)])
            .await
            .map_err(|e| self.refusal(e))?
            .ok_or_else(|| (FsStatus::NotFound, format!("no group {gid}")))?
            .get(0);
        if owner != i64::from(caller) && !caller_admin {
            return Err((FsStatus::NotPermitted, format!("only the owner of group {gid} changes its members")));
        }
        if member {
            let n: i64 = t
                .query_one("SELECT COUNT(*) FROM auth_group_members WHERE uid = $1", &[&uid])
                .await
                .map_err(|e| self.refusal(e))?
                .get(0);
            if n as usize >= GROUPS_MAX {
                return Err((FsStatus::NoSpace, format!("'{user}' is in GROUPS_MAX ({GROUPS_MAX}) groups")));
            }
            t.execute(
                "INSERT INTO auth_group_members (gid, uid) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[&i64::from(gid), &uid],
            )
            .await
            .map_err(|e| self.refusal(e))?;
        } else {
            t.execute("DELETE FROM auth_group_members WHERE gid = $1 AND uid = $2", &[&i64::from(gid), &uid])
                .await
                .map_err(|e| self.refusal(e))?;
        }
        self.commit(t).await
    }
}

/// Whether another key may be rotated in: fewer than
/// [`IDENTITY_KEYS_MAX`] live and an id left.
pub(crate) fn check_rotation(high: u32, live: usize) -> Result<(), Refusal> {
    if live >= IDENTITY_KEYS_MAX {
        return Err((
            FsStatus::NoSpace,
            format!("IDENTITY_KEYS_MAX ({IDENTITY_KEYS_MAX}) shared keys are live: retire one first"),
        ));
    }
    high.checked_add(1).map(|_| ()).ok_or((FsStatus::NoSpace, "no key id is left".to_string()))
}

/// Whether `key_id` was ever made (`high` the highest made).
pub(crate) fn check_retirement(key_id: u32, high: u32) -> Result<(), Refusal> {
    if key_id == 0 || key_id > high {
        return Err((FsStatus::InvalidArgument, format!("no shared key {key_id} was ever made")));
    }
    Ok(())
}

async fn insert_key(t: &Transaction<'_>, kek: &Key, key_id: u32) -> Result<(), tokio_postgres::Error> {
    let sealed = seal_key(kek, &key_context(key_id), &Key::random());
    t.execute(
        "INSERT INTO auth_shared_keys (key_id, sealed, retired) VALUES ($1, $2, FALSE)",
        &[&i64::from(key_id), &sealed],
    )
    .await
    .map(|_| ())
}

fn keys_of(rows: &[Row], kek: &Key) -> Result<(u32, BTreeMap<u32, Key>), Refusal> {
    let (mut high, mut live) = (0, BTreeMap::new());
    for row in rows {
        let (id, sealed, retired): (i64, Vec<u8>, bool) = (row.get(0), row.get(1), row.get(2));
        let id = to_u32(id, "key id")?;
        high = high.max(id);
        if !retired {
            let key = open_key(kek, &key_context(id), &sealed).map_err(|_| {
                (FsStatus::Internal, format!("shared key {id} does not open under this server's key (auth.key)"))
            })?;
            live.insert(id, key);
        }
    }
    Ok((high, live))
}

fn user_row(r: &Row) -> Result<UserRow, Refusal> {
    let user = AuthUser {
        uid: to_u32(r.get(0), "uid")?,
        name: r.get(1),
        gid: to_u32(r.get(2), "gid")?,
        admin: r.get(4),
        enabled: r.get(5),
        groups: ids(r.get(6), "gid")?,
        roles: ids(r.get(7), "role")?,
    };
    Ok(UserRow { user, hash: r.get(3) })
}
