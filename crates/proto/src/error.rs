//! Status codes carried in replies, and the decoder's own error type.

use thiserror::Error;

macro_rules! status_codes {
    ($( $(#[$doc:meta])* $name:ident = $val:expr, )*) => {
        /// The `status` field of a reply. `Ok` is 0; every failure has its own code
        /// so a client (and a test) can tell exactly which check refused a request.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        #[non_exhaustive]
        pub enum Status {
            $( $(#[$doc])* $name = $val, )*
        }

        impl Status {
            /// Every status, in code order (for documentation and tests).
            pub const ALL: &'static [Status] = &[ $( Status::$name, )* ];

            /// The status for a wire code, if it is one.
            pub fn from_code(code: u16) -> Option<Status> {
                match code {
                    $( $val => Some(Status::$name), )*
                    _ => None,
                }
            }

            /// The stable upper-snake-case name used in PROTOCOL.md.
            pub fn name(self) -> &'static str {
                match self {
                    $( Status::$name => stringify!($name), )*
                }
            }
        }
    };
}

status_codes! {
    /// Success.
    Ok = 0,
    /// The frame is not well formed: bad magic, reserved bits set, impossible lengths.
    MalformedFrame = 1,
    /// The frame's protocol version is not one this drive speaks.
    VersionUnsupported = 2,
    /// The opcode names no operation.
    UnknownOperation = 3,
    /// A length or count exceeds its named limit.
    LimitExceeded = 4,
    /// The operation's arguments do not decode canonically.
    BadArguments = 5,
    /// Two regions of one request overlap.
    RegionsOverlap = 6,
    /// A region is empty or extends past `OBJECT_SIZE_MAX`.
    RegionOutOfRange = 7,
    /// The data length differs from the sum of the region lengths.
    DataLengthMismatch = 8,
    /// The partition does not exist.
    NoSuchPartition = 9,
    /// The object does not exist in the partition.
    NoSuchObject = 10,
    /// `createpartition` named a partition that exists.
    PartitionExists = 11,
    /// `removepartition` without `force` on a partition that holds data.
    PartitionNotEmpty = 12,
    /// The operation would take the partition past its quota; nothing changed.
    QuotaExceeded = 13,
    /// `resizepartition` below the bytes the partition already uses.
    QuotaBelowUsage = 14,
    /// The drive has no free space (or the sum of quotas would exceed capacity).
    NoSpace = 15,
    /// `setattr`/`create` tried to set an attribute the drive maintains, or to an
    /// unsupported value.
    AttributeNotSettable = 16,
    /// The object is a read-only well-known object.
    ReadOnlyObject = 17,
    /// The protection option or key type is not supported by this drive.
    ProtectionUnsupported = 18,
    /// A stored block no longer matches its stored digest (media corruption).
    DataCorrupted = 19,
    /// The drive's storage failed; the drive stops accepting writes.
    IoError = 20,
    /// Too many partitions or objects.
    TooMany = 21,
    /// The drive is shutting down or overloaded; retry elsewhere or later.
    Busy = 22,
    /// An internal invariant failed; the request had no effect.
    Internal = 23,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), *self as u16)
    }
}

/// Why bytes from a peer failed to decode. Never contains key material.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the encoding needs.
    #[error("truncated")]
    Truncated,
    /// Bytes left over after the last field.
    #[error("{0} trailing bytes")]
    TrailingBytes(usize),
    /// A length or count over its named limit.
    #[error("{field} is {len}, over the limit of {max}")]
    OverLimit {
        /// The field's name.
        field: &'static str,
        /// The length found.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A value with more than one possible encoding, or none.
    #[error("not canonical: {0}")]
    NotCanonical(&'static str),
    /// The magic bytes are not `NASD`.
    #[error("bad magic")]
    BadMagic,
    /// An unknown protocol version.
    #[error("unsupported protocol version {0}")]
    Version(u8),
    /// An unknown opcode.
    #[error("unknown opcode {0:#06x}")]
    UnknownOpcode(u16),
}

impl DecodeError {
    /// The reply status a drive sends for this decoding failure.
    pub fn status(&self) -> Status {
        match self {
            DecodeError::OverLimit { .. } => Status::LimitExceeded,
            DecodeError::BadMagic => Status::MalformedFrame,
            DecodeError::Version(_) => Status::VersionUnsupported,
            DecodeError::UnknownOpcode(_) => Status::UnknownOperation,
            DecodeError::Truncated | DecodeError::TrailingBytes(_) | DecodeError::NotCanonical(_) => {
                Status::BadArguments
            }
        }
    }
}
