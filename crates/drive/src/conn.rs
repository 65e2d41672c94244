//! One client connection: frame in, operation, frame out.

use crate::{DriveConfig, FRAME_TIMEOUT, IDLE_TIMEOUT, MODEL, TRANSFER_CHUNKS_MAX, VENDOR};
use nasd_proto::limits::{CHUNK_LEN_MAX, DIGEST_LEN, HEADER_LEN, REGIONS_MAX};
use nasd_proto::{
    encode_error_message, validate_regions, DecodeError, DriveInfo, FrameHeader, FramePrefix, KeyType, Kind,
    Protection, Reply, Request, Status, VERSION, VERSION_MIN,
};
use nasd_store::{DataSink, DataSource, Store, StoreError};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::timeout;

/// What to do with the connection after a frame.
enum Next {
    Continue,
    Close,
}

type Reader = BufReader<tokio::net::tcp::OwnedReadHalf>;
type Writer = BufWriter<tokio::net::tcp::OwnedWriteHalf>;

static REPLY_SEQUENCE: AtomicU64 = AtomicU64::new(0);

pub(crate) async fn serve_connection(socket: TcpStream, peer: SocketAddr, store: Arc<Store>, config: Arc<DriveConfig>) {
    let _ = socket.set_nodelay(true);
    let (rd, wr) = socket.into_split();
    let mut rd = BufReader::with_capacity(256 * 1024, rd);
    let mut wr = BufWriter::with_capacity(256 * 1024, wr);
    tracing::debug!(%peer, "connection opened");
    loop {
        match handle_frame(&mut rd, &mut wr, &store, &config).await {
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

async fn handle_frame(rd: &mut Reader, wr: &mut Writer, store: &Arc<Store>, config: &DriveConfig) -> std::io::Result<Next> {
    let mut head = [0u8; HEADER_LEN];
    // Idle time is allowed before a frame starts; once it has started, the
    // rest must arrive within FRAME_TIMEOUT.
    let first = timeout(IDLE_TIMEOUT, read_full(rd, &mut head[..1])).await.map_err(|_| timed_out())??;
    if first == 0 {
        return Ok(Next::Close);
    }
    let got = 1 + timeout(FRAME_TIMEOUT, read_full(rd, &mut head[1..])).await.map_err(|_| timed_out())??;
    let fallback = fallback_header(&head);
    if got < HEADER_LEN {
        let msg = format!("truncated frame header: {got} of {HEADER_LEN} bytes");
        send_error(wr, store, &fallback, Status::MalformedFrame, &msg).await?;
        return Ok(Next::Close);
    }
    let header = match FrameHeader::decode(&head) {
        Ok(h) => h,
        Err(e) => {
            let msg = match &e {
                DecodeError::Version(v) => format!("protocol version {v} unsupported; this drive speaks {VERSION_MIN}..={VERSION}"),
                other => format!("bad frame header: {other}"),
            };
            send_error(wr, store, &fallback, header_error_status(&e), &msg).await?;
            return Ok(Next::Close);
        }
    };
    if header.kind != Kind::Request {
        send_error(wr, store, &header, Status::MalformedFrame, "expected a request frame").await?;
        return Ok(Next::Close);
    }
    let mut body = vec![0u8; header.body_len()];
    let got = timeout(FRAME_TIMEOUT, read_full(rd, &mut body)).await.map_err(|_| timed_out())??;
    if got < body.len() {
        let msg = format!("truncated frame: {got} of {} bytes after the header", body.len());
        send_error(wr, store, &header, Status::MalformedFrame, &msg).await?;
        return Ok(Next::Close);
    }
    let mut frame = head.to_vec();
    frame.extend_from_slice(&body);
    let prefix = match FramePrefix::parse(&frame) {
        Ok(p) => p,
        Err(e) => {
            send_error(wr, store, &header, e.status(), &format!("bad frame: {e}")).await?;
            return Ok(Next::Close);
        }
    };
    if header.key_type != KeyType::None || header.protection != Protection::NONE || !prefix.capability.is_empty() {
        drain_data(rd, &header).await?;
        let msg = "this drive accepts only unprotected requests (key type NONE, protection NONE, no capability)";
        send_error(wr, store, &header, Status::ProtectionUnsupported, msg).await?;
        return Ok(Next::Continue);
    }
    let request = match Request::decode(header.opcode, prefix.args) {
        Ok(r) => r,
        Err(e) => {
            drain_data(rd, &header).await?;
            send_error(wr, store, &header, e.status(), &format!("bad arguments for opcode {:#06x}: {e}", header.opcode)).await?;
            return Ok(Next::Continue);
        }
    };
    let expected = match expected_data_len(&request) {
        Ok(n) => n,
        Err(status) => {
            drain_data(rd, &header).await?;
            send_error(wr, store, &header, status, &format!("invalid regions: {}", status.name())).await?;
            return Ok(Next::Continue);
        }
    };
    if header.data_len != expected {
        drain_data(rd, &header).await?;
        let msg = format!("frame carries {} data bytes; the operation needs {expected}", header.data_len);
        send_error(wr, store, &header, Status::DataLengthMismatch, &msg).await?;
        return Ok(Next::Continue);
    }
    execute(rd, wr, store, config, &header, request).await
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

fn expected_data_len(req: &Request) -> Result<u64, Status> {
    match req {
        Request::Write { regions, .. } => validate_regions(regions),
        _ => Ok(0),
    }
}

/// Reads and discards a request's data section.
async fn drain_data(rd: &mut Reader, header: &FrameHeader) -> std::io::Result<()> {
    let mut left = header.data_len + header.chunk_count() * header.protection.data_tag_len() as u64;
    let mut sink = vec![0u8; 64 * 1024];
    while left > 0 {
        let n = left.min(sink.len() as u64) as usize;
        timeout(FRAME_TIMEOUT, rd.read_exact(&mut sink[..n])).await.map_err(|_| timed_out())??;
        left -= n as u64;
    }
    Ok(())
}

async fn execute(
    rd: &mut Reader,
    wr: &mut Writer,
    store: &Arc<Store>,
    config: &DriveConfig,
    header: &FrameHeader,
    request: Request,
) -> std::io::Result<Next> {
    match request {
        Request::Write { partition, object, regions } => execute_write(rd, wr, store, header, partition, object, regions).await,
        Request::Read { partition, object, regions } => execute_read(wr, store, config, header, partition, object, regions).await,
        Request::Hello { min_version, max_version, .. } => {
            if min_version <= VERSION && VERSION <= max_version && VERSION_MIN <= max_version {
                let reply = Reply::Hello {
                    version: VERSION,
                    drive_id: store.drive_id(),
                    chunk_len_max: CHUNK_LEN_MAX,
                    regions_max: REGIONS_MAX as u16,
                };
                send_reply(wr, store, header, &reply).await?;
                Ok(Next::Continue)
            } else {
                let msg = format!("no common version: client offers {min_version}..={max_version}, drive speaks {VERSION_MIN}..={VERSION}");
                send_error(wr, store, header, Status::VersionUnsupported, &msg).await?;
                Ok(Next::Close)
            }
        }
        Request::Inquiry => {
            let info = store.info();
            let reply = Reply::Inquiry(DriveInfo {
                vendor: VENDOR.into(),
                model: MODEL.into(),
                firmware: env!("CARGO_PKG_VERSION").into(),
                drive_id: info.drive_id,
                block_size: info.block_size,
                capacity_bytes: info.capacity_bytes,
                used_bytes: info.used_bytes,
                partitions: info.partitions,
                extensions: Vec::new(),
            });
            send_reply(wr, store, header, &reply).await?;
            Ok(Next::Continue)
        }
        other => {
            let s = store.clone();
            let result = tokio::task::spawn_blocking(move || run_simple(&s, other))
                .await
                .unwrap_or_else(|e| Err(StoreError::Corrupt(format!("operation task failed: {e}"))));
            match result {
                Ok(reply) => send_reply(wr, store, header, &reply).await?,
                Err(e) => send_store_error(wr, store, header, &e).await?,
            }
            Ok(Next::Continue)
        }
    }
}

/// Operations without a data section.
fn run_simple(store: &Store, request: Request) -> Result<Reply, StoreError> {
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
        Request::SetAttr { partition, object, mask, attrs } => Reply::Attrs(store.setattr(partition, object, mask, &attrs)?),
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
        Request::Initialize { clock_ns, clock_skew_ns } => {
            store.initialize(clock_ns, clock_skew_ns)?;
            Reply::Done
        }
        Request::Hello { .. } | Request::Inquiry | Request::Read { .. } | Request::Write { .. } => {
            unreachable!("handled by execute")
        }
    })
}

/// Feeds a store write from chunks received over a channel.
struct ChannelSource {
    rx: mpsc::Receiver<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
}

impl DataSource for ChannelSource {
    fn fill(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            if self.pos == self.current.len() {
                self.current = self.rx.blocking_recv().ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "client stopped sending write data")
                })?;
                self.pos = 0;
            }
            let n = (buf.len() - done).min(self.current.len() - self.pos);
            buf[done..done + n].copy_from_slice(&self.current[self.pos..self.pos + n]);
            done += n;
            self.pos += n;
        }
        Ok(())
    }
}

