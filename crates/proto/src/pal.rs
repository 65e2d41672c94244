//! Pre-authorization lists (DSFS §3.2, §4.1): the file manager's access
//! decisions stored on the drive with the objects, so a drive authorizes a
//! request by identity without a capability.
//!
//! A PAL is a list of entries, each naming a user, a role or everyone and
//! the rights ([`crate::rights`] bits) it grants. An object has at most one
//! **access PAL** and belongs to at most one **PAL collection**, whose
//! **super PAL** every member shares. A request by identity is allowed what
//! the union of the entries that name its user or its role, and the
//! everyone entry, in both lists, grants.

use crate::codec::{Reader, Writer};
use crate::limits::PAL_ENTRIES_MAX;
use crate::{rights, DecodeError};

/// Rights a PAL entry may grant: every capability right but `CREATE`
/// (an object is created through its partition's manager, never by
/// identity).
pub const PAL_RIGHTS: u32 = rights::ALL & !rights::CREATE;
/// Encoded length of one [`PalEntry`].
pub const PAL_ENTRY_LEN: usize = 9;
/// Wire kind of a user entry.
pub const PAL_KIND_USER: u8 = 1;
/// Wire kind of a role entry.
pub const PAL_KIND_ROLE: u8 = 2;
/// Wire kind of the everyone entry (its id is 0): it matches every
/// identity, whatever its user and role. The manager gives it the rights
/// every class of a file's mode has (see `nasd_manager::pals`).
pub const PAL_KIND_EVERYONE: u8 = 3;

/// Who an entry is for. Ordered users first, then roles, each by id, then
/// everyone: the order of a canonical list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Principal {
    /// One user.
    User(u32),
    /// Every user who assumes this role (never `ROLE_NONE`).
    Role(u32),
    /// Every identity.
    Everyone,
}

/// One pre-authorization entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PalEntry {
    /// The user or role.
    pub principal: Principal,
    /// [`rights`] bits granted (non-zero, within [`PAL_RIGHTS`]).
    pub rights: u32,
}

/// A pre-authorization list: entries in canonical order (users, then roles,
/// each by ascending id), each principal once.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Pal {
    /// The entries. [`Pal::new`] puts them in canonical order; a decoded
    /// list is in it already.
    pub entries: Vec<PalEntry>,
}

impl Pal {
    /// A list of `entries` in canonical order, the rights of a principal
    /// named twice joined. Nothing else is checked here: a list with more
    /// than `PAL_ENTRIES_MAX` entries, an entry without rights or a role 0
    /// encodes, and is refused by the decoder (the drive's).
    pub fn new(mut entries: Vec<PalEntry>) -> Pal {
        entries.sort_by_key(|e| e.principal);
        let mut out: Vec<PalEntry> = Vec::with_capacity(entries.len());
        for e in entries {
            match out.last_mut() {
                Some(last) if last.principal == e.principal => last.rights |= e.rights,
                _ => out.push(e),
            }
        }
        Pal { entries: out }
    }

    /// True if the list has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The rights granted to `user` acting in `role`: the union of the
    /// entry naming the user, the one naming the role (a role of
    /// `ROLE_NONE` names none) and the everyone entry. `None` if none of
    /// them is in the list.
    pub fn rights_for(&self, user: u32, role: u32) -> Option<u32> {
        let find = |p: Principal| self.entries.binary_search_by_key(&p, |e| e.principal).ok();
        let by_user = find(Principal::User(user));
        let by_role = (role != crate::ROLE_NONE).then(|| find(Principal::Role(role))).flatten();
        let by_everyone = find(Principal::Everyone);
        [by_user, by_role, by_everyone].into_iter().flatten().map(|i| self.entries[i].rights).reduce(|a, b| a | b)
    }

    /// Appends the list: `u16` count, then 9 bytes per entry (`kind u8`,
    /// `id u32`, `rights u32`; the everyone entry's id is 0).
    pub fn encode(&self, w: &mut Writer) {
        let n = u16::try_from(self.entries.len()).expect("a PAL has at most u16::MAX entries");
        w.u16(n);
        for e in &self.entries {
            let (kind, id) = match e.principal {
                Principal::User(id) => (PAL_KIND_USER, id),
                Principal::Role(id) => (PAL_KIND_ROLE, id),
                Principal::Everyone => (PAL_KIND_EVERYONE, 0),
            };
            w.u8(kind).u32(id).u32(e.rights);
        }
    }

