//! The drive's audit trail: every authorized and every refused request, in an
//! append-only, bounded log (`audit.sqlite` in the data directory).
//!
//! Recording costs a mutex and never touches the disk: records are numbered
//! and buffered in memory (at most [`AUDIT_BUFFER_MAX`]), and written in
//! batches by [`Audit::persist`] on a blocking thread — with every
//! background commit, at shutdown, before a `READ_AUDIT`, and as soon as the
//! buffer is half full ([`Audit::half_full`] wakes the drive's committer).
//! When more than [`AUDIT_RECORDS_MAX`] are stored, the oldest are dropped.
//!
//! Nothing is lost silently. Refusals of requests that proved no key —
//! anyone on the network can send them as fast as the link allows — are
//! itemized at [`UNAUTHENTICATED_AUDIT_PER_SEC`] (after a burst of
//! [`UNAUTHENTICATED_AUDIT_BURST`]); beyond that they are counted, and so are
//! records that find the buffer full, and each count is written as one
//! `NOT_ITEMIZED` record (PROTOCOL.md, `READ_AUDIT`).

use nasd_proto::{not_itemized, opcode, AuditRecord, KeyType, Region};
use rusqlite::{params, Connection};
use std::path::Path;
use std::sync::Mutex;

/// Records kept on disk; older ones are dropped first.
pub const AUDIT_RECORDS_MAX: u64 = 1_000_000;
/// Most records buffered in memory before they are written (~80 bytes
/// each: ~5 MiB). Records that arrive while it is full are counted, not
/// itemized.
pub const AUDIT_BUFFER_MAX: usize = 65_536;
/// Refusals of unauthenticated requests itemized per second once the burst
/// is spent; more are counted. Costs at most this many rows per second.
pub const UNAUTHENTICATED_AUDIT_PER_SEC: u64 = 100;
/// Refusals of unauthenticated requests itemized at once before the rate
/// applies.
pub const UNAUTHENTICATED_AUDIT_BURST: u64 = 1000;

const NS_PER_SEC: u64 = 1_000_000_000;
const _: () = assert!(UNAUTHENTICATED_AUDIT_BURST as usize <= AUDIT_BUFFER_MAX / 2);

/// The audit trail.
pub struct Audit {
    db: Mutex<Connection>,
    state: Mutex<State>,
    /// Notified when the buffer reaches half of [`AUDIT_BUFFER_MAX`].
    half_full: tokio::sync::Notify,
}

struct State {
    next_sequence: u64,
    pending: Vec<AuditRecord>,
    /// Tokens for itemizing unauthenticated refusals, in nanoseconds of
    /// allowance (one refusal costs `NS_PER_SEC / UNAUTHENTICATED_AUDIT_PER_SEC`).
    allowance_ns: u64,
    /// Drive time of the last refill of `allowance_ns`.
    refilled_ns: u64,
    unauthenticated: Uncounted,
    buffer_full: Uncounted,
}

/// Requests counted instead of itemized since the last write.
#[derive(Default, Clone, Copy)]
struct Uncounted {
    count: u64,
    first_ns: u64,
    last_ns: u64,
}

impl Uncounted {
    fn add(&mut self, time_ns: u64) {
        if self.count == 0 {
            self.first_ns = time_ns;
        }
        self.count += 1;
        self.last_ns = time_ns;
    }

    /// The `NOT_ITEMIZED` record for these requests (unnumbered).
    fn record(&self, why: u64) -> Option<AuditRecord> {
        (self.count > 0).then_some(AuditRecord {
            sequence: 0,
            time_ns: self.last_ns,
            audit_id: 0,
            key_type: KeyType::None as u8,
            opcode: opcode::NOT_ITEMIZED,
            status: 0,
            partition: why,
            object: self.count,
            region: Region { offset: self.first_ns, length: self.last_ns },
        })
    }
}

const COST_NS: u64 = NS_PER_SEC / UNAUTHENTICATED_AUDIT_PER_SEC;
const ALLOWANCE_MAX_NS: u64 = UNAUTHENTICATED_AUDIT_BURST * COST_NS;

impl State {
    /// Takes one token for an unauthenticated refusal at `now_ns`, if any.
    fn take_token(&mut self, now_ns: u64) -> bool {
        let earned = now_ns.saturating_sub(self.refilled_ns);
        self.allowance_ns = self.allowance_ns.saturating_add(earned).min(ALLOWANCE_MAX_NS);
        self.refilled_ns = self.refilled_ns.max(now_ns);
        match self.allowance_ns.checked_sub(COST_NS) {
            Some(left) => {
                self.allowance_ns = left;
                true
            }
            None => false,
        }
    }

