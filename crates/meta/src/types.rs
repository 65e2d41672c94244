//! The records the name space hands out and takes in.

use nasd_proto::fs::{FileAttr, ObjectRef};

/// Who is asking. uid 0 is the superuser (bypasses permission checks, may chown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// User id.
    pub uid: u32,
    /// The caller's one group id.
    pub gid: u32,
}

impl Caller {
    /// The superuser.
    pub const ROOT: Caller = Caller { uid: 0, gid: 0 };

    /// Whether this is the superuser.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// An inode with what the manager needs beyond stat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inode {
    /// The POSIX attributes.
    pub attr: FileAttr,
    /// Symlink target (kind Symlink only).
    pub target: Option<String>,
    /// Regular files: where the bytes live.
    pub object: Option<ObjectRef>,
    /// The drive object's access control version the manager last set;
    /// capabilities are minted with it. Starts at 0 for a fresh pool object.
    pub acv: u64,
}

/// A directory entry with its inode (readdir-plus).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name.
    pub name: String,
    /// The inode it names.
    pub inode: Inode,
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

/// What an unlink/rmdir/rename did to objects, for the manager to finish on
/// drives after commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    /// Objects whose capabilities must be revoked now (recorded as intents in
    /// the same transaction).
    pub revoke: Vec<AcvIntent>,
    /// Objects no longer referenced by any name: recorded in the doomed table
    /// in the same transaction; the manager removes them from drives.
    pub doomed: Vec<ObjectRef>,
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
    /// Primary (and only) group id.
    pub gid: u32,
    /// Password hash string (opaque to this crate).
    pub password_hash: String,
    /// Whether the user may administer the manager.
    pub admin: bool,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .field("password_hash", &"<redacted>")
            .field("admin", &self.admin)
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
            .finish()
    }
}
