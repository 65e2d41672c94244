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

mod conn;

use nasd_store::Store;
use std::net::SocketAddr;
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
    /// Data chunk length of read replies.
    pub chunk_len: u32,
}

impl Default for DriveConfig {
    fn default() -> Self {
        DriveConfig {
            commit_interval: Duration::from_secs(2),
            max_connections: CONNECTIONS_MAX,
            chunk_len: nasd_proto::limits::CHUNK_LEN_DEFAULT,
        }
    }
}

/// Vendor string reported by `inquiry`.
pub const VENDOR: &str = "nasd";
/// Model string reported by `inquiry`.
pub const MODEL: &str = "nasd-object-drive";

/// Serves `store` on `listener` until `shutdown` completes; then commits and returns.
pub async fn serve(
    listener: TcpListener,
    store: Arc<Store>,
    config: DriveConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let limit = Arc::new(Semaphore::new(config.max_connections));
    let config = Arc::new(config);
    let committer = tokio::spawn(commit_loop(store.clone(), config.commit_interval));
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
                let (store, config) = (store.clone(), config.clone());
                tokio::spawn(async move {
                    conn::serve_connection(socket, peer, store, config).await;
                    drop(permit);
                });
            }
        }
    }
    committer.abort();
    let s = store.clone();
    match tokio::task::spawn_blocking(move || s.commit()).await {
        Ok(Ok(())) => tracing::info!("final commit done"),
        Ok(Err(e)) => tracing::error!(error = %e, "final commit failed"),
        Err(e) => tracing::error!(error = %e, "final commit task failed"),
    }
    Ok(())
}

async fn commit_loop(store: Arc<Store>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.commit()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "background commit failed"),
            Err(e) => tracing::error!(error = %e, "background commit task failed"),
        }
    }
}

/// Binds `addr` and serves; convenience for the CLI and tests.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
