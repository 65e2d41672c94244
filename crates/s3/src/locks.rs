//! Locks by name, within this gateway process: a multipart upload's parts
//! written in place take its lock shared, its completion takes it alone
//! (no part lands in the staging file once it is being published), and two
//! uploads of one part number run one after the other (last one wins, never
//! a mix). A name's entry lives while a guard or a waiter holds it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// Read-write locks by name.
#[derive(Debug, Default)]
pub(crate) struct NamedLocks {
    locks: Mutex<HashMap<String, Arc<RwLock<()>>>>,
}

enum Taken {
    Shared(#[allow(dead_code)] OwnedRwLockReadGuard<()>),
    Alone(#[allow(dead_code)] OwnedRwLockWriteGuard<()>),
}

/// A name's lock, held until dropped.
pub(crate) struct NamedGuard {
    locks: Arc<NamedLocks>,
    name: String,
    taken: Option<Taken>,
}

impl NamedLocks {
    fn entry(&self, name: &str) -> Arc<RwLock<()>> {
        let mut locks = self.locks.lock().expect("named locks");
        locks.entry(name.to_string()).or_default().clone()
    }

    /// `name`'s lock, shared with other shared holders.
    pub(crate) async fn shared(self: &Arc<Self>, name: &str) -> NamedGuard {
        let taken = Taken::Shared(self.entry(name).read_owned().await);
        NamedGuard { locks: self.clone(), name: name.to_string(), taken: Some(taken) }
    }

    /// `name`'s lock, alone.
    pub(crate) async fn alone(self: &Arc<Self>, name: &str) -> NamedGuard {
        let taken = Taken::Alone(self.entry(name).write_owned().await);
        NamedGuard { locks: self.clone(), name: name.to_string(), taken: Some(taken) }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().expect("named locks").len()
    }
}

impl Drop for NamedGuard {
    fn drop(&mut self) {
        drop(self.taken.take());
        let mut locks = self.locks.locks.lock().expect("named locks");
        // Only the table holds it: no guard, no waiter.
        if locks.get(&self.name).is_some_and(|l| Arc::strong_count(l) == 1) {
            locks.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn alone_waits_for_shared_and_entries_go_with_their_guards() {
        let locks = Arc::new(NamedLocks::default());
        let a = locks.shared("u").await;
        let b = locks.shared("u").await;
        let other = locks.alone("v").await;
        assert_eq!(locks.len(), 2);
        let taken = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waiting = tokio::spawn({
            let (locks, taken) = (locks.clone(), taken.clone());
            async move {
                let guard = locks.alone("u").await;
                taken.store(true, std::sync::atomic::Ordering::SeqCst);
                drop(guard);
            }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!taken.load(std::sync::atomic::Ordering::SeqCst), "alone must wait for the shared holders");
        drop((a, b));
        waiting.await.unwrap();
        drop(other);
        assert_eq!(locks.len(), 0, "no entry outlives its guards");
    }
}
