//! One client connection: frame in, checks, operation, protected frame out.
//!
//! Per request: read and validate a frame; authenticate it
//! (`Security::authenticate`: key, digest, protection levels, nonce);
//! decrypt and decode the arguments; check the data length; authorize
//! (`Security::authorize`: expiry, drive, object, map epoch, access control
//! version — an object whose version cannot be read is refused with the
//! store's status —, rights, regions; or `Security::authorize_identity`
//! against the object's PALs); execute on a blocking thread; reply under the
//! request's protection; audit. A refused request changes nothing and is
//! audited. A check whose answer can change while a write's data streams
//! (the access control version, and for a write by identity its PAL stamp)
//! travels in the `Grant` to the store's `WriteCheck`, made again as the
//! write installs. A frame whose header or arguments cannot be trusted gets
//! its specific status; if framing itself is lost the connection is closed
//! after the reply, otherwise it goes on.
//!
//! **Deadlines.** Before a frame, the idle time-outs
//! (`UNAUTHENTICATED_IDLE_TIMEOUT` until a fresh request proved a key);
//! each piece of a frame and each data chunk the peer sends, within
//! `DriveConfig::frame_timeout` (`FRAME_TIMEOUT`); each piece the drive sends
//! — header and arguments, a data chunk with its tag, a flush, the final
//! shutdown — within `DriveConfig::send_timeout` (`SEND_TIMEOUT`, `Writer`).
//! A peer that stops is cut off, and its transfer memory, store task and
//! pinned blocks go with the connection (a read's store task is joined
//! before the connection ends).
//!
//! **Transfers.** Write data flows socket → bounded channel →
//! `Store::write_checked` on a blocking thread, handed on chunk by chunk only
//! after its tag verified (a failed tag aborts the atomic write); read data
//! flows `Store::read_with` → bounded channel → socket. Neither holds an
//! object lock while the channel waits on the peer, so a slow or stopped
//! peer costs its own transfer only. A transfer holds at most
//! `TRANSFER_CHUNKS_MAX` chunks (plus the one being read or sent and a
//! block); all together at most `TRANSFER_MEMORY_MAX`, each taking its share
//! before it allocates a chunk or starts its store task — a write only once
//! its first data bytes arrive. Between frames a connection holds its two
//! `CONNECTION_BUFFER_LEN` buffers and nothing else; a refused request's
//! data is read past through the buffer.
//!
//! **Read replies** go out in chunks of `DriveConfig::reply_chunk_len` (by
//! default the larger of 256 KiB and the block size). Under Hash-and-MAC the
//! reader's `ChannelSink` MACs the stored digest of each whole block that
//! fits in the chunk being filled (the client checks it), hashes every other
//! unit, and checks a whole block that straddles chunks against its stored
//! digest before sending any chunk holding it
//! (`UnitMac::absorb_unit_end_checked`): the drive sends no byte of a block
//! that failed its digest — rot is refused (`DATA_CORRUPTED`, or the
//! connection closed after the true chunks before it), or left to a client
//! check that must fail.

use crate::security::{audit_target, Authority, Grant};
use crate::tasks::{blocking, join};
use crate::{
    Drive, DriveConfig, CONNECTION_BUFFER_LEN, MODEL, TRANSFER_CHUNKS_MAX, UNAUTHENTICATED_DRAIN_MAX,
    UNAUTHENTICATED_IDLE_TIMEOUT, VENDOR,
};
use nasd_crypto::{FrameKeys, UnitMac};
use nasd_proto::limits::{CHUNK_LEN_MAX, DATA_TAG_LEN, DIGEST_LEN, HEADER_LEN, NONCE_LEN, REGIONS_MAX};
use nasd_proto::{
    encode_error_message, validate_regions, AuditRecord, DecodeError, DriveInfo, FrameHeader, FramePrefix, KeyType,
    Kind, Protection, Region, Reply, Request, Status, VERSION, VERSION_MIN,
};
use nasd_store::{DataSink, DataSource, Store, StoreError, WriteCheck};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tracing::Instrument;

/// What to do with the connection after a frame.
enum Next {
    Continue,
    Close,
}

type Reader = BufReader<nasd_env::ReadHalf>;

/// The sending half of a connection: every send — a reply's header, each
/// data chunk with its tag, a flush, the final shutdown — must be taken by
/// the peer within `deadline` ([`DriveConfig::send_timeout`]), or the
/// connection ends, freeing whatever the request held (its transfer memory,
/// its store task and the blocks that task pinned).
struct Writer {
    inner: BufWriter<nasd_env::WriteHalf>,
    deadline: Duration,
}

impl Writer {
    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        timeout(self.deadline, self.inner.write_all(bytes)).await.map_err(|_| not_taking())?
    }
    async fn flush(&mut self) -> std::io::Result<()> {
        timeout(self.deadline, self.inner.flush()).await.map_err(|_| not_taking())?
    }
    async fn shutdown(&mut self) -> std::io::Result<()> {
        timeout(self.deadline, self.inner.shutdown()).await.map_err(|_| not_taking())?
    }
}

fn not_taking() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "peer stopped taking the reply")
}

static REPLY_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// How a reply is protected: like its request, once the request authenticated.
struct ReplyGuard<'a> {
    keys: Option<&'a FrameKeys>,
    key_type: KeyType,
    protection: Protection,
    /// The request's digest, which the reply's MAC covers.
    request_digest: [u8; DIGEST_LEN],
}

impl ReplyGuard<'static> {
    /// For refusals of requests that did not authenticate: unprotected.
    const NONE: ReplyGuard<'static> = ReplyGuard {
        keys: None,
        key_type: KeyType::None,
        protection: Protection::NONE,
        request_digest: [0; DIGEST_LEN],
    };
}

impl<'a> ReplyGuard<'a> {
    fn of(auth: &'a Authority, request: &FrameHeader, request_digest: &[u8; DIGEST_LEN]) -> Self {
        match &auth.keys {
            Some(k) => ReplyGuard {
                keys: Some(k),
                key_type: request.key_type,
                protection: request.protection,
                request_digest: *request_digest,
            },
            None => ReplyGuard::NONE,
        }
    }
}

/// One request's context: its header and the connection's shared state.
struct Ctx<'a> {
    drive: &'a Arc<Drive>,
    config: &'a DriveConfig,
    header: &'a FrameHeader,
    /// How long the peer may take to deliver a piece of this frame before it
    /// has proved a key.
    frame_timeout: Duration,
    /// When the frame had been read whole.
    started: Instant,
}

