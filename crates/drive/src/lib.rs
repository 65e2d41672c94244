//! The nasd drive daemon: serves a [`nasd_store::Store`] over the nasd protocol.
//!
//! One task per connection reads a frame, executes it and writes the reply;
//! requests on one connection run in order, connections run concurrently.
//! Write data streams from the socket into the store and read data from the
//! store to the socket through bounded channels, so memory per transfer is a
//! few chunks whatever the request size.
//!
//! Bad input never panics the drive: a frame that cannot be parsed gets an
//! error reply and the connection is closed; a well-framed request that fails
//! gets its specific status and the connection goes on.
//!
//! No disk I/O on the async threads: store operations, key changes, audit
//! writes and reads run on blocking threads (`tasks.rs`), each awaited so
//! that a panic in any of them — or in a connection task — stops the process
//! rather than turning into a reply. Per request, per transfer and per
//! connection memory is bounded ([`TRANSFER_MEMORY_MAX`],
//! [`TRANSFER_CHUNKS_MAX`], [`CONNECTIONS_MAX`],
//! [`CONNECTIONS_PER_PEER_MAX`]); deadlines and the request pipeline are in
//! `conn.rs`, the key ring and checks in [`security`], the audit trail in
//! `audit.rs`.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod audit;
mod conn;
mod metrics;
pub mod prefetch;
pub mod security;
mod tasks;
pub mod throttle;

pub use audit::{
    Audit, AUDIT_BUFFER_MAX, AUDIT_RECORDS_MAX, UNAUTHENTICATED_AUDIT_BURST, UNAUTHENTICATED_AUDIT_PER_SEC,
};
pub use metrics::DriveMetrics;
pub use nasd_crypto::Key;
pub use security::Security;

use nasd_env::Listener;
use nasd_proto::limits::{CHUNK_LEN_DEFAULT, CHUNK_LEN_MAX, CHUNK_LEN_MIN, NAME_LEN_MAX};
use nasd_store::Store;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Most connections served at once; more are closed on accept.
pub const CONNECTIONS_MAX: usize = 1024;
/// Most connections one peer — an IPv4 address, or an IPv6 /64 — may hold at
/// once (by default; [`DriveConfig::max_connections_per_peer`]); more are
/// closed on accept, so one host cannot take every slot.
pub const CONNECTIONS_PER_PEER_MAX: usize = 128;
/// How long a connection may sit idle between requests, once a request on
/// it has proved a key (by default; [`DriveConfig::idle_timeout`]).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a connection on which no request has proved a key yet may sit
/// idle, or take to deliver one frame's header and arguments: anyone can
/// open one, and it holds a connection slot and [`CONNECTION_BUFFER_LEN`]
/// bytes for this long.
pub const UNAUTHENTICATED_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a peer may take to deliver one frame's header and arguments, or
/// any one data chunk (by default; [`DriveConfig::frame_timeout`]). A
/// writer that stops sending is cut off after this, and its write changes
/// nothing.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a peer may take to take one piece of a reply — its header and
/// arguments, or one data chunk with its tag (at most `CHUNK_LEN_MAX` +
/// `DATA_TAG_LEN` bytes) — by default ([`DriveConfig::send_timeout`]). A
/// reader that stops reading is cut off after this: its connection ends,
/// and with it the read's transfer memory, store task and pinned blocks.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Data bytes the drive reads and discards after refusing a request that
/// proved no key, to keep the connection in step (a client whose capability
/// just expired gets its refusal); a request announcing more is answered
/// and its connection closed. Costs that much network and time, no memory.
pub const UNAUTHENTICATED_DRAIN_MAX: u64 = 64 * 1024 * 1024;
/// Bytes each connection buffers in each direction between frames. Data
/// chunks bypass these buffers.
pub const CONNECTION_BUFFER_LEN: usize = 16 * 1024;
/// Chunks buffered between the socket and the store per transfer.
pub const TRANSFER_CHUNKS_MAX: usize = 4;
/// Memory that all reads and writes in progress together may hold for their
/// data: each holds [`TRANSFER_CHUNKS_MAX`] chunks in its channel, one being
/// read or filled, one being sent or stored, and a block. A transfer waits
/// for its share before it allocates anything or starts its store task, so
/// connections announcing transfers cost no memory beyond this (and no more
/// blocking threads than fit in it: ~40 at the default chunk length, 2 at
/// the largest).
pub const TRANSFER_MEMORY_MAX: usize = 64 * 1024 * 1024;

