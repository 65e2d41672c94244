//! Layouts: placing a new file's components, the dynamic inheritance of
//! directory layouts, and re-placing an empty file.
//!
//! A directory's layout is not copied into its subdirectories: a new file
//! takes the layout of the nearest directory above it that has one, looked
//! up when the file is made, so setting a layout on a directory affects
//! every later file below it that no nearer directory overrides. The root
//! always has one (the file system's default), which ends every lookup.

use crate::backend::{Backend, Txn};
use crate::namespace::{get, now_ns};
use crate::perm::owns;
use crate::types::{AcvIntent, Caller, Effects, Inode};
use crate::Namespace;
use nasd_proto::fs::{FileKind, FsStatus, Ino, ObjectRef, ROOT_INO};
use nasd_proto::layout::{Component, ComponentState, Layout};
use std::collections::BTreeSet;

/// The manager's placement policy, called inside a name-space transaction
/// with a file's layout: returns `layout.components()` objects, one per
/// component in component order, each on a different drive, taken from the
/// drives' pools with [`take_pooled`] in the same transaction (so a failed
/// operation puts them back). It may read the drive table through the
/// [`Txn`] (e.g. to skip drives out of service). An error it returns is the
/// operation's.
pub type Placer<'a> = dyn FnMut(&Layout, &mut dyn Txn) -> Result<Vec<ObjectRef>, FsStatus> + 'a;

/// Takes one pooled object of `drive` (for a [`Placer`]), or `None` if the
/// drive's pool is empty.
///
/// # Errors
/// `Internal` if the backend fails.
pub fn take_pooled(t: &mut dyn Txn, drive: u32) -> Result<Option<ObjectRef>, FsStatus> {
    t.pool_take(drive)
}

/// The layout new files in directory `dir` get: its own, else the nearest
/// ancestor's, walking up at most `limit` parent pointers.
///
/// `TooDeep` if no directory within `limit` levels has one (possible only
/// below subtrees moved whole under deep directories, or with a
/// parent-pointer cycle); `Internal` if the walk reaches a root without a
/// layout (a broken invariant, logged).
pub(crate) fn nearest_layout(t: &mut dyn Txn, dir: &Inode, limit: usize) -> Result<Layout, FsStatus> {
    if let Some(layout) = dir.layout {
        return Ok(layout);
    }
    let mut cur = dir.attr.ino;
    for _ in 0..limit {
        if cur == ROOT_INO {
            tracing::error!("the root directory has no layout");
            return Err(FsStatus::Internal);
        }
        cur = t.dir_parent(cur)?.expect("directory without a parent pointer");
        if let Some(layout) = get(t, cur)?.layout {
            return Ok(layout);
        }
    }
    Err(FsStatus::TooDeep)
}

/// Calls the placer and checks what it returns: exactly
/// `layout.components()` objects, on distinct drives of the drive table,
/// none of them held by a file, the pool or the doomed log. The components
/// it makes are all Ok.
pub(crate) fn place_components(
    t: &mut dyn Txn,
    layout: &Layout,
    place: &mut Placer<'_>,
) -> Result<Vec<Component>, FsStatus> {
    let objects = place(layout, t)?;
    let broken = |why: &str| {
        tracing::error!(%layout, placed = ?objects, why, "the placement policy broke its contract");
        Err(FsStatus::Internal)
    };
    if objects.len() != layout.components() {
        return broken("wrong number of objects");
    }
    let drives: BTreeSet<u32> = objects.iter().map(|o| o.drive).collect();
    if drives.len() != objects.len() {
        return broken("two objects on one drive");
    }
    for o in &objects {
        if t.get_drive(o.drive)?.is_none() {
            return broken("an object on a drive the drive table lacks");
        }
        if t.object_known(o)? {
            return broken("an object a file, the pool or the doomed log still holds");
        }
    }
    Ok(objects.iter().map(|&object| Component { object, state: ComponentState::Ok }).collect())
}

/// Writes every component row of `inode` (whose row exists).
pub(crate) fn put_components(t: &mut dyn Txn, inode: &Inode) -> Result<(), FsStatus> {
    for (idx, c) in inode.components.iter().enumerate() {
        t.put_component(inode.attr.ino, idx, c)?;
    }
    Ok(())
}

fn check_layout(layout: &Layout) -> Result<(), FsStatus> {
    layout.validate().map_err(|e| {
        tracing::debug!(error = %e, "layout refused");
        FsStatus::InvalidArgument
    })
}

