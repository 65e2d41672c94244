//! The file-system layer's vocabulary: what a file manager says about names,
//! files and where their bytes live. Shared by the manager protocol
//! ([`crate::manager`]) and the metadata store.

use crate::codec::{Reader, Writer};
use crate::DecodeError;

/// An inode number. Never reused within a file system (one metadata
/// database): the counter that hands them out commits with the inode.
pub type Ino = u64;

/// The root directory's inode number.
pub const ROOT_INO: Ino = 1;

/// Longest name of a directory entry, in bytes (POSIX `NAME_MAX`).
pub const FILE_NAME_MAX: usize = 255;
/// Longest path a client may send, in bytes (POSIX `PATH_MAX`).
pub const PATH_MAX: usize = 4096;
/// Longest symbolic-link target, in bytes.
pub const SYMLINK_TARGET_MAX: usize = 4096;
/// Most symbolic links followed while resolving one path (POSIX `SYMLOOP_MAX`).
pub const SYMLINK_FOLLOW_MAX: usize = 40;
/// Most hard links to one file.
pub const LINK_COUNT_MAX: u32 = 65_000;
/// Permission bits a mode may carry (`rwx` for user, group, other, plus
/// set-uid, set-gid and sticky).
pub const MODE_MASK: u32 = 0o7777;
/// Most supplementary groups of one caller (Linux's historical `NGROUPS`):
/// a user's in the users table, and what a gateway may claim for the user
/// it acts for. 4 bytes each on the wire; every permission check scans
/// them. A caller with more is refused rather than cut short: dropping a
/// group can grant access, not only take it (a mode such as `0604` denies
/// the group what it gives everyone else).
pub const GROUPS_MAX: usize = 32;

/// Longest extended-attribute name, with its namespace prefix (Linux
/// `XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended-attribute value, in bytes (Linux `XATTR_SIZE_MAX`).
pub const XATTR_VALUE_MAX: usize = 65_536;
/// Most extended attributes one inode carries.
pub const XATTRS_PER_INODE_MAX: usize = 128;
/// Most bytes of extended-attribute names and values one inode carries
/// (the manager keeps them in its database).
pub const XATTR_BYTES_PER_INODE_MAX: usize = 256 * 1024;

/// Checks a list of supplementary group ids: at most [`GROUPS_MAX`],
/// strictly ascending (so each id once, in the one canonical order).
pub fn validate_groups(groups: &[u32]) -> Result<(), &'static str> {
    if groups.len() > GROUPS_MAX {
        return Err("more than GROUPS_MAX supplementary groups");
    }
    if groups.windows(2).any(|w| w[0] >= w[1]) {
        return Err("supplementary groups must be strictly ascending");
    }
    Ok(())
}

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FileKind {
    /// A regular file: its bytes live in a drive object.
    File = 1,
    /// A directory.
    Dir = 2,
    /// A symbolic link: its target lives in the manager.
    Symlink = 3,
    /// A named pipe (FIFO): an inode only; its bytes pass through the
    /// kernel of the host that opens it.
    Fifo = 4,
    /// A UNIX-domain socket's name: an inode only.
    Socket = 5,
    /// A character device: an inode with a device number ([`FileAttr::rdev`]).
    CharDevice = 6,
    /// A block device: an inode with a device number.
    BlockDevice = 7,
}

impl FileKind {
    /// The wire byte.
    pub fn code(self) -> u8 {
        self as u8
    }
    /// Parses the wire byte.
    pub fn from_code(code: u8) -> Result<Self, DecodeError> {
        match code {
            1 => Ok(FileKind::File),
            2 => Ok(FileKind::Dir),
            3 => Ok(FileKind::Symlink),
            4 => Ok(FileKind::Fifo),
            5 => Ok(FileKind::Socket),
            6 => Ok(FileKind::CharDevice),
            7 => Ok(FileKind::BlockDevice),
            _ => Err(DecodeError::NotCanonical("unknown file kind")),
        }
    }

    /// A special file: a FIFO, a socket or a device (an inode with no data,
    /// made by `MKNOD`).
    pub fn is_special(self) -> bool {
        matches!(self, FileKind::Fifo | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice)
    }

