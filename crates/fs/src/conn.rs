//! The client's TLS connection to its file manager: log in once, then one
//! request at a time.

use crate::{FsConfig, FsError};
use nasd_proto::fs::FsStatus;
use nasd_proto::manager::{ManagerReply, ManagerRequest, MANAGER_MESSAGE_MAX, MANAGER_PROTOCOL_VERSION};
use nasd_proto::DecodeError;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

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
    /// The manager's address and how long each wait for it may take.
    deadline: (String, Duration),
}

/// `step`, failing with `TimedOut` if the manager does not let it finish in time.
async fn within<T>(
    (addr, limit): &(String, Duration),
    what: &str,
    step: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout(*limit, step).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the manager at {addr} did not {what} within {limit:?}"),
        ))
    })
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
    /// Connects, verifies the manager's certificate for the configured
    /// server name, logs in; each step within `config.reply_timeout`.
    pub(crate) async fn open(config: &FsConfig, tls: &TlsConnector) -> Result<(Self, Identity), FsError> {
        let (addr, server_name) = (&config.manager, &config.server_name);
        let deadline = (addr.clone(), config.reply_timeout);
        let socket = within(&deadline, "accept the connection", TcpStream::connect(addr)).await.map_err(|e| {
            FsError::Setup(format!("cannot reach the manager at {addr}: {e} (is `nasd up` or `nasd manager` running?)"))
        })?;
        socket.set_nodelay(true)?;
        let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
            .map_err(|_| FsError::Setup(format!("'{server_name}' is not a valid TLS server name")))?;
        let stream = within(&deadline, "finish TLS", tls.connect(name, socket))
            .await
            .map_err(|e| FsError::Setup(format!("TLS with the manager at {addr} failed: {e}")))?;
        let mut conn = ManagerConn { stream, next_id: 1, broken: false, deadline };
        let (user, password) = (config.user.clone(), config.password.clone());
        let login = ManagerRequest::Login { version: MANAGER_PROTOCOL_VERSION, user, password };
        match conn.call(&login).await? {
            ManagerReply::LoggedIn { uid, gid, admin, .. } => Ok((conn, Identity { uid, gid, admin })),
            other => Err(FsError::Protocol(format!("unexpected login reply {other:?}"))),
        }
    }

    /// True once a request did not finish: the stream is in an unknown state.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
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
        let stream = &mut self.stream;
        within(&self.deadline, "take the request", async {
            stream.write_all(&(body.len() as u32).to_le_bytes()).await?;
            stream.write_all(&body).await?;
            stream.flush().await
        })
        .await?;
        let mut len = [0u8; 4];
        within(&self.deadline, "answer", stream.read_exact(&mut len)).await?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MANAGER_MESSAGE_MAX {
            return Err(FsError::Protocol(format!("reply of {len} bytes is over MANAGER_MESSAGE_MAX")));
        }
        let mut reply = vec![0u8; len];
        within(&self.deadline, "send the whole reply it announced", stream.read_exact(&mut reply)).await?;
        let (reply_id, result) = ManagerReply::decode(&reply).map_err(|e| FsError::Protocol(e.to_string()))?;
        if reply_id != id {
            return Err(FsError::Protocol(format!("reply to request {reply_id}, expected {id}")));
        }
        self.broken = false;
        result.map_err(|(status, message)| FsError::Fs { status, message })
    }
}
