//! The fixed 56-byte frame header and the fields that describe a frame.

use crate::codec::{Reader, Writer};
use crate::limits::*;
use crate::{DecodeError, Status};

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"NASD";
/// The highest protocol version this crate speaks.
pub const VERSION: u8 = 2;
/// The version that added trace ids: from it on, the header's bytes 22–23
/// are `trace_len` (reserved, zero, in version 1), and a request may carry
/// its operation's [`TraceId`](crate::TraceId) after the header.
pub const VERSION_TRACE: u8 = 2;
/// Lowest protocol version this crate speaks.
pub const VERSION_MIN: u8 = 1;

/// Whether a frame is a request or a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client to drive.
    Request = 1,
    /// Drive to client.
    Reply = 2,
}

/// Which key of the hierarchy (NASD Table 6) protects a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum KeyType {
    /// No key: only valid with no protection.
    None = 0,
    /// The drive's master key.
    Master = 1,
    /// The drive key.
    Drive = 2,
    /// A partition key.
    Partition = 3,
    /// A partition's working key.
    Working = 4,
    /// The capability key of the capability in the frame.
    Capability = 5,
    /// The identity key of the identity credential (`K_data`) in the frame
    /// (DSFS): authorized by the objects' pre-authorization lists.
    Identity = 6,
}

impl KeyType {
    fn from_u8(v: u8) -> Result<Self, DecodeError> {
        Ok(match v {
            0 => KeyType::None,
            1 => KeyType::Master,
            2 => KeyType::Drive,
            3 => KeyType::Partition,
            4 => KeyType::Working,
            5 => KeyType::Capability,
            6 => KeyType::Identity,
            _ => return Err(DecodeError::NotCanonical("unknown key type")),
        })
    }
}

/// Protection options of NASD Table 7, as a set of bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Protection(u8);

impl Protection {
    /// Digests are neither computed nor checked.
    pub const NONE: Protection = Protection(0);
    /// The digest covers header, capability, arguments and nonce.
    pub const INTEGRITY_ARGS: Protection = Protection(1 << 0);
    /// Each data chunk carries a tag covering the data.
    pub const INTEGRITY_DATA: Protection = Protection(1 << 1);
    /// Arguments are encrypted.
    pub const PRIVACY_ARGS: Protection = Protection(1 << 2);
    /// Data is encrypted.
    pub const PRIVACY_DATA: Protection = Protection(1 << 3);
    /// The capability is encrypted under the working key.
    pub const PRIVACY_CAPABILITY: Protection = Protection(1 << 4);
    /// Reply data tags are "Hash and MAC": a MAC over per-block digests
    /// (stored ones for whole blocks) instead of over every byte. Needs
    /// `INTEGRITY_DATA`; not with `PRIVACY_DATA`.
    pub const HASH_AND_MAC: Protection = Protection(1 << 5);
    const DEFINED: u8 = 0b11_1111;

    /// The raw bits.
    pub fn bits(self) -> u8 {
        self.0
    }
    /// Parses bits, refusing undefined ones.
    pub fn from_bits(bits: u8) -> Result<Self, DecodeError> {
        if bits & !Self::DEFINED != 0 {
            return Err(DecodeError::NotCanonical("undefined protection bits"));
        }
        Ok(Protection(bits))
    }
    /// True if every option of `min` is also in `self`.
    pub fn covers(self, min: Protection) -> bool {
        self.0 & min.0 == min.0
    }
    /// The union of two sets of options.
    pub const fn union(self, other: Protection) -> Protection {
        Protection(self.0 | other.0)
    }
    /// True if the options respect their implications: every privacy option
    /// and `INTEGRITY_DATA` need `INTEGRITY_ARGS`; `PRIVACY_DATA` needs
    /// `INTEGRITY_DATA`.
    pub fn is_consistent(self) -> bool {
        let has = |p: Protection| self.covers(p);
        let needs_args = self.0 & !Self::INTEGRITY_ARGS.0 != 0;
        let args_ok = has(Self::INTEGRITY_ARGS) || !needs_args;
        let data_ok = has(Self::INTEGRITY_DATA) || !has(Self::PRIVACY_DATA);
        let hash_ok = !has(Self::HASH_AND_MAC) || (has(Self::INTEGRITY_DATA) && !has(Self::PRIVACY_DATA));
        args_ok && data_ok && hash_ok
    }

