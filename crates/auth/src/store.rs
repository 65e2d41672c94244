//! The authentication server's database: users, roles, groups and the
//! shared keys K (sealed under the server's key), in SQLite beside it
//! ([`Db`]) or in the file managers' PostgreSQL database ([`crate::pg::PgDb`],
//! shared by several servers); [`Store`] is either. Every change is one
//! transaction, durable when it returns.

use nasd_crypto::{open_key, seal_key, Key};
use nasd_proto::auth::{AuthUser, ROLES_PER_USER_MAX};
use nasd_proto::fs::{FsStatus, GROUPS_MAX};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::collections::BTreeMap;
use std::path::Path;

/// The first gid a user-made group gets; later ones count up.
pub const GROUP_GID_BASE: u32 = 1 << 20;
/// Most groups one user may own.
pub const GROUPS_OWNED_MAX: usize = 256;
/// Most roles the server knows.
pub const ROLES_MAX: usize = 4096;

/// A refusal: status and message.
pub type Refusal = (FsStatus, String);

fn internal(e: rusqlite::Error) -> Refusal {
    (FsStatus::Internal, format!("authentication database: {e}"))
}

/// A user's row.
pub struct UserRow {
    /// As listed.
    pub user: AuthUser,
    /// argon2id PHC string.
    pub hash: String,
}

/// Every row of an authentication server's state, as
/// [`crate::migrate_to_postgres`] moves it: shared keys still sealed under
/// `auth.key`, passwords as their argon2id hashes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Dump {
    /// `(uid, name, gid, hash, admin, enabled)`.
    pub users: Vec<(u32, String, u32, String, bool, bool)>,
    /// `(role, name)`.
    pub roles: Vec<(u32, String)>,
    /// `(uid, role)`.
    pub user_roles: Vec<(u32, u32)>,
    /// `(gid, name, owner uid)`.
    pub groups: Vec<(u32, String, u32)>,
    /// `(gid, uid)`.
    pub group_members: Vec<(u32, u32)>,
    /// `(key_id, sealed, retired)`.
    pub shared_keys: Vec<(u32, Vec<u8>, bool)>,
}

/// The database.
pub struct Db {
    conn: Connection,
}

pub(crate) fn key_context(key_id: u32) -> Vec<u8> {
    let mut c = b"nasd auth shared key".to_vec();
    c.extend_from_slice(&key_id.to_le_bytes());
    c
}

/// The gid of a new group `name`, given what the store found in the same
/// transaction: whether the name is `taken`, how many groups the owner
/// `owned`, and the `highest` gid so far (gids only grow). One rule for
/// both stores.
pub(crate) fn new_group_gid(name: &str, taken: bool, owned: i64, highest: Option<u32>) -> Result<u32, Refusal> {
    if taken {
        return Err((FsStatus::Exists, format!("group '{name}' exists already")));
    }
    if owned as usize >= GROUPS_OWNED_MAX {
        return Err((FsStatus::NoSpace, format!("you own GROUPS_OWNED_MAX ({GROUPS_OWNED_MAX}) groups")));
    }
    match highest {
        None => Ok(GROUP_GID_BASE),
        Some(h) => h.checked_add(1).ok_or_else(|| (FsStatus::NoSpace, "no gid is left".to_string())),
    }
}

impl Db {
    /// Opens (creating if new) the database at `path`.
    pub fn open(path: &Path) -> rusqlite::Result<Db> {
        Db::open_in(&nasd_env::Env::real(), path)
    }

