//! Directory cursors: the manager pages a directory by name (`READDIR`
//! after the last name returned); gateways ask by offset (FUSE, NFS
//! cookies). A cursor numbers what it has read in order — 0 `.`, 1 `..`,
//! then the entries — and keeps a window of at most two pages
//! (`READDIR_ENTRIES_MAX` each) from the oldest offset the gateway may still
//! ask for. An offset before the window (a `rewinddir`) reads the directory
//! again from its start, so a cursor's memory is bounded whatever the
//! directory's size.
//!
//! Concurrent changes: pages continue after the last *name* handed out, not
//! after a position, so a name added or removed meanwhile never makes the
//! cursor skip or repeat another (POSIX leaves only the changed name itself
//! unspecified). Each entry is kept with the layer's count of attribute
//! changes ([`crate::inodes::Inodes::seq`]) read before its page was asked
//! for, so the layer hands out attributes it learnt of since instead of the
//! page's (a window is handed out over several gateway calls, and this
//! layer's own writes and commits, or another client's change, may come
//! between them).

use nasd_fs::{Entry, FileKind, FsClient, FsError, Handle, Ino, READDIR_ENTRIES_MAX};
use std::collections::VecDeque;

/// The inode number a directory entry shows when the caller may read the
/// directory but not search it: the manager then gives names and kinds only
/// (POSIX needs search permission to learn more), and no stat of the entry
/// can succeed anyway.
pub const UNKNOWN_INO: u64 = u64::MAX;

/// Offset of the first real entry (after `.` and `..`).
pub const FIRST_ENTRY: u64 = 2;

/// One entry as a listing shows it.
#[derive(Debug, Clone)]
pub struct DirItem {
    /// Its name.
    pub name: String,
    /// What it is.
    pub kind: FileKind,
    /// Its inode number ([`UNKNOWN_INO`] without search permission).
    pub ino: u64,
    /// Its attributes and handle, when the caller may search the directory
    /// (readdirplus: no lookup per entry needed).
    pub entry: Option<Entry>,
}

/// One open directory.
pub(crate) struct DirCursor {
    pub dir: Handle,
    /// Entries from offset `base` on, each with the layer's count of
    /// attribute changes read before its page was asked for.
    window: VecDeque<(DirItem, u64)>,
    base: u64,
    /// The last name fetched (`""` before the first page).
    after: String,
    /// The manager said no entries follow the window.
    done: bool,
}

impl DirCursor {
    pub fn new(dir: Handle) -> DirCursor {
        DirCursor { dir, window: VecDeque::new(), base: FIRST_ENTRY, after: String::new(), done: false }
    }

    fn restart(&mut self) {
        self.window.clear();
        self.base = FIRST_ENTRY;
        self.after.clear();
        self.done = false;
    }

    /// The entry at `offset` (≥ 2), reading pages as needed, and the count
    /// of attribute changes `seq` gave before its page was asked for; `None`
    /// past the end.
    pub async fn at(
        &mut self,
        fs: &FsClient,
        offset: u64,
        seq: impl Fn() -> u64,
    ) -> Result<Option<(DirItem, u64)>, FsError> {
        if offset < self.base {
            self.restart();
        }
        loop {
            let index = offset - self.base;
            if let Some(item) = usize::try_from(index).ok().and_then(|i| self.window.get(i)) {
                return Ok(Some(item.clone()));
            }
            if self.done {
                return Ok(None);
            }
            // Entries before `offset` were handed out: the gateway asks on from there.
            let consumed = usize::try_from(index).unwrap_or(usize::MAX).min(self.window.len());
            self.window.drain(..consumed);
            self.base += consumed as u64;
            self.fetch(fs, seq()).await?;
        }
    }

    async fn fetch(&mut self, fs: &FsClient, seq: u64) -> Result<(), FsError> {
        let page = fs.readdir_page(self.dir, &self.after, READDIR_ENTRIES_MAX as u16).await?;
        self.done = !page.more;
        if let Some(last) = page.entries.last() {
            self.after = last.name.clone();
        }
        self.window.extend(page.entries.into_iter().map(|e| {
            let item = DirItem {
                ino: e.entry.as_ref().map_or(UNKNOWN_INO, |e| e.attr.ino),
                kind: e.kind,
                name: e.name,
                entry: e.entry,
            };
            (item, seq)
        }));
        Ok(())
    }

    /// The directory's inode.
    pub fn ino(&self) -> Ino {
        self.dir.ino
    }
}
