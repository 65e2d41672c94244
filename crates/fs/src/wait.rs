//! Waiting for a manager that cannot be reached (issue 23.1).
//!
//! When no manager accepts a new connection, a request either fails at once
//! with [`FsError::ManagerUnreachable`](crate::FsError::ManagerUnreachable)
//! (a command: the user sees why and runs it again) or waits for a manager to
//! come back, as a hard NFS mount does (a mount: programs see a pause, not an
//! error). The caller chooses per request with [`with_manager_wait`]; outside
//! it a request makes one attempt.
//!
//! - **What waits**: only the step that opens a new connection. A request
//!   waits before it takes one of the client's connection slots, so waiting
//!   requests hold none, and one of them at a time tries a new connection
//!   every [`MANAGER_PROBE_PAUSE`]; when one gets through, all go on.
//!   Nothing is sent while a request waits, so a request that stops waiting
//!   (its bound passed, its caller interrupted) did nothing.
//! - **A request in flight when the manager goes away** has no answer: one
//!   that only reads is sent again once a manager answers (within the wait);
//!   any other fails with `Io` (`EIO`), since it may or may not have been
//!   carried out.
//! - **Interrupted**: each waiting step also asks the caller's
//!   [`Interrupted`] check, every [`INTERRUPT_POLL`]; once it says so the
//!   request ends with [`FsError::Interrupted`](crate::FsError::Interrupted)
//!   (`EINTR`).
//! - **Logged once**: the first request that waits in an outage logs it
//!   (warn, target [`OUTAGE_LOG_TARGET`]), and the end of that outage is
//!   logged once (info, same target) with how long it lasted and how many
//!   requests waited. A request that does not wait logs nothing.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Pause between two attempts at a new connection while no manager answers
/// (one attempt at a time, whatever the number of waiting requests): the
/// longest a waiting request goes on waiting after a manager is back.
pub const MANAGER_PROBE_PAUSE: Duration = Duration::from_millis(500);
/// How often a waiting request asks whether its caller was interrupted: the
/// longest an interrupted caller waits for its request to end.
pub const INTERRUPT_POLL: Duration = Duration::from_millis(100);
/// Longest bounded wait [`ManagerWait::Bounded`] takes (a day): a longer one
/// is [`ManagerWait::Hard`] in all but name.
pub const MANAGER_WAIT_BOUND_MAX: Duration = Duration::from_secs(24 * 3600);
/// The `tracing` target of the two lines an outage logs (its start and its
/// end), so a program can show them at a level of their own.
pub const OUTAGE_LOG_TARGET: &str = "nasd_outage";

/// How long a request waits for a manager that cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagerWait {
    /// Until a manager answers again (a hard mount); only an interruption of
    /// the caller ends the wait.
    Hard,
    /// At most this long in all, then the request fails with
    /// [`FsError::ManagerUnreachable`](crate::FsError::ManagerUnreachable).
    /// [`ManagerWait::NONE`] makes one attempt.
    Bounded(Duration),
}

impl ManagerWait {
    /// One attempt, no wait: what a request outside [`with_manager_wait`] gets.
    pub const NONE: ManagerWait = ManagerWait::Bounded(Duration::ZERO);

    /// Whether a request waits at all.
    pub fn waits(self) -> bool {
        self != ManagerWait::NONE
    }
}

impl std::fmt::Display for ManagerWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ManagerWait::Hard => f.write_str("hard"),
            ManagerWait::Bounded(d) if d.subsec_millis() == 0 => write!(f, "{}s", d.as_secs()),
            ManagerWait::Bounded(d) => write!(f, "{}ms", d.as_millis()),
        }
    }
}

/// `"hard"`, or a bounded wait: a number with a unit, `"500ms"`, `"30s"`,
/// `"5m"`, `"1h"` (at most [`MANAGER_WAIT_BOUND_MAX`]); `"0s"` does not wait.
impl std::str::FromStr for ManagerWait {
    type Err = String;

    fn from_str(s: &str) -> Result<ManagerWait, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("hard") {
            return Ok(ManagerWait::Hard);
        }
        let bad = || format!("'{s}' is not a manager wait: \"hard\", or a duration such as \"30s\", \"500ms\", \"5m\"");
        let digits = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let (number, unit) = s.split_at(digits);
        let n: u64 = number.parse().map_err(|_| bad())?;
        let ms_per = match unit.trim() {
            "ms" => 1,
            "s" => 1000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        let wait = n.checked_mul(ms_per).map(Duration::from_millis).ok_or_else(bad)?;
        if wait > MANAGER_WAIT_BOUND_MAX {
            return Err(format!(
                "a manager wait of '{s}' is over the bound of {} h: use \"hard\" to wait without end",
                MANAGER_WAIT_BOUND_MAX.as_secs() / 3600
            ));
        }
        Ok(ManagerWait::Bounded(wait))
    }
}