/// The most memory one transfer may need (largest chunks and block).
const TRANSFER_MEMORY_EACH_MAX: usize = (TRANSFER_CHUNKS_MAX + 2)
    * (CHUNK_LEN_MAX as usize + nasd_proto::limits::DATA_TAG_LEN)
    + nasd_proto::limits::BLOCK_SIZE_MAX as usize;
const _: () = assert!(TRANSFER_MEMORY_EACH_MAX <= TRANSFER_MEMORY_MAX, "one transfer always fits");
const _: () = assert!(CONNECTIONS_PER_PEER_MAX <= CONNECTIONS_MAX);

/// How the drive behaves on the network.
#[derive(Debug, Clone)]
pub struct DriveConfig {
    /// Interval of the background commit that bounds unflushed work.
    pub commit_interval: Duration,
    /// Most concurrent connections.
    pub max_connections: usize,
    /// Most concurrent connections from one peer (an IPv4 address, or an
    /// IPv6 /64): [`CONNECTIONS_PER_PEER_MAX`] by default.
    pub max_connections_per_peer: usize,
    /// How long a connection may sit idle between requests once a request on
    /// it proved a key: [`IDLE_TIMEOUT`] by default. Before that,
    /// [`UNAUTHENTICATED_IDLE_TIMEOUT`] (or this, if shorter).
    pub idle_timeout: Duration,
    /// How long a peer may take to deliver a frame's header and arguments
    /// once it started, or one data chunk: [`FRAME_TIMEOUT`] by default
    /// (before a request on the connection proved a key, at most
    /// [`UNAUTHENTICATED_IDLE_TIMEOUT`]). Must not be zero.
    pub frame_timeout: Duration,
    /// How long a peer may take to take one piece of a reply:
    /// [`SEND_TIMEOUT`] by default. Must not be zero.
    pub send_timeout: Duration,
    /// Data chunk length of read replies. `None`: the larger of
    /// `CHUNK_LEN_DEFAULT` and the block size, so that every chunk holds
    /// whole blocks (Hash-and-MAC then MACs stored digests for aligned
    /// reads). A given length must be within `CHUNK_LEN_MIN..=CHUNK_LEN_MAX`
    /// ([`serve`] refuses to start otherwise); one that is not a multiple of
    /// the block size is allowed, with a warning: blocks straddling chunks
    /// are then hashed on the fly.
    pub chunk_len: Option<u32>,
    /// Whether the drive checks keys and capabilities.
    pub security: SecurityMode,
    /// The failure domain `INQUIRY` reports (a host, rack or power feed
    /// this drive shares with others; at most `NAME_LEN_MAX` bytes, checked
    /// by [`DriveConfig::check`]). Empty (the default): this drive alone.
    pub failure_domain: String,
    /// Emulated slow media, a test aid for benchmarks: when set, the data
    /// bytes every connection reads from and writes to the store are paced
    /// by one token bucket ([`throttle::Throttle`], bursts of
    /// [`throttle::THROTTLE_BURST`]), so the drive's aggregate data
    /// throughput stays at this many bytes per second. `Some(0)` is refused
    /// by [`DriveConfig::check`]. `None` (the default): no pacing.
    pub throttle_bytes_per_sec: Option<u64>,
    /// Where the drive counts what it does (`metrics.rs`); register them
    /// to have them served [default: fresh, unregistered].
    pub metrics: DriveMetrics,
}

/// Whether a drive enforces NASD security.
#[derive(Debug, Clone)]
pub enum SecurityMode {
    /// Every request but HELLO and INQUIRY must be authorized by a key of the
    /// hierarchy or a capability (docs/SECURITY.md). `master_key` provisions
    /// a drive that has none yet; a drive that has one keeps it.
    Enforced {
        /// The master key for a drive that has none yet.
        master_key: Option<Key>,
    },
    /// Requests with key type NONE are allowed everything. Only for trusted
    /// networks and for tests of storage semantics; never the default.
    Disabled,
}

impl Default for DriveConfig {
    fn default() -> Self {
        DriveConfig {
            commit_interval: Duration::from_secs(2),
            max_connections: CONNECTIONS_MAX,
            max_connections_per_peer: CONNECTIONS_PER_PEER_MAX,
            idle_timeout: IDLE_TIMEOUT,
            frame_timeout: FRAME_TIMEOUT,
            send_timeout: SEND_TIMEOUT,
            chunk_len: None,
            security: SecurityMode::Enforced { master_key: None },
            failure_domain: String::new(),
            throttle_bytes_per_sec: None,
            metrics: DriveMetrics::default(),
        }
    }
}

