//! Back-off of login attempts per address: after a failed login, the
//! host's password checks take turns, and turns are spaced by a delay that
//! doubles with every failure, from [`LOGIN_BACKOFF_MIN`] to
//! [`LOGIN_BACKOFF_MAX`]. Attempts in parallel (many connections from one
//! host) share the host's turns, so they guess no faster than one
//! connection does; a successful login, or [`LOGIN_FAILURES_FORGET`]
//! without a failure, clears the host's record. Hosts are counted like
//! connections are (an IPv4 address, an IPv6 /64), at most
//! [`LOGIN_BACKOFF_HOSTS_MAX`] remembered.
//!
//! **A turn is taken when it comes, never booked ahead.** An attempt waits
//! until the host's next turn is due and takes it then; attempts that find
//! it taken wait for the one after. An attempt that gives up while waiting
//! (its connection's login deadline passed) has taken nothing, so the
//! host's next turn is never more than [`LOGIN_BACKOFF_MAX`] after its last
//! check: once a host's waiting attempts are gone, its next one waits at
//! most that long. (Turns used to be booked at arrival: a burst of
//! connections that timed out waiting left their bookings behind, and the
//! host's right password was turned away for minutes after the guessing
//! stopped.)
//!
//! The bookkeeping is pure state driven by the caller's clock, so it is
//! tested without sleeping; [`LoginBackoff::paced`] is the waiting around it.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The delay between attempts after a host's first failed login.
pub const LOGIN_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest delay between a host's password checks: at most one guess
/// per this per host, and the longest an attempt waits when no other
/// attempt of its host is waiting (with `LOGIN_TIMEOUT` of 10 s, a
/// connection gets a few).
pub const LOGIN_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A host with no failed login for this long starts afresh.
pub const LOGIN_FAILURES_FORGET: Duration = Duration::from_secs(600);
/// Most hosts remembered (~100 bytes each); past it, the one whose last
/// failure is oldest is forgotten.
pub const LOGIN_BACKOFF_HOSTS_MAX: usize = 4096;

/// A host's failed logins.
struct Record {
    failures: u32,
    /// When the host's next turn is due: a check at or after it may start.
    next_turn: Instant,
    last_failure: Instant,
}

