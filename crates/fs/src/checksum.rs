//! A file's checksum from the digests the drives stored with its blocks
//! (`DIGESTS`), with no data read at the drives and none hashed here but
//! the bytes the manager keeps below the small-file threshold.
//!
//! The checksum is BLAKE3 in key-derivation mode under the context
//! [`CHECKSUM_CONTEXT`] over, in order: the layout's wire encoding; the
//! file's size and its small-file threshold (`u64` little-endian each); the
//! BLAKE3 digest of the bytes below the threshold (`min(size, threshold)`
//! bytes, from the manager); then, for each data column holding bytes, its
//! number (`u32`), its drive's block size (`u32`), its block count (`u64`)
//! and its blocks' stored digests in order (see
//! [`nasd_stripe::ColumnDigests`]).
//!
//! **What it depends on.** Two files have equal checksums when their bytes
//! are equal **and** they have the same layout (scheme, columns, stripe
//! unit), the same small-file threshold, and their data columns are on
//! drives of the same block sizes — whatever order or pieces they were
//! written in, with holes or written zeros alike (a hole's digest is that
//! of a block of zeros, as the bytes read). It is not a digest of the bytes
//! alone: equal bytes under another layout or block size give another
//! checksum. It changes when any byte or the size changes (up to a BLAKE3
//! collision among the block digests). It relies on the drives' invariant
//! that stored bytes past an object's size are zero, and on the manager
//! setting every component's size when the file's changes; a drive that
//! lies about its digests (it is trusted with the data anyway) gives a
//! wrong checksum, and a block that rotted since it was written still
//! answers with the digest of what was written.

use nasd_proto::codec::Writer;
use nasd_proto::layout::Layout;
use nasd_stripe::ColumnDigests;

/// BLAKE3's key-derivation context of the file checksum.
pub const CHECKSUM_CONTEXT: &str = "nasd 2026 file checksum v1";

/// The checksum of a file of `size` bytes and `layout` whose first
/// `min(size, small)` bytes are `head` (kept by the manager) and whose data
/// columns stored the digests `columns` (those holding bytes, in column
/// order), as the module documentation describes.
pub fn file_checksum(layout: Layout, size: u64, small: u64, head: &[u8], columns: &[ColumnDigests]) -> [u8; 32] {
    assert_eq!(head.len() as u64, size.min(small), "the head is the bytes below the small-file threshold");
    let mut w = Writer::with_capacity(64);
    layout.encode(&mut w);
    let mut h = blake3::Hasher::new_derive_key(CHECKSUM_CONTEXT);
    h.update(&w.into_vec());
    h.update(&size.to_le_bytes());
    h.update(&small.to_le_bytes());
    h.update(blake3::hash(head).as_bytes());
    for c in columns {
        h.update(&(c.column as u32).to_le_bytes());
        h.update(&c.block_size.to_le_bytes());
        h.update(&(c.digests.len() as u64).to_le_bytes());
        for d in &c.digests {
            h.update(d);
        }
    }
    *h.finalize().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(column: usize, digests: &[u8]) -> ColumnDigests {
        ColumnDigests { column, block_size: 4096, digests: digests.iter().map(|&b| [b; 32]).collect() }
    }

    #[test]
    fn every_input_changes_the_checksum() {
        let layout = Layout::parse("stripe:2@64K").unwrap();
        let cols = [column(0, &[1, 2]), column(1, &[3])];
        let base = file_checksum(layout, 200_000, 0, &[], &cols);
        assert_eq!(base, file_checksum(layout, 200_000, 0, &[], &cols), "deterministic");
        let variants = [
            file_checksum(Layout::parse("stripe:2@128K").unwrap(), 200_000, 0, &[], &cols),
            file_checksum(layout, 200_001, 0, &[], &cols),
            file_checksum(layout, 200_000, 0, &[], &[column(0, &[1, 2]), column(1, &[4])]),
            file_checksum(layout, 200_000, 0, &[], &[column(0, &[1]), column(1, &[2, 3])]),
            file_checksum(
                layout,
                200_000,
                0,
                &[],
                &[ColumnDigests { block_size: 8192, ..column(0, &[1, 2]) }, column(1, &[3])],
            ),
            file_checksum(layout, 200_000, 2, &[0, 0], &cols),
            file_checksum(layout, 200_000, 2, &[0, 1], &cols),
        ];
        for (i, v) in variants.iter().enumerate() {
            assert_ne!(*v, base, "variant {i}");
        }
    }
}
