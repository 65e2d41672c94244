//! nasd-fuse: the POSIX mount of a nasd file system, a FUSE gateway over
//! [`nasd_fs::FsClient`].
//!
//! The kernel's FUSE requests name inodes by number; the mount keeps, for
//! every inode the kernel holds, the manager's file handle (an inode number
//! with the manager's MAC for the logged-in user), and turns each request into
//! handle-based calls of `nasd-fs`: names and attributes from the manager,
//! file bytes straight between this host and the drives through a
//! [`nasd_fs::File`] (striping, read-ahead, write-behind, write
//! transactions). Nothing else in nasd knows FUSE.
//!
//! - **Inode numbers** are nasd's own (never reused within a file system, so
//!   the generation number is constant); the root is 1 in both.
//! - **Per-request isolation**: every request runs as a task of its own on the
//!   mount's tokio runtime and ends in a reply — an errno when anything fails,
//!   also when the task panics (its reply is dropped, which answers `EIO`).
//!   At most [`REQUESTS_IN_FLIGHT_MAX`] data requests (reads, writes,
//!   flushes, releases of open files) and [`NAME_REQUESTS_IN_FLIGHT_MAX`]
//!   others run at once; past that the FUSE threads wait, so the kernel
//!   queues.
//! - **Outages** (issue 23.1): while no manager can be reached, a request
//!   that needs one waits for it to come back, as on a hard NFS mount
//!   ([`MountConfig::manager_wait`]; with a bound it then fails with `EIO`).
//!   The wait is logged once when it begins and once when it ends, and it is
//!   interruptible: a request whose caller has a signal pending that it
//!   catches, or is being killed, ends with `EINTR` within
//!   [`nasd_fs::INTERRUPT_POLL`]. Reads and writes of open files go on
//!   without the manager while their capabilities are valid and their
//!   drives answer (the kernel's attribute checks before reads are answered
//!   from the open file; drives that do not answer, past the layout's
//!   redundancy, fail a read with `EIO` at once, as always); what needs the
//!   manager waits: opens, names,
//!   attributes of files not open, a small file's first bytes (kept by the
//!   manager), a capability to renew, and a write's commit — at `close`,
//!   `fsync`, and a quarter into its write transaction's lease, after which
//!   further writes to the file wait for it. A transaction whose lease runs
//!   out during the outage (or that a restarted manager no longer has) is
//!   rolled back: the file's writes since its last commit are lost, and its
//!   next write, `fsync` or `close` fails with `EIO`. A request the manager
//!   had when it went away fails with `EIO` unless it only reads (then it is
//!   sent again once the manager is back): it may or may not have been done.
//! - **Mount points**: a directory that already is a mount point (a second
//!   mount of the same directory) is refused, and so is a non-empty one
//!   unless [`MountConfig::nonempty`] (its entries would be hidden).
//!   `ioctl` is answered `ENOTTY` without a log line.
//! - **Consistency** (AFS/NFS style): close-to-open for data — `close`
//!   commits a file's writes (`flush`), `open` asks the manager for fresh
//!   attributes and keeps the kernel's page cache only if the file's size and
//!   modification time are what they were when the cache was filled
//!   (`FOPEN_KEEP_CACHE`); attributes and names are cached by the kernel for
//!   at most [`MountConfig::attr_timeout`], the bound within which another
//!   mount's changes become visible here. Within that bound the manager's
//!   change feed (`WATCH`, AFS's callbacks turned into one long poll per
//!   mount) drops a changed inode's attributes and pages and a changed name
//!   from the kernel's caches as soon as the manager reports them
//!   ([`Mount::invalidations`] counts them).
//! - **Users**: a mount acts for the nasd user it logged in as (without
//!   `allow_other` the kernel lets only the mounting user in; with it, other
//!   local users get `EACCES` unless their uid is the nasd user's); with
//!   [`MountConfig::map_users`] each request acts for its local caller
//!   through the manager's gateway requests (`AS_USER`,
//!   `FsClient::as_user`), its supplementary groups read from
//!   `/proc/PID/status` (a caller whose groups cannot be read, or who has
//!   more than `GROUPS_MAX`, is refused rather than acting with fewer), and
//!   the kernel checks permissions too (`default_permissions`), since callers
//!   share the gateway's handles.
//! - **Sparse files**: `lseek` with `SEEK_DATA`/`SEEK_HOLE` goes to
//!   `File::seek` (`ENXIO` at the end or when only holes follow);
//!   `st_blocks` is what the data takes (`FileAttr::allocated` / 512).
//! - **What the kernel asks and nasd lacks**: `RENAME_EXCHANGE` and
//!   `RENAME_NOREPLACE` (`EINVAL`), `fallocate` modes other than 0
//!   (`EOPNOTSUPP`), POSIX ACLs (`system.` extended attributes:
//!   `EOPNOTSUPP`; nasd's own ACLs are `nasd acl`), file locks (the kernel's
//!   local locks only).
//! - **Open files in one mount share one [`nasd_fs::File`] per inode**, so a
//!   write through one descriptor is seen by a read through another at once
//!   (POSIX within one host), and two descriptors never hold two write
//!   transactions on one file (the manager lets one writer in at a time).
//! - **Unlinking an open file**: the manager destroys a file's data when its
//!   last name goes. A name removed (or replaced by `rename`) while its file
//!   is open in this mount is renamed instead to a hidden name
//!   (`.nasd-unlinked-…`, as NFS clients do) and removed at the last close, so
//!   programs here keep POSIX semantics. Another mount that has the file open
//!   loses its data at once (documented in `docs/SECURITY.md`).
//!
//! ```no_run
//! # async fn demo(fs: nasd_fs::FsClient) -> std::io::Result<()> {
//! let mut mount = nasd_fuse::Mount::start(fs, nasd_fuse::MountConfig::new("/mnt/nasd")).await?;
//! // ... the file system is at /mnt/nasd until:
//! mount.unmount()?;
//! mount.ended().await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod attr;
mod errno;
mod metrics;
mod ops;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use errno::errno_of;
pub use metrics::MountMetrics;
pub use nasd_fs::ManagerWait;

