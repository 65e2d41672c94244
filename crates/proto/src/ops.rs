//! Every operation's arguments and results (NASD Tables 1–3), with their
//! canonical encodings.

use crate::attrs::{AttrMask, Attributes};
use crate::codec::{Reader, Writer};
use crate::limits::*;
use crate::{AuthScheme, DecodeError, ObjectPal, Pal, Protection, Status};

/// Operation codes. The high byte groups them: 0x00 session, 0x01 object,
/// 0x02 partition, 0x03 drive.
pub mod opcode {
    /// Negotiate the protocol version.
    pub const HELLO: u16 = 0x0001;
    /// Create an object.
    pub const CREATE: u16 = 0x0101;
    /// Remove an object.
    pub const REMOVE: u16 = 0x0102;
    /// Read an object's attributes.
    pub const GETATTR: u16 = 0x0103;
    /// Change an object's attributes.
    pub const SETATTR: u16 = 0x0104;
    /// Read scatter-gather regions.
    pub const READ: u16 = 0x0105;
    /// Write scatter-gather regions.
    pub const WRITE: u16 = 0x0106;
    /// Copy-on-write clone of an object.
    pub const FASTCOPY: u16 = 0x0107;
    /// Make a list of objects durable.
    pub const FLUSH: u16 = 0x0108;
    /// Blocks needed to overwrite regions.
    pub const BLOCKS_REQUIRED: u16 = 0x0109;
    /// Open a write transaction on an object.
    pub const TXN_BEGIN: u16 = 0x010A;
    /// End (commit or abort) an object's write transaction.
    pub const TXN_END: u16 = 0x010B;
    /// Replace an object's access PAL and PAL collection.
    pub const SET_PAL: u16 = 0x010C;
    /// Read an object's access PAL and PAL collection.
    pub const GET_PAL: u16 = 0x010D;
    /// List an object's stored (allocated) byte ranges: where it is not a hole.
    pub const EXTENTS: u16 = 0x010E;
    /// Read the stored digests of an object's blocks (no data is read).
    pub const DIGESTS: u16 = 0x010F;
    /// Call a drive extension on an object (`Request::Extension`).
    pub const EXTENSION: u16 = 0x0110;
    /// Create an empty partition.
    pub const CREATE_PARTITION: u16 = 0x0201;
    /// Remove a partition.
    pub const REMOVE_PARTITION: u16 = 0x0202;
    /// Set a partition's quota.
    pub const RESIZE_PARTITION: u16 = 0x0203;
    /// Make a partition durable.
    pub const FLUSH_PARTITION: u16 = 0x0204;
    /// Set a partition key (sealed under the drive key).
    pub const SET_PARTITION_KEY: u16 = 0x0205;
    /// Rotate a partition's working keys (new key sealed under the partition key).
    pub const SET_WORKING_KEY: u16 = 0x0206;
    /// Set the drive's (partition 0) or a partition's minimum protection.
    pub const SET_MIN_PROTECTION: u16 = 0x0207;
    /// List a partition's open write transactions.
    pub const TXN_LIST: u16 = 0x0208;
    /// Raise a partition's minimum cluster map epoch.
    pub const SET_MAP_EPOCH: u16 = 0x0209;
    /// Set which credentials a partition accepts (capabilities, PALs, both).
    pub const SET_AUTH_SCHEME: u16 = 0x020A;
    /// Read which credentials a partition accepts.
    pub const GET_AUTH_SCHEME: u16 = 0x020B;
    /// Replace a PAL collection's super PAL.
    pub const SET_SUPER_PAL: u16 = 0x020C;
    /// Read a PAL collection's super PAL.
    pub const GET_SUPER_PAL: u16 = 0x020D;
    /// Reset the drive: clock, and (with security) the master key.
    pub const INITIALIZE: u16 = 0x0301;
    /// Set the drive key (sealed under the master key).
    pub const SET_DRIVE_KEY: u16 = 0x0302;
    /// Describe the drive.
    pub const INQUIRY: u16 = 0x0303;
    /// Read the audit trail.
    pub const READ_AUDIT: u16 = 0x0304;
    /// Re-read every stored block and check it against its stored digest.
    pub const SCRUB: u16 = 0x0305;
    /// Install an identity key (sealed under the drive key).
    pub const SET_IDENTITY_KEY: u16 = 0x0306;
    /// Forget an identity key: every identity key made with it is refused.
    pub const RETIRE_IDENTITY_KEY: u16 = 0x0307;
    /// Not an operation: the opcode of an audit record that counts requests
    /// the drive did not record one by one (PROTOCOL.md, `READ_AUDIT`).
    pub const NOT_ITEMIZED: u16 = 0x0000;
}

/// Why an audit record with opcode [`opcode::NOT_ITEMIZED`] stands for
/// requests instead of one: its `partition` field.
pub mod not_itemized {
    /// Refusals of requests that proved no key, beyond the rate at which the
    /// drive itemizes them.
    pub const UNAUTHENTICATED_REFUSALS: u64 = 1;
    /// Records that arrived while the drive's audit buffer was full.
    pub const BUFFER_FULL: u64 = 2;
}

/// Object identifiers of the well-known objects (NASD Table 4), present in
/// every partition. Identifiers below [`FIRST_USER_OBJECT`](well_known::FIRST_USER_OBJECT) are reserved.
pub mod well_known {
    /// Drive-global control information (read-only, same in every partition).
    pub const DRIVE_CONTROL: u64 = 1;
    /// The partition's control information (read-only).
    pub const PARTITION_CONTROL: u64 = 2;
    /// The list of object identifiers in the partition (read-only).
    pub const PARTITION_CONTENTS: u64 = 3;
    /// An ordinary object created empty with each partition.
    pub const FIRST_OBJECT: u64 = 4;
    /// The first identifier `create` hands out.
    pub const FIRST_USER_OBJECT: u64 = 16;
}

