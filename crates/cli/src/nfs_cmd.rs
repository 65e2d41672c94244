//! `nasd nfs`: the NFSv3 gateway (`nasd_nfs`) served by this process until
//! Ctrl-C or SIGTERM.
//!
//! The gateway logs in as a nasd user holding a gateway grant (`nasd admin
//! set-gateway`) and runs each call as its AUTH_SYS ids through it. AUTH_SYS
//! ids are the client host's word: serve only client networks whose hosts
//! you trust to say who their users are (`[nfs] clients`).

use crate::config::NfsSection;
use crate::fs_cmd::Login;
use anyhow::Context;
use nasd_fs::FsClient;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Where `nasd nfs` listens without `--listen` or `[nfs] listen`.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:2049";
/// The handle key without `--handle-key` or `[nfs] handle_key`.
pub const HANDLE_KEY_DEFAULT: &str = "nasd-data/nfs/handle.key";

/// Arguments of `nasd nfs`.
#[derive(clap::Args)]
pub struct NfsArgs {
    /// Where to serve NFSv3 and MOUNT (one TCP port; no portmapper: clients
    /// give it, e.g. nfs://HOST/EXPORT?nfsport=P&mountport=P) [default:
    /// [nfs] listen, else 127.0.0.1:2049].
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// An exported nasd directory (repeat for more) [default: [nfs] exports, else /].
    #[arg(long = "export", value_name = "PATH")]
    exports: Vec<String>,
    /// An allowed client network, ADDR/PREFIX (repeat for more) [default:
    /// [nfs] clients, else loopback only].
    #[arg(long = "client", value_name = "NET")]
    clients: Vec<String>,
    /// Let uid 0 act as root instead of the anonymous ids (needs a grant
    /// covering uid 0).
    #[arg(long)]
    no_root_squash: bool,
    /// The key file sealing file handles, made at the first start [default:
    /// [nfs] handle_key, else nasd-data/nfs/handle.key]. Keep it: a new key
    /// makes every handle clients hold stale. Its directory also holds the
    /// duplicate-request journal (drc.log, drc.old.log), so that calls
    /// resent across a restart run once.
    #[arg(long, value_name = "FILE")]
    handle_key: Option<PathBuf>,
    /// Connections one client address may hold open at once, 1 to 256
    /// [default: [nfs] connections_per_client, else 16].
    #[arg(long, value_name = "N")]
    connections_per_client: Option<usize>,
    /// Serve Prometheus metrics at http://ADDR/metrics [default: `[metrics]
    /// nfs` of the config, else none].
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    #[command(flatten)]
    pub login: Login,
}

/// The server's limits from the arguments over `[nfs]`.
fn limits(args: &NfsArgs, section: &NfsSection) -> anyhow::Result<nfs_rpc::Limits> {
    let per_client = args
        .connections_per_client
        .or(section.connections_per_client)
        .unwrap_or(nfs_rpc::server::CONNECTIONS_PER_CLIENT_DEFAULT);
    let max = nfs_rpc::server::CONNECTIONS_MAX;
    anyhow::ensure!(
        (1..=max).contains(&per_client),
        "[nfs] connections_per_client must be 1 to {max}, not {per_client}"
    );
    Ok(nfs_rpc::Limits { connections_per_client: per_client })
}

