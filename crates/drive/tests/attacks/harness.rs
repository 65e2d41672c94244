//! The attack harness: a drive with security enforced, served on 127.0.0.1:0
//! from its own thread and runtime (so it can be stopped and restarted on the
//! same store), a frame builder that protects requests exactly as
//! docs/SECURITY.md says, a reply checker that verifies replies exactly as a
//! client must, a tampering TCP proxy, and the "nothing changed, and honest
//! clients still work" check every case ends with.

#![allow(dead_code)]

use nasd_client::{Auth, ClientError, Credential, DriveClient};
use nasd_crypto::{key_context, mint_capability, seal_key, FrameKeys, Key, MacAlgorithm};
use nasd_drive::{DriveConfig, SecurityMode};
use nasd_proto::limits::{DIGEST_LEN, HEADER_LEN, NONCE_LEN};
use nasd_proto::{
    decode_error_message, not_itemized, opcode, rights, AttrMask, Attributes, AuditRecord, CapabilityArgs, FrameHeader,
    FramePrefix, KeyType, Kind, Protection, Region, Reply, Request, Status, VERSION,
};
use nasd_store::{Store, StoreOptions};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Longest any single network step may take before the test fails.
pub const STEP: Duration = Duration::from_secs(20);
/// The partition every attack targets.
pub const P1: u64 = 1;
/// A second partition with its own keys. 3 = 1 ^ 2: a one-bit flip of P1's
/// number in a capability names it.
pub const P2: u64 = 3;
/// A partition with no keys at all.
pub const P_NO_KEYS: u64 = 5;
pub const QUOTA: u64 = 4 << 20;
pub const BLOCK: u32 = 4096;
pub const VICTIM_LEN: usize = 10_000;
pub const SCRATCH_LEN: usize = 4096;
/// Chunk length of request data built here (the smallest the protocol allows,
/// so small writes have several chunks).
pub const CHUNK: u32 = 512;
/// Chunk length of the drive's read replies.
pub const REPLY_CHUNK: u32 = 1024;
pub const SKEW_NS: u64 = nasd_store::DEFAULT_SKEW_NS;

// Protection bits.
pub const NONE: u8 = 0;
pub const IA: u8 = 1;
pub const ID: u8 = 2;
pub const PA: u8 = 4;
pub const PD: u8 = 8;
pub const PC: u8 = 16;
/// `HASH_AND_MAC`.
pub const HM: u8 = 1 << 5;
pub const ALL: u8 = IA | ID | PA | PD | PC;
/// Every defined protection bit.
pub const DEFINED: u8 = ALL | HM;

pub fn prot(bits: u8) -> Protection {
    Protection::from_bits(bits).expect("defined protection bits")
}

pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_nanos() as u64
}

static SEQUENCE: AtomicU64 = AtomicU64::new(1);
static REQUEST_ID: AtomicU64 = AtomicU64::new(0x0a77_ac00_0000_0000);

/// A nonce at `time_ns` with a sequence number no other frame of this process uses.
pub fn nonce_at(time_ns: u64) -> [u8; NONCE_LEN] {
    nasd_proto::nonce(time_ns, SEQUENCE.fetch_add(1, Ordering::Relaxed))
}

/// A nonce at the drive's clock now (the drive clock is the system clock here).
pub fn fresh_nonce() -> [u8; NONCE_LEN] {
    nonce_at(now_ns())
}

pub fn rg(offset: u64, length: u64) -> Region {
    Region { offset, length }
}

/// Deterministic bytes, never zero.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5DEE_CE66_D1CE_4E5B;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as u8) | 1
        })
        .collect()
}

pub fn victim_bytes() -> Vec<u8> {
    pattern(0x7167, VICTIM_LEN)
}

pub async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(STEP, f).await.expect("step timed out: the drive or the client hung")
}

/// Statuses the drive gives before a request has proved its key (checks 1–4
/// of SECURITY.md, and framing errors): their replies carry no key, and
/// their audit records no audit id. Every later refusal (checks 5–15) is
/// protected like a reply and audited with the capability's audit id.
pub fn before_authentication(s: Status) -> bool {
    matches!(
        s,
        Status::ProtectionUnsupported
            | Status::BadCapability
            | Status::KeyVersionRetired
            | Status::KeyNotSet
            | Status::BadDigest
            | Status::MalformedFrame
            | Status::LimitExceeded
            | Status::VersionUnsupported
    )
}

// ------------------------------------------------------------- credentials

/// The key a frame is protected with, as the harness holds it.
#[derive(Clone)]
pub enum Cred {
    None,
    Cap { token: Vec<u8>, key: Key, alg: MacAlgorithm, args: CapabilityArgs },
    Master(Key),
    Drive(Key),
    Partition(u64, Key),
    Working(u64, u32, Key),
}

