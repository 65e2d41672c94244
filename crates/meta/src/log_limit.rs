//! Rate-limited logging of a failure that repeats: a database outage makes
//! every request fail the same way, and one log line per request (hundreds
//! a second) buries what matters. [`LogLimit`] lets the first line through
//! at once, then one per [`LOG_REPEAT_INTERVAL`], each saying how many like
//! it were left out since the one before.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Least time between two lines of one [`LogLimit`].
pub const LOG_REPEAT_INTERVAL: Duration = Duration::from_secs(10);

/// One kind of repeating log line. See the module documentation.
#[derive(Debug, Default)]
pub struct LogLimit {
    /// When a line was last let through, and how many were left out since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogLimit {
    /// A limiter that has let nothing through yet.
    pub const fn new() -> LogLimit {
        LogLimit { state: Mutex::new((None, 0)) }
    }

    /// Runs `log(suppressed)` if no line went through in the last
    /// [`LOG_REPEAT_INTERVAL`], with the number of lines left out since the
    /// last one; else counts this one as left out. Returns whether it ran.
    pub fn log(&self, log: impl FnOnce(u64)) -> bool {
        self.log_at(Instant::now(), log)
    }

    fn log_at(&self, now: Instant, log: impl FnOnce(u64)) -> bool {
        let suppressed = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            match state.0 {
                Some(at) if now.saturating_duration_since(at) < LOG_REPEAT_INTERVAL => {
                    state.1 += 1;
                    return false;
                }
                _ => {
                    let suppressed = state.1;
                    *state = (Some(now), 0);
                    suppressed
                }
            }
        };
        log(suppressed);
        true
    }

    /// Forgets the last line: the failure is over, and the next one is news.
    pub fn reset(&self) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = (None, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_counting_the_rest() {
        let limit = LogLimit::new();
        let t0 = Instant::now();
        let mut lines = Vec::new();
        for i in 0..25u64 {
            // Every 100 ms for 2.5 s of clock: lines at 0 s, then none until 10 s.
            limit.log_at(t0 + Duration::from_millis(100 * i), |n| lines.push(n));
        }
        assert_eq!(lines, vec![0]);
        limit.log_at(t0 + LOG_REPEAT_INTERVAL, |n| lines.push(n));
        assert_eq!(lines, vec![0, 24], "the second line counts the 24 left out");
        limit.reset();
        assert!(limit.log_at(t0 + LOG_REPEAT_INTERVAL, |n| lines.push(n)), "news after a reset");
    }
}