    /// A device, which has a device number.
    pub fn is_device(self) -> bool {
        matches!(self, FileKind::CharDevice | FileKind::BlockDevice)
    }
}

/// Where a regular file's bytes live: one object on one drive.
///
/// Drives are named by the manager's drive number (its index in the drive
/// table, `nasd_meta`); the client learns each drive's address
/// and identity with the capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    /// The manager's number for the drive.
    pub drive: u32,
    /// The partition on that drive.
    pub partition: u64,
    /// The object.
    pub object: u64,
}

impl ObjectRef {
    /// Encoded length.
    pub const LEN: usize = 20;
    /// Appends the canonical encoding.
    pub fn encode(&self, w: &mut Writer) {
        w.u32(self.drive).u64(self.partition).u64(self.object);
    }
    /// Reads the canonical encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(ObjectRef { drive: r.u32()?, partition: r.u64()?, object: r.u64()? })
    }
}

/// The attributes of an inode as the manager keeps them (POSIX `stat`).
///
/// `size` and `mtime_ns` of a regular file are the manager's copy as of the
/// last close of a writer; the drive object's attributes are authoritative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileAttr {
    /// Inode number.
    pub ino: Ino,
    /// What it is.
    pub kind: FileKind,
    /// Permission bits (within [`MODE_MASK`]).
    pub mode: u32,
    /// Number of directory entries naming it (directories: 2 + subdirectories).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Length in bytes (symlinks: target length; directories: entry count).
    pub size: u64,
    /// Last access, nanoseconds since the Unix epoch.
    pub atime_ns: i64,
    /// Last data change.
    pub mtime_ns: i64,
    /// Last attribute change.
    pub ctime_ns: i64,
    /// A device's number (Linux `dev_t` encoding); 0 for every other kind.
    pub rdev: u64,
    /// Bytes of storage the inode's data takes (`st_blocks` × 512): for a
    /// regular file, what its data components store — one copy of each
    /// column, parity not counted, holes not at all — as the manager last
    /// measured it, plus its bytes below the small-file threshold; what a
    /// quota counts. For every other kind, its `size`.
    pub allocated: u64,
}

impl FileAttr {
    /// Encoded length.
    pub const LEN: usize = 8 + 1 + 4 * 4 + 8 * 6;

    /// Appends the canonical encoding.
    pub fn encode(&self, w: &mut Writer) {
        w.u64(self.ino).u8(self.kind.code()).u32(self.mode).u32(self.nlink).u32(self.uid).u32(self.gid);
        w.u64(self.size).u64(self.atime_ns as u64).u64(self.mtime_ns as u64).u64(self.ctime_ns as u64);
        w.u64(self.rdev).u64(self.allocated);
    }

    /// Reads the canonical encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let ino = r.u64()?;
        let kind = FileKind::from_code(r.u8()?)?;
        let mode = r.u32()?;
        if mode & !MODE_MASK != 0 {
            return Err(DecodeError::NotCanonical("mode has bits outside 0o7777"));
        }
        let attr = FileAttr {
            ino,
            kind,
            mode,
            nlink: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            size: r.u64()?,
            atime_ns: r.u64()? as i64,
            mtime_ns: r.u64()? as i64,
            ctime_ns: r.u64()? as i64,
            rdev: r.u64()?,
            allocated: r.u64()?,
        };
        if attr.rdev != 0 && !kind.is_device() {
            return Err(DecodeError::NotCanonical("a device number on an inode that is not a device"));
        }
        Ok(attr)
    }
}

/// Checks a directory-entry name: 1..=[`FILE_NAME_MAX`] bytes, no `/` or NUL,
/// not `.` or `..`.
pub fn validate_name(name: &str) -> Result<(), FsStatus> {
    if name.is_empty() || name == "." || name == ".." || name.bytes().any(|b| b == b'/' || b == 0) {
        return Err(FsStatus::InvalidName);
    }
    if name.len() > FILE_NAME_MAX {
        return Err(FsStatus::NameTooLong);
    }
    Ok(())
}

