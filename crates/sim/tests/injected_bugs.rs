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
