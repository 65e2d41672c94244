//! `nasd auth`: the authentication server (DSFS), as a daemon, and the
//! commands users and administrators run against it (users, roles, groups,
//! shared keys).
//!
//! Without a subcommand, the daemon (`[auth]` section, its own CA under
//! `DATA/tls`); with one, a client of it as the `[client]` user (`passwd`:
//! one's own password, the login password being the old one, or another's
//! as administrator); `rotate-key` and `retire-key` then ask the manager to
//! bring every drive up to date (`SYNC_IDENTITY_KEYS`). With `[client] auth`
//! set, every command that logs in does so there first and uses the identity
//! key with the manager (`fs_cmd::login`); a long-running client renews it
//! by logging in again (`nasd_profile::relogin`).

use crate::config::{self, AuthSection, ClientSection};
use anyhow::Context;
use clap::{Args, Subcommand};
use nasd_auth::{AuthConfig, AuthServer};
use nasd_login::auth_client::{AuthClient, IdentityGrant};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// `nasd auth` flags: the daemon's, or a subcommand.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AuthArgs {
    #[command(subcommand)]
    pub command: Option<AuthCommand>,
    /// Directory for the users, roles, groups and sealed shared keys.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Address to serve on [default: 127.0.0.1:7299].
    #[arg(long)]
    listen: Option<String>,
    /// A host name or address the TLS certificate names (repeat) [default: localhost, 127.0.0.1].
    #[arg(long = "tls-name")]
    tls_names: Vec<String>,
    /// Keep the state in the file managers' PostgreSQL database,
    /// postgres://USER@HOST[:PORT]/DB (no password here: $PGPASSWORD,
    /// ~/.pgpass or [auth] metadata_password_file), which several
    /// authentication servers share [default: [auth] metadata, else
    /// DATA/auth.sqlite].
    #[arg(long)]
    metadata: Option<String>,
    /// Join the authentication servers of a database with the bundle `nasd
    /// admin join-bundle` wrote: their auth.key and the cluster CA go into
    /// --data (this server issues itself a certificate for its --tls-name),
    /// and the metadata location comes from the bundle unless one is given.
    #[arg(long, value_name = "BUNDLE")]
    join: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics [default: `[metrics]
    /// auth`, else none].
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

