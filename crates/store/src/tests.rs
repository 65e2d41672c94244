use super::*;
use nasd_proto::limits::{FS_SPECIFIC_LEN, REGIONS_MAX};
use nasd_proto::Status;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use tempfile::TempDir;

const BS: u64 = 4096;
const CAP_BLOCKS: u64 = 4096;

fn opts() -> StoreOptions {
    StoreOptions {
        block_size: BS as u32,
        capacity_bytes: CAP_BLOCKS * BS,
        verify_reads: true,
        extensions: vec!["x-test".into()],
        prefetch_cache_bytes: 0,
        media_seek: None,
    }
}

#[track_caller]
fn open(dir: &Path) -> Store {
    Store::open(dir, &opts()).expect("open store")
}

/// A new store with partition 1 holding a quota of `quota_blocks`.
fn fresh(quota_blocks: u64) -> (TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    s.create_partition(1).unwrap();
    s.resize_partition(1, quota_blocks * BS).unwrap();
    (dir, s)
}

fn rg(offset: u64, length: u64) -> Region {
    Region { offset, length }
}

/// Deterministic bytes, never zero (so zeroed bytes are recognisable).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5DEE_CE66_D1CE_4E5B;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as u8) | 1
        })
        .collect()
}

fn write(s: &Store, p: u64, o: u64, regions: &[Region], data: &[u8]) -> Result<u64, StoreError> {
    s.write(p, o, regions, &mut &data[..])
}

fn read(s: &Store, p: u64, o: u64, regions: &[Region]) -> Result<(Vec<u64>, Vec<u8>), StoreError> {
    let mut sink = VecSink::default();
    s.read(p, o, regions, &mut sink)?;
    assert_eq!(sink.lengths.iter().sum::<u64>(), sink.data.len() as u64, "lengths disagree with the data");
    Ok((sink.lengths, sink.data))
}

#[track_caller]
fn read_all(s: &Store, p: u64, o: u64) -> Vec<u8> {
    let size = s.getattr(p, o).unwrap().logical_size;
    if size == 0 {
        return Vec::new();
    }
    let (lengths, data) = read(s, p, o, &[rg(0, size)]).unwrap();
    assert_eq!(lengths, vec![size]);
    data
}

#[track_caller]
fn err<T: std::fmt::Debug>(r: Result<T, StoreError>) -> Status {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.status(),
    }
}

fn part_used(s: &Store, p: u64) -> u64 {
    s.info().partitions.iter().find(|x| x.partition == p).expect("partition listed").used_bytes
}

fn phys_of(s: &Store, p: u64, o: u64, l: u64) -> u64 {
    lock(&s.meta).partitions[&p].objects[&o].blocks[&l].phys
}

fn attrs_with(f: impl FnOnce(&mut Attributes)) -> Attributes {
    let mut a = Attributes::default();
    f(&mut a);
    a
}

fn size_attr(size: u64) -> Attributes {
    attrs_with(|a| a.logical_size = size)
}

fn truncate(s: &Store, p: u64, o: u64, size: u64) -> Result<Attributes, StoreError> {
    s.setattr(p, o, AttrMask::LOGICAL_SIZE, &size_attr(size))
}

fn reserve(s: &Store, p: u64, o: u64, blocks: u64) -> Result<Attributes, StoreError> {
    s.setattr(p, o, AttrMask::BLOCKS_ALLOCATED, &attrs_with(|a| a.blocks_allocated = blocks))
}

