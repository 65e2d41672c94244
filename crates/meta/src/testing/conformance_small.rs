//! Conformance cases for small files (issue 14): the bytes of a file below
//! its small-file threshold, kept in the metadata store. Run on a name space
//! giving new files a threshold of [`T`] bytes.

use super::check_invariants;
use super::conformance::{ino, own, pool_placer, setup, ALICE, BOB, ROOT};
use crate::backend::Backend;
use crate::types::{QuotaSubject, SetAttrs};
use crate::Namespace;
use nasd_proto::fs::*;
use nasd_proto::layout::Layout;
use nasd_proto::manager::SMALL_IO_MAX;

/// The threshold of the name space these cases run on.
pub(super) const T: u32 = 64;

/// Runs the cases on name spaces from `make`.
pub(super) fn small_files<B: Backend>(make: &impl Fn() -> B) {
    let fresh = || {
        let ns = Namespace::new(make(), Layout::SINGLE)
            .and_then(|ns| ns.with_small_file_threshold(T))
            .expect("open name space");
        setup(&ns);
        ns
    };
    for (name, case) in [
        ("small_crossing_writes", crossing_writes::<B> as fn(&Namespace<B>)),
        ("small_truncate_and_sparse", truncate_and_sparse::<B>),
        ("small_permissions_and_writers", permissions_and_writers::<B>),
        ("small_bounds_and_quota", bounds_and_quota::<B>),
        ("small_staged_under_a_transaction", staged::<B>),
    ] {
        eprintln!("conformance case: {name}");
        let ns = fresh();
        case(&ns);
        check_invariants(&ns);
    }
    eprintln!("conformance case: small_off_and_limits");
    let ns = Namespace::new(make(), Layout::SINGLE).expect("open name space");
    setup(&ns);
    off_and_limits(ns);
    eprintln!("conformance case: small_staged_restart");
    staged_then_reopened(make());
}

fn create<B: Backend>(ns: &Namespace<B>, name: &str) -> Ino {
    let (n, created) = ns.create(&ALICE, ino(ns, "/"), name, 0o644, true, false, &mut pool_placer(&[1])).unwrap();
    assert!(created);
    n.attr.ino
}

fn size_to<B: Backend>(ns: &Namespace<B>, i: Ino, size: u64) {
    ns.setattr(&ALICE, i, &SetAttrs { size: Some(size), ..SetAttrs::default() }).unwrap();
}

fn crossing_writes<B: Backend>(ns: &Namespace<B>) {
    own(ns, "/", &ROOT, 0o777);
    let i = create(ns, "f");
    assert_eq!(ns.getattr(i).unwrap().small_threshold, T, "a new file takes the name space's threshold");
    assert_eq!(ns.read_small(&ALICE, i, 0, 100).unwrap(), b"", "an empty file reads nothing");
    // Below, at the start.
    let n = ns.write_small(&ALICE, i, 0, 0, b"hello").unwrap();
    assert_eq!(n.attr.size, 5);
    // Around: ending exactly at the threshold.
    let n = ns.write_small(&ALICE, i, 0, T as u64 - 3, b"xyz").unwrap();
    assert_eq!(n.attr.size, T as u64);
    // Past it: refused, nothing changes.
    let before = ns.getattr(i).unwrap();
    assert_eq!(ns.write_small(&ALICE, i, 0, T as u64 - 1, b"ab").err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.write_small(&ALICE, i, 0, T as u64, b"a").err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.write_small(&ALICE, i, 0, u64::MAX, b"a").err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.getattr(i).unwrap(), before);
    // Reads stop at the threshold and the size; the gap reads zeros.
    let mut want = vec![0u8; T as usize];
    want[..5].copy_from_slice(b"hello");
    want[T as usize - 3..].copy_from_slice(b"xyz");
    assert_eq!(ns.read_small(&ALICE, i, 0, 1000).unwrap(), want);
    assert_eq!(ns.read_small(&ALICE, i, 3, 4).unwrap(), &want[3..7]);
    assert_eq!(ns.read_small(&ALICE, i, T as u64 - 2, 100).unwrap(), b"yz");
    assert_eq!(ns.read_small(&ALICE, i, T as u64, 100).unwrap(), b"", "nothing at or past the threshold");
    // A size past the threshold (striped bytes committed) does not make reads cross it.
    size_to(ns, i, 10_000);
    assert_eq!(ns.read_small(&ALICE, i, 0, 1000).unwrap(), want);
    // An overwrite in the middle keeps the rest, and does not shrink the size.
    let n = ns.write_small(&ALICE, i, 0, 4, b"O").unwrap();
    assert_eq!(n.attr.size, 10_000);
    want[4] = b'O';
    assert_eq!(ns.read_small(&ALICE, i, 0, 1000).unwrap(), want);
    // The row goes with the inode.
    ns.unlink(&ALICE, ino(ns, "/"), "f").unwrap();
    assert_eq!(ns.backend().read(|t| t.get_small(i)).unwrap(), None);
    assert_eq!(ns.read_small(&ALICE, i, 0, 1).err(), Some(FsStatus::NotFound));
}

