//! nasd client library.
//!
//! [`DriveClient`] speaks the nasd protocol to one drive over TCP: it
//! negotiates the version, then sends requests and reads replies one at a time.
//! Data streams in chunks in both directions ([`DriveClient::write_from`],
//! [`DriveClient::read_to`]), so a transfer of any size needs a few chunks of
//! memory.
//!
//! ```no_run
//! # async fn demo() -> Result<(), nasd_client::ClientError> {
//! use nasd_client::DriveClient;
//! use nasd_proto::Region;
//! let mut drive = DriveClient::connect("127.0.0.1:7400").await?;
//! drive.create_partition(1).await?;
//! drive.resize_partition(1, 1 << 30).await?;
//! let (obj, _) = drive.create(1).await?;
//! drive.write(1, obj, &[Region { offset: 0, length: 5 }], b"hello").await?;
//! let (_, data) = drive.read(1, obj, &[Region { offset: 0, length: 5 }]).await?;
//! assert_eq!(data, b"hello");
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use nasd_proto::limits::{CHUNK_LEN_DEFAULT, DIGEST_LEN, HEADER_LEN};
use nasd_proto::{
    decode_error_message, AttrMask, Attributes, DecodeError, DriveInfo, FrameHeader, FramePrefix, Kind, Region, Reply,
    Request, Status, VERSION, VERSION_MIN,
};
use std::sync::atomic::{AtomicU64, Ordering};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpStream, ToSocketAddrs};

/// Why a call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The connection failed.
    #[error("connection to drive failed: {0}")]
    Io(#[from] std::io::Error),
    /// The drive refused the request with a status.
    #[error("drive refused the request: {status}: {message}")]
    Status {
        /// The status code.
        status: Status,
        /// The drive's explanation.
        message: String,
    },
    /// The drive's reply broke the protocol.
    #[error("drive reply is malformed: {0}")]
    Protocol(String),
}

impl ClientError {
    /// The drive's status, if it refused the request.
    pub fn status(&self) -> Option<Status> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl From<DecodeError> for ClientError {
    fn from(e: DecodeError) -> Self {
        ClientError::Protocol(e.to_string())
    }
}

static NONCE_SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// A connection to one drive.
pub struct DriveClient {
    rd: BufReader<tokio::net::tcp::OwnedReadHalf>,
    wr: BufWriter<tokio::net::tcp::OwnedWriteHalf>,
    next_id: u64,
    chunk_len: u32,
    drive_id: [u8; 16],
}

impl std::fmt::Debug for DriveClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriveClient").field("next_id", &self.next_id).finish()
    }
}

/// A reply's header and results, with its data still on the socket.
struct ReplyHead {
    header: FrameHeader,
    reply: Reply,
}

impl DriveClient {
    /// Connects and negotiates the protocol version.
    pub async fn connect(addr: impl ToSocketAddrs) -> Result<Self, ClientError> {
        let socket = TcpStream::connect(addr).await?;
        socket.set_nodelay(true)?;
        let (rd, wr) = socket.into_split();
        let mut c = DriveClient {
            rd: BufReader::with_capacity(256 * 1024, rd),
            wr: BufWriter::with_capacity(256 * 1024, wr),
            next_id: 1,
            chunk_len: CHUNK_LEN_DEFAULT,
            drive_id: [0; 16],
        };
        let hello = Request::Hello { min_version: VERSION_MIN, max_version: VERSION, client: "nasd-client".into() };
        match c.call(&hello).await? {
            Reply::Hello { drive_id, chunk_len_max, .. } => {
                c.drive_id = drive_id;
                c.chunk_len = c.chunk_len.min(chunk_len_max);
            }
            other => return Err(ClientError::Protocol(format!("unexpected hello reply {other:?}"))),
        }
        Ok(c)
    }

    /// The drive's unique name, learnt at connect.
    pub fn drive_id(&self) -> [u8; 16] {
        self.drive_id
    }

    /// Sets the chunk length used for write data (512 B ..= 4 MiB).
    pub fn set_chunk_len(&mut self, chunk_len: u32) {
        self.chunk_len = chunk_len.clamp(nasd_proto::limits::CHUNK_LEN_MIN, nasd_proto::limits::CHUNK_LEN_MAX);
    }

    fn header_for(&mut self, req: &Request, data_len: u64) -> FrameHeader {
        let mut h = FrameHeader::request(req.opcode(), self.next_id);
        self.next_id += 1;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        h.nonce = nasd_proto::nonce(now, NONCE_SEQUENCE.fetch_add(1, Ordering::Relaxed));
        h.data_len = data_len;
        h.chunk_len = if data_len > 0 { self.chunk_len } else { 0 };
        h
    }

