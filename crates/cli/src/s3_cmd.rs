//! `nasd s3`: the S3 gateway (`nasd_s3`) served by this process until
//! Ctrl-C or SIGTERM; `nasd s3-key`: its access keys.
//!
//! The gateway logs in as a nasd user holding a gateway grant (`nasd admin
//! set-gateway`) and runs each request as the user whose key signed it.
//! Keys live in a store directory on the gateway's host (`[s3] keys`):
//! whoever may write that directory issues keys; the commands below also
//! log in to the manager, which says who the issuer is and, for a key
//! issued for another user (`--owner`), that the issuer is an administrator
//! and what the owner's ids are.
//!
//! HTTPS (`[s3] tls`): the configured certificate and key, or a certificate
//! made once in `KEYS/tls` by a CA made there too (`nasd_login::tls`, as
//! the manager's), which clients trust (`aws --ca-bundle KEYS/tls/ca.pem`).

use crate::config::{ClientSection, S3Section};
use crate::fs_cmd::Login;
use anyhow::Context;
use nasd_fs::FsClient;
use nasd_s3::{KeyOwner, KeyStore};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Where `nasd s3` listens without `--listen` or `[s3] listen`.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7500";
/// The key store without `--keys` or `[s3] keys`.
pub const KEYS_DEFAULT: &str = "nasd-data/s3";

/// Arguments of `nasd s3`.
#[derive(clap::Args)]
pub struct S3Args {
    /// Where to serve S3 [default: [s3] listen, else 127.0.0.1:7500]: as
    /// plain HTTP, or HTTPS with `[s3] tls`. SigV4 keeps requests from being
    /// forged or replayed outside their window, but not from being read:
    /// plain HTTP off loopback needs --plain-http-off-loopback (and a TLS
    /// proxy in front).
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// Serve plain HTTP on an address other than loopback.
    #[arg(long)]
    plain_http_off_loopback: bool,
    /// The access-key store's directory [default: [s3] keys, else nasd-data/s3].
    #[arg(long, value_name = "DIR")]
    keys: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics [default: `[metrics]
    /// s3`, else none].
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    #[command(flatten)]
    pub login: Login,
}

/// `nasd s3-key`.
#[derive(clap::Subcommand)]
pub enum S3KeyCommand {
    /// Issue an access key for yourself (or, as an administrator, for
    /// --owner); prints the access key and its secret, which is shown only
    /// this once.
    Create {
        /// The user the key acts for (administrators) [default: you].
        #[arg(long, value_name = "NAME")]
        owner: Option<String>,
        /// The access-key store's directory [default: [s3] keys, else nasd-data/s3].
        #[arg(long, value_name = "DIR")]
        keys: Option<PathBuf>,
        #[command(flatten)]
        login: Login,
    },
    /// List access keys (yours; every one for an administrator), never their secrets.
    List {
        /// The access-key store's directory [default: [s3] keys, else nasd-data/s3].
        #[arg(long, value_name = "DIR")]
        keys: Option<PathBuf>,
        #[command(flatten)]
        login: Login,
    },
    /// Revoke an access key (yours; any for an administrator): the gateway
    /// refuses its next request.
    Revoke {
        /// The access key id.
        access_key: String,
        /// The access-key store's directory [default: [s3] keys, else nasd-data/s3].
        #[arg(long, value_name = "DIR")]
        keys: Option<PathBuf>,
        #[command(flatten)]
        login: Login,
    },
}

impl S3KeyCommand {
    /// How it logs in.
    pub fn login(&self) -> &Login {
        match self {
            S3KeyCommand::Create { login, .. } | S3KeyCommand::List { login, .. } => login,
            S3KeyCommand::Revoke { login, .. } => login,
        }
    }
}

fn store(keys: Option<PathBuf>, section: &S3Section) -> anyhow::Result<KeyStore> {
    let dir = keys.or_else(|| section.keys.clone()).unwrap_or_else(|| KEYS_DEFAULT.into());
    KeyStore::open(&dir).with_context(|| format!("cannot open the S3 key store {}", dir.display()))
}

