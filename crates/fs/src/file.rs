//! An open regular file: its bytes move between the client and the drives
//! of its component objects through the striping engine ([`Striper`]),
//! under the capabilities the manager minted, inside write transactions.
//!
//! - **Reads** are clamped to the size the client knows (the manager's, or
//!   larger where this file wrote further) and go through the engine piece by
//!   piece; sequential pieces through a read-ahead window ([`ReadAhead`]).
//!   A component that fails is read around while the layout's redundancy
//!   allows; beyond it the read fails with [`FsError::Unavailable`].
//! - **Writes** open a write transaction first (`BEGIN_WRITE`), go through
//!   write-behind ([`WriteBehind`]: errors surface at the next write or at
//!   flush), and are committed by [`File::flush`]: drain, `FLUSH` every
//!   component written, `COMMIT` with the end written, the ranges written
//!   and the components that missed writes. A transaction is committed a
//!   quarter into its lease (by a timer, so also when the writer pauses) or
//!   once larger than [`TXN_BYTES_MAX`](crate::TXN_BYTES_MAX); the next write
//!   begins the next one.
//! - **Small files** (issue 14): a file created with a small-file threshold
//!   keeps its bytes below it in the manager's metadata store. Reads and
//!   writes of that range go to the manager (`READ_SMALL`, `WRITE_SMALL`,
//!   at most [`SMALL_IO_MAX`] bytes each) and are split from the rest at the
//!   threshold; the bytes at and past it go through the engine as above.
//!   While a write transaction is open, small writes are staged under it
//!   (the manager keeps them apart and installs them with its `COMMIT`, or
//!   drops them when it is rolled back), and a write that crosses the
//!   threshold opens the transaction first: head and striped tail are old
//!   or new together. A small write with no transaction open is its own:
//!   stable when its request returns (one metadata transaction with the
//!   size). A read of the head while bytes are staged commits first, so
//!   the file reads its own writes.
//!
//! More on writes: writes go out only in the first three quarters of the
//! transaction's lease, counted from before `BEGIN_WRITE` was sent (a write
//! reaching a drive after the manager rolled the transaction back would land
//! outside it), so past that a flush drops what is buffered and fails with
//! `ABORTED`. A failure between `BEGIN_WRITE` and the first write ends the
//! transaction at once with an empty `COMMIT`. After an `ABORTED` commit or a
//! failed write, flush or commit the file takes no more writes; a failed
//! write or flush gives its transaction up (`ABORT_WRITE`: rolled back at
//! once, so a write that failed for want of space gives the space back). A
//! `COMMIT` that found no manager keeps the transaction open; its timer,
//! which never waits, tries again every `COMMIT_RETRY_PAUSE`. The escrow
//! the manager gave the transaction bounds how far a write may extend the
//! file: past it the file commits, asks once for a fresh escrow, and fails
//! with `QUOTA_EXCEEDED` if the manager cannot give one. Components the
//! file's own writes missed are `Stale` in every target it builds (written
//! if they answer, never read) until it is closed.
//!
//! More on reads: [`File::seek`] answers `SEEK_DATA`/`SEEK_HOLE` from the
//! drives' stored extents (`Striper::seek` over `EXTENTS`); a file of at
//! least [`HOLE_SKIP_FILE_BYTES_MIN`] reads its holes as zeros without
//! asking the drives. Before each transfer piece the capabilities are
//! refreshed if near expiry or short of the rights the piece needs; a
//! drive's refusal as stale makes the engine refresh once, so transfers
//! outlive capabilities.
//!
//! Memory per open file: a transfer piece, `1 + READ_AHEAD_WINDOWS`
//! read-ahead windows, the write-behind bound and the engine's batches in
//! flight. A file's reads and writes run one at a time (one lock per file),
//! so a read sees its earlier writes; different files run concurrently.

use crate::binder::FileBinder;
use crate::txn::{Timer, Txn, TXN_LEASE_FRACTION};
use crate::{no_space, FsClient, FsError};
use nasd_proto::fs::{FileAttr, FsStatus, Ino};
use nasd_proto::layout::{Layout, Scheme};
use nasd_proto::manager::{Entry, Handle, ManagerReply, ManagerRequest, OpenMode, SMALL_IO_MAX};
use nasd_proto::rights;
use nasd_stripe::geometry::Geometry;
use nasd_stripe::{ReadAhead, Report, Seek, StripeError, Striper, WriteBehind, WriteOutcome};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// Pause before a write transaction whose timed commit found no manager is
/// tried again (by its timer; a write or flush meanwhile tries at once).
const COMMIT_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// What one open file does with its data, behind one lock: reads and
/// writes of one file are ordered (a read sees the file's earlier writes,
/// and the engine is never asked to write and read one stripe at once).
struct Io {
    /// Sequential reads' windows; it also knows where the last read ended.
    read_ahead: ReadAhead,
    /// The open write transaction, if anything was written since the last commit.
    txn: Option<Txn>,
    /// Set when a write, flush or commit failed: the writes since the last
    /// commit are lost (rolled back), and the file takes no more writes.
    poisoned: Option<String>,
    /// Why, when it was for want of space (`NO_SPACE`, `QUOTA_EXCEEDED`):
    /// later writes and the close answer that, not `ABORTED`.
    poisoned_by: Option<FsStatus>,
    /// Components whose failure a read already warned of (once per open).
    warned: BTreeSet<usize>,
    /// The run of data or hole a read last found ([`Inner::run_at`]):
    /// forgotten when this file writes or takes new attributes (an open:
    /// close-to-open), as read-ahead is.
    run: Option<Run>,
}

