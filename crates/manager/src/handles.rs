//! File handles (docs/SECURITY.md, "File handles"): every inode the manager
//! names in a reply goes out as a handle — the inode number and a MAC under
//! a key derived from `manager.key`, bound to the caller's uid — and every
//! request that names an inode must bring one back. A handle is the
//! manager's proof, to itself, that this user reached the inode by name
//! (with search permission on the way), so no inode number is taken on the
//! caller's word.

use crate::service::Session;
use crate::{Failure, Manager};
use nasd_crypto::{FileHandleKey, Key, FILE_SYSTEM_ID_LEN};
use nasd_meta::{Namespace, Store};
use nasd_proto::fs::{FsStatus, Ino};
use nasd_proto::manager::{Handle, ManagerRequest};

/// Settings key of the file system's id: random, made with the database, so
/// handles of an earlier database under the same `manager.key` never check.
pub const FILE_SYSTEM_ID_SETTING: &str = "file_system_id";

/// The handle key of the file system in `ns` under the manager key `kek`,
/// making the file system's id on first use.
pub(crate) fn load_handle_key(ns: &Namespace<Store>, kek: &Key) -> anyhow::Result<FileHandleKey> {
    let unreadable = |e| anyhow::anyhow!("cannot read the file system id: {e}");
    let id = match ns.setting(FILE_SYSTEM_ID_SETTING).map_err(unreadable)? {
        Some(id) => id,
        // Set once: managers starting together on a new database agree on the first one.
        None => {
            let id = nasd_crypto::random_bytes::<FILE_SYSTEM_ID_LEN>().to_vec();
            ns.setting_or_insert(FILE_SYSTEM_ID_SETTING, &id)
                .map_err(|e| anyhow::anyhow!("cannot record the file system id: {e}"))?
        }
    };
    let id: [u8; FILE_SYSTEM_ID_LEN] = id.as_slice().try_into().map_err(|_| {
        anyhow::anyhow!("the file system id in the database is {} bytes, not {FILE_SYSTEM_ID_LEN}", id.len())
    })?;
    Ok(FileHandleKey::new(kek, id))
}

impl Manager {
    /// The handle of inode `ino`, made in routing site `site`, for the
    /// caller of session `s`.
    pub(crate) fn handle_for(&self, s: &Session, ino: Ino, site: u8) -> Handle {
        Handle { ino, site, mac: self.handles.mac(s.handle_uid, ino) }
    }

    /// Fails with `BAD_HANDLE` unless every handle `req` names was made for
    /// this session's uid (checked in constant time, before anything else).
    /// A gateway's requests for its users (`AS_USER`) use the gateway's own
    /// handles ([`Session::handle_uid`]).
    pub(crate) fn check_handles(&self, s: &Session, req: &ManagerRequest) -> Result<(), Failure> {
        for h in req.handles() {
            if !self.handles.verify(s.handle_uid, h.ino, &h.mac) {
                return Err(Failure::new(
                    FsStatus::BadHandle,
                    format!(
                        "the handle for inode {} was not made for user '{}': look the file up by name again",
                        h.ino, s.user
                    ),
                ));
            }
        }
        Ok(())
    }
}