impl Cred {
    pub fn key_type(&self) -> KeyType {
        match self {
            Cred::None => KeyType::None,
            Cred::Cap { .. } => KeyType::Capability,
            Cred::Master(_) => KeyType::Master,
            Cred::Drive(_) => KeyType::Drive,
            Cred::Partition(..) => KeyType::Partition,
            Cred::Working(..) => KeyType::Working,
        }
    }
    /// The frame's capability field: token, or key selector.
    pub fn field(&self) -> Vec<u8> {
        match self {
            Cred::Cap { token, .. } => token.clone(),
            Cred::Partition(p, _) => p.to_le_bytes().to_vec(),
            Cred::Working(p, v, _) => {
                let mut s = p.to_le_bytes().to_vec();
                s.extend_from_slice(&v.to_le_bytes());
                s
            }
            _ => Vec::new(),
        }
    }
    pub fn key(&self) -> Option<&Key> {
        match self {
            Cred::None => None,
            Cred::Cap { key, .. }
            | Cred::Master(key)
            | Cred::Drive(key)
            | Cred::Partition(_, key)
            | Cred::Working(_, _, key) => Some(key),
        }
    }
    pub fn alg(&self) -> MacAlgorithm {
        match self {
            Cred::Cap { alg, .. } => *alg,
            _ => MacAlgorithm::Blake3,
        }
    }
    pub fn audit_id(&self) -> u64 {
        match self {
            Cred::Cap { args, .. } => args.audit_id,
            _ => 0,
        }
    }
    pub fn token(&self) -> &[u8] {
        match self {
            Cred::Cap { token, .. } => token,
            _ => panic!("not a capability"),
        }
    }
    pub fn args(&self) -> &CapabilityArgs {
        match self {
            Cred::Cap { args, .. } => args,
            _ => panic!("not a capability"),
        }
    }
    /// The same token with another capability key (a forgery).
    pub fn with_key(&self, key: Key) -> Cred {
        match self {
            Cred::Cap { token, alg, args, .. } => {
                Cred::Cap { token: token.clone(), key, alg: *alg, args: args.clone() }
            }
            _ => panic!("not a capability"),
        }
    }
    /// Another token (edited by a hostile client) with this credential's key.
    pub fn with_token(&self, token: Vec<u8>, args: CapabilityArgs) -> Cred {
        match self {
            Cred::Cap { key, alg, .. } => Cred::Cap { token, key: key.clone(), alg: *alg, args },
            _ => panic!("not a capability"),
        }
    }
    /// The nasd-client credential for the same key.
    pub fn client(&self) -> Credential {
        match self.clone() {
            Cred::None => Credential::None,
            Cred::Cap { token, key, alg, .. } => Credential::Capability { token, key, algorithm: alg },
            Cred::Master(k) => Credential::Master(k),
            Cred::Drive(k) => Credential::Drive(k),
            Cred::Partition(partition, key) => Credential::Partition { partition, key },
            Cred::Working(partition, key_version, key) => Credential::Working { partition, key_version, key },
        }
    }
}

// ------------------------------------------------------------------ frames

/// A request frame as sent, with where its sections start.
#[derive(Clone)]
pub struct Frame {
    pub bytes: Vec<u8>,
    pub cred: Cred,
    pub header: FrameHeader,
    pub cap_at: usize,
    pub args_at: usize,
    pub digest_at: usize,
    pub data_at: usize,
}

/// Builds a protected request frame exactly as SECURITY.md specifies:
/// arguments encrypted first under PRIVACY_ARGS, then digest =
/// FrameKeys::digest over every byte before it, then data chunks sealed by
/// FrameKeys::data seeded with the digest, each followed by its tag.
pub fn build(
    cred: &Cred,
    protection: u8,
    field: &[u8],
    op: u16,
    args: &[u8],
    data: &[u8],
    nonce: [u8; NONCE_LEN],
) -> Frame {
    let protection = Protection::from_bits(protection).expect("defined bits");
    let mut h = FrameHeader::request(op, REQUEST_ID.fetch_add(1, Ordering::Relaxed));
    h.key_type = cred.key_type();
    h.protection = protection;
    h.nonce = nonce;
    h.data_len = data.len() as u64;
    h.chunk_len = if data.is_empty() { 0 } else { CHUNK };
    h.capability_len = field.len() as u16;
    h.args_len = args.len() as u32;
    let keys = cred.key().map(|k| FrameKeys::new(cred.alg(), k));
    let mut args = args.to_vec();
    if protection.covers(Protection::PRIVACY_ARGS) {
        if let Some(k) = &keys {
            k.crypt_args(Kind::Request, &nonce, &mut args);
        }
    }
    let mut bytes = FramePrefix::encode(&h, field, &args, &[0; DIGEST_LEN]);
    let digest_at = bytes.len() - DIGEST_LEN;
    let digest = keys.as_ref().map_or([0; DIGEST_LEN], |k| k.digest(protection, &bytes[..digest_at]));
    bytes[digest_at..].copy_from_slice(&digest);
    let data_at = bytes.len();
    let mut protector = keys.as_ref().map(|k| k.data(Kind::Request, &nonce, protection, &digest));
    for chunk in data.chunks(CHUNK as usize) {
        let mut c = chunk.to_vec();
        let tag = protector.as_mut().map(|p| p.seal_chunk(&mut c)).unwrap_or_default();
        bytes.extend_from_slice(&c);
        bytes.extend_from_slice(&tag);
    }
    Frame {
        bytes,
        cred: cred.clone(),
        header: h,
        cap_at: HEADER_LEN,
        args_at: HEADER_LEN + field.len(),
        digest_at,
        data_at,
    }
}

pub fn frame(cred: &Cred, protection: u8, req: &Request) -> Frame {
    build(cred, protection, &cred.field(), req.opcode(), &req.encode_args(), &[], fresh_nonce())
}

pub fn frame_data(cred: &Cred, protection: u8, req: &Request, data: &[u8]) -> Frame {
    build(cred, protection, &cred.field(), req.opcode(), &req.encode_args(), data, fresh_nonce())
}

pub fn frame_at(cred: &Cred, protection: u8, req: &Request, nonce: [u8; NONCE_LEN]) -> Frame {
    build(cred, protection, &cred.field(), req.opcode(), &req.encode_args(), &[], nonce)
}

// ------------------------------------------------------------------ replies

