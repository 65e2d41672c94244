//! The durable block index and metadata, in SQLite.
//!
//! Layout (format version 3):
//! - `drive(key, value)`: `format_version`, `drive_id`, `block_size`,
//!   `clock_offset_ns`, `clock_skew_ns`, and the drive's settings
//!   (`setting.*`).
//! - `partitions(id, quota_bytes, id_high_water)`.
//! - `objects(partition, id, reserved_blocks, attrs)`: attrs is the wire
//!   encoding of `Attributes` (352 bytes).
//! - `blocks(partition, object, block, phys, digest)`: one row per stored block.
//! - `txns(partition, object, txn, begun_ns, old_size)`: one row per open
//!   write transaction (version 2).
//! - `undo(partition, object, block, phys, digest)`: a block's mapping before
//!   the object's open transaction first changed it; `phys` and `digest`
//!   NULL for a hole (version 2).
//! - `pals(partition, object, pal)`: an object's security attribute — the
//!   encoding of `ObjectPal` (collection, access PAL); no row for an object
//!   without one (version 3).
//! - `pal_collections(partition, collection, pal)`: a PAL collection's
//!   super PAL, the encoding of `Pal` (version 3).
//!
//! Versions: 1 had no transactions, 2 no PALs; [`migrate`] takes a store
//! from any older version to [`FORMAT_VERSION`] in one transaction when it
//! opens.
//!
//! u64 identifiers are stored bit-for-bit as SQLite's i64. The database runs in
//! WAL mode with `synchronous=FULL`, so a committed transaction survives power
//! loss; a commit is the only moment metadata becomes durable.

use crate::{BlockRef, StoreError};
use nasd_proto::codec::{Reader, Writer};
use nasd_proto::{Attributes, ObjectPal, Pal};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;

