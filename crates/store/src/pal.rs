//! Pre-authorization lists on the store (DSFS §4.1–4.2): each object's
//! security attribute — its access PAL and the PAL collection it belongs to
//! — and each partition's collections with their super PALs.
//!
//! The store keeps them and makes them durable with everything else; it
//! does not interpret them (the drive matches identities against them). Every
//! change gets a fresh **stamp**, so a write authorized against the PALs as
//! they were ([`Store::pal_view`]) can be refused at install if they changed
//! meanwhile ([`crate::WriteCheck::pal`]).
//!
//! They are persisted by the commit like attributes (tables `pals`,
//! `pal_collections`; format 3): removing an object, a partition or
//! everything (`INITIALIZE`) deletes their rows in the same transaction, so
//! a crash never leaves a removed partition's PAL on a new object of the
//! same number. `FASTCOPY` gives the clone its source's attribute. A
//! partition holds at most `PAL_COLLECTIONS_MAX` super PALs; memory is at
//! most `PAL_LEN_MAX` encoded bytes (≈ 400 in memory) per object with a PAL.

use super::*;
use nasd_proto::limits::PAL_COLLECTIONS_MAX;

/// Which PALs a request by identity was authorized against: the stamp of
/// the object's security attribute and of its collection's super PAL (0 for
/// none). Any change to either gives a different stamp.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PalStamp {
    object: u64,
    collection: u64,
}

/// An object's PALs as one consistent view (taken under the metadata lock).
#[derive(Debug, Clone, Default)]
pub struct PalView {
    /// The object's access PAL and its collection, if it has either.
    pub access: Option<Arc<ObjectPal>>,
    /// The super PAL of the object's collection, if the collection has one.
    pub super_pal: Option<Arc<Pal>>,
    /// What [`crate::WriteCheck::pal`] compares at install.
    pub stamp: PalStamp,
}

impl PalView {
    /// The rights `user` acting in `role` has on the object: the union of
    /// the entries naming either in the access PAL and the super PAL. `None`
    /// if no entry names either.
    pub fn rights_for(&self, user: u32, role: u32) -> Option<u32> {
        let access = self.access.as_ref().and_then(|a| a.pal.rights_for(user, role));
        let shared = self.super_pal.as_ref().and_then(|s| s.rights_for(user, role));
        match (access, shared) {
            (None, None) => None,
            (a, s) => Some(a.unwrap_or(0) | s.unwrap_or(0)),
        }
    }
}

impl Meta {
    /// A stamp no PAL of this store had before.
    pub(crate) fn next_pal_stamp(&mut self) -> u64 {
        self.pal_stamps += 1;
        self.pal_stamps
    }

    /// The current stamp of object `o`'s PALs.
    pub(crate) fn pal_stamp(&self, p: u64, o: u64) -> Result<PalStamp, StoreError> {
        Ok(self.pal_view(p, o)?.stamp)
    }

    fn pal_view(&self, p: u64, o: u64) -> Result<PalView, StoreError> {
        let part = self.partition(p)?;
        let obj = self.object(p, o)?;
        let Some(access) = &obj.pal else {
            return Ok(PalView::default());
        };
        let shared = part.collections.get(&access.collection);
        Ok(PalView {
            access: Some(access.clone()),
            super_pal: shared.map(|(pal, _)| pal.clone()),
            stamp: PalStamp { object: obj.pal_stamp, collection: shared.map_or(0, |(_, s)| *s) },
        })
    }
}

impl Store {
    /// Replaces object `o`'s security attribute: its access PAL and the PAL
    /// collection it belongs to (0: none); an empty one (no entries, no
    /// collection) removes it. Takes effect at once for every later check;
    /// durable at the next commit. The collection need not have a super PAL
    /// (yet). Control objects have none (`ReadOnlyObject`).
    pub fn set_pal(&self, p: u64, o: u64, pal: ObjectPal) -> Result<(), StoreError> {
        self.check_healthy()?;
        if is_control(o) {
            return Err(StoreError::ReadOnlyObject(o));
        }
        let _g = self.stripe(p, o).write().expect("object lock poisoned");
        let now = self.now_ns();
        let mut m = lock(&self.meta);
        m.object(p, o)?;
        let stamp = m.next_pal_stamp();
        let obj = m.object_mut(p, o)?;
        obj.pal = (!pal.is_empty()).then(|| Arc::new(pal));
        obj.pal_stamp = stamp;
        obj.attrs.attribute_modify_time = now;
        m.dirty_object(p, o).pal = true;
        Ok(())
    }

    /// Object `o`'s PALs, as one view. A control object (1–3) has none: its
    /// view is empty, as long as the partition exists.
    pub fn pal_view(&self, p: u64, o: u64) -> Result<PalView, StoreError> {
        let m = lock(&self.meta);
        if is_control(o) {
            m.partition(p)?;
            return Ok(PalView::default());
        }
        m.pal_view(p, o)
    }

    /// Replaces collection `c`'s super PAL in partition `p`; an empty list
    /// removes the collection. At most `PAL_COLLECTIONS_MAX` collections per
    /// partition (`TooMany`); collection 0 names none (`BadArgument`).
    /// Takes effect at once for every member; durable at the next commit.
    pub fn set_super_pal(&self, p: u64, c: u64, pal: Pal) -> Result<(), StoreError> {
        self.check_healthy()?;
        if c == 0 {
            return Err(StoreError::BadArgument("PAL collection 0 names no collection"));
        }
        let mut m = lock(&self.meta);
        let part = m.partition(p)?;
        if !pal.is_empty() && !part.collections.contains_key(&c) && part.collections.len() >= PAL_COLLECTIONS_MAX {
            return Err(StoreError::TooMany("PAL collections in this partition"));
        }
        let stamp = m.next_pal_stamp();
        let part = m.partition_mut(p)?;
        if pal.is_empty() {
            part.collections.remove(&c);
        } else {
            part.collections.insert(c, (Arc::new(pal), stamp));
        }
        m.dirty.collections.insert((p, c));
        Ok(())
    }

    /// Collection `c`'s super PAL in partition `p` (None: it has none).
    pub fn super_pal(&self, p: u64, c: u64) -> Result<Option<Arc<Pal>>, StoreError> {
        let m = lock(&self.meta);
        Ok(m.partition(p)?.collections.get(&c).map(|(pal, _)| pal.clone()))
    }
}