    /// Bytes of tag after each data chunk under this protection.
    pub fn data_tag_len(self) -> usize {
        if self.0 & (Self::INTEGRITY_DATA.0 | Self::PRIVACY_DATA.0) != 0 {
            DATA_TAG_LEN
        } else {
            0
        }
    }
}

/// The fixed header at the start of every frame (see PROTOCOL.md, "Frame").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameHeader {
    /// Protocol version of this frame.
    pub version: u8,
    /// Request or reply.
    pub kind: Kind,
    /// Operation code; a reply echoes its request's.
    pub opcode: u16,
    /// Chosen by the client, echoed in the reply.
    pub request_id: u64,
    /// Which key protects the frame.
    pub key_type: KeyType,
    /// Protection options in force.
    pub protection: Protection,
    /// 0 in requests; the outcome in replies.
    pub status: u16,
    /// Length of the trace id that follows the header: version 2 requests
    /// only, at most [`TRACE_ID_LEN_MAX`]; 0 in replies and version 1.
    pub trace_len: u16,
    /// Length of the capability that follows the trace id.
    pub capability_len: u16,
    /// Length of the arguments that follow the capability.
    pub args_len: u32,
    /// Length of each data chunk but the last; 0 when there is no data.
    pub chunk_len: u32,
    /// Total data bytes after the digest (tags not counted).
    pub data_len: u64,
    /// Freshness value: drive-clock nanoseconds then a sequence number.
    pub nonce: [u8; NONCE_LEN],
}

impl FrameHeader {
    /// A version-1 request header (every drive takes version 1) with no
    /// capability, arguments or data yet. A client that negotiated a later
    /// version sets [`version`](Self::version).
    pub fn request(opcode: u16, request_id: u64) -> Self {
        FrameHeader {
            version: VERSION_MIN,
            kind: Kind::Request,
            opcode,
            request_id,
            key_type: KeyType::None,
            protection: Protection::NONE,
            status: 0,
            trace_len: 0,
            capability_len: 0,
            args_len: 0,
            chunk_len: 0,
            data_len: 0,
            nonce: [0; NONCE_LEN],
        }
    }

    /// A reply header answering `req` with `status`.
    pub fn reply_to(req: &FrameHeader, status: Status) -> Self {
        FrameHeader {
            kind: Kind::Reply,
            status: status as u16,
            trace_len: 0,
            capability_len: 0,
            args_len: 0,
            chunk_len: 0,
            data_len: 0,
            ..req.clone()
        }
    }

