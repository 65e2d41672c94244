//! The manager protocol: what clients and administrators say to a file
//! manager over TLS (docs/PROTOCOL.md, "Manager protocol").
//!
//! A message is a `u32` length, then a body: a request is `opcode u16,
//! request_id u64, arguments`; a reply is `status u16, request_id u64`, then
//! the result (status OK) or an error message. Arguments and results use the
//! canonical encoding of [`crate::codec`]. TLS protects the channel, so
//! nothing here is MACed for transport (file handles carry the manager's MAC for
//! itself, [`Handle`]); capability keys travel only inside it.

use crate::acl::{decode_acl, encode_acl, validate_acl, AclEntry, AclInfo, ACL_ENTRIES_MAX};
use crate::codec::{Reader, Writer};
use crate::fs::{
    validate_groups, FileAttr, FileKind, FsStatus, Ino, ObjectRef, FILE_NAME_MAX, GROUPS_MAX, MODE_MASK, PATH_MAX,
    SYMLINK_TARGET_MAX, XATTRS_PER_INODE_MAX, XATTR_NAME_MAX, XATTR_VALUE_MAX,
};
use crate::layout::{Component, ComponentState, Layout, COMPONENTS_MAX};
use crate::limits::NAME_LEN_MAX;
use crate::limits::TRACE_ID_LEN_MAX;
use crate::limits::{CAPABILITY_LEN_MAX, ERROR_MESSAGE_LEN_MAX};
use crate::routing::RoutingTable;
use crate::trace::TraceId;
use crate::DecodeError;

/// Version of the manager protocol this crate speaks (sent in `LOGIN`).
/// Version 2 added [`Entry::no_xattrs`] (bit 2 of an entry's flags);
/// version 3 the `TRACED` envelope ([`ManagerRequest::encode_traced`]).
pub const MANAGER_PROTOCOL_VERSION: u8 = 3;
/// The first version whose sessions may send `TRACED` envelopes.
pub const MANAGER_PROTOCOL_VERSION_TRACE: u8 = 3;
/// Oldest version a manager still serves: to a session that logged in with
/// version 1 it never sets what version 2 added ([`ManagerReply::for_version`]).
pub const MANAGER_PROTOCOL_VERSION_MIN: u8 = 1;
/// Requests one logged-in connection may have in flight at once: a
/// manager answers them in any order, each reply echoing its request's id,
/// and reads no more of the connection while this many are unanswered.
pub const CONNECTION_REQUESTS_MAX: usize = 16;
/// Largest message body, in bytes. A `READDIR` reply of
/// [`READDIR_ENTRIES_MAX`] longest names fits.
pub const MANAGER_MESSAGE_MAX: usize = 1024 * 1024;

/// The name ending of a client's temporary copy (`.NAME.XXXXXXXX.nasd-tmp`, made beside the
/// destination and renamed onto it once complete): clients make such names, and the manager
/// removes those a killed client left (`[manager] temporaries_age_secs`).
pub const TEMPORARY_SUFFIX: &str = ".nasd-tmp";

/// Most bytes one `READ_SMALL` or `WRITE_SMALL` moves (and a `SMALL_DATA`
/// reply carries): a client splits longer ranges below a file's small-file
/// threshold into requests of at most this many bytes.
pub const SMALL_IO_MAX: usize = 64 * 1024;

/// Highest small-file threshold a manager may be configured with (and a
/// `FileAccess` may carry): the bytes of a file below it live in the
/// metadata store.
pub const SMALL_FILE_THRESHOLD_MAX: u32 = 1024 * 1024;
/// Most entries one `READDIR` reply carries.
pub const READDIR_ENTRIES_MAX: usize = 1024;
/// Longest user name, in bytes.
pub const USER_NAME_MAX: usize = 64;
/// Longest password, in bytes.
pub const PASSWORD_MAX: usize = 1024;
/// Largest message body the manager reads before a connection has logged in:
/// a `LOGIN` with the longest user name and password (opcode, request id,
/// version, two length-prefixed strings). This, not [`MANAGER_MESSAGE_MAX`],
/// is what an unauthenticated peer can make the manager allocate.
pub const LOGIN_MESSAGE_MAX: usize = 2 + 8 + 1 + (2 + USER_NAME_MAX) + (2 + PASSWORD_MAX);
/// Longest drive address (`host:port`), in bytes.
pub const DRIVE_ADDR_MAX: usize = 256;
/// Most drives a manager serves (`ADD_DRIVE` refuses more) and lists in
/// `STATFS`; a `STATFS` reply of that many drives with the longest
/// addresses fits in one message.
pub const DRIVES_MAX: usize = 1024;
/// Most users one `LIST_USERS` reply carries.
pub const USERS_MAX: usize = 4096;

/// Most changes one `WATCH` reply carries.
pub const WATCH_CHANGES_MAX: usize = 2048;
/// Longest a `WATCH` waits for a change before it answers with none.
pub const WATCH_WAIT_MAX_MS: u32 = 30_000;

/// Length of a file handle's MAC, in bytes.
pub const HANDLE_MAC_LEN: usize = 32;
/// Most dirty file ranges one `COMMIT` reports (a writer that touched more
/// reports ranges covering them).
pub const DIRTY_RANGES_MAX: usize = 64;
/// Encoded length of a [`ComponentAccess`] at most: object, state, the
/// longest address, identity, the longest token, key.
pub const COMPONENT_ACCESS_LEN_MAX: usize = ObjectRef::LEN + 1 + 2 + DRIVE_ADDR_MAX + 16 + 2 + CAPABILITY_LEN_MAX + 32;
/// Encoded length of a [`FileAccess`] at most.
pub const FILE_ACCESS_LEN_MAX: usize =
    Layout::LEN + 4 + 4 + 4 + 1 + 1 + 4 + 2 + COMPONENTS_MAX * COMPONENT_ACCESS_LEN_MAX;

const _: () = assert!(
    READDIR_ENTRIES_MAX * (2 + FILE_NAME_MAX + FileAttr::LEN + HANDLE_MAC_LEN + 2 + 1) + 64 <= MANAGER_MESSAGE_MAX
);
const _: () = assert!(PATH_MAX + SYMLINK_TARGET_MAX + 1024 <= MANAGER_MESSAGE_MAX);
const _: () = assert!(DRIVES_MAX * (4 + 2 + DRIVE_ADDR_MAX + 1 + 8 + 8) + 64 <= MANAGER_MESSAGE_MAX);
const _: () = assert!(USERS_MAX * UserInfo::LEN_MAX + 64 <= MANAGER_MESSAGE_MAX);
const _: () = assert!(LOGIN_MESSAGE_MAX == 1103 && LOGIN_MESSAGE_MAX <= MANAGER_MESSAGE_MAX);
const _: () = assert!(
    FileAttr::LEN + HANDLE_MAC_LEN + 2 + SYMLINK_TARGET_MAX + 1 + FILE_ACCESS_LEN_MAX + 64 <= MANAGER_MESSAGE_MAX
);
const _: () = assert!(DRIVES_MAX * DriveStatus::LEN_MAX + 256 <= MANAGER_MESSAGE_MAX);
const _: () = assert!(XATTR_VALUE_MAX + XATTR_NAME_MAX + 2 * Handle::LEN + 4 * GROUPS_MAX + 256 <= MANAGER_MESSAGE_MAX);
const _: () = assert!(XATTRS_PER_INODE_MAX * (2 + XATTR_NAME_MAX) + 64 <= MANAGER_MESSAGE_MAX);
const _: () = assert!(WATCH_CHANGES_MAX * Change::LEN_MAX + 64 <= MANAGER_MESSAGE_MAX);
const _: () = assert!(SMALL_IO_MAX + Handle::LEN + 64 <= MANAGER_MESSAGE_MAX);
const _: () = assert!(COMPONENTS_MAX * (Component::LEN + 2 + DRIVE_ADDR_MAX) + 64 <= MANAGER_MESSAGE_MAX);

/// Operation codes of the manager protocol.
#[allow(missing_docs)]
pub mod manager_opcode {
    pub const LOGIN: u16 = 0x0001;
    pub const WALK: u16 = 0x0002;
    pub const LOOKUP: u16 = 0x0003;
    pub const GETATTR: u16 = 0x0004;
    pub const READDIR: u16 = 0x0005;
    pub const MKDIR: u16 = 0x0006;
    pub const CREATE: u16 = 0x0007;
    pub const SYMLINK: u16 = 0x0008;
    pub const LINK: u16 = 0x0009;
    pub const UNLINK: u16 = 0x000A;
    pub const RMDIR: u16 = 0x000B;
    pub const RENAME: u16 = 0x000C;
    pub const SETATTR: u16 = 0x000D;
    pub const COMMIT: u16 = 0x000E;
    pub const STATFS: u16 = 0x000F;
    pub const BEGIN_WRITE: u16 = 0x0010;
    pub const GET_LAYOUT: u16 = 0x0011;
    pub const SET_LAYOUT: u16 = 0x0012;
    pub const CLUSTER_STATUS: u16 = 0x0013;
    pub const AS_USER: u16 = 0x0014;
    pub const GETXATTR: u16 = 0x0015;
    pub const LISTXATTR: u16 = 0x0016;
    pub const SETXATTR: u16 = 0x0017;
    pub const REMOVEXATTR: u16 = 0x0018;
    pub const WATCH: u16 = 0x0019;
    pub const MKNOD: u16 = 0x001A;
    pub const GET_QUOTA: u16 = 0x001B;
    pub const LOGIN_IDENTITY: u16 = 0x001C;
    pub const READ_SMALL: u16 = 0x001D;
    pub const WRITE_SMALL: u16 = 0x001E;
    pub const GET_ACL: u16 = 0x001F;
    pub const SET_ACL: u16 = 0x0020;
    pub const GET_ROUTING: u16 = 0x0021;
    pub const SET_ROUTING: u16 = 0x0022;
    pub const REFRESH_PAL: u16 = 0x0023;
    pub const ABORT_WRITE: u16 = 0x0024;
    pub const SYNC: u16 = 0x0025;
    /// An envelope, not a request of its own: a trace id, then any request
    /// but a login (version 3).
    pub const TRACED: u16 = 0x0026;
    pub const ADD_USER: u16 = 0x0101;
    pub const LIST_USERS: u16 = 0x0102;
    pub const SET_PASSWORD: u16 = 0x0103;
    pub const ADD_DRIVE: u16 = 0x0104;
    pub const SET_DRIVE_STATE: u16 = 0x0105;
    pub const REPAIR: u16 = 0x0106;
    pub const SET_USER_GROUPS: u16 = 0x0107;
    pub const SET_GATEWAY: u16 = 0x0108;
    pub const SET_QUOTA: u16 = 0x0109;
    pub const SYNC_IDENTITY_KEYS: u16 = 0x010A;
}

/// What access a caller asks capabilities for with a name lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum OpenMode {
    /// No capability: attributes only.
    #[default]
    None = 0,
    /// Read rights; `PERMISSION_DENIED` unless the mode allows reading.
    Read = 1,
    /// Write rights, plus read rights if the mode allows reading (a `-w-`
    /// file opens write-only, as POSIX `O_WRONLY` would); `PERMISSION_DENIED`
    /// unless the mode allows writing.
    ReadWrite = 2,
    /// The best the mode allows: read-write, read-only, write-only or none.
    Best = 3,
    /// Read rights if the mode allows reading, else rights to read the
    /// object's attributes only (`GETATTR`); never write rights. For `stat`,
    /// which only wants the drive's size and times.
    ReadIfAllowed = 4,
    /// A client refreshing the capability of a file it has open for
    /// writing: as [`OpenMode::Best`], but the file's owner gets read and
    /// write rights whatever the mode (the "owner override" of Linux's NFS
    /// server: the owner could chmod the file anyway), so a file created
    /// read-only stays writable for its creator while it is open.
    RefreshWrite = 5,
}

impl OpenMode {
    fn decode(code: u8) -> Result<Self, DecodeError> {
        match code {
            0 => Ok(OpenMode::None),
            1 => Ok(OpenMode::Read),
            2 => Ok(OpenMode::ReadWrite),
            3 => Ok(OpenMode::Best),
            4 => Ok(OpenMode::ReadIfAllowed),
            5 => Ok(OpenMode::RefreshWrite),
            _ => Err(DecodeError::NotCanonical("unknown open mode")),
        }
    }
}

/// A file handle: an inode number and the manager's MAC over it, bound to
/// the user it was handed to (docs/SECURITY.md, "File handles"). Every
/// reply that names an inode carries one; every request that names an
/// inode takes one, and the manager checks its MAC before anything else
/// (`BAD_HANDLE`). Opaque to clients. `Debug` shows the inode number only.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    /// The inode it names.
    pub ino: Ino,
    /// The logical site the inode was made in (below
    /// [`ROUTING_SITES`](crate::routing::ROUTING_SITES)): where the client
    /// routes requests on it. A routing hint the MAC does not cover: any
    /// manager answers any request, and the manager never reads it.
    pub site: u8,
    /// The manager's MAC (`nasd_crypto::FileHandleKey`).
    pub mac: [u8; HANDLE_MAC_LEN],
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Handle(ino {} site {})", self.ino, self.site)
    }
}

