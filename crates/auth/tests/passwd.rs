//! Password changes at the authentication server, over TLS on loopback with
//! the real client: a user changes its own password (`CHANGE_PASSWORD`,
//! the old one checked), an administrator sets anyone's (`SET_PASSWORD`),
//! and what must be refused: a wrong old password (nothing changes, and the
//! connection is closed after `AUTH_LOGIN_ATTEMPTS_MAX` of them), a new
//! password out of bounds, another user's password set by a non-admin, an
//! unknown user. Identity keys issued before a change stay valid; the
//! change is in the database before the reply.

use nasd_auth::server::AUTH_LOGIN_ATTEMPTS_MAX;
use nasd_auth::{AuthConfig, AuthServer};
use nasd_login::auth_client::{connector, AuthClient, AuthError, IdentityGrant};
use nasd_proto::auth::{AuthReply, AuthRequest};
use nasd_proto::fs::FsStatus;
use nasd_proto::manager::PASSWORD_MAX;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

const ROOT: &str = "root";
const ROOT_PW: &str = "root password";
const ALICE: &str = "alice";
const ALICE_PW: &str = "alice password";
const BOB: &str = "bob";
const BOB_PW: &str = "bob password";

/// Guards a step against a hang (not a timing check).
async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(120), f).await.expect("step hung")
}

/// An authentication server on loopback, with root (admin), alice and bob.
struct Server {
    server: Arc<AuthServer>,
    addr: String,
    ca: PathBuf,
    dir: tempfile::TempDir,
    _stop: watch::Sender<bool>,
}

impl Server {
    async fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let names = vec!["localhost".to_string()];
        let files = nasd_login::tls::ensure_certificates(&dir.path().join("tls"), &names).unwrap();
        let server = Arc::new(AuthServer::open(&dir.path().join("auth"), AuthConfig::default()).unwrap());
        assert!(to(server.bootstrap_admin(ROOT, ROOT_PW, 0)).await.unwrap());
        to(server.add_user(ALICE, ALICE_PW, 1000, 0, false)).await.unwrap();
        to(server.add_user(BOB, BOB_PW, 1001, 0, false)).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (stop, rx) = watch::channel(false);
        tokio::spawn(server.clone().serve(listener, nasd_login::tls::acceptor(&files).unwrap(), rx));
        Server { server, addr, ca: files.ca, dir, _stop: stop }
    }

    async fn login(&self, user: &str, password: &str) -> Result<(AuthClient, IdentityGrant), AuthError> {
        let tls = connector(&self.ca).unwrap();
        to(AuthClient::login(&self.addr, "localhost", &tls, user, password, 0)).await
    }

    /// Whether `user` logs in with `password` (any other refusal fails the test).
    async fn logs_in(&self, user: &str, password: &str) -> bool {
        match self.login(user, password).await {
            Ok(_) => true,
            Err(e) if e.status() == Some(FsStatus::BadCredentials) => false,
            Err(e) => panic!("login of {user}: {e}"),
        }
    }
}

