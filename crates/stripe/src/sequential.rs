//! Helpers for sequential access through a [`Striper`]: a read-ahead window
//! ([`ReadAhead`]) and a write-behind buffer ([`WriteBehind`]). Both wrap
//! a `Striper` the caller may also use directly; a caller that never uses
//! them is unaffected.

use crate::engine::{Report, Striper, WriteOutcome};
use crate::error::StripeError;
use std::collections::VecDeque;
use std::ops::Range;
use tokio::task::JoinHandle;

/// Bytes of one [`ReadAhead`] window. A sequential reader has up to
/// [`READ_AHEAD_WINDOWS`] windows being fetched beside the one it is
/// consuming and the one before it (kept for reads that arrive late), so
/// this costs up to `2 + READ_AHEAD_WINDOWS` times as much memory per file
/// read sequentially, plus the engine's batches of the fetches in flight.
pub const READ_AHEAD_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// Windows a [`ReadAhead`] keeps in flight ahead of a sequential reader.
/// With one, every drive of the stripe fell idle between the end of a
/// window's fetch and the start of the next (the reader's wake-up and copy,
/// and each fetch ending with its slowest component): `nasd bench stripe`
/// measured 0.74 of eight paced drives' rate. With two, the next window's
/// requests are already queued at the drives when one ends.
pub const READ_AHEAD_WINDOWS: usize = 2;
/// Bytes a [`WriteBehind`] holds buffered or in flight at once, per file
/// written through it; a write that would exceed it waits for the oldest
/// background write. Costs that much memory, plus the engine's batches.
pub const WRITE_BEHIND_BYTES_MAX: u64 = 32 * 1024 * 1024;

/// A background task, aborted when dropped.
struct Background<T: Send + 'static>(JoinHandle<T>);

impl<T: Send + 'static> Drop for Background<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T: Send + 'static> Background<T> {
    fn spawn(env: &nasd_env::Env, f: impl std::future::Future<Output = T> + Send + 'static) -> Self {
        // Work of the caller's operation: under its trace id.
        Background(env.spawn(nasd_client::trace::scope(nasd_client::trace::current(), f)))
    }

    async fn join(mut self) -> T {
        match (&mut self.0).await {
            Ok(v) => v,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => unreachable!("a background task is aborted only when dropped: {e}"),
        }
    }

    fn is_finished(&self) -> bool {
        self.0.is_finished()
    }
}

type Prefetched = Result<(Vec<u8>, Report), StripeError>;

/// One window of a [`ReadAhead`]: `len` bytes of the object from `start`,
/// fetched or being fetched.
struct Window {
    start: u64,
    len: u64,
    state: WindowState,
}

enum WindowState {
    Pending(Background<Prefetched>),
    /// Fetched; `report` is handed to the first read that takes from it.
    Ready {
        data: Vec<u8>,
        report: Report,
    },
}

impl Window {
    fn end(&self) -> u64 {
        self.start + self.len
    }

    fn holds(&self, at: u64) -> bool {
        self.start <= at && at < self.end()
    }
}

/// Sequential read-ahead over a [`Striper`]: once a reader is sequential
/// (a first read at offset 0, or two reads in a row each starting where
/// the one before it ended — one alone is often a format's header and
/// body, as Parquet's column chunks are), the next [`READ_AHEAD_WINDOWS`] windows of
/// [`READ_AHEAD_BYTES_MAX`] bytes are fetched in the background, each as
/// its own request, and topped up as the reader takes them.
///
/// Every read that falls in the windows is served from them, in whatever
/// order the reads come: a kernel's read-ahead sends several reads of one
/// file at once, and they reach the file in any order. The window before
/// the one being read is kept for such stragglers, so each byte of a
/// sequential read is fetched from the drives once. A read outside the
/// windows (a seek) drops them and cancels their fetches.
///
/// A prefetch that failed is forgotten and its range read again directly,
/// so errors surface at the read that needs the bytes.
///
/// The windows are not told about writes: after writing or truncating the
/// object, call [`invalidate`](Self::invalidate).
pub struct ReadAhead {
    striper: Striper,
    window: u64,
    /// Bytes of one stripe of the layout: windows end on stripe boundaries.
    stripe_bytes: u64,
    /// Where the last read ended.
    last_end: Option<u64>,
    /// Whether the last read continued the one before it (or was a first
    /// read at offset 0): a read continuing it is sequential.
    streak: bool,
    /// Windows in file order, none overlapping (a window whose fetch failed
    /// or was cancelled leaves a gap, read directly).
    windows: VecDeque<Window>,
}