async fn execute_write(
    rd: &mut Reader,
    wr: &mut Writer,
    store: &Arc<Store>,
    header: &FrameHeader,
    partition: u64,
    object: u64,
    regions: Vec<nasd_proto::Region>,
) -> std::io::Result<Next> {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(TRANSFER_CHUNKS_MAX);
    let s = store.clone();
    let task = tokio::task::spawn_blocking(move || {
        let mut source = ChannelSource { rx, current: Vec::new(), pos: 0 };
        s.write(partition, object, &regions, &mut source)
    });
    let mut feeding = true;
    let mut socket_error = None;
    for index in 0..header.chunk_count() {
        let mut chunk = vec![0u8; header.chunk_size(index) as usize];
        match timeout(FRAME_TIMEOUT, rd.read_exact(&mut chunk)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                socket_error = Some(e);
                break;
            }
            Err(_) => {
                socket_error = Some(timed_out());
                break;
            }
        }
        if feeding && tx.send(chunk).await.is_err() {
            feeding = false; // the store stopped early (e.g. quota); keep draining the socket
        }
    }
    drop(tx);
    let result = task.await.unwrap_or_else(|e| Err(StoreError::Corrupt(format!("write task failed: {e}"))));
    if let Some(e) = socket_error {
        debug_assert!(result.is_err() || header.data_len == 0);
        return Err(e);
    }
    match result {
        Ok(length) => send_reply(wr, store, header, &Reply::Written { length }).await?,
        Err(e) => send_store_error(wr, store, header, &e).await?,
    }
    Ok(Next::Continue)
}

