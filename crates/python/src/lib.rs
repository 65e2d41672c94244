//! `nasd._nasd`: the nasd file-system client library ([`nasd_fs`]) for
//! Python. A [`Client`] logs in (by password, by an identity key from the
//! authentication server, or with the `[client]` section of a config file,
//! through [`nasd_profile`]) and reads and writes straight to the drives.
//! The pure-Python package `nasd` (python/nasd) wraps it as an fsspec file
//! system registered as `nasd://`.
//!
//! Every call that does I/O releases the GIL while it runs on the module's
//! tokio runtime, so Python threads share one client (it is `Send + Sync`;
//! clones of the [`FsClient`] share its connections) and run in parallel.
//! Failures become `OSError`s with the errno nasd maps them to — Python
//! picks the subclass: `FileNotFoundError`, `PermissionError`,
//! `IsADirectoryError`, `NotADirectoryError`, `FileExistsError`, … — and
//! nasd's message.
//!
//! Files are written whole and atomically: a [`Writer`] writes under a
//! temporary name beside its target ([`nasd_fs::temporary_name`]), commits
//! and renames it onto the target at [`Writer::commit`]; until then readers
//! see the old file (or none), and an aborted or dropped writer removes its
//! temporary file. An append ([`Client::open_append`]) is such a write whose
//! temporary file starts as a copy of the target: the appended bytes appear
//! at commit, all at once, and only if the target is still the file the copy
//! was taken from.

use nasd_fs::{FileAttr, FileKind, FsClient, FsError, FsStatus};
use pyo3::create_exception;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

create_exception!(
    _nasd,
    LoginError,
    PyOSError,
    "Logging in failed: the manager or authentication server could not be reached, refused the \
     credentials, or the profile lacks a setting (the message says which)."
);

/// Permission bits of files the client creates (before the manager's own rules).
const NEW_FILE_MODE: u32 = 0o644;
/// Permission bits of directories the client creates.
const NEW_DIR_MODE: u32 = 0o755;
/// Bytes a copy inside nasd moves per read and write.
const COPY_PIECE_BYTES: u64 = nasd_fs::TRANSFER_PIECE_DEFAULT as u64;
/// Worker threads of the module's runtime (I/O waits; the striping work is light).
const RUNTIME_THREADS: usize = 4;

/// The one runtime every client of this process runs its I/O on.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(RUNTIME_THREADS)
            .thread_name("nasd-io")
            .enable_all()
            .build()
            .expect("the nasd I/O runtime starts")
    })
}

/// Runs `io` to completion on the runtime with the GIL released.
fn block<T: Send>(py: Python<'_>, io: impl Future<Output = T> + Send) -> T {
    py.detach(|| runtime().block_on(io))
}

/// `e` as the `OSError` (subclass by errno) Python code expects, naming `path`.
fn os_error(e: FsError, path: &str) -> PyErr {
    PyOSError::new_err((e.errno(), e.to_string(), path.to_string()))
}

/// Runs the file-system call `io` on `path` with the GIL released, mapping its failure.
fn call<T: Send>(py: Python<'_>, path: &str, io: impl Future<Output = Result<T, FsError>> + Send) -> PyResult<T> {
    block(py, io).map_err(|e| os_error(e, path))
}

/// A nasd path as the client library takes it: absolute, without a trailing slash (but `/`).
fn abs(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    match trimmed {
        "" => "/".to_string(),
        t if t.starts_with('/') => t.to_string(),
        t => format!("/{t}"),
    }
}

/// A file's status: what `stat` and directory listings report.
#[pyclass(frozen, get_all, module = "nasd._nasd")]
#[derive(Clone)]
pub struct Stat {
    /// Its absolute path in nasd.
    path: String,
    /// "file", "directory", "symlink", "fifo", "socket", "char-device" or "block-device".
    kind: &'static str,
    /// Length in bytes (directories: entry count).
    size: u64,
    /// Permission bits.
    mode: u32,
    /// Owner.
    uid: u32,
    /// Group.
    gid: u32,
    /// Names linking to it.
    nlink: u32,
    /// Inode number.
    ino: u64,
    /// Last data change, nanoseconds since the Unix epoch.
    mtime_ns: i64,
    /// Last attribute change, nanoseconds since the Unix epoch.
    ctime_ns: i64,
    /// Bytes of storage its data takes (holes and parity not counted).
    allocated: u64,
}