impl<B: Backend> Namespace<B> {
    /// The layout of `ino` and whether it is set on `ino` itself: a regular
    /// file's own (always explicit); a directory's own, else the nearest
    /// ancestor's (what a new file in it would get), walking up at most
    /// [`DIR_DEPTH_MAX`](crate::DIR_DEPTH_MAX) levels.
    ///
    /// # Errors
    /// `NotFound`; `InvalidArgument` for a symbolic link; `TooDeep` as
    /// [`create`](Self::create); `Internal` for a file or root without a
    /// layout (a broken invariant, logged).
    pub fn effective_layout(&self, ino: Ino) -> Result<(Layout, bool), FsStatus> {
        self.backend.read(|t| {
            let n = get(t, ino)?;
            match (n.attr.kind, n.layout) {
                (kind, _) if kind == FileKind::Symlink || kind.is_special() => Err(FsStatus::InvalidArgument),
                (_, Some(layout)) => Ok((layout, true)),
                (FileKind::Dir, None) => Ok((nearest_layout(t, &n, self.dir_depth_max)?, false)),
                (_, None) => {
                    tracing::error!(ino, "a regular file has no layout");
                    Err(FsStatus::Internal)
                }
            }
        })
    }

    /// Sets or clears a layout; the owner or root only. ctime becomes now.
    ///
    /// - A directory: `Some` sets the layout new files below it get (unless
    ///   a nearer directory has its own), `None` clears it (they inherit
    ///   from above again). Returns no effects.
    /// - A regular file: re-places it with `layout`, which is allowed only
    ///   while it holds no data — size 0 and no write intent. `place` is
    ///   called as for [`create`](Self::create); the new components (state
    ///   Ok) replace the old, whose objects are doomed (in
    ///   [`Effects::doomed`]) with their pending ACV intents and stale ranges
    ///   forgotten. Each new object gets an ACV intent for the file's acv (in
    ///   [`Effects::revoke`]), so capabilities minted with it work on them.
    ///   The manager must know no unrecorded bytes sit in the old objects (a
    ///   single-component writer commits with txn 0 only when done).
    ///
    /// # Errors
    /// `NotPermitted` (neither the owner nor root); `InvalidArgument` (the
    /// layout breaks a bound of [`Layout::validate`], clearing the root's
    /// layout, `None` for a file, a symbolic link, or a file whose size is
    /// not 0 — re-striping data is not supported); `Busy` (the file has a
    /// write intent: a writer may be adding data; retry after it commits);
    /// what `place` fails with and `Internal` for a broken placement, as
    /// [`create`](Self::create); `NotFound`.
    pub fn set_layout(
        &self,
        caller: &Caller,
        ino: Ino,
        layout: Option<Layout>,
        place: &mut Placer<'_>,
    ) -> Result<Effects, FsStatus> {
        if let Some(layout) = &layout {
            check_layout(layout)?;
        }
        self.backend.transact(|t| {
            let mut n = get(t, ino)?;
            if !owns(caller, &n) {
                return Err(FsStatus::NotPermitted);
            }
            let fx = match n.attr.kind {
                FileKind::Symlink
                | FileKind::Fifo
                | FileKind::Socket
                | FileKind::CharDevice
                | FileKind::BlockDevice => return Err(FsStatus::InvalidArgument),
                FileKind::Dir if layout.is_none() && ino == ROOT_INO => return Err(FsStatus::InvalidArgument),
                FileKind::Dir => {
                    n.layout = layout;
                    Effects::default()
                }
                FileKind::File => {
                    let layout = layout.ok_or(FsStatus::InvalidArgument)?;
                    replace_layout(t, &mut n, layout, place)?
                }
            };
            n.attr.ctime_ns = now_ns();
            crate::quotas::put(t, &mut n)?;
            Ok(fx)
        })
    }
}

/// Re-places an empty file with `layout` (the caller writes the inode row).
fn replace_layout(t: &mut dyn Txn, n: &mut Inode, layout: Layout, place: &mut Placer<'_>) -> Result<Effects, FsStatus> {
    let ino = n.attr.ino;
    if t.intent_of_inode(ino)?.is_some() {
        return Err(FsStatus::Busy);
    }
    if n.attr.size != 0 {
        return Err(FsStatus::InvalidArgument);
    }
    let components = place_components(t, &layout, place)?;
    let mut fx = Effects::default();
    t.delete_stale_ranges(ino, None)?;
    t.delete_components(ino)?;
    for old in n.objects() {
        t.delete_acv_intent(&old, None)?;
        t.doom(&old)?;
        fx.doomed.push(old);
    }
    n.layout = Some(layout);
    n.components = components;
    put_components(t, n)?;
    for object in n.objects() {
        let intent = AcvIntent { object, acv: n.acv };
        t.put_acv_intent(&intent)?;
        fx.revoke.push(intent);
    }
    Ok(fx)
}
