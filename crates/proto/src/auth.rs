//! The authentication-server protocol (DSFS §3.1; docs/PROTOCOL.md,
//! "Authentication-server protocol"): what users, administrators and the
//! file manager say to `nasd auth` over TLS.
//!
//! Framing and the reply header are the manager protocol's: a message is a
//! `u32` length, then a body; a request is `opcode u16, request_id u64,
//! arguments`; a reply is `status u16, request_id u64`, then (status OK) a
//! result kind `u8` and its fields, or an error message. Statuses are
//! [`FsStatus`] codes. Arguments and results use the canonical encoding of
//! [`crate::codec`]. TLS protects the channel: identity keys and the shared
//! keys K travel only inside it.

use crate::codec::{Reader, Writer};
use crate::fs::{FsStatus, GROUPS_MAX};
use crate::identity::{IdentityData, IDENTITY_DATA_LEN};
use crate::limits::{ERROR_MESSAGE_LEN_MAX, IDENTITY_KEYS_MAX};
use crate::manager::{PASSWORD_MAX, USER_NAME_MAX};
use crate::DecodeError;

/// Version of the authentication-server protocol (sent in `LOGIN` and
/// `SERVICE_LOGIN`).
pub const AUTH_PROTOCOL_VERSION: u8 = 1;
/// Largest message body, in bytes, after login.
pub const AUTH_MESSAGE_MAX: usize = 512 * 1024;
/// Largest message body read before a connection has logged in: a `LOGIN`
/// with the longest user name and password and a role.
pub const AUTH_LOGIN_MESSAGE_MAX: usize = 2 + 8 + 1 + (2 + USER_NAME_MAX) + (2 + PASSWORD_MAX) + 4;
/// Most roles one user holds.
pub const ROLES_PER_USER_MAX: usize = 64;
/// Longest role or group name, in bytes.
pub const AUTH_NAME_MAX: usize = 64;
/// Length of the service token the file manager logs in with.
pub const SERVICE_TOKEN_LEN: usize = 32;
/// Length of an identity key (`idkey`) and of a shared key K.
pub const AUTH_KEY_LEN: usize = 32;
/// Most users one `LIST_USERS` reply carries.
pub const AUTH_USERS_MAX: usize = 512;

const _: () = assert!(AUTH_LOGIN_MESSAGE_MAX == 1107);
const _: () = assert!(AuthUser::LEN_MAX == 464);
const _: () = assert!(AUTH_USERS_MAX * AuthUser::LEN_MAX + 64 <= AUTH_MESSAGE_MAX);
/// The longest `CHANGE_PASSWORD` (two passwords) fits a message after login.
const _: () = assert!(2 + 8 + 2 * (2 + PASSWORD_MAX) <= AUTH_MESSAGE_MAX);

/// Operation codes of the authentication-server protocol.
#[allow(missing_docs)]
pub mod auth_opcode {
    pub const LOGIN: u16 = 0x0001;
    pub const SERVICE_LOGIN: u16 = 0x0002;
    pub const CREATE_GROUP: u16 = 0x0010;
    pub const SET_GROUP_MEMBER: u16 = 0x0011;
    pub const CHANGE_PASSWORD: u16 = 0x0012;
    pub const ADD_USER: u16 = 0x0101;
    pub const SET_USER_ENABLED: u16 = 0x0102;
    pub const ADD_ROLE: u16 = 0x0103;
    pub const SET_USER_ROLE: u16 = 0x0104;
    pub const ROTATE_KEY: u16 = 0x0105;
    pub const RETIRE_KEY: u16 = 0x0106;
    pub const LIST_USERS: u16 = 0x0107;
    pub const SET_PASSWORD: u16 = 0x0108;
    pub const IDENTITY_KEYS: u16 = 0x0201;
    pub const USER_INFO: u16 = 0x0202;
    pub const USER_BY_NAME: u16 = 0x0203;
}

/// Result kinds of a successful reply.
mod reply_kind {
    pub const DONE: u8 = 0;
    pub const LOGGED_IN: u8 = 1;
    pub const GROUP: u8 = 2;
    pub const KEY: u8 = 3;
    pub const IDENTITY_KEYS: u8 = 4;
    pub const USER_INFO: u8 = 5;
    pub const USERS: u8 = 6;
    pub const USER: u8 = 7;
}