/// What a connection knows between frames.
struct ConnState {
    /// A request on this connection proved a key (or the drive checks none):
    /// the connection may idle for the configured time, not only for
    /// [`UNAUTHENTICATED_IDLE_TIMEOUT`].
    trusted: bool,
}

impl ConnState {
    fn idle_timeout(&self, config: &DriveConfig) -> Duration {
        if self.trusted {
            config.idle_timeout
        } else {
            config.idle_timeout.min(UNAUTHENTICATED_IDLE_TIMEOUT)
        }
    }

    fn frame_timeout(&self, config: &DriveConfig) -> Duration {
        if self.trusted {
            config.frame_timeout
        } else {
            config.frame_timeout.min(UNAUTHENTICATED_IDLE_TIMEOUT)
        }
    }
}

pub(crate) async fn serve_connection(
    socket: nasd_env::Stream,
    peer: SocketAddr,
    drive: Arc<Drive>,
    config: Arc<DriveConfig>,
) {
    let _ = socket.set_nodelay(true);
    let (rd, wr) = socket.into_split();
    let mut rd = BufReader::with_capacity(CONNECTION_BUFFER_LEN, rd);
    let mut wr = Writer { inner: BufWriter::with_capacity(CONNECTION_BUFFER_LEN, wr), deadline: config.send_timeout };
    let mut state = ConnState { trusted: !drive.security.enabled() };
    tracing::debug!(%peer, "connection opened");
    loop {
        match handle_frame(&mut rd, &mut wr, &drive, &config, &mut state, peer).await {
            Ok(Next::Continue) => {}
            Ok(Next::Close) => break,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "connection ended");
                break;
            }
        }
    }
    let _ = wr.shutdown().await;
    tracing::debug!(%peer, "connection closed");
}

/// Reads up to `buf.len()` bytes; returns how many arrived before EOF.
async fn read_full(rd: &mut (impl AsyncRead + Unpin), buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = rd.read(&mut buf[got..]).await?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

fn timed_out() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "peer too slow")
}

/// Reads one frame's header and body (capability, arguments, digest). A
/// frame that cannot be framed is answered here: `Err(Next::Close)`.
async fn read_frame(
    rd: &mut Reader,
    wr: &mut Writer,
    drive: &Drive,
    idle: Duration,
    frame_timeout: Duration,
) -> std::io::Result<Result<(FrameHeader, Vec<u8>), Next>> {
    let (store, metrics) = (&drive.store, &drive.metrics);
    let mut head = [0u8; HEADER_LEN];
    // Idle time is allowed before a frame starts; once it has started, the
    // rest must arrive within the frame timeout.
    let first = timeout(idle, read_full(rd, &mut head[..1])).await.map_err(|_| timed_out())??;
    if first == 0 {
        return Ok(Err(Next::Close));
    }
    let got = 1 + timeout(frame_timeout, read_full(rd, &mut head[1..])).await.map_err(|_| timed_out())??;
    let fallback = fallback_header(&head);
    if got < HEADER_LEN {
        let msg = format!("truncated frame header: {got} of {HEADER_LEN} bytes");
        metrics.refused(Status::MalformedFrame);
        send_error(wr, store, &fallback, &ReplyGuard::NONE, Status::MalformedFrame, &msg).await?;
        return Ok(Err(Next::Close));
    }
    let header = match FrameHeader::decode(&head) {
        Ok(h) => h,
        Err(e) => {
            let msg = match &e {
                DecodeError::Version(v) => {
                    format!("protocol version {v} unsupported; this drive speaks {VERSION_MIN}..={VERSION}")
                }
                other => format!("bad frame header: {other}"),
            };
            metrics.refused(header_error_status(&e));
            send_error(wr, store, &fallback, &ReplyGuard::NONE, header_error_status(&e), &msg).await?;
            return Ok(Err(Next::Close));
        }
    };
    if header.kind != Kind::Request {
        metrics.refused(Status::MalformedFrame);
        send_error(wr, store, &header, &ReplyGuard::NONE, Status::MalformedFrame, "expected a request frame").await?;
        return Ok(Err(Next::Close));
    }
    let mut frame = head.to_vec();
    frame.resize(HEADER_LEN + header.body_len(), 0);
    let got = timeout(frame_timeout, read_full(rd, &mut frame[HEADER_LEN..])).await.map_err(|_| timed_out())??;
    if got < header.body_len() {
        let msg = format!("truncated frame: {got} of {} bytes after the header", header.body_len());
        metrics.refused(Status::MalformedFrame);
        send_error(wr, store, &header, &ReplyGuard::NONE, Status::MalformedFrame, &msg).await?;
        return Ok(Err(Next::Close));
    }
    Ok(Ok((header, frame)))
}

async fn handle_frame(
    rd: &mut Reader,
    wr: &mut Writer,
    drive: &Arc<Drive>,
    config: &DriveConfig,
    state: &mut ConnState,
    peer: SocketAddr,
) -> std::io::Result<Next> {
    let frame_timeout = state.frame_timeout(config);
    let (header, frame) = match read_frame(rd, wr, drive, state.idle_timeout(config), frame_timeout).await? {
        Ok(f) => f,
        Err(next) => return Ok(next),
    };
    // What the drive logs while it handles the request carries the peer, the operation and the
    // request id of the frame (the client's, unique on its connection).
    let span = tracing::warn_span!(
        "request",
        %peer,
        op = crate::metrics::op_label(header.opcode),
        id = header.request_id,
        trace_id = tracing::field::Empty
    );
    handle_request(rd, wr, drive, config, state, header, frame, frame_timeout).instrument(span).await
}