impl Io {
    /// Forgets what reads cached of the file's bytes: after this file's own
    /// writes, and when it takes another client's commits.
    fn forget_cached(&mut self) {
        self.read_ahead.invalidate();
        self.run = None;
    }
}

/// A run of file bytes that are all data or all hole: `[start, end)`.
#[derive(Debug, Clone, Copy)]
struct Run {
    start: u64,
    end: u64,
    data: bool,
}

/// Files at least this long have their holes found before they are read
/// (`SEEK_DATA`/`SEEK_HOLE` from the drives' extents: a few requests per
/// run of data or hole) and read as zeros without asking the drives; a
/// shorter file's holes cost less to read than to find.
pub const HOLE_SKIP_FILE_BYTES_MIN: u64 = 64 * 1024 * 1024;
/// Zeros handed over at a time for a hole.
const ZEROS_CHUNK_BYTES: usize = 1024 * 1024;

/// An open regular file. Its methods take `&self` and may be called from
/// several tasks: they run one at a time, in the order they take the file's
/// lock.
///
/// Dropping a `File` with writes not yet flushed discards them: the manager
/// rolls their transaction back when its lease runs out.
pub struct File {
    inner: Arc<Inner>,
}

/// The open file, shared with the timer that commits its transaction.
struct Inner {
    fs: FsClient,
    handle: Handle,
    path: String,
    writable: bool,
    binder: Arc<FileBinder>,
    striper: Striper,
    geometry: Geometry,
    /// The small-file threshold: bytes below it live in the metadata store
    /// (0: every byte on the components).
    small: u64,
    /// One past the last byte this file wrote (0: nothing).
    written_end: AtomicU64,
    io: tokio::sync::Mutex<Io>,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.inner;
        f.debug_struct("File")
            .field("path", &i.path)
            .field("ino", &i.handle.ino)
            .field("layout", &i.geometry.layout())
            .field("writable", &i.writable)
            .finish_non_exhaustive()
    }
}

impl Inner {
    fn ino(&self) -> Ino {
        self.handle.ino
    }

    fn handle(&self) -> Handle {
        self.handle
    }

    fn layout(&self) -> Layout {
        self.geometry.layout()
    }

    fn size(&self) -> u64 {
        self.binder.attr().size.max(self.written_end.load(Ordering::Relaxed))
    }

    fn attr(&self) -> FileAttr {
        FileAttr { size: self.size(), ..self.binder.attr() }
    }

    // ------------------------------------------------------------ reads

    async fn read_to(&self, offset: u64, len: u64, dst: &mut (impl AsyncWrite + Unpin)) -> Result<u64, FsError> {
        let mut io = self.io.lock().await;
        self.binder.clear_error();
        self.settle(&mut io).await?;
        let size = self.size();
        let end = offset.saturating_add(len).min(size);
        let piece = self.fs.transfer_piece() as u64;
        let mut at = offset;
        if at < end.min(self.small) && io.txn.as_ref().is_some_and(|t| t.staged) {
            // The manager shows staged bytes to nobody before the commit.
            self.commit(&mut io).await?;
        }
        if at < end.min(self.small) {
            let upto = end.min(self.small);
            self.read_small(at, upto, dst).await?;
            io.read_ahead.read_elsewhere(at, upto);
            at = upto;
        }
        while at < end {
            self.binder.ensure(rights::READ).await?;
            let mut n = piece.min(end - at);
            if size >= HOLE_SKIP_FILE_BYTES_MIN {
                let run = self.run_at(&mut io, at, size).await?;
                let upto = run.end.min(at + n);
                if !run.data {
                    // A hole: zeros, no request to any drive.
                    write_zeros(dst, upto - at).await?;
                    io.read_ahead.read_elsewhere(at, upto);
                    at = upto;
                    continue;
                }
                n = upto - at;
            }
            let (got, report) = if io.read_ahead.serves(at) {
                let (bytes, report) = io.read_ahead.read(at, n, size).await.map_err(|e| self.failed("reading", e))?;
                dst.write_all(&bytes).await.map_err(FsError::Local)?;
                (bytes.len() as u64, report)
            } else {
                let read = self.striper.read_to(at, n, size, dst).await.map_err(|e| self.failed("reading", e))?;
                io.read_ahead.read_elsewhere(at, at + read.0);
                read
            };
            self.note_report(&mut io, &report);
            at += got;
            if got < n {
                break;
            }
        }
        dst.flush().await.map_err(FsError::Local)?;
        Ok(at.saturating_sub(offset))
    }

    /// The run of data or hole holding byte `at` (below `size`): the one
    /// found last if it holds it, else found now from the drives' extents
    /// (`SEEK_DATA`, and `SEEK_HOLE` for data). A run is never empty. A hole
    /// may be reported as data, never data as a hole ([`Striper::seek`]).
    async fn run_at(&self, io: &mut Io, at: u64, size: u64) -> Result<Run, FsError> {
        if let Some(r) = io.run.filter(|r| r.start <= at && at < r.end) {
            return Ok(r);
        }
        let (data, report) = self.striper.seek(Seek::Data, at, size).await.map_err(|e| self.failed("reading", e))?;
        self.note_report(io, &report);
        let run = match data {
            Some(d) if d <= at => {
                let (hole, report) =
                    self.striper.seek(Seek::Hole, at, size).await.map_err(|e| self.failed("reading", e))?;
                self.note_report(io, &report);
                Run { start: at, end: hole.unwrap_or(size).clamp(at + 1, size), data: true }
            }
            Some(d) => Run { start: at, end: d.min(size), data: false },
            None => Run { start: at, end: size, data: false },
        };
        io.run = Some(run);
        Ok(run)
    }

