//! The inodes the kernel holds: for each, the manager's handle, the last
//! attributes, the kernel's lookup count, and the file shared by its open
//! descriptors.
//!
//! An inode enters the table when a reply hands it to the kernel (lookup,
//! create, mkdir, symlink, link) and leaves when the kernel has forgotten
//! every such reply (`FORGET`) and no descriptor has it open, so the table is
//! bounded by the kernel's inode cache plus the open files
//! ([`OPEN_FILES_MAX`](crate::OPEN_FILES_MAX)). The root never leaves.

use nasd_fs::{Entry, File, FileAttr, FileKind, FsClient, Handle, Ino, ROOT_INO};
use std::collections::HashMap;
use std::sync::Arc;

/// A name an open file was moved to instead of being unlinked.
#[derive(Debug, Clone)]
pub(crate) struct Hidden {
    /// The directory it is in.
    pub parent: Handle,
    /// Its hidden name there.
    pub name: String,
    /// Who hid it (and removes the name at the last close).
    pub fs: FsClient,
}

/// One inode the kernel holds.
pub(crate) struct Node {
    pub handle: Handle,
    pub attr: FileAttr,
    /// A symbolic link's target (targets never change).
    pub target: Option<String>,
    /// Replies that handed this inode to the kernel, less those it forgot.
    pub lookups: u64,
    /// Open descriptors (FUSE file handles) of this inode.
    pub opens: u32,
    /// The file every open descriptor of this inode reads and writes through.
    pub file: Option<Arc<File>>,
    /// Set while the file lives on under a hidden name (unlinked while open).
    pub hidden: Option<Hidden>,
    /// Size and modification time of the file when the kernel's page cache
    /// for it was last known valid (`None`: drop it at the next open).
    pub cached: Option<(u64, i64)>,
    /// The manager's last answer to the `getxattr` the kernel makes before
    /// every write (`security.capability`), while the file is open: it
    /// answers while no manager does.
    pub write_check: Option<Result<Vec<u8>, fuser::Errno>>,
}

impl Node {
    fn new(e: &Entry) -> Node {
        Node {
            handle: e.handle(),
            attr: e.attr.clone(),
            target: (e.attr.kind == FileKind::Symlink).then(|| e.target.clone()),
            lookups: 0,
            opens: 0,
            file: None,
            hidden: None,
            cached: None,
            write_check: None,
        }
    }

    /// Names POSIX would not count: the hidden name of a file unlinked while open.
    pub fn nlink_hidden(&self) -> u32 {
        u32::from(self.hidden.is_some())
    }
}

/// The table.
pub(crate) struct Inodes {
    nodes: HashMap<Ino, Node>,
}

impl Inodes {
    /// A table holding the root, which the kernel holds from the mount on.
    pub fn new(root: &Entry) -> Inodes {
        let mut nodes = HashMap::new();
        let mut node = Node::new(root);
        node.lookups = 1;
        nodes.insert(ROOT_INO, node);
        Inodes { nodes }
    }

    pub fn get(&self, ino: Ino) -> Option<&Node> {
        self.nodes.get(&ino)
    }

    pub fn get_mut(&mut self, ino: Ino) -> Option<&mut Node> {
        self.nodes.get_mut(&ino)
    }

    pub fn handle(&self, ino: Ino) -> Option<Handle> {
        self.nodes.get(&ino).map(|n| n.handle)
    }

    /// Records an entry handed to the kernel (one more lookup) and returns
    /// its node.
    pub fn remember(&mut self, e: &Entry) -> &mut Node {
        let node = self.nodes.entry(e.attr.ino).or_insert_with(|| Node::new(e));
        // The same inode may come back under a handle made later: both check.
        node.handle = e.handle();
        node.attr = e.attr.clone();
        if e.attr.kind == FileKind::Symlink {
            node.target = Some(e.target.clone());
        }
        node.lookups = node.lookups.saturating_add(1);
        node
    }

    /// Takes fresher attributes for an inode already held.
    pub fn refresh(&mut self, attr: &FileAttr) {
        if let Some(node) = self.nodes.get_mut(&attr.ino) {
            node.attr = attr.clone();
        }
    }

    /// The kernel forgot `n` lookups of `ino`.
    pub fn forget(&mut self, ino: Ino, n: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
            self.drop_if_unused(ino);
        }
    }

    /// Drops `ino` if the kernel holds it no more and nothing has it open.
    pub fn drop_if_unused(&mut self, ino: Ino) {
        let unused = self.nodes.get(&ino).is_some_and(|n| n.lookups == 0 && n.opens == 0 && n.hidden.is_none());
        if unused && ino != ROOT_INO {
            self.nodes.remove(&ino);
        }
    }

    /// Every inode held.
    pub fn all_mut(&mut self) -> impl Iterator<Item = (Ino, &mut Node)> {
        self.nodes.iter_mut().map(|(ino, node)| (*ino, node))
    }

    /// Every hidden name still held (for the clean-up at unmount).
    pub fn take_hidden(&mut self) -> Vec<Hidden> {
        self.nodes.values_mut().filter_map(|n| n.hidden.take()).collect()
    }
}