impl DriveConfig {
    /// The default configuration with security disabled (storage tests).
    pub fn unauthenticated() -> Self {
        DriveConfig { security: SecurityMode::Disabled, ..DriveConfig::default() }
    }

    /// The chunk length of read replies on a drive with `block_size`-byte
    /// blocks (see [`DriveConfig::chunk_len`]).
    pub fn reply_chunk_len(&self, block_size: u32) -> u32 {
        self.chunk_len.unwrap_or(CHUNK_LEN_DEFAULT.max(block_size))
    }

    /// Checks the configuration once, before a drive with `block_size`-byte
    /// blocks serves: the reply chunk length ([`Self::check_reply_chunk_len`])
    /// the failure domain's length, the throttle rate and the time-outs.
    ///
    /// # Errors
    /// `InvalidInput` naming the setting that is out of bounds.
    pub fn check(&self, block_size: u32) -> std::io::Result<()> {
        self.check_reply_chunk_len(block_size)?;
        if self.failure_domain.len() > NAME_LEN_MAX {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "failure domain is {} bytes; at most {NAME_LEN_MAX} fit in an INQUIRY reply",
                    self.failure_domain.len()
                ),
            ));
        }
        if self.frame_timeout.is_zero() || self.send_timeout.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a frame or send time-out of zero would cut every peer off",
            ));
        }
        if self.throttle_bytes_per_sec == Some(0) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a throttle of 0 bytes per second would never move data",
            ));
        }
        Ok(())
    }

    /// Checks the reply chunk length once, before a drive with
    /// `block_size`-byte blocks serves (warning if it is not a multiple of the
    /// block size).
    ///
    /// # Errors
    /// `InvalidInput` for a chunk length outside `CHUNK_LEN_MIN..=CHUNK_LEN_MAX`:
    /// 0 would never fill a chunk, and clients refuse replies with chunks
    /// over `CHUNK_LEN_MAX`.
    pub fn check_reply_chunk_len(&self, block_size: u32) -> std::io::Result<()> {
        let chunk = self.reply_chunk_len(block_size);
        if !(CHUNK_LEN_MIN..=CHUNK_LEN_MAX).contains(&chunk) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("reply chunk length {chunk} is outside {CHUNK_LEN_MIN}..={CHUNK_LEN_MAX}"),
            ));
        }
        if chunk.checked_rem(block_size) != Some(0) {
            tracing::warn!(
                chunk,
                block_size,
                "reply chunk length is not a multiple of the block size: Hash-and-MAC hashes blocks that straddle chunks"
            );
        }
        Ok(())
    }
}

/// A drive: its store, its security state and its audit trail.
pub struct Drive {
    /// The object store.
    pub store: Arc<Store>,
    /// Keys and checks.
    pub security: Security,
    /// Every request, authorized or refused.
    pub audit: Audit,
    /// Paces data bytes (emulated slow media), if configured.
    pub throttle: Option<throttle::Throttle>,
    /// What it counts (`metrics.rs`).
    pub(crate) metrics: DriveMetrics,
    /// [`TRANSFER_MEMORY_MAX`], in KiB.
    transfer_memory: Arc<Semaphore>,
    /// The `prefetch-v1` extension's streams.
    pub(crate) prefetcher: Arc<prefetch::Prefetcher>,
}

impl Drive {
    /// Opens the security state and audit trail of `store`.
    pub fn open(store: Arc<Store>, mode: &SecurityMode) -> std::io::Result<Drive> {
        let (master, enabled) = match mode {
            SecurityMode::Enforced { master_key } => (master_key.clone(), true),
            SecurityMode::Disabled => (None, false),
        };
        let security = Security::open(store.clone(), master, enabled).map_err(std::io::Error::other)?;
        let audit =
            Audit::open_in(store.env(), store.dir()).map_err(|e| std::io::Error::other(format!("audit trail: {e}")))?;
        let transfer_memory = Arc::new(Semaphore::new(TRANSFER_MEMORY_MAX / 1024));
        let prefetcher = Arc::new(prefetch::Prefetcher::new(store.clone(), DriveMetrics::default()));
        Ok(Drive {
            store,
            security,
            audit,
            throttle: None,
            metrics: DriveMetrics::default(),
            transfer_memory,
            prefetcher,
        })
    }

