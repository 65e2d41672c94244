//! Global access-control lists (DSFS §4.1, LegionFS §3.3): the file
//! manager's per-file and per-directory entries that grant a named user,
//! group or role rights beyond what the POSIX mode bits give. A role entry
//! matches a caller whose identity credential carries that role (the one
//! role it chose for the session at the authentication server).
//!
//! An inode's permissions are its mode bits (the owner, group and other
//! entries: `chmod` and `chown` change them) **plus** the union of the rights
//! of its named entries that match the caller. Entries only add: a right the
//! mode bits or one matching entry give is held. A directory entry flagged
//! [`ACL_INHERIT`] is copied onto every file, directory and special file
//! created in that directory afterwards (onto a new directory with the flag,
//! so it keeps propagating; onto anything else without it).
//!
//! A directory entry flagged [`ACL_SHARED`] is not copied onto the regular
//! files created in the directory but granted to them **live**: each such
//! file is a member of the directory's PAL collection (DSFS §4.1), and a
//! change of the directory's shared entries reaches every member at once
//! (one super PAL per drive, not one access PAL per file). With
//! [`ACL_INHERIT`] as well, a new subdirectory gets the entry with both
//! flags and so becomes a collection of its own.

use crate::codec::{Reader, Writer};
use crate::DecodeError;

/// Most named entries one inode's ACL holds. Every permission check the mode
/// bits refuse scans them (one indexed read of at most this many rows), a
/// `GET_ACL`/`SET_ACL` carries at most this many 7-byte entries, and it
/// equals the drive's `PAL_ENTRIES_MAX`, so a file's user entries always fit
/// one access PAL.
pub const ACL_ENTRIES_MAX: usize = 32;
/// Encoded length of one [`AclEntry`]: kind, id, rights, flags.
pub const ACL_ENTRY_LEN: usize = 7;

/// Read: a file's data; a directory's names (`READDIR`).
pub const ACL_READ: u8 = 4;
/// Write: a file's data (and its size); a directory's entries (create,
/// remove and rename names in it).
pub const ACL_WRITE: u8 = 2;
/// Execute: run a file; search a directory (look names up, walk through it).
pub const ACL_EXECUTE: u8 = 1;
/// Change the inode's named entries (`SET_ACL`), as its owner may. Not the
/// mode or the owner: those stay the owner's (`chmod`, `chown`).
pub const ACL_SET_ACL: u8 = 8;
/// Every defined right.
pub const ACL_RIGHTS: u8 = ACL_READ | ACL_WRITE | ACL_EXECUTE | ACL_SET_ACL;

/// Entry flag: on a directory, copied onto what is created in it.
pub const ACL_INHERIT: u8 = 1;
/// Entry flag: on a directory, granted live to every regular file created
/// in it (the members of its PAL collection); never copied onto them.
pub const ACL_SHARED: u8 = 2;
/// Every defined flag.
pub const ACL_FLAGS: u8 = ACL_INHERIT | ACL_SHARED;

/// Wire kind of an entry naming a user (by uid).
pub const ACL_KIND_USER: u8 = 1;
/// Wire kind of an entry naming a group (by gid).
pub const ACL_KIND_GROUP: u8 = 2;
/// Wire kind of an entry naming a role (by role id, never `ROLE_NONE`).
pub const ACL_KIND_ROLE: u8 = 3;

/// Who an entry is for. Ordered users first, then groups, then roles, each
/// by id: the order of a canonical list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AclWho {
    /// One user, by uid.
    User(u32),
    /// Every member of a group (its primary or a supplementary group), by gid.
    Group(u32),
    /// Every caller acting in a role (the role of its identity credential),
    /// by role id; never `ROLE_NONE` (0).
    Role(u32),
}

impl AclWho {
    /// The wire kind and id.
    pub fn code(self) -> (u8, u32) {
        match self {
            AclWho::User(id) => (ACL_KIND_USER, id),
            AclWho::Group(id) => (ACL_KIND_GROUP, id),
            AclWho::Role(id) => (ACL_KIND_ROLE, id),
        }
    }

    /// The principal of a wire kind and id.
    pub fn from_code(kind: u8, id: u32) -> Result<AclWho, DecodeError> {
        match kind {
            ACL_KIND_USER => Ok(AclWho::User(id)),
            ACL_KIND_GROUP => Ok(AclWho::Group(id)),
            ACL_KIND_ROLE if id != crate::ROLE_NONE => Ok(AclWho::Role(id)),
            ACL_KIND_ROLE => Err(DecodeError::NotCanonical("ACL entry for role 0")),
            _ => Err(DecodeError::NotCanonical("unknown ACL entry kind")),
        }
    }
}

