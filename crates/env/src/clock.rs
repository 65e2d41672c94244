//! The wall clock. [`system_ns`] is the one place nasd reads the system's
//! clock; components below the seam read it through [`crate::Env::now_ns`],
//! front ends that never run simulated (the FUSE mount, the CLI) call it
//! directly.
//!
//! Intervals, deadlines and sleeps are tokio's (`tokio::time`), which the
//! simulator runs on simulated time; only the wall clock — what goes into
//! nonces, capability expiry, timestamps and leases on disk — is here.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The system's wall clock: nanoseconds since the Unix epoch (0 for a clock
/// set before it; saturating after the year 2554).
pub fn system_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64)
}

/// The system's wall clock as a duration since the Unix epoch (zero before it).
pub fn system_since_epoch() -> Duration {
    Duration::from_nanos(system_ns())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_is_after_2020_and_agrees_with_systemtime() {
        let ns = system_ns();
        assert!(ns > 1_577_836_800_000_000_000, "after 2020-01-01: {ns}");
        let std = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
        assert!(std >= ns, "read in order");
        assert!(system_since_epoch() >= Duration::from_nanos(ns), "the clock does not go back here");
    }
}