/// A request to the authentication server.
#[derive(Clone, PartialEq, Eq)]
#[allow(missing_docs)] // fields: docs/PROTOCOL.md
pub enum AuthRequest {
    /// Password login; `role` is the role the session assumes (0: none),
    /// one the user holds.
    Login { version: u8, user: String, password: String, role: u32 },
    /// The file manager's login, with the service token both were given.
    ServiceLogin { version: u8, token: [u8; SERVICE_TOKEN_LEN] },
    /// Makes a group owned by the caller; the reply names its gid.
    CreateGroup { name: String },
    /// The group's owner (or an administrator) adds (`member` true) or
    /// removes a user.
    SetGroupMember { gid: u32, user: String, member: bool },
    /// The caller changes its own password: the old one (checked as
    /// `LOGIN` checks it) and the new one.
    ChangePassword { old_password: String, new_password: String },
    /// Administrator: a new user (gid 0: the uid).
    AddUser { name: String, password: String, uid: u32, gid: u32, admin: bool },
    /// Administrator: enables or disables a user's logins.
    SetUserEnabled { name: String, enabled: bool },
    /// Administrator: a new role.
    AddRole { role: u32, name: String },
    /// Administrator: gives (`held` true) or takes a role from a user.
    SetUserRole { user: String, role: u32, held: bool },
    /// Administrator: a new shared key K, which new identity keys use from
    /// then on; the reply names its key id.
    RotateKey,
    /// Administrator: retires a key id: every identity key made with it is
    /// refused from then on.
    RetireKey { key_id: u32 },
    /// Administrator: every user.
    ListUsers,
    /// Administrator: sets any user's password (no old one needed).
    SetPassword { user: String, password: String },
    /// Service: the live shared keys and the highest key id ever made.
    IdentityKeys,
    /// Service: who `uid` is, and whether `key_id` is live.
    UserInfo { uid: u32, key_id: u32 },
    /// Service: the user named `name` (for the manager's own record of it,
    /// where a gateway grant lives).
    UserByName { name: String },
}

impl std::fmt::Debug for AuthRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Passwords and tokens never print.
        match self {
            AuthRequest::Login { user, role, .. } => {
                f.debug_struct("Login").field("user", user).field("role", role).finish_non_exhaustive()
            }
            AuthRequest::ServiceLogin { .. } => f.write_str("ServiceLogin { .. }"),
            AuthRequest::AddUser { name, uid, gid, admin, .. } => f
                .debug_struct("AddUser")
                .field("name", name)
                .field("uid", uid)
                .field("gid", gid)
                .field("admin", admin)
                .finish_non_exhaustive(),
            AuthRequest::CreateGroup { name } => f.debug_struct("CreateGroup").field("name", name).finish(),
            AuthRequest::SetGroupMember { gid, user, member } => {
                f.debug_struct("SetGroupMember").field("gid", gid).field("user", user).field("member", member).finish()
            }
            AuthRequest::SetUserEnabled { name, enabled } => {
                f.debug_struct("SetUserEnabled").field("name", name).field("enabled", enabled).finish()
            }
            AuthRequest::AddRole { role, name } => {
                f.debug_struct("AddRole").field("role", role).field("name", name).finish()
            }
            AuthRequest::SetUserRole { user, role, held } => {
                f.debug_struct("SetUserRole").field("user", user).field("role", role).field("held", held).finish()
            }
            AuthRequest::ChangePassword { .. } => f.write_str("ChangePassword { .. }"),
            AuthRequest::SetPassword { user, .. } => {
                f.debug_struct("SetPassword").field("user", user).finish_non_exhaustive()
            }
            AuthRequest::RotateKey => f.write_str("RotateKey"),
            AuthRequest::RetireKey { key_id } => f.debug_struct("RetireKey").field("key_id", key_id).finish(),
            AuthRequest::ListUsers => f.write_str("ListUsers"),
            AuthRequest::IdentityKeys => f.write_str("IdentityKeys"),
            AuthRequest::UserInfo { uid, key_id } => {
                f.debug_struct("UserInfo").field("uid", uid).field("key_id", key_id).finish()
            }
            AuthRequest::UserByName { name } => f.debug_struct("UserByName").field("name", name).finish(),
        }
    }
}

fn user_name(r: &mut Reader<'_>) -> Result<String, DecodeError> {
    let s = r.str(USER_NAME_MAX, "user name")?;
    if s.is_empty() {
        return Err(DecodeError::NotCanonical("empty user name"));
    }
    Ok(s)
}

