//! Renewing the client's identity key before it expires.
//!
//! An identity from the authentication server (DSFS §3.1) is valid for the
//! server's `identity_lifetime` (an hour by default); a client that runs
//! longer — a FUSE mount, a gateway — needs fresh ones. Given an
//! [`IdentitySource`] (`FsConfig::identity_source`), the client renews on
//! demand, with no task of its own while idle:
//!
//! - Before each manager request and each file operation it looks at the
//!   identity it holds. Once less than [`renew_margin`] of its life is left
//!   (the smaller of a tenth of it and [`RENEW_MARGIN_MAX`]), a renewal
//!   starts in a background task and the request goes on under the current
//!   identity, which is still valid; once the identity has expired, the
//!   request waits for the renewal instead.
//! - A refusal because of expiry — the manager's `NOT_LOGGED_IN` for an
//!   expired (or `BAD_CREDENTIALS` for a retired) identity key, a drive's
//!   `IDENTITY_EXPIRED` (or `KEY_VERSION_RETIRED` for a retired key id) —
//!   renews (or finds the identity renewed by another
//!   request meanwhile) and sends the request once more.
//! - A renewed identity replaces the old one for everything that starts
//!   afterwards: manager connections logged in with the old one are closed
//!   as they come back idle, and new ones log in (`LOGIN_IDENTITY`) with the
//!   new one; the drive pool's connections take it at their next request
//!   (`DrivePool::set_identity`). Requests in flight finish under the one
//!   they started with.
//! - A renewal that fails (the authentication server down, the user
//!   disabled) is logged as a warning (never a key) and tried again no
//!   sooner than [`RENEW_RETRY_PAUSE`] later, by a later request; the
//!   current identity is used meanwhile, until it really expires.
//!
//! One renewal runs at a time; requests refused together share it.

use crate::FsError;
use nasd_crypto::Key;
use nasd_proto::fs::FsStatus;
use nasd_proto::IdentityData;
use nasd_stripe::{BoxFuture, DrivePool};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Where a client gets a fresh identity (credential and identity key) when
/// the one it holds nears expiry: typically a login at the authentication
/// server with the user, role and password the first one came from. The
/// file-system client knows nothing of how; the CLI's mount supplies one.
pub trait IdentitySource: Send + Sync {
    /// A fresh identity, or why none could be had (the message must not
    /// contain key material or the password).
    fn fresh(&self) -> BoxFuture<'_, Result<(IdentityData, Key), FsError>>;
}

/// Most of an identity's life left when the client starts renewing it.
pub const RENEW_MARGIN_MAX: Duration = Duration::from_secs(300);
/// The fraction of an identity's life (1 / this) left when the client
/// starts renewing it, if smaller than [`RENEW_MARGIN_MAX`].
pub const RENEW_MARGIN_DIVISOR: u32 = 10;
/// Shortest pause after a failed renewal before the next try.
pub const RENEW_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// How long before its expiry an identity valid for `lifetime` is renewed:
/// the smaller of a tenth of `lifetime` and [`RENEW_MARGIN_MAX`].
pub fn renew_margin(lifetime: Duration) -> Duration {
    (lifetime / RENEW_MARGIN_DIVISOR).min(RENEW_MARGIN_MAX)
}

/// Whether a manager's refusal means the session's identity key has run
/// out (expired, or its shared key retired): a fresh identity cures it.
pub(crate) fn identity_refusal(e: &FsError) -> bool {
    match e {
        FsError::Fs { status: FsStatus::NotLoggedIn, message } => {
            message.contains("expired") || message.contains("retired")
        }
        FsError::Fs { status: FsStatus::BadCredentials, message } => message.contains("retired"),
        _ => false,
    }
}