    /// Waits until `bytes` of [`TRANSFER_MEMORY_MAX`] are free and takes
    /// them, until the permit is dropped.
    pub(crate) async fn transfer_memory(&self, bytes: usize) -> tokio::sync::OwnedSemaphorePermit {
        let kib = bytes.div_ceil(1024).min(TRANSFER_MEMORY_EACH_MAX / 1024) as u32;
        self.transfer_memory.clone().acquire_many_owned(kib).await.expect("the semaphore is never closed")
    }
}

/// Connections per peer: an IPv4 address, or an IPv6 /64 (one host's
/// addresses), IPv4-mapped IPv6 addresses counted as IPv4.
#[derive(Default)]
struct Peers {
    open: std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>,
}

/// One connection's place in [`Peers`]; gives it back when dropped.
struct PeerSlot {
    peers: Arc<Peers>,
    key: IpAddr,
}

impl Peers {
    fn key(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
            },
            v4 => v4,
        }
    }

    /// A slot for one more connection from `ip`, unless it holds `max` already.
    fn admit(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let key = Self::key(ip);
        let mut open = self.open.lock().expect("peers mutex poisoned");
        let n = open.entry(key).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot { peers: self.clone(), key })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().expect("peers mutex poisoned");
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// Vendor string reported by `inquiry`.
pub const VENDOR: &str = "nasd";
/// Model string reported by `inquiry`.
pub const MODEL: &str = "nasd-object-drive";

/// Serves `store` on `listener` until `shutdown` completes; then commits and returns.
///
/// # Errors
/// A configuration that cannot be served (a reply chunk length outside the
/// protocol's limits, a failure domain too long: [`DriveConfig::check`]) is refused before
/// anything is served; so is a store whose security state or audit trail
/// does not open.
pub async fn serve(
    listener: impl Into<Listener>,
    store: Arc<Store>,
    config: DriveConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let listener = listener.into();
    config.check(store.block_size())?;
    let env = store.env().clone();
    let drive = {
        let (s, mode) = (store.clone(), config.security.clone());
        let mut d = tasks::blocking(&env, move || Drive::open(s, &mode)).await?;
        d.throttle = config.throttle_bytes_per_sec.map(throttle::Throttle::new);
        d.security.metrics = config.metrics.clone();
        d.metrics = config.metrics.clone();
        d.prefetcher = Arc::new(prefetch::Prefetcher::new(d.store.clone(), d.metrics.clone()));
        Arc::new(d)
    };
    drive.metrics.serving(&drive.store);
    if let Some(rate) = config.throttle_bytes_per_sec {
        tracing::warn!(bytes_per_sec = rate, "data is THROTTLED (emulated slow media, a test aid)");
    }
    if !drive.security.enabled() {
        tracing::warn!("security is DISABLED: any client may do anything on this drive");
    }
    let limit = Arc::new(Semaphore::new(config.max_connections));
    let peers = Arc::new(Peers::default());
    let config = Arc::new(config);
    // The committer and connection tasks are joined here so that a panic in one stops the
    // drive (`tasks`).
    let mut connections = tokio::task::JoinSet::new();
    let committer = connections.spawn(commit_loop(drive.clone(), config.commit_interval));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            Some(joined) = connections.join_next(), if !connections.is_empty() => {
                match joined {
                    Err(e) if e.is_panic() => tasks::fail_stop(&e),
                    _ => {}
                }
            }
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    drive.metrics.connection_refused_drive_limit();
                    tracing::warn!(%peer, "connection limit reached; closing");
                    continue;
                };
                let Some(slot) = peers.admit(peer.ip(), config.max_connections_per_peer) else {
                    drive.metrics.connection_refused_peer_limit();
                    tracing::debug!(%peer, "this peer's connection limit reached; closing");
                    continue;
                };
                let (drive, config) = (drive.clone(), config.clone());
                let open = drive.metrics.connection_opened();
                connections.spawn(async move {
                    conn::serve_connection(socket, peer, drive, config).await;
                    drop((permit, slot, open));
                });
            }
        }
    }
    committer.abort();
    // Requests in progress finish on their own, as before; only new ones stopped.
    connections.detach_all();
    if commit_all(&drive, "final").await {
        tracing::info!("final commit done");
    }
    Ok(())
}

/// Writes the buffered audit records, then commits the store; logs failures.
/// Returns true on success.
async fn commit_all(drive: &Arc<Drive>, which: &str) -> bool {
    let d = drive.clone();
    let result = tasks::blocking(drive.store.env(), move || {
        if let Err(e) = d.audit.persist() {
            tracing::error!(error = %e, "audit trail write failed");
        }
        d.store.commit()
    })
    .await;
    match result {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = %e, "{which} commit failed");
            false
        }
    }
}

