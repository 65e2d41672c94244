//! The records the name space hands out and takes in.

use nasd_proto::fs::{FileAttr, FileKind, Ino, ObjectRef};
use nasd_proto::layout::{Component, Layout};
use nasd_proto::manager::DriveState;

/// Who is asking. uid 0 is the superuser (bypasses permission checks, may chown).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    /// User id.
    pub uid: u32,
    /// The caller's primary group id: new inodes get it (unless their
    /// directory is set-group-id).
    pub gid: u32,
    /// Supplementary groups (at most [`GROUPS_MAX`](nasd_proto::fs::GROUPS_MAX)):
    /// the caller is in the group class of a file whose group is `gid` or
    /// one of these.
    pub groups: Vec<u32>,
    /// The role the caller acts in: its identity credential's (the one it
    /// chose at the authentication server for the session), matched by the
    /// ACL's role entries; `ROLE_NONE` (0, matching none) for a session
    /// that logged in with a password.
    pub role: u32,
}

impl Caller {
    /// The superuser.
    pub const ROOT: Caller = Caller { uid: 0, gid: 0, groups: Vec::new(), role: 0 };

    /// A caller with no supplementary groups and no role.
    pub fn new(uid: u32, gid: u32) -> Caller {
        Caller { uid, gid, groups: Vec::new(), role: 0 }
    }

    /// Whether this is the superuser.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether the caller is a member of group `gid`: its primary group or
    /// one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// An inode with what the manager needs beyond stat.
///
/// Shapes by kind (checked by `testing::check_invariants`):
/// - regular file: `layout` is `Some`, `components` holds exactly
///   `layout.components()` entries in component order, each on its own drive;
/// - directory: `layout` is `Some` only if set on this directory (new files
///   below take the nearest ancestor's, [`crate::Namespace::effective_layout`];
///   the root always has one), `components` is empty;
/// - symbolic link: no layout, no components, `target` is `Some`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    /// The POSIX attributes.
    pub attr: FileAttr,
    /// Symlink target (kind Symlink only).
    pub target: Option<String>,
    /// How a file's bytes spread over its components; for a directory, the
    /// layout set on it for new files below (if any).
    pub layout: Option<Layout>,
    /// A regular file's component objects, in component order, with their
    /// stored states ([`ComponentState::Ok`](nasd_proto::layout::ComponentState::Ok) or
    /// [`Stale`](nasd_proto::layout::ComponentState::Stale); `Down` is the
    /// manager's soft state and never stored). Empty for other kinds.
    pub components: Vec<Component>,
    /// The access control version the manager last set on every component
    /// object; capabilities are minted with it. Starts at 0 for fresh pool
    /// objects.
    pub acv: u64,
    /// The directory whose quota counts this inode (the nearest directory
    /// above it with a quota when it was made, or when that quota was set);
    /// 0: none.
    pub qdir: Ino,
    /// A regular file's small-file threshold, fixed when it was made: its
    /// bytes below it live in the metadata store (see `small.rs`); 0:
    /// every byte on its components (and for every other kind).
    pub small_threshold: u32,
    /// The logical routing site the inode was made in (below
    /// [`ROUTING_SITES`](nasd_proto::routing::ROUTING_SITES); the root's
    /// is 0): it travels in the inode's file handles, and clients route
    /// requests on it to the manager holding the site (`crate::routing`).
    pub site: u8,
    /// A regular file's bytes its data components store (one copy of each
    /// column, parity not counted, holes not at all), as the manager
    /// measured them at the file's last commit or size change; 0 for every
    /// other kind. With the bytes below the small-file threshold it makes
    /// [`Inode::allocated`], what quotas count.
    pub data_bytes: u64,
}

impl Inode {
    /// What the inode's data takes ([`FileAttr::allocated`]): a regular
    /// file's `data_bytes` plus its bytes below the small-file threshold,
    /// counted whole up to the size (the metadata store keeps them densely);
    /// any other kind's size.
    pub fn allocated(&self) -> u64 {
        match self.attr.kind {
            FileKind::File => self.data_bytes.saturating_add(self.attr.size.min(u64::from(self.small_threshold))),
            _ => self.attr.size,
        }
    }

    /// Sets `attr.allocated` from the other fields, after a change of the
    /// size or of `data_bytes`.
    pub fn refresh_allocated(&mut self) {
        self.attr.allocated = self.allocated();
    }

    /// The component objects, in component order.
    pub fn objects(&self) -> impl Iterator<Item = ObjectRef> + '_ {
        self.components.iter().map(|c| c.object)
    }
}

