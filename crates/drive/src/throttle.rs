//! Emulated slow media, a test aid for benchmarks: a token bucket shared by
//! every connection of a drive paces the data bytes the drive moves between
//! its store and the network, so the drive's aggregate data throughput stays
//! at a configured rate (`DriveConfig::throttle_bytes_per_sec`).
//!
//! The bucket is a pure state machine over a clock the caller passes in
//! ([`Bucket::take`]), so its arithmetic is tested with an injected clock;
//! [`Throttle`] wraps it with the monotonic clock and an async sleep, so a
//! paced connection never blocks a runtime worker thread.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How much a drive may move at once after an idle spell, as time at the
/// configured rate: 5 ms. Keeps bursts short whatever the chunk length (a
/// chunk bigger than the burst simply waits longer).
pub const THROTTLE_BURST: Duration = Duration::from_millis(5);

const NANOS_PER_SEC: i128 = 1_000_000_000;

/// Token bucket arithmetic. Tokens are kept in byte-nanoseconds (bytes ×
/// 10⁹), so refilling at `rate` bytes per second adds exactly `rate` per
/// elapsed nanosecond: integer arithmetic, no rounding drift.
#[derive(Debug, Clone)]
pub struct Bucket {
    /// Bytes per second (≥ 1).
    rate: u64,
    /// Most tokens the bucket holds, byte-nanoseconds.
    burst: i128,
    /// Tokens now (negative: bytes promised to callers still waiting).
    tokens: i128,
    /// Clock of the last refill, nanoseconds.
    last_ns: u64,
}

impl Bucket {
    /// A full bucket at `now_ns` for `rate` bytes per second (0 is taken as
    /// 1) holding at most [`THROTTLE_BURST`] worth of bytes (at least one).
    pub fn new(rate: u64, now_ns: u64) -> Bucket {
        let rate = rate.max(1);
        let burst_bytes = (rate as i128 * THROTTLE_BURST.as_nanos() as i128 / NANOS_PER_SEC).max(1);
        let burst = burst_bytes * NANOS_PER_SEC;
        Bucket { rate, burst, tokens: burst, last_ns: now_ns }
    }

    /// The most bytes the bucket lets through at once.
    pub fn burst_bytes(&self) -> u64 {
        (self.burst / NANOS_PER_SEC) as u64
    }

    /// Takes `bytes` at `now_ns` (a clock that never goes back; an earlier
    /// time counts as `last`); returns how long the caller must wait before
    /// moving them. The bytes are reserved at once — a later caller waits
    /// behind them — so callers that each wait their answer move, together,
    /// at most `rate` bytes per second after the first burst.
    pub fn take(&mut self, now_ns: u64, bytes: u64) -> Duration {
        let elapsed = now_ns.saturating_sub(self.last_ns) as i128;
        self.last_ns = self.last_ns.max(now_ns);
        // elapsed × rate < 2^64 × 2^64 = 2^128: saturate before the cap.
        self.tokens = self.tokens.saturating_add(elapsed.saturating_mul(self.rate as i128)).min(self.burst);
        self.tokens -= bytes as i128 * NANOS_PER_SEC;
        if self.tokens >= 0 {
            return Duration::ZERO;
        }
        // Ceiling: the tokens are back by then, not a nanosecond before.
        let rate = self.rate as i128;
        let wait = (-self.tokens + rate - 1) / rate;
        Duration::from_nanos(wait.min(u64::MAX as i128) as u64)
    }
}

/// A drive's shared pacer: [`Bucket`] on the monotonic clock.
#[derive(Debug)]
pub struct Throttle {
    start: Instant,
    bucket: Mutex<Bucket>,
}

impl Throttle {
    /// Paces at `bytes_per_sec`.
    pub fn new(bytes_per_sec: u64) -> Throttle {
        Throttle { start: Instant::now(), bucket: Mutex::new(Bucket::new(bytes_per_sec, 0)) }
    }

