//! The keys a manager holds for each drive, and how they rest in the
//! metadata store: sealed under the manager's key-encryption key, which lives
//! only in its own 0600 file (`manager.key`), so a copy of the metadata
//! database alone opens no drive.

use nasd_crypto::{open, seal, Key, KEY_LEN};
use zeroize::Zeroize;

/// Format byte of the sealed key record.
const KEYS_FORMAT: u8 = 1;
/// Plaintext length: format, rotation time, drive key, partition key, current
/// (version, key), previous (version, key).
const KEYS_LEN: usize = 1 + 8 + KEY_LEN * 2 + (4 + KEY_LEN) * 2;

/// One drive's keys below its master key.
#[derive(Clone)]
pub struct DriveKeys {
    /// The drive key (authorizes partition set-up).
    pub drive: Key,
    /// The file system's partition key (authorizes working-key changes and
    /// the manager's own object operations).
    pub partition: Key,
    /// The current working key and its version; capabilities are minted with it.
    pub current: (u32, Key),
    /// The previous working key (version 0: none); capabilities minted
    /// with it stay valid until the next rotation.
    pub previous: (u32, Key),
    /// When `current` was made current (seconds since the Unix epoch).
    pub rotated_at_s: u64,
}

impl std::fmt::Debug for DriveKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriveKeys")
            .field("current_version", &self.current.0)
            .field("previous_version", &self.previous.0)
            .finish_non_exhaustive()
    }
}

fn context(drive: u32) -> Vec<u8> {
    let mut c = b"nasd manager drive keys v1 drive ".to_vec();
    c.extend_from_slice(&drive.to_le_bytes());
    c
}

impl DriveKeys {
    /// Fresh random keys with working key version 1, made at `now_s` (the
    /// manager's wall clock, seconds since the Unix epoch).
    pub fn generate(now_s: u64) -> Self {
        DriveKeys {
            drive: Key::random(),
            partition: Key::random(),
            current: (1, Key::random()),
            previous: (0, Key::from_bytes([0; KEY_LEN])),
            rotated_at_s: now_s,
        }
    }

    /// The keys after a rotation: a new current key one version up, the
    /// current one kept as previous, made at `now_s`.
    pub fn rotated(&self, now_s: u64) -> Self {
        let version = self.current.0.checked_add(1).expect("working key version overflow after 2^32 rotations");
        DriveKeys {
            drive: self.drive.clone(),
            partition: self.partition.clone(),
            current: (version, Key::random()),
            previous: self.current.clone(),
            rotated_at_s: now_s,
        }
    }

    /// Seconds from the last rotation to `now_s`.
    pub fn age_s(&self, now_s: u64) -> u64 {
        now_s.saturating_sub(self.rotated_at_s)
    }

    /// The working key of `version`, if it is current or previous.
    pub fn working(&self, version: u32) -> Option<&Key> {
        if version == self.current.0 {
            Some(&self.current.1)
        } else if version != 0 && version == self.previous.0 {
            Some(&self.previous.1)
        } else {
            None
        }
    }

    /// Seals the keys of drive number `drive` under `kek`.
    pub fn seal(&self, kek: &Key, drive: u32) -> Vec<u8> {
        let mut p = Vec::with_capacity(KEYS_LEN);
        p.push(KEYS_FORMAT);
        p.extend_from_slice(&self.rotated_at_s.to_le_bytes());
        p.extend_from_slice(self.drive.expose());
        p.extend_from_slice(self.partition.expose());
        for (v, k) in [&self.current, &self.previous] {
            p.extend_from_slice(&v.to_le_bytes());
            p.extend_from_slice(k.expose());
        }
        let sealed = seal(kek, &context(drive), &p);
        p.zeroize();
        sealed
    }

    /// Opens what [`seal`](Self::seal) made; `None` if it was made under
    /// another key, for another drive, or altered.
    pub fn open(kek: &Key, drive: u32, sealed: &[u8]) -> Option<Self> {
        let mut p = open(kek, &context(drive), sealed).ok()?;
        if p.len() != KEYS_LEN || p[0] != KEYS_FORMAT {
            return None;
        }
        let key_at = |at: usize| Key::from_bytes(p[at..at + KEY_LEN].try_into().expect("key length"));
        let u32_at = |at: usize| u32::from_le_bytes(p[at..at + 4].try_into().expect("u32"));
        let rotated_at_s = u64::from_le_bytes(p[1..9].try_into().expect("u64"));
        let base = 9 + 2 * KEY_LEN;
        let keys = DriveKeys {
            drive: key_at(9),
            partition: key_at(9 + KEY_LEN),
            current: (u32_at(base), key_at(base + 4)),
            previous: (u32_at(base + 4 + KEY_LEN), key_at(base + 8 + KEY_LEN)),
            rotated_at_s,
        };
        p.zeroize();
        Some(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_keys_open_only_for_their_drive_and_key() {
        let kek = Key::random();
        let keys = DriveKeys::generate(1).rotated(2);
        let sealed = keys.seal(&kek, 3);
        let back = DriveKeys::open(&kek, 3, &sealed).expect("opens");
        assert_eq!(back.current.0, 2);
        assert_eq!(back.previous.0, 1);
        assert_eq!(back.current.1.expose(), keys.current.1.expose());
        assert_eq!(back.previous.1.expose(), keys.previous.1.expose());
        assert_eq!(back.partition.expose(), keys.partition.expose());
        assert!(DriveKeys::open(&kek, 4, &sealed).is_none(), "sealed for drive 3 only");
        assert!(DriveKeys::open(&Key::random(), 3, &sealed).is_none(), "needs the manager's key");
        let mut bent = sealed.clone();
        let last = bent.len() - 1;
        bent[last] ^= 1;
        assert!(DriveKeys::open(&kek, 3, &bent).is_none(), "tampering is detected");
    }

    #[test]
    fn working_key_lookup_is_current_or_previous() {
        let k = DriveKeys::generate(1);
        assert!(k.working(1).is_some());
        assert!(k.working(0).is_none(), "version 0 means no previous key");
        let r = k.rotated(2).rotated(3);
        assert!(r.working(3).is_some() && r.working(2).is_some());
        assert!(r.working(1).is_none(), "two rotations retire a key");
    }
}
