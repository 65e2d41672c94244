//! Capabilities on the wire (NASD Figure 1): public arguments, carried in the
//! frame's capability field either in the clear or sealed under the working key.

use crate::codec::{Reader, Writer};
use crate::limits::OBJECT_SIZE_MAX;
use crate::{DecodeError, Protection, Region};

/// Rights a capability grants, as bits.
pub mod rights {
    /// Read data.
    pub const READ: u32 = 1 << 0;
    /// Write data anywhere in the region.
    pub const WRITE: u32 = 1 << 1;
    /// Write data only at or past the object's current end.
    pub const APPEND: u32 = 1 << 2;
    /// Read attributes; `blocksrequired`.
    pub const GETATTR: u32 = 1 << 3;
    /// Set attributes other than `access_control_version`.
    pub const SETATTR: u32 = 1 << 4;
    /// Set `access_control_version` (revoke capabilities).
    pub const SET_ACV: u32 = 1 << 5;
    /// Create objects in the partition (capability object 0).
    pub const CREATE: u32 = 1 << 6;
    /// Remove the object.
    pub const REMOVE: u32 = 1 << 7;
    /// Clone the object.
    pub const FASTCOPY: u32 = 1 << 8;
    /// Flush the object.
    pub const FLUSH: u32 = 1 << 9;
    /// Every defined right.
    pub const ALL: u32 = (1 << 10) - 1;
}

/// Encoded length of [`CapabilityArgs`].
pub const CAPABILITY_ARGS_LEN: usize = 88;
/// Format byte of a capability sent in the clear.
pub const CAPABILITY_FORMAT_CLEAR: u8 = 1;
/// Format byte of a capability sealed under the working key.
pub const CAPABILITY_FORMAT_SEALED: u8 = 2;
/// Length of the clear prefix of a sealed capability token: format, 3 reserved
/// bytes, key version, partition.
pub const SEALED_CAPABILITY_PREFIX_LEN: usize = 16;
/// Length of a sealed capability token: prefix, 24-byte nonce, sealed args, 16-byte tag.
pub const SEALED_CAPABILITY_LEN: usize = SEALED_CAPABILITY_PREFIX_LEN + 24 + CAPABILITY_ARGS_LEN + 16;
/// Object number of a capability that covers every object of its partition.
pub const ANY_OBJECT: u64 = 0;

/// The public arguments of a capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityArgs {
    /// MAC algorithm id (1 BLAKE3, 2 HMAC-SHA-256) for the capability key and requests.
    pub algorithm: u8,
    /// Least protection a request using this capability must have.
    pub min_protection: Protection,
    /// Version of the working key the capability key was computed with.
    pub key_version: u32,
    /// The drive it is valid on.
    pub drive_id: [u8; 16],
    /// The partition.
    pub partition: u64,
    /// The object, or [`ANY_OBJECT`].
    pub object: u64,
    /// The bytes of the object it covers.
    pub region: Region,
    /// The object's `access_control_version` when it was minted.
    pub access_control_version: u64,
    /// [`rights`] bits.
    pub rights: u32,
    /// The cluster map epoch the capability was minted under: a drive
    /// refuses it (`MAP_EPOCH_MOVED`) once the partition's minimum epoch is
    /// above it. 0 is allowed (and always current on a partition whose
    /// minimum was never raised).
    pub map_epoch: u32,
    /// Drive-clock nanoseconds after which it is refused.
    pub expiration_ns: u64,
    /// Recorded in the drive's audit trail with every use.
    pub audit_id: u64,
}

impl CapabilityArgs {
    /// A region covering a whole object.
    pub const WHOLE_OBJECT: Region = Region { offset: 0, length: OBJECT_SIZE_MAX };