/// Commits every `every`; writes the audit trail's buffer (on a blocking
/// thread) as soon as it is half full.
async fn commit_loop(drive: Arc<Drive>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = tick.tick() => {
                commit_all(&drive, "background").await;
            }
            () = drive.audit.half_full() => {
                let d = drive.clone();
                if let Err(e) = tasks::blocking(drive.store.env(), move || d.audit.persist()).await {
                    tracing::error!(error = %e, "audit trail write failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_store::{StoreOptions, BLOCK_SIZE_MAX, BLOCK_SIZE_MIN};
    use tokio::net::TcpListener;

    #[test]
    fn reply_chunks_default_to_whole_blocks_and_stay_within_the_limits() {
        let auto = DriveConfig::default();
        for (block, chunk) in [
            (BLOCK_SIZE_MIN, CHUNK_LEN_DEFAULT),
            (64 * 1024, CHUNK_LEN_DEFAULT),
            (512 * 1024, 512 * 1024),
            (BLOCK_SIZE_MAX, BLOCK_SIZE_MAX),
        ] {
            auto.check_reply_chunk_len(block).unwrap();
            let got = auto.reply_chunk_len(block);
            assert_eq!(got, chunk, "block {block}");
            assert_eq!(got % block, 0, "the default chunk holds whole blocks");
        }
        for bad in [0, 1, CHUNK_LEN_MIN - 1, CHUNK_LEN_MAX + 1, u32::MAX] {
            let c = DriveConfig { chunk_len: Some(bad), ..DriveConfig::default() };
            let e = c.check_reply_chunk_len(4096).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{bad}");
        }
        for ok in [CHUNK_LEN_MIN, 1000, 4096, CHUNK_LEN_MAX] {
            let c = DriveConfig { chunk_len: Some(ok), ..DriveConfig::default() };
            c.check_reply_chunk_len(4096).unwrap();
            assert_eq!(c.reply_chunk_len(4096), ok);
        }
    }

    /// A chunk length of 0 once made every read loop forever; now the drive
    /// refuses to start with it.
    #[tokio::test]
    async fn serve_refuses_an_invalid_reply_chunk_length() {
        for bad in [0, CHUNK_LEN_MAX + 1] {
            let dir = tempfile::tempdir().unwrap();
            let opts = StoreOptions { block_size: 4096, capacity_bytes: 16 << 20, ..StoreOptions::default() };
            let store = Arc::new(Store::open(dir.path(), &opts).unwrap());
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let config = DriveConfig { chunk_len: Some(bad), ..DriveConfig::unauthenticated() };
            let served =
                tokio::time::timeout(Duration::from_secs(20), serve(listener, store, config, std::future::pending()))
                    .await
                    .expect("serve returns at once");
            assert_eq!(served.unwrap_err().kind(), std::io::ErrorKind::InvalidInput, "chunk {bad}");
        }
    }

    fn small_store(dir: &std::path::Path) -> Arc<Store> {
        let opts = StoreOptions { block_size: 4096, capacity_bytes: 16 << 20, ..StoreOptions::default() };
        Arc::new(Store::open(dir, &opts).unwrap())
    }

    /// INQUIRY reports the configured failure domain; one longer than an
    /// INQUIRY reply can carry stops the drive from starting.
    #[tokio::test]
    async fn inquiry_reports_the_failure_domain_and_serve_checks_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let domain = "rack-7/pdu-b".to_string();
        let config = DriveConfig { failure_domain: domain.clone(), ..DriveConfig::unauthenticated() };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, small_store(dir.path()), config, async {
            let _ = stopped.await;
        }));
        let mut c = nasd_client::DriveClient::connect(addr).await.unwrap();
        assert_eq!(c.inquiry().await.unwrap().failure_domain, domain);
        drop(c);
        let _ = stop.send(());
        server.await.unwrap().unwrap();

        let default = DriveConfig::default();
        assert_eq!(default.failure_domain, "", "default: the drive alone");
        let longest = DriveConfig { failure_domain: "d".repeat(NAME_LEN_MAX), ..DriveConfig::default() };
        longest.check(4096).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = DriveConfig { failure_domain: "d".repeat(NAME_LEN_MAX + 1), ..DriveConfig::unauthenticated() };
        let served = tokio::time::timeout(
            Duration::from_secs(20),
            serve(listener, small_store(dir.path()), config, std::future::pending()),
        )
        .await
        .expect("serve returns at once");
        let e = served.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("failure domain"), "{e}");
    }
}