fn contents(s: &Store, p: u64) -> Vec<u64> {
    let len = s.getattr(p, PARTITION_CONTENTS).unwrap().logical_size;
    let (_, bytes) = read(s, p, PARTITION_CONTENTS, &[rg(0, len)]).unwrap();
    assert_eq!(bytes.len() % 8, 0);
    bytes.chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Checks every in-memory invariant the store promises against the files:
/// every stored block matches its stored digest, bytes at or past
/// `logical_size` are zero, reference counts and per-partition charges are
/// exact, and every allocated block is referenced or awaiting release.
fn check_store_invariants(s: &Store) {
    let m = lock(&s.meta);
    let bs = s.bs();
    let mut buf = vec![0u8; bs as usize];
    let mut refs: HashMap<u64, u32> = HashMap::new();
    for (&p, part) in &m.partitions {
        let mut phys_in_part = HashSet::new();
        let mut slack = 0;
        for (&o, obj) in &part.objects {
            let size = obj.attrs.logical_size;
            slack += obj.slack();
            for (&l, b) in &obj.blocks {
                assert!(l * bs < size, "partition {p} object {o}: block {l} mapped at or past logical size {size}");
                s.data.read_exact_at(&mut buf, b.phys * bs).unwrap();
                assert!(
                    nasd_crypto::ct_eq(&nasd_crypto::block_digest(&buf), &b.digest),
                    "partition {p} object {o} block {l} (phys {}) does not match its stored digest",
                    b.phys
                );
                let valid = (size - l * bs).min(bs) as usize;
                assert!(
                    buf[valid..].iter().all(|&x| x == 0),
                    "partition {p} object {o} block {l}: stored bytes past logical size are not zero"
                );
                *refs.entry(b.phys).or_default() += 1;
                phys_in_part.insert(b.phys);
            }
            let Some(t) = &obj.txn else {
                assert!(!part.txn_objects.contains(&o), "partition {p} lists object {o} as in a transaction");
                continue;
            };
            assert!(part.txn_objects.contains(&o), "partition {p} does not list object {o}'s transaction");
            assert!(t.id != 0, "transaction 0 on {p}/{o}");
            for (&l, prev) in &t.undo {
                if let Some(w) = obj.blocks.get(&l) {
                    assert_eq!(
                        m.refcount.get(&w.phys),
                        Some(&1),
                        "{p}/{o} block {l} written in a transaction is shared"
                    );
                }
                let Some(b) = prev else {
                    assert!(obj.blocks.contains_key(&l), "{p}/{o}: undo of hole {l} whose block is a hole again");
                    continue;
                };
                assert!(l * bs < t.old_size, "{p}/{o}: undo holds block {l} past the old size {}", t.old_size);
                s.data.read_exact_at(&mut buf, b.phys * bs).unwrap();
                assert!(
                    nasd_crypto::ct_eq(&nasd_crypto::block_digest(&buf), &b.digest),
                    "{p}/{o}: undo block {l} (phys {}) does not match its stored digest",
                    b.phys
                );
                *refs.entry(b.phys).or_default() += 1;
                phys_in_part.insert(b.phys);
            }
        }
        assert_eq!(
            part.txn_objects.len(),
            part.objects.values().filter(|o| o.txn.is_some()).count(),
            "partition {p} transaction list"
        );
        assert_eq!(part.physical_blocks, phys_in_part.len() as u64, "partition {p} physical_blocks");
        assert_eq!(part.slack_blocks, slack, "partition {p} slack_blocks");
        assert_eq!(part.inflight_blocks, 0, "partition {p} inflight_blocks at rest");
        assert!(part.physical_blocks + part.slack_blocks <= part.quota_bytes / bs, "partition {p} over quota");
        assert!(part.next_id <= part.high_water, "partition {p} id beyond its durable high-water mark");
    }
    assert_eq!(refs, m.refcount, "reference counts");
    let pending: HashSet<u64> = m.pending_free.iter().copied().collect();
    assert_eq!(pending.len(), m.pending_free.len(), "a block is pending release twice");
    assert!(pending.iter().all(|b| !refs.contains_key(b)), "a referenced block is pending release");
    assert!(m.pins.is_empty() && m.pinned_free.is_empty(), "blocks pinned with no read in progress");
    let to_punch: HashSet<u64> = m.to_punch.iter().copied().collect();
    assert_eq!(to_punch.len(), m.to_punch.len(), "a block waits to be punched twice");
    assert!(
        to_punch.iter().all(|b| !refs.contains_key(b) && !pending.contains(b)),
        "a block in use waits to be punched"
    );
    assert_eq!(m.punching, 0, "blocks being punched with no punch in progress");
    assert_eq!(
        m.alloc.capacity() - m.alloc.free_blocks(),
        (refs.len() + pending.len() + to_punch.len()) as u64,
        "allocated blocks are exactly the referenced ones plus those awaiting release or a punch (no leak)"
    );
    assert_eq!(m.used_blocks(), (refs.len() + pending.len()) as u64, "used blocks");
}

// ------------------------------------------------------------------- create

#[test]
fn create_sets_masked_attributes_and_drive_times() {
    let (_d, s) = fresh(16);
    let before = s.now_ns();
    let a = attrs_with(|a| {
        a.access_control_version = 7;
        a.nearby_object = 4;
        a.logical_size = 10_000;
        a.block_size = BS as u32;
        a.blocks_allocated = 2;
        a.fs_data_modify_time = 11;
        a.fs_attribute_modify_time = 12;
        a.fs_specific = [0xAB; FS_SPECIFIC_LEN];
        a.copied_object = 99; // not in the mask: ignored
        a.create_time = 5; // not in the mask: ignored
    });
    let mask = AttrMask::ACCESS_CONTROL_VERSION
        .union(AttrMask::NEARBY_OBJECT)
        .union(AttrMask::LOGICAL_SIZE)
        .union(AttrMask::BLOCK_SIZE)
        .union(AttrMask::BLOCKS_ALLOCATED)
        .union(AttrMask::FS_DATA_MODIFY_TIME)
        .union(AttrMask::FS_ATTRIBUTE_MODIFY_TIME)
        .union(AttrMask::FS_SPECIFIC);
    let (id, got) = s.create(1, mask, &a).unwrap();
    let after = s.now_ns();
    assert_eq!(id, FIRST_USER_OBJECT);
    assert_eq!(got.access_control_version, 7);
    assert_eq!(got.nearby_object, 4);
    assert_eq!(got.logical_size, 10_000);
    assert_eq!(got.block_size, BS as u32);
    assert_eq!(got.blocks_allocated, 2);
    assert_eq!(got.blocks_used, 0);
    assert_eq!(got.copied_object, 0);
    assert_eq!(got.fs_data_modify_time, 11);
    assert_eq!(got.fs_attribute_modify_time, 12);
    assert_eq!(got.fs_specific, [0xAB; FS_SPECIFIC_LEN]);
    assert!((before..=after).contains(&got.create_time), "create_time from the drive clock");
    assert_eq!(got.data_modify_time, got.create_time);
    assert_eq!(got.attribute_modify_time, got.create_time);
    assert_eq!(s.getattr(1, id).unwrap(), got);
    assert_eq!(part_used(&s, 1), 2 * BS, "the reservation is charged");
    // The size was set without data: a hole that reads as zeros.
    assert_eq!(read_all(&s, 1, id), vec![0u8; 10_000]);

    // Fields outside the mask are ignored.
    let (id2, got2) = s.create(1, AttrMask::ACCESS_CONTROL_VERSION, &a).unwrap();
    assert_eq!(id2, id + 1);
    assert_eq!(got2.access_control_version, 7);
    assert_eq!((got2.nearby_object, got2.logical_size, got2.blocks_allocated), (0, 0, 0));
    assert_eq!(got2.fs_specific, [0; FS_SPECIFIC_LEN]);
    assert_eq!(got2.fs_data_modify_time, got2.create_time);
    assert_eq!(got2.block_size, BS as u32, "block_size is always the drive's");
}

#[test]
fn create_refuses_drive_maintained_and_unsupported_attributes() {
    let (_d, s) = fresh(4);
    let all = attrs_with(|a| {
        a.copied_object = 1;
        a.blocks_used = 1;
        a.create_time = 1;
        a.data_modify_time = 1;
        a.attribute_modify_time = 1;
        a.block_size = BS as u32;
    });
    for bit in 0..13 {
        let m = AttrMask(1 << bit);
        if AttrMask::DRIVE_MAINTAINED.intersects(m) {
            assert_eq!(err(s.create(1, m, &all)), Status::AttributeNotSettable, "bit {bit}");
            let with_settable = m.union(AttrMask::ACCESS_CONTROL_VERSION);
            assert_eq!(err(s.create(1, with_settable, &all)), Status::AttributeNotSettable, "bit {bit}");
        }
    }
    let bs8k = attrs_with(|a| a.block_size = 8192);
    assert_eq!(err(s.create(1, AttrMask::BLOCK_SIZE, &bs8k)), Status::AttributeNotSettable);
    assert_eq!(err(s.create(1, AttrMask::BLOCK_SIZE, &Attributes::default())), Status::AttributeNotSettable);
    assert_eq!(err(s.create(1, AttrMask(1 << 13), &all)), Status::BadArguments);
    let huge = size_attr(nasd_proto::limits::OBJECT_SIZE_MAX + 1);
    assert_eq!(err(s.create(1, AttrMask::LOGICAL_SIZE, &huge)), Status::AttributeNotSettable);
    assert_eq!(err(s.create(9, AttrMask::default(), &all)), Status::NoSuchPartition);
    let too_much = attrs_with(|a| a.blocks_allocated = 5);
    assert_eq!(err(s.create(1, AttrMask::BLOCKS_ALLOCATED, &too_much)), Status::QuotaExceeded);
    assert_eq!(contents(&s, 1), vec![1, 2, 3, 4], "refused creates made nothing");
    assert_eq!(part_used(&s, 1), 0);

    let (id, a) = s.create(1, AttrMask::BLOCK_SIZE, &all).unwrap();
    assert_eq!(id, FIRST_USER_OBJECT, "refused creates consumed no identifier");
    assert_eq!(a.block_size, BS as u32);
    let (id2, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    assert_eq!(id2, id + 1);
    assert_eq!(contents(&s, 1), vec![1, 2, 3, 4, id, id2]);
}

// ------------------------------------------------------------------- remove

#[test]
fn remove_refuses_well_known_and_releases_blocks() {
    let (_d, s) = fresh(64);
    for o in 1..=FIRST_OBJECT {
        assert_eq!(err(s.remove(1, o)), Status::ReadOnlyObject, "object {o}");
    }
    for o in FIRST_OBJECT + 1..FIRST_USER_OBJECT {
        assert_eq!(err(s.remove(1, o)), Status::NoSuchObject, "object {o} is never allocated");
    }
    let (a, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, a, &[rg(0, 3 * BS)], &pattern(1, 3 * BS as usize)).unwrap();
    s.commit().unwrap();
    assert_eq!(s.info().used_bytes, 3 * BS);
    s.remove(1, a).unwrap();
    assert_eq!(part_used(&s, 1), 0, "the partition is no longer charged");
    assert_eq!(err(s.getattr(1, a)), Status::NoSuchObject);
    assert_eq!(err(s.remove(1, a)), Status::NoSuchObject);
    assert_eq!(err(read(&s, 1, a, &[rg(0, 1)])), Status::NoSuchObject);
    assert_eq!(err(write(&s, 1, a, &[rg(0, 1)], b"x")), Status::NoSuchObject);
    assert_eq!(err(s.fastcopy(1, a)), Status::NoSuchObject);
    assert_eq!(contents(&s, 1), vec![1, 2, 3, 4]);
    s.commit().unwrap();
    assert_eq!(s.info().used_bytes, 0, "blocks are free after the commit that forgets them");

    // Blocks never committed go back at once.
    let (b, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, b, &[rg(0, 2 * BS)], &pattern(2, 2 * BS as usize)).unwrap();
    assert_eq!(s.info().used_bytes, 2 * BS);
    s.remove(1, b).unwrap();
    assert_eq!(s.info().used_bytes, 0);
    assert_eq!(err(s.remove(2, 99)), Status::NoSuchPartition);
    check_store_invariants(&s);
}

// ------------------------------------------------------------ control objects

#[test]
fn control_objects_publish_drive_and_partition_state() {
    let (_d, s) = fresh(64);
    s.create_partition(2).unwrap();
    let (a, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let (b, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, a, &[rg(0, 10)], b"0123456789").unwrap();

    let ga = s.getattr(1, DRIVE_CONTROL).unwrap();
    let (lengths, bytes) = read(&s, 1, DRIVE_CONTROL, &[rg(0, ga.logical_size)]).unwrap();
    assert_eq!(lengths, vec![ga.logical_size]);
    let dc = DriveControl::decode(&bytes).expect("drive control decodes");
    assert_eq!(dc.block_size, BS as u32);
    assert_eq!(dc.capacity_bytes, CAP_BLOCKS * BS);
    assert_eq!(dc.allocated_bytes, BS);
    assert_eq!(dc.partitions, 2);
    assert_eq!(dc.clock_skew_ns, DEFAULT_SKEW_NS);
    assert_eq!(dc.extensions, vec!["x-test".to_string()]);
    assert!(dc.clock_ns.abs_diff(s.now_ns()) < 10_000_000_000, "clock_ns is the drive clock");
    // The same in every partition.
    let (_, bytes2) = read(&s, 2, DRIVE_CONTROL, &[rg(0, 4096)]).unwrap();
    assert_eq!(DriveControl::decode(&bytes2).unwrap().partitions, 2);

    let gp = s.getattr(1, PARTITION_CONTROL).unwrap();
    let (_, bytes) = read(&s, 1, PARTITION_CONTROL, &[rg(0, 4096)]).unwrap();
    assert_eq!(bytes.len() as u64, gp.logical_size);
    let pc = PartitionControl::decode(&bytes).expect("partition control decodes");
    assert_eq!(
        pc,
        PartitionControl {
            quota_bytes: 64 * BS,
            used_bytes: BS,
            objects_in_use: 6,
            objects_max: OBJECTS_PER_PARTITION_MAX
        }
    );
    let (_, bytes) = read(&s, 2, PARTITION_CONTROL, &[rg(0, 4096)]).unwrap();
    assert_eq!(PartitionControl::decode(&bytes).unwrap().objects_in_use, 4);

    assert_eq!(s.getattr(1, PARTITION_CONTENTS).unwrap().logical_size, 6 * 8);
    assert_eq!(contents(&s, 1), vec![1, 2, 3, 4, a, b]);
    assert_eq!(contents(&s, 2), vec![1, 2, 3, 4]);
    // Sub-ranges, several regions, and reads past the end.
    let (lengths, bytes) = read(&s, 1, PARTITION_CONTENTS, &[rg(40, 100), rg(8, 8), rg(200, 5)]).unwrap();
    assert_eq!(lengths, vec![8, 8, 0]);
    assert_eq!(&bytes[..8], &b.to_le_bytes());
    assert_eq!(&bytes[8..], &2u64.to_le_bytes());

    for o in [DRIVE_CONTROL, PARTITION_CONTROL, PARTITION_CONTENTS] {
        assert_eq!(err(write(&s, 1, o, &[rg(0, 1)], b"x")), Status::ReadOnlyObject);
        assert_eq!(
            err(s.setattr(1, o, AttrMask::ACCESS_CONTROL_VERSION, &Attributes::default())),
            Status::ReadOnlyObject
        );
        assert_eq!(err(s.remove(1, o)), Status::ReadOnlyObject);
        assert_eq!(err(s.fastcopy(1, o)), Status::ReadOnlyObject);
        assert_eq!(err(s.blocks_required(1, o, &[rg(0, 1)])), Status::ReadOnlyObject);
        assert_eq!(err(s.getattr(9, o)), Status::NoSuchPartition);
        assert_eq!(err(read(&s, 9, o, &[rg(0, 1)])), Status::NoSuchPartition);
    }
}

// ------------------------------------------------------------------ setattr

#[test]
fn setattr_semantics_and_drive_clock() {
    const DRIVE_CLOCK: u64 = 1_000_000_000_000_000_000; // 2001: far from the host clock
    const MINUTE: u64 = 60_000_000_000;
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    s.initialize(DRIVE_CLOCK, 1_000).unwrap();
    assert!((DRIVE_CLOCK..DRIVE_CLOCK + MINUTE).contains(&s.now_ns()));
    assert_eq!(s.clock_skew_ns(), 1_000);
    s.create_partition(1).unwrap();
    s.resize_partition(1, 16 * BS).unwrap();
    let (o, a0) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    assert!((DRIVE_CLOCK..DRIVE_CLOCK + MINUTE).contains(&a0.create_time), "times come from the drive clock");

    let mut fs = [0u8; FS_SPECIFIC_LEN];
    for (i, b) in fs.iter_mut().enumerate() {
        *b = i as u8;
    }
    let v = attrs_with(|a| {
        a.access_control_version = 42;
        a.nearby_object = 4;
        a.fs_specific = fs;
    });
    let t = s.now_ns();
    let mask = AttrMask::ACCESS_CONTROL_VERSION.union(AttrMask::FS_SPECIFIC).union(AttrMask::NEARBY_OBJECT);
    let a1 = s.setattr(1, o, mask, &v).unwrap();
    assert_eq!((a1.access_control_version, a1.nearby_object, a1.fs_specific), (42, 4, fs));
    assert!((t..=s.now_ns()).contains(&a1.attribute_modify_time), "attribute_modify_time from the drive clock");
    assert_eq!(a1.fs_attribute_modify_time, a1.attribute_modify_time, "fs_attribute_modify_time follows unless set");
    assert_eq!(a1.create_time, a0.create_time);
    assert_eq!(a1.data_modify_time, a0.data_modify_time, "attributes only: data time unchanged");
    assert_eq!(a1.fs_data_modify_time, a0.fs_data_modify_time);
    assert_eq!(s.getattr(1, o).unwrap(), a1);

    let v2 = attrs_with(|a| {
        a.fs_attribute_modify_time = 5;
        a.fs_data_modify_time = 6;
    });
    let a2 = s.setattr(1, o, AttrMask::FS_ATTRIBUTE_MODIFY_TIME.union(AttrMask::FS_DATA_MODIFY_TIME), &v2).unwrap();
    assert_eq!((a2.fs_attribute_modify_time, a2.fs_data_modify_time), (5, 6));
    assert!(a2.attribute_modify_time >= a1.attribute_modify_time);
    assert_eq!((a2.access_control_version, a2.fs_specific), (42, fs), "unmasked attributes unchanged");

    // Refusals change nothing.
    for bit in 0..13 {
        let m = AttrMask(1 << bit);
        if AttrMask::DRIVE_MAINTAINED.intersects(m) {
            let both = m.union(AttrMask::ACCESS_CONTROL_VERSION);
            let x = attrs_with(|a| a.access_control_version = 1);
            assert_eq!(err(s.setattr(1, o, both, &x)), Status::AttributeNotSettable, "bit {bit}");
        }
    }
    assert_eq!(
        err(s.setattr(1, o, AttrMask::BLOCK_SIZE, &attrs_with(|a| a.block_size = 8192))),
        Status::AttributeNotSettable
    );
    assert_eq!(s.getattr(1, o).unwrap(), a2, "refused setattrs changed nothing");
    assert_eq!(
        s.setattr(1, o, AttrMask::BLOCK_SIZE, &attrs_with(|a| a.block_size = BS as u32)).unwrap().block_size,
        BS as u32
    );
    assert_eq!(err(s.setattr(1, 99, AttrMask::ACCESS_CONTROL_VERSION, &v)), Status::NoSuchObject);
    assert_eq!(err(s.setattr(7, o, AttrMask::ACCESS_CONTROL_VERSION, &v)), Status::NoSuchPartition);

    // A write moves both data times (the fs one too) to the drive clock.
    let t = s.now_ns();
    write(&s, 1, o, &[rg(0, 10)], b"abcdefghij").unwrap();
    let a3 = s.getattr(1, o).unwrap();
    assert!((t..=s.now_ns()).contains(&a3.data_modify_time));
    assert_eq!(a3.fs_data_modify_time, a3.data_modify_time);
    assert_eq!(a3.create_time, a0.create_time);
    s.commit().unwrap();
    drop(s);

    let s = open(dir.path());
    assert_eq!(s.getattr(1, o).unwrap(), a3, "every attribute survives reopening");
    assert!((DRIVE_CLOCK..DRIVE_CLOCK + MINUTE).contains(&s.now_ns()), "the drive clock survives reopening");
    assert_eq!(s.clock_skew_ns(), 1_000);
}

#[test]
fn truncate_zeroes_the_tail_and_frees_blocks() {
    let (_d, s) = fresh(64);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let data = pattern(1, 10_000);
    write(&s, 1, o, &[rg(0, 10_000)], &data).unwrap();
    let a = s.getattr(1, o).unwrap();
    assert_eq!((a.logical_size, a.blocks_used, a.blocks_allocated), (10_000, 3, 3));
    s.commit().unwrap();

    let t = s.now_ns();
    let a = truncate(&s, 1, o, 5_000).unwrap();
    assert_eq!((a.logical_size, a.blocks_used, a.blocks_allocated), (5_000, 2, 2));
    assert!(a.data_modify_time >= t);
    assert_eq!(part_used(&s, 1), 2 * BS);
    let (lengths, got) = read(&s, 1, o, &[rg(0, 10_000)]).unwrap();
    assert_eq!(lengths, vec![5_000], "reads stop at the new size");
    assert_eq!(got, &data[..5_000]);

    let a = truncate(&s, 1, o, 10_000).unwrap();
    assert_eq!((a.logical_size, a.blocks_used), (10_000, 2), "extending adds a hole, not blocks");
    let got = read_all(&s, 1, o);
    assert_eq!(&got[..5_000], &data[..5_000]);
    assert!(got[5_000..].iter().all(|&b| b == 0), "bytes past the truncation point read back as zero");
    s.commit().unwrap();
    assert_eq!(s.info().used_bytes, 2 * BS, "the dropped and replaced blocks are free after commit");
    check_store_invariants(&s);

    truncate(&s, 1, o, BS).unwrap();
    assert_eq!(read_all(&s, 1, o), &data[..BS as usize]);
    let a = truncate(&s, 1, o, 0).unwrap();
    assert_eq!((a.logical_size, a.blocks_used, a.blocks_allocated), (0, 0, 0));
    assert_eq!(part_used(&s, 1), 0);
    truncate(&s, 1, o, 2 * BS).unwrap();
    assert_eq!(read_all(&s, 1, o), vec![0u8; 2 * BS as usize]);
    check_store_invariants(&s);
}

/// Truncating inside a hole must not allocate a block (it would charge the
/// quota, and fail outright in a full partition).
#[test]
fn truncate_inside_a_hole_allocates_nothing() {
    let (_d, s) = fresh(0);
    let (o, _) = s.create(1, AttrMask::LOGICAL_SIZE, &size_attr(10_000)).unwrap();
    let a = truncate(&s, 1, o, 5_000).expect("truncating a sparse object needs no space");
    assert_eq!((a.logical_size, a.blocks_allocated, a.blocks_used), (5_000, 0, 0));
    assert_eq!(read_all(&s, 1, o), vec![0u8; 5_000]);
    assert_eq!(s.info().used_bytes, 0);

    // A full partition can still truncate a partly sparse object.
    s.resize_partition(1, BS).unwrap();
    let (p, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, p, &[rg(0, 100)], &pattern(3, 100)).unwrap();
    truncate(&s, 1, p, 3 * BS).unwrap();
    let a = truncate(&s, 1, p, BS + 10).expect("tail block is a hole");
    assert_eq!((a.blocks_used, a.logical_size), (1, BS + 10));
    let got = read_all(&s, 1, p);
    assert_eq!(&got[..100], &pattern(3, 100)[..]);
    assert!(got[100..].iter().all(|&b| b == 0));
    check_store_invariants(&s);
}

/// A block a write leaves all zeros is a hole: it takes no block, no quota
/// and no disk read, reads back as zeros with the digest of a hole, and
/// frees the block it replaces. `extents` lists exactly the stored blocks.
#[test]
fn blocks_of_zeros_are_holes_and_extents_list_the_stored_ones() {
    let (_d, s) = fresh(64);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    // Blocks: 0 data, 1 zeros, 2 zeros, 3 data in part (the rest zeros), 4 zeros.
    let mut data = vec![0u8; 5 * BS as usize];
    data[..BS as usize].copy_from_slice(&pattern(1, BS as usize));
    data[3 * BS as usize + 100] = 7;
    write(&s, 1, o, &[rg(0, 5 * BS)], &data).unwrap();
    let a = s.getattr(1, o).unwrap();
    assert_eq!((a.logical_size, a.blocks_used, a.blocks_allocated), (5 * BS, 2, 2), "two blocks stored");
    assert_eq!(part_used(&s, 1), 2 * BS, "the zeros are charged nothing");
    assert_eq!(read_all(&s, 1, o), data);
    let mapped: Vec<u64> = s.block_map(1, o).unwrap().into_iter().map(|(l, _)| l).collect();
    assert_eq!(mapped, vec![0, 3]);
    assert_eq!(s.extents(1, o, 0, 16).unwrap(), (vec![rg(0, BS), rg(3 * BS, BS)], 5 * BS));
    assert_eq!(
        s.extents(1, o, 100, 1).unwrap(),
        (vec![rg(100, BS - 100)], 3 * BS),
        "one asked for: covered to the next"
    );
    assert_eq!(s.extents(1, o, 3 * BS + 5, 16).unwrap(), (vec![rg(3 * BS + 5, BS - 5)], 5 * BS));
    assert_eq!(s.extents(1, o, 9 * BS, 16).unwrap(), (vec![], 9 * BS), "past the end");
    truncate(&s, 1, o, 3 * BS + 200).unwrap();
    assert_eq!(s.extents(1, o, 3 * BS + 300, 16).unwrap(), (vec![], 3 * BS + 300), "in the last block, past the end");
    assert_eq!(s.extents(1, o, 3 * BS + 50, 16).unwrap(), (vec![rg(3 * BS + 50, 150)], 3 * BS + 200));
    truncate(&s, 1, o, 5 * BS).unwrap();
    assert!(matches!(s.extents(1, o, 0, 0), Err(StoreError::BadArgument(_))));
    // Hash-and-MAC: a hole's whole block goes out with the digest of a block of zeros.
    struct Digests(Vec<Option<BlockDigest>>);
    impl DataSink for Digests {
        fn start(&mut self, _: &[u64]) -> std::io::Result<()> {
            Ok(())
        }
        fn data(&mut self, _: &[u8]) -> std::io::Result<()> {
            Ok(())
        }
        fn unit(&mut self, bytes: &[u8], stored: Option<&BlockDigest>) -> std::io::Result<()> {
            if let Some(d) = stored {
                assert!(ct_eq(d, &block_digest(bytes)), "a unit's stored digest is the digest of its bytes");
            }
            self.0.push(stored.copied());
            Ok(())
        }
    }
    let mut digests = Digests(Vec::new());
    s.read_with(1, o, &[rg(0, 5 * BS)], &mut digests, false).unwrap();
    assert_eq!(digests.0.len(), 5);
    assert!(digests.0.iter().all(Option::is_some), "every whole block has its digest");

    // Overwriting the data with zeros frees its block; a partial write that
    // zeroes what was left of a block does too.
    s.commit().unwrap();
    write(&s, 1, o, &[rg(0, BS)], &vec![0u8; BS as usize]).unwrap();
    write(&s, 1, o, &[rg(3 * BS + 100, 1)], &[0]).unwrap();
    let a = s.getattr(1, o).unwrap();
    assert_eq!((a.logical_size, a.blocks_used, a.blocks_allocated), (5 * BS, 0, 0));
    assert_eq!(s.extents(1, o, 0, 16).unwrap(), (vec![], 5 * BS));
    assert_eq!(read_all(&s, 1, o), vec![0u8; 5 * BS as usize]);
    s.commit().unwrap();
    assert_eq!(s.info().used_bytes, 0);
    // Under a transaction, zeros over data are undone like any write.
    write(&s, 1, o, &[rg(BS, BS)], &pattern(2, BS as usize)).unwrap();
    s.txn_begin(1, o, 5).unwrap();
    write(&s, 1, o, &[rg(BS, BS)], &vec![0u8; BS as usize]).unwrap();
    write(&s, 1, o, &[rg(2 * BS, BS)], &vec![0u8; BS as usize]).unwrap();
    assert_eq!(s.extents(1, o, 0, 16).unwrap().0, vec![]);
    check_store_invariants(&s);
    s.txn_end(1, o, 5, false).unwrap();
    assert_eq!(read(&s, 1, o, &[rg(BS, BS)]).unwrap().1, pattern(2, BS as usize));
    assert_eq!(s.extents(1, o, 0, 16).unwrap().0, vec![rg(BS, BS)]);
    check_store_invariants(&s);
}

/// `extents` walks a bounded number of block references per call and says
/// how far its answer goes; a caller following `covered_end` sees them all.
#[test]
fn extents_of_a_large_fragmented_object_come_in_bounded_calls() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = EXTENTS_SCAN_BLOCKS_MAX as u64 * 2 + 10;
    let s = Store::open(dir.path(), &StoreOptions { capacity_bytes: (blocks + 16) * BS, ..opts() }).unwrap();
    s.create_partition(1).unwrap();
    s.resize_partition(1, (blocks + 16) * BS).unwrap();
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    // Every other block stored: as many extents as blocks.
    let regions: Vec<Region> = (0..blocks / 2).map(|i| rg(2 * i * BS, BS)).collect();
    for chunk in regions.chunks(nasd_proto::limits::REGIONS_MAX) {
        let len: u64 = chunk.iter().map(|r| r.length).sum();
        write(&s, 1, o, chunk, &pattern(3, len as usize)).unwrap();
    }
    let (mut at, mut seen, mut calls) = (0, Vec::new(), 0);
    let size = s.getattr(1, o).unwrap().logical_size;
    while at < size {
        let (got, covered) = s.extents(1, o, at, 4096).unwrap();
        assert!(got.len() <= 4096 && covered > at, "progress from {at}");
        assert!(got.iter().all(|r| r.offset >= at && r.end() <= covered));
        seen.extend(got);
        at = covered;
        calls += 1;
    }
    assert_eq!(seen, regions);
    assert!(calls >= regions.len() / 4096, "{calls} calls");
    // Dense: one extent, listed in bounded walks that join up.
    let (d, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let dense = EXTENTS_SCAN_BLOCKS_MAX as u64 + 5;
    write(&s, 1, d, &[rg(0, dense * BS)], &pattern(4, (dense * BS) as usize)).unwrap();
    let (first, covered) = s.extents(1, d, 0, 8).unwrap();
    assert_eq!(
        (first, covered),
        (vec![rg(0, EXTENTS_SCAN_BLOCKS_MAX as u64 * BS)], EXTENTS_SCAN_BLOCKS_MAX as u64 * BS)
    );
    let (rest, covered) = s.extents(1, d, covered, 8).unwrap();
    assert_eq!((rest, covered), (vec![rg(EXTENTS_SCAN_BLOCKS_MAX as u64 * BS, 5 * BS)], dense * BS));
}

/// Blocks written and never committed before a crash are free at the next
/// open, and their space goes back to the file system then: the block file
/// is trimmed past the last block in use and the free blocks below it are
/// punched.
#[test]
fn reopening_after_a_crash_gives_back_what_no_commit_kept() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let on_disk = || std::fs::metadata(dir.path().join("blocks.dat")).unwrap().blocks() * 512;
    let v = pattern(5, 8 * BS as usize);
    let (a, b) = {
        let s = open(dir.path());
        s.create_partition(1).unwrap();
        s.resize_partition(1, 1024 * BS).unwrap();
        let (a, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        let (b, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        write(&s, 1, b, &[rg(0, 8 * BS)], &v).unwrap();
        write(&s, 1, a, &[rg(0, 8 * BS)], &v).unwrap();
        s.commit().unwrap();
        // b goes, durably; then 500 blocks are written and never committed.
        s.remove(1, b).unwrap();
        s.commit().unwrap();
        for i in 0..5 {
            let (n, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
            write(&s, 1, n, &[rg(0, 100 * BS)], &pattern(10 + i, 100 * BS as usize)).unwrap();
        }
        assert!(on_disk() >= 500 * BS);
        (a, b)
        // Dropped without a commit: as after a crash.
    };
    let s = open(dir.path());
    assert_eq!(read_all(&s, 1, a), v);
    assert!(s.getattr(1, b).is_err());
    assert_eq!(s.info().used_bytes, 8 * BS);
    let len = std::fs::metadata(dir.path().join("blocks.dat")).unwrap().len();
    assert!(len <= 16 * BS, "trimmed past the last block in use: {len} bytes");
    assert!(on_disk() <= 8 * BS + 16 * BS, "{} bytes on disk for 8 blocks in use", on_disk());
    check_store_invariants(&s);
}

// --------------------------------------------------------------- read/write

/// Whether block `l` of an object holding `data` is all zeros (a hole).
fn zero_block(data: &[u8], l: u64) -> bool {
    let start = (l * BS) as usize;
    data.get(start..data.len().min(start + BS as usize)).is_none_or(|b| b.iter().all(|&x| x == 0))
}

fn apply(model: &mut Vec<u8>, regions: &[Region], data: &[u8]) {
    let mut pos = 0;
    for r in regions {
        let end = r.end() as usize;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[r.offset as usize..end].copy_from_slice(&data[pos..pos + r.length as usize]);
        pos += r.length as usize;
    }
}

fn expect_read(model: &[u8], regions: &[Region]) -> (Vec<u64>, Vec<u8>) {
    let size = model.len() as u64;
    let mut lengths = Vec::new();
    let mut data = Vec::new();
    for r in regions {
        let n = r.end().min(size).saturating_sub(r.offset);
        lengths.push(n);
        if n > 0 {
            data.extend_from_slice(&model[r.offset as usize..(r.offset + n) as usize]);
        }
    }
    (lengths, data)
}

#[test]
fn scatter_gather_write_and_read() {
    let (_d, s) = fresh(64);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let mut model = Vec::new();
    // Out of order; three regions in block 0, one crossing into block 1, a
    // whole aligned block, one spanning three blocks, and holes between.
    let regions = [rg(4000, 200), rg(10, 5), rg(100, 7), rg(9000, 1), rg(3 * BS, BS), rg(5 * BS + 17, 2 * BS + 3)];
    let total: u64 = regions.iter().map(|r| r.length).sum();
    let data = pattern(2, total as usize);
    assert_eq!(write(&s, 1, o, &regions, &data).unwrap(), total);
    apply(&mut model, &regions, &data);
    let a = s.getattr(1, o).unwrap();
    assert_eq!(a.logical_size, 7 * BS + 20);
    assert_eq!(a.blocks_used, 7, "blocks 0,1,2,3,5,6,7; block 4 is a hole");
    assert_eq!(read_all(&s, 1, o), model);
    assert_eq!(s.blocks_required(1, o, &[rg(4 * BS + 1, 10)]).unwrap(), (1, 1));

    let len = model.len() as u64;
    let rr = [
        rg(5 * BS + 20, 10),
        rg(0, 20),
        rg(95, 20),
        rg(4090, 12),
        rg(6000, 3000),
        rg(4 * BS - 3, 6),
        rg(4 * BS + 100, 200),
        rg(len - 5, 100),
        rg(len + 200, 5),
    ];
    let got = read(&s, 1, o, &rr).unwrap();
    assert_eq!(got, expect_read(&model, &rr));
    assert!(got.1[got.0[..6].iter().sum::<u64>() as usize..][..200].iter().all(|&b| b == 0), "holes read as zeros");
    assert_eq!(got.0[7], 5, "short at the end of the object");
    assert_eq!(got.0[8], 0, "nothing past the end");

    // Overwrite bits of existing blocks, out of order, in one request.
    let regions = [rg(102, 3), rg(4, 2), rg(2 * BS - 1, 2), rg(5 * BS + 16, 1)];
    let data = pattern(3, 8);
    write(&s, 1, o, &regions, &data).unwrap();
    apply(&mut model, &regions, &data);
    assert_eq!(read_all(&s, 1, o), model);
    assert_eq!(s.getattr(1, o).unwrap().logical_size, len, "overwrites inside the object keep its size");
    check_store_invariants(&s);
}

/// Reads take the block map in batches of READ_BATCH_BLOCKS references:
/// reads spanning several batches, with holes inside and across batch
/// boundaries, regions going backwards and regions sharing blocks, return
/// exactly what a model holds.
#[test]
fn reads_spanning_many_block_map_batches_match_the_model() {
    let batch = READ_BATCH_BLOCKS as u64;
    let (_d, s) = fresh(CAP_BLOCKS);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let mut model = Vec::new();
    // Mapped runs with holes between them: one hole straddles the end of the
    // first batch, single-block holes fall inside later batches.
    let runs = [(0, batch - 3), (batch + 200, 300), (batch + 501, batch), (2 * batch + 503, 2), (2 * batch + 506, 700)];
    for (i, &(first, blocks)) in runs.iter().enumerate() {
        let region = [rg(first * BS, blocks * BS)];
        let data = pattern(40 + i as u64, (blocks * BS) as usize);
        write(&s, 1, o, &region, &data).unwrap();
        apply(&mut model, &region, &data);
    }
    let len = model.len() as u64;
    assert_eq!(read_all(&s, 1, o), model);
    let cases: [&[Region]; 4] = [
        &[rg(17, len - 40)],
        &[rg((2 * batch + 100) * BS + 5, 3 * batch * BS), rg(3, (batch + 10) * BS), rg((batch + 20) * BS - 1, 2)],
        &[rg((batch - 1) * BS, 7), rg((batch - 1) * BS + 7, BS), rg(batch * BS + 7, 2 * batch * BS)],
        &[rg(len - 10, 100), rg(0, 1), rg((batch + 200) * BS, 1)],
    ];
    for regions in cases {
        assert_eq!(read(&s, 1, o, regions).unwrap(), expect_read(&model, regions), "{regions:?}");
    }
}

#[test]
fn reads_past_eof_are_short_and_holes_read_zero() {
    let (_d, s) = fresh(64);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    assert_eq!(read(&s, 1, o, &[rg(0, 100)]).unwrap(), (vec![0], vec![]), "empty object");
    write(&s, 1, o, &[rg(3 * BS + 5, 10)], b"ABCDEFGHIJ").unwrap();
    let a = s.getattr(1, o).unwrap();
    assert_eq!((a.logical_size, a.blocks_used), (3 * BS + 15, 1));
    let (lengths, data) = read(&s, 1, o, &[rg(0, 10 * BS)]).unwrap();
    assert_eq!(lengths, vec![3 * BS + 15]);
    assert!(data[..3 * BS as usize + 5].iter().all(|&b| b == 0));
    assert_eq!(&data[3 * BS as usize + 5..], b"ABCDEFGHIJ");
    let (lengths, data) = read(&s, 1, o, &[rg(3 * BS + 10, 100), rg(BS, 3), rg(1 << 40, 1)]).unwrap();
    assert_eq!(lengths, vec![5, 3, 0]);
    assert_eq!(data, b"FGHIJ\0\0\0");
}

#[test]
fn invalid_regions_and_short_data_change_nothing() {
    let (_d, s) = fresh(64);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, o, &[rg(0, 100)], &pattern(1, 100)).unwrap();
    s.commit().unwrap();
    let before = s.getattr(1, o).unwrap();
    let used = s.info().used_bytes;
    let too_many: Vec<Region> = (0..REGIONS_MAX as u64 + 1).map(|i| rg(i * 2, 1)).collect();
    let max = nasd_proto::limits::OBJECT_SIZE_MAX;
    let cases: Vec<(Vec<Region>, Status)> = vec![
        (vec![], Status::LimitExceeded),
        (too_many, Status::LimitExceeded),
        (vec![rg(0, 0)], Status::RegionOutOfRange),
        (vec![rg(max - 1, 2)], Status::RegionOutOfRange),
        (vec![rg(max, 1)], Status::RegionOutOfRange),
        (vec![rg(0, 10), rg(5, 10)], Status::RegionsOverlap),
        (vec![rg(20, 10), rg(0, 21)], Status::RegionsOverlap),
        (vec![rg(7, 1), rg(7, 1)], Status::RegionsOverlap),
    ];
    for (regions, status) in &cases {
        let n: u64 = regions.iter().map(|r| r.length.min(1 << 20)).sum();
        let data = vec![1u8; n as usize];
        assert_eq!(err(write(&s, 1, o, regions, &data)), *status, "write {regions:?}");
        assert_eq!(err(read(&s, 1, o, regions)), *status, "read {regions:?}");
        assert_eq!(err(s.blocks_required(1, o, regions)), *status, "blocksrequired {regions:?}");
    }
    // Data that ends early: the first block was stored, then the source failed.
    assert_eq!(err(write(&s, 1, o, &[rg(0, 3 * BS)], &pattern(9, BS as usize + 1))), Status::DataLengthMismatch);
    assert_eq!(s.getattr(1, o).unwrap(), before);
    assert_eq!(read_all(&s, 1, o), pattern(1, 100));
    assert_eq!(s.info().used_bytes, used, "the blocks of a failed write were released");
    check_store_invariants(&s);
}

// ----------------------------------------------------------------- fastcopy

#[test]
fn fastcopy_is_copy_on_write() {
    let (_d, s) = fresh(256);
    let (src, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let data = pattern(3, 64 * BS as usize);
    write(&s, 1, src, &[rg(0, 64 * BS)], &data).unwrap();
    s.commit().unwrap();
    let used0 = s.info().used_bytes;
    assert_eq!(used0, 64 * BS);
    assert_eq!(part_used(&s, 1), 64 * BS);

    let (clone, ca) = s.fastcopy(1, src).unwrap();
    assert_eq!(clone, src + 1);
    assert_eq!(ca.copied_object, src);
    assert_eq!(ca.logical_size, 64 * BS);
    assert_eq!(s.info().used_bytes, used0, "a fastcopy stores no data");
    assert_eq!(part_used(&s, 1), 64 * BS, "shared blocks are charged once");
    let sa = s.getattr(1, src).unwrap();
    assert_eq!((sa.blocks_used, ca.blocks_used), (32, 32), "shared blocks are split between the sharers");
    assert_eq!(sa.blocks_used + ca.blocks_used, 64);
    assert_eq!(sa.copied_object, 0);
    assert_eq!(read_all(&s, 1, clone), data);
    assert_eq!(s.blocks_required(1, clone, &[rg(0, BS)]).unwrap(), (1, 1));
    assert_eq!(s.blocks_required(1, src, &[rg(0, BS)]).unwrap(), (1, 1));

    let new_block = pattern(4, BS as usize);
    write(&s, 1, clone, &[rg(5 * BS, BS)], &new_block).unwrap();
    assert_eq!(s.info().used_bytes, used0 + BS, "overwriting a shared block adds one block");
    assert_eq!(part_used(&s, 1), 65 * BS);
    assert_eq!(read_all(&s, 1, src), data, "the source is unchanged");
    let mut expect = data.clone();
    expect[5 * BS as usize..6 * BS as usize].copy_from_slice(&new_block);
    assert_eq!(read_all(&s, 1, clone), expect);
    assert_eq!(s.blocks_required(1, src, &[rg(5 * BS, BS)]).unwrap(), (0, 0), "now exclusive");
    assert_eq!(s.blocks_required(1, clone, &[rg(5 * BS, BS)]).unwrap(), (0, 0));

    // A partial overwrite of a shared block keeps the rest of its bytes.
    write(&s, 1, src, &[rg(7 * BS + 100, 3)], b"xyz").unwrap();
    let mut src_expect = data.clone();
    src_expect[7 * BS as usize + 100..7 * BS as usize + 103].copy_from_slice(b"xyz");
    assert_eq!(read_all(&s, 1, src), src_expect);
    assert_eq!(read_all(&s, 1, clone), expect);

    // A copy of a copy; then removing the original keeps both copies intact.
    let (clone2, c2a) = s.fastcopy(1, clone).unwrap();
    assert_eq!(c2a.copied_object, clone);
    s.remove(1, src).unwrap();
    assert_eq!(read_all(&s, 1, clone), expect);
    assert_eq!(read_all(&s, 1, clone2), expect);
    assert_eq!(part_used(&s, 1), 64 * BS);
    s.commit().unwrap();
    assert_eq!(s.info().used_bytes, 64 * BS);
    assert_eq!(err(s.fastcopy(1, 999)), Status::NoSuchObject);
    assert_eq!(err(s.fastcopy(2, clone)), Status::NoSuchPartition);
    check_store_invariants(&s);
}

#[test]
fn fastcopy_copies_settable_attributes() {
    let (_d, s) = fresh(16);
    let v = attrs_with(|a| {
        a.access_control_version = 3;
        a.nearby_object = 4;
        a.fs_specific = [7; FS_SPECIFIC_LEN];
        a.logical_size = 12_345;
        a.blocks_allocated = 2;
    });
    let mask = AttrMask::ACCESS_CONTROL_VERSION
        .union(AttrMask::NEARBY_OBJECT)
        .union(AttrMask::FS_SPECIFIC)
        .union(AttrMask::LOGICAL_SIZE)
        .union(AttrMask::BLOCKS_ALLOCATED);
    let (src, sa) = s.create(1, mask, &v).unwrap();
    let (c, ca) = s.fastcopy(1, src).unwrap();
    assert_eq!(ca.access_control_version, 3);
    assert_eq!(ca.nearby_object, 4);
    assert_eq!(ca.fs_specific, [7; FS_SPECIFIC_LEN]);
    assert_eq!(ca.logical_size, 12_345);
    assert_eq!(ca.blocks_allocated, 2, "the reservation is copied");
    assert_eq!(ca.copied_object, src);
    assert!(ca.create_time >= sa.create_time);
    assert_eq!(part_used(&s, 1), 4 * BS, "both reservations are charged");
    assert_eq!(s.getattr(1, c).unwrap(), ca);
}

#[test]
fn blocks_required_counts_blocks_a_write_would_add() {
    let (_d, s) = fresh(64);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    assert_eq!(s.blocks_required(1, o, &[rg(0, 3 * BS)]).unwrap(), (3, 3), "holes need one block each");
    assert_eq!(s.blocks_required(1, o, &[rg(BS - 1, 2)]).unwrap(), (2, 2), "unaligned: both blocks");
    assert_eq!(s.blocks_required(1, o, &[rg(0, 10), rg(20, 10)]).unwrap(), (1, 1), "same block counted once");
    assert_eq!(s.blocks_required(1, o, &[rg(0, 10), rg(5 * BS, 10)]).unwrap(), (2, 2));
    write(&s, 1, o, &[rg(0, 2 * BS)], &pattern(1, 2 * BS as usize)).unwrap();
    assert_eq!(s.blocks_required(1, o, &[rg(0, 2 * BS)]).unwrap(), (0, 0), "exclusive overwrite adds nothing");
    assert_eq!(s.blocks_required(1, o, &[rg(10, 1)]).unwrap(), (0, 0));
    assert_eq!(s.blocks_required(1, o, &[rg(BS, 2 * BS)]).unwrap(), (1, 1));
    let (c, _) = s.fastcopy(1, o).unwrap();
    assert_eq!(s.blocks_required(1, c, &[rg(0, 2 * BS)]).unwrap(), (2, 2), "shared blocks need copies");
    assert_eq!(s.blocks_required(1, o, &[rg(0, 10)]).unwrap(), (1, 1));
    write(&s, 1, c, &[rg(0, 10)], b"0123456789").unwrap();
    assert_eq!(s.blocks_required(1, c, &[rg(0, BS)]).unwrap(), (0, 0));
    assert_eq!(s.blocks_required(1, o, &[rg(0, BS)]).unwrap(), (0, 0), "the source's block is exclusive again");
    assert_eq!(s.blocks_required(1, o, &[rg(BS, 1)]).unwrap(), (1, 1), "block 1 is still shared");
    let used = part_used(&s, 1);
    s.blocks_required(1, o, &[rg(0, 100 * BS)]).unwrap();
    assert_eq!(part_used(&s, 1), used, "blocksrequired changes nothing");
    assert_eq!(err(s.blocks_required(1, 999, &[rg(0, 1)])), Status::NoSuchObject);
    assert_eq!(err(s.blocks_required(1, o, &[rg(0, 2), rg(1, 2)])), Status::RegionsOverlap);
}

// ------------------------------------------------------------------- quotas

#[test]
fn quotas_are_enforced_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    s.create_partition(1).unwrap();
    assert_eq!(s.info().partitions[0].quota_bytes, 0, "a new partition has quota 0");
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    assert_eq!(err(write(&s, 1, o, &[rg(0, 1)], b"x")), Status::QuotaExceeded);
    assert_eq!(s.getattr(1, o).unwrap().logical_size, 0);
    assert_eq!(s.info().used_bytes, 0);

    s.resize_partition(1, 4 * BS).unwrap();
    let data = pattern(5, 4 * BS as usize);
    write(&s, 1, o, &[rg(0, 4 * BS)], &data).unwrap();
    assert_eq!(part_used(&s, 1), 4 * BS);
    let before = s.getattr(1, o).unwrap();
    let used = s.info().used_bytes;
    assert_eq!(err(write(&s, 1, o, &[rg(4 * BS, 1)], b"y")), Status::QuotaExceeded);
    // One region overwrites in place, the other needs a block: all or nothing.
    let two = [rg(10, 5), rg(6 * BS, 5)];
    assert_eq!(err(write(&s, 1, o, &two, b"abcdefghij")), Status::QuotaExceeded);
    assert_eq!(s.getattr(1, o).unwrap(), before, "attributes unchanged by refused writes");
    assert_eq!(read_all(&s, 1, o), data, "data unchanged by refused writes");
    assert_eq!(s.info().used_bytes, used);
    assert_eq!(part_used(&s, 1), 4 * BS);

    // Overwriting exclusive blocks at full quota needs nothing.
    write(&s, 1, o, &[rg(10, 2 * BS)], &pattern(6, 2 * BS as usize)).unwrap();
    // A copy at full quota is free; changing it is not.
    let (c, _) = s.fastcopy(1, o).unwrap();
    let cbefore = s.getattr(1, c).unwrap();
    assert_eq!(err(write(&s, 1, c, &[rg(0, 1)], b"z")), Status::QuotaExceeded);
    assert_eq!(err(truncate(&s, 1, c, 100)), Status::QuotaExceeded, "zeroing a shared tail block needs a block");
    assert_eq!(s.getattr(1, c).unwrap(), cbefore);
    truncate(&s, 1, c, 2 * BS).expect("aligned truncation needs no block");
    assert_eq!(part_used(&s, 1), 4 * BS);

    assert_eq!(err(s.resize_partition(1, 4 * BS - 1)), Status::QuotaBelowUsage);
    assert_eq!(err(s.resize_partition(1, 0)), Status::QuotaBelowUsage);
    s.resize_partition(1, 4 * BS).unwrap();
    // Quotas are whole blocks: a partial block of quota buys nothing.
    s.resize_partition(1, 5 * BS - 1).unwrap();
    assert_eq!(err(write(&s, 1, o, &[rg(4 * BS, 1)], b"y")), Status::QuotaExceeded);

    s.create_partition(2).unwrap();
    s.resize_partition(2, CAP_BLOCKS * BS - (5 * BS - 1)).unwrap();
    assert_eq!(err(s.resize_partition(2, CAP_BLOCKS * BS - (5 * BS - 1) + 1)), Status::NoSpace);
    assert_eq!(err(s.resize_partition(1, 5 * BS)), Status::NoSpace, "the sum of quotas may not exceed capacity");
    assert_eq!(err(s.resize_partition(1, u64::MAX)), Status::NoSpace);
    s.resize_partition(2, 0).unwrap();
    s.resize_partition(1, CAP_BLOCKS * BS).unwrap();
    assert_eq!(err(s.resize_partition(3, BS)), Status::NoSuchPartition);
    check_store_invariants(&s);
}

#[test]
fn reservations_count_against_the_quota() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = {
        let s = open(dir.path());
        s.create_partition(1).unwrap();
        s.resize_partition(1, 4 * BS).unwrap();
        let (a, aa) = s.create(1, AttrMask::BLOCKS_ALLOCATED, &attrs_with(|a| a.blocks_allocated = 3)).unwrap();
        assert_eq!((aa.blocks_allocated, aa.blocks_used), (3, 0));
        assert_eq!(part_used(&s, 1), 3 * BS);
        let two = attrs_with(|a| a.blocks_allocated = 2);
        assert_eq!(err(s.create(1, AttrMask::BLOCKS_ALLOCATED, &two)), Status::QuotaExceeded);
        let (b, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        write(&s, 1, b, &[rg(0, BS)], &pattern(1, BS as usize)).unwrap();
        assert_eq!(err(write(&s, 1, b, &[rg(BS, 1)], b"x")), Status::QuotaExceeded, "the rest is reserved");
        write(&s, 1, a, &[rg(0, 3 * BS)], &pattern(2, 3 * BS as usize)).expect("writes into the reservation");
        assert_eq!(part_used(&s, 1), 4 * BS);
        let ga = s.getattr(1, a).unwrap();
        assert_eq!((ga.blocks_allocated, ga.blocks_used), (3, 3));
        assert_eq!(err(write(&s, 1, a, &[rg(3 * BS, 1)], b"x")), Status::QuotaExceeded);
        assert_eq!(reserve(&s, 1, a, 0).unwrap().blocks_allocated, 3, "blocks_allocated covers the stored blocks");
        assert_eq!(err(reserve(&s, 1, b, 5)), Status::QuotaExceeded);
        assert_eq!(s.getattr(1, b).unwrap().blocks_allocated, 1, "a refused reservation changes nothing");
        s.remove(1, a).unwrap();
        assert_eq!(part_used(&s, 1), BS);
        assert_eq!(reserve(&s, 1, b, 4).unwrap().blocks_allocated, 4);
        assert_eq!(part_used(&s, 1), 4 * BS);
        assert_eq!(err(s.resize_partition(1, 3 * BS)), Status::QuotaBelowUsage, "reservations count as usage");
        assert_eq!(err(s.fastcopy(1, b)), Status::QuotaExceeded, "a copy reserves as much as its source");
        assert_eq!(
            err(s.create(1, AttrMask::BLOCKS_ALLOCATED, &attrs_with(|a| a.blocks_allocated = 1))),
            Status::QuotaExceeded
        );
        // Truncation returns unreserved blocks but keeps the reservation.
        let t = truncate(&s, 1, b, 0).unwrap();
        assert_eq!((t.blocks_allocated, t.blocks_used), (4, 0));
        assert_eq!(part_used(&s, 1), 4 * BS);
        write(&s, 1, b, &[rg(0, 2 * BS)], &pattern(3, 2 * BS as usize)).unwrap();
        check_store_invariants(&s);
        s.commit().unwrap();
        (a, b)
    };
    let s = open(dir.path());
    assert_eq!(part_used(&s, 1), 4 * BS, "reservations survive reopening");
    assert_eq!(s.getattr(1, b).unwrap().blocks_allocated, 4);
    assert_eq!(err(s.getattr(1, a)), Status::NoSuchObject);
    let (c, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    assert_eq!(err(write(&s, 1, c, &[rg(0, 1)], b"x")), Status::QuotaExceeded);
    check_store_invariants(&s);
}

/// Truncating away blocks that a copy still shares frees no space, but gives
/// the object's reservation back as slack: that must not push the partition
/// past its quota (which would refuse every later write, even in place).
#[test]
fn truncating_shared_blocks_keeps_the_partition_within_quota() {
    let (_d, s) = fresh(4);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, o, &[rg(0, 3 * BS)], &pattern(1, 3 * BS as usize)).unwrap();
    reserve(&s, 1, o, 2).unwrap();
    let (c, _) = s.fastcopy(1, o).unwrap();
    assert_eq!(part_used(&s, 1), 3 * BS);
    let before = s.getattr(1, o).unwrap();
    // Dropping all three shared blocks would leave 3 stored + 2 reserved > 4.
    assert_eq!(err(truncate(&s, 1, o, 0)), Status::QuotaExceeded);
    assert_eq!(s.getattr(1, o).unwrap(), before, "a refused truncation changes nothing");
    assert!(part_used(&s, 1) <= 4 * BS);
    // Dropping two shared blocks gives back one reserved slot: 3 stored + 1 = 4 fits.
    let a = truncate(&s, 1, o, BS).unwrap();
    assert_eq!((a.logical_size, a.blocks_allocated), (BS, 2));
    assert_eq!(part_used(&s, 1), 4 * BS);
    // In-place overwrites of exclusive blocks still work at full quota.
    write(&s, 1, c, &[rg(2 * BS, 10)], b"0123456789").unwrap();
    // Without the reservation the truncation frees the slot.
    reserve(&s, 1, o, 0).unwrap();
    truncate(&s, 1, o, 0).unwrap();
    assert_eq!(part_used(&s, 1), 3 * BS);
    check_store_invariants(&s);
}

/// A setattr that sets a reservation and a size is refused as a whole: the
/// reservation must not stick when the truncation needs a block it cannot get.
#[test]
fn setattr_reservation_and_size_are_atomic() {
    let (_d, s) = fresh(3);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, o, &[rg(0, 2 * BS)], &pattern(1, 2 * BS as usize)).unwrap();
    s.fastcopy(1, o).unwrap();
    let before = s.getattr(1, o).unwrap();
    let used = part_used(&s, 1);
    // Reserving 3 fits (2 stored + 1 slack = 3), but zeroing the shared tail
    // block of a truncation to 100 bytes then needs a fourth block.
    let v = attrs_with(|a| {
        a.blocks_allocated = 3;
        a.logical_size = 100;
        a.access_control_version = 5;
    });
    let mask = AttrMask::BLOCKS_ALLOCATED.union(AttrMask::LOGICAL_SIZE).union(AttrMask::ACCESS_CONTROL_VERSION);
    assert_eq!(err(s.setattr(1, o, mask, &v)), Status::QuotaExceeded);
    assert_eq!(s.getattr(1, o).unwrap(), before, "nothing changed");
    assert_eq!(part_used(&s, 1), used);
    check_store_invariants(&s);
    // Lowering a reservation while the truncation fails also changes nothing.
    reserve(&s, 1, o, 3).unwrap();
    let before = s.getattr(1, o).unwrap();
    let v = attrs_with(|a| {
        a.blocks_allocated = 2;
        a.logical_size = 100;
    });
    s.resize_partition(1, 3 * BS).unwrap();
    assert_eq!(
        err(s.setattr(1, o, AttrMask::BLOCKS_ALLOCATED.union(AttrMask::LOGICAL_SIZE), &v)),
        Status::QuotaExceeded
    );
    assert_eq!(s.getattr(1, o).unwrap(), before, "nothing changed");
    check_store_invariants(&s);
}

// --------------------------------------------------------------- partitions

#[test]
fn remove_partition_requires_force_when_it_holds_data() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    s.create_partition(1).unwrap();
    s.resize_partition(1, 64 * BS).unwrap();
    assert_eq!(err(s.create_partition(1)), Status::PartitionExists);
    assert_eq!(err(s.create_partition(0)), Status::BadArguments);
    s.create_partition(2).unwrap();
    s.remove_partition(2, false).expect("a fresh partition holds no data");
    assert_eq!(err(s.getattr(2, FIRST_OBJECT)), Status::NoSuchPartition);

    s.create_partition(3).unwrap();
    s.resize_partition(3, 4 * BS).unwrap();
    write(&s, 3, FIRST_OBJECT, &[rg(0, 1)], b"x").unwrap();
    assert_eq!(err(s.remove_partition(3, false)), Status::PartitionNotEmpty, "data in the first object counts");
    s.remove_partition(3, true).unwrap();

    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let data = pattern(8, 8 * BS as usize);
    write(&s, 1, o, &[rg(0, 8 * BS)], &data).unwrap();
    let (c, _) = s.fastcopy(1, o).unwrap();
    s.commit().unwrap();
    assert_eq!(s.info().used_bytes, 8 * BS);
    assert_eq!(err(s.remove_partition(1, false)), Status::PartitionNotEmpty);
    assert_eq!(read_all(&s, 1, o), data, "a refused removal changes nothing");
    assert_eq!(read_all(&s, 1, c), data);
    s.remove_partition(1, true).unwrap();
    assert_eq!(err(s.getattr(1, o)), Status::NoSuchPartition);
    assert!(s.info().partitions.is_empty());
    s.commit().unwrap();
    assert_eq!(s.info().used_bytes, 0, "forced removal frees the blocks");
    assert_eq!(err(s.remove_partition(1, true)), Status::NoSuchPartition);
    check_store_invariants(&s);
    drop(s);

    let s = open(dir.path());
    assert!(s.info().partitions.is_empty());
    assert_eq!(s.info().used_bytes, 0);
    s.create_partition(1).unwrap();
    assert_eq!(contents(&s, 1), vec![1, 2, 3, 4], "a recreated partition starts empty");
}

#[test]
fn initialize_clears_every_partition_durably() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open(dir.path());
        s.create_partition(1).unwrap();
        s.resize_partition(1, 64 * BS).unwrap();
        s.create_partition(2).unwrap();
        let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        write(&s, 1, o, &[rg(0, 3 * BS)], &pattern(1, 3 * BS as usize)).unwrap();
        s.commit().unwrap();
        let (o2, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        write(&s, 1, o2, &[rg(0, 2 * BS)], &pattern(2, 2 * BS as usize)).unwrap();
        s.initialize(0, DEFAULT_SKEW_NS).unwrap();
        assert!(s.info().partitions.is_empty());
        assert_eq!(s.info().used_bytes, 0);
        assert_eq!(err(s.getattr(1, o)), Status::NoSuchPartition);
        let host = nasd_env::clock::system_ns();
        assert!(s.now_ns().abs_diff(host) < 10_000_000_000, "clock 0 keeps the clock");
        check_store_invariants(&s);
        // No commit: initialize is durable on its own.
    }
    let s = open(dir.path());
    assert!(s.info().partitions.is_empty());
    assert_eq!(s.info().used_bytes, 0);
    s.create_partition(1).unwrap();
}

// -------------------------------------------------------------- persistence

fn snapshot(s: &Store) -> Vec<(u64, u64, Attributes, Vec<u8>)> {
    let mut out = Vec::new();
    for p in s.info().partitions.iter().map(|p| p.partition) {
        for o in contents(s, p) {
            if !is_control(o) {
                out.push((p, o, s.getattr(p, o).unwrap(), read_all(s, p, o)));
            }
        }
    }
    out
}

#[test]
fn committed_state_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let (info, snap, a, b, c) = {
        let s = open(dir.path());
        s.create_partition(1).unwrap();
        s.resize_partition(1, 100 * BS).unwrap();
        s.create_partition(2).unwrap();
        s.resize_partition(2, 10 * BS).unwrap();
        let v = attrs_with(|a| {
            a.access_control_version = 9;
            a.nearby_object = 4;
            a.fs_specific = [0x5A; FS_SPECIFIC_LEN];
            a.blocks_allocated = 5;
        });
        let mask = AttrMask::ACCESS_CONTROL_VERSION
            .union(AttrMask::NEARBY_OBJECT)
            .union(AttrMask::FS_SPECIFIC)
            .union(AttrMask::BLOCKS_ALLOCATED);
        let (a, _) = s.create(1, mask, &v).unwrap();
        write(&s, 1, a, &[rg(0, 3 * BS + 7), rg(5 * BS, 10)], &pattern(1, 3 * BS as usize + 17)).unwrap();
        let (b, _) = s.fastcopy(1, a).unwrap();
        write(&s, 1, b, &[rg(0, 10)], b"0123456789").unwrap();
        let (c, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        write(&s, 1, c, &[rg(0, 1)], b"c").unwrap();
        s.remove(1, c).unwrap();
        truncate(&s, 1, a, 5 * BS + 5).unwrap();
        let (d, _) = s.create(2, AttrMask::default(), &Attributes::default()).unwrap();
        write(&s, 2, d, &[rg(BS, 2 * BS)], &pattern(4, 2 * BS as usize)).unwrap();
        write(&s, 2, FIRST_OBJECT, &[rg(0, 3)], b"abc").unwrap();
        s.commit().unwrap();
        check_store_invariants(&s);
        (s.info(), snapshot(&s), a, b, c)
    };
    let s = open(dir.path());
    assert_eq!(s.info(), info, "drive id, quotas, usage and object counts survive");
    assert_eq!(snapshot(&s), snap, "attributes and data survive");
    check_store_invariants(&s);
    // Sharing survives: the copy's untouched blocks are still shared.
    assert_eq!(s.blocks_required(1, b, &[rg(BS, BS)]).unwrap(), (1, 1));
    assert_eq!(s.blocks_required(1, b, &[rg(0, 1)]).unwrap(), (0, 0));
    write(&s, 1, b, &[rg(BS, 5)], b"after").unwrap();
    assert_eq!(
        &read_all(&s, 1, a)[BS as usize..BS as usize + 5],
        &pattern(1, 3 * BS as usize + 17)[BS as usize..BS as usize + 5]
    );
    let (e, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    assert!(e > c && e > b && e > a, "identifiers are not reused ({e})");
}

#[test]
fn identifiers_are_never_reused_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut issued: Vec<u64> = Vec::new();
    {
        let s = open(dir.path());
        s.create_partition(1).unwrap();
        s.resize_partition(1, 16 * BS).unwrap();
        s.commit().unwrap();
        issued.push(s.create(1, AttrMask::default(), &Attributes::default()).unwrap().0);
        // Crash: no commit.
    }
    let mut committed = 0;
    for round in 0..4 {
        let s = open(dir.path());
        assert_eq!(contents(&s, 1).len(), 4 + committed, "round {round}: only committed objects come back");
        let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        let (c, _) = s.fastcopy(1, o).unwrap();
        for id in [o, c] {
            assert!(
                issued.iter().all(|&old| id > old),
                "round {round}: identifier {id} handed out again (issued {issued:?})"
            );
            issued.push(id);
        }
        if round % 2 == 1 {
            s.remove(1, c).unwrap();
            s.commit().unwrap();
            committed += 1;
        }
        // Otherwise: crash without a commit.
    }
}

#[test]
fn uncommitted_changes_are_absent_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let v1 = pattern(1, 2 * BS as usize + 50);
    let (a, r) = {
        let s = open(dir.path());
        s.create_partition(1).unwrap();
        s.resize_partition(1, 256 * BS).unwrap();
        let (a, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        write(&s, 1, a, &[rg(0, v1.len() as u64)], &v1).unwrap();
        let (r, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        write(&s, 1, r, &[rg(0, 5)], b"keep!").unwrap();
        s.commit().unwrap();
        let old_phys: Vec<u64> = (0..3).map(|l| phys_of(&s, 1, a, l)).collect();

        // After the commit: overwrite, attribute change, new objects, a removal.
        write(&s, 1, a, &[rg(0, v1.len() as u64)], &pattern(2, v1.len())).unwrap();
        s.setattr(1, a, AttrMask::ACCESS_CONTROL_VERSION, &attrs_with(|x| x.access_control_version = 77)).unwrap();
        s.remove(1, r).unwrap();
        for i in 0..20 {
            let (n, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
            write(&s, 1, n, &[rg(0, 4 * BS)], &pattern(10 + i, 4 * BS as usize)).unwrap();
        }
        truncate(&s, 1, a, 10).unwrap();
        // The committed index still points at a's old blocks: nothing may reuse them yet.
        let m = lock(&s.meta);
        for part in m.partitions.values() {
            for obj in part.objects.values() {
                for b in obj.blocks.values() {
                    assert!(!old_phys.contains(&b.phys), "block {} reused before the commit that released it", b.phys);
                }
            }
        }
        drop(m);
        check_store_invariants(&s);
        (a, r)
    };
    let s = open(dir.path());
    assert_eq!(read_all(&s, 1, a), v1, "the committed data, digest-verified");
    assert_eq!(s.getattr(1, a).unwrap().access_control_version, 0);
    assert_eq!(read_all(&s, 1, r), b"keep!");
    assert_eq!(contents(&s, 1), vec![1, 2, 3, 4, a, r]);
    assert_eq!(s.info().used_bytes, 4 * BS);
    check_store_invariants(&s);
}

#[test]
fn a_store_directory_opens_only_once() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    match Store::open(dir.path(), &opts()) {
        Err(StoreError::Locked(_)) => {}
        other => panic!("expected Locked, got {other:?}"),
    }
    drop(s);
    let _again = open(dir.path());
}

#[test]
fn flush_checks_its_arguments() {
    let (_d, s) = fresh(4);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    s.flush(1, &[o, FIRST_OBJECT, PARTITION_CONTENTS]).unwrap();
    s.flush(1, &[]).unwrap();
    assert_eq!(err(s.flush(1, &[o + 1])), Status::NoSuchObject);
    assert_eq!(err(s.flush(9, &[])), Status::NoSuchPartition);
    assert_eq!(err(s.flush(9, &[PARTITION_CONTROL])), Status::NoSuchPartition);
    assert_eq!(err(s.flush_partition(9)), Status::NoSuchPartition);
    s.flush_partition(1).unwrap();
}

// ----------------------------------------------------------------- digests

#[test]
fn stored_digests_match_the_stored_blocks() {
    let (_d, s) = fresh(128);
    let (a, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, a, &[rg(100, 5 * BS), rg(8 * BS + 3, 17)], &pattern(1, 5 * BS as usize + 17)).unwrap();
    let (b, _) = s.fastcopy(1, a).unwrap();
    write(&s, 1, b, &[rg(2 * BS + 1, 1), rg(7, 7)], &pattern(2, 8)).unwrap();
    truncate(&s, 1, a, 3 * BS + 77).unwrap();
    s.commit().unwrap();
    truncate(&s, 1, b, 4 * BS + 1).unwrap();
    check_store_invariants(&s);
    // And against the digests as the database stores them.
    let m = lock(&s.meta);
    let mut n = 0;
    db::load_blocks(&lock(&s.db), |p, o, l, r| {
        let mut buf = vec![0u8; BS as usize];
        s.data.read_exact_at(&mut buf, r.phys * BS).unwrap();
        assert_eq!(nasd_crypto::block_digest(&buf), r.digest, "durable digest of {p}/{o}/{l}");
        assert!(m.partitions[&p].objects.contains_key(&o));
        n += 1;
        Ok(())
    })
    .unwrap();
    assert!(n >= 8);
}

#[test]
fn a_corrupted_block_fails_its_reads_and_nothing_else() {
    let (d, s) = fresh(64);
    let (a, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let data = pattern(1, 3 * BS as usize);
    write(&s, 1, a, &[rg(0, 3 * BS)], &data).unwrap();
    let (b, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, b, &[rg(0, BS)], &pattern(2, BS as usize)).unwrap();
    s.commit().unwrap();

    let phys = phys_of(&s, 1, a, 1);
    let f = std::fs::OpenOptions::new().read(true).write(true).open(d.path().join("blocks.dat")).unwrap();
    let mut byte = [0u8; 1];
    f.read_exact_at(&mut byte, phys * BS + 100).unwrap();
    byte[0] ^= 0x40;
    f.write_all_at(&byte, phys * BS + 100).unwrap();

    for regions in [vec![rg(BS, 10)], vec![rg(0, 3 * BS)], vec![rg(0, 1), rg(2 * BS - 1, 1)]] {
        match read(&s, 1, a, &regions) {
            Err(StoreError::DataCorrupted { partition: 1, object, block: 1 }) if object == a => {}
            other => panic!("expected DataCorrupted for {regions:?}, got {other:?}"),
        }
    }
    assert_eq!(
        read(&s, 1, a, &[rg(0, BS), rg(2 * BS, BS)]).unwrap().1,
        [&data[..BS as usize], &data[2 * BS as usize..]].concat()
    );
    assert_eq!(read_all(&s, 1, b), pattern(2, BS as usize), "other objects read fine");
    // A partial overwrite must merge with the block: refused, nothing changes.
    let before = s.getattr(1, a).unwrap();
    assert_eq!(err(write(&s, 1, a, &[rg(BS + 5, 3)], b"xyz")), Status::DataCorrupted);
    assert_eq!(s.getattr(1, a).unwrap(), before);
    // Replacing the whole block repairs the object.
    write(&s, 1, a, &[rg(BS, BS)], &data[BS as usize..2 * BS as usize]).unwrap();
    assert_eq!(read_all(&s, 1, a), data);
}

// -------------------------------------------------------------- concurrency

#[test]
fn concurrent_whole_object_writes_are_atomic() {
    let (_d, s) = fresh(1024);
    let s = Arc::new(s);
    const LEN: u64 = 3 * BS + 100;
    let (shared, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, shared, &[rg(0, LEN)], &vec![0xEE; LEN as usize]).unwrap();
    std::thread::scope(|scope| {
        for t in 0..6u8 {
            let s = &s;
            scope.spawn(move || {
                let (mine, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
                for i in 0..15u64 {
                    let v = t + 1;
                    // Two regions, so a torn write would show up as a mix.
                    write(s, 1, shared, &[rg(LEN / 2, LEN - LEN / 2), rg(0, LEN / 2)], &vec![v; LEN as usize]).unwrap();
                    let (_, got) = read(s, 1, shared, &[rg(0, LEN)]).unwrap();
                    assert!(got.iter().all(|&x| x == got[0]), "a read saw a mix of writes");
                    let own = pattern(t as u64 * 100 + i, (i as usize % 3 + 1) * 1000);
                    write(s, 1, mine, &[rg(0, own.len() as u64)], &own).unwrap();
                    assert_eq!(&read(s, 1, mine, &[rg(0, own.len() as u64)]).unwrap().1, &own);
                    if i % 5 == 0 {
                        s.fastcopy(1, shared).unwrap();
                    }
                    if i % 7 == 0 {
                        s.commit().unwrap();
                    }
                }
            });
        }
    });
    let got = read_all(&s, 1, shared);
    assert!((1..=6).contains(&got[0]) && got.iter().all(|&x| x == got[0]));
    check_store_invariants(&s);
}

// --------------------------------------- no object lock while data streams

/// Bound on how long a test waits for an operation that must not be blocked
/// by a held write or read: a hang guard only (each such operation takes
/// milliseconds), so a regression fails instead of hanging the suite.
const HANG_GUARD: std::time::Duration = std::time::Duration::from_secs(60);

/// A write's data, held before the piece that crosses byte `pause_at` until
/// the test lets it go on (or drops its sender).
struct HeldSource {
    data: Vec<u8>,
    pos: usize,
    pause_at: usize,
    reached: Option<std::sync::mpsc::Sender<()>>,
    resume: std::sync::mpsc::Receiver<()>,
}

impl DataSource for HeldSource {
    fn fill(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        if self.pos + buf.len() > self.pause_at {
            if let Some(reached) = self.reached.take() {
                reached.send(()).unwrap();
                let _ = self.resume.recv();
            }
        }
        (&mut &self.data[self.pos..]).fill(buf)?;
        self.pos += buf.len();
        Ok(())
    }
}

/// A write held mid-data on a thread of `scope`: returned once the store
/// is waiting for the piece that crosses `pause_at` (every block before it,
/// and the base of the block it falls in, already loaded), with what lets it
/// go on.
fn held_write<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    s: &'s Store,
    o: u64,
    regions: Vec<Region>,
    data: Vec<u8>,
    pause_at: usize,
    check: WriteCheck,
) -> (std::sync::mpsc::Sender<()>, std::thread::ScopedJoinHandle<'s, Result<u64, StoreError>>) {
    let (reached_tx, reached) = std::sync::mpsc::channel();
    let (resume, resume_rx) = std::sync::mpsc::channel();
    let mut source = HeldSource { data, pos: 0, pause_at, reached: Some(reached_tx), resume: resume_rx };
    let writer = scope.spawn(move || s.write_checked(1, o, &regions, &mut source, check));
    reached.recv_timeout(HANG_GUARD).expect("the write reaches its pause");
    (resume, writer)
}

/// Fails with the first byte where `got` and `want` differ (not both whole).
#[track_caller]
fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    if let Some(at) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!("{what}: byte {at} is {} not {} (block {})", got[at], want[at], at as u64 / BS);
    }
    assert_eq!(got.len(), want.len(), "{what}: length");
}

/// Runs `f` on another thread while a write or read is held (`held` lets
/// it go on). If `f` does not finish within the hang guard, the held one is
/// let go first — so `f` can finish, and its scope end — and the test fails.
fn unblocked<T: Send>(
    what: &str,
    held: std::sync::mpsc::Sender<()>,
    f: impl FnOnce() -> T + Send,
) -> (T, std::sync::mpsc::Sender<()>) {
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel();
        scope.spawn(move || tx.send(f()).unwrap());
        match rx.recv_timeout(HANG_GUARD) {
            Ok(v) => (v, held),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                drop(held);
                let _ = rx.recv();
                panic!("{what} waited for a write or read held mid-data")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
        }
    })
}