/// A byte range of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Region {
    /// First byte.
    pub offset: u64,
    /// Number of bytes; never zero.
    pub length: u64,
}

impl Region {
    /// One past the last byte (saturating: only validated regions are
    /// guaranteed to end below `OBJECT_SIZE_MAX`).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.length)
    }
}

/// Checks a request's regions: 1..=`REGIONS_MAX` of them, none empty, none past
/// `OBJECT_SIZE_MAX`, no two overlapping, at most `DATA_LEN_MAX` bytes in all.
/// Returns the total length.
pub fn validate_regions(regions: &[Region]) -> Result<u64, Status> {
    if regions.is_empty() || regions.len() > REGIONS_MAX {
        return Err(Status::LimitExceeded);
    }
    for r in regions {
        if r.length == 0 || r.offset >= OBJECT_SIZE_MAX || r.length > OBJECT_SIZE_MAX - r.offset {
            return Err(Status::RegionOutOfRange);
        }
    }
    let mut sorted = regions.to_vec();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0].end() > w[1].offset) {
        return Err(Status::RegionsOverlap);
    }
    let total: u64 = regions.iter().map(|r| r.length).sum();
    if total > DATA_LEN_MAX {
        return Err(Status::LimitExceeded);
    }
    Ok(total)
}

/// A request's operation and arguments.
///
/// Field names follow NASD Tables 1–3; PROTOCOL.md documents each field.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Offer a range of protocol versions.
    Hello { min_version: u8, max_version: u8, client: String },
    /// Create an object, optionally setting the attributes in `mask`.
    Create { partition: u64, mask: AttrMask, attrs: Attributes },
    /// Remove an object.
    Remove { partition: u64, object: u64 },
    /// Read an object's attributes.
    GetAttr { partition: u64, object: u64 },
    /// Set the attributes in `mask`.
    SetAttr { partition: u64, object: u64, mask: AttrMask, attrs: Attributes },
    /// Read regions; the reply's data is the regions' bytes in order.
    Read { partition: u64, object: u64, regions: Vec<Region> },
    /// Write regions; the request's data is the regions' bytes in order.
    Write { partition: u64, object: u64, regions: Vec<Region> },
    /// Clone `source` copy-on-write.
    FastCopy { partition: u64, source: u64 },
    /// Make the listed objects durable.
    Flush { partition: u64, objects: Vec<u64> },
    /// Blocks that overwriting `regions` would add.
    BlocksRequired { partition: u64, object: u64, regions: Vec<Region> },
    /// The object's stored byte ranges from `offset` on, at most `max`
    /// (≤ `EXTENTS_MAX`): every other byte below its size is a hole.
    Extents { partition: u64, object: u64, offset: u64, max: u16 },
    /// The stored BLAKE3 digests of the object's blocks in `region` (its
    /// offset and length multiples of the drive's block size, at most
    /// `DIGESTS_MAX` blocks; the length at most `DIGESTS_REGION_LEN_MAX`).
    Digests { partition: u64, object: u64, region: Region },
    /// Create an empty (zero-quota) partition.
    CreatePartition { partition: u64 },
    /// Remove a partition; with `force` even if it holds objects.
    RemovePartition { partition: u64, force: bool },
    /// Set a partition's quota in bytes.
    ResizePartition { partition: u64, quota_bytes: u64 },
    /// Make everything in a partition durable.
    FlushPartition { partition: u64 },
    /// Remove every partition and key, set the drive clock, and (if
    /// `sealed_master_key` is not empty) a new master key sealed under the current one.
    Initialize { clock_ns: u64, clock_skew_ns: u64, sealed_master_key: Vec<u8> },
    /// Describe the drive.
    Inquiry,
    /// Set the drive key, sealed under the master key.
    SetDriveKey { sealed_key: Vec<u8> },
    /// Set a partition key, sealed under the drive key.
    SetPartitionKey { partition: u64, sealed_key: Vec<u8> },
    /// Make a new working key current (sealed under the partition key); the
    /// current one becomes previous. `key_version` must exceed the current one.
    SetWorkingKey { partition: u64, key_version: u32, sealed_key: Vec<u8> },
    /// Set the minimum protection of the drive (partition 0) or a partition.
    SetMinProtection { partition: u64, protection: Protection },
    /// Audit records with sequence numbers above `after`, at most `max`.
    ReadAudit { after: u64, max: u16 },
    /// Check every stored block against its digest; report at most
    /// `max_report` corrupt blocks.
    Scrub { max_report: u16 },
    /// Open write transaction `txn` (≠ 0) on an object, remembering its size
    /// and, from then on, the previous mapping of every block it changes.
    TxnBegin { partition: u64, object: u64, txn: u64 },
    /// End transaction `txn` on an object: `commit` keeps its changes, else
    /// they are rolled back.
    TxnEnd { partition: u64, object: u64, txn: u64, commit: bool },
    /// Open transactions of a partition on objects above `after_object`,
    /// ascending, at most `max` (≤ `TXN_LIST_MAX`).
    TxnList { partition: u64, after_object: u64, max: u16 },
    /// Raise the partition's minimum cluster map epoch to `epoch`: every
    /// capability minted under an older map is refused from then on.
    SetMapEpoch { partition: u64, epoch: u32 },
    /// Replace the object's access PAL and PAL collection (0: none).
    SetPal { partition: u64, object: u64, pal: ObjectPal },
    /// The object's access PAL and PAL collection.
    GetPal { partition: u64, object: u64 },
    /// Which credentials the partition accepts for object operations.
    SetAuthScheme { partition: u64, scheme: AuthScheme },
    /// The partition's authorization scheme.
    GetAuthScheme { partition: u64 },
    /// Replace collection `collection`'s (≠ 0) super PAL; an empty list
    /// removes it.
    SetSuperPal { partition: u64, collection: u64, pal: Pal },
    /// Collection `collection`'s super PAL (empty if it has none).
    GetSuperPal { partition: u64, collection: u64 },
    /// Install identity key `key_id`, sealed under the drive key; key ids
    /// only grow.
    SetIdentityKey { key_id: u32, sealed_key: Vec<u8> },
    /// Forget identity key `key_id`.
    RetireIdentityKey { key_id: u32 },
    /// Call extension `name` (one the drive lists in `inquiry`) on an
    /// object, with arguments only the extension reads. Authorized as a read
    /// of the object: an extension sees no object its caller may not read.
    Extension { partition: u64, object: u64, name: String, args: Vec<u8> },
}

