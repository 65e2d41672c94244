//! Identity credentials (DSFS §3.1): the public key data `K_data` a client
//! sends in place of a capability under key type `IDENTITY`, and the
//! per-partition authorization scheme that decides which kind a partition
//! accepts.
//!
//! The identity key `idkey = MAC_alg(K, K_data)` is computed by the
//! authentication server with one of the shared identity keys K (named by
//! `key_id`) and by the drive with its own copy of K; `nasd_crypto::identity_key`
//! is the one implementation. `K_data` is not secret; `idkey` is.

use crate::codec::{Reader, Writer};
use crate::DecodeError;

/// Encoded length of [`IdentityData`].
pub const IDENTITY_DATA_LEN: usize = 24;
/// Format byte of an identity credential (capability tokens use 1 and 2).
pub const IDENTITY_FORMAT: u8 = 3;
/// The role of a credential that claims none: it matches no role entry.
pub const ROLE_NONE: u32 = 0;

/// `K_data`: who the holder of the matching identity key is, which shared
/// key vouches for it, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdentityData {
    /// MAC algorithm id (1 BLAKE3, 2 HMAC-SHA-256) of the identity key and of
    /// the requests it protects.
    pub algorithm: u8,
    /// The shared identity key K the identity key was computed with (≠ 0).
    pub key_id: u32,
    /// The user.
    pub user: u32,
    /// The one role the holder assumed for this session, or [`ROLE_NONE`].
    pub role: u32,
    /// Drive-clock nanoseconds after which requests under it are refused.
    pub expiration_ns: u64,
}

impl IdentityData {
    /// The canonical 24-byte encoding (the frame's capability field carries
    /// exactly these bytes; the identity key is the MAC of them).
    pub fn encode(&self) -> [u8; IDENTITY_DATA_LEN] {
        let mut w = Writer::with_capacity(IDENTITY_DATA_LEN);
        w.u8(IDENTITY_FORMAT).u8(self.algorithm).u16(0).u32(self.key_id).u32(self.user).u32(self.role);
        w.u64(self.expiration_ns);
        let mut out = [0u8; IDENTITY_DATA_LEN];
        out.copy_from_slice(&w.into_vec());
        out
    }

    /// Decodes and validates the 24-byte encoding: length, format, reserved
    /// bytes, algorithm, a key id other than 0.
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        if buf.len() != IDENTITY_DATA_LEN {
            return Err(DecodeError::NotCanonical("identity credential is not 24 bytes"));
        }
        let mut r = Reader::new(buf);
        if r.u8()? != IDENTITY_FORMAT {
            return Err(DecodeError::NotCanonical("not an identity credential"));
        }
        let algorithm = r.u8()?;
        if r.u16()? != 0 {
            return Err(DecodeError::NotCanonical("reserved identity bytes are not zero"));
        }
        let key_id = r.u32()?;
        let user = r.u32()?;
        let role = r.u32()?;
        let expiration_ns = r.u64()?;
        r.finish()?;
        if !matches!(algorithm, 1 | 2) {
            return Err(DecodeError::NotCanonical("unknown identity algorithm"));
        }
        if key_id == 0 {
            return Err(DecodeError::NotCanonical("identity key id 0"));
        }
        Ok(IdentityData { algorithm, key_id, user, role, expiration_ns })
    }

    /// The audit id the drive records for requests under this identity:
    /// user in the high 32 bits, role in the low.
    pub fn audit_id(&self) -> u64 {
        (self.user as u64) << 32 | self.role as u64
    }
}

/// Which credentials a partition accepts for object operations (its
/// owner's choice, `SET_AUTH_SCHEME`): capabilities, identities checked
/// against pre-authorization lists, or both. Keys of the hierarchy are not
/// affected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AuthScheme(u8);

impl AuthScheme {
    /// Capabilities only (the default of every partition).
    pub const CAPABILITIES: AuthScheme = AuthScheme(1 << 0);
    /// Identities and PALs only.
    pub const PALS: AuthScheme = AuthScheme(1 << 1);
    /// Both.
    pub const BOTH: AuthScheme = AuthScheme(Self::CAPABILITIES.0 | Self::PALS.0);

    /// The raw bits.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Parses bits: at least one, none undefined.
    pub fn from_bits(bits: u8) -> Result<Self, DecodeError> {
        if bits & !Self::BOTH.0 != 0 {
            return Err(DecodeError::NotCanonical("undefined authorization scheme bits"));
        }
        if bits == 0 {
            return Err(DecodeError::NotCanonical("an authorization scheme accepts at least one kind"));
        }
        Ok(AuthScheme(bits))
    }

    /// True if capabilities authorize object operations.
    pub fn capabilities(self) -> bool {
        self.0 & Self::CAPABILITIES.0 != 0
    }

    /// True if identities checked against PALs authorize object operations.
    pub fn pals(self) -> bool {
        self.0 & Self::PALS.0 != 0
    }
}

impl Default for AuthScheme {
    fn default() -> Self {
        AuthScheme::CAPABILITIES
    }
}
