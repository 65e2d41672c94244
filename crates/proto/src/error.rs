//! Status codes carried in replies, and the decoder's own error type.

use thiserror::Error;

macro_rules! status_codes {
    ($( $(#[$doc:meta])* $name:ident = $val:expr => $wire:literal, )*) => {
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
                    $( Status::$name => $wire, )*
                }
            }
        }
    };
}

status_codes! {
    /// Success.
    Ok = 0 => "OK",
    /// The frame is not well formed: bad magic, reserved bits set, impossible lengths.
    MalformedFrame = 1 => "MALFORMED_FRAME",
    /// The frame's protocol version is not one this drive speaks.
    VersionUnsupported = 2 => "VERSION_UNSUPPORTED",
    /// The opcode names no operation.
    UnknownOperation = 3 => "UNKNOWN_OPERATION",
    /// A length or count exceeds its named limit.
    LimitExceeded = 4 => "LIMIT_EXCEEDED",
    /// The operation's arguments do not decode canonically.
    BadArguments = 5 => "BAD_ARGUMENTS",
    /// Two regions of one request overlap.
    RegionsOverlap = 6 => "REGIONS_OVERLAP",
    /// A region is empty or extends past `OBJECT_SIZE_MAX`.
    RegionOutOfRange = 7 => "REGION_OUT_OF_RANGE",
    /// The data length differs from the sum of the region lengths.
    DataLengthMismatch = 8 => "DATA_LENGTH_MISMATCH",
    /// The partition does not exist.
    NoSuchPartition = 9 => "NO_SUCH_PARTITION",
    /// The object does not exist in the partition.
    NoSuchObject = 10 => "NO_SUCH_OBJECT",
    /// `createpartition` named a partition that exists.
    PartitionExists = 11 => "PARTITION_EXISTS",
    /// `removepartition` without `force` on a partition that holds data.
    PartitionNotEmpty = 12 => "PARTITION_NOT_EMPTY",
    /// The operation would take the partition past its quota; nothing changed.
    QuotaExceeded = 13 => "QUOTA_EXCEEDED",
    /// `resizepartition` below the bytes the partition already uses.
    QuotaBelowUsage = 14 => "QUOTA_BELOW_USAGE",
    /// The drive has no free space (or the sum of quotas would exceed capacity).
    NoSpace = 15 => "NO_SPACE",
    /// `setattr`/`create` tried to set an attribute the drive maintains, or to an
    /// unsupported value.
    AttributeNotSettable = 16 => "ATTRIBUTE_NOT_SETTABLE",
    /// The object is a read-only well-known object.
    ReadOnlyObject = 17 => "READ_ONLY_OBJECT",
    /// The protection option or key type is not supported by this drive.
    ProtectionUnsupported = 18 => "PROTECTION_UNSUPPORTED",
    /// A stored block no longer matches its stored digest (media corruption).
    DataCorrupted = 19 => "DATA_CORRUPTED",
    /// The drive's storage failed; the drive stops accepting writes.
    IoError = 20 => "IO_ERROR",
    /// Too many partitions or objects.
    TooMany = 21 => "TOO_MANY",
    /// The drive is shutting down or overloaded; retry elsewhere or later.
    Busy = 22 => "BUSY",
    /// An internal invariant failed; the request had no effect.
    Internal = 23 => "INTERNAL",
    /// The request digest is not the MAC of the frame under the named key.
    BadDigest = 24 => "BAD_DIGEST",
    /// The capability does not decode, or cannot be opened.
    BadCapability = 25 => "BAD_CAPABILITY",
    /// The request's protection is below the capability's minimum.
    ProtectionTooWeak = 26 => "PROTECTION_TOO_WEAK",
    /// The capability's minimum protection is below the drive's or partition's.
    CapabilityBelowMinimum = 27 => "CAPABILITY_BELOW_MINIMUM",
    /// The nonce's time is outside the drive's window (or before its start).
    NonceOutsideWindow = 28 => "NONCE_OUTSIDE_WINDOW",
    /// The nonce was seen before: a replay.
    NonceReplayed = 29 => "NONCE_REPLAYED",
    /// The capability has expired.
    CapabilityExpired = 30 => "CAPABILITY_EXPIRED",
    /// The capability names another drive.
    WrongDrive = 31 => "WRONG_DRIVE",
    /// The capability (or key selector) names another partition or object.
    WrongObject = 32 => "WRONG_OBJECT",
    /// The object's access control version changed: the capability is revoked.
    AccessRevoked = 33 => "ACCESS_REVOKED",
    /// The capability's rights do not cover the operation.
    RightsInsufficient = 34 => "RIGHTS_INSUFFICIENT",
    /// A region lies outside the capability's region.
    RegionNotInCapability = 35 => "REGION_NOT_IN_CAPABILITY",
    /// The working key version is not current or previous.
    KeyVersionRetired = 36 => "KEY_VERSION_RETIRED",
    /// The key the request names has not been set.
    KeyNotSet = 37 => "KEY_NOT_SET",
    /// The key type may not authorize this operation.
    WrongKeyType = 38 => "WRONG_KEY_TYPE",
    /// A sealed key does not open under the key above it.
    BadSealedKey = 39 => "BAD_SEALED_KEY",
    /// A data chunk's tag does not match: data changed in flight.
    BadDataTag = 40 => "BAD_DATA_TAG",
    /// The capability was minted under a cluster map epoch older than the
    /// partition's minimum: fetch new bindings from the manager.
    MapEpochMoved = 41 => "MAP_EPOCH_MOVED",
    /// Another write transaction is open on the object (or, for `txn_end`,
    /// the one open is not the one named).
    TxnConflict = 42 => "TXN_CONFLICT",
    /// The partition's authorization scheme does not accept this kind of
    /// credential (a capability where only PALs are, or the reverse).
    AuthSchemeRefused = 43 => "AUTH_SCHEME_REFUSED",
    /// The identity credential has expired: get a new identity key.
    IdentityExpired = 44 => "IDENTITY_EXPIRED",
    /// Neither the user nor the role of the identity has an entry in the
    /// object's access PAL or its collection's super PAL.
    NotInPal = 45 => "NOT_IN_PAL",
    /// A PAL with more than `PAL_ENTRIES_MAX` entries; nothing changed.
    PalOverflow = 46 => "PAL_OVERFLOW",
    /// An `extension` call names an extension the drive does not have (its
    /// `inquiry` lists those it has).
    UnknownExtension = 47 => "UNKNOWN_EXTENSION",
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
    /// A pre-authorization list longer than `PAL_ENTRIES_MAX`.
    #[error("PAL of {entries} entries, over the limit of {max}")]
    PalOverflow {
        /// The entries the list announced.
        entries: u64,
        /// The limit.
        max: u64,
    },
}

impl DecodeError {
    /// The reply status a drive sends for this decoding failure.
    pub fn status(&self) -> Status {
        match self {
            DecodeError::OverLimit { .. } => Status::LimitExceeded,
            DecodeError::BadMagic => Status::MalformedFrame,
            DecodeError::Version(_) => Status::VersionUnsupported,
            DecodeError::UnknownOpcode(_) => Status::UnknownOperation,
            DecodeError::PalOverflow { .. } => Status::PalOverflow,
            DecodeError::Truncated | DecodeError::TrailingBytes(_) | DecodeError::NotCanonical(_) => {
                Status::BadArguments
            }
        }
    }
}