impl Request {
    /// The operation code.
    pub fn opcode(&self) -> u16 {
        use opcode::*;
        match self {
            Request::Hello { .. } => HELLO,
            Request::Create { .. } => CREATE,
            Request::Remove { .. } => REMOVE,
            Request::GetAttr { .. } => GETATTR,
            Request::SetAttr { .. } => SETATTR,
            Request::Read { .. } => READ,
            Request::Write { .. } => WRITE,
            Request::FastCopy { .. } => FASTCOPY,
            Request::Flush { .. } => FLUSH,
            Request::BlocksRequired { .. } => BLOCKS_REQUIRED,
            Request::Extents { .. } => EXTENTS,
            Request::Digests { .. } => DIGESTS,
            Request::CreatePartition { .. } => CREATE_PARTITION,
            Request::RemovePartition { .. } => REMOVE_PARTITION,
            Request::ResizePartition { .. } => RESIZE_PARTITION,
            Request::FlushPartition { .. } => FLUSH_PARTITION,
            Request::Initialize { .. } => INITIALIZE,
            Request::Inquiry => INQUIRY,
            Request::SetDriveKey { .. } => SET_DRIVE_KEY,
            Request::SetPartitionKey { .. } => SET_PARTITION_KEY,
            Request::SetWorkingKey { .. } => SET_WORKING_KEY,
            Request::SetMinProtection { .. } => SET_MIN_PROTECTION,
            Request::ReadAudit { .. } => READ_AUDIT,
            Request::Scrub { .. } => SCRUB,
            Request::TxnBegin { .. } => TXN_BEGIN,
            Request::TxnEnd { .. } => TXN_END,
            Request::TxnList { .. } => TXN_LIST,
            Request::SetMapEpoch { .. } => SET_MAP_EPOCH,
            Request::SetPal { .. } => SET_PAL,
            Request::GetPal { .. } => GET_PAL,
            Request::SetAuthScheme { .. } => SET_AUTH_SCHEME,
            Request::GetAuthScheme { .. } => GET_AUTH_SCHEME,
            Request::SetSuperPal { .. } => SET_SUPER_PAL,
            Request::GetSuperPal { .. } => GET_SUPER_PAL,
            Request::SetIdentityKey { .. } => SET_IDENTITY_KEY,
            Request::RetireIdentityKey { .. } => RETIRE_IDENTITY_KEY,
            Request::Extension { .. } => EXTENSION,
        }
    }