/// A write whose data streams without the object's lock must not lose the
/// bytes another write installed meanwhile in the blocks it covers only in
/// part: each such block is merged again from the current block at
/// install. Checked for blocks changed by a write (both orders of bytes
/// around each other's, one range overlapping: the later install wins) and
/// by a truncation that dropped or rewrote them. Without the re-merge (the
/// block installed as loaded when the data began), B's bytes next to A's
/// came back as they were before B, and the truncated tail came back.
#[test]
fn writes_merge_the_blocks_they_cover_in_part_with_changes_installed_meanwhile() {
    let (_d, s) = fresh(64);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let mut model = pattern(1, (3 * BS) as usize);
    write(&s, 1, o, &[rg(0, 3 * BS)], &model).unwrap();

    // A covers blocks 0, 1 and 2 in part; held in its last piece, so it
    // loaded all three before B installs.
    let a_regions = vec![rg(100, 200), rg(BS + 50, BS - 50), rg(2 * BS, 50)];
    let a_data = pattern(2, (200 + BS - 50 + 50) as usize);
    let b_regions = [rg(0, 100), rg(250, 100), rg(BS, 50), rg(2 * BS + 50, 100), rg(5 * BS, 10)];
    let b_data = pattern(3, 360);
    std::thread::scope(|scope| {
        let pause = (200 + BS - 50 + 10) as usize;
        let (resume, a) = held_write(scope, &s, o, a_regions.clone(), a_data.clone(), pause, WriteCheck::default());
        let (b, resume) = unblocked("a write of the same object", resume, || write(&s, 1, o, &b_regions, &b_data));
        b.unwrap();
        apply(&mut model, &b_regions, &b_data);
        drop(resume);
        a.join().unwrap().unwrap();
        apply(&mut model, &a_regions, &a_data);
    });
    same_bytes(&read_all(&s, 1, o), &model, "every byte of both writes, A's where they overlap");
    check_store_invariants(&s);

    // A covers the last block in part and one past it; a truncation drops
    // the last block and rewrites the one before meanwhile.
    let size = model.len() as u64;
    let a_regions = vec![rg(size - BS + 10, 20), rg(size + 100, 30)];
    let a_data = pattern(4, 50);
    std::thread::scope(|scope| {
        let (resume, a) = held_write(scope, &s, o, a_regions.clone(), a_data.clone(), 25, WriteCheck::default());
        let cut = size - BS - 7;
        let (cut_done, resume) = unblocked("a truncation of the same object", resume, || truncate(&s, 1, o, cut));
        cut_done.unwrap();
        model.truncate(cut as usize);
        drop(resume);
        a.join().unwrap().unwrap();
        apply(&mut model, &a_regions, &a_data);
    });
    same_bytes(&read_all(&s, 1, o), &model, "the truncated bytes stay zero around A's");
    check_store_invariants(&s);
}

