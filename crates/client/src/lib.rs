//! nasd client library.
//!
//! [`DriveClient`] speaks the nasd protocol to one drive over TCP: it
//! negotiates the version, then sends requests and reads replies one at a time.
//! Data streams in chunks in both directions ([`DriveClient::write_from`],
//! [`DriveClient::read_to`]), so a transfer of any size needs a few chunks of
//! memory.
//!
//! Every request is protected with the client's [`Auth`] (docs/SECURITY.md):
//! a [`Credential`] (a capability, an identity or a key of the hierarchy) and
//! protection options. A client that also holds an identity
//! ([`DriveClient::set_identity`]) sends each object operation under
//! whichever of its capability and identity the partition's authorization
//! scheme accepts, learning the scheme from the drive. Every reply is checked before anything in it is believed: its
//! digest, its data tags chunk by chunk, and that it answers this request. A
//! reply that fails a check is [`ClientError::BadReply`] (or, for a data tag
//! of a Hash-and-MAC read, [`ClientError::HashAndMacMismatch`], which may
//! also mean rot on the drive) and the connection is no longer used.
//! A client that saw a bad reply refuses further calls
//! ([`ClientError::Broken`]); it does not re-read by itself (re-read without
//! `HASH_AND_MAC` to tell tampering from rot). The unauthenticated `HELLO`
//! reply's block size and chunk limit are checked against the protocol's
//! limits before use.
//!
//! Every wait for the drive — connecting, each piece of a request, a reply's
//! header, each data chunk — is bounded ([`DRIVE_WAIT_MAX`],
//! [`DriveClient::set_timeout`]) and fails with a time-out naming the drive
//! and the step. [`DriveClient::is_reusable`] tells without waiting whether a
//! kept connection can carry another request (not once the drive closed it
//! or sent bytes nobody asked for).
//!
//! ```no_run
//! # async fn demo(token: Vec<u8>, cap_key: nasd_crypto::Key) -> Result<(), nasd_client::ClientError> {
//! use nasd_client::{Auth, Credential, DriveClient};
//! use nasd_proto::{Protection, Region};
//! let mut drive = DriveClient::connect("127.0.0.1:7400").await?;
//! let protection = Protection::INTEGRITY_ARGS.union(Protection::INTEGRITY_DATA);
//! let credential = Credential::Capability { token, key: cap_key, algorithm: nasd_crypto::MacAlgorithm::Blake3 };
//! drive.set_auth(Auth::new(credential, protection));
//! drive.write(1, 16, &[Region { offset: 0, length: 5 }], b"hello").await?;
//! let (_, data) = drive.read(1, 16, &[Region { offset: 0, length: 5 }]).await?;
//! assert_eq!(data, b"hello");
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod auth;
#[cfg(test)]
mod tests;
pub mod trace;

pub use auth::{key_management_protection, Auth, Credential};
pub use nasd_crypto::{Key, MacAlgorithm};

use auth::Guard;
use nasd_crypto::{key_context, seal_key};
use nasd_env::Env;
use nasd_proto::limits::{
    ARGS_LEN_MAX, BLOCK_SIZE_MAX, BLOCK_SIZE_MIN, CHUNK_LEN_DEFAULT, CHUNK_LEN_MIN, DATA_LEN_MAX, DATA_TAG_LEN,
    DIGEST_LEN, HEADER_LEN, NONCE_LEN, PARTITIONS_MAX,
};
use nasd_proto::{
    opcode, AttrMask, Attributes, AuditRecord, AuthScheme, DecodeError, DriveInfo, FrameHeader, Kind, ObjectPal,
    OpenTxn, Pal, Protection, Region, Reply, Request, Status, TraceId, VERSION, VERSION_MIN, VERSION_TRACE,
};
use std::collections::HashMap;
use std::sync::Arc;
use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::ToSocketAddrs;

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
    /// The reply failed verification: altered in flight, made with another
    /// key or protection, or replayed from another request. The connection is
    /// no longer used.
    #[error("drive reply failed verification: {0}")]
    BadReply(String),
    /// A Hash-and-MAC read (`HASH_AND_MAC`) failed a data tag. Either the
    /// reply changed in flight or a whole block rotted on the drive: under
    /// Hash-and-MAC the drive sends the digest it stored for a block that
    /// fits in a chunk without re-reading it against the block, so the
    /// client's check is what catches such rot — and a client cannot tell
    /// the two apart. No byte of the failed chunk reached the caller; the
    /// connection is no longer used. To tell which (Gobioff et al. §4.2),
    /// re-read the regions on a new connection without `HASH_AND_MAC`: the
    /// drive then checks every block against its stored digest and refuses
    /// a rotten one with `DATA_CORRUPTED`; if that read succeeds, the first
    /// reply was tampered with. The client does not re-read by itself.
    #[error("hash-and-MAC read data failed its tag (changed in flight, or a block rotted on the drive; re-read without HASH_AND_MAC to tell which): {0}")]
    HashAndMacMismatch(String),
    /// The request was not sent: the client's [`Auth`] cannot be used safely,
    /// or the request cannot be encoded within the protocol's limits.
    #[error("request not sent: {0}")]
    InvalidRequest(String),
    /// An earlier failure left the connection in an unknown state; reconnect.
    #[error("connection unusable after an earlier failure; reconnect")]
    Broken,
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

#[cfg(test)]
fn local_ns() -> u64 {
    nasd_env::clock::system_ns()
}

/// The drive-clock time carried in a nonce.
fn nonce_time(nonce: &[u8; NONCE_LEN]) -> u64 {
    u64::from_le_bytes(nonce[..8].try_into().expect("8 bytes"))
}

/// A connection to one drive.
///
/// Requests use the [`Auth`] set with [`set_auth`](Self::set_auth) (none
/// until then). A call that fails with anything but a drive status or
/// [`ClientError::InvalidRequest`] — a reply that fails verification, a
/// broken connection, or a call cancelled mid-frame — leaves the connection
/// in an unknown state: every later call fails with [`ClientError::Broken`].
pub struct DriveClient {
    /// The client's clock, randomness and network.
    env: Env,
    rd: BufReader<nasd_env::ReadHalf>,
    wr: BufWriter<nasd_env::WriteHalf>,
    /// Next request id; starts random so a reply recorded on another
    /// connection does not answer a request of this one.
    next_id: u64,
    /// The frame version `HELLO` chose (1 until then).
    version: u8,
    chunk_len: u32,
    drive_id: [u8; 16],
    /// The drive's block size (the unit of Hash-and-MAC digests).
    block_size: u32,
    auth: Auth,
    /// `auth`, checked and prepared (or why it cannot be used).
    guard: Result<Arc<Guard>, String>,
    /// An identity credential to use instead of `auth` for object
    /// operations in partitions that accept identities, and its guard.
    identity: Option<(Auth, Result<Arc<Guard>, String>)>,
    /// What each partition accepts, as learnt from the drive (at most
    /// `PARTITIONS_MAX` entries).
    schemes: HashMap<u64, AuthScheme>,
    /// Whether the last refusal received was authenticated (a protected
    /// reply whose digest verified): only those teach the client a scheme.
    refusal_authenticated: bool,
    /// Drive clock minus local clock, learnt from HELLO and every
    /// authenticated reply.
    clock_offset_ns: i64,
    /// Nonce sequence number; starts random and increments per request.
    sequence: u64,
    /// Set while a request is in flight and left set if it failed in a way
    /// that leaves the stream in an unknown state (or was cancelled).
    broken: bool,
    /// The buffer read data chunks land in, kept between reads (one chunk).
    chunk_buf: Vec<u8>,
    /// How long each wait for the drive may take.
    deadline: Deadline,
}