/// FUSE threads reading requests from the kernel by default. Each only
/// decodes a request and hands it to the runtime, so a few suffice.
pub const MOUNT_THREADS_DEFAULT: usize = 4;
/// Most FUSE threads a mount may be given.
pub const MOUNT_THREADS_MAX: usize = 64;
/// How long the kernel may keep attributes and names by default: the bound
/// within which a change made through another mount (or client) becomes
/// visible here without a close and open.
pub const ATTR_TIMEOUT_DEFAULT: Duration = nasd_vfs::ATTR_TIMEOUT_DEFAULT;
/// Longest attribute and name timeout a mount accepts.
pub const ATTR_TIMEOUT_MAX: Duration = nasd_vfs::ATTR_TTL_MAX;
/// Requests running at once; each holds at most one transfer (up to
/// [`MAX_WRITE_BYTES`]) of its own, so this bounds the mount's memory for
/// requests to about 256 MiB.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 256;
/// Name-space and attribute requests running at once, apart from the data
/// requests: each holds at most a name, an attribute reply, a directory page
/// or an extended attribute (64 KiB), so about 64 MiB in all; this many may
/// wait for a manager in an outage before the FUSE threads wait too.
pub const NAME_REQUESTS_IN_FLIGHT_MAX: usize = 1024;
/// The largest write the kernel sends in one request (it needs
/// `FUSE_MAX_PAGES`; older kernels send 128 KiB).
pub const MAX_WRITE_BYTES: u32 = 1024 * 1024;
/// Kernel read-ahead asked for.
pub const MAX_READAHEAD_BYTES: u32 = 1024 * 1024;
/// Open file descriptions (FUSE file handles) one mount keeps; more opens
/// fail with `ENFILE`.
pub const OPEN_FILES_MAX: usize = nasd_vfs::OPEN_FILES_MAX;
/// Open directory streams one mount keeps; more fail with `ENFILE`.
pub const OPEN_DIRS_MAX: usize = nasd_vfs::OPEN_DIRS_MAX;
/// `st_blksize` reported: the size `cp` and friends read and write in.
pub const BLOCK_SIZE_REPORTED: u32 = 1024 * 1024;

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Where the file system appears.
    pub mountpoint: PathBuf,
    /// Let every local user use the mount (FUSE `allow_other`; needs root, or
    /// `user_allow_other` in `/etc/fuse.conf`). Without
    /// [`map_users`](Self::map_users), requests of local users other than
    /// the one who mounted and the one whose uid is the nasd user's are
    /// refused with `EACCES`.
    pub allow_other: bool,
    /// Run every request as its local caller: its uid, gid and
    /// supplementary groups (read from `/proc`), through the manager's
    /// gateway requests (`AS_USER`), so the nasd user the mount logged in as
    /// must be a gateway whose grant covers the callers' ids (`nasd admin
    /// set-gateway`). The kernel then also checks permissions itself
    /// (`default_permissions`: search permission on every directory of a
    /// path, for each caller), since every caller shares the gateway's
    /// file handles.
    pub map_users: bool,
    /// FUSE threads ([`MOUNT_THREADS_DEFAULT`]; 1..=[`MOUNT_THREADS_MAX`]).
    pub threads: usize,
    /// How long the kernel may cache attributes and names (at most
    /// [`ATTR_TIMEOUT_MAX`]); see [`ATTR_TIMEOUT_DEFAULT`].
    pub attr_timeout: Duration,
    /// The source shown in `/proc/mounts`.
    pub fsname: String,
    /// How long a request waits for a manager that cannot be reached
    /// ([`ManagerWait::Hard`] by default: until it is back, interruptible;
    /// a bounded wait then fails with `EIO`).
    pub manager_wait: ManagerWait,
    /// Mount over a directory that has entries (they are hidden, not
    /// touched, until the mount ends); refused by default.
    pub nonempty: bool,
    /// What the mount counts ([`MountMetrics`]); whoever registers it
    /// serves it.
    pub metrics: MountMetrics,
}