    async fn send_head(&mut self, h: &FrameHeader, req: &Request) -> Result<(), ClientError> {
        let frame = FramePrefix::encode(h, &[], &req.encode_args(), &[0u8; DIGEST_LEN]);
        self.wr.write_all(&frame).await?;
        Ok(())
    }

    async fn recv_head(&mut self, request: &FrameHeader) -> Result<ReplyHead, ClientError> {
        let mut head = [0u8; HEADER_LEN];
        self.rd.read_exact(&mut head).await?;
        let header = FrameHeader::decode(&head)?;
        if header.kind != Kind::Reply || header.request_id != request.request_id || header.opcode != request.opcode {
            return Err(ClientError::Protocol("reply does not answer the request".into()));
        }
        let mut body = vec![0u8; header.body_len()];
        self.rd.read_exact(&mut body).await?;
        let mut frame = head.to_vec();
        frame.extend_from_slice(&body);
        let prefix = FramePrefix::parse(&frame)?;
        if header.status != 0 {
            let status = Status::from_code(header.status)
                .ok_or_else(|| ClientError::Protocol(format!("unknown status {}", header.status)))?;
            let message = decode_error_message(prefix.args).unwrap_or_default();
            self.skip_data(&header).await?;
            return Err(ClientError::Status { status, message });
        }
        let reply = Reply::decode(header.opcode, prefix.args)?;
        Ok(ReplyHead { header, reply })
    }