/// The owner record of user `name` (administrators), or of the caller.
/// Users are the manager's, or, on a manager linked to an authentication
/// server (`[client] auth`), that server's: asked there as the same user.
async fn owner(fs: &FsClient, client: &ClientSection, name: Option<&str>) -> anyhow::Result<KeyOwner> {
    let me = fs.identity();
    let name = name.unwrap_or(fs.user());
    if name == fs.user() && !me.admin {
        // The manager's word on who the caller is; its groups need the user list.
        return Ok(KeyOwner { user: name.to_string(), uid: me.uid, gid: me.gid, groups: Vec::new() });
    }
    let users = fs.users().await.context("issuing a key for another user needs an administrator")?;
    if let Some(u) = users.into_iter().find(|u| u.name == name) {
        return Ok(KeyOwner { user: u.name, uid: u.uid, gid: u.gid, groups: u.groups });
    }
    anyhow::ensure!(client.auth.is_some(), "no user {name}");
    let (mut auth, _, _) = crate::auth_cmd::login_auth(client, Some(fs.user()), None).await?;
    let users = auth.users().await.context("cannot list the authentication server's users")?;
    let u = users.into_iter().find(|u| u.name == name).with_context(|| format!("no user {name}"))?;
    Ok(KeyOwner { user: u.name, uid: u.uid, gid: u.gid, groups: u.groups })
}

/// Runs a `nasd s3-key` command as `fs`'s user.
pub async fn run_key(
    fs: &FsClient,
    client: &ClientSection,
    cmd: S3KeyCommand,
    section: &S3Section,
) -> anyhow::Result<()> {
    let admin = fs.identity().admin;
    match cmd {
        S3KeyCommand::Create { owner: name, keys, .. } => {
            let store = store(keys, section)?;
            let owner = owner(fs, client, name.as_deref()).await?;
            let user = owner.user.clone();
            let (access_key, secret) = store.create(owner).context("cannot issue the key")?;
            println!("access key: {access_key}");
            println!("secret key: {}", secret.as_str());
            eprintln!("issued for {user}; the secret is not shown again");
        }
        S3KeyCommand::List { keys, .. } => {
            let store = store(keys, section)?;
            println!("{:<22} {:<20} {:>8}  created (unix)", "access key", "user", "uid");
            for r in store.list()?.into_iter().filter(|r| admin || r.owner.user == fs.user()) {
                println!("{:<22} {:<20} {:>8}  {}", r.access_key, r.owner.user, r.owner.uid, r.created);
            }
        }
        S3KeyCommand::Revoke { access_key, keys, .. } => {
            let store = store(keys, section)?;
            let mine = store.list()?.into_iter().find(|r| r.access_key == access_key);
            match mine {
                Some(r) if admin || r.owner.user == fs.user() => {
                    store.revoke(&access_key)?;
                    println!("revoked {access_key} of {}", r.owner.user);
                }
                Some(_) => anyhow::bail!("{access_key} is another user's key (administrators revoke those)"),
                None => anyhow::bail!("no access key {access_key}"),
            }
        }
    }
    Ok(())
}