    /// Encodes the header into exactly `HEADER_LEN` bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut w = Writer::with_capacity(HEADER_LEN);
        w.raw(&MAGIC)
            .u8(self.version)
            .u8(self.kind as u8)
            .u16(self.opcode)
            .u64(self.request_id)
            .u8(self.key_type as u8)
            .u8(self.protection.bits())
            .u16(self.status)
            .u16(self.capability_len)
            .u16(self.trace_len)
            .u32(self.args_len)
            .u32(self.chunk_len)
            .u64(self.data_len)
            .raw(&self.nonce);
        let v = w.into_vec();
        let mut out = [0u8; HEADER_LEN];
        out.copy_from_slice(&v);
        out
    }

    /// Decodes and validates a header: magic, version, every field in range and
    /// every length within its named limit.
    pub fn decode(buf: &[u8; HEADER_LEN]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(buf);
        if r.array::<4>()? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = r.u8()?;
        if !(VERSION_MIN..=VERSION).contains(&version) {
            // Checked before anything else: a later version may lay out the
            // rest of the header differently.
            return Err(DecodeError::Version(version));
        }
        let kind = match r.u8()? {
            1 => Kind::Request,
            2 => Kind::Reply,
            _ => return Err(DecodeError::NotCanonical("unknown frame kind")),
        };
        let opcode = r.u16()?;
        let request_id = r.u64()?;
        let key_type = KeyType::from_u8(r.u8()?)?;
        let protection = Protection::from_bits(r.u8()?)?;
        let status = r.u16()?;
        let capability_len = r.u16()?;
        let trace_len = r.u16()?;
        if version < VERSION_TRACE && trace_len != 0 {
            return Err(DecodeError::NotCanonical("reserved header field is not zero"));
        }
        let args_len = r.u32()?;
        let chunk_len = r.u32()?;
        let data_len = r.u64()?;
        let nonce = r.array::<NONCE_LEN>()?;
        r.finish()?;
        let h = FrameHeader {
            version,
            kind,
            opcode,
            request_id,
            key_type,
            protection,
            status,
            trace_len,
            capability_len,
            args_len,
            chunk_len,
            data_len,
            nonce,
        };
        h.check_limits()?;
        Ok(h)
    }

    fn check_limits(&self) -> Result<(), DecodeError> {
        let over = |field, len: u64, max: u64| DecodeError::OverLimit { field, len, max };
        if self.trace_len as usize > TRACE_ID_LEN_MAX {
            return Err(over("trace_len", self.trace_len as u64, TRACE_ID_LEN_MAX as u64));
        }
        if self.kind == Kind::Reply && self.trace_len != 0 {
            return Err(DecodeError::NotCanonical("reply with a trace id"));
        }
        if self.capability_len as usize > CAPABILITY_LEN_MAX {
            return Err(over("capability_len", self.capability_len as u64, CAPABILITY_LEN_MAX as u64));
        }
        if self.args_len as usize > ARGS_LEN_MAX {
            return Err(over("args_len", self.args_len as u64, ARGS_LEN_MAX as u64));
        }
        if self.data_len > DATA_LEN_MAX {
            return Err(over("data_len", self.data_len, DATA_LEN_MAX));
        }
        if self.data_len == 0 {
            if self.chunk_len != 0 {
                return Err(DecodeError::NotCanonical("chunk_len without data"));
            }
        } else if !(CHUNK_LEN_MIN..=CHUNK_LEN_MAX).contains(&self.chunk_len) {
            return Err(over("chunk_len", self.chunk_len as u64, CHUNK_LEN_MAX as u64));
        }
        if self.kind == Kind::Request && self.status != 0 {
            return Err(DecodeError::NotCanonical("request with a status"));
        }
        Ok(())
    }

    /// Bytes between the header and the data: trace id, capability,
    /// arguments, digest.
    pub fn body_len(&self) -> usize {
        self.trace_len as usize + self.capability_len as usize + self.args_len as usize + DIGEST_LEN
    }

    /// Number of data chunks that follow the digest.
    pub fn chunk_count(&self) -> u64 {
        if self.data_len == 0 {
            0
        } else {
            self.data_len.div_ceil(self.chunk_len as u64)
        }
    }

    /// Length of chunk `index` (all are `chunk_len` except possibly the last).
    pub fn chunk_size(&self, index: u64) -> u32 {
        debug_assert!(index < self.chunk_count());
        let start = index * self.chunk_len as u64;
        (self.data_len - start).min(self.chunk_len as u64) as u32
    }
}

/// Nonce layout helpers: 8 bytes of nanoseconds, 8 bytes of sequence, little-endian.
pub fn nonce(time_ns: u64, sequence: u64) -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    n[..8].copy_from_slice(&time_ns.to_le_bytes());
    n[8..].copy_from_slice(&sequence.to_le_bytes());
    n
}
