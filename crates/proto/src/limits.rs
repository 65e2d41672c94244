//! Every bound the protocol places on a peer, as a named constant.
//!
//! A decoder checks each count or length against one of these before it drives
//! a loop or an allocation, so a hostile peer can cost a drive at most these
//! amounts of memory and work per request.

/// Size of the fixed frame header, in bytes.
pub const HEADER_LEN: usize = 56;
/// Size of the request/reply digest that follows the arguments, in bytes.
pub const DIGEST_LEN: usize = 32;
/// Size of a nonce, in bytes (8 bytes of drive-clock nanoseconds, 8 of sequence).
pub const NONCE_LEN: usize = 16;
/// Size of the tag that follows each data chunk when the data is protected.
pub const DATA_TAG_LEN: usize = 32;
/// Longest trace id a request may carry (frame version 2, manager `TRACED`),
/// in bytes: a label for the logs, costing each logged line that much.
pub const TRACE_ID_LEN_MAX: usize = 64;
/// Largest encoded capability a frame may carry. Costs that much per request.
pub const CAPABILITY_LEN_MAX: usize = 512;
/// Largest operation-argument block. Bounds the memory a drive buffers before
/// it has verified a request.
pub const ARGS_LEN_MAX: usize = 64 * 1024;
/// Largest data payload of one request or reply. Data streams in chunks, so
/// this bounds time and disk, not memory.
pub const DATA_LEN_MAX: u64 = 64 * 1024 * 1024 * 1024;
/// Smallest data chunk a sender may choose (except the last chunk of a payload).
pub const CHUNK_LEN_MIN: u32 = 512;
/// Largest data chunk. Bounds the receiver's per-transfer buffer.
pub const CHUNK_LEN_MAX: u32 = 4 * 1024 * 1024;
/// Default data chunk length used by nasd's own senders.
pub const CHUNK_LEN_DEFAULT: u32 = 256 * 1024;
/// Smallest block size a drive may have (a power of two). A client refuses a
/// `HELLO` that names a block size outside `BLOCK_SIZE_MIN..=BLOCK_SIZE_MAX`
/// or not a power of two.
pub const BLOCK_SIZE_MIN: u32 = 4096;
/// Largest block size a drive may have (a power of two). Bounds the buffer a
/// drive reads a block into, and the stored-digest unit of Hash-and-MAC.
pub const BLOCK_SIZE_MAX: u32 = 1024 * 1024;
/// Most scatter-gather regions in one read, write or blocksrequired.
pub const REGIONS_MAX: usize = 1024;
/// Most object identifiers in one flush.
pub const FLUSH_OBJECTS_MAX: usize = 1024;
/// Largest byte offset (exclusive) any object may have: 2^48 bytes (256 TiB).
/// Keeps every `offset + length` far from u64 overflow.
pub const OBJECT_SIZE_MAX: u64 = 1 << 48;
/// Size of the `fs_specific` attribute, uninterpreted by the drive.
pub const FS_SPECIFIC_LEN: usize = 256;
/// Longest UTF-8 string field (names, vendor, model), in bytes.
pub const NAME_LEN_MAX: usize = 64;
/// Longest error message in a failed reply, in bytes.
pub const ERROR_MESSAGE_LEN_MAX: usize = 512;
/// Most partitions a drive holds (and lists in `inquiry`).
pub const PARTITIONS_MAX: usize = 1024;
/// Most extension names a drive lists in `inquiry`.
pub const EXTENSIONS_MAX: usize = 32;
/// Largest argument block of one `extension` call, in bytes.
pub const EXTENSION_ARGS_MAX: usize = 32 * 1024;
/// Largest result an extension returns, in bytes.
pub const EXTENSION_RESULT_MAX: usize = 1024;
/// Most read hints one `prefetch-v1` call carries (20 bytes each).
pub const PREFETCH_HINTS_PER_CALL_MAX: usize = 1024;
/// Largest sealed key blob carried by key-management operations.
pub const SEALED_KEY_LEN_MAX: usize = 128;

/// Most audit records in one `readaudit` reply (61 bytes each).
pub const AUDIT_RECORDS_PER_REPLY_MAX: usize = 512;

/// Most corrupt blocks one `scrub` reply lists (24 bytes each).
pub const SCRUB_REPORT_MAX: usize = 1024;

/// Most open transactions one `txn_list` reply lists (24 bytes each).
pub const TXN_LIST_MAX: usize = 1024;

