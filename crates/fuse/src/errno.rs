//! The one mapping from nasd errors to the errno a FUSE request answers with.

use fuser::Errno;
use nasd_fs::FsError;

/// The errno a failed `nasd-fs` call answers a FUSE request with: the
/// manager's status by its POSIX equivalent (`docs/PROTOCOL.md`, "Status
/// codes"), data unavailable past the layout's redundancy `EIO`, a drive or
/// every drive out of space `ENOSPC`, a write past what a layout holds
/// `EFBIG`, no manager reachable within the mount's wait `EIO`, a wait for
/// the manager interrupted by a signal `EINTR`.
pub fn errno_of(e: &FsError) -> i32 {
    e.errno()
}

/// The errno a failed file-system layer call answers with
/// ([`nasd_vfs::VfsError::errno`]: [`errno_of`] for the client library's
/// failures).
pub(crate) fn vfs_errno(e: &nasd_vfs::VfsError) -> Errno {
    Errno::from_i32(e.errno())
}

#[cfg(test)]
mod tests {
    use super::errno_of;
    use nasd_fs::{FsError, FsStatus};

    fn fs(status: FsStatus) -> FsError {
        FsError::Fs { status, message: String::new() }
    }

    #[test]
    fn statuses_map_to_their_posix_errno() {
        for (status, expect) in [
            (FsStatus::NotFound, libc::ENOENT),
            (FsStatus::Exists, libc::EEXIST),
            (FsStatus::NotDir, libc::ENOTDIR),
            (FsStatus::IsDir, libc::EISDIR),
            (FsStatus::NotEmpty, libc::ENOTEMPTY),
            (FsStatus::PermissionDenied, libc::EACCES),
            (FsStatus::NotPermitted, libc::EPERM),
            (FsStatus::InvalidName, libc::EINVAL),
            (FsStatus::NameTooLong, libc::ENAMETOOLONG),
            (FsStatus::SymlinkLoop, libc::ELOOP),
            (FsStatus::TooManyLinks, libc::EMLINK),
            (FsStatus::NoSpace, libc::ENOSPC),
            (FsStatus::BadHandle, libc::ESTALE),
            (FsStatus::Busy, libc::EAGAIN),
            (FsStatus::DriveUnavailable, libc::EIO),
            (FsStatus::NoXattr, libc::ENODATA),
            (FsStatus::NotSupported, libc::EOPNOTSUPP),
            (FsStatus::TooBig, libc::E2BIG),
            (FsStatus::QuotaExceeded, libc::EDQUOT),
            (FsStatus::CrossQuota, libc::EXDEV),
        ] {
            assert_eq!(errno_of(&fs(status)), expect, "{status:?}");
        }
        assert_eq!(errno_of(&FsError::Protocol("x".into())), libc::EIO);
        // An outage is an I/O error, never "invalid argument" (issue 23.1).
        assert_eq!(errno_of(&FsError::ManagerUnreachable { message: "x".into() }), libc::EIO);
        assert_eq!(errno_of(&FsError::Setup("x".into())), libc::EIO);
        assert_eq!(errno_of(&FsError::Interrupted { message: "x".into() }), libc::EINTR);
    }
}
