//! The drive's audit trail: every authorized and every refused request, in an
//! append-only, bounded log (`audit.sqlite` in the data directory).
//!
//! Records are numbered and buffered in memory, then written in batches by
//! [`Audit::persist`] (called with every background commit and at shutdown),
//! so recording costs a mutex, not a disk write. When more than
//! [`AUDIT_RECORDS_MAX`] are stored, the oldest are dropped.

use nasd_proto::AuditRecord;
use rusqlite::{params, Connection};
use std::path::Path;
use std::sync::Mutex;

/// Records kept on disk; older ones are dropped first.
pub const AUDIT_RECORDS_MAX: u64 = 1_000_000;
/// Records buffered in memory before a write is forced.
pub const AUDIT_BUFFER_MAX: usize = 65_536;

/// The audit trail.
pub struct Audit {
    db: Mutex<Connection>,
    state: Mutex<State>,
}

struct State {
    next_sequence: u64,
    pending: Vec<AuditRecord>,
}

impl Audit {
    /// Opens (creating if needed) the trail in `dir`.
    pub fn open(dir: &Path) -> rusqlite::Result<Audit> {
        let conn = Connection::open(dir.join("audit.sqlite"))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS audit (
                sequence INTEGER PRIMARY KEY, time_ns INTEGER NOT NULL, audit_id INTEGER NOT NULL,
                key_type INTEGER NOT NULL, opcode INTEGER NOT NULL, status INTEGER NOT NULL,
                partition INTEGER NOT NULL, object INTEGER NOT NULL, offset INTEGER NOT NULL, length INTEGER NOT NULL)",
        )?;
        let last: i64 = conn.query_row("SELECT COALESCE(MAX(sequence), 0) FROM audit", [], |r| r.get(0))?;
        Ok(Audit {
            db: Mutex::new(conn),
            state: Mutex::new(State { next_sequence: last as u64 + 1, pending: Vec::new() }),
        })
    }

    /// Records one request, numbering it.
    pub fn record(&self, mut rec: AuditRecord) {
        let full = {
            let mut st = self.state.lock().expect("audit mutex poisoned");
            rec.sequence = st.next_sequence;
            st.next_sequence += 1;
            st.pending.push(rec);
            st.pending.len() >= AUDIT_BUFFER_MAX
        };
        if full {
            if let Err(e) = self.persist() {
                tracing::error!(error = %e, "audit trail write failed");
            }
        }
    }

    /// Writes buffered records and drops the oldest beyond the bound.
    pub fn persist(&self) -> rusqlite::Result<()> {
        let pending = std::mem::take(&mut self.state.lock().expect("audit mutex poisoned").pending);
        if pending.is_empty() {
            return Ok(());
        }
        let mut db = self.db.lock().expect("audit db mutex poisoned");
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

    /// Records with sequence numbers above `after`, oldest first, at most `max`.
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