/// Handles one request frame read whole (`handle_frame`).
#[allow(clippy::too_many_arguments)]
async fn handle_request(
    rd: &mut Reader,
    wr: &mut Writer,
    drive: &Arc<Drive>,
    config: &DriveConfig,
    state: &mut ConnState,
    header: FrameHeader,
    frame: Vec<u8>,
    frame_timeout: Duration,
) -> std::io::Result<Next> {
    let store = &drive.store;
    let started = Instant::now();
    let prefix = match FramePrefix::parse(&frame) {
        Ok(p) => {
            if let Some(trace) = &p.trace {
                tracing::Span::current().record("trace_id", trace.as_str());
            }
            p
        }
        Err(e) => {
            drive.metrics.request(header.opcode, e.status(), started.elapsed());
            send_error(wr, store, &header, &ReplyGuard::NONE, e.status(), &format!("bad frame: {e}")).await?;
            return Ok(Next::Close);
        }
    };
    let ctx = Ctx { drive, config, header: &header, frame_timeout, started };
    let before_digest = &frame[..frame.len() - DIGEST_LEN];
    let auth = match drive.security.authenticate(&header, prefix.capability, before_digest, &prefix.digest) {
        Ok(a) => a,
        Err(refusal) => return refuse(rd, wr, &ctx, None, None, &ReplyGuard::NONE, refusal).await,
    };
    let guard = ReplyGuard::of(&auth, &header, &prefix.digest);
    if let Err(refusal) = drive.security.check_fresh(&auth, &header) {
        return refuse(rd, wr, &ctx, Some(&auth), None, &guard, refusal).await;
    }
    // A fresh request under a key: the peer holds one.
    state.trusted |= auth.keys.is_some();
    let mut args = prefix.args.to_vec();
    if header.protection.covers(Protection::PRIVACY_ARGS) {
        if let Some(keys) = &auth.keys {
            keys.crypt_args(Kind::Request, &header.nonce, &mut args);
        }
    }
    let request = match Request::decode(header.opcode, &args) {
        Ok(r) => r,
        Err(e) => {
            let msg = format!("bad arguments for opcode {:#06x}: {e}", header.opcode);
            return refuse(rd, wr, &ctx, Some(&auth), None, &guard, (e.status(), msg)).await;
        }
    };
    let checked = check_data_len(&header, &request)
        .and_then(|()| check_extension(store, &request))
        .and_then(|()| drive.security.authorize(&auth, &request));
    let grant = match checked {
        Ok(g) => g,
        Err(refusal) => return refuse(rd, wr, &ctx, Some(&auth), Some(&request), &guard, refusal).await,
    };
    let (status, next) = execute(rd, wr, &ctx, &auth, grant, &guard, &prefix.digest, &request).await?;
    ctx.audit(Some(&auth), Some(&request), status);
    ctx.count(status);
    Ok(next)
}

/// Answers a refused request: reads past its data (at most
/// [`UNAUTHENTICATED_DRAIN_MAX`] bytes if it proved no key; with more, the
/// connection is closed after the reply), audits it, sends the refusal.
async fn refuse(
    rd: &mut Reader,
    wr: &mut Writer,
    ctx: &Ctx<'_>,
    auth: Option<&Authority>,
    request: Option<&Request>,
    guard: &ReplyGuard<'_>,
    (status, msg): (Status, String),
) -> std::io::Result<Next> {
    let proved_key = auth.is_some_and(|a| a.keys.is_some());
    let piece_timeout = if proved_key { ctx.config.frame_timeout } else { ctx.frame_timeout };
    let next = drain_data(rd, ctx.header, proved_key, piece_timeout).await?;
    ctx.audit(auth, request, status);
    send_error(wr, &ctx.drive.store, ctx.header, guard, status, &msg).await?;
    ctx.count(status);
    Ok(next)
}

impl Ctx<'_> {
    /// Counts the request in the drive's metrics once its reply is sent.
    fn count(&self, status: Status) {
        let elapsed = self.started.elapsed();
        self.drive.metrics.request(self.header.opcode, status, elapsed);
        tracing::debug!(status = %status, elapsed_us = elapsed.as_micros() as u64, "request done");
    }

    fn audit(&self, auth: Option<&Authority>, req: Option<&Request>, status: Status) {
        if self.header.opcode == nasd_proto::opcode::HELLO {
            return;
        }
        let (partition, object, region) = req.map(audit_target).unwrap_or((0, 0, Region { offset: 0, length: 0 }));
        let record = AuditRecord {
            sequence: 0,
            time_ns: self.drive.store.now_ns(),
            audit_id: auth.map_or(0, Authority::audit_id),
            key_type: self.header.key_type as u8,
            opcode: self.header.opcode,
            status: status as u16,
            partition,
            object,
            region,
        };
        // A refusal of a request that proved no key may come from anyone, as fast as the network
        // allows: itemized at a bounded rate, counted beyond it.
        let proved_no_key = auth.is_none_or(|a| a.keys.is_none());
        if proved_no_key && status != Status::Ok {
            self.drive.audit.record_unauthenticated_refusal(record);
        } else {
            self.drive.audit.record(record);
        }
    }
}

/// The status for a header that does not decode.
fn header_error_status(e: &DecodeError) -> Status {
    match e {
        DecodeError::Version(_) => Status::VersionUnsupported,
        DecodeError::OverLimit { .. } => Status::LimitExceeded,
        _ => Status::MalformedFrame,
    }
}

/// A header to answer with when the real one does not decode: request id and
/// opcode taken from their fixed offsets.
fn fallback_header(head: &[u8; HEADER_LEN]) -> FrameHeader {
    let opcode = u16::from_le_bytes([head[6], head[7]]);
    let request_id = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
    FrameHeader::request(opcode, request_id)
}

/// An `EXTENSION` call of an extension the drive lists (INQUIRY, open to
/// anyone, says the same): else `UNKNOWN_EXTENSION`, before any credential
/// is looked at.
fn check_extension(store: &Store, req: &Request) -> Result<(), (Status, String)> {
    match req {
        Request::Extension { name, .. } if !store.extensions().iter().any(|e| e == name) => Err((
            Status::UnknownExtension,
            format!("this drive has no extension {name:?} (INQUIRY lists those it has)"),
        )),
        _ => Ok(()),
    }
}

fn check_data_len(header: &FrameHeader, req: &Request) -> Result<(), (Status, String)> {
    let expected = match req {
        Request::Write { regions, .. } => {
            validate_regions(regions).map_err(|s| (s, format!("invalid regions: {}", s.name())))?
        }
        _ => 0,
    };
    if header.data_len != expected {
        let msg = format!("frame carries {} data bytes; the operation needs {expected}", header.data_len);
        return Err((Status::DataLengthMismatch, msg));
    }
    Ok(())
}

