//! File handles (as a secure NFS server makes them): the file manager's MAC
//! over an inode number, bound to the user it was handed to, so an inode
//! number alone — guessed, counted, or taken from another user — names
//! nothing (docs/SECURITY.md, "File handles"; bytes in docs/PROTOCOL.md).

use crate::{ct_eq, mac, Key, MacAlgorithm, MacValue};

/// BLAKE3 key-derivation context of the handle key, derived from the
/// manager's own key (`manager.key`), so that key never serves two purposes.
pub const FILE_HANDLE_KEY_CONTEXT: &str = "nasd v1 manager file handle key";
/// Domain-separation prefix of every handle MAC.
pub const FILE_HANDLE_DOMAIN: &[u8] = b"nasd v1 file handle";
/// Length of a file system's id: random, made with its metadata database,
/// so a new database under the same `manager.key` honours no old handle.
pub const FILE_SYSTEM_ID_LEN: usize = 16;

/// The key a manager makes and checks file handles with.
#[derive(Clone)]
pub struct FileHandleKey {
    key: Key,
    fs_id: [u8; FILE_SYSTEM_ID_LEN],
}

impl std::fmt::Debug for FileHandleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileHandleKey(<redacted>)")
    }
}

impl FileHandleKey {
    /// The handle key of the file system `fs_id` under the manager's key.
    pub fn new(manager_key: &Key, fs_id: [u8; FILE_SYSTEM_ID_LEN]) -> Self {
        FileHandleKey { key: manager_key.derive(FILE_HANDLE_KEY_CONTEXT), fs_id }
    }

    /// The MAC of the handle for inode `ino` handed to user `uid`: keyed
    /// BLAKE3 of `FILE_HANDLE_DOMAIN ‖ fs_id ‖ uid u32 ‖ ino u64`
    /// (little-endian).
    pub fn mac(&self, uid: u32, ino: u64) -> MacValue {
        mac(MacAlgorithm::Blake3, &self.key, &[FILE_HANDLE_DOMAIN, &self.fs_id, &uid.to_le_bytes(), &ino.to_le_bytes()])
    }

    /// Whether `tag` is the MAC of inode `ino` for user `uid` (constant time).
    pub fn verify(&self, uid: u32, ino: u64, tag: &[u8]) -> bool {
        ct_eq(&self.mac(uid, ino), tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_bound_to_uid_inode_file_system_and_key() {
        let k = Key::random();
        let h = FileHandleKey::new(&k, [1; FILE_SYSTEM_ID_LEN]);
        let tag = h.mac(1000, 42);
        assert!(h.verify(1000, 42, &tag));
        assert!(!h.verify(1001, 42, &tag), "another user");
        assert!(!h.verify(1000, 43, &tag), "another inode");
        assert!(!FileHandleKey::new(&k, [2; FILE_SYSTEM_ID_LEN]).verify(1000, 42, &tag), "another file system");
        assert!(!FileHandleKey::new(&Key::random(), [1; FILE_SYSTEM_ID_LEN]).verify(1000, 42, &tag), "another key");
        assert!(!h.verify(1000, 42, &tag[..31]), "a shortened tag");
        assert_eq!(format!("{h:?}"), "FileHandleKey(<redacted>)");
    }
}
