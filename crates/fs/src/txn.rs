//! A writer's write transaction as the client keeps it (PROTOCOL.md, "Write
//! transactions"): the transaction the manager opened, the write-behind
//! buffer its writes go through, and what `COMMIT` reports — one past the
//! last byte written, the file ranges written (merged, bounded), and the
//! components that missed writes.

use nasd_proto::manager::DIRTY_RANGES_MAX;
use nasd_stripe::{WriteBehind, WriteOutcome};
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::time::Instant;

/// Bytes one write transaction takes before the client commits it and begins
/// the next at a clean point. A transaction's writes are what a failure rolls
/// back, what each drive keeps undo records for (block references, not data)
/// until the commit, and what a component that missed them must be resynced
/// over; this bounds all three for a long write.
pub const TXN_BYTES_MAX: u64 = 256 * 1024 * 1024;
/// The fraction of its lease after which a transaction is committed (and the
/// next begun) at the next write: `lease / TXN_LEASE_FRACTION`. A quarter
/// leaves the commit three quarters of the lease to drain write-behind, flush
/// every component and reach the manager. It is also the margin kept at the
/// end: writes go out only in the first `lease − lease / TXN_LEASE_FRACTION`
/// (counted from before `BEGIN_WRITE` was sent, so from before the manager
/// started the lease), because a write that reached a drive after the
/// manager rolled the transaction back would land outside it.
pub const TXN_LEASE_FRACTION: u32 = 4;

const _: () = assert!(TXN_LEASE_FRACTION >= 2);
const _: () = assert!(TXN_BYTES_MAX >= nasd_stripe::WRITE_BEHIND_BYTES_MAX);

/// The file ranges a transaction wrote: sorted, disjoint, not touching, at
/// most [`DIRTY_RANGES_MAX`] (`COMMIT` carries no more). When a write would
/// make one more, the two ranges with the smallest gap between them are
/// joined (the joined range covers bytes not written: the manager marks a
/// missed component stale over a little more than it missed, never less).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DirtyRanges {
    /// `(start, end)` pairs, end exclusive.
    ranges: Vec<(u64, u64)>,
}

impl DirtyRanges {
    /// Records `[offset, offset + len)` as written.
    pub(crate) fn add(&mut self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (mut a, mut b) = (offset, offset.saturating_add(len));
        // Ranges overlapping or touching [a, b) are folded into it.
        let first = self.ranges.partition_point(|&(_, end)| end < a);
        let mut last = first;
        while last < self.ranges.len() && self.ranges[last].0 <= b {
            a = a.min(self.ranges[last].0);
            b = b.max(self.ranges[last].1);
            last += 1;
        }
        self.ranges.splice(first..last, [(a, b)]);
        while self.ranges.len() > DIRTY_RANGES_MAX {
            let i = (0..self.ranges.len() - 1)
                .min_by_key(|&i| self.ranges[i + 1].0 - self.ranges[i].1)
                .expect("more than one range");
            self.ranges[i].1 = self.ranges[i + 1].1;
            self.ranges.remove(i + 1);
        }
        debug_assert!(self.ranges.windows(2).all(|w| w[0].1 < w[1].0));
    }

    /// `(offset, length)` pairs as `COMMIT` carries them.
    pub(crate) fn to_wire(&self) -> Vec<(u64, u64)> {
        self.ranges.iter().map(|&(a, b)| (a, b - a)).collect()
    }
}

/// An open write transaction of one [`crate::File`].
pub(crate) struct Txn {
    /// The manager's transaction id (never 0).
    pub(crate) id: u64,
    /// How long the manager keeps it open.
    pub(crate) lease: Duration,
    /// When `BEGIN_WRITE` was sent (before the manager started the lease).
    pub(crate) began: Instant,
    /// Bytes written under it.
    pub(crate) bytes: u64,
    /// One past the last byte written under it (0: nothing).
    pub(crate) written_end: u64,
    pub(crate) dirty: DirtyRanges,
    /// What its finished writes did (components written and missed).
    pub(crate) outcome: WriteOutcome,
    /// Its writes in flight or buffered.
    pub(crate) behind: WriteBehind,
    /// The task that commits it a quarter into its lease.
    pub(crate) timer: Option<Timer>,
    /// The quota escrow the manager reserved for it: the bytes its commit may
    /// add to what the file's data takes (`u64::MAX`: no quota). Quotas
    /// count stored bytes, not the size: a hole costs nothing.
    pub(crate) escrow: u64,
    /// Whether small-file bytes were staged under it (`WRITE_SMALL` with
    /// its id): readers, this file's too, see them once it is committed.
    pub(crate) staged: bool,
}

/// A background task, aborted when dropped unless disarmed.
pub(crate) struct Timer(Option<tokio::task::JoinHandle<()>>);

