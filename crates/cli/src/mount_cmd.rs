//! `nasd mount MOUNTPOINT`: the file system as a POSIX mount (FUSE), served
//! by this process until Ctrl-C, SIGTERM or `fusermount3 -u MOUNTPOINT`.
//!
//! With `--map-users` it first sends one `AS_USER` and stops if the manager
//! cannot serve a gateway (a PALs-only partition). With `[client] auth` it
//! logs in through `fs_cmd::login_renewing`, so its identity is renewed
//! before it expires. How long requests wait out a manager's outage:
//! `--manager-wait` / `[mount] manager_wait` (hard by default).

use anyhow::Context;
use nasd_fs::FsClient;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `nasd mount`.
#[derive(clap::Args)]
pub struct MountArgs {
    /// Where the file system appears (an existing directory).
    mountpoint: PathBuf,
    /// Let every local user use the mount (FUSE allow_other: root, or
    /// user_allow_other in /etc/fuse.conf). Without --map-users, requests of
    /// local users other than the one who mounted and the one whose uid is
    /// the nasd user's are refused (EACCES).
    #[arg(long)]
    allow_other: bool,
    /// Run each request as its local caller (uid, gid, supplementary
    /// groups), without their passwords: the nasd user logged in must be a
    /// gateway whose grant covers their ids (`nasd admin set-gateway`).
    /// With --allow-other, one mount serves every local user as themselves.
    #[arg(long)]
    map_users: bool,
    /// FUSE threads reading requests from the kernel.
    #[arg(long, default_value_t = nasd_fuse::MOUNT_THREADS_DEFAULT)]
    threads: usize,
    /// Milliseconds the kernel may cache attributes and names: the bound
    /// within which changes made by other clients show here [default: 1000].
    #[arg(long)]
    attr_timeout_ms: Option<u64>,
    /// How long a call in the mount waits for a manager that cannot be
    /// reached: "hard" (until it is back, like a hard NFS mount; a signal
    /// ends the call with EINTR), or a duration such as "30s", after which
    /// the call fails with EIO. Reads and writes of open files go on
    /// meanwhile where their capabilities allow [default: [mount]
    /// manager_wait, else "hard"].
    #[arg(long, value_name = "hard|DURATION")]
    manager_wait: Option<nasd_fuse::ManagerWait>,
    /// Mount over a directory that has entries (they are hidden until the
    /// mount ends); without it such a directory is refused.
    #[arg(long)]
    nonempty: bool,
    /// Serve the mount's Prometheus metrics at http://ADDR/metrics (requests,
    /// latency and bytes by FUSE operation) [default: `[metrics] mount`, else
    /// none].
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    #[command(flatten)]
    pub login: crate::fs_cmd::Login,
}

/// Refuses a mount point that is already one, or has entries without
/// `--nonempty`, saying what to do instead.
pub fn check(args: &MountArgs) -> anyhow::Result<()> {
    nasd_fuse::check_mountpoint(&args.mountpoint, args.nonempty).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Mounts, serves until asked to stop, unmounts.
pub async fn run(
    fs: FsClient,
    args: MountArgs,
    section: &crate::config::MountSection,
    metrics_section: &crate::config::MetricsSection,
) -> anyhow::Result<()> {
    let metrics_port =
        crate::daemons::metrics_port(args.metrics.as_deref().or(metrics_section.mount.as_deref()), "mount")?;
    if args.map_users {
        gateway_check(&fs).await?;
    }
    let mut config = nasd_fuse::MountConfig::new(&args.mountpoint);
    config.manager_wait = match args.manager_wait {
        Some(w) => w,
        None => section.manager_wait()?,
    };
    config.nonempty = args.nonempty;
    config.allow_other = args.allow_other;
    config.map_users = args.map_users;
    config.threads = args.threads;
    if let Some(ms) = args.attr_timeout_ms {
        config.attr_timeout = Duration::from_millis(ms);
    }
    config.fsname = format!("nasd:{}", fs.user());
    let mount_metrics = config.metrics.clone();
    let mut mount = nasd_fuse::Mount::start(fs, config).await?;
    eprintln!(
        "mounted at {}; unmount with Ctrl-C or `fusermount3 -u {}`",
        args.mountpoint.display(),
        args.mountpoint.display()
    );
    if let Some(port) = metrics_port {
        let registry = nasd_metrics::Metrics::new();
        mount_metrics.register(&registry);
        let (addr, _) = crate::daemons::serve_metrics(port, registry, std::future::pending())?;
        eprintln!("metrics at http://{addr}/metrics");
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    tokio::select! {
        ended = mount.ended() => return ended.context("the mount ended"),
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    mount.unmount().with_context(|| format!("cannot unmount {}", args.mountpoint.display()))?;
    mount.ended().await.context("the mount ended")?;
    eprintln!("unmounted {}", args.mountpoint.display());
    Ok(())
}

/// Before mounting with --map-users: one `AS_USER` request (the root
/// directory's attributes, as this session's own ids), so that a manager
/// that cannot serve a gateway at all — a partition that accepts PALs only
/// — is reported now, not as EACCES on every request after the mount. Any
/// other refusal (no gateway grant yet, ids outside it) is left to the
/// requests it concerns.
async fn gateway_check(fs: &FsClient) -> anyhow::Result<()> {
    let me = fs.identity();
    let acting = fs.as_user(me.uid, me.gid, &[]).map_err(|e| anyhow::anyhow!("{e}"))?;
    match acting.root().await {
        Err(e) if e.status() == Some(nasd_fs::FsStatus::NotSupported) => {
            anyhow::bail!("cannot mount with --map-users: {e}")
        }
        _ => Ok(()),
    }
}
