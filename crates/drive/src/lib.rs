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
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod audit;
mod conn;
pub mod security;
pub mod throttle;

pub use audit::{Audit, AUDIT_RECORDS_MAX};
pub use nasd_crypto::Key;
pub use security::Security;

use nasd_proto::limits::{CHUNK_LEN_DEFAULT, CHUNK_LEN_MAX, CHUNK_LEN_MIN, NAME_LEN_MAX};
use nasd_store::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Most connections served at once; more are closed on accept.
pub const CONNECTIONS_MAX: usize = 1024;
/// How long a connection may sit idle between requests.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a peer may take to deliver one frame's header and arguments, or
/// any one data chunk.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// Chunks buffered between the socket and the store per transfer.
pub const TRANSFER_CHUNKS_MAX: usize = 4;

/// How the drive behaves on the network.
#[derive(Debug, Clone)]
pub struct DriveConfig {
    /// Interval of the background commit that bounds unflushed work.
    pub commit_interval: Duration,
    /// Most concurrent connections.
    pub max_connections: usize,
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
            chunk_len: None,
            security: SecurityMode::Enforced { master_key: None },
            failure_domain: String::new(),
            throttle_bytes_per_sec: None,
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
    /// the failure domain's length and the throttle rate.
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
}

impl Drive {
    /// Opens the security state and audit trail of `store`.
    pub fn open(store: Arc<Store>, mode: &SecurityMode) -> std::io::Result<Drive> {
        let (master, enabled) = match mode {
            SecurityMode::Enforced { master_key } => (master_key.clone(), true),
            SecurityMode::Disabled => (None, false),
        };
        let security = Security::open(store.clone(), master, enabled).map_err(std::io::Error::other)?;
        let audit = Audit::open(store.dir()).map_err(|e| std::io::Error::other(format!("audit trail: {e}")))?;
        Ok(Drive { store, security, audit, throttle: None })
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
    listener: TcpListener,
    store: Arc<Store>,
    config: DriveConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    config.check(store.block_size())?;
    let drive = {
        let (s, mode) = (store.clone(), config.security.clone());
        let mut d =
            tokio::task::spawn_blocking(move || Drive::open(s, &mode)).await.map_err(std::io::Error::other)??;
        d.throttle = config.throttle_bytes_per_sec.map(throttle::Throttle::new);
        Arc::new(d)
    };
    if let Some(rate) = config.throttle_bytes_per_sec {
        tracing::warn!(bytes_per_sec = rate, "data is THROTTLED (emulated slow media, a test aid)");
    }
    if !drive.security.enabled() {
        tracing::warn!("security is DISABLED: any client may do anything on this drive");
    }
    let limit = Arc::new(Semaphore::new(config.max_connections));
    let config = Arc::new(config);
    let committer = tokio::spawn(commit_loop(drive.clone(), config.commit_interval));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
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
                    tracing::warn!(%peer, "connection limit reached; closing");
                    continue;
                };
                let (drive, config) = (drive.clone(), config.clone());
                tokio::spawn(async move {
                    conn::serve_connection(socket, peer, drive, config).await;
                    drop(permit);
                });
            }
        }
    }
    committer.abort();
    if commit_all(&drive, "final").await {
        tracing::info!("final commit done");
    }
    Ok(())
}

/// Writes the buffered audit records, then commits the store; logs failures.
/// Returns true on success.
async fn commit_all(drive: &Arc<Drive>, which: &str) -> bool {
    let d = drive.clone();
    let result = tokio::task::spawn_blocking(move || {
        if let Err(e) = d.audit.persist() {
            tracing::error!(error = %e, "audit trail write failed");
        }
        d.store.commit()
    })
    .await;
    match result {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "{which} commit failed");
            false
        }
        Err(e) => {
            tracing::error!(error = %e, "{which} commit task failed");
            false
        }
    }
}

async fn commit_loop(drive: Arc<Drive>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        commit_all(&drive, "background").await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_store::{StoreOptions, BLOCK_SIZE_MAX, BLOCK_SIZE_MIN};

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