/// Reads and discards a request's data section through the connection's
/// buffer (no allocation), each piece within `piece_timeout`. A request that
/// proved no key is drained only up to [`UNAUTHENTICATED_DRAIN_MAX`] bytes:
/// beyond that nothing is read and the connection is to be closed.
async fn drain_data(
    rd: &mut Reader,
    header: &FrameHeader,
    proved_key: bool,
    piece_timeout: Duration,
) -> std::io::Result<Next> {
    let tags = header.chunk_count().saturating_mul(header.protection.data_tag_len() as u64);
    let left = header.data_len.saturating_add(tags);
    if !proved_key && left > UNAUTHENTICATED_DRAIN_MAX {
        return Ok(Next::Close);
    }
    skip(rd, left, piece_timeout).await?;
    Ok(Next::Continue)
}

/// Reads and discards `left` bytes through the connection's buffer, each
/// piece within `piece_timeout`.
async fn skip(rd: &mut Reader, mut left: u64, piece_timeout: Duration) -> std::io::Result<()> {
    while left > 0 {
        let held = timeout(piece_timeout, rd.fill_buf()).await.map_err(|_| timed_out())??;
        if held.is_empty() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "peer stopped sending its data"));
        }
        let n = held.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        rd.consume(n);
        left -= n as u64;
    }
    Ok(())
}

/// Runs an authorized request; returns the status it ended with.
#[allow(clippy::too_many_arguments)]
async fn execute(
    rd: &mut Reader,
    wr: &mut Writer,
    ctx: &Ctx<'_>,
    auth: &Authority,
    grant: Grant,
    guard: &ReplyGuard<'_>,
    request_digest: &[u8; DIGEST_LEN],
    request: &Request,
) -> std::io::Result<(Status, Next)> {
    let (drive, header) = (ctx.drive, ctx.header);
    let store = &drive.store;
    let result: Result<Reply, (Status, String)> = match request {
        Request::Write { partition, object, regions } => {
            let check = WriteCheck {
                append_only: grant.append_only,
                access_control_version: grant.access_control_version,
                pal: grant.pal,
            };
            let target = (*partition, *object, regions.clone(), check);
            return execute_write(rd, wr, ctx, auth, guard, request_digest, target).await;
        }
        Request::Read { partition, object, regions } => {
            return execute_read(wr, ctx, guard, *partition, *object, regions.clone()).await;
        }
        Request::Hello { min_version, max_version, .. } => {
            // The highest version both speak: a client of version 1 only gets 1.
            let chosen = VERSION.min(*max_version);
            if (*min_version).max(VERSION_MIN) <= chosen {
                Ok(Reply::Hello {
                    version: chosen,
                    drive_id: store.drive_id(),
                    chunk_len_max: CHUNK_LEN_MAX,
                    regions_max: REGIONS_MAX as u16,
                    block_size: store.block_size(),
                })
            } else {
                let msg = format!(
                    "no common version: client offers {min_version}..={max_version}, drive speaks {VERSION_MIN}..={VERSION}"
                );
                send_error(wr, store, header, guard, Status::VersionUnsupported, &msg).await?;
                return Ok((Status::VersionUnsupported, Next::Close));
            }
        }
        Request::Inquiry => {
            let info = store.info();
            Ok(Reply::Inquiry(DriveInfo {
                vendor: VENDOR.into(),
                model: MODEL.into(),
                firmware: env!("CARGO_PKG_VERSION").into(),
                drive_id: info.drive_id,
                block_size: info.block_size,
                capacity_bytes: info.capacity_bytes,
                used_bytes: info.used_bytes,
                partitions: info.partitions,
                extensions: store.extensions().to_vec(),
                failure_domain: ctx.config.failure_domain.clone(),
            }))
        }
        Request::Extension { partition, object, name, args } => {
            if name == nasd_proto::extension::PREFETCH {
                drive.prefetcher.call(auth, &grant, *partition, *object, args).map(|result| Reply::Extension { result })
            } else {
                Err((Status::UnknownExtension, format!("this drive does not implement extension {name:?}")))
            }
        }
        Request::ReadAudit { after, max } => {
            let (d, after, max) = (drive.clone(), *after, *max as usize);
            blocking(store.env(), move || d.audit.read(after, max))
                .await
                .map(|records| Reply::Audit { records })
                .map_err(|e| (Status::IoError, format!("audit trail: {e}")))
        }
        Request::Scrub { max_report } => {
            let (s, max) = (store.clone(), *max_report as usize);
            match blocking(store.env(), move || s.scrub()).await {
                Ok(report) => Ok(Reply::Scrub {
                    blocks_checked: report.blocks_checked,
                    corrupt_total: report.corrupt.len() as u64,
                    corrupt: report.corrupt.iter().take(max).map(|c| (c.partition, c.object, c.block)).collect(),
                }),
                Err(e) => Err((e.status(), e.to_string())),
            }
        }
        Request::GetAuthScheme { partition } => {
            if *partition == 0 {
                Err((Status::BadArguments, "partition 0 has no authorization scheme".to_string()))
            } else {
                Ok(Reply::AuthScheme(drive.security.scheme(*partition)))
            }
        }
        Request::SetDriveKey { .. }
        | Request::SetPartitionKey { .. }
        | Request::SetWorkingKey { .. }
        | Request::SetMinProtection { .. }
        | Request::SetIdentityKey { .. }
        | Request::RetireIdentityKey { .. }
        | Request::SetAuthScheme { .. } => {
            let (d, req) = (drive.clone(), request.clone());
            blocking(store.env(), move || d.security.manage(&req)).await.map(|()| Reply::Done)
        }
        Request::SetMapEpoch { partition, epoch } => {
            let (d, p, e) = (drive.clone(), *partition, *epoch);
            blocking(store.env(), move || d.security.set_map_epoch(p, e)).await.map(|()| Reply::Done)
        }
        Request::Initialize { clock_ns, clock_skew_ns, sealed_master_key } => {
            // Open the new master key before erasing anything.
            match drive.security.open_new_master(sealed_master_key) {
                Err(refusal) => Err(refusal),
                Ok(new_master) => {
                    let (d, clock, skew) = (drive.clone(), *clock_ns, *clock_skew_ns);
                    blocking(store.env(), move || match d.store.initialize(clock, skew) {
                        Ok(()) => d.security.reset(new_master).map(|()| Reply::Done),
                        Err(e) => Err((e.status(), e.to_string())),
                    })
                    .await
                }
            }
        }
        other => {
            let (d, req) = (drive.clone(), other.clone());
            blocking(store.env(), move || {
                let r = run_simple(&d.store, req.clone()).map_err(|e| (e.status(), e.to_string()));
                if let (Ok(_), Request::RemovePartition { partition, .. }) = (&r, req) {
                    if let Err(refusal) = d.security.forget_partition(partition) {
                        tracing::error!(partition, status = %refusal.0, "could not forget a removed partition's keys");
                    }
                }
                r
            })
            .await
        }
    };
    let status = match result {
        Ok(reply) => {
            send_reply(wr, store, header, guard, &reply).await?;
            Status::Ok
        }
        Err((status, msg)) => {
            send_error(wr, store, header, guard, status, &msg).await?;
            status
        }
    };
    Ok((status, Next::Continue))
}

