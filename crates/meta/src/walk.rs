//! Path resolution.

use crate::acl::check;
use crate::backend::{Backend, Txn};
use crate::namespace::{child, get};
use crate::perm::X;
use crate::types::{Caller, Inode};
use crate::Namespace;
use nasd_proto::fs::*;

/// The state of one resolution: the directory reached so far, the
/// components still to resolve (next last), and the links followed.
struct Walk<'a> {
    caller: &'a Caller,
    cur: Inode,
    todo: Vec<String>,
    followed: usize,
}

/// Pushes the components of `path` so the first one is resolved next. A
/// trailing slash becomes a final `.`, so the last name must be a directory.
fn push_components(todo: &mut Vec<String>, path: &str) {
    if path.ends_with('/') && !path.trim_matches('/').is_empty() {
        todo.push(".".to_owned());
    }
    todo.extend(path.split('/').rev().filter(|c| !c.is_empty()).map(str::to_owned));
}

impl Walk<'_> {
    /// Resolves the next component.
    fn step(&mut self, t: &mut dyn Txn, follow_final: bool) -> Result<(), FsStatus> {
        let name = self.todo.pop().expect("step with nothing to do");
        if self.cur.attr.kind != FileKind::Dir {
            return Err(FsStatus::NotDir);
        }
        check(t, self.caller, &self.cur, X)?;
        let next = match name.as_str() {
            "." => return Ok(()),
            ".." => {
                let up = t.dir_parent(self.cur.attr.ino)?.expect("directory without a parent pointer");
                get(t, up)?
            }
            _ => {
                validate_name(&name)?;
                child(t, self.cur.attr.ino, &name)?.ok_or(FsStatus::NotFound)?
            }
        };
        let follow = !self.todo.is_empty() || follow_final;
        match next.target.as_deref() {
            Some(target) if follow && next.attr.kind == FileKind::Symlink => self.follow(t, target),
            _ => {
                self.cur = next;
                Ok(())
            }
        }
    }

    /// Continues through a symbolic link's target: absolute targets from the
    /// root, relative ones from the directory holding the link.
    fn follow(&mut self, t: &mut dyn Txn, target: &str) -> Result<(), FsStatus> {
        self.followed += 1;
        if self.followed > SYMLINK_FOLLOW_MAX {
            return Err(FsStatus::SymlinkLoop);
        }
        if target.starts_with('/') {
            self.cur = get(t, ROOT_INO)?;
        }
        push_components(&mut self.todo, target);
        Ok(())
    }
}

impl<B: Backend> Namespace<B> {
    /// Resolves an absolute path (`/` is the root; repeated slashes are
    /// fine; `.` and `..` go by the directories' parent pointers, `..` of the
    /// root is the root). Intermediate symbolic links are followed (absolute
    /// targets from the root, relative ones from the containing directory),
    /// at most [`SYMLINK_FOLLOW_MAX`] in all; the final component is followed
    /// only if `follow_final`. A trailing slash requires a directory (and
    /// follows a final link). Search (x) permission is needed on every
    /// directory searched.
    ///
    /// # Errors
    /// `InvalidArgument` (not absolute), `NameTooLong` (longer than
    /// [`PATH_MAX`] or a component longer than a name may be), `NotFound`,
    /// `NotDir`, `PermissionDenied`, `SymlinkLoop`.
    pub fn walk(&self, caller: &Caller, path: &str, follow_final: bool) -> Result<Inode, FsStatus> {
        if !path.starts_with('/') {
            return Err(FsStatus::InvalidArgument);
        }
        if path.len() > PATH_MAX {
            return Err(FsStatus::NameTooLong);
        }
        self.backend.read(|t| {
            let mut w = Walk { caller, cur: get(t, ROOT_INO)?, todo: Vec::new(), followed: 0 };
            push_components(&mut w.todo, path);
            // Each step consumes a component; each of at most
            // SYMLINK_FOLLOW_MAX links adds at most SYMLINK_TARGET_MAX / 2 + 1.
            while !w.todo.is_empty() {
                w.step(t, follow_final)?;
            }
            Ok(w.cur)
        })
    }
}
