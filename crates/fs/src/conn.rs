//! The client's TLS connections to its file manager: each logs in once,
//! then carries up to [`CONNECTION_REQUESTS_MAX`] requests at once
//! (pipelined, replies in any order: `crate::pipeline`); a [`ManagerPool`]
//! sends each request on its least busy connection and opens another, up
//! to [`MANAGER_CONNECTIONS_MAX`], only when every one is that busy.
//!
//! - **Waits and reuse.** Every wait for the manager — connecting, TLS,
//!   taking a request, its answer, the rest of the reply — is bounded by
//!   `FsConfig::reply_timeout` and fails with a time-out naming the manager
//!   and the step. A connection on which a request got no answer (the
//!   stream failed, or the answer did not come in time) is closed, with
//!   every request in flight on it, and none is resent; one the manager
//!   closed is found by its reading task and dropped before any request
//!   goes out on it; one idle longer than [`MANAGER_IDLE_REUSE_MAX`] is
//!   replaced rather than used.
//! - **Failover** (`Managers`, `FsConfig::failover`): each new connection
//!   goes to the manager in use, else the next that answers, round after
//!   round for up to `FAILOVER_WAIT_MAX` (`FAILOVER_CONNECT_WAIT` per
//!   attempt), and stays with the one that answered. Handles work on every
//!   manager of one database; the session logs in again. A request that got
//!   no reply is resent only if it only reads (`repeatable`).
//! - **Routing** (`nasd_proto::routing`): the pool keeps a slot per manager;
//!   every new connection sends `GET_ROUTING`. While the table names more
//!   than one manager, a request naming a handle goes to the manager holding
//!   its first handle's site (under name hashing, a (parent, name) request
//!   to the holder of the name's site), `READ_SMALL`/`WRITE_SMALL` to the
//!   file's, anything else to the manager in use. A `STALE_ROUTING` refusal
//!   fetches the table on that connection and resends by it (at most one per
//!   session plus [`STALE_ROUTING_RESENDS_MAX`]). A routed manager that does
//!   not answer is left out for [`MANAGER_DOWN_AVOID`] and its requests go to
//!   the manager in use. With one manager every request goes to it.
//! - **A database outage** (`METADATA_UNAVAILABLE`): the request changed
//!   nothing and is sent again, with back-off, for up to
//!   `FsConfig::metadata_wait`, said once through `FsConfig::on_wait`.

use crate::pipeline::{Outcome, Pipeline};
use crate::renew::{identity_refusal, IdentityCell};
use crate::wait::{sleep_or_forever, Patience};
use crate::{FsConfig, FsError};
use nasd_proto::fs::FsStatus;
use nasd_proto::manager::{
    Change, ManagerReply, ManagerRequest, CONNECTION_REQUESTS_MAX, MANAGER_MESSAGE_MAX, MANAGER_PROTOCOL_VERSION,
    MANAGER_PROTOCOL_VERSION_MIN, WATCH_WAIT_MAX_MS,
};
use nasd_proto::routing::{name_site, RoutingPolicy, RoutingTable};
use nasd_proto::DecodeError;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// Connections to the manager one client keeps at once. Each carries up to
/// [`CONNECTION_REQUESTS_MAX`] requests at once, so one is enough until that
/// many of one client's requests (concurrent files, tasks sharing an
/// [`crate::FsClient`]) overlap; past this bound times that, requests wait
/// for their turn on the least busy connection. Each costs a TLS session,
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

/// Why a connection to one manager was not made: it did not answer (or was
/// shutting down), so another may; or it answered and refused (a wrong
/// password), which another would too.
enum Unreached {
    Down(FsError),
    Refused(FsError),
}

/// The managers a client may use, in order, and which one it uses now:
/// `FsConfig::manager`, then `FsConfig::failover`.
pub(crate) struct Managers {
    addrs: Vec<String>,
    current: std::sync::atomic::AtomicUsize,
}

impl Managers {
    pub(crate) fn new(config: &FsConfig) -> Result<Managers, FsError> {
        let mut addrs = vec![config.manager.clone()];
        for a in &config.failover {
            if !addrs.contains(a) {
                addrs.push(a.clone());
            }
        }
        if addrs.len() > crate::MANAGERS_MAX {
            return Err(FsError::Setup(format!(
                "{} manager addresses given; at most {} (MANAGERS_MAX)",
                addrs.len(),
                crate::MANAGERS_MAX
            )));
        }
        Ok(Managers { addrs, current: std::sync::atomic::AtomicUsize::new(0) })
    }

    /// The address in use now.
    pub(crate) fn current(&self) -> &str {
        &self.addrs[self.current.load(std::sync::atomic::Ordering::SeqCst) % self.addrs.len()]
    }

