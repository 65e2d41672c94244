//! Informed prefetching, the drive's `prefetch-v1` extension (NASD §3.4,
//! §4.6; PROTOCOL.md, "Extensions").
//!
//! A client that knows its future reads sends them as numbered hints of a
//! stream, each call with a capability (or identity) for its object; the
//! drive reads the hinted blocks from disk into its prefetch cache
//! ([`nasd_store::BlockCache`]) ahead of the client, and the client's reads
//! then find them there. The client reports its progress (the last hint it
//! has read); the drive drops what it held for those hints and reads
//! further ahead. So the drive runs at most [`Prefetcher::ahead_bytes`]
//! ahead of each stream: paced by the client, as Patterson's informed
//! prefetching is, and bounded whatever the client asks. A stream's hints
//! are read in its order, one at a time; [`PREFETCH_READERS`] streams are
//! read at once.
//!
//! **Security.** A hint gives no access: the cache only speeds up reads
//! that pass their own checks. What a hint does get is disk work, so it is
//! accepted only with a valid credential for its object, and before each
//! hint is read the drive checks that credential still holds: not expired,
//! the object's access control version (capability) or PALs (identity)
//! unchanged. A hint whose credential was revoked or expired is dropped,
//! counted by reason (`nasd_drive_prefetch_hints_total{outcome}`). Streams are bounded in number
//! ([`PREFETCH_STREAMS_MAX`], the least recently used goes), in queued
//! hints ([`PREFETCH_HINTS_QUEUED_MAX`]) and idle time
//! ([`PREFETCH_STREAM_IDLE`]). A stream id is the client's 64-bit random
//! choice: only whoever knows it can advance or end the stream.

use crate::security::{Authority, Grant};
use crate::tasks::blocking;
use crate::DriveMetrics;
use nasd_proto::extension::{encode_hints_queued, PrefetchCall, ReadHint};
use nasd_proto::limits::OBJECT_SIZE_MAX;
use nasd_proto::{Region, Status};
use nasd_store::{Holder, PalStamp, Store};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Most prefetch streams a drive keeps; a new one beyond it replaces the
/// least recently used.
pub const PREFETCH_STREAMS_MAX: usize = 64;
/// Most hints one stream has queued (not yet read ahead).
pub const PREFETCH_HINTS_QUEUED_MAX: usize = 16 * 1024;
/// A stream not called for this long is dropped.
pub const PREFETCH_STREAM_IDLE: Duration = Duration::from_secs(60);
/// Streams read ahead at once (disk requests in flight for prefetching).
pub const PREFETCH_READERS: usize = 4;

/// The drive's prefetch streams and the tasks that read them ahead.
#[derive(Debug)]
pub struct Prefetcher {
    store: Arc<Store>,
    streams: Mutex<HashMap<u64, Stream>>,
    wake: Arc<tokio::sync::Notify>,
    started: AtomicBool,
    /// Counts what became of hints.
    metrics: DriveMetrics,
}

#[derive(Debug, Default)]
struct Stream {
    hints: VecDeque<Hint>,
    /// Hints being read ahead now (0 or 1: a stream's hints are read in
    /// its order, one at a time).
    reading: usize,
    /// When a reader last took one of its hints (streams take turns).
    last_read_ns: u64,
    /// The last hint the client has read, as it reported.
    progress: Option<u32>,
    last_called_ns: u64,
}

/// One hinted read and the credential it came with.
#[derive(Debug, Clone, Copy)]
struct Hint {
    seq: u32,
    partition: u64,
    object: u64,
    region: Region,
    expires_ns: u64,
    access_control_version: Option<u64>,
    pal: Option<PalStamp>,
}

impl Prefetcher {
    pub(crate) fn new(store: Arc<Store>, metrics: DriveMetrics) -> Prefetcher {
        Prefetcher {
            store,
            streams: Mutex::new(HashMap::new()),
            wake: Arc::new(tokio::sync::Notify::new()),
            started: AtomicBool::new(false),
            metrics,
        }
    }