/// The gateway's settings from the arguments over `[nfs]`.
fn config(args: &NfsArgs, section: &NfsSection) -> anyhow::Result<(nasd_nfs::NfsConfig, nasd_nfs::Clients)> {
    let exports = if !args.exports.is_empty() {
        args.exports.clone()
    } else if !section.exports.is_empty() {
        section.exports.clone()
    } else {
        vec!["/".to_string()]
    };
    for e in &exports {
        anyhow::ensure!(e.starts_with('/'), "export {e:?} is not an absolute nasd path");
    }
    let clients = if !args.clients.is_empty() {
        args.clients.clone()
    } else if !section.clients.is_empty() {
        section.clients.clone()
    } else {
        vec!["127.0.0.1/32".to_string(), "::1/128".to_string()]
    };
    let networks = clients
        .iter()
        .map(|c| c.parse::<nasd_nfs::Network>().map_err(|e| anyhow::anyhow!("[nfs] clients: {e}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let config = nasd_nfs::NfsConfig {
        exports: exports.into_iter().map(|path| nasd_nfs::Export { path }).collect(),
        root_squash: !args.no_root_squash && section.root_squash.unwrap_or(true),
        anon: (
            section.anon_uid.unwrap_or(nasd_nfs::ANON_ID_DEFAULT),
            section.anon_gid.unwrap_or(nasd_nfs::ANON_ID_DEFAULT),
        ),
    };
    Ok((config, nasd_nfs::Clients(networks)))
}

/// Serves NFS until Ctrl-C or SIGTERM.
pub async fn run(
    fs: FsClient,
    args: NfsArgs,
    section: &NfsSection,
    metrics_section: &crate::config::MetricsSection,
) -> anyhow::Result<()> {
    let metrics_port =
        crate::daemons::metrics_port(args.metrics.as_deref().or(metrics_section.nfs.as_deref()), "NFS gateway")?;
    let metrics = nasd_nfs::NfsMetrics::new();
    if let Some(port) = metrics_port {
        let registry = nasd_metrics::Metrics::new();
        metrics.register(&registry);
        let (addr, _) = crate::daemons::serve_metrics(port, registry, std::future::pending())?;
        eprintln!("metrics at http://{addr}/metrics");
    }
    let (config, clients) = config(&args, section)?;
    let limits = limits(&args, section)?;
    let listen = args.listen.clone().or_else(|| section.listen.clone()).unwrap_or_else(|| LISTEN_DEFAULT.into());
    let key_path = args.handle_key.clone().or_else(|| section.handle_key.clone()).unwrap_or(HANDLE_KEY_DEFAULT.into());
    let (key, _) = handle_key(&key_path)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let stop = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    serve(fs, config, (clients, limits), &listen, (&key, state_dir(&key_path)), metrics, stop).await
}

/// `nasd up`'s gateway (`[up] nfs = true`): logs in with `client` (the
/// administrator), gives it the grant for `UP_GATEWAY_IDS` the first time
/// (when the handle key is made), and serves `section`'s exports until `stop`.
pub async fn serve_for_up(
    client: crate::config::ClientSection,
    section: NfsSection,
    metrics: nasd_nfs::NfsMetrics,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let args = NfsArgs {
        listen: None,
        exports: Vec::new(),
        clients: Vec::new(),
        no_root_squash: false,
        handle_key: None,
        connections_per_client: None,
        metrics: None,
        login: Login::default(),
    };
    let (config, clients) = config(&args, &section)?;
    let limits = limits(&args, &section)?;
    let listen = section.listen.clone().unwrap_or_else(|| LISTEN_DEFAULT.into());
    let key_path = section.handle_key.clone().unwrap_or(HANDLE_KEY_DEFAULT.into());
    let fs = crate::fs_cmd::login_renewing(&client, None).await.context("the NFS gateway cannot log in")?;
    let (key, made) = handle_key(&key_path)?;
    if made {
        fs.set_gateway(fs.user(), Some(crate::s3_cmd::UP_GATEWAY_IDS))
            .await
            .context("cannot let the NFS gateway act for users")?;
    }
    serve(fs, config, (clients, limits), &listen, (&key, state_dir(&key_path)), metrics, stop).await
}

/// The gateway's state directory: the handle key's (the duplicate-request
/// journal lives there, `nfs_rpc::DRC_JOURNAL_FILE`).
fn state_dir(key_path: &std::path::Path) -> &std::path::Path {
    key_path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."))
}

/// The handle key at `path` (made, 0600, with its directory, if missing) and whether it was made.
fn handle_key(path: &std::path::Path) -> anyhow::Result<(nasd_crypto::Key, bool)> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
    }
    Ok(nasd_crypto::load_or_create_key_file(path)?)
}

async fn serve(
    fs: FsClient,
    config: nasd_nfs::NfsConfig,
    (clients, limits): (nasd_nfs::Clients, nfs_rpc::Limits),
    listen: &str,
    (key, state_dir): (&nasd_crypto::Key, &std::path::Path),
    metrics: nasd_nfs::NfsMetrics,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let addr: SocketAddr = tokio::net::lookup_host(listen)
        .await
        .with_context(|| format!("cannot resolve {listen}"))?
        .next()
        .with_context(|| format!("{listen} names no address"))?;
    gateway_check(&fs).await?;
    let drc = nfs_rpc::DuplicateRequestCache::persisted(state_dir)
        .with_context(|| format!("cannot open the duplicate-request journal in {}", state_dir.display()))?;
    let vfs =
        nasd_vfs::Vfs::start(fs, nasd_vfs::VfsConfig::default()).await.context("cannot start the file-system layer")?;
    let exports: Vec<String> = config.exports.iter().map(|e| e.path.clone()).collect();
    let gateway = nasd_nfs::Gateway::start(vfs, key, config, metrics).await.map_err(|e| anyhow::anyhow!(e))?;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    eprintln!("NFSv3 gateway ready on {bound} (MOUNT on the same port), exports {}", exports.join(" "));
    let served = nfs_rpc::serve(listener, gateway.clone(), Arc::new(clients), (limits, drc), stop).await;
    // What clients wrote and did not commit yet is committed now (their next COMMIT sees a new
    // verifier and resends it anyway).
    gateway.close_all().await;
    served.context("the NFS gateway stopped")
}

/// One `AS_USER` request before serving: a manager that cannot serve a
/// gateway at all (a PALs-only partition) is reported now.
async fn gateway_check(fs: &FsClient) -> anyhow::Result<()> {
    let me = fs.identity();
    let acting = fs.as_user(me.uid, me.gid, &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
    match acting.root().await {
        Err(e) if e.status() == Some(nasd_fs::FsStatus::NotSupported) => anyhow::bail!("cannot serve NFS: {e}"),
        _ => Ok(()),
    }
}
