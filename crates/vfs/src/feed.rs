//! The manager's change feed (`WATCH`, AFS's callbacks turned into one long
//! poll per gateway): what other clients changed is dropped from this
//! layer's caches and, through the gateway's [`Invalidator`], from the
//! gateway's (FUSE: the kernel's attributes, pages and names). Changes this
//! gateway made itself are skipped: its client took them from the replies.

use crate::{lock, Shared, Vfs};
use nasd_fs::{Change, Ino};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::{Duration, Instant};

/// Longest one wait on the change feed lasts; then the layer asks again.
const FEED_WAIT: Duration = Duration::from_secs(25);
/// How long the layer waits before it asks a feed that failed again.
const FEED_RETRY: Duration = Duration::from_secs(1);
/// How long the layer waits after a batch of changes before it asks for the
/// next: changes made meanwhile come in one reply, so a burst of changes
/// (this gateway's own, which the feed reports too) costs the manager one
/// `WATCH` per pause rather than one per change. Another client's change
/// reaches the gateway's caches this much later at most.
const FEED_COALESCE: Duration = Duration::from_millis(10);
/// How long the layer waits for the change feed to report a change it made
/// itself (and skips it) before it forgets it: one not reported by then
/// (the feed lost it, or was down) only costs an invalidation.
const OWN_CHANGE_WAIT: Duration = Duration::from_secs(10);
/// Most own changes awaited at once; past it the oldest are forgotten
/// (each then costs one invalidation, never a stale cache).
const OWN_CHANGES_MAX: usize = 65_536;

/// A gateway's own caches, which the change feed keeps true. Called from a
/// blocking thread (FUSE's notifications may wait for requests in flight on
/// the inode), never from a request.
pub trait Invalidator: Send + Sync {
    /// Drop what is cached about `ino`: attributes and data.
    fn inval_inode(&self, ino: Ino);
    /// Drop the cached attributes of `ino` only (its data stays). Called
    /// from within a request as well.
    fn inval_attr(&self, ino: Ino) {
        self.inval_inode(ino);
    }
    /// Drop what is cached about `name` in directory `dir`, present or absent.
    fn inval_entry(&self, dir: Ino, name: &str);
}

/// Follows the change feed for as long as the layer lives. A feed that
/// cannot be reached is tried again every [`FEED_RETRY`]; while it is
/// down, and for names it lost, the attribute timeout is the bound.
pub(crate) async fn follow(shared: Weak<Shared>, mut watcher: nasd_fs::Watcher, mut started: bool) {
    loop {
        let batch = watcher.wait(FEED_WAIT).await;
        let Some(shared) = shared.upgrade() else { return };
        let vfs = Vfs { shared };
        match batch {
            Ok(batch) => {
                if batch.lost && started {
                    tracing::info!("the manager's change feed lost changes: dropping every cached inode");
                    vfs.invalidate_all().await;
                }
                started = true;
                let changed = !batch.changes.is_empty();
                vfs.invalidate(batch.changes).await;
                if !vfs.shared.fed.load(Ordering::SeqCst) {
                    // Back after a gap (or the first answer): nothing known absent
                    // before it, or learnt by a request sent during it, is kept.
                    lock(&vfs.shared.negatives).clear();
                }
                vfs.shared.fed.store(true, Ordering::SeqCst);
                if changed {
                    drop(vfs);
                    tokio::time::sleep(FEED_COALESCE).await;
                }
            }
            Err(e) => {
                // Until it answers again, nothing vouches for cached attributes.
                vfs.shared.fed.store(false, Ordering::SeqCst);
                lock(&vfs.shared.negatives).clear();
                tracing::debug!(error = %e, "the change feed failed; trying again");
                drop(vfs);
                tokio::time::sleep(FEED_RETRY).await;
            }
        }
    }
}

impl Vfs {
    /// Notes changes this gateway is about to make (as the manager will
    /// record them), so the feed's report of them is skipped.
    fn expect(&self, changes: &[Change]) {
        let now = Instant::now();
        let mut own = lock(&self.shared.own);
        own.retain(|_, (_, at)| now.duration_since(*at) < OWN_CHANGE_WAIT);
        if own.len() + changes.len() > OWN_CHANGES_MAX {
            own.clear();
        }
        for c in changes {
            let e = own.entry(c.clone()).or_insert((0, now));
            *e = (e.0 + 1, now);
        }
    }

    /// Forgets expected changes of a request that failed (it changed nothing).
    fn unexpect(&self, changes: &[Change]) {
        let mut own = lock(&self.shared.own);
        for c in changes {
            if let Some(e) = own.get_mut(c) {
                e.0 = e.0.saturating_sub(1);
                if e.0 == 0 {
                    own.remove(c);
                }
            }
        }
    }