fn short_name(r: &mut Reader<'_>, field: &'static str) -> Result<String, DecodeError> {
    let s = r.str(AUTH_NAME_MAX, field)?;
    if s.is_empty() {
        return Err(DecodeError::NotCanonical("empty name"));
    }
    Ok(s)
}

impl AuthRequest {
    /// The opcode of this request.
    pub fn opcode(&self) -> u16 {
        use auth_opcode::*;
        match self {
            AuthRequest::Login { .. } => LOGIN,
            AuthRequest::ServiceLogin { .. } => SERVICE_LOGIN,
            AuthRequest::CreateGroup { .. } => CREATE_GROUP,
            AuthRequest::SetGroupMember { .. } => SET_GROUP_MEMBER,
            AuthRequest::ChangePassword { .. } => CHANGE_PASSWORD,
            AuthRequest::AddUser { .. } => ADD_USER,
            AuthRequest::SetUserEnabled { .. } => SET_USER_ENABLED,
            AuthRequest::AddRole { .. } => ADD_ROLE,
            AuthRequest::SetUserRole { .. } => SET_USER_ROLE,
            AuthRequest::RotateKey => ROTATE_KEY,
            AuthRequest::RetireKey { .. } => RETIRE_KEY,
            AuthRequest::ListUsers => LIST_USERS,
            AuthRequest::SetPassword { .. } => SET_PASSWORD,
            AuthRequest::IdentityKeys => IDENTITY_KEYS,
            AuthRequest::UserInfo { .. } => USER_INFO,
            AuthRequest::UserByName { .. } => USER_BY_NAME,
        }
    }

    /// Encodes the request body with `request_id`.
    pub fn encode(&self, request_id: u64) -> Vec<u8> {
        let mut w = Writer::with_capacity(64);
        w.u16(self.opcode()).u64(request_id);
        match self {
            AuthRequest::Login { version, user, password, role } => {
                w.u8(*version).str(user).str(password).u32(*role);
            }
            AuthRequest::ServiceLogin { version, token } => {
                w.u8(*version).raw(token);
            }
            AuthRequest::CreateGroup { name } => {
                w.str(name);
            }
            AuthRequest::SetGroupMember { gid, user, member } => {
                w.u32(*gid).str(user).bool(*member);
            }
            AuthRequest::AddUser { name, password, uid, gid, admin } => {
                w.str(name).str(password).u32(*uid).u32(*gid).bool(*admin);
            }
            AuthRequest::SetUserEnabled { name, enabled } => {
                w.str(name).bool(*enabled);
            }
            AuthRequest::ChangePassword { old_password, new_password } => {
                w.str(old_password).str(new_password);
            }
            AuthRequest::SetPassword { user, password } => {
                w.str(user).str(password);
            }
            AuthRequest::AddRole { role, name } => {
                w.u32(*role).str(name);
            }
            AuthRequest::SetUserRole { user, role, held } => {
                w.str(user).u32(*role).bool(*held);
            }
            AuthRequest::RotateKey | AuthRequest::ListUsers | AuthRequest::IdentityKeys => {}
            AuthRequest::RetireKey { key_id } => {
                w.u32(*key_id);
            }
            AuthRequest::UserInfo { uid, key_id } => {
                w.u32(*uid).u32(*key_id);
            }
            AuthRequest::UserByName { name } => {
                w.str(name);
            }
        }
        w.into_vec()
    }

