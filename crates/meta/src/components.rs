//! Component objects for repair: stale marking (with the ranges a
//! component missed), replacing a component by a rebuilt object, and the
//! listings a repair task walks.
//!
//! A regular file has exactly `layout.components()` components, in
//! component order, on distinct drives, each Ok or Stale (Down is the
//! manager's soft state, never stored); a directory has none, a symbolic
//! link neither components nor layout. An object on a drive belongs to
//! exactly one of: a file's components (shared by its hard links), the
//! pool, the doomed log, or a live reservation — [`Namespace::known_objects`]
//! is their union, read in one transaction; anything else is an orphan.
//! Repair walks [`Namespace::stale_components`] and
//! [`Namespace::components_on_drive`] (paged, `BATCH_MAX`), records what a
//! resync made current with [`Namespace::commit_repair`] (ranges leave the
//! component's stale ranges; none left, it is Ok), rebuilds into an object
//! taken with `take_pooled_object` (reserved, so no orphan collection
//! removes it), and installs it with [`Namespace::replace_component`],
//! which dooms the old object in the same transaction.

use crate::backend::{Backend, Txn};
use crate::namespace::get;
use crate::types::{AcvIntent, Effects, Inode, StaleRange};
use crate::{Namespace, BATCH_MAX, COMMIT_STALE_MAX, STALE_RANGES_MAX};
use nasd_proto::fs::{FileKind, FsStatus, Ino, ObjectRef};
use nasd_proto::layout::{Component, ComponentState};

/// Checks ranges handed in: each non-empty and not past `u64::MAX`.
pub(crate) fn check_ranges<'a>(ranges: impl IntoIterator<Item = &'a StaleRange>) -> Result<(), FsStatus> {
    for r in ranges {
        if r.length == 0 || r.offset.checked_add(r.length).is_none() {
            return Err(FsStatus::InvalidArgument);
        }
    }
    Ok(())
}

/// Merges ranges: sorted by offset, overlapping or touching ones joined.
/// If more than [`STALE_RANGES_MAX`] remain, the ones separated by the
/// smallest gaps are joined too (the gaps become stale: rebuilding more than
/// was missed is safe, forgetting a range is not) until that many remain.
pub(crate) fn merge_ranges(mut ranges: Vec<StaleRange>) -> Vec<StaleRange> {
    ranges.sort();
    let mut merged: Vec<StaleRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match merged.last_mut() {
            Some(last) if r.offset <= last.end() => last.length = last.end().max(r.end()) - last.offset,
            _ => merged.push(r),
        }
    }
    if merged.len() <= STALE_RANGES_MAX {
        return merged;
    }
    // Join across the (len - MAX) smallest gaps (ties: the lowest offset first).
    let mut gaps: Vec<(u64, usize)> =
        merged.windows(2).enumerate().map(|(i, w)| (w[1].offset - w[0].end(), i)).collect();
    gaps.sort_unstable();
    let mut join = vec![false; merged.len()];
    for &(_, i) in &gaps[..merged.len() - STALE_RANGES_MAX] {
        join[i] = true;
    }
    let mut out: Vec<StaleRange> = Vec::with_capacity(STALE_RANGES_MAX);
    for (i, r) in merged.iter().enumerate() {
        match out.last_mut() {
            Some(last) if i > 0 && join[i - 1] => last.length = r.end() - last.offset,
            _ => out.push(*r),
        }
    }
    out
}

/// Reads a regular file and checks `idx` names one of its components.
pub(crate) fn file_component(t: &mut dyn Txn, ino: Ino, idx: usize) -> Result<Inode, FsStatus> {
    let n = get(t, ino)?;
    if n.attr.kind != FileKind::File || idx >= n.components.len() {
        return Err(FsStatus::InvalidArgument);
    }
    Ok(n)
}