/// Serves S3 until Ctrl-C or SIGTERM.
pub async fn run(
    fs: FsClient,
    args: S3Args,
    section: &S3Section,
    metrics_section: &crate::config::MetricsSection,
) -> anyhow::Result<()> {
    let listen = args.listen.or_else(|| section.listen.clone()).unwrap_or_else(|| LISTEN_DEFAULT.into());
    let addr: SocketAddr = tokio::net::lookup_host(&listen)
        .await
        .with_context(|| format!("cannot resolve {listen}"))?
        .next()
        .with_context(|| format!("{listen} names no address"))?;
    let https = serves_https(section);
    if !https && !addr.ip().is_loopback() && !args.plain_http_off_loopback {
        anyhow::bail!(
            "{addr} is not loopback: the gateway serves plain HTTP (set [s3] tls = true, or add \
             --plain-http-off-loopback behind a TLS proxy)"
        );
    }
    let keys_dir = args.keys.clone().or_else(|| section.keys.clone()).unwrap_or_else(|| KEYS_DEFAULT.into());
    let tls = if https { Some(tls_acceptor(section, &keys_dir, addr)?) } else { None };
    let keys = store(args.keys, section)?;
    let metrics_port =
        crate::daemons::metrics_port(args.metrics.as_deref().or(metrics_section.s3.as_deref()), "S3 gateway")?;
    gateway_check(&fs).await?;
    let vfs =
        nasd_vfs::Vfs::start(fs, nasd_vfs::VfsConfig::default()).await.context("cannot start the file-system layer")?;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    match &tls {
        None => eprintln!("S3 endpoint http://{bound} (region us-east-1, path-style)"),
        Some((_, ca)) => eprintln!("S3 endpoint https://{bound} (region us-east-1, path-style; CA {ca})"),
    }
    let s3_metrics = nasd_s3::S3Metrics::new();
    if let Some(port) = metrics_port {
        let registry = nasd_metrics::Metrics::new();
        s3_metrics.register(&registry);
        let (addr, _) = crate::daemons::serve_metrics(port, registry, std::future::pending())?;
        eprintln!("metrics at http://{addr}/metrics");
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let stop = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    let gateway = section.gateway(vfs, keys).with_metrics(s3_metrics);
    let tls = tls.map(|(acceptor, _)| acceptor);
    nasd_s3::serve_with(listener, tls, gateway, stop).await.context("the S3 gateway stopped")
}

/// One `AS_USER` request before serving: a manager that cannot serve a
/// gateway at all (a PALs-only partition) is reported now.
async fn gateway_check(fs: &FsClient) -> anyhow::Result<()> {
    let me = fs.identity();
    let acting = fs.as_user(me.uid, me.gid, &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
    match acting.root().await {
        Err(e) if e.status() == Some(nasd_fs::FsStatus::NotSupported) => anyhow::bail!("cannot serve S3: {e}"),
        _ => Ok(()),
    }
}

/// The AWS credentials file `nasd up` writes in its key store for the
/// administrator's own key (`AWS_SHARED_CREDENTIALS_FILE`; 0600, as the
/// store's key beside it, which opens every secret of the store anyway).
pub const UP_CREDENTIALS_FILE: &str = "credentials";

/// The ids `nasd up`'s gateway acts for (the grant it gives the
/// administrator at its first start): the ids `nasd admin add-user` hands out.
pub const UP_GATEWAY_IDS: (u32, u32) = (1000, 60000);

/// `nasd up`'s gateway: logs in with `client` (the administrator of the
/// cluster), issues the administrator's own key into `keys` the first time
/// (`UP_CREDENTIALS_FILE`, and the `AS_USER` grant other users' keys need),
/// and serves S3 on `listener` until `stop`. The administrator's key acts as
/// the administrator itself; other users' keys (`nasd s3-key create`) as
/// with `nasd s3`.
pub async fn serve_for_up(
    client: crate::config::ClientSection,
    section: S3Section,
    keys: PathBuf,
    listener: tokio::net::TcpListener,
    metrics: nasd_s3::S3Metrics,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let endpoint = listener.local_addr()?;
    let fs = crate::fs_cmd::login_renewing(&client, None).await.context("the S3 gateway cannot log in")?;
    let store = KeyStore::open(&keys).with_context(|| format!("cannot open the S3 key store {}", keys.display()))?;
    let credentials = keys.join(UP_CREDENTIALS_FILE);
    let access_key = match read_credentials(&credentials)? {
        Some(access_key) => access_key,
        None => {
            fs.set_gateway(fs.user(), Some(UP_GATEWAY_IDS)).await.context("cannot let the S3 gateway act for users")?;
            let me = fs.identity();
            let owner = KeyOwner { user: fs.user().to_string(), uid: me.uid, gid: me.gid, groups: Vec::new() };
            let (access_key, secret) = store.create(owner).context("cannot issue the administrator's S3 key")?;
            let text = zeroize::Zeroizing::new(format!(
                "[default]\naws_access_key_id = {access_key}\naws_secret_access_key = {}\n",
                secret.as_str()
            ));
            let staged = keys.join(format!("{UP_CREDENTIALS_FILE}.staged"));
            nasd_crypto::durable::write_staged(&staged, text.as_bytes(), 0o600)
                .and_then(|()| nasd_crypto::durable::install(&staged, &credentials))
                .with_context(|| format!("cannot write {}", credentials.display()))?;
            access_key
        }
    };
    let tls = if serves_https(&section) { Some(tls_acceptor(&section, &keys, endpoint)?) } else { None };
    let vfs =
        nasd_vfs::Vfs::start(fs, nasd_vfs::VfsConfig::default()).await.context("cannot start the file-system layer")?;
    let (scheme, trust) = match &tls {
        None => ("http", String::new()),
        Some((_, ca)) => ("https", format!(" and AWS_CA_BUNDLE={ca}")),
    };
    eprintln!(
        "S3 gateway ready at {scheme}://{endpoint}: {} (access key {access_key}) with AWS_SHARED_CREDENTIALS_FILE={}{trust}",
        client.user.as_deref().unwrap_or("admin"),
        credentials.display()
    );
    let gateway = section.gateway(vfs, store).with_metrics(metrics);
    let tls = tls.map(|(acceptor, _)| acceptor);
    nasd_s3::serve_with(listener, tls, gateway, stop).await.context("the S3 gateway stopped")
}

/// Whether `[s3]` asks for HTTPS (`tls = true`, or a certificate and key).
pub fn serves_https(section: &S3Section) -> bool {
    section.tls.unwrap_or(false) || section.tls_cert.is_some() || section.tls_key.is_some()
}

/// The TLS acceptor `[s3]` asks for, and what clients trust: the
/// configured certificate and key, else ones made (once) in `KEYS/tls` for
/// `localhost`, `127.0.0.1` and `addr`'s address, with the CA that signed them.
fn tls_acceptor(
    section: &S3Section,
    keys_dir: &std::path::Path,
    addr: SocketAddr,
) -> anyhow::Result<(tokio_rustls::TlsAcceptor, String)> {
    let files = match (&section.tls_cert, &section.tls_key) {
        (Some(cert), Some(key)) => nasd_login::tls::TlsFiles { cert: cert.clone(), key: key.clone(), ca: cert.clone() },
        (None, None) => {
            let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
            if !addr.ip().is_unspecified() && !names.contains(&addr.ip().to_string()) {
                names.push(addr.ip().to_string());
            }
            let dir = keys_dir.join("tls");
            let files = nasd_login::tls::ensure_certificates(&dir, &names)
                .with_context(|| format!("cannot make the S3 gateway's certificate in {}", dir.display()))?;
            let missing = nasd_login::tls::names_missing(&files, &names)?;
            if !missing.is_empty() {
                anyhow::bail!(
                    "{} does not name {} (remove it to have a new one made)",
                    files.cert.display(),
                    missing.join(", ")
                );
            }
            files
        }
        _ => anyhow::bail!("[s3] tls_cert and tls_key go together"),
    };
    let acceptor = nasd_login::tls::acceptor(&files).context("cannot serve HTTPS")?;
    Ok((acceptor, files.ca.display().to_string()))
}

/// The access key in a credentials file `serve_for_up` wrote; `None` if there is none.
fn read_credentials(path: &std::path::Path) -> anyhow::Result<Option<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => zeroize::Zeroizing::new(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let access_key = text
        .lines()
        .find_map(|l| l.strip_prefix("aws_access_key_id = "))
        .with_context(|| format!("{} names no aws_access_key_id (remove it for a new key)", path.display()))?;
    Ok(Some(access_key.trim().to_string()))
}
