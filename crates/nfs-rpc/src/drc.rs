//! The duplicate-request cache (RFC 1813 §4.1's "duplicate request
//! cache"; Juszczak, "Improving the Performance and Correctness of an NFS
//! Server", 1989): a client that resends a call it got no reply to — the
//! connection broke, the reply was late — gets the first run's reply
//! instead of a second run. Only the procedures whose second run would
//! answer differently are kept ([`NON_IDEMPOTENT_PROCS`]: a resent REMOVE
//! would find the name gone and answer `NFS3ERR_NOENT` for a removal that
//! happened).
//!
//! A call is known by its client's address and xid, and recognised as the
//! same call by a keyed digest of its program, version, procedure,
//! credentials and arguments (a client reusing an xid for another call
//! runs it). A resend arriving while the first run is still going waits
//! for its reply. Entries are kept in arrival order, at most
//! [`DRC_ENTRIES_MAX`], each reply at most [`DRC_REPLY_BYTES_MAX`]; the
//! cache lives in memory (a restarted server runs a resent call again, as
//! Linux's does).

use crate::fs::Auth;
use crate::nfs::nfsstat3;
use crate::rpc::call_body;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Calls remembered (the oldest forgotten first). A client resends after a
/// timeout of seconds; 4096 calls cover that at thousands of changes a
/// second, for at most [`DRC_ENTRIES_MAX`] × [`DRC_REPLY_BYTES_MAX`] (4 MiB).
pub const DRC_ENTRIES_MAX: usize = 4096;
/// Longest reply kept: these procedures answer handles, attributes and
/// weak cache data (under 400 bytes); a longer reply is sent, not kept.
pub const DRC_REPLY_BYTES_MAX: usize = 1024;
/// NFSv3 procedures kept: SETATTR, CREATE, MKDIR, SYMLINK, MKNOD, REMOVE,
/// RMDIR, RENAME, LINK.
pub const NON_IDEMPOTENT_PROCS: [u32; 9] = [2, 8, 9, 10, 11, 12, 13, 14, 15];

/// Offset of the NFS status in an accepted, successful reply with an
/// `AUTH_NONE` verifier: xid, REPLY, MSG_ACCEPTED, verifier (flavour,
/// empty body), SUCCESS.
const STATUS_OFFSET: usize = 24;

type Key = (IpAddr, u32);
type Reply = watch::Receiver<Option<Arc<[u8]>>>;

struct Entry {
    digest: u64,
    generation: u64,
    reply: Reply,
}

#[derive(Default)]
struct State {
    entries: HashMap<Key, Entry>,
    /// Keys in arrival order, with the generation they were given (an
    /// entry replaced since leaves a stale pair, skipped when popped).
    order: VecDeque<(Key, u64)>,
    next_generation: u64,
}

/// The cache, shared by all connections.
pub(crate) struct Cache {
    state: Mutex<State>,
    keys: RandomState,
}

/// What the cache knows of a call.
pub(crate) enum Seen<'a> {
    /// Not seen: run it and hand its reply to [`Ticket::done`].
    New(Ticket<'a>),
    /// Seen: the first run's reply, when it has one.
    Again(Reply),
}

/// The right to answer a new call; dropped without [`Ticket::done`] (the
/// call gave no reply), the call is forgotten.
pub(crate) struct Ticket<'a> {
    cache: &'a Cache,
    key: Key,
    generation: u64,
    reply: watch::Sender<Option<Arc<[u8]>>>,
    done: bool,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cache {
    pub(crate) fn new() -> Cache {
        Cache { state: Mutex::new(State::default()), keys: RandomState::new() }
    }

    /// Whether calls of this program, version and procedure are kept.
    pub(crate) fn keeps(call: &call_body) -> bool {
        call.prog == crate::nfs::PROGRAM
            && call.vers == crate::nfs::VERSION
            && NON_IDEMPOTENT_PROCS.contains(&call.proc)
    }

    /// What tells two calls with one xid apart (keyed: a client cannot
    /// aim a collision at another's call).
    pub(crate) fn digest(&self, call: &call_body, auth: &Auth, args: &[u8]) -> u64 {
        self.keys.hash_one((call.prog, call.vers, call.proc, auth, args))
    }

    /// Looks the call `xid` from `client` up, taking it as new if unseen
    /// (or if that xid was another call).
    pub(crate) fn begin(&self, client: IpAddr, xid: u32, digest: u64) -> Seen<'_> {
        let key = (client, xid);
        let mut s = lock(&self.state);
        if let Some(e) = s.entries.get(&key).filter(|e| e.digest == digest) {
            return Seen::Again(e.reply.clone());
        }
        let (tx, rx) = watch::channel(None);
        let generation = s.next_generation;
        s.next_generation += 1;
        s.entries.insert(key, Entry { digest, generation, reply: rx });
        s.order.push_back((key, generation));
        while s.order.len() > DRC_ENTRIES_MAX {
            let Some((old, g)) = s.order.pop_front() else { break };
            if s.entries.get(&old).is_some_and(|e| e.generation == g) {
                s.entries.remove(&old);
            }
        }
        assert!(s.entries.len() <= DRC_ENTRIES_MAX, "the cache outgrew DRC_ENTRIES_MAX");
        Seen::New(Ticket { cache: self, key, generation, reply: tx, done: false })
    }

    fn forget(&self, key: Key, generation: u64) {
        let mut s = lock(&self.state);
        if s.entries.get(&key).is_some_and(|e| e.generation == generation) {
            s.entries.remove(&key);
        }
    }
}