/// Marks component `idx` of `n` stale and adds `ranges` to its recorded
/// ones (merged). `n.components` follows.
pub(crate) fn mark_stale_in(t: &mut dyn Txn, n: &mut Inode, idx: usize, ranges: &[StaleRange]) -> Result<(), FsStatus> {
    let ino = n.attr.ino;
    if !ranges.is_empty() {
        let mut all = t.get_stale_ranges(ino, idx)?;
        all.extend_from_slice(ranges);
        t.delete_stale_ranges(ino, Some(idx))?;
        for r in merge_ranges(all) {
            t.put_stale_range(ino, idx, &r)?;
        }
    }
    let c = &mut n.components[idx];
    if c.state != ComponentState::Stale {
        c.state = ComponentState::Stale;
        t.put_component(ino, idx, c)?;
    }
    Ok(())
}

/// What is left of `ranges` once every byte of `cut` is taken out
/// (ascending; pieces of one range that `cut` splits stay apart).
pub fn subtract_ranges(ranges: &[StaleRange], cut: &[StaleRange]) -> Vec<StaleRange> {
    let mut cut: Vec<StaleRange> = cut.to_vec();
    cut.sort();
    let mut out = Vec::new();
    for r in ranges {
        let mut at = r.offset;
        for c in cut.iter().filter(|c| c.end() > r.offset && c.offset < r.end()) {
            if c.offset > at {
                out.push(StaleRange { offset: at, length: c.offset - at });
            }
            at = at.max(c.end());
        }
        if at < r.end() {
            out.push(StaleRange { offset: at, length: r.end() - at });
        }
    }
    out.sort();
    out
}

/// Takes `ranges` out of what component `idx` of `n` is recorded to have
/// missed (a Stale component without ranges counts as stale whole); with
/// nothing left it becomes Ok. `n.components` follows.
pub(crate) fn forget_stale_in(
    t: &mut dyn Txn,
    n: &mut Inode,
    idx: usize,
    ranges: &[StaleRange],
) -> Result<(), FsStatus> {
    let ino = n.attr.ino;
    let mut recorded = t.get_stale_ranges(ino, idx)?;
    if recorded.is_empty() {
        recorded.push(StaleRange { offset: 0, length: u64::MAX });
    }
    let left = merge_ranges(subtract_ranges(&recorded, ranges));
    t.delete_stale_ranges(ino, Some(idx))?;
    for r in &left {
        t.put_stale_range(ino, idx, r)?;
    }
    if left.is_empty() {
        let c = &mut n.components[idx];
        c.state = ComponentState::Ok;
        t.put_component(ino, idx, c)?;
    }
    Ok(())
}

impl<B: Backend> Namespace<B> {
    /// Takes one pooled object of `drive` in its own transaction: a target
    /// for a rebuild, to be named in
    /// [`replace_component`](Self::replace_component). Until then no table
    /// holds it: orphan collection ([`known_objects`](Self::known_objects))
    /// would remove it from the drive, so the caller must keep collection
    /// away from it meanwhile.
    ///
    /// # Errors
    /// `Internal`.
    pub fn take_pooled_object(&self, drive: u32) -> Result<Option<ObjectRef>, FsStatus> {
        self.backend.transact(|t| t.pool_take(drive))
    }

    /// Puts object `new` in place of component `idx` of file `ino`, in
    /// state `state` (Ok: it holds current data, e.g. rebuilt; Stale: it
    /// must still be rebuilt). The old object is doomed and its pending ACV
    /// intent forgotten (it is in [`Effects::doomed`]); the new one gets an
    /// ACV intent for the file's acv (in [`Effects::revoke`]) so capabilities
    /// minted with it work there. The component's stale ranges are cleared
    /// either way: they described the old object (a Stale component without
    /// ranges is to be rebuilt whole).
    ///
    /// # Errors
    /// `InvalidArgument` (not a regular file, no component `idx`, state
    /// `Down` — the manager's soft state, never stored —, `new` is the
    /// current object, on a drive the table lacks, or on a drive another
    /// component of the file uses); `Exists` (`new` is held by a file, the
    /// pool or the doomed log); `NotFound`.
    pub fn replace_component(
        &self,
        ino: Ino,
        idx: usize,
        new: ObjectRef,
        state: ComponentState,
    ) -> Result<Effects, FsStatus> {
        if state == ComponentState::Down {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| {
            let n = file_component(t, ino, idx)?;
            let old = n.components[idx].object;
            let others_on_drive = n.objects().enumerate().any(|(i, o)| i != idx && o.drive == new.drive);
            if old == new || others_on_drive || t.get_drive(new.drive)?.is_none() {
                return Err(FsStatus::InvalidArgument);
            }
            if t.object_known(&new)? {
                return Err(FsStatus::Exists);
            }
            t.delete_stale_ranges(ino, Some(idx))?;
            t.put_component(ino, idx, &Component { object: new, state })?;
            t.delete_acv_intent(&old, None)?;
            t.doom(&old)?;
            let intent = AcvIntent { object: new, acv: n.acv };
            t.put_acv_intent(&intent)?;
            Ok(Effects { revoke: vec![intent], doomed: vec![old], collections: vec![] })
        })
    }