impl Timer {
    pub(crate) fn new(task: tokio::task::JoinHandle<()>) -> Timer {
        Timer(Some(task))
    }

    /// Lets the task run on (it is the one ending the transaction).
    pub(crate) fn disarm(mut self) {
        // Dropping a join handle detaches the task.
        self.0.take();
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

impl Txn {
    pub(crate) fn new(id: u64, lease: Duration, began: Instant, behind: WriteBehind, escrow: u64) -> Txn {
        Txn {
            escrow,
            id,
            lease,
            began,
            bytes: 0,
            written_end: 0,
            dirty: DirtyRanges::default(),
            outcome: WriteOutcome::default(),
            behind,
            timer: None,
            staged: false,
        }
    }

    /// Records a write of `len` bytes at `offset` (accepted by write-behind).
    pub(crate) fn note(&mut self, offset: u64, len: u64) {
        self.bytes = self.bytes.saturating_add(len);
        self.written_end = self.written_end.max(offset.saturating_add(len));
        self.dirty.add(offset, len);
    }

    /// Records bytes staged under it below the small-file threshold, ending
    /// at `end`: its `COMMIT` reports the end (the size covers them), not
    /// the components (they hold none of them).
    pub(crate) fn note_staged(&mut self, end: u64) {
        self.written_end = self.written_end.max(end);
        self.staged = true;
    }

    /// Whether it should be committed before more is written: older than its
    /// share of the lease, or larger than [`TXN_BYTES_MAX`].
    pub(crate) fn due(&self) -> bool {
        self.bytes >= TXN_BYTES_MAX || self.began.elapsed() >= self.lease / TXN_LEASE_FRACTION
    }

    /// Whether writes may still go out under it: it is younger than its lease
    /// less the margin (see [`TXN_LEASE_FRACTION`]).
    pub(crate) fn writable(&self) -> bool {
        self.began.elapsed() < self.lease - self.lease / TXN_LEASE_FRACTION
    }

    /// The components that missed writes, as `COMMIT` lists them.
    pub(crate) fn missed(&self) -> Vec<u8> {
        missed_wire(&self.outcome.missed)
    }
}

/// Component indexes as `COMMIT` carries them (ascending `u8`; a layout has
/// at most `COMPONENTS_MAX` = 64 components, so every index fits).
fn missed_wire(missed: &BTreeSet<usize>) -> Vec<u8> {
    missed.iter().filter_map(|&c| u8::try_from(c).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(d: &DirtyRanges) -> Vec<(u64, u64)> {
        d.ranges.clone()
    }

    #[test]
    fn dirty_ranges_merge_overlapping_and_touching_writes() {
        let mut d = DirtyRanges::default();
        d.add(100, 10);
        d.add(0, 10);
        d.add(200, 0);
        assert_eq!(ranges(&d), [(0, 10), (100, 110)]);
        d.add(10, 5); // touches the first
        d.add(105, 20); // overlaps the second
        assert_eq!(ranges(&d), [(0, 15), (100, 125)]);
        d.add(50, 60); // spans the gap up to the second
        assert_eq!(ranges(&d), [(0, 15), (50, 125)]);
        d.add(0, 1000); // covers everything
        assert_eq!(ranges(&d), [(0, 1000)]);
        assert_eq!(d.to_wire(), [(0, 1000)]);
        d.add(u64::MAX - 5, 100);
        assert_eq!(ranges(&d), [(0, 1000), (u64::MAX - 5, u64::MAX)], "saturates at the end of the offsets");
    }

    #[test]
    fn dirty_ranges_stay_within_the_bound_joining_the_closest() {
        let mut d = DirtyRanges::default();
        // Ranges 1000 apart, except one pair only 10 apart.
        for i in 0..DIRTY_RANGES_MAX as u64 {
            d.add(i * 1000, 100);
        }
        assert_eq!(d.ranges.len(), DIRTY_RANGES_MAX);
        d.add(5110, 10); // 10 after the range at 5000..5100
        assert_eq!(d.ranges.len(), DIRTY_RANGES_MAX, "one more range joins the closest pair");
        assert!(d.ranges.contains(&(5000, 5120)), "{:?}", d.ranges);
        // Far more writes than the bound: still bounded, and every byte written is covered.
        let mut written = Vec::new();
        for i in 0..1000u64 {
            let (o, l) = ((i * 7919) % 100_000 * 13, 1 + i % 50);
            d.add(o, l);
            written.push((o, l));
        }
        assert!(d.ranges.len() <= DIRTY_RANGES_MAX);
        for (o, l) in written {
            assert!(d.ranges.iter().any(|&(a, b)| a <= o && o + l <= b), "{o}+{l} not covered");
        }
    }

    #[test]
    fn missed_components_go_out_ascending() {
        let set: BTreeSet<usize> = [5, 0, 63].into_iter().collect();
        assert_eq!(missed_wire(&set), [0, 5, 63]);
    }
}