    /// Decodes a request body: its request id and the request. Every length
    /// is checked against its limit before anything is allocated.
    pub fn decode(body: &[u8]) -> Result<(u64, AuthRequest), DecodeError> {
        use auth_opcode::*;
        let mut r = Reader::new(body);
        let op = r.u16()?;
        let id = r.u64()?;
        let req = match op {
            LOGIN => AuthRequest::Login {
                version: r.u8()?,
                user: user_name(&mut r)?,
                password: r.str(PASSWORD_MAX, "password")?,
                role: r.u32()?,
            },
            SERVICE_LOGIN => AuthRequest::ServiceLogin { version: r.u8()?, token: r.array()? },
            CREATE_GROUP => AuthRequest::CreateGroup { name: short_name(&mut r, "group name")? },
            SET_GROUP_MEMBER => {
                AuthRequest::SetGroupMember { gid: r.u32()?, user: user_name(&mut r)?, member: r.bool()? }
            }
            CHANGE_PASSWORD => AuthRequest::ChangePassword {
                old_password: r.str(PASSWORD_MAX, "old password")?,
                new_password: r.str(PASSWORD_MAX, "new password")?,
            },
            SET_PASSWORD => {
                AuthRequest::SetPassword { user: user_name(&mut r)?, password: r.str(PASSWORD_MAX, "password")? }
            }
            ADD_USER => AuthRequest::AddUser {
                name: user_name(&mut r)?,
                password: r.str(PASSWORD_MAX, "password")?,
                uid: r.u32()?,
                gid: r.u32()?,
                admin: r.bool()?,
            },
            SET_USER_ENABLED => AuthRequest::SetUserEnabled { name: user_name(&mut r)?, enabled: r.bool()? },
            ADD_ROLE => {
                let role = r.u32()?;
                if role == 0 {
                    return Err(DecodeError::NotCanonical("role 0 is no role"));
                }
                AuthRequest::AddRole { role, name: short_name(&mut r, "role name")? }
            }
            SET_USER_ROLE => {
                let user = user_name(&mut r)?;
                let role = r.u32()?;
                if role == 0 {
                    return Err(DecodeError::NotCanonical("role 0 is no role"));
                }
                AuthRequest::SetUserRole { user, role, held: r.bool()? }
            }
            ROTATE_KEY => AuthRequest::RotateKey,
            RETIRE_KEY => AuthRequest::RetireKey { key_id: r.u32()? },
            LIST_USERS => AuthRequest::ListUsers,
            IDENTITY_KEYS => AuthRequest::IdentityKeys,
            USER_INFO => AuthRequest::UserInfo { uid: r.u32()?, key_id: r.u32()? },
            USER_BY_NAME => AuthRequest::UserByName { name: user_name(&mut r)? },
            _ => return Err(DecodeError::NotCanonical("unknown authentication-server opcode")),
        };
        r.finish()?;
        Ok((id, req))
    }
}

/// A user as `LIST_USERS` and `USER_INFO` describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthUser {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// May administer the authentication server and the file manager.
    pub admin: bool,
    /// May log in.
    pub enabled: bool,
    /// The groups it is a member of (made by users with `CREATE_GROUP`):
    /// strictly ascending, at most `GROUPS_MAX`.
    pub groups: Vec<u32>,
    /// The roles it holds: strictly ascending, at most [`ROLES_PER_USER_MAX`].
    pub roles: Vec<u32>,
}

impl AuthUser {
    /// Encoded length at most.
    pub const LEN_MAX: usize = 2 + USER_NAME_MAX + 4 + 4 + 1 + 1 + 2 + 4 * GROUPS_MAX + 2 + 4 * ROLES_PER_USER_MAX;

    fn encode(&self, w: &mut Writer) {
        w.str(&self.name).u32(self.uid).u32(self.gid).bool(self.admin).bool(self.enabled);
        w.u16(self.groups.len() as u16);
        for g in &self.groups {
            w.u32(*g);
        }
        w.u16(self.roles.len() as u16);
        for r in &self.roles {
            w.u32(*r);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let name = user_name(r)?;
        let (uid, gid, admin, enabled) = (r.u32()?, r.u32()?, r.bool()?, r.bool()?);
        let groups = ascending(r, GROUPS_MAX, "groups")?;
        let roles = ascending(r, ROLES_PER_USER_MAX, "roles")?;
        Ok(AuthUser { name, uid, gid, admin, enabled, groups, roles })
    }
}

/// A count-prefixed list of strictly ascending `u32`s.
fn ascending(r: &mut Reader<'_>, max: usize, field: &'static str) -> Result<Vec<u32>, DecodeError> {
    let n = r.count(max, field)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let x = r.u32()?;
        if v.last().is_some_and(|&last| last >= x) {
            return Err(DecodeError::NotCanonical("ids are not strictly ascending"));
        }
        v.push(x);
    }
    Ok(v)
}

/// A shared identity key K and its key id.
#[derive(Clone, PartialEq, Eq)]
pub struct SharedKey {
    /// Key id (≠ 0).
    pub key_id: u32,
    /// The key K.
    pub key: [u8; AUTH_KEY_LEN],
}

impl std::fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedKey").field("key_id", &self.key_id).finish_non_exhaustive()
    }
}

