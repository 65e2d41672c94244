//! nasd attributes as the kernel takes them.

use crate::BLOCK_SIZE_REPORTED;
use fuser::{FileType, INodeNo};
use nasd_fs::{FileAttr, FileKind};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Inode numbers are never reused within a file system (the manager's
/// counter commits with the inode), so one generation number serves all.
pub(crate) const GENERATION: fuser::Generation = fuser::Generation(1);

/// The kernel's file type of a nasd kind.
pub(crate) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

/// Nanoseconds since the epoch (negative before it) as a time.
pub(crate) fn time(ns: i64) -> SystemTime {
    let magnitude = Duration::from_nanos(ns.unsigned_abs());
    if ns >= 0 {
        UNIX_EPOCH.checked_add(magnitude).unwrap_or(UNIX_EPOCH)
    } else {
        UNIX_EPOCH.checked_sub(magnitude).unwrap_or(UNIX_EPOCH)
    }
}

/// A time as nanoseconds since the epoch, saturating at `i64`'s range.
pub(crate) fn nanos(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

/// The kernel's attributes of a nasd inode (as the file-system layer shows
/// them: a hidden name of a file unlinked while open is not counted).
pub(crate) fn to_kernel(attr: &FileAttr) -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        // What the data takes (holes cost nothing), as the manager measured it.
        blocks: attr.allocated.div_ceil(512),
        atime: time(attr.atime_ns),
        mtime: time(attr.mtime_ns),
        ctime: time(attr.ctime_ns),
        crtime: time(attr.ctime_ns),
        kind: file_type(attr.kind),
        perm: (attr.mode & 0o7777) as u16,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        // The kernel's encoding, as it sent it with MKNOD (FUSE carries 32 bits).
        rdev: u32::try_from(attr.rdev).unwrap_or(0),
        blksize: BLOCK_SIZE_REPORTED,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::{nanos, time};

    #[test]
    fn times_round_trip_both_sides_of_the_epoch() {
        for ns in [0, 1, 1_700_000_000_123_456_789, -1, -86_400_000_000_000] {
            assert_eq!(nanos(time(ns)), ns);
        }
    }
}