    /// Numbers and buffers `rec`, or counts it if the buffer is full.
    /// Returns whether the buffer just reached half full.
    fn push(&mut self, mut rec: AuditRecord) -> bool {
        if self.pending.len() >= AUDIT_BUFFER_MAX {
            self.buffer_full.add(rec.time_ns);
            return false;
        }
        rec.sequence = self.next_sequence;
        self.next_sequence += 1;
        self.pending.push(rec);
        self.pending.len() == AUDIT_BUFFER_MAX / 2
    }

    /// The buffered records, followed by a numbered `NOT_ITEMIZED` record for
    /// each count; the buffer and the counts start again empty.
    fn take(&mut self) -> Vec<AuditRecord> {
        let mut out = std::mem::take(&mut self.pending);
        let counts = [
            self.unauthenticated.record(not_itemized::UNAUTHENTICATED_REFUSALS),
            self.buffer_full.record(not_itemized::BUFFER_FULL),
        ];
        for mut rec in counts.into_iter().flatten() {
            rec.sequence = self.next_sequence;
            self.next_sequence += 1;
            out.push(rec);
        }
        self.unauthenticated = Uncounted::default();
        self.buffer_full = Uncounted::default();
        out
    }
}

impl Audit {
    /// Opens (creating if needed) the trail in `dir`.
    pub fn open(dir: &Path) -> rusqlite::Result<Audit> {
        Self::open_in(&nasd_env::Env::real(), dir)
    }