    async fn skip_data(&mut self, header: &FrameHeader) -> Result<(), ClientError> {
        let mut left = header.data_len + header.chunk_count() * header.protection.data_tag_len() as u64;
        let mut buf = vec![0u8; 64 * 1024];
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            self.rd.read_exact(&mut buf[..n]).await?;
            left -= n as u64;
        }
        Ok(())
    }

    /// Sends a request without data and returns its results. A reply that
    /// carries data (a read) is refused: use [`read`](Self::read).
    pub async fn call(&mut self, req: &Request) -> Result<Reply, ClientError> {
        let h = self.header_for(req, 0);
        self.send_head(&h, req).await?;
        self.wr.flush().await?;
        let head = self.recv_head(&h).await?;
        if head.header.data_len != 0 {
            self.skip_data(&head.header).await?;
            return Err(ClientError::Protocol("unexpected data in reply".into()));
        }
        Ok(head.reply)
    }

    /// Writes `data` (the regions' bytes in order) and returns bytes written.
    pub async fn write(&mut self, partition: u64, object: u64, regions: &[Region], data: &[u8]) -> Result<u64, ClientError> {
        self.write_from(partition, object, regions, data.len() as u64, &mut &data[..]).await
    }

    /// Writes `len` bytes streamed from `src`.
    pub async fn write_from(
        &mut self,
        partition: u64,
        object: u64,
        regions: &[Region],
        len: u64,
        src: &mut (impl AsyncRead + Unpin),
    ) -> Result<u64, ClientError> {
        let req = Request::Write { partition, object, regions: regions.to_vec() };
        let h = self.header_for(&req, len);
        self.send_head(&h, &req).await?;
        let mut buf = vec![0u8; self.chunk_len as usize];
        for index in 0..h.chunk_count() {
            let n = h.chunk_size(index) as usize;
            src.read_exact(&mut buf[..n]).await?;
            self.wr.write_all(&buf[..n]).await?;
        }
        self.wr.flush().await?;
        match self.recv_head(&h).await?.reply {
            Reply::Written { length } => Ok(length),
            other => Err(ClientError::Protocol(format!("unexpected write reply {other:?}"))),
        }
    }

    /// Reads `regions` into memory: (per-region lengths, data).
    pub async fn read(&mut self, partition: u64, object: u64, regions: &[Region]) -> Result<(Vec<u64>, Vec<u8>), ClientError> {
        let mut out = Vec::new();
        let lengths = self.read_to(partition, object, regions, &mut out).await?;
        Ok((lengths, out))
    }

    /// Reads `regions`, streaming the data into `dst`; returns per-region lengths.
    pub async fn read_to(
        &mut self,
        partition: u64,
        object: u64,
        regions: &[Region],
        dst: &mut (impl AsyncWrite + Unpin),
    ) -> Result<Vec<u64>, ClientError> {
        let req = Request::Read { partition, object, regions: regions.to_vec() };
        let h = self.header_for(&req, 0);
        self.send_head(&h, &req).await?;
        self.wr.flush().await?;
        let head = self.recv_head(&h).await?;
        let Reply::Read { lengths } = head.reply else {
            return Err(ClientError::Protocol("unexpected read reply".into()));
        };
        if lengths.iter().sum::<u64>() != head.header.data_len {
            return Err(ClientError::Protocol("read lengths disagree with the data length".into()));
        }
        let mut buf = vec![0u8; head.header.chunk_len.max(1) as usize];
        for index in 0..head.header.chunk_count() {
            let n = head.header.chunk_size(index) as usize;
            self.rd.read_exact(&mut buf[..n]).await?;
            dst.write_all(&buf[..n]).await?;
        }
        dst.flush().await?;
        Ok(lengths)
    }

    /// Creates an object with default attributes.
    pub async fn create(&mut self, partition: u64) -> Result<(u64, Attributes), ClientError> {
        self.create_with(partition, AttrMask::default(), &Attributes::default()).await
    }

    /// Creates an object, setting the attributes in `mask`.
    pub async fn create_with(&mut self, partition: u64, mask: AttrMask, attrs: &Attributes) -> Result<(u64, Attributes), ClientError> {
        match self.call(&Request::Create { partition, mask, attrs: attrs.masked(mask) }).await? {
            Reply::Created { object, attrs } => Ok((object, attrs)),
            other => Err(ClientError::Protocol(format!("unexpected create reply {other:?}"))),
        }
    }

    /// Removes an object.
    pub async fn remove(&mut self, partition: u64, object: u64) -> Result<(), ClientError> {
        self.call(&Request::Remove { partition, object }).await.map(drop)
    }

    /// An object's attributes.
    pub async fn getattr(&mut self, partition: u64, object: u64) -> Result<Attributes, ClientError> {
        match self.call(&Request::GetAttr { partition, object }).await? {
            Reply::Attrs(a) => Ok(a),
            other => Err(ClientError::Protocol(format!("unexpected getattr reply {other:?}"))),
        }
    }

    /// Sets the attributes in `mask`; returns the new attributes.
    pub async fn setattr(&mut self, partition: u64, object: u64, mask: AttrMask, attrs: &Attributes) -> Result<Attributes, ClientError> {
        match self.call(&Request::SetAttr { partition, object, mask, attrs: attrs.masked(mask) }).await? {
            Reply::Attrs(a) => Ok(a),
            other => Err(ClientError::Protocol(format!("unexpected setattr reply {other:?}"))),
        }
    }

    /// Clones an object copy-on-write.
    pub async fn fastcopy(&mut self, partition: u64, source: u64) -> Result<(u64, Attributes), ClientError> {
        match self.call(&Request::FastCopy { partition, source }).await? {
            Reply::Created { object, attrs } => Ok((object, attrs)),
            other => Err(ClientError::Protocol(format!("unexpected fastcopy reply {other:?}"))),
        }
    }

    /// Makes objects durable.
    pub async fn flush(&mut self, partition: u64, objects: &[u64]) -> Result<(), ClientError> {
        self.call(&Request::Flush { partition, objects: objects.to_vec() }).await.map(drop)
    }

    /// (estimated, maximum) blocks needed to overwrite `regions`.
    pub async fn blocks_required(&mut self, partition: u64, object: u64, regions: &[Region]) -> Result<(u64, u64), ClientError> {
        match self.call(&Request::BlocksRequired { partition, object, regions: regions.to_vec() }).await? {
            Reply::BlocksRequired { estimated, maximum } => Ok((estimated, maximum)),
            other => Err(ClientError::Protocol(format!("unexpected blocksrequired reply {other:?}"))),
        }
    }

    /// Creates an empty partition.
    pub async fn create_partition(&mut self, partition: u64) -> Result<(), ClientError> {
        self.call(&Request::CreatePartition { partition }).await.map(drop)
    }

    /// Removes a partition.
    pub async fn remove_partition(&mut self, partition: u64, force: bool) -> Result<(), ClientError> {
        self.call(&Request::RemovePartition { partition, force }).await.map(drop)
    }

    /// Sets a partition's quota.
    pub async fn resize_partition(&mut self, partition: u64, quota_bytes: u64) -> Result<(), ClientError> {
        self.call(&Request::ResizePartition { partition, quota_bytes }).await.map(drop)
    }

    /// Makes a partition durable.
    pub async fn flush_partition(&mut self, partition: u64) -> Result<(), ClientError> {
        self.call(&Request::FlushPartition { partition }).await.map(drop)
    }

    /// Removes every partition and sets the drive clock.
    pub async fn initialize(&mut self, clock_ns: u64, clock_skew_ns: u64) -> Result<(), ClientError> {
        self.call(&Request::Initialize { clock_ns, clock_skew_ns, sealed_master_key: Vec::new() }).await.map(drop)
    }

    /// Describes the drive.
    pub async fn inquiry(&mut self) -> Result<DriveInfo, ClientError> {
        match self.call(&Request::Inquiry).await? {
            Reply::Inquiry(d) => Ok(d),
            other => Err(ClientError::Protocol(format!("unexpected inquiry reply {other:?}"))),
        }
    }
}
