//! Back-off of login attempts per address: after a failed login, each
//! further attempt from the same host waits its turn, and turns are spaced
//! by a delay that doubles with every failure, from [`LOGIN_BACKOFF_MIN`] to
//! [`LOGIN_BACKOFF_MAX`]. Attempts in parallel (many connections from one
//! host) are spaced the same way, so they guess no faster than one
//! connection does; a successful login, or [`LOGIN_FAILURES_FORGET`]
//! without a failure, clears the host's record. Hosts are counted like
//! connections are (an IPv4 address, an IPv6 /64), at most
//! [`LOGIN_BACKOFF_HOSTS_MAX`] remembered.
//!
//! Pure state driven by the caller's clock, so it is tested without sleeping.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The delay between attempts after a host's first failed login.
pub const LOGIN_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest delay between a host's attempts: at most one guess per this
/// per host (with `LOGIN_TIMEOUT` of 10 s, a connection gets a few).
pub const LOGIN_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A host with no failed login for this long starts afresh.
pub const LOGIN_FAILURES_FORGET: Duration = Duration::from_secs(600);
/// Most hosts remembered (~100 bytes each); past it, the one whose last
/// failure is oldest is forgotten.
pub const LOGIN_BACKOFF_HOSTS_MAX: usize = 4096;

/// A host's failed logins.
struct Record {
    failures: u32,
    /// When the host's next attempt may be checked.
    next_turn: Instant,
    last_failure: Instant,
}

/// Failed logins per host (see the module documentation).
#[derive(Default)]
pub struct LoginBackoff {
    hosts: Mutex<HashMap<IpAddr, Record>>,
}

/// The delay between turns after `failures` failed logins.
fn delay(failures: u32) -> Duration {
    match failures {
        0 => Duration::ZERO,
        n => LOGIN_BACKOFF_MIN.saturating_mul(1 << (n - 1).min(16)).min(LOGIN_BACKOFF_MAX),
    }
}

impl LoginBackoff {
    fn hosts(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Record>> {
        self.hosts.lock().expect("login back-off mutex poisoned")
    }

    /// How long an attempt from `host` made at `now` waits before its
    /// password is checked; takes that turn, so the next attempt waits for
    /// the one after.
    pub fn take_turn(&self, host: IpAddr, now: Instant) -> Duration {
        let mut hosts = self.hosts();
        let Some(record) = hosts.get_mut(&host) else { return Duration::ZERO };
        if now.saturating_duration_since(record.last_failure) > LOGIN_FAILURES_FORGET {
            hosts.remove(&host);
            return Duration::ZERO;
        }
        let turn = record.next_turn.max(now);
        record.next_turn = turn + delay(record.failures);
        turn - now
    }

    /// A login from `host` failed at `now`.
    pub fn failed(&self, host: IpAddr, now: Instant) {
        let mut hosts = self.hosts();
        if !hosts.contains_key(&host) && hosts.len() >= LOGIN_BACKOFF_HOSTS_MAX {
            let oldest = hosts.iter().min_by_key(|(_, r)| r.last_failure).map(|(h, _)| *h);
            if let Some(h) = oldest {
                hosts.remove(&h);
            }
        }
        let record = hosts.entry(host).or_insert(Record { failures: 0, next_turn: now, last_failure: now });
        record.failures = record.failures.saturating_add(1);
        record.last_failure = now;
        record.next_turn = record.next_turn.max(now + delay(record.failures));
    }

    /// A login from `host` succeeded: it starts afresh.
    pub fn succeeded(&self, host: IpAddr) {
        self.hosts().remove(&host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2));

    #[test]
    fn turns_are_spaced_by_a_delay_that_doubles_with_each_failure_up_to_the_cap() {
        let b = LoginBackoff::default();
        let t0 = Instant::now();
        assert_eq!(b.take_turn(A, t0), Duration::ZERO, "no failure, no wait");
        b.failed(A, t0);
        assert_eq!(b.take_turn(A, t0), LOGIN_BACKOFF_MIN);
        // Parallel attempts queue behind one another.
        assert_eq!(b.take_turn(A, t0), 2 * LOGIN_BACKOFF_MIN);
        assert_eq!(b.take_turn(B, t0), Duration::ZERO, "other hosts are not held up");
        for _ in 0..20 {
            b.failed(A, t0);
        }
        // A minute on, the host's turn has come; the one after is the capped delay away.
        let minute = t0 + Duration::from_secs(60);
        assert_eq!(b.take_turn(A, minute), Duration::ZERO);
        assert_eq!(b.take_turn(A, minute), LOGIN_BACKOFF_MAX);
        let later = t0 + Duration::from_secs(3600 * 24);
        assert_eq!(b.take_turn(A, later), Duration::ZERO, "forgotten after LOGIN_FAILURES_FORGET");
        b.failed(A, later);
        b.succeeded(A);
        assert_eq!(b.take_turn(A, later), Duration::ZERO, "a success starts afresh");
    }

    #[test]
    fn hosts_remembered_are_bounded() {
        let b = LoginBackoff::default();
        let t0 = Instant::now();
        for i in 0..LOGIN_BACKOFF_HOSTS_MAX as u32 + 10 {
            b.failed(IpAddr::V4(i.into()), t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(b.hosts().len(), LOGIN_BACKOFF_HOSTS_MAX);
        assert!(!b.hosts().contains_key(&IpAddr::V4(0.into())), "the oldest is forgotten first");
    }
}
