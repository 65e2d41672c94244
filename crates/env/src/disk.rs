//! The disk: files read and written at offsets and synced, directories,
//! exclusive lock files, and SQLite databases.
//!
//! A [`DiskFile`] is a `std::fs::File` in the real environment (positioned
//! `pread`/`pwrite`, `fdatasync`) and a [`SimFile`] in a simulated one, whose
//! disk keeps what was synced apart from what was only written, so that a
//! simulated crash loses (or tears) exactly what a real one may.

use crate::Env;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A simulated disk ([`crate::World::disk`]).
pub trait SimDisk: Send + Sync {
    /// Opens `path`, creating it (and not its directory) if `create`.
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn SimFile>>;
    /// Creates a directory and its parents.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Makes the entries of the directory `path` durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Takes the lock file `path` (`WouldBlock` if held); `unlock` gives it back.
    fn lock(&self, path: &Path) -> io::Result<()>;
    /// Gives back a lock taken with [`SimDisk::lock`].
    fn unlock(&self, path: &Path);
    /// The SQLite VFS to open `path` with, and the name to give it.
    fn sqlite_vfs(&self, path: &Path) -> (String, PathBuf);
}

/// A file on a simulated disk.
pub trait SimFile: Send + Sync {
    /// Reads at `offset`; returns the bytes read (0 at or past the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `offset`, extending the file as needed.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every write so far durable.
    fn sync(&self) -> io::Result<()>;
    /// Sets the length.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// The length.
    fn len(&self) -> io::Result<u64>;
    /// Whether the length is 0.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Gives back the space of bytes `offset .. offset + len`, which read
    /// as zeros from then on; the length does not change.
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()>;
}

/// A file read and written at offsets ([`Env::open_file`]).
pub struct DiskFile(FileInner);

enum FileInner {
    Std(std::fs::File),
    Sim(Arc<dyn SimFile>),
}

impl std::fmt::Debug for DiskFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            FileInner::Std(file) => file.fmt(f),
            FileInner::Sim(_) => f.write_str("DiskFile(simulated)"),
        }
    }
}

impl From<std::fs::File> for DiskFile {
    fn from(f: std::fs::File) -> Self {
        DiskFile(FileInner::Std(f))
    }
}

pub(crate) fn open_file(env: &Env, path: &Path, create: bool) -> io::Result<DiskFile> {
    match env.sim_disk() {
        None => {
            let f = std::fs::OpenOptions::new().create(create).truncate(false).read(true).write(true).open(path)?;
            Ok(DiskFile(FileInner::Std(f)))
        }
        Some(d) => Ok(DiskFile(FileInner::Sim(d.open(path, create)?))),
    }
}