    /// Reads `[from, to)` below the small-file threshold from the manager
    /// into `dst`; zeros past what the manager holds (bytes this file wrote
    /// past it on the components, not yet committed, make it longer here).
    async fn read_small(&self, from: u64, to: u64, dst: &mut (impl AsyncWrite + Unpin)) -> Result<(), FsError> {
        let mut at = from;
        while at < to {
            let len = (to - at).min(SMALL_IO_MAX as u64) as u32;
            let req = ManagerRequest::ReadSmall { handle: self.handle, offset: at, len };
            let mut bytes = match self.fs.call(&req).await? {
                ManagerReply::SmallData(bytes) if bytes.len() <= len as usize => bytes,
                other => return Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
            };
            bytes.resize(len as usize, 0);
            dst.write_all(&bytes).await.map_err(FsError::Local)?;
            at += len as u64;
        }
        Ok(())
    }

    async fn read_at(&self, offset: u64, len: u64) -> Result<Vec<u8>, FsError> {
        let mut out = Vec::with_capacity(len.min(self.size().saturating_sub(offset)) as usize);
        self.read_to(offset, len, &mut out).await?;
        Ok(out)
    }

    /// `SEEK_DATA`/`SEEK_HOLE` from `offset` (see [`File::seek`]).
    async fn seek(&self, what: Seek, offset: u64) -> Result<Option<u64>, FsError> {
        let mut io = self.io.lock().await;
        self.binder.clear_error();
        // What this file wrote is on the drives first (installed there, if
        // not yet committed), so their extents show it.
        self.settle(&mut io).await?;
        let size = self.size();
        if offset >= size {
            return Ok(None);
        }
        // Bytes below the small-file threshold live in the manager: data.
        if offset < self.small && (what == Seek::Data || self.small >= size) {
            return Ok(Some(if what == Seek::Data { offset } else { size }));
        }
        self.binder.ensure(rights::READ).await?;
        let from = offset.max(self.small);
        let (found, report) = self.striper.seek(what, from, size).await.map_err(|e| self.failed("seeking", e))?;
        self.note_report(&mut io, &report);
        Ok(found)
    }

    /// The file's checksum (see [`File::checksum`]).
    async fn checksum(&self) -> Result<[u8; 32], FsError> {
        let mut io = self.io.lock().await;
        self.binder.clear_error();
        // What this file wrote is on the drives first, so their digests show it.
        self.settle(&mut io).await?;
        let size = self.size();
        let head_end = size.min(self.small);
        if head_end > 0 && io.txn.as_ref().is_some_and(|t| t.staged) {
            // The manager shows staged bytes to nobody before the commit.
            self.commit(&mut io).await?;
        }
        let mut head = Vec::with_capacity(head_end as usize);
        self.read_small(0, head_end, &mut head).await?;
        let mut columns = Vec::new();
        if size > self.small {
            self.binder.ensure(rights::READ).await?;
            let (found, report) = self.striper.digests(size).await.map_err(|e| self.failed("checksumming", e))?;
            self.note_report(&mut io, &report);
            columns = found;
        }
        Ok(crate::file_checksum(self.layout(), size, self.small, &head, &columns))
    }

    fn note_report(&self, io: &mut Io, report: &Report) {
        for f in &report.failed {
            if io.warned.insert(f.component) {
                tracing::warn!(path = %self.path, failure = %f, "a component failed; reading around it");
            } else {
                tracing::debug!(path = %self.path, failure = %f, "a component failed again; read around it");
            }
        }
    }

    // ------------------------------------------------------------ writes

    async fn write_at(self: &Arc<Self>, offset: u64, data: &[u8]) -> Result<(), FsError> {
        let mut io = self.io.lock().await;
        let piece = self.fs.transfer_piece();
        for (i, chunk) in data.chunks(piece).enumerate() {
            self.write_piece(&mut io, offset + (i * piece) as u64, chunk).await?;
        }
        Ok(())
    }

    async fn write_from(
        self: &Arc<Self>,
        offset: u64,
        len: u64,
        src: &mut (impl AsyncRead + Unpin),
    ) -> Result<u64, FsError> {
        let mut io = self.io.lock().await;
        let piece = self.fs.transfer_piece();
        let mut buf = vec![0u8; piece.min(len as usize)];
        let mut done = 0u64;
        while done < len {
            let n = (piece as u64).min(len - done) as usize;
            src.read_exact(&mut buf[..n]).await.map_err(FsError::Local)?;
            self.write_piece(&mut io, offset + done, &buf[..n]).await?;
            done += n as u64;
        }
        Ok(done)
    }

    async fn write_piece(self: &Arc<Self>, io: &mut Io, offset: u64, data: &[u8]) -> Result<(), FsError> {
        if data.is_empty() {
            return Ok(());
        }
        if !self.writable {
            return Err(FsError::Fs {
                status: FsStatus::PermissionDenied,
                message: format!("{}: not opened for writing", self.path),
            });
        }
        poisoned(io)?;
        let len = data.len() as u64;
        // What the layout holds, and what `COMMIT` can report written (its
        // dirty ranges end at most at OBJECT_SIZE_MAX).
        let max = self.geometry.file_size_max().min(nasd_proto::limits::OBJECT_SIZE_MAX);
        if offset.checked_add(len).is_none_or(|end| end > max) {
            return Err(FsError::Stripe(StripeError::OutOfRange { offset, len, max }));
        }
        // A write crossing the small-file threshold goes in one transaction,
        // head (staged under it) and tail: opened before the head is sent,
        // and not committed between the two.
        let crossing = offset < self.small && offset + len > self.small;
        if crossing {
            self.ready_txn(io, len, false).await?;
            // Refused whole, before the head is staged.
            self.within_escrow(io, offset, len)?;
        }
        let (offset, data) = if offset < self.small {
            let below = ((self.small - offset) as usize).min(data.len());
            self.write_small(io, offset, &data[..below]).await?;
            if below == data.len() {
                return Ok(());
            }
            (self.small, &data[below..])
        } else {
            (offset, data)
        };
        let len = data.len() as u64;
        self.ready_txn(io, len, crossing).await?;
        self.within_escrow(io, offset, len)?;
        let txn = io.txn.as_mut().expect("begun above");
        // Noted before write-behind takes the bytes: if this future is dropped
        // after it took some, they are still reported at COMMIT.
        txn.note(offset, len);
        self.written_end.fetch_max(offset + len, Ordering::Relaxed);
        if let Err(e) = txn.behind.write(offset, data).await {
            return Err(self.poison(io, "writing", e).await);
        }
        let due = txn.due();
        io.forget_cached();
        if due {
            self.commit(io).await?;
        }
        Ok(())
    }

