//! The inodes a gateway holds: for each, the manager's handle, the last
//! attributes and when they were fetched, the gateway's references, the
//! file shared by its open descriptors, the hidden name of a file unlinked
//! while open, and the answer to the extended-attribute question the
//! kernel asks before every write.
//!
//! An inode enters the table when a reply hands it to the gateway's client
//! (lookup, create, mkdir, symlink, link, a listing with attributes, a
//! persistent handle reopened) and leaves when the gateway has dropped
//! every such reference ([`Inodes::forget`]) and no descriptor has it open,
//! so the table is bounded by the gateway's own cache (the kernel's inode
//! cache for FUSE) plus the open files ([`OPEN_FILES_MAX`](crate::OPEN_FILES_MAX)).
//! The root never leaves.

use nasd_fs::{Entry, File, FileAttr, FileKind, FsClient, Handle, Ino, ROOT_INO};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

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

/// What the manager answered to `getxattr(security.capability)`: the value,
/// or the errno of its refusal (`ENODATA` for most files).
pub(crate) type XattrAnswer = Result<Vec<u8>, i32>;

/// One inode the gateway holds.
pub(crate) struct Node {
    pub handle: Handle,
    pub attr: FileAttr,
    /// When `attr` came from the manager (or from this gateway's own change).
    pub attr_at: Instant,
    /// The table's [`Inodes::seq`] when the layer last learnt that the
    /// inode's attributes changed (new ones taken in, its own writes, an
    /// invalidation): a listing page fetched before it is stale for this
    /// inode.
    pub changed: u64,
    /// A symbolic link's target (targets never change).
    pub target: Option<String>,
    /// Replies that handed this inode to the gateway's client, less those it
    /// forgot (FUSE: the kernel's lookup count).
    pub refs: u64,
    /// Open descriptors of this inode.
    pub opens: u32,
    /// The file every open descriptor of this inode reads and writes through.
    pub file: Option<Arc<File>>,
    /// Set while the file lives on under a hidden name (unlinked while open).
    pub hidden: Option<Hidden>,
    /// Size and modification time of the file when the client's data cache
    /// (the kernel's page cache) for it was last known valid (`None`: drop
    /// it at the next open).
    pub data_stamp: Option<(u64, i64)>,
    /// The manager's last answer to `getxattr(security.capability)` (asked
    /// by the kernel before every write), and when: kept true by the change
    /// feed, and the answer while no manager does.
    pub capability: Option<(XattrAnswer, Instant)>,
    /// When a manager last vouched that the inode had no extended
    /// attributes at all (a listing's [`Entry::no_xattrs`]): kept true by
    /// the change feed as the attributes are, forgotten at this gateway's
    /// own `setxattr`/`removexattr`.
    pub no_xattrs_at: Option<Instant>,
}

impl Node {
    fn new(e: &Entry) -> Node {
        Node {
            handle: e.handle(),
            attr: e.attr.clone(),
            attr_at: Instant::now(),
            changed: 0,
            target: (e.attr.kind == FileKind::Symlink).then(|| e.target.clone()),
            refs: 0,
            opens: 0,
            file: None,
            hidden: None,
            data_stamp: None,
            capability: None,
            no_xattrs_at: None,
        }
    }

    /// Names POSIX would not count: the hidden name of a file unlinked while open.
    pub fn nlink_hidden(&self) -> u32 {
        u32::from(self.hidden.is_some())
    }

    /// Forgets everything cached about the inode's attributes and data
    /// (callers note the change: [`Inodes::touch`]).
    fn invalidate(&mut self) {
        self.data_stamp = None;
        self.capability = None;
        self.no_xattrs_at = None;
        self.attr_at = long_ago(self.attr_at);
    }
}

/// A time older than any attribute lifetime (the next `getattr` asks the
/// manager), or `at` if the clock cannot go back that far.
pub(crate) fn long_ago(at: Instant) -> Instant {
    Instant::now().checked_sub(crate::ATTR_TTL_MAX * 2).unwrap_or(at)
}

