//! What an open write transaction costs in memory: its undo holds one entry
//! per logical block it changed, and each block it holds keeps a reference
//! count — a bounded number of bytes per block touched, whatever else the
//! store holds. Measured with a counting global allocator (one test in this
//! binary, so nothing else allocates meanwhile).

use nasd_proto::{AttrMask, Attributes, Region};
use nasd_store::{Store, StoreOptions, TXN_UNDO_BYTES_PER_BLOCK};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        CURRENT.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const BS: u64 = 4096;
const BLOCKS: u64 = 8192;

#[test]
fn an_open_transaction_costs_a_bounded_number_of_bytes_per_block_it_touched() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions { block_size: BS as u32, capacity_bytes: 256 << 20, ..Default::default() };
    let s = Store::open(dir.path(), &opts).unwrap();
    s.create_partition(1).unwrap();
    s.resize_partition(1, 256 << 20).unwrap();
    let (o, _) = s.create(1, AttrMask::default(), &Attributes::default()).unwrap();
    let data = vec![7u8; (BLOCKS * BS) as usize];
    let all = [Region { offset: 0, length: BLOCKS * BS }];
    s.write(1, o, &all, &mut &data[..]).unwrap();
    s.commit().unwrap();
    // The same overwrite without a transaction, to compare like with like
    // (the allocator's free map and the block map change the same way).
    s.write(1, o, &all, &mut &data[..]).unwrap();
    s.commit().unwrap();
    let base = CURRENT.load(Ordering::Relaxed);
    s.write(1, o, &all, &mut &data[..]).unwrap();
    s.commit().unwrap();
    let plain = CURRENT.load(Ordering::Relaxed) as i64 - base as i64;

    let base = CURRENT.load(Ordering::Relaxed);
    s.txn_begin(1, o, 1).unwrap();
    s.write(1, o, &all, &mut &data[..]).unwrap();
    s.commit().unwrap();
    let held = CURRENT.load(Ordering::Relaxed) as i64 - base as i64 - plain;
    let per_block = held as f64 / BLOCKS as f64;
    eprintln!("an open transaction over {BLOCKS} blocks holds {held} bytes: {per_block:.1} per block");
    assert!(
        held > 0 && per_block <= TXN_UNDO_BYTES_PER_BLOCK as f64,
        "undo costs {per_block:.1} bytes per block touched, over the documented {TXN_UNDO_BYTES_PER_BLOCK}"
    );
    // Ending it gives the undo back (the reference-count table keeps its
    // capacity, as hash tables do).
    let base = CURRENT.load(Ordering::Relaxed);
    assert!(s.txn_end(1, o, 1, true).unwrap());
    s.commit().unwrap();
    let freed = base as i64 - CURRENT.load(Ordering::Relaxed) as i64;
    eprintln!("ending it freed {freed} bytes");
    assert!(freed >= held / 2, "ending the transaction freed {freed} of {held} bytes");
}