/// Operations without a data section.
fn run_simple(store: &Store, request: Request) -> Result<Reply, StoreError> {
    #[cfg(feature = "fault-injection")]
    crate::tasks::fault::store_task(request.opcode());
    Ok(match request {
        Request::Create { partition, mask, attrs } => {
            let (object, attrs) = store.create(partition, mask, &attrs)?;
            Reply::Created { object, attrs }
        }
        Request::Remove { partition, object } => {
            store.remove(partition, object)?;
            Reply::Done
        }
        Request::GetAttr { partition, object } => Reply::Attrs(store.getattr(partition, object)?),
        Request::SetAttr { partition, object, mask, attrs } => {
            Reply::Attrs(store.setattr(partition, object, mask, &attrs)?)
        }
        Request::FastCopy { partition, source } => {
            let (object, attrs) = store.fastcopy(partition, source)?;
            Reply::Created { object, attrs }
        }
        Request::Flush { partition, objects } => {
            store.flush(partition, &objects)?;
            Reply::Done
        }
        Request::BlocksRequired { partition, object, regions } => {
            let (estimated, maximum) = store.blocks_required(partition, object, &regions)?;
            Reply::BlocksRequired { estimated, maximum }
        }
        Request::Extents { partition, object, offset, max } => {
            let (extents, covered_end) = store.extents(partition, object, offset, max as usize)?;
            Reply::Extents { covered_end, extents }
        }
        Request::Digests { partition, object, region } => {
            let (logical_size, digests) = store.block_digests(partition, object, region)?;
            Reply::Digests { logical_size, digests }
        }
        Request::CreatePartition { partition } => {
            store.create_partition(partition)?;
            Reply::Done
        }
        Request::RemovePartition { partition, force } => {
            store.remove_partition(partition, force)?;
            Reply::Done
        }
        Request::ResizePartition { partition, quota_bytes } => {
            store.resize_partition(partition, quota_bytes)?;
            Reply::Done
        }
        Request::FlushPartition { partition } => {
            store.flush_partition(partition)?;
            Reply::Done
        }
        Request::TxnBegin { partition, object, txn } => {
            store.txn_begin(partition, object, txn)?;
            Reply::Done
        }
        Request::TxnEnd { partition, object, txn, commit } => {
            Reply::TxnEnded { was_open: store.txn_end(partition, object, txn, commit)? }
        }
        Request::TxnList { partition, after_object, max } => {
            Reply::Txns { txns: store.txn_list(partition, after_object, max as usize)? }
        }
        // A PAL change is durable when it returns, like a key change: a
        // revocation by PAL must not come undone in a crash.
        Request::SetPal { partition, object, pal } => {
            store.set_pal(partition, object, pal)?;
            store.commit()?;
            Reply::Done
        }
        Request::GetPal { partition, object } => {
            let view = store.pal_view(partition, object)?;
            Reply::Pal(view.access.map(|a| (*a).clone()).unwrap_or_default())
        }
        Request::SetSuperPal { partition, collection, pal } => {
            store.set_super_pal(partition, collection, pal)?;
            store.commit()?;
            Reply::Done
        }
        Request::GetSuperPal { partition, collection } => {
            Reply::SuperPal(store.super_pal(partition, collection)?.map(|p| (*p).clone()).unwrap_or_default())
        }
        Request::Hello { .. }
        | Request::Inquiry
        | Request::Read { .. }
        | Request::Write { .. }
        | Request::Initialize { .. }
        | Request::SetDriveKey { .. }
        | Request::SetPartitionKey { .. }
        | Request::SetWorkingKey { .. }
        | Request::SetMinProtection { .. }
        | Request::SetMapEpoch { .. }
        | Request::ReadAudit { .. }
        | Request::Scrub { .. }
        | Request::GetAuthScheme { .. }
        | Request::SetIdentityKey { .. }
        | Request::RetireIdentityKey { .. }
        | Request::Extension { .. }
        | Request::SetAuthScheme { .. } => unreachable!("handled by execute"),
    })
}

/// Feeds a store write from chunks received over a channel.
struct ChannelSource {
    env: nasd_env::Env,
    rx: mpsc::Receiver<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
}

impl DataSource for ChannelSource {
    fn fill(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            if self.pos == self.current.len() {
                self.current = self.env.recv_blocking(&mut self.rx).ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "client stopped sending write data")
                })?;
                self.pos = 0;
            }
            let n = (buf.len() - done).min(self.current.len() - self.pos);
            buf[done..done + n].copy_from_slice(&self.current[self.pos..self.pos + n]);
            done += n;
            self.pos += n;
        }
        if self.pos == self.current.len() {
            // A write waiting for its next chunk holds none.
            (self.current, self.pos) = (Vec::new(), 0);
        }
        Ok(())
    }
}

/// An empty read chunk with room for the chunk and its tag, so that both go
/// out in one write.
fn chunk_buffer(chunk_len: usize) -> Vec<u8> {
    Vec::with_capacity(chunk_len + DATA_TAG_LEN)
}

enum ReadMsg {
    /// The per-region lengths, the protected reply prefix, and the per-byte
    /// data protector (when the sink does not compute Hash-and-MAC tags).
    Start(Vec<u64>, Vec<u8>, Option<nasd_crypto::DataProtector>),
    /// A chunk, with its Hash-and-MAC tag when the sink computes tags.
    Chunk(Vec<u8>, Option<nasd_crypto::MacValue>),
}

