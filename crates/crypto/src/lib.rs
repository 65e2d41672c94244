//! nasd cryptography.
//!
//! - [`block_digest`]: the unkeyed per-block digest the drive stores beside
//!   every block; [`ct_eq`]: the constant-time comparison every digest, MAC,
//!   tag or key check goes through.
//! - [`Key`]: a secret that never prints and is zeroed on drop.
//! - [`MacState`], [`mac`]: keyed BLAKE3 or HMAC-SHA-256, incremental, so
//!   cumulative MACs over a stream cost one finalization per chunk.
//! - [`seal`], [`open`], [`seal_key`], [`open_key`]: XChaCha20-Poly1305 for keys
//!   in transit and sealed capabilities; [`xor_keystream`]: XChaCha20 for
//!   argument and data privacy.
//! - [`identity_key`]: DSFS identity keys, `MAC(K, K_data)`, and
//!   [`identity_drive_key`], the key that binds an identity's requests to one drive.
//! - [`FileHandleKey`]: the file manager's MACs over inode numbers (file handles).
//! - [`durable`]: small files (keys, and the manager's TLS and password files)
//!   written whole, synced and renamed into place.
//!
//! ```
//! let d = nasd_crypto::block_digest(b"hello");
//! assert!(nasd_crypto::ct_eq(&d, &nasd_crypto::block_digest(b"hello")));
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod durable;
mod handle;
mod key;
mod key_file;
mod mac;
mod protect;
mod seal;

pub use handle::{FileHandleKey, FILE_HANDLE_DOMAIN, FILE_HANDLE_KEY_CONTEXT, FILE_SYSTEM_ID_LEN};
pub use key::{Key, KEY_LEN};
pub use key_file::{create_key_file, load_or_create_key_file, read_key_file};
pub use mac::{mac, MacAlgorithm, MacState, MacValue, MAC_LEN};
pub use protect::{
    capability_key, identity_drive_key, identity_key, identity_login_proof, key_context, mint_capability,
    unseal_capability, DataProtector, FrameKeys, StoredDigestMismatch, TagMismatch, UnitMac, Units,
    IDENTITY_DRIVE_PURPOSE, IDENTITY_LOGIN_PURPOSE,
};
pub use seal::{
    open, open_key, seal, seal_key, seal_with_nonce, xor_keystream, OpenError, SEALED_KEY_LEN, SEAL_NONCE_LEN,
    SEAL_TAG_LEN,
};

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

/// `N` bytes from the operating system's random source (keys, nonces, ids).
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::getrandom(&mut b).expect("the OS random source failed");
    b
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
        assert_eq!(hex::encode(block_digest(b"")), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262");
    }

    #[test]
    fn zero_digest_matches_materialized_zeros() {
        for len in [0, 1, 4095, 4096, 65536, 100_000] {
            assert_eq!(zero_block_digest(len), block_digest(&vec![0u8; len]));
        }
    }

    #[test]
    fn mac_known_answers() {
        let key = Key::from_bytes(*b"whats the Elvish word for friend");
        // HMAC-SHA-256 with this key and message, and keyed BLAKE3, computed
        // independently of this code (RFC 4231 style inputs).
        let m = mac(MacAlgorithm::HmacSha256, &key, &[b"nasd ", b"known answer"]);
        assert_eq!(m, hmac_reference(key.expose(), b"nasd known answer"));
        let b = mac(MacAlgorithm::Blake3, &key, &[b"nasd ", b"known answer"]);
        assert_eq!(b, *blake3::keyed_hash(key.expose(), b"nasd known answer").as_bytes());
        assert_ne!(m, b);
    }

    fn hmac_reference(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
        // HMAC per RFC 2104 over SHA-256, written out, to check the hmac crate wiring.
        use sha2::Digest;
        let mut ipad = [0x36u8; 64];
        let mut opad = [0x5cu8; 64];
        for i in 0..32 {
            ipad[i] ^= key[i];
            opad[i] ^= key[i];
        }
        let inner = sha2::Sha256::new().chain_update(ipad).chain_update(msg).finalize();
        sha2::Sha256::new().chain_update(opad).chain_update(inner).finalize().into()
    }

    #[test]
    fn cumulative_mac_equals_mac_of_prefix() {
        for alg in [MacAlgorithm::Blake3, MacAlgorithm::HmacSha256] {
            let key = Key::random();
            let mut m = MacState::new(alg, &key);
            m.update(b"chunk one");
            assert_eq!(m.peek(), mac(alg, &key, &[b"chunk one"]));
            m.update(b"chunk two");
            assert_eq!(m.finish(), mac(alg, &key, &[b"chunk one", b"chunk two"]));
        }
    }

    #[test]
    fn sealed_keys_open_only_with_key_and_context() {
        let wrap = Key::random();
        let k = Key::random();
        let sealed = seal_key(&wrap, b"setdrivekey", &k);
        assert_eq!(sealed.len(), SEALED_KEY_LEN);
        assert_eq!(open_key(&wrap, b"setdrivekey", &sealed).unwrap(), k);
        assert_eq!(open_key(&wrap, b"setpartitionkey", &sealed), Err(OpenError));
        assert_eq!(open_key(&Key::random(), b"setdrivekey", &sealed), Err(OpenError));
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert_eq!(open_key(&wrap, b"setdrivekey", &bad), Err(OpenError), "bit flip at {i}");
        }
        assert_eq!(open_key(&wrap, b"setdrivekey", &sealed[1..]), Err(OpenError));
    }

    #[test]
    fn keystream_round_trips_at_any_offset() {
        let k = Key::random();
        let nonce = [7u8; 24];
        let plain: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut whole = plain.clone();
        xor_keystream(&k, &nonce, 0, &mut whole);
        assert_ne!(whole, plain);
        let mut tail = plain[300..].to_vec();
        xor_keystream(&k, &nonce, 300, &mut tail);
        assert_eq!(tail, whole[300..]);
        xor_keystream(&k, &nonce, 0, &mut whole);
        assert_eq!(whole, plain);
    }

    #[test]
    fn keys_never_print() {
        let k = Key::from_bytes([0xab; 32]);
        assert_eq!(format!("{k:?}"), "Key(<redacted>)");
        assert_eq!(Key::from_hex(&k.to_hex()).unwrap(), k);
        assert!(Key::from_hex("abc").is_none());
        assert_ne!(k.derive("a"), k.derive("b"));
    }

    #[test]
    fn ct_eq_compares() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}
