//! Object attributes (NASD Table 5) and the mask that says which ones a
//! `create` or `setattr` sets.

use crate::codec::{Reader, Writer};
use crate::limits::FS_SPECIFIC_LEN;
use crate::DecodeError;

/// Encoded size of [`Attributes`].
pub const ATTRIBUTES_LEN: usize = 11 * 8 + 4 + 4 + FS_SPECIFIC_LEN;

/// Every attribute of an object. Times are nanoseconds since the Unix epoch on
/// the drive's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// Changing it revokes every capability for the object.
    pub access_control_version: u64,
    /// Placement hint: store this object near that one (0: none).
    pub nearby_object: u64,
    /// The object this one was fast-copied from (0: none). Set by the drive.
    pub copied_object: u64,
    /// One past the largest byte offset written (or set by `setattr`).
    pub logical_size: u64,
    /// Blocks reserved for this object against the partition quota.
    pub blocks_allocated: u64,
    /// Blocks this object's data occupies; blocks shared by copy-on-write
    /// clones are split between them. Set by the drive.
    pub blocks_used: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// When the object was created. Set by the drive.
    pub create_time: u64,
    /// When the data last changed. Set by the drive.
    pub data_modify_time: u64,
    /// When an attribute last changed. Set by the drive.
    pub attribute_modify_time: u64,
    /// Like `data_modify_time`, but a file system may set it.
    pub fs_data_modify_time: u64,
    /// Like `attribute_modify_time`, but a file system may set it.
    pub fs_attribute_modify_time: u64,
    /// Bytes the drive stores and never interprets.
    pub fs_specific: [u8; FS_SPECIFIC_LEN],
}

impl Default for Attributes {
    fn default() -> Self {
        Attributes {
            access_control_version: 0,
            nearby_object: 0,
            copied_object: 0,
            logical_size: 0,
            blocks_allocated: 0,
            blocks_used: 0,
            block_size: 0,
            create_time: 0,
            data_modify_time: 0,
            attribute_modify_time: 0,
            fs_data_modify_time: 0,
            fs_attribute_modify_time: 0,
            fs_specific: [0; FS_SPECIFIC_LEN],
        }
    }
}

impl Attributes {
    /// Appends the fixed-size encoding.
    pub fn encode(&self, w: &mut Writer) {
        w.u64(self.access_control_version)
            .u64(self.nearby_object)
            .u64(self.copied_object)
            .u64(self.logical_size)
            .u64(self.blocks_allocated)
            .u64(self.blocks_used)
            .u32(self.block_size)
            .u32(0)
            .u64(self.create_time)
            .u64(self.data_modify_time)
            .u64(self.attribute_modify_time)
            .u64(self.fs_data_modify_time)
            .u64(self.fs_attribute_modify_time)
            .raw(&self.fs_specific);
    }

    /// Reads the fixed-size encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mut a = Attributes {
            access_control_version: r.u64()?,
            nearby_object: r.u64()?,
            copied_object: r.u64()?,
            logical_size: r.u64()?,
            blocks_allocated: r.u64()?,
            blocks_used: r.u64()?,
            block_size: r.u32()?,
            ..Attributes::default()
        };
        if r.u32()? != 0 {
            return Err(DecodeError::NotCanonical("reserved attribute field is not zero"));
        }
        a.create_time = r.u64()?;
        a.data_modify_time = r.u64()?;
        a.attribute_modify_time = r.u64()?;
        a.fs_data_modify_time = r.u64()?;
        a.fs_attribute_modify_time = r.u64()?;
        a.fs_specific = r.array()?;
        Ok(a)
    }

    /// Copies the fields named by `mask` from `src`.
    pub fn apply(&mut self, mask: AttrMask, src: &Attributes) {
        let m = |bit: AttrMask| mask.contains(bit);
        if m(AttrMask::ACCESS_CONTROL_VERSION) {
            self.access_control_version = src.access_control_version;
        }
        if m(AttrMask::NEARBY_OBJECT) {
            self.nearby_object = src.nearby_object;
        }
        if m(AttrMask::COPIED_OBJECT) {
            self.copied_object = src.copied_object;
        }
        if m(AttrMask::LOGICAL_SIZE) {
            self.logical_size = src.logical_size;
        }
        if m(AttrMask::BLOCKS_ALLOCATED) {
            self.blocks_allocated = src.blocks_allocated;
        }
        if m(AttrMask::BLOCKS_USED) {
            self.blocks_used = src.blocks_used;
        }
        if m(AttrMask::BLOCK_SIZE) {
            self.block_size = src.block_size;
        }
        if m(AttrMask::CREATE_TIME) {
            self.create_time = src.create_time;
        }
        if m(AttrMask::DATA_MODIFY_TIME) {
            self.data_modify_time = src.data_modify_time;
        }
        if m(AttrMask::ATTRIBUTE_MODIFY_TIME) {
            self.attribute_modify_time = src.attribute_modify_time;
        }
        if m(AttrMask::FS_DATA_MODIFY_TIME) {
            self.fs_data_modify_time = src.fs_data_modify_time;
        }
        if m(AttrMask::FS_ATTRIBUTE_MODIFY_TIME) {
            self.fs_attribute_modify_time = src.fs_attribute_modify_time;
        }
        if m(AttrMask::FS_SPECIFIC) {
            self.fs_specific = src.fs_specific;
        }
    }

    /// A copy with only the fields named by `mask`, the rest zero: the
    /// canonical form of a `create`/`setattr` argument.
    pub fn masked(&self, mask: AttrMask) -> Attributes {
        let mut out = Attributes::default();
        out.apply(mask, self);
        out
    }
}

