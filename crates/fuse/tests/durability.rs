//! Durability through the mount (issue 24.4): the manager acknowledges a
//! change once it is committed (it survives the manager's crash at once,
//! `crates/cli/tests/manager_crash.rs`), and flushes its metadata to disk
//! for many changes at once. An `fsync` (and an `fsyncdir`) through the
//! mount returns only after the manager's own disk flush covered every
//! change made before it: observed in the manager's counters, with its
//! periodic flush set far beyond the test so only the mount's requests can
//! have caused the flush.

mod common;

use std::fs;
use std::io::Write;
use std::time::Duration;

/// The test's time limit (a hang, not a timing assertion).
const LIMIT: Duration = Duration::from_secs(600);

#[test]
fn an_fsync_returns_after_the_managers_disk_flush() {
    require_fuse!();
    let mut opts = common::ClusterOptions::default();
    // Longer than the test: no periodic flush of the manager's metadata happens in it.
    opts.config.metadata_sync_interval = Duration::from_secs(60);
    let mut env = common::Env::start("durability", LIMIT, opts);
    let m = env.mount();
    let durability = |env: &common::Env| env.cluster().manager.metadata_durability();

    for round in 0..3u64 {
        // Changes acknowledged without a flush: created, written, closed (committed).
        let name = m.join(format!("f{round}"));
        let mut f = fs::File::create(&name).unwrap();
        f.write_all(&common::cluster::pattern(round, 100_000)).unwrap();
        drop(f);
        fs::create_dir(m.join(format!("d{round}"))).unwrap();
        let before = durability(&env);
        assert!(before.durable < before.committed, "round {round}: acknowledged, not flushed yet: {before:?}");

        // fsync: the file's writes committed, then the manager's flush, before it returns.
        let mut f = fs::OpenOptions::new().write(true).open(&name).unwrap();
        f.write_all(b"more").unwrap();
        f.sync_all().unwrap();
        let after = durability(&env);
        assert_eq!(after.durable, after.committed, "round {round}: everything before the fsync flushed: {after:?}");
        assert!(after.syncs > before.syncs, "round {round}: by a flush of the manager's own");
        drop(f);

        // fsyncdir of the mount's root: names made before it flushed too.
        fs::create_dir(m.join(format!("e{round}"))).unwrap();
        let before = durability(&env);
        assert!(before.durable < before.committed);
        fs::File::open(&m).unwrap().sync_all().unwrap();
        let after = durability(&env);
        assert_eq!(after.durable, after.committed, "round {round}: fsyncdir flushed: {after:?}");
    }
    env.stop();
}
