//! A client's profile — the `[client]` section of the nasd config file
//! (`nasd up` writes one into `DATA/nasd.toml`) — and logging in with it:
//! by password at the manager, or, with `auth` set, by password at the
//! authentication server and then by the identity key it issues at the
//! manager, renewed before it expires for long-lived clients. The `nasd`
//! command and the Python client (`crates/python`) both log in through here.
//!
//! ```toml
//! [client]
//! manager = "nasd.example.com:7300"
//! failover = ["nasd2.example.com:7300"]  # more managers on the same metadata, tried if it is down
//! server_name = "nasd.example.com"
//! ca_cert = "/etc/nasd/ca.pem"
//! user = "alice"
//! password_file = "/home/alice/.nasd-password"
//! data_integrity = true
//! reply_timeout_secs = 60        # longest wait for the manager or a drive at any one step
//! metadata_wait_secs = 60        # how long commands wait out an outage of the metadata database
//! auth = "nasd.example.com:7299" # log in here and use the identity key with the manager
//! auth_failover = ["nasd2.example.com:7299"] # more authentication servers on the same database
//! role = 7                       # the role to assume [default: none]
//! ```
#![deny(missing_docs)]

use anyhow::Context;
use nasd_fs::{FsClient, FsConfig, FsStatus, IdentitySource, WaitNotice};
use nasd_login::auth_client::{connector, AuthClient, AuthError, IdentityGrant};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use zeroize::Zeroizing;

/// What to do when a setting a login needs is missing.
const HINT: &str = "run `nasd up` first, or point --config / $NASD_CONFIG at a config file with a [client] section";

/// `[client]`: how user and admin commands reach the manager. Every field is
/// optional in the file; a login says which one it lacks.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSection {
    /// The manager's `host:port`.
    pub manager: Option<String>,
    /// More managers of the same file system (one PostgreSQL database, one
    /// `manager.key`), tried in order when the one in use does not answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failover: Vec<String>,
    /// The name the manager's (and authentication server's) certificate
    /// is checked against [default: localhost].
    pub server_name: Option<String>,
    /// The cluster CA certificate (PEM).
    pub ca_cert: Option<PathBuf>,
    /// Who logs in.
    pub user: Option<String>,
    /// A file whose first line is `user`'s password (used for that user only).
    pub password_file: Option<PathBuf>,
    /// Protect file data on the wire beyond what capabilities demand [default: true].
    pub data_integrity: Option<bool>,
    /// Seconds a command waits for the manager or a drive at any one step
    /// before it fails with a time-out [default: 60]. A drive's waits stay
    /// within the striping engine's 30 s deadline per request as well.
    pub reply_timeout_secs: Option<u64>,
    /// Seconds a command waits out an outage of the manager's metadata
    /// database (its requests sent again with back-off; one line says so)
    /// before it fails [default: 60; 0: fail at once].
    pub metadata_wait_secs: Option<u64>,
    /// The authentication server (`host:port`): when set, commands log in
    /// there and use the identity key it gives with the manager.
    pub auth: Option<String>,
    /// More authentication servers on the same database (their certificates
    /// signed by `ca_cert`'s CA, for `server_name`), tried in order when the
    /// one before does not answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub auth_failover: Vec<String>,
    /// The role to assume when logging in there [default: none; $NASD_ROLE].
    pub role: Option<u32>,
}

/// Reads the `[client]` section of the config file at `path` (the other
/// sections are the daemons' and are not looked at). A file without one
/// gives an empty section.
pub fn load_client_section(path: &Path) -> anyhow::Result<ClientSection> {
    #[derive(Deserialize)]
    struct OnlyClient {
        #[serde(default)]
        client: ClientSection,
    }
    Ok(read_config::<OnlyClient>(path)?.client)
}

/// Reads and parses the config file at `path` as `T` (the whole file, or the sections `T` names).
pub fn read_config<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read config file {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow::anyhow!("config file {} is invalid: {e}", path.display()))
}

impl ClientSection {
    /// Who logs in: `user` if given, else the configured user.
    pub fn login_name(&self, user: Option<&str>) -> anyhow::Result<String> {
        user.map(str::to_string).or(self.user.clone()).context("no user: pass --user or set [client] user")
    }