    /// Makes a write transaction ready for a write of `len` bytes: ends one
    /// that is due (unless `keep`: the head of this write is staged under
    /// it) or whose quota escrow the write could pass (its bytes so far and
    /// these, were they all new storage), then begins one if none is open.
    async fn ready_txn(self: &Arc<Self>, io: &mut Io, len: u64, keep: bool) -> Result<(), FsError> {
        self.binder.clear_error();
        self.binder.ensure(rights::WRITE).await?;
        if !keep && io.txn.as_ref().is_some_and(Txn::due) {
            self.commit(io).await?;
        }
        if io.txn.is_none() {
            io.txn = Some(self.begin().await?);
        }
        if !keep && io.txn.as_ref().is_some_and(|t| t.bytes.saturating_add(len) > t.escrow && t.bytes > 0) {
            // Past this transaction's quota escrow: commit what it wrote, which
            // gives the escrow back, and ask for a fresh one.
            self.commit(io).await?;
            io.txn = Some(self.begin().await?);
        }
        Ok(())
    }

    /// Fails with `QuotaExceeded` if a write of `len` bytes at `offset` that
    /// extends the file could store more than the open transaction's quota
    /// escrow allows (its bytes so far and these). A write inside the file
    /// may fill holes or overwrite stored bytes: the manager's commit, which
    /// measures what the file stores, decides that one.
    fn within_escrow(&self, io: &Io, offset: u64, len: u64) -> Result<(), FsError> {
        let end = offset.saturating_add(len);
        let over = |t: &Txn| t.bytes.saturating_add(len) > t.escrow && end > self.size();
        if let Some(escrow) = io.txn.as_ref().filter(|t| over(t)).map(|t| t.escrow) {
            return Err(FsError::Fs {
                status: FsStatus::QuotaExceeded,
                message: format!(
                    "{}: writing {len} bytes up to byte {end} could pass the quota (the manager allows {escrow} more \
                     bytes of data now)",
                    self.path
                ),
            });
        }
        Ok(())
    }

    /// Writes `data` at `offset`, all below the small-file threshold, to the
    /// manager. Under the open write transaction if there is one: staged,
    /// part of it (a failure loses the transaction's writes, as a failed
    /// striped write does); else stable when this returns.
    async fn write_small(&self, io: &mut Io, offset: u64, data: &[u8]) -> Result<(), FsError> {
        let txn = io.txn.as_ref().map_or(0, |t| t.id);
        let mut at = offset;
        for chunk in data.chunks(SMALL_IO_MAX) {
            let req = ManagerRequest::WriteSmall { handle: self.handle, txn, offset: at, data: chunk.to_vec() };
            let written = match self.fs.call(&req).await {
                // Stable (no transaction): the attributes after it are the file's now.
                Ok(ManagerReply::Entry(e)) if txn == 0 => {
                    self.binder.set_attr(e.attr);
                    Ok(())
                }
                Ok(ManagerReply::Entry(_)) => Ok(()),
                Ok(other) => Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                if txn != 0 {
                    // The transaction cannot be committed whole: give it up.
                    self.give_up(io).await;
                    io.poisoned = Some(format!("the writes since the last flush were lost: {e}"));
                }
                return Err(e);
            }
            at += chunk.len() as u64;
            self.written_end.fetch_max(at, Ordering::Relaxed);
            if let Some(t) = io.txn.as_mut() {
                t.note_staged(at);
            }
        }
        io.forget_cached();
        Ok(())
    }

    /// Opens a write transaction: `BEGIN_WRITE`, then (for Reed-Solomon,
    /// whose parity is computed from the bytes below the size) the file's
    /// size under the transaction, which no other writer can change now.
    async fn begin(self: &Arc<Self>) -> Result<Txn, FsError> {
        let began = Instant::now();
        let (id, lease, size_limit) = match self.fs.call(&ManagerRequest::BeginWrite { handle: self.handle }).await? {
            ManagerReply::Began { txn, lease_ms, size_limit } => {
                (txn, Duration::from_millis(lease_ms as u64), size_limit)
            }
            other => return Err(FsError::Protocol(format!("unexpected reply {other:?}"))),
        };
        if id == 0 {
            return Err(FsError::Protocol("BEGIN_WRITE answered transaction 0, which means none".into()));
        }
        let ready = async {
            if matches!(self.geometry.layout().scheme, Scheme::ReedSolomon { .. }) {
                self.binder.fetch().await?;
            }
            WriteBehind::new(self.striper.clone(), self.size()).map_err(|e| self.failed("writing", e))
        };
        let behind = match ready.await {
            Ok(behind) => behind,
            Err(e) => {
                // Nothing was written under it: end it now rather than leave it open
                // (holding off every writer of the file, this one included) until its
                // lease runs out.
                let empty = ManagerRequest::Commit {
                    handle: self.handle,
                    txn: id,
                    written_end: 0,
                    missed: vec![],
                    dirty: vec![],
                };
                if let Err(c) = self.fs.call(&empty).await {
                    tracing::debug!(path = %self.path, txn = id, error = %c, "ending an unused write transaction failed");
                }
                return Err(e);
            }
        };
        // The size it may reach is the file's size at BEGIN_WRITE plus the escrow.
        let escrow = if size_limit == u64::MAX { u64::MAX } else { size_limit.saturating_sub(self.binder.attr().size) };
        let mut txn = Txn::new(id, lease, began, behind, escrow);
        txn.timer = Some(self.arm(id, began + lease / TXN_LEASE_FRACTION));
        Ok(txn)
    }