    /// A logged-in connection: to the manager in use, or else to the next
    /// one that answers, round after round for up to
    /// [`crate::FAILOVER_WAIT_MAX`]; the one that answered is used from then
    /// on. A refusal (a wrong password) ends it at once. A round in which
    /// no manager logged the client in but one answered that its database
    /// is unavailable ends with that answer (the caller waits the outage out:
    /// [`wait_out_outage`]), not with another manager's silence.
    pub(crate) async fn open(
        &self,
        config: &FsConfig,
        identity: &IdentityCell,
        tls: &TlsConnector,
    ) -> Result<(ManagerConn, Identity), FsError> {
        use std::sync::atomic::Ordering;
        let n = self.addrs.len();
        let connect_wait = if n > 1 { crate::FAILOVER_CONNECT_WAIT } else { config.reply_timeout };
        let deadline = Instant::now() + crate::FAILOVER_WAIT_MAX;
        loop {
            let start = self.current.load(Ordering::SeqCst);
            let mut last = None;
            let mut database_unavailable = None;
            for i in 0..n {
                let at = (start + i) % n;
                match ManagerConn::open_at(&self.addrs[at], connect_wait, config, identity, tls).await {
                    Ok(c) => {
                        if at != start % n {
                            tracing::info!(from = %self.addrs[start % n], to = %self.addrs[at], "moved to another manager");
                        }
                        self.current.store(at, Ordering::SeqCst);
                        return Ok(c);
                    }
                    Err(Unreached::Refused(e)) => return Err(e),
                    Err(Unreached::Down(e @ FsError::Fs { status: FsStatus::MetadataUnavailable, .. })) => {
                        database_unavailable = Some(e)
                    }
                    Err(Unreached::Down(e)) => last = Some(e),
                }
            }
            if let Some(e) = database_unavailable {
                return Err(e);
            }
            let e = last.expect("at least one address");
            if n == 1 || Instant::now() >= deadline {
                return Err(e);
            }
            tokio::time::sleep(FAILOVER_POLL).await;
        }
    }
}

/// Runs `attempt` again while it fails with `METADATA_UNAVAILABLE` (the
/// manager could not reach its database, and the request changed nothing),
/// pausing 100 ms doubling to [`crate::METADATA_RETRY_PAUSE_MAX`], for up to
/// `config.metadata_wait`; tells `config.on_wait` once, with the manager's
/// message (which names the database).
pub(crate) async fn wait_out_outage<T, F: std::future::Future<Output = Result<T, FsError>>>(
    config: &FsConfig,
    mut attempt: impl FnMut() -> F,
) -> Result<T, FsError> {
    let deadline = Instant::now() + config.metadata_wait;
    let mut pause = Duration::from_millis(100);
    let mut told = false;
    loop {
        match attempt().await {
            Err(FsError::Fs { status: FsStatus::MetadataUnavailable, message }) if Instant::now() < deadline => {
                if !told {
                    told = true;
                    let text = format!("{message}; waiting up to {} s for it", config.metadata_wait.as_secs());
                    tracing::warn!("{text}");
                    if let Some(tell) = &config.on_wait {
                        tell(&text);
                    }
                }
                tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
                pause = (pause * 2).min(crate::METADATA_RETRY_PAUSE_MAX);
            }
            other => return other,
        }
    }
}

/// Whether `req` only reads (resolves names, reads attributes, mints
/// capabilities): sending it twice does what sending it once does.
fn repeatable(req: &ManagerRequest) -> bool {
    use ManagerRequest as R;
    match req {
        R::Walk { .. }
        | R::Lookup { .. }
        | R::GetAttr { .. }
        | R::ReadDir { .. }
        | R::StatFs
        | R::GetLayout { .. }
        | R::ClusterStatus
        | R::GetXattr { .. }
        | R::ListXattr { .. }
        | R::GetQuota { .. }
        | R::Sync
        | R::ListUsers => true,
        R::AsUser { request, .. } => repeatable(request),
        _ => false,
    }
}

/// Refuses, before it is sent, a request the manager would refuse for its
/// size (a string over `u16::MAX` bytes cannot be encoded at all).
pub(crate) fn within_limits(req: &ManagerRequest) -> Result<(), FsError> {
    req.check_limits().map_err(|e| {
        let status = match e {
            DecodeError::OverLimit { field: "path" | "name" | "target", .. } => FsStatus::NameTooLong,
            _ => FsStatus::InvalidArgument,
        };
        FsError::Fs { status, message: format!("{}: {e}", req.name()) }
    })
}

/// Pause between rounds over the managers while none answers.
const FAILOVER_POLL: Duration = Duration::from_millis(100);

