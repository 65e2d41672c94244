//! Secret keys: 32 bytes that never print and are zeroed when dropped.

use zeroize::{Zeroize, ZeroizeOnDrop};

/// Length of every nasd key.
pub const KEY_LEN: usize = 32;

/// A secret key. `Debug` prints `Key(<redacted>)`; the bytes are zeroed on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct Key([u8; KEY_LEN]);

impl Key {
    /// Wraps raw key bytes.
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Key(bytes)
    }
    /// A fresh key from the operating system's random source.
    pub fn random() -> Self {
        Key(crate::random_bytes())
    }
    /// The raw bytes, for MACs, ciphers and sealed storage only.
    pub fn expose(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
    /// A key derived for one purpose (BLAKE3 key derivation), so one secret
    /// never serves two algorithms.
    pub fn derive(&self, purpose: &str) -> Key {
        Key(blake3::derive_key(purpose, &self.0))
    }
    /// Parses 64 hex digits (key files).
    pub fn from_hex(s: &str) -> Option<Key> {
        let s = s.trim();
        if s.len() != 2 * KEY_LEN {
            return None;
        }
        let mut k = [0u8; KEY_LEN];
        for (i, byte) in k.iter_mut().enumerate() {
            *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Key(k))
    }
    /// 64 hex digits (key files).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        crate::ct_eq(&self.0, &other.0)
    }
}
impl Eq for Key {}