    /// The canonical encoding of the arguments.
    pub fn encode_args(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(64);
        match self {
            Request::Hello { min_version, max_version, client } => {
                w.u8(*min_version).u8(*max_version).str(client);
            }
            Request::Create { partition, mask, attrs } => {
                w.u64(*partition).u16(mask.0);
                attrs.masked(*mask).encode(&mut w);
            }
            Request::Remove { partition, object } | Request::GetAttr { partition, object } => {
                w.u64(*partition).u64(*object);
            }
            Request::SetAttr { partition, object, mask, attrs } => {
                w.u64(*partition).u64(*object).u16(mask.0);
                attrs.masked(*mask).encode(&mut w);
            }
            Request::Read { partition, object, regions }
            | Request::Write { partition, object, regions }
            | Request::BlocksRequired { partition, object, regions } => {
                w.u64(*partition).u64(*object);
                encode_regions(&mut w, regions);
            }
            Request::FastCopy { partition, source } => {
                w.u64(*partition).u64(*source);
            }
            Request::Extents { partition, object, offset, max } => {
                w.u64(*partition).u64(*object).u64(*offset).u16(*max);
            }
            Request::Digests { partition, object, region } => {
                w.u64(*partition).u64(*object).u64(region.offset).u64(region.length);
            }
            Request::Flush { partition, objects } => {
                w.u64(*partition).u16(objects.len() as u16);
                for o in objects {
                    w.u64(*o);
                }
            }
            Request::CreatePartition { partition } | Request::FlushPartition { partition } => {
                w.u64(*partition);
            }
            Request::RemovePartition { partition, force } => {
                w.u64(*partition).bool(*force);
            }
            Request::ResizePartition { partition, quota_bytes } => {
                w.u64(*partition).u64(*quota_bytes);
            }
            Request::Initialize { clock_ns, clock_skew_ns, sealed_master_key } => {
                w.u64(*clock_ns).u64(*clock_skew_ns).bytes(sealed_master_key);
            }
            Request::Inquiry => {}
            Request::SetDriveKey { sealed_key } => {
                w.bytes(sealed_key);
            }
            Request::SetPartitionKey { partition, sealed_key } => {
                w.u64(*partition).bytes(sealed_key);
            }
            Request::SetWorkingKey { partition, key_version, sealed_key } => {
                w.u64(*partition).u32(*key_version).bytes(sealed_key);
            }
            Request::SetMinProtection { partition, protection } => {
                w.u64(*partition).u8(protection.bits());
            }
            Request::ReadAudit { after, max } => {
                w.u64(*after).u16(*max);
            }
            Request::Scrub { max_report } => {
                w.u16(*max_report);
            }
            Request::TxnBegin { partition, object, txn } => {
                w.u64(*partition).u64(*object).u64(*txn);
            }
            Request::TxnEnd { partition, object, txn, commit } => {
                w.u64(*partition).u64(*object).u64(*txn).bool(*commit);
            }
            Request::TxnList { partition, after_object, max } => {
                w.u64(*partition).u64(*after_object).u16(*max);
            }
            Request::SetMapEpoch { partition, epoch } => {
                w.u64(*partition).u32(*epoch);
            }
            Request::SetPal { partition, object, pal } => {
                w.u64(*partition).u64(*object);
                pal.encode(&mut w);
            }
            Request::GetPal { partition, object } => {
                w.u64(*partition).u64(*object);
            }
            Request::SetAuthScheme { partition, scheme } => {
                w.u64(*partition).u8(scheme.bits());
            }
            Request::GetAuthScheme { partition } => {
                w.u64(*partition);
            }
            Request::SetSuperPal { partition, collection, pal } => {
                w.u64(*partition).u64(*collection);
                pal.encode(&mut w);
            }
            Request::GetSuperPal { partition, collection } => {
                w.u64(*partition).u64(*collection);
            }
            Request::SetIdentityKey { key_id, sealed_key } => {
                w.u32(*key_id).bytes(sealed_key);
            }
            Request::RetireIdentityKey { key_id } => {
                w.u32(*key_id);
            }
            Request::Extension { partition, object, name, args } => {
                w.u64(*partition).u64(*object).str(name).bytes(args);
            }
        }
        w.into_vec()
    }