#[track_caller]
fn refusal(r: Result<(), AuthError>) -> (FsStatus, String) {
    match r {
        Err(AuthError::Refused { status, message }) => (status, message),
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(()) => panic!("expected a refusal"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_changes_its_own_password() {
    let s = Server::start().await;
    let (mut alice, grant) = s.login(ALICE, ALICE_PW).await.unwrap();
    let new = "alice's new password";

    // A wrong old password: refused as such, nothing changed, and the message holds no password.
    let (status, message) = refusal(to(alice.change_password("not alice's password", new)).await);
    assert_eq!(status, FsStatus::BadCredentials);
    assert!(message.contains("wrong old password"), "{message}");
    assert!(!message.contains(new) && !message.contains("not alice's"), "no password in errors: {message}");
    assert!(s.logs_in(ALICE, ALICE_PW).await, "a refused change changes nothing");
    assert!(!s.logs_in(ALICE, new).await);

    // A new password out of bounds: too short, refused before anything is checked; past
    // PASSWORD_MAX, the request does not decode. Nothing changes.
    let (status, _) = refusal(to(alice.change_password(ALICE_PW, "short")).await);
    assert_eq!(status, FsStatus::InvalidArgument);
    let (status, _) = refusal(to(alice.change_password(ALICE_PW, &"x".repeat(PASSWORD_MAX + 1))).await);
    assert_eq!(status, FsStatus::BadRequest);
    assert!(s.logs_in(ALICE, ALICE_PW).await);

    // The right old password: the old one no longer logs in, the new one does.
    to(alice.change_password(ALICE_PW, new)).await.unwrap();
    assert!(!s.logs_in(ALICE, ALICE_PW).await, "the old password is refused");
    assert!(s.logs_in(ALICE, new).await, "the new password logs in");
    // The longest password is accepted.
    let longest = "L".repeat(PASSWORD_MAX);
    let (mut again, _) = s.login(ALICE, new).await.unwrap();
    to(again.change_password(new, &longest)).await.unwrap();
    assert!(s.logs_in(ALICE, &longest).await);
    to(again.change_password(&longest, new)).await.unwrap();

    // Not a revocation: the session and identity key issued before the change go on.
    let gid = match to(alice.call(&AuthRequest::CreateGroup { name: "alices".into() })).await.unwrap() {
        AuthReply::Group { gid, member: true } => gid,
        other => panic!("{other:?}"),
    };
    assert!(gid > 0);
    assert!(
        to(s.server.key_live(grant.credential.key_id)).await.unwrap(),
        "the identity key's shared key is still live"
    );

    // Durable before the reply: a second server opened on the same directory (its own
    // database connection) checks the new password.
    let reopened = AuthServer::open(&s.dir.path().join("auth"), AuthConfig::default()).unwrap();
    assert!(matches!(to(reopened.login(ALICE, new, 0)).await, Ok(AuthReply::LoggedIn { .. })));
    assert_eq!(to(reopened.login(ALICE, ALICE_PW, 0)).await.unwrap_err().0, FsStatus::BadCredentials);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_old_passwords_close_the_connection() {
    let s = Server::start().await;
    let (mut bob, _) = s.login(BOB, BOB_PW).await.unwrap();
    for attempt in 1..=AUTH_LOGIN_ATTEMPTS_MAX {
        let r = to(bob.change_password(&format!("guess number {attempt}"), "bob's new password")).await;
        assert_eq!(refusal(r).0, FsStatus::BadCredentials, "attempt {attempt}");
    }
    // Closed after the last: the next request finds no server, guessing must log in again.
    match to(bob.change_password(BOB_PW, "bob's new password")).await {
        Err(AuthError::Io(_)) => {}
        other => panic!("expected the connection closed, got {other:?}"),
    }
    assert!(s.logs_in(BOB, BOB_PW).await, "no guess changed anything");
    assert!(!s.logs_in(BOB, "bob's new password").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn administrators_set_any_password_and_users_only_their_own() {
    let s = Server::start().await;
    let (mut root, _) = s.login(ROOT, ROOT_PW).await.unwrap();
    let (mut alice, _) = s.login(ALICE, ALICE_PW).await.unwrap();

    // A non-admin cannot set someone else's password: refused, bob's unchanged.
    let (status, message) = refusal(to(alice.set_password(BOB, "alice chose this")).await);
    assert_eq!(status, FsStatus::NotAdmin, "{message}");
    assert!(s.logs_in(BOB, BOB_PW).await);
    assert!(!s.logs_in(BOB, "alice chose this").await);
    // Looking a user up by name is the file manager's (service login) alone.
    let r = to(alice.call(&AuthRequest::UserByName { name: BOB.into() })).await.map(|_| ());
    assert_eq!(refusal(r).0, FsStatus::NotPermitted);
    // CHANGE_PASSWORD names no user: it is always the caller's own.
    to(alice.change_password(ALICE_PW, "alice's second password")).await.unwrap();
    assert!(s.logs_in(BOB, BOB_PW).await, "bob's password is untouched");

    // An administrator sets bob's without the old one.
    to(root.set_password(BOB, "reset by root")).await.unwrap();
    assert!(!s.logs_in(BOB, BOB_PW).await);
    assert!(s.logs_in(BOB, "reset by root").await);
    // An unknown user, a password out of bounds: specific refusals.
    let (status, message) = refusal(to(root.set_password("nobody", "some password")).await);
    assert_eq!(status, FsStatus::NotFound, "{message}");
    assert!(message.contains("nobody"), "{message}");
    let (status, _) = refusal(to(root.set_password(BOB, "short")).await);
    assert_eq!(status, FsStatus::InvalidArgument);
    assert!(s.logs_in(BOB, "reset by root").await);

    // A disabled user's session can change nothing.
    let (mut bob, _) = s.login(BOB, "reset by root").await.unwrap();
    to(root.set_user_enabled(BOB, false)).await.unwrap();
    let (status, _) = refusal(to(bob.change_password("reset by root", "bob while disabled")).await);
    assert_eq!(status, FsStatus::NotLoggedIn);
    to(root.set_user_enabled(BOB, true)).await.unwrap();
    assert!(s.logs_in(BOB, "reset by root").await);
}

/// uid u32::MAX is no user's: the managers record their own write
/// transactions as that id, which no caller may begin one as.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_managers_own_uid_is_no_users() {
    let s = Server::start().await;
    let refused = to(s.server.add_user("nobody", "a password", nasd_meta::MANAGER_WRITER_UID, 1, false)).await;
    let (status, message) = refused.expect_err("uid u32::MAX");
    assert_eq!(status, FsStatus::InvalidArgument, "{message}");
    assert!(!s.logs_in("nobody", "a password").await, "a refused user logs in");
    to(s.server.add_user("top", "a password", u32::MAX - 1, 1, false)).await.expect("the uid below it");
}