    /// A task that commits transaction `txn` at `at` if it is still open
    /// then (a writer that stops writing without flushing must not keep it
    /// open until its lease runs out). A failure is kept for the file's next
    /// call, as a background write's would be.
    fn arm(self: &Arc<Self>, txn: u64, at: Instant) -> Timer {
        let file = Arc::downgrade(self);
        Timer::new(self.striper.env().spawn(async move {
            tokio::time::sleep_until(at).await;
            let Some(file) = file.upgrade() else { return };
            let mut io = file.io.lock().await;
            match io.txn.as_mut() {
                // Its own commit must not abort it.
                Some(t) if t.id == txn => t.timer.take().map(Timer::disarm),
                _ => return,
            };
            match file.commit(&mut io).await {
                Ok(_) => {}
                // No manager answers: the transaction is kept, and tried again later
                // (without waiting here, which would hold the file's lock).
                Err(FsError::ManagerUnreachable { .. }) => {
                    if let Some(t) = io.txn.as_mut().filter(|t| t.id == txn) {
                        t.timer = Some(file.arm(txn, Instant::now() + COMMIT_RETRY_PAUSE));
                    }
                }
                Err(e) => {
                    tracing::warn!(path = %file.path, error = %e, "committing a write transaction on time failed")
                }
            }
        }))
    }

    /// Waits for the transaction's background writes, recording what they
    /// did (so reads see them, and skip components they missed).
    async fn settle(&self, io: &mut Io) -> Result<(), FsError> {
        let Some(txn) = io.txn.as_mut() else { return Ok(()) };
        match txn.behind.wait().await {
            Ok(outcome) => {
                self.binder.mark_missed(&outcome.missed);
                txn.outcome.merge(outcome);
                Ok(())
            }
            Err(e) => Err(self.poison(io, "writing", e).await),
        }
    }

    async fn flush(&self) -> Result<(), FsError> {
        let mut io = self.io.lock().await;
        poisoned(&io)?;
        self.commit(&mut io).await.map(|_| ())
    }

    /// Commits the open transaction, if any; returns the attributes the
    /// manager recorded.
    async fn commit(&self, io: &mut Io) -> Result<Option<FileAttr>, FsError> {
        if io.txn.is_none() {
            return Ok(None);
        }
        self.binder.clear_error();
        // Buffered writes go out now, and every component is flushed: with
        // capabilities fresh enough to outlast both (a refusal would refresh
        // anyway, a request later).
        self.binder.ensure(rights::WRITE | rights::FLUSH).await?;
        let Some(mut txn) = io.txn.take() else { return Ok(None) };
        if !txn.writable() {
            // Dropping it discards what is buffered and aborts what is in flight.
            drop(txn);
            io.forget_cached();
            let message = format!(
                "{}: the writes since the last flush were rolled back: their write transaction's lease \
                 ran out before they could be flushed; write them again",
                self.path
            );
            io.poisoned = Some(message.clone());
            return Err(FsError::Fs { status: FsStatus::Aborted, message });
        }
        // Until the commit's outcome is known: a flush dropped half-way leaves
        // the file refusing writes, not silently missing these.
        io.poisoned = Some("a flush was cancelled before the manager answered its commit".into());
        let drained: Result<WriteOutcome, StripeError> = async {
            let waited = txn.behind.wait().await?;
            txn.outcome.merge(waited);
            self.striper.flush(&txn.outcome.written).await
        }
        .await;
        match drained {
            Ok(flushed) => txn.outcome.merge(flushed),
            Err(e) => {
                io.txn = Some(txn);
                return Err(self.poison(io, "flushing", e).await);
            }
        }
        self.binder.mark_missed(&txn.outcome.missed);
        for f in &txn.outcome.failed {
            tracing::warn!(path = %self.path, failure = %f, "a component missed writes; the manager marks it stale");
        }
        let req = ManagerRequest::Commit {
            handle: self.handle,
            txn: txn.id,
            written_end: txn.written_end,
            missed: txn.missed(),
            dirty: txn.dirty.to_wire(),
        };
        match self.fs.call(&req).await {
            Ok(ManagerReply::Entry(e)) => {
                io.poisoned = None;
                self.binder.set_attr(e.attr);
                Ok(Some(self.attr()))
            }
            Ok(other) => {
                io.poisoned = Some("the manager's answer to COMMIT made no sense".into());
                Err(FsError::Protocol(format!("unexpected reply {other:?}")))
            }
            Err(FsError::Fs { status: FsStatus::Aborted, message }) => {
                let message = format!(
                    "{}: the writes since the last flush were rolled back: {message} (write them again)",
                    self.path
                );
                io.poisoned = Some(message.clone());
                Err(FsError::Fs { status: FsStatus::Aborted, message })
            }
            // Not sent (no manager answers, or the caller gave up waiting for one): the
            // transaction stays open as it was, its writes on the drives, for the next try.
            Err(e @ (FsError::ManagerUnreachable { .. } | FsError::Interrupted { .. })) => {
                io.poisoned = None;
                io.txn = Some(txn);
                Err(e)
            }
            // Refused: nothing was committed, and the manager rolls the transaction back.
            Err(FsError::Fs { status, message }) => {
                let message = format!(
                    "{}: the manager refused to commit the writes since the last flush ({message}); they are \
                     not part of the file and will be rolled back",
                    self.path
                );
                io.poisoned = Some(message.clone());
                Err(FsError::Fs { status, message })
            }
            // The answer was lost: the commit may or may not have happened.
            Err(e) => {
                io.poisoned = Some(format!("committing the writes failed, they may or may not be committed: {e}"));
                Err(e)
            }
        }
    }

