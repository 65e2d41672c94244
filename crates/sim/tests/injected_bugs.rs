//! The checkers catch real bugs: each deliberate bug (`nasd_env::Bug`,
//! compiled in by the components' `sim-bugs` feature and armed only by the
//! simulated world) is caught within the first fixed seeds.

use nasd_env::Bug;
use std::time::Duration;

/// The first seed of `0..4` on which `bug` breaks a property, with what broke.
fn caught(bug: Bug, breaks: &str) -> u64 {
    let cfg = nasd_sim::Config { duration: Duration::from_secs(60), bugs: [bug].into(), ..Default::default() };
    for seed in 0..4 {
        let r = nasd_sim::run(seed, &cfg);
        if !r.passed() {
            println!("{}", r.summary());
            assert!(
                r.failures.iter().any(|f| f.contains(breaks)),
                "seed {seed}: {bug:?} broke something else: {:?}",
                r.failures
            );
            assert!(r.replay_command().contains(&format!("--seed {seed} --bug ")), "{}", r.replay_command());
            return seed;
        }
    }
    panic!("{bug:?} went unnoticed in seeds 0..4");
}

/// A store that commits its index without syncing the block file first
/// loses acknowledged data at a crash: reads then fail their digests.
#[test]
fn skipping_the_block_sync_before_a_commit_is_caught() {
    caught(Bug::SkipBlockSync, "object");
}

/// A drive that accepts a capability older than the object's access-control
/// version honours requests sent after their revocation returned.
#[test]
fn accepting_a_stale_access_control_version_is_caught() {
    caught(Bug::AcceptStaleAcv, "was accepted, sent");
}

/// The whole cluster under `seed` (60 s) with `bug` armed breaks a property
/// whose text holds `breaks` (the same seed passes without it:
/// `tests/cluster.rs` plays it).
fn caught_in_the_cluster(bug: Bug, seed: u64, breaks: &str) {
    let cfg =
        nasd_sim::Config { cluster: true, duration: Duration::from_secs(60), bugs: [bug].into(), ..Default::default() };
    let r = nasd_sim::run(seed, &cfg);
    println!("{}", r.summary());
    assert!(!r.passed(), "seed {seed}: {bug:?} went unnoticed");
    assert!(
        r.failures.iter().any(|f| f.contains(breaks)),
        "seed {seed}: {bug:?} broke something else: {:?}",
        r.failures
    );
    assert!(r.replay_command().contains(" --cluster"), "{}", r.replay_command());
}

/// A manager that never flushes its metadata's log loses, at a power loss,
/// changes acknowledged longer ago than `metadata_sync_ms`: seed 1's
/// clients read files older than their acknowledged history allows.
#[test]
fn a_manager_that_never_flushes_its_metadata_is_caught_by_a_power_loss() {
    caught_in_the_cluster(Bug::SkipMetadataSync, 1, "acknowledged history allows only");
}

/// A manager that never rebuilds a lost drive's components leaves seed
/// 4's mirrored files on the drive gone for good: short of the redundancy
/// the drives left allow.
#[test]
fn a_manager_that_never_rebuilds_a_lost_drive_is_caught() {
    caught_in_the_cluster(Bug::SkipRebuild, 4, "repair did not converge");
}
