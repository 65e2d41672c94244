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

/// A drive that keeps its oldest working key when a new one is set honours
/// capabilities minted under a key two rotations old.
#[test]
fn keeping_a_retired_working_key_is_caught() {
    caught(Bug::KeepRetiredWorkingKey, "after working key");
}

/// Cluster seeds (60 s) the cluster tests play clean (`tests/cluster.rs`:
/// its fixed seeds and regression seeds), and 23 (clean too). Since the
/// authentication server and the repair tasks joined the world, none of the
/// first eight catches `SkipRebuild` (seed 1 loses a drive, yet every
/// component is current at the end: not yet understood — the files
/// rewritten since, or a rebalance moving components off the lost drive);
/// 23 does.
const CLUSTER_SEEDS: &[u64] = &[1, 2, 4, 5, 10, 13, 16, 17, 23];

/// The first of [`CLUSTER_SEEDS`] on which the whole cluster with `bug`
/// armed breaks a property; what broke must hold `breaks`.
fn caught_in_the_cluster(bug: Bug, breaks: &str) -> u64 {
    let cfg =
        nasd_sim::Config { cluster: true, duration: Duration::from_secs(60), bugs: [bug].into(), ..Default::default() };
    for &seed in CLUSTER_SEEDS {
        let r = nasd_sim::run(seed, &cfg);
        if r.passed() {
            continue;
        }
        println!("{}", r.summary());
        assert!(
            r.failures.iter().any(|f| f.contains(breaks)),
            "seed {seed}: {bug:?} broke something else: {:?}",
            r.failures
        );
        assert!(r.replay_command().contains(" --cluster"), "{}", r.replay_command());
        return seed;
    }
    panic!("{bug:?} went unnoticed in the cluster seeds {CLUSTER_SEEDS:?}");
}

/// A manager that never flushes its metadata's log loses, at a power loss,
/// changes acknowledged longer ago than `metadata_sync_ms`: clients read
/// files older than their acknowledged history allows.
#[test]
fn a_manager_that_never_flushes_its_metadata_is_caught_by_a_power_loss() {
    caught_in_the_cluster(Bug::SkipMetadataSync, "acknowledged history allows only");
}

/// A manager that never rebuilds a lost drive's components leaves mirrored
/// files on the drive gone for good: short of the redundancy the drives
/// left allow.
#[test]
fn a_manager_that_never_rebuilds_a_lost_drive_is_caught() {
    caught_in_the_cluster(Bug::SkipRebuild, "repair did not converge");
}

/// A manager that answers a chmod or an ACL change before the drives refuse
/// the old capabilities (leaving the revocations it logged to its next
/// maintenance pass) lets a holder read with a capability obtained before
/// the change, sent after it returned (`cluster`'s revocation races).
#[test]
fn a_manager_that_answers_before_revoking_is_caught() {
    caught_in_the_cluster(Bug::SkipRevocation, "was served, sent");
}

/// A manager that answers `SYNC_IDENTITY_KEYS` before fetching the shared
/// keys again (leaving them to its next maintenance pass) serves the
/// holder's identity session after the retirement of its key returned
/// (`cluster`'s identity races, through the authentication server).
#[test]
fn a_manager_that_answers_an_identity_key_sync_before_syncing_is_caught() {
    caught_in_the_cluster(Bug::SkipIdentityKeySync, "after the key's retirement returned");
}