/// A write held mid-data holds no lock: on its object and its partition,
/// reads, writes, attribute changes, clones, transactions, commits and the
/// partition's removal all go on. Once its partition is gone — even if a
/// new one of the same number holds an object of the same number — it
/// installs nothing and gives back nothing it did not take. Before, the
/// write held its object's stripe lock until its data was in, and each of
/// these waited for it (with a client that stopped sending: up to the
/// drive's time-out, per chunk).
#[test]
fn a_write_held_mid_data_blocks_nothing_and_outlives_its_partition_harmlessly() {
    let (_d, s) = fresh(64);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let v1 = pattern(1, 2 * BS as usize);
    write(&s, 1, o, &[rg(0, 2 * BS)], &v1).unwrap();
    std::thread::scope(|scope| {
        let a_data = pattern(2, 3 * BS as usize);
        let (resume, a) = held_write(scope, &s, o, vec![rg(0, 3 * BS)], a_data, BS as usize + 5, WriteCheck::default());
        let ((), resume) = unblocked("the object's other requests", resume, || {
            same_bytes(&read_all(&s, 1, o), &v1, "the held write is not visible");
            write(&s, 1, o, &[rg(10, 10)], &[9; 10]).unwrap();
            s.setattr(1, o, AttrMask::FS_SPECIFIC, &attrs_with(|a| a.fs_specific[0] = 1)).unwrap();
            s.fastcopy(1, o).unwrap();
            s.txn_begin(1, o, 5).unwrap();
            s.txn_end(1, o, 5, false).unwrap();
            s.commit().unwrap();
            s.remove_partition(1, true).unwrap();
            s.create_partition(1).unwrap();
            s.resize_partition(1, 64 * BS).unwrap();
            while s.create(1, AttrMask::default(), &Attributes::default()).unwrap().0 < o {}
        });
        drop(resume);
        assert_eq!(err(a.join().unwrap()), Status::NoSuchObject);
    });
    assert_eq!(s.getattr(1, o).unwrap().logical_size, 0, "the new object of the same number is untouched");
    check_store_invariants(&s);
}