    /// Decodes the arguments of operation `opcode`. Rejects unknown opcodes,
    /// over-limit counts, non-canonical values and trailing bytes.
    pub fn decode(opcode: u16, args: &[u8]) -> Result<Request, DecodeError> {
        use opcode::*;
        let mut r = Reader::new(args);
        let req = match opcode {
            HELLO => Request::Hello {
                min_version: r.u8()?,
                max_version: r.u8()?,
                client: r.str(NAME_LEN_MAX, "client name")?,
            },
            CREATE => {
                let partition = r.u64()?;
                let (mask, attrs) = decode_masked_attrs(&mut r)?;
                Request::Create { partition, mask, attrs }
            }
            REMOVE => Request::Remove { partition: r.u64()?, object: r.u64()? },
            GETATTR => Request::GetAttr { partition: r.u64()?, object: r.u64()? },
            SETATTR => {
                let (partition, object) = (r.u64()?, r.u64()?);
                let (mask, attrs) = decode_masked_attrs(&mut r)?;
                Request::SetAttr { partition, object, mask, attrs }
            }
            READ | WRITE | BLOCKS_REQUIRED => {
                let (partition, object) = (r.u64()?, r.u64()?);
                let regions = decode_regions(&mut r)?;
                match opcode {
                    READ => Request::Read { partition, object, regions },
                    WRITE => Request::Write { partition, object, regions },
                    _ => Request::BlocksRequired { partition, object, regions },
                }
            }
            FASTCOPY => Request::FastCopy { partition: r.u64()?, source: r.u64()? },
            EXTENTS => {
                let (partition, object, offset) = (r.u64()?, r.u64()?, r.u64()?);
                let max = r.u16()?;
                if max as usize > EXTENTS_MAX {
                    return Err(DecodeError::OverLimit { field: "extents", len: max as u64, max: EXTENTS_MAX as u64 });
                }
                Request::Extents { partition, object, offset, max }
            }
            DIGESTS => {
                let (partition, object) = (r.u64()?, r.u64()?);
                let region = Region { offset: r.u64()?, length: r.u64()? };
                if region.length > DIGESTS_REGION_LEN_MAX {
                    return Err(DecodeError::OverLimit {
                        field: "digests region",
                        len: region.length,
                        max: DIGESTS_REGION_LEN_MAX,
                    });
                }
                Request::Digests { partition, object, region }
            }
            FLUSH => {
                let partition = r.u64()?;
                let n = r.count(FLUSH_OBJECTS_MAX, "flush objects")?;
                let objects = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
                Request::Flush { partition, objects }
            }
            CREATE_PARTITION => Request::CreatePartition { partition: r.u64()? },
            REMOVE_PARTITION => Request::RemovePartition { partition: r.u64()?, force: r.bool()? },
            RESIZE_PARTITION => Request::ResizePartition { partition: r.u64()?, quota_bytes: r.u64()? },
            FLUSH_PARTITION => Request::FlushPartition { partition: r.u64()? },
            INITIALIZE => Request::Initialize {
                clock_ns: r.u64()?,
                clock_skew_ns: r.u64()?,
                sealed_master_key: r.bytes(SEALED_KEY_LEN_MAX, "sealed master key")?.to_vec(),
            },
            INQUIRY => Request::Inquiry,
            SET_DRIVE_KEY => Request::SetDriveKey { sealed_key: r.bytes(SEALED_KEY_LEN_MAX, "sealed key")?.to_vec() },
            SET_PARTITION_KEY => Request::SetPartitionKey {
                partition: r.u64()?,
                sealed_key: r.bytes(SEALED_KEY_LEN_MAX, "sealed key")?.to_vec(),
            },
            SET_WORKING_KEY => Request::SetWorkingKey {
                partition: r.u64()?,
                key_version: r.u32()?,
                sealed_key: r.bytes(SEALED_KEY_LEN_MAX, "sealed key")?.to_vec(),
            },
            SET_MIN_PROTECTION => {
                Request::SetMinProtection { partition: r.u64()?, protection: Protection::from_bits(r.u8()?)? }
            }
            READ_AUDIT => {
                let after = r.u64()?;
                let max = r.u16()?;
                if max as usize > AUDIT_RECORDS_PER_REPLY_MAX {
                    return Err(DecodeError::OverLimit {
                        field: "audit records",
                        len: max as u64,
                        max: AUDIT_RECORDS_PER_REPLY_MAX as u64,
                    });
                }
                Request::ReadAudit { after, max }
            }
            SCRUB => {
                let max_report = r.u16()?;
                if max_report as usize > SCRUB_REPORT_MAX {
                    return Err(DecodeError::OverLimit {
                        field: "scrub report",
                        len: max_report as u64,
                        max: SCRUB_REPORT_MAX as u64,
                    });
                }
                Request::Scrub { max_report }
            }
            TXN_BEGIN => Request::TxnBegin { partition: r.u64()?, object: r.u64()?, txn: r.u64()? },
            TXN_END => Request::TxnEnd { partition: r.u64()?, object: r.u64()?, txn: r.u64()?, commit: r.bool()? },
            TXN_LIST => {
                let (partition, after_object, max) = (r.u64()?, r.u64()?, r.u16()?);
                if max as usize > TXN_LIST_MAX {
                    return Err(DecodeError::OverLimit {
                        field: "transactions",
                        len: max as u64,
                        max: TXN_LIST_MAX as u64,
                    });
                }
                Request::TxnList { partition, after_object, max }
            }
            SET_MAP_EPOCH => Request::SetMapEpoch { partition: r.u64()?, epoch: r.u32()? },
            SET_PAL => {
                let (partition, object) = (r.u64()?, r.u64()?);
                Request::SetPal { partition, object, pal: ObjectPal::decode(&mut r)? }
            }
            GET_PAL => Request::GetPal { partition: r.u64()?, object: r.u64()? },
            SET_AUTH_SCHEME => Request::SetAuthScheme { partition: r.u64()?, scheme: AuthScheme::from_bits(r.u8()?)? },
            GET_AUTH_SCHEME => Request::GetAuthScheme { partition: r.u64()? },
            SET_SUPER_PAL => {
                let (partition, collection) = (r.u64()?, r.u64()?);
                Request::SetSuperPal { partition, collection, pal: Pal::decode(&mut r)? }
            }
            GET_SUPER_PAL => Request::GetSuperPal { partition: r.u64()?, collection: r.u64()? },
            SET_IDENTITY_KEY => Request::SetIdentityKey {
                key_id: r.u32()?,
                sealed_key: r.bytes(SEALED_KEY_LEN_MAX, "sealed key")?.to_vec(),
            },
            RETIRE_IDENTITY_KEY => Request::RetireIdentityKey { key_id: r.u32()? },
            EXTENSION => Request::Extension {
                partition: r.u64()?,
                object: r.u64()?,
                name: r.str(NAME_LEN_MAX, "extension")?,
                args: r.bytes(EXTENSION_ARGS_MAX, "extension arguments")?.to_vec(),
            },
            other => return Err(DecodeError::UnknownOpcode(other)),
        };
        r.finish()?;
        Ok(req)
    }
}

fn decode_masked_attrs(r: &mut Reader<'_>) -> Result<(AttrMask, Attributes), DecodeError> {
    let mask = AttrMask(r.u16()?);
    if !AttrMask::ALL.contains(mask) {
        return Err(DecodeError::NotCanonical("undefined attribute mask bits"));
    }
    let attrs = Attributes::decode(r)?;
    if attrs.masked(mask) != attrs {
        return Err(DecodeError::NotCanonical("attribute outside the mask is not zero"));
    }
    Ok((mask, attrs))
}

fn encode_regions(w: &mut Writer, regions: &[Region]) {
    w.u16(regions.len() as u16);
    for r in regions {
        w.u64(r.offset).u64(r.length);
    }
}

fn decode_regions(r: &mut Reader<'_>) -> Result<Vec<Region>, DecodeError> {
    let n = r.count(REGIONS_MAX, "regions")?;
    (0..n).map(|_| Ok(Region { offset: r.u64()?, length: r.u64()? })).collect()
}

/// One partition as `inquiry` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    /// Partition identifier.
    pub partition: u64,
    /// Quota in bytes.
    pub quota_bytes: u64,
    /// Bytes charged against the quota.
    pub used_bytes: u64,
    /// Objects in the partition, well-known ones included.
    pub objects: u64,
}

/// What `inquiry` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveInfo {
    /// Who made the drive.
    pub vendor: String,
    /// The drive's model.
    pub model: String,
    /// Software version.
    pub firmware: String,
    /// The drive's unique name (capabilities name it).
    pub drive_id: [u8; 16],
    /// Bytes per block.
    pub block_size: u32,
    /// Bytes the drive may store.
    pub capacity_bytes: u64,
    /// Bytes in use by all partitions.
    pub used_bytes: u64,
    /// Existing partitions.
    pub partitions: Vec<PartitionInfo>,
    /// Names of supported extensions.
    pub extensions: Vec<String>,
    /// The drive's failure domain (≤ `NAME_LEN_MAX` bytes): drives that
    /// share one can fail together (a host, a rack, a power feed), so a
    /// manager places copies of one stripe in different ones. Empty: the
    /// drive alone.
    pub failure_domain: String,
}

