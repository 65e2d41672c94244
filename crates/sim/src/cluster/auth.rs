//! The authentication server in the whole-cluster world: the real
//! `nasd_auth::AuthServer` on its own host — its SQLite database on its
//! simulated disk, its sessions and argon2 work the host's tasks, its
//! clock the host's — to which the manager is linked (`[manager] auth`: it
//! logs in with the service token, fetches the shared identity keys and
//! installs them on the drives) and at which every client logs in with a
//! password for an identity, then `LOGIN_IDENTITY` at the manager. An
//! identity lives [`IDENTITY_LIFETIME`], shorter than a run, so the clients
//! renew theirs by logging in again while the faults run. A linked manager
//! takes no password: no client works without the authentication server.
//!
//! Faults: the server loses power (its disk keeps what SQLite synced) and
//! comes back after a while drawn from the seed. Checked: it opens again
//! after every crash, and the administrator it made at the first start logs
//! in afterwards (the clients, the holder, and the checkers once the faults
//! stopped: a lost user would fail the run).

use super::*;
use nasd_auth::{AuthConfig, AuthServer};
use nasd_fs::{BoxFuture, IdentitySource};
use nasd_login::auth_client::{connector_from_pem, AuthClient};
use nasd_manager::identity::AuthLink;

/// The authentication server's address.
pub(super) const AUTH_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 50, 1));
const AUTH_PORT: u16 = 7500;
/// Its simulated disk (its database and log).
const AUTH_DISK_BYTES: u64 = 16 << 20;
/// How long an identity is valid: shorter than a run, so the clients
/// renew theirs at the server (a tenth of it before expiry) while it
/// crashes and comes back.
pub(super) const IDENTITY_LIFETIME: Duration = Duration::from_secs(45);
/// The name its TLS certificate carries.
const AUTH_SERVER_NAME: &str = "localhost";

/// The authentication server's host, its real directory (key files, TLS
/// material; the database is on the simulated disk, at the same path
/// there) and its running incarnation.
pub(super) struct AuthSlot {
    pub(super) host: Arc<Host>,
    dir: PathBuf,
    tls: nasd_login::tls::TlsFiles,
    ca_pem: Vec<u8>,
    running: Mutex<Option<AuthRunning>>,
}

/// A running authentication server: its node, and the shutdown signal its
/// accept loop watches (kept so that it runs until the node dies).
struct AuthRunning {
    node: Arc<Node>,
    _stop: watch::Sender<bool>,
}

impl AuthSlot {
    /// The server's host, with its directory and certificates under `root`.
    pub(super) fn new(core: &Arc<Core>, root: &Path) -> AuthSlot {
        let names = vec![AUTH_SERVER_NAME.to_string()];
        let tls = nasd_login::tls::ensure_certificates(&root.join("auth-tls"), &names)
            .expect("TLS certificates for the authentication server");
        let ca_pem = std::fs::read(&tls.ca).expect("the authentication server's CA certificate");
        AuthSlot {
            host: Host::new(core, "auth", AUTH_IP, AUTH_DISK_BYTES),
            dir: root.join("auth"),
            tls,
            ca_pem,
            running: Mutex::new(None),
        }
    }
}

impl Cluster {
    /// Opens the authentication server on a new incarnation of its host and
    /// serves; at the `first` start it makes the administrator (later, a
    /// lost administrator shows as logins refused).
    pub(super) async fn start_auth(&self, first: bool) -> Result<(), String> {
        let a = &self.auth;
        let node = a.host.boot();
        let env = node.env();
        let config = AuthConfig { identity_lifetime: IDENTITY_LIFETIME, ..AuthConfig::default() };
        let server = Arc::new(AuthServer::open_in(&env, &a.dir, config).map_err(|e| format!("open: {e:#}"))?);
        if first {
            server.bootstrap_admin(ADMIN, ADMIN_PW, 0).await.map_err(|(s, m)| format!("administrator: {s:?}: {m}"))?;
            self.core.log("authentication server: administrator made");
        }
        let acceptor = nasd_login::tls::acceptor(&a.tls).map_err(|e| format!("TLS: {e:#}"))?;
        let listener = env.bind(SocketAddr::new(AUTH_IP, AUTH_PORT)).await.map_err(|e| format!("listen: {e}"))?;
        let (stop, stop_rx) = watch::channel(false);
        env.spawn(server.serve_on(listener, acceptor, stop_rx));
        *lock(&a.running) = Some(AuthRunning { node, _stop: stop });
        self.core.log("authentication server up");
        Ok(())
    }