/// One named entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AclEntry {
    /// The user or group.
    pub who: AclWho,
    /// Rights granted ([`ACL_RIGHTS`] bits, non-zero).
    pub rights: u8,
    /// [`ACL_FLAGS`] bits.
    pub flags: u8,
}

impl AclEntry {
    /// Whether the entry is copied onto what is created in its directory.
    pub fn inherits(&self) -> bool {
        self.flags & ACL_INHERIT != 0
    }

    /// Whether the entry is granted live to the members of its directory's
    /// PAL collection.
    pub fn shared(&self) -> bool {
        self.flags & ACL_SHARED != 0
    }

    /// Appends `kind u8, id u32, rights u8, flags u8`.
    pub fn encode(&self, w: &mut Writer) {
        let (kind, id) = self.who.code();
        w.u8(kind).u32(id).u8(self.rights).u8(self.flags);
    }

    /// Reads one entry: a known kind, rights non-zero and defined, flags defined.
    pub fn decode(r: &mut Reader<'_>) -> Result<AclEntry, DecodeError> {
        let (kind, id, rights, flags) = (r.u8()?, r.u32()?, r.u8()?, r.u8()?);
        let e = AclEntry { who: AclWho::from_code(kind, id)?, rights, flags };
        e.validate().map_err(DecodeError::NotCanonical)?;
        Ok(e)
    }

    /// Checks the rights and flags, and that a role entry names a role.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.who == AclWho::Role(crate::ROLE_NONE) {
            return Err("ACL entry for role 0");
        }
        if self.rights == 0 {
            return Err("ACL entry grants no rights");
        }
        if self.rights & !ACL_RIGHTS != 0 {
            return Err("undefined ACL rights");
        }
        if self.flags & !ACL_FLAGS != 0 {
            return Err("undefined ACL entry flags");
        }
        Ok(())
    }
}

/// Checks a list of entries: at most [`ACL_ENTRIES_MAX`], each valid, in
/// strictly ascending order of [`AclWho`] (so each principal once).
pub fn validate_acl(entries: &[AclEntry]) -> Result<(), &'static str> {
    if entries.len() > ACL_ENTRIES_MAX {
        return Err("more than ACL_ENTRIES_MAX ACL entries");
    }
    for e in entries {
        e.validate()?;
    }
    if entries.windows(2).any(|w| w[0].who >= w[1].who) {
        return Err("ACL entries out of order or repeated");
    }
    Ok(())
}

/// Appends a list: `u16` count, then the entries.
///
/// # Panics
/// If the list has more than `u16::MAX` entries (check with [`validate_acl`]).
pub fn encode_acl(w: &mut Writer, entries: &[AclEntry]) {
    w.u16(u16::try_from(entries.len()).expect("an ACL has at most u16::MAX entries"));
    for e in entries {
        e.encode(w);
    }
}

/// Reads a list: at most [`ACL_ENTRIES_MAX`] entries (checked before any is
/// read), each valid, in canonical order.
pub fn decode_acl(r: &mut Reader<'_>) -> Result<Vec<AclEntry>, DecodeError> {
    let n = r.count(ACL_ENTRIES_MAX, "ACL entries")?;
    let entries = (0..n).map(|_| AclEntry::decode(r)).collect::<Result<Vec<_>, _>>()?;
    validate_acl(&entries).map_err(DecodeError::NotCanonical)?;
    Ok(entries)
}

/// An inode's ACL as `GET_ACL` and `SET_ACL` answer it: the owner, group and
/// mode (the base entries) and the named entries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AclInfo {
    /// Owner (the owner entry is the mode's user triple).
    pub uid: u32,
    /// Group (the group entry is the mode's group triple).
    pub gid: u32,
    /// Permission bits (`MODE_MASK`); the other entry is the last triple.
    pub mode: u32,
    /// Named entries, canonical.
    pub entries: Vec<AclEntry>,
}

impl AclInfo {
    /// Appends `uid u32, gid u32, mode u32`, then the list.
    pub fn encode(&self, w: &mut Writer) {
        w.u32(self.uid).u32(self.gid).u32(self.mode);
        encode_acl(w, &self.entries);
    }

    /// Reads what [`AclInfo::encode`] writes.
    pub fn decode(r: &mut Reader<'_>) -> Result<AclInfo, DecodeError> {
        let (uid, gid, mode) = (r.u32()?, r.u32()?, r.u32()?);
        if mode & !crate::fs::MODE_MASK != 0 {
            return Err(DecodeError::NotCanonical("mode bits outside MODE_MASK"));
        }
        Ok(AclInfo { uid, gid, mode, entries: decode_acl(r)? })
    }
}