/// A logged-in connection.
pub(crate) struct ManagerConn {
    stream: TlsStream<nasd_env::Stream>,
    next_id: u64,
    /// Set while a request is in flight; left set if it did not finish.
    broken: bool,
    /// The manager's address and how long each wait for it may take.
    deadline: (String, Duration),
    /// The generation of the identity it logged in with (`IdentityCell`):
    /// once the identity is renewed, the connection is closed when it comes
    /// back idle, and new ones log in with the new identity.
    generation: u64,
    /// The manager protocol version the login agreed on (0 before it).
    protocol: u8,
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
    /// Connects to the manager at `addr`, verifies its certificate for the
    /// configured server name, logs in (with the identity `identity` holds
    /// now, or else the configured password); each step within
    /// `config.reply_timeout` (the connection within `connect_wait`).
    async fn open_at(
        addr: &str,
        connect_wait: Duration,
        config: &FsConfig,
        identity: &IdentityCell,
        tls: &TlsConnector,
    ) -> Result<(Self, Identity), Unreached> {
        let server_name = &config.server_name;
        let deadline = (addr.to_string(), config.reply_timeout);
        let connecting = (addr.to_string(), connect_wait.min(config.reply_timeout));
        let socket = within(&connecting, "accept the connection", config.env.connect(addr)).await.map_err(|e| {
            Unreached::Down(FsError::ManagerUnreachable {
                message: format!("cannot reach the manager at {addr}: {e} (is `nasd up` or `nasd manager` running?)"),
            })
        })?;
        socket.set_nodelay(true).map_err(|e| Unreached::Down(e.into()))?;
        let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).map_err(|_| {
            Unreached::Refused(FsError::Setup(format!("'{server_name}' is not a valid TLS server name")))
        })?;
        let stream = within(&deadline, "finish TLS", tls.connect(name, socket)).await.map_err(|e| {
            let message = format!("TLS with the manager at {addr} failed: {e}");
            // A certificate or protocol refusal is set-up to fix; a connection cut or timed
            // out during the handshake is a manager going away.
            let refused = e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>());
            Unreached::Down(if refused { FsError::Setup(message) } else { FsError::ManagerUnreachable { message } })
        })?;
        let held = identity.current();
        let generation = held.as_ref().map_or(0, |(_, _, g)| *g);
        let mut conn = ManagerConn { stream, next_id: 1, broken: false, deadline, generation, protocol: 0 };
        // The newest version first; a manager that does not speak it refuses the login with
        // BAD_REQUEST before it checks the credential, and the version before is offered
        // (docs/PROTOCOL.md, "Manager protocol versions").
        let mut version = MANAGER_PROTOCOL_VERSION;
        loop {
            let login = match &held {
                Some((credential, idkey, _)) => ManagerRequest::LoginIdentity {
                    version,
                    credential: credential.encode(),
                    proof: nasd_crypto::identity_login_proof(idkey, credential).ok_or_else(|| {
                        Unreached::Refused(FsError::Setup(
                            "the identity credential names an unknown MAC algorithm".into(),
                        ))
                    })?,
                },
                None => {
                    let (user, password) = (config.user.clone(), config.password.clone());
                    ManagerRequest::Login { version, user, password }
                }
            };
            return match conn.call(&login).await {
                Ok(ManagerReply::LoggedIn { version: agreed, uid, gid, admin }) => {
                    if !(MANAGER_PROTOCOL_VERSION_MIN..=version).contains(&agreed) {
                        return Err(Unreached::Refused(FsError::Protocol(format!(
                            "the manager at {addr} logged the session in with protocol version {agreed}, \
                             offered {version}"
                        ))));
                    }
                    conn.protocol = agreed;
                    Ok((conn, Identity { uid, gid, admin }))
                }
                Ok(other) => Err(Unreached::Refused(FsError::Protocol(format!("unexpected login reply {other:?}")))),
                Err(FsError::Fs { status: FsStatus::BadRequest, message })
                    if version > MANAGER_PROTOCOL_VERSION_MIN =>
                {
                    tracing::debug!(manager = addr, version, refusal = %message, "login refused; offering an older version");
                    version -= 1;
                    continue;
                }
                // Overloaded or shutting down: another manager may take the session, or this one later.
                Err(FsError::Fs { status: FsStatus::Busy, message }) => {
                    Err(Unreached::Down(FsError::ManagerUnreachable {
                        message: format!("the manager at {addr} takes no session now: {message}"),
                    }))
                }
                // Without its database: another manager may take the session (or the caller waits the
                // outage out).
                Err(e @ FsError::Fs { status: FsStatus::MetadataUnavailable, .. }) => Err(Unreached::Down(e)),
                Err(e @ FsError::Fs { .. }) => Err(Unreached::Refused(e)),
                // Gone during the login (a manager stopping or restarting).
                Err(FsError::Io(e)) => Err(Unreached::Down(FsError::ManagerUnreachable {
                    message: format!("the manager at {addr} closed the connection before the login finished: {e}"),
                })),
                Err(e) => Err(Unreached::Down(e)),
            };
        }
    }

    /// The connection, logged in, carrying many requests at once from now on.
    fn into_pipeline(self) -> Pipeline {
        Pipeline::start(self.stream, self.next_id, self.deadline, self.generation, self.protocol)
    }

    /// True once a request did not finish: the stream is in an unknown state.
    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Whether the connection can carry another request, found without
    /// waiting (as `DriveClient::is_reusable`): not after an unfinished
    /// request, nor once the manager closed it (idle timeout, restart), nor
    /// if bytes nobody asked for are waiting — once logged in, the manager
    /// sends nothing but replies (its TLS session tickets come before the
    /// login reply and are read with it).
    pub(crate) fn is_reusable(&self) -> bool {
        if self.broken {
            return false;
        }
        self.stream.get_ref().0.is_open_and_idle()
    }

    /// A probe of the connection another task may ask whether it is open
    /// and idle (`None` on a simulated network, or if it cannot be made).
    fn probe(&self) -> Option<nasd_env::StreamProbe> {
        self.stream.get_ref().0.probe().ok().flatten()
    }

    /// Sends a request and waits for its reply.
    pub(crate) async fn call(&mut self, req: &ManagerRequest) -> Result<ManagerReply, FsError> {
        if self.broken {
            return Err(FsError::Protocol("manager connection unusable after an earlier failure".into()));
        }
        within_limits(req)?;
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

/// How long a manager that did not answer is left out of routing: requests
/// for its sites go to the manager in use meanwhile (any manager answers
/// any request), then it is tried again.
pub const MANAGER_DOWN_AVOID: Duration = Duration::from_secs(5);
/// Times one request is sent again after `STALE_ROUTING` beyond one per
/// session the client holds (each refusal refreshes one session's table,
/// so a table change costs at most one refusal per open session): a table
/// changing faster than this is a fault, and the refusal goes to the caller.
pub const STALE_ROUTING_RESENDS_MAX: usize = 4;

/// Up to [`MANAGER_CONNECTIONS_MAX`] logged-in connections to one manager,
/// each carrying up to `CONNECTION_REQUESTS_MAX` requests at once.
struct ManagerSlot {
    conns: Mutex<SlotConns>,
}

#[derive(Default)]
struct SlotConns {
    open: Vec<Arc<Pipeline>>,
    /// Connections being opened for this slot now.
    opening: usize,
}

/// Which connection a request goes out on.
enum Pick {
    Use(Arc<Pipeline>),
    /// Open another (counted in `opening` until [`ManagerSlot::opened`]).
    Open,
}

impl ManagerSlot {
    fn new() -> Self {
        ManagerSlot { conns: Mutex::new(SlotConns::default()) }
    }

    /// The connection a request goes out on: the least busy one with room
    /// for another request; else, while fewer than the bound are open or
    /// being opened, a new one; else the least busy (the request waits
    /// for its turn there). Ended connections, ones logged in with an
    /// identity older than `generation`, and ones idle longer than
    /// [`MANAGER_IDLE_REUSE_MAX`] are dropped first (their requests in
    /// flight finish).
    fn pick(&self, generation: u64) -> Pick {
        let mut c = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        c.open.retain(|p| {
            !p.has_ended() && p.generation == generation && p.idle_for().is_none_or(|d| d <= MANAGER_IDLE_REUSE_MAX)
        });
        let least = c.open.iter().min_by_key(|p| p.in_flight()).cloned();
        match least {
            Some(p) if p.in_flight() < CONNECTION_REQUESTS_MAX => Pick::Use(p),
            _ if c.open.len() + c.opening < MANAGER_CONNECTIONS_MAX => {
                c.opening += 1;
                Pick::Open
            }
            Some(p) => Pick::Use(p),
            // The bound is taken by connections being opened: open one more rather than wait.
            None => {
                c.opening += 1;
                Pick::Open
            }
        }
    }

    /// An opening counted by [`pick`](Self::pick) is over: `conn` if it was made.
    fn opened(&self, conn: Option<Arc<Pipeline>>) {
        let mut c = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        c.opening = c.opening.saturating_sub(1);
        c.open.extend(conn);
    }

    /// Keeps `conn` for requests, unless it logged in with an identity
    /// older than `generation` (then it is closed).
    fn keep(&self, conn: Arc<Pipeline>, generation: u64) {
        if conn.generation == generation {
            self.conns.lock().unwrap_or_else(|p| p.into_inner()).open.push(conn);
        }
    }

    /// Connections with no request in flight.
    fn idle(&self) -> usize {
        let c = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        c.open.iter().filter(|p| !p.has_ended() && p.in_flight() == 0).count()
    }
}

/// What routing did, for tests and diagnostics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingStats {
    /// The routing table version the client routes by (0: none).
    pub version: u64,
    /// Requests sent, per manager address, in address order.
    pub sent: Vec<(String, u64)>,
    /// Requests a manager refused with `STALE_ROUTING` (each followed by a
    /// fetch of the table and a resend).
    pub stale: u64,
    /// Times a routed manager did not answer and another took its request.
    pub rerouted: u64,
}

