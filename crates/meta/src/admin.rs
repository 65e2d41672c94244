//! Users, drives, the object pool, the intention logs and settings.

use crate::backend::{Backend, Txn};
use crate::types::{AcvIntent, DriveRecord, User};
use crate::{
    Namespace, BATCH_MAX, DRIVE_ADDR_MAX, PASSWORD_HASH_MAX, SEALED_KEYS_MAX, SETTING_KEY_MAX, SETTING_VALUE_MAX,
    USER_NAME_MAX,
};
use nasd_proto::fs::{validate_groups, FsStatus, ObjectRef};
use nasd_proto::limits::NAME_LEN_MAX;
use nasd_proto::manager::DriveState;
use std::collections::BTreeSet;

/// The setting holding the cluster map epoch (a `u32`, 4 bytes little-endian).
const MAP_EPOCH_KEY: &str = "map_epoch";

fn map_epoch_in(t: &mut dyn Txn) -> Result<u32, FsStatus> {
    match t.get_setting(MAP_EPOCH_KEY)? {
        None => Ok(0),
        Some(v) => match <[u8; 4]>::try_from(v.as_slice()) {
            Ok(b) => Ok(u32::from_le_bytes(b)),
            Err(_) => {
                tracing::error!(len = v.len(), "the map_epoch setting is not 4 bytes");
                Err(FsStatus::Internal)
            }
        },
    }
}

fn bump_map_epoch_in(t: &mut dyn Txn) -> Result<u32, FsStatus> {
    let Some(epoch) = map_epoch_in(t)?.checked_add(1) else {
        tracing::error!("the cluster map epoch is at u32::MAX and cannot move on");
        return Err(FsStatus::Internal);
    };
    t.put_setting(MAP_EPOCH_KEY, &epoch.to_le_bytes())?;
    Ok(epoch)
}

fn check_user(user: &User) -> Result<(), FsStatus> {
    let name_ok = !user.name.is_empty() && user.name.len() <= USER_NAME_MAX;
    let gateway_ok = user.gateway.is_none_or(|(lo, hi)| lo <= hi);
    let uid_ok = user.uid != crate::MANAGER_WRITER_UID;
    if !name_ok
        || !uid_ok
        || user.password_hash.len() > PASSWORD_HASH_MAX
        || validate_groups(&user.groups).is_err()
        || !gateway_ok
    {
        return Err(FsStatus::InvalidArgument);
    }
    Ok(())
}

pub(crate) fn check_drive(rec: &DriveRecord) -> Result<(), FsStatus> {
    if rec.addr.len() > DRIVE_ADDR_MAX
        || rec.sealed_keys.len() > SEALED_KEYS_MAX
        || rec.failure_domain.len() > NAME_LEN_MAX
    {
        return Err(FsStatus::InvalidArgument);
    }
    Ok(())
}

fn check_batch<T>(items: &[T]) -> Result<(), FsStatus> {
    if items.len() > BATCH_MAX {
        return Err(FsStatus::InvalidArgument);
    }
    Ok(())
}

impl<B: Backend> Namespace<B> {
    /// Adds a user.
    ///
    /// # Errors
    /// `Exists` if the name or the uid is taken; `InvalidArgument` if the
    /// name is empty or longer than [`USER_NAME_MAX`], the hash longer
    /// than [`PASSWORD_HASH_MAX`], or the groups are not strictly ascending
    /// or more than [`GROUPS_MAX`](nasd_proto::fs::GROUPS_MAX).
    pub fn add_user(&self, user: &User) -> Result<(), FsStatus> {
        check_user(user)?;
        self.backend.transact(|t| {
            if t.get_user(&user.name)?.is_some() || t.uid_taken(user.uid)? {
                return Err(FsStatus::Exists);
            }
            t.put_user(user)
        })
    }

    /// Reads a user by name.
    ///
    /// # Errors
    /// `Internal`.
    pub fn user(&self, name: &str) -> Result<Option<User>, FsStatus> {
        self.backend.read(|t| t.get_user(name))
    }