    /// The canonical 88-byte encoding (clear token = exactly these bytes).
    pub fn encode(&self) -> [u8; CAPABILITY_ARGS_LEN] {
        let mut w = Writer::with_capacity(CAPABILITY_ARGS_LEN);
        w.u8(CAPABILITY_FORMAT_CLEAR).u8(self.algorithm).u8(self.min_protection.bits()).u8(0);
        w.u32(self.key_version).raw(&self.drive_id).u64(self.partition).u64(self.object);
        w.u64(self.region.offset).u64(self.region.length).u64(self.access_control_version);
        w.u32(self.rights).u32(self.map_epoch).u64(self.expiration_ns).u64(self.audit_id);
        let v = w.into_vec();
        let mut out = [0u8; CAPABILITY_ARGS_LEN];
        out.copy_from_slice(&v);
        out
    }

    /// Decodes and validates the 88-byte encoding.
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(buf);
        if r.u8()? != CAPABILITY_FORMAT_CLEAR {
            return Err(DecodeError::NotCanonical("unknown capability format"));
        }
        let algorithm = r.u8()?;
        let min_protection = Protection::from_bits(r.u8()?)?;
        if r.u8()? != 0 {
            return Err(DecodeError::NotCanonical("reserved capability byte is not zero"));
        }
        let key_version = r.u32()?;
        let drive_id = r.array()?;
        let partition = r.u64()?;
        let object = r.u64()?;
        let region = Region { offset: r.u64()?, length: r.u64()? };
        let access_control_version = r.u64()?;
        let rights = r.u32()?;
        let map_epoch = r.u32()?;
        let expiration_ns = r.u64()?;
        let audit_id = r.u64()?;
        r.finish()?;
        if !matches!(algorithm, 1 | 2) {
            return Err(DecodeError::NotCanonical("unknown capability algorithm"));
        }
        if rights & !rights::ALL != 0 {
            return Err(DecodeError::NotCanonical("undefined capability rights"));
        }
        if region.offset > OBJECT_SIZE_MAX || region.length > OBJECT_SIZE_MAX - region.offset {
            return Err(DecodeError::NotCanonical("capability region beyond OBJECT_SIZE_MAX"));
        }
        Ok(CapabilityArgs {
            algorithm,
            min_protection,
            key_version,
            drive_id,
            partition,
            object,
            region,
            access_control_version,
            rights,
            map_epoch,
            expiration_ns,
            audit_id,
        })
    }

    /// True if `r` lies inside the capability's region.
    pub fn covers(&self, r: &Region) -> bool {
        r.offset >= self.region.offset && r.end() <= self.region.end()
    }
}

/// The clear prefix of a sealed capability token: which working key opens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealedCapabilityPrefix {
    /// Working key version.
    pub key_version: u32,
    /// Partition whose working key sealed it.
    pub partition: u64,
}

impl SealedCapabilityPrefix {
    /// The 16-byte prefix.
    pub fn encode(&self) -> [u8; SEALED_CAPABILITY_PREFIX_LEN] {
        let mut w = Writer::with_capacity(SEALED_CAPABILITY_PREFIX_LEN);
        w.u8(CAPABILITY_FORMAT_SEALED).u8(0).u16(0).u32(self.key_version).u64(self.partition);
        let mut out = [0u8; SEALED_CAPABILITY_PREFIX_LEN];
        out.copy_from_slice(&w.into_vec());
        out
    }
    /// Parses the prefix of a sealed token (which must be exactly
    /// `SEALED_CAPABILITY_LEN` bytes long).
    pub fn decode(token: &[u8]) -> Result<Self, DecodeError> {
        if token.len() != SEALED_CAPABILITY_LEN {
            return Err(DecodeError::NotCanonical("sealed capability has the wrong length"));
        }
        let mut r = Reader::new(&token[..SEALED_CAPABILITY_PREFIX_LEN]);
        if r.u8()? != CAPABILITY_FORMAT_SEALED || r.u8()? != 0 || r.u16()? != 0 {
            return Err(DecodeError::NotCanonical("not a sealed capability"));
        }
        Ok(SealedCapabilityPrefix { key_version: r.u32()?, partition: r.u64()? })
    }
}