/// What the reader needs to build a read's reply prefix as soon as the
/// lengths are known, without a round trip to the connection task.
struct ReplyPlan {
    /// The reply header; data and chunk lengths are filled in at start.
    header: FrameHeader,
    keys: Option<FrameKeys>,
    key_type: KeyType,
    protection: Protection,
    request_digest: [u8; DIGEST_LEN],
    regions: Vec<Region>,
    block_size: u32,
}

/// Collects a store read into frame-sized chunks and sends them on. Under
/// Hash-and-MAC it also computes each chunk's tag, using stored digests for
/// whole blocks that fit in the chunk and hashing the other units. A whole
/// block that straddles chunks is hashed and checked against its stored
/// digest before any chunk holding its bytes is sent: the store does not
/// check whole blocks under Hash-and-MAC (their digests travel), but this
/// one's does not, so the drive is the last place its rot can be caught.
struct ChannelSink {
    env: nasd_env::Env,
    tx: mpsc::Sender<ReadMsg>,
    buf: Vec<u8>,
    chunk_len: usize,
    plan: ReplyPlan,
    unit_mac: Option<UnitMac>,
    /// Tags of the chunks that end inside a straddling block, held until the
    /// block checks (at most BLOCK_SIZE_MAX / CHUNK_LEN_MIN + 1).
    cuts: Vec<(usize, nasd_crypto::MacValue)>,
}

impl ChannelSink {
    fn send(&self, msg: ReadMsg) -> std::io::Result<()> {
        self.env
            .send_blocking(&self.tx, msg)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "connection stopped taking read data"))
    }
    fn flush_chunk(&mut self) -> std::io::Result<()> {
        let tag = self.unit_mac.as_ref().map(UnitMac::tag);
        self.send_chunk(tag)
    }
    fn send_chunk(&mut self, tag: Option<nasd_crypto::MacValue>) -> std::io::Result<()> {
        let full = std::mem::replace(&mut self.buf, chunk_buffer(self.chunk_len));
        self.send(ReadMsg::Chunk(full, tag))
    }
    /// Appends bytes whose units are hashed (partial blocks, or no Hash-and-MAC).
    fn hashed(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let n = bytes.len().min(self.chunk_len - self.buf.len());
            if let Some(um) = self.unit_mac.as_mut() {
                um.absorb(&bytes[..n]);
            }
            self.buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.buf.len() == self.chunk_len {
                self.flush_chunk()?;
            }
        }
        Ok(())
    }
    /// A whole block (one unit) whose stored digest is `stored` and which
    /// does not fit in the current chunk: hashed in one pass, taking the tag
    /// at each chunk end inside it, then checked against `stored` in
    /// constant time; only if it matches do its chunks go out. A block that
    /// does not match is never vouched for: the read ends with
    /// [`nasd_crypto::StoredDigestMismatch`], which the store reports as
    /// `DATA_CORRUPTED` (logged, audited), and nothing of the block is sent.
    fn straddling_block(&mut self, bytes: &[u8], stored: &nasd_crypto::BlockDigest) -> std::io::Result<()> {
        let um = self.unit_mac.as_mut().expect("only under Hash-and-MAC");
        self.cuts.clear();
        let (mut pos, mut room) = (0, self.chunk_len - self.buf.len());
        while bytes.len() - pos > room {
            um.absorb(&bytes[pos..pos + room]);
            pos += room;
            self.cuts.push((pos, um.tag()));
            room = self.chunk_len;
        }
        if let Err(mismatch) = um.absorb_unit_end_checked(&bytes[pos..], stored) {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, mismatch));
        }
        let mut start = 0;
        for i in 0..self.cuts.len() {
            let (end, tag) = self.cuts[i];
            self.buf.extend_from_slice(&bytes[start..end]);
            self.send_chunk(Some(tag))?;
            start = end;
        }
        self.buf.extend_from_slice(&bytes[start..]);
        if self.buf.len() == self.chunk_len {
            self.flush_chunk()?;
        }
        Ok(())
    }
    fn finish(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.flush_chunk()?;
        }
        Ok(())
    }
}

impl DataSink for ChannelSink {
    fn start(&mut self, lengths: &[u64]) -> std::io::Result<()> {
        let plan = &mut self.plan;
        let total: u64 = lengths.iter().sum();
        plan.header.data_len = total;
        plan.header.chunk_len = if total > 0 { self.chunk_len as u32 } else { 0 };
        let guard = ReplyGuard {
            keys: plan.keys.as_ref(),
            key_type: plan.key_type,
            protection: plan.protection,
            request_digest: plan.request_digest,
        };
        let (prefix, digest) =
            protected_prefix(&plan.header, &guard, Reply::Read { lengths: lengths.to_vec() }.encode());
        let mut protector = None;
        if let Some(keys) = &plan.keys {
            if plan.protection.covers(Protection::HASH_AND_MAC) {
                let units = nasd_crypto::Units::of_read(&plan.regions, lengths, plan.block_size);
                self.unit_mac = Some(keys.unit_mac(&digest, units));
            } else {
                protector = Some(keys.data(Kind::Reply, &plan.header.nonce, plan.protection, &digest));
            }
        }
        self.send(ReadMsg::Start(lengths.to_vec(), prefix, protector))
    }
    fn data(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.unit(bytes, None)
    }
    fn unit(&mut self, bytes: &[u8], stored: Option<&nasd_crypto::BlockDigest>) -> std::io::Result<()> {
        let (Some(um), Some(d)) = (self.unit_mac.as_mut(), stored) else {
            return self.hashed(bytes);
        };
        assert!(um.at_whole_unit(bytes.len() as u64), "a block with a stored digest is one whole unit");
        if self.buf.len() + bytes.len() > self.chunk_len {
            return self.straddling_block(bytes, d);
        }
        um.absorb_digest(bytes.len() as u64, d);
        self.buf.extend_from_slice(bytes);
        if self.buf.len() == self.chunk_len {
            self.flush_chunk()?;
        }
        Ok(())
    }
}

/// A write's store task and the channel feeding it.
struct StoreWrite {
    tx: mpsc::Sender<Vec<u8>>,
    task: tokio::task::JoinHandle<Result<u64, StoreError>>,
}

/// What a write writes: partition, object, regions, and what the object
/// must still be when the write installs (checked under its lock).
type WriteTarget = (u64, u64, Vec<Region>, WriteCheck);