impl MountConfig {
    /// The defaults, mounting at `mountpoint`.
    pub fn new(mountpoint: impl Into<PathBuf>) -> MountConfig {
        MountConfig {
            mountpoint: mountpoint.into(),
            allow_other: false,
            map_users: false,
            threads: MOUNT_THREADS_DEFAULT,
            attr_timeout: ATTR_TIMEOUT_DEFAULT,
            fsname: "nasd".into(),
            manager_wait: ManagerWait::Hard,
            nonempty: false,
            metrics: MountMetrics::new(),
        }
    }

    fn validate(&self) -> io::Result<()> {
        let invalid = |m: String| Err(io::Error::new(io::ErrorKind::InvalidInput, m));
        if self.threads == 0 || self.threads > MOUNT_THREADS_MAX {
            return invalid(format!("threads must be 1..={MOUNT_THREADS_MAX}"));
        }
        if self.attr_timeout > ATTR_TIMEOUT_MAX {
            return invalid(format!("the attribute timeout must be at most {} s", ATTR_TIMEOUT_MAX.as_secs()));
        }
        if self.fsname.is_empty() || self.fsname.contains([',', '\0', ' ']) {
            return invalid("the file-system name must be non-empty without ',', ' ' or NUL".into());
        }
        Ok(())
    }
}

/// A mounted nasd file system. Dropping it does not unmount: call
/// [`unmount`](Mount::unmount) (or run `fusermount3 -u MOUNTPOINT`), then
/// [`ended`](Mount::ended).
pub struct Mount {
    mountpoint: PathBuf,
    unmounter: std::sync::Mutex<fuser::SessionUnmounter>,
    done: Option<tokio::sync::oneshot::Receiver<io::Result<()>>>,
    state: Arc<ops::State>,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount").field("mountpoint", &self.mountpoint).finish_non_exhaustive()
    }
}