/// A reply as it came off the wire.
pub struct Wire {
    pub header: FrameHeader,
    pub prefix: Vec<u8>,
    /// Data chunks with their tags.
    pub data: Vec<u8>,
}

pub fn read_wire(s: &mut TcpStream) -> std::io::Result<Wire> {
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head)?;
    let header =
        FrameHeader::decode(&head).unwrap_or_else(|e| panic!("drive sent an invalid header ({e}): {head:02x?}"));
    assert_eq!(header.kind, Kind::Reply, "drive sent a non-reply frame");
    let mut prefix = head.to_vec();
    prefix.resize(HEADER_LEN + header.body_len(), 0);
    s.read_exact(&mut prefix[HEADER_LEN..])?;
    let wire_data = header.data_len + header.chunk_count() * header.protection.data_tag_len() as u64;
    assert!(wire_data <= 16 << 20, "replies in this suite are small; got data_len {}", header.data_len);
    let mut data = vec![0u8; wire_data as usize];
    s.read_exact(&mut data)?;
    Ok(Wire { header, prefix, data })
}

/// A reply checked the way a client must check it.
pub struct Rep {
    pub header: FrameHeader,
    /// Plaintext arguments.
    pub args: Vec<u8>,
    /// Plaintext data.
    pub data: Vec<u8>,
    /// The reply carries the request's key type and protection and its
    /// digest verified under the request's key, bound to the request's
    /// digest (zero, proving nothing, when the request had no INTEGRITY_ARGS).
    pub authenticated: bool,
}

impl Rep {
    pub fn status(&self) -> Status {
        Status::from_code(self.header.status).unwrap_or_else(|| panic!("unknown status {}", self.header.status))
    }
    pub fn message(&self) -> String {
        if self.header.status == 0 {
            String::new()
        } else {
            decode_error_message(&self.args).unwrap_or_else(|e| format!("<undecodable message: {e}>"))
        }
    }
    pub fn reply(&self) -> Reply {
        assert_eq!(self.status(), Status::Ok, "not a success: {}", self.message());
        Reply::decode(self.header.opcode, &self.args).expect("reply results decode")
    }
}

/// Verifies a reply exactly as a client must (and as nasd-client does): it
/// answers the request; it is either an unprotected refusal, or it carries
/// the request's key type and protection and its digest is
/// MAC(request digest ‖ reply bytes before the digest) under the request's
/// key (zero without INTEGRITY_ARGS: never the key); then arguments are
/// decrypted and every data chunk's tag is checked before the chunk is used. A reply that fails any of this fails the
/// test: the drive must never send one.
pub fn open_reply(sent: &Frame, w: Wire) -> Rep {
    let h = w.header.clone();
    assert_eq!(
        (h.request_id, h.opcode),
        (sent.header.request_id, sent.header.opcode),
        "the reply does not answer the request"
    );
    let parsed = FramePrefix::parse(&w.prefix).expect("reply prefix parses");
    assert!(parsed.capability.is_empty(), "replies carry no capability");
    let mut args = parsed.args.to_vec();
    if h.key_type == KeyType::None {
        assert_eq!(h.protection, Protection::NONE, "an unkeyed reply claims protection");
        assert!(
            h.status != 0 || sent.header.key_type == KeyType::None,
            "a success answered a keyed request without protection"
        );
        return Rep { header: h, args, data: w.data, authenticated: false };
    }
    assert_eq!(
        (h.key_type, h.protection),
        (sent.header.key_type, sent.header.protection),
        "reply protection differs from the request's"
    );
    let key = sent.cred.key().expect("a protected reply to a request without a key");
    let keys = FrameKeys::new(sent.cred.alg(), key);
    let split = w.prefix.len() - DIGEST_LEN;
    let request_digest = &sent.bytes[sent.digest_at..sent.digest_at + DIGEST_LEN];
    assert!(
        keys.verify_reply_digest(h.protection, request_digest, &w.prefix[..split], &parsed.digest),
        "the drive's reply digest does not verify (or is not bound to the request)"
    );
    if h.protection.covers(Protection::PRIVACY_ARGS) {
        keys.crypt_args(Kind::Reply, &h.nonce, &mut args);
    }
    let mut protector = keys.data(Kind::Reply, &h.nonce, h.protection, &parsed.digest);
    let tag_len = h.protection.data_tag_len();
    let mut data = Vec::with_capacity(h.data_len as usize);
    let mut at = 0;
    for i in 0..h.chunk_count() {
        let n = h.chunk_size(i) as usize;
        let mut chunk = w.data[at..at + n].to_vec();
        protector
            .open_chunk(&mut chunk, &w.data[at + n..at + n + tag_len])
            .expect("the drive's reply data tag does not verify");
        data.extend_from_slice(&chunk);
        at += n + tag_len;
    }
    Rep { header: h, args, data, authenticated: true }
}

/// A raw TCP connection to the drive, with timeouts.
pub struct Conn(pub TcpStream);

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect_timeout(&addr, STEP).expect("connect to the drive");
        s.set_read_timeout(Some(STEP)).unwrap();
        s.set_write_timeout(Some(STEP)).unwrap();
        s.set_nodelay(true).unwrap();
        Conn(s)
    }
    pub fn send(&mut self, f: &Frame) -> Rep {
        self.0.write_all(&f.bytes).expect("send a frame");
        open_reply(f, read_wire(&mut self.0).expect("the drive sent no reply"))
    }
    /// Sends `bytes`, closes the write half, and returns the first reply's
    /// status, or None if the drive closed without one.
    pub fn send_and_close(mut self, bytes: &[u8]) -> Option<Status> {
        if self.0.write_all(bytes).is_err() {
            return None;
        }
        let _ = self.0.shutdown(Shutdown::Write);
        read_wire(&mut self.0).ok().map(|w| Status::from_code(w.header.status).expect("known status"))
    }
    /// Asserts the drive has closed the connection.
    pub fn assert_closed(&mut self, what: &str) {
        let mut buf = [0u8; 256];
        match self.0.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => panic!("{what}: expected the drive to close the connection, got {n} more bytes"),
            Err(e) => assert!(
                matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe),
                "{what}: unexpected error waiting for close: {e}"
            ),
        }
    }
}