/// Why a file-system operation failed. Each has a POSIX `errno` equivalent
/// ([`FsStatus::errno`]) so a FUSE or NFS front end can pass it on unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum FsStatus {
    /// Success.
    Ok = 0,
    /// No such file or directory.
    NotFound = 1,
    /// The name already exists.
    Exists = 2,
    /// A path component, or the target, is not a directory.
    NotDir = 3,
    /// The target is a directory.
    IsDir = 4,
    /// The directory is not empty.
    NotEmpty = 5,
    /// The caller's permission bits do not allow it.
    PermissionDenied = 6,
    /// Only the owner (or the superuser) may do it.
    NotPermitted = 7,
    /// The name is empty, `.`, `..`, or holds `/` or NUL.
    InvalidName = 8,
    /// The name or path is too long.
    NameTooLong = 9,
    /// Too many symbolic links while resolving a path.
    SymlinkLoop = 10,
    /// A rename would move a directory under itself.
    InvalidMove = 11,
    /// Too many hard links.
    TooManyLinks = 12,
    /// No drive has room or an object to give.
    NoSpace = 13,
    /// An argument is out of range or inconsistent.
    InvalidArgument = 14,
    /// The user name or password is wrong.
    BadCredentials = 15,
    /// The request needs a logged-in session.
    NotLoggedIn = 16,
    /// The request needs an administrator.
    NotAdmin = 17,
    /// A drive the operation needs did not answer or refused; the name
    /// space change (if any) is committed and will be finished in the
    /// background.
    DriveUnavailable = 18,
    /// The request could not be decoded or breaks a protocol limit.
    BadRequest = 19,
    /// The manager is overloaded or shutting down; retry.
    Busy = 20,
    /// The metadata store failed.
    Internal = 21,
    /// A file handle's MAC does not check: forged, altered, handed to
    /// another user, or from another file system.
    BadHandle = 22,
    /// A directory would lie deeper below the root than the manager's
    /// limit (`DIR_DEPTH_MAX`), deeper than any path could name.
    TooDeep = 23,
    /// The write transaction was aborted (its lease ran out, or the file
    /// was removed): the writes made under it since the last commit are
    /// rolled back on every drive.
    Aborted = 24,
    /// The extended attribute does not exist (`ENODATA`).
    NoXattr = 25,
    /// Not supported by this file system (`EOPNOTSUPP`): an extended
    /// attribute outside the `user.`, `trusted.` and `security.` namespaces.
    NotSupported = 26,
    /// A value or list over its limit (`E2BIG`): an extended attribute
    /// larger than `XATTR_VALUE_MAX`, or an inode's over
    /// `XATTRS_PER_INODE_MAX` / `XATTR_BYTES_PER_INODE_MAX`.
    TooBig = 27,
    /// A user or directory quota would be exceeded (`EDQUOT`).
    QuotaExceeded = 28,
    /// The operation would move a file between quota trees (`EXDEV`): a
    /// rename or link across a directory quota's boundary.
    CrossQuota = 29,
    /// The session routes by an older routing table than the manager holds
    /// (or a `SET_ROUTING` was not the next version): the request was not
    /// carried out; fetch the table (`GET_ROUTING`) and send it again.
    StaleRouting = 30,
    /// The manager cannot reach its metadata database (an outage): the
    /// request changed nothing; send it again once the database is back.
    MetadataUnavailable = 31,
}

impl FsStatus {
    /// Every status, in code order.
    pub const ALL: [FsStatus; 32] = [
        FsStatus::Ok,
        FsStatus::NotFound,
        FsStatus::Exists,
        FsStatus::NotDir,
        FsStatus::IsDir,
        FsStatus::NotEmpty,
        FsStatus::PermissionDenied,
        FsStatus::NotPermitted,
        FsStatus::InvalidName,
        FsStatus::NameTooLong,
        FsStatus::SymlinkLoop,
        FsStatus::InvalidMove,
        FsStatus::TooManyLinks,
        FsStatus::NoSpace,
        FsStatus::InvalidArgument,
        FsStatus::BadCredentials,
        FsStatus::NotLoggedIn,
        FsStatus::NotAdmin,
        FsStatus::DriveUnavailable,
        FsStatus::BadRequest,
        FsStatus::Busy,
        FsStatus::Internal,
        FsStatus::BadHandle,
        FsStatus::TooDeep,
        FsStatus::Aborted,
        FsStatus::NoXattr,
        FsStatus::NotSupported,
        FsStatus::TooBig,
        FsStatus::QuotaExceeded,
        FsStatus::CrossQuota,
        FsStatus::StaleRouting,
        FsStatus::MetadataUnavailable,
    ];