/// The state of a write intent (Slice's coordinator intention log, §3.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IntentState {
    /// A client is writing under it.
    Open = 0,
    /// The writer committed: size and stale components are recorded; the
    /// manager finishes it (drive work, if any) and then forgets it.
    Committed = 1,
    /// The writer died or gave up (its deadline passed): the manager probes
    /// the components, marks what may have missed writes stale, and then
    /// forgets it.
    Aborting = 2,
}

impl IntentState {
    /// The stored code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Parses a stored code.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            0 => Some(IntentState::Open),
            1 => Some(IntentState::Committed),
            2 => Some(IntentState::Aborting),
            _ => None,
        }
    }
}

/// A write intent: the manager's record that a client may be writing a file
/// (at most one per file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intent {
    /// The transaction id (from the `next_txn` counter: never 0, never reused).
    pub txn: u64,
    /// The file written.
    pub ino: Ino,
    /// Where it stands.
    pub state: IntentState,
    /// Who began it (only they, or root, may commit it).
    pub uid: u32,
    /// When the manager stops waiting for the writer (ns since the epoch).
    pub deadline_ns: i64,
    /// Bytes of quota reserved for the writer to extend the file with
    /// (held while the intent is Open).
    pub escrow: u64,
    /// The size the writer may make the file, at most (its size when the
    /// transaction began plus the escrow); `u64::MAX` when no quota
    /// limits it.
    pub size_limit: u64,
    /// The components the writer may change, as a bit set (bit `i`:
    /// component `i`): [`Intent::ALL`] for a client, which may write any;
    /// none for the manager's own repairs, which write only bytes every
    /// component is already meant to hold (a resync, a healed block) or a
    /// new object. A rollback that cannot reach one of these leaves it
    /// stale; the others it leaves as they are.
    pub writes: u64,
    /// Of [`writes`](Self::writes), the components the transaction could not
    /// be opened on (their drive was down or failed `TXN_BEGIN`): bytes the
    /// writer lands there have no undo, so a rollback leaves them stale.
    pub unopened: u64,
}

impl Intent {
    /// Every component (the bit set of [`Intent::writes`]).
    pub const ALL: u64 = u64::MAX;
}

/// The [`Intent::uid`] of a write transaction the manager makes itself (a
/// size change, a repair): no user's — `(uid_t)-1` names nobody — so only
/// root could commit it as a client, and a manager that finds one it is not
/// running knows its writer is gone.
pub const MANAGER_WRITER_UID: u32 = u32::MAX;

/// A byte range of one component object (in component space) that the
/// component missed: it must be rebuilt from the other components before it
/// can be read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StaleRange {
    /// First byte.
    pub offset: u64,
    /// Bytes (more than 0; `offset + length` does not overflow).
    pub length: u64,
}

impl StaleRange {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.length)
    }
}

/// A directory entry with its inode (readdir-plus).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name.
    pub name: String,
    /// The inode it names.
    pub inode: Inode,
    /// Whether the inode has extended attributes (of any namespace), read
    /// in the same transaction: a listing that says none lets a gateway
    /// answer `getxattr`/`listxattr` without asking.
    pub has_xattrs: bool,
}

/// A revocation the manager must carry out on a drive after the transaction
/// commits: set the object's access_control_version to `acv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcvIntent {
    /// The object.
    pub object: ObjectRef,
    /// The access control version to set.
    pub acv: u64,
}

/// What an operation asks of drives, for the manager to finish after commit
/// (both lists are also recorded in the intention logs in the same
/// transaction, so the maintenance pass finishes them after a crash).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    /// Access control versions to set: one per component object of every
    /// file whose capabilities are revoked, and one per object that newly
    /// joined a file (to give it the file's current version).
    pub revoke: Vec<AcvIntent>,
    /// Objects no longer held by any file (every component of a file whose
    /// last name went, or replaced components): recorded in the doomed table;
    /// the manager removes them from drives.
    pub doomed: Vec<ObjectRef>,
    /// PAL collections (directories) whose shared entries changed or went
    /// with their directory: each is recorded in `collection_pending` in the
    /// same transaction, and the manager sets its super PAL again on every
    /// drive (an empty one for a directory gone).
    pub collections: Vec<Ino>,
}

/// What `setattr` may change (None = leave as is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttrs {
    /// New permission bits (chmod).
    pub mode: Option<u32>,
    /// New owner (chown).
    pub uid: Option<u32>,
    /// New group (chgrp).
    pub gid: Option<u32>,
    /// New length (truncate).
    pub size: Option<u64>,
    /// New access time.
    pub atime_ns: Option<i64>,
    /// New modification time.
    pub mtime_ns: Option<i64>,
    /// The size change comes from a descriptor open for writing: the owner
    /// may make it whatever the mode says (knfsd's owner override).
    pub open_writer: bool,
    /// With a size change the manager made on the components: the bytes they
    /// store after it, as measured ([`Inode::data_bytes`]).
    pub data_bytes: Option<u64>,
}