impl Mount {
    /// Mounts the file system `fs` is logged in to at `config.mountpoint`
    /// and serves it from threads of its own, handing each request to the
    /// current tokio runtime. Returns once the kernel has the mount.
    ///
    /// # Errors
    /// An invalid configuration; a mount point that is not a directory, is
    /// already a mount point (`AlreadyExists`), or has entries without
    /// [`MountConfig::nonempty`] (`DirectoryNotEmpty`); the root directory
    /// not reachable through the manager; or the kernel refusing the mount
    /// (no `/dev/fuse`, not allowed to mount, `allow_other` without the
    /// right).
    pub async fn start(fs: nasd_fs::FsClient, config: MountConfig) -> io::Result<Mount> {
        config.validate()?;
        check_mountpoint(&config.mountpoint, config.nonempty)?;
        // Takes a place in the change feed before the kernel can cache anything:
        // every change made after `start` returns reaches this mount.
        let layer = nasd_vfs::VfsConfig { attr_timeout: config.attr_timeout, follow_feed: true };
        let vfs = nasd_vfs::Vfs::start(fs, layer)
            .await
            .map_err(|e| io::Error::other(format!("cannot reach the root directory: {e}")))?;
        let runtime = tokio::runtime::Handle::current();
        let state = Arc::new(ops::State::new(vfs, runtime, &config));
        let options = fuser_config(&config);
        let fs = ops::NasdFs::new(state.clone());
        let mountpoint = config.mountpoint.clone();
        let mut session = tokio::task::spawn_blocking(move || fuser::Session::new(fs, &mountpoint, &options))
            .await
            .map_err(|e| io::Error::other(format!("mount task failed: {e}")))?
            .map_err(|e| io::Error::new(e.kind(), format!("cannot mount at {}: {e}", config.mountpoint.display())))?;
        state.set_notifier(session.notifier());
        let unmounter = session.unmount_callable();
        let (tx, done) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("nasd-fuse".into())
            .spawn(move || {
                let _ = tx.send(session.run());
            })
            .map_err(|e| io::Error::other(format!("cannot start the session thread: {e}")))?;
        Ok(Mount {
            mountpoint: config.mountpoint,
            unmounter: std::sync::Mutex::new(unmounter),
            done: Some(done),
            state,
        })
    }

    /// Where the file system is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Asks the kernel to unmount. If programs still use the file system
    /// (`EBUSY`) it is detached lazily: it leaves the name space at once and
    /// goes on serving what is open until that is closed. The session ends
    /// then; [`ended`](Mount::ended) returns.
    ///
    /// # Errors
    /// The kernel refused (already unmounted is not an error).
    pub fn unmount(&self) -> io::Result<()> {
        match self.unmounter.lock().unwrap_or_else(|p| p.into_inner()).unmount() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => detach(&self.mountpoint),
            other => other,
        }
    }

    /// Waits until the session ends (after [`unmount`](Mount::unmount), or
    /// `fusermount3 -u`), then removes what the mount still kept for files
    /// unlinked while open. Returns at once if it ended before.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves the mount as it was.
    pub async fn ended(&mut self) -> io::Result<()> {
        let Some(done) = self.done.as_mut() else { return Ok(()) };
        let result = done.await.unwrap_or_else(|_| Err(io::Error::other("the session thread ended abnormally")));
        self.done = None;
        self.state.vfs().stop_feed();
        self.state.vfs().remove_hidden().await;
        result
    }

    /// Requests answered so far and how many of them failed with an errno
    /// (for tests and diagnostics).
    pub fn counters(&self) -> (u64, u64) {
        self.state.counters()
    }

    /// Cache invalidations the change feed sent the kernel so far (for tests
    /// and diagnostics).
    pub fn invalidations(&self) -> u64 {
        self.state.vfs().invalidations()
    }

    /// Changes the feed reported that this mount made itself, and which it
    /// therefore did not invalidate (the kernel took them from the replies).
    pub fn own_changes_skipped(&self) -> u64 {
        self.state.vfs().own_changes_skipped()
    }
}

/// Refuses a mount point that would surprise: one that already is a mount
/// point (mounting again would stack a second mount on it), and a directory
/// with entries unless `nonempty` (the mount would hide them). Each message
/// says what to do instead. [`Mount::start`] checks this first; a program
/// may check before it logs in.
///
/// # Errors
/// `AlreadyExists` for a mount point, `DirectoryNotEmpty` for a directory
/// with entries, the error of reading the directory (not one, missing).
pub fn check_mountpoint(mountpoint: &Path, nonempty: bool) -> io::Result<()> {
    let absolute = std::path::absolute(mountpoint)?;
    let shown = mountpoint.display();
    // Looked up before anything touches the directory: a mount whose server is gone
    // answers every call with ENOTCONN.
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    let canonical = std::fs::canonicalize(&absolute).unwrap_or_else(|_| absolute.clone());
    if let Some(m) = mount_at(&table, &canonical).or_else(|| mount_at(&table, &absolute)) {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{shown} is already a mount point ({} from {}): a second mount would hide the first; \
                 unmount it first (`fusermount3 -u {shown}`, or `umount {shown}` as root) or choose another directory",
                m.fstype, m.source
            ),
        ));
    }
    let mut entries =
        std::fs::read_dir(&canonical).map_err(|e| io::Error::new(e.kind(), format!("cannot mount at {shown}: {e}")))?;
    if let Some(first) = entries.next() {
        if !nonempty {
            let first = first.map(|e| e.file_name().to_string_lossy().into_owned()).unwrap_or_default();
            return Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                format!(
                    "{shown} is not empty (it holds '{first}'…): the mount would hide what it holds until it ends; \
                     choose an empty directory, or mount over it anyway with `nasd mount --nonempty`"
                ),
            ));
        }
    }
    Ok(())
}