enum ReadMsg {
    Start(Vec<u64>),
    Chunk(Vec<u8>),
}

/// Collects a store read into frame-sized chunks and sends them on.
struct ChannelSink {
    tx: mpsc::Sender<ReadMsg>,
    buf: Vec<u8>,
    chunk_len: usize,
}

impl ChannelSink {
    fn send(&self, msg: ReadMsg) -> std::io::Result<()> {
        self.tx
            .blocking_send(msg)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "connection stopped taking read data"))
    }
    fn finish(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let last = std::mem::take(&mut self.buf);
            self.send(ReadMsg::Chunk(last))?;
        }
        Ok(())
    }
}

impl DataSink for ChannelSink {
    fn start(&mut self, lengths: &[u64]) -> std::io::Result<()> {
        self.send(ReadMsg::Start(lengths.to_vec()))
    }
    fn data(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let n = bytes.len().min(self.chunk_len - self.buf.len());
            self.buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.buf.len() == self.chunk_len {
                let full = std::mem::replace(&mut self.buf, Vec::with_capacity(self.chunk_len));
                self.send(ReadMsg::Chunk(full))?;
            }
        }
        Ok(())
    }
}

async fn execute_read(
    wr: &mut Writer,
    store: &Arc<Store>,
    config: &DriveConfig,
    header: &FrameHeader,
    partition: u64,
    object: u64,
    regions: Vec<nasd_proto::Region>,
) -> std::io::Result<Next> {
    let chunk_len = config.chunk_len as usize;
    let (tx, mut rx) = mpsc::channel::<ReadMsg>(TRANSFER_CHUNKS_MAX);
    let s = store.clone();
    let task = tokio::task::spawn_blocking(move || {
        let mut sink = ChannelSink { tx, buf: Vec::with_capacity(chunk_len), chunk_len };
        s.read(partition, object, &regions, &mut sink)?;
        sink.finish().map_err(StoreError::Sink)
    });
    let failed = |task: tokio::task::JoinHandle<Result<(), StoreError>>| async move {
        task.await.unwrap_or_else(|e| Err(StoreError::Corrupt(format!("read task failed: {e}"))))
    };
    let Some(ReadMsg::Start(lengths)) = rx.recv().await else {
        drop(rx);
        let e = failed(task).await.err().unwrap_or_else(|| StoreError::Corrupt("read produced no lengths".into()));
        send_store_error(wr, store, header, &e).await?;
        return Ok(Next::Continue);
    };
    let total: u64 = lengths.iter().sum();
    // Hold the reply header until the first chunk is read and verified, so a
    // failure in the first chunk still gets its own status.
    let first = if total > 0 { rx.recv().await } else { None };
    if total > 0 && !matches!(first, Some(ReadMsg::Chunk(_))) {
        drop(rx);
        let e = failed(task).await.err().unwrap_or_else(|| StoreError::Corrupt("read ended early".into()));
        send_store_error(wr, store, header, &e).await?;
        return Ok(Next::Continue);
    }
    let mut reply = FrameHeader::reply_to(header, Status::Ok);
    reply.data_len = total;
    reply.chunk_len = if total > 0 { chunk_len as u32 } else { 0 };
    reply.nonce = reply_nonce(store);
    let args = Reply::Read { lengths }.encode();
    wr.write_all(&FramePrefix::encode(&reply, &[], &args, &[0u8; DIGEST_LEN])).await?;
    let mut sent = 0u64;
    let mut next = first;
    while let Some(ReadMsg::Chunk(bytes)) = next {
        wr.write_all(&bytes).await?;
        sent += bytes.len() as u64;
        next = if sent < total { rx.recv().await } else { None };
    }
    wr.flush().await?;
    if sent < total {
        // The reply promised more data than the store could deliver: the only
        // honest signal left is to cut the connection.
        drop(rx);
        let e = failed(task).await.err();
        tracing::error!(error = ?e, sent, total, "read failed after its reply started; closing connection");
        return Ok(Next::Close);
    }
    drop(rx);
    if let Err(e) = failed(task).await {
        tracing::error!(error = %e, "read task failed after all data was sent");
    }
    Ok(Next::Continue)
}