    /// Waits (asynchronously) until `bytes` more may move. The lock is held
    /// only for the arithmetic, never across the sleep.
    ///
    /// # Cancel safety
    /// Cancelling the wait keeps the bytes reserved: the drive's aggregate
    /// rate is still honoured.
    pub async fn pace(&self, bytes: u64) {
        let now = self.start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        let wait = self.bucket.lock().expect("throttle lock poisoned").take(now, bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    #[test]
    fn a_full_bucket_lets_a_burst_through_then_waits_exactly() {
        let mut b = Bucket::new(1_000_000, 0); // 1 MB/s: burst 5000 bytes
        assert_eq!(b.burst_bytes(), 5_000);
        assert_eq!(b.take(0, 3_000), Duration::ZERO);
        assert_eq!(b.take(0, 2_000), Duration::ZERO, "the burst is exactly 5 ms worth");
        assert_eq!(b.take(0, 1), Duration::from_nanos(1_000), "1 byte at 1 MB/s is 1 µs");
        // 2 ms later 2000 bytes are back, less the 1 byte still owed.
        assert_eq!(b.take(2 * MS, 1_999), Duration::ZERO);
        assert_eq!(b.take(2 * MS, 1_000), Duration::from_millis(1));
    }

    #[test]
    fn reservations_queue_so_concurrent_callers_share_the_rate() {
        // Eight connections each ask for a 256 KiB chunk at the same instant.
        let rate = 50 << 20;
        let mut b = Bucket::new(rate, 0);
        let burst = b.burst_bytes();
        let chunk = 256 << 10;
        let waits: Vec<Duration> = (0..8).map(|_| b.take(0, chunk)).collect();
        for (i, w) in waits.iter().enumerate() {
            let owed = (i as u64 + 1) * chunk - burst;
            let want = (owed as u128 * S as u128).div_ceil(rate as u128);
            assert_eq!(w.as_nanos(), want, "caller {i} waits for everything reserved before it, and its own");
        }
        assert!(waits.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn paced_transfer_takes_bytes_over_rate_after_the_first_burst() {
        // A caller that waits what it is told before each chunk, on a clock
        // that advances only by those waits, moves `total` bytes in
        // (total - burst) / rate: the rate is exact, not approximate.
        for (rate, chunk) in [(10 << 20, 256 << 10), (1 << 20, 1 << 20), (123_457, 4096), (3, 1)] {
            let mut b = Bucket::new(rate, 7 * S);
            let mut now = 7 * S;
            let mut moved = 0u64;
            while moved < 64 * chunk {
                now += b.take(now, chunk).as_nanos() as u64;
                moved += chunk;
            }
            let elapsed = (now - 7 * S) as u128;
            let ideal = ((moved - b.burst_bytes()) as u128 * S as u128).div_ceil(rate as u128);
            assert!(
                elapsed >= ideal && elapsed <= ideal + 64,
                "rate {rate}: {elapsed} ns for {moved} bytes, ideal {ideal}"
            );
        }
    }

    #[test]
    fn idle_time_refills_only_up_to_the_burst() {
        let mut b = Bucket::new(1_000_000, 0);
        assert_eq!(b.take(0, 5_000), Duration::ZERO);
        // An hour idle: still only one burst.
        assert_eq!(b.take(3600 * S, 5_000), Duration::ZERO);
        assert_eq!(b.take(3600 * S, 1_000), Duration::from_millis(1));
        // A clock read out of order (an earlier time) refills nothing.
        assert_eq!(b.take(3600 * S - S, 1_000), Duration::from_millis(2));
    }

    #[test]
    fn extreme_rates_and_sizes_do_not_overflow() {
        let mut fast = Bucket::new(u64::MAX, 0);
        let w = fast.take(u64::MAX, u64::MAX);
        assert!(w > Duration::from_millis(990) && w <= Duration::from_secs(1), "u64::MAX bytes at u64::MAX/s: {w:?}");
        let mut slow = Bucket::new(0, 0); // taken as 1 byte per second
        assert_eq!(slow.burst_bytes(), 1);
        assert_eq!(slow.take(0, 1), Duration::ZERO);
        assert_eq!(slow.take(0, 10), Duration::from_secs(10));
        assert_eq!(slow.take(u64::MAX, u64::MAX), Duration::from_nanos(u64::MAX), "refill capped, waits saturate");
    }
}