/// A successful reply's results. Failed replies carry only an error message.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The version the drive chose, its name, its limits and its block size
    /// (the unit of `HASH_AND_MAC` digests).
    Hello { version: u8, drive_id: [u8; 16], chunk_len_max: u32, regions_max: u16, block_size: u32 },
    /// The new object's identifier and attributes (`create`, `fastcopy`).
    Created { object: u64, attrs: Attributes },
    /// Attributes (`getattr`, `setattr`).
    Attrs(Attributes),
    /// Bytes returned for each region of a read, in order; the data follows.
    Read { lengths: Vec<u64> },
    /// Bytes written.
    Written { length: u64 },
    /// `blocksrequired`'s estimate and maximum.
    BlocksRequired { estimated: u64, maximum: u64 },
    /// `extents`: the object's stored byte ranges from the request's offset
    /// on, ascending, disjoint and not touching, at most `EXTENTS_MAX`; every
    /// stored byte below `covered_end` is in one of them (at or past the
    /// object's size the list is complete).
    Extents { covered_end: u64, extents: Vec<Region> },
    /// `digests`: the object's `logical_size`, and the stored digest of each
    /// block of the request's region below it (rounded up to whole blocks),
    /// in order, at most `DIGESTS_MAX`; a hole's is the digest of a block of
    /// zeros.
    Digests { logical_size: u64, digests: Vec<[u8; DIGEST_LEN]> },
    /// Drive description.
    Inquiry(DriveInfo),
    /// Audit records, oldest first.
    Audit { records: Vec<AuditRecord> },
    /// What a scrub found: blocks checked, corrupt blocks in all, and the
    /// first of them as (partition, object, logical block).
    Scrub { blocks_checked: u64, corrupt_total: u64, corrupt: Vec<(u64, u64, u64)> },
    /// Whether the transaction `txn_end` named was open.
    TxnEnded { was_open: bool },
    /// Open transactions, ascending by object (`txn_list`).
    Txns { txns: Vec<OpenTxn> },
    /// An object's access PAL and PAL collection (`get_pal`).
    Pal(ObjectPal),
    /// A collection's super PAL (`get_super_pal`).
    SuperPal(Pal),
    /// A partition's authorization scheme (`get_auth_scheme`).
    AuthScheme(AuthScheme),
    /// What an extension answered (`extension`), in its own encoding.
    Extension { result: Vec<u8> },
    /// No results.
    Done,
}

/// One open write transaction as `txn_list` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenTxn {
    /// The object it is open on.
    pub object: u64,
    /// The transaction identifier `txn_begin` named.
    pub txn: u64,
    /// The drive clock when it began, nanoseconds.
    pub begun_ns: u64,
}

/// One entry of a drive's audit trail.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// Increasing sequence number.
    pub sequence: u64,
    /// Drive clock, nanoseconds.
    pub time_ns: u64,
    /// The capability's audit id; 0 for key-hierarchy requests.
    pub audit_id: u64,
    pub key_type: u8,
    pub opcode: u16,
    /// The reply status (0 = authorized and done).
    pub status: u16,
    pub partition: u64,
    pub object: u64,
    /// The first region of the request, or (0, 0).
    pub region: Region,
}

impl AuditRecord {
    fn encode(&self, w: &mut Writer) {
        w.u64(self.sequence).u64(self.time_ns).u64(self.audit_id).u8(self.key_type).u16(self.opcode);
        w.u16(self.status).u64(self.partition).u64(self.object).u64(self.region.offset).u64(self.region.length);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(AuditRecord {
            sequence: r.u64()?,
            time_ns: r.u64()?,
            audit_id: r.u64()?,
            key_type: r.u8()?,
            opcode: r.u16()?,
            status: r.u16()?,
            partition: r.u64()?,
            object: r.u64()?,
            region: Region { offset: r.u64()?, length: r.u64()? },
        })
    }
}