/// The write's conditions hold when it installs, not only when it began:
/// an access control version changed while its data streamed (a
/// revocation) refuses it with `ACCESS_REVOKED`, and an object grown past
/// an append's offset meanwhile refuses the append — changing nothing
/// either way. Before, they were checked only before the data (the version
/// by the drive, before the store was even called).
#[test]
fn a_write_installs_only_if_its_conditions_still_hold() {
    let (_d, s) = fresh(64);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let v1 = pattern(1, (BS + 100) as usize);
    write(&s, 1, o, &[rg(0, v1.len() as u64)], &v1).unwrap();
    let revoked = WriteCheck { append_only: false, access_control_version: Some(0), pal: None };
    assert_eq!(
        err(s.write_checked(
            1,
            o,
            &[rg(0, 1)],
            &mut &[1u8][..],
            WriteCheck { access_control_version: Some(3), ..revoked }
        )),
        Status::AccessRevoked,
        "checked before the data too"
    );
    std::thread::scope(|scope| {
        let (resume, a) = held_write(scope, &s, o, vec![rg(50, 2 * BS)], pattern(2, 2 * BS as usize), 100, revoked);
        let acv = attrs_with(|a| a.access_control_version = 1);
        let (set, resume) =
            unblocked("a revocation", resume, || s.setattr(1, o, AttrMask::ACCESS_CONTROL_VERSION, &acv));
        set.unwrap();
        drop(resume);
        assert_eq!(err(a.join().unwrap()), Status::AccessRevoked);
    });
    same_bytes(&read_all(&s, 1, o), &v1, "nothing written");
    check_store_invariants(&s);

    let append = WriteCheck { append_only: true, access_control_version: Some(1), pal: None };
    std::thread::scope(|scope| {
        let at = v1.len() as u64;
        let (resume, a) = held_write(scope, &s, o, vec![rg(at, BS)], pattern(3, BS as usize), 10, append);
        let (grown, resume) = unblocked("a write past the end", resume, || write(&s, 1, o, &[rg(at, 1)], &[7]));
        grown.unwrap();
        drop(resume);
        assert_eq!(err(a.join().unwrap()), Status::RightsInsufficient, "NOT_AN_APPEND");
    });
    let mut model = v1.clone();
    model.push(7);
    assert_eq!(read_all(&s, 1, o), model);
    check_store_invariants(&s);
}

/// A write planned before a transaction began and installed after it is
/// recorded in the transaction's undo (so an abort takes it back), and the
/// blocks the undo now holds are charged at install: in a partition too
/// full for both, the install is refused with `QUOTA_EXCEEDED`, changing
/// nothing. Before, the install trusted the charge planned before the
/// transaction (0: the blocks it replaced were its object's alone) and
/// took the partition past its quota.
#[test]
fn a_write_installing_into_a_transaction_begun_meanwhile_is_undone_and_charged() {
    let (_d, s) = fresh(8);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let v1 = pattern(1, 3 * BS as usize);
    write(&s, 1, o, &[rg(0, 3 * BS)], &v1).unwrap();
    let v2 = pattern(2, 3 * BS as usize);
    std::thread::scope(|scope| {
        let (resume, a) = held_write(scope, &s, o, vec![rg(0, 3 * BS)], v2.clone(), BS as usize, WriteCheck::default());
        let (begun, resume) = unblocked("a transaction's begin", resume, || s.txn_begin(1, o, 9));
        begun.unwrap();
        drop(resume);
        a.join().unwrap().unwrap();
    });
    same_bytes(&read_all(&s, 1, o), &v2, "the write installed");
    assert_eq!(part_used(&s, 1), 6 * BS, "the old blocks are held for the transaction");
    check_store_invariants(&s);
    s.txn_end(1, o, 9, false).unwrap();
    same_bytes(&read_all(&s, 1, o), &v1, "the abort takes the write back");
    check_store_invariants(&s);

    // 6 blocks used of 8: overwriting 3 is free, unless a transaction holds them.
    let (other, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, other, &[rg(0, 3 * BS)], &pattern(3, 3 * BS as usize)).unwrap();
    std::thread::scope(|scope| {
        let (resume, a) = held_write(scope, &s, o, vec![rg(0, 3 * BS)], v2.clone(), BS as usize, WriteCheck::default());
        let (begun, resume) = unblocked("a transaction's begin", resume, || s.txn_begin(1, o, 10));
        begun.unwrap();
        drop(resume);
        assert_eq!(err(a.join().unwrap()), Status::QuotaExceeded);
    });
    same_bytes(&read_all(&s, 1, o), &v1, "nothing written");
    assert_eq!(part_used(&s, 1), 6 * BS);
    check_store_invariants(&s);
}

/// A read's data, held after its first `pause_after` bytes until the test
/// lets it go on.
struct HeldSink {
    data: Vec<u8>,
    pause_after: usize,
    reached: Option<std::sync::mpsc::Sender<()>>,
    resume: std::sync::mpsc::Receiver<()>,
}

impl DataSink for HeldSink {
    fn start(&mut self, _lengths: &[u64]) -> std::io::Result<()> {
        Ok(())
    }
    fn data(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.data.extend_from_slice(bytes);
        if self.data.len() >= self.pause_after {
            if let Some(reached) = self.reached.take() {
                reached.send(()).unwrap();
                let _ = self.resume.recv();
            }
        }
        Ok(())
    }
}

/// A read of `regions` of `o` held after `pause_after` bytes, on a thread of `scope`.
fn held_read<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    s: &'s Store,
    o: u64,
    regions: Vec<Region>,
    pause_after: usize,
) -> (std::sync::mpsc::Sender<()>, std::thread::ScopedJoinHandle<'s, Result<Vec<u8>, StoreError>>) {
    let (reached_tx, reached) = std::sync::mpsc::channel();
    let (resume, resume_rx) = std::sync::mpsc::channel();
    let mut sink = HeldSink { data: Vec::new(), pause_after, reached: Some(reached_tx), resume: resume_rx };
    let reader = scope.spawn(move || s.read(1, o, &regions, &mut sink).map(|()| sink.data));
    reached.recv_timeout(HANG_GUARD).expect("the read reaches its pause");
    (resume, reader)
}

/// A read held while its caller sends data on holds no lock, and serves
/// the object as it was when it took its blocks: they are pinned, so
/// overwriting the object, committing (which releases the old blocks) and
/// writing again — on a drive so small that the allocator must hand out
/// every block it can — never reuses them under the read. Once the read is
/// done they are free again. Without the pins (a freed block reusable at
/// once) the second write took the read's blocks and the read failed its
/// digest check; before pins, the read held the object's lock, and the
/// writes waited for the reader's network.
#[test]
fn a_read_serves_its_pinned_blocks_while_they_are_overwritten_released_and_reallocated() {
    let dir = tempfile::tempdir().unwrap();
    // Room for the read's 3 blocks and two writes': the third write must
    // reuse blocks.
    let s = Store::open(dir.path(), &StoreOptions { capacity_bytes: 9 * BS, ..opts() }).unwrap();
    s.create_partition(1).unwrap();
    s.resize_partition(1, 9 * BS).unwrap();
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let v1 = pattern(1, 3 * BS as usize);
    write(&s, 1, o, &[rg(0, 3 * BS)], &v1).unwrap();
    s.commit().unwrap();
    let free_at_rest = lock(&s.meta).free_blocks();
    std::thread::scope(|scope| {
        let (resume, r) = held_read(scope, &s, o, vec![rg(0, 3 * BS)], BS as usize);
        let ((), resume) = unblocked("writes and commits of the object", resume, || {
            for seed in 2..6 {
                write(&s, 1, o, &[rg(0, 3 * BS)], &pattern(seed, 3 * BS as usize)).unwrap();
                s.commit().unwrap();
            }
        });
        assert_eq!(lock(&s.meta).pinned_free.len(), 3, "the read's blocks are free but pinned");
        drop(resume);
        same_bytes(&r.join().unwrap().unwrap(), &v1, "the read sees the object as it began");
    });
    assert_eq!(lock(&s.meta).free_blocks(), free_at_rest, "the last pin freed the blocks");
    check_store_invariants(&s);
}

/// A read longer than one batch of the block map whose partition is removed
/// (and made again, with an object of the same number) between two batches
/// fails with `NO_SUCH_OBJECT` rather than go on with the new object's
/// blocks; the batch it held stays readable until then.
#[test]
fn a_read_outliving_its_partition_ends_with_no_such_object() {
    let blocks = READ_BATCH_BLOCKS as u64 + 1;
    let (_d, s) = fresh(2 * blocks + 8);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, o, &[rg(0, blocks * BS)], &pattern(1, (blocks * BS) as usize)).unwrap();
    std::thread::scope(|scope| {
        let (resume, r) = held_read(scope, &s, o, vec![rg(0, blocks * BS)], BS as usize);
        let ((), resume) = unblocked("the partition's removal", resume, || {
            s.remove_partition(1, true).unwrap();
            s.create_partition(1).unwrap();
            s.resize_partition(1, 2 * blocks * BS).unwrap();
            while s.create(1, AttrMask::default(), &Attributes::default()).unwrap().0 < o {}
            write(&s, 1, o, &[rg(0, blocks * BS)], &pattern(2, (blocks * BS) as usize)).unwrap();
        });
        drop(resume);
        assert_eq!(err(r.join().unwrap().map(|data| data.len())), Status::NoSuchObject);
    });
    check_store_invariants(&s);
}

// ------------------------------------------------------------- transactions

/// A model of an object's bytes under one write transaction: what reads
/// must show now, and what an abort must bring back.
struct TxnCase {
    now: Vec<u8>,
    before: Vec<u8>,
}

impl TxnCase {
    #[track_caller]
    fn write(&mut self, s: &Store, o: u64, regions: &[Region], seed: u64) {
        let data = pattern(seed, regions.iter().map(|r| r.length).sum::<u64>() as usize);
        write(s, 1, o, regions, &data).unwrap();
        apply(&mut self.now, regions, &data);
        assert_eq!(read_all(s, 1, o), self.now, "reads see the transaction's writes at once");
        check_store_invariants(s);
    }
    #[track_caller]
    fn resize(&mut self, s: &Store, o: u64, size: u64) {
        truncate(s, 1, o, size).unwrap();
        self.now.resize(size as usize, 0);
        assert_eq!(read_all(s, 1, o), self.now);
        check_store_invariants(s);
    }
}

/// An object with 2.5 blocks of data, a hole at block 3 and a block at 4.
fn txn_object(s: &Store) -> (u64, Vec<u8>) {
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let mut v = Vec::new();
    let regions = [rg(0, 2 * BS + BS / 2), rg(4 * BS, 100)];
    let data = pattern(1, 2 * BS as usize + BS as usize / 2 + 100);
    write(s, 1, o, &regions, &data).unwrap();
    apply(&mut v, &regions, &data);
    (o, v)
}