fn reply_nonce(store: &Store) -> [u8; nasd_proto::limits::NONCE_LEN] {
    nasd_proto::nonce(store.now_ns(), REPLY_SEQUENCE.fetch_add(1, Ordering::Relaxed))
}

async fn send_reply(wr: &mut Writer, store: &Store, request: &FrameHeader, reply: &Reply) -> std::io::Result<()> {
    let mut h = FrameHeader::reply_to(request, Status::Ok);
    h.nonce = reply_nonce(store);
    wr.write_all(&FramePrefix::encode(&h, &[], &reply.encode(), &[0u8; DIGEST_LEN])).await?;
    wr.flush().await
}

async fn send_error(
    wr: &mut Writer,
    store: &Store,
    request: &FrameHeader,
    status: Status,
    message: &str,
) -> std::io::Result<()> {
    debug_assert!(status != Status::Ok);
    let mut h = FrameHeader::reply_to(request, status);
    h.nonce = reply_nonce(store);
    h.version = VERSION;
    h.key_type = KeyType::None;
    h.protection = Protection::NONE;
    tracing::debug!(status = %status, message, "request refused");
    wr.write_all(&FramePrefix::encode(&h, &[], &encode_error_message(message), &[0u8; DIGEST_LEN])).await?;
    wr.flush().await
}

async fn send_store_error(wr: &mut Writer, store: &Store, request: &FrameHeader, e: &StoreError) -> std::io::Result<()> {
    send_error(wr, store, request, e.status(), &e.to_string()).await
}
