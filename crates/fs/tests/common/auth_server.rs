//! An authentication server (`nasd_auth`) on loopback for the tests that
//! link managers and clients to one: its own temporary directory and CA,
//! the administrator `ROOT` bootstrapped. Apart from `common` (which the
//! FUSE tests share, without the authentication server's crates): a test
//! includes it with `#[path = "common/auth_server.rs"] mod auth_server;`.

#![allow(dead_code)] // each test binary uses part of it

use crate::common::to;
use nasd_auth::{AuthConfig, AuthServer};
use nasd_login::auth_client::{AuthClient, AuthError, IdentityGrant};
use nasd_manager::identity::AuthLink;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The authentication server's administrator, made at start.
pub const ROOT: &str = "root";
/// Its password.
pub const ROOT_PW: &str = "root password";

/// An authentication server on loopback with its own CA.
pub struct Auth0 {
    pub server: Arc<AuthServer>,
    pub addr: String,
    pub ca: PathBuf,
    stop: watch::Sender<bool>,
    acceptor: tokio_rustls::TlsAcceptor,
    _dir: tempfile::TempDir,
}

impl Auth0 {
    pub async fn start() -> Auth0 {
        Auth0::start_with(AuthConfig::default()).await
    }

    pub async fn start_with(config: AuthConfig) -> Auth0 {
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let files = nasd_login::tls::ensure_certificates(&dir.path().join("tls"), &names).unwrap();
        let acceptor = nasd_login::tls::acceptor(&files).unwrap();
        let server = Arc::new(AuthServer::open(&dir.path().join("auth"), config).unwrap());
        assert!(to(server.bootstrap_admin(ROOT, ROOT_PW, 0)).await.unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (stop, rx) = watch::channel(false);
        tokio::spawn(server.clone().serve(listener, acceptor.clone(), rx));
        Auth0 { server, addr, ca: files.ca, stop, acceptor, _dir: dir }
    }

    /// Stops serving (the same server serves again after [`resume`](Self::resume)).
    pub fn halt(&self) {
        let _ = self.stop.send(true);
    }

    /// Serves again on the same address.
    pub async fn resume(&mut self) {
        let mut tries = 0;
        let listener = loop {
            match tokio::net::TcpListener::bind(&self.addr).await {
                Ok(l) => break l,
                // The stopped accept loop may not have let go of the port yet.
                Err(e) if tries < 50 => {
                    tries += 1;
                    tracing::debug!(error = %e, "the authentication server's port is still taken");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot listen on {} again: {e}", self.addr),
            }
        };
        let (stop, rx) = watch::channel(false);
        tokio::spawn(self.server.clone().serve(listener, self.acceptor.clone(), rx));
        self.stop = stop;
    }

    pub fn link(&self) -> AuthLink {
        AuthLink::new(vec![self.addr.clone()], "localhost".into(), &self.ca, self.server.service_token().clone())
            .expect("the authentication server's CA")
    }

    pub async fn login(&self, user: &str, password: &str, role: u32) -> Result<(AuthClient, IdentityGrant), AuthError> {
        let tls = nasd_login::auth_client::connector(&self.ca).unwrap();
        to(AuthClient::login(&self.addr, "localhost", &tls, user, password, role)).await
    }

    pub async fn grant(&self, user: &str, password: &str, role: u32) -> IdentityGrant {
        self.login(user, password, role).await.expect("log in at the authentication server").1
    }
}