#[pymethods]
impl Stat {
    fn __repr__(&self) -> String {
        format!("Stat(path={:?}, kind={:?}, size={}, mode=0o{:o})", self.path, self.kind, self.size, self.mode)
    }
}

impl Stat {
    fn new(path: String, a: &FileAttr) -> Stat {
        Stat {
            path,
            kind: kind_name(a.kind),
            size: a.size,
            mode: a.mode,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            ino: a.ino,
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
            allocated: a.allocated,
        }
    }
}

fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "file",
        FileKind::Dir => "directory",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDevice => "char-device",
        FileKind::BlockDevice => "block-device",
    }
}

/// A logged-in nasd client. One client may be shared by many threads: each
/// call releases the GIL while it waits for the manager or the drives.
#[pyclass(frozen, module = "nasd._nasd")]
pub struct Client {
    fs: FsClient,
}

/// Logs in with `section` as `user`.
fn login(py: Python<'_>, section: &nasd_profile::ClientSection, user: &str, password: &str) -> PyResult<Client> {
    let how = nasd_profile::Login { user, password, role: None, renew: true, on_wait: None };
    let fs = block(py, nasd_profile::login(section, how)).map_err(|e| LoginError::new_err(format!("{e:#}")))?;
    Ok(Client { fs })
}

#[pymethods]
impl Client {
    /// Logs in to the manager at `manager` (host:port) over TLS checked
    /// against the cluster CA `ca_cert`, as `user` with `password`; with
    /// `auth` (host:port of the authentication server) the password is
    /// given there, in `role`, and the identity key it issues is used with
    /// the manager (and renewed before it expires).
    #[staticmethod]
    #[pyo3(signature = (manager, ca_cert, user, password, *, server_name=None, auth=None, role=None,
                        failover=Vec::new(), data_integrity=true, reply_timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        py: Python<'_>,
        manager: String,
        ca_cert: PathBuf,
        user: String,
        password: String,
        server_name: Option<String>,
        auth: Option<String>,
        role: Option<u32>,
        failover: Vec<String>,
        data_integrity: bool,
        reply_timeout: Option<f64>,
    ) -> PyResult<Client> {
        let password = zeroize::Zeroizing::new(password);
        let reply_timeout_secs = reply_timeout.map(|s| Duration::from_secs_f64(s.max(1.0)).as_secs());
        let section = nasd_profile::ClientSection {
            manager: Some(manager),
            failover,
            server_name,
            ca_cert: Some(ca_cert),
            user: Some(user.clone()),
            data_integrity: Some(data_integrity),
            reply_timeout_secs,
            auth,
            role,
            ..Default::default()
        };
        login(py, &section, &user, &password)
    }

    /// Logs in with the `[client]` section of the config file at `config`
    /// (`nasd up` writes DATA/nasd.toml): its manager, CA, user and
    /// authentication server. `user` overrides the configured user;
    /// `password` the configured `password_file` (which serves the
    /// configured user only) and `$NASD_PASSWORD`.
    #[staticmethod]
    #[pyo3(signature = (config, *, user=None, password=None))]
    fn from_config(
        py: Python<'_>,
        config: PathBuf,
        user: Option<String>,
        password: Option<String>,
    ) -> PyResult<Client> {
        let fail = |e: anyhow::Error| LoginError::new_err(format!("{e:#}"));
        let section = nasd_profile::load_client_section(&config).map_err(fail)?;
        let user = section.login_name(user.as_deref()).map_err(fail)?;
        let password = match password.or_else(|| std::env::var("NASD_PASSWORD").ok()) {
            Some(p) => p,
            None => section.password_from_file(&user).map_err(fail)?.ok_or_else(|| {
                LoginError::new_err(format!(
                    "no password for '{user}': pass password=, set $NASD_PASSWORD, or a password_file for \
                     this user in [client] of {}",
                    config.display()
                ))
            })?,
        };
        let password = zeroize::Zeroizing::new(password);
        login(py, &section, &user, &password)
    }

    /// The user this client is logged in as.
    #[getter]
    fn user(&self) -> String {
        self.fs.user().to_string()
    }

    /// The status of `path` (symbolic links followed).
    fn stat(&self, py: Python<'_>, path: &str) -> PyResult<Stat> {
        let path = abs(path);
        let st = call(py, &path, self.fs.stat(&path))?;
        Ok(Stat::new(path, &st.attr))
    }

    /// The entries of the directory `path`, in name order, with their status.
    fn listdir(&self, py: Python<'_>, path: &str) -> PyResult<Vec<Stat>> {
        let path = abs(path);
        let entries = call(py, &path, self.fs.readdir(&path))?;
        let dir = path.trim_end_matches('/');
        Ok(entries.iter().map(|(name, attr)| Stat::new(format!("{dir}/{name}"), attr)).collect())
    }

    /// Creates the directory `path`; with `parents`, its missing parents
    /// too, and an existing directory is no error.
    #[pyo3(signature = (path, *, parents=false, mode=NEW_DIR_MODE))]
    fn mkdir(&self, py: Python<'_>, path: &str, parents: bool, mode: u32) -> PyResult<()> {
        let path = abs(path);
        if parents {
            return call(py, &path, make_dirs(&self.fs, &path, mode));
        }
        call(py, &path, self.fs.mkdir(&path, mode)).map(drop)
    }

    /// Removes the empty directory `path`.
    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let path = abs(path);
        call(py, &path, self.fs.rmdir(&path))
    }

    /// Removes the file (or link) `path`.
    fn unlink(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let path = abs(path);
        call(py, &path, self.fs.unlink(&path))
    }

    /// Renames `src` to `dst` (atomically replacing a file there).
    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        let (src, dst) = (abs(src), abs(dst));
        call(py, &src, self.fs.rename(&src, &dst))
    }

    /// Sets the permission bits of `path`.
    fn chmod(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        let path = abs(path);
        call(py, &path, self.fs.chmod(&path, mode)).map(drop)
    }

    /// Sets the modification time of `path` (nanoseconds since the Unix epoch).
    fn set_mtime(&self, py: Python<'_>, path: &str, mtime_ns: i64) -> PyResult<()> {
        let path = abs(path);
        let changes = nasd_fs::SetAttr { mtime_ns: Some(mtime_ns), ..Default::default() };
        call(py, &path, async {
            let e = self.fs.walk(&path, nasd_fs::OpenMode::None).await?;
            self.fs.setattr(e.handle(), &changes).await
        })
        .map(drop)
    }

    /// Bytes `start` to `end` (exclusive; `None`: the end) of the file
    /// `path`, fewer if it ends first.
    #[pyo3(signature = (path, start=0, end=None))]
    fn read<'py>(&self, py: Python<'py>, path: &str, start: u64, end: Option<u64>) -> PyResult<Bound<'py, PyBytes>> {
        let path = abs(path);
        let data = call(py, &path, async {
            let f = self.fs.open(&path, false).await?;
            let end = end.unwrap_or(u64::MAX).min(f.size());
            if end <= start {
                return Ok(Vec::new());
            }
            f.read_at(start, end - start).await
        })?;
        Ok(PyBytes::new(py, &data))
    }

    /// The bytes of each of `reads` (offset, length) of the file `path`, in
    /// order: the reads are sent to its drives first as hints, so they read
    /// them from disk ahead (informed prefetching, `prefetch-v1`). Each read
    /// is fewer bytes at the end of the file.
    fn read_hinted<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        reads: Vec<(u64, u64)>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let path = abs(path);
        let data = call(py, &path, async {
            let f = self.fs.open(&path, false).await?;
            let mut hinted = nasd_fs::HintedReads::new(&f, reads).await?;
            let mut out = Vec::with_capacity(hinted.remaining());
            while let Some((_, bytes)) = hinted.next_read().await? {
                out.push(bytes);
            }
            hinted.end().await;
            Ok(out)
        })?;
        Ok(data.iter().map(|d| PyBytes::new(py, d)).collect())
    }

    /// The checksum of the file `path` (32 bytes, BLAKE3): from the digests
    /// its drives stored with its blocks, so no drive reads or hashes the
    /// data (only bytes below the small-file threshold come from the
    /// manager). Equal for equal bytes under the same layout, small-file
    /// threshold and drive block sizes; see `nasd_fs::file_checksum`.
    fn checksum<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyBytes>> {
        let path = abs(path);
        let sum = call(py, &path, self.fs.checksum(&path))?;
        Ok(PyBytes::new(py, &sum))
    }

    /// Replaces the file `path` with `data`, atomically; with `exclusive`,
    /// creates it, failing with `FileExistsError` if it exists.
    #[pyo3(signature = (path, data, *, exclusive=false))]
    fn write(&self, py: Python<'_>, path: &str, data: PyBackedBytes, exclusive: bool) -> PyResult<()> {
        let w = self.open_write(py, path, exclusive)?;
        w.write(py, data)?;
        w.commit(py)
    }

    /// Opens the file `path` for ranged reads.
    fn open_read(&self, py: Python<'_>, path: &str) -> PyResult<Reader> {
        let path = abs(path);
        let file = call(py, &path, self.fs.open(&path, false))?;
        Ok(Reader { file, path })
    }

    /// Starts replacing the file `path`: the bytes written go to a
    /// temporary file beside it, renamed onto it at `commit`. With
    /// `exclusive` the file must not exist, now or at `commit` (which then
    /// links the new file in, failing with `FileExistsError` if the name
    /// appeared meanwhile).
    #[pyo3(signature = (path, exclusive=false))]
    fn open_write(&self, py: Python<'_>, path: &str, exclusive: bool) -> PyResult<Writer> {
        let path = abs(path);
        let (tmp, file) = call(py, &path, async {
            let existing = match self.fs.stat(&path).await {
                Ok(st) if st.attr.kind == FileKind::Dir => {
                    return Err(FsError::Fs { status: FsStatus::IsDir, message: format!("{path} is a directory") })
                }
                Ok(_) if exclusive => {
                    return Err(FsError::Fs { status: FsStatus::Exists, message: format!("{path} exists") })
                }
                Ok(st) => Some(st.attr.mode),
                Err(e) if e.status() == Some(FsStatus::NotFound) => None,
                Err(e) => return Err(e),
            };
            let tmp = nasd_fs::temporary_name(&path)?;
            let file = self.fs.create(&tmp, existing.unwrap_or(NEW_FILE_MODE), true, false).await?;
            Ok((tmp, file))
        })?;
        Ok(Writer::new(self.fs.clone(), path, tmp, file, if exclusive { Placing::Create } else { Placing::Replace }))
    }

    /// Starts appending to the file `path`, atomically: a temporary file
    /// beside it gets a copy of its bytes (read from and written to the
    /// drives by this library, not through Python), the bytes written are
    /// appended to that, and `commit` renames it onto `path` — readers see
    /// the file as it was or with everything appended. `commit` refuses
    /// (`BlockingIOError`, errno `EAGAIN`: retry the append) if `path` was
    /// replaced or changed since this call (its inode, size, modification
    /// or change time differ), so two appenders never silently lose one's
    /// bytes; the check and the rename are two manager requests, so a change
    /// landing between them is lost. A missing `path` is created (as with
    /// `exclusive`: `FileExistsError` at `commit` if it appeared meanwhile).
    /// Costs a copy of the whole file per append.
    fn open_append(&self, py: Python<'_>, path: &str) -> PyResult<Writer> {
        let path = abs(path);
        let (tmp, file, source) = call(py, &path, async {
            let source = match self.fs.open(&path, false).await {
                Ok(f) => Some(f),
                Err(e) if e.status() == Some(FsStatus::NotFound) => None,
                Err(e) => return Err(e),
            };
            let mode = source.as_ref().map_or(NEW_FILE_MODE, |f| f.attr().mode);
            let tmp = nasd_fs::temporary_name(&path)?;
            let file = self.fs.create(&tmp, mode, true, false).await?;
            Ok((tmp, file, source))
        })?;
        let placing = match &source {
            Some(f) => Placing::ReplaceIfUnchanged(Version::of(&f.attr())),
            None => Placing::Create,
        };
        let w = Writer::new(self.fs.clone(), path.clone(), tmp, file, placing);
        if let Some(source) = source {
            let copied = block(py, w.copy_from(&source, &path));
            if let Err(e) = copied {
                w.abort(py)?;
                return Err(e);
            }
        }
        Ok(w)
    }

    /// Copies the file `src` to `dst` inside nasd (atomically at `dst`),
    /// with the GIL released throughout. nasd has no server-side copy of a
    /// file (drives clone objects, `FASTCOPY`, but the manager does not
    /// offer a file clone), so this library reads the bytes from the drives
    /// and writes them to the drives, piece by piece; none pass through
    /// Python.
    fn copy(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        let src = abs(src);
        let source = call(py, &src, self.fs.open(&src, false))?;
        let w = self.open_write(py, dst, false)?;
        let copied = block(py, w.copy_from(&source, &src));
        match copied {
            Ok(()) => w.commit(py),
            Err(e) => {
                w.abort(py)?;
                Err(e)
            }
        }
    }

    /// Uploads the local file `local` to `remote` (atomically at `remote`).
    fn put(&self, py: Python<'_>, local: PathBuf, remote: &str) -> PyResult<()> {
        let w = self.open_write(py, remote, false)?;
        let sent = block(py, async {
            let mut src = tokio::fs::File::open(&local).await.map_err(|e| local_error(e, &local))?;
            let len = src.metadata().await.map_err(|e| local_error(e, &local))?.len();
            w.write_from(&mut src, len).await
        });
        match sent {
            Ok(()) => w.commit(py),
            Err(e) => {
                w.abort(py)?;
                Err(e)
            }
        }
    }

    /// Downloads `remote` to the local file `local`, written under a
    /// temporary name beside it and renamed onto it when whole.
    fn get(&self, py: Python<'_>, remote: &str, local: PathBuf) -> PyResult<()> {
        let remote = abs(remote);
        block(py, async {
            let f = self.fs.open(&remote, false).await.map_err(|e| os_error(e, &remote))?;
            let dir = local.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let tmp = tempfile::Builder::new()
                .prefix(".nasd-get.")
                .suffix(nasd_fs::TEMPORARY_SUFFIX)
                .tempfile_in(dir)
                .map_err(|e| local_error(e, &local))?;
            let out = tmp.as_file().try_clone().map_err(|e| local_error(e, &local))?;
            let mut out = tokio::fs::File::from_std(out);
            f.read_to(0, f.size(), &mut out).await.map_err(|e| match e {
                FsError::Local(io) => local_error(io, &local),
                e => os_error(e, &remote),
            })?;
            out.sync_all().await.map_err(|e| local_error(e, &local))?;
            tmp.persist(&local).map_err(|e| local_error(e.error, &local))?;
            Ok(())
        })
    }

    fn __repr__(&self) -> String {
        format!("nasd.Client(user={:?}, manager={:?})", self.fs.user(), self.fs.current_manager())
    }
}

