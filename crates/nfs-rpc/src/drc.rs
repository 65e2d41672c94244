//! The duplicate-request cache (RFC 1813 §4.1's "duplicate request
//! cache"; Juszczak, "Improving the Performance and Correctness of an NFS
//! Server", 1989): a client that resends a call it got no reply to — the
//! connection broke, the reply was late, the server restarted — gets the
//! first run's reply instead of a second run. Only the procedures whose
//! second run would answer differently are kept ([`NON_IDEMPOTENT_PROCS`]:
//! a resent REMOVE would find the name gone and answer `NFS3ERR_NOENT` for
//! a removal that happened).
//!
//! A call is known by its client's address and xid, and recognised as the
//! same call by a digest (BLAKE3, 16 bytes) of its program, version,
//! procedure, credentials and arguments (a client reusing an xid for
//! another call runs it). A resend arriving while the first run is still
//! going waits for its reply. Entries are kept in arrival order, at most
//! [`DRC_ENTRIES_MAX`] in all and [`DRC_ENTRIES_PER_CLIENT_MAX`] per client
//! address, each reply at most [`DRC_REPLY_BYTES_MAX`].
//!
//! With a state directory ([`DuplicateRequestCache::persisted`]) every
//! reply kept is also appended to a journal there before it is sent, so a
//! restarted server still answers a resend with it (a client's resent
//! REMOVE after a gateway restart lands once). The journal is two files of
//! at most [`DRC_ENTRIES_MAX`] records each (`drc.log`, rotated to
//! `drc.old.log`); records are written, not synced: they survive the
//! server's process being killed, not the host crashing. A call whose run
//! ended with the process, before its reply was written, runs again when
//! resent. Layout: `docs/PROTOCOL.md`, "Duplicate-request cache".

use crate::fs::Auth;
use crate::nfs::nfsstat3;
use crate::rpc::call_body;
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Calls remembered (the oldest forgotten first). A client resends after a
/// timeout of seconds; 4096 calls cover that at thousands of changes a
/// second, for at most [`DRC_ENTRIES_MAX`] × [`DRC_REPLY_BYTES_MAX`] (4 MiB).
pub const DRC_ENTRIES_MAX: usize = 4096;
/// Longest reply kept: these procedures answer handles, attributes and
/// weak cache data (under 400 bytes); a longer reply is sent, not kept.
pub const DRC_REPLY_BYTES_MAX: usize = 1024;
/// Calls remembered for one client address: one busy client cannot push
/// every other client's calls out of the cache.
pub const DRC_ENTRIES_PER_CLIENT_MAX: usize = DRC_ENTRIES_MAX / 4;
/// NFSv3 procedures kept: SETATTR, CREATE, MKDIR, SYMLINK, MKNOD, REMOVE,
/// RMDIR, RENAME, LINK.
pub const NON_IDEMPOTENT_PROCS: [u32; 9] = [2, 8, 9, 10, 11, 12, 13, 14, 15];
/// Records one journal file holds before it is rotated: the two files hold
/// the last [`DRC_ENTRIES_MAX`] to twice that many kept replies, at most
/// `2 * DRC_JOURNAL_RECORDS_MAX * RECORD_BYTES_MAX` (about 8.5 MiB) on disk.
pub const DRC_JOURNAL_RECORDS_MAX: usize = DRC_ENTRIES_MAX;
/// The journal file appended to, under the state directory.
pub const DRC_JOURNAL_FILE: &str = "drc.log";
/// The journal file rotated out, read before [`DRC_JOURNAL_FILE`] at start.
pub const DRC_JOURNAL_OLD_FILE: &str = "drc.old.log";
/// A journal file's first 8 bytes.
const JOURNAL_MAGIC: [u8; 8] = *b"nasddrc1";
/// A record's body before its reply: client address (16), xid (4), digest (16).
const RECORD_HEAD_BYTES: usize = 16 + 4 + DIGEST_BYTES;
/// A whole record: length (4), body, check (8).
const RECORD_BYTES_MAX: usize = 4 + RECORD_HEAD_BYTES + DRC_REPLY_BYTES_MAX + 8;
/// Bytes of a call's digest.
const DIGEST_BYTES: usize = 16;

