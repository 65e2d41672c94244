//! The manager's network face: TLS connections carrying length-prefixed
//! manager-protocol messages (docs/PROTOCOL.md, "Manager protocol"). The
//! first request must be `LOGIN`; each connection then serves up to
//! [`CONNECTION_REQUESTS_MAX`] requests at once, pipelined, each reply sent
//! when ready (replies carry their request's id). Every input is bounded: message size (smaller before login),
//! sessions, time to log in.

use crate::service::Session;
use crate::{Failure, Manager};
use nasd_login::login_backoff::Verdict;
use nasd_login::peers::{accept_sessions, host_of, request_id_of};
use nasd_proto::fs::FsStatus;
use nasd_proto::manager::{
    ManagerReply, ManagerRequest, LOGIN_MESSAGE_MAX, MANAGER_MESSAGE_MAX, MANAGER_PROTOCOL_VERSION,
    MANAGER_PROTOCOL_VERSION_MIN,
};
use std::cell::Cell;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument;

/// Most connections served at once; more wait to be accepted.
pub const SESSIONS_MAX: usize = 1024;
/// Most connections one peer — an IPv4 address, or an IPv6 /64 — may hold
/// at once; more are closed on accept, so one host cannot take every
/// session (each costs a TLS state and, before login, up to
/// `LOGIN_MESSAGE_MAX` bytes).
pub const SESSIONS_PER_PEER_MAX: usize = 128;
const _: () = assert!(SESSIONS_PER_PEER_MAX <= SESSIONS_MAX);
/// Time a new connection has to finish TLS and log in.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Failed logins after which a connection is closed.
pub const LOGIN_ATTEMPTS_MAX: u32 = 3;
/// A logged-in connection idle this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Requests one connection may have in flight at once (pipelined: each
/// runs as it arrives, its reply, which carries the request's id, sent when
/// ready). Past it the manager reads no more of the connection until one
/// is answered. Each holds a request body and its reply (at most
/// `MANAGER_MESSAGE_MAX` each; most are a few hundred bytes).
pub const CONNECTION_REQUESTS_MAX: usize = nasd_proto::manager::CONNECTION_REQUESTS_MAX;

/// Reads one message body; `None` at a clean end of stream.
pub async fn read_message(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Option<Vec<u8>>> {
    let Some(len) = read_length(r).await? else { return Ok(None) };
    if len > MANAGER_MESSAGE_MAX {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("message of {len} bytes is over MANAGER_MESSAGE_MAX ({MANAGER_MESSAGE_MAX})"),
        ));
    }
    read_body(r, len).await.map(Some)
}

/// Reads a message's length prefix; `None` at a clean end of stream.
async fn read_length(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Option<usize>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => Ok(Some(u32::from_le_bytes(len) as usize)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Reads a body of `len` bytes (already checked against its limit).
async fn read_body(r: &mut (impl AsyncRead + Unpin), len: usize) -> std::io::Result<Vec<u8>> {
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(body)
}

/// Reads one message before login: anything over [`LOGIN_MESSAGE_MAX`] is
/// answered `BAD_REQUEST` and the connection closed, without reading (or
/// allocating) the body. `None` at a clean end of stream.
async fn read_login_message(stream: &mut (impl AsyncRead + AsyncWrite + Unpin)) -> std::io::Result<Option<Vec<u8>>> {
    let Some(len) = read_length(stream).await? else { return Ok(None) };
    if len > LOGIN_MESSAGE_MAX {
        let message = format!(
            "a message of {len} bytes before login is over LOGIN_MESSAGE_MAX ({LOGIN_MESSAGE_MAX}): log in first"
        );
        // The body was not read, so its request id is unknown: 0.
        write_message(stream, &ManagerReply::encode_error(0, FsStatus::BadRequest, &message)).await?;
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, message));
    }
    read_body(stream, len).await.map(Some)
}

/// Writes one message body with its length.
pub async fn write_message(w: &mut (impl AsyncWrite + Unpin), body: &[u8]) -> std::io::Result<()> {
    assert!(body.len() <= MANAGER_MESSAGE_MAX, "message over MANAGER_MESSAGE_MAX");
    w.write_all(&(body.len() as u32).to_le_bytes()).await?;
    w.write_all(body).await?;
    w.flush().await
}