/// What users and administrators do at the authentication server (they log
/// in there with the [client] user and its password; `auth` must be set in
/// [client]).
#[derive(Subcommand)]
pub enum AuthCommand {
    /// Log in and show the identity issued: user, roles, key id, expiry.
    Login {
        /// The role to assume [default: [client] role, $NASD_ROLE, else none].
        #[arg(long)]
        role: Option<u32>,
    },
    /// Administrators: add a user (password from $NASD_NEW_PASSWORD, else asked for).
    AddUser {
        /// The new user's name.
        name: String,
        /// User id (the manager's files are owned by it).
        #[arg(long)]
        uid: u32,
        /// Primary group [default: the uid].
        #[arg(long)]
        gid: Option<u32>,
        /// May run administrator commands.
        #[arg(long)]
        admin: bool,
    },
    /// Administrators: let a user log in again.
    Enable {
        /// Whose logins.
        name: String,
    },
    /// Administrators: refuse a user's logins (at this server and, with
    /// identity keys it still holds, at the manager) and every request its
    /// open sessions and gateways (S3) make for it — at once at the manager
    /// this command tells; at other managers within their recheck times.
    Disable {
        /// Whose logins.
        name: String,
    },
    /// Administrators: a new role.
    AddRole {
        /// The role's number (what `--role` and grant-role name).
        role: u32,
        /// The role's name.
        name: String,
    },
    /// Administrators: give a user a role.
    GrantRole {
        /// Who gets it.
        user: String,
        /// The role's number.
        role: u32,
    },
    /// Administrators: take a role from a user.
    RevokeRole {
        /// Who loses it.
        user: String,
        /// The role's number.
        role: u32,
    },
    /// Make a group you own, and join it (unless you are in GROUPS_MAX
    /// groups already: then you own it without being in it); prints its gid.
    CreateGroup {
        /// The group's name.
        name: String,
    },
    /// Add a user to a group you own.
    AddMember {
        /// The group's id (create-group printed it).
        gid: u32,
        /// Who joins it.
        user: String,
    },
    /// Remove a user from a group you own.
    RemoveMember {
        /// The group's id.
        gid: u32,
        /// Who leaves it.
        user: String,
    },
    /// Change your password (the old one is the one you log in with), or
    /// as an administrator anyone's. The new password is $NASD_NEW_PASSWORD,
    /// else asked twice without echo; the current one $NASD_PASSWORD, the
    /// [client] password_file, else asked. Identity keys issued before stay
    /// valid until they expire: `disable` the user, or rotate-key then
    /// retire-key, to cut them off.
    Passwd {
        /// Whose password [default: yours].
        user: Option<String>,
    },
    /// Administrators: list users.
    Users,
    /// Administrators: a new shared key for new identity keys (the others stay valid).
    RotateKey,
    /// Administrators: retire a shared key id: every identity key made with
    /// it is refused, by the manager at once and by the drives once the
    /// manager has installed the change (this command asks it to).
    RetireKey {
        /// The shared key's id (`nasd auth login` shows the one in use).
        key_id: u32,
    },
    /// Move this server's state from DATA/auth.sqlite (users, passwords,
    /// roles, groups, shared keys, its service token) into the managers'
    /// PostgreSQL database, where more servers can share it. Offline: stop
    /// the server first; no login. One transaction, refused if the database
    /// holds an authentication server's state already; auth.sqlite is then
    /// renamed auth.sqlite.migrated. Start the server again with the
    /// database as its metadata (`nasd up` and `nasd auth` find it there).
    Migrate {
        /// The server's data directory (for `nasd up`, DATA/auth) [default: [auth] data].
        #[arg(long)]
        data: Option<PathBuf>,
        /// postgres://USER@HOST[:PORT]/DB, no password ($PGPASSWORD, ~/.pgpass or [auth]
        /// metadata_password_file) [default: [auth] metadata, else [manager] metadata].
        #[arg(long)]
        metadata: Option<String>,
    },
}

impl AuthCommand {
    /// Works on the server's data directly, without logging in.
    pub fn is_offline(&self) -> bool {
        matches!(self, AuthCommand::Migrate { .. })
    }
}

/// `nasd auth migrate`: see [`AuthCommand::Migrate`].
pub async fn migrate(
    data: Option<PathBuf>,
    metadata: Option<String>,
    file: &config::AuthSection,
    manager: &config::ManagerSection,
) -> anyhow::Result<()> {
    let data = data
        .or(file.data.clone())
        .context("no data directory: pass --data DIR (for `nasd up`, DATA/auth; or set [auth] data)")?;
    let (text, password_file) = match file.metadata.clone() {
        Some(m) => (Some(m), file.metadata_password_file.clone()),
        None => (manager.metadata.clone(), manager.metadata_password_file.clone()),
    };
    let location = crate::daemons::location_of(metadata.as_deref(), text, password_file, "[auth] metadata")?;
    let nasd_auth::Backing::Postgres(target) = crate::daemons::auth_backing(location.as_ref())? else {
        anyhow::bail!("the state moves into a PostgreSQL database: pass --metadata postgres://USER@HOST/DB");
    };
    let to = target.describe().to_string();
    let moved = nasd_auth::migrate_to_postgres(&data, *target).await?;
    println!(
        "moved {} users, {} roles, {} groups and {} shared keys from {} to {to}; the old file is {}. Start the \
         server with its metadata there (`nasd auth --metadata {to}`, or [auth] metadata; `nasd up` finds it)",
        moved.users,
        moved.roles,
        moved.groups,
        moved.shared_keys,
        data.join(nasd_auth::AUTH_DB).display(),
        moved.old_file.display()
    );
    Ok(())
}

/// The `[client]` user's password at the authentication server.
fn password(section: &ClientSection, user: &str) -> anyhow::Result<String> {
    crate::fs_cmd::password_for(user, section)
}