impl StoreWrite {
    fn start(store: Arc<Store>, (partition, object, regions, check): WriteTarget) -> StoreWrite {
        let (tx, rx) = mpsc::channel::<Vec<u8>>(TRANSFER_CHUNKS_MAX);
        let env = store.env().clone();
        let task = env.clone().spawn_blocking(move || {
            let mut source = ChannelSource { env, rx, current: Vec::new(), pos: 0 };
            store.write_checked(partition, object, &regions, &mut source, check)
        });
        StoreWrite { tx, task }
    }

    /// Ends the feed and waits for the store's result.
    async fn finish(self) -> Result<u64, StoreError> {
        drop(self.tx);
        join(self.task).await
    }
}

/// Waits for a data chunk's first bytes; then, for the first chunk, for
/// the transfer's share of [`crate::TRANSFER_MEMORY_MAX`]; then allocates
/// the chunk and reads it and its tag. A peer that announces data and sends
/// none costs no memory and no store task.
async fn read_chunk(
    rd: &mut Reader,
    ctx: &Ctx<'_>,
    index: u64,
    tag: &mut [u8],
    memory: &mut Option<tokio::sync::OwnedSemaphorePermit>,
) -> std::io::Result<Vec<u8>> {
    let (header, frame_timeout) = (ctx.header, ctx.config.frame_timeout);
    if timeout(frame_timeout, rd.fill_buf()).await.map_err(|_| timed_out())??.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "peer stopped sending write data"));
    }
    if memory.is_none() {
        let need = transfer_memory(header.chunk_len, header.data_len, ctx.drive.store.block_size());
        *memory = Some(ctx.drive.transfer_memory(need).await);
    }
    let mut chunk = vec![0u8; header.chunk_size(index) as usize];
    let read = async {
        rd.read_exact(&mut chunk).await?;
        rd.read_exact(tag).await
    };
    timeout(frame_timeout, read).await.map_err(|_| timed_out())??;
    Ok(chunk)
}

/// Memory a transfer of `data_len` bytes in `chunk_len`-byte chunks holds at
/// most (see [`crate::TRANSFER_MEMORY_MAX`]).
fn transfer_memory(chunk_len: u32, data_len: u64, block_size: u32) -> usize {
    let chunk = (chunk_len as u64).min(data_len) as usize + DATA_TAG_LEN;
    (TRANSFER_CHUNKS_MAX + 2) * chunk + block_size as usize
}

/// Receives a write's data chunk by chunk, checking each tag before the
/// chunk reaches the store; the store task starts with the first checked
/// chunk (at once for a write without data).
async fn execute_write(
    rd: &mut Reader,
    wr: &mut Writer,
    ctx: &Ctx<'_>,
    auth: &Authority,
    guard: &ReplyGuard<'_>,
    request_digest: &[u8; DIGEST_LEN],
    target: WriteTarget,
) -> std::io::Result<(Status, Next)> {
    let (store, header) = (&ctx.drive.store, ctx.header);
    let mut checker =
        auth.keys.as_ref().map(|k| k.data(Kind::Request, &header.nonce, header.protection, request_digest));
    let mut tag = vec![0u8; header.protection.data_tag_len()];
    let (mut target, mut writing, mut memory) = (Some(target), None, None);
    let (mut tag_failed, mut socket_error) = (false, None);
    let mut rest = 0; // data and tags after the chunk at which feeding stopped
    for index in 0..header.chunk_count() {
        let mut chunk = match read_chunk(rd, ctx, index, &mut tag, &mut memory).await {
            Ok(c) => c,
            Err(e) => {
                socket_error = Some(e);
                break;
            }
        };
        let after = header.data_len - header.chunk_size(index) as u64 - index * header.chunk_len as u64;
        rest = after + (header.chunk_count() - index - 1) * tag.len() as u64;
        if checker.as_mut().is_some_and(|c| c.open_chunk(&mut chunk, &tag).is_err()) {
            // Stop feeding the store: the write aborts and changes nothing.
            tag_failed = true;
            break;
        }
        pace(ctx, chunk.len()).await;
        let w = writing.get_or_insert_with(|| StoreWrite::start(store.clone(), target.take().expect("once")));
        if w.tx.send(chunk).await.is_err() {
            break; // the store stopped early (e.g. quota)
        }
        rest = 0;
    }
    if writing.is_none() && !tag_failed && socket_error.is_none() {
        writing = Some(StoreWrite::start(store.clone(), target.take().expect("not started")));
    }
    let result = match writing {
        Some(w) => Some(w.finish().await),
        None => None,
    };
    // The rest of a write that stopped early is read past with neither memory nor store task.
    drop(memory);
    if socket_error.is_none() && rest > 0 {
        socket_error = skip(rd, rest, ctx.config.frame_timeout).await.err();
    }
    if let Some(e) = socket_error {
        return Err(e);
    }
    if tag_failed {
        debug_assert!(!matches!(result, Some(Ok(_))), "a write whose data failed its tag must not complete");
        let msg = "a data chunk failed its tag: data changed in flight; nothing was written";
        send_error(wr, store, header, guard, Status::BadDataTag, msg).await?;
        return Ok((Status::BadDataTag, Next::Continue));
    }
    let status = match result.expect("started unless a tag failed or the socket broke") {
        Ok(length) => {
            ctx.drive.metrics.written_bytes(length);
            send_reply(wr, store, header, guard, &Reply::Written { length }).await?;
            Status::Ok
        }
        Err(e) => {
            send_error(wr, store, header, guard, e.status(), &e.to_string()).await?;
            e.status()
        }
    };
    Ok((status, Next::Continue))
}