/// The client's connections to its managers (Slice's µproxy role; the
/// module doc, "Routing"): per manager up to
/// [`MANAGER_CONNECTIONS_MAX`] logged-in connections, as one user. Every
/// new connection fetches the routing table (`GET_ROUTING`); while it names
/// more than one manager, a request naming a handle goes to the manager
/// holding the handle's site (under name hashing, a (parent, name) request
/// to the holder of the name's site), anything else to the manager in use
/// (`FsConfig::manager`, or the one it failed over to). `STALE_ROUTING`
/// means the table changed: the table is fetched on that connection and
/// the request sent again by the new one. A routed manager that does not
/// answer is left out for [`MANAGER_DOWN_AVOID`] and its request goes to the
/// manager in use, whose table is taken too.
///
/// A request goes out on the least busy connection with room for it (or
/// opens one while fewer than the bound exist), beside the others in
/// flight there. A connection on which a request failed in transport or
/// protocol (a time-out included) is closed, never reused, with every
/// request in flight on it, and none is resent — unless the client
/// knows several managers and the request only reads, which is sent once
/// more on a new connection (to another manager if the one in use is
/// gone); the next request opens a fresh connection in its place. New
/// connections to the manager in use fail over ([`Managers::open`]). An
/// idle connection the manager has closed meanwhile (its idle timeout, a
/// restart) is found without waiting and replaced before any request goes
/// out on it.
pub(crate) struct ManagerPool {
    /// Where and as whom to connect, and the wait bound (`reply_timeout`).
    config: FsConfig,
    /// The identity connections log in with, renewed before it expires.
    identity: Arc<IdentityCell>,
    /// The managers, and the one in use.
    managers: Arc<Managers>,
    tls: TlsConnector,
    /// Per manager address.
    slots: Mutex<std::collections::HashMap<String, Arc<ManagerSlot>>>,
    /// The newest routing table a manager gave.
    routing: std::sync::RwLock<Option<Arc<RoutingTable>>>,
    /// Routed managers that did not answer, and until when to leave them out.
    down: Mutex<std::collections::HashMap<String, Instant>>,
    stats: Mutex<RoutingStats>,
    /// Whether a new connection can be made now, as the last attempt found.
    outage: Mutex<Outage>,
    /// Woken when an outage ends.
    back: tokio::sync::Notify,
    /// Held by the one waiting request that tries a new connection; when
    /// the last try was made.
    probe: tokio::sync::Mutex<Option<Instant>>,
}

/// An outage: no new connection to any manager could be made.
#[derive(Default)]
struct Outage {
    /// Since when, if one is going on.
    since: Option<Instant>,
    /// Why the last attempt failed.
    cause: String,
    /// Requests that waited in it; the first logged it, so its end is logged.
    waited: u64,
}

