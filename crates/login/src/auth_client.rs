//! A connection to the authentication server (`nasd auth`): TLS to a server
//! whose certificate the cluster CA signed, then one request at a time
//! (docs/PROTOCOL.md, "Authentication-server protocol"). Users log in with
//! a password and get an identity credential and its identity key; the file
//! manager logs in with its service token and fetches the shared keys K.

use nasd_crypto::Key;
use nasd_proto::auth::{
    AuthReply, AuthRequest, AuthUser, SharedKey, AUTH_MESSAGE_MAX, AUTH_PROTOCOL_VERSION, SERVICE_TOKEN_LEN,
};
use nasd_proto::fs::FsStatus;
use nasd_proto::IdentityData;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Longest one step with the authentication server (connect, TLS, a
/// request and its reply, an argon2 check included) may take.
pub const AUTH_REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a call to the authentication server failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The server refused the request.
    #[error("the authentication server refused: {message} ({status:?})")]
    Refused {
        /// Its status.
        status: FsStatus,
        /// Its message.
        message: String,
    },
    /// Could not reach it, TLS failed, the connection broke or timed out.
    #[error("authentication server: {0}")]
    Io(#[from] std::io::Error),
    /// It answered something that does not decode or does not fit the request.
    #[error("authentication server protocol error: {0}")]
    Protocol(String),
    /// Bad local setup (CA file, server name).
    #[error("{0}")]
    Setup(String),
}

impl AuthError {
    /// The refusal's status, if the server refused.
    pub fn status(&self) -> Option<FsStatus> {
        match self {
            AuthError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A group just made (`CREATE_GROUP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewGroup {
    /// Its gid.
    pub gid: u32,
    /// Whether its owner, the caller, is its first member: not if it was in
    /// `GROUPS_MAX` groups already (it may add itself once it is in fewer).
    pub member: bool,
}

/// What a password login gives a user: the credential, its identity key,
/// and the user as the server knows it.
#[derive(Clone)]
pub struct IdentityGrant {
    /// The credential `K_data` (public).
    pub credential: IdentityData,
    /// `idkey = MAC_K(K_data)` (secret).
    pub idkey: Key,
    /// User id.
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
    /// Administrator.
    pub admin: bool,
    /// Every role the user holds.
    pub roles: Vec<u32>,
}

impl std::fmt::Debug for IdentityGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityGrant")
            .field("credential", &self.credential)
            .field("uid", &self.uid)
            .field("roles", &self.roles)
            .finish_non_exhaustive()
    }
}

/// A TLS connector that trusts only the certificates in the PEM file `ca_pem`.
pub fn connector(ca_pem: &Path) -> Result<TlsConnector, AuthError> {
    let pem = std::fs::read(ca_pem)
        .map_err(|e| AuthError::Setup(format!("cannot read the cluster CA certificate {}: {e}", ca_pem.display())))?;
    connector_from_pem(&pem, &ca_pem.display().to_string())
}

/// A TLS connector that trusts only the certificates in `pem` (named
/// `what` in errors).
pub fn connector_from_pem(pem: &[u8], what: &str) -> Result<TlsConnector, AuthError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        let cert = cert.map_err(|e| AuthError::Setup(format!("{what} is not a PEM certificate: {e}")))?;
        roots.add(cert).map_err(|e| AuthError::Setup(format!("{what}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(AuthError::Setup(format!("{what} holds no certificate")));
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| AuthError::Setup(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Writes one message (length, body).
pub async fn write_frame(w: &mut (impl AsyncWrite + Unpin), body: &[u8]) -> std::io::Result<()> {
    w.write_all(&(body.len() as u32).to_le_bytes()).await?;
    w.write_all(body).await?;
    w.flush().await
}

/// Reads one message of at most `max` bytes; `None` at a clean end of
/// stream. A longer one is an error, its body never read.
pub async fn read_frame(r: &mut (impl AsyncRead + Unpin), max: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a message of {len} bytes is over the limit of {max}"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(Some(body))
}

/// A logged-in connection to the authentication server.
pub struct AuthClient {
    stream: TlsStream<nasd_env::Stream>,
    next_id: u64,
}

impl AuthClient {
    async fn connect(
        env: &nasd_env::Env,
        addr: &str,
        server_name: &str,
        tls: &TlsConnector,
    ) -> Result<AuthClient, AuthError> {
        let timeout = |what: &str| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{addr} did not {what} in {AUTH_REPLY_TIMEOUT:?}"),
            )
        };
        let socket = tokio::time::timeout(AUTH_REPLY_TIMEOUT, env.connect(addr))
            .await
            .map_err(|_| timeout("accept"))?
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "cannot reach the authentication server at {addr}: {e} (is `nasd up` or `nasd auth` running?)"
                    ),
                )
            })?;
        socket.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
            .map_err(|_| AuthError::Setup(format!("'{server_name}' is not a valid TLS server name")))?;
        let stream = tokio::time::timeout(AUTH_REPLY_TIMEOUT, tls.connect(name, socket))
            .await
            .map_err(|_| timeout("finish TLS"))??;
        Ok(AuthClient { stream, next_id: 1 })
    }

    /// Logs in as `user` with `password`, assuming `role` (0: none) for
    /// the session; the grant holds the identity key.
    pub async fn login(
        addr: &str,
        server_name: &str,
        tls: &TlsConnector,
        user: &str,
        password: &str,
        role: u32,
    ) -> Result<(AuthClient, IdentityGrant), AuthError> {
        Self::login_in(&nasd_env::Env::real(), addr, server_name, tls, user, password, role).await
    }

    /// [`AuthClient::login`] over `env`'s network.
    pub async fn login_in(
        env: &nasd_env::Env,
        addr: &str,
        server_name: &str,
        tls: &TlsConnector,
        user: &str,
        password: &str,
        role: u32,
    ) -> Result<(AuthClient, IdentityGrant), AuthError> {
        let mut c = Self::connect(env, addr, server_name, tls).await?;
        let req =
            AuthRequest::Login { version: AUTH_PROTOCOL_VERSION, user: user.into(), password: password.into(), role };
        match c.call(&req).await? {
            AuthReply::LoggedIn { uid, gid, admin, roles, credential, idkey } => {
                let grant = IdentityGrant { credential, idkey: Key::from_bytes(idkey), uid, gid, admin, roles };
                Ok((c, grant))
            }
            other => Err(AuthError::Protocol(format!("unexpected login reply {other:?}"))),
        }
    }

    /// Logs in as the file manager with the service token.
    pub async fn service_login(
        addr: &str,
        server_name: &str,
        tls: &TlsConnector,
        token: &Key,
    ) -> Result<AuthClient, AuthError> {
        Self::service_login_in(&nasd_env::Env::real(), addr, server_name, tls, token).await
    }

    /// [`AuthClient::service_login`] over `env`'s network.
    pub async fn service_login_in(
        env: &nasd_env::Env,
        addr: &str,
        server_name: &str,
        tls: &TlsConnector,
        token: &Key,
    ) -> Result<AuthClient, AuthError> {
        let mut c = Self::connect(env, addr, server_name, tls).await?;
        let token: [u8; SERVICE_TOKEN_LEN] = *token.expose();
        match c.call(&AuthRequest::ServiceLogin { version: AUTH_PROTOCOL_VERSION, token }).await? {
            AuthReply::Done => Ok(c),
            other => Err(AuthError::Protocol(format!("unexpected service login reply {other:?}"))),
        }
    }

    /// Sends one request and reads its reply.
    pub async fn call(&mut self, req: &AuthRequest) -> Result<AuthReply, AuthError> {
        let id = self.next_id;
        self.next_id += 1;
        let step = async {
            write_frame(&mut self.stream, &req.encode(id)).await?;
            read_frame(&mut self.stream, AUTH_MESSAGE_MAX).await
        };
        let body = tokio::time::timeout(AUTH_REPLY_TIMEOUT, step).await.map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no reply within {AUTH_REPLY_TIMEOUT:?}"))
        })??;
        let body = body.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the authentication server closed the connection")
        })?;
        let (reply_id, outcome) = AuthReply::decode(&body).map_err(|e| AuthError::Protocol(e.to_string()))?;
        if reply_id != id {
            return Err(AuthError::Protocol(format!("reply to request {reply_id}, expected {id}")));
        }
        outcome.map_err(|(status, message)| AuthError::Refused { status, message })
    }

    async fn done(&mut self, req: AuthRequest) -> Result<(), AuthError> {
        match self.call(&req).await? {
            AuthReply::Done => Ok(()),
            other => Err(AuthError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Makes a group the caller owns: its gid, and whether the caller is
    /// its first member (not if it is in `GROUPS_MAX` groups already).
    pub async fn create_group(&mut self, name: &str) -> Result<NewGroup, AuthError> {
        match self.call(&AuthRequest::CreateGroup { name: name.into() }).await? {
            AuthReply::Group { gid, member } => Ok(NewGroup { gid, member }),
            other => Err(AuthError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Adds (`member`) or removes `user` from group `gid` (its owner or an administrator).
    pub async fn set_group_member(&mut self, gid: u32, user: &str, member: bool) -> Result<(), AuthError> {
        self.done(AuthRequest::SetGroupMember { gid, user: user.into(), member }).await
    }

    /// Changes the logged-in user's own password: `old` is the current one
    /// (`BAD_CREDENTIALS` if wrong, and nothing changes). Identity keys
    /// already issued stay valid until they expire.
    pub async fn change_password(&mut self, old: &str, new: &str) -> Result<(), AuthError> {
        self.done(AuthRequest::ChangePassword { old_password: old.into(), new_password: new.into() }).await
    }

    /// Administrator: sets `user`'s password (no old one needed).
    pub async fn set_password(&mut self, user: &str, password: &str) -> Result<(), AuthError> {
        self.done(AuthRequest::SetPassword { user: user.into(), password: password.into() }).await
    }

    /// Administrator: a new user (gid 0: its uid).
    pub async fn add_user(
        &mut self,
        name: &str,
        password: &str,
        uid: u32,
        gid: u32,
        admin: bool,
    ) -> Result<(), AuthError> {
        self.done(AuthRequest::AddUser { name: name.into(), password: password.into(), uid, gid, admin }).await
    }

    /// Administrator: enables or disables a user.
    pub async fn set_user_enabled(&mut self, name: &str, enabled: bool) -> Result<(), AuthError> {
        self.done(AuthRequest::SetUserEnabled { name: name.into(), enabled }).await
    }

    /// Administrator: a new role.
    pub async fn add_role(&mut self, role: u32, name: &str) -> Result<(), AuthError> {
        self.done(AuthRequest::AddRole { role, name: name.into() }).await
    }

    /// Administrator: gives (`held`) or takes `role` from `user`.
    pub async fn set_user_role(&mut self, user: &str, role: u32, held: bool) -> Result<(), AuthError> {
        self.done(AuthRequest::SetUserRole { user: user.into(), role, held }).await
    }

    /// Administrator: a new shared key; its key id.
    pub async fn rotate_key(&mut self) -> Result<u32, AuthError> {
        match self.call(&AuthRequest::RotateKey).await? {
            AuthReply::Key { key_id } => Ok(key_id),
            other => Err(AuthError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Administrator: retires a key id.
    pub async fn retire_key(&mut self, key_id: u32) -> Result<(), AuthError> {
        self.done(AuthRequest::RetireKey { key_id }).await
    }

    /// Administrator: every user.
    pub async fn users(&mut self) -> Result<Vec<AuthUser>, AuthError> {
        match self.call(&AuthRequest::ListUsers).await? {
            AuthReply::Users(u) => Ok(u),
            other => Err(AuthError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Service: the live shared keys and the highest key id ever made.
    pub async fn identity_keys(&mut self) -> Result<(u32, Vec<SharedKey>), AuthError> {
        match self.call(&AuthRequest::IdentityKeys).await? {
            AuthReply::IdentityKeys { high, keys } => Ok((high, keys)),
            other => Err(AuthError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Service: the user named `name`.
    pub async fn user_by_name(&mut self, name: &str) -> Result<AuthUser, AuthError> {
        match self.call(&AuthRequest::UserByName { name: name.into() }).await? {
            AuthReply::User(user) => Ok(user),
            other => Err(AuthError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Service: user `uid`, and whether `key_id` is live.
    pub async fn user_info(&mut self, uid: u32, key_id: u32) -> Result<(AuthUser, bool), AuthError> {
        match self.call(&AuthRequest::UserInfo { uid, key_id }).await? {
            AuthReply::UserInfo { user, key_live } => Ok((user, key_live)),
            other => Err(AuthError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }
}