// ------------------------------------------------------------------ server

/// A drive served from its own thread and runtime; stopping it drops every
/// connection task and the store, so the store directory can be reopened.
pub struct Server {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Server {
    /// Starts serving `dir` with read replies in `reply_chunk`-byte chunks;
    /// returns the server, its address, and a time taken before the drive
    /// started (so before its boot time).
    pub fn start(dir: &Path, master: &Key, reply_chunk: u32) -> (Server, SocketAddr, u64) {
        let before = now_ns();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let (dir, master) = (dir.to_path_buf(), master.clone());
        let thread = std::thread::spawn(move || {
            let rt =
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
            rt.block_on(async move {
                let opts = StoreOptions { block_size: BLOCK, capacity_bytes: 64 << 20, ..StoreOptions::default() };
                let store = Arc::new(Store::open(&dir, &opts).expect("store opens"));
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let config = DriveConfig {
                    chunk_len: Some(reply_chunk),
                    security: SecurityMode::Enforced { master_key: Some(master) },
                    ..DriveConfig::default()
                };
                nasd_drive::serve(listener, store, config, async move {
                    let _ = rx.await;
                })
                .await
                .expect("serve");
            });
            rt.shutdown_timeout(Duration::from_secs(10));
        });
        (Server { stop, thread }, addr, before)
    }

    pub fn stop(self) {
        let _ = self.stop.send(());
        self.thread.join().expect("drive thread");
    }
}

// ------------------------------------------------------------------- drive

#[derive(Clone, Default)]
pub struct Snapshot {
    pub attrs: Attributes,
    pub bytes: Vec<u8>,
    pub used: u64,
}

/// An audit record the drive must have written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expect {
    pub opcode: u16,
    pub key_type: u8,
    pub status: Status,
    pub audit_id: u64,
}

impl Expect {
    fn matches(&self, r: &AuditRecord) -> bool {
        r.opcode == self.opcode
            && r.key_type == self.key_type
            && r.status == self.status as u16
            && r.audit_id == self.audit_id
    }

    /// A refusal of a request that proved no key: the drive may count it in
    /// a `NOT_ITEMIZED` record instead of itemizing it (its rate limit).
    fn proved_no_key(&self) -> bool {
        self.status != Status::Ok && (before_authentication(self.status) || self.key_type == KeyType::None as u8)
    }
}

/// A drive with keys and objects, and everything the attacks need.
pub struct Drive {
    dir: tempfile::TempDir,
    /// Chunk length of the drive's read replies.
    pub reply_chunk: u32,
    pub master: Key,
    pub drive_key: Key,
    pub pkeys: HashMap<u64, Key>,
    /// Every working key ever set, per partition, oldest first.
    working: RefCell<HashMap<u64, Vec<(u32, Key)>>>,
    server: RefCell<Option<Server>>,
    addr: Cell<SocketAddr>,
    started_before: Cell<u64>,
    pub rt: tokio::runtime::Runtime,
    pub drive_id: [u8; 16],
    pub victim: u64,
    pub scratch: u64,
    snap: RefCell<Snapshot>,
    expected: RefCell<Vec<Expect>>,
    audit_ids: Cell<u64>,
    round: Cell<u64>,
    /// Names of the named cases run, in order.
    pub cases: RefCell<Vec<String>>,
}

impl Drop for Drive {
    fn drop(&mut self) {
        if let Some(s) = self.server.borrow_mut().take() {
            s.stop();
        }
    }
}

impl Drive {
    /// A drive with a master key; a drive key set with `setdrivekey`;
    /// partitions P1 and P2 with quotas, partition keys and working key 1; a
    /// victim object in P1 with content; and a scratch object honest
    /// clients write. All set up with protected requests built here.
    pub fn start() -> Drive {
        Drive::start_with_reply_chunk(REPLY_CHUNK)
    }