    /// [`Audit::open`] on `env`'s disk.
    pub fn open_in(env: &nasd_env::Env, dir: &Path) -> rusqlite::Result<Audit> {
        let conn = env.open_sqlite(&dir.join("audit.sqlite"))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS audit (
                sequence INTEGER PRIMARY KEY, time_ns INTEGER NOT NULL, audit_id INTEGER NOT NULL,
                key_type INTEGER NOT NULL, opcode INTEGER NOT NULL, status INTEGER NOT NULL,
                partition INTEGER NOT NULL, object INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL)",
        )?;
        // SQLite syncs the directory of a new journal or WAL, never of a new
        // database file: without this a crash soon after the trail was
        // created could lose `audit.sqlite` whole, and every record in it
        // (found by nasd-sim, seed 4242).
        env.sync_dir(dir).map_err(|e| {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                Some(format!("syncing the directory of the audit trail {}: {e}", dir.display())),
            )
        })?;
        let last: i64 = conn.query_row("SELECT COALESCE(MAX(sequence), 0) FROM audit", [], |r| r.get(0))?;
        let state = State {
            next_sequence: last as u64 + 1,
            pending: Vec::new(),
            allowance_ns: ALLOWANCE_MAX_NS,
            refilled_ns: 0,
            unauthenticated: Uncounted::default(),
            buffer_full: Uncounted::default(),
        };
        Ok(Audit { db: Mutex::new(conn), state: Mutex::new(state), half_full: tokio::sync::Notify::new() })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("audit mutex poisoned")
    }

    /// Records one request, numbering it. Never waits for the disk.
    pub fn record(&self, rec: AuditRecord) {
        if self.state().push(rec) {
            self.half_full.notify_one();
        }
    }

    /// Records the refusal of a request that proved no key: itemized within
    /// the rate limit, counted beyond it.
    pub fn record_unauthenticated_refusal(&self, rec: AuditRecord) {
        let mut state = self.state();
        if !state.take_token(rec.time_ns) {
            state.unauthenticated.add(rec.time_ns);
            return;
        }
        if state.push(rec) {
            drop(state);
            self.half_full.notify_one();
        }
    }

    /// Resolves when the buffer has reached half full since the last call
    /// (the drive's committer then writes it at once).
    pub async fn half_full(&self) {
        self.half_full.notified().await
    }

    /// Writes buffered records and counts, and drops the oldest records
    /// beyond the bound. Blocks on disk I/O: call it from a blocking thread.
    pub fn persist(&self) -> rusqlite::Result<()> {
        let mut db = self.db.lock().expect("audit db mutex poisoned");
        // Taken under the database lock, so batches are written in sequence order.
        let pending = self.state().take();
        if pending.is_empty() {
            return Ok(());
        }
        let tx = db.transaction()?;
        {
            let mut st = tx.prepare_cached(
                "INSERT INTO audit (sequence, time_ns, audit_id, key_type, opcode, status, partition, object, offset, length)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?;
            for r in &pending {
                st.execute(params![
                    r.sequence as i64,
                    r.time_ns as i64,
                    r.audit_id as i64,
                    r.key_type,
                    r.opcode,
                    r.status,
                    r.partition as i64,
                    r.object as i64,
                    r.region.offset as i64,
                    r.region.length as i64
                ])?;
            }
            drop(st);
            let last = pending.last().map_or(0, |r| r.sequence);
            tx.execute("DELETE FROM audit WHERE sequence <= ?1", [last.saturating_sub(AUDIT_RECORDS_MAX) as i64])?;
        }
        tx.commit()
    }

    /// Records with sequence numbers above `after`, oldest first, at most
    /// `max`. Blocks on disk I/O: call it from a blocking thread.
    pub fn read(&self, after: u64, max: usize) -> rusqlite::Result<Vec<AuditRecord>> {
        self.persist()?;
        let db = self.db.lock().expect("audit db mutex poisoned");
        let mut st = db.prepare(
            "SELECT sequence, time_ns, audit_id, key_type, opcode, status, partition, object, offset, length
             FROM audit WHERE sequence > ?1 ORDER BY sequence LIMIT ?2",
        )?;
        let rows = st.query_map(params![after as i64, max as i64], |r| {
            Ok(AuditRecord {
                sequence: r.get::<_, i64>(0)? as u64,
                time_ns: r.get::<_, i64>(1)? as u64,
                audit_id: r.get::<_, i64>(2)? as u64,
                key_type: r.get(3)?,
                opcode: r.get(4)?,
                status: r.get(5)?,
                partition: r.get::<_, i64>(6)? as u64,
                object: r.get::<_, i64>(7)? as u64,
                region: nasd_proto::Region { offset: r.get::<_, i64>(8)? as u64, length: r.get::<_, i64>(9)? as u64 },
            })
        })?;
        rows.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(time_ns: u64) -> AuditRecord {
        AuditRecord {
            sequence: 0,
            time_ns,
            audit_id: 0,
            key_type: 0,
            opcode: opcode::GETATTR,
            status: nasd_proto::Status::BadDigest as u16,
            partition: 0,
            object: 0,
            region: Region { offset: 0, length: 0 },
        }
    }

    /// A full buffer is counted, not written from the recording thread: the
    /// trail used to write all 65 536 rows synchronously, on the async
    /// thread that recorded the last one. Here the database is held by
    /// another thread throughout: recording must not wait for it.
    #[test]
    fn recording_never_waits_for_the_disk_and_loses_nothing_silently() {
        let dir = tempfile::tempdir().unwrap();
        let audit = std::sync::Arc::new(Audit::open(dir.path()).unwrap());
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let held = audit.db.lock().unwrap();
        let recorder = {
            let audit = audit.clone();
            std::thread::spawn(move || {
                for i in 0..AUDIT_BUFFER_MAX as u64 + 10 {
                    audit.record(refusal(i));
                }
                done_tx.send(()).unwrap();
            })
        };
        done_rx.recv_timeout(std::time::Duration::from_secs(120)).expect("recording waited for the audit database");
        drop(held);
        recorder.join().unwrap();
        let records = audit.read(0, AUDIT_BUFFER_MAX + 10).unwrap();
        assert_eq!(records.len(), AUDIT_BUFFER_MAX + 1, "the buffer, then one count");
        let count = records.last().unwrap();
        assert_eq!(
            (count.opcode, count.partition, count.object),
            (opcode::NOT_ITEMIZED, not_itemized::BUFFER_FULL, 10)
        );
        assert!(records.windows(2).all(|w| w[1].sequence == w[0].sequence + 1));
    }

    #[test]
    fn unauthenticated_refusals_are_itemized_at_a_bounded_rate_and_the_rest_counted() {
        let dir = tempfile::tempdir().unwrap();
        let audit = Audit::open(dir.path()).unwrap();
        let start = 1_000 * NS_PER_SEC;
        let sent = 3 * UNAUTHENTICATED_AUDIT_BURST;
        for i in 0..sent {
            audit.record_unauthenticated_refusal(refusal(start + i));
        }
        // Five seconds later, the rate has earned five seconds' worth again.
        for i in 0..sent {
            audit.record_unauthenticated_refusal(refusal(start + 5 * NS_PER_SEC + i));
        }
        let records = audit.read(0, 10 * sent as usize).unwrap();
        let itemized = records.iter().filter(|r| r.opcode == opcode::GETATTR).count() as u64;
        let counted: u64 = records.iter().filter(|r| r.opcode == opcode::NOT_ITEMIZED).map(|r| r.object).sum();
        assert_eq!(itemized, UNAUTHENTICATED_AUDIT_BURST + 5 * UNAUTHENTICATED_AUDIT_PER_SEC);
        assert_eq!(itemized + counted, 2 * sent, "every refusal itemized or counted");
    }
}