/// A successful reply of the authentication server.
#[derive(Clone, PartialEq, Eq)]
#[allow(missing_docs)] // fields: docs/PROTOCOL.md
pub enum AuthReply {
    /// The request was carried out.
    Done,
    /// A `LOGIN` succeeded: the credential and its identity key.
    LoggedIn {
        /// Who logged in.
        uid: u32,
        /// Primary group.
        gid: u32,
        /// Administrator.
        admin: bool,
        /// Every role the user holds (strictly ascending); the credential
        /// carries the one chosen.
        roles: Vec<u32>,
        /// The identity credential `K_data`.
        credential: IdentityData,
        /// `idkey = MAC_K(K_data)`: secret.
        idkey: [u8; AUTH_KEY_LEN],
    },
    /// The gid of a group just made, and whether the caller was made its
    /// first member (not when it is in `GROUPS_MAX` groups already: it owns
    /// the group all the same).
    Group { gid: u32, member: bool },
    /// The key id of a shared key just made.
    Key { key_id: u32 },
    /// The live shared keys (ascending key ids) and the highest key id ever
    /// made: every id up to it that is not live is retired.
    IdentityKeys { high: u32, keys: Vec<SharedKey> },
    /// A user, and whether the key id asked about is live.
    UserInfo { user: AuthUser, key_live: bool },
    /// Every user.
    Users(Vec<AuthUser>),
    /// One user.
    User(AuthUser),
}

impl std::fmt::Debug for AuthReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthReply::Done => f.write_str("Done"),
            AuthReply::LoggedIn { uid, gid, admin, roles, credential, .. } => f
                .debug_struct("LoggedIn")
                .field("uid", uid)
                .field("gid", gid)
                .field("admin", admin)
                .field("roles", roles)
                .field("credential", credential)
                .finish_non_exhaustive(),
            AuthReply::Group { gid, member } => {
                f.debug_struct("Group").field("gid", gid).field("member", member).finish()
            }
            AuthReply::Key { key_id } => f.debug_struct("Key").field("key_id", key_id).finish(),
            AuthReply::IdentityKeys { high, keys } => {
                f.debug_struct("IdentityKeys").field("high", high).field("keys", keys).finish()
            }
            AuthReply::UserInfo { user, key_live } => {
                f.debug_struct("UserInfo").field("user", user).field("key_live", key_live).finish()
            }
            AuthReply::Users(u) => f.debug_tuple("Users").field(u).finish(),
            AuthReply::User(u) => f.debug_tuple("User").field(u).finish(),
        }
    }
}

/// A decoded reply: the result, or the refusal's status and message.
pub type AuthOutcome = Result<AuthReply, (FsStatus, String)>;

impl AuthReply {
    /// Encodes a successful reply to request `request_id`.
    pub fn encode(&self, request_id: u64) -> Vec<u8> {
        use reply_kind::*;
        let mut w = Writer::with_capacity(64);
        w.u16(FsStatus::Ok.code()).u64(request_id);
        match self {
            AuthReply::Done => {
                w.u8(DONE);
            }
            AuthReply::LoggedIn { uid, gid, admin, roles, credential, idkey } => {
                w.u8(LOGGED_IN).u32(*uid).u32(*gid).bool(*admin).u16(roles.len() as u16);
                for r in roles {
                    w.u32(*r);
                }
                w.raw(&credential.encode()).raw(idkey);
            }
            AuthReply::Group { gid, member } => {
                w.u8(GROUP).u32(*gid).bool(*member);
            }
            AuthReply::Key { key_id } => {
                w.u8(KEY).u32(*key_id);
            }
            AuthReply::IdentityKeys { high, keys } => {
                w.u8(IDENTITY_KEYS).u32(*high).u16(keys.len() as u16);
                for k in keys {
                    w.u32(k.key_id).raw(&k.key);
                }
            }
            AuthReply::UserInfo { user, key_live } => {
                w.u8(USER_INFO);
                user.encode(&mut w);
                w.bool(*key_live);
            }
            AuthReply::Users(users) => {
                w.u8(USERS).u16(users.len() as u16);
                for u in users {
                    u.encode(&mut w);
                }
            }
            AuthReply::User(user) => {
                w.u8(USER);
                user.encode(&mut w);
            }
        }
        w.into_vec()
    }

    /// Encodes a refusal (the message cut to `ERROR_MESSAGE_LEN_MAX` bytes).
    pub fn encode_error(request_id: u64, status: FsStatus, message: &str) -> Vec<u8> {
        crate::manager::ManagerReply::encode_error(request_id, status, message)
    }

