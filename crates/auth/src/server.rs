//! The authentication server's network face: TLS connections carrying
//! length-prefixed messages (docs/PROTOCOL.md, "Authentication-server
//! protocol"). The first request must be `LOGIN` or `SERVICE_LOGIN`; each
//! connection then serves one request at a time. Every input is bounded:
//! message size (smaller before login), sessions in all and per peer, time
//! to log in, failed logins per connection, and password checks per host
//! ([`nasd_login::login_backoff`]) — those of `CHANGE_PASSWORD` included.

use crate::store::Refusal;
use crate::{AuthServer, Principal};
use nasd_login::auth_client::{read_frame, write_frame};
use nasd_login::login_backoff::Verdict;
use nasd_login::peers::{accept_sessions, host_of, request_id_of};
use nasd_proto::auth::{AuthReply, AuthRequest, AUTH_LOGIN_MESSAGE_MAX, AUTH_MESSAGE_MAX, AUTH_PROTOCOL_VERSION};
use nasd_proto::fs::FsStatus;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

/// Most connections served at once; more wait to be accepted.
pub const AUTH_SESSIONS_MAX: usize = 1024;
/// Most connections one host (an IPv4 address, an IPv6 /64) holds at once;
/// more are closed on accept.
pub const AUTH_SESSIONS_PER_PEER_MAX: usize = 128;
/// Time a new connection has to finish TLS and log in.
pub const AUTH_LOGIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Failed logins after which a connection is closed.
pub const AUTH_LOGIN_ATTEMPTS_MAX: u32 = 3;
/// A logged-in connection idle this long is closed.
pub const AUTH_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

const _: () = assert!(AUTH_SESSIONS_PER_PEER_MAX <= AUTH_SESSIONS_MAX);