impl std::fmt::Debug for ReadAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let windows: Vec<_> =
            self.windows.iter().map(|w| (w.start..w.end(), matches!(w.state, WindowState::Ready { .. }))).collect();
        f.debug_struct("ReadAhead").field("last_end", &self.last_end).field("windows", &windows).finish()
    }
}

impl ReadAhead {
    /// A read-ahead window of [`READ_AHEAD_BYTES_MAX`] over `striper`.
    pub fn new(striper: Striper) -> ReadAhead {
        ReadAhead::with_window(striper, READ_AHEAD_BYTES_MAX)
    }

    /// A read-ahead window of `window` bytes (at most [`READ_AHEAD_BYTES_MAX`]).
    pub fn with_window(striper: Striper, window: u64) -> ReadAhead {
        let stripe_bytes = crate::geometry::Geometry::new(striper.target().layout).map_or(1, |g| g.stripe_bytes());
        ReadAhead {
            striper,
            window: window.clamp(1, READ_AHEAD_BYTES_MAX),
            stripe_bytes,
            last_end: None,
            streak: true,
            windows: VecDeque::new(),
        }
    }

    /// Drops what was fetched and cancels the fetches in progress.
    pub fn invalidate(&mut self) {
        self.windows.clear();
        self.last_end = None;
        self.streak = true;
    }

    /// Whether a read at `offset` would be served through the windows:
    /// it falls in them, or continues a sequential reader. A caller may read
    /// elsewhere directly, and then tells [`read_elsewhere`](Self::read_elsewhere).
    pub fn serves(&self, offset: u64) -> bool {
        self.in_windows(offset) || (self.streak && self.continues(offset))
    }

    /// Notes a read of `[start, end)` made directly (not through
    /// [`read`](Self::read)): the windows are of no use; a read starting at
    /// `end` continues it.
    pub fn read_elsewhere(&mut self, start: u64, end: u64) {
        self.windows.clear();
        self.streak = self.continues(start);
        self.last_end = Some(end);
    }

    fn in_windows(&self, offset: u64) -> bool {
        match (self.windows.front(), self.windows.back()) {
            (Some(first), Some(last)) => first.start <= offset && offset < last.end(),
            _ => false,
        }
    }

    fn continues(&self, offset: u64) -> bool {
        self.last_end == Some(offset) || (self.last_end.is_none() && offset == 0)
    }

    /// As [`Striper::read`], served from the windows where it can be.
    ///
    /// # Errors
    /// As [`Striper::read`].
    ///
    /// # Cancel safety
    /// Dropping the future may drop a window being waited for (its bytes
    /// are fetched again on demand); nothing else.
    pub async fn read(&mut self, offset: u64, len: u64, size: u64) -> Result<(Vec<u8>, Report), StripeError> {
        let end = offset.saturating_add(len).min(size);
        let sequential = self.serves(offset);
        self.streak = self.in_windows(offset) || self.continues(offset);
        if !self.in_windows(offset) {
            self.windows.clear();
        }
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut report = Report::default();
        let mut at = offset;
        while at < end {
            if self.windows.iter().any(|w| w.holds(at)) {
                if sequential {
                    // The windows behind it are fetched while this one is awaited.
                    self.forget_behind(at);
                    self.top_up(at, size);
                }
                let i = self.windows.iter().position(|w| w.holds(at)).expect("kept");
                if !self.settle(i).await {
                    continue;
                }
                let w = &mut self.windows[i];
                let WindowState::Ready { data, report: r } = &mut w.state else { unreachable!("settled") };
                let from = (at - w.start) as usize;
                let to = (end.min(w.start + data.len() as u64) - w.start) as usize;
                out.extend_from_slice(&data[from..to]);
                report.merge(std::mem::take(r));
                at += (to - from) as u64;
            } else {
                // Before the first window, in a gap, or past the last: read
                // directly up to the next window.
                let upto = self.windows.iter().map(|w| w.start).filter(|&s| s > at).min().unwrap_or(end).min(end);
                let (bytes, r) = self.striper.read(at, upto - at, size).await?;
                report.merge(r);
                let got = bytes.len() as u64;
                out.extend_from_slice(&bytes);
                at += got;
                if got == 0 {
                    break;
                }
            }
        }
        self.last_end = Some(at);
        if sequential {
            self.forget_behind(at);
            self.top_up(at, size);
        }
        Ok((out, report))
    }

    /// Waits for window `i`'s fetch; false (and the window dropped) if it
    /// failed or came back with other than the bytes asked for.
    async fn settle(&mut self, i: usize) -> bool {
        if matches!(self.windows[i].state, WindowState::Ready { .. }) {
            return true;
        }
        // Out of the list while awaited: a cancelled read leaves a gap, not a
        // window that never fills.
        let mut w = self.windows.remove(i).expect("window i");
        let WindowState::Pending(task) = w.state else { unreachable!("checked above") };
        match task.join().await {
            Ok((data, report)) if data.len() as u64 == w.len => {
                w.state = WindowState::Ready { data, report };
                self.windows.insert(i, w);
                true
            }
            _ => false,
        }
    }

