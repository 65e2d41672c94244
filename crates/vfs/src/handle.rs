//! Handles that outlive the gateway: what a gateway gives its clients
//! (NFS file handles) so that they still name the file after the gateway
//! restarts. The manager's handle — inode number, routing site and the
//! manager's MAC over the inode for the gateway's user — carries its own
//! sealed identity: reopening one needs no table, on this process or any
//! other of the same user, and the manager refuses a forged or another
//! user's (`BAD_HANDLE`, `ESTALE`). rclone's NFS server, by contrast, keeps
//! its handle table in memory (a restart gives every client stale handles)
//! or on disk.
//!
//! Layout (little-endian, as the manager protocol): `"nH"`, a format version
//! (1), then the manager's `Handle` (`ino u64`, `site u8`, `mac [32]`):
//! [`PERSISTENT_HANDLE_LEN`] bytes, within NFSv3's 64.

use crate::{Vfs, VfsError};
use nasd_fs::{Entry, FsClient, Handle, Ino};
use nasd_proto::codec::{Reader, Writer};

/// Bytes of a persistent handle.
pub const PERSISTENT_HANDLE_LEN: usize = MAGIC.len() + 1 + Handle::LEN;
/// NFSv3's largest file handle: persistent handles must fit.
const NFS3_FHSIZE: usize = 64;
const _: () = assert!(PERSISTENT_HANDLE_LEN <= NFS3_FHSIZE);

const MAGIC: &[u8; 2] = b"nH";
const FORMAT: u8 = 1;

/// A handle a gateway may store and give out: it names the same file after
/// the gateway restarts ([`Vfs::open_persistent`]).
#[derive(Clone, PartialEq, Eq)]
pub struct PersistentHandle([u8; PERSISTENT_HANDLE_LEN]);

impl std::fmt::Debug for PersistentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PersistentHandle(ino {})", self.ino())
    }
}

impl PersistentHandle {
    fn of(handle: Handle) -> PersistentHandle {
        let mut w = Writer::with_capacity(PERSISTENT_HANDLE_LEN);
        w.raw(MAGIC).u8(FORMAT);
        handle.encode(&mut w);
        let bytes = w.into_vec();
        PersistentHandle(bytes.try_into().expect("PERSISTENT_HANDLE_LEN bytes by construction"))
    }

    /// The bytes to store or send.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The inode it names.
    pub fn ino(&self) -> Ino {
        u64::from_le_bytes(self.0[3..11].try_into().expect("eight bytes"))
    }

    /// Reads stored bytes back (checking their form only: the manager checks
    /// the MAC when the handle is used).
    ///
    /// # Errors
    /// [`VfsError::BadHandle`] for bytes that are not a persistent handle of
    /// this format.
    pub fn from_bytes(bytes: &[u8]) -> Result<PersistentHandle, VfsError> {
        Self::decode(bytes).map(Self::of)
    }

    fn decode(bytes: &[u8]) -> Result<Handle, VfsError> {
        let bad = |why: &str| VfsError::BadHandle(format!("not a nasd file handle: {why}"));
        if bytes.len() != PERSISTENT_HANDLE_LEN {
            return Err(bad("wrong length"));
        }
        if &bytes[..2] != MAGIC {
            return Err(bad("wrong magic"));
        }
        if bytes[2] != FORMAT {
            return Err(bad("an unknown format version"));
        }
        let mut r = Reader::new(&bytes[3..]);
        let handle = Handle::decode(&mut r).map_err(|e| bad(&e.to_string()))?;
        r.finish().map_err(|e| bad(&e.to_string()))?;
        Ok(handle)
    }
}

impl Vfs {
    /// The persistent handle of held inode `ino`.
    ///
    /// # Errors
    /// [`VfsError::Stale`] if it is not held.
    pub fn persistent_handle(&self, ino: Ino) -> Result<PersistentHandle, VfsError> {
        Ok(PersistentHandle::of(self.handle_of(ino)?))
    }

    /// Holds the inode a persistent handle names (one more reference), after
    /// asking the manager, which checks the handle's MAC for this client's
    /// user: the handle of a file since removed, a forged one or another
    /// user's is refused (`BAD_HANDLE` or `NOT_FOUND`, `ESTALE`/`ENOENT`).
    ///
    /// # Errors
    /// [`VfsError::BadHandle`] for bytes that are not a handle; the
    /// manager's refusal.
    pub async fn open_persistent(&self, cx: &FsClient, bytes: &[u8]) -> Result<Entry, VfsError> {
        let handle = PersistentHandle::decode(bytes)?;
        let mut e = cx.getattr(handle).await?;
        e.attr = self.remember_listed(&e).await;
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_round_trips_and_damaged_ones_are_refused() {
        let h = Handle { ino: 0x0102_0304_0506_0708, site: 7, mac: [0xab; 32] };
        let p = PersistentHandle::of(h);
        assert_eq!(p.as_bytes().len(), PERSISTENT_HANDLE_LEN);
        assert_eq!(p.ino(), h.ino);
        assert_eq!(PersistentHandle::decode(p.as_bytes()).unwrap(), h);
        assert_eq!(PersistentHandle::from_bytes(p.as_bytes()).unwrap(), p);
        let mut bytes = p.as_bytes().to_vec();
        for (at, why) in [(0, "magic"), (2, "format")] {
            let mut b = bytes.clone();
            b[at] ^= 1;
            assert!(matches!(PersistentHandle::decode(&b), Err(VfsError::BadHandle(_))), "{why}");
        }
        bytes.push(0);
        assert!(matches!(PersistentHandle::decode(&bytes), Err(VfsError::BadHandle(_))), "length");
        assert!(PersistentHandle::decode(&[]).is_err());
        // A site past ROUTING_SITES does not decode.
        let mut b = p.as_bytes().to_vec();
        b[11] = 0xff;
        assert!(PersistentHandle::decode(&b).is_err());
    }
}
