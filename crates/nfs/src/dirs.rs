//! READDIR and READDIRPLUS over the layer's directory cursors: the cookie
//! verifier names a cursor (random, per listing), a cookie is the cursor's
//! offset after an entry. The cursor pages the directory by name at the
//! manager, so entries added or removed during a listing never make it
//! repeat or skip another. A verifier the gateway does not know (another
//! user's listing, a listing finished or forgotten, a gateway restarted)
//! with a cookie other than 0 is `NFS3ERR_BAD_COOKIE`: the client starts
//! the listing again. Cursors are closed after [`CURSOR_IDLE`] unused, or,
//! past [`CURSORS_MAX`](crate::CURSORS_MAX), finished ones first.

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
    /// The layer said the listing ended (the client may still ask for the
    /// last page again if its reply could not hold every entry).
    done: bool,
}

/// How long a cursor no call used is kept.
pub const CURSOR_IDLE: std::time::Duration = std::time::Duration::from_secs(120);

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
        map.insert(v, Cursor { dir, uid, fh, used: Instant::now(), done: false });
        while map.len() > CURSORS_MAX {
            // Finished listings go first, then the longest unused.
            let Some((&old, _)) = map.iter().min_by_key(|(_, c)| (!c.done, c.used)) else { break };
            if let Some(c) = map.remove(&old) {
                gw.vfs.releasedir(c.fh);
            }
        }
        Ok((v, fh))
    }

    /// The listing under `verifier` reached its end.
    fn finish(&self, verifier: u64) {
        if let Some(c) = lock(&self.map).get_mut(&verifier) {
            c.done = true;
        }
    }

    /// Closes every cursor.
    pub fn close_all(&self, gw: &Gateway) {
        for (_, c) in lock(&self.map).drain() {
            gw.vfs.releasedir(c.fh);
        }
    }

    /// Closes cursors unused for [`CURSOR_IDLE`].
    pub fn close_idle(&self, gw: &Gateway) {
        let mut map = lock(&self.map);
        map.retain(|_, c| {
            let keep = c.used.elapsed() < CURSOR_IDLE;
            if !keep {
                gw.vfs.releasedir(c.fh);
            }
            keep
        });
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
        gw.cursors.finish(v);
    }
    Ok(DirPage { verifier: v.to_be_bytes(), entries, eof })
}
