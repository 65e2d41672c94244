//! Leases: how several managers sharing one database take turns at work
//! only one of them may do at a time, and reservations of objects that no
//! table names yet.
//!
//! A lease is a row (`name`, `holder`, `token`, `expires_ms`) read and
//! written in serializable transactions, so two managers never both
//! acquire it. Expiry is on the database's clock ([`Txn::now_ms`]): a
//! holder that died lets go after the lease's time-to-live. The fencing
//! token moves on at every acquisition, and the transaction that records
//! the work's result checks it ([`Namespace::pool_add_fenced`]): a holder
//! that lost the lease while it worked (stalled past the expiry, then taken
//! over) cannot record anything, whatever its clock says.

use crate::backend::{Backend, Txn};
use crate::types::Lease;
use crate::{Namespace, BATCH_MAX};
use nasd_proto::fs::{FsStatus, ObjectRef};
use std::time::Duration;

/// Longest lease name, in bytes.
pub const LEASE_NAME_MAX: usize = 255;
/// Longest lease holder (a manager's id), in bytes.
pub const LEASE_HOLDER_MAX: usize = 255;
/// Longest time-to-live of a lease or reservation: one day.
pub const LEASE_TTL_MAX: Duration = Duration::from_secs(24 * 3600);
/// Prefix of the names of object reservations ([`Namespace::reserve_pooled_object`]).
pub const RESERVATION_PREFIX: &str = "object/";

fn ttl_ms(ttl: Duration) -> Result<u64, FsStatus> {
    if ttl.is_zero() || ttl > LEASE_TTL_MAX {
        return Err(FsStatus::InvalidArgument);
    }
    Ok(ttl.as_millis() as u64)
}

fn check_names(name: &str, holder: &str) -> Result<(), FsStatus> {
    if name.is_empty() || name.len() > LEASE_NAME_MAX || holder.is_empty() || holder.len() > LEASE_HOLDER_MAX {
        return Err(FsStatus::InvalidArgument);
    }
    Ok(())
}

/// The name of the reservation of `object`.
pub fn reservation_name(object: &ObjectRef) -> String {
    format!("{RESERVATION_PREFIX}{}/{}/{}", object.drive, object.partition, object.object)
}

fn reservation_prefix(drive: u32) -> String {
    format!("{RESERVATION_PREFIX}{drive}/")
}

/// Whether `lease` is still held as it was acquired (same holder, same
/// token), inside the caller's transaction: the fence. An expired lease
/// nobody took over is still held: nothing else happened under its name.
pub fn holds(t: &mut dyn Txn, lease: &Lease) -> Result<bool, FsStatus> {
    Ok(t.get_lease(&lease.name)?.is_some_and(|l| l.holder == lease.holder && l.token == lease.token))
}