impl Reply {
    /// The canonical encoding of the results.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(64);
        match self {
            Reply::Hello { version, drive_id, chunk_len_max, regions_max, block_size } => {
                w.u8(*version).raw(drive_id).u32(*chunk_len_max).u16(*regions_max).u32(*block_size);
            }
            Reply::Created { object, attrs } => {
                w.u64(*object);
                attrs.encode(&mut w);
            }
            Reply::Attrs(a) => a.encode(&mut w),
            Reply::Read { lengths } => {
                w.u16(lengths.len() as u16);
                for l in lengths {
                    w.u64(*l);
                }
            }
            Reply::Written { length } => {
                w.u64(*length);
            }
            Reply::BlocksRequired { estimated, maximum } => {
                w.u64(*estimated).u64(*maximum);
            }
            Reply::Extents { covered_end, extents } => {
                w.u64(*covered_end).u16(extents.len() as u16);
                for e in extents {
                    w.u64(e.offset).u64(e.length);
                }
            }
            Reply::Digests { logical_size, digests } => {
                w.u64(*logical_size).u16(digests.len() as u16);
                for d in digests {
                    w.raw(d);
                }
            }
            Reply::Inquiry(d) => {
                w.str(&d.vendor).str(&d.model).str(&d.firmware).raw(&d.drive_id);
                w.u32(d.block_size).u64(d.capacity_bytes).u64(d.used_bytes);
                w.u16(d.partitions.len() as u16);
                for p in &d.partitions {
                    w.u64(p.partition).u64(p.quota_bytes).u64(p.used_bytes).u64(p.objects);
                }
                w.u16(d.extensions.len() as u16);
                for e in &d.extensions {
                    w.str(e);
                }
                w.str(&d.failure_domain);
            }
            Reply::Audit { records } => {
                w.u16(records.len() as u16);
                for rec in records {
                    rec.encode(&mut w);
                }
            }
            Reply::Scrub { blocks_checked, corrupt_total, corrupt } => {
                w.u64(*blocks_checked).u64(*corrupt_total).u16(corrupt.len() as u16);
                for (p, o, b) in corrupt {
                    w.u64(*p).u64(*o).u64(*b);
                }
            }
            Reply::TxnEnded { was_open } => {
                w.bool(*was_open);
            }
            Reply::Txns { txns } => {
                w.u16(txns.len() as u16);
                for t in txns {
                    w.u64(t.object).u64(t.txn).u64(t.begun_ns);
                }
            }
            Reply::Pal(p) => p.encode(&mut w),
            Reply::SuperPal(p) => p.encode(&mut w),
            Reply::AuthScheme(s) => {
                w.u8(s.bits());
            }
            Reply::Extension { result } => {
                w.bytes(result);
            }
            Reply::Done => {}
        }
        w.into_vec()
    }

    /// Decodes the results of a successful reply to operation `opcode`.
    pub fn decode(opcode: u16, args: &[u8]) -> Result<Reply, DecodeError> {
        use opcode::*;
        let mut r = Reader::new(args);
        let reply = match opcode {
            HELLO => Reply::Hello {
                version: r.u8()?,
                drive_id: r.array()?,
                chunk_len_max: r.u32()?,
                regions_max: r.u16()?,
                block_size: r.u32()?,
            },
            CREATE | FASTCOPY => Reply::Created { object: r.u64()?, attrs: Attributes::decode(&mut r)? },
            GETATTR | SETATTR => Reply::Attrs(Attributes::decode(&mut r)?),
            READ => {
                let n = r.count(REGIONS_MAX, "read lengths")?;
                Reply::Read { lengths: (0..n).map(|_| r.u64()).collect::<Result<_, _>>()? }
            }
            WRITE => Reply::Written { length: r.u64()? },
            BLOCKS_REQUIRED => Reply::BlocksRequired { estimated: r.u64()?, maximum: r.u64()? },
            EXTENTS => decode_extents(&mut r)?,
            DIGESTS => {
                let logical_size = r.u64()?;
                let n = r.count(DIGESTS_MAX, "digests")?;
                let digests = (0..n).map(|_| r.array::<DIGEST_LEN>()).collect::<Result<Vec<_>, _>>()?;
                Reply::Digests { logical_size, digests }
            }
            INQUIRY => Reply::Inquiry(decode_drive_info(&mut r)?),
            READ_AUDIT => {
                let n = r.count(AUDIT_RECORDS_PER_REPLY_MAX, "audit records")?;
                Reply::Audit { records: (0..n).map(|_| AuditRecord::decode(&mut r)).collect::<Result<_, _>>()? }
            }
            SCRUB => {
                let blocks_checked = r.u64()?;
                let corrupt_total = r.u64()?;
                let n = r.count(SCRUB_REPORT_MAX, "scrub report")?;
                let corrupt = (0..n).map(|_| Ok((r.u64()?, r.u64()?, r.u64()?))).collect::<Result<_, DecodeError>>()?;
                Reply::Scrub { blocks_checked, corrupt_total, corrupt }
            }
            TXN_END => Reply::TxnEnded { was_open: r.bool()? },
            TXN_LIST => {
                let n = r.count(TXN_LIST_MAX, "transactions")?;
                let txns = (0..n)
                    .map(|_| Ok(OpenTxn { object: r.u64()?, txn: r.u64()?, begun_ns: r.u64()? }))
                    .collect::<Result<_, DecodeError>>()?;
                Reply::Txns { txns }
            }
            GET_PAL => Reply::Pal(ObjectPal::decode(&mut r)?),
            GET_SUPER_PAL => Reply::SuperPal(Pal::decode(&mut r)?),
            GET_AUTH_SCHEME => Reply::AuthScheme(AuthScheme::from_bits(r.u8()?)?),
            EXTENSION => Reply::Extension { result: r.bytes(EXTENSION_RESULT_MAX, "extension result")?.to_vec() },
            REMOVE | FLUSH | CREATE_PARTITION | REMOVE_PARTITION | RESIZE_PARTITION | FLUSH_PARTITION | INITIALIZE
            | SET_DRIVE_KEY | SET_PARTITION_KEY | SET_WORKING_KEY | SET_MIN_PROTECTION | TXN_BEGIN | SET_MAP_EPOCH
            | SET_PAL | SET_AUTH_SCHEME | SET_SUPER_PAL | SET_IDENTITY_KEY | RETIRE_IDENTITY_KEY => Reply::Done,
            other => return Err(DecodeError::UnknownOpcode(other)),
        };
        r.finish()?;
        Ok(reply)
    }
}