/// What a paced check came to, as the back-off counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The credential was right: the host starts afresh.
    Succeeded,
    /// The credential was wrong: the host's turns are spaced further.
    Failed,
    /// Nothing was learnt about the credential (a malformed request, a
    /// disabled user after the right password): the turn is used, no more.
    Neither,
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

    /// An attempt from `host` at `now` asks for a turn: `None` if it has
    /// it (it may check the password now; the host's next turn is a delay
    /// later), else how long until the host's next turn is due — which it
    /// has not taken: it asks again then, and another attempt may take the
    /// turn first. An attempt that stops asking leaves nothing behind.
    pub fn try_turn(&self, host: IpAddr, now: Instant) -> Option<Duration> {
        let mut hosts = self.hosts();
        let record = hosts.get_mut(&host)?;
        if now.saturating_duration_since(record.last_failure) > LOGIN_FAILURES_FORGET {
            hosts.remove(&host);
            return None;
        }
        if now < record.next_turn {
            return Some(record.next_turn - now);
        }
        record.next_turn = now + delay(record.failures);
        assert!(record.next_turn <= now + LOGIN_BACKOFF_MAX, "a turn is never booked ahead");
        None
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

    /// Runs the credential check `check` for an attempt from `host` in one
    /// of the host's turns, and counts what it came to (`verdict`).
    ///
    /// # Cancel safety
    /// Cancel-safe while waiting for the turn (nothing is taken until the
    /// check starts). Dropped during `check`, the turn is used and the
    /// outcome not counted.
    pub async fn paced<T>(
        &self,
        host: IpAddr,
        check: impl Future<Output = T>,
        verdict: impl FnOnce(&T) -> Verdict,
    ) -> T {
        // tokio's clock: simulated time in a simulation, the monotonic clock otherwise.
        let now = || tokio::time::Instant::now().into_std();
        while let Some(wait) = self.try_turn(host, now()) {
            tokio::time::sleep(wait).await;
        }
        let outcome = check.await;
        match verdict(&outcome) {
            Verdict::Succeeded => self.succeeded(host),
            Verdict::Failed => self.failed(host, now()),
            Verdict::Neither => {}
        }
        outcome
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
        assert_eq!(b.try_turn(A, t0), None, "no failure, no wait");
        b.failed(A, t0);
        assert_eq!(b.try_turn(A, t0), Some(LOGIN_BACKOFF_MIN));
        // Parallel attempts wait for the same turn; one takes it, the others the next.
        assert_eq!(b.try_turn(A, t0), Some(LOGIN_BACKOFF_MIN), "a turn is not booked by asking");
        let t1 = t0 + LOGIN_BACKOFF_MIN;
        assert_eq!(b.try_turn(A, t1), None);
        assert_eq!(b.try_turn(A, t1), Some(LOGIN_BACKOFF_MIN), "taken: the next one is a delay later");
        assert_eq!(b.try_turn(B, t0), None, "other hosts are not held up");
        for _ in 0..20 {
            b.failed(A, t1);
        }
        assert_eq!(b.try_turn(A, t1), Some(LOGIN_BACKOFF_MAX), "capped");
        // A minute on, the host's turn has come; the one after is the capped delay away.
        let minute = t0 + Duration::from_secs(60);
        assert_eq!(b.try_turn(A, minute), None);
        assert_eq!(b.try_turn(A, minute), Some(LOGIN_BACKOFF_MAX));
        let later = t0 + Duration::from_secs(3600 * 24);
        assert_eq!(b.try_turn(A, later), None, "forgotten after LOGIN_FAILURES_FORGET");
        assert_eq!(b.try_turn(A, later), None);
        b.failed(A, later);
        b.succeeded(A);
        assert_eq!(b.try_turn(A, later), None, "a success starts afresh");
    }

    /// A burst of attempts from one host that give up waiting (their
    /// connections' login deadline) leaves the host's next turn at most
    /// `LOGIN_BACKOFF_MAX` after its last check: turns used to be booked at
    /// arrival, so 100 abandoned attempts pushed it 200 s out.
    #[test]
    fn attempts_that_give_up_waiting_leave_no_turn_behind() {
        let b = LoginBackoff::default();
        let t0 = Instant::now();
        for _ in 0..8 {
            b.failed(A, t0);
        }
        for i in 0..100 {
            let wait = b.try_turn(A, t0 + Duration::from_millis(i)).expect("the turn is not due yet");
            assert!(wait <= LOGIN_BACKOFF_MAX, "attempt {i} waits {wait:?}");
        }
        // They all gave up; the next attempt after the burst waits at most one delay.
        let after = t0 + Duration::from_secs(1);
        assert!(b.try_turn(A, after).is_some_and(|w| w <= LOGIN_BACKOFF_MAX));
        assert_eq!(b.try_turn(A, t0 + LOGIN_BACKOFF_MAX), None, "its turn, when the delay has passed");
    }

    #[test]
    fn paced_checks_count_as_their_verdict_says() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            let b = LoginBackoff::default();
            assert_eq!(b.paced(A, async { 1 }, |_| Verdict::Failed).await, 1);
            assert!(b.try_turn(A, Instant::now()).is_some(), "a failure spaces the next turn");
            b.paced(A, async {}, |_| Verdict::Succeeded).await;
            assert_eq!(b.try_turn(A, Instant::now()), None, "a success starts afresh");
            b.paced(B, async {}, |_| Verdict::Neither).await;
            assert_eq!(b.try_turn(B, Instant::now()), None, "neither: nothing counted");
        });
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