const _: () = assert!(DRC_ENTRIES_PER_CLIENT_MAX >= 1 && DRC_ENTRIES_PER_CLIENT_MAX <= DRC_ENTRIES_MAX);
const _: () = assert!(DRC_JOURNAL_RECORDS_MAX >= DRC_ENTRIES_MAX, "a restart must find every kept reply");

/// Offset of the NFS status in an accepted, successful reply with an
/// `AUTH_NONE` verifier: xid, REPLY, MSG_ACCEPTED, verifier (flavour,
/// empty body), SUCCESS.
const STATUS_OFFSET: usize = 24;

type Key = (IpAddr, u32);
type Digest = [u8; DIGEST_BYTES];
/// A journaled reply: its call's key and digest, and the reply.
type Record = (Key, Digest, Vec<u8>);
type Reply = watch::Receiver<Option<Arc<[u8]>>>;

struct Entry {
    digest: Digest,
    generation: u64,
    reply: Reply,
}

#[derive(Default)]
struct State {
    entries: HashMap<Key, Entry>,
    /// Keys in arrival order, with the generation they were given (an
    /// entry replaced since leaves a stale pair, skipped when popped).
    order: VecDeque<(Key, u64)>,
    /// Per client address, the generations of its entries in arrival order
    /// (stale ones skipped as in `order`).
    per_client: HashMap<IpAddr, VecDeque<(u32, u64)>>,
    next_generation: u64,
}

/// The duplicate-request cache, shared by all connections of a server:
/// in memory only ([`DuplicateRequestCache::in_memory`]) or journaled under
/// a state directory so that it survives a restart
/// ([`DuplicateRequestCache::persisted`]).
pub struct DuplicateRequestCache {
    state: Mutex<State>,
    journal: Mutex<Option<Journal>>,
}

pub(crate) type Cache = DuplicateRequestCache;

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
    cache: &'a DuplicateRequestCache,
    key: Key,
    generation: u64,
    reply: watch::Sender<Option<Arc<[u8]>>>,
    done: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Removes `key`'s entry if it is still the one given `generation`.
fn remove_if_current(entries: &mut HashMap<Key, Entry>, key: Key, generation: u64) {
    if entries.get(&key).is_some_and(|e| e.generation == generation) {
        entries.remove(&key);
    }
}

impl DuplicateRequestCache {
    /// A cache kept in memory only: a restarted server runs a resent call again.
    pub fn in_memory() -> DuplicateRequestCache {
        DuplicateRequestCache { state: Mutex::new(State::default()), journal: Mutex::new(None) }
    }

    /// A cache journaled under `dir` (made, 0700, if missing): the replies
    /// its journal holds are loaded, and every reply kept from now on is
    /// written there before it is sent.
    ///
    /// # Errors
    /// The directory or its journal cannot be made, read or written. A
    /// journal that does not decode is not an error: it is read up to its
    /// first bad record and cut there.
    pub fn persisted(dir: &Path) -> std::io::Result<DuplicateRequestCache> {
        let cache = DuplicateRequestCache::in_memory();
        let (journal, records) = Journal::open(dir)?;
        {
            let mut s = lock(&cache.state);
            for (key, digest, reply) in records {
                let (tx, rx) = watch::channel(Some(Arc::from(reply)));
                drop(tx);
                cache.insert(&mut s, key, digest, rx);
            }
        }
        *lock(&cache.journal) = Some(journal);
        Ok(cache)
    }

    /// Whether calls of this program, version and procedure are kept.
    pub(crate) fn keeps(call: &call_body) -> bool {
        call.prog == crate::nfs::PROGRAM
            && call.vers == crate::nfs::VERSION
            && NON_IDEMPOTENT_PROCS.contains(&call.proc)
    }