impl Handle {
    /// Encoded length.
    pub const LEN: usize = 8 + 1 + HANDLE_MAC_LEN;

    /// Appends the canonical encoding: `ino u64`, `site u8`, `mac [32]`.
    pub fn encode(&self, w: &mut Writer) {
        w.u64(self.ino).u8(self.site).raw(&self.mac);
    }

    /// Reads the canonical encoding (a site at or past
    /// [`ROUTING_SITES`](crate::routing::ROUTING_SITES) is refused).
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let ino = r.u64()?;
        let site = decode_site(r)?;
        Ok(Handle { ino, site, mac: r.array()? })
    }
}

/// Which fields a `SETATTR` changes, as bits.
pub mod set_mask {
    /// Permission bits.
    pub const MODE: u8 = 1 << 0;
    /// Owner.
    pub const UID: u8 = 1 << 1;
    /// Group.
    pub const GID: u8 = 1 << 2;
    /// Length (truncate or extend).
    pub const SIZE: u8 = 1 << 3;
    /// Access time.
    pub const ATIME: u8 = 1 << 4;
    /// Modification time.
    pub const MTIME: u8 = 1 << 5;
    /// Not a field: the size change comes from a descriptor open for
    /// writing (`ftruncate`), so the file's owner may make it whatever the
    /// mode says (the owner could chmod the file anyway), as a write
    /// through that descriptor would.
    pub const OPEN_WRITER: u8 = 1 << 6;
    /// Every defined bit.
    pub const ALL: u8 = (1 << 7) - 1;
}

/// Whether a drive is in service (`SET_DRIVE_STATE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DriveState {
    /// In service: new components are placed on it.
    In = 0,
    /// Out of service: nothing new is placed on it, and its components are
    /// rebuilt on other drives (to replace or retire it).
    Out = 1,
}

impl DriveState {
    fn decode(code: u8) -> Result<Self, DecodeError> {
        match code {
            0 => Ok(DriveState::In),
            1 => Ok(DriveState::Out),
            _ => Err(DecodeError::NotCanonical("unknown drive state")),
        }
    }
}

/// What `REPAIR` starts. Each runs in the background; `CLUSTER_STATUS`
/// shows its progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RepairAction {
    /// Rebuild every stale or lost component now (without waiting for the
    /// rebuild delay after a drive went down).
    Rebuild = 1,
    /// Scrub every drive and heal the rotten blocks found from redundancy.
    Scrub = 2,
    /// Move components so every drive holds its share (after adding drives).
    Rebalance = 3,
}

impl RepairAction {
    fn decode(code: u8) -> Result<Self, DecodeError> {
        match code {
            1 => Ok(RepairAction::Rebuild),
            2 => Ok(RepairAction::Scrub),
            3 => Ok(RepairAction::Rebalance),
            _ => Err(DecodeError::NotCanonical("unknown repair action")),
        }
    }
}

/// A request to the manager. `Debug` shows every argument except passwords
/// and keys (redacted), so a request may be logged with `{:?}`.
#[allow(missing_docs)]
#[derive(Clone, PartialEq, Eq)]
pub enum ManagerRequest {
    /// Authenticate the connection. Must be the first request.
    Login {
        version: u8,
        user: String,
        password: String,
    },
    /// Authenticate the connection with an identity from the
    /// authentication server (DSFS): the credential and
    /// `identity_login_proof(idkey, credential)`. Must be the first request.
    /// The credential's 24 bytes are the manager's to check
    /// ([`crate::IdentityData::decode`] among the rest): one that does not
    /// decode is a wrong credential (`BAD_CREDENTIALS`), as one whose MAC
    /// does not verify, not a malformed request.
    LoginIdentity {
        version: u8,
        credential: [u8; crate::IDENTITY_DATA_LEN],
        proof: [u8; 32],
    },
    /// Administrator: fetch the authentication server's live shared keys
    /// now and install or retire them on every drive in service.
    SyncIdentityKeys,
    /// Resolve an absolute path.
    Walk {
        path: String,
        follow: bool,
        open: OpenMode,
    },
    /// Resolve one name in a directory.
    Lookup {
        parent: Handle,
        name: String,
        open: OpenMode,
    },
    /// Attributes by handle (and fresh capabilities, if `open`).
    GetAttr {
        handle: Handle,
        open: OpenMode,
    },
    /// Directory entries with names after `after`, at most `limit`.
    ReadDir {
        dir: Handle,
        after: String,
        limit: u16,
    },
    Mkdir {
        parent: Handle,
        name: String,
        mode: u32,
    },
    /// Create a regular file (or open an existing one unless `exclusive`),
    /// returning capabilities: read-write for a new file whatever its mode
    /// (POSIX `open` with `O_CREAT`), as [`OpenMode::ReadWrite`] for an
    /// existing one.
    Create {
        parent: Handle,
        name: String,
        mode: u32,
        exclusive: bool,
        truncate: bool,
    },
    Symlink {
        parent: Handle,
        name: String,
        target: String,
    },
    Link {
        handle: Handle,
        new_parent: Handle,
        new_name: String,
    },
    Unlink {
        parent: Handle,
        name: String,
    },
    Rmdir {
        parent: Handle,
        name: String,
    },
    Rename {
        parent: Handle,
        name: String,
        new_parent: Handle,
        new_name: String,
    },
    /// Change the fields in `mask` ([`set_mask`]).
    SetAttr {
        handle: Handle,
        mask: u8,
        mode: u32,
        uid: u32,
        gid: u32,
        size: u64,
        atime_ns: i64,
        mtime_ns: i64,
    },
    /// A writer checkpoints or is done: the manager commits write
    /// transaction `txn` (0: none open), records the file's size as at
    /// least `written_end` and at least what its data components hold, and
    /// marks the `missed` components stale over the `dirty` file ranges.
    Commit {
        handle: Handle,
        txn: u64,
        written_end: u64,
        missed: Vec<u8>,
        dirty: Vec<(u64, u64)>,
    },
    /// Space and drives.
    StatFs,
    /// Make every change the manager has acknowledged so far durable
    /// against power loss (one disk flush of its metadata, shared by
    /// concurrent `SYNC`s): a client's `fsync` after its `COMMIT`. Any
    /// session; `Done`.
    Sync,
    /// Open a write transaction on a file before writing it.
    BeginWrite {
        handle: Handle,
    },
    /// A file's or directory's layout (a directory's: what new files in it get).
    GetLayout {
        handle: Handle,
    },
    /// Set a directory's layout for new files (`None`: inherit from the
    /// parent again), or re-place an empty file with `layout`.
    SetLayout {
        handle: Handle,
        layout: Option<Layout>,
    },
    /// The cluster map, drive health and repair progress.
    ClusterStatus,
    /// Makes a special file: a FIFO, a socket or (the superuser only) a
    /// device with number `rdev` (0 for the others).
    Mknod {
        parent: Handle,
        name: String,
        kind: FileKind,
        mode: u32,
        rdev: u64,
    },
    /// A quota's limits and usage: one's own uid's (any user), any uid's
    /// (administrators), a directory's (anyone holding its handle).
    GetQuota {
        of: QuotaOf,
    },
    /// Reads up to `len` (at most [`SMALL_IO_MAX`]) bytes at `offset` of a
    /// regular file's bytes below its small-file threshold, from the
    /// metadata store (read permission). The reply (`SMALL_DATA`) stops at
    /// the threshold and at the end of the stored bytes: bytes past it up to
    /// the file's size read as zeros.
    ReadSmall {
        handle: Handle,
        offset: u64,
        len: u32,
    },
    /// Writes `data` (at most [`SMALL_IO_MAX`] bytes, ending at or below
    /// the file's small-file threshold) at `offset` into the metadata
    /// store, in one metadata transaction with the file's size (at least
    /// the end written), times and quota usage (write permission). Stable
    /// on the reply (`ENTRY`). `txn`: the caller's open write transaction on
    /// the file, 0 if none; refused with `BUSY` while another's is open.
    WriteSmall {
        handle: Handle,
        txn: u64,
        offset: u64,
        data: Vec<u8>,
    },
    /// Administrator: sets a quota's limits (`None`: unlimited; both
    /// `None` removes the quota).
    SetQuota {
        of: QuotaOf,
        bytes_limit: Option<u64>,
        files_limit: Option<u64>,
    },
    /// A gateway's request for one of its local users: `request` runs with
    /// `uid`, `gid` and `groups` as its caller. The session's user must
    /// hold a gateway grant ([`ManagerRequest::SetGateway`]) covering the
    /// uid and every group. Handles stay bound to the gateway's user.
    /// `request` is a name-space or file request (not `LOGIN`, `AS_USER`,
    /// `WATCH`, `CLUSTER_STATUS` or an administrator request).
    AsUser {
        uid: u32,
        gid: u32,
        groups: Vec<u32>,
        request: Box<ManagerRequest>,
    },
    /// An extended attribute's value.
    GetXattr {
        handle: Handle,
        name: String,
    },
    /// The names of the extended attributes the caller may see.
    ListXattr {
        handle: Handle,
    },
    /// Sets an extended attribute.
    SetXattr {
        handle: Handle,
        name: String,
        value: Vec<u8>,
        mode: XattrMode,
    },
    /// Removes an extended attribute.
    RemoveXattr {
        handle: Handle,
        name: String,
    },
    /// An inode's ACL: owner, group, mode and named entries. Needs only the
    /// handle (as `GETATTR`).
    GetAcl {
        handle: Handle,
    },
    /// Replaces an inode's named ACL entries (canonical, at most
    /// [`ACL_ENTRIES_MAX`]; [`ACL_INHERIT`](crate::acl::ACL_INHERIT) and
    /// [`ACL_SHARED`](crate::acl::ACL_SHARED) on a directory's only). The owner, the superuser, or a holder of
    /// [`ACL_SET_ACL`](crate::acl::ACL_SET_ACL) through an entry.
    SetAcl {
        handle: Handle,
        entries: Vec<AclEntry>,
    },
    /// A drive refused the caller's request by identity with `NOT_IN_PAL`
    /// on this regular file: the manager checks through the ACL that the
    /// caller holds `rights` (`ACL_READ`, `ACL_WRITE` or both, nothing
    /// else), and if so sets the file's flattened access PAL again on every
    /// component before answering `Done`; else `PERMISSION_DENIED`.
    RefreshPal {
        handle: Handle,
        rights: u8,
    },
    /// The writer gives up its open write transaction `txn` on the file
    /// (a write failed: it will not commit): the manager rolls it back on
    /// the drives at once — what it wrote, and the space and quota it held,
    /// go back now rather than when its lease runs out. Only the writer who
    /// began it (or an administrator). `Done`; `Done` too if it is already
    /// gone (committed, or rolled back).
    AbortWrite {
        handle: Handle,
        txn: u64,
    },
    /// The routing table the manager holds; the session routes by its
    /// version from then on (a later name-space request on the session is
    /// refused with `STALE_ROUTING` once the manager holds a newer one).
    GetRouting,
    /// Replaces the routing table in the database (administrators only):
    /// `table.version` must be one more than the stored version, else
    /// `STALE_ROUTING` (someone changed it first: fetch it and try again).
    SetRouting {
        table: RoutingTable,
    },
    /// The changes after `after` in the manager's change feed (incarnation
    /// `incarnation`), waiting up to `wait_ms` for one.
    Watch {
        incarnation: u64,
        after: u64,
        wait_ms: u32,
    },
    /// Administrator: add a user, with its supplementary groups (strictly
    /// ascending, at most [`GROUPS_MAX`]).
    AddUser {
        name: String,
        password: String,
        uid: u32,
        gid: u32,
        admin: bool,
        groups: Vec<u32>,
    },
    /// Administrator: replace a user's supplementary groups (strictly
    /// ascending, at most [`GROUPS_MAX`]; empty: none).
    SetUserGroups {
        name: String,
        groups: Vec<u32>,
    },
    /// Administrator: let user `name` act for the local users of the hosts
    /// it serves (`AS_USER`) whose uid and groups lie in `ids` (inclusive;
    /// `None`: no longer).
    SetGateway {
        name: String,
        ids: Option<(u32, u32)>,
    },
    /// Administrator: list users.
    ListUsers,
    /// Change a password (one's own, or anyone's as administrator).
    SetPassword {
        name: String,
        password: String,
    },
    /// Administrator: take a drive into service. The master key is the
    /// drive's, provisioned out of band; the manager replaces the drive key.
    AddDrive {
        addr: String,
        master_key: [u8; 32],
    },
    /// Administrator: take a drive out of service (its components are
    /// rebuilt elsewhere) or back in.
    SetDriveState {
        drive: u32,
        state: DriveState,
    },
    /// Administrator: start a repair task now.
    Repair {
        action: RepairAction,
    },
}

