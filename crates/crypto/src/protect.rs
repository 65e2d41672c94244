//! Protection of frames (NASD Table 7) and capabilities (NASD Figure 1): the
//! one implementation both drive and client use, so the two cannot disagree.

use crate::{ct_eq, mac, open, seal, xor_keystream, Key, MacAlgorithm, MacState, MacValue};
use nasd_proto::limits::NONCE_LEN;
use nasd_proto::{CapabilityArgs, Kind, Protection, SealedCapabilityPrefix, CAPABILITY_ARGS_LEN, SEALED_CAPABILITY_PREFIX_LEN};

/// The keys a frame is protected with, all derived from the request key.
pub struct FrameKeys {
    alg: MacAlgorithm,
    raw: Key,
    mac: Key,
    enc: Key,
}

/// Which part of a frame a keystream encrypts.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Section {
    Args = 1,
    Data = 2,
}

fn stream_nonce(kind: Kind, nonce: &[u8; NONCE_LEN], section: Section) -> [u8; 24] {
    let mut n = [0u8; 24];
    n[..NONCE_LEN].copy_from_slice(nonce);
    n[NONCE_LEN] = kind as u8;
    n[NONCE_LEN + 1] = section as u8;
    n
}

impl FrameKeys {
    /// Keys for frames protected by `key` (a capability key or a key of the hierarchy).
    pub fn new(alg: MacAlgorithm, key: &Key) -> Self {
        FrameKeys { alg, raw: key.clone(), mac: key.derive("nasd v1 frame mac"), enc: key.derive("nasd v1 frame encryption") }
    }

    /// The digest field a frame must carry: under `INTEGRITY_ARGS`, the MAC of
    /// every byte before the digest; under no protection, the key itself (a
    /// bearer proof, sent only when the capability allows no protection).
    pub fn digest(&self, protection: Protection, before_digest: &[u8]) -> MacValue {
        if protection.covers(Protection::INTEGRITY_ARGS) {
            mac(self.alg, &self.mac, &[before_digest])
        } else {
            *self.raw.expose()
        }
    }

    /// Checks a received digest in constant time.
    pub fn verify_digest(&self, protection: Protection, before_digest: &[u8], digest: &[u8]) -> bool {
        ct_eq(&self.digest(protection, before_digest), digest)
    }

    /// The digest of a reply: under `INTEGRITY_ARGS`, the MAC of the request's
    /// digest then every byte of the reply before its digest, so a reply
    /// answers exactly one request and cannot be replayed for another. Without
    /// integrity, zero: such a reply proves nothing, and never carries a key.
    pub fn reply_digest(&self, protection: Protection, request_digest: &[u8], before_digest: &[u8]) -> MacValue {
        if protection.covers(Protection::INTEGRITY_ARGS) {
            mac(self.alg, &self.mac, &[request_digest, before_digest])
        } else {
            [0u8; crate::MAC_LEN]
        }
    }

    /// Checks a reply's digest in constant time.
    pub fn verify_reply_digest(&self, protection: Protection, request_digest: &[u8], before_digest: &[u8], digest: &[u8]) -> bool {
        ct_eq(&self.reply_digest(protection, request_digest, before_digest), digest)
    }

    /// Encrypts or decrypts arguments in place (`PRIVACY_ARGS`; encrypt, then MAC).
    pub fn crypt_args(&self, kind: Kind, nonce: &[u8; NONCE_LEN], args: &mut [u8]) {
        xor_keystream(&self.enc, &stream_nonce(kind, nonce, Section::Args), 0, args);
    }

    /// The protector of a frame's data section, seeded with the frame's digest
    /// so the data is bound to its header.
    pub fn data(&self, kind: Kind, nonce: &[u8; NONCE_LEN], protection: Protection, digest: &[u8]) -> DataProtector {
        let integrity = protection.covers(Protection::INTEGRITY_DATA);
        let privacy = protection.covers(Protection::PRIVACY_DATA);
        DataProtector {
            mac: integrity.then(|| {
                let mut m = MacState::new(self.alg, &self.mac);
                m.update(digest);
                m
            }),
            enc: privacy.then(|| (self.enc.clone(), stream_nonce(kind, nonce, Section::Data))),
            offset: 0,
        }
    }
}

