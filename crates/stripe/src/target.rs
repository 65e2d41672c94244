//! What the engine talks to: the layout and, per component, the drive,
//! object and credential ([`Target`]), and who provides them ([`Binder`]).

use crate::error::StripeError;
use nasd_client::{Auth, Credential, Key, MacAlgorithm};
use nasd_proto::layout::{ComponentState, Layout};
use nasd_proto::manager::FileAccess;
use nasd_proto::Protection;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// A boxed future, so that [`Binder`] is object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One component object: where it is and how to reach it.
#[derive(Debug, Clone)]
pub struct Binding {
    /// The manager's number for the drive (for error reports).
    pub drive: u32,
    /// The drive's address (`host:port`).
    pub addr: String,
    /// The drive's identity, checked against its `HELLO` before any request.
    pub drive_id: [u8; 16],
    /// The partition.
    pub partition: u64,
    /// The object.
    pub object: u64,
    /// The credential and protection of requests to it (a capability for a
    /// file-system client, the drive key for the manager).
    pub auth: Auth,
    /// Whether it may be read, or used at all.
    pub state: ComponentState,
}

/// A striped object as the engine sees it: the layout and one binding per
/// component, in component order.
#[derive(Debug, Clone)]
pub struct Target {
    /// How the bytes map onto the components.
    pub layout: Layout,
    /// One per component (`layout.components()` of them).
    pub components: Vec<Binding>,
}

impl Target {
    /// Checks that the layout is valid and that there is one binding per component.
    ///
    /// # Errors
    /// [`StripeError::BadTarget`] naming what is wrong.
    pub fn check(&self) -> Result<(), StripeError> {
        self.layout.validate().map_err(|e| StripeError::BadTarget(e.to_string()))?;
        if self.components.len() != self.layout.components() {
            return Err(StripeError::BadTarget(format!(
                "{} bindings for a layout of {} components",
                self.components.len(),
                self.layout.components()
            )));
        }
        Ok(())
    }

    /// The target a manager's [`FileAccess`] describes, each component's
    /// requests protected with `protection` (at least the access's
    /// `min_protection`: the caller's policy decides how much more).
    ///
    /// # Errors
    /// [`StripeError::BadTarget`] for an unknown capability algorithm or a
    /// component count that differs from the layout's.
    pub fn from_access(access: &FileAccess, protection: Protection) -> Result<Target, StripeError> {
        let algorithm = MacAlgorithm::from_id(access.algorithm)
            .ok_or_else(|| StripeError::BadTarget(format!("unknown capability algorithm {}", access.algorithm)))?;
        let components = access
            .components
            .iter()
            .map(|c| Binding {
                drive: c.object.drive,
                addr: c.drive_addr.clone(),
                drive_id: c.drive_id,
                partition: c.object.partition,
                object: c.object.object,
                auth: Auth::new(
                    Credential::Capability { token: c.token.clone(), key: Key::from_bytes(c.key), algorithm },
                    protection,
                ),
                state: c.state,
            })
            .collect();
        let target = Target { layout: access.layout, components };
        target.check()?;
        Ok(target)
    }
}

/// Who provides a striped object's [`Target`] and refreshes it.
///
/// The file-system client's binder asks the manager for fresh capabilities
/// (and bindings: a component may have moved); the manager's is static. The
/// engine calls [`refresh`](Self::refresh) when a drive refuses a request in
/// a way a fresh binding may cure, at most once per component request, and
/// never twice for the same stale target (concurrent requests that failed
/// together share one refresh).
pub trait Binder: Send + Sync {
    /// The current target (cheap; called at the start of every operation
    /// and every request).
    fn current(&self) -> Arc<Target>;

    /// Fetches a fresh target, makes it current and returns it.
    fn refresh(&self) -> BoxFuture<'_, Result<Arc<Target>, StripeError>>;

    /// A drive refused a request by identity with `NOT_IN_PAL`: asks whoever
    /// sets the object's pre-authorization lists to set them again, for a
    /// request that reads (`write` false) or writes. `Ok(true)`: they were
    /// set, retry the request (the engine does, once). `Ok(false)`: this
    /// binder cannot ask (the default); the refusal stands. An error: the
    /// request is refused (the binder may keep why, as for `refresh`).
    fn refresh_pal(&self, write: bool) -> BoxFuture<'_, Result<bool, StripeError>> {
        let _ = write;
        Box::pin(async { Ok(false) })
    }

    /// A drive refused a request with `IDENTITY_EXPIRED` (or with
    /// `KEY_VERSION_RETIRED` while the pool holds an identity: its key id
    /// may have been retired): asks
    /// whoever holds the identity for a fresh one and has the pool's
    /// connections take it (`DrivePool::set_identity`). `Ok(true)`: the
    /// identity was renewed (by this call or by another since the refused
    /// request went out), retry the request (the engine does, once).
    /// `Ok(false)`: this binder cannot renew (the default), or renewing
    /// failed; the refusal stands.
    fn renew_identity(&self) -> BoxFuture<'_, Result<bool, StripeError>> {
        Box::pin(async { Ok(false) })
    }
}

/// A binder whose target changes only when its owner sets it (the
/// manager's: its drive-key credentials do not expire). `refresh` returns
/// the current target.
#[derive(Debug)]
pub struct StaticBinder {
    target: Mutex<Arc<Target>>,
}

impl StaticBinder {
    /// A binder for `target`.
    ///
    /// # Errors
    /// [`StripeError::BadTarget`] if the target fails [`Target::check`].
    pub fn new(target: Target) -> Result<StaticBinder, StripeError> {
        target.check()?;
        Ok(StaticBinder { target: Mutex::new(Arc::new(target)) })
    }

    /// Replaces the target (e.g. a component rebound to a new object).
    ///
    /// # Errors
    /// [`StripeError::BadTarget`] if the target fails [`Target::check`].
    pub fn set(&self, target: Target) -> Result<(), StripeError> {
        target.check()?;
        *self.target.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(target);
        Ok(())
    }
}

impl Binder for StaticBinder {
    fn current(&self) -> Arc<Target> {
        self.target.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn refresh(&self) -> BoxFuture<'_, Result<Arc<Target>, StripeError>> {
        let t = self.current();
        Box::pin(async move { Ok(t) })
    }
}