impl ManagerPool {
    /// Connects and logs in once (so a wrong password or an unreachable
    /// manager fails here), keeping that connection as the first idle one.
    pub(crate) async fn open(
        config: &FsConfig,
        cell: Arc<IdentityCell>,
        tls: &TlsConnector,
    ) -> Result<(ManagerPool, Identity), FsError> {
        let managers = Arc::new(Managers::new(config)?);
        let (conn, identity) = wait_out_outage(config, || managers.open(config, &cell, tls)).await?;
        let pool = ManagerPool {
            config: config.clone(),
            identity: cell,
            managers,
            tls: tls.clone(),
            slots: Mutex::new(std::collections::HashMap::new()),
            routing: std::sync::RwLock::new(None),
            down: Mutex::new(std::collections::HashMap::new()),
            stats: Mutex::new(RoutingStats::default()),
            outage: Mutex::new(Outage::default()),
            back: tokio::sync::Notify::new(),
            probe: tokio::sync::Mutex::new(None),
        };
        let conn = pool.fetch_routing(conn).await;
        if let Some(conn) = conn {
            let generation = pool.identity.generation();
            pool.slot(&conn.deadline.0).keep(Arc::new(conn.into_pipeline()), generation);
        }
        Ok((pool, identity))
    }

    fn slot(&self, addr: &str) -> Arc<ManagerSlot> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = slots.get(addr) {
            return slot.clone();
        }
        slots.entry(addr.to_string()).or_insert_with(|| Arc::new(ManagerSlot::new())).clone()
    }

    /// The routing table the client routes by, if a manager gave one.
    pub(crate) fn routing_table(&self) -> Option<Arc<RoutingTable>> {
        self.routing.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Keeps `table` if it is newer than the one held.
    fn adopt(&self, table: RoutingTable) {
        let mut held = self.routing.write().unwrap_or_else(|p| p.into_inner());
        if held.as_ref().is_none_or(|h| h.version < table.version) {
            tracing::debug!(version = table.version, managers = table.managers.len(), "routing table");
            self.stats.lock().unwrap_or_else(|p| p.into_inner()).version = table.version;
            *held = Some(Arc::new(table));
        }
    }

    /// Sends `GET_ROUTING` on `conn` (so its session routes by the table it
    /// gets) and keeps the table if newer; the connection back unless the
    /// request broke it. A manager without a table (or one that does not
    /// know the request) leaves the client unrouted.
    async fn fetch_routing(&self, mut conn: ManagerConn) -> Option<ManagerConn> {
        match conn.call(&ManagerRequest::GetRouting).await {
            Ok(ManagerReply::Routing(table)) => self.adopt(table),
            Ok(other) => tracing::debug!(reply = ?other, "unexpected GET_ROUTING reply"),
            Err(e) => tracing::debug!(error = %e, "no routing table"),
        }
        (!conn.is_broken()).then_some(conn)
    }

    /// Sends `GET_ROUTING` on a connection in use (after a `STALE_ROUTING`
    /// refusal on it: its session routes by the new table from then on)
    /// and keeps the table if newer.
    async fn fetch_routing_on(&self, conn: &Pipeline) {
        match conn.call(&ManagerRequest::GetRouting).await {
            Outcome::Answered(Ok(ManagerReply::Routing(table))) => self.adopt(table),
            Outcome::Answered(Ok(other)) => tracing::debug!(reply = ?other, "unexpected GET_ROUTING reply"),
            Outcome::Answered(Err(e)) | Outcome::Lost(e) | Outcome::NotSent(e) => {
                tracing::debug!(error = %e, "no routing table")
            }
            Outcome::Ended => tracing::debug!("no routing table: the connection ended"),
        }
    }

    /// The manager `req` goes to: the holder of its site when the table
    /// names several managers and that one is not left out; else `None`,
    /// the manager in use.
    fn route(&self, req: &ManagerRequest) -> Option<String> {
        let table = self.routing_table()?;
        if table.managers.len() < 2 {
            return None;
        }
        let site = site_of(&table, req)?;
        let addr = table.manager_of(site);
        let mut down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        match down.get(addr) {
            Some(until) if Instant::now() < *until => None,
            Some(_) => {
                down.remove(addr);
                Some(addr.to_string())
            }
            None => Some(addr.to_string()),
        }
    }

    /// A new logged-in connection to `target` (its table fetched), or to
    /// the manager in use if `target` is `None` or does not answer.
    async fn connect(&self, target: Option<&str>) -> Result<Arc<Pipeline>, FsError> {
        if let Some(addr) = target {
            let wait = crate::FAILOVER_CONNECT_WAIT.min(self.config.reply_timeout);
            match ManagerConn::open_at(addr, wait, &self.config, &self.identity, &self.tls).await {
                Ok((conn, _)) => {
                    if let Some(conn) = self.fetch_routing(conn).await {
                        return Ok(Arc::new(conn.into_pipeline()));
                    }
                }
                Err(Unreached::Refused(e)) => return Err(e),
                Err(Unreached::Down(e)) => {
                    tracing::info!(manager = addr, error = %e, "a routed manager did not answer; using another");
                }
            }
            self.down
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(addr.to_string(), Instant::now() + MANAGER_DOWN_AVOID);
            self.stats.lock().unwrap_or_else(|p| p.into_inner()).rerouted += 1;
        }
        let (conn, _) = match self.managers.open(&self.config, &self.identity, &self.tls).await {
            Ok(c) => {
                self.note_reachable();
                c
            }
            Err(e) => {
                if let FsError::ManagerUnreachable { message } = &e {
                    self.note_unreachable(message);
                }
                return Err(e);
            }
        };
        let addr = self.managers.current().to_string();
        match self.fetch_routing(conn).await {
            Some(conn) => Ok(Arc::new(conn.into_pipeline())),
            // Gone right after the login: nothing of the caller's was sent.
            None => {
                let message = format!("the connection to the manager at {addr} broke while fetching the routing table");
                self.note_unreachable(&message);
                Err(FsError::ManagerUnreachable { message })
            }
        }
    }

    // ------------------------------------------------------------ outages

    /// How long no manager has answered, if none answers now (as the last
    /// attempt at a new connection found).
    pub(crate) fn outage(&self) -> Option<std::time::Duration> {
        self.outage.lock().unwrap_or_else(|p| p.into_inner()).since.map(|t| t.elapsed())
    }

    fn note_unreachable(&self, cause: &str) {
        let mut o = self.outage.lock().unwrap_or_else(|p| p.into_inner());
        o.since.get_or_insert_with(Instant::now);
        o.cause = cause.to_string();
    }

    /// A manager answered: an outage going on ends, logged if it was, and
    /// the requests waiting in it go on.
    fn note_reachable(&self) {
        let ended = {
            let mut o = self.outage.lock().unwrap_or_else(|p| p.into_inner());
            o.since.take().map(|since| (since.elapsed(), std::mem::take(&mut o.waited)))
        };
        if let Some((lasted, waited)) = ended {
            if waited > 0 {
                tracing::info!(
                    target: crate::OUTAGE_LOG_TARGET,
                    manager = %self.managers.current(),
                    after_secs = lasted.as_secs(),
                    requests_waited = waited,
                    "the manager answers again; the requests that waited for it go on"
                );
            }
            self.back.notify_waiters();
        }
    }

    /// Counts a request that waits in the outage going on; the first logs it.
    fn note_waiting(&self, wait: crate::ManagerWait) {
        let mut o = self.outage.lock().unwrap_or_else(|p| p.into_inner());
        o.waited += 1;
        if o.waited == 1 {
            let waits = match wait {
                crate::ManagerWait::Hard => "until it is back (interruptible)".to_string(),
                crate::ManagerWait::Bounded(d) => format!("up to {} s, then fail with EIO", d.as_secs_f64()),
            };
            tracing::warn!(
                target: crate::OUTAGE_LOG_TARGET,
                manager = %self.managers.current(),
                cause = %o.cause,
                "the manager cannot be reached: requests wait for it {waits}"
            );
        }
    }

    /// While an outage goes on, waits (holding no connection slot) until it
    /// ends, the request's bound passes (`ManagerUnreachable`), or its
    /// caller is interrupted (`Interrupted`); meanwhile one waiting request
    /// at a time tries a new connection every [`crate::MANAGER_PROBE_PAUSE`].
    async fn wait_while_down(&self, patience: &Patience, started: Instant, counted: &mut bool) -> Result<(), FsError> {
        loop {
            let back = self.back.notified();
            tokio::pin!(back);
            back.as_mut().enable();
            let cause = {
                let o = self.outage.lock().unwrap_or_else(|p| p.into_inner());
                match o.since {
                    None => return Ok(()),
                    Some(_) => o.cause.clone(),
                }
            };
            let left = patience.left(started);
            if left == Some(std::time::Duration::ZERO) {
                if patience.waits() && !self.tried_since(started).await {
                    // A bound shorter than the pause between tries: one try of its own
                    // before the request fails, so a manager back by then is found (a
                    // request that does not wait fails at once, as it did).
                    self.try_connect().await;
                    continue;
                }
                let waited = started.elapsed().as_secs_f64();
                return Err(FsError::ManagerUnreachable {
                    message: format!("{cause}; gave up after waiting {waited:.1} s for it (the mount's manager_wait)"),
                });
            }
            if !*counted {
                *counted = true;
                self.note_waiting(patience.wait);
            }
            tokio::select! {
                biased;
                () = &mut back => {}
                () = self.probe() => {}
                () = sleep_or_forever(left) => {}
                () = patience.interrupted() => {
                    return Err(FsError::Interrupted {
                        message: format!("interrupted while waiting for the manager ({cause})"),
                    });
                }
            }
        }
    }

    /// Tries a new connection, one request at a time and no sooner than
    /// [`crate::MANAGER_PROBE_PAUSE`] after the last try; one that is made is
    /// kept for the requests that waited. Returns once the try is over
    /// (at once if the outage ended meanwhile).
    ///
    /// # Cancel safety
    /// Cancel safe: a try dropped half-way sent nothing.
    async fn probe(&self) {
        let last = self.probe.lock().await;
        if let Some(at) = *last {
            tokio::time::sleep_until(at + crate::MANAGER_PROBE_PAUSE).await;
        }
        self.try_connect_holding(last).await;
    }

    /// Whether a try at a new connection began at or after `since`.
    async fn tried_since(&self, since: Instant) -> bool {
        self.probe.lock().await.is_some_and(|at| at >= since)
    }

    /// A try at a new connection now, without the pause [`probe`](Self::probe) keeps.
    async fn try_connect(&self) {
        let last = self.probe.lock().await;
        self.try_connect_holding(last).await;
    }

    async fn try_connect_holding(&self, mut last: tokio::sync::MutexGuard<'_, Option<Instant>>) {
        if self.outage().is_none() {
            return;
        }
        *last = Some(Instant::now());
        match self.connect(None).await {
            Ok(conn) => self.slot(&conn.deadline.0).keep(conn, self.identity.generation()),
            Err(FsError::ManagerUnreachable { .. }) => {}
            // It answered, and refused (a password changed meanwhile): the requests go on to
            // meet the refusal themselves.
            Err(e) => {
                tracing::debug!(error = %e, "a manager answered the outage's probe with a refusal");
                self.note_reachable();
            }
        }
    }

    /// Sends one request (routed by the table) and waits for its reply,
    /// each wait bounded by `reply_timeout`; sent again after
    /// `STALE_ROUTING`, by the table fetched then.
    ///
    /// # Cancel safety
    /// Dropping the future closes the connection it was using (its request
    /// may or may not have reached the manager); the pool opens another when
    /// needed.
    ///
    /// The identity is renewed first if it nears expiry (in the background
    /// while it is still valid), and once more, with the request sent
    /// again, if the manager refuses it as expired (`crate::renew`).
    pub(crate) async fn call(&self, req: &ManagerRequest) -> Result<ManagerReply, FsError> {
        wait_out_outage(&self.config, || self.call_once(req)).await
    }

    /// [`call`](Self::call) without waiting out a database outage.
    async fn call_once(&self, req: &ManagerRequest) -> Result<ManagerReply, FsError> {
        self.identity.ensure_fresh().await;
        let generation = self.identity.generation();
        match self.call_routed(req).await {
            // Refused before anything was done: the session's identity ran out.
            Err(e) if identity_refusal(&e) && self.identity.renew_after_refusal(generation).await => {
                tracing::debug!(request = req.name(), "sending the request again under the renewed identity");
                self.call_routed(req).await
            }
            r => r,
        }
    }

    /// [`call`](Self::call) without renewal.
    async fn call_routed(&self, req: &ManagerRequest) -> Result<ManagerReply, FsError> {
        let mut resent = 0;
        loop {
            let target = self.route(req);
            match self.call_at(target.as_deref(), req).await {
                Err(FsError::Fs { status: FsStatus::StaleRouting, .. })
                    if resent < self.stale_resends_max() && !req.handles().is_empty() =>
                {
                    resent += 1;
                }
                r => return r,
            }
        }
    }

    /// How often one request may be sent again after `STALE_ROUTING`: once
    /// per session the client may hold, plus [`STALE_ROUTING_RESENDS_MAX`]
    /// (asked only after a refusal, not on every request).
    fn stale_resends_max(&self) -> usize {
        let sessions = self.slots.lock().unwrap_or_else(|p| p.into_inner()).len() * MANAGER_CONNECTIONS_MAX;
        sessions + STALE_ROUTING_RESENDS_MAX
    }

    /// Sends one request to `target` (`None`: the manager in use), waiting
    /// for a manager as the request's [`Patience`] allows while none answers.
    async fn call_at(&self, target: Option<&str>, req: &ManagerRequest) -> Result<ManagerReply, FsError> {
        let key = target.map_or_else(|| self.managers.current().to_string(), str::to_string);
        let slot = self.slot(&key);
        let patience = Patience::current();
        let started = Instant::now();
        let mut counted = false;
        let mut sent = 0;
        loop {
            if patience.waits() {
                self.wait_while_down(&patience, started, &mut counted).await?;
            }
            let conn = match slot.pick(self.identity.generation()) {
                Pick::Use(c) => c,
                Pick::Open => {
                    let made = self.connect(target).await;
                    slot.opened(made.as_ref().ok().cloned());
                    match made {
                        Ok(c) => c,
                        // Nothing was sent: wait for a manager (the outage is noted), then try again.
                        Err(FsError::ManagerUnreachable { .. }) if patience.waits() => continue,
                        Err(e) => return Err(e),
                    }
                }
            };
            let at = conn.deadline.0.clone();
            let lost = match conn.call(req).await {
                Outcome::NotSent(e) => return Err(e),
                // Nothing went out: the next pick drops the ended connection.
                Outcome::Ended => continue,
                Outcome::Answered(r) => Err(r),
                Outcome::Lost(e) => Ok(e),
            };
            sent += 1;
            {
                let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                match stats.sent.iter_mut().find(|(a, _)| *a == at) {
                    Some((_, n)) => *n += 1,
                    None => {
                        stats.sent.push((at.clone(), 1));
                        stats.sent.sort();
                    }
                }
            }
            let e = match lost {
                Ok(e) => e,
                Err(r) => {
                    // Refused before anything was done: take the table on this session, then the
                    // caller sends the request again by it.
                    if let Err(FsError::Fs { status: FsStatus::StaleRouting, .. }) = &r {
                        self.stats.lock().unwrap_or_else(|p| p.into_inner()).stale += 1;
                        self.fetch_routing_on(&conn).await;
                    }
                    return r;
                }
            };
            // No reply: the manager died or the connection broke. A request that only
            // reads is sent once more (to another manager, if this one is gone, or to this
            // one once it is back, if the request may wait); any other may have been
            // carried out, and its failure is the caller's to judge.
            let others = self.managers.addrs.len() > 1 || target.is_some();
            if sent > 1 || !repeatable(req) || !(others || patience.waits()) {
                return Err(e);
            }
            tracing::debug!(request = req.name(), "no reply from the manager; sending the request once more");
        }
    }

    /// What routing did so far.
    pub(crate) fn routing_stats(&self) -> RoutingStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The address of the manager in use.
    pub(crate) fn current_manager(&self) -> String {
        self.managers.current().to_string()
    }

    /// Idle connections held, all managers together (for tests and diagnostics).
    pub(crate) fn idle_connections(&self) -> usize {
        let slots: Vec<_> = self.slots.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        slots.iter().map(|s| s.idle()).sum()
    }

    /// A change-feed watcher with a connection of its own (opened at its
    /// first wait).
    pub(crate) fn watcher(&self) -> Watcher {
        Watcher {
            config: self.config.clone(),
            identity: self.identity.clone(),
            tls: self.tls.clone(),
            managers: self.managers.clone(),
            conn: None,
            link: WatchLink::default(),
            incarnation: 0,
            next: 0,
        }
    }
}