/// The encoded reply to request `id` of `session` (`op` for the log).
fn answer(session: &Session, id: u64, op: &str, done: Result<ManagerReply, Failure>) -> Vec<u8> {
    match done {
        Ok(r) => r.for_version(session.protocol).encode(id),
        Err(f) => {
            tracing::debug!(user = %session.user, op, status = ?f.status, "refused");
            ManagerReply::encode_error(id, f.status, &f.message)
        }
    }
}

/// The status a request ended with.
fn status_of(done: &Result<ManagerReply, Failure>) -> FsStatus {
    done.as_ref().err().map_or(FsStatus::Ok, |f| f.status)
}

/// One debug line per request answered, in its span (`NASD_LOG=nasd_manager=debug`).
fn log_done(done: &Result<ManagerReply, Failure>, started: Instant) {
    let elapsed_us = started.elapsed().as_micros() as u64;
    tracing::debug!(status = ?status_of(done), elapsed_us, "request done");
}

/// Writes the connection's replies in the order they are ready, until every
/// sender is gone.
async fn send_replies(
    mut writer: impl AsyncWrite + Unpin,
    mut replies: tokio::sync::mpsc::Receiver<Vec<u8>>,
) -> std::io::Result<()> {
    while let Some(reply) = replies.recv().await {
        write_message(&mut writer, &reply).await?;
    }
    Ok(())
}

impl Manager {
    /// Accepts TLS connections on `listener` until `shutdown` turns true.
    pub async fn serve(
        self: Arc<Self>,
        listener: impl Into<nasd_env::Listener>,
        tls: TlsAcceptor,
        shutdown: watch::Receiver<bool>,
    ) {
        let listener = listener.into();
        // The first routing table (one manager holds every site) names this manager by the
        // address it advertises, else the one it listens on.
        let addr = match (&self.config().advertise, listener.local_addr()) {
            (Some(a), _) => Some(a.clone()),
            (None, Ok(a)) => Some(a.to_string()),
            (None, Err(e)) => {
                tracing::warn!(error = %e, "no listening address to put in the routing table");
                None
            }
        };
        if let Some(addr) = addr {
            if let Err(f) = self.init_routing(&addr).await {
                tracing::warn!(error = %f.message, "the routing table could not be read or made; retried at each maintenance pass");
            }
        }
        // Acknowledged changes reach the disk within the sync interval, and at shutdown.
        let syncer = self.spawn_metadata_sync(shutdown.clone());
        let stop = shutdown.clone();
        let env = self.env.clone();
        accept_sessions(&env, listener, SESSIONS_MAX, SESSIONS_PER_PEER_MAX, shutdown, |socket, peer| {
            let (me, tls, stop) = (self.clone(), tls.clone(), stop.clone());
            async move {
                if let Err(e) = me.session(socket, host_of(peer.ip()), tls, stop).await {
                    tracing::debug!(%peer, error = %e, "session ended");
                }
            }
        })
        .await;
        if let Err(e) = syncer.await {
            tracing::warn!(error = %e, "the metadata sync task ended abnormally");
        }
    }

