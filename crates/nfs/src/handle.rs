//! Sealed NFS file handles: the layer's persistent handle (the manager's
//! 41-byte MAC'd handle inside) with the export it was reached through,
//! sealed by the gateway's own key, so a forged or altered handle is
//! refused before any manager request, and a handle survives a restart
//! with no table.
//!
//! Layout, 64 bytes (NFSv3's largest):
//! `"nN"` ‖ format 1 ‖ export index u8 ‖ persistent handle (44: `"nH"`, 1,
//! `ino u64 LE`, `site u8`, `mac [32]`) ‖ tag [16], where
//! `tag = keyed BLAKE3(derive_key("nasd v1 nfs handle key", K), "nasd v1 nfs handle" ‖ export path ‖ 0x00 ‖ bytes 0..48)[..16]`.

use nasd_crypto::Key;
use nasd_vfs::{PersistentHandle, PERSISTENT_HANDLE_LEN};

const MAGIC: &[u8; 2] = b"nN";
const FORMAT: u8 = 1;
/// Bytes of the gateway's tag.
pub const TAG_LEN: usize = 16;
/// Bytes before the tag.
const BODY_LEN: usize = MAGIC.len() + 2 + PERSISTENT_HANDLE_LEN;
/// Bytes of a sealed NFS handle.
pub const NFS_HANDLE_LEN: usize = BODY_LEN + TAG_LEN;
const _: () = assert!(NFS_HANDLE_LEN <= 64);
const DOMAIN: &[u8] = b"nasd v1 nfs handle";

/// The gateway's handle key.
#[derive(Clone)]
pub struct Sealer {
    key: [u8; 32],
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    /// A sealer under the gateway key `k` (its handle key derived from it).
    pub fn new(k: &Key) -> Sealer {
        Sealer { key: *k.derive("nasd v1 nfs handle key").expose() }
    }

    fn tag(&self, export_path: &str, body: &[u8]) -> [u8; TAG_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(DOMAIN).update(export_path.as_bytes()).update(&[0]).update(body);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        tag
    }

    /// The sealed handle of `handle` reached through export `export` (at `export_path`).
    pub fn seal(&self, export: u8, export_path: &str, handle: &PersistentHandle) -> Vec<u8> {
        let mut out = Vec::with_capacity(NFS_HANDLE_LEN);
        out.extend_from_slice(MAGIC);
        out.push(FORMAT);
        out.push(export);
        out.extend_from_slice(handle.as_bytes());
        let tag = self.tag(export_path, &out);
        out.extend_from_slice(&tag);
        debug_assert_eq!(out.len(), NFS_HANDLE_LEN);
        out
    }

    /// The export index a handle claims, if it has the form of one (checked
    /// by [`Sealer::open`] against that export's path).
    pub fn export_of(bytes: &[u8]) -> Option<u8> {
        (bytes.len() == NFS_HANDLE_LEN && &bytes[..2] == MAGIC && bytes[2] == FORMAT).then(|| bytes[3])
    }

    /// The persistent handle inside `bytes` if the gateway sealed it for
    /// `export_path`; `None` for anything else (compared in constant time).
    pub fn open(&self, export_path: &str, bytes: &[u8]) -> Option<PersistentHandle> {
        Self::export_of(bytes)?;
        let (body, tag) = bytes.split_at(BODY_LEN);
        if !nasd_crypto::ct_eq(&self.tag(export_path, body), tag) {
            return None;
        }
        PersistentHandle::from_bytes(&body[4..]).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_handles_open_and_every_altered_byte_is_refused() {
        let sealer = Sealer::new(&Key::from_bytes([7; 32]));
        let mut inner = vec![b'n', b'H', 1];
        inner.extend_from_slice(&42u64.to_le_bytes());
        inner.push(0);
        inner.extend_from_slice(&[0xab; 32]);
        let p = PersistentHandle::from_bytes(&inner).unwrap();
        let sealed = sealer.seal(2, "/exp", &p);
        assert_eq!(sealed.len(), NFS_HANDLE_LEN);
        assert_eq!(Sealer::export_of(&sealed), Some(2));
        assert_eq!(sealer.open("/exp", &sealed), Some(p.clone()));
        assert_eq!(sealer.open("/other", &sealed), None, "another export's path");
        for i in 0..sealed.len() {
            let mut b = sealed.clone();
            b[i] ^= 0x10;
            assert_eq!(sealer.open("/exp", &b), None, "byte {i} altered");
        }
        assert_eq!(Sealer::new(&Key::from_bytes([8; 32])).open("/exp", &sealed), None, "another key");
        assert_eq!(sealer.open("/exp", &sealed[..NFS_HANDLE_LEN - 1]), None);
    }
}

#[cfg(test)]
mod known_answer {
    use super::*;

    /// docs/PROTOCOL.md, "NFS gateway", vector N1.
    #[test]
    fn sealed_handle_vector() {
        let sealer = Sealer::new(&Key::from_bytes([0x11; 32]));
        let mut inner = vec![b'n', b'H', 1];
        inner.extend_from_slice(&42u64.to_le_bytes());
        inner.push(0);
        inner.extend_from_slice(&[0x77; 32]);
        let p = PersistentHandle::from_bytes(&inner).unwrap();
        let sealed = sealer.seal(0, "/", &p);
        assert_eq!(hex(&sealed), EXPECTED);
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    const EXPECTED: &str =
        "6e4e01006e48012a0000000000000000777777777777777777777777777777777777777777777777777777777777777\
        75faba4a94cf7e23a4230b97dd1c84632";
}