impl std::fmt::Display for ManagerRequest {
    /// The operation's name, never its arguments (passwords and keys).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Debug for ManagerRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const REDACTED: &str = "<redacted>";
        use ManagerRequest as R;
        match self {
            R::LoginIdentity { version, credential, .. } => f
                .debug_struct("LoginIdentity")
                .field("version", version)
                .field("credential", &crate::IdentityData::decode(credential))
                .finish_non_exhaustive(),
            R::SyncIdentityKeys => f.write_str("SyncIdentityKeys"),
            R::Login { version, user, password: _ } => f
                .debug_struct("Login")
                .field("version", version)
                .field("user", user)
                .field("password", &REDACTED)
                .finish(),
            R::Walk { path, follow, open } => {
                f.debug_struct("Walk").field("path", path).field("follow", follow).field("open", open).finish()
            }
            R::Lookup { parent, name, open } => {
                f.debug_struct("Lookup").field("parent", parent).field("name", name).field("open", open).finish()
            }
            R::GetAttr { handle, open } => {
                f.debug_struct("GetAttr").field("handle", handle).field("open", open).finish()
            }
            R::ReadDir { dir, after, limit } => {
                f.debug_struct("ReadDir").field("dir", dir).field("after", after).field("limit", limit).finish()
            }
            R::Mkdir { parent, name, mode } => {
                f.debug_struct("Mkdir").field("parent", parent).field("name", name).field("mode", mode).finish()
            }
            R::Create { parent, name, mode, exclusive, truncate } => f
                .debug_struct("Create")
                .field("parent", parent)
                .field("name", name)
                .field("mode", mode)
                .field("exclusive", exclusive)
                .field("truncate", truncate)
                .finish(),
            R::Symlink { parent, name, target } => {
                f.debug_struct("Symlink").field("parent", parent).field("name", name).field("target", target).finish()
            }
            R::Link { handle, new_parent, new_name } => f
                .debug_struct("Link")
                .field("handle", handle)
                .field("new_parent", new_parent)
                .field("new_name", new_name)
                .finish(),
            R::Unlink { parent, name } => f.debug_struct("Unlink").field("parent", parent).field("name", name).finish(),
            R::Rmdir { parent, name } => f.debug_struct("Rmdir").field("parent", parent).field("name", name).finish(),
            R::Rename { parent, name, new_parent, new_name } => f
                .debug_struct("Rename")
                .field("parent", parent)
                .field("name", name)
                .field("new_parent", new_parent)
                .field("new_name", new_name)
                .finish(),
            R::SetAttr { handle, mask, mode, uid, gid, size, atime_ns, mtime_ns } => f
                .debug_struct("SetAttr")
                .field("handle", handle)
                .field("mask", mask)
                .field("mode", mode)
                .field("uid", uid)
                .field("gid", gid)
                .field("size", size)
                .field("atime_ns", atime_ns)
                .field("mtime_ns", mtime_ns)
                .finish(),
            R::Commit { handle, txn, written_end, missed, dirty } => f
                .debug_struct("Commit")
                .field("handle", handle)
                .field("txn", txn)
                .field("written_end", written_end)
                .field("missed", missed)
                .field("dirty", dirty)
                .finish(),
            R::StatFs => f.write_str("StatFs"),
            R::Sync => f.write_str("Sync"),
            R::BeginWrite { handle } => f.debug_struct("BeginWrite").field("handle", handle).finish(),
            R::GetLayout { handle } => f.debug_struct("GetLayout").field("handle", handle).finish(),
            R::SetLayout { handle, layout } => {
                f.debug_struct("SetLayout").field("handle", handle).field("layout", layout).finish()
            }
            R::ClusterStatus => f.write_str("ClusterStatus"),
            R::SetDriveState { drive, state } => {
                f.debug_struct("SetDriveState").field("drive", drive).field("state", state).finish()
            }
            R::Repair { action } => f.debug_struct("Repair").field("action", action).finish(),
            R::AddUser { name, password: _, uid, gid, admin, groups } => f
                .debug_struct("AddUser")
                .field("name", name)
                .field("password", &REDACTED)
                .field("uid", uid)
                .field("gid", gid)
                .field("admin", admin)
                .field("groups", groups)
                .finish(),
            R::SetUserGroups { name, groups } => {
                f.debug_struct("SetUserGroups").field("name", name).field("groups", groups).finish()
            }
            R::SetGateway { name, ids } => f.debug_struct("SetGateway").field("name", name).field("ids", ids).finish(),
            R::AsUser { uid, gid, groups, request } => f
                .debug_struct("AsUser")
                .field("uid", uid)
                .field("gid", gid)
                .field("groups", groups)
                .field("request", request)
                .finish(),
            R::GetQuota { of } => f.debug_struct("GetQuota").field("of", of).finish(),
            R::ReadSmall { handle, offset, len } => {
                f.debug_struct("ReadSmall").field("handle", handle).field("offset", offset).field("len", len).finish()
            }
            R::WriteSmall { handle, txn, offset, data } => f
                .debug_struct("WriteSmall")
                .field("handle", handle)
                .field("txn", txn)
                .field("offset", offset)
                .field("len", &data.len())
                .finish(),
            R::SetQuota { of, bytes_limit, files_limit } => f
                .debug_struct("SetQuota")
                .field("of", of)
                .field("bytes_limit", bytes_limit)
                .field("files_limit", files_limit)
                .finish(),
            R::Mknod { parent, name, kind, mode, rdev } => f
                .debug_struct("Mknod")
                .field("parent", parent)
                .field("name", name)
                .field("kind", kind)
                .field("mode", mode)
                .field("rdev", rdev)
                .finish(),
            R::GetXattr { handle, name } => {
                f.debug_struct("GetXattr").field("handle", handle).field("name", name).finish()
            }
            R::ListXattr { handle } => f.debug_struct("ListXattr").field("handle", handle).finish(),
            R::SetXattr { handle, name, value, mode } => f
                .debug_struct("SetXattr")
                .field("handle", handle)
                .field("name", name)
                .field("value_len", &value.len())
                .field("mode", mode)
                .finish(),
            R::RemoveXattr { handle, name } => {
                f.debug_struct("RemoveXattr").field("handle", handle).field("name", name).finish()
            }
            R::GetAcl { handle } => f.debug_struct("GetAcl").field("handle", handle).finish(),
            R::AbortWrite { handle, txn } => {
                f.debug_struct("AbortWrite").field("handle", handle).field("txn", txn).finish()
            }
            R::RefreshPal { handle, rights } => {
                f.debug_struct("RefreshPal").field("handle", handle).field("rights", rights).finish()
            }
            R::GetRouting => f.write_str("GetRouting"),
            R::SetRouting { table } => f.debug_struct("SetRouting").field("table", table).finish(),
            R::SetAcl { handle, entries } => {
                f.debug_struct("SetAcl").field("handle", handle).field("entries", entries).finish()
            }
            R::Watch { incarnation, after, wait_ms } => f
                .debug_struct("Watch")
                .field("incarnation", incarnation)
                .field("after", after)
                .field("wait_ms", wait_ms)
                .finish(),
            R::ListUsers => f.write_str("ListUsers"),
            R::SetPassword { name, password: _ } => {
                f.debug_struct("SetPassword").field("name", name).field("password", &REDACTED).finish()
            }
            R::AddDrive { addr, master_key: _ } => {
                f.debug_struct("AddDrive").field("addr", addr).field("master_key", &REDACTED).finish()
            }
        }
    }
}

/// How `SETXATTR` treats an existing attribute (Linux `XATTR_CREATE`,
/// `XATTR_REPLACE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum XattrMode {
    /// Create it or replace it.
    #[default]
    Either = 0,
    /// Fail with `EXISTS` if it exists.
    Create = 1,
    /// Fail with `NO_XATTR` unless it exists.
    Replace = 2,
}

impl XattrMode {
    fn decode(code: u8) -> Result<Self, DecodeError> {
        match code {
            0 => Ok(XattrMode::Either),
            1 => Ok(XattrMode::Create),
            2 => Ok(XattrMode::Replace),
            _ => Err(DecodeError::NotCanonical("unknown setxattr mode")),
        }
    }
}

/// Whose quota a request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaOf {
    /// The inodes a user owns, by uid.
    User(u32),
    /// A directory's tree, by the directory's handle.
    Dir(Handle),
}

impl QuotaOf {
    fn encode(&self, w: &mut Writer) {
        match self {
            QuotaOf::User(uid) => {
                w.u8(1).u32(*uid);
            }
            QuotaOf::Dir(h) => {
                w.u8(2);
                h.encode(w);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.u8()? {
            1 => Ok(QuotaOf::User(r.u32()?)),
            2 => Ok(QuotaOf::Dir(Handle::decode(r)?)),
            _ => Err(DecodeError::NotCanonical("unknown quota subject")),
        }
    }
}

/// A quota as `GET_QUOTA` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QuotaInfo {
    /// Whether the subject has a quota (else every other field is empty).
    pub exists: bool,
    /// Most bytes (sizes of regular files); `None`: unlimited.
    pub bytes_limit: Option<u64>,
    /// Most inodes; `None`: unlimited.
    pub files_limit: Option<u64>,
    /// Bytes used.
    pub bytes_used: u64,
    /// Inodes used.
    pub files_used: u64,
    /// Bytes open write transactions hold in escrow against it.
    pub escrow: u64,
}

fn encode_opt(w: &mut Writer, v: Option<u64>) {
    w.bool(v.is_some());
    if let Some(v) = v {
        w.u64(v);
    }
}

fn decode_opt(r: &mut Reader<'_>) -> Result<Option<u64>, DecodeError> {
    Ok(if r.bool()? { Some(r.u64()?) } else { None })
}

/// One change a `WATCH` reports.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Change {
    /// The inode's attributes, data or extended attributes changed.
    Inode(Ino),
    /// A name in directory `dir` was added, removed or now names another
    /// inode.
    Entry {
        /// The directory.
        dir: Ino,
        /// The name in it.
        name: String,
    },
}

impl Change {
    /// Longest encoding: kind, inode, the longest name.
    pub const LEN_MAX: usize = 1 + 8 + 2 + FILE_NAME_MAX;

    fn encode(&self, w: &mut Writer) {
        match self {
            Change::Inode(ino) => {
                w.u8(1).u64(*ino);
            }
            Change::Entry { dir, name } => {
                w.u8(2).u64(*dir).str(name);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.u8()? {
            1 => Ok(Change::Inode(r.u64()?)),
            2 => Ok(Change::Entry { dir: r.u64()?, name: name(r)? }),
            _ => Err(DecodeError::NotCanonical("unknown change kind")),
        }
    }
}

/// Capabilities for every component object of a file, as the manager hands
/// them out with a lookup (one round trip): the layout, and per component
/// its binding (drive address and identity) and capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileAccess {
    /// How the file's bytes map onto the components.
    pub layout: Layout,
    /// The cluster map epoch the capabilities were minted under; a drive
    /// whose map moved past it answers `MAP_EPOCH_MOVED`.
    pub map_epoch: u32,
    /// `rights` bits of every capability.
    pub rights: u32,
    /// How long they are valid, in milliseconds from when the manager sent them.
    pub lifetime_ms: u32,
    /// Least protection the drives accept with them (`Protection` bits).
    pub min_protection: u8,
    /// MAC algorithm id of the capabilities.
    pub algorithm: u8,
    /// The file's small-file threshold: its bytes below this offset live in
    /// the metadata store and move with `READ_SMALL` / `WRITE_SMALL` through
    /// the manager; the components hold only the bytes at and past it (0:
    /// every byte is on the components). Fixed when the file is created.
    pub small_threshold: u32,
    /// One per component, in component order (`layout.components()` of them).
    pub components: Vec<ComponentAccess>,
}

/// One component's binding and capability.
#[derive(Clone, PartialEq, Eq)]
pub struct ComponentAccess {
    /// The object.
    pub object: ObjectRef,
    /// Whether it may be read (or used at all).
    pub state: ComponentState,
    /// The drive's address (`host:port`).
    pub drive_addr: String,
    /// The drive's identity (checked against its `HELLO`).
    pub drive_id: [u8; 16],
    /// The capability token (opaque to the client).
    pub token: Vec<u8>,
    /// The capability key.
    pub key: [u8; 32],
}

impl std::fmt::Debug for ComponentAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComponentAccess")
            .field("object", &self.object)
            .field("state", &self.state)
            .field("drive_addr", &self.drive_addr)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A drive in a `CLUSTER_STATUS` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveStatus {
    /// The manager's number for it.
    pub drive: u32,
    /// Its address.
    pub addr: String,
    /// Its failure domain (drives sharing one fail together; empty: its own).
    pub failure_domain: String,
    /// In or out of service.
    pub state: DriveState,
    /// Whether it answers heartbeats.
    pub up: bool,
    /// Capacity in bytes (as last reported).
    pub capacity_bytes: u64,
    /// Bytes in use (as last reported).
    pub used_bytes: u64,
    /// Component objects of files it holds.
    pub components: u64,
}

impl DriveStatus {
    /// Longest encoding.
    pub const LEN_MAX: usize = 4 + 2 + DRIVE_ADDR_MAX + 2 + NAME_LEN_MAX + 1 + 1 + 8 + 8 + 8;
}

/// Progress of a background task: 0 of 0 when idle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    /// Files done.
    pub files_done: u64,
    /// Files to do in all.
    pub files_total: u64,
    /// Bytes done.
    pub bytes_done: u64,
    /// Bytes to do in all.
    pub bytes_total: u64,
}

