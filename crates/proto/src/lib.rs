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
pub mod trace;

pub use attrs::{AttrMask, Attributes, ATTRIBUTES_LEN};
pub use capability::{
    rights, CapabilityArgs, SealedCapabilityPrefix, ANY_OBJECT, CAPABILITY_ARGS_LEN, CAPABILITY_FORMAT_CLEAR,
    CAPABILITY_FORMAT_SEALED, SEALED_CAPABILITY_LEN, SEALED_CAPABILITY_PREFIX_LEN,
};
pub use error::{DecodeError, Status};
pub use header::{nonce, FrameHeader, KeyType, Kind, Protection, MAGIC, VERSION, VERSION_MIN, VERSION_TRACE};
pub use identity::{AuthScheme, IdentityData, IDENTITY_DATA_LEN, IDENTITY_FORMAT, ROLE_NONE};
pub use ops::{
    decode_error_message, encode_error_message, not_itemized, opcode, validate_regions, well_known, AuditRecord,
    DriveControl, DriveInfo, OpenTxn, PartitionControl, PartitionInfo, Region, Reply, Request, CONTROL_FORMAT_VERSION,
};
pub use pal::{
    ObjectPal, Pal, PalEntry, Principal, PAL_ENTRY_LEN, PAL_KIND_EVERYONE, PAL_KIND_ROLE, PAL_KIND_USER, PAL_RIGHTS,
};
pub use trace::TraceId;

use limits::{DIGEST_LEN, HEADER_LEN};

/// The part of a frame before its data: header, trace id (version 2),
/// capability, arguments, digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FramePrefix<'a> {
    /// The validated header.
    pub header: FrameHeader,
    /// The operation's trace id (`trace_len` bytes; version 2 requests only).
    pub trace: Option<TraceId>,
    /// The capability bytes (`capability_len` of them).
    pub capability: &'a [u8],
    /// The argument bytes (`args_len` of them).
    pub args: &'a [u8],
    /// The digest over everything before it.
    pub digest: [u8; DIGEST_LEN],
}

impl<'a> FramePrefix<'a> {
    /// Encodes a frame prefix without a trace id, filling in the header's
    /// length fields from the slices given. The digest is appended as given.
    pub fn encode(header: &FrameHeader, capability: &[u8], args: &[u8], digest: &[u8; DIGEST_LEN]) -> Vec<u8> {
        Self::encode_traced(header, None, capability, args, digest)
    }

    /// [`encode`](Self::encode) with the operation's trace id after the
    /// header (`trace_len` set from it).
    ///
    /// # Panics
    /// If a trace id is given for a header of a version before
    /// [`VERSION_TRACE`], which has no room for it.
    pub fn encode_traced(
        header: &FrameHeader,
        trace: Option<&TraceId>,
        capability: &[u8],
        args: &[u8],
        digest: &[u8; DIGEST_LEN],
    ) -> Vec<u8> {
        let trace = trace.map_or(&[][..], TraceId::as_bytes);
        assert!(trace.is_empty() || header.version >= VERSION_TRACE, "a version-1 frame carries no trace id");
        let mut h = header.clone();
        h.trace_len = trace.len() as u16;
        h.capability_len = capability.len() as u16;
        h.args_len = args.len() as u32;
        let mut out = Vec::with_capacity(HEADER_LEN + trace.len() + capability.len() + args.len() + DIGEST_LEN);
        out.extend_from_slice(&h.encode());
        out.extend_from_slice(trace);
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
        let trace = match header.trace_len {
            0 => None,
            n => Some(TraceId::from_bytes(r.take(n as usize)?)?),
        };
        let capability = r.take(header.capability_len as usize)?;
        let args = r.take(header.args_len as usize)?;
        let digest = r.array::<DIGEST_LEN>()?;
        r.finish()?;
        Ok(FramePrefix { header, trace, capability, args, digest })
    }
}

#[cfg(test)]
mod manager_tests;
#[cfg(test)]
mod tests;
