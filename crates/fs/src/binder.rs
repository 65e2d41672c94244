//! An open file's [`Binder`]: the striping engine's view of the file — its
//! layout and, per component, drive and capability — built from the
//! manager's [`FileAccess`] and refreshed from the manager (`GETATTR` with the
//! file's open mode) when a drive refuses a capability as stale, or before
//! one gets near expiry; and asking the manager to set the file's PALs
//! again (`REFRESH_PAL`) when a drive finds no entry for the identity.

use crate::cache::Held;
use crate::{FsClient, FsError};
use nasd_proto::fs::{FileAttr, FsStatus};
use nasd_proto::layout::{ComponentState, Layout};
use nasd_proto::manager::{FileAccess, Handle, ManagerRequest, OpenMode};
use nasd_stripe::{Binder, BoxFuture, StripeError, Target};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the binder holds now.
struct Bound {
    held: Held,
    target: Arc<Target>,
    /// The file's attributes as the manager last reported them.
    attr: FileAttr,
}

/// The binder of one open file.
pub(crate) struct FileBinder {
    fs: FsClient,
    handle: Handle,
    /// What a refresh asks for: `Read`, or `RefreshWrite` for a file open for
    /// writing (the owner keeps write rights on a file created read-only).
    open: OpenMode,
    bound: Mutex<Bound>,
    /// Components this file's writes missed. They are not read (they count as
    /// `Stale`, whatever a refresh says) until the file is closed: until the
    /// manager has recorded them stale, or after it did, they may hold older
    /// bytes than the others.
    missed: Mutex<BTreeSet<usize>>,
    /// Why the last refresh failed, for the operation that asked for it (the
    /// manager's refusal says more than the drive's refusal it followed).
    error: Mutex<Option<FsError>>,
}

impl std::fmt::Debug for FileBinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = lock(&self.bound);
        f.debug_struct("FileBinder")
            .field("ino", &self.handle.ino)
            .field("layout", &b.target.layout)
            .field("rights", &b.held.access.rights)
            .finish_non_exhaustive()
    }
}

impl FileBinder {
    /// A binder for the file `handle` names, starting from the access and
    /// attributes of the reply that opened it.
    pub(crate) fn new(
        fs: FsClient,
        handle: Handle,
        open: OpenMode,
        attr: FileAttr,
        access: FileAccess,
    ) -> Result<FileBinder, FsError> {
        let held = Held::new(access);
        let target = Arc::new(fs.target_for(&held.access, &BTreeSet::new())?);
        Ok(FileBinder {
            fs,
            handle,
            open,
            bound: Mutex::new(Bound { held, target, attr }),
            missed: Mutex::new(BTreeSet::new()),
            error: Mutex::new(None),
        })
    }

    /// The file's layout.
    pub(crate) fn layout(&self) -> Layout {
        lock(&self.bound).target.layout
    }

    /// The attributes the manager last reported.
    pub(crate) fn attr(&self) -> FileAttr {
        lock(&self.bound).attr.clone()
    }

    /// Records attributes from a later reply (a `COMMIT`).
    pub(crate) fn set_attr(&self, attr: FileAttr) {
        lock(&self.bound).attr = attr;
    }

    /// Makes sure the held capabilities carry `rights` and are not near
    /// expiry: adopts a fresher one from the client's cache (another open of
    /// the same file), else asks the manager once.
    ///
    /// # Errors
    /// The manager's refusal, or `PERMISSION_DENIED` if it does not grant
    /// `rights`.
    pub(crate) async fn ensure(&self, rights: u32) -> Result<(), FsError> {
        // The identity the drives see too (a no-op unless it nears expiry).
        self.fs.ensure_identity_fresh().await;
        let expires = {
            let b = lock(&self.bound);
            if b.held.fresh() && b.held.allows(rights) {
                return Ok(());
            }
            b.held.expires
        };
        if let Some(h) = self.fs.cached(self.handle.ino) {
            if h.fresh() && h.allows(rights) && h.expires > expires {
                let target = Arc::new(self.fs.target_for(&h.access, &lock(&self.missed))?);
                let mut b = lock(&self.bound);
                (b.held, b.target) = (h, target);
                return Ok(());
            }
        }
        self.fetch().await?;
        if !lock(&self.bound).held.allows(rights) {
            return Err(FsError::Fs {
                status: FsStatus::PermissionDenied,
                message: format!(
                    "the manager does not grant {} access to this file (inode {})",
                    rights_name(rights),
                    self.handle.ino
                ),
            });
        }
        Ok(())
    }