/// The site a request is routed by: under name hashing, a (parent, name)
/// request's name site; else its first handle's site; `None` for requests
/// naming no handle.
fn site_of(table: &RoutingTable, req: &ManagerRequest) -> Option<u8> {
    use ManagerRequest as R;
    if table.policy == RoutingPolicy::NameHashing {
        match req {
            R::Lookup { parent, name, .. }
            | R::Mkdir { parent, name, .. }
            | R::Create { parent, name, .. }
            | R::Symlink { parent, name, .. }
            | R::Mknod { parent, name, .. }
            | R::Unlink { parent, name }
            | R::Rmdir { parent, name }
            | R::Rename { parent, name, .. } => return Some(name_site(parent.ino, name)),
            R::Link { new_parent, new_name, .. } => return Some(name_site(new_parent.ino, new_name)),
            R::AsUser { request, .. } => return site_of(table, request),
            _ => {}
        }
    }
    req.handles().first().map(|h| h.site)
}

/// What one wait of a [`Watcher`] brought.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeBatch {
    /// Changes were missed (the manager restarted, the watcher fell behind
    /// its log, or this is the first wait): drop everything cached.
    pub lost: bool,
    /// The changes since the last wait, in order.
    pub changes: Vec<Change>,
}

/// Follows the manager's change feed (`WATCH`) on a connection of its own:
/// each [`wait`](Watcher::wait) returns what changed since the last one, or
/// says changes were lost. A connection that fails is replaced at the next
/// wait; the position in the feed is kept, so nothing is missed unless the
/// manager says so.
pub struct Watcher {
    config: FsConfig,
    /// The client's identity (renewed with the client's).
    identity: Arc<IdentityCell>,
    tls: TlsConnector,
    /// The client's managers (a watcher moves with the client; another
    /// manager's feed is another incarnation, so it reports changes lost).
    managers: Arc<Managers>,
    conn: Option<ManagerConn>,
    /// Its connection, for [`Watcher::link`].
    link: WatchLink,
    incarnation: u64,
    next: u64,
}

