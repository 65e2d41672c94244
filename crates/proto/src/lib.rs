//! The nasd wire format: how requests and replies travel between clients and
//! drives over TCP.
//!
//! A frame is a fixed [`FrameHeader`], then a capability, the operation's
//! arguments, a digest, and a data payload sent in chunks (each followed by a
//! tag when the data is protected). Everything is canonical little-endian, so
//! the bytes a digest covers are exactly the bytes on the wire. `docs/PROTOCOL.md`
//! is the byte-for-byte specification; this crate is its only implementation.
//!
//! ```
//! use nasd_proto::{FrameHeader, Request, FramePrefix, Status};
//! let req = Request::GetAttr { partition: 7, object: 16 };
//! let bytes = FramePrefix::encode(&FrameHeader::request(req.opcode(), 1), &[], &req.encode_args(), &[0; 32]);
//! let parsed = FramePrefix::parse(&bytes).unwrap();
//! assert_eq!(Request::decode(parsed.header.opcode, parsed.args).unwrap(), req);
//! # let _ = Status::Ok;
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod acl;
mod attrs;
pub mod auth;
mod capability;
pub mod codec;
mod error;
pub mod extension;
pub mod fs;
mod header;
mod identity;
pub mod layout;
pub mod limits;
pub mod manager;
mod ops;
mod pal;
pub mod routing;

pub use attrs::{AttrMask, Attributes, ATTRIBUTES_LEN};
pub use capability::{
    rights, CapabilityArgs, SealedCapabilityPrefix, ANY_OBJECT, CAPABILITY_ARGS_LEN, CAPABILITY_FORMAT_CLEAR,
    CAPABILITY_FORMAT_SEALED, SEALED_CAPABILITY_LEN, SEALED_CAPABILITY_PREFIX_LEN,
};
pub use error::{DecodeError, Status};
pub use header::{nonce, FrameHeader, KeyType, Kind, Protection, MAGIC, VERSION, VERSION_MIN};
pub use identity::{AuthScheme, IdentityData, IDENTITY_DATA_LEN, IDENTITY_FORMAT, ROLE_NONE};
pub use ops::{
    decode_error_message, encode_error_message, not_itemized, opcode, validate_regions, well_known, AuditRecord,
    DriveControl, DriveInfo, OpenTxn, PartitionControl, PartitionInfo, Region, Reply, Request, CONTROL_FORMAT_VERSION,
};
pub use pal::{
    ObjectPal, Pal, PalEntry, Principal, PAL_ENTRY_LEN, PAL_KIND_EVERYONE, PAL_KIND_ROLE, PAL_KIND_USER, PAL_RIGHTS,
};

use limits::{DIGEST_LEN, HEADER_LEN};

/// The part of a frame before its data: header, capability, arguments, digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FramePrefix<'a> {
    /// The validated header.
    pub header: FrameHeader,
    /// The capability bytes (`capability_len` of them).
    pub capability: &'a [u8],
    /// The argument bytes (`args_len` of them).
    pub args: &'a [u8],
    /// The digest over everything before it.
    pub digest: [u8; DIGEST_LEN],
}

impl<'a> FramePrefix<'a> {
    /// Encodes a frame prefix, filling in the header's length fields from the
    /// slices given. The digest is appended as given.
    pub fn encode(header: &FrameHeader, capability: &[u8], args: &[u8], digest: &[u8; DIGEST_LEN]) -> Vec<u8> {
        let mut h = header.clone();
        h.capability_len = capability.len() as u16;
        h.args_len = args.len() as u32;
        let mut out = Vec::with_capacity(HEADER_LEN + capability.len() + args.len() + DIGEST_LEN);
        out.extend_from_slice(&h.encode());
        out.extend_from_slice(capability);
        out.extend_from_slice(args);
        out.extend_from_slice(digest);
        out
    }

    /// Parses a complete frame prefix from `buf`, which must hold exactly the
    /// prefix (the data, if any, follows separately).
    pub fn parse(buf: &'a [u8]) -> Result<Self, DecodeError> {
        let head: &[u8; HEADER_LEN] =
            buf.get(..HEADER_LEN).and_then(|b| b.try_into().ok()).ok_or(DecodeError::Truncated)?;
        let header = FrameHeader::decode(head)?;
        let mut r = codec::Reader::new(&buf[HEADER_LEN..]);
        let capability = r.take(header.capability_len as usize)?;
        let args = r.take(header.args_len as usize)?;
        let digest = r.array::<DIGEST_LEN>()?;
        r.finish()?;
        Ok(FramePrefix { header, capability, args, digest })
    }
}

#[cfg(test)]
mod manager_tests;
#[cfg(test)]
mod tests;
