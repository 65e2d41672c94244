//! Protection of frames (NASD Table 7) and capabilities (NASD Figure 1): the
//! one implementation both drive and client use, so the two cannot disagree.

use crate::{ct_eq, mac, open, seal, xor_keystream, Key, MacAlgorithm, MacState, MacValue};
use nasd_proto::limits::NONCE_LEN;
use nasd_proto::{
    CapabilityArgs, IdentityData, Kind, Protection, SealedCapabilityPrefix, CAPABILITY_ARGS_LEN,
    SEALED_CAPABILITY_PREFIX_LEN,
};

/// The keys a frame is protected with, all derived from the request key.
#[derive(Clone)]
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
        FrameKeys {
            alg,
            raw: key.clone(),
            mac: key.derive("nasd v1 frame mac"),
            enc: key.derive("nasd v1 frame encryption"),
        }
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
    pub fn verify_reply_digest(
        &self,
        protection: Protection,
        request_digest: &[u8],
        before_digest: &[u8],
        digest: &[u8],
    ) -> bool {
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

/// A unit's bytes do not hash to the digest stored for them (the block
/// rotted on the media).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("block bytes do not match their stored digest")]
pub struct StoredDigestMismatch;

/// The capability key: MAC(working key, capability arguments). The arguments
/// include the object's access control version, so changing it revokes.
pub fn capability_key(working: &Key, args: &CapabilityArgs) -> Option<Key> {
    let alg = MacAlgorithm::from_id(args.algorithm)?;
    Some(Key::from_bytes(mac(alg, working, &[&args.encode()])))
}

/// The identity key of DSFS §3.1: `idkey = MAC_alg(K, K_data)`, where K is
/// the shared identity key `data.key_id` names and `alg` is the
/// credential's algorithm. The authentication server computes it and hands
/// it to the user privately; the drive recomputes it from the credential in
/// each request and its own copy of K, so any change to the user, role,
/// expiration or key id changes the key and the request's digest fails.
/// `None` for an unknown algorithm.
pub fn identity_key(shared: &Key, data: &IdentityData) -> Option<Key> {
    let alg = MacAlgorithm::from_id(data.algorithm)?;
    Some(Key::from_bytes(mac(alg, shared, &[&data.encode()])))
}

/// What [`identity_drive_key`] MACs before the drive id (23 bytes).
pub const IDENTITY_DRIVE_PURPOSE: &[u8] = b"nasd v1 identity drive ";

/// The key that protects an identity's requests to one drive:
/// `MAC_alg(idkey, IDENTITY_DRIVE_PURPOSE ‖ drive_id)`, `alg` the
/// credential's. `idkey` is the same on every drive (DSFS shares K with
/// all of them); this key is not, so a request MACed for one drive fails
/// its digest on every other (`BAD_DIGEST`) — object numbers repeat across
/// drives, and each drive's replay cache only knows its own requests. The
/// drive computes it with its own id, the client with the id of the drive
/// it means to reach (the manager's, checked against `HELLO`). `None` for
/// an unknown algorithm.
pub fn identity_drive_key(idkey: &Key, data: &IdentityData, drive_id: &[u8; 16]) -> Option<Key> {
    let alg = MacAlgorithm::from_id(data.algorithm)?;
    Some(Key::from_bytes(mac(alg, idkey, &[IDENTITY_DRIVE_PURPOSE, drive_id])))
}

/// Key-derivation purpose of [`identity_login_proof`].
pub const IDENTITY_LOGIN_PURPOSE: &str = "nasd v1 manager identity login";

/// The proof of an identity a client gives the file manager
/// (`LOGIN_IDENTITY`): `MAC_alg(derive(idkey, IDENTITY_LOGIN_PURPOSE),
/// credential)`. One-way from `idkey`, so a proof the manager sees (or a
/// log of it) cannot MAC a drive request. `None` for an unknown algorithm.
pub fn identity_login_proof(idkey: &Key, data: &IdentityData) -> Option<MacValue> {
    let alg = MacAlgorithm::from_id(data.algorithm)?;
    Some(mac(alg, &idkey.derive(IDENTITY_LOGIN_PURPOSE), &[&data.encode()]))
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
    let bytes = open(
        &capability_seal_key(working),
        &token[..SEALED_CAPABILITY_PREFIX_LEN],
        &token[SEALED_CAPABILITY_PREFIX_LEN..],
    )
    .ok()?;
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

/// The units of a Hash-and-MAC data section: each region's returned bytes cut
/// at block boundaries of the object. A whole-block unit's digest is the
/// block's stored digest.
#[derive(Debug, Clone)]
pub struct Units {
    regions: Vec<(u64, u64)>,
    index: usize,
    pos: u64,
    block_size: u64,
}

impl Units {
    /// Units of a read reply: each requested region from its offset, for the
    /// length the reply returned for it.
    pub fn of_read(regions: &[nasd_proto::Region], lengths: &[u64], block_size: u32) -> Self {
        Self::new(regions.iter().zip(lengths).map(|(r, l)| (r.offset, *l)).collect(), block_size)
    }

    /// Units of `regions` given as (offset, returned length), in order.
    pub fn new(regions: Vec<(u64, u64)>, block_size: u32) -> Self {
        let pos = regions.first().map_or(0, |r| r.0);
        Units { regions, index: 0, pos, block_size: block_size.max(1) as u64 }
    }
}

impl Iterator for Units {
    type Item = u64;
    fn next(&mut self) -> Option<u64> {
        while let Some(&(offset, len)) = self.regions.get(self.index) {
            let end = offset + len;
            if self.pos >= end {
                self.index += 1;
                self.pos = self.regions.get(self.index).map_or(0, |r| r.0);
                continue;
            }
            let unit_end = end.min((self.pos / self.block_size + 1) * self.block_size);
            let n = unit_end - self.pos;
            self.pos = unit_end;
            return Some(n);
        }
        None
    }
}

/// "Hash and MAC" (Gobioff et al.): a cumulative MAC over the unkeyed BLAKE3
/// digests of a data section's units, seeded with the frame digest. A drive
/// feeds stored digests for whole units and hashes only partial ones; the
/// receiver hashes what it receives. `tag` after each chunk covers every
/// byte so far (a unit cut by the chunk end contributes the digest of its
/// bytes so far).
pub struct UnitMac {
    mac: MacState,
    units: Units,
    unit_len: u64,
    done: u64,
    hasher: blake3::Hasher,
}

impl UnitMac {
    fn new(alg: MacAlgorithm, key: &Key, seed: &[u8], units: Units) -> Self {
        let mut mac = MacState::new(alg, key);
        mac.update(seed);
        UnitMac { mac, units, unit_len: 0, done: 0, hasher: blake3::Hasher::new() }
    }

    fn ensure_unit(&mut self) -> bool {
        if self.unit_len == 0 {
            match self.units.next() {
                Some(n) => {
                    self.unit_len = n;
                    self.done = 0;
                }
                None => return false,
            }
        }
        true
    }

    fn finish_unit(&mut self, digest: &[u8; 32]) {
        self.mac.update(digest);
        self.unit_len = 0;
        self.done = 0;
        self.hasher.reset();
    }

    /// True if the next bytes start a unit of exactly `len` bytes, so a stored
    /// digest may stand for them.
    pub fn at_whole_unit(&mut self, len: u64) -> bool {
        self.ensure_unit() && self.done == 0 && self.unit_len == len
    }

    /// Absorbs a whole unit by its digest (the drive's stored digest). The
    /// caller checked [`Self::at_whole_unit`].
    pub fn absorb_digest(&mut self, len: u64, digest: &[u8; 32]) {
        assert!(self.at_whole_unit(len), "a stored digest must stand for exactly one whole unit");
        self.finish_unit(digest);
    }

    /// Absorbs the last `bytes` of the current unit, which must complete it,
    /// and checks the unit's digest against `stored` in constant time: for a
    /// sender that hashes a unit with a stored digest on the fly (a whole
    /// block that straddles chunks) and must not vouch for bytes that no
    /// longer match it. Either way the unit enters the MAC as `stored` (the
    /// same digest when they match), so after a mismatch no tag covers the
    /// bytes actually read.
    pub fn absorb_unit_end_checked(&mut self, bytes: &[u8], stored: &[u8; 32]) -> Result<(), StoredDigestMismatch> {
        assert!(
            self.ensure_unit() && self.unit_len - self.done == bytes.len() as u64,
            "the bytes must complete the current unit"
        );
        self.hasher.update(bytes);
        let matches = ct_eq(self.hasher.finalize().as_bytes(), stored);
        self.finish_unit(stored);
        if matches {
            Ok(())
        } else {
            Err(StoredDigestMismatch)
        }
    }

    /// Absorbs bytes, hashing them unit by unit. Bytes past the last unit
    /// are an error of the caller (the data length is checked first).
    pub fn absorb(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            assert!(self.ensure_unit(), "more data than the regions' lengths");
            let n = ((self.unit_len - self.done) as usize).min(bytes.len());
            self.hasher.update(&bytes[..n]);
            self.done += n as u64;
            bytes = &bytes[n..];
            if self.done == self.unit_len {
                let d = *self.hasher.finalize().as_bytes();
                self.finish_unit(&d);
            }
        }
    }

    /// The tag after the bytes absorbed so far.
    pub fn tag(&self) -> MacValue {
        if self.unit_len != 0 && self.done > 0 {
            let mut m = self.mac.clone();
            m.update(self.hasher.finalize().as_bytes());
            m.finish()
        } else {
            self.mac.peek()
        }
    }

    /// Receiver: absorbs `chunk` and checks its tag in constant time.
    pub fn open_chunk(&mut self, chunk: &[u8], tag: &[u8]) -> Result<(), TagMismatch> {
        self.absorb(chunk);
        self.check_tag(tag)
    }

    /// Receiver: checks `tag` against the bytes absorbed so far, in constant
    /// time (for a receiver that absorbs a chunk piece by piece as it arrives).
    pub fn check_tag(&self, tag: &[u8]) -> Result<(), TagMismatch> {
        if ct_eq(&self.tag(), tag) {
            Ok(())
        } else {
            Err(TagMismatch)
        }
    }
}

impl FrameKeys {
    /// The Hash-and-MAC of a reply's data section (`HASH_AND_MAC`), seeded
    /// with the reply's digest.
    pub fn unit_mac(&self, digest: &[u8], units: Units) -> UnitMac {
        UnitMac::new(self.alg, &self.mac, digest, units)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit_mac(key: &Key, units: &[(u64, u64)]) -> UnitMac {
        FrameKeys::new(MacAlgorithm::Blake3, key).unit_mac(b"seed", Units::new(units.to_vec(), 4096))
    }

    /// A unit hashed on the fly and checked against its stored digest gives
    /// the tags plain hashing gives when the digest matches; when it does
    /// not, the mismatch is reported and the MAC takes the stored digest, so
    /// no later tag vouches for the bytes actually read.
    #[test]
    fn unit_end_checked_against_the_stored_digest() {
        let key = Key::random();
        let block: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
        let stored = crate::block_digest(&block);
        let mut plain = unit_mac(&key, &[(0, 8192)]);
        let mut checked = unit_mac(&key, &[(0, 8192)]);
        plain.absorb(&block[..1000]);
        checked.absorb(&block[..1000]);
        assert_eq!(plain.tag(), checked.tag(), "a cut inside the unit tags the prefix's digest");
        plain.absorb(&block[1000..]);
        checked.absorb_unit_end_checked(&block[1000..], &stored).expect("matching bytes");
        assert_eq!(plain.tag(), checked.tag());

        let mut rotten = block.clone();
        rotten[3000] ^= 1;
        let mut honest = unit_mac(&key, &[(0, 8192)]);
        assert!(honest.at_whole_unit(4096));
        honest.absorb_digest(4096, &stored);
        let mut reader = unit_mac(&key, &[(0, 8192)]);
        reader.absorb(&rotten);
        let mut drive = unit_mac(&key, &[(0, 8192)]);
        drive.absorb(&rotten[..1000]);
        assert_eq!(drive.absorb_unit_end_checked(&rotten[1000..], &stored), Err(StoredDigestMismatch));
        assert_eq!(drive.tag(), honest.tag(), "the unit entered the MAC as its stored digest");
        assert!(reader.check_tag(&drive.tag()).is_err(), "a reader of the rotten bytes cannot accept the tag");
    }

    #[test]
    #[should_panic(expected = "complete the current unit")]
    fn unit_end_checked_must_complete_the_unit() {
        let mut m = unit_mac(&Key::random(), &[(0, 4096)]);
        let _ = m.absorb_unit_end_checked(&[0u8; 100], &[0; 32]);
    }
}