impl AuthServer {
    /// Accepts TLS connections on `listener` until `shutdown` turns true.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, tls: TlsAcceptor, shutdown: watch::Receiver<bool>) {
        self.serve_on(listener.into(), tls, shutdown).await
    }

    /// [`AuthServer::serve`] on a listener of the server's environment
    /// (its sessions are that environment's tasks: a simulated crash ends them).
    pub async fn serve_on(
        self: Arc<Self>,
        listener: nasd_env::Listener,
        tls: TlsAcceptor,
        shutdown: watch::Receiver<bool>,
    ) {
        let stop = shutdown.clone();
        let env = self.env.clone();
        accept_sessions(&env, listener, AUTH_SESSIONS_MAX, AUTH_SESSIONS_PER_PEER_MAX, shutdown, |socket, peer| {
            let (me, tls, stop) = (self.clone(), tls.clone(), stop.clone());
            async move {
                if let Err(e) = me.session(socket, host_of(peer.ip()), tls, stop).await {
                    tracing::debug!(%peer, error = %e, "session ended");
                }
            }
        })
        .await
    }

    async fn session(
        &self,
        socket: nasd_env::Stream,
        host: IpAddr,
        tls: TlsAcceptor,
        mut shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<()> {
        let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "no login in time");
        let mut stream =
            tokio::time::timeout(AUTH_LOGIN_TIMEOUT, tls.accept(socket)).await.map_err(|_| timed_out())??;
        let who = match tokio::time::timeout(AUTH_LOGIN_TIMEOUT, self.login_phase(&mut stream, host))
            .await
            .map_err(|_| timed_out())??
        {
            Some(w) => w,
            None => return Ok(()),
        };
        let _open = self.metrics.session_opened();
        // Wrong old passwords given to `CHANGE_PASSWORD` on this connection.
        let mut wrong_old_passwords = 0u32;
        loop {
            let body = tokio::select! {
                biased;
                b = tokio::time::timeout(AUTH_IDLE_TIMEOUT, read_frame(&mut stream, AUTH_MESSAGE_MAX)) => match b {
                    Ok(b) => b?,
                    Err(_) => return Ok(()),
                },
                _ = shutdown.changed() => return Ok(()),
            };
            let Some(body) = body else { return Ok(()) };
            let reply = match AuthRequest::decode(&body) {
                Ok((id, req)) => match self.paced(host, who, req).await {
                    Ok(r) => r.encode(id),
                    Err((status, message)) => {
                        tracing::debug!(?who, ?status, "refused");
                        self.metrics.refused(status);
                        // A wrong old password counts as a failed login: the connection
                        // gets AUTH_LOGIN_ATTEMPTS_MAX of them, as before login.
                        if status == FsStatus::BadCredentials {
                            wrong_old_passwords += 1;
                        }
                        let end = status == FsStatus::NotLoggedIn || wrong_old_passwords >= AUTH_LOGIN_ATTEMPTS_MAX;
                        let reply = AuthReply::encode_error(id, status, &message);
                        if end {
                            write_frame(&mut stream, &reply).await?;
                            return Ok(());
                        }
                        reply
                    }
                },
                Err(e) => {
                    self.metrics.refused(FsStatus::BadRequest);
                    AuthReply::encode_error(request_id_of(&body), FsStatus::BadRequest, &e.to_string())
                }
            };
            write_frame(&mut stream, &reply).await?;
        }
    }

    /// Serves one request of a logged-in connection from `host`; a
    /// `CHANGE_PASSWORD`, which checks a password, takes its turn and counts
    /// as a login attempt of the host ([`nasd_login::login_backoff`]).
    async fn paced(&self, host: IpAddr, who: Principal, req: AuthRequest) -> Result<AuthReply, Refusal> {
        if !matches!(req, AuthRequest::ChangePassword { .. }) {
            return self.handle(who, req).await;
        }
        self.login_backoff.paced(host, self.handle(who, req), password_verdict).await
    }

    /// Reads requests until a successful login; `None` if the peer gave up
    /// or failed too often.
    async fn login_phase(
        &self,
        stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
        host: IpAddr,
    ) -> std::io::Result<Option<Principal>> {
        for _ in 0..AUTH_LOGIN_ATTEMPTS_MAX {
            let body = match read_frame(stream, AUTH_LOGIN_MESSAGE_MAX).await {
                Ok(Some(b)) => b,
                Ok(None) => return Ok(None),
                Err(e) => {
                    let message =
                        format!("{e} before login (AUTH_LOGIN_MESSAGE_MAX {AUTH_LOGIN_MESSAGE_MAX}): log in first");
                    let _ = write_frame(stream, &AuthReply::encode_error(0, FsStatus::BadRequest, &message)).await;
                    return Err(e);
                }
            };
            let version_ok = |v: u8| {
                if v == AUTH_PROTOCOL_VERSION {
                    Ok(())
                } else {
                    Err((
                        FsStatus::BadRequest,
                        format!("protocol version {v} is not supported (this server speaks {AUTH_PROTOCOL_VERSION})"),
                    ))
                }
            };
            let (id, result) = match AuthRequest::decode(&body) {
                Ok((id, AuthRequest::Login { version, user, password, role })) => {
                    let result = match version_ok(version) {
                        Err(e) => Err(e),
                        Ok(()) => {
                            self.login_backoff.paced(host, self.login(&user, &password, role), password_verdict).await
                        }
                    };
                    (id, result)
                }
                Ok((id, AuthRequest::ServiceLogin { version, token })) => {
                    let result = match version_ok(version) {
                        Err(e) => Err(e),
                        Ok(()) => {
                            let check = async { self.service_login(&token).map(|()| AuthReply::Done) };
                            // Any refusal of a service token counts as a wrong one.
                            let verdict = |r: &Result<_, _>| match r {
                                Ok(_) => Verdict::Succeeded,
                                Err(_) => Verdict::Failed,
                            };
                            self.login_backoff.paced(host, check, verdict).await
                        }
                    };
                    (id, result)
                }
                Ok((id, _)) => (id, Err((FsStatus::NotLoggedIn, "log in first".to_string()))),
                Err(e) => (request_id_of(&body), Err((FsStatus::BadRequest, e.to_string()))),
            };
            match result {
                Ok(reply) => {
                    let who = match &reply {
                        AuthReply::LoggedIn { uid, .. } => Principal::User(*uid),
                        _ => Principal::Service,
                    };
                    self.metrics.logged_in(matches!(who, Principal::User(_)));
                    write_frame(stream, &reply.encode(id)).await?;
                    return Ok(Some(who));
                }
                Err((status, message)) => {
                    self.metrics.login_refused(status);
                    write_frame(stream, &AuthReply::encode_error(id, status, &message)).await?;
                }
            }
        }
        Ok(None)
    }
}

/// How the back-off counts a password check: a wrong password (or old
/// password) is a failure, the right one a success, anything else neither.
fn password_verdict(r: &Result<AuthReply, Refusal>) -> Verdict {
    match r {
        Ok(_) => Verdict::Succeeded,
        Err((FsStatus::BadCredentials, _)) => Verdict::Failed,
        Err(_) => Verdict::Neither,
    }
}
