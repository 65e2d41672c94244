//! Directories whose every name this layer knows: the ones it made itself
//! (empty when made) and has seen every change of since, its own from its
//! requests and other clients' from the change feed. A lookup of a name
//! such a directory does not hold is answered "no such name" without the
//! manager (the kernel asks one before every create), for as long as the
//! change feed vouches for what it has not reported ([`Vfs::fed`]).
//!
//! The set of a directory is a superset of its names: a name goes in
//! before the request that makes it is sent (so a request whose outcome is
//! unknown leaves it in), and a name other clients made or removed goes in
//! when the feed reports it. A name leaves only when this layer removed it
//! and no other client's name change was reported while the removal was in
//! flight; else the directory is forgotten. So a name that exists is never
//! missing from a known directory's set, and an answer from the set is as
//! true as a negative entry the change feed keeps (the window is the feed's
//! delay, the same for both).
//!
//! Bounded: at most [`KNOWN_NAMES_MAX`] names in all; past it every
//! directory is forgotten (lookups then ask the manager again).

use nasd_fs::Ino;
use std::collections::{HashMap, HashSet};

/// Most names held for all known directories together (each a few tens of
/// bytes): past it, every directory is forgotten.
pub(crate) const KNOWN_NAMES_MAX: usize = 1 << 20;

/// The known directories and their names.
#[derive(Default)]
pub(crate) struct KnownDirs {
    dirs: HashMap<Ino, HashSet<String>>,
    names: usize,
}

impl KnownDirs {
    /// Directory `dir` was just made (empty) and no other client's name
    /// change was reported since its request went out: its names are known.
    pub fn made(&mut self, dir: Ino) {
        if let Some(old) = self.dirs.insert(dir, HashSet::new()) {
            self.names -= old.len();
        }
    }

    /// `name` may exist in `dir` (made by this layer's request about to go
    /// out, or by another client as the feed reported).
    pub fn add(&mut self, dir: Ino, name: &str) {
        let Some(names) = self.dirs.get_mut(&dir) else { return };
        if names.insert(name.to_string()) {
            self.names += 1;
            if self.names > KNOWN_NAMES_MAX {
                self.clear();
            }
        }
    }

    /// This layer removed `name` from `dir`; `undisturbed` if no other
    /// client's name change was reported while the removal was in flight
    /// (else such a change may have made the name again: `dir` is
    /// forgotten).
    pub fn removed(&mut self, dir: Ino, name: &str, undisturbed: bool) {
        if !undisturbed {
            self.forget(dir);
            return;
        }
        if let Some(names) = self.dirs.get_mut(&dir) {
            if names.remove(name) {
                self.names -= 1;
            }
        }
    }

    /// Whether `dir` is known and holds no `name`.
    pub fn absent(&self, dir: Ino, name: &str) -> bool {
        self.dirs.get(&dir).is_some_and(|names| !names.contains(name))
    }

    /// Stops answering for `dir`.
    pub fn forget(&mut self, dir: Ino) {
        if let Some(old) = self.dirs.remove(&dir) {
            self.names -= old.len();
        }
    }

    /// Stops answering for every directory (the change feed failed or lost changes).
    pub fn clear(&mut self) {
        self.dirs.clear();
        self.names = 0;
    }

    /// Known directories (tests, diagnostics).
    pub fn len(&self) -> usize {
        self.dirs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_directory_answers_for_the_names_it_does_not_hold() {
        let mut k = KnownDirs::default();
        assert!(!k.absent(5, "a"), "an unknown directory answers nothing");
        k.made(5);
        assert!(k.absent(5, "a"));
        k.add(5, "a");
        assert!(!k.absent(5, "a"), "a name about to be made is not absent");
        k.removed(5, "a", true);
        assert!(k.absent(5, "a"), "removed while no other client changed names");
        k.add(5, "b");
        k.removed(5, "b", false);
        assert!(!k.absent(5, "zzz"), "a removal disturbed by another client's change forgets the directory");
        assert_eq!(k.len(), 0);
    }

    #[test]
    fn names_are_bounded_in_all() {
        let mut k = KnownDirs::default();
        k.made(1);
        k.made(2);
        for i in 0..KNOWN_NAMES_MAX {
            k.add(1 + (i % 2) as Ino, &format!("n{i}"));
        }
        assert_eq!(k.len(), 2);
        assert_eq!(k.names, KNOWN_NAMES_MAX);
        k.add(1, "one-more");
        assert_eq!((k.len(), k.names), (0, 0), "past the bound every directory is forgotten");
        assert!(!k.absent(1, "x"));
    }

    #[test]
    fn forgetting_and_making_again_keeps_the_count() {
        let mut k = KnownDirs::default();
        k.made(3);
        k.add(3, "x");
        k.add(3, "x");
        assert_eq!(k.names, 1);
        k.made(3);
        assert_eq!(k.names, 0);
        k.add(3, "y");
        k.forget(3);
        assert_eq!(k.names, 0);
        k.removed(3, "y", true);
        assert_eq!(k.names, 0, "a removal in an unknown directory changes nothing");
    }
}
