//! nasd attributes as NFS shows them, and ACCESS's answer.

use nasd_fs::{FileAttr, FileKind, FsClient};
use nfs_rpc::nfs::{fattr3, ftype3, nfstime3, specdata3};
use nfs_rpc::Auth;

/// The file system id every handle of the gateway shows.
const FSID: u64 = 0x6e61_7364;

fn time(ns: i64) -> nfstime3 {
    let ns = ns.max(0);
    nfstime3 { seconds: (ns / 1_000_000_000) as u32, nseconds: (ns % 1_000_000_000) as u32 }
}

/// `attr` as `fattr3`.
pub fn fattr(attr: &FileAttr) -> fattr3 {
    let ftype = match attr.kind {
        FileKind::File => ftype3::NF3REG,
        FileKind::Dir => ftype3::NF3DIR,
        FileKind::Symlink => ftype3::NF3LNK,
        FileKind::Fifo => ftype3::NF3FIFO,
        FileKind::Socket => ftype3::NF3SOCK,
        FileKind::CharDevice => ftype3::NF3CHR,
        FileKind::BlockDevice => ftype3::NF3BLK,
    };
    fattr3 {
        ftype,
        mode: attr.mode & 0o7777,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        size: attr.size,
        used: attr.allocated,
        rdev: {
            let (major, minor) = split_dev(attr.rdev);
            specdata3 { specdata1: major, specdata2: minor }
        },
        fsid: FSID,
        fileid: attr.ino,
        atime: time(attr.atime_ns),
        mtime: time(attr.mtime_ns),
        ctime: time(attr.ctime_ns),
    }
}

/// A device number as the mount stores it (Linux's `new_encode_dev`) from
/// NFS's major and minor.
pub fn join_dev(major: u32, minor: u32) -> u64 {
    u64::from((minor & 0xff) | (major & 0xfff) << 8 | (minor & !0xff) << 12)
}

/// [`join_dev`]'s inverse: (major, minor).
pub fn split_dev(dev: u64) -> (u32, u32) {
    let dev = dev as u32;
    ((dev >> 8) & 0xfff, (dev & 0xff) | ((dev >> 12) & 0xfff00))
}

const ACCESS3_READ: u32 = 0x01;
const ACCESS3_LOOKUP: u32 = 0x02;
const ACCESS3_MODIFY: u32 = 0x04;
const ACCESS3_EXTEND: u32 = 0x08;
const ACCESS3_DELETE: u32 = 0x10;
const ACCESS3_EXECUTE: u32 = 0x20;

/// The ACCESS bits of `mask` the mode bits give the caller `cx` acts as (a
/// hint, as RFC 1813 allows: every operation is decided by the manager).
pub fn access(attr: &FileAttr, cx: &FsClient, auth: &Auth, mask: u32) -> u32 {
    let id = cx.identity();
    let groups: &[u32] = match auth {
        Auth::Sys { groups, .. } if id.uid != 0 || groups.is_empty() => groups,
        _ => &[],
    };
    let rwx = if id.uid == 0 {
        let x = attr.kind == FileKind::Dir || attr.mode & 0o111 != 0;
        if x {
            7
        } else {
            6
        }
    } else if attr.uid == id.uid {
        (attr.mode >> 6) & 7
    } else if attr.gid == id.gid || groups.contains(&attr.gid) {
        (attr.mode >> 3) & 7
    } else {
        attr.mode & 7
    };
    let mut granted = 0;
    if rwx & 4 != 0 {
        granted |= ACCESS3_READ;
    }
    if rwx & 2 != 0 {
        granted |= ACCESS3_MODIFY | ACCESS3_EXTEND;
        if attr.kind == FileKind::Dir {
            granted |= ACCESS3_DELETE;
        }
    }
    if rwx & 1 != 0 {
        granted |= if attr.kind == FileKind::Dir { ACCESS3_LOOKUP } else { ACCESS3_EXECUTE };
    }
    granted & mask
}

#[cfg(test)]
mod tests {
    #[test]
    fn device_numbers_round_trip_as_linux_encodes_them() {
        for (major, minor) in [(0, 0), (1, 3), (8, 17), (259, 70_000), (4095, 0xfffff)] {
            assert_eq!(super::split_dev(super::join_dev(major, minor)), (major, minor));
        }
        assert_eq!(super::join_dev(8, 1), 0x801, "sda1 as stat(2) shows it");
    }
}
