//! Sealing keys and small records (XChaCha20-Poly1305), and the XChaCha20
//! keystream used for argument and data privacy.

use crate::{Key, KEY_LEN};
use chacha20::cipher::{KeyIvInit, StreamCipher, StreamCipherSeek};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::XChaCha20Poly1305;

/// Nonce length of the sealing AEAD.
pub const SEAL_NONCE_LEN: usize = 24;
/// Tag length of the sealing AEAD.
pub const SEAL_TAG_LEN: usize = 16;
/// Length of a sealed key: nonce, encrypted key, tag.
pub const SEALED_KEY_LEN: usize = SEAL_NONCE_LEN + KEY_LEN + SEAL_TAG_LEN;

/// Sealing or opening failed: wrong key, wrong context, or altered bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("sealed value does not open under this key and context")]
pub struct OpenError;

/// Encrypts and authenticates `plaintext` under `key`, binding `context`
/// (associated data); output = random nonce ‖ ciphertext ‖ tag.
pub fn seal(key: &Key, context: &[u8], plaintext: &[u8]) -> Vec<u8> {
    let nonce: [u8; SEAL_NONCE_LEN] = crate::random_bytes();
    seal_with_nonce(key, &nonce, context, plaintext)
}

/// [`seal`] with a caller-chosen nonce (known-answer tests only; a nonce must
/// never repeat under one key).
pub fn seal_with_nonce(key: &Key, nonce: &[u8; SEAL_NONCE_LEN], context: &[u8], plaintext: &[u8]) -> Vec<u8> {
    let aead = XChaCha20Poly1305::new(key.expose().into());
    let ct = aead
        .encrypt(nonce.into(), Payload { msg: plaintext, aad: context })
        .expect("XChaCha20-Poly1305 encryption cannot fail for in-memory buffers");
    let mut out = Vec::with_capacity(SEAL_NONCE_LEN + ct.len());
    out.extend_from_slice(nonce);
    out.extend_from_slice(&ct);
    out
}

/// Opens a value made by [`seal`] with the same key and context.
pub fn open(key: &Key, context: &[u8], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
    if sealed.len() < SEAL_NONCE_LEN + SEAL_TAG_LEN {
        return Err(OpenError);
    }
    let (nonce, ct) = sealed.split_at(SEAL_NONCE_LEN);
    let aead = XChaCha20Poly1305::new(key.expose().into());
    aead.decrypt(nonce.into(), Payload { msg: ct, aad: context }).map_err(|_| OpenError)
}

/// Seals a key under a wrapping key.
pub fn seal_key(wrapping: &Key, context: &[u8], key: &Key) -> Vec<u8> {
    seal(wrapping, context, key.expose())
}

/// Opens a sealed key.
pub fn open_key(wrapping: &Key, context: &[u8], sealed: &[u8]) -> Result<Key, OpenError> {
    if sealed.len() != SEALED_KEY_LEN {
        return Err(OpenError);
    }
    let mut bytes = open(wrapping, context, sealed)?;
    let key: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| OpenError)?;
    zeroize::Zeroize::zeroize(&mut bytes);
    Ok(Key::from_bytes(key))
}

/// XORs `data` with the XChaCha20 keystream of (`key`, `nonce`) starting at
/// byte `offset` of the stream. Encryption and decryption are the same call.
pub fn xor_keystream(key: &Key, nonce: &[u8; 24], offset: u64, data: &mut [u8]) {
    let mut c = chacha20::XChaCha20::new(key.expose().into(), nonce.into());
    c.seek(offset);
    c.apply_keystream(data);
}