/// The identity held now.
struct Held {
    credential: IdentityData,
    key: Key,
    /// One more at every renewal.
    generation: u64,
    /// When to start renewing.
    renew_at: Instant,
    /// When it expires (by this machine's clock).
    expires_at: Instant,
    /// After a failed renewal: no other try before this.
    retry_after: Option<Instant>,
}

impl Held {
    /// `wall_ns`: the wall clock now (the credential's expiry is on it).
    fn new(credential: IdentityData, key: Key, generation: u64, wall_ns: u64) -> Held {
        let now = Instant::now();
        let left = Duration::from_nanos(credential.expiration_ns.saturating_sub(wall_ns));
        Held {
            credential,
            key,
            generation,
            renew_at: now + left - renew_margin(left),
            expires_at: now + left,
            retry_after: None,
        }
    }
}

/// The client's identity (if it logged in with one), shared by its manager
/// connections, its change watchers and its drive pool, and renewed from
/// its [`IdentitySource`].
pub(crate) struct IdentityCell {
    held: Mutex<Option<Held>>,
    source: Option<Arc<dyn IdentitySource>>,
    /// One renewal at a time.
    renewing: tokio::sync::Mutex<()>,
    /// A background renewal is running.
    background: AtomicBool,
    /// The pool whose connections hold the identity.
    drives: Arc<DrivePool>,
    renewals: AtomicU64,
    failures: AtomicU64,
}

/// The [`nasd_client::Auth`] drive requests by identity go under: their
/// data MACed, as writes under capabilities are.
pub(crate) fn drive_auth(credential: IdentityData, key: Key) -> nasd_client::Auth {
    let protection = nasd_proto::Protection::INTEGRITY_ARGS.union(nasd_proto::Protection::INTEGRITY_DATA);
    nasd_client::Auth::new(nasd_client::Credential::Identity { data: credential, key }, protection)
}