/// Logs in at the authentication server named by `[client] auth`.
pub async fn login_auth(
    section: &ClientSection,
    user: Option<&str>,
    role: Option<u32>,
) -> anyhow::Result<(AuthClient, IdentityGrant, String)> {
    let user = section.login_name(user)?;
    let pw = zeroize::Zeroizing::new(password(section, &user)?);
    let (c, grant) = login_as(section, &user, &pw, role).await?;
    Ok((c, grant, user))
}

/// Logs in as `user` with `pw` at the authentication server named by `[client] auth`.
async fn login_as(
    section: &ClientSection,
    user: &str,
    pw: &str,
    role: Option<u32>,
) -> anyhow::Result<(AuthClient, IdentityGrant)> {
    nasd_profile::login_auth(section, user, pw, section.role(role)?, Some(crate::fs_cmd::say_once())).await
}

/// Runs an `nasd auth` subcommand.
pub async fn run(section: &ClientSection, user: Option<&str>, cmd: AuthCommand) -> anyhow::Result<()> {
    let role = match &cmd {
        AuthCommand::Login { role } => *role,
        _ => None,
    };
    let name = section.login_name(user)?;
    // Changing one's own password: the password that logs in is the old one, asked as such.
    let own_passwd = matches!(&cmd, AuthCommand::Passwd { user } if user.as_deref().is_none_or(|u| u == name));
    let pw = if own_passwd {
        crate::fs_cmd::password_asking(&name, section, "current password for")?
    } else {
        password(section, &name)?
    };
    let (mut c, grant) = login_as(section, &name, &pw, role).await?;
    match cmd {
        AuthCommand::Migrate { .. } => anyhow::bail!("migrate works on the server's data directly, without logging in"),
        AuthCommand::Login { .. } => {
            let left = grant.credential.expiration_ns.saturating_sub(now_ns()) / 1_000_000_000;
            println!(
                "uid {} gid {}{}; roles {:?}; this session's role {}; identity key id {}, valid {left} s more",
                grant.uid,
                grant.gid,
                if grant.admin { " (administrator)" } else { "" },
                grant.roles,
                grant.credential.role,
                grant.credential.key_id
            );
        }
        AuthCommand::AddUser { name, uid, gid, admin } => {
            let pw = match std::env::var("NASD_NEW_PASSWORD") {
                Ok(p) => p,
                Err(_) => rpassword::prompt_password(format!("new password for {name}: "))?,
            };
            c.add_user(&name, &pw, uid, gid.unwrap_or(uid), admin).await?;
        }
        AuthCommand::Enable { name: user } => {
            c.set_user_enabled(&user, true).await?;
            tell_manager_users_changed(section, &grant, &name).await;
        }
        AuthCommand::Disable { name: user } => {
            c.set_user_enabled(&user, false).await?;
            tell_manager_users_changed(section, &grant, &name).await;
        }
        AuthCommand::AddRole { role, name } => c.add_role(role, &name).await?,
        AuthCommand::GrantRole { user, role } => {
            c.set_user_role(&user, role, true).await?;
            tell_manager_users_changed(section, &grant, &name).await;
        }
        AuthCommand::RevokeRole { user, role } => {
            c.set_user_role(&user, role, false).await?;
            tell_manager_users_changed(section, &grant, &name).await;
        }
        AuthCommand::CreateGroup { name: group } => {
            let group = c.create_group(&group).await?;
            println!("{}", group.gid);
            if !group.member {
                eprintln!(
                    "you own group {gid} but are not in it: you are in GROUPS_MAX ({max}) groups already; \
                     leave one (remove-member) to join it (add-member {gid} {name})",
                    gid = group.gid,
                    max = nasd_proto::fs::GROUPS_MAX,
                );
            }
        }
        AuthCommand::AddMember { gid, user } => c.set_group_member(gid, &user, true).await?,
        AuthCommand::RemoveMember { gid, user } => c.set_group_member(gid, &user, false).await?,
        AuthCommand::Passwd { user } => {
            let target = user.unwrap_or_else(|| name.clone());
            let new = crate::fs_cmd::new_password(&target)?;
            let changed =
                if own_passwd { c.change_password(&pw, &new).await } else { c.set_password(&target, &new).await };
            changed.with_context(|| format!("cannot change the password of {target}"))?;
            println!(
                "password of {target} changed; identity keys issued before stay valid until they expire \
                 (`nasd auth disable {target}`, or rotate-key then retire-key, cuts them off)"
            );
        }
        AuthCommand::Users => {
            for u in c.users().await? {
                println!(
                    "{}\tuid {}\tgid {}\t{}{}\tgroups {:?}\troles {:?}",
                    u.name,
                    u.uid,
                    u.gid,
                    if u.enabled { "enabled" } else { "disabled" },
                    if u.admin { " admin" } else { "" },
                    u.groups,
                    u.roles
                );
            }
        }
        AuthCommand::RotateKey => {
            let id = c.rotate_key().await?;
            println!("shared key {id} is the one new identity keys use");
            sync_manager(section, &grant, &name).await?;
        }
        AuthCommand::RetireKey { key_id } => {
            c.retire_key(key_id).await?;
            println!("shared key {key_id} retired");
            // The identity this command holds may be one of those just retired: a fresh one
            // (under a live key, from whichever server answers) asks the manager.
            let grant =
                if grant.credential.key_id == key_id { login_as(section, &name, &pw, role).await?.1 } else { grant };
            sync_manager(section, &grant, &name).await?;
        }
    }
    Ok(())
}

