//! Per-client limits: requests per access key per second (a token bucket
//! per key, refused with `SlowDown`, which S3 clients back off and retry),
//! connections per peer address, and uploads in flight (bodies being
//! written: PUT, UploadPart, copies, completions) per user and in all,
//! also refused with `SlowDown`; and multipart uploads open per user,
//! refused with [`TOO_MANY_UPLOADS`] (400: not worth retrying until the
//! user completes or aborts one).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Requests one access key may make per second, on average, unless configured otherwise.
pub const REQUESTS_PER_KEY_PER_SEC_DEFAULT: u32 = 2000;
/// How many seconds' worth of requests a key may make at once after a quiet spell.
const BURST_SECONDS: u32 = 2;
/// Keys whose buckets are remembered at most; past it all are forgotten (each starts full again).
const KEYS_REMEMBERED_MAX: usize = 100_000;
/// Connections one peer address may hold open at once.
pub const CONNECTIONS_PER_PEER_MAX: usize = 128;

/// Uploads the gateway writes at once, over all users: each holds up to
/// [`IO_CHUNK`](crate::IO_CHUNK) of buffer and a drive write in flight.
pub const UPLOADS_IN_FLIGHT_MAX: usize = 256;
/// Uploads one user may have in flight at once, unless configured otherwise.
pub const UPLOADS_IN_FLIGHT_PER_USER_DEFAULT: usize = 32;
/// Smallest part of a multipart upload but its last (S3's 5 MiB), unless
/// configured otherwise; a completion naming a smaller one is `EntityTooSmall`.
pub const PART_BYTES_MIN_DEFAULT: u64 = 5 << 20;

const _: () = assert!(UPLOADS_IN_FLIGHT_PER_USER_DEFAULT <= UPLOADS_IN_FLIGHT_MAX);