    /// What tells two calls with one xid apart: BLAKE3 (128 bits, so no
    /// client can aim a collision at another's call) of the program,
    /// version, procedure, the admitted credential's ids (not the raw
    /// credential: its stamp may change between resends) and the arguments.
    pub(crate) fn digest(call: &call_body, auth: &Auth, args: &[u8]) -> Digest {
        let mut h = blake3::Hasher::new_derive_key("nasd v1 nfs duplicate request");
        for word in [call.prog, call.vers, call.proc] {
            h.update(&word.to_be_bytes());
        }
        match auth {
            Auth::None => {
                h.update(&[0]);
            }
            Auth::Sys { uid, gid, groups } => {
                h.update(&[1]);
                let count = u32::try_from(groups.len()).expect("AUTH_SYS groups are bounded");
                for word in [*uid, *gid, count].iter().chain(groups) {
                    h.update(&word.to_be_bytes());
                }
            }
        }
        h.update(args);
        let mut d = [0u8; DIGEST_BYTES];
        d.copy_from_slice(&h.finalize().as_bytes()[..DIGEST_BYTES]);
        d
    }

    /// Looks the call `xid` from `client` up, taking it as new if unseen
    /// (or if that xid was another call).
    pub(crate) fn begin(&self, client: IpAddr, xid: u32, digest: Digest) -> Seen<'_> {
        let key = (client, xid);
        let mut s = lock(&self.state);
        if let Some(e) = s.entries.get(&key).filter(|e| e.digest == digest) {
            return Seen::Again(e.reply.clone());
        }
        let (tx, rx) = watch::channel(None);
        let generation = self.insert(&mut s, key, digest, rx);
        Seen::New(Ticket { cache: self, key, generation, reply: tx, done: false })
    }

    /// Remembers `reply` for `key`, forgetting the oldest calls past
    /// [`DRC_ENTRIES_PER_CLIENT_MAX`] for the client and [`DRC_ENTRIES_MAX`]
    /// in all; the entry's generation.
    fn insert(&self, s: &mut State, key: Key, digest: Digest, reply: Reply) -> u64 {
        let generation = s.next_generation;
        s.next_generation += 1;
        s.entries.insert(key, Entry { digest, generation, reply });
        s.order.push_back((key, generation));
        let State { entries, order, per_client, .. } = s;
        let mine = per_client.entry(key.0).or_default();
        mine.push_back((key.1, generation));
        while mine.len() > DRC_ENTRIES_PER_CLIENT_MAX {
            let Some((xid, g)) = mine.pop_front() else { break };
            remove_if_current(entries, (key.0, xid), g);
        }
        while order.len() > DRC_ENTRIES_MAX {
            let Some((old, g)) = order.pop_front() else { break };
            remove_if_current(entries, old, g);
            // The client's pairs are in arrival order too: this one and any
            // older (stale) ones are at its front.
            if let Some(q) = per_client.get_mut(&old.0) {
                while q.front().is_some_and(|&(_, qg)| qg <= g) {
                    q.pop_front();
                }
                if q.is_empty() {
                    per_client.remove(&old.0);
                }
            }
        }
        assert!(entries.len() <= DRC_ENTRIES_MAX, "the cache outgrew DRC_ENTRIES_MAX");
        generation
    }

    /// Writes a kept reply to the journal, if there is one; a journal that
    /// fails is dropped (the cache goes on in memory, and says so).
    fn journal(&self, key: Key, digest: &Digest, reply: &[u8]) {
        let mut journal = lock(&self.journal);
        let Some(j) = journal.as_mut() else { return };
        if let Err(e) = j.append(key, digest, reply) {
            tracing::warn!(dir = %j.dir.display(), error = %e,
                "the duplicate-request journal failed: resent calls will run again after a restart");
            *journal = None;
        }
    }

    fn forget(&self, key: Key, generation: u64) {
        remove_if_current(&mut lock(&self.state).entries, key, generation);
    }
}

