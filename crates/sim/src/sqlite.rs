//! A SQLite VFS over the simulated disks, so the store's `meta.sqlite` and
//! the drive's `audit.sqlite` (and their WALs) live on the simulated disk
//! and a crash treats them as it treats any file: what SQLite synced
//! survives, the rest is kept, torn or lost.
//!
//! A path is `/nasd-sim/DISK/PATH` ([`vfs_path`]): the disk's id, then the
//! path on it. Locks: one process, and connections used one at a time by
//! the simulation, so file locks always succeed; the WAL's shared-memory
//! locks are kept per connection (a reader and a checkpointer of one
//! database still exclude each other). Shared memory lives beside the disk
//! and goes with a crash, as a real `-shm` is rebuilt from the WAL. The
//! device is reported power-safe-overwrite (as SQLite's unix VFS does by
//! default), which the simulated disk honours: a torn write damages only
//! sectors it wrote. SQLite's own random numbers (WAL salts) come from the
//! default VFS, never change what the code does, and are not simulated.
#![allow(unsafe_code)]

use crate::disk::{disk_by_id, Handle};
use nasd_env::disk::SimFile;
use rusqlite::ffi;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The VFS's registered name.
pub const VFS_NAME: &str = "nasd-sim";
const VFS_NAME_C: &CStr = c"nasd-sim";
const PREFIX: &str = "/nasd-sim/";
const MAX_PATHNAME: c_int = 1024;

/// The name SQLite is given for `path` on disk `disk`.
pub fn vfs_path(disk: u64, path: &Path) -> PathBuf {
    PathBuf::from(format!("{PREFIX}{disk}{}", path.display()))
}

fn parse(name: &str) -> Option<(u64, PathBuf)> {
    let rest = name.strip_prefix(PREFIX)?;
    let slash = rest.find('/')?;
    Some((rest[..slash].parse().ok()?, PathBuf::from(&rest[slash..])))
}

/// Registers the VFS once per process (not as the default).
pub fn register() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let vfs = Box::leak(Box::new(ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: std::mem::size_of::<VfsFile>() as c_int,
            mxPathname: MAX_PATHNAME,
            pNext: std::ptr::null_mut(),
            zName: VFS_NAME_C.as_ptr(),
            pAppData: std::ptr::null_mut(),
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: None,
            xDlError: None,
            xDlSym: None,
            xDlClose: None,
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        }));
        // SAFETY: `vfs` is leaked, so it outlives every use SQLite makes of it.
        let rc = unsafe { ffi::sqlite3_vfs_register(vfs, 0) };
        assert_eq!(rc, ffi::SQLITE_OK, "registering the simulated VFS");
    });
}

/// What SQLite allocates for an open file (`szOsFile`): the base struct
/// SQLite reads `pMethods` from, then ours.
#[repr(C)]
struct VfsFile {
    base: ffi::sqlite3_file,
    open: *mut Open,
}

/// An open file: on a simulated disk, or an anonymous temporary one.
struct Open {
    file: OpenKind,
    delete_on_close: bool,
    /// This connection's id for shared-memory locks.
    conn: u64,
    /// Shared-memory locks this connection holds.
    shared: u8,
    exclusive: u8,
}

enum OpenKind {
    Disk(Handle),
    Temp(Mutex<Vec<u8>>),
}

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

unsafe fn open_of<'a>(f: *mut ffi::sqlite3_file) -> &'a mut Open {
    // SAFETY: every file with our methods was set up by x_open with a live `open`.
    unsafe { &mut *(*(f as *mut VfsFile)).open }
}