/// Creates the directory `path` and its missing parents (an existing
/// directory is no error). Only what is missing is made, from the deepest
/// directory that exists: a user may create below a directory whose
/// parents they cannot write.
async fn make_dirs(fs: &FsClient, path: &str, mode: u32) -> Result<(), FsError> {
    let mut missing = Vec::new();
    let mut at = path;
    while at != "/" {
        match fs.stat(at).await {
            Ok(st) if st.attr.kind == FileKind::Dir => break,
            Ok(_) => return Err(FsError::Fs { status: FsStatus::NotDir, message: format!("{at} is not a directory") }),
            Err(e) if e.status() == Some(FsStatus::NotFound) => missing.push(at),
            Err(e) => return Err(e),
        }
        at = nasd_fs::split_path(at)?.0;
    }
    for dir in missing.into_iter().rev() {
        match fs.mkdir(dir, mode).await {
            Err(e) if e.status() != Some(FsStatus::Exists) => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// A local I/O failure as the `OSError` Python raises for it.
fn local_error(e: std::io::Error, path: &Path) -> PyErr {
    match e.raw_os_error() {
        Some(errno) => PyOSError::new_err((errno, e.to_string(), path.display().to_string())),
        None => PyOSError::new_err(format!("{}: {e}", path.display())),
    }
}

/// A file open for ranged reads.
#[pyclass(frozen, module = "nasd._nasd")]
pub struct Reader {
    file: nasd_fs::File,
    path: String,
}

#[pymethods]
impl Reader {
    /// The file's size when it was opened.
    #[getter]
    fn size(&self) -> u64 {
        self.file.size()
    }

    /// Up to `length` bytes at `offset` (fewer at the end of the file).
    fn read<'py>(&self, py: Python<'py>, offset: u64, length: u64) -> PyResult<Bound<'py, PyBytes>> {
        let length = length.min(self.file.size().saturating_sub(offset));
        if length == 0 {
            return Ok(PyBytes::new(py, b""));
        }
        let data = call(py, &self.path, self.file.read_at(offset, length))?;
        Ok(PyBytes::new(py, &data))
    }
}

/// A file being written whole: bytes are appended under a temporary name
/// and put in place of the target at `commit`.
#[pyclass(frozen, module = "nasd._nasd")]
pub struct Writer {
    fs: FsClient,
    target: String,
    tmp: String,
    /// How the file is put in place of the target at commit.
    placing: Placing,
    /// The open temporary file until committed or aborted; held across
    /// each write, so writes from several threads go one after another.
    state: tokio::sync::Mutex<Option<Pending>>,
}

struct Pending {
    file: nasd_fs::File,
    written: u64,
}

/// How a committed file is put in place of its target.
#[derive(Clone, Copy)]
enum Placing {
    /// Renamed onto it, whatever is there.
    Replace,
    /// Linked in: the target must not exist.
    Create,
    /// Renamed onto it if it is still this version (an append).
    ReplaceIfUnchanged(Version),
}

/// What tells one version of a file from another: a rewrite is a new
/// inode; a write in place changes the modification time, an attribute
/// change the change time.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Version {
    ino: u64,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl Version {
    fn of(a: &FileAttr) -> Version {
        Version { ino: a.ino, size: a.size, mtime_ns: a.mtime_ns, ctime_ns: a.ctime_ns }
    }
}

impl Writer {
    fn new(fs: FsClient, target: String, tmp: String, file: nasd_fs::File, placing: Placing) -> Writer {
        Writer { fs, target, tmp, placing, state: tokio::sync::Mutex::new(Some(Pending { file, written: 0 })) }
    }

    /// Appends the bytes of `source` (the file at `source_path`), piece by piece.
    async fn copy_from(&self, source: &nasd_fs::File, source_path: &str) -> PyResult<()> {
        let mut offset = 0;
        while offset < source.size() {
            let piece = source.read_at(offset, COPY_PIECE_BYTES).await.map_err(|e| os_error(e, source_path))?;
            if piece.is_empty() {
                break;
            }
            self.write_piece(&piece).await?;
            offset += piece.len() as u64;
        }
        Ok(())
    }

    /// Puts the closed temporary file in place of the target.
    async fn place(&self) -> Result<(), FsError> {
        match self.placing {
            Placing::Replace => self.fs.rename(&self.tmp, &self.target).await,
            Placing::Create => self.link_in().await,
            Placing::ReplaceIfUnchanged(version) => {
                let now = self.fs.stat(&self.target).await?;
                if Version::of(&now.attr) != version {
                    return Err(FsError::Fs {
                        status: FsStatus::Busy,
                        message: format!(
                            "{} changed since it was opened for append: the appended bytes were dropped; retry",
                            self.target
                        ),
                    });
                }
                self.fs.rename(&self.tmp, &self.target).await
            }
        }
    }

    /// The open temporary file, or why there is none.
    fn open_file<'a>(&self, state: &'a mut Option<Pending>) -> PyResult<&'a mut Pending> {
        state.as_mut().ok_or_else(|| PyValueError::new_err(format!("{} is closed (committed or aborted)", self.target)))
    }

    async fn write_piece(&self, data: &[u8]) -> PyResult<()> {
        let mut state = self.state.lock().await;
        let p = self.open_file(&mut state)?;
        p.file.write_at(p.written, data).await.map_err(|e| os_error(e, &self.target))?;
        p.written += data.len() as u64;
        Ok(())
    }

    async fn write_from(&self, src: &mut tokio::fs::File, len: u64) -> PyResult<()> {
        let mut state = self.state.lock().await;
        let p = self.open_file(&mut state)?;
        p.written += p.file.write_from(p.written, len, src).await.map_err(|e| os_error(e, &self.target))?;
        Ok(())
    }

    /// Links the committed temporary file in at the target (refused if a
    /// file appeared there), then drops its temporary name.
    async fn link_in(&self) -> Result<(), FsError> {
        self.fs.link(&self.tmp, &self.target).await?;
        self.fs.unlink(&self.tmp).await
    }

    async fn discard(fs: &FsClient, tmp: &str, pending: Option<Pending>) -> Result<(), FsError> {
        drop(pending);
        match fs.unlink(tmp).await {
            Err(e) if e.status() != Some(FsStatus::NotFound) => Err(e),
            _ => Ok(()),
        }
    }
}