    async fn session(
        self: &Arc<Self>,
        socket: nasd_env::Stream,
        host: IpAddr,
        tls: TlsAcceptor,
        mut shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<()> {
        let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "no login in time");
        let mut stream = tokio::time::timeout(LOGIN_TIMEOUT, tls.accept(socket)).await.map_err(|_| timed_out())??;
        let mut session = match tokio::time::timeout(LOGIN_TIMEOUT, self.login_phase(&mut stream, host))
            .await
            .map_err(|_| timed_out())??
        {
            Some(s) => s,
            None => return Ok(()),
        };
        let _open = self.metrics.session_opened();
        let (mut reader, writer) = tokio::io::split(stream);
        let (replies, to_send) = tokio::sync::mpsc::channel::<Vec<u8>>(CONNECTION_REQUESTS_MAX);
        let sender = self.env.spawn(send_replies(writer, to_send));
        let permits = Arc::new(tokio::sync::Semaphore::new(CONNECTION_REQUESTS_MAX));
        let ended = loop {
            // A permit before the next body is read: at most CONNECTION_REQUESTS_MAX requests of
            // this connection are held (read, running or being answered) at once.
            let permit = tokio::select! {
                biased;
                p = permits.clone().acquire_owned() => p.expect("the connection never closes its semaphore"),
                _ = shutdown.changed() => break Ok(()),
            };
            let body = tokio::select! {
                biased;
                b = tokio::time::timeout(IDLE_TIMEOUT, read_message(&mut reader)) => match b {
                    Ok(Ok(Some(b))) => b,
                    Ok(Ok(None)) | Err(_) => break Ok(()),
                    Ok(Err(e)) => break Err(e),
                },
                _ = shutdown.changed() => break Ok(()),
            };
            // In order, before the request runs: a user's changed groups or an expired
            // identity apply to every request read after the change.
            if let Err(f) = self.refresh_session(&mut session).await {
                let reply = ManagerReply::encode_error(request_id_of(&body), f.status, &f.message);
                let _ = replies.send(reply).await;
                break Ok(());
            }
            let (id, trace, req) = match ManagerRequest::decode_traced(&body) {
                Ok(decoded) => decoded,
                Err(e) => {
                    let reply = ManagerReply::encode_error(request_id_of(&body), FsStatus::BadRequest, &e.to_string());
                    if replies.send(reply).await.is_err() {
                        break Ok(());
                    }
                    continue;
                }
            };
            // What the manager logs while it handles the request carries the operation, the
            // request id (the client's, unique on its connection), the session's uid and the
            // operation's trace id (TRACED), which its own requests to drives carry on.
            let span = tracing::warn_span!(
                "request",
                op = req.name(),
                id,
                uid = session.caller.uid,
                trace_id = trace.as_ref().map(|t| t.as_str())
            );
            if let ManagerRequest::GetRouting = req {
                // It changes the session (the version it routes by): in order too.
                let started = Instant::now();
                let routing = self.get_routing(&mut session).instrument(span.clone());
                let done = crate::REQUEST_WROTE.scope(Cell::new(false), routing).await;
                self.metrics.request(req.name(), status_of(&done), started.elapsed());
                span.in_scope(|| log_done(&done, started));
                let reply = answer(&session, id, "get-routing", done);
                if replies.send(reply).await.is_err() {
                    break Ok(());
                }
                continue;
            }
            // Any other request runs beside the ones before it, its reply sent when ready
            // (replies carry the request id: they may come back in any order).
            let (me, snapshot, replies) = (self.clone(), session.clone(), replies.clone());
            self.env.spawn(
                async move {
                    let op = req.name();
                    let started = Instant::now();
                    // Whether it committed anything yet, for an outage of the database ([`Manager::meta`]).
                    let handled = nasd_client::trace::scope(trace, me.handle(&snapshot, req));
                    let done = crate::REQUEST_WROTE.scope(Cell::new(false), handled).await;
                    me.metrics.request(op, status_of(&done), started.elapsed());
                    log_done(&done, started);
                    let reply = answer(&snapshot, id, op, done);
                    let _ = replies.send(reply).await;
                    drop(permit);
                }
                .instrument(span),
            );
        };
        // Requests still running answer before the connection closes.
        drop(replies);
        match sender.await {
            Ok(Err(e)) if ended.is_ok() => Err(e),
            _ => ended,
        }
    }

    /// Reads requests until a successful `LOGIN`; `None` if the peer gave up
    /// or failed too often. Each password from `host` is checked in the
    /// host's turn ([`crate::login_backoff`]).
    async fn login_phase(
        &self,
        stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
        host: IpAddr,
    ) -> std::io::Result<Option<Session>> {
        for _ in 0..LOGIN_ATTEMPTS_MAX {
            let Some(body) = read_login_message(stream).await? else { return Ok(None) };
            let version = match ManagerRequest::decode(&body) {
                Ok((_, ManagerRequest::Login { version, .. } | ManagerRequest::LoginIdentity { version, .. })) => {
                    version
                }
                _ => MANAGER_PROTOCOL_VERSION,
            };
            let (id, result) = match ManagerRequest::decode(&body) {
                // Linked to an authentication server, the manager takes identities only: a
                // password here would be a second, weaker way in (see docs/SECURITY.md). Refused
                // at once, before any hash is computed: nothing is checked, so nothing to pace.
                Ok((id, ManagerRequest::Login { user, .. })) if self.config().auth.is_some() => {
                    self.refused_password_logins.log(|suppressed| {
                        tracing::warn!(user, suppressed, "password login refused: this manager takes identities only")
                    });
                    (id, Err(password_login_refused(self.config().auth.as_ref())))
                }
                Ok((id, ManagerRequest::Login { version, user, password })) => {
                    (id, self.paced_login(host, self.check_login(version, &user, &password)).await)
                }
                Ok((id, ManagerRequest::LoginIdentity { version, credential, proof })) => {
                    (id, self.paced_login(host, self.check_identity_login(version, &credential, &proof)).await)
                }
                Ok((id, _)) => (id, Err(Failure::new(FsStatus::NotLoggedIn, "log in first"))),
                Err(e) => (request_id_of(&body), Err(Failure::new(FsStatus::BadRequest, e.to_string()))),
            };
            self.metrics.login(result.as_ref().err().map(|f| f.status));
            match result {
                Ok(mut s) => {
                    s.protocol = version;
                    let reply =
                        ManagerReply::LoggedIn { version, uid: s.caller.uid, gid: s.caller.gid, admin: s.admin };
                    write_message(stream, &reply.encode(id)).await?;
                    return Ok(Some(s));
                }
                Err(f) => {
                    write_message(stream, &ManagerReply::encode_error(id, f.status, &f.message)).await?;
                }
            }
        }
        Ok(None)
    }

