//! POSIX permission rules, pure functions of the caller and the inode.
//!
//! Every rule takes a `Caller`: uid, primary gid, at most `GROUPS_MAX`
//! supplementary groups, and the role it acts in (its identity credential's;
//! 0, none, for a password session). `Caller::in_group` (the gid or any
//! supplementary group) decides the group class of a check, whether
//! set-group-id survives a chmod, and which groups the owner may give a
//! file. New inodes take the primary gid (or a set-group-id directory's).
//! Every check goes through `acl::check`, which asks these mode rules first.

use crate::types::{Caller, Inode};
use nasd_proto::fs::{FileKind, FsStatus};

/// Read permission bit (in the `rwx` triple).
pub const R: u32 = 4;
/// Write permission bit.
pub const W: u32 = 2;
/// Execute / search permission bit.
pub const X: u32 = 1;

/// Set-user-id bit.
pub const S_ISUID: u32 = 0o4000;
/// Set-group-id bit.
pub const S_ISGID: u32 = 0o2000;
/// Sticky bit (restricted deletion in directories).
pub const S_ISVTX: u32 = 0o1000;

/// Checks by the mode bits alone (the ACL's base: `crate::acl::check` adds
/// the named entries) that `caller` holds every bit of `want` (a combination of [`R`],
/// [`W`], [`X`]) on `inode`: the owner's triple if the caller owns it, else the
/// group's if the caller is in the file's group (its gid or one of its
/// supplementary groups, [`Caller::in_group`]), else the others'. The superuser
/// bypasses read and write, and execute on directories; on other files it
/// needs some execute bit set.
pub fn check_mode(caller: &Caller, inode: &Inode, want: u32) -> Result<(), FsStatus> {
    let a = &inode.attr;
    if caller.is_root() {
        let needs_x = want & X != 0 && a.kind != FileKind::Dir;
        return if needs_x && a.mode & 0o111 == 0 { Err(FsStatus::PermissionDenied) } else { Ok(()) };
    }
    let shift = if caller.uid == a.uid {
        6
    } else if caller.in_group(a.gid) {
        3
    } else {
        0
    };
    let have = (a.mode >> shift) & 0o7;
    if have & want == want {
        Ok(())
    } else {
        Err(FsStatus::PermissionDenied)
    }
}

/// Whether the caller owns the inode or is the superuser.
pub fn owns(caller: &Caller, inode: &Inode) -> bool {
    caller.is_root() || caller.uid == inode.attr.uid
}

/// The sticky-bit rule: in a sticky directory only the owner of the entry,
/// the owner of the directory or the superuser may remove or rename it.
pub fn check_sticky(caller: &Caller, dir: &Inode, victim: &Inode) -> Result<(), FsStatus> {
    if dir.attr.mode & S_ISVTX == 0 || owns(caller, dir) || owns(caller, victim) {
        Ok(())
    } else {
        Err(FsStatus::NotPermitted)
    }
}

/// Clears set-group-id from `mode` when a non-root caller is not in group
/// `gid` (neither its primary nor a supplementary group).
pub fn strip_sgid(caller: &Caller, mode: u32, gid: u32) -> u32 {
    if !caller.is_root() && !caller.in_group(gid) {
        mode & !S_ISGID
    } else {
        mode
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nasd_proto::fs::FileAttr;

    fn inode(kind: FileKind, mode: u32) -> Inode {
        let attr = FileAttr {
            ino: 2,
            kind,
            mode,
            nlink: 1,
            uid: 10,
            gid: 20,
            size: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            rdev: 0,
            allocated: 0,
        };
        Inode {
            attr,
            target: None,
            layout: None,
            components: Vec::new(),
            acv: 0,
            qdir: 0,
            small_threshold: 0,
            site: 0,
            data_bytes: 0,
        }
    }

    #[test]
    fn root_needs_some_execute_bit_on_files_only() {
        let root = Caller::ROOT;
        assert_eq!(check_mode(&root, &inode(FileKind::File, 0o644), X), Err(FsStatus::PermissionDenied));
        assert_eq!(check_mode(&root, &inode(FileKind::File, 0o001), X), Ok(()));
        assert_eq!(check_mode(&root, &inode(FileKind::Dir, 0o000), X | R | W), Ok(()));
        assert_eq!(check_mode(&root, &inode(FileKind::File, 0o000), R | W), Ok(()));
    }

    #[test]
    fn classes_do_not_fall_through() {
        let f = inode(FileKind::File, 0o077);
        assert_eq!(check_mode(&Caller::new(10, 20), &f, R), Err(FsStatus::PermissionDenied));
        assert_eq!(check_mode(&Caller::new(11, 20), &f, R | W | X), Ok(()));
        assert_eq!(check_mode(&Caller::new(11, 21), &f, R | W | X), Ok(()));
        assert_eq!(check_mode(&Caller::new(11, 21), &inode(FileKind::File, 0o770), R), Err(FsStatus::PermissionDenied));
    }

    #[test]
    fn supplementary_groups_are_the_group_class() {
        let f = inode(FileKind::File, 0o640);
        let member = Caller { uid: 11, gid: 21, groups: vec![5, 20, 30], role: 0 };
        assert_eq!(check_mode(&member, &f, R), Ok(()), "group 20 is one of its supplementary groups");
        assert_eq!(check_mode(&member, &f, W), Err(FsStatus::PermissionDenied));
        let outsider = Caller { uid: 11, gid: 21, groups: vec![5, 30], role: 0 };
        assert_eq!(check_mode(&outsider, &f, R), Err(FsStatus::PermissionDenied));
        // Membership puts the caller in the group class, which can deny what others get.
        let g_denied = inode(FileKind::File, 0o604);
        assert_eq!(check_mode(&member, &g_denied, R), Err(FsStatus::PermissionDenied));
        assert_eq!(check_mode(&outsider, &g_denied, R), Ok(()));
        assert_eq!(strip_sgid(&member, 0o2755, 20), 0o2755, "in the group through a supplementary group");
        assert_eq!(strip_sgid(&outsider, 0o2755, 20), 0o755);
        assert_eq!(strip_sgid(&Caller::ROOT, 0o2755, 20), 0o2755);
    }

    #[test]
    fn sticky_rule() {
        let dir = inode(FileKind::Dir, 0o1777);
        let mut victim = inode(FileKind::File, 0o666);
        victim.attr.uid = 30;
        assert_eq!(check_sticky(&Caller::new(40, 0), &dir, &victim), Err(FsStatus::NotPermitted));
        assert_eq!(check_sticky(&Caller::new(30, 0), &dir, &victim), Ok(()));
        assert_eq!(check_sticky(&Caller::new(10, 0), &dir, &victim), Ok(()));
        assert_eq!(check_sticky(&Caller::ROOT, &dir, &victim), Ok(()));
        assert_eq!(check_sticky(&Caller::new(40, 0), &inode(FileKind::Dir, 0o777), &victim), Ok(()));
    }
}
