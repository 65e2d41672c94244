//! nasd cryptography.
//!
//! Today: the unkeyed per-block digest the drive stores beside every block
//! ([`block_digest`]) and the constant-time comparison every digest or MAC check
//! goes through ([`ct_eq`]). The key hierarchy, capability keys, request MACs
//! and AEAD build on these in the security layer.
//!
//! ```
//! let d = nasd_crypto::block_digest(b"hello");
//! assert!(nasd_crypto::ct_eq(&d, &nasd_crypto::block_digest(b"hello")));
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use subtle::ConstantTimeEq;

/// Length of a block digest, in bytes.
pub const BLOCK_DIGEST_LEN: usize = 32;

/// A block digest: BLAKE3 of the block's bytes.
pub type BlockDigest = [u8; BLOCK_DIGEST_LEN];

/// Digest of one stored block (BLAKE3, unkeyed, 32 bytes).
///
/// Unkeyed on purpose: stored digests detect media corruption at rest and are
/// bound to a key only when a reply is MACed ("Hash and MAC").
pub fn block_digest(block: &[u8]) -> BlockDigest {
    *blake3::hash(block).as_bytes()
}

/// Digest of a block of `len` zero bytes (holes read as zeros).
pub fn zero_block_digest(len: usize) -> BlockDigest {
    let mut h = blake3::Hasher::new();
    const ZEROS: [u8; 4096] = [0; 4096];
    let mut left = len;
    while left > 0 {
        let n = left.min(ZEROS.len());
        h.update(&ZEROS[..n]);
        left -= n;
    }
    *h.finalize().as_bytes()
}

/// Compares two byte strings in time independent of where they differ
/// (`subtle::ConstantTimeEq`). Every digest and MAC comparison in nasd goes
/// through this function.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_known_answer() {
        // BLAKE3("") from the BLAKE3 specification's test vectors.
        assert_eq!(
            hex::encode(block_digest(b"")),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn zero_digest_matches_materialized_zeros() {
        for len in [0, 1, 4095, 4096, 65536, 100_000] {
            assert_eq!(zero_block_digest(len), block_digest(&vec![0u8; len]));
        }
    }

    #[test]
    fn ct_eq_compares() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}