    /// Bytes a stream may hold in the cache ahead of its client: a quarter
    /// of the cache, so four streams progress at once.
    pub fn ahead_bytes(&self) -> u64 {
        self.store.block_cache().capacity() / 4
    }

    /// Runs one `prefetch-v1` call on `partition`/`object`, authorized by
    /// `auth` with `grant`; returns the extension's result.
    pub(crate) fn call(
        self: &Arc<Self>,
        auth: &Authority,
        grant: &Grant,
        partition: u64,
        object: u64,
        args: &[u8],
    ) -> Result<Vec<u8>, (Status, String)> {
        let call = PrefetchCall::decode(args).map_err(|e| (e.status(), format!("bad prefetch-v1 arguments: {e}")))?;
        let now = self.store.now_ns();
        match call {
            PrefetchCall::Hint { stream, hints } => {
                if let Some(h) = hints.iter().find(|h| h.region.length == 0 || h.region.end() > OBJECT_SIZE_MAX) {
                    let r = h.region;
                    return Err((Status::BadArguments, format!("hint {r:?} is empty or past the largest object")));
                }
                let expires_ns = auth
                    .capability
                    .as_ref()
                    .map(|c| c.expiration_ns)
                    .or(auth.identity.as_ref().map(|i| i.expiration_ns))
                    .unwrap_or(u64::MAX);
                let hint = |h: &ReadHint| Hint {
                    seq: h.seq,
                    partition,
                    object,
                    region: h.region,
                    expires_ns,
                    access_control_version: grant.access_control_version,
                    pal: grant.pal,
                };
                let queued = self.queue(stream, now, hints.iter().map(hint));
                self.metrics.prefetch_hints("queued", queued as u64);
                self.start();
                self.wake.notify_waiters();
                Ok(encode_hints_queued(queued))
            }
            PrefetchCall::Progress { stream, through_seq } => {
                self.progress(stream, through_seq, now);
                self.wake.notify_waiters();
                Ok(Vec::new())
            }
            PrefetchCall::End { stream } => {
                self.end(stream);
                Ok(Vec::new())
            }
        }
    }

    /// Adds hints to `stream` (made if new), as many as fit; how many did.
    fn queue(&self, stream: u64, now: u64, hints: impl Iterator<Item = Hint>) -> u16 {
        let mut streams = lock(&self.streams);
        if !streams.contains_key(&stream) && streams.len() >= PREFETCH_STREAMS_MAX {
            let oldest = streams.iter().min_by_key(|(_, s)| s.last_called_ns).map(|(&id, _)| id);
            if let Some(id) = oldest {
                streams.remove(&id);
                self.store.block_cache().release(id, None);
            }
        }
        let s = streams.entry(stream).or_default();
        s.last_called_ns = now;
        let room = PREFETCH_HINTS_QUEUED_MAX.saturating_sub(s.hints.len());
        let before = s.hints.len();
        s.hints.extend(hints.take(room));
        (s.hints.len() - before) as u16
    }

    /// The client has read through hint `through`: drops queued hints up to
    /// it and the cache's holds for them.
    fn progress(&self, stream: u64, through: u32, now: u64) {
        let mut streams = lock(&self.streams);
        let Some(s) = streams.get_mut(&stream) else { return };
        s.last_called_ns = now;
        s.progress = Some(s.progress.map_or(through, |p| p.max(through)));
        let before = s.hints.len();
        s.hints.retain(|h| h.seq > through);
        self.metrics.prefetch_hints("passed", (before - s.hints.len()) as u64);
        drop(streams);
        self.store.block_cache().release(stream, Some(through));
    }

    fn end(&self, stream: u64) {
        lock(&self.streams).remove(&stream);
        self.store.block_cache().release(stream, None);
    }

