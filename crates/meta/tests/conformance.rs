//! The backend conformance suite against SQLite, in memory and on disk.

use nasd_meta::testing::conformance;
use nasd_meta::Sqlite;

#[test]
fn sqlite_in_memory() {
    conformance(|| Sqlite::open_in_memory().expect("open in-memory database"));
}

#[test]
fn sqlite_on_disk() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let next = std::sync::atomic::AtomicUsize::new(0);
    conformance(|| {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Sqlite::open(&dir.path().join(format!("meta-{n}.sqlite"))).expect("open database")
    });
}