/// A check a waiting request makes every [`INTERRUPT_POLL`]: `true` once its
/// caller gave up (for a FUSE request: a signal is pending for the process
/// that made the system call). It must be quick and must not block.
pub type Interrupted = Arc<dyn Fn() -> bool + Send + Sync>;

/// What the request being run may wait for.
#[derive(Clone)]
pub(crate) struct Patience {
    pub(crate) wait: ManagerWait,
    interrupted: Option<Interrupted>,
}

tokio::task_local! {
    static PATIENCE: Patience;
}

/// Runs `fut` with its manager requests waiting as `wait` says for a manager
/// that cannot be reached, each wait ended early once `interrupted` says so.
/// Scopes nest: the innermost one holds. Work `fut` hands to tasks of their
/// own makes one attempt.
///
/// ```no_run
/// # async fn demo(fs: nasd_fs::FsClient) -> Result<(), nasd_fs::FsError> {
/// use nasd_fs::{with_manager_wait, ManagerWait};
/// // Waits as long as it takes for the manager to come back.
/// let root = with_manager_wait(ManagerWait::Hard, None, fs.root()).await?;
/// # Ok(()) }
/// ```
pub async fn with_manager_wait<F: Future>(wait: ManagerWait, interrupted: Option<Interrupted>, fut: F) -> F::Output {
    PATIENCE.scope(Patience { wait, interrupted }, fut).await
}

impl Patience {
    /// The scope's patience, or one attempt outside any.
    pub(crate) fn current() -> Patience {
        PATIENCE.try_with(Patience::clone).unwrap_or(Patience { wait: ManagerWait::NONE, interrupted: None })
    }

    pub(crate) fn waits(&self) -> bool {
        self.wait.waits()
    }

    /// How much longer a request that started at `started` may wait: `None`
    /// without end.
    pub(crate) fn left(&self, started: Instant) -> Option<Duration> {
        match self.wait {
            ManagerWait::Hard => None,
            ManagerWait::Bounded(limit) => Some(limit.saturating_sub(started.elapsed())),
        }
    }

    /// Resolves once the caller is interrupted; never without a check.
    pub(crate) async fn interrupted(&self) {
        let Some(check) = &self.interrupted else { return std::future::pending().await };
        loop {
            if check() {
                return;
            }
            tokio::time::sleep(INTERRUPT_POLL).await;
        }
    }
}

/// Sleeps for `left`, or for ever if `None`.
pub(crate) async fn sleep_or_forever(left: Option<Duration>) {
    match left {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::{ManagerWait, MANAGER_WAIT_BOUND_MAX};
    use std::time::Duration;

    fn check(input: &str, expect: Result<ManagerWait, &str>) {
        match (input.parse::<ManagerWait>(), expect) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{input}"),
            (Err(e), Err(part)) => assert!(e.contains(part), "{input}: {e}"),
            (got, want) => panic!("{input}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn waits_parse_from_hard_or_a_duration() {
        check("hard", Ok(ManagerWait::Hard));
        check(" HARD ", Ok(ManagerWait::Hard));
        check("30s", Ok(ManagerWait::Bounded(Duration::from_secs(30))));
        check("500ms", Ok(ManagerWait::Bounded(Duration::from_millis(500))));
        check("5m", Ok(ManagerWait::Bounded(Duration::from_secs(300))));
        check("2 h", Ok(ManagerWait::Bounded(Duration::from_secs(7200))));
        check("0s", Ok(ManagerWait::NONE));
        check("30", Err("not a manager wait"));
        check("soft", Err("not a manager wait"));
        check("-1s", Err("not a manager wait"));
        check("25h", Err("use \"hard\""));
        check("99999999999999999999h", Err("not a manager wait"));
        assert_eq!(
            ManagerWait::Bounded(MANAGER_WAIT_BOUND_MAX).to_string().parse(),
            Ok(ManagerWait::Bounded(MANAGER_WAIT_BOUND_MAX))
        );
        assert_eq!(ManagerWait::Hard.to_string(), "hard");
        assert_eq!(ManagerWait::Bounded(Duration::from_millis(1500)).to_string(), "1500ms");
    }
}