/// A mount as `/proc/self/mountinfo` lists it.
#[derive(Debug, PartialEq, Eq)]
struct MountEntry {
    fstype: String,
    source: String,
}

/// The mount on top at `point` in a `/proc/self/mountinfo` table: the last
/// line whose mount point (the fifth field, with spaces, tabs, newlines and
/// backslashes escaped in octal) is `point`; its file-system type and
/// source are the first two fields after the ` - ` separator.
fn mount_at(table: &str, point: &Path) -> Option<MountEntry> {
    use std::os::unix::ffi::OsStrExt;
    table.lines().rev().find_map(|line| {
        let (head, tail) = line.split_once(" - ")?;
        let field = head.split(' ').nth(4)?;
        if unescape_octal(field) != point.as_os_str().as_bytes() {
            return None;
        }
        let mut tail = tail.split(' ');
        let fstype = String::from_utf8_lossy(&unescape_octal(tail.next()?)).into_owned();
        let source = String::from_utf8_lossy(&unescape_octal(tail.next().unwrap_or("none"))).into_owned();
        Some(MountEntry { fstype, source })
    })
}

/// A mountinfo field with its `\NNN` octal escapes decoded.
fn unescape_octal(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// A lazy unmount: `umount2(MNT_DETACH)` as root, else `fusermount3 -u -z`.
fn detach(mountpoint: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a mount point with a NUL byte"))?;
    // SAFETY: a valid NUL-terminated path; umount2(2) touches nothing else.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let status = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(mountpoint).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("fusermount3 -u -z {} failed ({status})", mountpoint.display())))
    }
}

fn fuser_config(config: &MountConfig) -> fuser::Config {
    use fuser::MountOption;
    let mut options = fuser::Config::default();
    options.mount_options = vec![
        MountOption::FSName(config.fsname.clone()),
        MountOption::Subtype("nasd".into()),
        MountOption::RW,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::Exec,
        MountOption::Atime,
    ];
    if config.map_users {
        // Callers share the gateway's handles: the kernel checks each
        // caller's search permission along the path, the manager the rest.
        options.mount_options.push(MountOption::DefaultPermissions);
    }
    // Otherwise no DefaultPermissions: the manager checks every request itself.
    options.acl = if config.allow_other { fuser::SessionACL::All } else { fuser::SessionACL::Owner };
    options.n_threads = Some(config.threads);
    options.clone_fd = config.threads > 1;
    options
}

#[cfg(test)]
mod tests {
    use super::{mount_at, MountEntry};
    use std::path::Path;

    const TABLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
98 22 0:50 / /tmp/a\\040dir rw,nosuid,nodev,relatime shared:60 - fuse.nasd nasd:admin rw,user_id=0,group_id=0
99 98 0:51 / /tmp/a\\040dir rw,nosuid,nodev,relatime shared:61 - fuse.nasd nasd:alice rw,user_id=0,group_id=0
100 22 0:52 / /mnt/x rw,relatime - tmpfs none rw
";

    #[test]
    fn mounts_are_found_by_their_unescaped_mount_point_topmost_first() {
        let top = MountEntry { fstype: "fuse.nasd".into(), source: "nasd:alice".into() };
        assert_eq!(mount_at(TABLE, Path::new("/tmp/a dir")), Some(top));
        assert_eq!(
            mount_at(TABLE, Path::new("/mnt/x")),
            Some(MountEntry { fstype: "tmpfs".into(), source: "none".into() })
        );
        assert_eq!(mount_at(TABLE, Path::new("/tmp/a\\040dir")), None, "the escaped form is not the path");
        assert_eq!(mount_at(TABLE, Path::new("/tmp")), None);
        assert_eq!(mount_at("garbage line\n", Path::new("/")), None);
    }
}