#[test]
fn txn_abort_restores_every_byte_and_the_size() {
    let (_d, s) = fresh(64);
    let (o, v) = txn_object(&s);
    s.commit().unwrap();
    let (used, drive_used) = (part_used(&s, 1), s.info().used_bytes);
    assert_eq!(used, 4 * BS);
    let t0 = s.now_ns();
    s.txn_begin(1, o, 7).unwrap();
    let mut c = TxnCase { now: v.clone(), before: v };
    c.write(&s, o, &[rg(10, 20)], 2); // partial overwrite of block 0
    c.write(&s, o, &[rg(BS, BS)], 3); // whole block 1
    c.write(&s, o, &[rg(3 * BS + 5, 7)], 4); // into the hole
    c.write(&s, o, &[rg(8 * BS, 10), rg(10, 5)], 5); // extend, and block 0 again
    assert_eq!(part_used(&s, 1), 8 * BS, "old blocks 0 and 1 stay held beside new 0, 1, 3 and 8");
    c.resize(&s, o, 2 * BS + 5); // drops 4 and 8, zeroes block 2's tail
    c.write(&s, o, &[rg(6 * BS, 3)], 6); // past the end again
    c.resize(&s, o, 20 * BS); // extend with a hole
    c.resize(&s, o, 0); // everything goes
    c.write(&s, o, &[rg(BS + 1, 2)], 7);
    assert!(s.getattr(1, o).unwrap().blocks_used >= 4, "blocks_used counts the blocks the transaction holds");
    assert!(s.txn_end(1, o, 7, false).unwrap());
    let a = s.getattr(1, o).unwrap();
    assert_eq!(a.logical_size, c.before.len() as u64, "the old size is back");
    assert_eq!(read_all(&s, 1, o), c.before, "every old byte is back");
    assert!(a.data_modify_time >= t0 && a.fs_data_modify_time == a.data_modify_time);
    assert_eq!((a.blocks_used, a.blocks_allocated), (4, 4));
    assert_eq!(part_used(&s, 1), used, "the blocks the transaction wrote are no longer charged");
    check_store_invariants(&s);
    s.commit().unwrap();
    assert_eq!(s.info().used_bytes, drive_used, "and free after the next commit");
    assert_eq!(s.txn_list(1, 0, 10).unwrap(), vec![]);
    drop(s);
    let s = open(_d.path());
    assert_eq!(read_all(&s, 1, o), c.before, "the rollback is durable");
    check_store_invariants(&s);
}

#[test]
fn txn_commit_keeps_the_changes_and_releases_the_old_blocks() {
    let (_d, s) = fresh(64);
    let (o, v) = txn_object(&s);
    s.commit().unwrap();
    let old: Vec<u64> = [0, 1, 2, 4].iter().map(|&l| phys_of(&s, 1, o, l)).collect();
    s.txn_begin(1, o, 9).unwrap();
    let mut c = TxnCase { now: v.clone(), before: v };
    c.write(&s, o, &[rg(0, 3 * BS)], 2);
    c.resize(&s, o, 3 * BS);
    assert_eq!(part_used(&s, 1), 7 * BS, "three new blocks, four held");
    assert!(s.txn_end(1, o, 9, true).unwrap());
    assert_eq!(read_all(&s, 1, o), c.now);
    assert_eq!(part_used(&s, 1), 3 * BS);
    check_store_invariants(&s);
    {
        let m = lock(&s.meta);
        assert!(old.iter().all(|b| m.pending_free.contains(b)), "old blocks wait for the commit that forgets them");
    }
    s.commit().unwrap();
    assert_eq!(s.info().used_bytes, 3 * BS);
    assert!(!s.txn_end(1, o, 9, false).unwrap(), "a second end is a no-op: the commit stands");
    assert_eq!(read_all(&s, 1, o), c.now);
}