impl Progress {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.files_done).u64(self.files_total).u64(self.bytes_done).u64(self.bytes_total);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(Progress { files_done: r.u64()?, files_total: r.u64()?, bytes_done: r.u64()?, bytes_total: r.u64()? })
    }
}

/// What the last scrub found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScrubSummary {
    /// Blocks read and checked on every drive.
    pub blocks_checked: u64,
    /// Blocks that failed their stored digest.
    pub corrupt: u64,
    /// Of those, rewritten from redundancy.
    pub healed: u64,
    /// Of those, in files without redundancy left to heal them from.
    pub unrecoverable: u64,
}

/// The cluster as the manager sees it (`CLUSTER_STATUS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The cluster map epoch (changes with every change of drives or health).
    pub map_epoch: u32,
    /// Every drive.
    pub drives: Vec<DriveStatus>,
    /// Files with a component that is stale or on a drive that is down.
    pub files_degraded: u64,
    /// Rebuilding of stale and lost components.
    pub rebuild: Progress,
    /// Moving components onto new drives.
    pub rebalance: Progress,
    /// Scrubbing: blocks as `bytes`, drives as `files`.
    pub scrub: Progress,
    /// The last finished scrub.
    pub last_scrub: ScrubSummary,
}

/// A file's or directory's layout (`GET_LAYOUT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutInfo {
    /// The layout (a directory's: what new files in it get).
    pub layout: Layout,
    /// Set on this inode itself (a directory's may be inherited).
    pub explicit: bool,
    /// A file's components with their drive addresses (none for directories).
    pub components: Vec<(Component, String)>,
}

/// An inode as a reply carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Attributes.
    pub attr: FileAttr,
    /// The MAC of the handle that names it in later requests ([`Entry::handle`];
    /// the inode is `attr.ino`).
    pub handle_mac: [u8; HANDLE_MAC_LEN],
    /// The inode's logical site (the handle's [`Handle::site`]).
    pub site: u8,
    /// Symbolic-link target (empty for other kinds).
    pub target: String,
    /// Capabilities, when asked for and allowed (regular files only).
    pub access: Option<FileAccess>,
    /// The manager vouches that the inode had no extended attributes (of
    /// any namespace) when it read these attributes, so a client may answer
    /// `getxattr` (`NO_XATTR`) and `listxattr` (none) from them while it
    /// holds them valid. `false` says nothing: it may have some.
    pub no_xattrs: bool,
}

/// One drive in a `STATFS` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveUsage {
    /// The manager's number for it.
    pub drive: u32,
    /// Its address.
    pub addr: String,
    /// Whether it answered just now.
    pub online: bool,
    /// Capacity in bytes (0 if offline).
    pub capacity_bytes: u64,
    /// Bytes in use (0 if offline).
    pub used_bytes: u64,
}

/// A user in a `LIST_USERS` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// May run administrator requests.
    pub admin: bool,
    /// Supplementary groups, strictly ascending (at most [`GROUPS_MAX`]).
    pub groups: Vec<u32>,
    /// The ids (first, last) it may act for as a gateway (`AS_USER`), if any.
    pub gateway: Option<(u32, u32)>,
}

impl UserInfo {
    /// Longest encoding: name, uid, gid, admin, the most groups, a gateway range.
    pub const LEN_MAX: usize = 2 + USER_NAME_MAX + 4 + 4 + 1 + 2 + 4 * GROUPS_MAX + 1 + 8;

    fn encode(&self, w: &mut Writer) {
        w.str(&self.name).u32(self.uid).u32(self.gid).bool(self.admin);
        encode_groups(w, &self.groups);
        w.bool(self.gateway.is_some());
        if let Some((lo, hi)) = self.gateway {
            w.u32(lo).u32(hi);
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(UserInfo {
            name: r.str(USER_NAME_MAX, "user")?,
            uid: r.u32()?,
            gid: r.u32()?,
            admin: r.bool()?,
            groups: decode_groups(r)?,
            gateway: match r.bool()? {
                false => None,
                true => match (r.u32()?, r.u32()?) {
                    (lo, hi) if lo <= hi => Some((lo, hi)),
                    _ => return Err(DecodeError::NotCanonical("gateway id range runs backwards")),
                },
            },
        })
    }
}

/// Appends a group list: `count u16`, that many `u32`.
fn encode_groups(w: &mut Writer, groups: &[u32]) {
    assert!(groups.len() <= GROUPS_MAX, "group list over GROUPS_MAX");
    w.u16(groups.len() as u16);
    for g in groups {
        w.u32(*g);
    }
}

/// Reads a group list: at most [`GROUPS_MAX`], strictly ascending.
fn decode_groups(r: &mut Reader<'_>) -> Result<Vec<u32>, DecodeError> {
    let n = r.count(GROUPS_MAX, "groups")?;
    let groups = (0..n).map(|_| r.u32()).collect::<Result<Vec<_>, _>>()?;
    validate_groups(&groups).map_err(DecodeError::NotCanonical)?;
    Ok(groups)
}

/// [`validate_groups`] as [`ManagerRequest::check_limits`] reports it.
fn check_groups(groups: &[u32]) -> Result<(), DecodeError> {
    if groups.len() > GROUPS_MAX {
        return Err(DecodeError::OverLimit { field: "groups", len: groups.len() as u64, max: GROUPS_MAX as u64 });
    }
    validate_groups(groups).map_err(DecodeError::NotCanonical)
}

/// The result of a successful request.
#[allow(missing_docs)]
// One reply exists per request and is encoded at once: an `Entry` inline costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManagerReply {
    /// `LOGIN`: who the connection is.
    LoggedIn { version: u8, uid: u32, gid: u32, admin: bool },
    /// `WALK`, `LOOKUP`, `GETATTR`, `MKDIR`, `CREATE`, `SYMLINK`, `LINK`, `SETATTR`, `CLOSE`: the entry
    /// carries the MAC of the inode's handle for the caller ([`Entry::handle`]).
    Entry(Entry),
    /// `READDIR` of a directory the caller may read and search: entries in
    /// name order; `more` if the directory has more after them.
    Dir { entries: Vec<(String, Entry)>, more: bool },
    /// `READDIR` of a directory the caller may read but not search: names
    /// and kinds only (POSIX needs search permission to stat an entry).
    Names { names: Vec<(String, FileKind)>, more: bool },
    /// `UNLINK`, `RMDIR`, `RENAME`, `ADD_USER`, `SET_PASSWORD`.
    Done,
    /// `STATFS`.
    StatFs { inodes: u64, file_bytes: u64, drives: Vec<DriveUsage> },
    /// `LIST_USERS`.
    Users(Vec<UserInfo>),
    /// `ADD_DRIVE`: the number the manager gave it.
    DriveAdded { drive: u32 },
    /// `BEGIN_WRITE`: the transaction to write under, how long it may stay
    /// open (a writer commits before then; the manager aborts it after),
    /// and the file's size plus the quota escrow reserved for it (the bytes
    /// its data may grow by; `u64::MAX`: no quota limits it). A `COMMIT`
    /// growing the data by more, with no room left in the quota, is refused
    /// with `QUOTA_EXCEEDED` and rolled back.
    Began { txn: u64, lease_ms: u32, size_limit: u64 },
    /// `GET_QUOTA`.
    Quota(QuotaInfo),
    /// `GET_LAYOUT`.
    Layout(LayoutInfo),
    /// `CLUSTER_STATUS`.
    Status(ClusterStatus),
    /// `GETXATTR`: the value.
    Xattr(Vec<u8>),
    /// `LISTXATTR`: the names, in byte order.
    XattrNames(Vec<String>),
    /// `READ_SMALL`: the bytes read (at most [`SMALL_IO_MAX`]).
    SmallData(Vec<u8>),
    /// `GET_ACL`, `SET_ACL`: the inode's ACL.
    Acl(AclInfo),
    /// `GET_ROUTING`, `SET_ROUTING`: the routing table the manager holds.
    Routing(RoutingTable),
    /// `WATCH`: the changes after the request's `after`, in order, up to
    /// `next` (ask again with it). `lost`: changes were missed (the feed
    /// moved past `after`, or the manager restarted: `incarnation` is new);
    /// the watcher must drop everything it caches.
    Changes { incarnation: u64, next: u64, lost: bool, changes: Vec<Change> },
}

fn decode_site(r: &mut Reader<'_>) -> Result<u8, DecodeError> {
    let site = r.u8()?;
    if usize::from(site) >= crate::routing::ROUTING_SITES {
        return Err(DecodeError::NotCanonical("site past ROUTING_SITES"));
    }
    Ok(site)
}

fn name(r: &mut Reader<'_>) -> Result<String, DecodeError> {
    r.str(FILE_NAME_MAX, "name")
}

impl ManagerRequest {
    /// The operation code.
    pub fn opcode(&self) -> u16 {
        use manager_opcode::*;
        match self {
            ManagerRequest::Login { .. } => LOGIN,
            ManagerRequest::LoginIdentity { .. } => LOGIN_IDENTITY,
            ManagerRequest::SyncIdentityKeys => SYNC_IDENTITY_KEYS,
            ManagerRequest::Walk { .. } => WALK,
            ManagerRequest::Lookup { .. } => LOOKUP,
            ManagerRequest::GetAttr { .. } => GETATTR,
            ManagerRequest::ReadDir { .. } => READDIR,
            ManagerRequest::Mkdir { .. } => MKDIR,
            ManagerRequest::Create { .. } => CREATE,
            ManagerRequest::Symlink { .. } => SYMLINK,
            ManagerRequest::Link { .. } => LINK,
            ManagerRequest::Unlink { .. } => UNLINK,
            ManagerRequest::Rmdir { .. } => RMDIR,
            ManagerRequest::Rename { .. } => RENAME,
            ManagerRequest::SetAttr { .. } => SETATTR,
            ManagerRequest::Commit { .. } => COMMIT,
            ManagerRequest::StatFs => STATFS,
            ManagerRequest::Sync => SYNC,
            ManagerRequest::BeginWrite { .. } => BEGIN_WRITE,
            ManagerRequest::GetLayout { .. } => GET_LAYOUT,
            ManagerRequest::SetLayout { .. } => SET_LAYOUT,
            ManagerRequest::ClusterStatus => CLUSTER_STATUS,
            ManagerRequest::SetDriveState { .. } => SET_DRIVE_STATE,
            ManagerRequest::Repair { .. } => REPAIR,
            ManagerRequest::AddUser { .. } => ADD_USER,
            ManagerRequest::SetUserGroups { .. } => SET_USER_GROUPS,
            ManagerRequest::SetGateway { .. } => SET_GATEWAY,
            ManagerRequest::AsUser { .. } => AS_USER,
            ManagerRequest::GetXattr { .. } => GETXATTR,
            ManagerRequest::ListXattr { .. } => LISTXATTR,
            ManagerRequest::SetXattr { .. } => SETXATTR,
            ManagerRequest::RemoveXattr { .. } => REMOVEXATTR,
            ManagerRequest::GetAcl { .. } => GET_ACL,
            ManagerRequest::SetAcl { .. } => SET_ACL,
            ManagerRequest::RefreshPal { .. } => REFRESH_PAL,
            ManagerRequest::AbortWrite { .. } => ABORT_WRITE,
            ManagerRequest::GetRouting => GET_ROUTING,
            ManagerRequest::SetRouting { .. } => SET_ROUTING,
            ManagerRequest::Watch { .. } => WATCH,
            ManagerRequest::Mknod { .. } => MKNOD,
            ManagerRequest::GetQuota { .. } => GET_QUOTA,
            ManagerRequest::ReadSmall { .. } => READ_SMALL,
            ManagerRequest::WriteSmall { .. } => WRITE_SMALL,
            ManagerRequest::SetQuota { .. } => SET_QUOTA,
            ManagerRequest::ListUsers => LIST_USERS,
            ManagerRequest::SetPassword { .. } => SET_PASSWORD,
            ManagerRequest::AddDrive { .. } => ADD_DRIVE,
        }
    }