    /// The authentication server's host loses power: its disk keeps what
    /// SQLite synced.
    pub(super) fn power_off_auth(&self) {
        let Some(running) = lock(&self.auth.running).take() else { return };
        let lost = running.node.crash();
        self.core.log("authentication server lost power");
        // Its directory's real name is a temporary one: not the seed's.
        let dir = self.auth.dir.display().to_string();
        for line in lost {
            self.core.log(format!("auth disk: {}", line.replace(&dir, "$AUTH_DIR")));
        }
    }

    /// Starts the authentication server again if it is down; a server that
    /// does not open fails the run.
    pub(super) async fn restart_auth(&self) {
        if lock(&self.auth.running).is_some() {
            return;
        }
        if let Err(e) = self.start_auth(false).await {
            self.fail(format!("the authentication server did not open again after a crash: {e}"));
        }
    }

    /// The manager's link to the authentication server (its service token
    /// is the server's key file, made at its first start).
    pub(super) fn auth_link(&self) -> AuthLink {
        let token = nasd_crypto::read_key_file(&self.auth.dir.join(nasd_auth::SERVICE_TOKEN_FILE))
            .expect("the authentication server's service token (made at its first start)");
        AuthLink {
            addrs: vec![SocketAddr::new(AUTH_IP, AUTH_PORT).to_string()],
            server_name: AUTH_SERVER_NAME.into(),
            ca_pem: self.auth.ca_pem.clone(),
            token,
        }
    }

    /// A fresh identity of the administrator, from `node`.
    pub(super) async fn grant(
        &self,
        node: &Arc<Node>,
    ) -> Result<(nasd_proto::IdentityData, nasd_crypto::Key), FsError> {
        Relogin { env: node.env(), ca_pem: self.auth.ca_pem.clone() }.fresh().await
    }

    /// The administrator's session at the authentication server, from `node`.
    pub(super) async fn auth_session(&self, node: &Arc<Node>) -> Result<AuthClient, String> {
        let tls = connector_from_pem(&self.auth.ca_pem, "the authentication server's CA").map_err(|e| e.to_string())?;
        let addr = SocketAddr::new(AUTH_IP, AUTH_PORT).to_string();
        AuthClient::login_in(&node.env(), &addr, AUTH_SERVER_NAME, &tls, ADMIN, ADMIN_PW, 0)
            .await
            .map(|(c, _)| c)
            .map_err(|e| format!("administrator login: {:?}", e.status()))
    }

    /// Logs in as the administrator from `node`: a password login at the
    /// authentication server for an identity, then `LOGIN_IDENTITY` at
    /// the manager; the client renews the identity by logging in again.
    pub(super) async fn log_in(&self, node: &Arc<Node>) -> Result<FsClient, FsError> {
        let source = Arc::new(Relogin { env: node.env(), ca_pem: self.auth.ca_pem.clone() });
        let identity = source.fresh().await?;
        let config = FsConfig { identity: Some(identity), identity_source: Some(source), ..self.fs_config(node) };
        FsClient::connect(&config).await
    }
}

/// Logs the administrator in at the authentication server, over its node's
/// network, for a fresh identity.
struct Relogin {
    env: nasd_env::Env,
    ca_pem: Vec<u8>,
}

impl IdentitySource for Relogin {
    fn fresh(&self) -> BoxFuture<'_, Result<(nasd_proto::IdentityData, nasd_crypto::Key), FsError>> {
        Box::pin(async move {
            let tls = connector_from_pem(&self.ca_pem, "the authentication server's CA")
                .map_err(|e| FsError::Setup(e.to_string()))?;
            let addr = SocketAddr::new(AUTH_IP, AUTH_PORT).to_string();
            let (_, grant) = AuthClient::login_in(&self.env, &addr, AUTH_SERVER_NAME, &tls, ADMIN, ADMIN_PW, 0)
                .await
                .map_err(|e| FsError::Setup(format!("logging in at the authentication server: {e}")))?;
            Ok((grant.credential, grant.idkey))
        })
    }
}
