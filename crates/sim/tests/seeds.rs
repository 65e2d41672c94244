//! The simulator over a fixed set of seeds: every run must keep every
//! property (`nasd_sim::drives`). A failure prints what broke, the end of
//! the event log, and the command that replays the seed exactly.
//!
//! `many_seeds` (ignored) plays thousands: `NASD_SIM_SEEDS=10000
//! NASD_SIM_FROM=0 cargo test --release -p nasd-sim --test seeds -- --ignored`.

use std::time::Duration;

/// Seeds every test run plays, split in two tests so both cores work.
const FIXED_SEEDS: std::ops::Range<u64> = 0..16;
/// Simulated workload time of each fixed seed.
const FIXED_DURATION: Duration = Duration::from_secs(90);

fn play(seeds: impl Iterator<Item = u64>, duration: Duration) -> (u64, Duration) {
    let cfg = nasd_sim::Config { duration, ..Default::default() };
    let (mut runs, mut simulated) = (0, Duration::ZERO);
    let mut failed = Vec::new();
    for seed in seeds {
        let r = nasd_sim::run(seed, &cfg);
        println!("{}", r.summary());
        assert!(r.requests > 1000, "seed {seed}: the workload ran ({} requests)", r.requests);
        runs += 1;
        simulated += r.simulated;
        if !r.passed() {
            failed.push(r.summary());
        }
    }
    assert!(failed.is_empty(), "{} seeds failed:\n{}", failed.len(), failed.join("\n"));
    (runs, simulated)
}

#[test]
fn the_first_half_of_the_fixed_seeds_keeps_every_property() {
    let half = FIXED_SEEDS.start + (FIXED_SEEDS.end - FIXED_SEEDS.start) / 2;
    play(FIXED_SEEDS.start..half, FIXED_DURATION);
}

#[test]
fn the_second_half_of_the_fixed_seeds_keeps_every_property() {
    let half = FIXED_SEEDS.start + (FIXED_SEEDS.end - FIXED_SEEDS.start) / 2;
    play(half..FIXED_SEEDS.end, FIXED_DURATION);
}

/// Seeds that found a bug, each with its simulated duration, kept once the
/// bug was fixed. 4242 (60 s): the drive never synced the directory of a
/// new `audit.sqlite`, so a crash lost the whole audit trail and the next
/// incarnation numbered its records from 1 again. 2860 (60 s): drive-1's
/// clock stepped back 1.8 s past the moment it had restarted; a drive
/// refuses nonces from before its start and ahead of its clock, so it
/// refused every request, and every client's retry on the clock it had
/// just learnt, until its clock caught up. The drive's nonce clock now
/// never steps back (`Store::nonce_now_ns`).
const REGRESSIONS: &[(u64, u64)] = &[(4242, 60), (2860, 60)];

#[test]
fn seeds_that_found_bugs_keep_every_property() {
    for &(seed, secs) in REGRESSIONS {
        play(seed..seed + 1, Duration::from_secs(secs));
    }
}

/// Thousands of seeds: `NASD_SIM_SEEDS` (default 1000) from `NASD_SIM_FROM`
/// (default 1000, past the fixed ones), each `NASD_SIM_DURATION` simulated
/// seconds (default 120).
#[test]
#[ignore = "thousands of seeds: run with --ignored (and --release)"]
fn many_seeds() {
    let var = |name: &str, default: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (n, from, secs) = (var("NASD_SIM_SEEDS", 1000), var("NASD_SIM_FROM", 1000), var("NASD_SIM_DURATION", 120));
    let started = std::time::Instant::now();
    let (runs, simulated) = play(from..from + n, Duration::from_secs(secs));
    println!(
        "{runs} seeds, {:.1} simulated hours, in {:.0} s",
        simulated.as_secs_f64() / 3600.0,
        started.elapsed().as_secs_f64()
    );
}