impl Ticket<'_> {
    /// The call's reply: handed to resends waiting for it, and kept unless
    /// it is too long or asks the client to retry later (`NFS3ERR_JUKEBOX`:
    /// a resend should run again).
    pub(crate) fn done(mut self, reply: &[u8]) {
        self.done = true;
        if reply.len() > DRC_REPLY_BYTES_MAX || retry_later(reply) {
            self.reply.send_replace(Some(Arc::from(reply)));
            self.cache.forget(self.key, self.generation);
            return;
        }
        let digest = lock(&self.cache.state).entries.get(&self.key).map(|e| e.digest);
        if let Some(digest) = digest {
            self.cache.journal(self.key, &digest, reply);
        }
        self.reply.send_replace(Some(Arc::from(reply)));
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

/// The journal: append-only records in [`DRC_JOURNAL_FILE`], rotated to
/// [`DRC_JOURNAL_OLD_FILE`] every [`DRC_JOURNAL_RECORDS_MAX`] records.
struct Journal {
    dir: PathBuf,
    file: std::fs::File,
    records: usize,
}

impl Journal {
    /// Opens the journal under `dir` and reads its records, the old file's
    /// first; the current file is cut after its last good record.
    fn open(dir: &Path) -> std::io::Result<(Journal, Vec<Record>)> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        let mut records = match std::fs::File::open(dir.join(DRC_JOURNAL_OLD_FILE)) {
            Ok(f) => read_journal(f)?.0,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let path = dir.join(DRC_JOURNAL_FILE);
        let mut file = open_append(&path)?;
        let (current, good_bytes) = read_journal(file.try_clone()?)?;
        if good_bytes == 0 {
            file.set_len(0)?;
            file.write_all(&JOURNAL_MAGIC)?;
        } else if good_bytes < file.metadata()?.len() {
            tracing::warn!(path = %path.display(), "a duplicate-request journal cut after its last whole record");
            file.set_len(good_bytes)?;
        }
        let journal = Journal { dir: dir.to_path_buf(), file, records: current.len() };
        records.extend(current);
        Ok((journal, records))
    }

    /// Appends one record (one `write`), rotating a full file first.
    fn append(&mut self, (client, xid): Key, digest: &Digest, reply: &[u8]) -> std::io::Result<()> {
        if self.records >= DRC_JOURNAL_RECORDS_MAX {
            std::fs::rename(self.dir.join(DRC_JOURNAL_FILE), self.dir.join(DRC_JOURNAL_OLD_FILE))?;
            let path = self.dir.join(DRC_JOURNAL_FILE);
            let _ = std::fs::remove_file(&path);
            self.file = open_append(&path)?;
            self.file.write_all(&JOURNAL_MAGIC)?;
            self.records = 0;
        }
        self.file.write_all(&encode_record((client, xid), digest, reply))?;
        self.records += 1;
        Ok(())
    }
}

fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).append(true).create(true).mode(0o600).open(path)
}