    /// Runs a manager request that makes `changes` if it succeeds, expecting them.
    pub(crate) async fn making<T, E>(
        &self,
        changes: Vec<Change>,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        {
            // Before it is sent: a name it may make is not known absent from now on.
            let mut negatives = lock(&self.shared.negatives);
            for c in &changes {
                if let Change::Entry { dir, name } = c {
                    negatives.may_exist(*dir, name);
                }
            }
        }
        let fed = self.shared.config.follow_feed;
        if fed {
            self.expect(&changes);
        }
        let r = call.await;
        {
            // Whatever the outcome, the attributes held of the inodes it may have
            // changed are too old to answer from (a reply's newer ones follow).
            let mut inodes = lock(&self.shared.inodes);
            for c in &changes {
                if let Change::Inode(ino) = c {
                    inodes.stale_attr(*ino);
                }
            }
        }
        if fed && r.is_err() {
            self.unexpect(&changes);
            // A request that failed may still have been carried out (its reply lost with a
            // manager that died): what it would have changed is dropped from the gateway's
            // caches (a negative entry for a name it made), once its own reply is out — the
            // gateway's notifications wait for requests in flight on the inode.
            let me = self.clone();
            tokio::spawn(async move { me.notify(changes).await });
        }
        r
    }

    /// Whether `c` is one of this gateway's own changes (then consumed).
    fn own_change(&self, c: &Change) -> bool {
        let mut own = lock(&self.shared.own);
        match own.get_mut(c) {
            Some(e) if OWN_CHANGE_WAIT > e.1.elapsed() => {
                e.0 -= 1;
                if e.0 == 0 {
                    own.remove(c);
                }
                self.shared.own_skipped.fetch_add(1, Ordering::Relaxed);
                true
            }
            Some(_) => {
                own.remove(c);
                false
            }
            None => false,
        }
    }

    /// Drops what `changes` made stale, here and in the gateway, for inodes
    /// and directories held (not what this gateway changed itself).
    async fn invalidate(&self, changes: Vec<Change>) {
        let changes: Vec<Change> = changes.into_iter().filter(|c| !self.own_change(c)).collect();
        {
            // Another client's change to a directory (a name in it, or its
            // attributes) drops what is known absent from it.
            let mut negatives = lock(&self.shared.negatives);
            for c in &changes {
                match c {
                    Change::Entry { dir, .. } | Change::Inode(dir) => negatives.changed(*dir),
                }
            }
        }
        let mut todo = Vec::new();
        {
            let mut inodes = lock(&self.shared.inodes);
            for c in changes {
                match c {
                    Change::Inode(ino) => {
                        if inodes.invalidate(ino) && !todo.contains(&Change::Inode(ino)) {
                            todo.push(Change::Inode(ino));
                        }
                    }
                    Change::Entry { dir, name } => {
                        if inodes.get(dir).is_some() {
                            todo.push(Change::Entry { dir, name });
                        }
                    }
                }
            }
        }
        self.notify(todo).await;
    }

    /// Drops everything cached about every inode held.
    pub(crate) async fn invalidate_all(&self) {
        lock(&self.shared.negatives).clear();
        let all: Vec<Change> = lock(&self.shared.inodes).invalidate_all().into_iter().map(Change::Inode).collect();
        self.notify(all).await;
    }

    /// Sends the gateway its invalidations, off the runtime's threads.
    async fn notify(&self, todo: Vec<Change>) {
        let Some(invalidator) = self.shared.invalidator.get().cloned() else { return };
        if todo.is_empty() {
            return;
        }
        self.shared.invalidations.fetch_add(todo.len() as u64, Ordering::Relaxed);
        let sent = tokio::task::spawn_blocking(move || send(&*invalidator, todo));
        if let Err(e) = sent.await {
            tracing::warn!(error = %e, "sending the gateway its cache invalidations failed");
        }
    }

    /// Tells the gateway directly that `ino`'s cached data is stale (an
    /// open found another client's commits).
    pub(crate) fn notify_inode_now(&self, ino: Ino) {
        if let Some(i) = self.shared.invalidator.get() {
            i.inval_attr(ino);
        }
    }
}

fn send(invalidator: &dyn Invalidator, todo: Vec<Change>) {
    for c in todo {
        match c {
            Change::Inode(ino) => invalidator.inval_inode(ino),
            Change::Entry { dir, name } => invalidator.inval_entry(dir, &name),
        }
    }
}

/// The changes the manager records for a name made or removed in `parent`.
pub(crate) fn name_changes(parent: Ino, name: &str) -> Vec<Change> {
    vec![Change::Entry { dir: parent, name: name.to_string() }, Change::Inode(parent)]
}