impl IdentityCell {
    /// The cell for `identity`; `drives` is given it now and at every renewal.
    pub(crate) fn new(
        identity: Option<(IdentityData, Key)>,
        source: Option<Arc<dyn IdentitySource>>,
        drives: Arc<DrivePool>,
    ) -> Arc<IdentityCell> {
        drives.set_identity(identity.as_ref().map(|(c, k)| drive_auth(*c, k.clone())));
        let wall_ns = drives.env().now_ns();
        Arc::new(IdentityCell {
            held: Mutex::new(identity.map(|(c, k)| Held::new(c, k, 0, wall_ns))),
            source,
            renewing: tokio::sync::Mutex::new(()),
            background: AtomicBool::new(false),
            drives,
            renewals: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The identity to log in with, and its generation; `None`: log in with
    /// the password.
    pub(crate) fn current(&self) -> Option<(IdentityData, Key, u64)> {
        self.lock().as_ref().map(|h| (h.credential, h.key.clone(), h.generation))
    }

    /// The generation of the identity held (0 without one).
    pub(crate) fn generation(&self) -> u64 {
        self.lock().as_ref().map_or(0, |h| h.generation)
    }

    /// The credential held (public).
    pub(crate) fn credential(&self) -> Option<IdentityData> {
        self.lock().as_ref().map(|h| h.credential)
    }

    /// Renewals that succeeded so far.
    pub(crate) fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::SeqCst)
    }

    /// Renewals that failed so far.
    pub(crate) fn failures(&self) -> u64 {
        self.failures.load(Ordering::SeqCst)
    }

    /// Called before a request: starts a renewal in the background once the
    /// identity is within its margin of expiry, or renews before returning
    /// once it has expired. Never fails: the request goes on under whatever
    /// identity is held after it (and is refused if that has expired).
    pub(crate) async fn ensure_fresh(self: &Arc<Self>) {
        if self.source.is_none() {
            return;
        }
        let (generation, expired) = {
            let held = self.lock();
            let Some(h) = held.as_ref() else { return };
            let now = Instant::now();
            if now < h.renew_at || h.retry_after.is_some_and(|t| now < t) {
                return;
            }
            (h.generation, now >= h.expires_at)
        };
        if expired {
            self.renew(generation).await;
        } else if !self.background.swap(true, Ordering::SeqCst) {
            let me = self.clone();
            self.drives.env().spawn(async move {
                me.renew(generation).await;
                me.background.store(false, Ordering::SeqCst);
            });
        }
    }

    /// After a refusal because of expiry of the identity of generation
    /// `seen`: whether a fresher identity is held now (renewed here, or by
    /// another request since), so the request is worth sending once more.
    pub(crate) async fn renew_after_refusal(&self, seen: u64) -> bool {
        self.source.is_some() && self.renew(seen).await
    }

    /// Renews the identity of generation `seen`, unless another renewal
    /// replaced it meanwhile (true at once) or one failed less than
    /// [`RENEW_RETRY_PAUSE`] ago (false at once). Whether a fresher
    /// identity is held after it.
    async fn renew(&self, seen: u64) -> bool {
        let Some(source) = &self.source else { return false };
        let _one_at_a_time = self.renewing.lock().await;
        {
            let held = self.lock();
            let Some(h) = held.as_ref() else { return false };
            if h.generation != seen {
                return true;
            }
            if h.retry_after.is_some_and(|t| Instant::now() < t) {
                return false;
            }
        }
        let result = source.fresh().await;
        let mut held = self.lock();
        let Some(h) = held.as_mut() else { return false };
        match result {
            Ok((credential, key)) if credential.user == h.credential.user && credential.role == h.credential.role => {
                let generation = h.generation.wrapping_add(1);
                tracing::info!(
                    user = credential.user,
                    key_id = credential.key_id,
                    expiration_ns = credential.expiration_ns,
                    "identity key renewed"
                );
                self.drives.set_identity(Some(drive_auth(credential, key.clone())));
                *h = Held::new(credential, key, generation, self.drives.env().now_ns());
                self.renewals.fetch_add(1, Ordering::SeqCst);
                true
            }
            Ok((credential, _)) => {
                tracing::warn!(
                    user = h.credential.user,
                    role = h.credential.role,
                    got_user = credential.user,
                    got_role = credential.role,
                    "the identity source gave another user's or role's identity; keeping the current one"
                );
                h.retry_after = Some(Instant::now() + RENEW_RETRY_PAUSE);
                self.failures.fetch_add(1, Ordering::SeqCst);
                false
            }
            Err(e) => {
                let expired = Instant::now() >= h.expires_at;
                tracing::warn!(
                    user = h.credential.user,
                    error = %e,
                    expired,
                    "renewing the identity key failed; the current one is used until it expires, and renewal is \
                     tried again by later requests"
                );
                h.retry_after = Some(Instant::now() + RENEW_RETRY_PAUSE);
                self.failures.fetch_add(1, Ordering::SeqCst);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_is_a_tenth_of_the_life_up_to_five_minutes() {
        assert_eq!(renew_margin(Duration::from_secs(3)), Duration::from_millis(300));
        assert_eq!(renew_margin(Duration::from_secs(600)), Duration::from_secs(60));
        assert_eq!(renew_margin(Duration::from_secs(3600)), RENEW_MARGIN_MAX);
        assert_eq!(renew_margin(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn only_expiry_refusals_renew() {
        let fs = |status, message: &str| FsError::Fs { status, message: message.into() };
        assert!(identity_refusal(&fs(FsStatus::NotLoggedIn, "the identity key has expired: log in again")));
        assert!(identity_refusal(&fs(FsStatus::BadCredentials, "identity key 2 is retired: log in again")));
        assert!(!identity_refusal(&fs(FsStatus::NotLoggedIn, "log in first")));
        assert!(!identity_refusal(&fs(FsStatus::BadCredentials, "the identity does not verify")));
        assert!(!identity_refusal(&fs(FsStatus::PermissionDenied, "expired")));
    }
}
