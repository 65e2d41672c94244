//! The allocator honours `nearby_object` and keeps an object's blocks contiguous.

use nasd_proto::{AttrMask, Attributes, Region};
use nasd_store::{Store, StoreOptions};

const BS: u64 = 4096;

fn store(dir: &std::path::Path) -> Store {
    let opts = StoreOptions { block_size: BS as u32, capacity_bytes: 64 << 20, ..Default::default() };
    let s = Store::open(dir, &opts).unwrap();
    s.create_partition(1).unwrap();
    s.resize_partition(1, 64 << 20).unwrap();
    s
}

fn write_blocks(s: &Store, o: u64, n: u64) {
    let data = vec![7u8; (n * BS) as usize];
    s.write(1, o, &[Region { offset: 0, length: n * BS }], &mut &data[..]).unwrap();
}

fn phys(s: &Store, o: u64) -> Vec<u64> {
    s.block_map(1, o).unwrap().into_iter().map(|(_, b)| b.phys).collect()
}

#[test]
fn sequential_writes_are_contiguous() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let (a, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    for i in 0..32 {
        let data = vec![i as u8; BS as usize];
        s.write(1, a, &[Region { offset: i * BS, length: BS }], &mut &data[..]).unwrap();
    }
    let p = phys(&s, a);
    assert!(p.windows(2).all(|w| w[1] == w[0] + 1), "blocks of a sequentially written object are contiguous: {p:?}");
}

#[test]
fn nearby_object_places_new_data_next_to_the_named_object() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let none = AttrMask::default();
    // first (4 blocks), a (4), filler (64), tail (4); then first and filler
    // go, so there are two holes: the lowest one and the one right after `a`.
    let (first, _) = s.create(1, none, &Attributes::default()).unwrap();
    write_blocks(&s, first, 4);
    let (a, _) = s.create(1, none, &Attributes::default()).unwrap();
    write_blocks(&s, a, 4);
    let (filler, _) = s.create(1, none, &Attributes::default()).unwrap();
    write_blocks(&s, filler, 64);
    let (tail, _) = s.create(1, none, &Attributes::default()).unwrap();
    write_blocks(&s, tail, 4);
    let lowest = phys(&s, first)[0];
    s.remove(1, first).unwrap();
    s.remove(1, filler).unwrap();
    s.commit().unwrap();
    let (far, _) = s.create(1, none, &Attributes::default()).unwrap();
    write_blocks(&s, far, 4);
    assert_eq!(phys(&s, far), (lowest..lowest + 4).collect::<Vec<_>>(), "without a hint, the lowest free blocks");

    let a_last = *phys(&s, a).last().unwrap();
    let hint = Attributes { nearby_object: a, ..Attributes::default() };
    let (near, attrs) = s.create(1, AttrMask::NEARBY_OBJECT, &hint).unwrap();
    assert_eq!(attrs.nearby_object, a);
    write_blocks(&s, near, 4);
    assert_eq!(phys(&s, near), (a_last + 1..a_last + 5).collect::<Vec<_>>(), "placed right after the nearby object");
}

/// Freed blocks are reused before the block file grows, and their space is
/// given back to the file system once their release is durable: after
/// writing and removing an object four times, `blocks.dat` occupies what the
/// store holds, not four objects' worth.
#[test]
fn freed_space_is_reused_and_given_back() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path());
    let on_disk = || std::fs::metadata(dir.path().join("blocks.dat")).unwrap().blocks() * 512;
    let (keep, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write_blocks(&s, keep, 2);
    s.commit().unwrap();
    for round in 0..4 {
        let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        write_blocks(&s, o, 256);
        s.commit().unwrap();
        assert!(on_disk() >= 258 * BS, "round {round}: the object's blocks are on disk");
        s.remove(1, o).unwrap();
        // The removal is durable at this commit: only then are its blocks punched.
        s.commit().unwrap();
        let used = s.info().used_bytes;
        assert_eq!(used, 2 * BS, "round {round}");
        assert!(on_disk() <= used + 16 * BS, "round {round}: {} bytes on disk for {used} in use", on_disk());
        let len = std::fs::metadata(dir.path().join("blocks.dat")).unwrap().len();
        assert!(len <= 258 * BS, "round {round}: the file never grew past one object's worth ({len} bytes)");
    }
}