    /// [`Drive::start`], the drive sending read replies in `reply_chunk`-byte chunks.
    pub fn start_with_reply_chunk(reply_chunk: u32) -> Drive {
        let dir = tempfile::tempdir().expect("tempdir");
        let master = Key::random();
        let (server, addr, before) = Server::start(dir.path(), &master, reply_chunk);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("client runtime");
        let mut d = Drive {
            dir,
            reply_chunk,
            master,
            drive_key: Key::random(),
            pkeys: [(P1, Key::random()), (P2, Key::random())].into_iter().collect(),
            working: RefCell::new(HashMap::new()),
            server: RefCell::new(Some(server)),
            addr: Cell::new(addr),
            started_before: Cell::new(before),
            rt,
            drive_id: [0; 16],
            victim: 0,
            scratch: 0,
            snap: RefCell::new(Snapshot::default()),
            expected: RefCell::new(Vec::new()),
            audit_ids: Cell::new(1000),
            round: Cell::new(0),
            cases: RefCell::new(Vec::new()),
        };
        let hello = Request::Hello { min_version: VERSION, max_version: VERSION, client: "attacks".into() };
        match d.ok(&Cred::None, NONE, &hello) {
            Reply::Hello { drive_id, .. } => d.drive_id = drive_id,
            other => panic!("unexpected hello reply {other:?}"),
        }
        let sealed = seal_key(&d.master, &key_context(opcode::SET_DRIVE_KEY, 0, 0), &d.drive_key);
        d.ok(&Cred::Master(d.master.clone()), IA, &Request::SetDriveKey { sealed_key: sealed });
        let dk = d.dk();
        for p in [P1, P2] {
            d.ok(&dk, IA, &Request::CreatePartition { partition: p });
            d.ok(&dk, IA, &Request::ResizePartition { partition: p, quota_bytes: QUOTA });
            let sealed = seal_key(&d.drive_key, &key_context(opcode::SET_PARTITION_KEY, p, 0), &d.pkeys[&p]);
            d.ok(&dk, IA, &Request::SetPartitionKey { partition: p, sealed_key: sealed });
            d.rotate(p, 1);
        }
        d.ok(&dk, IA, &Request::CreatePartition { partition: P_NO_KEYS });
        d.victim = d.create_object(P1, &victim_bytes());
        d.scratch = d.create_object(P1, &vec![0x5a; SCRATCH_LEN]);
        d.snapshot();
        d
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr.get()
    }

    /// A time before the running drive started.
    pub fn started_before(&self) -> u64 {
        self.started_before.get()
    }

    pub fn dk(&self) -> Cred {
        Cred::Drive(self.drive_key.clone())
    }

    pub fn pk(&self, p: u64) -> Cred {
        Cred::Partition(p, self.pkeys[&p].clone())
    }

    /// Stops the drive (final commit) and serves the same store again.
    pub fn restart(&self) {
        self.server.borrow_mut().take().expect("drive running").stop();
        let (server, addr, before) = Server::start(self.dir.path(), &self.master, self.reply_chunk);
        *self.server.borrow_mut() = Some(server);
        self.addr.set(addr);
        self.started_before.set(before);
    }

    // ----------------------------------------------------------- keys

    /// Sets working key `version` of `p` (sealed under and authorized by the
    /// partition key) and returns it.
    pub fn rotate(&self, p: u64, version: u32) -> Key {
        let k = Key::random();
        let sealed = seal_key(&self.pkeys[&p], &key_context(opcode::SET_WORKING_KEY, p, version), &k);
        self.ok(&self.pk(p), IA, &Request::SetWorkingKey { partition: p, key_version: version, sealed_key: sealed });
        self.working.borrow_mut().entry(p).or_default().push((version, k.clone()));
        k
    }

    /// Any working key ever set for (p, version).
    pub fn working_key(&self, p: u64, version: u32) -> Option<Key> {
        self.working.borrow().get(&p)?.iter().find(|(v, _)| *v == version).map(|(_, k)| k.clone())
    }

    /// True if the drive holds working key `version` of `p` (current or previous).
    pub fn live(&self, p: u64, version: u32) -> bool {
        self.working.borrow().get(&p).is_some_and(|l| l.iter().rev().take(2).any(|(v, _)| *v == version))
    }

    pub fn current_version(&self, p: u64) -> u32 {
        self.working.borrow()[&p].last().expect("a working key").0
    }

    pub fn next_audit_id(&self) -> u64 {
        let id = self.audit_ids.get() + 1;
        self.audit_ids.set(id);
        id
    }

    /// Capability arguments a file manager would mint: current working key,
    /// this drive, whole object, the object's current ACV, IA minimum, one
    /// hour, a fresh audit id.
    pub fn cap_args(&self, p: u64, object: u64, rights: u32) -> CapabilityArgs {
        let acv = if p == P1 && object == self.victim { self.snap.borrow().attrs.access_control_version } else { 0 };
        CapabilityArgs {
            algorithm: MacAlgorithm::Blake3 as u8,
            min_protection: prot(IA),
            key_version: self.current_version(p),
            drive_id: self.drive_id,
            partition: p,
            object,
            region: CapabilityArgs::WHOLE_OBJECT,
            access_control_version: acv,
            rights,
            map_epoch: 0,
            expiration_ns: now_ns() + 3600 * 1_000_000_000,
            audit_id: self.next_audit_id(),
        }
    }

    /// Mints `args` with the working key it names (a random key if none was
    /// ever set), as the file manager does.
    pub fn mint(&self, args: &CapabilityArgs, sealed: bool) -> Cred {
        let working = self.working_key(args.partition, args.key_version).unwrap_or_else(Key::random);
        let (token, key) = mint_capability(&working, args, sealed).expect("known algorithm");
        let alg = MacAlgorithm::from_id(args.algorithm).expect("known algorithm");
        Cred::Cap { token, key, alg, args: args.clone() }
    }

    /// A clear capability for the victim, edited by `f`.
    pub fn cap(&self, rights: u32, f: impl FnOnce(&mut CapabilityArgs)) -> Cred {
        let mut a = self.cap_args(P1, self.victim, rights);
        f(&mut a);
        self.mint(&a, false)
    }

    pub fn read_req(&self, offset: u64, length: u64) -> Request {
        Request::Read { partition: P1, object: self.victim, regions: vec![rg(offset, length)] }
    }

    pub fn write_req(&self, offset: u64, length: u64) -> Request {
        Request::Write { partition: P1, object: self.victim, regions: vec![rg(offset, length)] }
    }

    // ----------------------------------------------------- exchanges

    pub fn send(&self, f: &Frame) -> Rep {
        Conn::open(self.addr()).send(f)
    }