impl<B: Backend> Namespace<B> {
    /// Acquires lease `name` for `holder` for `ttl`, if nobody else holds
    /// it: free, expired, or held by `holder` already (an earlier run of the
    /// same manager, which stopped without releasing it). Every acquisition
    /// moves the token on. `None`: another holder has it, unexpired.
    ///
    /// # Errors
    /// `InvalidArgument` (an empty or too long name or holder, a zero `ttl`
    /// or one over [`LEASE_TTL_MAX`]); `Internal`.
    pub fn acquire_lease(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Lease>, FsStatus> {
        check_names(name, holder)?;
        let ttl = ttl_ms(ttl)?;
        self.backend.transact(|t| {
            let now = t.now_ms()?;
            let old = t.get_lease(name)?;
            if old.as_ref().is_some_and(|l| l.holder != holder && l.expires_ms > now) {
                return Ok(None);
            }
            let token = old.map_or(1, |l| l.token.wrapping_add(1).max(1));
            let lease =
                Lease { name: name.to_owned(), holder: holder.to_owned(), token, expires_ms: now.saturating_add(ttl) };
            t.put_lease(&lease)?;
            Ok(Some(lease))
        })
    }

    /// Extends a lease still held (see [`holds`]) by `ttl` from now, keeping
    /// its token. `None`: it was lost (taken over, or released).
    ///
    /// # Errors
    /// As [`Namespace::acquire_lease`].
    pub fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<Option<Lease>, FsStatus> {
        let ttl = ttl_ms(ttl)?;
        self.backend.transact(|t| {
            if !holds(t, lease)? {
                return Ok(None);
            }
            let renewed = Lease { expires_ms: t.now_ms()?.saturating_add(ttl), ..lease.clone() };
            t.put_lease(&renewed)?;
            Ok(Some(renewed))
        })
    }

    /// Gives a lease up, if still held; whether it was. The row goes, and
    /// the next acquisition starts at token 1 again: a fence compares the
    /// holder too, and one manager runs one piece of work under a lease name
    /// at a time.
    ///
    /// # Errors
    /// `Internal`.
    pub fn release_lease(&self, lease: &Lease) -> Result<bool, FsStatus> {
        self.backend.transact(|t| {
            let held = holds(t, lease)?;
            if held {
                t.delete_lease(&lease.name)?;
            }
            Ok(held)
        })
    }

    /// A lease as stored, expired or not.
    ///
    /// # Errors
    /// `Internal`.
    pub fn lease(&self, name: &str) -> Result<Option<Lease>, FsStatus> {
        self.backend.read(|t| t.get_lease(name))
    }

    /// [`Namespace::pool_add`] for the holder of `lease` only: fails with
    /// `Busy` and adds nothing if the lease changed hands since it was
    /// acquired. The objects were made on the drive under the lease; if the
    /// lease was lost meanwhile, another manager may have collected them
    /// as orphans, and recording them would hand out objects that are gone.
    ///
    /// # Errors
    /// `Busy` (the lease was lost), otherwise as [`Namespace::pool_add`].
    pub fn pool_add_fenced(&self, objects: &[ObjectRef], lease: &Lease) -> Result<(), FsStatus> {
        if objects.len() > BATCH_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| {
            if !holds(t, lease)? {
                return Err(FsStatus::Busy);
            }
            crate::admin::insert_pooled(t, objects)
        })
    }

    /// Takes an object from `drive`'s pool and reserves it for `holder` for
    /// `ttl`, in one transaction: the object leaves the pool (nothing else
    /// takes it) but orphan collection still counts it as known
    /// ([`Namespace::known_objects`]) until the reservation is released
    /// or lapses. A repair writes into such an object before a table names
    /// it; a manager that dies meanwhile leaves a reservation that lapses,
    /// and its object is then an orphan. `None`: the pool is empty.
    ///
    /// # Errors
    /// As [`Namespace::acquire_lease`].
    pub fn reserve_pooled_object(
        &self,
        drive: u32,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<ObjectRef>, FsStatus> {
        check_names(RESERVATION_PREFIX, holder)?;
        let ttl = ttl_ms(ttl)?;
        self.backend.transact(|t| {
            let Some(object) = t.pool_take(drive)? else { return Ok(None) };
            let expires_ms = t.now_ms()?.saturating_add(ttl);
            t.put_lease(&Lease { name: reservation_name(&object), holder: holder.to_owned(), token: 1, expires_ms })?;
            Ok(Some(object))
        })
    }

    /// Drops the reservation of `object` (it is a file's component now, or
    /// was given up and removed).
    ///
    /// # Errors
    /// `Internal`.
    pub fn unreserve_object(&self, object: &ObjectRef) -> Result<(), FsStatus> {
        self.backend.transact(|t| t.delete_lease(&reservation_name(object)))
    }

    /// Drops the lapsed reservations of `drive` (their objects are orphans
    /// unless a table names them); how many.
    ///
    /// # Errors
    /// `Internal`.
    pub fn drop_lapsed_reservations(&self, drive: u32) -> Result<usize, FsStatus> {
        let prefix = reservation_prefix(drive);
        self.backend.transact(|t| {
            let now = t.now_ms()?;
            let mut dropped = 0;
            for l in t.list_leases(&prefix, BATCH_MAX)? {
                if l.expires_ms <= now {
                    t.delete_lease(&l.name)?;
                    dropped += 1;
                }
            }
            Ok(dropped)
        })
    }

    /// Sets setting `key` to `value` unless it has a value; the value it
    /// has after the call. Two managers starting on a new database agree on
    /// one value (the file system's id).
    ///
    /// # Errors
    /// As [`Namespace::set_setting`].
    pub fn setting_or_insert(&self, key: &str, value: &[u8]) -> Result<Vec<u8>, FsStatus> {
        if key.is_empty() || key.len() > crate::SETTING_KEY_MAX || value.len() > crate::SETTING_VALUE_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| match t.get_setting(key)? {
            Some(v) => Ok(v),
            None => {
                t.put_setting(key, value)?;
                Ok(value.to_vec())
            }
        })
    }