/// Version of the on-disk layout; a drive refuses a newer one.
pub const FORMAT_VERSION: i64 = 3;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS drive (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS partitions (
    id INTEGER PRIMARY KEY, quota_bytes INTEGER NOT NULL, id_high_water INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS objects (
    partition INTEGER NOT NULL, id INTEGER NOT NULL, reserved_blocks INTEGER NOT NULL,
    attrs BLOB NOT NULL, PRIMARY KEY (partition, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blocks (
    partition INTEGER NOT NULL, object INTEGER NOT NULL, block INTEGER NOT NULL,
    phys INTEGER NOT NULL, digest BLOB NOT NULL,
    PRIMARY KEY (partition, object, block)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS txns (
    partition INTEGER NOT NULL, object INTEGER NOT NULL, txn INTEGER NOT NULL,
    begun_ns INTEGER NOT NULL, old_size INTEGER NOT NULL,
    PRIMARY KEY (partition, object)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS undo (
    partition INTEGER NOT NULL, object INTEGER NOT NULL, block INTEGER NOT NULL,
    phys INTEGER, digest BLOB,
    PRIMARY KEY (partition, object, block)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pals (
    partition INTEGER NOT NULL, object INTEGER NOT NULL, pal BLOB NOT NULL,
    PRIMARY KEY (partition, object)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pal_collections (
    partition INTEGER NOT NULL, collection INTEGER NOT NULL, pal BLOB NOT NULL,
    PRIMARY KEY (partition, collection)) WITHOUT ROWID;
";

/// Takes a store of format version `from` (older than [`FORMAT_VERSION`]) to
/// the current version, one step at a time, in one transaction: a crash
/// leaves it at `from` or at the current version.
pub fn migrate(conn: &mut Connection, from: i64) -> Result<(), StoreError> {
    let tx = conn.transaction()?;
    let mut version = from;
    while version < FORMAT_VERSION {
        match version {
            // 1 → 2: the `txns` and `undo` tables, which `open` creates
            // empty; a version-1 store has no transactions.
            // 2 → 3: the `pals` and `pal_collections` tables, likewise; a
            // version-2 store has no PALs.
            1 | 2 => {}
            v => return Err(StoreError::Corrupt(format!("no migration from format version {v}"))),
        }
        version += 1;
    }
    put_drive_value(&tx, "format_version", &(FORMAT_VERSION as u64).to_le_bytes())?;
    tx.commit()?;
    Ok(())
}

/// Opens (creating if needed) the metadata database.
pub fn open(env: &nasd_env::Env, path: &Path) -> Result<Connection, StoreError> {
    let conn = env.open_sqlite(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(SCHEMA)?;
    Ok(conn)
}

/// Reads a drive-table value.
pub fn get_drive_value(conn: &Connection, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(conn.query_row("SELECT value FROM drive WHERE key = ?1", [key], |r| r.get(0)).optional()?)
}

/// Writes a drive-table value (inside the caller's transaction, if any).
pub fn put_drive_value(conn: &Connection, key: &str, value: &[u8]) -> rusqlite::Result<()> {
    conn.execute("INSERT OR REPLACE INTO drive (key, value) VALUES (?1, ?2)", params![key, value])?;
    Ok(())
}

/// A persisted partition row.
pub struct PartitionRow {
    pub id: u64,
    pub quota_bytes: u64,
    pub id_high_water: u64,
}

/// A persisted object row.
pub struct ObjectRow {
    pub partition: u64,
    pub id: u64,
    pub reserved_blocks: u64,
    pub attrs: Attributes,
}

/// Loads every partition.
pub fn load_partitions(conn: &Connection) -> Result<Vec<PartitionRow>, StoreError> {
    let mut st = conn.prepare("SELECT id, quota_bytes, id_high_water FROM partitions")?;
    let rows = st.query_map([], |r| {
        Ok(PartitionRow {
            id: r.get::<_, i64>(0)? as u64,
            quota_bytes: r.get::<_, i64>(1)? as u64,
            id_high_water: r.get::<_, i64>(2)? as u64,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Loads every object.
pub fn load_objects(conn: &Connection) -> Result<Vec<ObjectRow>, StoreError> {
    let mut st = conn.prepare("SELECT partition, id, reserved_blocks, attrs FROM objects")?;
    let mut rows = st.query([])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let blob: Vec<u8> = r.get(3)?;
        out.push(ObjectRow {
            partition: r.get::<_, i64>(0)? as u64,
            id: r.get::<_, i64>(1)? as u64,
            reserved_blocks: r.get::<_, i64>(2)? as u64,
            attrs: decode_attrs(&blob)?,
        });
    }
    Ok(out)
}

/// Calls `f(partition, object, block, ref)` for every stored block.
pub fn load_blocks(
    conn: &Connection,
    mut f: impl FnMut(u64, u64, u64, BlockRef) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut st = conn.prepare("SELECT partition, object, block, phys, digest FROM blocks")?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let digest: Vec<u8> = r.get(4)?;
        let digest: [u8; 32] =
            digest.try_into().map_err(|_| StoreError::Corrupt("block digest is not 32 bytes".into()))?;
        let phys = r.get::<_, i64>(3)? as u64;
        f(
            r.get::<_, i64>(0)? as u64,
            r.get::<_, i64>(1)? as u64,
            r.get::<_, i64>(2)? as u64,
            BlockRef { phys, digest },
        )?;
    }
    Ok(())
}

/// A persisted open transaction.
pub struct TxnRow {
    pub partition: u64,
    pub object: u64,
    pub txn: u64,
    pub begun_ns: u64,
    pub old_size: u64,
}

/// Loads every open transaction.
pub fn load_txns(conn: &Connection) -> Result<Vec<TxnRow>, StoreError> {
    let mut st = conn.prepare("SELECT partition, object, txn, begun_ns, old_size FROM txns")?;
    let rows = st.query_map([], |r| {
        Ok(TxnRow {
            partition: r.get::<_, i64>(0)? as u64,
            object: r.get::<_, i64>(1)? as u64,
            txn: r.get::<_, i64>(2)? as u64,
            begun_ns: r.get::<_, i64>(3)? as u64,
            old_size: r.get::<_, i64>(4)? as u64,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Calls `f(partition, object, block, previous mapping)` for every undo row.
pub fn load_undo(
    conn: &Connection,
    mut f: impl FnMut(u64, u64, u64, Option<BlockRef>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut st = conn.prepare("SELECT partition, object, block, phys, digest FROM undo")?;
    let mut rows = st.query([])?;
    while let Some(r) = rows.next()? {
        let phys: Option<i64> = r.get(3)?;
        let digest: Option<Vec<u8>> = r.get(4)?;
        let prev = match (phys, digest) {
            (None, None) => None,
            (Some(phys), Some(d)) => Some(BlockRef {
                phys: phys as u64,
                digest: d.try_into().map_err(|_| StoreError::Corrupt("undo digest is not 32 bytes".into()))?,
            }),
            _ => return Err(StoreError::Corrupt("undo row with a block but no digest, or the reverse".into())),
        };
        f(r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? as u64, prev)?;
    }
    Ok(())
}

/// Every object's security attribute: (partition, object, PAL).
pub fn load_pals(conn: &Connection) -> Result<Vec<(u64, u64, ObjectPal)>, StoreError> {
    let mut st = conn.prepare("SELECT partition, object, pal FROM pals")?;
    let mut rows = st.query([])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let blob: Vec<u8> = r.get(2)?;
        let pal = ObjectPal::from_bytes(&blob).map_err(|e| StoreError::Corrupt(format!("object PAL: {e}")))?;
        out.push((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64, pal));
    }
    Ok(out)
}

/// Every PAL collection's super PAL: (partition, collection, PAL).
pub fn load_collections(conn: &Connection) -> Result<Vec<(u64, u64, Pal)>, StoreError> {
    let mut st = conn.prepare("SELECT partition, collection, pal FROM pal_collections")?;
    let mut rows = st.query([])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let blob: Vec<u8> = r.get(2)?;
        let pal = Pal::from_bytes(&blob).map_err(|e| StoreError::Corrupt(format!("super PAL: {e}")))?;
        out.push((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64, pal));
    }
    Ok(out)
}

/// The attribute blob.
pub fn encode_attrs(a: &Attributes) -> Vec<u8> {
    let mut w = Writer::with_capacity(nasd_proto::ATTRIBUTES_LEN);
    a.encode(&mut w);
    w.into_vec()
}

fn decode_attrs(blob: &[u8]) -> Result<Attributes, StoreError> {
    let mut r = Reader::new(blob);
    let a = Attributes::decode(&mut r).map_err(|e| StoreError::Corrupt(format!("object attributes: {e}")))?;
    r.finish().map_err(|e| StoreError::Corrupt(format!("object attributes: {e}")))?;
    Ok(a)
}

/// Everything one commit writes, captured under the metadata lock.
#[derive(Default)]
pub struct Batch {
    pub drive_values: Vec<(&'static str, Vec<u8>)>,
    pub removed_partitions: Vec<u64>,
    pub partitions: Vec<PartitionRow>,
    pub removed_objects: Vec<(u64, u64)>,
    pub objects: Vec<ObjectRow>,
    /// (partition, object, block, Some(ref) to store or None to delete).
    pub blocks: Vec<(u64, u64, u64, Option<BlockRef>)>,
    /// Objects whose every block row is rewritten (new, cloned): delete first.
    pub replaced_objects: Vec<(u64, u64)>,
    /// Objects whose transaction began or ended: their transaction row and
    /// every undo row are deleted first.
    pub txn_reset: Vec<(u64, u64)>,
    /// Open transactions to store.
    pub txns: Vec<TxnRow>,
    /// (partition, object, block, Some(previous mapping) to store or None to delete).
    pub undo: Vec<(u64, u64, u64, Option<Option<BlockRef>>)>,
    /// (partition, object, Some(encoded ObjectPal) to store or None to delete).
    pub pals: Vec<(u64, u64, Option<Vec<u8>>)>,
    /// (partition, collection, Some(encoded Pal) to store or None to delete).
    pub collections: Vec<(u64, u64, Option<Vec<u8>>)>,
}

impl Batch {
    /// True if the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.drive_values.is_empty()
            && self.removed_partitions.is_empty()
            && self.partitions.is_empty()
            && self.removed_objects.is_empty()
            && self.objects.is_empty()
            && self.blocks.is_empty()
            && self.txn_reset.is_empty()
            && self.txns.is_empty()
            && self.undo.is_empty()
            && self.pals.is_empty()
            && self.collections.is_empty()
    }
}

/// Writes a batch in one transaction and commits it.
pub fn write_batch(conn: &mut Connection, b: &Batch) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    for (k, v) in &b.drive_values {
        put_drive_value(&tx, k, v)?;
    }
    for &p in &b.removed_partitions {
        tx.execute("DELETE FROM undo WHERE partition = ?1", [p as i64])?;
        tx.execute("DELETE FROM txns WHERE partition = ?1", [p as i64])?;
        tx.execute("DELETE FROM blocks WHERE partition = ?1", [p as i64])?;
        tx.execute("DELETE FROM objects WHERE partition = ?1", [p as i64])?;
        tx.execute("DELETE FROM pals WHERE partition = ?1", [p as i64])?;
        tx.execute("DELETE FROM pal_collections WHERE partition = ?1", [p as i64])?;
        tx.execute("DELETE FROM partitions WHERE id = ?1", [p as i64])?;
    }
    for p in &b.partitions {
        tx.execute(
            "INSERT INTO partitions (id, quota_bytes, id_high_water) VALUES (?1, ?2, ?3)
             ON CONFLICT(id) DO UPDATE SET quota_bytes = ?2, id_high_water = max(id_high_water, ?3)",
            params![p.id as i64, p.quota_bytes as i64, p.id_high_water as i64],
        )?;
    }
    {
        let mut del_blocks = tx.prepare_cached("DELETE FROM blocks WHERE partition = ?1 AND object = ?2")?;
        let mut del_obj = tx.prepare_cached("DELETE FROM objects WHERE partition = ?1 AND id = ?2")?;
        let mut del_txn = tx.prepare_cached("DELETE FROM txns WHERE partition = ?1 AND object = ?2")?;
        let mut del_undo = tx.prepare_cached("DELETE FROM undo WHERE partition = ?1 AND object = ?2")?;
        let mut del_pal = tx.prepare_cached("DELETE FROM pals WHERE partition = ?1 AND object = ?2")?;
        for &(p, o) in &b.removed_objects {
            del_blocks.execute([p as i64, o as i64])?;
            del_obj.execute([p as i64, o as i64])?;
            del_txn.execute([p as i64, o as i64])?;
            del_undo.execute([p as i64, o as i64])?;
            del_pal.execute([p as i64, o as i64])?;
        }
        for &(p, o) in &b.txn_reset {
            del_txn.execute([p as i64, o as i64])?;
            del_undo.execute([p as i64, o as i64])?;
        }
        for &(p, o) in &b.replaced_objects {
            del_blocks.execute([p as i64, o as i64])?;
        }
        let mut put_obj = tx.prepare_cached(
            "INSERT OR REPLACE INTO objects (partition, id, reserved_blocks, attrs) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for o in &b.objects {
            put_obj.execute(params![
                o.partition as i64,
                o.id as i64,
                o.reserved_blocks as i64,
                encode_attrs(&o.attrs)
            ])?;
        }
        let mut put_block = tx.prepare_cached(
            "INSERT OR REPLACE INTO blocks (partition, object, block, phys, digest) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        let mut del_block =
            tx.prepare_cached("DELETE FROM blocks WHERE partition = ?1 AND object = ?2 AND block = ?3")?;
        for (p, o, l, r) in &b.blocks {
            match r {
                Some(r) => put_block.execute(params![*p as i64, *o as i64, *l as i64, r.phys as i64, &r.digest[..]])?,
                None => del_block.execute(params![*p as i64, *o as i64, *l as i64])?,
            };
        }
        let mut put_txn = tx.prepare_cached(
            "INSERT OR REPLACE INTO txns (partition, object, txn, begun_ns, old_size) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for t in &b.txns {
            put_txn.execute(params![
                t.partition as i64,
                t.object as i64,
                t.txn as i64,
                t.begun_ns as i64,
                t.old_size as i64
            ])?;
        }
        let mut put_undo = tx.prepare_cached(
            "INSERT OR REPLACE INTO undo (partition, object, block, phys, digest) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        let mut del_undo_block =
            tx.prepare_cached("DELETE FROM undo WHERE partition = ?1 AND object = ?2 AND block = ?3")?;
        for (p, o, l, entry) in &b.undo {
            let (p, o, l) = (*p as i64, *o as i64, *l as i64);
            match entry {
                Some(Some(r)) => put_undo.execute(params![p, o, l, r.phys as i64, &r.digest[..]])?,
                Some(None) => put_undo.execute(params![p, o, l, None::<i64>, None::<Vec<u8>>])?,
                None => del_undo_block.execute(params![p, o, l])?,
            };
        }
        let mut put_pal =
            tx.prepare_cached("INSERT OR REPLACE INTO pals (partition, object, pal) VALUES (?1, ?2, ?3)")?;
        for (p, o, pal) in &b.pals {
            match pal {
                Some(pal) => put_pal.execute(params![*p as i64, *o as i64, pal])?,
                None => del_pal.execute([*p as i64, *o as i64])?,
            };
        }
        let mut put_collection = tx.prepare_cached(
            "INSERT OR REPLACE INTO pal_collections (partition, collection, pal) VALUES (?1, ?2, ?3)",
        )?;
        let mut del_collection =
            tx.prepare_cached("DELETE FROM pal_collections WHERE partition = ?1 AND collection = ?2")?;
        for (p, c, pal) in &b.collections {
            match pal {
                Some(pal) => put_collection.execute(params![*p as i64, *c as i64, pal])?,
                None => del_collection.execute([*p as i64, *c as i64])?,
            };
        }
    }
    tx.commit()
}

/// Raises a partition's persisted identifier high-water mark at once (its own
/// transaction), so identifiers handed out below it are never reused.
pub fn raise_high_water(conn: &Connection, partition: u64, high: u64) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE partitions SET id_high_water = max(id_high_water, ?2) WHERE id = ?1",
        params![partition as i64, high as i64],
    )?;
    Ok(())
}
