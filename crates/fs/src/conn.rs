//! The client's TLS connections to its file manager: each logs in once,
//! then carries one request at a time; a [`ManagerPool`] keeps up to
//! [`MANAGER_CONNECTIONS_MAX`] of them so concurrent requests do not queue
//! behind one another.

use crate::FsError;
use nasd_proto::fs::FsStatus;
use nasd_proto::manager::{ManagerReply, ManagerRequest, MANAGER_MESSAGE_MAX, MANAGER_PROTOCOL_VERSION};
use nasd_proto::DecodeError;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Connections to the manager one client keeps at once. The manager protocol
/// serves one request at a time per connection, so this is how many requests
/// of one client (concurrent files, tasks sharing an [`crate::FsClient`]) are in
/// flight together; more wait for a free connection. Each costs a TLS session,
/// a login (an argon2id hash on the manager, ~19 MiB and tens of milliseconds
/// there, paid once per connection), and one of the manager's
/// `SESSIONS_MAX` sessions. Connections are opened only when requests overlap.
pub const MANAGER_CONNECTIONS_MAX: usize = 4;
/// Longest a connection may sit idle and still be reused. The manager closes
/// a connection after 600 s without a request (`IDLE_TIMEOUT`); a request
/// sent on a connection it just closed fails, and is never resent (it may not
/// be idempotent), so older idle connections are closed and replaced instead.
pub const MANAGER_IDLE_REUSE_MAX: Duration = Duration::from_secs(300);

const _: () = assert!(MANAGER_CONNECTIONS_MAX > 0);

/// Who the manager says the connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// May run administrator requests.
    pub admin: bool,
}

/// A logged-in connection.
pub(crate) struct ManagerConn {
    stream: TlsStream<TcpStream>,
    next_id: u64,
    /// Set while a request is in flight; left set if it did not finish.
    broken: bool,
}

/// A TLS connector that trusts only the CA certificate(s) in `ca_pem`.
pub fn connector(ca_pem: &Path) -> Result<TlsConnector, FsError> {
    let pem = std::fs::read(ca_pem)
        .map_err(|e| FsError::Setup(format!("cannot read the cluster CA certificate {}: {e}", ca_pem.display())))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        let cert = cert.map_err(|e| FsError::Setup(format!("{} is not a PEM certificate: {e}", ca_pem.display())))?;
        roots.add(cert).map_err(|e| FsError::Setup(format!("{}: {e}", ca_pem.display())))?;
    }
    if roots.is_empty() {
        return Err(FsError::Setup(format!("{} holds no certificate", ca_pem.display())));
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| FsError::Setup(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}

impl ManagerConn {
    /// Connects, verifies the manager's certificate for `server_name`, logs in.
    pub(crate) async fn open(
        addr: &str,
        server_name: &str,
        tls: &TlsConnector,
        user: &str,
        password: &str,
    ) -> Result<(Self, Identity), FsError> {
        let socket = TcpStream::connect(addr).await.map_err(|e| {
            FsError::Setup(format!("cannot reach the manager at {addr}: {e} (is `nasd up` or `nasd manager` running?)"))
        })?;
        socket.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
            .map_err(|_| FsError::Setup(format!("'{server_name}' is not a valid TLS server name")))?;
        let stream = tls
            .connect(name, socket)
            .await
            .map_err(|e| FsError::Setup(format!("TLS with the manager at {addr} failed: {e}")))?;
        let mut conn = ManagerConn { stream, next_id: 1, broken: false };
        let login =
            ManagerRequest::Login { version: MANAGER_PROTOCOL_VERSION, user: user.into(), password: password.into() };
        match conn.call(&login).await? {
            ManagerReply::LoggedIn { uid, gid, admin, .. } => Ok((conn, Identity { uid, gid, admin })),
            other => Err(FsError::Protocol(format!("unexpected login reply {other:?}"))),
        }
    }

    /// Sends a request and waits for its reply.
    pub(crate) async fn call(&mut self, req: &ManagerRequest) -> Result<ManagerReply, FsError> {
        if self.broken {
            return Err(FsError::Protocol("manager connection unusable after an earlier failure".into()));
        }
        // The manager would refuse it, and a string over u16::MAX bytes cannot be encoded at all.
        if let Err(e) = req.check_limits() {
            let status = match e {
                DecodeError::OverLimit { field: "path" | "name" | "target", .. } => FsStatus::NameTooLong,
                _ => FsStatus::InvalidArgument,
            };
            return Err(FsError::Fs { status, message: format!("{}: {e}", req.name()) });
        }
        self.broken = true;
        let id = self.next_id;
        self.next_id += 1;
        let body = req.encode(id);
        if body.len() > MANAGER_MESSAGE_MAX {
            self.broken = false;
            return Err(FsError::Protocol("request over MANAGER_MESSAGE_MAX".into()));
        }
        self.stream.write_all(&(body.len() as u32).to_le_bytes()).await?;
        self.stream.write_all(&body).await?;
        self.stream.flush().await?;
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).await?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MANAGER_MESSAGE_MAX {
            return Err(FsError::Protocol(format!("reply of {len} bytes is over MANAGER_MESSAGE_MAX")));
        }
        let mut reply = vec![0u8; len];
        self.stream.read_exact(&mut reply).await?;
        let (reply_id, result) = ManagerReply::decode(&reply).map_err(|e| FsError::Protocol(e.to_string()))?;
        if reply_id != id {
            return Err(FsError::Protocol(format!("reply to request {reply_id}, expected {id}")));
        }
        self.broken = false;
        result.map_err(|(status, message)| FsError::Fs { status, message })
    }
}

