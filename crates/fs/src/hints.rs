//! Informed prefetching from the application's side (NASD §4.6): an
//! application that knows the reads it will make gives them to
//! [`HintedReads`] and then makes them through it. The reads are sent ahead
//! as hints to the drives that hold them (a window of
//! [`HINTS_AHEAD_MAX`] at a time, topped up as reads are made), each with
//! the file's read capability; every [`PROGRESS_EVERY`] reads the drives
//! are told how far the application got, so they read a bounded distance
//! ahead and drop what was read. Dropping or ending it ends the stream.

use crate::file::File;
use crate::FsError;

/// Reads hinted to the drives ahead of the one being made.
pub const HINTS_AHEAD_MAX: usize = 4096;
/// Reads made between progress reports to the drives.
pub const PROGRESS_EVERY: usize = 32;

/// A file's reads, announced to its drives before they are made.
pub struct HintedReads<'a> {
    file: &'a File,
    stream: u64,
    reads: Vec<(u64, u64)>,
    /// The next read to make.
    next: usize,
    /// Reads hinted so far (the first `hinted`).
    hinted: usize,
    /// Reads the drives were last told were made.
    reported: usize,
}

impl<'a> HintedReads<'a> {
    /// Announces `reads` (offset, length) of `file`, in the order they will
    /// be made, to its drives.
    ///
    /// # Errors
    /// The file's read capability could not be had (the reads would fail too).
    pub async fn new(file: &'a File, reads: Vec<(u64, u64)>) -> Result<HintedReads<'a>, FsError> {
        let stream = u64::from_le_bytes(nasd_crypto::random_bytes::<8>());
        let mut hinted = HintedReads { file, stream, reads, next: 0, hinted: 0, reported: 0 };
        hinted.top_up().await?;
        Ok(hinted)
    }

    /// How many reads are left.
    pub fn remaining(&self) -> usize {
        self.reads.len() - self.next
    }

    /// Makes the next read: its offset and bytes; None after the last.
    ///
    /// # Errors
    /// As [`File::read_at`].
    pub async fn next_read(&mut self) -> Result<Option<(u64, Vec<u8>)>, FsError> {
        let Some(&(offset, len)) = self.reads.get(self.next) else { return Ok(None) };
        let bytes = self.file.read_at(offset, len).await?;
        self.next += 1;
        if self.next - self.reported >= PROGRESS_EVERY || self.next == self.reads.len() {
            self.reported = self.next;
            self.file.hint_progress(self.stream, (self.next - 1) as u32).await;
        }
        if self.hinted - self.next < HINTS_AHEAD_MAX / 2 {
            self.top_up().await?;
        }
        Ok(Some((offset, bytes)))
    }

    /// Ends the stream at the drives (what they hold for it is dropped).
    pub async fn end(self) {
        self.file.hint_end(self.stream).await;
    }

    /// Hints reads until [`HINTS_AHEAD_MAX`] are ahead of the next one.
    async fn top_up(&mut self) -> Result<(), FsError> {
        let upto = (self.next + HINTS_AHEAD_MAX).min(self.reads.len());
        if upto <= self.hinted {
            return Ok(());
        }
        let batch: Vec<(u32, u64, u64)> =
            (self.hinted..upto).map(|i| (i as u32, self.reads[i].0, self.reads[i].1)).collect();
        self.file.hint_reads(self.stream, &batch).await?;
        self.hinted = upto;
        Ok(())
    }
}