/// Protects or checks a data section chunk by chunk: cumulative MACs (each
/// tag covers all data so far), and optional XChaCha20 encryption.
pub struct DataProtector {
    mac: Option<MacState>,
    enc: Option<(Key, [u8; 24])>,
    offset: u64,
}

/// A data chunk's tag did not match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("data tag mismatch: the data changed in flight")]
pub struct TagMismatch;

impl DataProtector {
    /// Sender: encrypts `chunk` in place if required and returns its tag (empty
    /// without data integrity).
    pub fn seal_chunk(&mut self, chunk: &mut [u8]) -> Vec<u8> {
        if let Some((key, nonce)) = &self.enc {
            xor_keystream(key, nonce, self.offset, chunk);
        }
        self.offset += chunk.len() as u64;
        match &mut self.mac {
            Some(m) => {
                m.update(chunk);
                m.peek().to_vec()
            }
            None => Vec::new(),
        }
    }

    /// Receiver: checks `tag` over the data so far (ending with `chunk`), then
    /// decrypts `chunk` in place if required. The chunk must not be used if
    /// this fails.
    pub fn open_chunk(&mut self, chunk: &mut [u8], tag: &[u8]) -> Result<(), TagMismatch> {
        if let Some(m) = &mut self.mac {
            m.update(chunk);
            if !ct_eq(&m.peek(), tag) {
                return Err(TagMismatch);
            }
        }
        if let Some((key, nonce)) = &self.enc {
            xor_keystream(key, nonce, self.offset, chunk);
        }
        self.offset += chunk.len() as u64;
        Ok(())
    }
}

/// The capability key: MAC(working key, capability arguments). The arguments
/// include the object's access control version, so changing it revokes.
pub fn capability_key(working: &Key, args: &CapabilityArgs) -> Option<Key> {
    let alg = MacAlgorithm::from_id(args.algorithm)?;
    Some(Key::from_bytes(mac(alg, working, &[&args.encode()])))
}

fn capability_seal_key(working: &Key) -> Key {
    working.derive("nasd v1 capability seal")
}

/// Mints a capability (the file manager's job): the token a client puts in
/// its frames, and the secret capability key it MACs them with. `sealed`
/// hides the arguments from everyone but the drive (`PRIVACY_CAPABILITY`).
pub fn mint_capability(working: &Key, args: &CapabilityArgs, sealed: bool) -> Option<(Vec<u8>, Key)> {
    let key = capability_key(working, args)?;
    let token = if sealed {
        let prefix = SealedCapabilityPrefix { key_version: args.key_version, partition: args.partition }.encode();
        let mut t = prefix.to_vec();
        t.extend_from_slice(&seal(&capability_seal_key(working), &prefix, &args.encode()));
        t
    } else {
        args.encode().to_vec()
    };
    Some((token, key))
}

/// Opens a sealed capability token with the working key its prefix names.
pub fn unseal_capability(working: &Key, token: &[u8]) -> Option<CapabilityArgs> {
    let prefix = SealedCapabilityPrefix::decode(token).ok()?;
    let bytes = open(&capability_seal_key(working), &token[..SEALED_CAPABILITY_PREFIX_LEN], &token[SEALED_CAPABILITY_PREFIX_LEN..]).ok()?;
    if bytes.len() != CAPABILITY_ARGS_LEN {
        return None;
    }
    let args = CapabilityArgs::decode(&bytes).ok()?;
    (args.partition == prefix.partition && args.key_version == prefix.key_version).then_some(args)
}

/// Associated data binding a sealed key to the slot it is for.
pub fn key_context(operation: u16, partition: u64, key_version: u32) -> Vec<u8> {
    let mut c = b"nasd v1 key ".to_vec();
    c.extend_from_slice(&operation.to_le_bytes());
    c.extend_from_slice(&partition.to_le_bytes());
    c.extend_from_slice(&key_version.to_le_bytes());
    c
}
