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
    let (a, _) = s.create(1, none, &Attributes::default()).unwrap();
    write_blocks(&s, a, 4);
    // Fill the space after `a`, then free it, so there is a hole right after `a`
    // while the allocator's next-fit cursor points elsewhere.
    let (filler, _) = s.create(1, none, &Attributes::default()).unwrap();
    write_blocks(&s, filler, 64);
    s.remove(1, filler).unwrap();
    s.commit().unwrap();
    let (far, _) = s.create(1, none, &Attributes::default()).unwrap();
    write_blocks(&s, far, 4);
    let a_last = *phys(&s, a).last().unwrap();
    assert_ne!(phys(&s, far)[0], a_last + 1, "without a hint, allocation continues at the cursor");

    let hint = Attributes { nearby_object: a, ..Attributes::default() };
    let (near, attrs) = s.create(1, AttrMask::NEARBY_OBJECT, &hint).unwrap();
    assert_eq!(attrs.nearby_object, a);
    write_blocks(&s, near, 4);
    assert_eq!(phys(&s, near), (a_last + 1..a_last + 5).collect::<Vec<_>>(), "placed right after the nearby object");
}