fn truncate_and_sparse<B: Backend>(ns: &Namespace<B>) {
    own(ns, "/", &ROOT, 0o777);
    let i = create(ns, "f");
    // Sparse: a write at 40 of an empty file; 0..40 read as zeros.
    assert_eq!(ns.write_small(&ALICE, i, 0, 40, b"tail").unwrap().attr.size, 44);
    let mut want = vec![0u8; 44];
    want[40..].copy_from_slice(b"tail");
    assert_eq!(ns.read_small(&ALICE, i, 0, 100).unwrap(), want);
    // Truncate below the threshold, then grow past it: the cut bytes read as zeros.
    size_to(ns, i, 41);
    assert_eq!(ns.read_small(&ALICE, i, 0, 100).unwrap(), &want[..41]);
    size_to(ns, i, 1000);
    let mut grown = want[..41].to_vec();
    grown.resize(T as usize, 0);
    assert_eq!(ns.read_small(&ALICE, i, 0, 100).unwrap(), grown);
    // Truncate to 0 through a truncating CREATE.
    ns.write_small(&ALICE, i, 0, 0, b"abc").unwrap();
    let (n, created) = ns.create(&ALICE, ino(ns, "/"), "f", 0o644, false, true, &mut pool_placer(&[1])).unwrap();
    assert!(!created);
    assert_eq!(n.attr.size, 0);
    assert_eq!(ns.read_small(&ALICE, i, 0, 100).unwrap(), b"");
    size_to(ns, i, 3);
    assert_eq!(ns.read_small(&ALICE, i, 0, 100).unwrap(), [0, 0, 0], "no old byte comes back");
    // A drive's length at or below the threshold does not move the size (the
    // drive holds nothing there); past it, it does.
    ns.write_small(&ALICE, i, 0, 0, b"0123456789").unwrap();
    assert_eq!(ns.record_size(i, 0, 0, 77).unwrap().attr.size, 10);
    assert_eq!(ns.record_size(i, T as u64, 0, 78).unwrap().attr.size, 10);
    assert_eq!(ns.record_size(i, T as u64 + 1, 0, 79).unwrap().attr.size, T as u64 + 1);
}

fn permissions_and_writers<B: Backend>(ns: &Namespace<B>) {
    own(ns, "/", &ROOT, 0o777);
    let i = create(ns, "f");
    ns.write_small(&ALICE, i, 0, 0, b"mine").unwrap();
    // 0644: BOB (same group) reads, does not write.
    assert_eq!(ns.read_small(&BOB, i, 0, 4).unwrap(), b"mine");
    assert_eq!(ns.write_small(&BOB, i, 0, 0, b"x").err(), Some(FsStatus::PermissionDenied));
    own(ns, "/f", &ALICE, 0o600);
    assert_eq!(ns.read_small(&BOB, i, 0, 4).err(), Some(FsStatus::PermissionDenied));
    own(ns, "/f", &ALICE, 0o666);
    ns.write_small(&BOB, i, 0, 0, b"B").unwrap();
    // The owner writes a file it made read-only (the open-writer rule), but does not read a 0o200 one.
    own(ns, "/f", &ALICE, 0o200);
    ns.write_small(&ALICE, i, 0, 1, b"I").unwrap();
    assert_eq!(ns.read_small(&ALICE, i, 0, 4).err(), Some(FsStatus::PermissionDenied));
    own(ns, "/f", &ALICE, 0o444);
    ns.write_small(&ALICE, i, 0, 2, b"N").unwrap();
    assert_eq!(ns.read_small(&ALICE, i, 0, 4).unwrap(), b"BINe");
    assert_eq!(ns.read_small(&ROOT, i, 0, 4).unwrap(), b"BINe");
    // One writer at a time: another's open write transaction holds the file.
    own(ns, "/f", &ALICE, 0o666);
    let txn = ns.begin_write(&ALICE, i, i64::MAX).unwrap();
    assert_eq!(ns.write_small(&BOB, i, 0, 0, b"x").err(), Some(FsStatus::Busy));
    assert_eq!(ns.write_small(&ALICE, i, 0, 0, b"x").err(), Some(FsStatus::Busy), "not under its transaction");
    assert_eq!(ns.write_small(&BOB, i, txn, 0, b"x").err(), Some(FsStatus::NotPermitted));
    ns.write_small(&ALICE, i, txn, 0, b"x").unwrap();
    ns.abort_intent(txn).unwrap();
    assert_eq!(ns.write_small(&ALICE, i, txn, 0, b"y").err(), Some(FsStatus::Aborted), "being rolled back");
    ns.finish_intent(txn).unwrap();
    assert_eq!(ns.write_small(&ALICE, i, txn, 0, b"y").err(), Some(FsStatus::Aborted), "gone");
    assert_eq!(
        ns.read_small(&ALICE, i, 0, 4).unwrap(),
        b"BINe",
        "the staged write is rolled back with its transaction"
    );
    ns.write_small(&BOB, i, 0, 0, b"z").unwrap();
    // Kinds.
    ns.mkdir(&ALICE, ino(ns, "/"), "d", 0o755).unwrap();
    let d = ino(ns, "/d");
    assert_eq!(ns.read_small(&ALICE, d, 0, 1).err(), Some(FsStatus::IsDir));
    assert_eq!(ns.write_small(&ALICE, d, 0, 0, b"x").err(), Some(FsStatus::IsDir));
}