    /// Every file handle the request names (the manager checks them all
    /// before anything else).
    pub fn handles(&self) -> Vec<Handle> {
        use ManagerRequest as R;
        match self {
            R::Lookup { parent, .. }
            | R::Mkdir { parent, .. }
            | R::Create { parent, .. }
            | R::Symlink { parent, .. }
            | R::Mknod { parent, .. }
            | R::Unlink { parent, .. }
            | R::Rmdir { parent, .. } => vec![*parent],
            R::ReadDir { dir, .. } => vec![*dir],
            R::GetAttr { handle, .. }
            | R::SetAttr { handle, .. }
            | R::Commit { handle, .. }
            | R::BeginWrite { handle }
            | R::GetLayout { handle }
            | R::SetLayout { handle, .. }
            | R::GetXattr { handle, .. }
            | R::ListXattr { handle }
            | R::SetXattr { handle, .. }
            | R::RemoveXattr { handle, .. }
            | R::ReadSmall { handle, .. }
            | R::WriteSmall { handle, .. }
            | R::GetAcl { handle }
            | R::RefreshPal { handle, .. }
            | R::AbortWrite { handle, .. }
            | R::SetAcl { handle, .. } => vec![*handle],
            R::AsUser { request, .. } => request.handles(),
            R::GetQuota { of: QuotaOf::Dir(h) } | R::SetQuota { of: QuotaOf::Dir(h), .. } => vec![*h],
            R::GetQuota { of: QuotaOf::User(_) } | R::SetQuota { of: QuotaOf::User(_), .. } => Vec::new(),
            R::Link { handle, new_parent, .. } => vec![*handle, *new_parent],
            R::Rename { parent, new_parent, .. } => vec![*parent, *new_parent],
            R::Login { .. }
            | R::LoginIdentity { .. }
            | R::SyncIdentityKeys
            | R::GetRouting
            | R::SetRouting { .. }
            | R::Walk { .. }
            | R::StatFs
            | R::Sync
            | R::AddUser { .. }
            | R::SetUserGroups { .. }
            | R::SetGateway { .. }
            | R::Watch { .. }
            | R::ListUsers
            | R::SetPassword { .. }
            | R::AddDrive { .. }
            | R::ClusterStatus
            | R::SetDriveState { .. }
            | R::Repair { .. } => Vec::new(),
        }
    }

    /// Whether `AS_USER` may wrap this request: name-space and file
    /// requests, not `LOGIN`, `AS_USER`, `WATCH`, `CLUSTER_STATUS` or an
    /// administrator request.
    pub fn may_run_as_user(&self) -> bool {
        use ManagerRequest as R;
        match self {
            R::Walk { .. }
            | R::Lookup { .. }
            | R::GetAttr { .. }
            | R::ReadDir { .. }
            | R::Mkdir { .. }
            | R::Create { .. }
            | R::Symlink { .. }
            | R::Mknod { .. }
            | R::Link { .. }
            | R::Unlink { .. }
            | R::Rmdir { .. }
            | R::Rename { .. }
            | R::SetAttr { .. }
            | R::Commit { .. }
            | R::StatFs
            | R::BeginWrite { .. }
            | R::GetLayout { .. }
            | R::SetLayout { .. }
            | R::GetXattr { .. }
            | R::ListXattr { .. }
            | R::SetXattr { .. }
            | R::RemoveXattr { .. }
            | R::GetQuota { .. }
            | R::ReadSmall { .. }
            | R::WriteSmall { .. }
            | R::GetAcl { .. }
            | R::RefreshPal { .. }
            | R::AbortWrite { .. }
            | R::SetAcl { .. } => true,
            R::Login { .. }
            | R::LoginIdentity { .. }
            | R::SyncIdentityKeys
            | R::GetRouting
            | R::SetRouting { .. }
            | R::AsUser { .. }
            | R::Watch { .. }
            | R::Sync
            | R::ClusterStatus
            | R::SetDriveState { .. }
            | R::Repair { .. }
            | R::AddUser { .. }
            | R::SetUserGroups { .. }
            | R::SetGateway { .. }
            | R::SetQuota { .. }
            | R::ListUsers
            | R::SetPassword { .. }
            | R::AddDrive { .. } => false,
        }
    }