/// A token bucket per access key.
#[derive(Debug)]
pub(crate) struct KeyRates {
    per_sec: u32,
    buckets: Mutex<HashMap<String, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl KeyRates {
    /// `per_sec` requests per key per second (at least 1).
    pub fn new(per_sec: u32) -> KeyRates {
        KeyRates { per_sec: per_sec.max(1), buckets: Mutex::new(HashMap::new()) }
    }

    /// Takes one request of `key`'s at `now`; false if it is over its rate.
    pub fn admit(&self, key: &str, now: Instant) -> bool {
        let capacity = f64::from(self.per_sec * BURST_SECONDS);
        let mut buckets = self.buckets.lock().expect("key rates lock");
        if buckets.len() >= KEYS_REMEMBERED_MAX && !buckets.contains_key(key) {
            buckets.clear();
        }
        let b = buckets.entry(key.to_string()).or_insert(Bucket { tokens: capacity, at: now });
        let refill = now.saturating_duration_since(b.at).as_secs_f64() * f64::from(self.per_sec);
        b.tokens = (b.tokens + refill).min(capacity);
        b.at = now.max(b.at);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Open connections per peer address.
#[derive(Debug, Default, Clone)]
pub(crate) struct PeerConnections(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// One connection counted against its peer until dropped.
pub(crate) struct PeerSlot {
    peers: PeerConnections,
    ip: IpAddr,
}

impl PeerConnections {
    /// A slot for a new connection from `ip`, unless it holds [`CONNECTIONS_PER_PEER_MAX`].
    pub fn take(&self, ip: IpAddr) -> Option<PeerSlot> {
        let mut open = self.0.lock().expect("peer connections lock");
        let n = open.entry(ip).or_insert(0);
        if *n >= CONNECTIONS_PER_PEER_MAX {
            return None;
        }
        *n += 1;
        Some(PeerSlot { peers: self.clone(), ip })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.0.lock().expect("peer connections lock");
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Multipart uploads one user may have open (created, not yet completed or
/// aborted), unless configured otherwise.
pub const OPEN_UPLOADS_PER_USER_DEFAULT: usize = 1000;
/// Largest bound on open multipart uploads per user a gateway may configure:
/// each is a directory the sweep for abandoned uploads lists.
pub const OPEN_UPLOADS_PER_USER_MAX: usize = 100_000;
/// The S3 error code of a CreateMultipartUpload over the user's bound.
pub const TOO_MANY_UPLOADS: &str = "TooManyOpenMultipartUploads";

const _: () = assert!(OPEN_UPLOADS_PER_USER_DEFAULT <= OPEN_UPLOADS_PER_USER_MAX);

/// Open multipart uploads per user (uid, the owner of the upload's
/// directory): counted from the buckets once, at the first creation, then
/// kept as uploads are created and removed.
#[derive(Debug)]
pub(crate) struct OpenUploads {
    per_user: usize,
    counts: Mutex<HashMap<u32, usize>>,
    /// Set once the buckets were counted.
    pub(crate) counted: tokio::sync::OnceCell<()>,
}

impl OpenUploads {
    /// At most `per_user` (1 to [`OPEN_UPLOADS_PER_USER_MAX`]) per user.
    pub fn new(per_user: usize) -> OpenUploads {
        OpenUploads {
            per_user: per_user.clamp(1, OPEN_UPLOADS_PER_USER_MAX),
            counts: Mutex::new(HashMap::new()),
            counted: tokio::sync::OnceCell::new(),
        }
    }

    /// Counts one more of `uid`'s; [`TOO_MANY_UPLOADS`] if it has its bound.
    pub fn open(&self, uid: u32) -> s3s::S3Result<()> {
        let mut counts = self.counts.lock().expect("open uploads lock");
        let mine = counts.entry(uid).or_insert(0);
        if *mine >= self.per_user {
            let mut e = s3s::S3Error::with_message(
                s3s::S3ErrorCode::Custom(TOO_MANY_UPLOADS.into()),
                format!(
                    "this user has {} multipart uploads open, as many as it may: complete or abort some \
                     (ListMultipartUploads lists them)",
                    self.per_user
                ),
            );
            e.set_status_code(http::StatusCode::BAD_REQUEST);
            return Err(e);
        }
        *mine += 1;
        Ok(())
    }

    /// Counts one of `uid`'s found in a bucket (no bound: it exists).
    pub fn found(&self, uid: u32) {
        *self.counts.lock().expect("open uploads lock").entry(uid).or_insert(0) += 1;
    }

    /// One of `uid`'s is gone (completed, aborted, swept, or never made).
    pub fn closed(&self, uid: u32) {
        let mut counts = self.counts.lock().expect("open uploads lock");
        if let Some(n) = counts.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&uid);
            }
        }
    }
}

/// Uploads in flight, per user (uid) and in all.
#[derive(Debug)]
pub(crate) struct InFlight {
    per_user: usize,
    open: Mutex<(usize, HashMap<u32, usize>)>,
}

/// One upload counted against its user and the gateway until dropped.
pub(crate) struct InFlightSlot {
    in_flight: Arc<InFlight>,
    uid: u32,
}

impl InFlight {
    /// At most `per_user` (at least 1, at most [`UPLOADS_IN_FLIGHT_MAX`]) per user.
    pub fn new(per_user: usize) -> InFlight {
        InFlight { per_user: per_user.clamp(1, UPLOADS_IN_FLIGHT_MAX), open: Mutex::new((0, HashMap::new())) }
    }

    /// A slot for one more upload of `uid`'s; `SlowDown` if the user or the
    /// gateway is at its bound.
    pub fn take(self: &Arc<Self>, uid: u32) -> s3s::S3Result<InFlightSlot> {
        let mut open = self.open.lock().expect("uploads in flight lock");
        if open.0 >= UPLOADS_IN_FLIGHT_MAX {
            return Err(s3s::s3_error!(SlowDown, "the gateway is writing as many uploads as it takes at once"));
        }
        let mine = open.1.entry(uid).or_insert(0);
        if *mine >= self.per_user {
            return Err(s3s::s3_error!(SlowDown, "this user has as many uploads in flight as it may"));
        }
        *mine += 1;
        open.0 += 1;
        Ok(InFlightSlot { in_flight: self.clone(), uid })
    }
}

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        let mut open = self.in_flight.open.lock().expect("uploads in flight lock");
        open.0 -= 1;
        if let Some(n) = open.1.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_key_gets_its_burst_then_its_rate_and_others_are_not_held_up() {
        let rates = KeyRates::new(10);
        let t0 = Instant::now();
        let admitted = (0..30).filter(|_| rates.admit("AK1", t0)).count();
        assert_eq!(admitted, 20, "two seconds' worth at once");
        assert!(rates.admit("AK2", t0), "another key has its own bucket");
        assert!(!rates.admit("AK1", t0 + Duration::from_millis(50)), "half a token back: still refused");
        assert!(rates.admit("AK1", t0 + Duration::from_millis(100)), "one token back after 1/10 s");
        let later = t0 + Duration::from_secs(60);
        assert_eq!((0..30).filter(|_| rates.admit("AK1", later)).count(), 20, "refilled to the burst, no more");
    }

    #[test]
    fn a_peer_holds_at_most_its_connections_and_gets_them_back() {
        let peers = PeerConnections::default();
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let slots: Vec<_> = (0..CONNECTIONS_PER_PEER_MAX).map(|_| peers.take(ip).expect("a slot")).collect();
        assert!(peers.take(ip).is_none(), "one more is refused");
        assert!(peers.take("192.0.2.8".parse().unwrap()).is_some(), "another peer is not");
        drop(slots);
        assert!(peers.take(ip).is_some(), "closed connections give their slots back");
        assert_eq!(peers.0.lock().unwrap().len(), 0, "nothing kept for peers without connections");
    }

    #[test]
    fn open_uploads_are_bounded_per_user_and_closing_one_makes_room() {
        let open = OpenUploads::new(2);
        open.open(7).expect("first");
        open.open(7).expect("second");
        let refused = open.open(7).expect_err("the third is refused");
        assert_eq!(refused.code().as_str(), TOO_MANY_UPLOADS);
        assert_eq!(refused.status_code(), Some(http::StatusCode::BAD_REQUEST));
        open.open(8).expect("another user has its own bound");
        open.closed(7);
        open.open(7).expect("a closed upload makes room");
        open.closed(8);
        open.closed(8);
        assert!(!open.counts.lock().unwrap().contains_key(&8), "nothing kept for users without uploads");
    }

    #[test]
    fn uploads_in_flight_are_bounded_per_user_and_in_all() {
        let in_flight = Arc::new(InFlight::new(2));
        let mine: Vec<_> = (0..2).map(|_| in_flight.take(7).expect("a slot")).collect();
        let refused = in_flight.take(7).err().expect("the user's third is refused");
        assert_eq!(refused.code().as_str(), "SlowDown");
        let others: Vec<_> =
            (0..UPLOADS_IN_FLIGHT_MAX - 2).map(|i| in_flight.take(100 + i as u32).expect("a slot")).collect();
        assert_eq!(in_flight.take(99).err().expect("the gateway is full").code().as_str(), "SlowDown");
        drop(mine);
        let again = in_flight.take(7).expect("finished uploads give their slots back");
        drop((again, others));
        assert_eq!(in_flight.open.lock().unwrap().0, 0);
        assert!(in_flight.open.lock().unwrap().1.is_empty(), "nothing kept for users without uploads");
    }
}