/// Most extents one `extents` reply lists (16 bytes each: 16 KiB).
pub const EXTENTS_MAX: usize = 1024;

/// Most block digests one `digests` reply carries (32 bytes each: 32 KiB).
pub const DIGESTS_MAX: usize = 1024;

/// Longest region one `digests` request may name: `DIGESTS_MAX` blocks of
/// the largest block size (1 GiB). The drive bounds it further by its own
/// block size.
pub const DIGESTS_REGION_LEN_MAX: u64 = DIGESTS_MAX as u64 * BLOCK_SIZE_MAX as u64;

/// Most entries in one pre-authorization list (an object's access PAL or a
/// collection's super PAL), 9 bytes each on the wire. A PAL is kept inline
/// with its object, in the drive's memory and its metadata row, and read on
/// every request by identity without disk I/O: this bounds both (DSFS §4.2
/// keeps 32 entries in the onode). A longer list is refused with
/// `PAL_OVERFLOW`; the manager folds users into roles instead.
pub const PAL_ENTRIES_MAX: usize = 32;
/// Largest encoded PAL: a `u16` count and `PAL_ENTRIES_MAX` 9-byte entries.
pub const PAL_LEN_MAX: usize = 2 + PAL_ENTRIES_MAX * 9;
/// Most PAL collections (super PALs) one partition holds: bounds the
/// drive's memory for them at about `PAL_COLLECTIONS_MAX` × `PAL_LEN_MAX`
/// per partition.
pub const PAL_COLLECTIONS_MAX: usize = 1024;
/// Most identity keys (the shared keys K of DSFS, by key id) a drive holds
/// at once: rotation installs a new one before retiring the old.
pub const IDENTITY_KEYS_MAX: usize = 8;

const _: () = assert!(AUDIT_RECORDS_PER_REPLY_MAX * 61 + 2 <= ARGS_LEN_MAX);
const _: () = assert!(SCRUB_REPORT_MAX * 24 + 18 <= ARGS_LEN_MAX);
const _: () = assert!(TXN_LIST_MAX * 24 + 2 <= ARGS_LEN_MAX);
const _: () = assert!(EXTENTS_MAX * 16 + 10 <= ARGS_LEN_MAX && EXTENTS_MAX <= u16::MAX as usize);
const _: () = assert!(DIGESTS_MAX * DIGEST_LEN + 10 <= ARGS_LEN_MAX && DIGESTS_MAX <= u16::MAX as usize);
// A SET_PAL request (partition, object, collection, the list) fits the arguments.
const _: () = assert!(24 + PAL_LEN_MAX <= ARGS_LEN_MAX);
// A PAL's count is a u16.
const _: () = assert!(PAL_ENTRIES_MAX <= u16::MAX as usize);
const _: () = assert!(CHUNK_LEN_MIN as usize <= CHUNK_LEN_DEFAULT as usize);
const _: () = assert!(CHUNK_LEN_DEFAULT <= CHUNK_LEN_MAX);
const _: () = assert!(BLOCK_SIZE_MIN.is_power_of_two() && BLOCK_SIZE_MAX.is_power_of_two());
const _: () = assert!(BLOCK_SIZE_MIN <= BLOCK_SIZE_MAX);
// A drive's reply chunk can always hold a whole block (see the drive's default chunk length).
const _: () = assert!(BLOCK_SIZE_MAX <= CHUNK_LEN_MAX);
const _: () = assert!(REGIONS_MAX * 16 + 64 <= ARGS_LEN_MAX);
const _: () = assert!(FLUSH_OBJECTS_MAX * 8 + 64 <= ARGS_LEN_MAX);
const _: () = assert!(DATA_LEN_MAX < OBJECT_SIZE_MAX);
// An inquiry reply: partitions, extensions, and at most 1024 bytes for its
// four strings (vendor, model, firmware, failure domain) and fixed fields.
const _: () = assert!(4 * (NAME_LEN_MAX + 2) + 16 + 4 + 8 + 8 + 2 + 2 <= 1024);
const _: () = assert!(2 * 8 + NAME_LEN_MAX + 4 + EXTENSION_ARGS_MAX <= ARGS_LEN_MAX);
const _: () = assert!(1 + 8 + 2 + PREFETCH_HINTS_PER_CALL_MAX * 20 <= EXTENSION_ARGS_MAX);
const _: () = assert!(PARTITIONS_MAX * 32 + EXTENSIONS_MAX * (NAME_LEN_MAX + 2) + 1024 <= ARGS_LEN_MAX);
