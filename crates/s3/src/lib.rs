//! nasd-s3: the S3 gateway — an [`s3s`] service over the shared
//! file-system layer ([`nasd_vfs::Vfs`]), the only crate that knows S3.
//!
//! - **Identity** (`keys.rs`): every access key belongs to one nasd user;
//!   s3s checks the SigV4 signature with the key's secret ([`KeyAuth`]),
//!   then every request runs as the key's user through the gateway's
//!   `AS_USER` grant ([`nasd_fs::FsClient::as_user`]), so nasd's modes and
//!   ACLs decide it. Requests without a valid signature are refused before
//!   any file-system call; a revoked key's next request is refused.
//! - **Names**: a bucket is a top-level directory (made `0700`, the user's
//!   own); a key is a path below it, each `/` a directory level
//!   (`object_path`). Keys that cannot be paths (empty levels, `.`, `..`,
//!   the layer's temporary and hidden names, over [`KEY_BYTES_MAX`]) are
//!   refused with `InvalidArgument`/`KeyTooLongError`, nothing touched.
//!   A key ending in `/` (a directory marker, as s3fs-fuse and consoles
//!   make them) names the directory: PUT (empty body only) makes it, HEAD
//!   and GET answer an empty `application/x-directory` object while it
//!   exists, DELETE removes it if empty. Listings give every object's
//!   stored ETag (S3 clients compare it with their MD5s).
//! - **Objects** appear whole or not at all: a PUT (and a copy) is written
//!   under a temporary name through [`nasd_vfs::Replacement`] and renamed
//!   into place after its last byte; its MD5 (the ETag), Content-Type and
//!   user metadata are kept in the extended attribute [`META_XATTR`] set
//!   before the rename.
//! - **Multipart uploads** (`multipart.rs`): parts kept in the bucket's
//!   hidden `.nasd-s3-uploads/ID/`, the first send of each of the upload's
//!   part size written in place in one staging file that completion renames
//!   to the key (no copy of the data), a part sent again written apart (the
//!   acknowledged copy survives a failed re-send); the object appears whole
//!   then or not at all.
//!   Uploads left without a new part for [`UPLOAD_EXPIRY_DEFAULT`]
//!   (configurable) are removed; each user may have
//!   [`OPEN_UPLOADS_PER_USER_DEFAULT`] (configurable) open.
//! - **Bounded memory**: bodies stream in [`IO_CHUNK`] pieces, a GET reads
//!   at most [`READ_AHEAD_CHUNKS`] ahead of its client; listings walk the
//!   tree one directory at a time in S3's byte order (`list.rs`).
#![deny(missing_docs)]

mod checksum;
mod keys;
mod limits;
mod list;
mod locks;
mod metrics;
mod multipart;
mod ops;
mod paths;

pub use keys::{KeyOwner, KeyRecord, KeyStore, KeyStoreError, ACCESS_KEY_PREFIX, KEY_FILE_BYTES_MAX};
pub use limits::{
    CONNECTIONS_PER_PEER_MAX, OPEN_UPLOADS_PER_USER_DEFAULT, OPEN_UPLOADS_PER_USER_MAX, PART_BYTES_MIN_DEFAULT,
    REQUESTS_PER_KEY_PER_SEC_DEFAULT, TOO_MANY_UPLOADS, UPLOADS_IN_FLIGHT_MAX, UPLOADS_IN_FLIGHT_PER_USER_DEFAULT,
};
pub use metrics::S3Metrics;
pub use multipart::{IN_PLACE_PIECE_BYTES_MAX, PARTS_MAX};
pub use paths::KEY_BYTES_MAX;

use hyper_util::rt::{TokioExecutor, TokioIo};
use nasd_vfs::Vfs;
use s3s::auth::{S3Auth, SecretKey};
use s3s::service::S3ServiceBuilder;
use s3s::{s3_error, S3Result};
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tracing::Instrument;

/// Largest object one PUT or copy writes (S3's own single-PUT limit).
pub const OBJECT_BYTES_MAX: u64 = 5 << 30;
/// Largest user metadata (names and values) an object keeps (S3's limit).
pub const METADATA_BYTES_MAX: usize = 2048;
/// Piece size bodies are written and read in.
pub const IO_CHUNK: usize = 1 << 20;
/// Pieces a GET reads ahead of its client at most.
pub const READ_AHEAD_CHUNKS: usize = 4;
/// Most of a failed upload's body read (and dropped) so its connection
/// stays usable; a longer one is left, and the connection with it.
pub const DRAIN_BYTES_MAX: usize = 8 << 20;
/// Keys (and common prefixes) one listing returns at most.
pub const LIST_KEYS_MAX: usize = 1000;
/// Keys one DeleteObjects names at most.
pub const DELETE_OBJECTS_MAX: usize = 1000;
/// Largest request head (request line and headers) a connection buffers.
pub const HEADER_BYTES_MAX: usize = 64 << 10;
/// Connections served at once; more are closed at accept.
pub const CONNECTIONS_MAX: usize = 1024;
/// Extended attribute holding an object's ETag, Content-Type and metadata
/// (JSON).
pub const META_XATTR: &str = "user.nasd.s3";