    /// Drops the windows wholly before `at` but the last of them, which is
    /// kept for reads that come late.
    fn forget_behind(&mut self, at: u64) {
        while self.windows.len() >= 2 && self.windows[1].end() <= at {
            self.windows.pop_front();
        }
    }

    /// Starts fetches after the last window (or at `at`, if there is none)
    /// until [`READ_AHEAD_WINDOWS`] windows start at or after `at`, or the
    /// object ends.
    fn top_up(&mut self, at: u64, size: u64) {
        while self.windows.iter().filter(|w| w.start >= at).count() < READ_AHEAD_WINDOWS {
            let next = self.windows.back().map_or(at, Window::end);
            if next >= size {
                return;
            }
            self.push_fetch(next, size);
        }
    }

    /// Starts fetching the window at `start`: up to [`Self::window`] bytes,
    /// ending on a stripe boundary where the window holds one. A degraded
    /// Reed-Solomon read decodes whole stripes: windows that cut stripes made
    /// both windows of a cut stripe read all of its other chunks (1.48 bytes
    /// read per byte with a data drive down, where whole stripes cost 1.0).
    fn push_fetch(&mut self, start: u64, size: u64) {
        debug_assert!(start < size);
        let striper = self.striper.clone();
        let end = start + self.window;
        let aligned = end / self.stripe_bytes * self.stripe_bytes;
        let len = if aligned > start { aligned - start } else { self.window }.min(size - start);
        let task = Background::spawn(self.striper.env(), async move { striper.read(start, len, size).await });
        self.windows.push_back(Window { start, len, state: WindowState::Pending(task) });
    }
}

/// A background write and the stripes it touches.
struct InFlight {
    stripes: Range<u64>,
    bytes: u64,
    task: Background<Result<WriteOutcome, StripeError>>,
}

/// Write-behind over a [`Striper`]: writes are gathered into whole stripes
/// and issued in the background, at most [`WRITE_BEHIND_BYTES_MAX`] bytes
/// buffered and in flight. Writes that share a stripe are issued one after
/// the other (never concurrently, which would race their parity), each
/// with the size the object has after the writes before it.
///
/// A background write's error is returned by the next [`write`](Self::write),
/// [`wait`](Self::wait) or [`flush`](Self::flush) — never lost; after it,
/// every call fails with [`StripeError::WriteBehindBroken`].
///
/// Dropping a `WriteBehind` without [`wait`](Self::wait) discards what is
/// buffered and aborts what is in flight.
pub struct WriteBehind {
    striper: Striper,
    stripe_bytes: u64,
    /// Bytes gathered per issued write (whole stripes, at least one).
    issue_bytes: u64,
    /// The size after every write issued so far.
    issued_size: u64,
    buf_start: u64,
    buf: Vec<u8>,
    inflight: VecDeque<InFlight>,
    inflight_bytes: u64,
    outcome: WriteOutcome,
    error: Option<StripeError>,
    broken: bool,
}

impl std::fmt::Debug for WriteBehind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBehind")
            .field("size", &self.size())
            .field("buffered", &self.buf.len())
            .field("inflight_bytes", &self.inflight_bytes)
            .finish()
    }
}

impl WriteBehind {
    /// A write-behind buffer for an object of `size` bytes.
    ///
    /// # Errors
    /// [`StripeError::BadTarget`] if the striper's target is not valid.
    pub fn new(striper: Striper, size: u64) -> Result<WriteBehind, StripeError> {
        let target = striper.target();
        target.check()?;
        let g = crate::geometry::Geometry::new(target.layout).map_err(|e| StripeError::BadTarget(e.to_string()))?;
        let sb = g.stripe_bytes();
        let issue_bytes = (striper.batch_stripes(&g) * sb).clamp(sb, (WRITE_BEHIND_BYTES_MAX / 2).max(sb));
        Ok(WriteBehind {
            striper,
            stripe_bytes: sb,
            issue_bytes,
            issued_size: size,
            buf_start: 0,
            buf: Vec::new(),
            inflight: VecDeque::new(),
            inflight_bytes: 0,
            outcome: WriteOutcome::default(),
            error: None,
            broken: false,
        })
    }

    /// The object's size with every accepted write (buffered or not).
    pub fn size(&self) -> u64 {
        self.issued_size.max(self.buf_start + self.buf.len() as u64)
    }