    async fn close(&self) -> Result<FileAttr, FsError> {
        let mut io = self.io.lock().await;
        poisoned(&io)?;
        if let Some(attr) = self.commit(&mut io).await? {
            return Ok(attr);
        }
        let e = self.fs.entry(ManagerRequest::GetAttr { handle: self.handle, open: OpenMode::None }).await?;
        Ok(FileAttr { size: e.attr.size.max(self.written_end.load(Ordering::Relaxed)), ..e.attr })
    }

    async fn adopt_attr(&self, attr: FileAttr) -> bool {
        let mut io = self.io.lock().await;
        if io.txn.is_some() || attr.ino != self.ino() {
            return false;
        }
        // With no transaction open every write of this file is committed, so
        // the manager's size is at least what it wrote, unless the file was cut
        // since: then the new size rules.
        self.written_end.fetch_min(attr.size, Ordering::Relaxed);
        self.binder.set_attr(attr);
        io.forget_cached();
        true
    }

    // ------------------------------------------------------------ errors

    /// Records a failed write or flush: the transaction cannot be committed
    /// (it is given up: [`give_up`](Self::give_up)), and the file takes no
    /// more writes.
    async fn poison(&self, io: &mut Io, doing: &str, e: StripeError) -> FsError {
        let e = self.failed(doing, e);
        self.give_up(io).await;
        io.poisoned = Some(format!("the writes since the last flush were lost: {e}"));
        io.poisoned_by = [FsStatus::NoSpace, FsStatus::QuotaExceeded].into_iter().find(|s| s.errno() == e.errno());
        e
    }

    /// Gives the open transaction up, if any: what is buffered is dropped and
    /// what is in flight stopped, and the manager is asked to roll it back
    /// now (`ABORT_WRITE`), so what it wrote, and the drive space and quota
    /// it held, come back at once — a write that failed for a full drive
    /// leaves the drive as it found it. If the manager cannot be told, it
    /// rolls the transaction back when its lease runs out.
    async fn give_up(&self, io: &mut Io) {
        io.forget_cached();
        let Some(txn) = io.txn.take() else { return };
        let id = txn.id;
        drop(txn);
        let req = ManagerRequest::AbortWrite { handle: self.handle, txn: id };
        // One attempt, whatever the caller's patience for an unreachable manager: the lease
        // rolls the transaction back anyway.
        let told = crate::wait::with_manager_wait(crate::wait::ManagerWait::NONE, None, self.fs.call(&req));
        if let Err(e) = told.await {
            tracing::debug!(path = %self.path, txn = id, error = %e, "a given-up write transaction rolls back when its lease runs out");
        }
    }

    /// The error for a failed engine operation.
    fn failed(&self, doing: &str, e: StripeError) -> FsError {
        // The manager's refusal to refresh a capability explains the drive's
        // refusal that made the engine ask.
        if matches!(e, StripeError::Unavailable { .. } | StripeError::Bind(_)) {
            if let Some(refusal) = self.binder.take_error() {
                return refusal;
            }
        }
        match e {
            StripeError::Unavailable { missing_drives, missing, tolerates, failures } => {
                let target = nasd_stripe::Binder::current(&*self.binder);
                let drives: Vec<String> = missing_drives
                    .iter()
                    .map(|d| match target.components.iter().find(|b| b.drive == *d) {
                        Some(b) => format!("drive {d} ({})", b.addr),
                        None => format!("drive {d}"),
                    })
                    .collect();
                let advice = if doing == "reading" {
                    "no data was returned"
                } else {
                    "the writes since the last flush will be rolled back"
                };
                let details = failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
                // Full drives are not down drives: say so, not "bring them back".
                if !failures.is_empty() && failures.iter().all(|f| no_space(f.cause.status())) {
                    let message = format!(
                        "{doing} {}: no space left: the drives of {} of its {} components are full ({}), more \
                         than its layout {} tolerates; {advice}. Remove files or add drives (`nasd df` shows \
                         each drive's use). ({details})",
                        self.path,
                        missing.len(),
                        self.geometry.components(),
                        drives.join(", "),
                        self.geometry.layout(),
                    );
                    return FsError::Unavailable { missing_drives, tolerates, failures, message };
                }
                let message = format!(
                    "{doing} {}: {} of its {} components are unavailable, on {}, and its layout {} tolerates {tolerates}; \
                     {advice}. Bring the drives back (`nasd status` shows which are down) and try again. ({})",
                    self.path,
                    missing.len(),
                    self.geometry.components(),
                    drives.join(", "),
                    self.geometry.layout(),
                    details,
                );
                FsError::Unavailable { missing_drives, tolerates, failures, message }
            }
            StripeError::WriteBehind(inner) => self.failed(doing, *inner),
            StripeError::Io(e) => FsError::Local(e),
            other => FsError::Stripe(other),
        }
    }
}

