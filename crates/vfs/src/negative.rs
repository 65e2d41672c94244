//! Names this layer knows are absent: the manager answered a lookup of
//! one `NOT_FOUND`, and a lookup of it again is answered "no such name"
//! without the manager (a gateway without the kernel's negative entries,
//! or a kernel that dropped its own).
//!
//! What keeps an answer true (the change feed's promise, the same one the
//! gateway's own negative entries rest on):
//! - an answer is taken in only while the change feed is live, and only if
//!   the feed reported no other client's change and had no gap while the
//!   lookup that brought it was out ([`Negatives::generation`], read
//!   before the request is sent and checked under the table's lock);
//! - any change the feed reports for a directory (a name in it, or its own
//!   attributes) from another client drops every absent name of it;
//! - a gap in the feed (it failed, reconnected, lost changes, or was
//!   stopped) drops everything;
//! - this layer's own requests that make a name (create, mknod, mkdir,
//!   symlink, link, rename, its hidden names) take that name out *before*
//!   they are sent, so an outcome that is not known (a lost reply) leaves
//!   it to the manager.
//!
//! Bounded: at most [`NEGATIVE_ENTRIES_MAX`] directories and names in all;
//! past it everything is dropped (lookups then ask the manager again).
//! Answers are given only for names [`nasd_proto::fs::validate_name`]
//! accepts (the manager's own check, so a name too long still gets
//! `NameTooLong` from it), to callers the held attributes show may search
//! the directory, while the feed's connection is open with nothing unread
//! on it and the client knows of no manager outage (see
//! [`crate::Vfs::lookup`]).

use nasd_fs::Ino;
use std::collections::{HashMap, HashSet};

/// Most directories and names the table holds together (each up to
/// [`nasd_proto::fs::FILE_NAME_MAX`] bytes of name and ~100 bytes of
/// table: ~23 MiB at most); past it everything is dropped.
pub(crate) const NEGATIVE_ENTRIES_MAX: usize = 65_536;

/// Names the manager answered `NOT_FOUND` for, in one directory.
#[derive(Default)]
struct DirNames {
    absent: HashSet<String>,
}

impl DirNames {
    fn entries(&self) -> usize {
        1 + self.absent.len()
    }
}

/// The table of absent names (see the module doc).
#[derive(Default)]
pub(crate) struct Negatives {
    dirs: HashMap<Ino, DirNames>,
    /// Directories and names held, against [`NEGATIVE_ENTRIES_MAX`].
    entries: usize,
    /// Moves at every change of another client the feed reports and at
    /// every gap: knowledge brought by a request sent at another
    /// generation is not taken in.
    generation: u64,
}

impl Negatives {
    /// The generation to read before a request whose answer may be taken in.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether `name` is known absent from `dir`.
    pub fn absent(&self, dir: Ino, name: &str) -> bool {
        self.dirs.get(&dir).is_some_and(|d| d.absent.contains(name))
    }

    /// The manager answered `NOT_FOUND` for `name` in `dir`, to a request
    /// sent at `generation`.
    pub fn found_absent(&mut self, dir: Ino, name: &str, generation: u64) {
        if generation != self.generation {
            return;
        }
        let new_dir = !self.dirs.contains_key(&dir);
        let d = self.dirs.entry(dir).or_default();
        let added = d.absent.insert(name.to_string());
        self.entries += usize::from(new_dir) + usize::from(added);
        self.bound();
    }

    /// `name` in `dir` may exist from now on: a request of this layer that
    /// makes it is about to be sent.
    pub fn may_exist(&mut self, dir: Ino, name: &str) {
        let Some(d) = self.dirs.get_mut(&dir) else { return };
        if d.absent.remove(name) {
            self.entries -= 1;
        }
    }

    /// Another client changed `dir` (a name in it, or its attributes):
    /// nothing about it is known any more.
    pub fn changed(&mut self, dir: Ino) {
        self.generation += 1;
        self.forget(dir);
    }

    /// The feed had a gap: nothing is known any more.
    pub fn clear(&mut self) {
        self.generation += 1;
        self.dirs.clear();
        self.entries = 0;
    }

    fn forget(&mut self, dir: Ino) {
        if let Some(d) = self.dirs.remove(&dir) {
            self.entries -= d.entries();
        }
    }

    fn bound(&mut self) {
        if self.entries > NEGATIVE_ENTRIES_MAX {
            self.clear();
        }
    }

    /// Directories and names held (tests, diagnostics).
    pub fn len(&self) -> usize {
        self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_name_is_known_until_this_layer_makes_it_or_another_client_changes_its_directory() {
        let mut n = Negatives::default();
        assert!(!n.absent(5, "a"), "nothing is known at first");
        let g = n.generation();
        n.found_absent(5, "a", g);
        assert!(n.absent(5, "a"));
        assert!(!n.absent(5, "b"), "only the name asked about");
        n.may_exist(5, "a");
        assert!(!n.absent(5, "a"), "a name about to be made is not absent");
        n.found_absent(5, "a", g);
        n.changed(5);
        assert!(!n.absent(5, "a"), "another client's change drops the directory");
        n.found_absent(5, "a", g);
        assert!(!n.absent(5, "a"), "an answer to a request sent before the change is not taken in");
        assert_eq!(n.len(), 0);
    }

    #[test]
    fn a_gap_in_the_feed_drops_everything_and_what_was_asked_before_it() {
        let mut n = Negatives::default();
        let g = n.generation();
        n.found_absent(7, "y", g);
        n.changed(8);
        assert!(!n.absent(7, "z"));
        let g = n.generation();
        n.found_absent(7, "z", g);
        assert!(n.absent(7, "y") && n.absent(7, "z"), "another directory's change leaves it");
        n.clear();
        assert!(!n.absent(7, "y"), "a gap in the feed drops everything");
        n.found_absent(7, "y", g);
        assert!(!n.absent(7, "y"), "asked before the gap: not taken in");
        assert_eq!(n.len(), 0);
    }

    #[test]
    fn entries_are_bounded_in_all() {
        let mut n = Negatives::default();
        let g = n.generation();
        for i in 0..NEGATIVE_ENTRIES_MAX - 2 {
            n.found_absent(2 + (i % 2) as Ino, &format!("n{i}"), g);
        }
        assert_eq!(n.len(), NEGATIVE_ENTRIES_MAX, "two directories and their names");
        assert!(n.absent(2, "n0") && n.absent(3, "n1"));
        n.found_absent(2, "one-more", g);
        assert_eq!(n.len(), 0, "past the bound everything is dropped");
        assert!(!n.absent(2, "n0") && !n.absent(3, "n1"));
        let g = n.generation();
        n.found_absent(2, "again", g);
        assert_eq!(n.len(), 2);
    }
}