    /// Marks component `idx` of file `ino` stale and records the ranges it
    /// missed (merged with those recorded: overlapping and touching ranges
    /// join, and past [`STALE_RANGES_MAX`] the closest ones join). Without
    /// ranges the state changes only (a Stale component without ranges is
    /// to be rebuilt whole).
    ///
    /// # Errors
    /// `InvalidArgument` (not a regular file, no component `idx`, more than
    /// [`COMMIT_STALE_MAX`] ranges, an empty range or one past `u64::MAX`);
    /// `NotFound`.
    pub fn mark_stale(&self, ino: Ino, idx: usize, ranges: &[StaleRange]) -> Result<(), FsStatus> {
        if ranges.len() > COMMIT_STALE_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        check_ranges(ranges)?;
        self.backend.transact(|t| {
            let mut n = file_component(t, ino, idx)?;
            mark_stale_in(t, &mut n, idx, ranges)
        })
    }

    /// Component `idx` of file `ino` holds current data again (rebuilt in
    /// place): state Ok, its stale ranges forgotten.
    ///
    /// # Errors
    /// `InvalidArgument` (not a regular file, no component `idx`); `NotFound`.
    pub fn clear_stale(&self, ino: Ino, idx: usize) -> Result<(), FsStatus> {
        self.backend.transact(|t| {
            let n = file_component(t, ino, idx)?;
            t.delete_stale_ranges(ino, Some(idx))?;
            t.put_component(ino, idx, &Component { object: n.components[idx].object, state: ComponentState::Ok })
        })
    }

    /// The ranges component `idx` of file `ino` missed (at most
    /// [`STALE_RANGES_MAX`], ascending, disjoint); empty for an Ok component.
    ///
    /// # Errors
    /// `InvalidArgument` (not a regular file, no component `idx`); `NotFound`.
    pub fn stale_ranges(&self, ino: Ino, idx: usize) -> Result<Vec<StaleRange>, FsStatus> {
        self.backend.read(|t| {
            file_component(t, ino, idx)?;
            t.get_stale_ranges(ino, idx)
        })
    }

    /// Up to `limit` (at most [`BATCH_MAX`]) stale components as (file,
    /// component index), ascending, strictly after `after` (start with
    /// `(0, 0)`).
    ///
    /// # Errors
    /// `Internal`.
    pub fn stale_components(&self, after: (Ino, usize), limit: usize) -> Result<Vec<(Ino, usize)>, FsStatus> {
        self.backend.read(|t| t.list_stale_components(after, limit.min(BATCH_MAX)))
    }

    /// Up to `limit` (at most [`BATCH_MAX`]) components whose object lies on
    /// `drive`, as (file, component index, object), ascending by (file,
    /// index), strictly after `after` (start with `(0, 0)`).
    ///
    /// # Errors
    /// `Internal`.
    pub fn components_on_drive(
        &self,
        drive: u32,
        after: (Ino, usize),
        limit: usize,
    ) -> Result<Vec<(Ino, usize, ObjectRef)>, FsStatus> {
        self.backend.read(|t| t.list_components_on_drive(drive, after, limit.min(BATCH_MAX)))
    }