#[test]
fn txn_begin_and_end_are_idempotent_and_refuse_conflicts() {
    let (_d, s) = fresh(64);
    let (o, _) = txn_object(&s);
    let (o2, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let t = s.now_ns();
    s.txn_begin(1, o, 5).unwrap();
    write(&s, 1, o, &[rg(0, 3)], b"new").unwrap();
    s.txn_begin(1, o, 5).unwrap();
    let e = s.txn_begin(1, o, 6).unwrap_err();
    assert_eq!(e.status(), Status::TxnConflict);
    assert!(e.to_string().contains("transaction 5"), "the error names the open transaction: {e}");
    assert_eq!(err(s.txn_end(1, o, 6, true)), Status::TxnConflict);
    assert_eq!(err(s.fastcopy(1, o)), Status::TxnConflict, "a copy would share the transaction's blocks");
    assert_eq!(err(s.txn_begin(1, o2, 0)), Status::BadArguments);
    assert_eq!(err(s.txn_end(1, o2, 0, true)), Status::BadArguments);
    assert_eq!(err(s.txn_begin(1, PARTITION_CONTROL, 1)), Status::ReadOnlyObject);
    assert_eq!(err(s.txn_begin(1, 999, 1)), Status::NoSuchObject);
    assert_eq!(err(s.txn_begin(2, o, 1)), Status::NoSuchPartition);
    assert_eq!(err(s.txn_end(1, 999, 1, false)), Status::NoSuchObject);
    assert_eq!(err(s.txn_list(2, 0, 1)), Status::NoSuchPartition);
    s.txn_begin(1, o2, 6).unwrap();
    s.txn_begin(1, FIRST_OBJECT, 8).unwrap();
    let list = s.txn_list(1, 0, 10).unwrap();
    assert_eq!(list.iter().map(|x| (x.object, x.txn)).collect::<Vec<_>>(), vec![(FIRST_OBJECT, 8), (o, 5), (o2, 6)]);
    assert!(list.iter().all(|x| (t..=s.now_ns()).contains(&x.begun_ns)));
    assert_eq!(s.txn_list(1, FIRST_OBJECT, 1).unwrap().iter().map(|x| x.object).collect::<Vec<_>>(), vec![o]);
    assert_eq!(s.txn_list(1, o2, 10).unwrap(), vec![]);
    assert_eq!(s.txn_list(1, u64::MAX, 10).unwrap(), vec![]);
    assert_eq!(s.txn_list(1, 0, 0).unwrap(), vec![]);
    assert!(!s.txn_end(1, o2, 7, true).is_ok_and(|x| x), "another id on an open transaction is refused");
    assert!(s.txn_end(1, o, 5, false).unwrap());
    assert!(!s.txn_end(1, o, 5, false).unwrap(), "ending twice: was not open");
    assert!(!s.txn_end(1, o, 77, true).unwrap(), "any id ends nothing when none is open");
    assert_eq!(&read_all(&s, 1, o)[..3], &pattern(1, 3)[..]);
    s.fastcopy(1, o).unwrap();
    s.txn_begin(1, o, 6).unwrap();
    check_store_invariants(&s);
}

#[test]
fn txn_quota_charges_the_blocks_it_holds() {
    let (_d, s) = fresh(4);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    write(&s, 1, o, &[rg(0, 2 * BS)], &pattern(1, 2 * BS as usize)).unwrap();
    assert_eq!(s.blocks_required(1, o, &[rg(0, 2 * BS)]).unwrap(), (0, 0));
    s.txn_begin(1, o, 1).unwrap();
    assert_eq!(
        s.blocks_required(1, o, &[rg(0, 2 * BS)]).unwrap(),
        (2, 2),
        "under a transaction an overwrite keeps the old blocks"
    );
    write(&s, 1, o, &[rg(0, 2 * BS)], &pattern(2, 2 * BS as usize)).unwrap();
    assert_eq!(part_used(&s, 1), 4 * BS);
    assert_eq!(s.blocks_required(1, o, &[rg(0, 2 * BS)]).unwrap(), (0, 0), "blocks it wrote are replaced 1:1");
    write(&s, 1, o, &[rg(0, 2 * BS)], &pattern(3, 2 * BS as usize)).unwrap();
    assert_eq!(err(write(&s, 1, o, &[rg(2 * BS, 1)], b"x")), Status::QuotaExceeded);
    assert_eq!(err(s.resize_partition(1, 3 * BS)), Status::QuotaBelowUsage, "held blocks are usage");
    truncate(&s, 1, o, BS).unwrap();
    assert_eq!(part_used(&s, 1), 3 * BS, "dropping a block the transaction wrote frees it; the held one stays");
    assert!(s.txn_end(1, o, 1, false).unwrap());
    assert_eq!(part_used(&s, 1), 2 * BS);
    assert_eq!(read_all(&s, 1, o), pattern(1, 2 * BS as usize));
    check_store_invariants(&s);
}

#[test]
fn removing_an_object_or_partition_drops_its_transaction() {
    let (d, s) = fresh(64);
    let (o, _) = txn_object(&s);
    let (k, _) = txn_object(&s);
    s.txn_begin(1, o, 3).unwrap();
    write(&s, 1, o, &[rg(0, 3 * BS)], &pattern(9, 3 * BS as usize)).unwrap();
    s.txn_begin(1, k, 4).unwrap();
    s.commit().unwrap();
    s.remove(1, o).unwrap();
    assert_eq!(s.txn_list(1, 0, 10).unwrap().len(), 1);
    assert_eq!(part_used(&s, 1), 4 * BS, "the removed object's blocks and held blocks are gone");
    check_store_invariants(&s);
    s.commit().unwrap();
    drop(s);
    let s = open(d.path());
    assert_eq!(s.txn_list(1, 0, 10).unwrap().iter().map(|t| t.object).collect::<Vec<_>>(), vec![k]);
    assert_eq!(s.info().used_bytes, 4 * BS);
    check_store_invariants(&s);
    write(&s, 1, k, &[rg(0, BS)], &pattern(8, BS as usize)).unwrap();
    s.remove_partition(1, true).unwrap();
    s.commit().unwrap();
    assert_eq!(s.info().used_bytes, 0);
    drop(s);
    let s = open(d.path());
    s.create_partition(1).unwrap();
    assert_eq!(s.txn_list(1, 0, 10).unwrap(), vec![], "nothing of the old partition's transactions is left");
    check_store_invariants(&s);
}

/// A crash (the store dropped without a commit) leaves every object with the
/// durable index and durable undo of the last commit: an abort afterwards
/// restores the state before the transaction whatever had been flushed, and
/// a commit keeps what had.
#[test]
fn txn_survives_a_crash_and_ends_either_way_after_it() {
    for commit in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        s.create_partition(1).unwrap();
        s.resize_partition(1, 64 * BS).unwrap();
        let (o, v) = txn_object(&s);
        let (n, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        s.commit().unwrap();
        s.txn_begin(1, o, 11).unwrap();
        s.txn_begin(1, n, 12).unwrap();
        let mut c = TxnCase { now: v.clone(), before: v };
        c.write(&s, o, &[rg(0, BS + 3), rg(3 * BS, 10)], 2);
        c.resize(&s, o, 3 * BS + 10);
        write(&s, 1, n, &[rg(0, 10)], &pattern(3, 10)).unwrap();
        s.flush(1, &[o, n]).unwrap(); // the client's FLUSH before COMMIT
        let flushed = c.now.clone();
        // Not durable: more writes, and a begin on a third object.
        c.write(&s, o, &[rg(0, 2 * BS)], 4);
        let (late, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        let _ = late;
        check_store_invariants(&s);
        drop(s); // crash
        let s = open(dir.path());
        check_store_invariants(&s);
        assert_eq!(
            s.txn_list(1, 0, 10).unwrap().iter().map(|t| (t.object, t.txn)).collect::<Vec<_>>(),
            vec![(o, 11), (n, 12)]
        );
        assert_eq!(read_all(&s, 1, o), flushed, "the flushed state of the transaction is what survived");
        // The held blocks are in use: writes after the restart never reuse them.
        for i in 0..20 {
            let (x, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
            write(&s, 1, x, &[rg(0, BS)], &pattern(100 + i, BS as usize)).unwrap();
        }
        check_store_invariants(&s);
        assert!(s.txn_end(1, o, 11, commit).unwrap());
        assert!(s.txn_end(1, n, 12, commit).unwrap());
        if commit {
            assert_eq!(read_all(&s, 1, o), flushed);
            assert_eq!(read_all(&s, 1, n), pattern(3, 10));
        } else {
            assert_eq!(read_all(&s, 1, o), c.before, "abort after a crash restores the old bytes exactly");
            assert_eq!(s.getattr(1, n).unwrap().logical_size, 0);
        }
        check_store_invariants(&s);
        s.commit().unwrap();
        check_store_invariants(&s);
    }
}

/// A transaction that began after the last commit is gone after a crash,
/// and so is everything it wrote; ending it then reports it was not open.
#[test]
fn an_uncommitted_txn_vanishes_with_its_writes() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    s.create_partition(1).unwrap();
    s.resize_partition(1, 64 * BS).unwrap();
    let (o, v) = txn_object(&s);
    s.commit().unwrap();
    s.txn_begin(1, o, 1).unwrap();
    write(&s, 1, o, &[rg(0, BS)], &pattern(5, BS as usize)).unwrap();
    drop(s);
    let s = open(dir.path());
    assert_eq!(s.txn_list(1, 0, 10).unwrap(), vec![]);
    assert!(!s.txn_end(1, o, 1, false).unwrap());
    assert_eq!(read_all(&s, 1, o), v);
    check_store_invariants(&s);
}

/// A store of format version 1 (no transaction tables) opens, is migrated
/// to the current version, and takes transactions.
#[test]
fn a_version_1_store_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let v = {
        let s = open(dir.path());
        s.create_partition(1).unwrap();
        s.resize_partition(1, 64 * BS).unwrap();
        let (o, v) = txn_object(&s);
        assert_eq!(o, FIRST_USER_OBJECT);
        s.commit().unwrap();
        v
    };
    {
        let conn = rusqlite::Connection::open(dir.path().join("meta.sqlite")).unwrap();
        conn.execute_batch("DROP TABLE txns; DROP TABLE undo;").unwrap();
        db::put_drive_value(&conn, "format_version", &1u64.to_le_bytes()).unwrap();
    }
    let o = FIRST_USER_OBJECT;
    let s = open(dir.path());
    let version = db::get_drive_value(&lock(&s.db), "format_version").unwrap().unwrap();
    assert_eq!(version, (db::FORMAT_VERSION as u64).to_le_bytes());
    assert_eq!(read_all(&s, 1, o), v);
    s.txn_begin(1, o, 1).unwrap();
    write(&s, 1, o, &[rg(0, 4)], b"abcd").unwrap();
    s.commit().unwrap();
    drop(s);
    let s = open(dir.path());
    assert!(s.txn_end(1, o, 1, false).unwrap());
    assert_eq!(read_all(&s, 1, o), v);
    drop(s);
    {
        let conn = rusqlite::Connection::open(dir.path().join("meta.sqlite")).unwrap();
        db::put_drive_value(&conn, "format_version", &(db::FORMAT_VERSION as u64 + 1).to_le_bytes()).unwrap();
    }
    assert!(matches!(Store::open(dir.path(), &opts()), Err(StoreError::Corrupt(_))), "a newer format is refused");
}

// ------------------------------------------------------ model-based property

mod model {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed, TestRunner};

    const BAD_OBJECT: u64 = 9_999;

    /// How often each kind of outcome happened over all cases, so the test
    /// proves it exercised what it claims to.
    static COVERAGE: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

    fn count<T>(op: &Op, got: &Result<T, Status>) {
        let name = format!("{op:?}");
        let name = name.split([' ', '(']).next().unwrap_or("?").to_string();
        let key = match got {
            Ok(_) => format!("{name} ok"),
            Err(s) => format!("{name} {}", s.name()),
        };
        *lock(&COVERAGE).entry(key).or_default() += 1;
    }

    #[derive(Clone, Debug)]
    struct MObj {
        data: Vec<u8>,
        /// Logical block → a token naming the physical block (shared by copies).
        blocks: BTreeMap<u64, u64>,
        reserved: u64,
        copied: u64,
        acv: u64,
        fs: u8,
        txn: Option<MTxn>,
    }

    /// An open transaction as the model keeps it: the bytes an abort must
    /// bring back (kept whole, independently of the undo), and the tokens
    /// it holds.
    #[derive(Clone, Debug)]
    struct MTxn {
        id: u64,
        old_data: Vec<u8>,
        undo: BTreeMap<u64, Option<u64>>,
    }

    impl MObj {
        fn new() -> Self {
            MObj { data: Vec::new(), blocks: BTreeMap::new(), reserved: 0, copied: 0, acv: 0, fs: 0, txn: None }
        }
        /// Tokens the object references: its blocks and those its transaction holds.
        fn tokens(&self) -> impl Iterator<Item = u64> + '_ {
            self.blocks.values().copied().chain(self.txn.iter().flat_map(|t| t.undo.values().flatten().copied()))
        }
        fn slack(&self) -> u64 {
            self.reserved.saturating_sub(self.blocks.len() as u64)
        }
    }

    #[derive(Clone, Debug)]
    struct MPart {
        quota_blocks: u64,
        objects: BTreeMap<u64, MObj>,
    }

    #[derive(Clone, Debug, Default)]
    struct Model {
        parts: BTreeMap<u64, MPart>,
        refs: HashMap<u64, u32>,
        next_token: u64,
    }

    fn touched(regions: &[Region]) -> BTreeSet<u64> {
        regions.iter().flat_map(|r| r.offset / BS..=(r.end() - 1) / BS).collect()
    }

    fn overlapping(regions: &[Region]) -> bool {
        let mut v = regions.to_vec();
        v.sort();
        v.windows(2).any(|w| w[0].end() > w[1].offset)
    }

    impl Model {
        fn token(&mut self) -> u64 {
            self.next_token += 1;
            self.refs.insert(self.next_token, 1);
            self.next_token
        }
        fn unref(&mut self, t: u64) {
            let c = self.refs.get_mut(&t).expect("token referenced");
            *c -= 1;
            if *c == 0 {
                self.refs.remove(&t);
            }
        }
        fn part(&self, p: u64) -> Result<&MPart, Status> {
            self.parts.get(&p).ok_or(Status::NoSuchPartition)
        }
        fn obj(&self, p: u64, o: u64) -> Result<&MObj, Status> {
            self.part(p)?.objects.get(&o).ok_or(Status::NoSuchObject)
        }
        fn charged(&self, p: u64) -> u64 {
            let part = &self.parts[&p];
            let phys: HashSet<u64> = part.objects.values().flat_map(MObj::tokens).collect();
            phys.len() as u64 + part.objects.values().map(MObj::slack).sum::<u64>()
        }
        fn quota_ok(&self, p: u64, extra: u64) -> Result<(), Status> {
            if self.charged(p) + extra > self.parts[&p].quota_blocks {
                Err(Status::QuotaExceeded)
            } else {
                Ok(())
            }
        }
        fn blocks_used(&self, o: &MObj) -> u64 {
            let share: f64 = o.tokens().map(|t| 1.0 / self.refs[&t] as f64).sum();
            share.round() as u64
        }
        fn take(&mut self, p: u64, o: u64) -> MObj {
            self.parts.get_mut(&p).unwrap().objects.remove(&o).unwrap()
        }
        fn put(&mut self, p: u64, o: u64, obj: MObj) {
            self.parts.get_mut(&p).unwrap().objects.insert(o, obj);
        }
        /// Blocks a write of `touched` adds, and those it maps anew.
        fn added(&self, obj: &MObj, touched: &BTreeSet<u64>) -> (u64, u64) {
            let (mut added, mut newly) = (0, 0);
            for l in touched {
                match obj.blocks.get(l) {
                    None => {
                        added += 1;
                        newly += 1;
                    }
                    Some(t) if self.refs[t] > 1 => added += 1,
                    // Held by the transaction, so not replaced one for one.
                    Some(_) if obj.txn.as_ref().is_some_and(|x| !x.undo.contains_key(l)) => added += 1,
                    Some(_) => {}
                }
            }
            (added, newly)
        }

        fn write(&mut self, p: u64, o: u64, regions: &[Region], data: &[u8]) -> Result<u64, Status> {
            if overlapping(regions) {
                return Err(Status::RegionsOverlap);
            }
            if is_control(o) {
                return Err(Status::ReadOnlyObject);
            }
            let obj = self.obj(p, o)?;
            let t = touched(regions);
            let (added, newly) = self.added(obj, &t);
            self.quota_ok(p, added - newly.min(obj.slack()))?;
            let mut obj = self.take(p, o);
            apply(&mut obj.data, regions, data);
            for l in t {
                // A block the write leaves all zeros is a hole.
                let new = (!zero_block(&obj.data, l)).then(|| self.token());
                self.remap(&mut obj, l, new);
            }
            self.put(p, o, obj);
            Ok(data.len() as u64)
        }

        fn truncate(&mut self, p: u64, o: u64, size: u64) -> Result<(), Status> {
            if is_control(o) {
                return Err(Status::ReadOnlyObject);
            }
            let obj = self.obj(p, o)?;
            let old = obj.data.len() as u64;
            let first_dropped = size.div_ceil(BS);
            let zero_tail = size < old && old.min(first_dropped * BS) > size && obj.blocks.contains_key(&(size / BS));
            let tail_charge = zero_tail && !self.frees(obj, size / BS);
            self.quota_ok(p, tail_charge as u64)?;
            if size < old {
                // Dropped blocks still shared free nothing, yet the reservation
                // they covered comes back as slack.
                let kept = obj.blocks.range(..first_dropped).count() as u64;
                let freed = obj.blocks.range(first_dropped..).filter(|(l, _)| self.frees(obj, **l)).count() as u64;
                let gain = obj.reserved.saturating_sub(kept) - obj.slack();
                if gain > freed {
                    self.quota_ok(p, tail_charge as u64 + gain - freed)?;
                }
            }
            let mut obj = self.take(p, o);
            obj.data.resize(size as usize, 0);
            if zero_tail {
                let new = (!zero_block(&obj.data, size / BS)).then(|| self.token());
                self.remap(&mut obj, size / BS, new);
            }
            if size < old {
                let dropped: Vec<u64> = obj.blocks.range(first_dropped..).map(|(l, _)| *l).collect();
                for l in dropped {
                    self.remap(&mut obj, l, None);
                }
            }
            self.put(p, o, obj);
            Ok(())
        }

        fn reserve(&mut self, p: u64, o: u64, blocks: u64) -> Result<(), Status> {
            if is_control(o) {
                return Err(Status::ReadOnlyObject);
            }
            let obj = self.obj(p, o)?;
            let old = obj.slack();
            let new = blocks.saturating_sub(obj.blocks.len() as u64);
            if new > old {
                self.quota_ok(p, new - old)?;
            }
            self.parts.get_mut(&p).unwrap().objects.get_mut(&o).unwrap().reserved = blocks;
            Ok(())
        }

        fn fastcopy(&mut self, p: u64, o: u64, id: impl FnOnce() -> u64) -> Result<u64, Status> {
            if is_control(o) {
                return Err(Status::ReadOnlyObject);
            }
            let src = self.obj(p, o)?.clone();
            if src.txn.is_some() {
                return Err(Status::TxnConflict);
            }
            self.quota_ok(p, src.slack())?;
            for t in src.blocks.values() {
                *self.refs.get_mut(t).unwrap() += 1;
            }
            let id = id();
            self.put(p, id, MObj { copied: o, ..src });
            Ok(id)
        }

        fn remove(&mut self, p: u64, o: u64) -> Result<(), Status> {
            if o <= FIRST_OBJECT {
                return Err(Status::ReadOnlyObject);
            }
            self.obj(p, o)?;
            let obj = self.take(p, o);
            for t in obj.tokens() {
                self.unref(t);
            }
            Ok(())
        }

        /// Whether replacing or dropping block `l` of `obj` frees its token.
        fn frees(&self, obj: &MObj, l: u64) -> bool {
            self.refs[&obj.blocks[&l]] == 1 && obj.txn.as_ref().is_none_or(|t| t.undo.contains_key(&l))
        }

        /// Maps block `l` to `new`; the first change under a transaction
        /// hands the old token to the undo instead of dropping it.
        fn remap(&mut self, obj: &mut MObj, l: u64, new: Option<u64>) {
            let old = match new {
                Some(t) => obj.blocks.insert(l, t),
                None => obj.blocks.remove(&l),
            };
            if let Some(txn) = obj.txn.as_mut() {
                match txn.undo.get(&l) {
                    None => {
                        if old.is_some() || new.is_some() {
                            txn.undo.insert(l, old);
                        }
                        return;
                    }
                    Some(None) if new.is_none() => {
                        txn.undo.remove(&l);
                    }
                    Some(_) => {}
                }
            }
            if let Some(t) = old {
                self.unref(t);
            }
        }

        fn txn_target(&self, p: u64, o: u64, id: u64) -> Result<&MObj, Status> {
            if id == 0 {
                return Err(Status::BadArguments);
            }
            if is_control(o) {
                return Err(Status::ReadOnlyObject);
            }
            self.obj(p, o)
        }

        fn txn_begin(&mut self, p: u64, o: u64, id: u64) -> Result<(), Status> {
            match &self.txn_target(p, o, id)?.txn {
                Some(t) if t.id == id => return Ok(()),
                Some(_) => return Err(Status::TxnConflict),
                None => {}
            }
            let obj = self.parts.get_mut(&p).unwrap().objects.get_mut(&o).unwrap();
            obj.txn = Some(MTxn { id, old_data: obj.data.clone(), undo: BTreeMap::new() });
            Ok(())
        }

        fn txn_end(&mut self, p: u64, o: u64, id: u64, commit: bool) -> Result<bool, Status> {
            match &self.txn_target(p, o, id)?.txn {
                None => return Ok(false),
                Some(t) if t.id != id => return Err(Status::TxnConflict),
                Some(_) => {}
            }
            let mut obj = self.take(p, o);
            let t = obj.txn.take().unwrap();
            for (l, prev) in t.undo {
                if commit {
                    if let Some(held) = prev {
                        self.unref(held);
                    }
                    continue;
                }
                let cur = match prev {
                    Some(held) => obj.blocks.insert(l, held),
                    None => obj.blocks.remove(&l),
                };
                if let Some(c) = cur {
                    self.unref(c);
                }
            }
            if !commit {
                obj.data = t.old_data;
            }
            self.put(p, o, obj);
            Ok(true)
        }

        fn resize(&mut self, p: u64, quota: u64) -> Result<(), Status> {
            self.part(p)?;
            if quota < self.charged(p) * BS {
                return Err(Status::QuotaBelowUsage);
            }
            let others: u64 = self.parts.iter().filter(|(&id, _)| id != p).map(|(_, q)| q.quota_blocks * BS).sum();
            if others + quota > CAP_BLOCKS * BS {
                return Err(Status::NoSpace);
            }
            self.parts.get_mut(&p).unwrap().quota_blocks = quota / BS;
            Ok(())
        }

        /// The bytes a control object holds, if `o` is one.
        fn control_bytes(&self, p: u64, o: u64) -> Result<Vec<u8>, Status> {
            let part = self.part(p)?;
            Ok(match o {
                PARTITION_CONTROL => PartitionControl {
                    quota_bytes: part.quota_blocks * BS,
                    used_bytes: self.charged(p) * BS,
                    objects_in_use: part.objects.len() as u64 + 3,
                    objects_max: OBJECTS_PER_PARTITION_MAX,
                }
                .encode(),
                PARTITION_CONTENTS => {
                    [1, 2, 3].into_iter().chain(part.objects.keys().copied()).flat_map(u64::to_le_bytes).collect()
                }
                _ => unreachable!(),
            })
        }

        fn read(&self, p: u64, o: u64, regions: &[Region]) -> Result<(Vec<u64>, Vec<u8>), Status> {
            if overlapping(regions) {
                return Err(Status::RegionsOverlap);
            }
            if is_control(o) {
                return Ok(expect_read(&self.control_bytes(p, o)?, regions));
            }
            Ok(expect_read(&self.obj(p, o)?.data, regions))
        }

        fn blocks_required(&self, p: u64, o: u64, regions: &[Region]) -> Result<(u64, u64), Status> {
            if overlapping(regions) {
                return Err(Status::RegionsOverlap);
            }
            if is_control(o) {
                return Err(Status::ReadOnlyObject);
            }
            let (added, _) = self.added(self.obj(p, o)?, &touched(regions));
            Ok((added, added))
        }

        #[track_caller]
        fn check_attrs(&self, p: u64, o: u64, a: &Attributes, what: &str) {
            let m = &self.parts[&p].objects[&o];
            let expect = (
                m.data.len() as u64,
                m.reserved.max(m.blocks.len() as u64),
                self.blocks_used(m),
                m.copied,
                m.acv,
                Some(m.fs),
                BS as u32,
            );
            let fs = Some(a.fs_specific[0]).filter(|&b| a.fs_specific.iter().all(|&x| x == b));
            let got = (
                a.logical_size,
                a.blocks_allocated,
                a.blocks_used,
                a.copied_object,
                a.access_control_version,
                fs,
                a.block_size,
            );
            assert_eq!(got, expect, "{what}: attributes of {p}/{o} (size, allocated, used, copied, acv, fs, bs)");
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Create {
            p: u64,
            reserve: Option<u64>,
        },
        Write {
            p: u64,
            o: u8,
            regions: Vec<Region>,
            overlap: bool,
            seed: u64,
        },
        Read {
            p: u64,
            o: u8,
            regions: Vec<Region>,
        },
        Truncate {
            p: u64,
            o: u8,
            size: u64,
        },
        Reserve {
            p: u64,
            o: u8,
            blocks: u64,
        },
        ReserveAndTruncate {
            p: u64,
            o: u8,
            blocks: u64,
            size: u64,
        },
        SetMisc {
            p: u64,
            o: u8,
            acv: u64,
            fs: u8,
        },
        FastCopy {
            p: u64,
            o: u8,
        },
        Remove {
            p: u64,
            o: u8,
        },
        BlocksRequired {
            p: u64,
            o: u8,
            regions: Vec<Region>,
        },
        GetAttr {
            p: u64,
            o: u8,
        },
        Resize {
            p: u64,
            blocks: u64,
        },
        Flush {
            p: u64,
            o: u8,
        },
        TxnBegin {
            p: u64,
            o: u8,
            id: u64,
        },
        /// `open`: end a transaction that is open, under its own id.
        TxnEnd {
            p: u64,
            o: u8,
            id: u64,
            commit: bool,
            open: bool,
        },
        Commit,
        Reopen,
    }

    fn part() -> impl Strategy<Value = u64> {
        prop_oneof![8 => Just(1u64), 8 => Just(2u64), 1 => Just(3u64)]
    }

    fn regions() -> impl Strategy<Value = Vec<Region>> {
        let gap = prop_oneof![Just(0u64), 0..64u64, 0..2 * BS];
        let len = prop_oneof![Just(BS), 1..256u64, 1..2 * BS];
        (prop::collection::vec((gap, len), 1..=4), any::<bool>()).prop_map(|(parts, rev)| {
            let mut pos = 0;
            let mut v = Vec::new();
            for (gap, length) in parts {
                pos += gap;
                v.push(Region { offset: pos, length });
                pos += length;
            }
            if rev {
                v.reverse();
            }
            v
        })
    }

    fn op() -> impl Strategy<Value = Op> {
        let o = any::<u8>;
        prop_oneof![
            3 => (part(), prop::option::weighted(0.2, 0..6u64)).prop_map(|(p, reserve)| Op::Create { p, reserve }),
            8 => (part(), o(), regions(), prop::bool::weighted(0.05), any::<u64>())
                .prop_map(|(p, o, regions, overlap, seed)| Op::Write { p, o, regions, overlap, seed }),
            4 => (part(), o(), regions()).prop_map(|(p, o, regions)| Op::Read { p, o, regions }),
            2 => (part(), o(), prop_oneof![0..8 * BS, (0..8u64).prop_map(|b| b * BS)])
                .prop_map(|(p, o, size)| Op::Truncate { p, o, size }),
            1 => (part(), o(), 0..6u64).prop_map(|(p, o, blocks)| Op::Reserve { p, o, blocks }),
            1 => (part(), o(), 0..6u64, 0..8 * BS).prop_map(|(p, o, blocks, size)| Op::ReserveAndTruncate { p, o, blocks, size }),
            1 => (part(), o(), any::<u64>(), any::<u8>()).prop_map(|(p, o, acv, fs)| Op::SetMisc { p, o, acv, fs }),
            2 => (part(), o()).prop_map(|(p, o)| Op::FastCopy { p, o }),
            1 => (part(), o()).prop_map(|(p, o)| Op::Remove { p, o }),
            2 => (part(), o(), regions()).prop_map(|(p, o, regions)| Op::BlocksRequired { p, o, regions }),
            1 => (part(), o()).prop_map(|(p, o)| Op::GetAttr { p, o }),
            1 => (part(), prop_oneof![4 => 0..64u64, 1 => Just(CAP_BLOCKS)]).prop_map(|(p, blocks)| Op::Resize { p, blocks }),
            1 => (part(), o()).prop_map(|(p, o)| Op::Flush { p, o }),
            3 => (part(), o(), txn_id()).prop_map(|(p, o, id)| Op::TxnBegin { p, o, id }),
            3 => (part(), o(), txn_id(), any::<bool>(), prop::bool::weighted(0.7))
                .prop_map(|(p, o, id, commit, open)| Op::TxnEnd { p, o, id, commit, open }),
            1 => Just(Op::Commit),
            1 => Just(Op::Reopen),
        ]
    }

    /// Transaction identifiers: a few, so that ends find what began and
    /// conflicts happen; 0 (invalid) now and then.
    fn txn_id() -> impl Strategy<Value = u64> {
        prop_oneof![1 => Just(0u64), 12 => 1..4u64]
    }

    /// Maps a selector to an object: mostly existing ones, sometimes a
    /// control object or one that does not exist.
    fn pick(model: &Model, p: u64, sel: u8) -> u64 {
        match sel {
            250 => PARTITION_CONTENTS,
            251 => PARTITION_CONTROL,
            252.. => BAD_OBJECT,
            _ => match model.parts.get(&p) {
                Some(part) => *part.objects.keys().nth(sel as usize % part.objects.len()).unwrap(),
                None => FIRST_USER_OBJECT,
            },
        }
    }

    struct Ids {
        issued: BTreeMap<u64, u64>,
        exact: BTreeMap<u64, bool>,
    }

    impl Ids {
        #[track_caller]
        fn check(&mut self, p: u64, id: u64, model: &Model) -> u64 {
            let last = self.issued.get(&p).copied().unwrap_or(FIRST_USER_OBJECT - 1);
            assert!(id > last, "partition {p}: identifier {id} not above every identifier issued before ({last})");
            if self.exact.get(&p).copied().unwrap_or(true) {
                assert_eq!(id, last + 1, "partition {p}: identifiers are sequential within a session");
            }
            assert!(!model.parts[&p].objects.contains_key(&id));
            self.issued.insert(p, id);
            self.exact.insert(p, true);
            id
        }
    }

    fn check_all(s: &Store, model: &Model, what: &str) {
        let info = s.info();
        assert_eq!(info.partitions.len(), model.parts.len(), "{what}: partitions");
        for pi in &info.partitions {
            let p = pi.partition;
            let mp = &model.parts[&p];
            assert_eq!(
                (pi.quota_bytes, pi.used_bytes),
                (mp.quota_blocks * BS, model.charged(p) * BS),
                "{what}: partition {p} quota/used"
            );
            assert_eq!(
                contents(s, p),
                [1, 2, 3].into_iter().chain(mp.objects.keys().copied()).collect::<Vec<_>>(),
                "{what}: contents"
            );
            for (&o, mo) in &mp.objects {
                model.check_attrs(p, o, &s.getattr(p, o).unwrap(), what);
                assert!(read_all(s, p, o) == mo.data, "{what}: data of {p}/{o}");
            }
            let txns: Vec<(u64, u64)> = s.txn_list(p, 0, 1024).unwrap().iter().map(|t| (t.object, t.txn)).collect();
            let want: Vec<(u64, u64)> =
                mp.objects.iter().filter_map(|(&o, mo)| mo.txn.as_ref().map(|t| (o, t.id))).collect();
            assert_eq!(txns, want, "{what}: open transactions of partition {p}");
        }
    }

    fn run(q1: u64, q2: u64, ops: &[Op]) {
        let dir = tempfile::tempdir().unwrap();
        let mut s = open(dir.path());
        let mut model = Model::default();
        for (p, q) in [(1, q1), (2, q2)] {
            s.create_partition(p).unwrap();
            s.resize_partition(p, q * BS).unwrap();
            let mut objects = BTreeMap::new();
            objects.insert(FIRST_OBJECT, MObj::new());
            model.parts.insert(p, MPart { quota_blocks: q, objects });
        }
        s.commit().unwrap();
        let mut durable = model.clone();
        let mut ids = Ids { issued: BTreeMap::new(), exact: BTreeMap::new() };
        for (i, op) in ops.iter().enumerate() {
            let what = format!("op {i} {op:?}");
            match op.clone() {
                Op::Create { p, reserve } => {
                    let (mask, attrs) = match reserve {
                        Some(n) => (AttrMask::BLOCKS_ALLOCATED, attrs_with(|a| a.blocks_allocated = n)),
                        None => (AttrMask::default(), Attributes::default()),
                    };
                    let got = s.create(p, mask, &attrs);
                    let want = model.part(p).and_then(|_| model.quota_ok(p, reserve.unwrap_or(0)));
                    count(op, &want);
                    match (got, want) {
                        (Ok((id, a)), Ok(())) => {
                            ids.check(p, id, &model);
                            model.put(p, id, MObj { reserved: reserve.unwrap_or(0), ..MObj::new() });
                            model.check_attrs(p, id, &a, &what);
                        }
                        (got, want) => assert_eq!(got.map(drop).map_err(|e| e.status()), want, "{what}"),
                    }
                }
                Op::Write { p, o, mut regions, overlap, seed } => {
                    let o = pick(&model, p, o);
                    if overlap {
                        let r = regions[0];
                        regions.push(Region { offset: r.offset + r.length / 2, length: r.length });
                    }
                    let data = pattern(seed, regions.iter().map(|r| r.length).sum::<u64>() as usize);
                    let got = write(&s, p, o, &regions, &data).map_err(|e| e.status());
                    let want = model.write(p, o, &regions, &data);
                    count(op, &want);
                    assert_eq!(got, want, "{what}");
                    if got.is_ok() {
                        model.check_attrs(p, o, &s.getattr(p, o).unwrap(), &what);
                    }
                }
                Op::Read { p, o, regions } => {
                    let o = pick(&model, p, o);
                    let got = read(&s, p, o, &regions).map_err(|e| e.status());
                    let want = model.read(p, o, &regions);
                    count(op, &want);
                    assert!(
                        got == want,
                        "{what}: read differs (lengths {:?} vs {:?})",
                        got.as_ref().map(|g| &g.0),
                        want.as_ref().map(|w| &w.0)
                    );
                }
                Op::Truncate { p, o, size } => {
                    let o = pick(&model, p, o);
                    let got = truncate(&s, p, o, size);
                    let want = model.truncate(p, o, size);
                    count(op, &want);
                    match (got, want) {
                        (Ok(a), Ok(())) => model.check_attrs(p, o, &a, &what),
                        (got, want) => assert_eq!(got.map(drop).map_err(|e| e.status()), want, "{what}"),
                    }
                }
                Op::Reserve { p, o, blocks } => {
                    let o = pick(&model, p, o);
                    let want = model.reserve(p, o, blocks);
                    count(op, &want);
                    match (reserve(&s, p, o, blocks), want) {
                        (Ok(a), Ok(())) => model.check_attrs(p, o, &a, &what),
                        (got, want) => assert_eq!(got.map(drop).map_err(|e| e.status()), want, "{what}"),
                    }
                }
                Op::ReserveAndTruncate { p, o, blocks, size } => {
                    let o = pick(&model, p, o);
                    let v = attrs_with(|a| {
                        a.blocks_allocated = blocks;
                        a.logical_size = size;
                    });
                    let got = s.setattr(p, o, AttrMask::BLOCKS_ALLOCATED.union(AttrMask::LOGICAL_SIZE), &v);
                    // One request: if either part fails, nothing changes.
                    let saved = model.clone();
                    let want = model.reserve(p, o, blocks).and_then(|()| model.truncate(p, o, size));
                    if want.is_err() {
                        model = saved;
                    }
                    count(op, &want);
                    match (got, want) {
                        (Ok(a), Ok(())) => model.check_attrs(p, o, &a, &what),
                        (got, want) => assert_eq!(got.map(drop).map_err(|e| e.status()), want, "{what}"),
                    }
                }
                Op::SetMisc { p, o, acv, fs } => {
                    let o = pick(&model, p, o);
                    let v = attrs_with(|a| {
                        a.access_control_version = acv;
                        a.fs_specific = [fs; FS_SPECIFIC_LEN];
                    });
                    let got = s.setattr(p, o, AttrMask::ACCESS_CONTROL_VERSION.union(AttrMask::FS_SPECIFIC), &v);
                    let want = if is_control(o) { Err(Status::ReadOnlyObject) } else { model.obj(p, o).map(drop) };
                    count(op, &want);
                    match (got, want) {
                        (Ok(a), Ok(())) => {
                            let m = model.parts.get_mut(&p).unwrap().objects.get_mut(&o).unwrap();
                            (m.acv, m.fs) = (acv, fs);
                            model.check_attrs(p, o, &a, &what);
                        }
                        (got, want) => assert_eq!(got.map(drop).map_err(|e| e.status()), want, "{what}"),
                    }
                }
                Op::FastCopy { p, o } => {
                    let o = pick(&model, p, o);
                    let got = s.fastcopy(p, o);
                    let id = got.as_ref().map(|g| g.0).unwrap_or(0);
                    let before = model.clone();
                    let want = model.fastcopy(p, o, || id);
                    count(op, &want);
                    match (got, want) {
                        (Ok((id, a)), Ok(_)) => {
                            ids.check(p, id, &before);
                            model.check_attrs(p, id, &a, &what);
                            model.check_attrs(p, o, &s.getattr(p, o).unwrap(), &what);
                        }
                        (got, want) => assert_eq!(got.map(drop).map_err(|e| e.status()), want.map(drop), "{what}"),
                    }
                }
                Op::Remove { p, o } => {
                    let o = pick(&model, p, o);
                    let want = model.remove(p, o);
                    count(op, &want);
                    assert_eq!(s.remove(p, o).map_err(|e| e.status()), want, "{what}");
                }
                Op::BlocksRequired { p, o, regions } => {
                    let o = pick(&model, p, o);
                    let got = s.blocks_required(p, o, &regions).map_err(|e| e.status());
                    let want = model.blocks_required(p, o, &regions);
                    count(op, &want);
                    if matches!(want, Ok((n, _)) if n > 0) {
                        count(op, &Ok::<_, Status>("nonzero"));
                    }
                    assert_eq!(got, want, "{what}");
                }
                Op::GetAttr { p, o } => {
                    let o = pick(&model, p, o);
                    count(
                        op,
                        &if is_control(o) { model.control_bytes(p, o).map(drop) } else { model.obj(p, o).map(drop) },
                    );
                    match (s.getattr(p, o), is_control(o)) {
                        (Ok(a), true) => {
                            assert_eq!(Ok(a.logical_size), model.control_bytes(p, o).map(|b| b.len() as u64), "{what}")
                        }
                        (Ok(a), false) => model.check_attrs(p, o, &a, &what),
                        (Err(e), true) => assert_eq!(Err(e.status()), model.control_bytes(p, o).map(drop), "{what}"),
                        (Err(e), false) => assert_eq!(Err(e.status()), model.obj(p, o).map(drop), "{what}"),
                    }
                }
                Op::Resize { p, blocks } => {
                    let got = s.resize_partition(p, blocks * BS).map_err(|e| e.status());
                    let want = model.resize(p, blocks * BS);
                    count(op, &want);
                    assert_eq!(got, want, "{what}");
                }
                Op::Flush { p, o } => {
                    let o = pick(&model, p, o);
                    let got = s.flush(p, &[o]).map_err(|e| e.status());
                    let want = if is_control(o) { model.part(p).map(drop) } else { model.obj(p, o).map(drop) };
                    count(op, &want);
                    assert_eq!(got, want, "{what}");
                    if got.is_ok() {
                        durable = model.clone();
                    }
                }
                Op::TxnBegin { p, o, id } => {
                    let o = pick(&model, p, o);
                    let got = s.txn_begin(p, o, id).map_err(|e| e.status());
                    let want = model.txn_begin(p, o, id);
                    count(op, &want);
                    assert_eq!(got, want, "{what}");
                }
                Op::TxnEnd { p, o: sel, mut id, commit, open } => {
                    let mut o = pick(&model, p, sel);
                    let open_txns: Vec<(u64, u64)> = model.parts.get(&p).map_or(vec![], |mp| {
                        mp.objects.iter().filter_map(|(&o, mo)| mo.txn.as_ref().map(|t| (o, t.id))).collect()
                    });
                    if open && !open_txns.is_empty() {
                        (o, id) = open_txns[sel as usize % open_txns.len()];
                    }
                    let got = s.txn_end(p, o, id, commit).map_err(|e| e.status());
                    let want = model.txn_end(p, o, id, commit);
                    count(op, &want);
                    if want == Ok(true) {
                        let key = if commit { "TxnEnd committed" } else { "TxnEnd aborted" };
                        *lock(&COVERAGE).entry(key.into()).or_default() += 1;
                    }
                    assert_eq!(got, want, "{what}");
                    if got.is_ok() {
                        model.check_attrs(p, o, &s.getattr(p, o).unwrap(), &what);
                        assert!(read_all(&s, p, o) == model.obj(p, o).unwrap().data, "{what}: data after the end");
                    }
                }
                Op::Commit => {
                    count(op, &Ok::<_, Status>(()));
                    s.commit().unwrap();
                    durable = model.clone();
                }
                Op::Reopen => {
                    count(op, &Ok::<_, Status>(()));
                    check_store_invariants(&s);
                    drop(s);
                    s = open(dir.path());
                    model = durable.clone();
                    for e in ids.exact.values_mut() {
                        *e = false;
                    }
                    check_all(&s, &model, &what);
                    check_store_invariants(&s);
                }
            }
            for pi in s.info().partitions {
                let p = pi.partition;
                assert_eq!(pi.used_bytes, model.charged(p) * BS, "{what}: partition {p} usage");
                assert_eq!(pi.quota_bytes, model.parts[&p].quota_blocks * BS, "{what}: partition {p} quota");
            }
        }
        check_all(&s, &model, "end");
        check_store_invariants(&s);
        s.commit().unwrap();
        drop(s);
        let s = open(dir.path());
        check_all(&s, &model, "end, reopened");
        check_store_invariants(&s);
    }

    #[test]
    fn store_matches_model() {
        // Deterministic by default; NASD_MODEL_CASES / NASD_MODEL_SEED explore further.
        let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
        let config = Config {
            cases: env("NASD_MODEL_CASES").unwrap_or(64) as u32,
            failure_persistence: None,
            rng_seed: RngSeed::Fixed(env("NASD_MODEL_SEED").unwrap_or(0x6e61_7364)),
            max_shrink_iters: 2_000,
            ..Config::default()
        };
        let strategy = (
            prop_oneof![1 => Just(0u64), 6 => 4..48u64, 1 => Just(256u64)],
            prop_oneof![1 => Just(0u64), 6 => 4..48u64],
            prop::collection::vec(op(), 40..80),
        );
        let mut runner = TestRunner::new(config);
        let result = runner.run(&strategy, |(q1, q2, ops)| {
            run(q1, q2, &ops);
            Ok(())
        });
        if let Err(e) = result {
            panic!("{e}");
        }
        let coverage = lock(&COVERAGE);
        eprintln!("model coverage: {coverage:#?}");
        for key in [
            "Create ok",
            "Create QUOTA_EXCEEDED",
            "Create NO_SUCH_PARTITION",
            "Write ok",
            "Write QUOTA_EXCEEDED",
            "Write REGIONS_OVERLAP",
            "Write READ_ONLY_OBJECT",
            "Write NO_SUCH_OBJECT",
            "Read ok",
            "Truncate ok",
            "Reserve ok",
            "Reserve QUOTA_EXCEEDED",
            "ReserveAndTruncate ok",
            "FastCopy ok",
            "FastCopy QUOTA_EXCEEDED",
            "Remove ok",
            "Remove READ_ONLY_OBJECT",
            "BlocksRequired ok",
            "Resize ok",
            "Resize QUOTA_BELOW_USAGE",
            "Resize NO_SPACE",
            "Flush ok",
            "FastCopy TXN_CONFLICT",
            "TxnBegin ok",
            "TxnBegin TXN_CONFLICT",
            "TxnBegin BAD_ARGUMENTS",
            "TxnEnd ok",
            "TxnEnd TXN_CONFLICT",
            "TxnEnd committed",
            "TxnEnd aborted",
            "Commit ok",
            "Reopen ok",
        ] {
            assert!(coverage.get(key).copied().unwrap_or(0) > 0, "the model test never saw {key}");
        }
    }
}