#[pymethods]
impl Writer {
    /// Bytes written so far.
    #[getter]
    fn written(&self, py: Python<'_>) -> u64 {
        block(py, async { self.state.lock().await.as_ref().map_or(0, |p| p.written) })
    }

    /// Appends `data`.
    fn write(&self, py: Python<'_>, data: PyBackedBytes) -> PyResult<()> {
        block(py, self.write_piece(&data))
    }

    /// Makes the bytes durable and puts the file in place of the target
    /// (a rename: readers see the old file or the whole new one; a link if
    /// exclusive or an append to a missing file; for an append, refused if
    /// the target changed since it was opened).
    fn commit(&self, py: Python<'_>) -> PyResult<()> {
        block(py, async {
            let mut state = self.state.lock().await;
            self.open_file(&mut state)?;
            let p = state.take().expect("open_file found it open");
            let placed = match p.file.close().await {
                Ok(_) => self.place().await,
                Err(e) => Err(e),
            };
            // On failure leave nothing behind; the failure to report is the commit's.
            if let Err(e) = placed {
                let _ = Self::discard(&self.fs, &self.tmp, None).await;
                return Err(os_error(e, &self.target));
            }
            Ok(())
        })
    }

    /// Drops the bytes written and removes the temporary file; the target is untouched.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        call(py, &self.target, async {
            let pending = self.state.lock().await.take();
            if pending.is_none() {
                return Ok(());
            }
            Self::discard(&self.fs, &self.tmp, pending).await
        })
    }
}

impl Drop for Writer {
    /// A writer neither committed nor aborted removes its temporary file
    /// (in the background: a drop may come with the GIL held).
    fn drop(&mut self) {
        let pending = self.state.get_mut().take();
        if pending.is_some() {
            let (fs, tmp) = (self.fs.clone(), self.tmp.clone());
            runtime().spawn(async move { Writer::discard(&fs, &tmp, pending).await });
        }
    }
}

/// The module `nasd._nasd`.
#[pymodule]
fn _nasd(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Stat>()?;
    m.add_class::<Reader>()?;
    m.add_class::<Writer>()?;
    m.add("LoginError", m.py().get_type::<LoginError>())?;
    m.add("TEMPORARY_SUFFIX", nasd_fs::TEMPORARY_SUFFIX)?;
    Ok(())
}