/// Has the manager forget what the authentication server told it of users
/// (`SYNC_IDENTITY_KEYS` does that first), so a user just disabled, or
/// whose roles changed, is refused or served as changed at once — through
/// identity sessions and through gateways. The change is made already: a
/// manager that cannot be told is said, with when it notices by itself.
async fn tell_manager_users_changed(section: &ClientSection, grant: &IdentityGrant, user: &str) {
    let told = async {
        let fs = crate::fs_cmd::login_with_identity(section, grant, user).await?;
        fs.sync_identity_keys().await.map_err(anyhow::Error::from)
    };
    match told.await {
        Ok(()) => {}
        // The manager forgot before it went on to the drives.
        Err(e)
            if matches!(
                e.downcast_ref::<nasd_fs::FsError>(),
                Some(nasd_fs::FsError::Fs { status: nasd_proto::fs::FsStatus::DriveUnavailable, .. })
            ) => {}
        Err(e) => eprintln!(
            "warning: the change is made at the authentication server, but the manager was not told ({e:#}); \
             it takes effect there within identity_recheck_secs (30 s by default), through S3 and NFS \
             gateways within {} s",
            nasd_manager::identity::ACTED_FOR_RECHECK_MAX.as_secs()
        ),
    }
}

/// Has the manager install the shared keys on its drives now.
async fn sync_manager(section: &ClientSection, grant: &IdentityGrant, user: &str) -> anyhow::Result<()> {
    let fs = crate::fs_cmd::login_with_identity(section, grant, user).await?;
    fs.sync_identity_keys().await.context("the manager could not bring every drive up to date")?;
    println!("every drive has the change");
    Ok(())
}

fn now_ns() -> u64 {
    nasd_env::clock::system_ns()
}

/// Where the administrator's password is kept, inside the server's directory.
pub const AUTH_ADMIN_PASSWORD_FILE: &str = "admin.password";