// ---------------------------------------------------------------------------
// Pre-authorization lists (DSFS): the objects' security attributes and the
// collections' super PALs.
// ---------------------------------------------------------------------------

fn object_pal(collection: u64, users: &[u32]) -> ObjectPal {
    let entries = users
        .iter()
        .map(|&u| nasd_proto::PalEntry { principal: nasd_proto::Principal::User(u), rights: nasd_proto::rights::READ })
        .collect();
    ObjectPal { collection, pal: Pal::new(entries) }
}

fn super_pal(roles: &[u32]) -> Pal {
    Pal::new(
        roles
            .iter()
            .map(|&r| nasd_proto::PalEntry {
                principal: nasd_proto::Principal::Role(r),
                rights: nasd_proto::rights::READ,
            })
            .collect(),
    )
}

/// PALs are kept with their objects: set, read back as one view with the
/// collection's super PAL, removed with the object and with the partition,
/// copied by `fastcopy`, durable only through a commit (the drive commits
/// after every set), and refused on control objects.
#[test]
fn pals_live_and_die_with_their_objects() {
    let dir = tempfile::tempdir().unwrap();
    let (o, clone, lost) = {
        let s = open(dir.path());
        s.create_partition(1).unwrap();
        let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        assert!(s.pal_view(1, o).unwrap().access.is_none(), "a new object has no PAL");
        s.set_pal(1, o, object_pal(9, &[1000])).unwrap();
        s.set_super_pal(1, 9, super_pal(&[7])).unwrap();
        let v = s.pal_view(1, o).unwrap();
        assert_eq!(*v.access.unwrap(), object_pal(9, &[1000]));
        assert_eq!(*v.super_pal.unwrap(), super_pal(&[7]));
        let (clone, _) = s.fastcopy(1, o).unwrap();
        assert_eq!(*s.pal_view(1, clone).unwrap().access.unwrap(), object_pal(9, &[1000]), "the clone shares it");
        assert_eq!(
            err(s.set_pal(1, nasd_proto::well_known::PARTITION_CONTROL, object_pal(0, &[1]))),
            Status::ReadOnlyObject
        );
        assert!(s.pal_view(1, nasd_proto::well_known::DRIVE_CONTROL).unwrap().access.is_none());
        assert_eq!(err(s.set_pal(1, 999, object_pal(0, &[1]))), Status::NoSuchObject);
        assert_eq!(err(s.set_pal(2, o, object_pal(0, &[1]))), Status::NoSuchPartition);
        assert_eq!(err(s.set_super_pal(1, 0, super_pal(&[1]))), Status::BadArguments);
        s.commit().unwrap();
        // Set after the last commit: lost with the process.
        let (lost, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
        s.commit().unwrap();
        s.set_pal(1, lost, object_pal(0, &[5])).unwrap();
        s.set_super_pal(1, 9, super_pal(&[8])).unwrap();
        (o, clone, lost)
    };
    let s = open(dir.path());
    let v = s.pal_view(1, o).unwrap();
    assert_eq!(*v.access.unwrap(), object_pal(9, &[1000]), "committed: back after a reopen");
    assert_eq!(*v.super_pal.unwrap(), super_pal(&[7]), "the committed super PAL, not the later one");
    assert!(s.pal_view(1, clone).unwrap().access.is_some());
    assert!(s.pal_view(1, lost).unwrap().access.is_none(), "never committed: gone");
    // An empty attribute removes it; removing the object removes its row.
    s.set_pal(1, o, ObjectPal::default()).unwrap();
    s.remove(1, clone).unwrap();
    s.set_super_pal(1, 9, Pal::default()).unwrap();
    s.commit().unwrap();
    drop(s);
    let s = open(dir.path());
    assert!(s.pal_view(1, o).unwrap().access.is_none());
    assert_eq!(s.super_pal(1, 9).unwrap(), None);
    let db = rusqlite::Connection::open(dir.path().join("meta.sqlite")).unwrap();
    let rows: i64 = db.query_row("SELECT count(*) FROM pals", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 0, "no row for a removed object or an emptied PAL");
    // A partition removed takes its PALs and collections with it, also
    // when one of the same number is made again.
    s.set_pal(1, o, object_pal(3, &[1])).unwrap();
    s.set_super_pal(1, 3, super_pal(&[1])).unwrap();
    s.commit().unwrap();
    s.remove_partition(1, true).unwrap();
    s.create_partition(1).unwrap();
    let (again, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    s.commit().unwrap();
    assert_eq!(s.super_pal(1, 3).unwrap(), None);
    assert!(s.pal_view(1, again).unwrap().access.is_none());
    drop(s);
    let s = open(dir.path());
    assert_eq!(s.super_pal(1, 3).unwrap(), None);
    let rows: i64 = db.query_row("SELECT count(*) FROM pals", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 0);
    drop(s);
}

/// At most `PAL_COLLECTIONS_MAX` collections per partition; replacing or
/// removing one never counts against the limit.
#[test]
fn pal_collections_are_bounded_per_partition() {
    let (_d, s) = fresh(4);
    let max = nasd_proto::limits::PAL_COLLECTIONS_MAX as u64;
    for c in 1..=max {
        s.set_super_pal(1, c, super_pal(&[1])).unwrap();
    }
    assert_eq!(err(s.set_super_pal(1, max + 1, super_pal(&[1]))), Status::TooMany);
    s.set_super_pal(1, max, super_pal(&[2])).unwrap();
    s.set_super_pal(1, 1, Pal::default()).unwrap();
    s.set_super_pal(1, max + 1, super_pal(&[1])).unwrap();
    assert_eq!(err(s.set_super_pal(1, max + 2, super_pal(&[1]))), Status::TooMany);
}

/// A write authorized against PALs installs only if they are unchanged:
/// replacing the object's PAL, its membership, or its collection's super
/// PAL while its data streams refuses it (`ACCESS_REVOKED`), changing
/// nothing; PALs of other objects do not.
#[test]
fn a_write_authorized_by_pal_installs_only_if_the_pals_are_unchanged() {
    let (_d, s) = fresh(64);
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let (other, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let v1 = pattern(1, (BS + 100) as usize);
    write(&s, 1, o, &[rg(0, v1.len() as u64)], &v1).unwrap();
    s.set_pal(1, o, object_pal(9, &[1])).unwrap();
    s.set_super_pal(1, 9, super_pal(&[1])).unwrap();
    type Change<'a> = Box<dyn Fn() -> Result<(), StoreError> + Sync + 'a>;
    let changes: Vec<(&str, Change)> = vec![
        ("access PAL", Box::new(|| s.set_pal(1, o, object_pal(9, &[2])))),
        ("membership", Box::new(|| s.set_pal(1, o, object_pal(0, &[2])))),
        ("super PAL", Box::new(|| s.set_super_pal(1, 9, super_pal(&[2])))),
        ("super PAL removed", Box::new(|| s.set_super_pal(1, 9, Pal::default()))),
    ];
    for (what, change) in &changes {
        s.set_pal(1, o, object_pal(9, &[2])).unwrap();
        s.set_super_pal(1, 9, super_pal(&[1])).unwrap();
        let stamp = s.pal_view(1, o).unwrap().stamp;
        let check = WriteCheck { pal: Some(stamp), ..WriteCheck::default() };
        std::thread::scope(|scope| {
            let (resume, a) = held_write(scope, &s, o, vec![rg(50, 2 * BS)], pattern(2, 2 * BS as usize), 100, check);
            let (set, resume) = unblocked(what, resume, change);
            set.unwrap();
            drop(resume);
            assert_eq!(err(a.join().unwrap()), Status::AccessRevoked, "{what}");
        });
        same_bytes(&read_all(&s, 1, o), &v1, what);
        check_store_invariants(&s);
    }
    // Unchanged PALs, or another object's change: the write lands.
    let stamp = s.pal_view(1, o).unwrap().stamp;
    let check = WriteCheck { pal: Some(stamp), ..WriteCheck::default() };
    std::thread::scope(|scope| {
        let (resume, a) = held_write(scope, &s, o, vec![rg(0, 3)], b"new".to_vec(), 1, check);
        let (set, resume) = unblocked("another object's PAL", resume, || s.set_pal(1, other, object_pal(0, &[3])));
        set.unwrap();
        drop(resume);
        a.join().unwrap().unwrap();
    });
    assert_eq!(&read_all(&s, 1, o)[..3], b"new");
}
