//! Bit rot injected into a stored block is found by scrub and by a read, and
//! only the rotten block is reported; clones sharing it are checked once.

use nasd_proto::{AttrMask, Attributes, Region};
use nasd_store::{CorruptBlock, Store, StoreError, StoreOptions, VecSink};
use std::os::unix::fs::FileExt;

const BS: u64 = 4096;

fn open(dir: &std::path::Path) -> Store {
    Store::open(dir, &StoreOptions { block_size: BS as u32, capacity_bytes: 64 << 20, ..Default::default() }).unwrap()
}

#[test]
fn scrub_and_reads_find_rot() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    s.create_partition(1).unwrap();
    s.resize_partition(1, 64 << 20).unwrap();
    let (a, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let data: Vec<u8> = (0..16 * BS).map(|i| (i * 7 % 251) as u8).collect();
    s.write(1, a, &[Region { offset: 0, length: data.len() as u64 }], &mut &data[..]).unwrap();
    let (clone, _) = s.fastcopy(1, a).unwrap();
    s.commit().unwrap();
    let clean = s.scrub().unwrap();
    assert_eq!(clean.blocks_checked, 16, "shared blocks are checked once");
    assert!(clean.corrupt.is_empty());

    // Flip one bit of logical block 5 on the media.
    let phys = s.block_map(1, a).unwrap()[5].1.phys;
    drop(s);
    let f = std::fs::OpenOptions::new().read(true).write(true).open(dir.path().join("blocks.dat")).unwrap();
    let mut byte = [0u8; 1];
    f.read_exact_at(&mut byte, phys * BS + 100).unwrap();
    f.write_all_at(&[byte[0] ^ 0x08], phys * BS + 100).unwrap();
    f.sync_all().unwrap();

    let s = open(dir.path());
    let report = s.scrub().unwrap();
    assert_eq!(report.blocks_checked, 16);
    assert_eq!(report.corrupt.len(), 1, "{report:?}");
    let CorruptBlock { partition, object, block } = report.corrupt[0];
    assert_eq!((partition, block), (1, 5));
    assert!(object == a || object == clone);

    // A read of the rotten block fails with its own error; other blocks read fine.
    let mut sink = VecSink::default();
    let err = s.read(1, clone, &[Region { offset: 5 * BS + 10, length: 10 }], &mut sink).unwrap_err();
    assert!(matches!(err, StoreError::DataCorrupted { partition: 1, block: 5, .. }), "{err:?}");
    let mut sink = VecSink::default();
    s.read(1, a, &[Region { offset: 6 * BS, length: BS }], &mut sink).unwrap();
    assert_eq!(sink.data, data[(6 * BS) as usize..(7 * BS) as usize]);

    // Overwriting the rotten block whole repairs it (fresh block, fresh digest).
    let fresh = vec![0x42u8; BS as usize];
    s.write(1, a, &[Region { offset: 5 * BS, length: BS }], &mut &fresh[..]).unwrap();
    let report = s.scrub().unwrap();
    assert_eq!(
        report.corrupt,
        vec![CorruptBlock { partition: 1, object: clone, block: 5 }],
        "the clone still maps the rotten block"
    );
}