impl Ticket<'_> {
    /// The call's reply: handed to resends waiting for it, and kept unless
    /// it is too long or asks the client to retry later (`NFS3ERR_JUKEBOX`:
    /// a resend should run again).
    pub(crate) fn done(mut self, reply: &[u8]) {
        self.done = true;
        self.reply.send_replace(Some(Arc::from(reply)));
        if reply.len() > DRC_REPLY_BYTES_MAX || retry_later(reply) {
            self.cache.forget(self.key, self.generation);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.cache.forget(self.key, self.generation);
        }
    }
}

/// The reply a resend gets: the first run's, once it has one; `None` if
/// the first run ended without a reply.
pub(crate) async fn replay(mut reply: Reply) -> Option<Vec<u8>> {
    let r = reply.wait_for(Option::is_some).await.ok()?;
    r.as_deref().map(<[u8]>::to_vec)
}

fn retry_later(reply: &[u8]) -> bool {
    reply.get(STATUS_OFFSET..STATUS_OFFSET + 4) == Some(&(nfsstat3::NFS3ERR_JUKEBOX as u32).to_be_bytes()[..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn ok_reply(status: u32) -> Vec<u8> {
        let mut r = vec![0u8; STATUS_OFFSET];
        r.extend_from_slice(&status.to_be_bytes());
        r
    }

    #[tokio::test]
    async fn a_resend_gets_the_first_reply_and_another_call_with_the_xid_runs() {
        let cache = Cache::new();
        let Seen::New(t) = cache.begin(CLIENT, 7, 1) else { panic!("a first call is new") };
        // A resend while the first run goes on waits for its reply.
        let Seen::Again(waiting) = cache.begin(CLIENT, 7, 1) else { panic!("a resend is seen") };
        t.done(&ok_reply(0));
        assert_eq!(replay(waiting).await, Some(ok_reply(0)));
        let Seen::Again(later) = cache.begin(CLIENT, 7, 1) else { panic!("a later resend is seen") };
        assert_eq!(replay(later).await, Some(ok_reply(0)));
        // The same xid with other arguments, or from another client: new calls.
        assert!(matches!(cache.begin(CLIENT, 7, 2), Seen::New(_)));
        assert!(matches!(cache.begin(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 7, 1), Seen::New(_)));
    }

    #[tokio::test]
    async fn retry_later_and_unanswered_calls_are_not_kept_and_the_cache_is_bounded() {
        let cache = Cache::new();
        let Seen::New(t) = cache.begin(CLIENT, 1, 1) else { panic!() };
        t.done(&ok_reply(nfsstat3::NFS3ERR_JUKEBOX as u32));
        assert!(matches!(cache.begin(CLIENT, 1, 1), Seen::New(_)), "a JUKEBOX answer runs again");
        let Seen::New(t) = cache.begin(CLIENT, 2, 1) else { panic!() };
        let Seen::Again(waiting) = cache.begin(CLIENT, 2, 1) else { panic!() };
        drop(t);
        assert_eq!(replay(waiting).await, None, "no reply to hand on");
        assert!(matches!(cache.begin(CLIENT, 2, 1), Seen::New(_)), "an unanswered call is forgotten");
        let Seen::New(t) = cache.begin(CLIENT, 3, 1) else { panic!() };
        t.done(&vec![0u8; DRC_REPLY_BYTES_MAX + 1]);
        assert!(matches!(cache.begin(CLIENT, 3, 1), Seen::New(_)), "a long reply is not kept");

        for xid in 0..(DRC_ENTRIES_MAX as u32 * 2) {
            if let Seen::New(t) = cache.begin(CLIENT, 1000 + xid, 9) {
                t.done(&ok_reply(0));
            }
        }
        assert_eq!(lock(&cache.state).entries.len(), DRC_ENTRIES_MAX);
        assert!(matches!(cache.begin(CLIENT, 1000, 9), Seen::New(_)), "the oldest is forgotten");
        let newest = 1000 + DRC_ENTRIES_MAX as u32 * 2 - 1;
        assert!(matches!(cache.begin(CLIENT, newest, 9), Seen::Again(_)), "the newest is kept");
    }
}
