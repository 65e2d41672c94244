//! A client's side of a write, spelled out with raw manager requests and the
//! striping engine (for tests of what the manager does with it).

#![allow(dead_code)]

use super::to;
use nasd_fs::{FsClient, FsError, OpenMode};
use nasd_proto::layout::ComponentState;
use nasd_proto::manager::{FileAccess, Handle, ManagerReply, ManagerRequest};
use nasd_proto::Protection;
use nasd_stripe::{DrivePool, StaticBinder, Striper, Target};
use std::sync::Arc;

/// Creates `/name` (exclusive); its handle and access.
pub async fn create(fs: &FsClient, name: &str) -> (Handle, FileAccess) {
    let parent = to(fs.walk("/", OpenMode::None)).await.expect("walk /").handle();
    let req = ManagerRequest::Create { parent, name: name.into(), mode: 0o644, exclusive: true, truncate: false };
    match to(fs.call(&req)).await.expect("create") {
        ManagerReply::Entry(e) => (e.handle(), e.access.expect("capabilities for a new file")),
        other => panic!("create: {other:?}"),
    }
}

/// `BEGIN_WRITE`: the transaction id.
pub async fn begin(fs: &FsClient, handle: Handle) -> Result<u64, FsError> {
    match to(fs.call(&ManagerRequest::BeginWrite { handle })).await? {
        ManagerReply::Began { txn, .. } => Ok(txn),
        other => panic!("begin: {other:?}"),
    }
}

/// `COMMIT` of `txn` having written `[0, end)` with `missed` components: the recorded size.
pub async fn commit(fs: &FsClient, handle: Handle, txn: u64, end: u64, missed: Vec<u8>) -> Result<u64, FsError> {
    let req = ManagerRequest::Commit { handle, txn, written_end: end, missed, dirty: vec![(0, end.max(1))] };
    match to(fs.call(&req)).await? {
        ManagerReply::Entry(e) => Ok(e.attr.size),
        other => panic!("commit: {other:?}"),
    }
}

/// A striper over `access` with the components in `unreadable` taken as stale.
pub fn striper(pool: &Arc<DrivePool>, access: &FileAccess, unreadable: &[usize]) -> Striper {
    let min = Protection::from_bits(access.min_protection).expect("known protection bits");
    let mut target = Target::from_access(access, min.union(Protection::INTEGRITY_ARGS)).expect("target");
    for &i in unreadable {
        target.components[i].state = ComponentState::Stale;
    }
    Striper::new(pool.clone(), Arc::new(StaticBinder::new(target).expect("binder")))
}

/// A striper over `access` that neither reads nor writes the components in
/// `missing` (as if their drives were down): a write through it misses them.
pub fn striper_without(pool: &Arc<DrivePool>, access: &FileAccess, missing: &[usize]) -> Striper {
    let min = Protection::from_bits(access.min_protection).expect("known protection bits");
    let mut target = Target::from_access(access, min.union(Protection::INTEGRITY_ARGS)).expect("target");
    for &i in missing {
        target.components[i].state = ComponentState::Down;
    }
    Striper::new(pool.clone(), Arc::new(StaticBinder::new(target).expect("binder")))
}

/// `COMMIT` of `txn` having written the file ranges `dirty` (offset,
/// length), up to `end`, with `missed` components: the recorded size.
pub async fn commit_ranges(
    fs: &FsClient,
    handle: Handle,
    txn: u64,
    end: u64,
    missed: Vec<u8>,
    dirty: Vec<(u64, u64)>,
) -> Result<u64, FsError> {
    let req = ManagerRequest::Commit { handle, txn, written_end: end, missed, dirty };
    match to(fs.call(&req)).await? {
        ManagerReply::Entry(e) => Ok(e.attr.size),
        other => panic!("commit: {other:?}"),
    }
}

/// Writes `data` as the whole content of a new file `/name` in one
/// transaction; its handle and access.
pub async fn write_new(fs: &FsClient, pool: &Arc<DrivePool>, name: &str, data: &[u8]) -> (Handle, FileAccess) {
    let (h, access) = create(fs, name).await;
    write(fs, pool, h, &access, data).await;
    (h, access)
}

/// Writes `data` from offset 0 of an empty file in one transaction, as a
/// client would (components that miss the write reported at commit); the
/// components missed.
pub async fn write(fs: &FsClient, pool: &Arc<DrivePool>, h: Handle, access: &FileAccess, data: &[u8]) -> Vec<u8> {
    let txn = begin(fs, h).await.expect("begin");
    let s = striper(pool, access, &[]);
    let w = to(s.write(0, data, 0)).await.expect("write");
    let f = to(s.flush(&w.written)).await.expect("flush");
    let missed: Vec<u8> = w.missed.union(&f.missed).map(|&m| m as u8).collect();
    commit(fs, h, txn, data.len() as u64, missed.clone()).await.expect("commit");
    missed
}

/// The whole file at `path` as a fresh lookup binds it.
pub async fn read_all(fs: &FsClient, pool: &Arc<DrivePool>, path: &str) -> Vec<u8> {
    let e = to(fs.walk(path, OpenMode::Read)).await.expect("walk");
    let access = e.access.expect("read access");
    let s = striper(pool, &access, &[]);
    to(s.read(0, e.attr.size, e.attr.size)).await.expect("read").0
}