impl std::fmt::Debug for DriveClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriveClient")
            .field("next_id", &self.next_id)
            .field("auth", &self.auth)
            .field("broken", &self.broken)
            .finish()
    }
}

/// The reply reader's buffer: enough for a reply prefix and no more, so that
/// data sections are read straight from the socket into the chunk buffer
/// (see [`read_direct`]) instead of being copied through this one.
const REPLY_BUFFER_LEN: usize = 16 * 1024;

/// Hash-and-MAC data is hashed in pieces of this size as it arrives, while
/// the piece is still in cache (BLAKE3 is fastest on inputs of 16 KiB and up).
const HASH_PIECE_LEN: usize = 64 * 1024;

/// How long a client waits for the drive at any one step by default — to
/// connect and negotiate, to take the next piece of a request, to send a
/// reply's header or its next data chunk — before the call fails with
/// [`ClientError::Io`] of kind `TimedOut` ([`DriveClient::set_timeout`]).
/// A reply cut short, or one whose lengths were changed in flight to promise
/// more than comes, then ends in an error instead of a wait without end.
pub const DRIVE_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// The bound on each wait for one drive, and the drive, for the error.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    limit: std::time::Duration,
    peer: std::net::SocketAddr,
}

impl Deadline {
    /// `step`, failing with `TimedOut` if the drive does not let it finish
    /// within the limit.
    async fn wait<T>(
        self,
        what: &str,
        step: impl std::future::Future<Output = std::io::Result<T>>,
    ) -> std::io::Result<T> {
        tokio::time::timeout(self.limit, step).await.unwrap_or_else(|_| {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the drive at {} did not {what} within {:?}", self.peer, self.limit),
            ))
        })
    }
}

/// Reads exactly `buf.len()` bytes: those the reader already holds, then the
/// rest straight from the socket into `buf`, skipping the reader's buffer.
async fn read_direct(rd: &mut BufReader<nasd_env::ReadHalf>, buf: &mut [u8]) -> std::io::Result<()> {
    let held = rd.buffer();
    let n = held.len().min(buf.len());
    buf[..n].copy_from_slice(&held[..n]);
    rd.consume(n);
    if n < buf.len() {
        // The reader's buffer is empty now, so reading around it keeps the
        // stream in order.
        rd.get_mut().read_exact(&mut buf[n..]).await?;
    }
    Ok(())
}

/// A checked reply's header, digest and results, with its data still on the socket.
struct ReplyHead {
    header: FrameHeader,
    digest: [u8; DIGEST_LEN],
    reply: Reply,
}

/// Encodes a request's arguments, refusing what the wire cannot carry
/// faithfully (counts over `u16`, arguments or data over their limits).
fn encode_args(req: &Request, data_len: u64) -> Result<Vec<u8>, ClientError> {
    let count = match req {
        Request::Read { regions, .. } | Request::Write { regions, .. } | Request::BlocksRequired { regions, .. } => {
            regions.len()
        }
        Request::Flush { objects, .. } => objects.len(),
        Request::SetPal { pal: ObjectPal { pal, .. }, .. } | Request::SetSuperPal { pal, .. } => pal.entries.len(),
        _ => 0,
    };
    if count > u16::MAX as usize {
        return Err(ClientError::InvalidRequest(format!("{count} list entries do not fit the wire's u16 count")));
    }
    if data_len > DATA_LEN_MAX {
        return Err(ClientError::InvalidRequest(format!("{data_len} data bytes exceed DATA_LEN_MAX ({DATA_LEN_MAX})")));
    }
    let args = req.encode_args();
    if args.len() > ARGS_LEN_MAX {
        return Err(ClientError::InvalidRequest(format!(
            "{} argument bytes exceed ARGS_LEN_MAX ({ARGS_LEN_MAX})",
            args.len()
        )));
    }
    Ok(args)
}

/// Checks the unauthenticated `HELLO` reply's sizes against the protocol's
/// limits. A man in the middle who changes them within the limits can only
/// make calls fail: `chunk_len_max` only ever lowers the chunk length of
/// requests (which the drive accepts at any valid length), and a wrong
/// `block_size` cuts Hash-and-MAC units where the drive does not, so those
/// reads fail their tags ([`ClientError::HashAndMacMismatch`]).
fn check_hello(chunk_len_max: u32, block_size: u32) -> Result<(), ClientError> {
    if chunk_len_max < CHUNK_LEN_MIN {
        return Err(ClientError::Protocol(format!(
            "HELLO offers chunk_len_max {chunk_len_max}, below CHUNK_LEN_MIN ({CHUNK_LEN_MIN})"
        )));
    }
    if !block_size.is_power_of_two() || !(BLOCK_SIZE_MIN..=BLOCK_SIZE_MAX).contains(&block_size) {
        return Err(ClientError::Protocol(format!(
            "HELLO names block size {block_size}: not a power of two in {BLOCK_SIZE_MIN}..={BLOCK_SIZE_MAX}"
        )));
    }
    Ok(())
}

/// Which of its credentials a client sends a request under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chosen {
    /// The [`Auth`].
    Auth,
    /// The identity ([`DriveClient::set_identity`]).
    Identity,
}

/// The partition whose authorization scheme decides `req`'s credential: an
/// object operation's, except `CREATE` (which an identity never does).
fn scheme_partition(req: &Request) -> Option<u64> {
    match req {
        Request::Remove { partition, .. }
        | Request::GetAttr { partition, .. }
        | Request::SetAttr { partition, .. }
        | Request::Read { partition, .. }
        | Request::Write { partition, .. }
        | Request::FastCopy { partition, .. }
        | Request::Flush { partition, .. }
        | Request::BlocksRequired { partition, .. }
        | Request::Extents { partition, .. }
        | Request::Digests { partition, .. } => Some(*partition),
        _ => None,
    }
}

fn unexpected(what: &str, reply: &Reply) -> ClientError {
    ClientError::Protocol(format!("unexpected {what} reply {reply:?}"))
}

fn expect_done(what: &str, reply: Reply) -> Result<(), ClientError> {
    match reply {
        Reply::Done => Ok(()),
        other => Err(unexpected(what, &other)),
    }
}

impl DriveClient {
    /// Connects and negotiates the protocol version (unprotected: `HELLO`
    /// always uses no key).
    pub async fn connect(addr: impl ToSocketAddrs) -> Result<Self, ClientError> {
        Self::connect_with_timeout(addr, DRIVE_WAIT_MAX).await
    }

    /// [`connect`](Self::connect), with `timeout` bounding the connection,
    /// the negotiation and then every wait for the drive
    /// ([`set_timeout`](Self::set_timeout)).
    pub async fn connect_with_timeout(
        addr: impl ToSocketAddrs,
        timeout: std::time::Duration,
    ) -> Result<Self, ClientError> {
        Self::connect_in(&Env::real(), addr, timeout).await
    }