    /// The file and component index an object belongs to, if it is a component.
    ///
    /// # Errors
    /// `Internal`.
    pub fn component_of(&self, object: &ObjectRef) -> Result<Option<(Ino, usize)>, FsStatus> {
        self.backend.read(|t| t.component_of(object))
    }

    /// Every drive of the table with the number of components it holds,
    /// ordered by drive number (as many entries as drives).
    ///
    /// # Errors
    /// `Internal`.
    pub fn component_counts(&self) -> Result<Vec<(u32, u64)>, FsStatus> {
        self.backend.read(|t| t.component_counts())
    }

    /// Number of files with at least one Stale component. (Files with a
    /// component on a drive that is down are the manager's to add: `Down`
    /// is its soft state, not stored.)
    ///
    /// # Errors
    /// `Internal`.
    pub fn degraded_files(&self) -> Result<u64, FsStatus> {
        self.backend.read(|t| t.count_degraded())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(offset: u64, length: u64) -> StaleRange {
        StaleRange { offset, length }
    }

    #[test]
    fn overlapping_and_touching_ranges_join() {
        assert_eq!(merge_ranges(vec![]), vec![]);
        assert_eq!(merge_ranges(vec![r(10, 5), r(0, 5)]), vec![r(0, 5), r(10, 5)], "sorted, the gap stays");
        assert_eq!(merge_ranges(vec![r(0, 5), r(5, 5)]), vec![r(0, 10)], "touching");
        assert_eq!(merge_ranges(vec![r(0, 10), r(3, 2)]), vec![r(0, 10)], "contained");
        assert_eq!(merge_ranges(vec![r(4, 10), r(0, 5), r(20, 1)]), vec![r(0, 14), r(20, 1)]);
        assert_eq!(merge_ranges(vec![r(0, u64::MAX), r(7, 1)]), vec![r(0, u64::MAX)]);
    }

    #[test]
    fn subtracting_leaves_what_no_cut_covers() {
        assert_eq!(subtract_ranges(&[r(0, 100)], &[]), vec![r(0, 100)]);
        assert_eq!(subtract_ranges(&[r(0, 100)], &[r(0, 100)]), vec![]);
        assert_eq!(subtract_ranges(&[r(0, 100)], &[r(20, 10), r(50, 10)]), vec![r(0, 20), r(30, 20), r(60, 40)]);
        assert_eq!(subtract_ranges(&[r(10, 10), r(40, 10)], &[r(0, 15), r(45, 100)]), vec![r(15, 5), r(40, 5)]);
        assert_eq!(subtract_ranges(&[r(0, u64::MAX)], &[r(0, 10)]), vec![r(10, u64::MAX - 10)]);
        assert_eq!(
            subtract_ranges(&[r(0, 10)], &[r(5, 1), r(2, 6)]),
            vec![r(0, 2), r(8, 2)],
            "cuts sorted, overlapping"
        );
    }

    #[test]
    fn past_the_bound_the_closest_ranges_join() {
        // STALE_RANGES_MAX + 2 ranges of one byte, every 10 bytes, except two closer pairs.
        let n = STALE_RANGES_MAX as u64 + 2;
        let mut ranges: Vec<StaleRange> = (0..n).map(|i| r(i * 10, 1)).collect();
        ranges[5].offset = 42; // 2 bytes after ranges[4] (40..41)
        ranges[9].offset = 83; // 3 bytes after ranges[8] (80..81)
        let out = merge_ranges(ranges.clone());
        assert_eq!(out.len(), STALE_RANGES_MAX);
        assert!(out.contains(&r(40, 3)) && out.contains(&r(80, 4)), "{:?}", &out[..10]);
        // Every input byte is still covered.
        for x in &ranges {
            assert!(out.iter().any(|o| o.offset <= x.offset && x.end() <= o.end()), "{x:?} lost");
        }
        assert!(out.windows(2).all(|w| w[0].end() < w[1].offset), "disjoint and ascending");
    }
}