    /// The operation's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            ManagerRequest::Login { .. } => "login",
            ManagerRequest::LoginIdentity { .. } => "login-identity",
            ManagerRequest::SyncIdentityKeys => "sync-identity-keys",
            ManagerRequest::Walk { .. } => "walk",
            ManagerRequest::Lookup { .. } => "lookup",
            ManagerRequest::GetAttr { .. } => "getattr",
            ManagerRequest::ReadDir { .. } => "readdir",
            ManagerRequest::Mkdir { .. } => "mkdir",
            ManagerRequest::Create { .. } => "create",
            ManagerRequest::Symlink { .. } => "symlink",
            ManagerRequest::Link { .. } => "link",
            ManagerRequest::Unlink { .. } => "unlink",
            ManagerRequest::Rmdir { .. } => "rmdir",
            ManagerRequest::Rename { .. } => "rename",
            ManagerRequest::SetAttr { .. } => "setattr",
            ManagerRequest::Commit { .. } => "commit",
            ManagerRequest::StatFs => "statfs",
            ManagerRequest::Sync => "sync",
            ManagerRequest::BeginWrite { .. } => "begin-write",
            ManagerRequest::GetLayout { .. } => "get-layout",
            ManagerRequest::SetLayout { .. } => "set-layout",
            ManagerRequest::ClusterStatus => "cluster-status",
            ManagerRequest::SetDriveState { .. } => "set-drive-state",
            ManagerRequest::Repair { .. } => "repair",
            ManagerRequest::AddUser { .. } => "add-user",
            ManagerRequest::SetUserGroups { .. } => "set-user-groups",
            ManagerRequest::SetGateway { .. } => "set-gateway",
            ManagerRequest::AsUser { request, .. } => request.name(),
            ManagerRequest::GetXattr { .. } => "getxattr",
            ManagerRequest::ListXattr { .. } => "listxattr",
            ManagerRequest::SetXattr { .. } => "setxattr",
            ManagerRequest::RemoveXattr { .. } => "removexattr",
            ManagerRequest::GetAcl { .. } => "get-acl",
            ManagerRequest::SetAcl { .. } => "set-acl",
            ManagerRequest::RefreshPal { .. } => "refresh-pal",
            ManagerRequest::AbortWrite { .. } => "abort-write",
            ManagerRequest::GetRouting => "get-routing",
            ManagerRequest::SetRouting { .. } => "set-routing",
            ManagerRequest::Watch { .. } => "watch",
            ManagerRequest::Mknod { .. } => "mknod",
            ManagerRequest::GetQuota { .. } => "get-quota",
            ManagerRequest::ReadSmall { .. } => "read-small",
            ManagerRequest::WriteSmall { .. } => "write-small",
            ManagerRequest::SetQuota { .. } => "set-quota",
            ManagerRequest::ListUsers => "list-users",
            ManagerRequest::SetPassword { .. } => "set-password",
            ManagerRequest::AddDrive { .. } => "add-drive",
        }
    }

    /// Checks every string against the limit [`decode`](Self::decode)
    /// enforces, so a sender can refuse what the manager would (and what
    /// [`encode`](Self::encode) cannot length-prefix) before sending it.
    pub fn check_limits(&self) -> Result<(), DecodeError> {
        use ManagerRequest as R;
        let within = |field: &'static str, s: &str, max: usize| {
            if s.len() > max {
                Err(DecodeError::OverLimit { field, len: s.len() as u64, max: max as u64 })
            } else {
                Ok(())
            }
        };
        match self {
            R::Login { user, password, .. } => {
                within("user", user, USER_NAME_MAX)?;
                within("password", password, PASSWORD_MAX)
            }
            R::AddUser { name, password, groups, .. } => {
                within("user", name, USER_NAME_MAX)?;
                within("password", password, PASSWORD_MAX)?;
                check_groups(groups)
            }
            R::SetUserGroups { name, groups } => {
                within("user", name, USER_NAME_MAX)?;
                check_groups(groups)
            }
            R::SetPassword { name, password } => {
                within("user", name, USER_NAME_MAX)?;
                within("password", password, PASSWORD_MAX)
            }
            R::SetGateway { name, ids } => {
                within("user", name, USER_NAME_MAX)?;
                match ids {
                    Some((lo, hi)) if lo > hi => Err(DecodeError::NotCanonical("gateway id range runs backwards")),
                    _ => Ok(()),
                }
            }
            R::AsUser { groups, request, .. } => {
                check_groups(groups)?;
                if !request.may_run_as_user() {
                    return Err(DecodeError::NotCanonical("AS_USER wraps a name-space or file request only"));
                }
                request.check_limits()
            }
            R::GetXattr { name, .. } | R::RemoveXattr { name, .. } => check_xattr_name(name),
            R::SetXattr { name, value, .. } => {
                check_xattr_name(name)?;
                if value.len() > XATTR_VALUE_MAX {
                    return Err(DecodeError::OverLimit {
                        field: "xattr value",
                        len: value.len() as u64,
                        max: XATTR_VALUE_MAX as u64,
                    });
                }
                Ok(())
            }
            R::SetAcl { entries, .. } => {
                if entries.len() > ACL_ENTRIES_MAX {
                    return Err(DecodeError::OverLimit {
                        field: "ACL entries",
                        len: entries.len() as u64,
                        max: ACL_ENTRIES_MAX as u64,
                    });
                }
                validate_acl(entries).map_err(DecodeError::NotCanonical)
            }
            R::RefreshPal { rights, .. } => refresh_pal_rights(*rights).map(|_| ()),
            R::Watch { wait_ms, .. } => {
                if *wait_ms > WATCH_WAIT_MAX_MS {
                    return Err(DecodeError::OverLimit {
                        field: "watch wait",
                        len: u64::from(*wait_ms),
                        max: u64::from(WATCH_WAIT_MAX_MS),
                    });
                }
                Ok(())
            }
            R::Walk { path, .. } => within("path", path, PATH_MAX),
            R::ReadDir { after: name, .. }
            | R::Lookup { name, .. }
            | R::Mkdir { name, .. }
            | R::Create { name, .. }
            | R::Unlink { name, .. }
            | R::Rmdir { name, .. }
            | R::Link { new_name: name, .. } => within("name", name, FILE_NAME_MAX),
            R::Mknod { name, kind, rdev, .. } => {
                within("name", name, FILE_NAME_MAX)?;
                if !kind.is_special() {
                    return Err(DecodeError::NotCanonical("MKNOD makes FIFOs, sockets and devices only"));
                }
                if *rdev != 0 && !kind.is_device() {
                    return Err(DecodeError::NotCanonical("a device number for an inode that is not a device"));
                }
                Ok(())
            }
            R::Symlink { name, target, .. } => {
                within("name", name, FILE_NAME_MAX)?;
                within("target", target, SYMLINK_TARGET_MAX)
            }
            R::Rename { name, new_name, .. } => {
                within("name", name, FILE_NAME_MAX)?;
                within("name", new_name, FILE_NAME_MAX)
            }
            R::AddDrive { addr, .. } => within("drive address", addr, DRIVE_ADDR_MAX),
            R::Commit { missed, dirty, .. } => {
                if missed.len() > COMPONENTS_MAX {
                    return Err(DecodeError::OverLimit {
                        field: "missed components",
                        len: missed.len() as u64,
                        max: COMPONENTS_MAX as u64,
                    });
                }
                if dirty.len() > DIRTY_RANGES_MAX {
                    return Err(DecodeError::OverLimit {
                        field: "dirty ranges",
                        len: dirty.len() as u64,
                        max: DIRTY_RANGES_MAX as u64,
                    });
                }
                Ok(())
            }
            R::ReadSmall { len, .. } if *len as usize > SMALL_IO_MAX => {
                Err(DecodeError::OverLimit { field: "small read", len: *len as u64, max: SMALL_IO_MAX as u64 })
            }
            R::WriteSmall { data, .. } if data.len() > SMALL_IO_MAX => Err(DecodeError::OverLimit {
                field: "small-file data",
                len: data.len() as u64,
                max: SMALL_IO_MAX as u64,
            }),
            R::ReadSmall { .. }
            | R::WriteSmall { .. }
            | R::GetAttr { .. }
            | R::LoginIdentity { .. }
            | R::SyncIdentityKeys
            | R::SetAttr { .. }
            | R::ListXattr { .. }
            | R::GetAcl { .. }
            | R::GetQuota { .. }
            | R::SetQuota { .. }
            | R::StatFs
            | R::Sync
            | R::ListUsers
            | R::BeginWrite { .. }
            | R::AbortWrite { .. }
            | R::GetLayout { .. }
            | R::SetLayout { .. }
            | R::ClusterStatus
            | R::SetDriveState { .. }
            | R::GetRouting
            | R::Repair { .. } => Ok(()),
            R::SetRouting { table } => table.validate(),
        }
    }

    /// The message body: opcode, request id, arguments.
    ///
    /// # Panics
    /// If a string is longer than `u16::MAX` bytes; call
    /// [`check_limits`](Self::check_limits) first on untrusted input.
    pub fn encode(&self, request_id: u64) -> Vec<u8> {
        let mut w = Writer::with_capacity(64);
        w.u16(self.opcode()).u64(request_id);
        match self {
            ManagerRequest::Login { version, user, password } => {
                w.u8(*version).str(user).str(password);
            }
            ManagerRequest::LoginIdentity { version, credential, proof } => {
                w.u8(*version).raw(credential).raw(proof);
            }
            ManagerRequest::SyncIdentityKeys => {}
            ManagerRequest::Walk { path, follow, open } => {
                w.str(path).bool(*follow).u8(*open as u8);
            }
            ManagerRequest::Lookup { parent, name, open } => {
                parent.encode(&mut w);
                w.str(name).u8(*open as u8);
            }
            ManagerRequest::GetAttr { handle, open } => {
                handle.encode(&mut w);
                w.u8(*open as u8);
            }
            ManagerRequest::ReadDir { dir, after, limit } => {
                dir.encode(&mut w);
                w.str(after).u16(*limit);
            }
            ManagerRequest::Mkdir { parent, name, mode } => {
                parent.encode(&mut w);
                w.str(name).u32(*mode);
            }
            ManagerRequest::Create { parent, name, mode, exclusive, truncate } => {
                parent.encode(&mut w);
                w.str(name).u32(*mode).bool(*exclusive).bool(*truncate);
            }
            ManagerRequest::Symlink { parent, name, target } => {
                parent.encode(&mut w);
                w.str(name).str(target);
            }
            ManagerRequest::Link { handle, new_parent, new_name } => {
                handle.encode(&mut w);
                new_parent.encode(&mut w);
                w.str(new_name);
            }
            ManagerRequest::Unlink { parent, name } | ManagerRequest::Rmdir { parent, name } => {
                parent.encode(&mut w);
                w.str(name);
            }
            ManagerRequest::Rename { parent, name, new_parent, new_name } => {
                parent.encode(&mut w);
                w.str(name);
                new_parent.encode(&mut w);
                w.str(new_name);
            }
            ManagerRequest::SetAttr { handle, mask, mode, uid, gid, size, atime_ns, mtime_ns } => {
                handle.encode(&mut w);
                w.u8(*mask).u32(*mode).u32(*uid).u32(*gid).u64(*size);
                w.u64(*atime_ns as u64).u64(*mtime_ns as u64);
            }
            ManagerRequest::Commit { handle, txn, written_end, missed, dirty } => {
                handle.encode(&mut w);
                w.u64(*txn).u64(*written_end).u16(missed.len() as u16);
                for m in missed {
                    w.u8(*m);
                }
                w.u16(dirty.len() as u16);
                for (offset, length) in dirty {
                    w.u64(*offset).u64(*length);
                }
            }
            ManagerRequest::BeginWrite { handle } | ManagerRequest::GetLayout { handle } => {
                handle.encode(&mut w);
            }
            ManagerRequest::SetLayout { handle, layout } => {
                handle.encode(&mut w);
                w.bool(layout.is_some());
                if let Some(l) = layout {
                    l.encode(&mut w);
                }
            }
            ManagerRequest::SetDriveState { drive, state } => {
                w.u32(*drive).u8(*state as u8);
            }
            ManagerRequest::Repair { action } => {
                w.u8(*action as u8);
            }
            ManagerRequest::StatFs
            | ManagerRequest::Sync
            | ManagerRequest::ListUsers
            | ManagerRequest::ClusterStatus
            | ManagerRequest::GetRouting => {}
            ManagerRequest::SetRouting { table } => table.encode(&mut w),
            ManagerRequest::AddUser { name, password, uid, gid, admin, groups } => {
                w.str(name).str(password).u32(*uid).u32(*gid).bool(*admin);
                encode_groups(&mut w, groups);
            }
            ManagerRequest::SetUserGroups { name, groups } => {
                w.str(name);
                encode_groups(&mut w, groups);
            }
            ManagerRequest::SetPassword { name, password } => {
                w.str(name).str(password);
            }
            ManagerRequest::AddDrive { addr, master_key } => {
                w.str(addr).raw(master_key);
            }
            ManagerRequest::SetGateway { name, ids } => {
                w.str(name).bool(ids.is_some());
                if let Some((lo, hi)) = ids {
                    w.u32(*lo).u32(*hi);
                }
            }
            ManagerRequest::AsUser { uid, gid, groups, request } => {
                w.u32(*uid).u32(*gid);
                encode_groups(&mut w, groups);
                // The wrapped request without its request id: opcode, arguments.
                let inner = request.encode(request_id);
                w.raw(&inner[..2]).raw(&inner[10..]);
            }
            ManagerRequest::GetXattr { handle, name } | ManagerRequest::RemoveXattr { handle, name } => {
                handle.encode(&mut w);
                w.str(name);
            }
            ManagerRequest::ListXattr { handle } | ManagerRequest::GetAcl { handle } => {
                handle.encode(&mut w);
            }
            ManagerRequest::SetAcl { handle, entries } => {
                handle.encode(&mut w);
                encode_acl(&mut w, entries);
            }
            ManagerRequest::RefreshPal { handle, rights } => {
                handle.encode(&mut w);
                w.u8(*rights);
            }
            ManagerRequest::AbortWrite { handle, txn } => {
                handle.encode(&mut w);
                w.u64(*txn);
            }
            ManagerRequest::SetXattr { handle, name, value, mode } => {
                handle.encode(&mut w);
                w.str(name);
                encode_xattr_value(&mut w, value);
                w.u8(*mode as u8);
            }
            ManagerRequest::Watch { incarnation, after, wait_ms } => {
                w.u64(*incarnation).u64(*after).u32(*wait_ms);
            }
            ManagerRequest::Mknod { parent, name, kind, mode, rdev } => {
                parent.encode(&mut w);
                w.str(name).u8(kind.code()).u32(*mode).u64(*rdev);
            }
            ManagerRequest::GetQuota { of } => of.encode(&mut w),
            ManagerRequest::ReadSmall { handle, offset, len } => {
                handle.encode(&mut w);
                w.u64(*offset).u32(*len);
            }
            ManagerRequest::WriteSmall { handle, txn, offset, data } => {
                assert!(data.len() <= SMALL_IO_MAX, "WRITE_SMALL over SMALL_IO_MAX");
                handle.encode(&mut w);
                w.u64(*txn).u64(*offset).u32(data.len() as u32).raw(data);
            }
            ManagerRequest::SetQuota { of, bytes_limit, files_limit } => {
                of.encode(&mut w);
                encode_opt(&mut w, *bytes_limit);
                encode_opt(&mut w, *files_limit);
            }
        }
        w.into_vec()
    }

    /// Parses a message body into the request id and the request.
    pub fn decode(body: &[u8]) -> Result<(u64, Self), DecodeError> {
        use manager_opcode::*;
        let mut r = Reader::new(body);
        let opcode = r.u16()?;
        let id = r.u64()?;
        let req = match opcode {
            LOGIN => ManagerRequest::Login {
                version: r.u8()?,
                user: r.str(USER_NAME_MAX, "user")?,
                password: r.str(PASSWORD_MAX, "password")?,
            },
            LOGIN_IDENTITY => {
                ManagerRequest::LoginIdentity { version: r.u8()?, credential: r.array()?, proof: r.array()? }
            }
            SYNC_IDENTITY_KEYS => ManagerRequest::SyncIdentityKeys,
            WALK => ManagerRequest::Walk {
                path: r.str(PATH_MAX, "path")?,
                follow: r.bool()?,
                open: OpenMode::decode(r.u8()?)?,
            },
            LOOKUP => ManagerRequest::Lookup {
                parent: Handle::decode(&mut r)?,
                name: name(&mut r)?,
                open: OpenMode::decode(r.u8()?)?,
            },
            GETATTR => ManagerRequest::GetAttr { handle: Handle::decode(&mut r)?, open: OpenMode::decode(r.u8()?)? },
            READDIR => ManagerRequest::ReadDir { dir: Handle::decode(&mut r)?, after: name(&mut r)?, limit: r.u16()? },
            MKDIR => {
                ManagerRequest::Mkdir { parent: Handle::decode(&mut r)?, name: name(&mut r)?, mode: mode(&mut r)? }
            }
            CREATE => ManagerRequest::Create {
                parent: Handle::decode(&mut r)?,
                name: name(&mut r)?,
                mode: mode(&mut r)?,
                exclusive: r.bool()?,
                truncate: r.bool()?,
            },
            SYMLINK => ManagerRequest::Symlink {
                parent: Handle::decode(&mut r)?,
                name: name(&mut r)?,
                target: r.str(SYMLINK_TARGET_MAX, "target")?,
            },
            LINK => ManagerRequest::Link {
                handle: Handle::decode(&mut r)?,
                new_parent: Handle::decode(&mut r)?,
                new_name: name(&mut r)?,
            },
            UNLINK => ManagerRequest::Unlink { parent: Handle::decode(&mut r)?, name: name(&mut r)? },
            RMDIR => ManagerRequest::Rmdir { parent: Handle::decode(&mut r)?, name: name(&mut r)? },
            RENAME => ManagerRequest::Rename {
                parent: Handle::decode(&mut r)?,
                name: name(&mut r)?,
                new_parent: Handle::decode(&mut r)?,
                new_name: name(&mut r)?,
            },
            SETATTR => {
                let handle = Handle::decode(&mut r)?;
                let mask = r.u8()?;
                if mask & !set_mask::ALL != 0 {
                    return Err(DecodeError::NotCanonical("undefined setattr mask bits"));
                }
                ManagerRequest::SetAttr {
                    handle,
                    mask,
                    mode: r.u32()?,
                    uid: r.u32()?,
                    gid: r.u32()?,
                    size: r.u64()?,
                    atime_ns: r.u64()? as i64,
                    mtime_ns: r.u64()? as i64,
                }
            }
            COMMIT => decode_commit(&mut r)?,
            STATFS => ManagerRequest::StatFs,
            SYNC => ManagerRequest::Sync,
            BEGIN_WRITE => ManagerRequest::BeginWrite { handle: Handle::decode(&mut r)? },
            GET_LAYOUT => ManagerRequest::GetLayout { handle: Handle::decode(&mut r)? },
            SET_LAYOUT => {
                let handle = Handle::decode(&mut r)?;
                let layout = if r.bool()? { Some(Layout::decode(&mut r)?) } else { None };
                ManagerRequest::SetLayout { handle, layout }
            }
            CLUSTER_STATUS => ManagerRequest::ClusterStatus,
            SET_DRIVE_STATE => ManagerRequest::SetDriveState { drive: r.u32()?, state: DriveState::decode(r.u8()?)? },
            REPAIR => ManagerRequest::Repair { action: RepairAction::decode(r.u8()?)? },
            ADD_USER => ManagerRequest::AddUser {
                name: r.str(USER_NAME_MAX, "user")?,
                password: r.str(PASSWORD_MAX, "password")?,
                uid: r.u32()?,
                gid: r.u32()?,
                admin: r.bool()?,
                groups: decode_groups(&mut r)?,
            },
            SET_USER_GROUPS => {
                ManagerRequest::SetUserGroups { name: r.str(USER_NAME_MAX, "user")?, groups: decode_groups(&mut r)? }
            }
            LIST_USERS => ManagerRequest::ListUsers,
            SET_PASSWORD => ManagerRequest::SetPassword {
                name: r.str(USER_NAME_MAX, "user")?,
                password: r.str(PASSWORD_MAX, "password")?,
            },
            ADD_DRIVE => {
                ManagerRequest::AddDrive { addr: r.str(DRIVE_ADDR_MAX, "drive address")?, master_key: r.array()? }
            }
            SET_GATEWAY => {
                let name = r.str(USER_NAME_MAX, "user")?;
                let ids = if r.bool()? { Some((r.u32()?, r.u32()?)) } else { None };
                if ids.is_some_and(|(lo, hi)| lo > hi) {
                    return Err(DecodeError::NotCanonical("gateway id range runs backwards"));
                }
                ManagerRequest::SetGateway { name, ids }
            }
            AS_USER => {
                let (uid, gid, groups) = (r.u32()?, r.u32()?, decode_groups(&mut r)?);
                // The wrapped request: its opcode and arguments, under this request's id.
                let opcode = r.u16()?;
                let rest = r.take(r.remaining())?;
                let mut inner = Vec::with_capacity(10 + rest.len());
                inner.extend_from_slice(&opcode.to_le_bytes());
                inner.extend_from_slice(&id.to_le_bytes());
                inner.extend_from_slice(rest);
                let (_, request) = ManagerRequest::decode(&inner)?;
                if !request.may_run_as_user() {
                    return Err(DecodeError::NotCanonical("AS_USER wraps a name-space or file request only"));
                }
                ManagerRequest::AsUser { uid, gid, groups, request: Box::new(request) }
            }
            MKNOD => {
                let (parent, name) = (Handle::decode(&mut r)?, name(&mut r)?);
                let kind = FileKind::from_code(r.u8()?)?;
                let (mode, rdev) = (mode(&mut r)?, r.u64()?);
                if !kind.is_special() {
                    return Err(DecodeError::NotCanonical("MKNOD makes FIFOs, sockets and devices only"));
                }
                if rdev != 0 && !kind.is_device() {
                    return Err(DecodeError::NotCanonical("a device number for an inode that is not a device"));
                }
                ManagerRequest::Mknod { parent, name, kind, mode, rdev }
            }
            GET_QUOTA => ManagerRequest::GetQuota { of: QuotaOf::decode(&mut r)? },
            READ_SMALL => {
                let (handle, offset, len) = (Handle::decode(&mut r)?, r.u64()?, r.u32()?);
                if len as usize > SMALL_IO_MAX {
                    return Err(DecodeError::OverLimit {
                        field: "small read",
                        len: len as u64,
                        max: SMALL_IO_MAX as u64,
                    });
                }
                ManagerRequest::ReadSmall { handle, offset, len }
            }
            WRITE_SMALL => {
                let (handle, txn, offset) = (Handle::decode(&mut r)?, r.u64()?, r.u64()?);
                ManagerRequest::WriteSmall { handle, txn, offset, data: decode_small_data(&mut r)? }
            }
            SET_QUOTA => ManagerRequest::SetQuota {
                of: QuotaOf::decode(&mut r)?,
                bytes_limit: decode_opt(&mut r)?,
                files_limit: decode_opt(&mut r)?,
            },
            GETXATTR => ManagerRequest::GetXattr { handle: Handle::decode(&mut r)?, name: xattr_name(&mut r)? },
            LISTXATTR => ManagerRequest::ListXattr { handle: Handle::decode(&mut r)? },
            SETXATTR => ManagerRequest::SetXattr {
                handle: Handle::decode(&mut r)?,
                name: xattr_name(&mut r)?,
                value: decode_xattr_value(&mut r)?,
                mode: XattrMode::decode(r.u8()?)?,
            },
            REMOVEXATTR => ManagerRequest::RemoveXattr { handle: Handle::decode(&mut r)?, name: xattr_name(&mut r)? },
            GET_ACL => ManagerRequest::GetAcl { handle: Handle::decode(&mut r)? },
            SET_ACL => ManagerRequest::SetAcl { handle: Handle::decode(&mut r)?, entries: decode_acl(&mut r)? },
            REFRESH_PAL => {
                ManagerRequest::RefreshPal { handle: Handle::decode(&mut r)?, rights: refresh_pal_rights(r.u8()?)? }
            }
            ABORT_WRITE => ManagerRequest::AbortWrite { handle: Handle::decode(&mut r)?, txn: r.u64()? },
            GET_ROUTING => ManagerRequest::GetRouting,
            SET_ROUTING => ManagerRequest::SetRouting { table: RoutingTable::decode(&mut r)? },
            WATCH => {
                let (incarnation, after, wait_ms) = (r.u64()?, r.u64()?, r.u32()?);
                if wait_ms > WATCH_WAIT_MAX_MS {
                    return Err(DecodeError::OverLimit {
                        field: "watch wait",
                        len: u64::from(wait_ms),
                        max: u64::from(WATCH_WAIT_MAX_MS),
                    });
                }
                ManagerRequest::Watch { incarnation, after, wait_ms }
            }
            _ => return Err(DecodeError::UnknownOpcode(opcode)),
        };
        r.finish()?;
        Ok((id, req))
    }

    /// The body of this request in a `TRACED` envelope (manager protocol
    /// version 3): `TRACED u16`, `request_id u64`, the trace id as a byte
    /// string, then the request's own opcode and arguments.
    pub fn encode_traced(&self, request_id: u64, trace: &TraceId) -> Vec<u8> {
        let inner = self.encode(request_id);
        let mut w = Writer::with_capacity(inner.len() + 2 + trace.as_bytes().len());
        w.u16(manager_opcode::TRACED).u64(request_id).bytes(trace.as_bytes());
        w.raw(&inner[..2]).raw(&inner[10..]);
        w.into_vec()
    }

    /// [`decode`](Self::decode), also taking a `TRACED` envelope: the
    /// request id, the trace id if the body carried one, and the request.
    /// An envelope around a login, or around another envelope, is refused.
    pub fn decode_traced(body: &[u8]) -> Result<(u64, Option<TraceId>, Self), DecodeError> {
        let mut r = Reader::new(body);
        if r.u16()? != manager_opcode::TRACED {
            let (id, req) = Self::decode(body)?;
            return Ok((id, None, req));
        }
        let id = r.u64()?;
        let trace = TraceId::from_bytes(r.bytes(TRACE_ID_LEN_MAX, "trace id")?)?;
        let opcode = r.u16()?;
        if matches!(opcode, manager_opcode::LOGIN | manager_opcode::LOGIN_IDENTITY) {
            return Err(DecodeError::NotCanonical("TRACED wraps a request of a logged-in session only"));
        }
        let rest = r.take(r.remaining())?;
        let mut inner = Vec::with_capacity(10 + rest.len());
        inner.extend_from_slice(&opcode.to_le_bytes());
        inner.extend_from_slice(&id.to_le_bytes());
        inner.extend_from_slice(rest);
        let (_, request) = Self::decode(&inner)?;
        Ok((id, Some(trace), request))
    }
}