    /// Sends a request that must succeed; returns its results.
    pub fn ok(&self, cred: &Cred, protection: u8, req: &Request) -> Reply {
        let f = frame(cred, protection, req);
        self.expect_ok("setup", &f).reply()
    }

    pub fn ok_data(&self, cred: &Cred, protection: u8, req: &Request, data: &[u8]) -> Rep {
        self.expect_ok("setup", &frame_data(cred, protection, req, data))
    }

    /// Sends `f`, which must be authorized and succeed.
    pub fn expect_ok(&self, name: &str, f: &Frame) -> Rep {
        let rep = self.send(f);
        self.judge(name, f, &rep, Status::Ok);
        rep
    }

    /// Asserts `rep` answers `f` with `want` and that its protection fits:
    /// refusals before authentication are unkeyed, anything after carries
    /// the request's key. Records the audit record the drive must write.
    pub fn judge(&self, name: &str, f: &Frame, rep: &Rep, want: Status) {
        assert_eq!(rep.status(), want, "{name}: wrong status; the drive said {:?}", rep.message());
        if want != Status::Ok {
            assert!(!rep.message().is_empty(), "{name}: refusal without a message");
            assert_eq!(rep.header.data_len, 0, "{name}: refusal with data");
        }
        if before_authentication(want) {
            assert!(!rep.authenticated, "{name}: a refusal before authentication claims a key");
        } else if f.cred.key().is_some() {
            assert!(rep.authenticated, "{name}: a reply after authentication must be protected with the request's key");
        }
        self.record(f, want);
    }

    /// Notes the audit record `f` answered with `status` must leave.
    pub fn record(&self, f: &Frame, status: Status) {
        if matches!(status, Status::MalformedFrame | Status::LimitExceeded | Status::VersionUnsupported)
            || f.header.opcode == opcode::HELLO
        {
            return;
        }
        let audit_id = if before_authentication(status) { 0 } else { f.cred.audit_id() };
        self.expected.borrow_mut().push(Expect {
            opcode: f.header.opcode,
            key_type: f.header.key_type as u8,
            status,
            audit_id,
        });
    }

    /// One named attack: send `f` on a new connection, assert the exact
    /// status, then that nothing changed and an honest client still works.
    pub fn attack(&self, name: &str, f: &Frame, want: Status) -> Rep {
        let rep = self.send(f);
        self.judge(name, f, &rep, want);
        self.cases.borrow_mut().push(name.to_string());
        self.verify(name);
        rep
    }

    /// A named positive control: `f` must succeed; the victim must be
    /// unchanged (a control never modifies it).
    pub fn control(&self, name: &str, f: &Frame) -> Rep {
        let rep = self.expect_ok(name, f);
        self.verify(name);
        rep
    }

    // --------------------------------------------------- verification

    /// The victim's attributes and bytes and P1's usage, via the drive key
    /// (nasd-client, every protection option).
    pub fn observe(&self) -> Snapshot {
        let (addr, key, victim) = (self.addr(), self.drive_key.clone(), self.victim);
        self.rt.block_on(async move {
            let mut c = to(DriveClient::connect(addr)).await.expect("admin connects");
            c.set_auth(Auth::new(Credential::Drive(key), prot(ALL)));
            let attrs = to(c.getattr(P1, victim)).await.expect("admin getattr");
            let (_, bytes) = to(c.read(P1, victim, &[rg(0, VICTIM_LEN as u64 + 8192)])).await.expect("admin read");
            let info = to(c.inquiry()).await.expect("inquiry");
            let used = info.partitions.iter().find(|p| p.partition == P1).expect("P1 listed").used_bytes;
            Snapshot { attrs, bytes, used }
        })
    }

    /// Takes the current state as the expected one (after an authorized change).
    pub fn snapshot(&self) {
        *self.snap.borrow_mut() = self.observe();
    }

    pub fn victim_attrs(&self) -> Attributes {
        self.snap.borrow().attrs.clone()
    }

    pub fn victim_content(&self) -> Vec<u8> {
        self.snap.borrow().bytes.clone()
    }

    /// Nothing changed (victim bytes and attributes, P1 usage), and an honest
    /// client on another connection still works.
    pub fn verify(&self, name: &str) {
        let now = self.observe();
        let snap = self.snap.borrow();
        assert_eq!(now.attrs, snap.attrs, "after {name}: the victim's attributes changed");
        assert!(now.bytes == snap.bytes, "after {name}: the victim's bytes changed");
        assert_eq!(now.used, snap.used, "after {name}: the partition's usage changed");
        drop(snap);
        self.honest_round(name);
    }

    /// A cheap check for loops: one raw drive-key getattr of the victim.
    pub fn quick_check(&self, name: &str) {
        let f = frame(&self.dk(), IA, &Request::GetAttr { partition: P1, object: self.victim });
        match self.send(&f).reply() {
            Reply::Attrs(a) => assert_eq!(a, self.snap.borrow().attrs, "after {name}: the victim's attributes changed"),
            other => panic!("unexpected getattr reply {other:?}"),
        }
    }

