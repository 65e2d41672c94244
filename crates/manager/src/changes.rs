//! The change feed behind `WATCH` (AFS's callbacks turned around: instead
//! of the manager calling each client back, each client keeps one `WATCH`
//! waiting, and the manager answers it as soon as something changes).
//!
//! Every name-space request that changes an inode's attributes, data or
//! extended attributes appends [`Change::Inode`]; every name added, removed
//! or re-pointed appends [`Change::Entry`]. The feed keeps the last
//! [`CHANGE_LOG_MAX`] changes in memory, numbered from 1 within one
//! incarnation (a random number drawn when the manager starts). A watcher
//! sends the incarnation and the number it got last; if the manager
//! restarted or the log has moved past that number, the reply says `lost`
//! and the watcher must drop everything it caches. So a watcher sees every
//! change, in order, or learns it did not.

use nasd_proto::manager::{Change, WATCH_CHANGES_MAX};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

/// Changes the manager remembers for watchers that fall behind: about
/// 9 MiB at most (the longest entry change is ~280 bytes with its deque
/// slot). A watcher further behind is told it lost changes.
pub const CHANGE_LOG_MAX: usize = 32_768;

/// What a `WATCH` answers: see [`nasd_proto::manager::ManagerReply::Changes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    pub incarnation: u64,
    pub next: u64,
    pub lost: bool,
    pub changes: Vec<Change>,
}

struct Log {
    /// Number of `entries[0]`.
    first: u64,
    entries: VecDeque<Change>,
}

impl Log {
    fn next(&self) -> u64 {
        self.first + self.entries.len() as u64
    }
}

/// The feed: an in-memory log and a signal that moves with its end.
pub(crate) struct ChangeFeed {
    incarnation: u64,
    log: Mutex<Log>,
    /// The log's `next`, for waiters.
    tail: watch::Sender<u64>,
    capacity: usize,
}

impl ChangeFeed {
    pub fn new() -> ChangeFeed {
        Self::with_capacity(CHANGE_LOG_MAX)
    }

    pub fn with_capacity(capacity: usize) -> ChangeFeed {
        // Never 0: a watcher's first request (incarnation 0) is always told it lost changes.
        let incarnation = rand::random::<u64>().max(1);
        ChangeFeed {
            incarnation,
            log: Mutex::new(Log { first: 1, entries: VecDeque::new() }),
            tail: watch::Sender::new(1),
            capacity: capacity.max(1),
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends changes (in order), dropping the oldest beyond the capacity.
    pub fn record(&self, changes: impl IntoIterator<Item = Change>) {
        let next = {
            let mut log = self.log();
            for c in changes {
                if log.entries.len() == self.capacity {
                    log.entries.pop_front();
                    log.first += 1;
                }
                log.entries.push_back(c);
            }
            log.next()
        };
        self.tail.send_if_modified(|t| {
            let moved = *t != next;
            *t = next;
            moved
        });
    }

    /// The changes numbered `after` and later, at most [`WATCH_CHANGES_MAX`];
    /// none and `lost` if the watcher is of another incarnation or behind
    /// the log's start.
    fn read(&self, incarnation: u64, after: u64) -> Batch {
        let log = self.log();
        let next = log.next();
        if incarnation != self.incarnation || after < log.first || after > next {
            return Batch { incarnation: self.incarnation, next, lost: true, changes: Vec::new() };
        }
        let skip = (after - log.first) as usize;
        let changes: Vec<Change> = log.entries.iter().skip(skip).take(WATCH_CHANGES_MAX).cloned().collect();
        Batch { incarnation: self.incarnation, next: after + changes.len() as u64, lost: false, changes }
    }

    /// [`read`](Self::read), waiting up to `wait` for a change if there is
    /// none yet.
    pub async fn wait(&self, incarnation: u64, after: u64, wait: Duration) -> Batch {
        let mut tail = self.tail.subscribe();
        let batch = self.read(incarnation, after);
        if batch.lost || !batch.changes.is_empty() || wait.is_zero() {
            return batch;
        }
        let _ = tokio::time::timeout(wait, tail.wait_for(|&t| t > after)).await;
        self.read(incarnation, after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn watchers_see_every_change_in_order_or_learn_they_lost_some() {
        let feed = ChangeFeed::with_capacity(4);
        let first = feed.wait(0, 0, Duration::ZERO).await;
        assert!(first.lost, "a new watcher starts from now");
        assert_eq!(first.next, 1);
        let inc = first.incarnation;
        feed.record([Change::Inode(5), Change::Entry { dir: 1, name: "a".into() }]);
        let b = feed.wait(inc, 1, Duration::ZERO).await;
        assert_eq!((b.lost, b.next), (false, 3));
        assert_eq!(b.changes, [Change::Inode(5), Change::Entry { dir: 1, name: "a".into() }]);
        assert!(feed.wait(inc, 3, Duration::ZERO).await.changes.is_empty());
        // A waiting watcher is answered when a change comes.
        let waiter = {
            let feed = std::sync::Arc::new(feed);
            let f = feed.clone();
            let h = tokio::spawn(async move { f.wait(inc, 3, Duration::from_secs(60)).await });
            tokio::task::yield_now().await;
            feed.record([Change::Inode(9)]);
            (h.await.unwrap(), feed)
        };
        let (b, feed) = waiter;
        assert_eq!((b.changes, b.next), (vec![Change::Inode(9)], 4));
        // Past the capacity the oldest go: a watcher behind them lost changes.
        feed.record((10..14).map(Change::Inode));
        assert!(feed.wait(inc, 3, Duration::ZERO).await.lost);
        let b = feed.wait(inc, 4, Duration::ZERO).await;
        assert_eq!(b.changes, (10..14).map(Change::Inode).collect::<Vec<_>>());
        // Another incarnation, or a number from the future: lost.
        assert!(feed.wait(inc ^ 1, 8, Duration::ZERO).await.lost);
        assert!(feed.wait(inc, 99, Duration::ZERO).await.lost);
        // A wait with nothing new ends empty, not lost.
        let b = feed.wait(inc, 8, Duration::from_millis(1)).await;
        assert_eq!((b.lost, b.next, b.changes.len()), (false, 8, 0));
    }
}