    /// Reads a list: at most `PAL_ENTRIES_MAX` entries (else
    /// [`DecodeError::PalOverflow`], checked before any entry is read), each
    /// of a known kind, a role other than 0, the everyone entry with id 0,
    /// rights non-zero and within [`PAL_RIGHTS`], in strictly ascending
    /// order.
    pub fn decode(r: &mut Reader<'_>) -> Result<Pal, DecodeError> {
        let n = r.u16()? as usize;
        if n > PAL_ENTRIES_MAX {
            return Err(DecodeError::PalOverflow { entries: n as u64, max: PAL_ENTRIES_MAX as u64 });
        }
        let mut entries: Vec<PalEntry> = Vec::with_capacity(n);
        for _ in 0..n {
            let kind = r.u8()?;
            let id = r.u32()?;
            let rights = r.u32()?;
            let principal = match kind {
                PAL_KIND_USER => Principal::User(id),
                PAL_KIND_ROLE if id != crate::ROLE_NONE => Principal::Role(id),
                PAL_KIND_ROLE => return Err(DecodeError::NotCanonical("PAL entry for role 0")),
                PAL_KIND_EVERYONE if id == 0 => Principal::Everyone,
                PAL_KIND_EVERYONE => return Err(DecodeError::NotCanonical("PAL everyone entry with an id")),
                _ => return Err(DecodeError::NotCanonical("unknown PAL entry kind")),
            };
            if rights == 0 {
                return Err(DecodeError::NotCanonical("PAL entry grants no rights"));
            }
            if rights & !PAL_RIGHTS != 0 {
                return Err(DecodeError::NotCanonical("undefined or ungrantable PAL rights"));
            }
            if entries.last().is_some_and(|last| last.principal >= principal) {
                return Err(DecodeError::NotCanonical("PAL entries out of order or repeated"));
            }
            entries.push(PalEntry { principal, rights });
        }
        Ok(Pal { entries })
    }

    /// The list alone, as the drive stores a super PAL.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(2 + self.entries.len() * PAL_ENTRY_LEN);
        self.encode(&mut w);
        w.into_vec()
    }

    /// Parses [`Pal::to_bytes`], refusing trailing bytes.
    pub fn from_bytes(buf: &[u8]) -> Result<Pal, DecodeError> {
        let mut r = Reader::new(buf);
        let pal = Pal::decode(&mut r)?;
        r.finish()?;
        Ok(pal)
    }
}

/// An object's security attribute: its access PAL and the PAL collection it
/// belongs to (0: none).
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct ObjectPal {
    /// The PAL collection whose super PAL the object shares; 0 for none.
    pub collection: u64,
    /// The object's access PAL.
    pub pal: Pal,
}

impl ObjectPal {
    /// True if the object has neither entries nor a collection (no PAL).
    pub fn is_empty(&self) -> bool {
        self.collection == 0 && self.pal.is_empty()
    }

    /// Appends `collection u64`, then the list.
    pub fn encode(&self, w: &mut Writer) {
        w.u64(self.collection);
        self.pal.encode(w);
    }

    /// Reads what [`ObjectPal::encode`] writes.
    pub fn decode(r: &mut Reader<'_>) -> Result<ObjectPal, DecodeError> {
        let collection = r.u64()?;
        Ok(ObjectPal { collection, pal: Pal::decode(r)? })
    }

    /// The attribute alone, as the drive stores it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(10 + self.pal.entries.len() * PAL_ENTRY_LEN);
        self.encode(&mut w);
        w.into_vec()
    }

    /// Parses [`ObjectPal::to_bytes`], refusing trailing bytes.
    pub fn from_bytes(buf: &[u8]) -> Result<ObjectPal, DecodeError> {
        let mut r = Reader::new(buf);
        let p = ObjectPal::decode(&mut r)?;
        r.finish()?;
        Ok(p)
    }
}