async fn execute_read(
    wr: &mut Writer,
    ctx: &Ctx<'_>,
    guard: &ReplyGuard<'_>,
    partition: u64,
    object: u64,
    regions: Vec<Region>,
) -> std::io::Result<(Status, Next)> {
    let (store, header) = (&ctx.drive.store, ctx.header);
    let chunk_len = ctx.config.reply_chunk_len(store.block_size()) as usize;
    let hash_and_mac = guard.keys.is_some() && guard.protection.covers(Protection::HASH_AND_MAC);
    let (tx, mut rx) = mpsc::channel::<ReadMsg>(TRANSFER_CHUNKS_MAX);
    let s = store.clone();
    let plan = ReplyPlan {
        header: reply_header(store, header, guard, Status::Ok),
        keys: guard.keys.cloned(),
        key_type: guard.key_type,
        protection: guard.protection,
        request_digest: guard.request_digest,
        regions: regions.clone(),
        block_size: store.block_size(),
    };
    // Under Hash-and-MAC the client checks every block's digest itself.
    let verify = s.verifies_reads() && !hash_and_mac;
    let wanted = regions.iter().fold(0u64, |sum, r| sum.saturating_add(r.length));
    let _memory = ctx.drive.transfer_memory(transfer_memory(chunk_len as u32, wanted, store.block_size())).await;
    let task = store.env().spawn_blocking(move || {
        let mut sink = ChannelSink {
            env: s.env().clone(),
            tx,
            buf: chunk_buffer(chunk_len),
            chunk_len,
            plan,
            unit_mac: None,
            cuts: Vec::new(),
        };
        s.read_with(partition, object, &regions, &mut sink, verify)?;
        sink.finish().map_err(StoreError::Sink)
    });
    let failed = join::<Result<(), StoreError>>;
    let Some(ReadMsg::Start(lengths, prefix, mut protector)) = rx.recv().await else {
        drop(rx);
        let e = failed(task).await.err().unwrap_or_else(|| StoreError::Corrupt("read produced no lengths".into()));
        send_error(wr, store, header, guard, e.status(), &e.to_string()).await?;
        return Ok((e.status(), Next::Continue));
    };
    let total: u64 = lengths.iter().sum();
    // Hold the reply header until the first chunk is read and verified, so a
    // failure in the first chunk still gets its own status.
    let first = if total > 0 { rx.recv().await } else { None };
    if total > 0 && !matches!(first, Some(ReadMsg::Chunk(..))) {
        drop(rx);
        let e = failed(task).await.err().unwrap_or_else(|| StoreError::Corrupt("read ended early".into()));
        send_error(wr, store, header, guard, e.status(), &e.to_string()).await?;
        return Ok((e.status(), Next::Continue));
    }
    let sending = async {
        wr.write_all(&prefix).await?;
        let mut sent = 0u64;
        let mut next = first;
        while let Some(ReadMsg::Chunk(mut bytes, unit_tag)) = next {
            let n = bytes.len();
            pace(ctx, n).await;
            // The tag goes out in the same write as its chunk.
            match (&mut protector, unit_tag) {
                (_, Some(t)) => bytes.extend_from_slice(&t),
                (Some(p), None) => {
                    let tag = p.seal_chunk(&mut bytes);
                    bytes.extend_from_slice(&tag);
                }
                (None, None) => {}
            }
            wr.write_all(&bytes).await?;
            ctx.drive.metrics.read_bytes(n as u64);
            sent += n as u64;
            next = if sent < total { rx.recv().await } else { None };
        }
        wr.flush().await.map(|()| sent)
    };
    let sent = match sending.await {
        Ok(sent) => sent,
        Err(e) => {
            // The peer is gone or stopped taking data (send deadline): the
            // store task ends at its next chunk, unpinning its blocks.
            drop(rx);
            let _ = failed(task).await;
            return Err(e);
        }
    };
    if sent < total {
        // The reply promised more data than the store could deliver: the only
        // honest signal left is to cut the connection.
        drop(rx);
        let e = failed(task).await.err();
        tracing::error!(error = ?e, sent, total, "read failed after its reply started; closing connection");
        return Ok((e.map_or(Status::Internal, |e| e.status()), Next::Close));
    }
    drop(rx);
    if let Err(e) = failed(task).await {
        tracing::error!(error = %e, "read task failed after all data was sent");
    }
    Ok((Status::Ok, Next::Continue))
}

/// Waits until the drive's throttle (emulated slow media) lets `bytes` more
/// data bytes move between the store and the network; at once without one.
async fn pace(ctx: &Ctx<'_>, bytes: usize) {
    if let Some(t) = &ctx.drive.throttle {
        t.pace(bytes as u64).await;
    }
}

fn reply_nonce(store: &Store) -> [u8; NONCE_LEN] {
    nasd_proto::nonce(store.nonce_now_ns(), REPLY_SEQUENCE.fetch_add(1, Ordering::Relaxed))
}

fn reply_header(store: &Store, request: &FrameHeader, guard: &ReplyGuard<'_>, status: Status) -> FrameHeader {
    let mut h = FrameHeader::reply_to(request, status);
    h.version = VERSION;
    h.key_type = guard.key_type;
    h.protection = guard.protection;
    h.nonce = reply_nonce(store);
    h
}

/// Encodes a reply prefix under the guard's protection: arguments encrypted
/// under PRIVACY_ARGS, digest over every byte before it. Returns the bytes and the digest.
fn protected_prefix(h: &FrameHeader, guard: &ReplyGuard<'_>, mut args: Vec<u8>) -> (Vec<u8>, [u8; DIGEST_LEN]) {
    let Some(keys) = guard.keys else {
        return (FramePrefix::encode(h, &[], &args, &[0u8; DIGEST_LEN]), [0u8; DIGEST_LEN]);
    };
    if guard.protection.covers(Protection::PRIVACY_ARGS) {
        keys.crypt_args(Kind::Reply, &h.nonce, &mut args);
    }
    let mut bytes = FramePrefix::encode(h, &[], &args, &[0u8; DIGEST_LEN]);
    let split = bytes.len() - DIGEST_LEN;
    let digest = keys.reply_digest(guard.protection, &guard.request_digest, &bytes[..split]);
    bytes[split..].copy_from_slice(&digest);
    (bytes, digest)
}

async fn send_reply(
    wr: &mut Writer,
    store: &Store,
    request: &FrameHeader,
    guard: &ReplyGuard<'_>,
    reply: &Reply,
) -> std::io::Result<()> {
    let h = reply_header(store, request, guard, Status::Ok);
    wr.write_all(&protected_prefix(&h, guard, reply.encode()).0).await?;
    wr.flush().await
}

async fn send_error(
    wr: &mut Writer,
    store: &Store,
    request: &FrameHeader,
    guard: &ReplyGuard<'_>,
    status: Status,
    message: &str,
) -> std::io::Result<()> {
    debug_assert!(status != Status::Ok);
    let h = reply_header(store, request, guard, status);
    // (`detail`: a field named `message` would hide the event's own in JSON lines.)
    tracing::debug!(status = %status, detail = message, "request refused");
    wr.write_all(&protected_prefix(&h, guard, encode_error_message(message)).0).await?;
    wr.flush().await
}