fn bounds_and_quota<B: Backend>(ns: &Namespace<B>) {
    own(ns, "/", &ROOT, 0o777);
    let i = create(ns, "f");
    assert_eq!(ns.read_small(&ALICE, i, 0, SMALL_IO_MAX as u32 + 1).err(), Some(FsStatus::InvalidArgument));
    let big = vec![1u8; SMALL_IO_MAX + 1];
    assert_eq!(ns.write_small(&ALICE, i, 0, 0, &big).err(), Some(FsStatus::InvalidArgument));
    // An empty write changes nothing.
    let before = ns.getattr(i).unwrap();
    assert_eq!(ns.write_small(&ALICE, i, 0, 10, b"").unwrap(), before);
    // Growth is charged to the quota, in the same transaction.
    ns.set_quota(QuotaSubject::User(ALICE.uid), Some(20), None).unwrap();
    ns.write_small(&ALICE, i, 0, 0, &[7u8; 20]).unwrap();
    assert_eq!(ns.write_small(&ALICE, i, 0, 20, b"x").err(), Some(FsStatus::QuotaExceeded));
    assert_eq!(ns.getattr(i).unwrap().attr.size, 20);
    assert_eq!(ns.read_small(&ALICE, i, 0, 100).unwrap(), [7u8; 20], "the refused write left nothing");
    ns.write_small(&ALICE, i, 0, 5, b"in place").unwrap();
    assert_eq!(ns.quota(QuotaSubject::User(ALICE.uid)).unwrap().unwrap().0.bytes_used, 20);
}

fn off_and_limits<B: Backend>(ns: Namespace<B>) {
    own(&ns, "/", &ROOT, 0o777);
    let i = create(&ns, "old");
    assert_eq!(ns.getattr(i).unwrap().small_threshold, 0, "threshold 0: no small-file bytes");
    assert_eq!(ns.read_small(&ALICE, i, 0, 1).err(), Some(FsStatus::InvalidArgument));
    assert_eq!(ns.write_small(&ALICE, i, 0, 0, b"x").err(), Some(FsStatus::InvalidArgument));
    assert!(ns.with_small_file_threshold(nasd_proto::manager::SMALL_FILE_THRESHOLD_MAX + 1).is_err());
}

fn staged_bytes<B: Backend>(ns: &Namespace<B>, i: Ino) -> Option<(u64, Vec<u8>)> {
    ns.backend().read(|t| t.get_staged(i)).unwrap()
}

