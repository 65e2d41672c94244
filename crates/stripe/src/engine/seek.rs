//! Where a striped object's data is: `SEEK_DATA` and `SEEK_HOLE` from the
//! stored extents of its data components (`EXTENTS`), reading no data.
//!
//! In data column `c`, component offsets map to file offsets in order
//! (`Geometry::file_offset` grows with the component offset). So the first
//! stored file byte at or after `x` is the least, over the columns, of the
//! file offset of the column's first stored byte at or after its first
//! component offset that maps at or after `x`; the first hole likewise. A
//! column none of whose copies answers counts as data everywhere: a hole may
//! be reported as data, never data as a hole. Parity is not consulted.

use super::*;
use crate::request::TaskError;
use nasd_proto::limits::EXTENTS_MAX;

/// `EXTENTS` requests one column may take for one seek. Each moves past at
/// least a whole extent or `EXTENTS_SCAN_BLOCKS_MAX` blocks; past the bound
/// the column is taken as data from where it got to (a conservative answer
/// for an object of millions of extents, never a wrong one).
pub const SEEK_REQUESTS_PER_COLUMN_MAX: usize = 1024;

/// What [`Striper::seek`] looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    /// The first byte that may hold data (`SEEK_DATA`).
    Data,
    /// The first byte of a hole (`SEEK_HOLE`); the end of the object counts as one.
    Hole,
}

/// One data column's part of a seek.
struct Column {
    column: usize,
    /// The first component offset that maps at or after the seek's start.
    start: u64,
    /// The column's bytes under the object's size (offsets past it map past the size).
    len: u64,
    /// Copies tried so far (a mirror's next copy is asked when one fails).
    copy: usize,
    /// Where the next request starts.
    at: u64,
    requests: usize,
    /// The column's answer, a component offset (None: none before `len`), once known.
    answer: Option<Option<u64>>,
}

/// The first component offset of data column `column` whose file offset is
/// at or after `from`.
fn column_start(g: &Geometry, from: u64, column: usize) -> u64 {
    let at = g.locate(from);
    match column.cmp(&at.column) {
        std::cmp::Ordering::Less => (at.stripe + 1) * g.unit(),
        std::cmp::Ordering::Equal => at.comp_offset,
        std::cmp::Ordering::Greater => at.stripe * g.unit(),
    }
}

impl Column {
    /// What one `EXTENTS` answer (from `self.at`) says, or `None` to ask
    /// again from where it got to.
    fn take(&mut self, what: Seek, extents: &[Region], covered_end: u64) -> Option<Option<u64>> {
        match (what, extents.first()) {
            // A reply that lists nothing is complete: nothing stored from `at` on.
            (Seek::Data, None) => Some(None),
            (Seek::Data, Some(e)) => Some(Some(e.offset)),
            (Seek::Hole, None) => Some(Some(self.at)),
            (Seek::Hole, Some(e)) if e.offset > self.at => Some(Some(self.at)),
            // Extents are separated by holes: the first one's end is a hole
            // unless the reply stopped there (the run may go on).
            (Seek::Hole, Some(e)) if e.end() < covered_end => Some(Some(e.end())),
            (Seek::Hole, Some(e)) => {
                self.at = e.end();
                None
            }
        }
    }

    /// The answer when no copy can say: data everywhere.
    fn unknown(&self, what: Seek) -> Option<u64> {
        match what {
            Seek::Data => Some(self.at.max(self.start)),
            Seek::Hole => None,
        }
    }
}

impl Striper {
    /// `SEEK_DATA` or `SEEK_HOLE` from `from` in an object of `size` bytes:
    /// [`Seek::Data`] gives the first offset at or after `from` where data
    /// may be stored (None: none below `size`), [`Seek::Hole`] the first
    /// offset at or after `from` in a hole (`size` if none comes before).
    /// `from` at or past `size` gives None. Asks each data column's
    /// components for their stored extents, all columns at once; components
    /// that fail are reported and their column counts as data.
    ///
    /// # Errors
    /// [`StripeError::OutOfRange`] if `size` exceeds what the layout holds;
    /// binding errors.
    ///
    /// # Cancel safety
    /// Dropping the future aborts its requests; nothing is changed.
    pub async fn seek(&self, what: Seek, from: u64, size: u64) -> Result<(Option<u64>, Report), StripeError> {
        let mut op = self.op()?;
        op.check_size(size)?;
        if from >= size {
            return Ok((None, op.report));
        }
        let g = op.g;
        let mut columns: Vec<Column> = (0..g.data_columns())
            .map(|column| {
                let start = column_start(&g, from, column);
                let len = g.component_len(size, g.data_component(column, 0));
                Column { column, start, len, copy: 0, at: start, requests: 0, answer: None }
            })
            .collect();
        loop {
            let mut asked = Vec::new();
            for (i, col) in columns.iter_mut().enumerate().filter(|(_, c)| c.answer.is_none()) {
                if col.at >= col.len {
                    col.answer = Some(None);
                    continue;
                }
                let copies = g.copies();
                let comp = (col.copy..copies).map(|r| g.data_component(col.column, r)).find(|&x| op.readable(x));
                let Some(comp) = comp.filter(|_| col.requests < SEEK_REQUESTS_PER_COLUMN_MAX) else {
                    col.answer = Some(col.unknown(what));
                    continue;
                };
                col.copy = comp / g.data_columns();
                col.requests += 1;
                let max = if what == Seek::Data { 1 } else { EXTENTS_MAX as u16 };
                asked.push((i, comp, op.spawn(comp, Req::Extents { offset: col.at, max })));
            }
            if asked.is_empty() {
                break;
            }
            for (i, comp, task) in asked {
                let col = &mut columns[i];
                match task.join_extents().await {
                    Ok((extents, covered_end)) => col.answer = col.take(what, &extents, covered_end),
                    Err(TaskError::Component(cause)) => {
                        // The next copy starts over from the column's start.
                        let at = col.at;
                        op.record(comp, Some(at..at), cause);
                        col.at = col.start;
                    }
                    Err(TaskError::Fatal(e)) => return Err(e),
                }
            }
        }
        let file_offsets = columns.iter().filter_map(|c| c.answer.flatten().map(|x| g.file_offset(c.column, x)));
        let found = match what {
            Seek::Data => file_offsets.min().filter(|&f| f < size),
            Seek::Hole => Some(file_offsets.min().map_or(size, |f| f.min(size))),
        };
        Ok((found.map(|f| f.max(from)), op.report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_proto::layout::Layout;

    #[test]
    fn column_starts_map_at_or_after_the_offset_and_are_the_first_such() {
        for text in ["stripe:1@4K", "stripe:3@4K", "rs:4+2@4K", "mirror:2x3@4K"] {
            let g = Geometry::new(Layout::parse(text).unwrap()).unwrap();
            for from in [0, 1, 4095, 4096, 4097, 3 * 4096 + 5, 100_000, 1 << 30] {
                for c in 0..g.data_columns() {
                    let s = column_start(&g, from, c);
                    assert!(g.file_offset(c, s) >= from, "{text} from {from} column {c}");
                    if s > 0 {
                        assert!(g.file_offset(c, s - 1) < from, "{text} from {from} column {c}: {s} is not the first");
                    }
                }
            }
        }
    }
}
