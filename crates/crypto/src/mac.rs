//! Message authentication codes, chosen by algorithm id.

use crate::Key;
use hmac::{Hmac, Mac as _};
use sha2::Sha256;

/// Length of every MAC and digest on the wire.
pub const MAC_LEN: usize = 32;

/// A MAC value.
pub type MacValue = [u8; MAC_LEN];

/// MAC algorithms, by their wire id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MacAlgorithm {
    /// BLAKE3 in keyed mode (the default: fastest).
    Blake3 = 1,
    /// HMAC-SHA-256 (for sites that require a NIST algorithm).
    HmacSha256 = 2,
}

impl MacAlgorithm {
    /// The algorithm for a wire id.
    pub fn from_id(id: u8) -> Option<Self> {
        match id {
            1 => Some(MacAlgorithm::Blake3),
            2 => Some(MacAlgorithm::HmacSha256),
            _ => None,
        }
    }
}

/// An incremental MAC. Cloning the state and finalizing the clone gives the
/// MAC of everything so far without ending the stream: the cumulative MACs
/// inserted after every data chunk cost one finalization each.
#[derive(Clone)]
pub enum MacState {
    /// Keyed BLAKE3.
    Blake3(Box<blake3::Hasher>),
    /// HMAC-SHA-256.
    HmacSha256(Box<Hmac<Sha256>>),
}

impl MacState {
    /// Starts a MAC under `key`.
    pub fn new(alg: MacAlgorithm, key: &Key) -> Self {
        match alg {
            MacAlgorithm::Blake3 => MacState::Blake3(Box::new(blake3::Hasher::new_keyed(key.expose()))),
            MacAlgorithm::HmacSha256 => MacState::HmacSha256(Box::new(
                Hmac::<Sha256>::new_from_slice(key.expose()).expect("HMAC takes any key length"),
            )),
        }
    }
    /// Adds bytes.
    pub fn update(&mut self, bytes: &[u8]) -> &mut Self {
        match self {
            MacState::Blake3(h) => {
                h.update(bytes);
            }
            MacState::HmacSha256(h) => h.update(bytes),
        }
        self
    }
    /// The MAC of everything added so far; the state goes on.
    pub fn peek(&self) -> MacValue {
        self.clone().finish()
    }
    /// The MAC of everything added.
    pub fn finish(self) -> MacValue {
        match self {
            MacState::Blake3(h) => *h.finalize().as_bytes(),
            MacState::HmacSha256(h) => h.finalize().into_bytes().into(),
        }
    }
}

/// MAC of the concatenation of `parts`.
pub fn mac(alg: MacAlgorithm, key: &Key, parts: &[&[u8]]) -> MacValue {
    let mut m = MacState::new(alg, key);
    for p in parts {
        m.update(p);
    }
    m.finish()
}