/// An extended attribute's value: `length u32` (at most
/// [`XATTR_VALUE_MAX`], one more than a `u16` holds), that many bytes.
/// The rights of a `REFRESH_PAL`: `ACL_READ`, `ACL_WRITE` or both.
fn refresh_pal_rights(rights: u8) -> Result<u8, DecodeError> {
    use crate::acl::{ACL_READ, ACL_WRITE};
    if rights == 0 || rights & !(ACL_READ | ACL_WRITE) != 0 {
        return Err(DecodeError::NotCanonical("REFRESH_PAL rights other than read and write"));
    }
    Ok(rights)
}

fn encode_xattr_value(w: &mut Writer, value: &[u8]) {
    assert!(value.len() <= XATTR_VALUE_MAX, "xattr value over XATTR_VALUE_MAX");
    w.u32(value.len() as u32).raw(value);
}

fn decode_xattr_value(r: &mut Reader<'_>) -> Result<Vec<u8>, DecodeError> {
    let len = r.u32()? as usize;
    if len > XATTR_VALUE_MAX {
        return Err(DecodeError::OverLimit { field: "xattr value", len: len as u64, max: XATTR_VALUE_MAX as u64 });
    }
    Ok(r.take(len)?.to_vec())
}

/// Small-file bytes: `length u32` (at most [`SMALL_IO_MAX`]), that many bytes.
fn decode_small_data(r: &mut Reader<'_>) -> Result<Vec<u8>, DecodeError> {
    let len = r.u32()? as usize;
    if len > SMALL_IO_MAX {
        return Err(DecodeError::OverLimit { field: "small-file data", len: len as u64, max: SMALL_IO_MAX as u64 });
    }
    Ok(r.take(len)?.to_vec())
}

/// An extended attribute's name: 1..=[`XATTR_NAME_MAX`] bytes, no NUL.
fn xattr_name(r: &mut Reader<'_>) -> Result<String, DecodeError> {
    let name = r.str(XATTR_NAME_MAX, "xattr name")?;
    check_xattr_name(&name)?;
    Ok(name)
}

fn check_xattr_name(name: &str) -> Result<(), DecodeError> {
    if name.len() > XATTR_NAME_MAX {
        return Err(DecodeError::OverLimit { field: "xattr name", len: name.len() as u64, max: XATTR_NAME_MAX as u64 });
    }
    if name.is_empty() || name.contains('\0') {
        return Err(DecodeError::NotCanonical("xattr names are 1-255 bytes without NUL"));
    }
    Ok(())
}

fn decode_commit(r: &mut Reader<'_>) -> Result<ManagerRequest, DecodeError> {
    let handle = Handle::decode(r)?;
    let (txn, written_end) = (r.u64()?, r.u64()?);
    let n = r.count(COMPONENTS_MAX, "missed components")?;
    let mut missed = Vec::with_capacity(n);
    for _ in 0..n {
        let m = r.u8()?;
        if m as usize >= COMPONENTS_MAX || missed.last().is_some_and(|&prev| prev >= m) {
            return Err(DecodeError::NotCanonical("missed components must be ascending component indexes"));
        }
        missed.push(m);
    }
    let n = r.count(DIRTY_RANGES_MAX, "dirty ranges")?;
    let mut dirty = Vec::with_capacity(n);
    for _ in 0..n {
        let (offset, length) = (r.u64()?, r.u64()?);
        if length == 0 || offset.checked_add(length).is_none_or(|end| end > crate::limits::OBJECT_SIZE_MAX) {
            return Err(DecodeError::NotCanonical("dirty range empty or past OBJECT_SIZE_MAX"));
        }
        dirty.push((offset, length));
    }
    Ok(ManagerRequest::Commit { handle, txn, written_end, missed, dirty })
}

fn mode(r: &mut Reader<'_>) -> Result<u32, DecodeError> {
    let mode = r.u32()?;
    if mode & !MODE_MASK != 0 {
        return Err(DecodeError::NotCanonical("mode has bits outside 0o7777"));
    }
    Ok(mode)
}

impl ComponentAccess {
    /// Bytes of the canonical encoding.
    pub fn encoded_len(&self) -> usize {
        Component::LEN + 2 + self.drive_addr.len() + 16 + 2 + self.token.len() + 32
    }
    fn encode(&self, w: &mut Writer) {
        Component { object: self.object, state: self.state }.encode(w);
        w.str(&self.drive_addr).raw(&self.drive_id).bytes(&self.token).raw(&self.key);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let c = Component::decode(r)?;
        Ok(ComponentAccess {
            object: c.object,
            state: c.state,
            drive_addr: r.str(DRIVE_ADDR_MAX, "drive address")?,
            drive_id: r.array()?,
            token: r.bytes(CAPABILITY_LEN_MAX, "capability")?.to_vec(),
            key: r.array()?,
        })
    }
}

impl FileAccess {
    /// Bytes of the canonical encoding.
    pub fn encoded_len(&self) -> usize {
        Layout::LEN
            + 4
            + 4
            + 4
            + 1
            + 1
            + 4
            + 2
            + self.components.iter().map(ComponentAccess::encoded_len).sum::<usize>()
    }
    fn encode(&self, w: &mut Writer) {
        assert_eq!(self.components.len(), self.layout.components(), "one access per component");
        self.layout.encode(w);
        w.u32(self.map_epoch).u32(self.rights).u32(self.lifetime_ms).u8(self.min_protection).u8(self.algorithm);
        w.u32(self.small_threshold);
        w.u16(self.components.len() as u16);
        for c in &self.components {
            c.encode(w);
        }
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let layout = Layout::decode(r)?;
        let (map_epoch, rights, lifetime_ms) = (r.u32()?, r.u32()?, r.u32()?);
        let (min_protection, algorithm) = (r.u8()?, r.u8()?);
        let small_threshold = r.u32()?;
        if small_threshold > SMALL_FILE_THRESHOLD_MAX {
            return Err(DecodeError::OverLimit {
                field: "small-file threshold",
                len: small_threshold as u64,
                max: SMALL_FILE_THRESHOLD_MAX as u64,
            });
        }
        let n = r.count(COMPONENTS_MAX, "components")?;
        if n != layout.components() {
            return Err(DecodeError::NotCanonical("component count differs from the layout's"));
        }
        let components = (0..n).map(|_| ComponentAccess::decode(r)).collect::<Result<_, _>>()?;
        Ok(FileAccess {
            layout,
            map_epoch,
            rights,
            lifetime_ms,
            min_protection,
            algorithm,
            small_threshold,
            components,
        })
    }
}

impl DriveStatus {
    fn encode(&self, w: &mut Writer) {
        w.u32(self.drive).str(&self.addr).str(&self.failure_domain).u8(self.state as u8).bool(self.up);
        w.u64(self.capacity_bytes).u64(self.used_bytes).u64(self.components);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(DriveStatus {
            drive: r.u32()?,
            addr: r.str(DRIVE_ADDR_MAX, "drive address")?,
            failure_domain: r.str(NAME_LEN_MAX, "failure domain")?,
            state: DriveState::decode(r.u8()?)?,
            up: r.bool()?,
            capacity_bytes: r.u64()?,
            used_bytes: r.u64()?,
            components: r.u64()?,
        })
    }
}

impl ClusterStatus {
    fn encode(&self, w: &mut Writer) {
        assert!(self.drives.len() <= DRIVES_MAX, "status reply over DRIVES_MAX");
        w.u32(self.map_epoch).u16(self.drives.len() as u16);
        for d in &self.drives {
            d.encode(w);
        }
        w.u64(self.files_degraded);
        self.rebuild.encode(w);
        self.rebalance.encode(w);
        self.scrub.encode(w);
        let s = &self.last_scrub;
        w.u64(s.blocks_checked).u64(s.corrupt).u64(s.healed).u64(s.unrecoverable);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let map_epoch = r.u32()?;
        let n = r.count(DRIVES_MAX, "drives")?;
        let drives = (0..n).map(|_| DriveStatus::decode(r)).collect::<Result<_, _>>()?;
        Ok(ClusterStatus {
            map_epoch,
            drives,
            files_degraded: r.u64()?,
            rebuild: Progress::decode(r)?,
            rebalance: Progress::decode(r)?,
            scrub: Progress::decode(r)?,
            last_scrub: ScrubSummary {
                blocks_checked: r.u64()?,
                corrupt: r.u64()?,
                healed: r.u64()?,
                unrecoverable: r.u64()?,
            },
        })
    }
}

impl LayoutInfo {
    fn encode(&self, w: &mut Writer) {
        assert!(self.components.len() <= COMPONENTS_MAX, "layout reply over COMPONENTS_MAX");
        self.layout.encode(w);
        w.bool(self.explicit).u16(self.components.len() as u16);
        for (c, addr) in &self.components {
            c.encode(w);
            w.str(addr);
        }
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let layout = Layout::decode(r)?;
        let explicit = r.bool()?;
        let n = r.count(COMPONENTS_MAX, "components")?;
        let components = (0..n)
            .map(|_| Ok((Component::decode(r)?, r.str(DRIVE_ADDR_MAX, "drive address")?)))
            .collect::<Result<_, DecodeError>>()?;
        Ok(LayoutInfo { layout, explicit, components })
    }
}

