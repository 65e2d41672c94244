//! Extended attributes, Linux's rules over the manager's database: the
//! `user.` namespace (regular files and directories; reading needs read
//! permission, writing needs write permission, and in a sticky directory
//! only its owner writes), `trusted.` (the superuser only; others neither
//! see nor read them) and `security.` (anyone reads, the superuser writes).
//! Other namespaces (`system.` with its ACLs among them) are
//! `NOT_SUPPORTED`. Each inode holds at most [`XATTRS_PER_INODE_MAX`]
//! attributes and [`XATTR_BYTES_PER_INODE_MAX`] bytes of names and values.

use crate::acl::check;
use crate::backend::{Backend, Txn};
use crate::namespace::{get, now_ns};
use crate::perm::{owns, R, S_ISVTX, W};
use crate::types::{Caller, Inode};
use crate::Namespace;
use nasd_proto::fs::{FileKind, FsStatus, Ino, XATTRS_PER_INODE_MAX, XATTR_BYTES_PER_INODE_MAX, XATTR_NAME_MAX};
use nasd_proto::manager::XattrMode;

/// An attribute's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    User,
    Trusted,
    Security,
}

/// The namespace of `name`: `NOT_SUPPORTED` outside the three kept here,
/// `INVALID_ARGUMENT` for a bare prefix, a NUL or an overlong name.
fn class_of(name: &str) -> Result<Class, FsStatus> {
    if name.len() > XATTR_NAME_MAX {
        return Err(FsStatus::NameTooLong);
    }
    if name.contains('\0') {
        return Err(FsStatus::InvalidArgument);
    }
    let (class, rest) = if let Some(rest) = name.strip_prefix("user.") {
        (Class::User, rest)
    } else if let Some(rest) = name.strip_prefix("trusted.") {
        (Class::Trusted, rest)
    } else if let Some(rest) = name.strip_prefix("security.") {
        (Class::Security, rest)
    } else {
        return Err(FsStatus::NotSupported);
    };
    if rest.is_empty() {
        return Err(FsStatus::InvalidArgument);
    }
    Ok(class)
}

/// Linux's `xattr_permission`: may `caller` read (`write` false) or write
/// attribute class `class` of `n`? A refused read of what the caller may
/// not see is `NO_XATTR`, as on Linux.
fn permitted(t: &mut dyn Txn, caller: &Caller, n: &Inode, class: Class, write: bool) -> Result<(), FsStatus> {
    match class {
        Class::Trusted if !caller.is_root() => Err(if write { FsStatus::NotPermitted } else { FsStatus::NoXattr }),
        Class::Trusted => Ok(()),
        Class::Security if write && !caller.is_root() => Err(FsStatus::NotPermitted),
        Class::Security => Ok(()),
        Class::User => {
            if !matches!(n.attr.kind, FileKind::File | FileKind::Dir) {
                return Err(if write { FsStatus::NotPermitted } else { FsStatus::NoXattr });
            }
            let sticky_dir = n.attr.kind == FileKind::Dir && n.attr.mode & S_ISVTX != 0;
            if write && sticky_dir && !owns(caller, n) {
                return Err(FsStatus::NotPermitted);
            }
            check(t, caller, n, if write { W } else { R })
        }
    }
}

impl<B: Backend> Namespace<B> {
    /// The value of extended attribute `name` of `ino`.
    ///
    /// # Errors
    /// `NO_XATTR` (none, or one the caller may not see), `PERMISSION_DENIED`
    /// (a `user.` attribute of a file the caller may not read),
    /// `NOT_SUPPORTED`, `INVALID_ARGUMENT`, `NAME_TOO_LONG`, `NOT_FOUND`.
    pub fn getxattr(&self, caller: &Caller, ino: Ino, name: &str) -> Result<Vec<u8>, FsStatus> {
        let class = class_of(name)?;
        self.backend.read(|t| {
            let n = get(t, ino)?;
            permitted(t, caller, &n, class, false)?;
            t.get_xattr(ino, name)?.ok_or(FsStatus::NoXattr)
        })
    }

    /// The names of `ino`'s extended attributes the caller may see (all
    /// but `trusted.` ones for a caller other than the superuser), in byte
    /// order. Needs no permission on the file (as Linux's `listxattr`).
    ///
    /// # Errors
    /// `NOT_FOUND`.
    pub fn listxattr(&self, caller: &Caller, ino: Ino) -> Result<Vec<String>, FsStatus> {
        self.backend.read(|t| {
            get(t, ino)?;
            let names = t.list_xattrs(ino)?.into_iter().map(|(n, _)| n);
            Ok(names.filter(|n| caller.is_root() || !n.starts_with("trusted.")).collect())
        })
    }

    /// Sets extended attribute `name` of `ino` to `value` (ctime becomes
    /// now). Returns the inode.
    ///
    /// # Errors
    /// `EXISTS` (`XattrMode::Create` of one that exists), `NO_XATTR`
    /// (`XattrMode::Replace` of one that does not), `TOO_BIG` (the value
    /// over `XATTR_VALUE_MAX`, or the inode's attributes over their
    /// limits), `NOT_PERMITTED`, `PERMISSION_DENIED`, `NOT_SUPPORTED`,
    /// `INVALID_ARGUMENT`, `NAME_TOO_LONG`, `NOT_FOUND`.
    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: Ino,
        name: &str,
        value: &[u8],
        mode: XattrMode,
    ) -> Result<Inode, FsStatus> {
        let class = class_of(name)?;
        if value.len() > nasd_proto::fs::XATTR_VALUE_MAX {
            return Err(FsStatus::TooBig);
        }
        self.backend.transact(|t| {
            let mut n = get(t, ino)?;
            permitted(t, caller, &n, class, true)?;
            let all = t.list_xattrs(ino)?;
            let exists = all.iter().any(|(k, _)| k == name);
            match mode {
                XattrMode::Create if exists => return Err(FsStatus::Exists),
                XattrMode::Replace if !exists => return Err(FsStatus::NoXattr),
                _ => {}
            }
            let others = all.iter().filter(|(k, _)| k != name);
            let (count, bytes) = others.fold((1, name.len() + value.len()), |(c, b), (k, v)| (c + 1, b + k.len() + v));
            if count > XATTRS_PER_INODE_MAX || bytes > XATTR_BYTES_PER_INODE_MAX {
                return Err(FsStatus::TooBig);
            }
            t.put_xattr(ino, name, value)?;
            touch_ctime(t, &mut n)?;
            Ok(n)
        })
    }

    /// Removes extended attribute `name` of `ino` (ctime becomes now).
    /// Returns the inode.
    ///
    /// # Errors
    /// `NO_XATTR`, `NOT_PERMITTED`, `PERMISSION_DENIED`, `NOT_SUPPORTED`,
    /// `INVALID_ARGUMENT`, `NAME_TOO_LONG`, `NOT_FOUND`.
    pub fn removexattr(&self, caller: &Caller, ino: Ino, name: &str) -> Result<Inode, FsStatus> {
        let class = class_of(name)?;
        self.backend.transact(|t| {
            let mut n = get(t, ino)?;
            permitted(t, caller, &n, class, true)?;
            if !t.delete_xattr(ino, name)? {
                return Err(FsStatus::NoXattr);
            }
            touch_ctime(t, &mut n)?;
            Ok(n)
        })
    }
}

fn touch_ctime(t: &mut dyn Txn, n: &mut Inode) -> Result<(), FsStatus> {
    n.attr.ctime_ns = now_ns();
    crate::quotas::put(t, n)
}