/// Where and as whom a [`ManagerPool`] connects.
struct Login {
    addr: String,
    server_name: String,
    tls: TlsConnector,
    user: String,
    password: String,
}

/// Up to [`MANAGER_CONNECTIONS_MAX`] logged-in connections to one manager,
/// as one user: a request takes an idle connection (or opens one while fewer
/// than the bound exist), and gives it back when its reply arrived. A
/// connection whose request failed in transport or protocol is closed, never
/// reused; the request is not resent.
pub(crate) struct ManagerPool {
    login: Login,
    permits: tokio::sync::Semaphore,
    /// Idle connections and when each was last used.
    idle: Mutex<Vec<(ManagerConn, Instant)>>,
}

impl ManagerPool {
    /// Connects and logs in once (so a wrong password or an unreachable
    /// manager fails here), keeping that connection as the first idle one.
    pub(crate) async fn open(
        addr: &str,
        server_name: &str,
        tls: &TlsConnector,
        user: &str,
        password: &str,
    ) -> Result<(ManagerPool, Identity), FsError> {
        let login = Login {
            addr: addr.into(),
            server_name: server_name.into(),
            tls: tls.clone(),
            user: user.into(),
            password: password.into(),
        };
        let (conn, identity) = ManagerConn::open(addr, server_name, tls, user, password).await?;
        let pool = ManagerPool {
            login,
            permits: tokio::sync::Semaphore::new(MANAGER_CONNECTIONS_MAX),
            idle: Mutex::new(vec![(conn, Instant::now())]),
        };
        Ok((pool, identity))
    }

    fn take_idle(&self) -> Option<ManagerConn> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((conn, used)) = idle.pop() {
            if used.elapsed() <= MANAGER_IDLE_REUSE_MAX {
                return Some(conn);
            }
        }
        None
    }

    /// Sends one request on a free connection and waits for its reply.
    ///
    /// # Cancel safety
    /// Dropping the future closes the connection it was using (its request
    /// may or may not have reached the manager); the pool opens another when
    /// needed.
    pub(crate) async fn call(&self, req: &ManagerRequest) -> Result<ManagerReply, FsError> {
        let _permit = self.permits.acquire().await.expect("the pool never closes its semaphore");
        let mut conn = match self.take_idle() {
            Some(c) => c,
            None => {
                let l = &self.login;
                ManagerConn::open(&l.addr, &l.server_name, &l.tls, &l.user, &l.password).await?.0
            }
        };
        let r = conn.call(req).await;
        if !conn.broken {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            idle.push((conn, Instant::now()));
        }
        r
    }

    /// Idle connections held (for tests and diagnostics).
    pub(crate) fn idle_connections(&self) -> usize {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