/// An entry's flags byte: a `FileAccess` follows (version 1's `has_access` bool).
const ENTRY_HAS_ACCESS: u8 = 1;
/// An entry's flags byte: [`Entry::no_xattrs`] (version 2).
const ENTRY_NO_XATTRS: u8 = 2;

impl Entry {
    /// Bytes of the canonical encoding (how much of a reply it takes).
    pub fn encoded_len(&self) -> usize {
        let access = self.access.as_ref().map_or(0, FileAccess::encoded_len);
        FileAttr::LEN + HANDLE_MAC_LEN + 1 + 2 + self.target.len() + 1 + access
    }

    /// The handle that names this entry's inode in later requests.
    pub fn handle(&self) -> Handle {
        Handle { ino: self.attr.ino, site: self.site, mac: self.handle_mac }
    }

    fn encode(&self, w: &mut Writer) {
        self.attr.encode(w);
        w.raw(&self.handle_mac).u8(self.site);
        w.str(&self.target);
        let flags =
            if self.access.is_some() { ENTRY_HAS_ACCESS } else { 0 } | if self.no_xattrs { ENTRY_NO_XATTRS } else { 0 };
        w.u8(flags);
        if let Some(a) = &self.access {
            a.encode(w);
        }
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let attr = FileAttr::decode(r)?;
        let handle_mac = r.array()?;
        let site = decode_site(r)?;
        let target = r.str(SYMLINK_TARGET_MAX, "target")?;
        let flags = r.u8()?;
        if flags & !(ENTRY_HAS_ACCESS | ENTRY_NO_XATTRS) != 0 {
            return Err(DecodeError::NotCanonical("unknown entry flags"));
        }
        let access = if flags & ENTRY_HAS_ACCESS != 0 { Some(FileAccess::decode(r)?) } else { None };
        Ok(Entry { attr, handle_mac, site, target, access, no_xattrs: flags & ENTRY_NO_XATTRS != 0 })
    }
}

/// Reply result codes: which [`ManagerReply`] variant follows.
pub(crate) mod reply_kind {
    pub const LOGGED_IN: u8 = 1;
    pub const ENTRY: u8 = 2;
    pub const DIR: u8 = 3;
    pub const DONE: u8 = 4;
    pub const STATFS: u8 = 5;
    pub const USERS: u8 = 6;
    pub const DRIVE_ADDED: u8 = 7;
    pub const NAMES: u8 = 8;
    pub const BEGAN: u8 = 9;
    pub const LAYOUT: u8 = 10;
    pub const STATUS: u8 = 11;
    pub const XATTR: u8 = 12;
    pub const XATTR_NAMES: u8 = 13;
    pub const CHANGES: u8 = 14;
    pub const QUOTA: u8 = 15;
    pub const SMALL_DATA: u8 = 16;
    pub const ACL: u8 = 17;
    pub const ROUTING: u8 = 18;
}

/// A decoded reply: the result, or the manager's refusal (status and message).
pub type ReplyOutcome = Result<ManagerReply, (FsStatus, String)>;

impl ManagerReply {
    /// Bytes of a `Dir` reply besides its entries (status, request id,
    /// kind, count, `more`); each entry adds `2 + name.len() +`
    /// [`Entry::encoded_len`].
    pub const DIR_OVERHEAD: usize = 2 + 8 + 1 + 2 + 1;

    /// The reply as a session that logged in with manager protocol
    /// `version` reads it: nothing a later version added (version 1 knows
    /// no [`Entry::no_xattrs`]; its entries' flags byte is the `has_access`
    /// bool).
    pub fn for_version(mut self, version: u8) -> ManagerReply {
        if version < 2 {
            match &mut self {
                ManagerReply::Entry(e) => e.no_xattrs = false,
                ManagerReply::Dir { entries, .. } => entries.iter_mut().for_each(|(_, e)| e.no_xattrs = false),
                _ => {}
            }
        }
        self
    }

    /// The body of a successful reply: status OK, request id, kind, result.
    pub fn encode(&self, request_id: u64) -> Vec<u8> {
        use reply_kind::*;
        let mut w = Writer::with_capacity(128);
        w.u16(FsStatus::Ok.code()).u64(request_id);
        match self {
            ManagerReply::LoggedIn { version, uid, gid, admin } => {
                w.u8(LOGGED_IN).u8(*version).u32(*uid).u32(*gid).bool(*admin);
            }
            ManagerReply::Entry(e) => {
                w.u8(ENTRY);
                e.encode(&mut w);
            }
            ManagerReply::Dir { entries, more } => {
                assert!(entries.len() <= READDIR_ENTRIES_MAX, "readdir reply over READDIR_ENTRIES_MAX");
                w.u8(DIR).u16(entries.len() as u16);
                for (n, e) in entries {
                    w.str(n);
                    e.encode(&mut w);
                }
                w.bool(*more);
            }
            ManagerReply::Names { names, more } => {
                assert!(names.len() <= READDIR_ENTRIES_MAX, "readdir reply over READDIR_ENTRIES_MAX");
                w.u8(NAMES).u16(names.len() as u16);
                for (n, kind) in names {
                    w.str(n).u8(kind.code());
                }
                w.bool(*more);
            }
            ManagerReply::Done => {
                w.u8(DONE);
            }
            ManagerReply::StatFs { inodes, file_bytes, drives } => {
                assert!(drives.len() <= DRIVES_MAX, "statfs reply over DRIVES_MAX");
                w.u8(STATFS).u64(*inodes).u64(*file_bytes).u16(drives.len() as u16);
                for d in drives {
                    w.u32(d.drive).str(&d.addr).bool(d.online).u64(d.capacity_bytes).u64(d.used_bytes);
                }
            }
            ManagerReply::Users(users) => {
                assert!(users.len() <= USERS_MAX, "users reply over USERS_MAX");
                w.u8(USERS).u16(users.len() as u16);
                for u in users {
                    u.encode(&mut w);
                }
            }
            ManagerReply::DriveAdded { drive } => {
                w.u8(DRIVE_ADDED).u32(*drive);
            }
            ManagerReply::Began { txn, lease_ms, size_limit } => {
                w.u8(BEGAN).u64(*txn).u32(*lease_ms).u64(*size_limit);
            }
            ManagerReply::Quota(q) => {
                w.u8(QUOTA).bool(q.exists);
                encode_opt(&mut w, q.bytes_limit);
                encode_opt(&mut w, q.files_limit);
                w.u64(q.bytes_used).u64(q.files_used).u64(q.escrow);
            }
            ManagerReply::Layout(info) => {
                w.u8(LAYOUT);
                info.encode(&mut w);
            }
            ManagerReply::Status(status) => {
                w.u8(STATUS);
                status.encode(&mut w);
            }
            ManagerReply::Xattr(value) => {
                assert!(value.len() <= XATTR_VALUE_MAX, "xattr reply over XATTR_VALUE_MAX");
                w.u8(XATTR);
                encode_xattr_value(&mut w, value);
            }
            ManagerReply::SmallData(bytes) => {
                assert!(bytes.len() <= SMALL_IO_MAX, "SMALL_DATA reply over SMALL_IO_MAX");
                w.u8(SMALL_DATA).u32(bytes.len() as u32).raw(bytes);
            }
            ManagerReply::XattrNames(names) => {
                assert!(names.len() <= XATTRS_PER_INODE_MAX, "xattr list over XATTRS_PER_INODE_MAX");
                w.u8(XATTR_NAMES).u16(names.len() as u16);
                for n in names {
                    w.str(n);
                }
            }
            ManagerReply::Acl(info) => {
                assert!(info.entries.len() <= ACL_ENTRIES_MAX, "ACL reply over ACL_ENTRIES_MAX");
                w.u8(ACL);
                info.encode(&mut w);
            }
            ManagerReply::Routing(table) => {
                w.u8(ROUTING);
                table.encode(&mut w);
            }
            ManagerReply::Changes { incarnation, next, lost, changes } => {
                assert!(changes.len() <= WATCH_CHANGES_MAX, "watch reply over WATCH_CHANGES_MAX");
                w.u8(CHANGES).u64(*incarnation).u64(*next).bool(*lost).u16(changes.len() as u16);
                for c in changes {
                    c.encode(&mut w);
                }
            }
        }
        w.into_vec()
    }

    /// The body of a failed reply: status, request id, message.
    pub fn encode_error(request_id: u64, status: FsStatus, message: &str) -> Vec<u8> {
        assert!(status != FsStatus::Ok, "an error reply needs an error status");
        let mut end = message.len().min(ERROR_MESSAGE_LEN_MAX);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let mut w = Writer::with_capacity(16 + end);
        w.u16(status.code()).u64(request_id).str(&message[..end]);
        w.into_vec()
    }

    /// Parses a reply body: the request id, then the result or the error
    /// status and message.
    pub fn decode(body: &[u8]) -> Result<(u64, ReplyOutcome), DecodeError> {
        let mut r = Reader::new(body);
        let status = FsStatus::from_code(r.u16()?)?;
        let id = r.u64()?;
        if status != FsStatus::Ok {
            let message = r.str(ERROR_MESSAGE_LEN_MAX, "error message")?;
            r.finish()?;
            return Ok((id, Err((status, message))));
        }
        let reply = Self::decode_result(&mut r)?;
        r.finish()?;
        Ok((id, Ok(reply)))
    }

    fn decode_result(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        use reply_kind::*;
        Ok(match r.u8()? {
            LOGGED_IN => ManagerReply::LoggedIn { version: r.u8()?, uid: r.u32()?, gid: r.u32()?, admin: r.bool()? },
            ENTRY => ManagerReply::Entry(Entry::decode(r)?),
            DIR => {
                let n = r.count(READDIR_ENTRIES_MAX, "directory entries")?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push((name(r)?, Entry::decode(r)?));
                }
                ManagerReply::Dir { entries, more: r.bool()? }
            }
            NAMES => {
                let n = r.count(READDIR_ENTRIES_MAX, "directory entries")?;
                let mut names = Vec::with_capacity(n);
                for _ in 0..n {
                    names.push((name(r)?, FileKind::from_code(r.u8()?)?));
                }
                ManagerReply::Names { names, more: r.bool()? }
            }
            DONE => ManagerReply::Done,
            STATFS => {
                let (inodes, file_bytes) = (r.u64()?, r.u64()?);
                let n = r.count(DRIVES_MAX, "drives")?;
                let mut drives = Vec::with_capacity(n);
                for _ in 0..n {
                    drives.push(DriveUsage {
                        drive: r.u32()?,
                        addr: r.str(DRIVE_ADDR_MAX, "drive address")?,
                        online: r.bool()?,
                        capacity_bytes: r.u64()?,
                        used_bytes: r.u64()?,
                    });
                }
                ManagerReply::StatFs { inodes, file_bytes, drives }
            }
            USERS => {
                let n = r.count(USERS_MAX, "users")?;
                let mut users = Vec::with_capacity(n);
                for _ in 0..n {
                    users.push(UserInfo::decode(r)?);
                }
                ManagerReply::Users(users)
            }
            DRIVE_ADDED => ManagerReply::DriveAdded { drive: r.u32()? },
            BEGAN => ManagerReply::Began { txn: r.u64()?, lease_ms: r.u32()?, size_limit: r.u64()? },
            QUOTA => ManagerReply::Quota(QuotaInfo {
                exists: r.bool()?,
                bytes_limit: decode_opt(r)?,
                files_limit: decode_opt(r)?,
                bytes_used: r.u64()?,
                files_used: r.u64()?,
                escrow: r.u64()?,
            }),
            LAYOUT => ManagerReply::Layout(LayoutInfo::decode(r)?),
            STATUS => ManagerReply::Status(ClusterStatus::decode(r)?),
            XATTR => ManagerReply::Xattr(decode_xattr_value(r)?),
            SMALL_DATA => ManagerReply::SmallData(decode_small_data(r)?),
            XATTR_NAMES => {
                let n = r.count(XATTRS_PER_INODE_MAX, "xattr names")?;
                let names = (0..n).map(|_| xattr_name(r)).collect::<Result<Vec<_>, _>>()?;
                ManagerReply::XattrNames(names)
            }
            ACL => ManagerReply::Acl(AclInfo::decode(r)?),
            ROUTING => ManagerReply::Routing(RoutingTable::decode(r)?),
            CHANGES => {
                let (incarnation, next, lost) = (r.u64()?, r.u64()?, r.bool()?);
                let n = r.count(WATCH_CHANGES_MAX, "changes")?;
                let changes = (0..n).map(|_| Change::decode(r)).collect::<Result<Vec<_>, _>>()?;
                ManagerReply::Changes { incarnation, next, lost, changes }
            }
            _ => return Err(DecodeError::NotCanonical("unknown manager reply kind")),
        })
    }
}