    /// An honest client (nasd-client, a sealed capability minted now, every
    /// protection option) writes the scratch object and reads it back.
    pub fn honest_round(&self, name: &str) {
        let n = self.round.get() + 1;
        self.round.set(n);
        let mut args = self.cap_args(P1, self.scratch, rights::ALL);
        args.min_protection = prot(ALL);
        let cred = self.mint(&args, true).client();
        let (addr, scratch) = (self.addr(), self.scratch);
        let data = pattern(n ^ 0xabcd, SCRATCH_LEN);
        self.rt.block_on(async move {
            let mut c =
                to(DriveClient::connect(addr)).await.unwrap_or_else(|e| panic!("after {name}: honest connect: {e}"));
            c.set_auth(Auth::new(cred, prot(ALL)));
            let wrote = to(c.write(P1, scratch, &[rg(0, SCRATCH_LEN as u64)], &data))
                .await
                .unwrap_or_else(|e| panic!("after {name}: honest write failed: {e}"));
            assert_eq!(wrote, SCRATCH_LEN as u64);
            let (_, back) = to(c.read(P1, scratch, &[rg(0, SCRATCH_LEN as u64)]))
                .await
                .unwrap_or_else(|e| panic!("after {name}: honest read failed: {e}"));
            assert!(back == data, "after {name}: honest write did not read back");
        });
    }

    /// Creates an object in `p` with `content` (drive key).
    pub fn create_object(&self, p: u64, content: &[u8]) -> u64 {
        let dk = self.dk();
        let object = match self.ok(
            &dk,
            IA,
            &Request::Create { partition: p, mask: AttrMask::default(), attrs: Attributes::default() },
        ) {
            Reply::Created { object, .. } => object,
            other => panic!("unexpected create reply {other:?}"),
        };
        if !content.is_empty() {
            let req = Request::Write { partition: p, object, regions: vec![rg(0, content.len() as u64)] };
            self.ok_data(&dk, IA | ID, &req, content);
        }
        object
    }

    // ----------------------------------------------------------- audit

    /// The whole audit trail, via READ_AUDIT under the drive key.
    pub fn audit_trail(&self) -> Vec<AuditRecord> {
        let (addr, key) = (self.addr(), self.drive_key.clone());
        self.rt.block_on(async move {
            let mut c = to(DriveClient::connect(addr)).await.expect("connect");
            let mut all = Vec::new();
            let mut after = 0;
            loop {
                // Each readaudit is itself audited: stop at a short page,
                // not an empty one.
                let page = to(c.read_audit(&key, after, 512)).await.expect("readaudit");
                let full = page.len() == 512;
                if let Some(last) = page.last() {
                    after = last.sequence;
                }
                all.extend(page);
                if !full {
                    break;
                }
            }
            all
        })
    }

    /// Every refusal and authorization this harness recorded appears in the
    /// audit trail with its status, key type, operation and audit id.
    pub fn check_audit(&self, family: &str) -> Vec<AuditRecord> {
        let trail = self.audit_trail();
        assert!(
            trail.windows(2).all(|w| w[0].sequence < w[1].sequence),
            "{family}: audit sequence numbers not increasing"
        );
        let mut left: Vec<&AuditRecord> = trail.iter().collect();
        // Refusals that proved no key beyond the drive's rate are counted, not itemized.
        let mut counted: u64 = trail
            .iter()
            .filter(|r| r.opcode == opcode::NOT_ITEMIZED && r.partition == not_itemized::UNAUTHENTICATED_REFUSALS)
            .map(|r| r.object)
            .sum();
        let expected = self.expected.borrow();
        for e in expected.iter() {
            match left.iter().position(|r| e.matches(r)) {
                Some(i) => {
                    left.swap_remove(i);
                }
                None if e.proved_no_key() && counted > 0 => counted -= 1,
                None => panic!("{family}: the audit trail neither itemizes nor counts {e:?} ({} records)", trail.len()),
            }
        }
        trail
    }

    /// Prints the named cases of a family (for the report) and checks its audit trail.
    pub fn finish(&self, family: &str) {
        self.check_audit(family);
        let cases = self.cases.borrow();
        eprintln!("{family}: {} named cases, {} audit records checked", cases.len(), self.expected.borrow().len());
        for c in cases.iter() {
            eprintln!("  - {c}");
        }
    }
}

// ------------------------------------------------------------------ proxy

/// How the proxy changes the drive's replies on a connection.
#[derive(Clone, Copy, Debug)]
pub enum Tamper {
    /// XOR `mask` into byte `offset` of reply frame `frame` (0 = HELLO's reply).
    Xor { frame: usize, offset: usize, mask: u8 },
    /// Send reply `frame - 1` again in place of reply `frame`.
    ReplayPrevious { frame: usize },
    /// Like `Xor`, but the connection goes on after the tampered frame.
    XorAndGoOn { frame: usize, offset: usize, mask: u8 },
    /// XOR `mask` into byte `offset` of request frame `frame` (0 = HELLO),
    /// on its way to the drive.
    XorRequest { frame: usize, offset: usize, mask: u8 },
    /// One flip per request, many requests on one connection: XOR `mask`
    /// into request frames `first_frame`, `first_frame + 1`, …, the i-th of
    /// them at byte `first_offset + i * stride`.
    XorRequests { first_frame: usize, first_offset: usize, stride: usize, mask: u8 },
}

impl Tamper {
    /// The byte of request frame `index` this tampering flips, and the mask.
    fn request_flip(&self, index: usize) -> Option<(usize, u8)> {
        match *self {
            Tamper::XorRequest { frame, offset, mask } => (index == frame).then_some((offset, mask)),
            Tamper::XorRequests { first_frame, first_offset, stride, mask } => {
                (index >= first_frame).then(|| (first_offset + (index - first_frame) * stride, mask))
            }
            Tamper::Xor { .. } | Tamper::XorAndGoOn { .. } | Tamper::ReplayPrevious { .. } => None,
        }
    }
}

/// A TCP proxy between client and drive that records both directions and
/// can tamper with one reply frame; after a tampered frame it ends the
/// connection towards the client (so a client waiting for more bytes than
/// the tampered frame holds sees EOF, not a hang).
pub struct Proxy {
    pub addr: SocketAddr,
    tamper: Arc<Mutex<Option<Tamper>>>,
    up: Capture,
    down: Capture,
}