impl File {
    /// The file an `Entry` with capabilities names (`path` for messages).
    pub(crate) fn new(fs: FsClient, entry: Entry, path: &str, writable: bool) -> Result<File, FsError> {
        let handle = entry.handle();
        let Some(access) = entry.access else {
            return Err(FsError::Fs {
                status: FsStatus::PermissionDenied,
                message: format!("{path}: the manager granted no access to its data"),
            });
        };
        let open = if writable { OpenMode::RefreshWrite } else { OpenMode::Read };
        let small = u64::from(access.small_threshold);
        let binder = Arc::new(FileBinder::new(fs.clone(), handle, open, entry.attr, access)?);
        let geometry = Geometry::new(binder.layout()).map_err(|e| FsError::Protocol(format!("{path}: {e}")))?;
        let striper = Striper::with_options(fs.drive_pool(), binder.clone(), fs.stripe_options())
            .map_err(|e| FsError::Setup(format!("{path}: {e}")))?;
        let read_ahead = ReadAhead::new(striper.clone());
        Ok(File {
            inner: Arc::new(Inner {
                fs,
                handle,
                path: path.to_string(),
                writable,
                binder,
                striper,
                geometry,
                small,
                written_end: AtomicU64::new(0),
                io: tokio::sync::Mutex::new(Io {
                    read_ahead,
                    txn: None,
                    poisoned: None,
                    poisoned_by: None,
                    warned: BTreeSet::new(),
                    run: None,
                }),
            }),
        })
    }

    /// The file's inode number.
    pub fn ino(&self) -> Ino {
        self.inner.ino()
    }

    /// The file's handle (opaque; valid for this client's user only).
    pub fn handle(&self) -> Handle {
        self.inner.handle()
    }

    /// How the file's bytes are spread over its component objects.
    pub fn layout(&self) -> Layout {
        self.inner.layout()
    }

    /// The file's size as this client knows it: the manager's (from the open,
    /// the last capability refresh or commit), or larger where this file has
    /// written further. Reads stop there. Another client's writes show after
    /// it flushed or closed and this file refreshed or was opened again
    /// (close-to-open consistency).
    pub fn size(&self) -> u64 {
        self.inner.size()
    }

    /// The file's attributes as the manager last reported them, with the
    /// size as [`size`](Self::size) knows it.
    pub fn attr(&self) -> FileAttr {
        self.inner.attr()
    }

    /// Whether the file was opened for writing.
    pub fn writable(&self) -> bool {
        self.inner.writable
    }

    /// Whether the file takes writes: opened for writing, and no write,
    /// flush or commit of it has failed (after which it refuses writes until
    /// reopened).
    pub async fn takes_writes(&self) -> bool {
        self.inner.writable && self.inner.io.lock().await.poisoned.is_none()
    }

    /// Whether writes since the last flush await a commit.
    pub async fn dirty(&self) -> bool {
        self.inner.io.lock().await.txn.is_some()
    }

    /// Takes attributes the manager has just reported for this file — from a
    /// new open of it (close-to-open: another client's committed writes), or
    /// from a size change made with [`FsClient::setattr`](crate::FsClient::setattr)
    /// — so reads stop at the new size. Returns `false`, changing nothing,
    /// while a write transaction is open (flush first: the file's own writes
    /// then decide its size) or if `attr` is another inode's.
    pub async fn adopt_attr(&self, attr: FileAttr) -> bool {
        self.inner.adopt_attr(attr).await
    }

    /// Reads up to `len` bytes at `offset` into `dst`, stopping at the end of
    /// the file as [`size`](Self::size) knows it; returns the bytes read.
    /// Every byte is verified before it reaches `dst`; a component that fails
    /// is read around while the layout allows.
    ///
    /// # Errors
    /// [`FsError::Unavailable`] if more components fail than the layout
    /// tolerates (`dst` then holds whole, correct pieces before the one that
    /// failed, never wrong bytes); the manager's refusal if a capability
    /// could not be refreshed (`PERMISSION_DENIED` after a chmod);
    /// [`FsError::Local`] if `dst` fails.
    ///
    /// # Cancel safety
    /// Dropping the future aborts its drive requests; `dst` may have received
    /// some pieces. The file stays usable.
    pub async fn read_to(&self, offset: u64, len: u64, dst: &mut (impl AsyncWrite + Unpin)) -> Result<u64, FsError> {
        self.inner.read_to(offset, len, dst).await
    }

    /// Reads up to `len` bytes at `offset`.
    ///
    /// # Errors
    /// As [`read_to`](Self::read_to).
    pub async fn read_at(&self, offset: u64, len: u64) -> Result<Vec<u8>, FsError> {
        self.inner.read_at(offset, len).await
    }

    /// Sends hints for reads (number in `stream`, offset, length) of this
    /// file to its drives ([`crate::HintedReads`] does this for an application);
    /// returns the hints the drives queued.
    ///
    /// # Errors
    /// The read capability could not be had.
    pub async fn hint_reads(&self, stream: u64, reads: &[(u32, u64, u64)]) -> Result<u64, FsError> {
        self.inner.binder.ensure(rights::READ).await?;
        Ok(self.inner.striper.hint_reads(stream, reads, self.size()).await)
    }

    /// Tells the drives read `through_seq` of `stream` was made.
    pub async fn hint_progress(&self, stream: u64, through_seq: u32) {
        self.inner.striper.hint_progress(stream, through_seq).await;
    }

    /// Ends `stream` at the drives.
    pub async fn hint_end(&self, stream: u64) {
        self.inner.striper.hint_end(stream).await;
    }