const _: () = assert!(IO_CHUNK as u64 <= nasd_fs::TXN_BYTES_MAX);

/// How long a multipart upload may go without a new part before the
/// gateway removes it, unless configured otherwise.
pub const UPLOAD_EXPIRY_DEFAULT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The S3 service over one file-system layer and one key store.
#[derive(Clone)]
pub struct Gateway {
    vfs: Vfs,
    keys: KeyStore,
    /// Abandoned multipart uploads are removed after this long ([`Gateway::expire_uploads`]).
    upload_expiry: Option<std::time::Duration>,
    /// Requests per access key per second.
    rates: Arc<limits::KeyRates>,
    /// Uploads being written, per user and in all.
    in_flight: Arc<limits::InFlight>,
    /// Smallest part of a multipart upload but its last.
    part_bytes_min: u64,
    /// What it counts ([`S3Metrics`]).
    metrics: S3Metrics,
    /// Open multipart uploads per user.
    open_uploads: Arc<limits::OpenUploads>,
    /// Multipart uploads' and their parts' locks (`multipart.rs`).
    upload_locks: Arc<locks::NamedLocks>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway acting through `vfs` (whose client must hold a gateway
    /// grant covering the keys' users) for the keys of `keys`.
    pub fn new(vfs: Vfs, keys: KeyStore) -> Gateway {
        Gateway {
            vfs,
            keys,
            upload_expiry: Some(UPLOAD_EXPIRY_DEFAULT),
            rates: Arc::new(limits::KeyRates::new(REQUESTS_PER_KEY_PER_SEC_DEFAULT)),
            in_flight: Arc::new(limits::InFlight::new(UPLOADS_IN_FLIGHT_PER_USER_DEFAULT)),
            part_bytes_min: PART_BYTES_MIN_DEFAULT,
            metrics: S3Metrics::default(),
            upload_locks: Arc::default(),
            open_uploads: Arc::new(limits::OpenUploads::new(OPEN_UPLOADS_PER_USER_DEFAULT)),
        }
    }

    /// Counts in `metrics` (register them to have them served).
    pub fn with_metrics(self, metrics: S3Metrics) -> Gateway {
        Gateway { metrics, ..self }
    }

    /// Lets each access key make `per_sec` requests per second on average
    /// (twice that at once after a quiet spell); more get `SlowDown`.
    pub fn with_request_rate(self, per_sec: u32) -> Gateway {
        Gateway { rates: Arc::new(limits::KeyRates::new(per_sec)), ..self }
    }

    /// Lets each user have `per_user` uploads (PUT, UploadPart, copies,
    /// completions) in flight at once (1 to [`UPLOADS_IN_FLIGHT_MAX`]);
    /// more get `SlowDown`.
    pub fn with_uploads_in_flight_per_user(self, per_user: usize) -> Gateway {
        Gateway { in_flight: Arc::new(limits::InFlight::new(per_user)), ..self }
    }

    /// Lets each user have `per_user` multipart uploads open (created, not
    /// completed or aborted; 1 to [`OPEN_UPLOADS_PER_USER_MAX`]); one more
    /// CreateMultipartUpload gets [`TOO_MANY_UPLOADS`] (400). Counted from
    /// the buckets at the first creation, then as uploads come and go.
    pub fn with_open_uploads_per_user(self, per_user: usize) -> Gateway {
        Gateway { open_uploads: Arc::new(limits::OpenUploads::new(per_user)), ..self }
    }

    /// Refuses (`EntityTooSmall`) to complete a multipart upload with a
    /// part but the last smaller than `bytes` (S3's is
    /// [`PART_BYTES_MIN_DEFAULT`]).
    pub fn with_part_bytes_min(self, bytes: u64) -> Gateway {
        Gateway { part_bytes_min: bytes, ..self }
    }

    /// Removes multipart uploads left without a new part for `after`
    /// (`None`: never) while it serves.
    pub fn with_upload_expiry(self, after: Option<std::time::Duration>) -> Gateway {
        Gateway { upload_expiry: after, ..self }
    }

    /// Sweeps for abandoned uploads every quarter of the expiry (1 s to 1 h).
    async fn sweep_uploads(self, after: std::time::Duration) {
        let every = (after / 4).clamp(std::time::Duration::from_secs(1), std::time::Duration::from_secs(3600));
        loop {
            tokio::time::sleep(every).await;
            // Each sweep one operation of its own (a trace id its manager and drive requests carry).
            let fs = self.vfs.fs().clone();
            fs.operation("expire-uploads", self.expire_uploads(after)).await;
        }
    }
}

/// s3s's signature check, given each access key's secret from the store.
#[derive(Debug, Clone)]
pub struct KeyAuth {
    keys: KeyStore,
}

#[async_trait::async_trait]
impl S3Auth for KeyAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.keys.lookup(access_key) {
            Ok((_, secret)) => Ok(SecretKey::from(secret.as_str())),
            Err(KeyStoreError::NoSuchKey) => Err(s3_error!(InvalidAccessKeyId)),
            Err(e) => {
                tracing::error!(error = %e, "the S3 key store cannot be read");
                Err(s3_error!(InternalError, "the key store cannot be read"))
            }
        }
    }
}

