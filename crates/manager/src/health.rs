//! Drive health from heartbeats: every [`HEARTBEAT_INTERVAL`] the manager
//! asks each drive for `INQUIRY` on a connection of its own (so a long
//! operation on the manager's working connection cannot make a live drive
//! look dead); [`HEARTBEAT_MISSES_MAX`] misses in a row make the drive
//! **down**, one answer makes it **up** again. The answers also carry what
//! placement needs: capacity, use and failure domain.
//!
//! The state machine ([`DriveHealth::observe`]) is pure; [`probe`] does the I/O.

use nasd_client::DriveClient;
use nasd_proto::DriveInfo;
use std::time::Duration;
use tokio::time::Instant;

/// How often each drive is probed.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// How long one probe may take before it counts as a miss.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);
/// Consecutive misses that make a drive down (so a drive is declared down
/// about this many intervals after it stops answering).
pub const HEARTBEAT_MISSES_MAX: u32 = 3;

/// What the last answer said.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reported {
    /// Bytes of block storage.
    pub capacity_bytes: u64,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Failure domain from the drive's config (empty: its own).
    pub failure_domain: String,
}

impl Reported {
    /// Free bytes.
    pub fn free_bytes(&self) -> u64 {
        self.capacity_bytes.saturating_sub(self.used_bytes)
    }
}

impl From<&DriveInfo> for Reported {
    fn from(i: &DriveInfo) -> Self {
        Reported {
            capacity_bytes: i.capacity_bytes,
            used_bytes: i.used_bytes,
            failure_domain: i.failure_domain.clone(),
        }
    }
}

/// A change of a drive's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Nothing changed.
    None,
    /// The drive stopped answering.
    WentDown,
    /// The drive answers again (or for the first time since the manager started).
    CameUp,
}

/// One drive's health as the manager tracks it.
#[derive(Debug, Clone)]
pub struct DriveHealth {
    up: bool,
    misses: u32,
    down_since: Option<Instant>,
    /// The last answer, if any since the manager started.
    pub reported: Option<Reported>,
}

impl Default for DriveHealth {
    /// A drive not probed yet counts as up: the manager starts optimistic and
    /// learns otherwise within [`HEARTBEAT_MISSES_MAX`] intervals.
    fn default() -> Self {
        DriveHealth { up: true, misses: 0, down_since: None, reported: None }
    }
}

impl DriveHealth {
    /// Whether the drive answers heartbeats.
    pub fn is_up(&self) -> bool {
        self.up
    }

    /// How long the drive has been down, if it is.
    pub fn down_for(&self, now: Instant) -> Option<Duration> {
        self.down_since.map(|since| now.saturating_duration_since(since))
    }

    /// Takes one probe's outcome.
    pub fn observe(&mut self, now: Instant, answer: Option<Reported>) -> Transition {
        match answer {
            Some(reported) => {
                self.reported = Some(reported);
                self.misses = 0;
                self.down_since = None;
                if self.up {
                    Transition::None
                } else {
                    self.up = true;
                    Transition::CameUp
                }
            }
            None => {
                self.misses = self.misses.saturating_add(1);
                if self.up && self.misses >= HEARTBEAT_MISSES_MAX {
                    self.up = false;
                    self.down_since = Some(now);
                    Transition::WentDown
                } else {
                    Transition::None
                }
            }
        }
    }
}

/// One heartbeat: `INQUIRY` on `conn` (connecting first if needed), within
/// [`HEARTBEAT_TIMEOUT`]. Checks the drive is the one expected; drops the
/// connection on any failure so the next probe connects afresh.
pub async fn probe(env: &nasd_env::Env, conn: &mut Option<DriveClient>, addr: &str, drive_id: [u8; 16]) -> Probe {
    let fresh = conn.is_none();
    let attempt = async {
        if conn.is_none() {
            let c = DriveClient::connect_in(env, addr, nasd_client::DRIVE_WAIT_MAX).await.ok()?;
            if c.drive_id() != drive_id {
                tracing::warn!(addr, "a different drive answers at this address: counting it as down");
                return None;
            }
            *conn = Some(c);
        }
        let info = conn.as_mut()?.inquiry().await.ok()?;
        Some(Reported::from(&info))
    };
    let (answer, broken) = match tokio::time::timeout(HEARTBEAT_TIMEOUT, attempt).await {
        Ok(answer) => {
            let broken = answer.is_none();
            (answer, broken)
        }
        Err(_) => (None, false),
    };
    if answer.is_none() {
        *conn = None;
    }
    Probe { answer, fresh, broken }
}

/// What one heartbeat found.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The drive's answer, if it answered in time.
    pub answer: Option<Reported>,
    /// The answer (or the attempt) was on a new connection.
    pub fresh: bool,
    /// The attempt failed before its time ran out: the connection was
    /// refused or broke, as when the drive's process ends (a restart), not
    /// merely slow.
    pub broken: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_after_consecutive_misses_up_after_one_answer() {
        let t = Instant::now();
        let mut h = DriveHealth::default();
        assert!(h.is_up());
        for i in 1..HEARTBEAT_MISSES_MAX {
            assert_eq!(h.observe(t, None), Transition::None, "miss {i}");
        }
        // An answer in between resets the count.
        assert_eq!(h.observe(t, Some(Reported::default())), Transition::None);
        for _ in 1..HEARTBEAT_MISSES_MAX {
            h.observe(t, None);
        }
        assert!(h.is_up());
        assert_eq!(h.observe(t, None), Transition::WentDown);
        assert!(!h.is_up());
        assert_eq!(h.observe(t + Duration::from_secs(5), None), Transition::None, "down once");
        assert_eq!(h.down_for(t + Duration::from_secs(5)), Some(Duration::from_secs(5)));
        let r = Reported { capacity_bytes: 10, used_bytes: 4, failure_domain: "rack".into() };
        assert_eq!(h.observe(t, Some(r.clone())), Transition::CameUp);
        assert_eq!((h.is_up(), h.down_for(t), h.reported.as_ref().map(Reported::free_bytes)), (true, None, Some(6)));
    }
}
