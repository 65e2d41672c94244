//! READDIR and READDIRPLUS over the layer's directory cursors: the cookie
//! verifier names a cursor (random, per listing), a cookie is the cursor's
//! offset after an entry. The cursor pages the directory by name at the
//! manager, so entries added or removed during a listing never make it
//! repeat or skip another. A verifier the gateway does not know (another
//! user's listing, a listing finished or forgotten, a gateway restarted)
//! with a cookie other than 0 is `NFS3ERR_BAD_COOKIE`: the client starts
//! the listing again.

use crate::{err, lock, Gateway, CURSORS_MAX};
use nasd_fs::{FsClient, Ino};
use nasd_vfs::{DirItem, FIRST_ENTRY};
use nfs_rpc::nfs::{cookieverf3, nfsstat3};
use nfs_rpc::{DirEntry, DirPage, NfsResult};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

struct Cursor {
    dir: Ino,
    uid: u32,
    /// The layer's cursor.
    fh: u64,
    used: Instant,
}

#[derive(Default)]
pub(crate) struct Cursors {
    map: Mutex<HashMap<u64, Cursor>>,
}

impl Cursors {
    /// The layer cursor for a listing of `dir` by `uid` that continues
    /// under `verifier` (a new one for a listing that starts, cookie 0).
    fn take(&self, gw: &Gateway, dir: Ino, uid: u32, cookie: u64, verifier: u64) -> NfsResult<(u64, u64)> {
        let mut map = lock(&self.map);
        if let Some(c) = map.get_mut(&verifier) {
            if c.dir == dir && c.uid == uid {
                c.used = Instant::now();
                return Ok((verifier, c.fh));
            }
        }
        if cookie != 0 {
            return Err(nfsstat3::NFS3ERR_BAD_COOKIE);
        }
        let fh = gw.vfs.opendir(dir).map_err(err)?;
        let mut v = u64::from_le_bytes(nasd_crypto::random_bytes::<8>());
        while v == 0 || map.contains_key(&v) {
            v = u64::from_le_bytes(nasd_crypto::random_bytes::<8>());
        }
        map.insert(v, Cursor { dir, uid, fh, used: Instant::now() });
        while map.len() > CURSORS_MAX {
            let Some((&old, _)) = map.iter().min_by_key(|(_, c)| c.used) else { break };
            if let Some(c) = map.remove(&old) {
                gw.vfs.releasedir(c.fh);
            }
        }
        Ok((v, fh))
    }

    /// The listing under `verifier` ended: its cursor goes.
    fn finish(&self, gw: &Gateway, verifier: u64) {
        if let Some(c) = lock(&self.map).remove(&verifier) {
            gw.vfs.releasedir(c.fh);
        }
    }
}

/// One page of directory `dir` after `cookie`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn page(
    gw: &Gateway,
    cx: &FsClient,
    export: u8,
    dir: Ino,
    cookie: u64,
    verifier: cookieverf3,
    max_entries: usize,
    plus: bool,
) -> NfsResult<DirPage> {
    let uid = cx.identity().uid;
    let (v, fh) = gw.cursors.take(gw, dir, uid, cookie, u64::from_be_bytes(verifier))?;
    // Cookies 1 and 2 are never handed out below FIRST_ENTRY: `.` and `..` are not listed.
    let start = cookie.max(FIRST_ENTRY);
    let mut items: Vec<(u64, DirItem)> = Vec::new();
    gw.vfs
        .readdir(cx, fh, start, |next, item| {
            items.push((next, item.clone()));
            items.len() >= max_entries
        })
        .await
        .map_err(err)?;
    let eof = items.len() < max_entries;
    let mut entries = Vec::with_capacity(items.len());
    for (next, item) in items {
        let plus = match (&item.entry, plus) {
            (Some(e), true) => {
                let attr = gw.vfs.remember_listed(e).await;
                gw.note_held(attr.ino);
                Some((gw.seal(export, attr.ino)?, crate::attr::fattr(&attr)))
            }
            _ => None,
        };
        entries.push(DirEntry { fileid: item.ino, name: item.name.into_bytes(), cookie: next, plus });
    }
    if eof {
        gw.cursors.finish(gw, v);
    }
    Ok(DirPage { verifier: v.to_be_bytes(), entries, eof })
}