fn io_code(e: &std::io::Error, otherwise: c_int) -> c_int {
    match e.kind() {
        std::io::ErrorKind::StorageFull => ffi::SQLITE_FULL,
        std::io::ErrorKind::NotFound => ffi::SQLITE_CANTOPEN,
        _ => otherwise,
    }
}

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let f = file as *mut VfsFile;
    // SAFETY: SQLite gives `szOsFile` bytes at `file`; clear our methods so a failed open is not closed.
    unsafe { (*f).base.pMethods = std::ptr::null() };
    let kind = if name.is_null() {
        OpenKind::Temp(Mutex::new(Vec::new()))
    } else {
        // SAFETY: a non-null name is a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        let Some((disk, path)) = parse(&name) else { return ffi::SQLITE_CANTOPEN };
        let Some(disk) = disk_by_id(disk) else { return ffi::SQLITE_CANTOPEN };
        let create = flags & ffi::SQLITE_OPEN_CREATE != 0;
        let journal =
            flags & (ffi::SQLITE_OPEN_WAL | ffi::SQLITE_OPEN_MAIN_JOURNAL | ffi::SQLITE_OPEN_SUPER_JOURNAL) != 0;
        match disk.open_handle(&path, create, journal) {
            Ok(h) => OpenKind::Disk(h),
            Err(e) => return io_code(&e, ffi::SQLITE_CANTOPEN),
        }
    };
    let open = Box::new(Open {
        file: kind,
        delete_on_close: flags & ffi::SQLITE_OPEN_DELETEONCLOSE != 0,
        conn: NEXT_CONN.fetch_add(1, Ordering::Relaxed),
        shared: 0,
        exclusive: 0,
    });
    // SAFETY: as above.
    unsafe {
        (*f).open = Box::into_raw(open);
        (*f).base.pMethods = &IO_METHODS;
        if !out_flags.is_null() {
            *out_flags = flags;
        }
    }
    ffi::SQLITE_OK
}

fn named(name: *const c_char) -> Option<(Arc<crate::disk::Disk>, PathBuf)> {
    if name.is_null() {
        return None;
    }
    // SAFETY: a non-null name is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
    let (disk, path) = parse(&name)?;
    Some((disk_by_id(disk)?, path))
}