/// Small writes under a write transaction are staged: readers see the
/// committed bytes until its `COMMIT` installs them with its size; a
/// rollback drops them; a truncation cuts them; they go with the file.
fn staged<B: Backend>(ns: &Namespace<B>) {
    own(ns, "/", &ROOT, 0o777);
    let i = create(ns, "f");
    ns.write_small(&ALICE, i, 0, 0, b"old old old").unwrap();
    let before = ns.getattr(i).unwrap();
    // Staged: nothing a reader sees moves, not even the size.
    let txn = ns.begin_write(&ALICE, i, i64::MAX).unwrap();
    assert_eq!(ns.write_small(&ALICE, i, txn, 0, b"NEW").unwrap(), before, "the attributes as committed");
    ns.write_small(&ALICE, i, txn, 8, b"NEW NEW").unwrap();
    assert_eq!(ns.read_small(&BOB, i, 0, 100).unwrap(), b"old old old");
    assert_eq!(ns.getattr(i).unwrap(), before);
    assert_eq!(staged_bytes(ns, i), Some((txn, b"NEW old NEW NEW".to_vec())), "staged on the committed bytes");
    check_invariants(ns);
    // The commit installs them with the size it records: a write that crossed the threshold.
    let n = ns.commit_write(&ALICE, i, txn, T as u64 + 100, 100, &[], 5).unwrap();
    assert_eq!(n.attr.size, T as u64 + 100);
    let mut want = b"NEW old NEW NEW".to_vec();
    want.resize(T as usize, 0);
    assert_eq!(ns.read_small(&BOB, i, 0, 1000).unwrap(), want, "head installed with the commit");
    assert_eq!(staged_bytes(ns, i), None);
    ns.finish_intent(txn).unwrap();
    assert_eq!(ns.read_small(&BOB, i, 0, 1000).unwrap(), want, "finishing a committed intent keeps its bytes");

    // Rolled back: the head stays as committed.
    let txn = ns.begin_write(&ALICE, i, i64::MAX).unwrap();
    ns.write_small(&ALICE, i, txn, 0, &[9u8; T as usize]).unwrap();
    assert!(staged_bytes(ns, i).is_some());
    ns.abort_intent(txn).unwrap();
    check_invariants(ns);
    ns.finish_intent(txn).unwrap();
    assert_eq!(staged_bytes(ns, i), None, "a rollback drops what it staged");
    assert_eq!(ns.read_small(&BOB, i, 0, 1000).unwrap(), want);
    assert_eq!(ns.getattr(i).unwrap().attr.size, T as u64 + 100);

    // A commit refused for its quota escrow installs nothing; the rollback drops it.
    ns.set_quota(QuotaSubject::User(ALICE.uid), Some(T as u64 + 100), None).unwrap();
    let txn = ns.begin_write(&ALICE, i, i64::MAX).unwrap();
    ns.write_small(&ALICE, i, txn, 0, b"Q").unwrap();
    assert_eq!(
        ns.commit_write(&ALICE, i, txn, u64::MAX / 2, u64::MAX / 4, &[], 6).err(),
        Some(FsStatus::QuotaExceeded)
    );
    assert_eq!(ns.read_small(&BOB, i, 0, 1).unwrap(), b"N");
    ns.abort_intent(txn).unwrap();
    ns.finish_intent(txn).unwrap();
    ns.set_quota(QuotaSubject::User(ALICE.uid), None, None).unwrap();
    assert_eq!(ns.read_small(&BOB, i, 0, 1).unwrap(), b"N");

    // A truncation while a transaction is open cuts what it staged too.
    size_to(ns, i, 20);
    let txn = ns.begin_write(&ALICE, i, i64::MAX).unwrap();
    ns.write_small(&ALICE, i, txn, 0, b"abcdefgh").unwrap();
    size_to(ns, i, 2);
    assert_eq!(staged_bytes(ns, i), Some((txn, b"ab".to_vec())));
    let n = ns.commit_write(&ALICE, i, txn, 0, 0, &[], 7).unwrap();
    assert_eq!(n.attr.size, 2);
    assert_eq!(ns.read_small(&BOB, i, 0, 100).unwrap(), b"ab");
    ns.finish_intent(txn).unwrap();

    // A file removed with bytes staged: they go with it.
    let txn = ns.begin_write(&ALICE, i, i64::MAX).unwrap();
    ns.write_small(&ALICE, i, txn, 0, b"doomed").unwrap();
    ns.unlink(&ALICE, ino(ns, "/"), "f").unwrap();
    assert_eq!(staged_bytes(ns, i), None);
    assert_eq!(ns.intent(txn).unwrap(), None);
}

/// Bytes staged by a transaction left open when its manager stopped: the
/// name space opened again on the same store (a restarted manager) still
/// keeps them from readers, and its rollback drops them.
fn staged_then_reopened<B: Backend>(backend: B) {
    let ns = Namespace::new(backend, Layout::SINGLE).and_then(|ns| ns.with_small_file_threshold(T)).unwrap();
    setup(&ns);
    own(&ns, "/", &ROOT, 0o777);
    let i = create(&ns, "f");
    ns.write_small(&ALICE, i, 0, 0, b"old").unwrap();
    let rolled = ns.begin_write(&ALICE, i, 1).unwrap();
    ns.write_small(&ALICE, i, rolled, 0, b"new").unwrap();
    let backend = ns.into_backend();
    let ns = Namespace::new(backend, Layout::SINGLE).and_then(|ns| ns.with_small_file_threshold(T)).unwrap();
    assert_eq!(ns.read_small(&BOB, i, 0, 10).unwrap(), b"old");
    let intent = ns.intents(0, 10).unwrap().into_iter().find(|x| x.txn == rolled).expect("the intent is logged");
    assert_eq!(intent.ino, i);
    ns.abort_intent(rolled).unwrap();
    ns.finish_intent(rolled).unwrap();
    assert_eq!(staged_bytes(&ns, i), None);
    assert_eq!(ns.read_small(&BOB, i, 0, 10).unwrap(), b"old");
    check_invariants(&ns);
}