/// An `extents` reply: each extent non-empty, within `covered_end`, and
/// after the previous one with a gap (extents are coalesced).
fn decode_extents(r: &mut Reader<'_>) -> Result<Reply, DecodeError> {
    let covered_end = r.u64()?;
    let n = r.count(EXTENTS_MAX, "extents")?;
    let mut extents: Vec<Region> = Vec::with_capacity(n);
    for _ in 0..n {
        let e = Region { offset: r.u64()?, length: r.u64()? };
        let after_previous = extents.last().is_none_or(|p| p.end() < e.offset);
        if e.length == 0 || e.offset.checked_add(e.length).is_none_or(|end| end > covered_end) || !after_previous {
            return Err(DecodeError::NotCanonical("extents: empty, overlapping, touching, or past covered_end"));
        }
        extents.push(e);
    }
    Ok(Reply::Extents { covered_end, extents })
}

fn decode_drive_info(r: &mut Reader<'_>) -> Result<DriveInfo, DecodeError> {
    let vendor = r.str(NAME_LEN_MAX, "vendor")?;
    let model = r.str(NAME_LEN_MAX, "model")?;
    let firmware = r.str(NAME_LEN_MAX, "firmware")?;
    let drive_id = r.array()?;
    let block_size = r.u32()?;
    let capacity_bytes = r.u64()?;
    let used_bytes = r.u64()?;
    let n = r.count(PARTITIONS_MAX, "partitions")?;
    let partitions = (0..n)
        .map(|_| {
            Ok(PartitionInfo { partition: r.u64()?, quota_bytes: r.u64()?, used_bytes: r.u64()?, objects: r.u64()? })
        })
        .collect::<Result<_, DecodeError>>()?;
    let n = r.count(EXTENSIONS_MAX, "extensions")?;
    let extensions = (0..n).map(|_| r.str(NAME_LEN_MAX, "extension")).collect::<Result<_, _>>()?;
    let failure_domain = r.str(NAME_LEN_MAX, "failure domain")?;
    Ok(DriveInfo {
        vendor,
        model,
        firmware,
        drive_id,
        block_size,
        capacity_bytes,
        used_bytes,
        partitions,
        extensions,
        failure_domain,
    })
}

/// Encodes a failed reply's arguments: the human-readable message, truncated
/// to `ERROR_MESSAGE_LEN_MAX` bytes on a character boundary.
pub fn encode_error_message(message: &str) -> Vec<u8> {
    let mut end = message.len().min(ERROR_MESSAGE_LEN_MAX);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let mut w = Writer::with_capacity(end + 2);
    w.str(&message[..end]);
    w.into_vec()
}

/// Decodes a failed reply's message.
pub fn decode_error_message(args: &[u8]) -> Result<String, DecodeError> {
    let mut r = Reader::new(args);
    let s = r.str(ERROR_MESSAGE_LEN_MAX, "error message")?;
    r.finish()?;
    Ok(s)
}

/// Contents of the drive-control object (well-known object 1), version 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveControl {
    /// Bytes per block.
    pub block_size: u32,
    /// Bytes the drive may store.
    pub capacity_bytes: u64,
    /// Bytes in use by all partitions.
    pub allocated_bytes: u64,
    /// Number of partitions.
    pub partitions: u32,
    /// The drive clock when the object was read, nanoseconds.
    pub clock_ns: u64,
    /// Allowed clock skew for nonces, nanoseconds.
    pub clock_skew_ns: u64,
    /// Names of supported extensions.
    pub extensions: Vec<String>,
}

/// Format version of the control objects' encodings.
pub const CONTROL_FORMAT_VERSION: u32 = 1;

impl DriveControl {
    /// The published byte format.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(64);
        w.u32(CONTROL_FORMAT_VERSION).u32(self.block_size).u64(self.capacity_bytes).u64(self.allocated_bytes);
        w.u32(self.partitions).u64(self.clock_ns).u64(self.clock_skew_ns);
        w.u16(self.extensions.len() as u16);
        for e in &self.extensions {
            w.str(e);
        }
        w.into_vec()
    }
    /// Parses the published byte format.
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(buf);
        if r.u32()? != CONTROL_FORMAT_VERSION {
            return Err(DecodeError::NotCanonical("unknown control format"));
        }
        let mut d = DriveControl {
            block_size: r.u32()?,
            capacity_bytes: r.u64()?,
            allocated_bytes: r.u64()?,
            partitions: r.u32()?,
            clock_ns: r.u64()?,
            clock_skew_ns: r.u64()?,
            extensions: Vec::new(),
        };
        let n = r.count(EXTENSIONS_MAX, "extensions")?;
        d.extensions = (0..n).map(|_| r.str(NAME_LEN_MAX, "extension")).collect::<Result<_, _>>()?;
        r.finish()?;
        Ok(d)
    }
}

/// Contents of a partition-control object (well-known object 2), version 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionControl {
    /// Quota in bytes.
    pub quota_bytes: u64,
    /// Bytes charged against the quota.
    pub used_bytes: u64,
    /// Objects in use, well-known ones included.
    pub objects_in_use: u64,
    /// Most objects the partition may hold.
    pub objects_max: u64,
}

impl PartitionControl {
    /// The published byte format.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(36);
        w.u32(CONTROL_FORMAT_VERSION).u64(self.quota_bytes).u64(self.used_bytes);
        w.u64(self.objects_in_use).u64(self.objects_max);
        w.into_vec()
    }
    /// Parses the published byte format.
    pub fn decode(buf: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(buf);
        if r.u32()? != CONTROL_FORMAT_VERSION {
            return Err(DecodeError::NotCanonical("unknown control format"));
        }
        let p = PartitionControl {
            quota_bytes: r.u64()?,
            used_bytes: r.u64()?,
            objects_in_use: r.u64()?,
            objects_max: r.u64()?,
        };
        r.finish()?;
        Ok(p)
    }
}