/// Opens the authentication server in `dir`, its state where `backing`
/// says. On first start (no user yet, at this server or any other of its
/// database) makes the administrator `admin` (uid 0) with `password`, or
/// with a new one written to `DIR/admin.password` (0600) first.
pub async fn open_auth(
    dir: &Path,
    config: AuthConfig,
    backing: nasd_auth::Backing,
    password: Option<String>,
) -> anyhow::Result<Arc<AuthServer>> {
    let server = Arc::new(AuthServer::open_on(dir, config, backing).await?);
    if !server.no_users().await.map_err(|(_, m)| anyhow::anyhow!(m))? {
        return Ok(server);
    }
    let password = match password {
        Some(p) => p,
        None => {
            let file = dir.join(AUTH_ADMIN_PASSWORD_FILE);
            if file.exists() {
                std::fs::read_to_string(&file)?.trim_end().to_string()
            } else {
                let p = nasd_crypto::Key::random().to_hex()[..24].to_string();
                nasd_crypto::durable::create_new(&file, format!("{p}\n"), 0o600)
                    .with_context(|| format!("cannot write {}", file.display()))?;
                p
            }
        }
    };
    if server.bootstrap_admin("admin", &password, 0).await.map_err(|(_, m)| anyhow::anyhow!(m))? {
        eprintln!("created authentication-server user 'admin' (uid 0)");
    }
    Ok(server)
}

/// Serves `server` on `listener` with `tls` until `stop` turns true.
pub async fn serve_auth(
    server: Arc<AuthServer>,
    listener: tokio::net::TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    server.serve(listener, tls, stop).await;
    Ok(())
}

/// The `[auth]` policy.
pub fn auth_config(file: &AuthSection) -> AuthConfig {
    let d = AuthConfig::default();
    AuthConfig { identity_lifetime: file.identity_lifetime_secs.map_or(d.identity_lifetime, Duration::from_secs), ..d }
}

/// `nasd auth` as a daemon.
pub async fn run_daemon(
    args: AuthArgs,
    file: config::AuthSection,
    metrics_file: config::MetricsSection,
) -> anyhow::Result<()> {
    let data = args
        .data
        .clone()
        .or(file.data.clone())
        .context("no data directory: pass --data DIR (or set [auth] data in the config file)")?;
    let listen: SocketAddr = args
        .listen
        .as_deref()
        .or(file.listen.as_deref())
        .unwrap_or("127.0.0.1:7299")
        .parse()
        .context("--listen is not HOST:PORT")?;
    let port = crate::daemons::ReservedPort::take(listen, "authentication server")?;
    let metrics_port = crate::daemons::metrics_port(
        args.metrics.as_deref().or(metrics_file.auth.as_deref()),
        "authentication server",
    )?;
    let names = if args.tls_names.is_empty() {
        file.tls_names.clone().unwrap_or_else(|| vec!["localhost".into(), "127.0.0.1".into()])
    } else {
        args.tls_names.clone()
    };
    let mut file = file;
    if let Some(bundle) = &args.join {
        let joined = crate::daemons::install_auth_join(bundle, &data)?;
        if args.metadata.is_none() && file.metadata.is_none() {
            file.metadata = Some(joined);
        }
    }
    let location = crate::daemons::location_of(
        args.metadata.as_deref(),
        file.metadata.clone(),
        file.metadata_password_file.clone(),
        "[auth] metadata",
    )?;
    let backing = crate::daemons::auth_backing(location.as_ref())?;
    let tls = nasd_login::tls::ensure_certificates(&data.join("tls"), &names)?;
    let server = open_auth(&data, auth_config(&file), backing, None).await?;
    eprintln!(
        "nasd auth serving {} on {listen} (TLS; clients trust {}; state in {}); the manager logs in with the \
         service token {}",
        data.display(),
        tls.ca.display(),
        server.store_name(),
        data.join(nasd_auth::SERVICE_TOKEN_FILE).display()
    );
    if let Some(port) = metrics_port {
        let registry = nasd_metrics::Metrics::new();
        server.metrics().register(&registry);
        let (addr, _) = crate::daemons::serve_metrics(port, registry, std::future::pending())?;
        eprintln!("metrics at http://{addr}/metrics");
    }
    let (tx, rx) = watch::channel(false);
    let stop = crate::daemons::shutdown_signal();
    tokio::spawn(async move {
        stop.await;
        let _ = tx.send(true);
    });
    serve_auth(server, port.listen()?, nasd_login::tls::acceptor(&tls)?, rx).await?;
    eprintln!("nasd auth stopped cleanly");
    Ok(())
}