impl DiskFile {
    /// Reads exactly `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// `UnexpectedEof` past the end; the disk's error otherwise.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match &self.0 {
            FileInner::Std(f) => f.read_exact_at(buf, offset),
            FileInner::Sim(f) => {
                let mut done = 0;
                while done < buf.len() {
                    let n = f.read_at(&mut buf[done..], offset + done as u64)?;
                    if n == 0 {
                        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the file"));
                    }
                    done += n;
                }
                Ok(())
            }
        }
    }

    /// Fills `buf` from `offset` only if the kernel's page cache holds all
    /// of it (`preadv2` with `RWF_NOWAIT`): whether it did. A simulated
    /// disk has no page cache (false). For emulating media latency on the
    /// reads that would reach the disk.
    pub fn read_cached_at(&self, buf: &mut [u8], offset: u64) -> bool {
        match &self.0 {
            FileInner::Std(f) => {
                let mut bufs = [std::io::IoSliceMut::new(buf)];
                let nowait = rustix::io::ReadWriteFlags::NOWAIT;
                rustix::io::preadv2(f, &mut bufs, offset, nowait).is_ok_and(|n| n == bufs[0].len())
            }
            FileInner::Sim(_) => false,
        }
    }

    /// Writes all of `buf` at `offset`.
    ///
    /// # Errors
    /// The disk's error (a full disk: `StorageFull`).
    pub fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match &self.0 {
            FileInner::Std(f) => f.write_all_at(buf, offset),
            FileInner::Sim(f) => f.write_all_at(buf, offset),
        }
    }

    /// Makes the file's data durable (`fdatasync`).
    ///
    /// # Errors
    /// The disk's error; after one, what was written since the last
    /// successful sync may or may not be durable.
    pub fn sync_data(&self) -> io::Result<()> {
        match &self.0 {
            FileInner::Std(f) => f.sync_data(),
            FileInner::Sim(f) => f.sync(),
        }
    }

    /// Makes the file's data and metadata durable (`fsync`).
    ///
    /// # Errors
    /// As [`DiskFile::sync_data`].
    pub fn sync_all(&self) -> io::Result<()> {
        match &self.0 {
            FileInner::Std(f) => f.sync_all(),
            FileInner::Sim(f) => f.sync(),
        }
    }

    /// Sets the file's length.
    ///
    /// # Errors
    /// The disk's error.
    pub fn set_len(&self, len: u64) -> io::Result<()> {
        match &self.0 {
            FileInner::Std(f) => f.set_len(len),
            FileInner::Sim(f) => f.set_len(len),
        }
    }

    /// The file's length.
    ///
    /// # Errors
    /// The disk's error.
    pub fn len(&self) -> io::Result<u64> {
        match &self.0 {
            FileInner::Std(f) => Ok(f.metadata()?.len()),
            FileInner::Sim(f) => f.len(),
        }
    }

    /// Gives back the space of bytes `offset .. offset + len` (which read
    /// as zeros from then on) without changing the length:
    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`.
    ///
    /// # Errors
    /// The disk's error; `EOPNOTSUPP` (or `ENOSYS`) where the file system
    /// cannot punch holes.
    pub fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        match &self.0 {
            FileInner::Std(f) => {
                use nix::fcntl::{fallocate, FallocateFlags};
                let too_far = || io::Error::new(io::ErrorKind::InvalidInput, "hole past the largest file offset");
                let offset = i64::try_from(offset).map_err(|_| too_far())?;
                let len = i64::try_from(len).map_err(|_| too_far())?;
                let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
                fallocate(f, flags, offset, len).map_err(io::Error::from)
            }
            FileInner::Sim(f) => f.punch_hole(offset, len),
        }
    }

    /// Whether the file's length is 0.
    ///
    /// # Errors
    /// The disk's error.
    pub fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// The real file, if this is one.
    pub fn as_std(&self) -> Option<&std::fs::File> {
        match &self.0 {
            FileInner::Std(f) => Some(f),
            FileInner::Sim(_) => None,
        }
    }
}

/// An exclusive lock file, held until dropped ([`Env::lock_file`]).
pub struct DirLock(LockInner);

enum LockInner {
    Std(#[allow(dead_code)] std::fs::File),
    Sim(Env, PathBuf),
}

impl std::fmt::Debug for DirLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DirLock")
    }
}

pub(crate) fn lock_file(env: &Env, path: &Path) -> io::Result<DirLock> {
    match env.sim_disk() {
        None => {
            let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
            f.try_lock().map_err(|e| match e {
                std::fs::TryLockError::WouldBlock => io::Error::new(io::ErrorKind::WouldBlock, "held by another"),
                std::fs::TryLockError::Error(e) => e,
            })?;
            Ok(DirLock(LockInner::Std(f)))
        }
        Some(d) => {
            d.lock(path)?;
            Ok(DirLock(LockInner::Sim(env.clone(), path.to_path_buf())))
        }
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        if let LockInner::Sim(env, path) = &self.0 {
            if let Some(d) = env.sim_disk() {
                d.unlock(path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_file_reads_back_what_was_written_at_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::real();
        let f = env.open_file(&dir.path().join("f"), true).unwrap();
        f.write_all_at(b"world", 5).unwrap();
        f.write_all_at(b"hello", 0).unwrap();
        f.sync_data().unwrap();
        let mut buf = [0u8; 10];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"helloworld");
        assert_eq!(f.len().unwrap(), 10);
        assert_eq!(f.read_exact_at(&mut buf, 5).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        assert!(env.open_file(&dir.path().join("missing"), false).is_err());
    }

    #[test]
    fn a_lock_file_is_exclusive_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::real();
        let path = dir.path().join("LOCK");
        let held = env.lock_file(&path).unwrap();
        assert_eq!(env.lock_file(&path).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        drop(held);
        env.lock_file(&path).unwrap();
    }
}