    /// The wire code.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// Parses a wire code.
    pub fn from_code(code: u16) -> Result<Self, DecodeError> {
        FsStatus::ALL.get(code as usize).copied().ok_or(DecodeError::NotCanonical("unknown file-system status"))
    }

    /// The POSIX `errno` value (Linux numbering).
    pub fn errno(self) -> i32 {
        match self {
            FsStatus::Ok => 0,
            FsStatus::NotFound => 2,
            FsStatus::Exists => 17,
            FsStatus::NotDir => 20,
            FsStatus::IsDir => 21,
            FsStatus::NotEmpty => 39,
            FsStatus::PermissionDenied | FsStatus::BadCredentials | FsStatus::NotLoggedIn => 13,
            FsStatus::NotPermitted | FsStatus::NotAdmin => 1,
            FsStatus::InvalidName | FsStatus::InvalidMove | FsStatus::InvalidArgument | FsStatus::BadRequest => 22,
            FsStatus::NameTooLong | FsStatus::TooDeep => 36,
            FsStatus::SymlinkLoop => 40,
            FsStatus::TooManyLinks => 31,
            FsStatus::NoSpace => 28,
            FsStatus::DriveUnavailable | FsStatus::Internal | FsStatus::Aborted => 5,
            FsStatus::Busy | FsStatus::StaleRouting | FsStatus::MetadataUnavailable => 11,
            FsStatus::BadHandle => 116,
            FsStatus::NoXattr => 61,
            FsStatus::NotSupported => 95,
            FsStatus::TooBig => 7,
            FsStatus::QuotaExceeded => 122,
            FsStatus::CrossQuota => 18,
        }
    }

    /// A short human description.
    pub fn describe(self) -> &'static str {
        match self {
            FsStatus::Ok => "success",
            FsStatus::NotFound => "no such file or directory",
            FsStatus::Exists => "file exists",
            FsStatus::NotDir => "not a directory",
            FsStatus::IsDir => "is a directory",
            FsStatus::NotEmpty => "directory not empty",
            FsStatus::PermissionDenied => "permission denied",
            FsStatus::NotPermitted => "operation not permitted (owner or administrator only)",
            FsStatus::InvalidName => "invalid file name",
            FsStatus::NameTooLong => "file name too long",
            FsStatus::SymlinkLoop => "too many levels of symbolic links",
            FsStatus::InvalidMove => "cannot move a directory into itself",
            FsStatus::TooManyLinks => "too many links",
            FsStatus::NoSpace => "no space left on the drives",
            FsStatus::InvalidArgument => "invalid argument",
            FsStatus::BadCredentials => "wrong user name or password",
            FsStatus::NotLoggedIn => "not logged in",
            FsStatus::NotAdmin => "administrator only",
            FsStatus::DriveUnavailable => "a drive did not answer; the change will be finished in the background",
            FsStatus::BadRequest => "malformed request",
            FsStatus::Busy => "manager busy; retry",
            FsStatus::Internal => "manager metadata store failed",
            FsStatus::BadHandle => "file handle not valid for this user",
            FsStatus::TooDeep => "directories nested too deep (DIR_DEPTH_MAX)",
            FsStatus::Aborted => "the write transaction was aborted; writes since the last commit are rolled back",
            FsStatus::NoXattr => "no such extended attribute",
            FsStatus::NotSupported => "not supported",
            FsStatus::TooBig => "value too large",
            FsStatus::QuotaExceeded => "quota exceeded",
            FsStatus::CrossQuota => "cannot move or link a file across a directory quota's boundary",
            FsStatus::StaleRouting => "the routing table changed; fetch it and retry",
            FsStatus::MetadataUnavailable => "the manager's metadata database cannot be reached; nothing was changed",
        }
    }
}

impl std::fmt::Display for FsStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

impl std::error::Error for FsStatus {}