    /// `SEEK_DATA` ([`Seek::Data`]): the first offset at or after `offset`
    /// where the file may hold data; `SEEK_HOLE` ([`Seek::Hole`]): the first
    /// offset at or after `offset` in a hole, the file's size if none comes
    /// before. `None` when `offset` is at or past the size, or (data) when
    /// only holes follow it. From the drives' stored extents (`EXTENTS`),
    /// after this file's own writes reached them; no data is read. A hole
    /// may be reported as data (bytes below the small-file threshold, a
    /// component that cannot answer), never data as a hole.
    ///
    /// # Errors
    /// As [`read_to`](Self::read_to) (an earlier write's failure included).
    ///
    /// # Cancel safety
    /// Dropping the future aborts its drive requests; nothing changes.
    pub async fn seek(&self, what: Seek, offset: u64) -> Result<Option<u64>, FsError> {
        self.inner.seek(what, offset).await
    }

    /// The file's checksum (BLAKE3, 32 bytes) from the digests its drives
    /// stored with its blocks (`DIGESTS`): no drive reads or hashes the
    /// data; only bytes below the small-file threshold are fetched (from
    /// the manager) and hashed. Equal for equal bytes under the same
    /// layout, small-file threshold and drive block sizes; different after
    /// any change of a byte or of the size — see [`file_checksum`](crate::file_checksum)
    /// for exactly what it covers. This file's own writes reach the drives
    /// first; another client's show after it committed and this file was
    /// opened again (close-to-open).
    ///
    /// # Errors
    /// [`FsError::Unavailable`] if a data column has no copy that answers
    /// (a Reed-Solomon column is not rebuilt from parity for this); the
    /// manager's refusal if a capability with the `READ` right could not be
    /// had; as [`read_to`](Self::read_to) otherwise.
    ///
    /// # Cancel safety
    /// Dropping the future aborts its requests; nothing changes.
    pub async fn checksum(&self) -> Result<[u8; 32], FsError> {
        self.inner.checksum().await
    }

    /// Writes `data` at `offset`. The bytes are accepted into write-behind and
    /// written in the background; [`flush`](Self::flush) makes them durable
    /// and visible to others.
    ///
    /// # Errors
    /// `PERMISSION_DENIED` if the file was not opened for writing; the
    /// manager's refusal to begin a write transaction (`BUSY` while another
    /// writer's is open past `BEGIN_WAIT`); an earlier background write's
    /// failure ([`FsError::Unavailable`] if too many components failed) —
    /// after which the writes since the last flush are lost and the file takes
    /// no more writes.
    ///
    /// # Cancel safety
    /// Dropping the future may leave part of the data written: the whole range
    /// counts as written (the next flush commits the file's size past it), and
    /// bytes of it not yet written keep their old contents (zeros past the old
    /// end).
    pub async fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), FsError> {
        self.inner.write_at(offset, data).await
    }

    /// Writes `len` bytes read from `src` starting at `offset`, one transfer
    /// piece at a time (memory stays at one piece plus write-behind); returns
    /// the bytes written.
    ///
    /// # Errors
    /// As [`write_at`](Self::write_at); [`FsError::Local`] if `src` fails or
    /// ends early.
    ///
    /// # Cancel safety
    /// As [`write_at`](Self::write_at), for the pieces taken from `src`.
    pub async fn write_from(&self, offset: u64, len: u64, src: &mut (impl AsyncRead + Unpin)) -> Result<u64, FsError> {
        self.inner.write_from(offset, len, src).await
    }

    /// Makes everything written so far durable and visible (`fsync`):
    /// drains write-behind, flushes every component written, and commits the
    /// write transaction at the manager, which records the new size and marks
    /// components that missed writes stale. Does nothing if nothing was
    /// written since the last flush.
    ///
    /// # Errors
    /// `ABORTED` if the manager rolled the transaction back (its lease ran
    /// out): the writes since the last flush are lost. [`FsError::Unavailable`]
    /// if too many components failed; the transaction is then left to roll back.
    /// After either the file takes no more writes.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the transaction committed or not (it is
    /// rolled back if its `COMMIT` did not arrive); the file then takes no
    /// more writes.
    pub async fn flush(&self) -> Result<(), FsError> {
        self.inner.flush().await
    }

    /// Closes the file: flushes if anything was written since the last flush
    /// (committing it), else asks the manager for the attributes. Returns the
    /// attributes.
    ///
    /// # Errors
    /// As [`flush`](Self::flush), also when an earlier write or flush failed.
    pub async fn close(self) -> Result<FileAttr, FsError> {
        self.inner.close().await
    }
}

/// Hands `len` zeros to `dst`.
async fn write_zeros(dst: &mut (impl AsyncWrite + Unpin), len: u64) -> Result<(), FsError> {
    let zeros = vec![0u8; (len as usize).min(ZEROS_CHUNK_BYTES)];
    let mut left = len;
    while left > 0 {
        let n = (left as usize).min(zeros.len());
        dst.write_all(&zeros[..n]).await.map_err(FsError::Local)?;
        left -= n as u64;
    }
    Ok(())
}

/// The error a poisoned file answers writes with: `ABORTED`, or the want of
/// space that made its writes fail.
fn poisoned(io: &Io) -> Result<(), FsError> {
    match &io.poisoned {
        Some(why) => Err(FsError::Fs {
            status: io.poisoned_by.unwrap_or(FsStatus::Aborted),
            message: format!(
                "an earlier write or flush of this file failed, so it takes no more writes ({why}); reopen it"
            ),
        }),
        None => Ok(()),
    }
}
