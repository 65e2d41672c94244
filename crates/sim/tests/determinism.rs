//! The same seed replays exactly: the event log — every request, reply,
//! fault and check, stamped with simulated time — hashes the same.

use std::time::Duration;

#[test]
fn the_same_seed_gives_the_same_event_log_hash_and_another_seed_another() {
    let cfg = nasd_sim::Config { duration: Duration::from_secs(60), ..Default::default() };
    let a = nasd_sim::run(4242, &cfg);
    let b = nasd_sim::run(4242, &cfg);
    let c = nasd_sim::run(4243, &cfg);
    assert!(a.passed(), "{}", a.summary());
    assert!(a.events > 1000 && a.faults > 0, "the run did something: {}", a.summary());
    assert_eq!((a.hash.as_str(), a.events, a.requests), (b.hash.as_str(), b.events, b.requests), "seed 4242 replayed");
    assert_eq!(a.simulated, b.simulated);
    assert_ne!(a.hash, c.hash, "another seed is another run");
}