/// The canonical list of `entries`: sorted by principal.
///
/// # Errors
/// As [`validate_acl`]: a principal named twice (with any rights), an
/// invalid entry, or more than [`ACL_ENTRIES_MAX`] entries.
pub fn canonical_acl(mut entries: Vec<AclEntry>) -> Result<Vec<AclEntry>, &'static str> {
    entries.sort_by_key(|e| e.who);
    validate_acl(&entries)?;
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(who: AclWho, rights: u8, flags: u8) -> AclEntry {
        AclEntry { who, rights, flags }
    }

    #[test]
    fn known_answer() {
        let info = AclInfo {
            uid: 1000,
            gid: 100,
            mode: 0o640,
            entries: vec![e(AclWho::User(1001), ACL_READ, 0), e(AclWho::Group(7), ACL_READ | ACL_EXECUTE, ACL_INHERIT)],
        };
        let mut w = Writer::with_capacity(64);
        info.encode(&mut w);
        let bytes = w.into_vec();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "e803000064000000a0010000020001e9030000040002070000000501");
        let mut r = Reader::new(&bytes);
        assert_eq!(AclInfo::decode(&mut r).unwrap(), info);
        r.finish().unwrap();
    }

    #[test]
    fn decoder_refuses_what_is_not_canonical() {
        let enc = |entries: &[AclEntry]| {
            let mut w = Writer::with_capacity(64);
            encode_acl(&mut w, entries);
            w.into_vec()
        };
        let dec = |b: &[u8]| decode_acl(&mut Reader::new(b));
        let u = |id, rights| e(AclWho::User(id), rights, 0);
        assert_eq!(
            dec(&enc(&[u(2, ACL_READ), u(1, ACL_READ)])),
            Err(DecodeError::NotCanonical("ACL entries out of order or repeated"))
        );
        assert_eq!(
            dec(&enc(&[u(1, ACL_READ), u(1, ACL_WRITE)])),
            Err(DecodeError::NotCanonical("ACL entries out of order or repeated"))
        );
        assert_eq!(dec(&enc(&[u(1, 0)])), Err(DecodeError::NotCanonical("ACL entry grants no rights")));
        assert_eq!(dec(&enc(&[u(1, 0x10)])), Err(DecodeError::NotCanonical("undefined ACL rights")));
        assert_eq!(
            dec(&enc(&[e(AclWho::User(1), ACL_READ, 2)])),
            Err(DecodeError::NotCanonical("undefined ACL entry flags"))
        );
        let mut bad_kind = enc(&[u(1, ACL_READ)]);
        bad_kind[2] = 4;
        assert_eq!(dec(&bad_kind), Err(DecodeError::NotCanonical("unknown ACL entry kind")));
        // The count is checked before any entry is read.
        let mut w = Writer::with_capacity(4);
        w.u16((ACL_ENTRIES_MAX + 1) as u16);
        assert!(matches!(dec(&w.into_vec()), Err(DecodeError::OverLimit { .. })));
        let full: Vec<_> = (0..ACL_ENTRIES_MAX as u32).map(|i| u(i, ACL_READ)).collect();
        assert_eq!(dec(&enc(&full)).unwrap(), full);
        assert_eq!(canonical_acl(vec![e(AclWho::Group(1), 1, 0), u(9, 1)]).unwrap()[0].who, AclWho::User(9));
        assert_eq!(
            dec(&enc(&[e(AclWho::Role(0), ACL_READ, 0)])),
            Err(DecodeError::NotCanonical("ACL entry for role 0"))
        );
        assert_eq!(canonical_acl(vec![e(AclWho::Role(0), ACL_READ, 0)]), Err("ACL entry for role 0"));
        assert_eq!(
            dec(&enc(&[e(AclWho::Role(7), ACL_READ, 0), e(AclWho::Group(9), ACL_READ, 0)])),
            Err(DecodeError::NotCanonical("ACL entries out of order or repeated")),
            "roles after groups"
        );
    }

    #[test]
    fn role_entries_known_answer() {
        // kind 3, role 7, read+write, no flags; after a group entry.
        let entries = vec![e(AclWho::Group(100), ACL_READ, 0), e(AclWho::Role(7), ACL_READ | ACL_WRITE, 0)];
        let mut w = Writer::with_capacity(32);
        encode_acl(&mut w, &entries);
        let bytes = w.into_vec();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "02000264000000040003070000000600");
        assert_eq!(decode_acl(&mut Reader::new(&bytes)).unwrap(), entries);
    }
}