    /// The configured password file's password, if `user` is the configured
    /// user and a file is configured (`None` otherwise: ask elsewhere).
    pub fn password_from_file(&self, user: &str) -> anyhow::Result<Option<String>> {
        let (Some(file), Some(configured)) = (&self.password_file, &self.user) else { return Ok(None) };
        if configured != user {
            return Ok(None);
        }
        let text =
            std::fs::read_to_string(file).with_context(|| format!("cannot read password file {}", file.display()))?;
        Ok(Some(text.trim_end_matches(['\n', '\r']).to_string()))
    }

    /// The role to assume: `role` if given, else `$NASD_ROLE`, else `role`, else none (0).
    pub fn role(&self, role: Option<u32>) -> anyhow::Result<u32> {
        Ok(match role {
            Some(r) => r,
            None => match std::env::var("NASD_ROLE") {
                Ok(r) => r.parse().with_context(|| format!("$NASD_ROLE = {r:?} is not a role number"))?,
                Err(_) => self.role.unwrap_or(0),
            },
        })
    }

    /// How long requests wait out an outage of the metadata database.
    pub fn metadata_wait(&self) -> Duration {
        self.metadata_wait_secs.map_or(nasd_fs::METADATA_WAIT_DEFAULT, Duration::from_secs)
    }

    fn server_name(&self) -> String {
        self.server_name.clone().unwrap_or_else(|| "localhost".into())
    }

    /// The authentication servers, in the order tried: `auth`, then `auth_failover`.
    pub fn auth_servers(&self) -> anyhow::Result<Vec<String>> {
        let first = self.auth.clone().context("no authentication server: set auth = \"HOST:PORT\" in [client]")?;
        Ok(std::iter::once(first).chain(self.auth_failover.iter().cloned()).collect())
    }

    fn ca(&self) -> anyhow::Result<PathBuf> {
        self.ca_cert.clone().with_context(|| format!("no ca_cert configured: {HINT}"))
    }

    /// The connection settings of this profile for `user`, without
    /// credentials; `on_wait` is told when requests wait out a database outage.
    fn fs_config(&self, user: &str, on_wait: Option<WaitNotice>) -> anyhow::Result<FsConfig> {
        Ok(FsConfig {
            manager: self.manager.clone().with_context(|| format!("no manager address configured: {HINT}"))?,
            failover: self.failover.clone(),
            server_name: self.server_name(),
            ca_cert: self.ca()?,
            user: user.to_string(),
            data_integrity: self.data_integrity.unwrap_or(true),
            reply_timeout: self.reply_timeout_secs.map_or(nasd_fs::WAIT_MAX, Duration::from_secs),
            metadata_wait: self.metadata_wait(),
            on_wait,
            ..Default::default()
        })
    }
}

/// How a login goes: who, with which password, and what else.
pub struct Login<'a> {
    /// The user.
    pub user: &'a str,
    /// Their password (at the manager, or with `auth` at the authentication server).
    pub password: &'a str,
    /// The role to assume at the authentication server (`None`: [`ClientSection::role`]).
    pub role: Option<u32>,
    /// Renew the identity from the authentication server before it expires
    /// (the password is kept in memory, wiped when dropped): for clients
    /// that outlive an identity (mounts, Python sessions).
    pub renew: bool,
    /// Told when a request starts to wait out an outage of the metadata database.
    pub on_wait: Option<WaitNotice>,
}

/// Logs in with `section`: at the authentication server and then by
/// identity key if `auth` is set, else by password at the manager.
pub async fn login(section: &ClientSection, how: Login<'_>) -> anyhow::Result<FsClient> {
    if section.auth.is_some() {
        let role = section.role(how.role)?;
        let (_, grant) = login_auth(section, how.user, how.password, role, how.on_wait.clone()).await?;
        let source =
            how.renew.then(|| relogin(section, how.user, how.password, role, how.on_wait.clone())).transpose()?;
        return login_with_identity(section, &grant, how.user, source, how.on_wait).await;
    }
    let mut config = section.fs_config(how.user, how.on_wait)?;
    config.password = how.password.to_string();
    let manager = config.manager.clone();
    FsClient::connect(&config).await.map_err(|e| match e.status() {
        // The manager's own words: a wrong user or password, or that it takes no passwords
        // (it is linked to an authentication server: log in there).
        Some(FsStatus::BadCredentials) => anyhow::anyhow!("login as '{}' at {manager} failed: {e}", how.user),
        _ => anyhow::anyhow!("{e}"),
    })
}