    /// Moves the counter in setting `key` (a `u64`, 8 bytes little-endian;
    /// absent: 0) on by one; the new value. What one manager changed that
    /// other managers cache (users' credentials) is announced this way.
    ///
    /// # Errors
    /// `InvalidArgument` (a bad key); `Internal` (a malformed value, logged).
    pub fn bump_counter(&self, key: &str) -> Result<u64, FsStatus> {
        if key.is_empty() || key.len() > crate::SETTING_KEY_MAX {
            return Err(FsStatus::InvalidArgument);
        }
        self.backend.transact(|t| {
            let next = counter_in(t, key)?.wrapping_add(1);
            t.put_setting(key, &next.to_le_bytes())?;
            Ok(next)
        })
    }

    /// The counter in setting `key` (see [`Namespace::bump_counter`]).
    ///
    /// # Errors
    /// As [`Namespace::bump_counter`].
    pub fn counter(&self, key: &str) -> Result<u64, FsStatus> {
        self.backend.read(|t| counter_in(t, key))
    }
}

fn counter_in(t: &mut dyn Txn, key: &str) -> Result<u64, FsStatus> {
    match t.get_setting(key)? {
        None => Ok(0),
        Some(v) => <[u8; 8]>::try_from(v.as_slice()).map(u64::from_le_bytes).map_err(|_| {
            tracing::error!(key, len = v.len(), "a counter setting is not 8 bytes");
            FsStatus::Internal
        }),
    }
}

impl<B: Backend> Namespace<B> {
    /// [`Namespace::update_drive`] for the holder of `lease` only (key
    /// rotation): `Busy`, and nothing changes, if the lease changed hands.
    ///
    /// # Errors
    /// `Busy`, otherwise as [`Namespace::update_drive`].
    pub fn update_drive_fenced(&self, rec: &crate::DriveRecord, lease: &Lease) -> Result<(), FsStatus> {
        crate::admin::check_drive(rec)?;
        self.backend.transact(|t| {
            if !holds(t, lease)? {
                return Err(FsStatus::Busy);
            }
            t.get_drive(rec.drive)?.ok_or(FsStatus::NotFound)?;
            if t.drive_with_id(&rec.drive_id)?.is_some_and(|d| d != rec.drive) {
                return Err(FsStatus::Exists);
            }
            t.put_drive(rec)
        })
    }
}

/// The objects of `drive` reserved and not lapsed (at most [`BATCH_MAX`]
/// reservations are looked at; a repair holds one at a time).
pub(crate) fn live_reservations(t: &mut dyn Txn, drive: u32) -> Result<Vec<u64>, FsStatus> {
    let prefix = reservation_prefix(drive);
    let now = t.now_ms()?;
    let mut live = Vec::new();
    for l in t.list_leases(&prefix, BATCH_MAX)? {
        if l.expires_ms <= now {
            continue;
        }
        match l.name[prefix.len()..].split_once('/').and_then(|(_, o)| o.parse::<u64>().ok()) {
            Some(object) => live.push(object),
            None => {
                tracing::error!(name = %l.name, "a malformed object reservation");
                return Err(FsStatus::Internal);
            }
        }
    }
    Ok(live)
}