    /// Asks the manager for fresh capabilities and bindings and makes them current.
    pub(crate) async fn fetch(&self) -> Result<Arc<Target>, FsError> {
        let e = self.fs.entry(ManagerRequest::GetAttr { handle: self.handle, open: self.open }).await?;
        let Some(access) = e.access else {
            return Err(FsError::Fs {
                status: FsStatus::PermissionDenied,
                message: format!("the manager no longer grants access to this file (inode {})", self.handle.ino),
            });
        };
        let held = Held::new(access);
        let target = Arc::new(self.fs.target_for(&held.access, &lock(&self.missed))?);
        let mut b = lock(&self.bound);
        *b = Bound { held, target: target.clone(), attr: e.attr };
        Ok(target)
    }

    /// Marks `components` as having missed writes: from now on they are
    /// written (if their drive answers) but not read.
    pub(crate) fn mark_missed(&self, components: &BTreeSet<usize>) {
        let mut missed = lock(&self.missed);
        if components.is_subset(&missed) {
            return;
        }
        missed.extend(components.iter().copied());
        let mut b = lock(&self.bound);
        let mut target = (*b.target).clone();
        overlay(&mut target, &missed);
        b.target = Arc::new(target);
    }

    /// Forgets why an earlier refresh failed (at the start of an operation).
    pub(crate) fn clear_error(&self) {
        lock(&self.error).take();
    }

    /// Why the last refresh failed, if it did since [`clear_error`](Self::clear_error).
    pub(crate) fn take_error(&self) -> Option<FsError> {
        lock(&self.error).take()
    }
}

/// Marks `missed` components that are not `Down` as `Stale`.
pub(crate) fn overlay(target: &mut Target, missed: &BTreeSet<usize>) {
    for &c in missed {
        if let Some(b) = target.components.get_mut(c) {
            if b.state == ComponentState::Ok {
                b.state = ComponentState::Stale;
            }
        }
    }
}

fn rights_name(rights: u32) -> &'static str {
    use nasd_proto::rights::{READ, WRITE};
    match (rights & READ != 0, rights & WRITE != 0) {
        (true, true) => "read and write",
        (true, false) => "read",
        (false, true) => "write",
        (false, false) => "the",
    }
}

impl Binder for FileBinder {
    fn current(&self) -> Arc<Target> {
        lock(&self.bound).target.clone()
    }

    /// `REFRESH_PAL`: the manager checks the session's rights through the
    /// ACL and sets the file's PAL again on every component. Its refusal
    /// (`PERMISSION_DENIED`: the ACL does not grant them) is kept for the
    /// operation to report, as a refresh's.
    fn refresh_pal(&self, write: bool) -> BoxFuture<'_, Result<bool, StripeError>> {
        Box::pin(async move {
            let rights = if write { nasd_proto::acl::ACL_WRITE } else { nasd_proto::acl::ACL_READ };
            match self.fs.refresh_pal(self.handle, rights).await {
                Ok(()) => Ok(true),
                Err(e) => {
                    let message = e.to_string();
                    *lock(&self.error) = Some(e);
                    Err(StripeError::Bind(message))
                }
            }
        })
    }

    /// A drive refused the identity as expired: renewed from the client's
    /// identity source (the pool's connections take the new one), or found
    /// renewed by another request meanwhile.
    fn renew_identity(&self) -> BoxFuture<'_, Result<bool, StripeError>> {
        Box::pin(async move { Ok(self.fs.renew_identity_after_refusal().await) })
    }

    fn refresh(&self) -> BoxFuture<'_, Result<Arc<Target>, StripeError>> {
        Box::pin(async move {
            match self.fetch().await {
                Ok(t) => Ok(t),
                Err(e) => {
                    let message = e.to_string();
                    *lock(&self.error) = Some(e);
                    Err(StripeError::Bind(message))
                }
            }
        })
    }
}