/// Logs in as `user` with `password` at the authentication servers named by
/// `auth` and `auth_failover` (the first that answers; [`login_at_any`]),
/// `on_wait` told once if their database is down and the login waits for it.
pub async fn login_auth(
    section: &ClientSection,
    user: &str,
    password: &str,
    role: u32,
    on_wait: Option<WaitNotice>,
) -> anyhow::Result<(AuthClient, IdentityGrant)> {
    let servers = AuthServers {
        addrs: section.auth_servers()?,
        server_name: section.server_name(),
        tls: connector(&section.ca()?)?,
        wait: section.metadata_wait(),
        on_wait,
    };
    let (c, grant, _) = servers.login_at_any((user, password, role)).await?;
    Ok((c, grant))
}

/// The authentication servers of a profile, as a login reaches them.
struct AuthServers {
    addrs: Vec<String>,
    server_name: String,
    tls: tokio_rustls::TlsConnector,
    /// How long a login waits out an outage of their database.
    wait: Duration,
    on_wait: Option<WaitNotice>,
}

/// First pause between rounds of logins while the servers' database is down.
const LOGIN_RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest pause between them.
const LOGIN_RETRY_MAX: Duration = Duration::from_secs(2);

impl AuthServers {
    /// Logs in at the first server that answers: one that cannot be reached
    /// (or whose database cannot, `METADATA_UNAVAILABLE`) is passed for the
    /// next; any other refusal (a wrong password) is the answer. The server
    /// that answered is returned too. When none answered and one said its
    /// database cannot be reached, all are tried again with back-off for up
    /// to `wait` (`[client] metadata_wait_secs`), said once through
    /// `on_wait`, as the manager's outages are.
    async fn login_at_any(&self, login: (&str, &str, u32)) -> anyhow::Result<(AuthClient, IdentityGrant, String)> {
        let (user, pw, role) = login;
        let deadline = std::time::Instant::now() + self.wait;
        let mut pause = LOGIN_RETRY_MIN;
        let mut told = false;
        loop {
            let (mut failures, mut unavailable) = (Vec::new(), None);
            for addr in &self.addrs {
                match AuthClient::login(addr, &self.server_name, &self.tls, user, pw, role).await {
                    Ok((c, grant)) => {
                        if !failures.is_empty() {
                            tracing::info!(%addr, passed = ?failures, "logged in at a later authentication server");
                        }
                        return Ok((c, grant, addr.clone()));
                    }
                    Err(AuthError::Refused { status: FsStatus::MetadataUnavailable, message }) => {
                        failures.push(format!("{addr}: {message}"));
                        unavailable = Some(message);
                    }
                    Err(e) if e.status().is_some() => {
                        anyhow::bail!("login as '{user}' at the authentication server {addr} failed: {e}")
                    }
                    Err(e) => failures.push(format!("{addr}: {e}")),
                }
            }
            match unavailable {
                Some(message) if std::time::Instant::now() + pause < deadline => {
                    if let (false, Some(tell)) = (told, &self.on_wait) {
                        tell(&format!("{message}; waiting up to {} s for it", self.wait.as_secs()));
                        told = true;
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(LOGIN_RETRY_MAX);
                }
                _ => anyhow::bail!(
                    "login as '{user}' failed: no authentication server answered ({})",
                    failures.join("; ")
                ),
            }
        }
    }
}

/// Logs in to the manager with an identity from the authentication server,
/// renewing it from `source` if given.
pub async fn login_with_identity(
    section: &ClientSection,
    grant: &IdentityGrant,
    user: &str,
    source: Option<Arc<dyn IdentitySource>>,
    on_wait: Option<WaitNotice>,
) -> anyhow::Result<FsClient> {
    let config = FsConfig {
        identity: Some((grant.credential, grant.idkey.clone())),
        identity_source: source,
        ..section.fs_config(user, on_wait)?
    };
    FsClient::connect(&config)
        .await
        .map_err(|e| anyhow::anyhow!("login by identity (uid {}) at {} failed: {e}", grant.uid, config.manager))
}

/// The source of fresh identities for `user` in `role` at the
/// authentication server of `section`, logging in again with `password`
/// (kept in this process's memory, wiped when dropped; never written or logged).
pub fn relogin(
    section: &ClientSection,
    user: &str,
    password: &str,
    role: u32,
    on_wait: Option<WaitNotice>,
) -> anyhow::Result<Arc<dyn IdentitySource>> {
    Ok(Arc::new(Relogin {
        servers: AuthServers {
            addrs: section.auth_servers()?,
            server_name: section.server_name(),
            tls: connector(&section.ca()?)?,
            wait: section.metadata_wait(),
            on_wait,
        },
        user: user.to_string(),
        password: Zeroizing::new(password.to_string()),
        role,
    }))
}

/// Logs a user in at the authentication server again, with the password
/// it logged in with at start, for a fresh identity.
struct Relogin {
    servers: AuthServers,
    user: String,
    password: Zeroizing<String>,
    role: u32,
}

impl IdentitySource for Relogin {
    fn fresh(&self) -> nasd_fs::BoxFuture<'_, Result<(nasd_proto::IdentityData, nasd_crypto::Key), nasd_fs::FsError>> {
        Box::pin(async move {
            let refused =
                |e: String| nasd_fs::FsError::Setup(format!("logging in as '{}' again failed: {e}", self.user));
            let login = (self.user.as_str(), self.password.as_str(), self.role);
            let (_, grant, _) = self.servers.login_at_any(login).await.map_err(|e| refused(e.to_string()))?;
            Ok((grant.credential, grant.idkey))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_section_parses_and_other_sections_are_ignored() {
        let doc = include_str!("lib.rs");
        let example: String = doc
            .lines()
            .skip_while(|l| !l.starts_with("//! ```toml"))
            .skip(1)
            .take_while(|l| !l.starts_with("//! ```"))
            .map(|l| l.trim_start_matches("//!").trim_start().to_string() + "\n")
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nasd.toml");
        std::fs::write(&path, format!("[manager]\nlisten = \"0.0.0.0:7300\"\n\n{example}")).unwrap();
        let section = load_client_section(&path).unwrap();
        assert_eq!(section.user.as_deref(), Some("alice"));
        assert_eq!(section.failover, ["nasd2.example.com:7300"]);
        assert_eq!(section.role, Some(7));
        std::fs::write(&path, "[client]\nusr = \"x\"\n").unwrap();
        let typo = load_client_section(&path).unwrap_err().to_string();
        assert!(typo.contains("usr"), "{typo}");
        std::fs::write(&path, "[up]\ndrives = 2\n").unwrap();
        assert!(load_client_section(&path).unwrap().manager.is_none());
    }

    #[test]
    fn the_password_file_serves_the_configured_user_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("alice.password");
        std::fs::write(&file, "s3cret\r\n").unwrap();
        let section = ClientSection { user: Some("alice".into()), password_file: Some(file), ..Default::default() };
        assert_eq!(section.password_from_file("alice").unwrap().as_deref(), Some("s3cret"));
        assert_eq!(section.password_from_file("bob").unwrap(), None);
        assert_eq!(section.login_name(Some("bob")).unwrap(), "bob");
        assert_eq!(section.login_name(None).unwrap(), "alice");
        assert!(ClientSection::default().login_name(None).is_err());
    }

    #[test]
    fn a_login_without_a_manager_says_what_to_set() {
        let section = ClientSection { ca_cert: Some("ca.pem".into()), ..Default::default() };
        let e = section.fs_config("alice", None).unwrap_err().to_string();
        assert!(e.contains("no manager address configured"), "{e}");
    }
}