/// Whether a [`Watcher`]'s connection to the manager is open and idle now,
/// asked from anywhere without waiting ([`Watcher::link`]): false while it
/// has none, once the manager closed it, and while something the manager
/// sent on it is not read yet (a batch of changes, a refusal).
#[derive(Debug, Clone, Default)]
pub struct WatchLink(Arc<std::sync::Mutex<Option<nasd_env::StreamProbe>>>);

impl WatchLink {
    /// See [`WatchLink`].
    pub fn is_open_and_idle(&self) -> bool {
        self.slot().as_ref().is_some_and(|p| p.is_open_and_idle())
    }

    fn set(&self, probe: Option<nasd_env::StreamProbe>) {
        *self.slot() = probe;
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<nasd_env::StreamProbe>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // The probe's descriptor would hold the connection open.
        self.link.set(None);
    }
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").field("incarnation", &self.incarnation).field("next", &self.next).finish()
    }
}

impl Watcher {
    /// Its connection's state, for other tasks ([`WatchLink`]).
    pub fn link(&self) -> WatchLink {
        self.link.clone()
    }

    /// Waits up to `wait` (at most `WATCH_WAIT_MAX_MS`, and half the reply
    /// timeout) for changes; returns at once if there are some.
    ///
    /// # Errors
    /// The manager unreachable or refusing; the next call tries a fresh
    /// connection.
    ///
    /// # Cancel safety
    /// Dropping the future drops its connection; the position in the feed
    /// is kept.
    pub async fn wait(&mut self, wait: Duration) -> Result<ChangeBatch, FsError> {
        let most = Duration::from_millis(u64::from(WATCH_WAIT_MAX_MS)).min(self.config.reply_timeout / 2);
        let wait_ms = wait.min(most).as_millis() as u32;
        self.identity.ensure_fresh().await;
        let generation = self.identity.generation();
        let req = ManagerRequest::Watch { incarnation: self.incarnation, after: self.next, wait_ms };
        let reply = match self.watch_once(&req).await {
            // The session's identity ran out: renewed, asked once more (a WATCH only reads).
            Err(e) if identity_refusal(&e) && self.identity.renew_after_refusal(generation).await => {
                self.watch_once(&req).await
            }
            r => r,
        };
        match reply? {
            ManagerReply::Changes { incarnation, next, lost, changes } => {
                (self.incarnation, self.next) = (incarnation, next);
                Ok(ChangeBatch { lost, changes })
            }
            other => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Sends `req` on the watcher's connection (a new one if it has none
    /// usable, or one logged in with an identity since renewed).
    async fn watch_once(&mut self, req: &ManagerRequest) -> Result<ManagerReply, FsError> {
        let generation = self.identity.generation();
        let mut conn = match self.conn.take() {
            Some(c) if c.generation == generation && c.is_reusable() => c,
            _ => {
                self.link.set(None);
                let conn = self.managers.open(&self.config, &self.identity, &self.tls).await?.0;
                self.link.set(conn.probe());
                conn
            }
        };
        let reply = conn.call(req).await;
        if conn.is_broken() {
            self.link.set(None);
        } else {
            self.conn = Some(conn);
        }
        reply
    }
}