unsafe extern "C" fn x_delete(_vfs: *mut ffi::sqlite3_vfs, name: *const c_char, sync_dir: c_int) -> c_int {
    if let Some((disk, path)) = named(name) {
        disk.remove(&path, sync_dir != 0);
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_access(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    _flags: c_int,
    out: *mut c_int,
) -> c_int {
    let exists = named(name).is_some_and(|(disk, path)| disk.exists(&path));
    // SAFETY: SQLite passes a valid out pointer.
    unsafe { *out = exists as c_int };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_full_pathname(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n_out: c_int,
    out: *mut c_char,
) -> c_int {
    // SAFETY: `name` is NUL-terminated and `out` holds `n_out` bytes.
    unsafe {
        let bytes = CStr::from_ptr(name).to_bytes_with_nul();
        if bytes.len() > n_out as usize {
            return ffi::SQLITE_CANTOPEN;
        }
        std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, out, bytes.len());
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_randomness(_vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
    // Deterministic: SQLite seeds its generator from the default VFS anyway.
    // SAFETY: `out` holds `n` bytes.
    unsafe { std::ptr::write_bytes(out, 0x5a, n.max(0) as usize) };
    n
}

unsafe extern "C" fn x_sleep(_vfs: *mut ffi::sqlite3_vfs, us: c_int) -> c_int {
    us
}

/// 2030-01-01 as a Julian day: SQLite's own clock is never what nasd's code reads.
const JULIAN_2030: f64 = 2_462_502.5;

unsafe extern "C" fn x_current_time(_vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    // SAFETY: valid out pointer.
    unsafe { *out = JULIAN_2030 };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_current_time_int64(_vfs: *mut ffi::sqlite3_vfs, out: *mut ffi::sqlite3_int64) -> c_int {
    // SAFETY: valid out pointer.
    unsafe { *out = (JULIAN_2030 * 86_400_000.0) as i64 };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_get_last_error(_vfs: *mut ffi::sqlite3_vfs, _n: c_int, _out: *mut c_char) -> c_int {
    0
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_lock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let f = file as *mut VfsFile;
    // SAFETY: `open` was made by Box::into_raw in x_open and is closed once.
    let open = unsafe { Box::from_raw((*f).open) };
    if let OpenKind::Disk(h) = &open.file {
        release_shm(&open, h);
        if open.delete_on_close {
            h.disk().remove(h.path(), true);
        }
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amt: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: `buf` holds `amt` bytes.
    let buf = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, amt as usize) };
    let open = unsafe { open_of(file) };
    let got = match &open.file {
        OpenKind::Disk(h) => {
            let mut got = 0;
            loop {
                match h.read_at(&mut buf[got..], offset as u64 + got as u64) {
                    Ok(0) => break got,
                    Ok(n) => {
                        got += n;
                        if got == buf.len() {
                            break got;
                        }
                    }
                    Err(_) => return ffi::SQLITE_IOERR_READ,
                }
            }
        }
        OpenKind::Temp(t) => {
            let t = t.lock().expect("temp file");
            let start = (offset as usize).min(t.len());
            let n = buf.len().min(t.len() - start);
            buf[..n].copy_from_slice(&t[start..start + n]);
            n
        }
    };
    if got < buf.len() {
        buf[got..].fill(0);
        return ffi::SQLITE_IOERR_SHORT_READ;
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: `buf` holds `amt` bytes.
    let buf = unsafe { std::slice::from_raw_parts(buf as *const u8, amt as usize) };
    let open = unsafe { open_of(file) };
    match &open.file {
        OpenKind::Disk(h) => match h.write_all_at(buf, offset as u64) {
            Ok(()) => ffi::SQLITE_OK,
            Err(e) => io_code(&e, ffi::SQLITE_IOERR_WRITE),
        },
        OpenKind::Temp(t) => {
            let mut t = t.lock().expect("temp file");
            let end = offset as usize + buf.len();
            if t.len() < end {
                t.resize(end, 0);
            }
            t[offset as usize..end].copy_from_slice(buf);
            ffi::SQLITE_OK
        }
    }
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    let open = unsafe { open_of(file) };
    match &open.file {
        OpenKind::Disk(h) => match h.set_len(size as u64) {
            Ok(()) => ffi::SQLITE_OK,
            Err(e) => io_code(&e, ffi::SQLITE_IOERR_TRUNCATE),
        },
        OpenKind::Temp(t) => {
            t.lock().expect("temp file").resize(size as usize, 0);
            ffi::SQLITE_OK
        }
    }
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, _flags: c_int) -> c_int {
    let open = unsafe { open_of(file) };
    match &open.file {
        OpenKind::Disk(h) => match h.sync() {
            Ok(()) => ffi::SQLITE_OK,
            Err(_) => ffi::SQLITE_IOERR_FSYNC,
        },
        OpenKind::Temp(_) => ffi::SQLITE_OK,
    }
}

unsafe extern "C" fn x_file_size(file: *mut ffi::sqlite3_file, out: *mut ffi::sqlite3_int64) -> c_int {
    let open = unsafe { open_of(file) };
    let len = match &open.file {
        OpenKind::Disk(h) => match h.len() {
            Ok(l) => l,
            Err(_) => return ffi::SQLITE_IOERR_FSTAT,
        },
        OpenKind::Temp(t) => t.lock().expect("temp file").len() as u64,
    };
    // SAFETY: valid out pointer.
    unsafe { *out = len as i64 };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_lock(_file: *mut ffi::sqlite3_file, _level: c_int) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_check_reserved_lock(_file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    // SAFETY: valid out pointer.
    unsafe { *out = 0 };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_file_control(_file: *mut ffi::sqlite3_file, _op: c_int, _arg: *mut c_void) -> c_int {
    ffi::SQLITE_NOTFOUND
}

unsafe extern "C" fn x_sector_size(_file: *mut ffi::sqlite3_file) -> c_int {
    crate::disk::SECTOR_LEN as c_int
}

unsafe extern "C" fn x_device_characteristics(_file: *mut ffi::sqlite3_file) -> c_int {
    ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let open = unsafe { open_of(file) };
    let OpenKind::Disk(h) = &open.file else { return ffi::SQLITE_IOERR_SHMMAP };
    let shm = h.disk().shm(h.path());
    let mut shm = shm.lock().expect("shm");
    shm.mapped_by.insert(open.conn);
    let region = region as usize;
    while shm.regions.len() <= region {
        if extend == 0 {
            // SAFETY: valid out pointer.
            unsafe { *out = std::ptr::null_mut() };
            return ffi::SQLITE_OK;
        }
        shm.regions.push(vec![0u8; size as usize].into_boxed_slice());
    }
    // SAFETY: the region's heap bytes stay put until the shared memory is dropped (unmap or crash).
    unsafe { *out = shm.regions[region].as_mut_ptr() as *mut c_void };
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shm_lock(file: *mut ffi::sqlite3_file, offset: c_int, n: c_int, flags: c_int) -> c_int {
    let open = unsafe { open_of(file) };
    let OpenKind::Disk(h) = &open.file else { return ffi::SQLITE_IOERR_SHMLOCK };
    let shm = h.disk().shm(h.path());
    let mut shm = shm.lock().expect("shm");
    let me = open.conn;
    let slots = offset as usize..(offset + n) as usize;
    if flags & ffi::SQLITE_SHM_UNLOCK != 0 {
        for s in slots {
            shm.shared[s].remove(&me);
            if shm.exclusive[s] == Some(me) {
                shm.exclusive[s] = None;
            }
            open.shared &= !(1 << s);
            open.exclusive &= !(1 << s);
        }
        return ffi::SQLITE_OK;
    }
    let exclusive = flags & ffi::SQLITE_SHM_EXCLUSIVE != 0;
    for s in slots.clone() {
        let other_excl = shm.exclusive[s].is_some_and(|c| c != me);
        let other_shared = shm.shared[s].iter().any(|&c| c != me);
        if other_excl || (exclusive && other_shared) {
            return ffi::SQLITE_BUSY;
        }
    }
    for s in slots {
        if exclusive {
            shm.exclusive[s] = Some(me);
            open.exclusive |= 1 << s;
        } else {
            shm.shared[s].insert(me);
            open.shared |= 1 << s;
        }
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shm_barrier(_file: *mut ffi::sqlite3_file) {
    std::sync::atomic::fence(Ordering::SeqCst);
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, _delete: c_int) -> c_int {
    let open = unsafe { open_of(file) };
    if let OpenKind::Disk(h) = &open.file {
        release_shm(open, h);
    }
    ffi::SQLITE_OK
}

/// Drops this connection's shared-memory locks and mapping; the regions go
/// with the last connection that mapped them.
fn release_shm(open: &Open, h: &Handle) {
    let shm_arc = h.disk().shm(h.path());
    let mut shm = shm_arc.lock().expect("shm");
    for s in 0..8 {
        shm.shared[s].remove(&open.conn);
        if shm.exclusive[s] == Some(open.conn) {
            shm.exclusive[s] = None;
        }
    }
    shm.mapped_by.remove(&open.conn);
    if shm.mapped_by.is_empty() {
        drop(shm);
        h.disk().drop_shm(h.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::{Disk, NodeDisk};
    use nasd_env::disk::SimDisk;
    use rand::SeedableRng;

    fn node_disk(seed: u64) -> (Arc<Disk>, NodeDisk) {
        let d = Disk::new("t", 64 << 20, Arc::new(Mutex::new(rand::rngs::StdRng::seed_from_u64(seed))));
        (d.clone(), NodeDisk(d))
    }

    fn open(nd: &NodeDisk) -> rusqlite::Connection {
        let (vfs, name) = nd.sqlite_vfs(Path::new("/db/meta.sqlite"));
        let c = rusqlite::Connection::open_with_flags_and_vfs(name, rusqlite::OpenFlags::default(), &vfs).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.pragma_update(None, "synchronous", "FULL").unwrap();
        c
    }

    /// Every committed transaction survives any crash; the database always opens.
    #[test]
    fn committed_rows_survive_crashes_whatever_the_unsynced_bytes_do() {
        for seed in 0..20 {
            let (d, nd) = node_disk(seed);
            nd.create_dir_all(Path::new("/db")).unwrap();
            let mut committed = 0u64;
            for round in 0..4 {
                let c = open(&nd);
                if round == 0 {
                    c.execute_batch("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v BLOB)").unwrap();
                    nd.sync_dir(Path::new("/db")).unwrap();
                }
                let n: u64 = c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0)).unwrap();
                assert!(n >= committed, "seed {seed} round {round}: {n} rows, {committed} committed");
                for i in 0..50u64 {
                    c.execute("INSERT INTO t (v) VALUES (?1)", [vec![(i % 251) as u8; 700]]).unwrap();
                }
                committed = n + 50;
                // An uncommitted transaction's writes may reach the disk in part.
                c.execute_batch("BEGIN; INSERT INTO t (v) VALUES (zeroblob(9000));").unwrap();
                std::mem::forget(c);
                d.crash();
            }
        }
    }
}