/// A task stopped when its handle goes.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `service`, each request one operation and counted in `metrics`: a fresh
/// trace id from `env` (`nasd_client::trace`) that every manager and drive
/// request it makes carries, on a `request` span (`method`, `path`,
/// `trace_id`) ended by a debug line "request done", and returned to the S3
/// client as the response's `x-amz-request-id` header (S3's request id, which
/// clients print with an error), so an operator finds the request's lines in
/// the gateway's, the manager's and the drives' logs from what the client saw.
fn served(
    service: s3s::service::S3Service,
    metrics: S3Metrics,
    env: nasd_env::Env,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = s3s::HttpResponse,
    Error = s3s::HttpError,
    Future = impl Future<Output = Result<s3s::HttpResponse, s3s::HttpError>> + Send,
> + Clone {
    hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let (service, metrics) = (service.clone(), metrics.clone());
        let trace = nasd_client::trace::fresh(&env);
        let span = tracing::info_span!(
            "request",
            method = %request.method(),
            path = request.uri().path(),
            trace_id = %trace
        );
        let header = http::HeaderValue::from_str(trace.as_str()).expect("a trace id is visible ASCII");
        let served = async move {
            let (method, started) = (request.method().clone(), std::time::Instant::now());
            let response = hyper::service::Service::call(&service, request).await;
            let status = response.as_ref().ok().map(|r| r.status());
            metrics.request(&method, status, started.elapsed());
            tracing::debug!(
                status = status.map(|s| s.as_u16()),
                elapsed_us = started.elapsed().as_micros() as u64,
                "request done"
            );
            response.map(|mut r| {
                r.headers_mut().insert(REQUEST_ID_HEADER, header);
                r
            })
        };
        nasd_client::trace::scope(Some(trace), served.instrument(span))
    })
}

/// The response header naming a request's id (its trace id): S3's.
pub const REQUEST_ID_HEADER: &str = "x-amz-request-id";

/// Longest a TLS client may take to finish its handshake; then its
/// connection is closed (a peer that stalls holds a connection slot).
pub const TLS_HANDSHAKE_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves S3 as plain HTTP on `listener` until `shutdown` completes,
/// removing abandoned multipart uploads meanwhile
/// (`Gateway::with_upload_expiry`).
///
/// # Errors
/// Accepting connections failed.
pub async fn serve(listener: TcpListener, gateway: Gateway, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
    serve_with(listener, None, gateway, shutdown).await
}

/// [`serve`], over TLS when `tls` is given (HTTPS: every connection's
/// handshake within [`TLS_HANDSHAKE_MAX`], else it is closed).
///
/// # Errors
/// Accepting connections failed.
pub async fn serve_with(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    gateway: Gateway,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut builder = S3ServiceBuilder::new(gateway.clone());
    builder.set_auth(KeyAuth { keys: gateway.keys.clone() });
    let service = builder.build();
    let connections = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    let peers = limits::PeerConnections::default();
    let sweeper = gateway.upload_expiry.map(|after| AbortOnDrop(tokio::spawn(gateway.clone().sweep_uploads(after))));
    let _sweeper = sweeper;
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => return Ok(()),
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            gateway.metrics.refused_gateway_limit();
            tracing::warn!(%peer, "refusing a connection: {CONNECTIONS_MAX} are open");
            continue;
        };
        let Some(slot) = peers.take(peer.ip()) else {
            gateway.metrics.refused_peer_limit();
            tracing::warn!(%peer, "refusing a connection: the peer holds {CONNECTIONS_PER_PEER_MAX}");
            continue;
        };
        let service = served(service.clone(), gateway.metrics.clone(), gateway.vfs.fs().env().clone());
        let tls = tls.clone();
        tokio::spawn(async move {
            let mut http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            http.http1().max_buf_size(HEADER_BYTES_MAX);
            let served = match tls {
                None => http.serve_connection(TokioIo::new(stream), service).await,
                Some(acceptor) => match tokio::time::timeout(TLS_HANDSHAKE_MAX, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => http.serve_connection(TokioIo::new(stream), service).await,
                    Ok(Err(e)) => Err(e.into()),
                    Err(_) => Err("the TLS handshake took too long".into()),
                },
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "S3 connection ended");
            }
            drop((permit, slot));
        });
    }
}