    /// Every user, ordered by name.
    ///
    /// # Errors
    /// `Internal`.
    pub fn users(&self) -> Result<Vec<User>, FsStatus> {
        self.backend.read(|t| t.list_users())
    }

    /// Replaces a user's password hash.
    ///
    /// # Errors
    /// `NotFound`; `InvalidArgument` if the hash is longer than [`PASSWORD_HASH_MAX`].
    pub fn set_password(&self, name: &str, password_hash: &str) -> Result<(), FsStatus> {
        if password_hash.len() > PASSWORD_HASH_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| {
            let mut user = t.get_user(name)?.ok_or(FsStatus::NotFound)?;
            user.password_hash = password_hash.to_owned();
            t.put_user(&user)
        })
    }

    /// Replaces a user's supplementary groups (strictly ascending, at most
    /// [`GROUPS_MAX`](nasd_proto::fs::GROUPS_MAX); empty: none).
    ///
    /// # Errors
    /// `NotFound`; `InvalidArgument` (unordered, repeated or too many groups).
    pub fn set_user_groups(&self, name: &str, groups: &[u32]) -> Result<(), FsStatus> {
        validate_groups(groups).map_err(|_| FsStatus::InvalidArgument)?;
        self.backend.transact(|t| {
            let mut user = t.get_user(name)?.ok_or(FsStatus::NotFound)?;
            user.groups = groups.to_vec();
            t.put_user(&user)
        })
    }

    /// Grants user `name` the gateway right to act for the ids in `ids`
    /// (inclusive), or takes it away (`None`).
    ///
    /// # Errors
    /// `NotFound`; `InvalidArgument` (a range whose first id is above its last).
    pub fn set_gateway(&self, name: &str, ids: Option<(u32, u32)>) -> Result<(), FsStatus> {
        if ids.is_some_and(|(lo, hi)| lo > hi) {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| {
            let mut user = t.get_user(name)?.ok_or(FsStatus::NotFound)?;
            user.gateway = ids;
            t.put_user(&user)
        })
    }

    /// Adds a drive to the table.
    ///
    /// # Errors
    /// `Exists` if the drive number or the drive id is taken;
    /// `InvalidArgument` if the address, keys or failure domain are too long.
    pub fn add_drive(&self, rec: &DriveRecord) -> Result<(), FsStatus> {
        check_drive(rec)?;
        self.backend.transact(|t| {
            if t.get_drive(rec.drive)?.is_some() || t.drive_with_id(&rec.drive_id)?.is_some() {
                return Err(FsStatus::Exists);
            }
            t.put_drive(rec)
        })
    }

    /// Replaces a drive's record (e.g. after key rotation), by drive number.
    ///
    /// # Errors
    /// `NotFound`; `Exists` if the new drive id belongs to another drive;
    /// `InvalidArgument` as [`Namespace::add_drive`].
    pub fn update_drive(&self, rec: &DriveRecord) -> Result<(), FsStatus> {
        check_drive(rec)?;
        self.backend.transact(|t| {
            t.get_drive(rec.drive)?.ok_or(FsStatus::NotFound)?;
            if t.drive_with_id(&rec.drive_id)?.is_some_and(|d| d != rec.drive) {
                return Err(FsStatus::Exists);
            }
            t.put_drive(rec)
        })
    }

    /// Every drive, ordered by drive number.
    ///
    /// # Errors
    /// `Internal`.
    pub fn drives(&self) -> Result<Vec<DriveRecord>, FsStatus> {
        self.backend.read(|t| t.list_drives())
    }

    /// Takes a drive into service or out of it. A change moves the cluster
    /// map epoch on in the same transaction (a drive taken out is about to
    /// lose its components to rebuilds, so capabilities minted under the
    /// old map must be refreshed); setting the state it has changes
    /// nothing. Returns the map epoch after the call.
    ///
    /// # Errors
    /// `NotFound` (no such drive); `Internal` (the epoch cannot move past
    /// `u32::MAX`).
    pub fn set_drive_state(&self, drive: u32, state: DriveState) -> Result<u32, FsStatus> {
        self.backend.transact(|t| {
            let mut rec = t.get_drive(drive)?.ok_or(FsStatus::NotFound)?;
            if rec.state == state {
                return map_epoch_in(t);
            }
            rec.state = state;
            t.put_drive(&rec)?;
            bump_map_epoch_in(t)
        })
    }

    /// Sets the failure domain of a drive (empty: its own). It steers only
    /// where new components go, so the map epoch stays.
    ///
    /// # Errors
    /// `NotFound` (no such drive); `InvalidArgument` (longer than
    /// [`NAME_LEN_MAX`] bytes).
    pub fn set_drive_failure_domain(&self, drive: u32, domain: &str) -> Result<(), FsStatus> {
        if domain.len() > NAME_LEN_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| {
            let mut rec = t.get_drive(drive)?.ok_or(FsStatus::NotFound)?;
            rec.failure_domain = domain.to_owned();
            t.put_drive(&rec)
        })
    }

    /// The cluster map epoch (0 until first moved on).
    ///
    /// # Errors
    /// `Internal` (also if the stored value is malformed, logged).
    pub fn map_epoch(&self) -> Result<u32, FsStatus> {
        self.backend.read(map_epoch_in)
    }

    /// Moves the cluster map epoch on by one; returns the new epoch.
    ///
    /// # Errors
    /// `Internal` (also at `u32::MAX`, logged).
    pub fn bump_map_epoch(&self) -> Result<u32, FsStatus> {
        self.backend.transact(bump_map_epoch_in)
    }

    /// Adds objects (pre-created empty on their drives) to the pool.
    ///
    /// # Errors
    /// `InvalidArgument` if more than [`BATCH_MAX`] objects are given or a
    /// drive is not in the table; `Exists` if an object is already held by a
    /// file, pooled or doomed. Nothing is added on error.
    pub fn pool_add(&self, objects: &[ObjectRef]) -> Result<(), FsStatus> {
        check_batch(objects)?;
        self.backend.transact(|t| insert_pooled(t, objects))
    }

    /// Dooms every pooled object of `drive` (they go to the doomed list, to
    /// be removed from the drive), in one transaction; returns how many.
    /// For a manager starting on a store no other manager uses: a create
    /// acknowledged but then lost to a power loss (within the store's
    /// durability window) put its objects back in the pool, after its
    /// client may have written to them.
    ///
    /// # Errors
    /// `Internal`.
    pub fn doom_pool(&self, drive: u32) -> Result<usize, FsStatus> {
        self.backend.transact(|t| {
            let mut n = 0;
            while let Some(o) = t.pool_take(drive)? {
                t.doom(&o)?;
                n += 1;
            }
            Ok(n)
        })
    }

    /// Number of pooled objects of a drive.
    ///
    /// # Errors
    /// `Internal`.
    pub fn pool_len(&self, drive: u32) -> Result<usize, FsStatus> {
        let n = self.backend.read(|t| t.pool_count(drive))?;
        usize::try_from(n).map_err(|_| FsStatus::Internal)
    }

    /// Up to `limit` (at most [`BATCH_MAX`]) doomed objects: no longer named,
    /// to be removed from their drives.
    ///
    /// # Errors
    /// `Internal`.
    pub fn doomed(&self, limit: usize) -> Result<Vec<ObjectRef>, FsStatus> {
        self.backend.read(|t| t.list_doomed(None, limit.min(BATCH_MAX)))
    }

    /// Up to `limit` (at most [`BATCH_MAX`]) doomed objects of one drive
    /// (what must be removed from it before it is readmitted).
    ///
    /// # Errors
    /// `Internal`.
    pub fn doomed_on(&self, drive: u32, limit: usize) -> Result<Vec<ObjectRef>, FsStatus> {
        self.backend.read(|t| t.list_doomed(Some(drive), limit.min(BATCH_MAX)))
    }

    /// Forgets doomed objects the manager removed from their drives.
    ///
    /// # Errors
    /// `InvalidArgument` if more than [`BATCH_MAX`] objects are given.
    pub fn forget_doomed(&self, objects: &[ObjectRef]) -> Result<(), FsStatus> {
        check_batch(objects)?;
        self.backend.transact(|t| objects.iter().try_for_each(|o| t.forget_doomed(o)))
    }

    /// Up to `limit` (at most [`BATCH_MAX`]) pending ACV intents (at most one
    /// per object, the newest).
    ///
    /// # Errors
    /// `Internal`.
    pub fn acv_intents(&self, limit: usize) -> Result<Vec<AcvIntent>, FsStatus> {
        self.backend.read(|t| t.list_acv_intents(None, limit.min(BATCH_MAX)))
    }

    /// Up to `limit` (at most [`BATCH_MAX`]) pending ACV intents of objects
    /// on one drive.
    ///
    /// # Errors
    /// `Internal`.
    pub fn acv_intents_on(&self, drive: u32, limit: usize) -> Result<Vec<AcvIntent>, FsStatus> {
        self.backend.read(|t| t.list_acv_intents(Some(drive), limit.min(BATCH_MAX)))
    }

    /// Forgets an ACV intent the manager carried out; a newer intent for the
    /// same object (another acv) stays.
    ///
    /// # Errors
    /// `Internal`.
    pub fn forget_acv_intent(&self, intent: &AcvIntent) -> Result<(), FsStatus> {
        self.backend.transact(|t| t.delete_acv_intent(&intent.object, Some(intent.acv)))
    }

    /// Every object the managers know on a drive: files' component objects,
    /// pooled and doomed ones, and those reserved and not lapsed
    /// ([`Namespace::reserve_pooled_object`]), read in one transaction.
    /// Anything else on the drive's partition is an orphan.
    ///
    /// # Errors
    /// `Internal`.
    pub fn known_objects(&self, drive: u32) -> Result<BTreeSet<u64>, FsStatus> {
        self.backend.read(|t| {
            let mut known = BTreeSet::new();
            for list in [t.file_objects(drive)?, t.pool_objects(drive)?, t.doomed_objects(drive)?] {
                known.extend(list.iter().map(|o| o.object));
            }
            known.extend(crate::leases::live_reservations(t, drive)?);
            Ok(known)
        })
    }

    /// Reads a setting.
    ///
    /// # Errors
    /// `Internal`.
    pub fn setting(&self, key: &str) -> Result<Option<Vec<u8>>, FsStatus> {
        self.backend.read(|t| t.get_setting(key))
    }

    /// Writes a setting.
    ///
    /// # Errors
    /// `InvalidArgument` if the key is empty or longer than
    /// [`SETTING_KEY_MAX`], or the value larger than [`SETTING_VALUE_MAX`].
    pub fn set_setting(&self, key: &str, value: &[u8]) -> Result<(), FsStatus> {
        if key.is_empty() || key.len() > SETTING_KEY_MAX || value.len() > SETTING_VALUE_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| t.put_setting(key, value))
    }
}

/// Adds `objects` to their drives' pools in transaction `t`: `InvalidArgument`
/// if a drive is not in the table, `Exists` if an object is already held by a
/// file, pooled or doomed.
pub(crate) fn insert_pooled(t: &mut dyn Txn, objects: &[ObjectRef]) -> Result<(), FsStatus> {
    for object in objects {
        t.get_drive(object.drive)?.ok_or(FsStatus::InvalidArgument)?;
        if t.object_known(object)? {
            return Err(FsStatus::Exists);
        }
        t.pool_insert(object)?;
    }
    Ok(())
}