/// A record: body length (u32, big-endian), body (client address as 16
/// bytes of IPv6, IPv4 mapped; xid, big-endian; digest; reply), and the
/// first 8 bytes of BLAKE3 of the body.
fn encode_record((client, xid): Key, digest: &Digest, reply: &[u8]) -> Vec<u8> {
    assert!(reply.len() <= DRC_REPLY_BYTES_MAX, "only replies the cache keeps are journaled");
    let ip = match client {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let mut body = Vec::with_capacity(RECORD_HEAD_BYTES + reply.len());
    body.extend_from_slice(&ip.octets());
    body.extend_from_slice(&xid.to_be_bytes());
    body.extend_from_slice(digest);
    body.extend_from_slice(reply);
    let len = u32::try_from(body.len()).expect("records are bounded");
    let mut record = Vec::with_capacity(4 + body.len() + 8);
    record.extend_from_slice(&len.to_be_bytes());
    record.extend_from_slice(&body);
    record.extend_from_slice(&blake3::hash(&body).as_bytes()[..8]);
    record
}

/// The records of a journal file up to the first that does not decode or
/// check, and how many bytes (with the magic) they take; `(empty, 0)` for
/// an empty file or one without the magic.
fn read_journal(file: std::fs::File) -> std::io::Result<(Vec<Record>, u64)> {
    let limit = (JOURNAL_MAGIC.len() + DRC_JOURNAL_RECORDS_MAX * RECORD_BYTES_MAX) as u64;
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    let Some(mut rest) = bytes.strip_prefix(&JOURNAL_MAGIC[..]) else { return Ok((Vec::new(), 0)) };
    let mut records = Vec::new();
    let mut good = JOURNAL_MAGIC.len();
    while records.len() < DRC_JOURNAL_RECORDS_MAX {
        let Some((record, used)) = decode_record(rest) else { break };
        records.push(record);
        rest = &rest[used..];
        good += used;
    }
    Ok((records, good as u64))
}

/// One record at the start of `b` and its length, if whole and checked.
fn decode_record(b: &[u8]) -> Option<(Record, usize)> {
    let len = u32::from_be_bytes(b.get(..4)?.try_into().ok()?) as usize;
    if !(RECORD_HEAD_BYTES..=RECORD_HEAD_BYTES + DRC_REPLY_BYTES_MAX).contains(&len) {
        return None;
    }
    let body = b.get(4..4 + len)?;
    let check = b.get(4 + len..4 + len + 8)?;
    if blake3::hash(body).as_bytes()[..8] != *check {
        return None;
    }
    let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&body[..16]).ok()?);
    let client = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
    let xid = u32::from_be_bytes(body[16..20].try_into().ok()?);
    let digest: Digest = body[20..RECORD_HEAD_BYTES].try_into().ok()?;
    Some((((client, xid), digest, body[RECORD_HEAD_BYTES..].to_vec()), 4 + len + 8))
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

    fn d(n: u8) -> Digest {
        [n; DIGEST_BYTES]
    }

    fn client(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
    }

    /// Answers the call if it is new; whether it was.
    fn answer(cache: &Cache, (ip, xid): Key, digest: Digest, reply: &[u8]) -> bool {
        match cache.begin(ip, xid, digest) {
            Seen::New(t) => {
                t.done(reply);
                true
            }
            Seen::Again(_) => false,
        }
    }

    #[tokio::test]
    async fn a_resend_gets_the_first_reply_and_another_call_with_the_xid_runs() {
        let cache = Cache::in_memory();
        let Seen::New(t) = cache.begin(CLIENT, 7, d(1)) else { panic!("a first call is new") };
        // A resend while the first run goes on waits for its reply.
        let Seen::Again(waiting) = cache.begin(CLIENT, 7, d(1)) else { panic!("a resend is seen") };
        t.done(&ok_reply(0));
        assert_eq!(replay(waiting).await, Some(ok_reply(0)));
        let Seen::Again(later) = cache.begin(CLIENT, 7, d(1)) else { panic!("a later resend is seen") };
        assert_eq!(replay(later).await, Some(ok_reply(0)));
        // The same xid with other arguments, or from another client: new calls.
        assert!(matches!(cache.begin(CLIENT, 7, d(2)), Seen::New(_)));
        assert!(matches!(cache.begin(client(1), 7, d(1)), Seen::New(_)));
    }

    #[test]
    fn the_digest_tells_calls_apart_by_procedure_ids_and_arguments_but_not_by_the_credential_stamp() {
        let call = |proc| call_body { rpcvers: 2, prog: 100_003, vers: 3, proc, ..call_body::default() };
        let sys = |uid, groups: &[u32]| Auth::Sys { uid, gid: 100, groups: groups.to_vec() };
        let base = Cache::digest(&call(12), &sys(1000, &[1]), b"args");
        assert_eq!(base, Cache::digest(&call(12), &sys(1000, &[1]), b"args"), "stable across starts");
        for other in [
            Cache::digest(&call(13), &sys(1000, &[1]), b"args"),
            Cache::digest(&call(12), &sys(1001, &[1]), b"args"),
            Cache::digest(&call(12), &sys(1000, &[1, 2]), b"args"),
            Cache::digest(&call(12), &sys(1000, &[]), b"args"),
            Cache::digest(&call(12), &Auth::None, b"args"),
            Cache::digest(&call(12), &sys(1000, &[1]), b"argz"),
        ] {
            assert_ne!(base, other);
        }
    }

    #[tokio::test]
    async fn retry_later_and_unanswered_calls_are_not_kept_and_the_cache_is_bounded() {
        let cache = Cache::in_memory();
        let Seen::New(t) = cache.begin(CLIENT, 1, d(1)) else { panic!() };
        t.done(&ok_reply(nfsstat3::NFS3ERR_JUKEBOX as u32));
        assert!(matches!(cache.begin(CLIENT, 1, d(1)), Seen::New(_)), "a JUKEBOX answer runs again");
        let Seen::New(t) = cache.begin(CLIENT, 2, d(1)) else { panic!() };
        let Seen::Again(waiting) = cache.begin(CLIENT, 2, d(1)) else { panic!() };
        drop(t);
        assert_eq!(replay(waiting).await, None, "no reply to hand on");
        assert!(matches!(cache.begin(CLIENT, 2, d(1)), Seen::New(_)), "an unanswered call is forgotten");
        let Seen::New(t) = cache.begin(CLIENT, 3, d(1)) else { panic!() };
        t.done(&vec![0u8; DRC_REPLY_BYTES_MAX + 1]);
        assert!(matches!(cache.begin(CLIENT, 3, d(1)), Seen::New(_)), "a long reply is not kept");

        // One client keeps at most its share; the others' entries stay.
        assert!(answer(&cache, (client(0), 1), d(9), &ok_reply(0)));
        for xid in 0..(DRC_ENTRIES_PER_CLIENT_MAX as u32 * 3) {
            answer(&cache, (CLIENT, 1000 + xid), d(9), &ok_reply(0));
        }
        let mine = |cache: &Cache, ip| lock(&cache.state).entries.keys().filter(|k| k.0 == ip).count();
        assert_eq!(mine(&cache, CLIENT), DRC_ENTRIES_PER_CLIENT_MAX);
        assert!(!answer(&cache, (client(0), 1), d(9), &ok_reply(0)), "another client's entry was pushed out");
        // In all, at most DRC_ENTRIES_MAX, the oldest forgotten first.
        let clients = 2 * DRC_ENTRIES_MAX / DRC_ENTRIES_PER_CLIENT_MAX;
        for xid in 0..DRC_ENTRIES_PER_CLIENT_MAX as u32 {
            for c in 1..=clients as u32 {
                answer(&cache, (client(c), xid), d(9), &ok_reply(0));
            }
        }
        let s = lock(&cache.state);
        assert_eq!(s.entries.len(), DRC_ENTRIES_MAX);
        let pairs: usize = s.per_client.values().map(VecDeque::len).sum();
        assert!(pairs <= DRC_ENTRIES_MAX, "{pairs} per-client pairs kept for {} entries", s.entries.len());
        drop(s);
        assert!(answer(&cache, (client(1), 0), d(9), &ok_reply(0)), "the oldest is forgotten");
        let last = (client(clients as u32), DRC_ENTRIES_PER_CLIENT_MAX as u32 - 1);
        assert!(!answer(&cache, last, d(9), &ok_reply(0)), "the newest is kept");
    }

    /// PROTOCOL.md's vectors: a digest and a journal record.
    #[test]
    fn digest_and_record_vectors() {
        let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let call = call_body { rpcvers: 2, prog: 100_003, vers: 3, proc: 12, ..call_body::default() };
        let auth = Auth::Sys { uid: 1000, gid: 1000, groups: vec![1000] };
        let digest = Cache::digest(&call, &auth, &[0xab; 8]);
        let record = encode_record((CLIENT, 0x0102_0304), &[0x11; DIGEST_BYTES], &[0xaa; 4]);
        assert_eq!(hex(&digest), "03ffe962a95e5dc8001cc68eee9f842d");
        let want =
            "0000002800000000000000000000ffff7f0000010102030411111111111111111111111111111111aaaaaaaafef8e382a02ae3f3";
        assert_eq!(hex(&record), want);
        assert_eq!(
            decode_record(&record),
            Some((((CLIENT, 0x0102_0304), [0x11; DIGEST_BYTES], vec![0xaa; 4]), record.len()))
        );
    }

    #[tokio::test]
    async fn a_journaled_cache_answers_resends_after_a_restart_and_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("nfs");
        let cache = Cache::persisted(&state).unwrap();
        assert!(answer(&cache, (CLIENT, 1), d(1), &ok_reply(0)));
        assert!(answer(&cache, (CLIENT, 2), d(1), &ok_reply(nfsstat3::NFS3ERR_JUKEBOX as u32)));
        let v6: IpAddr = "2001:db8::7".parse().unwrap();
        assert!(answer(&cache, (v6, 1), d(3), &ok_reply(2)));
        drop(cache);

        let cache = Cache::persisted(&state).unwrap();
        let Seen::Again(r) = cache.begin(CLIENT, 1, d(1)) else { panic!("a kept reply forgotten by a restart") };
        assert_eq!(replay(r).await, Some(ok_reply(0)));
        let Seen::Again(r) = cache.begin(v6, 1, d(3)) else { panic!("an IPv6 client's reply forgotten") };
        assert_eq!(replay(r).await, Some(ok_reply(2)));
        assert!(matches!(cache.begin(CLIENT, 1, d(2)), Seen::New(_)), "another call under the xid runs");
        assert!(answer(&cache, (CLIENT, 2), d(1), &ok_reply(0)), "a JUKEBOX answer is not journaled");
        drop(cache);

        // A record cut by a crash, and bytes that are no record, are cut
        // away; what follows the cut is found at the next start.
        let log = state.join(DRC_JOURNAL_FILE);
        let whole = std::fs::metadata(&log).unwrap().len();
        let mut torn = encode_record((CLIENT, 9), &d(9), &ok_reply(0));
        torn.truncate(torn.len() - 3);
        std::fs::OpenOptions::new().append(true).open(&log).unwrap().write_all(&torn).unwrap();
        let cache = Cache::persisted(&state).unwrap();
        assert_eq!(std::fs::metadata(&log).unwrap().len(), whole, "the torn record was cut");
        assert!(!answer(&cache, (CLIENT, 1), d(1), &ok_reply(0)), "records before the cut were lost");
        assert!(answer(&cache, (CLIENT, 9), d(9), &ok_reply(0)), "a torn record was believed");
        drop(cache);
        let cache = Cache::persisted(&state).unwrap();
        assert!(!answer(&cache, (CLIENT, 9), d(9), &ok_reply(0)), "a record after the cut was lost");

        // Many replies: the files rotate, the newest DRC_ENTRIES_MAX survive.
        let total = DRC_JOURNAL_RECORDS_MAX * 5 / 2;
        for i in 0..total as u32 {
            answer(&cache, (client(i % 64), 100 + i), d(5), &ok_reply(0));
        }
        drop(cache);
        let bytes: u64 = [DRC_JOURNAL_FILE, DRC_JOURNAL_OLD_FILE]
            .iter()
            .map(|f| std::fs::metadata(state.join(f)).unwrap().len())
            .sum();
        assert!(bytes <= 2 * (8 + DRC_JOURNAL_RECORDS_MAX * RECORD_BYTES_MAX) as u64, "{bytes} journal bytes");
        let cache = Cache::persisted(&state).unwrap();
        // Newest first: a call found new is remembered and pushes the oldest out.
        let kept =
            (0..total as u32).rev().take_while(|&i| !answer(&cache, (client(i % 64), 100 + i), d(5), &[])).count();
        assert_eq!(kept, DRC_ENTRIES_MAX, "the newest replies found after the restart");
    }
}
