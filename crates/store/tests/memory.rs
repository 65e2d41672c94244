//! A read's and a scrub's memory does not grow with the object or the drive:
//! both walk the block map in bounded batches (`READ_BATCH_BLOCKS`,
//! `SCRUB_BATCH_BLOCKS`) instead of copying it. Measured with a counting
//! global allocator (one test in this binary, so nothing else allocates
//! meanwhile).

use nasd_proto::{AttrMask, Attributes, Region};
use nasd_store::{DataSink, Store, StoreOptions};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated at the peak of `f`, above what was allocated before it.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - base)
}

const BS: u64 = 4096;
/// Blocks of the object: 8× READ_BATCH_BLOCKS, so copying its block map
/// (≈ 93 bytes per entry in a BTreeMap) would cost ≈ 760 KiB.
const BLOCKS: u64 = 8192;
/// What a read or scrub may allocate: a block buffer and one batch, with room to spare.
const BOUND_BYTES: usize = 256 * 1024;

fn byte_at(i: u64) -> u8 {
    (i * 7 % 251) as u8
}

/// Checks the bytes as they come, keeping nothing.
struct Check {
    at: u64,
}

impl DataSink for Check {
    fn start(&mut self, _lengths: &[u64]) -> std::io::Result<()> {
        Ok(())
    }
    fn data(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        for &b in bytes {
            assert_eq!(b, byte_at(self.at), "byte {}", self.at);
            self.at += 1;
        }
        Ok(())
    }
}

#[test]
fn reads_and_scrub_walk_the_block_map_in_bounded_batches() {
    assert!(nasd_store::READ_BATCH_BLOCKS as u64 * 4 <= BLOCKS && nasd_store::SCRUB_BATCH_BLOCKS as u64 * 2 <= BLOCKS);
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions { block_size: BS as u32, capacity_bytes: 64 << 20, ..Default::default() };
    let s = Store::open(dir.path(), &opts).unwrap();
    s.create_partition(1).unwrap();
    s.resize_partition(1, 64 << 20).unwrap();
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let data: Vec<u8> = (0..BLOCKS * BS).map(byte_at).collect();
    s.write(1, o, &[Region { offset: 0, length: data.len() as u64 }], &mut &data[..]).unwrap();
    drop(data);
    // Clones multiply the references to each block (scrub still checks each
    // once); a run of empty objects longer than a batch lies between them
    // and a last object with blocks of its own.
    s.fastcopy(1, o).unwrap();
    for _ in 0..nasd_store::SCRUB_BATCH_BLOCKS + 300 {
        s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    }
    s.fastcopy(1, o).unwrap();
    s.fastcopy(1, o).unwrap();
    let (last, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    s.write(1, last, &[Region { offset: 0, length: 10 * BS }], &mut &[7u8; 10 * BS as usize][..]).unwrap();
    s.commit().unwrap();

    let mut sink = Check { at: 0 };
    let (r, peak) = peak_of(|| s.read(1, o, &[Region { offset: 0, length: BLOCKS * BS }], &mut sink));
    r.unwrap();
    assert_eq!(sink.at, BLOCKS * BS);
    assert!(peak <= BOUND_BYTES, "a read of {BLOCKS} blocks allocated {peak} bytes at its peak");

    let (report, peak) = peak_of(|| s.scrub());
    let report = report.unwrap();
    assert_eq!((report.blocks_checked, report.corrupt.len()), (BLOCKS + 10, 0));
    assert!(peak <= BOUND_BYTES, "a scrub of {} block references allocated {peak} bytes at its peak", BLOCKS * 4);
}