    /// Accepts `data` at `offset`; returns once it is buffered or issued.
    ///
    /// # Errors
    /// An earlier background write's error ([`StripeError::WriteBehind`]),
    /// then [`StripeError::WriteBehindBroken`]; [`StripeError::OutOfRange`].
    pub async fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), StripeError> {
        self.reap().await?;
        if data.is_empty() {
            return Ok(());
        }
        if offset.checked_add(data.len() as u64).is_none() {
            return Err(StripeError::OutOfRange { offset, len: data.len() as u64, max: u64::MAX });
        }
        if !self.buf.is_empty() && offset != self.buf_start + self.buf.len() as u64 {
            self.issue_all().await?;
        }
        if self.buf.is_empty() {
            self.buf_start = offset;
        }
        for piece in data.chunks(self.issue_bytes as usize) {
            self.buf.extend_from_slice(piece);
            let buf_end = self.buf_start + self.buf.len() as u64;
            let whole = buf_end / self.stripe_bytes * self.stripe_bytes;
            if whole > self.buf_start && whole - self.buf_start >= self.issue_bytes {
                let rest = self.buf.split_off((whole - self.buf_start) as usize);
                let head = std::mem::replace(&mut self.buf, rest);
                let start = std::mem::replace(&mut self.buf_start, whole);
                self.issue(start, head).await?;
            }
        }
        Ok(())
    }

    /// Issues everything buffered and waits for every background write;
    /// returns what they did together since the last `wait` (components
    /// missed and written).
    ///
    /// # Errors
    /// A background write's error, as for [`write`](Self::write).
    pub async fn wait(&mut self) -> Result<WriteOutcome, StripeError> {
        self.reap().await?;
        self.issue_all().await?;
        while let Some(f) = self.inflight.pop_front() {
            self.finish(f).await;
        }
        self.reap().await?;
        Ok(std::mem::take(&mut self.outcome))
    }

    /// [`wait`](Self::wait), then makes every component written durable
    /// ([`Striper::flush`]).
    ///
    /// # Errors
    /// As [`wait`](Self::wait) and [`Striper::flush`].
    pub async fn flush(&mut self) -> Result<WriteOutcome, StripeError> {
        let mut outcome = self.wait().await?;
        let flushed = self.striper.flush(&outcome.written).await?;
        outcome.missed.extend(flushed.missed);
        for f in flushed.failed {
            if !outcome.failed.iter().any(|g| g.component == f.component) {
                outcome.failed.push(f);
            }
        }
        Ok(outcome)
    }

    /// Takes finished background writes; returns a failure not yet reported.
    async fn reap(&mut self) -> Result<(), StripeError> {
        while self.inflight.front().is_some_and(|f| f.task.is_finished()) {
            let f = self.inflight.pop_front().expect("checked above");
            self.finish(f).await;
        }
        if let Some(e) = self.error.take() {
            self.broken = true;
            self.buf = Vec::new();
            self.inflight.clear();
            return Err(StripeError::WriteBehind(Box::new(e)));
        }
        if self.broken {
            return Err(StripeError::WriteBehindBroken);
        }
        Ok(())
    }

    async fn finish(&mut self, f: InFlight) {
        self.inflight_bytes -= f.bytes;
        match f.task.join().await {
            Ok(o) => self.outcome.merge(o),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
    }

    async fn issue_all(&mut self) -> Result<(), StripeError> {
        if !self.buf.is_empty() {
            let (start, buf) = (self.buf_start, std::mem::take(&mut self.buf));
            self.issue(start, buf).await?;
        }
        Ok(())
    }

    /// Starts writing `data` at `start` once no write in flight shares a
    /// stripe with it and the in-flight bytes leave room.
    async fn issue(&mut self, start: u64, data: Vec<u8>) -> Result<(), StripeError> {
        let end = start + data.len() as u64;
        let stripes = start / self.stripe_bytes..(end - 1) / self.stripe_bytes + 1;
        loop {
            let overlaps = self.inflight.iter().any(|f| f.stripes.start < stripes.end && stripes.start < f.stripes.end);
            let full = self.inflight_bytes + data.len() as u64 > WRITE_BEHIND_BYTES_MAX;
            if !(overlaps || full && !self.inflight.is_empty()) {
                break;
            }
            let f = self.inflight.pop_front().expect("something in flight");
            self.finish(f).await;
        }
        self.reap().await?;
        let size_before = self.issued_size;
        self.issued_size = self.issued_size.max(end);
        let striper = self.striper.clone();
        let bytes = data.len() as u64;
        let task = Background::spawn(self.striper.env(), async move { striper.write(start, &data, size_before).await });
        self.inflight_bytes += bytes;
        self.inflight.push_back(InFlight { stripes, bytes, task });
        Ok(())
    }
}