    /// [`connect_with_timeout`](Self::connect_with_timeout) in `env`: the
    /// connection, the nonces' clock and the random starting points of
    /// request ids and nonce sequences are the environment's.
    pub async fn connect_in(
        env: &Env,
        addr: impl ToSocketAddrs,
        timeout: std::time::Duration,
    ) -> Result<Self, ClientError> {
        let socket = tokio::time::timeout(timeout, env.connect(addr)).await.map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("could not connect to the drive within {timeout:?}"),
            )
        })??;
        socket.set_nodelay(true)?;
        let deadline = Deadline { limit: timeout, peer: socket.peer_addr()? };
        let (rd, wr) = socket.into_split();
        let mut c = DriveClient {
            env: env.clone(),
            rd: BufReader::with_capacity(REPLY_BUFFER_LEN, rd),
            wr: BufWriter::with_capacity(256 * 1024, wr),
            next_id: env.random_u64(),
            version: VERSION_MIN,
            chunk_len: CHUNK_LEN_DEFAULT,
            drive_id: [0; 16],
            block_size: 0,
            auth: Auth::default(),
            guard: Ok(Arc::new(Guard::none())),
            identity: None,
            schemes: HashMap::new(),
            refusal_authenticated: false,
            clock_offset_ns: 0,
            sequence: env.random_u64(),
            broken: false,
            chunk_buf: Vec::new(),
            deadline,
        };
        let hello = Request::Hello { min_version: VERSION_MIN, max_version: VERSION, client: "nasd-client".into() };
        // The HELLO reply is unauthenticated: its time is not trusted. The
        // client starts from its own (NTP-synchronized) clock and learns the
        // drive's only from authenticated replies.
        let head = c.exchange(&Guard::none(), &hello).await?;
        match head.reply {
            Reply::Hello { version, drive_id, chunk_len_max, block_size, .. } => {
                check_hello(chunk_len_max, block_size)?;
                if !(VERSION_MIN..=VERSION).contains(&version) {
                    return Err(ClientError::Protocol(format!(
                        "HELLO chose version {version}, outside the {VERSION_MIN}..={VERSION} offered"
                    )));
                }
                c.version = version;
                c.drive_id = drive_id;
                c.block_size = block_size;
                c.chunk_len = c.chunk_len.min(chunk_len_max);
            }
            other => return Err(unexpected("hello", &other)),
        }
        Ok(c)
    }

    /// The drive's unique name, learnt at connect.
    pub fn drive_id(&self) -> [u8; 16] {
        self.drive_id
    }

    /// The drive's block size (from `HELLO`): the unit of its stored digests.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Whether the connection can carry another request, found without
    /// waiting: not after an earlier failure, nor once the drive has closed
    /// it — a drive ends a connection idle for its idle timeout, and a
    /// connection kept for reuse then sits half-closed, so a request sent on
    /// it would get no reply — nor if the drive sent bytes no request asked
    /// for. Callers that keep connections check this before reusing one.
    pub fn is_reusable(&self) -> bool {
        if self.broken || !self.rd.buffer().is_empty() {
            return false;
        }
        self.rd.get_ref().is_open_and_idle()
    }

    /// Sets how long each wait for the drive may take before a call fails
    /// with `TimedOut` ([`DRIVE_WAIT_MAX`] by default).
    pub fn set_timeout(&mut self, timeout: std::time::Duration) {
        self.deadline.limit = timeout;
    }

    /// Sets the chunk length used for write data (512 B ..= 4 MiB).
    pub fn set_chunk_len(&mut self, chunk_len: u32) {
        self.chunk_len = chunk_len.clamp(nasd_proto::limits::CHUNK_LEN_MIN, nasd_proto::limits::CHUNK_LEN_MAX);
    }

    /// Sets the credential and protection every following request uses.
    ///
    /// An `auth` that cannot be used safely (inconsistent options, a key of
    /// the hierarchy without `INTEGRITY_ARGS`, which would send the key in
    /// the clear, protection without a key, `PRIVACY_CAPABILITY` with a clear
    /// token) makes every following request fail with
    /// [`ClientError::InvalidRequest`] without sending anything.
    pub fn set_auth(&mut self, auth: Auth) {
        self.guard = Guard::new(&auth, &self.drive_id).map(Arc::new);
        self.auth = auth;
    }

    /// The credential and protection requests use.
    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    /// Gives the client an identity (an [`Auth`] whose credential is
    /// [`Credential::Identity`]) beside its [`Auth`], or takes it away.
    ///
    /// From then on an object operation (all but `CREATE`, which goes
    /// through the manager) goes under the identity when the [`Auth`]
    /// holds no key, and when it holds a capability goes under whichever
    /// of the two the partition's authorization scheme accepts — the
    /// identity if it accepts both. The client asks the drive for a
    /// partition's scheme (`GET_AUTH_SCHEME`, under the identity) the first
    /// time it needs it, and learns a change from an authenticated
    /// `AUTH_SCHEME_REFUSED`: a call that sends no data (and
    /// [`write`](Self::write)) is then sent once more under the other
    /// credential; [`write_from`](Self::write_from), whose data is gone,
    /// fails and the next call chooses right. On a partition that accepts
    /// both, a request the identity's PAL entries do not cover (an
    /// authenticated `NOT_IN_PAL`) is sent once more under the capability,
    /// as such a call. Requests under a key of the hierarchy never switch.
    ///
    /// An identity that cannot be used safely (not an identity credential,
    /// protection options it cannot have) makes every request that would go
    /// under it fail with [`ClientError::InvalidRequest`].
    pub fn set_identity(&mut self, identity: Option<Auth>) {
        self.identity = identity.map(|auth| {
            let guard = match auth.credential {
                Credential::Identity { .. } => Guard::new(&auth, &self.drive_id).map(Arc::new),
                _ => Err("set_identity needs an identity credential".to_string()),
            };
            (auth, guard)
        });
    }

    /// The identity the client holds, if any.
    pub fn identity(&self) -> Option<&Auth> {
        self.identity.as_ref().map(|(auth, _)| auth)
    }

    /// What the client believes `partition` accepts (learnt from the drive;
    /// None until then).
    pub fn known_scheme(&self, partition: u64) -> Option<AuthScheme> {
        self.schemes.get(&partition).copied()
    }

    /// The client's estimate of the drive clock, in nanoseconds (for
    /// nonces; also handy for capability expirations).
    pub fn drive_time_ns(&self) -> u64 {
        self.env.now_ns().saturating_add_signed(self.clock_offset_ns)
    }

    fn learn_clock(&mut self, nonce: &[u8; NONCE_LEN]) {
        let offset = nonce_time(nonce) as i128 - self.env.now_ns() as i128;
        self.clock_offset_ns = offset.clamp(i64::MIN as i128, i64::MAX as i128) as i64;
    }

    fn guard(&self) -> Result<Arc<Guard>, ClientError> {
        self.guard.clone().map_err(ClientError::InvalidRequest)
    }

    fn guard_of(&self, chosen: Chosen) -> Result<Arc<Guard>, ClientError> {
        match (chosen, &self.identity) {
            (Chosen::Identity, Some((_, guard))) => guard.clone().map_err(ClientError::InvalidRequest),
            _ => self.guard(),
        }
    }

    /// Which credential `req` goes under (see [`set_identity`](Self::set_identity)).
    async fn choose(&mut self, req: &Request) -> Result<Chosen, ClientError> {
        let Some(partition) = scheme_partition(req) else { return Ok(Chosen::Auth) };
        if self.identity.is_none() {
            return Ok(Chosen::Auth);
        }
        match self.auth.credential {
            Credential::None => return Ok(Chosen::Identity),
            Credential::Capability { .. } => {}
            _ => return Ok(Chosen::Auth),
        }
        let scheme = match self.schemes.get(&partition) {
            Some(s) => *s,
            None => match self.probe_scheme(partition).await {
                Ok(s) => s,
                // The identity cannot even ask (retired, never installed, …):
                // the capability is the credential that may still work.
                Err(ClientError::Status { .. }) => return Ok(Chosen::Auth),
                Err(e) => return Err(e),
            },
        };
        Ok(if scheme.pals() { Chosen::Identity } else { Chosen::Auth })
    }

    /// Asks the drive, under the identity, what `partition` accepts, and remembers it.
    async fn probe_scheme(&mut self, partition: u64) -> Result<AuthScheme, ClientError> {
        let guard = self.guard_of(Chosen::Identity)?;
        match self.exchange(&guard, &Request::GetAuthScheme { partition }).await?.reply {
            Reply::AuthScheme(s) => {
                self.learn_scheme(partition, s);
                Ok(s)
            }
            other => Err(unexpected("get_auth_scheme", &other)),
        }
    }

    fn learn_scheme(&mut self, partition: u64, scheme: AuthScheme) {
        if self.schemes.len() >= PARTITIONS_MAX && !self.schemes.contains_key(&partition) {
            self.schemes.clear();
        }
        self.schemes.insert(partition, scheme);
    }

    /// After `req`, sent under `chosen`, failed with `e`: if that was an
    /// authenticated `AUTH_SCHEME_REFUSED`, records what the partition
    /// accepts instead and returns the other credential, if the client
    /// holds it.
    /// On a partition that takes both, an authenticated `NOT_IN_PAL` under
    /// the identity returns the capability, if the client holds one: the
    /// manager flattens only users and roles into PALs, and a caller it
    /// grants through a group or the mode's group or other class holds a
    /// capability instead.
    fn rechoose(&mut self, req: &Request, chosen: Chosen, e: &ClientError) -> Option<Chosen> {
        let holds_capability = matches!(self.auth.credential, Credential::Capability { .. });
        if e.status() == Some(Status::NotInPal) && self.refusal_authenticated && chosen == Chosen::Identity {
            let partition = scheme_partition(req)?;
            let both = self.schemes.get(&partition).is_some_and(|s| s.pals() && s.capabilities());
            return (both && holds_capability).then_some(Chosen::Auth);
        }
        if e.status() != Some(Status::AuthSchemeRefused) || !self.refusal_authenticated || self.identity.is_none() {
            return None;
        }
        let partition = scheme_partition(req)?;
        let (learnt, other) = match chosen {
            Chosen::Identity => (AuthScheme::CAPABILITIES, Chosen::Auth),
            Chosen::Auth => (AuthScheme::PALS, Chosen::Identity),
        };
        self.learn_scheme(partition, learnt);
        let holds_other = match other {
            Chosen::Auth => matches!(self.auth.credential, Credential::Capability { .. }),
            Chosen::Identity => true,
        };
        holds_other.then_some(other)
    }

    /// The header of the next request, and the trace id it carries: the
    /// task's ([`trace::current`]) on a connection of version 2 or later.
    fn header_for(&mut self, req: &Request, data_len: u64) -> (FrameHeader, Option<TraceId>) {
        let mut h = FrameHeader::request(req.opcode(), self.next_id);
        h.version = self.version;
        let trace = if self.version >= VERSION_TRACE { trace::current() } else { None };
        self.next_id = self.next_id.wrapping_add(1);
        h.nonce = nasd_proto::nonce(self.drive_time_ns(), self.sequence);
        self.sequence = self.sequence.wrapping_add(1);
        h.data_len = data_len;
        h.chunk_len = if data_len > 0 { self.chunk_len } else { 0 };
        (h, trace)
    }

    /// Marks the connection busy; it stays marked (unusable) unless the
    /// exchange ends cleanly, so an error or a cancelled call mid-frame
    /// cannot desynchronize the next request.
    fn begin(&mut self) -> Result<(), ClientError> {
        if self.broken {
            return Err(ClientError::Broken);
        }
        self.broken = true;
        Ok(())
    }

    fn end<T>(&mut self, r: Result<T, ClientError>) -> Result<T, ClientError> {
        if matches!(r, Ok(_) | Err(ClientError::Status { .. })) {
            self.broken = false;
        }
        r
    }

    /// Reads a reply prefix and checks it (see [`Guard::check_reply`]); a
    /// refusal becomes [`ClientError::Status`]. Authenticated replies update
    /// the drive clock estimate.
    async fn recv_head(
        &mut self,
        guard: &Guard,
        request: &FrameHeader,
        request_digest: &[u8; DIGEST_LEN],
    ) -> Result<ReplyHead, ClientError> {
        let mut frame = vec![0u8; HEADER_LEN];
        let d = self.deadline;
        d.wait("send a reply", self.rd.read_exact(&mut frame)).await?;
        let head: &[u8; HEADER_LEN] = frame[..].try_into().expect("header length");
        // Lengths come from a validated header: at most CAPABILITY_LEN_MAX +
        // ARGS_LEN_MAX + DIGEST_LEN bytes.
        let body_len = FrameHeader::decode(head)?.body_len();
        frame.resize(HEADER_LEN + body_len, 0);
        d.wait("send the whole reply its header announced", self.rd.read_exact(&mut frame[HEADER_LEN..])).await?;
        let checked = guard.check_reply(request, request_digest, &frame)?;
        if checked.authenticated {
            self.learn_clock(&checked.header.nonce);
        }
        self.refusal_authenticated = checked.authenticated;
        if checked.header.status != 0 {
            if checked.header.data_len != 0 {
                return Err(ClientError::Protocol("a failed reply carries data".into()));
            }
            checked.refusal()?;
        }
        let reply = Reply::decode(checked.header.opcode, &checked.args)?;
        Ok(ReplyHead { header: checked.header, digest: checked.digest, reply })
    }

    /// Sends a request prefix (a request without data) and flushes it.
    async fn send_prefix(&mut self, prefix: &[u8]) -> std::io::Result<()> {
        let d = self.deadline;
        d.wait("take the request", async {
            self.wr.write_all(prefix).await?;
            self.wr.flush().await
        })
        .await
    }

    /// Sends a request without data under `guard` and reads its reply, which
    /// must carry no data.
    async fn exchange(&mut self, guard: &Guard, req: &Request) -> Result<ReplyHead, ClientError> {
        let args = encode_args(req, 0)?;
        self.begin()?;
        let offset = self.clock_offset_ns;
        let mut r = self.exchange_inner(guard, req, args).await;
        if matches!(&r, Err(e) if e.status() == Some(Status::NonceOutsideWindow)) && self.clock_offset_ns != offset {
            // The refusal was authenticated and taught us the drive's clock:
            // a fresh nonce on that clock is worth one more try.
            r = self.exchange_inner(guard, req, encode_args(req, 0)?).await;
        }
        self.end(r)
    }

    async fn exchange_inner(&mut self, guard: &Guard, req: &Request, args: Vec<u8>) -> Result<ReplyHead, ClientError> {
        let (mut h, trace) = self.header_for(req, 0);
        let (prefix, digest) = guard.seal_traced(&mut h, trace.as_ref(), args);
        self.send_prefix(&prefix).await?;
        let head = self.recv_head(guard, &h, &digest).await?;
        if head.header.data_len != 0 {
            return Err(ClientError::Protocol("unexpected data in reply".into()));
        }
        Ok(head)
    }

    /// Sends a request without data under `credential` and `protection`
    /// (this call only; the client's [`Auth`] is unchanged).
    async fn call_as(
        &mut self,
        credential: Credential,
        protection: Protection,
        req: &Request,
    ) -> Result<Reply, ClientError> {
        let guard =
            Guard::new(&Auth::new(credential, protection), &self.drive_id).map_err(ClientError::InvalidRequest)?;
        Ok(self.exchange(&guard, req).await?.reply)
    }

    /// Sends a request without data and returns its results. A reply that
    /// carries data (a read) is refused: use [`read`](Self::read). An
    /// object operation goes under the identity instead of the [`Auth`]
    /// where the partition's scheme says so ([`set_identity`](Self::set_identity)).
    pub async fn call(&mut self, req: &Request) -> Result<Reply, ClientError> {
        let chosen = self.choose(req).await?;
        let guard = self.guard_of(chosen)?;
        match self.exchange(&guard, req).await {
            Err(e) => match self.rechoose(req, chosen, &e) {
                Some(other) => {
                    let guard = self.guard_of(other)?;
                    Ok(self.exchange(&guard, req).await?.reply)
                }
                None => Err(e),
            },
            Ok(head) => Ok(head.reply),
        }
    }

    /// Writes `data` (the regions' bytes in order) and returns bytes written.
    pub async fn write(
        &mut self,
        partition: u64,
        object: u64,
        regions: &[Region],
        data: &[u8],
    ) -> Result<u64, ClientError> {
        let req = Request::Write { partition, object, regions: regions.to_vec() };
        let chosen = self.choose(&req).await?;
        match self.write_under(chosen, &req, data.len() as u64, &mut &data[..]).await {
            Err(e) => match self.rechoose(&req, chosen, &e) {
                Some(other) => self.write_under(other, &req, data.len() as u64, &mut &data[..]).await,
                None => Err(e),
            },
            ok => ok,
        }
    }

    /// Writes `len` bytes streamed from `src`. Under `INTEGRITY_DATA` every
    /// chunk is followed by its tag; under `PRIVACY_DATA` it is encrypted.
    pub async fn write_from(
        &mut self,
        partition: u64,
        object: u64,
        regions: &[Region],
        len: u64,
        src: &mut (impl AsyncRead + Unpin),
    ) -> Result<u64, ClientError> {
        let req = Request::Write { partition, object, regions: regions.to_vec() };
        let chosen = self.choose(&req).await?;
        let r = self.write_under(chosen, &req, len, src).await;
        if let Err(e) = &r {
            // The data is gone: learn the scheme for the next call, no retry.
            self.rechoose(&req, chosen, e);
        }
        r
    }

    async fn write_under(
        &mut self,
        chosen: Chosen,
        req: &Request,
        len: u64,
        src: &mut (impl AsyncRead + Unpin),
    ) -> Result<u64, ClientError> {
        let guard = self.guard_of(chosen)?;
        let args = encode_args(req, len)?;
        self.begin()?;
        let r = self.write_inner(&guard, req, args, len, src).await;
        self.end(r)
    }

    async fn write_inner(
        &mut self,
        guard: &Guard,
        req: &Request,
        args: Vec<u8>,
        len: u64,
        src: &mut (impl AsyncRead + Unpin),
    ) -> Result<u64, ClientError> {
        let (mut h, trace) = self.header_for(req, len);
        let (prefix, digest) = guard.seal_traced(&mut h, trace.as_ref(), args);
        let d = self.deadline;
        d.wait("take the request", self.wr.write_all(&prefix)).await?;
        let mut protector = guard.data(Kind::Request, &h.nonce, &digest);
        let tag_len = guard.data_tag_len();
        let mut buf = vec![0u8; h.chunk_len as usize];
        for index in 0..h.chunk_count() {
            let n = h.chunk_size(index) as usize;
            src.read_exact(&mut buf[..n]).await?;
            let tag = protector.as_mut().map(|p| p.seal_chunk(&mut buf[..n])).unwrap_or_default();
            if tag.len() != tag_len {
                return Err(ClientError::InvalidRequest(
                    "data tag length disagrees with the protection options".into(),
                ));
            }
            d.wait("take the next data chunk", async {
                self.wr.write_all(&buf[..n]).await?;
                self.wr.write_all(&tag).await
            })
            .await?;
        }
        d.wait("take the request's end", self.wr.flush()).await?;
        match self.recv_head(guard, &h, &digest).await? {
            ReplyHead { reply: Reply::Written { length }, header, .. } if header.data_len == 0 => Ok(length),
            other => Err(unexpected("write", &other.reply)),
        }
    }

    /// Reads `regions` into memory: (per-region lengths, data).
    pub async fn read(
        &mut self,
        partition: u64,
        object: u64,
        regions: &[Region],
    ) -> Result<(Vec<u64>, Vec<u8>), ClientError> {
        let mut out = Vec::new();
        let lengths = self.read_to(partition, object, regions, &mut out).await?;
        Ok((lengths, out))
    }

    /// Reads `regions`, streaming the data into `dst`; returns per-region
    /// lengths. Each chunk's tag is checked before the chunk reaches `dst`;
    /// a chunk that fails is [`ClientError::BadReply`] (under `HASH_AND_MAC`,
    /// [`ClientError::HashAndMacMismatch`]), and `dst` then holds only the
    /// chunks before it.
    ///
    /// A block that fails its stored digest on the drive is refused with
    /// status `DATA_CORRUPTED` if the drive finds it before the reply's
    /// first chunk; found later, the drive ends the connection after the
    /// chunks before it (each verified) and the call fails with
    /// [`ClientError::Io`] (`UnexpectedEof`), `dst` holding those chunks.
    pub async fn read_to(
        &mut self,
        partition: u64,
        object: u64,
        regions: &[Region],
        dst: &mut (impl AsyncWrite + Unpin),
    ) -> Result<Vec<u64>, ClientError> {
        let req = Request::Read { partition, object, regions: regions.to_vec() };
        let chosen = self.choose(&req).await?;
        match self.read_under(chosen, &req, regions, dst).await {
            // A refusal carries no data: nothing reached `dst`.
            Err(e) => match self.rechoose(&req, chosen, &e) {
                Some(other) => self.read_under(other, &req, regions, dst).await,
                None => Err(e),
            },
            ok => ok,
        }
    }

    async fn read_under(
        &mut self,
        chosen: Chosen,
        req: &Request,
        regions: &[Region],
        dst: &mut (impl AsyncWrite + Unpin),
    ) -> Result<Vec<u64>, ClientError> {
        let guard = self.guard_of(chosen)?;
        let args = encode_args(req, 0)?;
        self.begin()?;
        let r = self.read_inner(&guard, req, args, regions, dst).await;
        self.end(r)
    }

    async fn read_inner(
        &mut self,
        guard: &Guard,
        req: &Request,
        args: Vec<u8>,
        regions: &[Region],
        dst: &mut (impl AsyncWrite + Unpin),
    ) -> Result<Vec<u64>, ClientError> {
        let (mut h, trace) = self.header_for(req, 0);
        let (prefix, digest) = guard.seal_traced(&mut h, trace.as_ref(), args);
        self.send_prefix(&prefix).await?;
        let head = self.recv_head(guard, &h, &digest).await?;
        let Reply::Read { lengths } = head.reply else {
            return Err(unexpected("read", &head.reply));
        };
        if lengths.len() != regions.len() || lengths.iter().zip(regions).any(|(l, r)| *l > r.length) {
            return Err(ClientError::Protocol("read lengths do not match the requested regions".into()));
        }
        if lengths.iter().map(|&l| l as u128).sum::<u128>() != head.header.data_len as u128 {
            return Err(ClientError::Protocol("read lengths disagree with the data length".into()));
        }
        let block_size = self.block_size;
        if let Some(unit_mac) =
            guard.unit_mac(&head.digest, || nasd_crypto::Units::of_read(regions, &lengths, block_size))
        {
            return self.read_hash_and_mac(&head.header, unit_mac, dst).await.map(|()| lengths);
        }
        let mut protector = guard.data(Kind::Reply, &head.header.nonce, &head.digest);
        let mut buf = self.take_chunk_buf(head.header.chunk_len);
        let mut tag = [0u8; DATA_TAG_LEN];
        let tag = &mut tag[..head.header.protection.data_tag_len()];
        for index in 0..head.header.chunk_count() {
            let n = head.header.chunk_size(index) as usize;
            let d = self.deadline;
            d.wait("send the next data chunk", async {
                read_direct(&mut self.rd, &mut buf[..n]).await?;
                read_direct(&mut self.rd, tag).await
            })
            .await?;
            if let Some(p) = protector.as_mut() {
                p.open_chunk(&mut buf[..n], tag).map_err(|_| {
                    ClientError::BadReply(format!("read data chunk {index} failed its tag: data changed in flight"))
                })?;
            }
            dst.write_all(&buf[..n]).await?;
        }
        dst.flush().await?;
        self.chunk_buf = buf;
        Ok(lengths)
    }

    /// The chunk buffer, at least `chunk_len` long (zeroed only when it grows).
    fn take_chunk_buf(&mut self, chunk_len: u32) -> Vec<u8> {
        let mut buf = std::mem::take(&mut self.chunk_buf);
        if buf.len() < chunk_len as usize {
            buf.resize(chunk_len as usize, 0);
        }
        buf
    }

    /// Receives a Hash-and-MAC read's data. Each chunk is read straight from
    /// the socket into the chunk buffer and hashed piece by piece as it
    /// arrives (while the drive sends the rest); only after the chunk's tag
    /// checks does the chunk reach `dst`.
    async fn read_hash_and_mac(
        &mut self,
        header: &FrameHeader,
        mut unit_mac: nasd_crypto::UnitMac,
        dst: &mut (impl AsyncWrite + Unpin),
    ) -> Result<(), ClientError> {
        let mut buf = self.take_chunk_buf(header.chunk_len);
        let mut tag = [0u8; DATA_TAG_LEN];
        let tag = &mut tag[..header.protection.data_tag_len()];
        for index in 0..header.chunk_count() {
            let chunk = &mut buf[..header.chunk_size(index) as usize];
            let d = self.deadline;
            for piece in chunk.chunks_mut(HASH_PIECE_LEN) {
                d.wait("send the next data chunk", read_direct(&mut self.rd, piece)).await?;
                unit_mac.absorb(piece);
            }
            d.wait("send the next data chunk", read_direct(&mut self.rd, tag)).await?;
            unit_mac
                .check_tag(tag)
                .map_err(|_| ClientError::HashAndMacMismatch(format!("read data chunk {index} failed its tag")))?;
            dst.write_all(chunk).await?;
        }
        dst.flush().await?;
        self.chunk_buf = buf;
        Ok(())
    }

    /// Creates an object with default attributes.
    pub async fn create(&mut self, partition: u64) -> Result<(u64, Attributes), ClientError> {
        self.create_with(partition, AttrMask::default(), &Attributes::default()).await
    }

    /// Creates an object, setting the attributes in `mask`.
    pub async fn create_with(
        &mut self,
        partition: u64,
        mask: AttrMask,
        attrs: &Attributes,
    ) -> Result<(u64, Attributes), ClientError> {
        match self.call(&Request::Create { partition, mask, attrs: attrs.masked(mask) }).await? {
            Reply::Created { object, attrs } => Ok((object, attrs)),
            other => Err(unexpected("create", &other)),
        }
    }

    /// Removes an object.
    pub async fn remove(&mut self, partition: u64, object: u64) -> Result<(), ClientError> {
        let reply = self.call(&Request::Remove { partition, object }).await?;
        expect_done("remove", reply)
    }

    /// An object's attributes.
    pub async fn getattr(&mut self, partition: u64, object: u64) -> Result<Attributes, ClientError> {
        match self.call(&Request::GetAttr { partition, object }).await? {
            Reply::Attrs(a) => Ok(a),
            other => Err(unexpected("getattr", &other)),
        }
    }

    /// Sets the attributes in `mask`; returns the new attributes.
    pub async fn setattr(
        &mut self,
        partition: u64,
        object: u64,
        mask: AttrMask,
        attrs: &Attributes,
    ) -> Result<Attributes, ClientError> {
        match self.call(&Request::SetAttr { partition, object, mask, attrs: attrs.masked(mask) }).await? {
            Reply::Attrs(a) => Ok(a),
            other => Err(unexpected("setattr", &other)),
        }
    }

    /// Clones an object copy-on-write.
    pub async fn fastcopy(&mut self, partition: u64, source: u64) -> Result<(u64, Attributes), ClientError> {
        match self.call(&Request::FastCopy { partition, source }).await? {
            Reply::Created { object, attrs } => Ok((object, attrs)),
            other => Err(unexpected("fastcopy", &other)),
        }
    }

    /// Makes objects durable.
    pub async fn flush(&mut self, partition: u64, objects: &[u64]) -> Result<(), ClientError> {
        let reply = self.call(&Request::Flush { partition, objects: objects.to_vec() }).await?;
        expect_done("flush", reply)
    }

    /// (estimated, maximum) blocks needed to overwrite `regions`.
    pub async fn blocks_required(
        &mut self,
        partition: u64,
        object: u64,
        regions: &[Region],
    ) -> Result<(u64, u64), ClientError> {
        match self.call(&Request::BlocksRequired { partition, object, regions: regions.to_vec() }).await? {
            Reply::BlocksRequired { estimated, maximum } => Ok((estimated, maximum)),
            other => Err(unexpected("blocksrequired", &other)),
        }
    }

    /// The object's stored byte ranges from `offset` on — where it is not a
    /// hole — at most `max` (1..=`EXTENTS_MAX`) of them, and `covered_end`:
    /// every stored byte of `[offset, covered_end)` is in one of them (at or
    /// past the object's size the answer is complete; else ask again from
    /// `covered_end`). A reply with extents outside `[offset, covered_end)`
    /// or more than `max` is a protocol error.
    pub async fn extents(
        &mut self,
        partition: u64,
        object: u64,
        offset: u64,
        max: u16,
    ) -> Result<(Vec<Region>, u64), ClientError> {
        match self.call(&Request::Extents { partition, object, offset, max }).await? {
            Reply::Extents { covered_end, extents } => {
                // Ascending, disjoint and within covered_end: checked by the decoder.
                let below = extents.first().is_some_and(|e| e.offset < offset);
                if covered_end < offset || below || extents.len() > max as usize {
                    return Err(ClientError::Protocol(format!(
                        "extents from {offset} (at most {max}): the drive answered {} extents to {covered_end}, \
                         starting at {:?}",
                        extents.len(),
                        extents.first().map(|e| e.offset)
                    )));
                }
                Ok((extents, covered_end))
            }
            other => Err(unexpected("extents", &other)),
        }
    }

    /// The stored BLAKE3 digests of up to `blocks` (1..=`DIGESTS_MAX`)
    /// blocks of the object from block `first_block` on (at the drive's
    /// [`block_size`](Self::block_size)), and the object's logical size: one
    /// digest per block that starts below the size (a hole's is the digest of
    /// a block of zeros). The drive reads no data (`DIGESTS`). A reply with
    /// more digests than the blocks asked for, or a count that disagrees
    /// with the size it reports, is a protocol error.
    pub async fn digests(
        &mut self,
        partition: u64,
        object: u64,
        first_block: u64,
        blocks: u16,
    ) -> Result<(u64, Vec<nasd_crypto::BlockDigest>), ClientError> {
        let bs = u64::from(self.block_size);
        let region = Region { offset: first_block.saturating_mul(bs), length: u64::from(blocks) * bs };
        match self.call(&Request::Digests { partition, object, region }).await? {
            Reply::Digests { logical_size, digests } => {
                let below_size = logical_size.div_ceil(bs).saturating_sub(first_block).min(u64::from(blocks));
                if digests.len() as u64 != below_size {
                    return Err(ClientError::Protocol(format!(
                        "digests of {blocks} blocks from block {first_block}: the drive answered {} for an object \
                         of {logical_size} bytes",
                        digests.len()
                    )));
                }
                Ok((logical_size, digests))
            }
            other => Err(unexpected("digests", &other)),
        }
    }

    /// Creates an empty partition.
    pub async fn create_partition(&mut self, partition: u64) -> Result<(), ClientError> {
        let reply = self.call(&Request::CreatePartition { partition }).await?;
        expect_done("createpartition", reply)
    }

    /// Removes a partition.
    pub async fn remove_partition(&mut self, partition: u64, force: bool) -> Result<(), ClientError> {
        let reply = self.call(&Request::RemovePartition { partition, force }).await?;
        expect_done("removepartition", reply)
    }

    /// Sets a partition's quota.
    pub async fn resize_partition(&mut self, partition: u64, quota_bytes: u64) -> Result<(), ClientError> {
        let reply = self.call(&Request::ResizePartition { partition, quota_bytes }).await?;
        expect_done("resizepartition", reply)
    }

    /// Makes a partition durable.
    pub async fn flush_partition(&mut self, partition: u64) -> Result<(), ClientError> {
        let reply = self.call(&Request::FlushPartition { partition }).await?;
        expect_done("flushpartition", reply)
    }

    /// Opens write transaction `txn` (≠ 0) on an object: from now until it
    /// ends, the drive keeps what every block the object's writes, truncations
    /// and extensions change held before, so that [`txn_end`](Self::txn_end)
    /// can undo them. Beginning the transaction already open is fine; another
    /// one open on the object is `TXN_CONFLICT`. Authorized by the drive key
    /// or the partition's key (the client's [`Auth`]).
    pub async fn txn_begin(&mut self, partition: u64, object: u64, txn: u64) -> Result<(), ClientError> {
        let reply = self.call(&Request::TxnBegin { partition, object, txn }).await?;
        expect_done("txn_begin", reply)
    }

    /// Ends write transaction `txn` on an object: `commit` keeps its changes,
    /// otherwise the object's data and length return to what they were when
    /// it began. Returns whether the transaction was open (ending one that is
    /// not is not an error); another transaction open on the object is
    /// `TXN_CONFLICT`.
    pub async fn txn_end(&mut self, partition: u64, object: u64, txn: u64, commit: bool) -> Result<bool, ClientError> {
        match self.call(&Request::TxnEnd { partition, object, txn, commit }).await? {
            Reply::TxnEnded { was_open } => Ok(was_open),
            other => Err(unexpected("txn_end", &other)),
        }
    }

    /// The open write transactions of a partition on objects above
    /// `after_object`, ascending by object, at most `max` (≤ `TXN_LIST_MAX`):
    /// to list them all, call again after the last object returned until a
    /// reply is shorter than `max`.
    pub async fn txn_list(&mut self, partition: u64, after_object: u64, max: u16) -> Result<Vec<OpenTxn>, ClientError> {
        match self.call(&Request::TxnList { partition, after_object, max }).await? {
            Reply::Txns { txns } => Ok(txns),
            other => Err(unexpected("txn_list", &other)),
        }
    }

    /// Raises `partition`'s minimum cluster map epoch to `epoch`: from then
    /// on the drive refuses every capability minted under an older epoch
    /// with `MAP_EPOCH_MOVED`. The epoch only grows (a lower one is
    /// `BAD_ARGUMENTS`; the same one is fine). Authorized by the drive key or
    /// the partition's key (the client's [`Auth`]); durable when it returns.
    pub async fn set_map_epoch(&mut self, partition: u64, epoch: u32) -> Result<(), ClientError> {
        let reply = self.call(&Request::SetMapEpoch { partition, epoch }).await?;
        expect_done("set_map_epoch", reply)
    }

    // ------------------------------------------- pre-authorization lists
    //
    // The object's and the collections' PALs are the file manager's
    // decisions: set and read under the drive key or the partition's key
    // (an object's also under a working key of its partition), the client's
    // Auth. Each change is durable when it returns, and from then on every
    // request by identity is checked against it.

    /// Replaces an object's access PAL and the PAL collection it belongs to
    /// (0: none). A PAL longer than `PAL_ENTRIES_MAX` is refused with
    /// `PAL_OVERFLOW`, changing nothing.
    pub async fn set_pal(&mut self, partition: u64, object: u64, pal: &ObjectPal) -> Result<(), ClientError> {
        let reply = self.call(&Request::SetPal { partition, object, pal: pal.clone() }).await?;
        expect_done("set_pal", reply)
    }

    /// An object's access PAL and PAL collection (empty if it has none).
    pub async fn get_pal(&mut self, partition: u64, object: u64) -> Result<ObjectPal, ClientError> {
        match self.call(&Request::GetPal { partition, object }).await? {
            Reply::Pal(p) => Ok(p),
            other => Err(unexpected("get_pal", &other)),
        }
    }

    /// Replaces collection `collection`'s (≠ 0) super PAL; an empty list
    /// removes it.
    pub async fn set_super_pal(&mut self, partition: u64, collection: u64, pal: &Pal) -> Result<(), ClientError> {
        let reply = self.call(&Request::SetSuperPal { partition, collection, pal: pal.clone() }).await?;
        expect_done("set_super_pal", reply)
    }

    /// Collection `collection`'s super PAL (empty if it has none).
    pub async fn get_super_pal(&mut self, partition: u64, collection: u64) -> Result<Pal, ClientError> {
        match self.call(&Request::GetSuperPal { partition, collection }).await? {
            Reply::SuperPal(p) => Ok(p),
            other => Err(unexpected("get_super_pal", &other)),
        }
    }

    /// Calls drive extension `name` on `object` (authorized as a read of
    /// it: the client's [`Auth`]); returns the extension's result. A drive
    /// without the extension answers `UNKNOWN_EXTENSION`.
    pub async fn extension(
        &mut self,
        partition: u64,
        object: u64,
        name: &str,
        args: Vec<u8>,
    ) -> Result<Vec<u8>, ClientError> {
        match self.call(&Request::Extension { partition, object, name: name.into(), args }).await? {
            Reply::Extension { result } => Ok(result),
            other => Err(unexpected("extension", &other)),
        }
    }

    /// Sends `prefetch-v1` call `call` for `object`; for a `Hint`, how many
    /// hints the drive queued.
    pub async fn prefetch(
        &mut self,
        partition: u64,
        object: u64,
        call: &nasd_proto::extension::PrefetchCall,
    ) -> Result<u16, ClientError> {
        let result = self.extension(partition, object, nasd_proto::extension::PREFETCH, call.encode()).await?;
        if !matches!(call, nasd_proto::extension::PrefetchCall::Hint { .. }) {
            return Ok(0);
        }
        nasd_proto::extension::decode_hints_queued(&result)
            .map_err(|e| ClientError::Protocol(format!("prefetch-v1 result: {e}")))
    }

    /// Sets which credentials `partition` accepts for object operations
    /// (authorized by the drive key or the partition's key, the client's
    /// [`Auth`]); durable when it returns.
    pub async fn set_auth_scheme(&mut self, partition: u64, scheme: AuthScheme) -> Result<(), ClientError> {
        let reply = self.call(&Request::SetAuthScheme { partition, scheme }).await?;
        expect_done("set_auth_scheme", reply)?;
        self.learn_scheme(partition, scheme);
        Ok(())
    }

    /// What `partition` accepts, asked under the client's [`Auth`] (any
    /// key, or none), and remembered.
    pub async fn auth_scheme(&mut self, partition: u64) -> Result<AuthScheme, ClientError> {
        match self.call(&Request::GetAuthScheme { partition }).await? {
            Reply::AuthScheme(s) => {
                self.learn_scheme(partition, s);
                Ok(s)
            }
            other => Err(unexpected("get_auth_scheme", &other)),
        }
    }

    /// Describes the drive.
    pub async fn inquiry(&mut self) -> Result<DriveInfo, ClientError> {
        match self.call(&Request::Inquiry).await? {
            Reply::Inquiry(d) => Ok(d),
            other => Err(unexpected("inquiry", &other)),
        }
    }

    // ------------------------------------------------------ key management
    //
    // Each of these is authorized by the key it names (whatever the client's
    // Auth is, which stays as it was) under INTEGRITY_ARGS | PRIVACY_ARGS,
    // and carries new keys sealed under the key above them, bound to the
    // slot they are for (`nasd_crypto::key_context`).

    /// Removes every partition and key, sets the drive clock (`clock_ns`; 0
    /// keeps it) and the nonce skew, authorized by the master key. With
    /// `new_master`, the drive's master key becomes that key (sealed under
    /// the current one); otherwise it stays `master`.
    pub async fn initialize(
        &mut self,
        master: &Key,
        new_master: Option<&Key>,
        clock_ns: u64,
        clock_skew_ns: u64,
    ) -> Result<(), ClientError> {
        let sealed_master_key =
            new_master.map(|k| seal_key(master, &key_context(opcode::INITIALIZE, 0, 0), k)).unwrap_or_default();
        let req = Request::Initialize { clock_ns, clock_skew_ns, sealed_master_key };
        let reply = self.call_as(Credential::Master(master.clone()), key_management_protection(), &req).await?;
        expect_done("initialize", reply)
    }

    /// [`initialize`](Self::initialize) without a key (key type `NONE`): only
    /// a drive with security disabled accepts it.
    pub async fn initialize_unprotected(&mut self, clock_ns: u64, clock_skew_ns: u64) -> Result<(), ClientError> {
        let req = Request::Initialize { clock_ns, clock_skew_ns, sealed_master_key: Vec::new() };
        let reply = self.call_as(Credential::None, Protection::NONE, &req).await?;
        expect_done("initialize", reply)
    }

    /// Sets the drive key (sealed under the master key), authorized by the master key.
    pub async fn set_drive_key(&mut self, master: &Key, new_drive_key: &Key) -> Result<(), ClientError> {
        let sealed_key = seal_key(master, &key_context(opcode::SET_DRIVE_KEY, 0, 0), new_drive_key);
        let reply = self
            .call_as(
                Credential::Master(master.clone()),
                key_management_protection(),
                &Request::SetDriveKey { sealed_key },
            )
            .await?;
        expect_done("setdrivekey", reply)
    }

    /// Sets `partition`'s key (sealed under the drive key), authorized by the drive key.
    pub async fn set_partition_key(
        &mut self,
        drive_key: &Key,
        partition: u64,
        new_key: &Key,
    ) -> Result<(), ClientError> {
        let sealed_key = seal_key(drive_key, &key_context(opcode::SET_PARTITION_KEY, partition, 0), new_key);
        let req = Request::SetPartitionKey { partition, sealed_key };
        let reply = self.call_as(Credential::Drive(drive_key.clone()), key_management_protection(), &req).await?;
        expect_done("setpartitionkey", reply)
    }

    /// Makes `new_key` the current working key of `partition` with version
    /// `key_version` (which must exceed the current one); the current key
    /// becomes previous. Sealed under and authorized by the partition key.
    pub async fn set_working_key(
        &mut self,
        partition_key: &Key,
        partition: u64,
        key_version: u32,
        new_key: &Key,
    ) -> Result<(), ClientError> {
        let sealed_key =
            seal_key(partition_key, &key_context(opcode::SET_WORKING_KEY, partition, key_version), new_key);
        let req = Request::SetWorkingKey { partition, key_version, sealed_key };
        let credential = Credential::Partition { partition, key: partition_key.clone() };
        let reply = self.call_as(credential, key_management_protection(), &req).await?;
        expect_done("setworkingkey", reply)
    }

    /// Sets the minimum protection of the drive (`partition` 0; authorized by
    /// the drive key) or of a partition (authorized by its partition key or
    /// the drive key). `credential` is the authorizing key; the drive
    /// refuses any other.
    pub async fn set_min_protection(
        &mut self,
        credential: &Credential,
        partition: u64,
        protection: Protection,
    ) -> Result<(), ClientError> {
        let req = Request::SetMinProtection { partition, protection };
        let reply = self.call_as(credential.clone(), key_management_protection(), &req).await?;
        expect_done("setminprotection", reply)
    }

    /// Installs identity key `key_id` (one of DSFS's shared keys K; ids only
    /// grow, at most `IDENTITY_KEYS_MAX` live at once), sealed under and
    /// authorized by the drive key. Identity keys made with it
    /// (`nasd_crypto::identity_key`) are accepted from then on.
    pub async fn set_identity_key(&mut self, drive_key: &Key, key_id: u32, key: &Key) -> Result<(), ClientError> {
        let sealed_key = seal_key(drive_key, &key_context(opcode::SET_IDENTITY_KEY, 0, key_id), key);
        let req = Request::SetIdentityKey { key_id, sealed_key };
        let reply = self.call_as(Credential::Drive(drive_key.clone()), key_management_protection(), &req).await?;
        expect_done("set_identity_key", reply)
    }

    /// Retires identity key `key_id`, authorized by the drive key: every
    /// identity key made with it is refused from then on (`KEY_VERSION_RETIRED`).
    pub async fn retire_identity_key(&mut self, drive_key: &Key, key_id: u32) -> Result<(), ClientError> {
        let req = Request::RetireIdentityKey { key_id };
        let reply = self.call_as(Credential::Drive(drive_key.clone()), key_management_protection(), &req).await?;
        expect_done("retire_identity_key", reply)
    }

    /// Audit records with sequence numbers above `after`, at most `max`
    /// (≤ `AUDIT_RECORDS_PER_REPLY_MAX`), oldest first; authorized by the drive key.
    pub async fn read_audit(&mut self, drive_key: &Key, after: u64, max: u16) -> Result<Vec<AuditRecord>, ClientError> {
        let req = Request::ReadAudit { after, max };
        match self.call_as(Credential::Drive(drive_key.clone()), key_management_protection(), &req).await? {
            Reply::Audit { records } => Ok(records),
            other => Err(unexpected("readaudit", &other)),
        }
    }

    /// Has the drive re-read every stored block and check it against its
    /// stored digest (authorized by the drive key). Returns (blocks checked,
    /// corrupt blocks in all, the first `max_report` of them as (partition,
    /// object, logical block)).
    pub async fn scrub(
        &mut self,
        drive_key: &Key,
        max_report: u16,
    ) -> Result<(u64, u64, Vec<(u64, u64, u64)>), ClientError> {
        let req = Request::Scrub { max_report };
        match self.call_as(Credential::Drive(drive_key.clone()), key_management_protection(), &req).await? {
            Reply::Scrub { blocks_checked, corrupt_total, corrupt } => Ok((blocks_checked, corrupt_total, corrupt)),
            other => Err(unexpected("scrub", &other)),
        }
    }
}
