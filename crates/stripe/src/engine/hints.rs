//! Read hints for the drives' informed prefetching (`prefetch-v1`, NASD
//! §3.4 and §4.6): the pass-through the paper asks of a client file system.
//! An application's future reads of a file, numbered in a stream, are
//! resolved here to the data components (drives, objects, offsets) that
//! hold them and sent to each drive with the component's credential; the
//! drives read them from disk ahead of the application. As the application
//! reads, its progress is passed on, so each drive stays a bounded distance
//! ahead and drops what was read.
//!
//! Hints are advice: a drive without the extension, or one that cannot be
//! reached, is skipped (its reads just come from its disk as before).

use super::*;
use crate::request::Task;
use nasd_proto::extension::{PrefetchCall, ReadHint};
use nasd_proto::limits::PREFETCH_HINTS_PER_CALL_MAX;

impl Striper {
    /// Sends hints for `reads` of a file of `size` bytes — each its number
    /// in `stream`, file offset and length, in the order they will be made
    /// — to the drives of the data they read (a mirror's first copy).
    /// Returns the hints the drives queued (a read spanning chunks is
    /// several). A drive that fails or lacks the extension is skipped.
    pub async fn hint_reads(&self, stream: u64, reads: &[(u32, u64, u64)], size: u64) -> u64 {
        let target = self.target();
        let Ok(g) = Geometry::new(target.layout) else { return 0 };
        let mut per_component: BTreeMap<usize, Vec<ReadHint>> = BTreeMap::new();
        for &(seq, offset, len) in reads {
            let end = offset.saturating_add(len).min(size);
            if offset >= end {
                continue;
            }
            for e in g.extents(offset, end - offset) {
                let hints = per_component.entry(g.data_component(e.column, 0)).or_default();
                match hints.last_mut() {
                    Some(h) if h.seq == seq && h.region.end() == e.comp_offset => h.region.length += e.len,
                    _ => hints.push(ReadHint { seq, region: Region { offset: e.comp_offset, length: e.len } }),
                }
            }
        }
        let mut tasks = Vec::new();
        for (component, hints) in per_component {
            if target.components[component].state != ComponentState::Ok {
                continue;
            }
            for chunk in hints.chunks(PREFETCH_HINTS_PER_CALL_MAX) {
                let call = PrefetchCall::Hint { stream, hints: chunk.to_vec() };
                tasks.push(Task::spawn(&self.shared, target.layout, component, Req::Prefetch(call)));
            }
        }
        let mut queued = 0;
        for t in tasks {
            match t.join_queued().await {
                Ok(n) => queued += u64::from(n),
                Err(e) => tracing::debug!(?e, "a read hint was not sent"),
            }
        }
        queued
    }

    /// Tells every data component's drive that the application has made
    /// read `through_seq` of `stream` and those before it.
    pub async fn hint_progress(&self, stream: u64, through_seq: u32) {
        self.to_data_drives(PrefetchCall::Progress { stream, through_seq }).await;
    }

    /// Tells every data component's drive that `stream` is done.
    pub async fn hint_end(&self, stream: u64) {
        self.to_data_drives(PrefetchCall::End { stream }).await;
    }

    async fn to_data_drives(&self, call: PrefetchCall) {
        let target = self.target();
        let Ok(g) = Geometry::new(target.layout) else { return };
        let tasks: Vec<Task> = (0..g.data_columns())
            .map(|column| g.data_component(column, 0))
            .filter(|&c| target.components[c].state == ComponentState::Ok)
            .map(|c| Task::spawn(&self.shared, target.layout, c, Req::Prefetch(call.clone())))
            .collect();
        for t in tasks {
            if let Err(e) = t.join_queued().await {
                tracing::debug!(?e, "a prefetch call was not sent");
            }
        }
    }
}