    /// Runs the credential check `check` in `host`'s turn of the login
    /// back-off, and tells the back-off how it went: a wrong credential makes
    /// the host's next turn later, a success clears its record.
    async fn paced_login(
        &self,
        host: IpAddr,
        check: impl std::future::Future<Output = Result<Session, Failure>>,
    ) -> Result<Session, Failure> {
        self.login_backoff
            .paced(host, check, |result| match result {
                Ok(_) => Verdict::Succeeded,
                Err(f) if f.status == FsStatus::BadCredentials => Verdict::Failed,
                Err(_) => Verdict::Neither,
            })
            .await
    }

    /// Checks a `LOGIN_IDENTITY` of `credential`'s 24 bytes: a credential
    /// that does not decode (a format, algorithm, reserved byte or key id the
    /// authentication server never issues) is refused as a wrong one,
    /// `BAD_CREDENTIALS` like a forged MAC — whichever field was altered —
    /// and so counts as a failed login of the host.
    async fn check_identity_login(
        &self,
        version: u8,
        credential: &[u8; nasd_proto::IDENTITY_DATA_LEN],
        proof: &[u8; 32],
    ) -> Result<Session, Failure> {
        if !(MANAGER_PROTOCOL_VERSION_MIN..=MANAGER_PROTOCOL_VERSION).contains(&version) {
            return Err(Failure::new(
                FsStatus::BadRequest,
                format!(
                    "manager protocol version {version} is not supported (this manager speaks \
                     {MANAGER_PROTOCOL_VERSION_MIN}..={MANAGER_PROTOCOL_VERSION})"
                ),
            ));
        }
        let credential = match nasd_proto::IdentityData::decode(credential) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "failed identity login: the credential does not decode");
                return Err(Failure::new(
                    FsStatus::BadCredentials,
                    "the identity does not verify: log in at the authentication server",
                ));
            }
        };
        let s = self.open_identity_session(&credential, proof).await;
        match &s {
            Ok(s) => {
                tracing::info!(user = %s.user, uid = credential.user, role = credential.role, "logged in by identity")
            }
            // An outage is logged by the metadata backend, at a bounded rate.
            Err(f) if f.status == FsStatus::MetadataUnavailable => {}
            Err(f) => tracing::warn!(uid = credential.user, status = ?f.status, "failed identity login"),
        }
        s
    }

    async fn check_login(&self, version: u8, user: &str, password: &str) -> Result<Session, Failure> {
        if !(MANAGER_PROTOCOL_VERSION_MIN..=MANAGER_PROTOCOL_VERSION).contains(&version) {
            return Err(Failure::new(
                FsStatus::BadRequest,
                format!(
                    "manager protocol version {version} is not supported (this manager speaks \
                     {MANAGER_PROTOCOL_VERSION_MIN}..={MANAGER_PROTOCOL_VERSION})"
                ),
            ));
        }
        let s = self.open_session(user, password).await;
        match &s {
            Ok(_) => tracing::info!(user, "logged in"),
            Err(f) if f.status == FsStatus::MetadataUnavailable => {}
            Err(_) => tracing::warn!(user, "failed login"),
        }
        s
    }
}

/// The refusal of a password `LOGIN` at a manager linked to an
/// authentication server: it names the servers, as the database records them.
pub(crate) fn password_login_refused(link: Option<&crate::identity::AuthLink>) -> Failure {
    let servers = link.map_or_else(String::new, |l| format!(" ({})", l.servers()));
    Failure::new(
        FsStatus::BadCredentials,
        format!(
            "this manager takes no passwords: its metadata database is linked to an authentication server{servers}, \
             so log in there (`nasd auth login`, or set auth = \"HOST:PORT\" in [client]) and use the identity key \
             it gives (LOGIN_IDENTITY)"
        ),
    )
}