/// The table.
pub(crate) struct Inodes {
    nodes: HashMap<Ino, Node>,
    /// Counts the attribute changes the layer learnt of ([`Node::changed`]).
    seq: u64,
}

impl Inodes {
    /// A table holding the root, which the gateway holds from the start.
    pub fn new(root: &Entry) -> Inodes {
        let mut nodes = HashMap::new();
        let mut node = Node::new(root);
        node.refs = 1;
        nodes.insert(ROOT_INO, node);
        Inodes { nodes, seq: 0 }
    }

    /// The count of attribute changes learnt so far: read before a listing
    /// page is asked for, it tells later which of its entries' attributes
    /// the layer has learnt newer ones of (or changes to) since.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Notes that the layer learnt of a change to `ino`'s attributes (taken
    /// in, made here, or invalidated).
    pub fn touch(&mut self, ino: Ino) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            self.seq += 1;
            node.changed = self.seq;
        }
    }

    /// Takes `attr` as the inode's current attributes (a reply, or this
    /// layer's own change), noting the change.
    pub fn set_attr(&mut self, attr: FileAttr) {
        let ino = attr.ino;
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.attr = attr;
            node.attr_at = Instant::now();
            self.touch(ino);
        }
    }

    /// Notes that `ino`'s attributes changed in a way the layer does not
    /// know the outcome of (its own request changed them): the held ones
    /// are too old to answer from, and a listing page fetched before is stale.
    pub fn stale_attr(&mut self, ino: Ino) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.attr_at = long_ago(node.attr_at);
            self.touch(ino);
        }
    }

    /// Forgets everything cached about `ino`'s attributes and data; whether it is held.
    pub fn invalidate(&mut self, ino: Ino) -> bool {
        let Some(node) = self.nodes.get_mut(&ino) else { return false };
        node.invalidate();
        self.touch(ino);
        true
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

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Records an entry handed to the gateway's client (one more reference
    /// if `counted`) and returns its node.
    pub fn remember(&mut self, e: &Entry, counted: bool) -> &mut Node {
        self.seq += 1;
        let node = self.nodes.entry(e.attr.ino).or_insert_with(|| Node::new(e));
        // The same inode may come back under a handle made later: both check.
        node.handle = e.handle();
        node.attr = e.attr.clone();
        node.attr_at = Instant::now();
        node.changed = self.seq;
        if e.no_xattrs {
            node.no_xattrs_at = Some(node.attr_at);
        }
        if e.attr.kind == FileKind::Symlink {
            node.target = Some(e.target.clone());
        }
        if counted {
            node.refs = node.refs.saturating_add(1);
        }
        node
    }

    /// Takes fresher attributes for an inode already held.
    pub fn refresh(&mut self, attr: &FileAttr) {
        self.set_attr(attr.clone());
    }

    /// The gateway's client dropped `n` references to `ino`.
    pub fn forget(&mut self, ino: Ino, n: u64) {
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.refs = node.refs.saturating_sub(n);
            self.drop_if_unused(ino);
        }
    }

    /// Drops `ino` if the gateway holds it no more and nothing has it open.
    pub fn drop_if_unused(&mut self, ino: Ino) {
        let unused = self.nodes.get(&ino).is_some_and(|n| n.refs == 0 && n.opens == 0 && n.hidden.is_none());
        if unused && ino != ROOT_INO {
            self.nodes.remove(&ino);
        }
    }

    /// Forgets everything cached about every inode held; their numbers.
    pub fn invalidate_all(&mut self) -> Vec<Ino> {
        let all: Vec<Ino> = self.nodes.keys().copied().collect();
        for &ino in &all {
            self.invalidate(ino);
        }
        all
    }

    /// Every hidden name still held (for the clean-up at the end).
    pub fn take_hidden(&mut self) -> Vec<Hidden> {
        self.nodes.values_mut().filter_map(|n| n.hidden.take()).collect()
    }
}