/// Which attributes a `create` or `setattr` sets: one bit per field of
/// [`Attributes`], in field order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttrMask(pub u16);

impl AttrMask {
    /// `access_control_version`.
    pub const ACCESS_CONTROL_VERSION: AttrMask = AttrMask(1 << 0);
    /// `nearby_object`.
    pub const NEARBY_OBJECT: AttrMask = AttrMask(1 << 1);
    /// `copied_object` (drive-maintained: never settable).
    pub const COPIED_OBJECT: AttrMask = AttrMask(1 << 2);
    /// `logical_size`: truncates or extends (with a hole).
    pub const LOGICAL_SIZE: AttrMask = AttrMask(1 << 3);
    /// `blocks_allocated`: reserves quota.
    pub const BLOCKS_ALLOCATED: AttrMask = AttrMask(1 << 4);
    /// `blocks_used` (drive-maintained: never settable).
    pub const BLOCKS_USED: AttrMask = AttrMask(1 << 5);
    /// `block_size`: only to the drive's block size.
    pub const BLOCK_SIZE: AttrMask = AttrMask(1 << 6);
    /// `create_time` (drive-maintained: never settable).
    pub const CREATE_TIME: AttrMask = AttrMask(1 << 7);
    /// `data_modify_time` (drive-maintained: never settable).
    pub const DATA_MODIFY_TIME: AttrMask = AttrMask(1 << 8);
    /// `attribute_modify_time` (drive-maintained: never settable).
    pub const ATTRIBUTE_MODIFY_TIME: AttrMask = AttrMask(1 << 9);
    /// `fs_data_modify_time`.
    pub const FS_DATA_MODIFY_TIME: AttrMask = AttrMask(1 << 10);
    /// `fs_attribute_modify_time`.
    pub const FS_ATTRIBUTE_MODIFY_TIME: AttrMask = AttrMask(1 << 11);
    /// `fs_specific`.
    pub const FS_SPECIFIC: AttrMask = AttrMask(1 << 12);
    /// Every defined bit.
    pub const ALL: AttrMask = AttrMask((1 << 13) - 1);
    /// The attributes only the drive may set.
    pub const DRIVE_MAINTAINED: AttrMask = AttrMask(
        Self::COPIED_OBJECT.0
            | Self::BLOCKS_USED.0
            | Self::CREATE_TIME.0
            | Self::DATA_MODIFY_TIME.0
            | Self::ATTRIBUTE_MODIFY_TIME.0,
    );

    /// True if every bit of `other` is set.
    pub fn contains(self, other: AttrMask) -> bool {
        self.0 & other.0 == other.0
    }
    /// True if any bit of `other` is set.
    pub fn intersects(self, other: AttrMask) -> bool {
        self.0 & other.0 != 0
    }
    /// The union.
    pub fn union(self, other: AttrMask) -> AttrMask {
        AttrMask(self.0 | other.0)
    }
    /// True if no bit is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}
