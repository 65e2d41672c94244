use nasd_proto::Status;
use thiserror::Error;

/// Why a store operation failed. Operating errors only: broken invariants
/// stop the process instead (fail-stop, so a corrupt index cannot spread).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No such partition.
    #[error("no partition {0}")]
    NoSuchPartition(u64),
    /// No such object in the partition.
    #[error("no object {object} in partition {partition}")]
    NoSuchObject {
        /// Partition.
        partition: u64,
        /// Object.
        object: u64,
    },
    /// The partition already exists.
    #[error("partition {0} already exists")]
    PartitionExists(u64),
    /// The partition holds objects and `force` was not given.
    #[error("partition {0} is not empty; remove its objects or pass force")]
    PartitionNotEmpty(u64),
    /// The change would take the partition past its quota.
    #[error(
        "partition {partition} quota exceeded: needs {needed_blocks} more blocks, {free_blocks} free under the quota"
    )]
    QuotaExceeded {
        /// Partition.
        partition: u64,
        /// Blocks the operation needed.
        needed_blocks: u64,
        /// Blocks left under the quota.
        free_blocks: u64,
    },
    /// A quota below what the partition already uses.
    #[error("partition {partition} uses {used_bytes} bytes, more than the requested quota")]
    QuotaBelowUsage {
        /// Partition.
        partition: u64,
        /// Bytes in use.
        used_bytes: u64,
    },
    /// The drive is out of space, or quotas would exceed its capacity.
    #[error("no space: {0}")]
    NoSpace(String),
    /// The attribute is drive-maintained or the value unsupported.
    #[error("attribute not settable: {0}")]
    AttributeNotSettable(&'static str),
    /// A well-known object that cannot be changed this way.
    #[error("object {0} is a read-only well-known object")]
    ReadOnlyObject(u64),
    /// An argument out of range.
    #[error("bad argument: {0}")]
    BadArgument(&'static str),
    /// Regions failed validation.
    #[error("invalid regions: {0}")]
    Regions(Status),
    /// Too many partitions or objects.
    #[error("too many {0}")]
    TooMany(&'static str),
    /// An append-only write with a region starting before the object's end.
    #[error("append-only write starts before the end of the object ({logical_size} bytes)")]
    NotAnAppend {
        /// The object's size when the write was checked.
        logical_size: u64,
    },
    /// The object's `access_control_version` is no longer the one the
    /// write was authorized under ([`crate::WriteCheck`]): a revocation
    /// came first, and the write changed nothing.
    #[error("object {object} in partition {partition}: its access control version changed; capability revoked")]
    AccessRevoked {
        /// Partition.
        partition: u64,
        /// Object.
        object: u64,
    },
    /// The object's PALs (its access PAL, its collection, or the
    /// collection's super PAL) changed since a write by identity was
    /// authorized against them ([`crate::WriteCheck::pal`]): the write
    /// changed nothing.
    #[error("object {object} in partition {partition}: its pre-authorization list changed; the write is no longer authorized")]
    PalChanged {
        /// Partition.
        partition: u64,
        /// Object.
        object: u64,
    },
    /// Another write transaction is open on the object (or a transaction
    /// was ended with an identifier other than the open one's).
    #[error("object {object} in partition {partition} has transaction {open} open")]
    TxnConflict {
        /// Partition.
        partition: u64,
        /// Object.
        object: u64,
        /// The transaction open on it.
        open: u64,
    },
    /// A stored block does not match its stored digest.
    #[error("block {block} of object {object} in partition {partition} does not match its stored digest")]
    DataCorrupted {
        /// Partition.
        partition: u64,
        /// Object.
        object: u64,
        /// Logical block number.
        block: u64,
    },
    /// The supplier of a write's data failed (e.g. the client went away);
    /// the write changed nothing.
    #[error("write data source failed: {0}")]
    Source(std::io::Error),
    /// The consumer of a read's data failed (e.g. the client went away).
    #[error("read data sink failed: {0}")]
    Sink(std::io::Error),
    /// The storage device failed; the store refuses further changes.
    #[error("storage I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The metadata database failed.
    #[error("metadata database error: {0}")]
    Db(#[from] rusqlite::Error),
    /// The store failed earlier and accepts no more changes until restarted.
    #[error("the store failed earlier and refuses changes; restart the drive")]
    Failed,
    /// The on-disk state is not what this version can read.
    #[error("on-disk state is corrupt or unsupported: {0}")]
    Corrupt(String),
    /// Another process has the data directory open.
    #[error("data directory {0} is in use by another process")]
    Locked(String),
}

impl StoreError {
    /// The wire status a drive reports for this error.
    pub fn status(&self) -> Status {
        use StoreError::*;
        match self {
            NoSuchPartition(_) => Status::NoSuchPartition,
            NoSuchObject { .. } => Status::NoSuchObject,
            PartitionExists(_) => Status::PartitionExists,
            PartitionNotEmpty(_) => Status::PartitionNotEmpty,
            QuotaExceeded { .. } => Status::QuotaExceeded,
            QuotaBelowUsage { .. } => Status::QuotaBelowUsage,
            NoSpace(_) => Status::NoSpace,
            AttributeNotSettable(_) => Status::AttributeNotSettable,
            ReadOnlyObject(_) => Status::ReadOnlyObject,
            BadArgument(_) => Status::BadArguments,
            Regions(s) => *s,
            TooMany(_) => Status::TooMany,
            NotAnAppend { .. } => Status::RightsInsufficient,
            AccessRevoked { .. } | PalChanged { .. } => Status::AccessRevoked,
            TxnConflict { .. } => Status::TxnConflict,
            DataCorrupted { .. } => Status::DataCorrupted,
            Source(_) => Status::DataLengthMismatch,
            Sink(_) | Io(_) | Db(_) | Failed | Corrupt(_) | Locked(_) => Status::IoError,
        }
    }
}