    /// Starts the readers once, on the first hint.
    fn start(self: &Arc<Self>) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        for _ in 0..PREFETCH_READERS {
            tokio::spawn(read_ahead(Arc::downgrade(self)));
        }
    }

    /// The next hint to read ahead: the first of the stream within its
    /// bound, and with none being read, that waited longest; None if there
    /// is none now. Drops idle streams.
    fn next(&self) -> Option<(u64, Hint)> {
        let now = self.store.now_ns();
        let ahead = self.ahead_bytes();
        let cache = self.store.block_cache();
        let mut streams = lock(&self.streams);
        let idle: Vec<u64> = streams
            .iter()
            .filter(|(_, s)| now.saturating_sub(s.last_called_ns) > PREFETCH_STREAM_IDLE.as_nanos() as u64)
            .map(|(&id, _)| id)
            .collect();
        for id in idle {
            streams.remove(&id);
            cache.release(id, None);
        }
        let (&id, s) = streams
            .iter_mut()
            .filter(|(id, s)| s.reading == 0 && !s.hints.is_empty() && cache.held_by(**id) < ahead)
            .min_by_key(|(_, s)| s.last_read_ns)?;
        s.last_read_ns = now;
        s.reading += 1;
        Some((id, s.hints.pop_front().expect("not empty")))
    }

    /// A hint read (or dropped): its stream may take another.
    fn done(&self, stream: u64, retry: Option<Hint>) {
        if let Some(s) = lock(&self.streams).get_mut(&stream) {
            s.reading = s.reading.saturating_sub(1);
            if let Some(h) = retry {
                s.hints.push_front(h);
            }
        }
    }

    /// Whether `h`'s credential still holds; counts a drop.
    fn still_valid(&self, h: &Hint) -> bool {
        if self.store.now_ns() > h.expires_ns {
            self.metrics.prefetch_hints("expired", 1);
            return false;
        }
        let acv_holds = h
            .access_control_version
            .is_none_or(|v| self.store.access_control_version(h.partition, h.object).is_ok_and(|now| now == v));
        let pal_holds =
            h.pal.is_none_or(|stamp| self.store.pal_view(h.partition, h.object).is_ok_and(|v| v.stamp == stamp));
        if !(acv_holds && pal_holds) {
            self.metrics.prefetch_hints("revoked", 1);
            return false;
        }
        true
    }
}

/// One reader: takes hints and reads them into the cache until the drive
/// is gone.
async fn read_ahead(prefetcher: Weak<Prefetcher>) {
    loop {
        let Some(p) = prefetcher.upgrade() else { return };
        // Registered before looking, so a hint or progress that comes
        // meanwhile is not missed.
        let wake = p.wake.clone();
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let Some((stream, hint)) = p.next() else {
            drop(p);
            // Also wakes now and then: idle streams are dropped, and a
            // reader outlives no drive by more than this.
            let _ = tokio::time::timeout(Duration::from_secs(1), woken).await;
            continue;
        };
        if !p.still_valid(&hint) {
            p.done(stream, None);
            continue;
        }
        let (store, env) = (p.store.clone(), p.store.env().clone());
        let holder = Holder { stream, seq: hint.seq };
        let got = blocking(&env, move || store.prefetch(hint.partition, hint.object, hint.region, holder)).await;
        match got {
            Ok(done) if done.full => {
                // No room until a client's progress frees some.
                p.done(stream, Some(hint));
                drop(p);
                let _ = tokio::time::timeout(Duration::from_secs(1), woken).await;
            }
            Ok(_) => {
                p.metrics.prefetch_hints("read", 1);
                p.done(stream, None);
            }
            Err(e) => {
                tracing::debug!(error = %e, stream, seq = hint.seq, "prefetch hint not read");
                p.metrics.prefetch_hints("failed", 1);
                p.done(stream, None);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().expect("prefetch lock poisoned")
}