impl SetAttrs {
    /// Whether the owner, group or mode changes (which revokes capabilities).
    pub fn changes_access(&self) -> bool {
        self.mode.is_some() || self.uid.is_some() || self.gid.is_some()
    }
}

/// A user of the file system.
#[derive(Clone, PartialEq, Eq)]
pub struct User {
    /// Login name (1..=`USER_NAME_MAX` bytes).
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Password hash string (opaque to this crate).
    pub password_hash: String,
    /// Whether the user may administer the manager.
    pub admin: bool,
    /// Supplementary groups: strictly ascending, at most
    /// [`GROUPS_MAX`](nasd_proto::fs::GROUPS_MAX).
    pub groups: Vec<u32>,
    /// The ids (first, last, inclusive) this user may act for as a gateway
    /// (`AS_USER`): every uid and group it claims for a caller must lie in
    /// them. `None`: not a gateway.
    pub gateway: Option<(u32, u32)>,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("password_hash", &"<redacted>")
            .field("admin", &self.admin)
            .field("groups", &self.groups)
            .field("gateway", &self.gateway)
            .finish()
    }
}

/// A drive the manager uses. Keys are opaque sealed blobs to this crate.
#[derive(Clone, PartialEq, Eq)]
pub struct DriveRecord {
    /// The manager's number for the drive (used in [`ObjectRef::drive`]).
    pub drive: u32,
    /// The drive's identity.
    pub drive_id: [u8; 16],
    /// Where it listens.
    pub addr: String,
    /// The partition the manager uses on it.
    pub partition: u64,
    /// The manager's keys for the drive, sealed by the manager.
    pub sealed_keys: Vec<u8>,
    /// Capacity the manager may use, in bytes.
    pub capacity_bytes: u64,
    /// Drives sharing a failure domain fail together (a host, a rack);
    /// empty: the drive is its own domain. At most
    /// [`NAME_LEN_MAX`](nasd_proto::limits::NAME_LEN_MAX) bytes.
    pub failure_domain: String,
    /// In service (new components are placed on it) or out.
    pub state: DriveState,
}

impl std::fmt::Debug for DriveRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriveRecord")
            .field("drive", &self.drive)
            .field("drive_id", &self.drive_id)
            .field("addr", &self.addr)
            .field("partition", &self.partition)
            .field("sealed_keys", &format_args!("<{} bytes>", self.sealed_keys.len()))
            .field("capacity_bytes", &self.capacity_bytes)
            .field("failure_domain", &self.failure_domain)
            .field("state", &self.state)
            .finish()
    }
}

/// What a quota limits: a user's inodes (by owner), or a directory's tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaSubject {
    /// Every inode owned by this uid.
    User(u32),
    /// Every inode below this directory (not in a nested quota's tree).
    Dir(Ino),
}

impl QuotaSubject {
    /// The stored kind code (1 user, 2 directory) and id.
    pub fn key(self) -> (u8, u64) {
        match self {
            QuotaSubject::User(uid) => (1, u64::from(uid)),
            QuotaSubject::Dir(ino) => (2, ino),
        }
    }

    /// Parses a stored kind code and id.
    pub fn from_key(kind: u8, id: u64) -> Option<Self> {
        match kind {
            1 => u32::try_from(id).ok().map(QuotaSubject::User),
            2 => Some(QuotaSubject::Dir(id)),
            _ => None,
        }
    }
}

/// A quota: limits (`None`: unlimited) and what is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// Whose.
    pub subject: QuotaSubject,
    /// Most bytes of regular files (their sizes).
    pub bytes_limit: Option<u64>,
    /// Most inodes.
    pub files_limit: Option<u64>,
    /// Bytes used now.
    pub bytes_used: u64,
    /// Inodes used now.
    pub files_used: u64,
}

/// A lease held in the metadata store (`leases` table): work that at most
/// one manager may do at a time (a drive's pool refill, orphan collection
/// and key rotation; one inode's size change) names a lease, and a manager
/// does it only while it holds the lease. Expiry is on the database's clock
/// ([`crate::Txn::now_ms`]); `token` grows at every change of hands, so a
/// transaction that checks it (a fence) fails for a holder that lost the
/// lease, however late it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// What the lease guards, e.g. `drive/3` (at most
    /// [`crate::LEASE_NAME_MAX`] bytes).
    pub name: String,
    /// Who holds it: a manager's id (at most [`crate::LEASE_HOLDER_MAX`] bytes).
    pub holder: String,
    /// The fencing token: moves on every time the lease is acquired.
    pub token: u64,
    /// When it lapses unless renewed, in milliseconds since the Unix epoch
    /// on the database's clock.
    pub expires_ms: u64,
}