    /// [`Db::open`] on `env`'s disk.
    pub fn open_in(env: &nasd_env::Env, path: &Path) -> rusqlite::Result<Db> {
        let conn = env.open_sqlite(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS users (
                uid INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, gid INTEGER NOT NULL,
                hash TEXT NOT NULL, admin INTEGER NOT NULL, enabled INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS roles (role INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
             CREATE TABLE IF NOT EXISTS user_roles (
                uid INTEGER NOT NULL REFERENCES users(uid), role INTEGER NOT NULL REFERENCES roles(role),
                PRIMARY KEY (uid, role));
             CREATE TABLE IF NOT EXISTS groups (
                gid INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, owner INTEGER NOT NULL REFERENCES users(uid));
             CREATE TABLE IF NOT EXISTS group_members (
                gid INTEGER NOT NULL REFERENCES groups(gid), uid INTEGER NOT NULL REFERENCES users(uid),
                PRIMARY KEY (gid, uid));
             CREATE TABLE IF NOT EXISTS shared_keys (
                key_id INTEGER PRIMARY KEY, sealed BLOB NOT NULL, retired INTEGER NOT NULL);",
        )?;
        Ok(Db { conn })
    }

    /// Every row, in key order, read in one transaction.
    ///
    /// # Errors
    /// The database fails.
    pub fn dump(&mut self) -> rusqlite::Result<Dump> {
        let t = self.conn.transaction()?;
        let mut d = Dump::default();
        {
            let mut q = t.prepare("SELECT uid, name, gid, hash, admin, enabled FROM users ORDER BY uid")?;
            let rows = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)))?;
            d.users = rows.collect::<Result<_, _>>()?;
            let mut q = t.prepare("SELECT role, name FROM roles ORDER BY role")?;
            d.roles = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?;
            let mut q = t.prepare("SELECT uid, role FROM user_roles ORDER BY uid, role")?;
            d.user_roles = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?;
            let mut q = t.prepare("SELECT gid, name, owner FROM groups ORDER BY gid")?;
            d.groups = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect::<Result<_, _>>()?;
            let mut q = t.prepare("SELECT gid, uid FROM group_members ORDER BY gid, uid")?;
            d.group_members = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?;
            let mut q = t.prepare("SELECT key_id, sealed, retired FROM shared_keys ORDER BY key_id")?;
            d.shared_keys = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?.collect::<Result<_, _>>()?;
        }
        t.commit()?;
        Ok(d)
    }

    /// The live shared keys by key id, and the highest key id ever made.
    /// A key that does not open under `kek` is an error naming its id.
    pub fn shared_keys(&self, kek: &Key) -> Result<(u32, BTreeMap<u32, Key>), String> {
        let mut stmt = self
            .conn
            .prepare("SELECT key_id, sealed, retired FROM shared_keys ORDER BY key_id")
            .map_err(|e| e.to_string())?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, u32>(0)?, r.get::<_, Vec<u8>>(1)?, r.get::<_, bool>(2)?)))
            .map_err(|e| e.to_string())?;
        let (mut high, mut live) = (0, BTreeMap::new());
        for row in rows {
            let (id, sealed, retired) = row.map_err(|e| e.to_string())?;
            high = high.max(id);
            if !retired {
                let key = open_key(kek, &key_context(id), &sealed)
                    .map_err(|_| format!("shared key {id} does not open under this server's key"))?;
                live.insert(id, key);
            }
        }
        Ok((high, live))
    }

    /// Makes shared key 1 if no key was ever made; whether it did.
    pub fn first_key(&mut self, kek: &Key) -> Result<bool, Refusal> {
        let t = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(internal)?;
        let any: bool = t.query_row("SELECT EXISTS(SELECT 1 FROM shared_keys)", [], |r| r.get(0)).map_err(internal)?;
        if any {
            return Ok(false);
        }
        t.execute(
            "INSERT INTO shared_keys (key_id, sealed, retired) VALUES (1, ?1, 0)",
            params![seal_key(kek, &key_context(1), &Key::random())],
        )
        .map_err(internal)?;
        t.commit().map_err(internal)?;
        Ok(true)
    }

    /// A new shared key above every id ever made: its id. `NoSpace` if
    /// `IDENTITY_KEYS_MAX` are live.
    pub fn rotate(&mut self, kek: &Key) -> Result<u32, Refusal> {
        let t = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(internal)?;
        let (high, live): (u32, i64) = t
            .query_row(
                "SELECT COALESCE(MAX(key_id), 0), (SELECT COUNT(*) FROM shared_keys WHERE retired = 0) FROM shared_keys",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(internal)?;
        crate::pg::check_rotation(high, live as usize)?;
        let key_id = high + 1;
        t.execute(
            "INSERT INTO shared_keys (key_id, sealed, retired) VALUES (?1, ?2, 0)",
            params![key_id, seal_key(kek, &key_context(key_id), &Key::random())],
        )
        .map_err(internal)?;
        t.commit().map_err(internal)?;
        Ok(key_id)
    }

    /// Retires `key_id`; `InvalidArgument` if it was never made.
    pub fn retire(&mut self, key_id: u32) -> Result<(), Refusal> {
        let t = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(internal)?;
        let high: u32 =
            t.query_row("SELECT COALESCE(MAX(key_id), 0) FROM shared_keys", [], |r| r.get(0)).map_err(internal)?;
        crate::pg::check_retirement(key_id, high)?;
        t.execute("UPDATE shared_keys SET retired = 1 WHERE key_id = ?1", params![key_id]).map_err(internal)?;
        t.commit().map_err(internal)
    }

    /// Records shared key `key_id` (above every id made so far).
    pub fn add_shared_key(&mut self, kek: &Key, key_id: u32, key: &Key) -> Result<(), Refusal> {
        self.conn
            .execute(
                "INSERT INTO shared_keys (key_id, sealed, retired) VALUES (?1, ?2, 0)",
                params![key_id, seal_key(kek, &key_context(key_id), key)],
            )
            .map_err(internal)?;
        Ok(())
    }

    /// Marks `key_id` retired.
    pub fn retire_shared_key(&mut self, key_id: u32) -> Result<(), Refusal> {
        self.conn.execute("UPDATE shared_keys SET retired = 1 WHERE key_id = ?1", params![key_id]).map_err(internal)?;
        Ok(())
    }

    fn user_where(&self, clause: &str, arg: &dyn rusqlite::ToSql) -> Result<Option<UserRow>, Refusal> {
        let sql = format!("SELECT uid, name, gid, hash, admin, enabled FROM users WHERE {clause}");
        let row = self
            .conn
            .query_row(&sql, [arg], |r| {
                Ok((
                    r.get::<_, u32>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, u32>(2)?,
                    r.get::<_, String>(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .optional()
            .map_err(internal)?;
        let Some((uid, name, gid, hash, admin, enabled)) = row else { return Ok(None) };
        let groups = self.ids("SELECT gid FROM group_members WHERE uid = ?1 ORDER BY gid", uid)?;
        let roles = self.ids("SELECT role FROM user_roles WHERE uid = ?1 ORDER BY role", uid)?;
        Ok(Some(UserRow { user: AuthUser { name, uid, gid, admin, enabled, groups, roles }, hash }))
    }

    fn ids(&self, sql: &str, uid: u32) -> Result<Vec<u32>, Refusal> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(internal)?;
        let rows = stmt.query_map([uid], |r| r.get::<_, u32>(0)).map_err(internal)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(internal)
    }

    /// The user named `name`.
    pub fn user_by_name(&self, name: &str) -> Result<Option<UserRow>, Refusal> {
        self.user_where("name = ?1", &name)
    }

    /// The user with id `uid`.
    pub fn user_by_uid(&self, uid: u32) -> Result<Option<UserRow>, Refusal> {
        self.user_where("uid = ?1", &uid)
    }

    fn uid_of(&self, name: &str) -> Result<u32, Refusal> {
        self.conn
            .query_row("SELECT uid FROM users WHERE name = ?1", [name], |r| r.get(0))
            .optional()
            .map_err(internal)?
            .ok_or_else(|| (FsStatus::NotFound, format!("no user '{name}'")))
    }

    /// Every user, by uid.
    pub fn users(&self, max: usize) -> Result<Vec<AuthUser>, Refusal> {
        let names: Vec<String> = {
            let mut stmt = self.conn.prepare("SELECT name FROM users ORDER BY uid LIMIT ?1").map_err(internal)?;
            let rows = stmt.query_map([max as i64], |r| r.get(0)).map_err(internal)?;
            rows.collect::<Result<_, _>>().map_err(internal)?
        };
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            if let Some(row) = self.user_by_name(&n)? {
                out.push(row.user);
            }
        }
        Ok(out)
    }

    /// Adds a user; `Exists` if the name or uid is taken.
    pub fn add_user(&mut self, name: &str, uid: u32, gid: u32, hash: &str, admin: bool) -> Result<(), Refusal> {
        let t = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(internal)?;
        let taken: bool = t
            .query_row("SELECT EXISTS(SELECT 1 FROM users WHERE name = ?1 OR uid = ?2)", params![name, uid], |r| {
                r.get(0)
            })
            .map_err(internal)?;
        if taken {
            return Err((FsStatus::Exists, format!("user '{name}' or uid {uid} exists already")));
        }
        t.execute(
            "INSERT INTO users (uid, name, gid, hash, admin, enabled) VALUES (?1, ?2, ?3, ?4, ?5, 1)",
            params![uid, name, gid, hash, admin],
        )
        .map_err(internal)?;
        t.commit().map_err(internal)
    }

    /// Replaces a user's password hash (`NotFound` if there is no such user).
    pub fn set_hash(&mut self, name: &str, hash: &str) -> Result<(), Refusal> {
        let n =
            self.conn.execute("UPDATE users SET hash = ?2 WHERE name = ?1", params![name, hash]).map_err(internal)?;
        if n == 0 {
            return Err((FsStatus::NotFound, format!("no user '{name}'")));
        }
        Ok(())
    }

    /// Replaces user `uid`'s password hash with `new` only if it is still
    /// `expected` (the one a caller's old password was checked against):
    /// `Busy` if it changed meanwhile, `NotFound` if the user is gone.
    pub fn replace_hash(&mut self, uid: u32, expected: &str, new: &str) -> Result<(), Refusal> {
        let t = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(internal)?;
        let current: Option<String> =
            t.query_row("SELECT hash FROM users WHERE uid = ?1", [uid], |r| r.get(0)).optional().map_err(internal)?;
        match current {
            None => return Err((FsStatus::NotFound, format!("no user {uid}"))),
            Some(h) if h != expected => {
                return Err((FsStatus::Busy, "the password was set by someone else meanwhile; try again".to_string()))
            }
            Some(_) => {}
        }
        t.execute("UPDATE users SET hash = ?2 WHERE uid = ?1", params![uid, new]).map_err(internal)?;
        t.commit().map_err(internal)
    }

    /// Enables or disables a user.
    pub fn set_enabled(&mut self, name: &str, enabled: bool) -> Result<(), Refusal> {
        let n = self
            .conn
            .execute("UPDATE users SET enabled = ?2 WHERE name = ?1", params![name, enabled])
            .map_err(internal)?;
        if n == 0 {
            return Err((FsStatus::NotFound, format!("no user '{name}'")));
        }
        Ok(())
    }

    /// True if there is no user yet.
    pub fn no_users(&self) -> Result<bool, Refusal> {
        self.conn.query_row("SELECT NOT EXISTS(SELECT 1 FROM users)", [], |r| r.get(0)).map_err(internal)
    }

    /// Adds a role.
    pub fn add_role(&mut self, role: u32, name: &str) -> Result<(), Refusal> {
        let t = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(internal)?;
        let (taken, count): (bool, i64) = t
            .query_row(
                "SELECT EXISTS(SELECT 1 FROM roles WHERE role = ?1 OR name = ?2), (SELECT COUNT(*) FROM roles)",
                params![role, name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(internal)?;
        if taken {
            return Err((FsStatus::Exists, format!("role {role} or '{name}' exists already")));
        }
        if count as usize >= ROLES_MAX {
            return Err((FsStatus::NoSpace, format!("the server holds ROLES_MAX ({ROLES_MAX}) roles")));
        }
        t.execute("INSERT INTO roles (role, name) VALUES (?1, ?2)", params![role, name]).map_err(internal)?;
        t.commit().map_err(internal)
    }

    /// Gives or takes a role.
    pub fn set_user_role(&mut self, user: &str, role: u32, held: bool) -> Result<(), Refusal> {
        let t = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(internal)?;
        let uid: u32 = t
            .query_row("SELECT uid FROM users WHERE name = ?1", [user], |r| r.get(0))
            .optional()
            .map_err(internal)?
            .ok_or_else(|| (FsStatus::NotFound, format!("no user '{user}'")))?;
        let exists: bool = t
            .query_row("SELECT EXISTS(SELECT 1 FROM roles WHERE role = ?1)", [role], |r| r.get(0))
            .map_err(internal)?;
        if !exists {
            return Err((FsStatus::NotFound, format!("no role {role}")));
        }
        if held {
            let n: i64 =
                t.query_row("SELECT COUNT(*) FROM user_roles WHERE uid = ?1", [uid], |r| r.get(0)).map_err(internal)?;
            if n as usize >= ROLES_PER_USER_MAX {
                return Err((
                    FsStatus::NoSpace,
                    format!("'{user}' holds ROLES_PER_USER_MAX ({ROLES_PER_USER_MAX}) roles"),
                ));
            }
            t.execute("INSERT OR IGNORE INTO user_roles (uid, role) VALUES (?1, ?2)", params![uid, role])
                .map_err(internal)?;
        } else {
            t.execute("DELETE FROM user_roles WHERE uid = ?1 AND role = ?2", params![uid, role]).map_err(internal)?;
        }
        t.commit().map_err(internal)
    }

    /// Makes a group owned by `owner`: its gid, and whether the owner became
    /// its first member — unless the owner is in `GROUPS_MAX` groups
    /// already, which bounds membership, not ownership (`GROUPS_OWNED_MAX`:
    /// creating used to be refused at `GROUPS_MAX`, so no one could own
    /// more than 32 groups).
    pub fn create_group(&mut self, owner: u32, name: &str) -> Result<(u32, bool), Refusal> {
        let t = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(internal)?;
        let (taken, owned, member_of, high): (bool, i64, i64, Option<u32>) = t
            .query_row(
                "SELECT EXISTS(SELECT 1 FROM groups WHERE name = ?1),
                        (SELECT COUNT(*) FROM groups WHERE owner = ?2),
                        (SELECT COUNT(*) FROM group_members WHERE uid = ?2),
                        (SELECT MAX(gid) FROM groups)",
                params![name, owner],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .map_err(internal)?;
        let gid = new_group_gid(name, taken, owned, high)?;
        t.execute("INSERT INTO groups (gid, name, owner) VALUES (?1, ?2, ?3)", params![gid, name, owner])
            .map_err(internal)?;
        let member = (member_of as usize) < GROUPS_MAX;
        if member {
            t.execute("INSERT INTO group_members (gid, uid) VALUES (?1, ?2)", params![gid, owner]).map_err(internal)?;
        }
        t.commit().map_err(internal)?;
        Ok((gid, member))
    }

    /// Adds or removes a member; only the group's owner or an administrator.
    pub fn set_group_member(
        &mut self,
        caller: u32,
        caller_admin: bool,
        gid: u32,
        user: &str,
        member: bool,
    ) -> Result<(), Refusal> {
        let uid = self.uid_of(user)?;
        let t = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(internal)?;
        let owner: u32 = t
            .query_row("SELECT owner FROM groups WHERE gid = ?1", [gid], |r| r.get(0))
            .optional()
            .map_err(internal)?
            .ok_or_else(|| (FsStatus::NotFound, format!("no group {gid}")))?;
        if owner != caller && !caller_admin {
            return Err((FsStatus::NotPermitted, format!("only the owner of group {gid} changes its members")));
        }
        if member {
            let n: i64 = t
                .query_row("SELECT COUNT(*) FROM group_members WHERE uid = ?1", [uid], |r| r.get(0))
                .map_err(internal)?;
            if n as usize >= GROUPS_MAX {
                return Err((FsStatus::NoSpace, format!("'{user}' is in GROUPS_MAX ({GROUPS_MAX}) groups")));
            }
            t.execute("INSERT OR IGNORE INTO group_members (gid, uid) VALUES (?1, ?2)", params![gid, uid])
                .map_err(internal)?;
        } else {
            t.execute("DELETE FROM group_members WHERE gid = ?1 AND uid = ?2", params![gid, uid]).map_err(internal)?;
        }
        t.commit().map_err(internal)
    }
}

/// Where the server keeps its state: SQLite beside it, or the managers'
/// PostgreSQL database (several servers on one).
#[derive(Clone)]
pub enum Store {
    /// `auth.sqlite` in the server's directory, and the environment whose
    /// blocking tasks run its transactions.
    Sqlite(std::sync::Arc<std::sync::Mutex<Db>>, nasd_env::Env),
    /// The tables `auth_*` of a PostgreSQL database.
    Postgres(std::sync::Arc<crate::pg::PgDb>),
}

/// Runs `f` on the SQLite database as one of `env`'s blocking tasks.
async fn on_sqlite<R: Send + 'static>(
    db: &std::sync::Arc<std::sync::Mutex<Db>>,
    env: &nasd_env::Env,
    f: impl FnOnce(&mut Db) -> Result<R, Refusal> + Send + 'static,
) -> Result<R, Refusal> {
    let db = db.clone();
    env.spawn_blocking(move || f(&mut db.lock().expect("auth database lock poisoned")))
        .await
        .map_err(|e| (FsStatus::Internal, format!("database task failed: {e}")))?
}

/// One operation on either store: `$sqlite` runs with `$db: &mut Db` on a
/// blocking thread (it owns what it uses), `$pg` is awaited with `$p: &PgDb`.
macro_rules! on_store {
    ($self:ident, |$db:ident| $sqlite:expr, |$p:ident| $pg:expr) => {
        match $self {
            Store::Sqlite(s, env) => on_sqlite(s, env, move |$db: &mut Db| $sqlite).await,
            Store::Postgres($p) => $pg.await,
        }
    };
}

impl Store {
    /// Which store, for logs: `auth.sqlite` or the database's URL without password.
    pub fn describe(&self) -> String {
        match self {
            Store::Sqlite(..) => crate::AUTH_DB.to_string(),
            Store::Postgres(p) => p.describe().to_string(),
        }
    }

    /// The live shared keys by key id, and the highest key id ever made.
    pub async fn shared_keys(&self, kek: &Key) -> Result<(u32, BTreeMap<u32, Key>), Refusal> {
        let k = kek.clone();
        on_store!(self, |db| db.shared_keys(&k).map_err(|e| (FsStatus::Internal, e)), |p| p.shared_keys(kek))
    }

    /// Makes shared key 1 if no key was ever made; whether it did.
    pub async fn first_key(&self, kek: &Key) -> Result<bool, Refusal> {
        let k = kek.clone();
        on_store!(self, |db| db.first_key(&k), |p| p.first_key(kek))
    }

    /// A new shared key above every id ever made: its id.
    pub async fn rotate(&self, kek: &Key) -> Result<u32, Refusal> {
        let k = kek.clone();
        on_store!(self, |db| db.rotate(&k), |p| p.rotate(kek))
    }

    /// Retires `key_id` (retired already: nothing changes).
    pub async fn retire(&self, key_id: u32) -> Result<(), Refusal> {
        on_store!(self, |db| db.retire(key_id), |p| p.retire(key_id))
    }

    /// The user named `name`.
    pub async fn user_by_name(&self, name: &str) -> Result<Option<UserRow>, Refusal> {
        let n = name.to_string();
        on_store!(self, |db| db.user_by_name(&n), |p| p.user_by_name(name))
    }

    /// The user with id `uid`.
    pub async fn user_by_uid(&self, uid: u32) -> Result<Option<UserRow>, Refusal> {
        on_store!(self, |db| db.user_by_uid(uid), |p| p.user_by_uid(uid))
    }

    /// Every user, by uid (at most `max`).
    pub async fn users(&self, max: usize) -> Result<Vec<AuthUser>, Refusal> {
        on_store!(self, |db| db.users(max), |p| p.users(max))
    }

    /// Whether there is no user yet.
    pub async fn no_users(&self) -> Result<bool, Refusal> {
        on_store!(self, |db| db.no_users(), |p| p.no_users())
    }

    /// Adds a user; `Exists` if the name or uid is taken.
    pub async fn add_user(&self, name: &str, uid: u32, gid: u32, hash: &str, admin: bool) -> Result<(), Refusal> {
        let (n, h) = (name.to_string(), hash.to_string());
        on_store!(self, |db| db.add_user(&n, uid, gid, &h, admin), |p| p.add_user(name, uid, gid, hash, admin))
    }

    /// Replaces a user's password hash.
    pub async fn set_hash(&self, name: &str, hash: &str) -> Result<(), Refusal> {
        let (n, h) = (name.to_string(), hash.to_string());
        on_store!(self, |db| db.set_hash(&n, &h), |p| p.set_hash(name, hash))
    }

    /// Replaces user `uid`'s hash with `new` only if it is still `expected`.
    pub async fn replace_hash(&self, uid: u32, expected: &str, new: &str) -> Result<(), Refusal> {
        let (e, n) = (expected.to_string(), new.to_string());
        on_store!(self, |db| db.replace_hash(uid, &e, &n), |p| p.replace_hash(uid, expected, new))
    }

    /// Enables or disables a user.
    pub async fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), Refusal> {
        let n = name.to_string();
        on_store!(self, |db| db.set_enabled(&n, enabled), |p| p.set_enabled(name, enabled))
    }

    /// Adds a role.
    pub async fn add_role(&self, role: u32, name: &str) -> Result<(), Refusal> {
        let n = name.to_string();
        on_store!(self, |db| db.add_role(role, &n), |p| p.add_role(role, name))
    }

    /// Gives or takes a role.
    pub async fn set_user_role(&self, user: &str, role: u32, held: bool) -> Result<(), Refusal> {
        let u = user.to_string();
        on_store!(self, |db| db.set_user_role(&u, role, held), |p| p.set_user_role(user, role, held))
    }

    /// Makes a group owned by `owner`: its gid, and whether the owner is its first member.
    pub async fn create_group(&self, owner: u32, name: &str) -> Result<(u32, bool), Refusal> {
        let n = name.to_string();
        on_store!(self, |db| db.create_group(owner, &n), |p| p.create_group(owner, name))
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
        let u = user.to_string();
        on_store!(self, |db| db.set_group_member(caller, caller_admin, gid, &u, member), |p| p.set_group_member(
            caller,
            caller_admin,
            gid,
            user,
            member
        ))
    }
}