/// Bytes a proxy recorded in one direction.
type Capture = Arc<Mutex<Vec<u8>>>;

impl Proxy {
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let addr = listener.local_addr().unwrap();
        let tamper: Arc<Mutex<Option<Tamper>>> = Arc::default();
        let (up, down) = (Capture::default(), Capture::default());
        let (t, u, d) = (tamper.clone(), up.clone(), down.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(drive) = TcpStream::connect(target) else { continue };
                let _ = (client.set_nodelay(true), drive.set_nodelay(true));
                let tamper = *t.lock().unwrap();
                let (c_rd, d_wr) = (client.try_clone().unwrap(), drive.try_clone().unwrap());
                let u = u.clone();
                std::thread::spawn(move || pump_requests(c_rd, d_wr, u, tamper));
                let d = d.clone();
                std::thread::spawn(move || pump_replies(drive, client, tamper, d));
            }
        });
        Proxy { addr, tamper, up, down }
    }

    /// Tampering for connections accepted from now on.
    pub fn set(&self, t: Option<Tamper>) {
        *self.tamper.lock().unwrap() = t;
    }

    pub fn clear(&self) {
        self.up.lock().unwrap().clear();
        self.down.lock().unwrap().clear();
    }

    /// (client → drive, drive → client) bytes recorded since `clear`.
    pub fn captured(&self) -> (Vec<u8>, Vec<u8>) {
        (self.up.lock().unwrap().clone(), self.down.lock().unwrap().clone())
    }
}

fn pump_requests(mut from: TcpStream, mut to: TcpStream, capture: Capture, tamper: Option<Tamper>) {
    if let Some(t @ (Tamper::XorRequest { .. } | Tamper::XorRequests { .. })) = tamper {
        tamper_requests(&mut from, &mut to, &capture, t);
        let _ = to.shutdown(Shutdown::Write);
        return;
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                capture.lock().unwrap().extend_from_slice(&buf[..n]);
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Reads one whole frame (header, body, data and tags) from `from`; None at
/// the end of the stream or on a header that does not decode.
fn read_frame(from: &mut TcpStream) -> Option<Vec<u8>> {
    let mut frame = vec![0u8; HEADER_LEN];
    from.read_exact(&mut frame).ok()?;
    let h = FrameHeader::decode(frame[..].try_into().unwrap()).ok()?;
    let rest = h.body_len() + (h.data_len + h.chunk_count() * h.protection.data_tag_len() as u64) as usize;
    frame.resize(HEADER_LEN + rest, 0);
    from.read_exact(&mut frame[HEADER_LEN..]).ok()?;
    Some(frame)
}

/// Forwards request frames one by one, flipping the bytes `tamper` names.
fn tamper_requests(from: &mut TcpStream, to: &mut TcpStream, capture: &Capture, tamper: Tamper) {
    for index in 0.. {
        let Some(mut frame) = read_frame(from) else { break };
        if let Some((offset, mask)) = tamper.request_flip(index) {
            assert!(offset < frame.len(), "tamper offset {offset} beyond a {}-byte request", frame.len());
            frame[offset] ^= mask;
        }
        capture.lock().unwrap().extend_from_slice(&frame);
        if to.write_all(&frame).is_err() {
            break;
        }
    }
}

fn pump_replies(mut from: TcpStream, mut to: TcpStream, tamper: Option<Tamper>, capture: Capture) {
    let mut previous: Option<Vec<u8>> = None;
    for index in 0.. {
        let Some(frame) = read_frame(&mut from) else { break };
        let mut out = frame.clone();
        let mut last = false;
        match tamper {
            Some(Tamper::Xor { frame: f, offset, mask }) if f == index => {
                assert!(offset < out.len(), "tamper offset {offset} beyond a {}-byte reply", out.len());
                out[offset] ^= mask;
                last = true;
            }
            Some(Tamper::XorAndGoOn { frame: f, offset, mask }) if f == index => {
                assert!(offset < out.len(), "tamper offset {offset} beyond a {}-byte reply", out.len());
                out[offset] ^= mask;
            }
            Some(Tamper::ReplayPrevious { frame: f }) if f == index => {
                out = previous.clone().expect("a previous reply to replay");
                last = true;
            }
            _ => {}
        }
        capture.lock().unwrap().extend_from_slice(&out);
        if to.write_all(&out).is_err() || last {
            break;
        }
        previous = Some(frame);
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// Lengths of the reply frames in `down` (a proxy's drive → client bytes).
pub fn reply_frame_lengths(down: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + HEADER_LEN <= down.len() {
        let h = FrameHeader::decode(down[at..at + HEADER_LEN].try_into().unwrap()).expect("recorded reply header");
        let len =
            HEADER_LEN + h.body_len() + (h.data_len + h.chunk_count() * h.protection.data_tag_len() as u64) as usize;
        out.push(len);
        at += len;
    }
    out
}

/// Connects through `addr` as `cred` with `protection`.
pub async fn client_as(addr: SocketAddr, cred: Credential, protection: u8) -> Result<DriveClient, ClientError> {
    let mut c = to(DriveClient::connect(addr)).await?;
    c.set_auth(Auth::new(cred, prot(protection)));
    Ok(c)
}

/// Every `window`-byte slice of `hay`, for fast "does this leak" checks.
pub fn windows(hay: &[u8], window: usize) -> HashSet<&[u8]> {
    hay.windows(window).collect()
}