    /// Parses a reply body: the request id, then the result or the refusal.
    pub fn decode(body: &[u8]) -> Result<(u64, AuthOutcome), DecodeError> {
        use reply_kind::*;
        let mut r = Reader::new(body);
        let status = FsStatus::from_code(r.u16()?)?;
        let id = r.u64()?;
        if status != FsStatus::Ok {
            let message = r.str(ERROR_MESSAGE_LEN_MAX, "error message")?;
            r.finish()?;
            return Ok((id, Err((status, message))));
        }
        let reply = match r.u8()? {
            DONE => AuthReply::Done,
            LOGGED_IN => {
                let (uid, gid, admin) = (r.u32()?, r.u32()?, r.bool()?);
                let roles = ascending(&mut r, ROLES_PER_USER_MAX, "roles")?;
                let credential = IdentityData::decode(r.take(IDENTITY_DATA_LEN)?)?;
                AuthReply::LoggedIn { uid, gid, admin, roles, credential, idkey: r.array()? }
            }
            GROUP => AuthReply::Group { gid: r.u32()?, member: r.bool()? },
            KEY => AuthReply::Key { key_id: r.u32()? },
            IDENTITY_KEYS => {
                let high = r.u32()?;
                let n = r.count(IDENTITY_KEYS_MAX, "identity keys")?;
                let mut keys: Vec<SharedKey> = Vec::with_capacity(n);
                for _ in 0..n {
                    let key_id = r.u32()?;
                    if key_id == 0 || key_id > high || keys.last().is_some_and(|k| k.key_id >= key_id) {
                        return Err(DecodeError::NotCanonical("identity key ids are not ascending in 1..=high"));
                    }
                    keys.push(SharedKey { key_id, key: r.array()? });
                }
                AuthReply::IdentityKeys { high, keys }
            }
            USER_INFO => AuthReply::UserInfo { user: AuthUser::decode(&mut r)?, key_live: r.bool()? },
            USERS => {
                let n = r.count(AUTH_USERS_MAX, "users")?;
                let mut users = Vec::with_capacity(n);
                for _ in 0..n {
                    users.push(AuthUser::decode(&mut r)?);
                }
                AuthReply::Users(users)
            }
            USER => AuthReply::User(AuthUser::decode(&mut r)?),
            _ => return Err(DecodeError::NotCanonical("unknown authentication-server reply kind")),
        };
        r.finish()?;
        Ok((id, Ok(reply)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn login_known_answer() {
        let req = AuthRequest::Login { version: 1, user: "ann".into(), password: "pw".into(), role: 7 };
        let body = req.encode(5);
        assert_eq!(hex(&body), LOGIN_VECTOR);
        assert_eq!(AuthRequest::decode(&body).unwrap(), (5, req));
    }

    #[test]
    fn password_change_known_answers() {
        let req = AuthRequest::ChangePassword { old_password: "old pw 1".into(), new_password: "new pw 2".into() };
        let body = req.encode(6);
        assert_eq!(hex(&body), CHANGE_PASSWORD_VECTOR);
        assert_eq!(AuthRequest::decode(&body).unwrap(), (6, req.clone()));
        let req2 = AuthRequest::SetPassword { user: "bob".into(), password: "bob pw 3".into() };
        let body2 = req2.encode(7);
        assert_eq!(hex(&body2), SET_PASSWORD_VECTOR);
        assert_eq!(AuthRequest::decode(&body2).unwrap(), (7, req2.clone()));
        // Passwords never print.
        for shown in [format!("{req:?}"), format!("{req2:?}")] {
            assert!(!shown.contains("pw"), "{shown}");
        }
        // The longest passwords decode; one byte more does not; an empty user name does not.
        let longest = AuthRequest::ChangePassword {
            old_password: "o".repeat(PASSWORD_MAX),
            new_password: "n".repeat(PASSWORD_MAX),
        };
        assert_eq!(AuthRequest::decode(&longest.encode(1)).unwrap().1, longest);
        assert!(longest.encode(1).len() <= AUTH_MESSAGE_MAX);
        for bad in [
            AuthRequest::ChangePassword { old_password: "o".into(), new_password: "n".repeat(PASSWORD_MAX + 1) },
            AuthRequest::ChangePassword { old_password: "o".repeat(PASSWORD_MAX + 1), new_password: "n".into() },
            AuthRequest::SetPassword { user: "bob".into(), password: "p".repeat(PASSWORD_MAX + 1) },
            AuthRequest::SetPassword { user: String::new(), password: "p".into() },
        ] {
            assert!(AuthRequest::decode(&bad.encode(1)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn logged_in_known_answer() {
        let credential =
            IdentityData { algorithm: 1, key_id: 2, user: 1000, role: 7, expiration_ns: 0x0102030405060708 };
        let reply =
            AuthReply::LoggedIn { uid: 1000, gid: 100, admin: false, roles: vec![7, 9], credential, idkey: [0xab; 32] };
        let body = reply.encode(5);
        assert_eq!(hex(&body), LOGGED_IN_VECTOR);
        assert_eq!(AuthReply::decode(&body).unwrap(), (5, Ok(reply)));
    }

    #[test]
    fn group_known_answer() {
        let reply = AuthReply::Group { gid: 1 << 20, member: false };
        let body = reply.encode(4);
        assert_eq!(hex(&body), GROUP_VECTOR);
        assert_eq!(AuthReply::decode(&body).unwrap(), (4, Ok(reply)));
        assert!(AuthReply::decode(&body[..body.len() - 1]).is_err(), "member is part of the reply");
    }

    #[test]
    fn identity_keys_known_answer_and_order() {
        let reply = AuthReply::IdentityKeys { high: 3, keys: vec![SharedKey { key_id: 3, key: [1; 32] }] };
        let body = reply.encode(1);
        assert_eq!(hex(&body[..21]), concat!("0000", "0100000000000000", "04", "03000000", "0100", "03000000"));
        assert_eq!(&body[21..], &[1u8; 32][..]);
        assert_eq!(AuthReply::decode(&body).unwrap().1, Ok(reply));
        // A key id above `high` does not decode.
        let bad = AuthReply::IdentityKeys { high: 2, keys: vec![SharedKey { key_id: 3, key: [1; 32] }] };
        assert!(AuthReply::decode(&bad.encode(1)).is_err());
    }

    #[test]
    fn login_identity_known_answer() {
        use crate::manager::ManagerRequest;
        let credential =
            IdentityData { algorithm: 1, key_id: 2, user: 1000, role: 7, expiration_ns: 2_000_000_000_000_000_000 };
        let mut proof = [0u8; 32];
        let hexproof = "8656397b33ba1913eeb4b63fa1d1f7262527479d287841747cd7e549be1a55e8";
        for (i, b) in proof.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hexproof[2 * i..2 * i + 2], 16).unwrap();
        }
        let req = ManagerRequest::LoginIdentity { version: 1, credential: credential.encode(), proof };
        let body = req.encode(3);
        assert_eq!(hex(&body), LOGIN_IDENTITY_VECTOR);
        assert_eq!(ManagerRequest::decode(&body).unwrap(), (3, req));
        assert!(body.len() <= crate::manager::LOGIN_MESSAGE_MAX, "fits before login");
        // A credential that does not decode (format byte) still frames: the manager refuses
        // it as a wrong credential, as one whose proof does not verify.
        let mut bad = body.clone();
        bad[11] = 1;
        let Ok((3, ManagerRequest::LoginIdentity { credential, .. })) = ManagerRequest::decode(&bad) else {
            panic!("a LOGIN_IDENTITY of 24 credential bytes frames")
        };
        assert!(IdentityData::decode(&credential).is_err());
        // Only the length is the decoder's: one byte short does not decode.
        assert!(ManagerRequest::decode(&body[..body.len() - 1]).is_err());
    }

    const LOGIN_VECTOR: &str = "01000500000000000000010300616e6e0200707707000000";
    const CHANGE_PASSWORD_VECTOR: &str = "1200060000000000000008006f6c64207077203108006e65772070772032";
    const SET_PASSWORD_VECTOR: &str = "080107000000000000000300626f620800626f622070772033";
    const LOGGED_IN_VECTOR: &str = concat!(
        "0000050000000000000001e80300006400000000020007000000090000000301000002000000e8030000070000000807060504030201",
        "abababababababababababababababababababababababababababababababab"
    );
    const GROUP_VECTOR: &str = "00000400000000000000020000100000";
    const LOGIN_IDENTITY_VECTOR: &str = concat!(
        "1c000300000000000000010301000002000000e8030000070000000000c84e676dc11b",
        "8656397b33ba1913eeb4b63fa1d1f7262527479d287841747cd7e549be1a55e8"
    );

    /// The vectors above are in PROTOCOL.md exactly.
    #[test]
    fn vectors_are_published_in_protocol_md() {
        let doc = include_str!("../../../docs/PROTOCOL.md");
        for v in [
            LOGIN_VECTOR,
            LOGGED_IN_VECTOR,
            LOGIN_IDENTITY_VECTOR,
            CHANGE_PASSWORD_VECTOR,
            SET_PASSWORD_VECTOR,
            GROUP_VECTOR,
        ] {
            assert!(doc.lines().any(|l| l.trim() == v), "{v} is not published in PROTOCOL.md");
        }
    }

    /// Mutated valid bodies: no panic, and what decodes re-encodes to the same bytes
    /// (the property `fuzz/fuzz_targets/auth_decode.rs` checks at length).
    #[test]
    fn mutations_decode_canonically_or_not_at_all() {
        let credential = IdentityData { algorithm: 1, key_id: 2, user: 1000, role: 7, expiration_ns: 99 };
        let user = AuthUser {
            name: "ann".into(),
            uid: 1,
            gid: 2,
            admin: true,
            enabled: false,
            groups: vec![3, 5],
            roles: vec![7],
        };
        let bodies = vec![
            AuthRequest::Login { version: 1, user: "ann".into(), password: "pw".into(), role: 7 }.encode(1),
            AuthRequest::SetGroupMember { gid: 9, user: "bob".into(), member: true }.encode(2),
            AuthRequest::AddUser { name: "c".into(), password: "p".into(), uid: 4, gid: 0, admin: false }.encode(3),
            AuthRequest::UserInfo { uid: 4, key_id: 2 }.encode(4),
            AuthRequest::ChangePassword { old_password: "old".into(), new_password: "new one".into() }.encode(9),
            AuthRequest::SetPassword { user: "dan".into(), password: "dan's".into() }.encode(10),
            AuthReply::LoggedIn { uid: 1, gid: 2, admin: false, roles: vec![7], credential, idkey: [1; 32] }.encode(5),
            AuthReply::IdentityKeys { high: 4, keys: vec![SharedKey { key_id: 2, key: [2; 32] }] }.encode(6),
            AuthReply::UserInfo { user: user.clone(), key_live: true }.encode(7),
            AuthReply::Users(vec![user.clone()]).encode(8),
            AuthReply::User(user).encode(11),
            AuthRequest::UserByName { name: "eve".into() }.encode(12),
            AuthReply::Group { gid: 1 << 20, member: true }.encode(13),
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for body in &bodies {
            for _ in 0..2000 {
                let mut b = body.clone();
                for _ in 0..(1 + next() % 3) {
                    let i = (next() as usize) % b.len();
                    b[i] = next() as u8;
                }
                if next() % 4 == 0 {
                    b.truncate((next() as usize) % (b.len() + 1));
                }
                if let Ok((id, req)) = AuthRequest::decode(&b) {
                    assert_eq!(req.encode(id), b);
                }
                if let Ok((id, reply)) = AuthReply::decode(&b) {
                    let again = match &reply {
                        Ok(r) => r.encode(id),
                        Err((status, message)) => AuthReply::encode_error(id, *status, message),
                    };
                    assert_eq!(again, b);
                }
            }
        }
    }

    #[test]
    fn bounds_and_bad_input() {
        // Too many roles, a role 0, unknown opcodes, trailing bytes: refused, never a panic.
        let mut w = Writer::with_capacity(16);
        w.u16(auth_opcode::ADD_ROLE).u64(1).u32(0).str("r");
        assert!(AuthRequest::decode(&w.into_vec()).is_err());
        let mut w = Writer::with_capacity(16);
        w.u16(0x7777).u64(1);
        assert!(AuthRequest::decode(&w.into_vec()).is_err());
        let mut body = AuthRequest::RotateKey.encode(1);
        body.push(0);
        assert!(AuthRequest::decode(&body).is_err());
        let mut w = Writer::with_capacity(16);
        w.u16(0).u64(1).u8(reply_kind::USERS).u16(AUTH_USERS_MAX as u16 + 1);
        assert!(AuthReply::decode(&w.into_vec()).is_err());
        for n in 0..40 {
            let body = AuthRequest::Login { version: 1, user: "u".into(), password: "p".into(), role: 1 }.encode(9);
            let _ = AuthRequest::decode(&body[..n.min(body.len())]);
        }
        // The longest login fits the pre-login limit exactly.
        let longest = AuthRequest::Login {
            version: 1,
            user: "u".repeat(USER_NAME_MAX),
            password: "p".repeat(PASSWORD_MAX),
            role: 1,
        };
        assert_eq!(longest.encode(1).len(), AUTH_LOGIN_MESSAGE_MAX);
        assert!(!format!("{longest:?}").contains("ppp"), "passwords never print");
    }
}
